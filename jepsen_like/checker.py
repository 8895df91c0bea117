"""The history checker: Jepsen's Kafka rules, decided from a recorded history alone.

Jepsen's Kafka checker (jepsen/src/jepsen/tests/kafka.clj) infers each partition's *version
order*, offset -> value, from everything observed: ok sends (the broker acknowledged the offset)
and every record any consumer or the final read returned. Our broker reports offsets, so the
order is observed, never searched for, and every rule below is a pass over the history plus a
sort: O(n log n) in the number of events and records.

Rules, per topic-partition (see ``_anomalies.KINDS`` for the one-line versions):

* ``lost``: a value that must have been committed (its send was ``ok``, or was indeterminate,
  ``info`` or never completed, and some read saw it) is missing from a complete (``ok``) final
  read of its partition. Where the final read has it at another offset than acknowledged, that is
  not a loss but a ``duplicate`` or ``inconsistent_offsets`` of the acknowledgement. Without a
  complete final read of a partition loss cannot be told from delay: only ``unseen`` is reported,
  and the partition is listed in ``CheckResult.unchecked_partitions``.
* ``unseen`` (allowed): an ok send no read ever saw. With a complete final read these are lost.
* ``duplicate``: a value observed at more than one offset (the acknowledgement counts as an
  observation). Always an anomaly, with idempotence on or off: the harness never resends a value
  (its plain producers do not retry an unknown outcome), and the broker appends each request
  once (its own retries carry its producer id), so a second copy is the broker's doing.
* ``inconsistent_offsets``: one offset observed with different values (reads, or an ack vs reads).
* ``nonmonotonic`` / ``skipped``: one consumer's successive records of one partition must be
  successive entries of the version order: going back or repeating is nonmonotonic, passing over
  an offset that holds a value is a skip. Gaps where no value was ever observed (control batches)
  are not skips. Checked within one poll and between the polls of one reading session; the first
  record after an ``Assign`` with a seek offset, or after a subscribe-mode member read the
  committed offset (``FetchCommitted``), must be the first value at or after that offset.
  A session ends at ``Assign``, ``Subscribe``, ``Crash`` and, in subscribe mode, at a rebalance
  (an ``Assignment`` event or a change of ``Poll.generation``). A subscribe-mode consumer that
  records neither cannot be told from a rebalancing one, so its jumps between polls are allowed.
  The final read is only checked for going backwards: what it misses is ``lost``.
* ``nonmonotonic_send``: one process's later ok send to a partition acknowledged at an offset not
  above its earlier one.
* ``G1a`` (aborted read): a read saw a value whose send failed.
* ``unexpected``: a read saw a value no send in the history carried (the harness records every
  send, so this is corruption or a value from outside the test).
* ``double_assignment``: two members of a group owned one partition in the same generation, or
  in time windows that overlap (an ``Assignment`` starts a window; the member's next
  Assignment, Crash, Assign or Subscribe ends it).
* ``replica_gap``: every broker's own replicas are read at the end (``ReplicaRead``, ``FETCH
  ... replica=local``), each up to its own high watermark (a follower may be behind: it is held
  only to what it says it has committed). Raft's log matching makes every replica's committed
  log a prefix of one history, so a value placed at an offset below a replica's end (by an ack
  or any read) must be at that offset in that replica's read; missing there, it is a gap (one
  anomaly per replica and partition, naming the first offsets). Replicas that hold different
  values at one offset are ``inconsistent_offsets``, a value at two offsets a ``duplicate``:
  replica reads are observations like any other read.
* ``commit_regression``: for one (group, partition), an ok ``Commit`` or an ok ``FetchCommitted``
  invoked after an ok commit completed carries a lower offset than that commit (a read of
  "nothing committed" counts as lower). Commits in flight together may land in either order.
  This assumes, as a group does, that only the partition's owner commits it, from where it read.

``max_unavailable_s``: for each fault start, the time until the first ok send *invoked* after it
completed (a send in flight when the fault began proves nothing about availability after it);
the maximum over faults, and until the end of the history for a fault after which no send
succeeded.

Per partition (``FaultWindow.partition_gaps``): the longest stretch of a fault's window, from its
start to its stop (or the end of the history), in which no send to the partition was
acknowledged. A fault that stalls one partition (a paused leader holds its partitions, not the
others) shows there, where the whole-cluster figure above is cut short by the first write that
any other partition takes. ``CheckResult.pause_gaps`` is each partition's longest over the
``pause`` faults.
"""

