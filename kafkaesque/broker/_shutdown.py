"""Graceful shutdown: hand every leadership this broker holds to another replica, then stop.

A broker that simply stops leaves each partition it leads without a leader until its followers
notice the silence and elect one (an election timeout, then a vote: about half a second to a
second of refused writes). A broker that is asked to stop (SIGTERM) can do better: for each Raft
group it leads, it picks a voter whose log matches its own and sends it TimeoutNow (Raft thesis
§3.10, ``RaftNode.transfer_leadership``): the voter stands at once, without pre-vote, and wins
because its log is as long as any. The gap is one round trip and one fsync, not a timeout.
While a transfer runs the old leader refuses proposals (``ProposalDropped``), which the write
path retries until it forwards them to the new leader, so a client connected here sees latency,
not an error.

``hand_over_groups`` is that loop; it is bounded by a deadline, and what it could not hand over
in time (no voter reachable, a group of one replica) is left to the ordinary election that the
stop causes. The controller quorum's leadership (pysyncobj) is handed over the same way by
``ClusterMetadata.hand_over_leadership``; ``Broker.drain`` runs both.

The client connections are drained meanwhile, as Kafka's and NATS's brokers close theirs: each
one is told (``Draining``), stops taking requests, finishes those it had taken, sends every
reply it owes, then closes; one with nothing owed closes at once. A line-protocol connection
answers a request it reads after that with a retriable ``NOT_READY`` (``_session``); an MQTT
connection sends the acknowledgements it owes, then (MQTT 5) DISCONNECT "Server shutting down"
(``broker.mqtt._device``). ``Broker.drain`` waits for them until its deadline.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import trio

from kafkaesque.raft import NotLeader, ProposalDropped, RaftUsageError, Role, Status
from kafkaesque.raft.driver import MultiRaft

log = logging.getLogger("kafkaesque.broker.shutdown")

DEFAULT_SHUTDOWN_TIMEOUT_S = 5.0
"""How long a SIGTERMed broker spends handing its leaderships over, at most, before it stops."""

_POLL_S = 0.005  # how often the hand-over looks at its groups (a transfer takes a round trip)
# A transfer not done after this long is asked again, to the best voter then (the core abandons
# a transfer after an election timeout; a voter that went silent meanwhile is passed over).
_ASK_AGAIN_S = 0.3
# A group that has had nobody to hand it to for this long is left to the election the stop
# causes: its other voters are down, paused or cut off, and waiting would only delay the stop
# (a stepped-down leader waits this long for its successor's first message, which takes
# milliseconds when there is one).
_STUCK_S = 1.0
# The controller quorum's hand-over takes a round trip when a follower is up to date: once the
# groups are handed over, it gets this much more, not the rest of the shutdown timeout.
CONTROLLER_GRACE_S = 1.0


class Draining:
    """Tells the client connections that the broker is stopping; counts them until they closed.

    Each connection is served inside ``connection(stop)``; ``begin`` calls every such
    connection's ``stop`` once (a connection that opens after ``begin`` has its ``stop`` called
    at once). ``stop`` runs in the task that called ``begin``: it must be quick, must not
    raise, and only tells the connection (which then finishes and closes on its own).
    ``wait_closed`` returns once no connection is open. Trio thread only.
    """

    def __init__(self) -> None:
        self._begun = False
        self._stops: dict[int, Callable[[], None]] = {}  # by a number per connection
        self._next = 0
        self._closed = trio.Event()
        self._closed.set()  # none open yet

    @property
    def begun(self) -> bool:
        """Whether ``begin`` was called (for good: a stopping broker never takes it back)."""
        return self._begun

    @property
    def open(self) -> int:
        """How many connections are open now."""
        return len(self._stops)

    def begin(self) -> None:
        """Tell every open connection to finish and close. Idempotent."""
        if self._begun:
            return
        self._begun = True
        for stop in list(self._stops.values()):
            stop()

    @contextmanager
    def connection(self, stop: Callable[[], None]) -> Iterator[None]:
        """Count a connection while its body runs; ``stop`` is how ``begin`` tells it."""
        key = self._next
        self._next += 1
        self._stops[key] = stop
        self._closed = trio.Event() if len(self._stops) == 1 else self._closed
        try:
            if self._begun:
                stop()
            yield
        finally:
            del self._stops[key]
            if not self._stops:
                self._closed.set()

    async def wait_closed(self) -> None:
        """Return once no connection is open. Unbounded: wrap it in a deadline."""
        while self._stops:
            await self._closed.wait()


@dataclass(frozen=True)
class HandOver:
    """What a hand-over did.

    ``led``: the groups this broker led while it ran (at its start, or won meanwhile).
    ``left``: those of them without a leader elsewhere at its end, sorted: no voter could take
    them in time (none reachable, or a group with no other voter); their followers elect one
    once this broker stops. ``controller``: None if this broker did not lead the controller
    quorum, else whether another controller leads now. ``seconds``: how long it took.
    """

    led: int
    left: tuple[str, ...]
    controller: bool | None
    seconds: float

    @property
    def moved(self) -> int:
        """How many of the groups led here have a leader elsewhere now."""
        return self.led - len(self.left)

    def describe(self) -> str:
        """One line for the broker's log: what moved, what did not, how long it took."""
        text = f"handed over {self.moved} of {self.led} partition leaderships"
        if self.left:
            shown = ", ".join(self.left[:5]) + (", ..." if len(self.left) > 5 else "")
            text += f" ({len(self.left)} left to an election: {shown})"
        if self.controller is not None:
            text += "; controller leadership " + (
                "handed over" if self.controller else "not handed over (an election follows)"
            )
        return f"{text} in {self.seconds:.2f} s"


