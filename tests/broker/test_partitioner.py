"""The producers' rule for a record's partition, shared by PUBS/PUB and REST produce."""

from __future__ import annotations

import pytest

from kafkaesque.broker._errors import RequestError
from kafkaesque.broker._partitioner import Partitioner
from kafkaesque.protocol import ErrorCode, partition_for_key


def test_a_named_partition_is_kept_and_one_the_topic_lacks_is_refused() -> None:
    chooser = Partitioner()
    assert chooser.choose("t", 3, b"key", 2) == 2
    with pytest.raises(RequestError) as refused:
        chooser.choose("t", 3, None, 3)
    assert refused.value.code is ErrorCode.UNKNOWN_PARTITION


def test_a_key_picks_the_partition_every_client_would() -> None:
    chooser = Partitioner()
    assert [chooser.choose("t", 7, k, None) for k in (b"a", b"b", b"")] == [
        partition_for_key(k, 7) for k in (b"a", b"b", b"")
    ]


def test_keyless_records_go_round_robin_per_topic() -> None:
    chooser = Partitioner()
    assert [chooser.choose("t", 3, None, None) for _ in range(4)] == [0, 1, 2, 0]
    assert chooser.choose("u", 2, None, None) == 0  # its own counter
    assert chooser.choose("t", 3, None, None) == 1
