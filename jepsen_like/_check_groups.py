"""Consumer groups: who owned which partition when (``double_assignment``), and committed offsets
that go backwards (``commit_regression``).

* ``double_assignment``: two members of a group owned one partition in the same generation, or
  in time windows that overlap (an ``Assignment`` starts a window; the member's next
  Assignment, Crash, Assign or Subscribe ends it).
* ``commit_regression``: for one (group, partition), an ok ``Commit`` or an ok ``FetchCommitted``
  invoked after an ok commit completed carries a lower offset than that commit (a read of
  "nothing committed" counts as lower). Commits in flight together may land in either order.
  This assumes, as a group does, that only the partition's owner commits it, from where it read.

Both are fed by pass 1; ownership is judged once every window is known, commits as they complete.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import NamedTuple

from ._anomalies import COMMIT_REGRESSION, DOUBLE_ASSIGNMENT
from ._check_findings import Findings, TPKey, show
from .history import Assignment, Commit, Event, FetchCommitted, Process

__all__ = ["Commits", "Ownership"]


class _Window(NamedTuple):
    """A member's ownership of one partition: [start, end) in ns."""

    start: int
    end: int
    owner: tuple[Process, str]  # (process, member id): a restarted member is a new owner
    generation: int
    line: int  # the Assignment event


class Ownership:
    """The partitions each group gave its members, as windows in time."""

    def __init__(self, events: Sequence[Event], findings: Findings) -> None:
        self.events = events
        self.findings = findings
        self.owning: dict[Process, int] = {}  # process -> index of its current Assignment
        self.windows: dict[tuple[str, TPKey], list[_Window]] = {}

    def assigned(self, i: int, ev: Event) -> None:
        """The ok Assignment at event ``i`` replaces what its process owned."""
        self.end(ev.process, ev.time)
        self.owning[ev.process] = i

    def end(self, process: Process, time: int) -> None:
        """The process's current assignment (if any) ends at ``time``."""
        i = self.owning.pop(process, None)
        if i is None:
            return
        ev = self.events[i]
        op = ev.op
        assert isinstance(op, Assignment)  # owning only holds Assignment events
        for tp in op.partitions:
            window = _Window(ev.time, time, (process, op.member), op.generation, i + 1)
            self.windows.setdefault((op.group, tp), []).append(window)

    def end_all(self, time: int) -> None:
        """The history ends at ``time``: every assignment still held ends there."""
        for proc in list(self.owning):
            self.end(proc, time)

    def check(self) -> None:
        """Report ``double_assignment`` (once every window has ended)."""
        reported: set[tuple[int, int]] = set()

        def report(group: str, tp: TPKey, a: _Window, b: _Window, how: str) -> None:
            pair = (min(a.line, b.line), max(a.line, b.line))
            if pair in reported:
                return
            reported.add(pair)
            self.findings.report(
                DOUBLE_ASSIGNMENT,
                f"group {group} gave {show(tp)} to member {a.owner[1]} (generation "
                f"{a.generation}) and member {b.owner[1]} (generation {b.generation}) {how}",
                pair,
                tp=tp,
            )

        for (group, tp), windows in self.windows.items():
            by_generation: dict[int, _Window] = {}
            for w in windows:
                first = by_generation.setdefault(w.generation, w)
                if first.owner != w.owner:
                    report(group, tp, first, w, "in the same generation")
            windows.sort(key=lambda w: (w.start, w.end, w.line))
            active: list[tuple[int, int]] = []  # (end, index) of windows not yet over
            for k, w in enumerate(windows):
                while active and active[0][0] <= w.start:
                    heapq.heappop(active)
                for _, j in active:
                    if windows[j].owner != w.owner:
                        report(group, tp, windows[j], w, "at the same time")
                heapq.heappush(active, (w.end, k))


class Commits:
    """Each (group, partition)'s highest ok commit, held against later commits and reads."""

    def __init__(self, findings: Findings) -> None:
        self.findings = findings
        self.commit_floor: dict[tuple[str, TPKey], tuple[int, int]] = {}  # max ok commit, line
        self.commit_snap: dict[int, tuple[int, int] | None] = {}  # invoke index -> floor then

    def invoked(self, i: int, op: Commit | FetchCommitted) -> None:
        """The commit or committed-offset read at event ``i`` starts: remember the floor then."""
        self.commit_snap[i] = self.commit_floor.get((op.group, (op.topic, op.partition)))

    def abandoned(self, inv: int) -> None:
        """The operation invoked at ``inv`` never completed."""
        self.commit_snap.pop(inv, None)

    def completed(self, line: int, inv: int, ok: bool, op: Commit | FetchCommitted) -> None:
        """The operation invoked at event ``inv`` completes at ``line``, ok or not."""
        snap = self.commit_snap.pop(inv, None)
        if ok:
            self._complete_commit(line, op, snap)

    def _complete_commit(
        self, line: int, op: Commit | FetchCommitted, floor: tuple[int, int] | None
    ) -> None:
        """An ok commit or committed-offset read; ``floor`` is the highest ok commit that had
        completed when it was invoked."""
        tp = (op.topic, op.partition)
        if isinstance(op, Commit):
            if floor is not None and op.offset < floor[0]:
                self.findings.report(
                    COMMIT_REGRESSION,
                    f"group {op.group} committed {show(tp)} offset {op.offset} after a commit "
                    f"of offset {floor[0]} had succeeded",
                    (floor[1], line),
                    tp=tp,
                    offset=op.offset,
                )
            key = (op.group, tp)
            best = self.commit_floor.get(key)
            if best is None or op.offset > best[0]:
                self.commit_floor[key] = (op.offset, line)
        elif floor is not None and (op.offset is None or op.offset < floor[0]):
            got = "nothing" if op.offset is None else f"offset {op.offset}"
            self.findings.report(
                COMMIT_REGRESSION,
                f"group {op.group} read committed {got} for {show(tp)} after a commit of "
                f"offset {floor[0]} had succeeded",
                (floor[1], line),
                tp=tp,
                offset=op.offset,
            )
