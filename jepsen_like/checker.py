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
* ``hard_state_regression``, ``double_vote``, ``metadata_regression``, ``leaderless``: what
  brokers keep across power losses (``_check_power`` has the rules): a Raft term or vote that
  went back over a power loss (read from the broker's disk before and after the cut), two votes
  in one term, a topic acknowledged or listed earlier that a broker's METADATA lacks once every
  broker is back, a partition with no leader 30 s after every broker is back.
* ``internal_error``: a line of a broker's log, found by the harness after the run
  (``InternalErrors``), that reports an internal error: the broker stopped on a bug. No fault
  excuses one (a fault a broker cannot survive ends it with a clear error, not this).

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

Each group of rules is a module of its own, fed by one pass over the history (``_check_scan``):
the version order and ``inconsistent_offsets`` (``_check_versions``); sends against reads,
``lost``, ``unseen``, ``duplicate``, ``nonmonotonic_send``, ``G1a``, ``unexpected``
(``_check_sends``); consumers against the order, ``nonmonotonic``, ``skipped``
(``_check_consumers``); ``double_assignment`` and ``commit_regression`` (``_check_groups``);
``replica_gap`` (``_check_replicas``); durable state after power losses (``_check_power``);
fault windows and unavailability (``_check_faults``).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ._anomalies import (
    DUPLICATE,
    INCONSISTENT_OFFSETS,
    INTERNAL_ERROR,
    KINDS,
    LOST,
    NONMONOTONIC,
    SKIPPED,
    UNSEEN,
    Anomaly,
    OpRef,
)
from ._check_consumers import check_positions
from ._check_faults import MeasuredFault
from ._check_findings import NS, Findings, as_tp
from ._check_power import check_power
from ._check_replicas import check_replicas
from ._check_scan import Scan
from .history import (
    Event,
    HistoryError,
    InternalErrors,
    TopicPartition,
    gc_paused,
    read_history,
)

__all__ = ["KINDS", "Anomaly", "CheckResult", "FaultWindow", "OpRef", "check", "check_file", "main"]


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
        end = "the end" if self.end_ns is None else f"{self.end_ns / NS:.3f} s"
        after = "no ok send after it" if not self.recovered else "first ok send after"
        lines = (
            f"line {self.start_line}"
            if self.end_line is None
            else f"lines {self.start_line}, {self.end_line}"
        )
        gaps = f"; per partition {self.gaps_text()}" if self.partition_gaps else ""
        return (
            f"{self.fault} {','.join(self.targets) or '-'} from {self.start_ns / NS:.3f} s to "
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
        return _run(events)


def check_file(path: str | os.PathLike[str]) -> CheckResult:
    """``check(read_history(path))``."""
    return check(read_history(path))


def _check_internal_errors(events: Sequence[Event], findings: Findings) -> None:
    for i, ev in enumerate(events):
        if ev.type == "ok" and isinstance(ev.op, InternalErrors):
            for line in ev.op.lines:
                findings.report(INTERNAL_ERROR, line, (i + 1,))


def _run(events: Sequence[Event]) -> CheckResult:
    """One run over one history. Pass 1 (``Scan``) pairs invocations with completions and
    builds the version order; pass 2 (``check_positions``) replays consumers against it; the
    rest are passes over what pass 1 collected."""
    scan = Scan(events)
    scan.run()
    findings = scan.findings
    check_positions(events, scan.consumer_steps, scan.versions, findings)
    scan.sends.check()
    scan.versions.check_conflicts(findings)
    scan.ownership.check()
    check_replicas(events, scan.replica_reads, scan.versions, findings)
    check_power(events, findings)
    _check_internal_errors(events, findings)
    touched = sorted(scan.versions.versions)  # every acknowledged or read partition
    windows = tuple(_window(m) for m in scan.faults.measure(scan.end_time, touched))
    found = findings.by_kind()
    sends = scan.sends
    return CheckResult(
        valid=not any(not a.allowed for v in found.values() for a in v),
        ops=scan.ops,
        acked=sends.acked,
        lost=len(found[LOST]),
        duplicate=len(found[DUPLICATE]),
        inconsistent_offsets=len(found[INCONSISTENT_OFFSETS]),
        nonmonotonic=len(found[NONMONOTONIC]),
        skipped=len(found[SKIPPED]),
        faults=len(windows),
        max_unavailable_s=max((w.unavailable_s for w in windows), default=0.0),
        anomalies=found,
        info_sends=sends.info_sends,
        failed_sends=sends.failed_sends,
        recovered=sends.recovered,
        unseen=len(found[UNSEEN]),
        fault_windows=windows,
        unchecked_partitions=tuple(
            as_tp(k) for k in sorted(set(touched) - set(sends.final_complete))
        ),
        pause_gaps=_longest_gaps(w for w in windows if w.fault == "pause"),
    )


def _window(m: MeasuredFault) -> FaultWindow:
    return FaultWindow(
        fault=m.op.fault,
        targets=m.op.targets,
        start_ns=m.start,
        end_ns=m.end,
        start_line=m.start_line,
        end_line=m.end_line,
        unavailable_s=m.unavailable_s,
        recovered=m.recovered,
        partition_gaps=m.partition_gaps,
    )


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
