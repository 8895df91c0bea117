"""Who leads each partition, as one broker knows it.

Leadership is not stored in the metadata quorum (it changes with every election): each
partition's Raft group knows its own leader, and every broker reports the groups it leads to
every peer, periodically and whenever that changes. A broker believes, for each group, the claim
with the highest term; a claim by a broker whose connection just closed is dropped at once.
A broker that hosts a replica trusts its own Raft group first: it hears of elections directly.
"""

from __future__ import annotations

from collections.abc import Mapping


class LeaderTable:
    """Peers' leadership claims: ``group id -> (term, broker)``; pure, no I/O."""

    def __init__(self) -> None:
        # Invariant: _best[g] is the claim of highest term among _claims[*][g].
        self._claims: dict[int, dict[str, int]] = {}
        self._best: dict[str, tuple[int, int]] = {}

    def report(self, broker: int, led: Mapping[str, int]) -> None:
        """``broker`` says it leads exactly the groups ``led`` (group id -> term) now."""
        old = self._claims.get(broker, {})
        self._claims[broker] = dict(led)
        for group, term in led.items():
            best = self._best.get(group)
            if best is None or term > best[0] or (term == best[0] and best[1] == broker):
                self._best[group] = (term, broker)
        for group in old.keys() - led.keys():
            self._recompute(group)

    def forget(self, broker: int) -> None:
        """``broker`` is gone (its connection closed): its claims are void."""
        for group in self._claims.pop(broker, {}):
            self._recompute(group)

    def leader(self, group: str) -> int | None:
        best = self._best.get(group)
        return None if best is None else best[1]

    def _recompute(self, group: str) -> None:
        claims = [(led[group], b) for b, led in self._claims.items() if group in led]
        if claims:
            self._best[group] = max(claims)
        else:
            self._best.pop(group, None)
