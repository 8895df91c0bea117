"""Pass 2: every consumer's reads replayed against the version order (``nonmonotonic``,
``skipped``), as Jepsen's Kafka checker holds each consumer to the log's order.

One consumer's successive records of one partition must be successive entries of the version
order: going back or repeating is ``nonmonotonic``, passing over an offset that holds a value is
a ``skip``. Gaps where no value was ever observed (control batches) are not skips. Checked within
one poll and between the polls of one reading session; the first record after an ``Assign`` with
a seek offset, or after a subscribe-mode member read the committed offset (``FetchCommitted``),
must be the first value at or after that offset. A session ends at ``Assign``, ``Subscribe``,
``Crash`` and, in subscribe mode, at a rebalance (an ``Assignment`` event or a change of
``Poll.generation``). A subscribe-mode consumer that records neither cannot be told from a
rebalancing one, so its jumps between polls are allowed. The final read (and a replica read) is
only checked for going backwards: what it misses is ``lost`` (or a ``replica_gap``).

The version order must be whole before a consumer is judged against it, hence a second pass,
over only the events pass 1 listed (``steps``).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

from ._anomalies import NONMONOTONIC, SKIPPED
from ._check_findings import Findings, TPKey, offsets_text, show
from ._check_versions import VersionOrder
from .history import (
    Assign,
    Assignment,
    Crash,
    Event,
    FetchCommitted,
    FinalRead,
    Poll,
    Process,
    ReplicaRead,
    Subscribe,
)

__all__ = ["check_positions"]


class _Consumer:
    """The reading session of one consumer process (pass 2)."""

    __slots__ = ("evidence", "generation", "mode", "positions", "seeks")

    def __init__(self) -> None:
        self.mode = ""  # "assign", "subscribe", or "" before either
        self.evidence = False  # did this subscriber ever record a generation or assignment?
        self.generation: int | None = None
        self.positions: dict[TPKey, tuple[int, int]] = {}  # tp -> (index in order, line)
        self.seeks: dict[TPKey, tuple[int, int]] = {}  # tp -> (start offset, Assign line)

    def reset(self) -> None:
        self.positions.clear()
        self.seeks.clear()
        self.generation = None


def check_positions(
    events: Sequence[Event], steps: Sequence[int], versions: VersionOrder, findings: Findings
) -> None:
    """Replay the events at indexes ``steps`` (in history order, as pass 1 listed them: the
    reads that did not fail, the session's starts and ends, ok Assignments and ok committed
    offset reads) against the whole version order; report ``nonmonotonic`` and ``skipped``."""
    _Replay(events, versions, findings).run(steps)


class _Replay:
    """Pass 2 over one history."""

    def __init__(self, events: Sequence[Event], versions: VersionOrder, findings: Findings) -> None:
        self.events = events
        self.versions = versions.versions
        self.order = versions.indexed()
        self.report = findings.report

    def run(self, steps: Sequence[int]) -> None:
        consumers: dict[Process, _Consumer] = {}
        for i in steps:
            ev = self.events[i]
            op = ev.op
            c = consumers.get(ev.process)
            if c is None:
                c = consumers[ev.process] = _Consumer()
            if isinstance(op, Poll):
                self._check_poll(c, i, op)
            elif isinstance(op, Assign):
                c.reset()
                c.mode = "assign"
                for s in op.partitions:
                    if s.offset is not None:
                        c.seeks[(s.topic, s.partition)] = (s.offset, i + 1)
            elif isinstance(op, Subscribe):
                c.reset()
                c.mode = "subscribe"
            elif isinstance(op, Crash):
                c.reset()
            elif isinstance(op, Assignment):
                c.positions.clear()  # a rebalance: the position may jump...
                c.seeks.clear()
                c.evidence = True
            elif isinstance(op, FetchCommitted):
                if c.mode == "subscribe" and op.offset is not None:
                    # ...but only to where the group committed, when the member says so.
                    c.seeks[(op.topic, op.partition)] = (op.offset, i + 1)
            elif isinstance(op, (FinalRead, ReplicaRead)):
                self._check_final_order(i, op)

    def _check_poll(self, c: _Consumer, i: int, op: Poll) -> None:
        line = i + 1
        subscribe = c.mode == "subscribe" or op.group is not None
        if op.generation is not None:
            if c.generation is not None and op.generation != c.generation:
                c.positions.clear()  # a rebalance happened between the two polls
            c.generation = op.generation
            c.evidence = True
        lenient = subscribe and not c.evidence
        who = self.events[i].process
        positions = c.positions
        order = self.order
        for topic, partition, offset, _ in op.reads:
            tp = (topic, partition)
            ordered, index = order[tp]
            k = index[offset]
            prev = positions.get(tp)
            if prev is not None:
                if k != prev[0] + 1:
                    allowed = lenient and prev[1] != line
                    self._jump(who, tp, ordered, prev[0], k, prev[1], line, allowed)
            elif c.seeks:
                seek = c.seeks.pop(tp, None)
                if seek is not None:
                    expected = bisect_left(ordered, seek[0])
                    if k != expected:
                        self._jump(who, tp, ordered, expected - 1, k, seek[1], line, False, seek[0])
            positions[tp] = (k, line)

    def _jump(
        self,
        who: Process,
        tp: TPKey,
        ordered: list[int],
        prev: int,
        k: int,
        prev_line: int,
        line: int,
        allowed: bool,
        seek: int | None = None,
    ) -> None:
        """A consumer's record at index ``k`` of ``tp``'s order did not follow index ``prev``
        (or, with ``seek``, was not the first at or after the assigned start offset)."""
        offset = ordered[k]
        where = "in one poll" if prev_line == line else "between polls"
        if seek is not None:
            where = f"as its first record from offset {seek}"
        after = "" if prev < 0 else f" after offset {ordered[prev]}"
        versions = self.versions[tp]
        if k <= prev:
            self.report(
                NONMONOTONIC,
                f"consumer {who!r} read {show(tp)} offset {offset}{after} {where}",
                (prev_line, line),
                tp=tp,
                value=versions[offset][0],
                offset=offset,
                allowed=allowed,
            )
            return
        passed = ordered[prev + 1 : k]
        self.report(
            SKIPPED,
            f"consumer {who!r} read {show(tp)} offset {offset}{after} {where}, skipping "
            f"{'offset' if len(passed) == 1 else 'offsets'} {offsets_text(passed)}, which "
            f"{'holds a value' if len(passed) == 1 else 'hold values'}",
            (prev_line, line, versions[passed[0]][1]),
            tp=tp,
            value=versions[passed[0]][0],
            offset=passed[0],
            allowed=allowed,
        )

    def _check_final_order(self, i: int, op: FinalRead | ReplicaRead) -> None:
        last: dict[TPKey, int] = {}
        for topic, partition, offset, value in op.reads:
            tp = (topic, partition)
            before = last.get(tp)
            if before is not None and offset <= before:
                self.report(
                    NONMONOTONIC,
                    f"final read of {show(tp)} returned offset {offset} after offset {before}",
                    (i + 1,),
                    tp=tp,
                    value=value,
                    offset=offset,
                )
            last[tp] = offset