from __future__ import annotations

import dataclasses
import heapq
import os
import sys
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import NamedTuple, TypeAlias

from ._anomalies import (
    COMMIT_REGRESSION,
    DOUBLE_ASSIGNMENT,
    DUPLICATE,
    G1A,
    INCONSISTENT_OFFSETS,
    KINDS,
    LOST,
    NONMONOTONIC,
    NONMONOTONIC_SEND,
    REPLICA_GAP,
    SKIPPED,
    UNEXPECTED,
    UNSEEN,
    Anomaly,
    OpRef,
)
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
    TopicPartition,
    gc_paused,
    read_history,
)

__all__ = ["KINDS", "Anomaly", "CheckResult", "FaultWindow", "OpRef", "check", "check_file", "main"]

TPKey: TypeAlias = tuple[str, int]
_NS = 1_000_000_000
_MAX_LISTED_OFFSETS = 8  # a skip over thousands of offsets names the first few


def _tp(key: TPKey) -> TopicPartition:
    return TopicPartition(key[0], key[1])


def _show(key: TPKey) -> str:
    return f"{key[0]}/{key[1]}"


def _offsets_text(offsets: Sequence[int]) -> str:
    shown = ", ".join(str(o) for o in offsets[:_MAX_LISTED_OFFSETS])
    more = len(offsets) - _MAX_LISTED_OFFSETS
    return shown + (f" and {more} more" if more > 0 else "")


@dataclass(frozen=True, slots=True)
class FaultWindow:
    """One fault as the nemesis recorded it, and the write unavailability that followed it.

    ``end_ns`` is None (and ``end_line`` too) when no stop was recorded: the fault lasted to the
    end of the history. ``recovered`` is False when no send invoked after the start succeeded, in
    which case ``unavailable_s`` runs to the end of the history.
    """

    fault: str
    targets: tuple[str, ...]
    start_ns: int
    end_ns: int | None
    start_line: int
    end_line: int | None
    unavailable_s: float
    recovered: bool
    partition_gaps: tuple[tuple[TopicPartition, float], ...] = ()
    """Per partition written in the history, the longest stretch of the window (seconds) with
    no acknowledged send to it, sorted by partition."""

    def describe(self) -> str:
        """One line for reports."""
        end = "the end" if self.end_ns is None else f"{self.end_ns / _NS:.3f} s"
        after = "no ok send after it" if not self.recovered else "first ok send after"
        lines = (
            f"line {self.start_line}"
            if self.end_line is None
            else f"lines {self.start_line}, {self.end_line}"
        )
        gaps = f"; per partition {self.gaps_text()}" if self.partition_gaps else ""
        return (
            f"{self.fault} {','.join(self.targets) or '-'} from {self.start_ns / _NS:.3f} s to "
            f"{end}: {after} {self.unavailable_s:.3f} s{gaps} [{lines}]"
        )

    def gaps_text(self) -> str:
        """``t/0 3.2 s, t/1 0.1 s``: the longest gap without an ok send, per partition."""
        return ", ".join(f"{t}/{p} {gap:.1f} s" for (t, p), gap in self.partition_gaps)


