"""What was sent against what was read: lost, unseen, aborted, unexpected and duplicated writes,
and one producer's acknowledgements going backwards (Jepsen's queue and set checkers).

``Sends`` follows every sent value through pass 1 (its invocation, its completion, the complete
final reads) and ``check`` then judges each value against the version order:

* ``lost``: a value that must have been committed (its send was ``ok``, or was indeterminate and
  some read saw it) is missing from a complete (``ok``) final read of its partition. Without a
  complete final read loss cannot be told from delay, and only ``unseen`` is reported.
* ``unseen`` (allowed): an ok send no read ever saw.
* ``duplicate``: a value observed at more than one offset (the acknowledgement counts as an
  observation). Always an anomaly: the harness never resends a value and the broker appends
  each request once, so a second copy is the broker's doing.
* ``nonmonotonic_send``: one process's later ok send to a partition acknowledged at an offset not
  above its earlier one.
* ``G1a`` (aborted read): a read saw a value whose send failed.
* ``unexpected``: a read saw a value no send in the history carried.
"""

from __future__ import annotations

from ._anomalies import DUPLICATE, G1A, LOST, NONMONOTONIC_SEND, UNEXPECTED, UNSEEN
from ._check_findings import Findings, TPKey, show
from ._check_versions import VersionOrder
from .history import Event, FinalRead, HistoryError, Op, Process, Send

__all__ = ["SendRecord", "Sends"]


class SendRecord:
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


class Sends:
    """Every sent value of one history, and the complete final reads that hold them to account."""

    def __init__(self, findings: Findings, versions: VersionOrder) -> None:
        self.findings = findings
        self.versions = versions
        self.records: dict[str, SendRecord] = {}
        self.acked = 0
        self.last_send: dict[tuple[Process, TPKey], tuple[int, int]] = {}  # -> (offset, line)
        self.final_values: dict[int, set[str]] = {}  # line of an ok final read -> its values
        self.final_complete: dict[TPKey, list[int]] = {}  # tp -> lines of ok final reads of it

    def begin(self, line: int, ev: Event, op: Send) -> None:
        """A send starts at ``line`` (its invocation, or a lone completion).

        Raises HistoryError if its value was sent before: sent values must be unique.
        """
        prior = self.records.get(op.value)
        if prior is not None:
            raise HistoryError(
                f"line {line}: value {op.value!r} was already sent (line {prior.line}); "
                "sent values must be unique"
            )
        self.records[op.value] = SendRecord(ev.process, op.idempotent, line, ev.time)

    def complete(self, line: int, ev: Event, op: Send, invoked: Op | None) -> SendRecord | None:
        """The send completes at ``line``; ``invoked`` is its invocation's op, if recorded.
        Returns its record if it is ok (acknowledged at ``record.tp``/``record.offset``).

        Raises HistoryError if it completes another value than invoked, or is ok without a
        partition or offset.
        """
        if invoked is not None and (not isinstance(invoked, Send) or invoked.value != op.value):
            raise HistoryError(f"line {line}: send completes a different value than invoked")
        rec = self.records[op.value]
        rec.outcome = ev.type
        rec.line = line
        if ev.type != "ok":
            return None
        if op.partition is None or op.offset is None:
            raise HistoryError(f"line {line}: an ok send must give its partition and offset")
        tp = (op.topic, op.partition)
        rec.tp = tp
        rec.offset = op.offset
        self.acked += 1
        self.versions.observe(tp, op.offset, op.value, line)
        key = (ev.process, tp)
        prev = self.last_send.get(key)
        if prev is not None and op.offset <= prev[0]:
            self.findings.report(
                NONMONOTONIC_SEND,
                f"process {ev.process!r} sent {op.value!r} to {show(tp)} after an ok send at "
                f"offset {prev[0]}, and it was acknowledged at offset {op.offset}",
                (prev[1], line),
                tp=tp,
                value=op.value,
                offset=op.offset,
            )
        self.last_send[key] = (op.offset, line)
        return rec

    def final_read(self, line: int, op: FinalRead) -> None:
        """An ok (complete) final read at ``line``: what it holds is what its partitions hold."""
        self.final_values[line] = {r.value for r in op.reads}
        for tp in op.partitions:
            self.final_complete.setdefault(tp, []).append(line)

    @property
    def info_sends(self) -> int:
        """Indeterminate sends: ``info``, or never completed."""
        return sum(r.outcome in ("info", "pending") for r in self.records.values())

    @property
    def failed_sends(self) -> int:
        """Sends that definitely failed."""
        return sum(r.outcome == "fail" for r in self.records.values())

    @property
    def recovered(self) -> int:
        """Indeterminate sends that some read saw."""
        first_read = self.versions.first_read
        return sum(
            r.outcome in ("info", "pending") and v in first_read for v, r in self.records.items()
        )

    # ---- per-value rules ----------------------------------------------------------------------

    def check(self) -> None:
        """Report ``G1a``, ``unseen``, ``lost``, ``unexpected`` and ``duplicate`` (after pass 1)."""
        report = self.findings.report
        first_read = self.versions.first_read
        where = self.versions.where
        for value, rec in self.records.items():
            read_line = first_read.get(value)
            if rec.outcome == "fail":
                if read_line is not None:
                    place = where[value]
                    report(
                        G1A,
                        f"{value!r} was read at {show(place[0])} offset {place[1]} but its "
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
                    report(
                        UNSEEN,
                        f"ok send of {value!r} to {show(tp)} offset {rec.offset} was never read",
                        (rec.line,),
                        tp=tp,
                        value=value,
                        offset=rec.offset,
                        allowed=True,
                    )
                proof = rec.line
                why = f"acknowledged at offset {rec.offset}"
            elif read_line is not None:  # indeterminate, but a read proves it was committed
                tp = where[value][0]
                proof = read_line
                why = f"indeterminate send, read at line {read_line}"
            else:
                continue
            for final_line in self.final_complete.get(tp, ()):
                if value not in self.final_values[final_line]:
                    report(
                        LOST,
                        f"{value!r} ({why}) is missing from the final read of {show(tp)}",
                        (proof, final_line),
                        tp=tp,
                        value=value,
                        offset=rec.offset,
                    )
                    break  # one drain missing it proves the loss; a second one adds nothing
        for value, line in first_read.items():
            if value not in self.records:
                place = where[value]
                report(
                    UNEXPECTED,
                    f"{value!r} was read at {show(place[0])} offset {place[1]} but never sent",
                    (line,),
                    tp=place[0],
                    value=value,
                    offset=place[1],
                )
        self._check_duplicates()

    def _check_duplicates(self) -> None:
        where = self.versions.where
        for value, others in self.versions.elsewhere.items():
            tp, offset, line = where[value]
            places = [(tp, offset, line)] + [(t, o, n) for (t, o), n in others.items()]
            rec = self.records.get(value)
            shown = ", ".join(f"{show(t)}@{o} (line {n})" for t, o, n in places)
            lines = [n for _, _, n in places] + ([] if rec is None else [rec.line])
            why = (
                ""
                if rec is None
                else " though its producer was idempotent"
                if rec.idempotent
                else " though nobody resent it"
            )
            self.findings.report(
                DUPLICATE,
                f"{value!r} was observed at {shown}{why}",
                lines,
                tp=tp,
                value=value,
                offset=offset,
            )
