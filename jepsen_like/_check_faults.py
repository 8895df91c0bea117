"""Fault windows and unavailability (Jepsen's availability and performance stats).

``Faults`` pairs each nemesis start with its stop in pass 1 and records when every ok send was
invoked and completed; ``measure`` then tells, per fault:

* its unavailability: the time from its start until the first ok send *invoked* after it
  completed (a send in flight when the fault began proves nothing about availability after it),
  or until the end of the history if no send succeeded after it;
* per partition, the longest stretch of its window, from its start to its stop (or the end of
  the history), in which no send to the partition was acknowledged. A fault that stalls one
  partition (a paused leader holds its partitions, not the others) shows there, where the
  whole-cluster figure above is cut short by the first write that any other partition takes.
"""

from __future__ import annotations

import sys
from bisect import bisect_left
from collections.abc import Sequence
from itertools import pairwise
from typing import NamedTuple

from ._check_findings import NS, TPKey, as_tp
from .history import Event, Nemesis, TopicPartition

__all__ = ["Faults", "MeasuredFault"]


class MeasuredFault(NamedTuple):
    """One fault's window and the unavailability that followed it (``checker.FaultWindow``'s
    fields; ``end`` and ``end_line`` are None when no stop was recorded)."""

    op: Nemesis  # the start
    start: int
    start_line: int
    end: int | None
    end_line: int | None
    unavailable_s: float
    recovered: bool  # did an ok send invoked after the start complete?
    partition_gaps: tuple[tuple[TopicPartition, float], ...]


class Faults:
    """The faults of one history, and the times of its ok sends."""

    def __init__(self) -> None:
        self.open_faults: dict[str, list[tuple[int, int, Nemesis]]] = {}
        self.fault_spans: list[tuple[Nemesis, int, int, int | None, int | None]] = []
        self.ok_send_times: list[tuple[int, int]] = []  # (invoked, completed) of ok sends
        self.ok_times_by_tp: dict[TPKey, list[int]] = {}  # completions of ok sends, in order

    def acked(self, tp: TPKey, invoked: int, completed: int) -> None:
        """An ok send to ``tp``, invoked and completed at these times (in completion order)."""
        self.ok_send_times.append((invoked, completed))
        self.ok_times_by_tp.setdefault(tp, []).append(completed)

    def abandoned(self, time: int, line: int, op: Nemesis) -> None:
        """A fault start invoked at ``time`` (``line``) never completed: it may be in force."""
        self.open_faults.setdefault(op.fault, []).append((time, line, op))

    def complete(self, line: int, ev: Event, op: Nemesis, invoked: tuple[int, int] | None) -> None:
        """The nemesis operation completes at ``line``; ``invoked`` is its invocation's (time,
        line), if recorded."""
        if ev.type == "fail":  # the fault was definitely not injected (or not healed)
            return
        # A fault is in force from its start's invocation: that is when availability may end.
        start, start_line = (ev.time, line) if invoked is None else invoked
        if op.phase == "start":
            self.open_faults.setdefault(op.fault, []).append((start, start_line, op))
        else:
            for t0, l0, op0 in self.open_faults.pop(op.fault, []):
                self.fault_spans.append((op0, t0, l0, ev.time, line))

    def measure(self, end_time: int, partitions: Sequence[TPKey]) -> list[MeasuredFault]:
        """Every fault, in order of start, in a history that ends at ``end_time`` (a fault with
        no stop lasts until then); the gaps are of ``partitions``, in that order."""
        spans = list(self.fault_spans)
        for opened in self.open_faults.values():
            spans.extend((op, t0, l0, None, None) for t0, l0, op in opened)
        spans.sort(key=lambda s: (s[1], s[2]))
        sends = sorted(self.ok_send_times)
        invoked = [t for t, _ in sends]
        # soonest[k]: the earliest completion among ok sends invoked at or after invoked[k].
        soonest = [0] * len(sends)
        running = sys.maxsize
        for k in range(len(sends) - 1, -1, -1):
            running = min(running, sends[k][1])
            soonest[k] = running
        out = []
        for op, start, start_line, end, end_line in spans:
            k = bisect_left(invoked, start)
            recovered = k < len(sends)
            until = soonest[k] if recovered else end_time
            stop = end_time if end is None else end
            out.append(
                MeasuredFault(
                    op=op,
                    start=start,
                    start_line=start_line,
                    end=end,
                    end_line=end_line,
                    unavailable_s=max(0, until - start) / NS,
                    recovered=recovered,
                    partition_gaps=self._gaps(start, stop, partitions),
                )
            )
        return out

    def _gaps(
        self, start: int, stop: int, partitions: Sequence[TPKey]
    ) -> tuple[tuple[TopicPartition, float], ...]:
        """Per partition of the history, the longest part of [start, stop] without an ok send
        completing to it (the whole window for one that took none)."""
        out = []
        for tp in partitions:
            times = self.ok_times_by_tp.get(tp, [])
            inside = times[bisect_left(times, start) : bisect_left(times, stop)]
            edges = [start, *inside, stop]
            longest = max((b - a for a, b in pairwise(edges)), default=0)
            out.append((as_tp(tp), max(0, longest) / NS))
        return tuple(out)
