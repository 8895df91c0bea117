"""Which member of a consumer group owns which partition: balanced, sticky, computed by the server.

The group's coordinator recomputes the assignment whenever a member joins or leaves (the idea of
Kafka's KIP-848: the server decides, members just follow). ``assign`` is pure and deterministic.
Its promises, for members without a cap (``max_partitions``):

* every partition has exactly one owner (while the group has a member that may take it);
* the shares differ by at most one;
* sticky: a member keeps every partition it owns unless its share shrank, and then gives up
  only the excess, so members whose partitions do not have to move never pause; the partitions
  that do move go from the most loaded members to the least loaded.

A member with a cap (the seed's ``SUBS topic group <n>``) owns at most ``n`` partitions; the rest
are shared by the others as above.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class MemberSpec:
    id: str
    max_partitions: int | None = None


def assign(
    partitions: Sequence[int],
    members: Sequence[MemberSpec],
    current: Mapping[str, frozenset[int]],
) -> dict[str, frozenset[int]]:
    """The new assignment of ``partitions`` to ``members`` (in join order), from ``current``."""
    if not members:
        return {}
    valid = set(partitions)
    holding = {m.id: len(current.get(m.id, frozenset()) & valid) for m in members}
    quota = _quotas(len(partitions), members, holding)
    owned: dict[str, list[int]] = {}
    taken: set[int] = set()
    for m in members:
        keep = sorted(p for p in current.get(m.id, frozenset()) if p in valid and p not in taken)
        keep = keep[: quota[m.id]]  # a shrunk share gives up its highest partitions
        owned[m.id] = keep
        taken.update(keep)
    free = [p for p in sorted(partitions) if p not in taken]
    for p in free:
        hungry = [m for m in members if len(owned[m.id]) < quota[m.id]]
        if not hungry:
            break
        least = min(hungry, key=lambda m: len(owned[m.id]))
        owned[least.id].append(p)
    return {m.id: frozenset(owned[m.id]) for m in members}


def _quotas(
    count: int, members: Sequence[MemberSpec], holding: Mapping[str, int]
) -> dict[str, int]:
    """How many partitions each member should own: capped members first, fair shares after.

    When the shares cannot be equal, the larger ones go to the members holding the most now, so
    that as few partitions as possible move.
    """
    quota: dict[str, int] = {}
    remaining = count
    open_members = list(members)
    # Water-filling: a member whose cap is below the fair share takes its cap, the rest re-share.
    while open_members:
        share = remaining // len(open_members)
        capped = [
            m for m in open_members if m.max_partitions is not None and m.max_partitions <= share
        ]
        if not capped:
            break
        for m in capped:
            quota[m.id] = m.max_partitions or 0
            remaining -= quota[m.id]
            open_members.remove(m)
    if open_members:
        share, extra = divmod(remaining, len(open_members))
        order = sorted(range(len(open_members)), key=lambda i: -holding[open_members[i].id])
        larger = set(order[:extra])
        for i, m in enumerate(open_members):
            quota[m.id] = share + (1 if i in larger else 0)
            if m.max_partitions is not None:
                quota[m.id] = min(quota[m.id], m.max_partitions)
    return quota
