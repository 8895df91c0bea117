"""Leader balancing: every broker gives the groups it leads back to their preferred replicas.

The assignment (``TopicInfo.replicas``) lists each partition's replicas preferred first, and
spreads the first replicas evenly over the brokers (``_metadata_view.assign_replicas``): when every
group is led by its preferred replica, leaderships are even. Elections break that: a broker that
stops or restarts loses its leaderships to the others, and nothing gives them back.

The design is the simplest one that cannot fight itself. No controller decides; each broker
looks only at the groups it leads and moves a leadership in one direction only: to the group's
preferred replica, never away from it. A preferred leader never moves its group, so a group moves
at most once per election, and two brokers can never pass a group back and forth. The move is
a Raft leadership transfer (TimeoutNow, as the graceful shutdown does), so writes see a round
trip of latency, not an error; it is made only when the preferred replica is:

* a voter of the group (not a learner, not a replica being moved in or out);
* alive: connected to this broker and heard from lately by the group (``recent_active``);
* caught up: its log holds everything committed (``match >= commit``), so the transfer is one
  round trip, not a catch-up;

and only for a leadership this broker has held for ``hold_s`` at least. The hold keeps a group
from going straight back to a preferred replica that just handed it over because it is shutting
down (it is still connected while it drains), and lets a restarted broker settle before it
takes work back. Moves are rate-limited per broker (``--leader-balance-rate``, transfers a
second, a token bucket) so that a broker coming back does not trigger hundreds of elections
at once; 0 turns balancing off.

What this does not do: spread leaderships by count over brokers the assignment does not favour
(a broker that joined leads nothing until partitions are assigned to it, by a new topic, an
``ALTER``, a ``REASSIGN`` or a decommission). Preferred replicas are the single source of truth
for where a leadership belongs, as in Kafka's ``auto.leader.rebalance.enable``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import trio

from kafkaesque.raft import NotLeader, ProposalDropped, RaftUsageError, Role, Status
from kafkaesque.raft.driver import MultiRaft

log = logging.getLogger("kafkaesque.broker.balancer")

DEFAULT_LEADER_BALANCE_RATE = 50.0
"""Leader transfers a second a broker may start to give groups back to their preferred replicas."""

DEFAULT_HOLD_S = 6.0
"""How long a leadership stays where it was won before it may be given back (above the default
shutdown timeout's hand-over, so a draining broker is not handed back what it gave away)."""

_PASS_S = 0.05  # how often the groups led here are looked at
_ASK_AGAIN_S = 1.0  # a transfer asked this long ago without effect may be asked again
_BURST_S = 1.0  # the token bucket holds this many seconds' worth of transfers


def preferred_target(status: Status, preferred: int, reachable: Collection[int]) -> int | None:
    """``preferred`` if the group whose leader's state is ``status`` should be moved to it now,
    else None.

    Pure. Only a leader moves a group, only to another broker, and only to a voter (not a
    learner) that is ``reachable`` (connected), heard from lately, and holds every committed
    entry.
    """
    if status.role is not Role.LEADER or preferred == status.id:
        return None
    if preferred not in status.configuration.voters or preferred not in reachable:
        return None
    progress = status.progress.get(preferred)
    if progress is None or progress.is_learner or not progress.recent_active:
        return None
    if progress.match < status.commit:
        return None
    return preferred


@dataclass
class TokenBucket:
    """``rate`` tokens a second, at most ``capacity`` saved up; time is given by the caller."""

    rate: float
    capacity: float
    tokens: float = 0.0
    at: float | None = None

    def refill(self, now: float) -> None:
        if self.at is not None:
            self.tokens = min(self.capacity, self.tokens + (now - self.at) * self.rate)
        self.at = now

    def take(self) -> bool:
        """Spend one token if there is one."""
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


@dataclass
class LeaderBalancer:
    """The balancing loop of one broker (see the module docstring).

    ``preferred(group_id)`` gives the group's preferred replica from the metadata (None: not
    known, e.g. a topic being deleted); ``reachable()`` the peers connected now. ``transfers``
    counts the transfers it started (for tests and metrics). ``stop()`` ends balancing for good
    (a draining broker must not move groups around while it hands them over).
    """

    raft: MultiRaft
    preferred: Callable[[str], int | None]
    reachable: Callable[[], Collection[int]]
    rate: float = DEFAULT_LEADER_BALANCE_RATE
    hold_s: float = DEFAULT_HOLD_S
    transfers: int = 0
    _won: dict[str, tuple[int, float]] = field(default_factory=dict)  # group -> (term, since)
    _asked: dict[str, float] = field(default_factory=dict)  # group -> when last asked
    _stopped: bool = False

    def stop(self) -> None:
        self._stopped = True

    async def run(self) -> None:
        """Balance until cancelled or stopped; never raises for a group that changed under it."""
        if self.rate <= 0:
            return
        bucket = TokenBucket(self.rate, max(1.0, self.rate * _BURST_S))
        while not self._stopped:
            await trio.sleep(_PASS_S)
            now = trio.current_time()
            bucket.refill(now)
            self.balance_once(now, bucket)

    def elect_preferred(self, wanted: Callable[[str], bool]) -> tuple[int, int]:
        """Preferred-leader election now (``ELECTLEADERS``): every group led here for which
        ``wanted(log_id)`` and whose preferred replica is another broker is handed to it, if
        ``preferred_target`` allows (a connected, caught-up voter). Returns ``(moved, skipped)``:
        transfers started, and groups whose preferred replica is not eligible now (the loop
        gives them back later, once it is). No hold and no rate limit: an operator asked, for
        the groups named; nothing once stopped (a draining broker hands its groups elsewhere).
        """
        if self._stopped:
            return 0, 0
        moved = skipped = 0
        connected = self.reachable()
        for log_id, replica in list(self.raft.replicas.items()):
            if replica.role is not Role.LEADER or not wanted(log_id):
                continue
            preferred = self.preferred(log_id)
            if preferred is None or preferred == self.raft.node_id:
                continue
            to = preferred_target(replica.node.status(), preferred, connected)
            if to is None:
                skipped += 1
                continue
            try:
                self.raft.transfer_leadership(log_id, to)
            except (NotLeader, ProposalDropped, RaftUsageError, KeyError) as exc:
                log.debug("node %d: %s not elected to %d: %s", self.raft.node_id, log_id, to, exc)
                skipped += 1
                continue
            self.transfers += 1
            moved += 1
        log.info(
            "node %d: preferred-leader election: %d transferred, %d skipped",
            self.raft.node_id,
            moved,
            skipped,
        )
        return moved, skipped

    def balance_once(self, now: float, bucket: TokenBucket) -> int:
        """One pass over the groups led here: start the transfers due, as the bucket allows;
        returns how many were started."""
        led = {g.id: g for g in self.raft.replicas.values() if g.role is Role.LEADER}
        for gone in [g for g in self._won if g not in led]:
            del self._won[gone]
            self._asked.pop(gone, None)
        connected: Collection[int] | None = None
        started = 0
        for log_id, replica in led.items():
            term = replica.node.term
            won = self._won.get(log_id)
            if won is None or won[0] != term:
                self._won[log_id] = (term, now)
                if self.hold_s > 0:
                    continue
            elif now - won[1] < self.hold_s:
                continue
            preferred = self.preferred(log_id)
            if preferred is None or preferred == self.raft.node_id:
                continue
            if now - self._asked.get(log_id, -1e18) < _ASK_AGAIN_S:
                continue
            if connected is None:
                connected = self.reachable()
            if preferred not in connected:
                continue
            to = preferred_target(replica.node.status(), preferred, connected)
            if to is None:
                continue
            if not bucket.take():
                break
            try:
                self.raft.transfer_leadership(log_id, to)
            except (NotLeader, ProposalDropped, RaftUsageError, KeyError) as exc:
                log.debug(
                    "node %d: %s not given back to %d: %s", self.raft.node_id, log_id, to, exc
                )
                continue
            self._asked[log_id] = now
            self.transfers += 1
            started += 1
            log.debug(
                "node %d: %s given back to its preferred replica %d",
                self.raft.node_id,
                log_id,
                to,
            )
        return started