@dataclass(frozen=True, slots=True)
class CheckResult:
    """What ``check`` found. Counts count every anomaly of their kind, allowed or not.

    ``ops`` counts operations: an invocation with its completion is one, and so is an
    observation recorded alone (an Assignment, a Crash). ``acked`` counts ok sends; ``info_sends``
    the indeterminate ones (``info``, or never completed), of which ``recovered`` were read.

    ``anomalies`` maps every kind of ``_anomalies.KINDS`` (all present, maybe empty) to its
    anomalies in the order found. ``valid`` is True iff no anomaly is of a kind not allowed.
    ``unchecked_partitions`` are partitions that saw sends but no complete final read: losses in
    them show only as ``unseen``.
    """

    valid: bool
    ops: int
    acked: int
    lost: int
    duplicate: int
    inconsistent_offsets: int
    nonmonotonic: int
    skipped: int
    faults: int
    max_unavailable_s: float
    anomalies: Mapping[str, tuple[Anomaly, ...]]
    info_sends: int
    failed_sends: int
    recovered: int
    unseen: int
    fault_windows: tuple[FaultWindow, ...]
    unchecked_partitions: tuple[TopicPartition, ...]
    pause_gaps: Mapping[TopicPartition, float] = dataclasses.field(default_factory=dict)
    """Per partition, the longest stretch of a ``pause`` fault with no ok send to it (s)."""

    def count(self, kind: str) -> int:
        """How many anomalies of ``kind`` were found (allowed ones included)."""
        return len(self.anomalies[kind])

    @property
    def invalid_kinds(self) -> tuple[str, ...]:
        """The kinds with at least one anomaly that is not allowed, in report order."""
        return tuple(k for k, found in self.anomalies.items() if any(not a.allowed for a in found))

    def result_line(self) -> str:
        """The machine-readable last line of ``summary``."""
        return (
            f"RESULT valid={int(self.valid)} ops={self.ops} acked={self.acked} lost={self.lost} "
            f"duplicate={self.duplicate} inconsistent_offsets={self.inconsistent_offsets} "
            f"nonmonotonic={self.nonmonotonic} skipped={self.skipped} faults={self.faults} "
            f"max_unavailable_s={self.max_unavailable_s:.3f}"
        )

    def summary(self, *, examples: int = 5) -> str:
        """The terminal report: counts, up to ``examples`` proofs per kind, the ``examples``
        faults with the longest unavailability, and exactly one ``RESULT ...`` line, last."""
        out = [
            f"history: {self.ops} ops, {self.acked} acked sends, {self.info_sends} indeterminate "
            f"({self.recovered} of them read), {self.failed_sends} failed",
        ]
        if self.unchecked_partitions:
            names = ", ".join(f"{t}/{p}" for t, p in self.unchecked_partitions)
            out.append(f"no complete final read of {names}: losses there show only as unseen")
        for kind, found in self.anomalies.items():
            allowed = sum(a.allowed for a in found)
            note = f" ({allowed} allowed)" if allowed else ""
            out.append(f"{kind}: {len(found)}{note}")
            out.extend(f"  {a.describe()}" for a in found[:examples])
            if len(found) > examples:
                out.append(f"  ... and {len(found) - examples} more")
        out.append(f"faults: {self.faults}, max unavailable {self.max_unavailable_s:.3f} s")
        if self.pause_gaps:
            gaps = ", ".join(f"{t}/{p} {g:.1f} s" for (t, p), g in sorted(self.pause_gaps.items()))
            out.append(f"pause: longest stretch with no ok send, per partition: {gaps}")
        worst = sorted(self.fault_windows, key=lambda w: -w.unavailable_s)[:examples]
        out.extend(f"  {w.describe()}" for w in worst)
        if len(self.fault_windows) > examples:
            out.append(f"  ... and {len(self.fault_windows) - examples} more, less unavailable")
        out.append(self.result_line())
        return "\n".join(out)


def check(events: Sequence[Event]) -> CheckResult:
    """Check a history; event ``i`` is line ``i + 1`` (as ``read_history`` returns them).

    Raises HistoryError if the history is malformed rather than anomalous: a process invoking
    while its previous operation is in flight, a completion that does not match its invocation,
    a value sent twice, an ok send without partition or offset.
    """
    with gc_paused():
        return _Checker(events).run()


def check_file(path: str | os.PathLike[str]) -> CheckResult:
    """``check(read_history(path))``."""
    return check(read_history(path))


# --------------------------------------------------------------------------------------------


class _SendRecord:
    """What the history says about one sent value."""

    __slots__ = ("idempotent", "invoke_time", "line", "offset", "outcome", "process", "tp")

    def __init__(self, process: Process, idempotent: bool, line: int, invoke_time: int) -> None:
        self.process = process
        self.idempotent = idempotent
        self.line = line  # the completion once there is one, else the invocation
        self.invoke_time = invoke_time
        self.outcome = "pending"  # then the completion's type
        self.tp: TPKey | None = None
        self.offset: int | None = None


