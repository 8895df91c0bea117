"""What the checker reports: anomaly kinds, and one anomaly with the events that prove it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from .history import Event, TopicPartition

LOST: Final = "lost"
DUPLICATE: Final = "duplicate"
INCONSISTENT_OFFSETS: Final = "inconsistent_offsets"
NONMONOTONIC: Final = "nonmonotonic"
SKIPPED: Final = "skipped"
NONMONOTONIC_SEND: Final = "nonmonotonic_send"
G1A: Final = "G1a"
UNEXPECTED: Final = "unexpected"
DOUBLE_ASSIGNMENT: Final = "double_assignment"
COMMIT_REGRESSION: Final = "commit_regression"
UNSEEN: Final = "unseen"
REPLICA_GAP: Final = "replica_gap"
HARD_STATE_REGRESSION: Final = "hard_state_regression"
DOUBLE_VOTE: Final = "double_vote"
METADATA_REGRESSION: Final = "metadata_regression"
LEADERLESS: Final = "leaderless"
INTERNAL_ERROR: Final = "internal_error"

KINDS: Final[dict[str, str]] = {
    LOST: "a committed value is missing from the complete final read of its partition",
    DUPLICATE: "a value is at more than one offset (the harness sends each value once)",
    INCONSISTENT_OFFSETS: "one offset holds different values for different observers",
    NONMONOTONIC: "a consumer's next record is not after its previous one",
    SKIPPED: "a consumer passed over an offset that holds a value",
    NONMONOTONIC_SEND: "a producer's later send landed at a lower offset than its earlier one",
    G1A: "a read observed a value whose send failed (aborted read)",
    UNEXPECTED: "a read observed a value that nobody sent",
    DOUBLE_ASSIGNMENT: "two members of a group owned one partition at once",
    COMMIT_REGRESSION: "a group's committed offset for a partition went backwards",
    REPLICA_GAP: "a replica's own committed log, read to its end, lacks a value placed below it",
    HARD_STATE_REGRESSION: "a broker's Raft term or vote went back across its power loss",
    DOUBLE_VOTE: "a broker voted for two candidates in one term of one Raft group",
    METADATA_REGRESSION: "a topic acknowledged or listed earlier is missing (or shrunk) later",
    LEADERLESS: "a partition had no leader 30 s after every broker was back",
    INTERNAL_ERROR: "a broker stopped with an internal error: a bug, whatever the faults were",
    UNSEEN: "an acknowledged send was never read by anyone (lost, or not yet read)",
}
"""Every kind the checker reports, in report order, with what it means."""


@dataclass(frozen=True, slots=True)
class OpRef:
    """An event of the history that is part of the proof of an anomaly, with its 1-based line."""

    line: int
    event: Event

    def describe(self) -> str:
        """``line N: <event>``, for reports."""
        return f"line {self.line}: {self.event.describe()}"


@dataclass(frozen=True, slots=True)
class Anomaly:
    """One violation (or allowed oddity) found in a history.

    ``ops`` are the events that together prove it, in history order; ``explanation`` says in a
    sentence how. ``allowed`` anomalies are reported and counted but do not make the history
    invalid (an unseen value, a subscribe-mode jump that the history gives no way to tell from a
    rebalance).
    """

    kind: str
    explanation: str
    ops: tuple[OpRef, ...]
    partition: TopicPartition | None = None
    value: str | None = None
    offset: int | None = None
    allowed: bool = False

    @property
    def lines(self) -> tuple[int, ...]:
        """The history lines of ``ops``."""
        return tuple(o.line for o in self.ops)

    def describe(self) -> str:
        """One line for reports: the explanation and the proving lines."""
        tag = " (allowed)" if self.allowed else ""
        lines = ", ".join(str(n) for n in self.lines)
        return f"{self.explanation}{tag} [lines {lines}]"
