"""Who leads each partition, and with which members, as one broker knows it.

Leadership is not stored in the metadata quorum (it changes with every election): each
partition's Raft group knows its own leader, and every broker reports the groups it leads to
every peer, periodically and whenever that changes, with the group's members as that leader
sees them (how a broker knows that a reassignment finished, or that it was removed from a
group). A broker believes, for each group, the claim with the highest term; a claim by a broker
whose connection just closed is dropped at once. A broker that hosts a replica trusts its own Raft
group first: it hears of elections directly.

A claim withdrawn (its broker's connection closed, or its report no longer names the group) does
not hand the group back to a claim of a lower term: a leader of term 5 existed, so one of term 4
is deposed, whether it knows it yet or not (a paused broker that resumes still reports its old
term). Until a claim of that term or later arrives the leader is unknown, and a write waits for
the election instead of going to a leader that must refuse it. Once no broker claims the group
at all (a deleted topic's group), the floor goes with it: a new group of that name starts again
at term 1.
"""

from __future__ import annotations

from collections.abc import Mapping

from kafkaesque.protocol import LeaderClaim

Claim = LeaderClaim
"""A leader's report of one group: its term, its members, and whether they are committed (the
peer message's own type: what a peer reports is what the table holds)."""


class LeaderTable:
    """Peers' leadership claims; pure, no I/O."""

    def __init__(self) -> None:
        # Invariant: _best[g] is the claim of highest term among _claims[*][g] whose term is at
        # least _floor[g] (0 when absent), with its broker; _floor[g] exists only while some
        # broker claims g.
        self._claims: dict[int, dict[str, Claim]] = {}
        self._best: dict[str, tuple[Claim, int]] = {}
        self._floor: dict[str, int] = {}

    def report(self, broker: int, led: Mapping[str, Claim]) -> None:
        """``broker`` says it leads exactly the groups ``led`` now."""
        old = self._claims.get(broker, {})
        self._claims[broker] = dict(led)
        for log_id, claim in led.items():
            best = self._best.get(log_id)
            if best is not None and best[1] == broker:
                if claim.term >= best[0].term:
                    self._best[log_id] = (claim, broker)
                else:  # (a new group of the same name, under a broker that kept its claim)
                    self._recompute(log_id)
            elif claim.term >= self._floor.get(log_id, 0) and (
                best is None or claim.term > best[0].term
            ):
                self._best[log_id] = (claim, broker)
        for log_id in old.keys() - led.keys():
            self._withdrawn(log_id, broker, old[log_id])

    def forget(self, broker: int) -> None:
        """``broker`` is gone (its connection closed): its claims are void."""
        for log_id, claim in self._claims.pop(broker, {}).items():
            self._withdrawn(log_id, broker, claim)

    def leader(self, log_id: str) -> int | None:
        best = self._best.get(log_id)
        return None if best is None else best[1]

    def claim(self, log_id: str) -> Claim | None:
        """The believed leader's report of ``log_id`` (None when no leader is known)."""
        best = self._best.get(log_id)
        return None if best is None else best[0]

    def _withdrawn(self, log_id: str, broker: int, claim: Claim) -> None:
        best = self._best.get(log_id)
        if best is not None and best[1] == broker:
            # The believed leader's term stands: no claim below it is believed from now on.
            self._floor[log_id] = max(self._floor.get(log_id, 0), claim.term)
        self._recompute(log_id)

    def _recompute(self, log_id: str) -> None:
        claims = [(led[log_id], b) for b, led in self._claims.items() if log_id in led]
        if not claims:
            self._best.pop(log_id, None)
            self._floor.pop(log_id, None)
            return
        floor = self._floor.get(log_id, 0)
        current = [c for c in claims if c[0].term >= floor]
        if current:
            self._best[log_id] = max(current, key=lambda c: (c[0].term, c[1]))
        else:
            self._best.pop(log_id, None)
