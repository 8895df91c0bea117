"""Replicas agreeing: ``replica_gap``, every broker's own replica held to the version order.

Every broker's own replicas are read at the end (``ReplicaRead``, ``FETCH ... replica=local``),
each up to its own high watermark (a follower may be behind: it is held only to what it says it
has committed). Raft's log matching makes every replica's committed log a prefix of one history,
so a value placed at an offset below a replica's end (by an ack or any read) must be at that
offset in that replica's read; missing there, it is a gap (one anomaly per replica and
partition, naming the first offsets). Replicas that hold different values at one offset, or one
value at two offsets, need nothing here: replica reads are observations like any other read, so
the version order reports them as ``inconsistent_offsets`` and ``duplicate``.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

from ._anomalies import REPLICA_GAP
from ._check_findings import Findings, TPKey, offsets_text, show
from ._check_versions import VersionOrder
from .history import Event, ReplicaRead

__all__ = ["check_replicas"]


def check_replicas(
    events: Sequence[Event], reads: Sequence[int], versions: VersionOrder, findings: Findings
) -> None:
    """Report ``replica_gap`` for the ok replica reads at event indexes ``reads``, against the
    whole version order."""
    ordered: dict[TPKey, list[int]] = {}
    for i in reads:
        ev = events[i]
        op = ev.op
        assert isinstance(op, ReplicaRead)  # replica_reads only holds ReplicaRead events
        held: dict[TPKey, set[int]] = {}
        for topic, partition, offset, _ in op.reads:
            held.setdefault((topic, partition), set()).add(offset)
        for topic, partition, end in op.ends:
            tp = (topic, partition)
            tp_versions = versions.versions.get(tp, {})
            offsets = ordered.get(tp)
            if offsets is None:
                offsets = ordered[tp] = sorted(tp_versions)
            has = held.get(tp, set())
            missing = [o for o in offsets[: bisect_left(offsets, end)] if o not in has]
            if not missing:
                continue
            first = missing[0]
            findings.report(
                REPLICA_GAP,
                f"the replica of {show(tp)} on {ev.node or '?'} read to its end {end} lacks "
                f"{'offset' if len(missing) == 1 else 'offsets'} {offsets_text(missing)}, "
                f"which {'holds a value' if len(missing) == 1 else 'hold values'}",
                (i + 1, tp_versions[first][1]),
                tp=tp,
                value=tp_versions[first][0],
                offset=first,
            )
