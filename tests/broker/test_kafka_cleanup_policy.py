"""Kafka's cleanup.policy list in our topic config's terms (``_cleanup_policy``, pure)."""

from __future__ import annotations

import pytest

from kafkaesque.broker.kafka._cleanup_policy import (
    describe_cleanup_policy,
    parse_cleanup_policy,
)


def test_each_policy_kafka_allows_parses_and_anything_else_is_refused() -> None:
    assert parse_cleanup_policy("compact") == (True, False)
    assert parse_cleanup_policy("delete") == (False, True)
    assert parse_cleanup_policy("compact,delete") == (True, True)
    assert parse_cleanup_policy("delete, compact") == (True, True)
    for bad in (None, "", "shred", "compact,compact", "compact,", "Compact"):
        with pytest.raises(ValueError, match=r"cleanup\.policy"):
            parse_cleanup_policy(bad)


def test_a_compacted_topic_with_a_retention_limit_is_described_as_compact_and_delete() -> None:
    assert describe_cleanup_policy(False, None, None) == "delete"
    assert describe_cleanup_policy(False, 1000, None) == "delete"
    assert describe_cleanup_policy(True, None, None) == "compact"
    assert describe_cleanup_policy(True, 1000, None) == "compact,delete"
    assert describe_cleanup_policy(True, None, 10**9) == "compact,delete"
