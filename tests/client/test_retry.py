"""``retry_decision``: which errors are retried, after how long, with a metadata refresh or not."""

from __future__ import annotations

import pytest

from kafkaesque.client import (
    KafkaesqueConnectionError,
    KafkaesqueError,
    RetryDecision,
    RetryPolicy,
    retry_decision,
)
from kafkaesque.protocol import ErrorCode, ErrorReply

POLICY = RetryPolicy(max_attempts=5, backoff_ms=10, backoff_max_ms=40, unknown_topic_attempts=2)
REFRESHING = {
    ErrorCode.NOT_LEADER,
    ErrorCode.NO_QUORUM,
    ErrorCode.UNKNOWN_TOPIC,
    ErrorCode.NOT_READY,  # a stopping broker's refusal: its leaderships have moved
}


@pytest.mark.parametrize("code", list(ErrorCode))
def test_every_code_follows_its_table_row(code: ErrorCode) -> None:
    error = KafkaesqueError.from_reply(ErrorReply(code, "m"))
    assert (error.retriable, error.outcome_unknown) == (code.retriable, code.outcome_unknown)
    for idempotent in (False, True):
        decision = retry_decision(POLICY, error, 1, idempotent=idempotent)
        should = code.retriable and (idempotent or not code.outcome_unknown)
        assert (decision is not None) == should, (code, idempotent)
        if decision is not None:
            assert decision == RetryDecision(0.01, code in REFRESHING)


def test_backoff_doubles_up_to_the_cap_and_attempts_run_out() -> None:
    busy = KafkaesqueError(ErrorCode.BUSY, "")
    delays = [retry_decision(POLICY, busy, n, idempotent=False) for n in range(1, 6)]
    assert [d.delay_s if d else None for d in delays] == [0.01, 0.02, 0.04, 0.04, None]


def test_unknown_topic_gives_up_early() -> None:
    missing = KafkaesqueError(ErrorCode.UNKNOWN_TOPIC, "")
    assert retry_decision(POLICY, missing, 1, idempotent=True) is not None
    assert retry_decision(POLICY, missing, 2, idempotent=True) is None


def test_connection_failures_are_retriable_and_refresh_metadata() -> None:
    refused = KafkaesqueConnectionError("refused", sent=False)
    lost = KafkaesqueConnectionError("lost", sent=True)
    broken = KafkaesqueConnectionError("garbage", sent=True, retriable=False)
    assert refused.code is None and not refused.outcome_unknown and str(refused).startswith("CONN")
    assert retry_decision(POLICY, refused, 1, idempotent=False) == RetryDecision(0.01, True)
    assert retry_decision(POLICY, lost, 1, idempotent=False) is None  # maybe applied
    assert retry_decision(POLICY, lost, 1, idempotent=True) == RetryDecision(0.01, True)
    assert retry_decision(POLICY, broken, 1, idempotent=True) is None


def test_an_error_without_a_code_must_state_its_flags() -> None:
    with pytest.raises(ValueError):
        KafkaesqueError(None, "what?")
