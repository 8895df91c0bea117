"""What every check of the history checker shares: partition keys, how a proof names partitions
and offsets, and ``Findings``, the anomalies found so far.

A proof cites the events that prove it by line (event ``i`` of the history is line ``i + 1``, as
``read_history`` numbers them), so a reader can find them in the history file.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

from ._anomalies import KINDS, Anomaly, OpRef
from .history import Event, TopicPartition

__all__ = ["MAX_LISTED_OFFSETS", "NS", "Findings", "TPKey", "as_tp", "offsets_text", "show"]

TPKey: TypeAlias = tuple[str, int]
NS = 1_000_000_000
MAX_LISTED_OFFSETS = 8  # a skip over thousands of offsets names the first few


def as_tp(key: TPKey) -> TopicPartition:
    """The public name of a partition key."""
    return TopicPartition(key[0], key[1])


def show(key: TPKey) -> str:
    """``topic/partition``, as explanations name a partition."""
    return f"{key[0]}/{key[1]}"


def offsets_text(offsets: Sequence[int]) -> str:
    """The first ``MAX_LISTED_OFFSETS`` of ``offsets``, and how many more there are."""
    shown = ", ".join(str(o) for o in offsets[:MAX_LISTED_OFFSETS])
    more = len(offsets) - MAX_LISTED_OFFSETS
    return shown + (f" and {more} more" if more > 0 else "")


class Findings:
    """The anomalies found in one history: per kind of ``_anomalies.KINDS`` (every kind present,
    maybe empty), in the order found."""

    def __init__(self, events: Sequence[Event]) -> None:
        self.events = events
        self.found: dict[str, list[Anomaly]] = {k: [] for k in KINDS}

    def report(
        self,
        kind: str,
        explanation: str,
        lines: Sequence[int],
        *,
        tp: TPKey | None = None,
        value: str | None = None,
        offset: int | None = None,
        allowed: bool = False,
    ) -> None:
        """Add an anomaly of ``kind`` proven by the events at ``lines`` (1-based, any order,
        repeats allowed: the proof cites each once, in history order)."""
        ops = tuple(OpRef(n, self.events[n - 1]) for n in sorted(set(lines)))
        part = None if tp is None else as_tp(tp)
        self.found[kind].append(Anomaly(kind, explanation, ops, part, value, offset, allowed))

    def by_kind(self) -> dict[str, tuple[Anomaly, ...]]:
        """What was found, frozen: kind -> its anomalies in the order found."""
        return {k: tuple(v) for k, v in self.found.items()}
