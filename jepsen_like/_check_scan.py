"""Pass 1 of the checker: one walk over the history that pairs each invocation with its
completion and feeds every check what it needs.

The walk raises HistoryError where the history is malformed rather than anomalous (a process
invoking while its previous operation is in flight, a completion that does not match its
invocation, a value sent twice, an ok send without partition or offset). On the way it builds the
version order (``_check_versions``), follows each send (``_check_sends``), ownership windows and
commits (``_check_groups``), faults and the times of ok sends (``_check_faults``), and lists the
events the later passes replay: the consumers' (``_check_consumers``) and the ok replica reads
(``_check_replicas``). Everything after it is a pass over what it collected, so the whole check
is O(n log n) in the number of events and records.
"""

from __future__ import annotations

from collections.abc import Sequence

from ._check_faults import Faults
from ._check_findings import Findings
from ._check_groups import Commits, Ownership
from ._check_sends import Sends
from ._check_versions import VersionOrder
from .history import (
    OBSERVATIONS,
    Assign,
    Assignment,
    Commit,
    Crash,
    Event,
    FetchCommitted,
    FinalRead,
    HistoryError,
    Nemesis,
    Poll,
    Process,
    ReplicaRead,
    Send,
    Subscribe,
)

__all__ = ["Scan"]


class Scan:
    """Pass 1 over one history (``run``), and what it collected for the checks."""

    def __init__(self, events: Sequence[Event]) -> None:
        self.events = events
        self.findings = Findings(events)
        self.ops = 0
        self.end_time = 0
        self.versions = VersionOrder()
        self.sends = Sends(self.findings, self.versions)
        self.ownership = Ownership(events, self.findings)
        self.commits = Commits(self.findings)
        self.faults = Faults()
        self.consumer_steps: list[int] = []  # event indexes pass 2 replays
        self.replica_reads: list[int] = []  # event indexes of ok replica reads

    def run(self) -> None:
        """Walk the history once. Raises HistoryError if it is malformed."""
        events = self.events
        pending: dict[Process, int] = {}  # process -> index of its in-flight invocation
        end = 0
        for i, ev in enumerate(events):
            end = max(end, ev.time)
            proc = ev.process
            if ev.type == "invoke":
                if proc in pending:
                    raise HistoryError(
                        f"line {i + 1}: process {proc!r} invokes while its operation at line "
                        f"{pending[proc] + 1} is in flight"
                    )
                pending[proc] = i
                self.ops += 1
                self._begin(i, ev)
                continue
            inv = pending.get(proc)
            if inv is not None and type(events[inv].op) is type(ev.op):
                del pending[proc]
            else:
                if inv is not None:
                    if not isinstance(ev.op, OBSERVATIONS):
                        raise HistoryError(
                            f"line {i + 1}: {ev.op.F} completes while process {proc!r} has "
                            f"{events[inv].op.F} (line {inv + 1}) in flight"
                        )
                    if isinstance(ev.op, Crash):  # the crash abandons the operation in flight
                        del pending[proc]
                        self._abandon(inv)
                inv = None
                self.ops += 1
                self._begin(i, ev)  # a lone completion is its own invocation
            self._complete(i, ev, inv)
        self.end_time = end
        for inv in pending.values():
            self._abandon(inv)
        self.ownership.end_all(end)

    def _begin(self, i: int, ev: Event) -> None:
        """The operation at event ``i`` starts (its invocation, or a lone completion)."""
        op = ev.op
        if isinstance(op, Send):
            self.sends.begin(i + 1, ev, op)
        elif isinstance(op, (Assign, Subscribe, Crash)):
            if isinstance(op, Crash):  # an Assign or Subscribe is replayed at its completion
                self.consumer_steps.append(i)
            self.ownership.end(ev.process, ev.time)
        elif isinstance(op, (Commit, FetchCommitted)):
            self.commits.invoked(i, op)

    def _abandon(self, inv: int) -> None:
        """The operation invoked at ``inv`` never completed: it stays indeterminate."""
        ev = self.events[inv]
        op = ev.op
        if isinstance(op, Nemesis) and op.phase == "start":
            self.faults.abandoned(ev.time, inv + 1, op)
        self.commits.abandoned(inv)

    def _complete(self, i: int, ev: Event, inv: int | None) -> None:
        """The operation completes at event ``i``; ``inv`` is its invocation, if recorded."""
        op = ev.op
        line = i + 1
        if isinstance(op, Send):
            invoked = None if inv is None else self.events[inv].op
            rec = self.sends.complete(line, ev, op, invoked)
            if rec is not None:
                assert rec.tp is not None  # set by every ok completion
                self.faults.acked(rec.tp, rec.invoke_time, ev.time)
        elif isinstance(op, Poll):
            if ev.type != "fail" and op.reads:
                self.versions.observe_reads(op.reads, line)
                self.consumer_steps.append(i)
        elif isinstance(op, FinalRead):
            if ev.type != "fail":  # an info drain's records are observations, proof of nothing
                self.versions.observe_reads(op.reads, line)
                self.consumer_steps.append(i)
            if ev.type == "ok":
                self.sends.final_read(line, op)
        elif isinstance(op, ReplicaRead):
            if ev.type != "fail":
                self.versions.observe_reads(op.reads, line)
                self.consumer_steps.append(i)
            if ev.type == "ok":
                self.replica_reads.append(i)
        elif isinstance(op, (Assign, Subscribe)):
            # The process polls only after this completes, and a proof should cite the line that
            # shows the outcome, so the reading session is reset here rather than at invocation.
            self.consumer_steps.append(i)
        elif isinstance(op, Assignment):
            if ev.type == "ok":
                self.ownership.assigned(i, ev)
                self.consumer_steps.append(i)
        elif isinstance(op, (Commit, FetchCommitted)):
            self.commits.completed(line, i if inv is None else inv, ev.type == "ok", op)
            if ev.type == "ok" and isinstance(op, FetchCommitted):
                self.consumer_steps.append(i)
        elif isinstance(op, Nemesis):
            invoked_at = None if inv is None else (self.events[inv].time, inv + 1)
            self.faults.complete(line, ev, op, invoked_at)
