"""The version order: each partition's offset -> value, as the history observed it.

Jepsen's Kafka checker (jepsen/src/jepsen/tests/kafka.clj) infers each partition's *version
order* from everything observed: ok sends (the broker acknowledged the offset) and every record
any consumer or the final read returned. Our broker reports offsets, so the order is observed,
never searched for: ``VersionOrder`` collects the observations in pass 1 and every other check
reads it (consumers are replayed against it, replicas held to it, losses and duplicates found in
it). One rule is about the observations alone, and is reported here:

* ``inconsistent_offsets``: one offset observed with different values (reads, or an ack vs reads).
"""

from __future__ import annotations

from collections.abc import Sequence

from ._anomalies import INCONSISTENT_OFFSETS
from ._check_findings import Findings, TPKey, show

__all__ = ["VersionOrder"]


class VersionOrder:
    """Every observation of a history: what each offset held, and where each value was seen.

    ``versions[tp][offset]`` is the first (value, line) observed there; ``conflicts`` the
    offsets seen holding more than one value; ``where[value]`` the first (tp, offset, line) a
    value was seen at and ``elsewhere[value]`` its other places; ``first_read[value]`` the line
    of the first read (not ack) that saw it.
    """

    def __init__(self) -> None:
        # The version order and who observed it. Invariant: every offset in versions[tp] was
        # observed holding versions[tp][offset][0] by line versions[tp][offset][1].
        self.versions: dict[TPKey, dict[int, tuple[str, int]]] = {}
        self.conflicts: dict[tuple[TPKey, int], dict[str, int]] = {}  # -> {value: first line}
        self.where: dict[str, tuple[TPKey, int, int]] = {}  # value -> first (tp, offset, line)
        self.elsewhere: dict[str, dict[tuple[TPKey, int], int]] = {}  # its other places
        self.first_read: dict[str, int] = {}  # value -> line of the first read that saw it

    def observe(self, tp: TPKey, offset: int, value: str, line: int) -> None:
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

    def observe_reads(self, reads: Sequence[tuple[str, int, int, str]], line: int) -> None:
        """Record the records one read (``line``) returned."""
        observe = self.observe
        first_read = self.first_read
        for topic, partition, offset, value in reads:
            observe((topic, partition), offset, value, line)
            if value not in first_read:
                first_read[value] = line

    def indexed(self) -> dict[TPKey, tuple[list[int], dict[int, int]]]:
        """Per partition, its observed offsets in order and each offset's index in that list."""
        order: dict[TPKey, tuple[list[int], dict[int, int]]] = {}
        for tp, offsets in self.versions.items():
            ordered = sorted(offsets)
            order[tp] = (ordered, {o: k for k, o in enumerate(ordered)})
        return order

    def check_conflicts(self, findings: Findings) -> None:
        """Report ``inconsistent_offsets``: each offset observed holding more than one value."""
        for (tp, offset), values in self.conflicts.items():
            held = ", ".join(f"{v!r} (line {n})" for v, n in values.items())
            findings.report(
                INCONSISTENT_OFFSETS,
                f"{show(tp)} offset {offset} was observed holding {held}",
                list(values.values()),
                tp=tp,
                offset=offset,
            )