def successor(status: Status, reachable: Collection[int]) -> int | None:
    """The voter a leader whose state is ``status`` should hand its group to, or None.

    Only another voter that is connected (``reachable``) and was heard from lately qualifies.
    Among them, the one whose log goes furthest (the highest ``match``): one that matches the
    leader's last index gets TimeoutNow at once, another is caught up first. Ties go to the
    lowest id, so that the choice is reproducible.
    """
    candidates = [
        (progress.match, -node)
        for node, progress in status.progress.items()
        if node != status.id
        and node in status.configuration.voters
        and node in reachable
        and progress.recent_active
        and not progress.is_learner
    ]
    if not candidates:
        return None
    return -max(candidates)[1]


async def hand_over_groups(
    raft: MultiRaft,
    reachable: Callable[[], Collection[int]],
    deadline: float,
    *,
    poll_s: float = _POLL_S,
) -> tuple[int, tuple[str, ...]]:
    """Hand every group ``raft`` leads to another voter; return once each has a leader other
    than this node, or at ``deadline`` (``trio.current_time()``).

    Returns how many groups were led here and, sorted, those still without a leader elsewhere.
    A group this node comes to lead meanwhile (a group created while it drains) is handed over
    too. A group with no other voter cannot be handed over: it is left at once, not waited for;
    nor is one that had nobody to take it for ``_STUCK_S`` (no other voter reachable and
    active). ``reachable()`` gives the peers connected now. Never raises for a group that
    changed under it (a transfer refused because leadership moved, or the group was removed).
    """
    me = raft.node_id
    led: set[str] = set()
    hopeless: set[str] = set()  # nobody to hand it to: not waited for
    asked: dict[str, float] = {}  # group -> when its transfer was last asked
    stuck: dict[str, float] = {}  # group -> since when nobody could take it
    while True:
        now = trio.current_time()
        pending = []
        for replica in list(raft.replicas.values()):
            if replica.id in hopeless:
                continue
            if replica.role is Role.LEADER:
                led.add(replica.id)
                if replica.node.configuration.voters <= {me}:
                    hopeless.add(replica.id)
                    continue
                pending.append(replica)
            elif replica.id in led and replica.leader in (None, me):
                pending.append(replica)  # stepped down; its successor has not been heard yet
                stuck.setdefault(replica.id, now)
        if not pending or now >= deadline:
            break
        connected = reachable()
        for replica in pending:
            if now - stuck.get(replica.id, now) >= _STUCK_S:
                hopeless.add(replica.id)
                continue
            if replica.role is not Role.LEADER:
                continue
            to = successor(replica.node.status(), connected)
            if to is None:
                stuck.setdefault(replica.id, now)
                continue
            stuck.pop(replica.id, None)
            if now - asked.get(replica.id, -1e18) < _ASK_AGAIN_S:
                continue
            try:
                raft.transfer_leadership(replica.id, to)
            except (NotLeader, ProposalDropped, RaftUsageError, KeyError) as exc:
                log.info("node %d: %s not handed to %d: %s", me, replica.id, to, exc)
                continue
            asked[replica.id] = now
        await trio.sleep(poll_s)
    left = sorted(g for g in led if g in raft.replicas and raft.replicas[g].leader in (None, me))
    return len(led), tuple(left)
