"""When a failed request is sent again, after how long, and whether the metadata is refreshed first.

One pure decision (``retry_decision``) serves every request of the client: admin calls, fetches and
the producer's batches. It reads only the error's flags (``retriable``, ``outcome_unknown``) and its
code, so the table of docs/protocol.md is the single source of truth.
"""

from __future__ import annotations

from dataclasses import dataclass

from kafkaesque.protocol import ErrorCode

from ._errors import KafkaesqueError

REFRESH_CODES = frozenset(
    {ErrorCode.NOT_LEADER, ErrorCode.NO_QUORUM, ErrorCode.UNKNOWN_TOPIC, ErrorCode.NOT_READY}
)
"""Codes after which the client re-reads METADATA before retrying: the leader may have moved.
A connection failure (``code`` None) is treated the same way. ``NOT_READY`` too: a broker that
is stopping says it once its leaderships have moved, and one that has just started does not
lead anything yet; the refresh asks another broker when this one answers ``NOT_READY`` to
METADATA as well (``steps.refresh_metadata``)."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How hard to retry. ``max_attempts`` counts the first try; the backoff doubles from
    ``backoff_ms`` up to ``backoff_max_ms`` (no jitter: runs are reproducible).

    ``unknown_topic_attempts`` bounds the retries of ``UNKNOWN_TOPIC`` separately: the code is
    retriable because a topic just created reaches every broker a moment later, but a topic that
    does not exist should fail fast, not after the whole budget.
    """

    max_attempts: int = 8
    backoff_ms: float = 50.0
    backoff_max_ms: float = 1000.0
    unknown_topic_attempts: int = 4

    def __post_init__(self) -> None:
        if self.max_attempts < 1 or self.unknown_topic_attempts < 1:
            raise ValueError("a request is attempted at least once")
        if self.backoff_ms < 0 or self.backoff_max_ms < self.backoff_ms:
            raise ValueError("need 0 <= backoff_ms <= backoff_max_ms")

    def backoff_s(self, attempts: int) -> float:
        """The pause after the ``attempts``-th failed attempt (1 after the first), in seconds."""
        exponent = min(max(attempts - 1, 0), 30)
        return min(self.backoff_ms * float(2**exponent), self.backoff_max_ms) / 1000.0


DEFAULT_RETRY = RetryPolicy()
"""Admin calls, fetches and metadata: about 3.5 s of backoff in all before giving up."""
PRODUCER_RETRY = RetryPolicy(max_attempts=10, backoff_ms=100.0, backoff_max_ms=1000.0)
"""The producer's default: bounded by its ``delivery_timeout_ms`` as much as by attempts."""
NO_RETRY = RetryPolicy(max_attempts=1, backoff_ms=0, backoff_max_ms=0, unknown_topic_attempts=1)


@dataclass(frozen=True, slots=True)
class RetryDecision:
    """Send the request again after ``delay_s`` seconds, re-reading METADATA first if
    ``refresh_metadata``."""

    delay_s: float
    refresh_metadata: bool


def retry_decision(
    policy: RetryPolicy,
    error: KafkaesqueError,
    attempts: int,
    *,
    idempotent: bool,
) -> RetryDecision | None:
    """Whether to retry after ``error`` ended the ``attempts``-th attempt; None: give up.

    A request is retried only if the error is ``retriable``, attempts remain, and either the
    outcome is known (nothing was applied) or the request is ``idempotent`` (sending it twice does
    no harm: reads, COMMIT, or a write whose caller accepts duplicates).
    """
    if not error.retriable or attempts >= policy.max_attempts:
        return None
    if error.outcome_unknown and not idempotent:
        return None
    if error.code is ErrorCode.UNKNOWN_TOPIC and attempts >= policy.unknown_topic_attempts:
        return None
    refresh = error.code is None or error.code in REFRESH_CODES
    return RetryDecision(policy.backoff_s(attempts), refresh)