class _Window(NamedTuple):
    """A member's ownership of one partition: [start, end) in ns."""

    start: int
    end: int
    owner: tuple[Process, str]  # (process, member id): a restarted member is a new owner
    generation: int
    line: int  # the Assignment event


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


class _Checker:
    """One run over one history. Pass 1 (``_scan``) pairs invocations with completions and
    builds the version order; pass 2 (``_check_positions``) replays consumers against it; the
    rest are passes over what pass 1 collected."""

    def __init__(self, events: Sequence[Event]) -> None:
        self.events = events
        self.found: dict[str, list[Anomaly]] = {k: [] for k in KINDS}
        self.ops = 0
        self.end_time = 0
        # Sends.
        self.sends: dict[str, _SendRecord] = {}
        self.acked = 0
        self.last_send: dict[tuple[Process, TPKey], tuple[int, int]] = {}  # -> (offset, line)
        self.ok_send_times: list[tuple[int, int]] = []  # (invoked, completed) of ok sends
        self.ok_times_by_tp: dict[TPKey, list[int]] = {}  # completions of ok sends, in order
        # The version order and who observed it. Invariant: every offset in versions[tp] was
        # observed holding versions[tp][offset][0] by line versions[tp][offset][1].
        self.versions: dict[TPKey, dict[int, tuple[str, int]]] = {}
        self.conflicts: dict[tuple[TPKey, int], dict[str, int]] = {}  # -> {value: first line}
        self.where: dict[str, tuple[TPKey, int, int]] = {}  # value -> first (tp, offset, line)
        self.elsewhere: dict[str, dict[tuple[TPKey, int], int]] = {}  # its other places
        self.first_read: dict[str, int] = {}  # value -> line of the first read that saw it
        self.final_values: dict[int, set[str]] = {}  # line of an ok final read -> its values
        self.final_complete: dict[TPKey, list[int]] = {}  # tp -> lines of ok final reads of it
        self.replica_reads: list[int] = []  # event indexes of ok replica reads
        # Consumers, groups, faults.
        self.consumer_steps: list[int] = []  # event indexes pass 2 replays
        self.owning: dict[Process, int] = {}  # process -> index of its current Assignment
        self.windows: dict[tuple[str, TPKey], list[_Window]] = {}
        self.commit_floor: dict[tuple[str, TPKey], tuple[int, int]] = {}  # max ok commit, line
        self.commit_snap: dict[int, tuple[int, int] | None] = {}  # invoke index -> floor then
        self.open_faults: dict[str, list[tuple[int, int, Nemesis]]] = {}
        self.fault_spans: list[tuple[Nemesis, int, int, int | None, int | None]] = []

    def run(self) -> CheckResult:
        self._scan()
        self._check_positions()
        self._check_values()
        self._check_groups()
        self._check_replicas()
        windows = self._fault_windows()
        found = {k: tuple(v) for k, v in self.found.items()}
        sends = self.sends.values()
        touched = set(self.versions)  # every acknowledged or read partition
        return CheckResult(
            valid=not any(not a.allowed for v in found.values() for a in v),
            ops=self.ops,
            acked=self.acked,
            lost=len(found[LOST]),
            duplicate=len(found[DUPLICATE]),
            inconsistent_offsets=len(found[INCONSISTENT_OFFSETS]),
            nonmonotonic=len(found[NONMONOTONIC]),
            skipped=len(found[SKIPPED]),
            faults=len(windows),
            max_unavailable_s=max((w.unavailable_s for w in windows), default=0.0),
            anomalies=found,
            info_sends=sum(r.outcome in ("info", "pending") for r in sends),
            failed_sends=sum(r.outcome == "fail" for r in sends),
            recovered=sum(
                r.outcome in ("info", "pending") and v in self.first_read
                for v, r in self.sends.items()
            ),
            unseen=len(found[UNSEEN]),
            fault_windows=windows,
            unchecked_partitions=tuple(_tp(k) for k in sorted(touched - set(self.final_complete))),
            pause_gaps=_longest_gaps(w for w in windows if w.fault == "pause"),
        )

    def _ref(self, line: int) -> OpRef:
        return OpRef(line, self.events[line - 1])

    def _report(
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
        ops = tuple(self._ref(n) for n in sorted(set(lines)))
        part = None if tp is None else _tp(tp)
        self.found[kind].append(Anomaly(kind, explanation, ops, part, value, offset, allowed))

    # ---- pass 1 ------------------------------------------------------------------------------

    def _scan(self) -> None:
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
        for proc in list(self.owning):
            self._end_ownership(proc, end)

    def _begin(self, i: int, ev: Event) -> None:
        """The operation at event ``i`` starts (its invocation, or a lone completion)."""
        op = ev.op
        if isinstance(op, Send):
            prior = self.sends.get(op.value)
            if prior is not None:
                raise HistoryError(
                    f"line {i + 1}: value {op.value!r} was already sent (line {prior.line}); "
                    "sent values must be unique"
                )
            self.sends[op.value] = _SendRecord(ev.process, op.idempotent, i + 1, ev.time)
        elif isinstance(op, (Assign, Subscribe, Crash)):
            if isinstance(op, Crash):  # an Assign or Subscribe is replayed at its completion
                self.consumer_steps.append(i)
            self._end_ownership(ev.process, ev.time)
        elif isinstance(op, (Commit, FetchCommitted)):
            self.commit_snap[i] = self.commit_floor.get((op.group, (op.topic, op.partition)))

    def _abandon(self, inv: int) -> None:
        """The operation invoked at ``inv`` never completed: it stays indeterminate."""
        op = self.events[inv].op
        if isinstance(op, Nemesis) and op.phase == "start":
            self.open_faults.setdefault(op.fault, []).append((self.events[inv].time, inv + 1, op))
        self.commit_snap.pop(inv, None)

    def _complete(self, i: int, ev: Event, inv: int | None) -> None:
        """The operation completes at event ``i``; ``inv`` is its invocation, if recorded."""
        op = ev.op
        line = i + 1
        if isinstance(op, Send):
            self._complete_send(i, ev, op, inv)
        elif isinstance(op, Poll):
            if ev.type != "fail" and op.reads:
                self._observe_reads(op.reads, line)
                self.consumer_steps.append(i)
        elif isinstance(op, FinalRead):
            if ev.type != "fail":  # an info drain's records are observations, proof of nothing
                self._observe_reads(op.reads, line)
                self.consumer_steps.append(i)
            if ev.type == "ok":
                self.final_values[line] = {r.value for r in op.reads}
                for tp in op.partitions:
                    self.final_complete.setdefault(tp, []).append(line)
        elif isinstance(op, ReplicaRead):
            if ev.type != "fail":
                self._observe_reads(op.reads, line)
                self.consumer_steps.append(i)
            if ev.type == "ok":
                self.replica_reads.append(i)
        elif isinstance(op, (Assign, Subscribe)):
            # The process polls only after this completes, and a proof should cite the line that
            # shows the outcome, so the reading session is reset here rather than at invocation.
            self.consumer_steps.append(i)
        elif isinstance(op, Assignment):
            if ev.type == "ok":
                self._end_ownership(ev.process, ev.time)
                self.owning[ev.process] = i
                self.consumer_steps.append(i)
        elif isinstance(op, (Commit, FetchCommitted)):
            snap = self.commit_snap.pop(i if inv is None else inv, None)
            if ev.type == "ok":
                self._complete_commit(line, op, snap)
                if isinstance(op, FetchCommitted):
                    self.consumer_steps.append(i)
        elif isinstance(op, Nemesis):
            self._complete_nemesis(i, ev, op, inv)

    def _complete_nemesis(self, i: int, ev: Event, op: Nemesis, inv: int | None) -> None:
        if ev.type == "fail":  # the fault was definitely not injected (or not healed)
            return
        line = i + 1
        # A fault is in force from its start's invocation: that is when availability may end.
        start, start_line = (ev.time, line) if inv is None else (self.events[inv].time, inv + 1)
        if op.phase == "start":
            self.open_faults.setdefault(op.fault, []).append((start, start_line, op))
        else:
            for t0, l0, op0 in self.open_faults.pop(op.fault, []):
                self.fault_spans.append((op0, t0, l0, ev.time, line))

    def _complete_send(self, i: int, ev: Event, op: Send, inv: int | None) -> None:
        line = i + 1
        if inv is not None:
            invoked = self.events[inv].op
            if not isinstance(invoked, Send) or invoked.value != op.value:
                raise HistoryError(f"line {line}: send completes a different value than invoked")
        rec = self.sends[op.value]
        rec.outcome = ev.type
        rec.line = line
        if ev.type != "ok":
            return
        if op.partition is None or op.offset is None:
            raise HistoryError(f"line {line}: an ok send must give its partition and offset")
        tp = (op.topic, op.partition)
        rec.tp = tp
        rec.offset = op.offset
        self.acked += 1
        self.ok_send_times.append((rec.invoke_time, ev.time))
        self.ok_times_by_tp.setdefault(tp, []).append(ev.time)
        self._observe(tp, op.offset, op.value, line)
        key = (ev.process, tp)
        prev = self.last_send.get(key)
        if prev is not None and op.offset <= prev[0]:
            self._report(
                NONMONOTONIC_SEND,
                f"process {ev.process!r} sent {op.value!r} to {_show(tp)} after an ok send at "
                f"offset {prev[0]}, and it was acknowledged at offset {op.offset}",
                (prev[1], line),
                tp=tp,
                value=op.value,
                offset=op.offset,
            )
        self.last_send[key] = (op.offset, line)

    def _observe(self, tp: TPKey, offset: int, value: str, line: int) -> None:
        """Record that ``line`` saw ``value`` at ``tp``/``offset`` (the hot path)."""
        offsets = self.versions.get(tp)
        if offsets is None:
            offsets = self.versions[tp] = {}
        seen = offsets.get(offset)
        if seen is None:
            offsets[offset] = (value, line)
        elif seen[0] != value:
            conflict = self.conflicts.get((tp, offset))
            if conflict is None:
                conflict = self.conflicts[(tp, offset)] = {seen[0]: seen[1]}
            conflict.setdefault(value, line)
        place = self.where.get(value)
        if place is None:
            self.where[value] = (tp, offset, line)
        elif place[1] != offset or place[0] != tp:
            self.elsewhere.setdefault(value, {}).setdefault((tp, offset), line)

    def _observe_reads(self, reads: Sequence[tuple[str, int, int, str]], line: int) -> None:
        observe = self._observe
        first_read = self.first_read
        for topic, partition, offset, value in reads:
            observe((topic, partition), offset, value, line)
            if value not in first_read:
                first_read[value] = line

    def _end_ownership(self, process: Process, time: int) -> None:
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

    def _complete_commit(
        self, line: int, op: Commit | FetchCommitted, floor: tuple[int, int] | None
    ) -> None:
        """An ok commit or committed-offset read; ``floor`` is the highest ok commit that had
        completed when it was invoked."""
        tp = (op.topic, op.partition)
        if isinstance(op, Commit):
            if floor is not None and op.offset < floor[0]:
                self._report(
                    COMMIT_REGRESSION,
                    f"group {op.group} committed {_show(tp)} offset {op.offset} after a commit "
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
            self._report(
                COMMIT_REGRESSION,
                f"group {op.group} read committed {got} for {_show(tp)} after a commit of "
                f"offset {floor[0]} had succeeded",
                (floor[1], line),
                tp=tp,
                offset=op.offset,
            )

    # ---- pass 2: consumers against the version order ------------------------------------------

    def _check_positions(self) -> None:
        order: dict[TPKey, tuple[list[int], dict[int, int]]] = {}
        for tp, offsets in self.versions.items():
            ordered = sorted(offsets)
            order[tp] = (ordered, {o: k for k, o in enumerate(ordered)})
        consumers: dict[Process, _Consumer] = {}
        for i in self.consumer_steps:
            ev = self.events[i]
            op = ev.op
            c = consumers.get(ev.process)
            if c is None:
                c = consumers[ev.process] = _Consumer()
            if isinstance(op, Poll):
                self._check_poll(c, i, op, order)
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

    def _check_poll(
        self,
        c: _Consumer,
        i: int,
        op: Poll,
        order: Mapping[TPKey, tuple[list[int], dict[int, int]]],
    ) -> None:
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
            self._report(
                NONMONOTONIC,
                f"consumer {who!r} read {_show(tp)} offset {offset}{after} {where}",
                (prev_line, line),
                tp=tp,
                value=versions[offset][0],
                offset=offset,
                allowed=allowed,
            )
            return
        passed = ordered[prev + 1 : k]
        self._report(
            SKIPPED,
            f"consumer {who!r} read {_show(tp)} offset {offset}{after} {where}, skipping "
            f"{'offset' if len(passed) == 1 else 'offsets'} {_offsets_text(passed)}, which "
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
                self._report(
                    NONMONOTONIC,
                    f"final read of {_show(tp)} returned offset {offset} after offset {before}",
                    (i + 1,),
                    tp=tp,
                    value=value,
                    offset=offset,
                )
            last[tp] = offset

    # ---- per-value rules ----------------------------------------------------------------------

    def _check_values(self) -> None:
        first_read = self.first_read
        for value, rec in self.sends.items():
            read_line = first_read.get(value)
            if rec.outcome == "fail":
                if read_line is not None:
                    place = self.where[value]
                    self._report(
                        G1A,
                        f"{value!r} was read at {_show(place[0])} offset {place[1]} but its "
                        "send failed",
                        (rec.line, read_line),
                        tp=place[0],
                        value=value,
                        offset=place[1],
                    )
                continue
            if rec.outcome == "ok":
                assert rec.tp is not None  # set by every ok completion
                tp = rec.tp
                if read_line is None:
                    self._report(
                        UNSEEN,
                        f"ok send of {value!r} to {_show(tp)} offset {rec.offset} was never read",
                        (rec.line,),
                        tp=tp,
                        value=value,
                        offset=rec.offset,
                        allowed=True,
                    )
                proof = rec.line
                why = f"acknowledged at offset {rec.offset}"
            elif read_line is not None:  # indeterminate, but a read proves it was committed
                tp = self.where[value][0]
                proof = read_line
                why = f"indeterminate send, read at line {read_line}"
            else:
                continue
            for final_line in self.final_complete.get(tp, ()):
                if value not in self.final_values[final_line]:
                    self._report(
                        LOST,
                        f"{value!r} ({why}) is missing from the final read of {_show(tp)}",
                        (proof, final_line),
                        tp=tp,
                        value=value,
                        offset=rec.offset,
                    )
                    break  # one drain missing it proves the loss; a second one adds nothing
        for value, line in first_read.items():
            if value not in self.sends:
                place = self.where[value]
                self._report(
                    UNEXPECTED,
                    f"{value!r} was read at {_show(place[0])} offset {place[1]} but never sent",
                    (line,),
                    tp=place[0],
                    value=value,
                    offset=place[1],
                )
        self._check_duplicates()
        for (tp, offset), values in self.conflicts.items():
            held = ", ".join(f"{v!r} (line {n})" for v, n in values.items())
            self._report(
                INCONSISTENT_OFFSETS,
                f"{_show(tp)} offset {offset} was observed holding {held}",
                list(values.values()),
                tp=tp,
                offset=offset,
            )

    def _check_duplicates(self) -> None:
        for value, others in self.elsewhere.items():
            tp, offset, line = self.where[value]
            places = [(tp, offset, line)] + [(t, o, n) for (t, o), n in others.items()]
            rec = self.sends.get(value)
            shown = ", ".join(f"{_show(t)}@{o} (line {n})" for t, o, n in places)
            lines = [n for _, _, n in places] + ([] if rec is None else [rec.line])
            why = (
                ""
                if rec is None
                else " though its producer was idempotent"
                if rec.idempotent
                else " though nobody resent it"
            )
            self._report(
                DUPLICATE,
                f"{value!r} was observed at {shown}{why}",
                lines,
                tp=tp,
                value=value,
                offset=offset,
            )

    # ---- replicas -----------------------------------------------------------------------------

    def _check_replicas(self) -> None:
        ordered: dict[TPKey, list[int]] = {}
        for i in self.replica_reads:
            ev = self.events[i]
            op = ev.op
            assert isinstance(op, ReplicaRead)  # replica_reads only holds ReplicaRead events
            held: dict[TPKey, set[int]] = {}
            for topic, partition, offset, _ in op.reads:
                held.setdefault((topic, partition), set()).add(offset)
            for topic, partition, end in op.ends:
                tp = (topic, partition)
                versions = self.versions.get(tp, {})
                offsets = ordered.get(tp)
                if offsets is None:
                    offsets = ordered[tp] = sorted(versions)
                has = held.get(tp, set())
                missing = [o for o in offsets[: bisect_left(offsets, end)] if o not in has]
                if not missing:
                    continue
                first = missing[0]
                self._report(
                    REPLICA_GAP,
                    f"the replica of {_show(tp)} on {ev.node or '?'} read to its end {end} lacks "
                    f"{'offset' if len(missing) == 1 else 'offsets'} {_offsets_text(missing)}, "
                    f"which {'holds a value' if len(missing) == 1 else 'hold values'}",
                    (i + 1, versions[first][1]),
                    tp=tp,
                    value=versions[first][0],
                    offset=first,
                )

    # ---- groups and faults --------------------------------------------------------------------

    def _check_groups(self) -> None:
        reported: set[tuple[int, int]] = set()

        def report(group: str, tp: TPKey, a: _Window, b: _Window, how: str) -> None:
            pair = (min(a.line, b.line), max(a.line, b.line))
            if pair in reported:
                return
            reported.add(pair)
            self._report(
                DOUBLE_ASSIGNMENT,
                f"group {group} gave {_show(tp)} to member {a.owner[1]} (generation "
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

    def _fault_windows(self) -> tuple[FaultWindow, ...]:
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
            until = soonest[k] if recovered else self.end_time
            stop = self.end_time if end is None else end
            out.append(
                FaultWindow(
                    fault=op.fault,
                    targets=op.targets,
                    start_ns=start,
                    end_ns=end,
                    start_line=start_line,
                    end_line=end_line,
                    unavailable_s=max(0, until - start) / _NS,
                    recovered=recovered,
                    partition_gaps=self._gaps(start, stop),
                )
            )
        return tuple(out)

    def _gaps(self, start: int, stop: int) -> tuple[tuple[TopicPartition, float], ...]:
        """Per partition of the history, the longest part of [start, stop] without an ok send
        completing to it (the whole window for one that took none)."""
        out = []
        for tp in sorted(self.versions):
            times = self.ok_times_by_tp.get(tp, [])
            inside = times[bisect_left(times, start) : bisect_left(times, stop)]
            edges = [start, *inside, stop]
            longest = max((b - a for a, b in pairwise(edges)), default=0)
            out.append((_tp(tp), max(0, longest) / _NS))
        return tuple(out)


def _longest_gaps(windows: Iterable[FaultWindow]) -> dict[TopicPartition, float]:
    """Per partition, the longest ``partition_gaps`` entry over ``windows``."""
    out: dict[TopicPartition, float] = {}
    for w in windows:
        for tp, gap in w.partition_gaps:
            out[tp] = max(out.get(tp, 0.0), gap)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m kafkaesque.jepsen_like.checker HISTORY``: print the summary.

    Exit status 0 if the history is valid, 1 if it has anomalies, 2 if it cannot be checked.
    """
    args = sys.argv[1:] if argv is None else list(argv)
    if len(args) != 1:
        print("usage: python -m kafkaesque.jepsen_like.checker HISTORY.jsonl", file=sys.stderr)
        return 2
    try:
        result = check_file(args[0])
    except (HistoryError, OSError) as e:
        print(f"checker: {e}", file=sys.stderr)
        return 2
    print(result.summary())
    return 0 if result.valid else 1


if __name__ == "__main__":
    sys.exit(main())
