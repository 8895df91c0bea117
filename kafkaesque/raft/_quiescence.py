"""Quiescence as a pure policy: when a quiet group stops ticking, and what wakes it.

CockroachDB's idea: a leader whose followers hold its whole log and know its commit index, and
that saw no traffic for a few ticks, stops ticking and tells its followers to stop too. An idle
partition then costs nothing but its share of one ping per peer per tick (the per-node
heartbeat, coalesced over every group). Any message for a group wakes it, and so does a local
request (a proposal, a read index, a membership change); a follower also wakes when the leader's
broker stops answering pings (a killed broker's connection closes, but a paused one's stays open
and says nothing), and counts the ticks of that silence toward its election timeout, so a dead
or paused leader is replaced within one election timeout, as a leader of a busy group is.

This module decides; it does no I/O and keeps no clock of its own. Time is the caller's tick
count, passed in as ``now``. The trio driver (``kafkaesque.raft.driver``) and the deterministic
simulator (tests/raft/sim.py) call the same policy: the driver does what it decides (sends the
pings and the "quiesce" notes, stops or resumes ticking a core, applies an ``OrphanWake``).

Invariants the simulator checks (tests/raft/test_quiescence.py): a quiet group's followers do not
start elections while its leader is alive and heard; a proposal wakes a quiet group and commits;
a silent (partitioned, paused, killed) leader's group does not stay quiet: a new leader is
elected within about two election timeouts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from ._core import RaftNode
from ._errors import RaftUsageError
from ._messages import Heartbeat, HeartbeatResponse, Message
from ._types import ElectionCause, Role

# A leader quiesces its group after this many ticks without traffic (and once quiescent).
QUIESCE_AFTER_TICKS = 3

# ``last_heard`` of a peer whose connection closed: older than any silence threshold.
_LONG_AGO = -(10**9)


@dataclass(slots=True)
class QuietState:
    """One group's quiescence state on one node, kept by the caller beside the group's core.

    Only ``QuiescencePolicy`` changes it. Invariant: a quiesced group is not ticked.
    """

    quiesced: bool = False
    # Ticks since the group last saw traffic (a heartbeat and its answer are not traffic).
    idle_ticks: int = 0


@dataclass(frozen=True, slots=True)
class OrphanWake:
    """What a follower does when its leader's broker goes silent or its connection closes.

    ``gone`` (the connection closed): forget the leader (no stickiness for a leader known gone)
    and, if ``stand_first``, campaign at once. Else (silence only): count ``silent_ticks``
    toward the election timeout (``RaftNode.leader_silent_for``), standing first if
    ``stand_first``. ``woke``: the group was quiesced and is active again.
    """

    gone: bool
    stand_first: bool
    silent_ticks: int
    woke: bool

    def apply(self, node: RaftNode) -> None:
        """Do it to ``node``, the follower's core (pure: no I/O)."""
        if self.gone:
            node.forget_leader()
            if self.stand_first:
                node.campaign(ElectionCause.LEADER_GONE)
        else:
            node.leader_silent_for(self.silent_ticks, stand_first=self.stand_first)


class QuiescencePolicy:
    """The quiescence decisions of one node, for all the groups it hosts.

    It tracks which peers are heard (the per-node ping: a peer is silent once it has not been
    heard for a third of an election timeout, at least two ticks, or once its connection
    closed), and takes each group's ``QuietState`` as an argument. Methods that return a bool
    say whether the caller must act (quiesce the group, or resume ticking it); they update the
    ``QuietState`` themselves.
    """

    def __init__(
        self, node_id: int, election_tick: int, *, quiesce_after: int = QUIESCE_AFTER_TICKS
    ) -> None:
        if election_tick <= 0 or quiesce_after <= 0:
            raise RaftUsageError(f"bad quiescence ticks: {election_tick}, {quiesce_after}")
        self.node_id = node_id
        self.quiesce_after = quiesce_after
        # A peer not heard for this many ticks is silent: well within an election timeout, so
        # that the followers of a silent leader still elect a new one within about one.
        self.silence_ticks = max(2, math.ceil(election_tick / 3))
        self._last_heard: dict[int, int] = {}
        self._silent: set[int] = set()  # peers not heard from lately

    # -- peers (the per-node heartbeat) ---------------------------------------------------------

    def heard(self, peer: int, now: int) -> None:
        """Something (a frame of any kind) arrived from ``peer`` at tick ``now``."""
        self._last_heard[peer] = now

    def disconnected(self, peer: int) -> None:
        """``peer``'s connection closed: it is silent at once. The caller then wakes the groups
        ``peer`` leads here (``orphaned(..., gone=True)``)."""
        self._last_heard[peer] = _LONG_AGO
        self._silent.add(peer)

    def check_peers(self, peers: Iterable[int], now: int) -> list[int]:
        """At tick ``now``: mark ``peers`` heard or silent; return those that have just gone
        silent (each once per silence), whose groups the caller wakes (``orphaned``)."""
        live_after = now - self.silence_ticks
        went_silent: list[int] = []
        for peer in peers:
            if self._last_heard.get(peer, -1) >= live_after:
                self._silent.discard(peer)
            elif peer not in self._silent:
                self._silent.add(peer)
                went_silent.append(peer)
        return went_silent

    def hears(self, peer: int) -> bool:
        """Whether ``peer`` answered this node's pings lately (it is not silent)."""
        return peer not in self._silent

    def orphaned(
        self, state: QuietState, node: RaftNode, peer: int, now: int, *, gone: bool
    ) -> OrphanWake | None:
        """``peer`` went silent (or, with ``gone``, its connection closed): what the group of
        ``node`` does, or None if ``peer`` does not lead it here. The group wakes (``state``).

        Silence wakes a quiesced group and counts the ticks of silence toward the election
        timeout (its own clock stood still while quiesced; a paused broker keeps its connection
        open, so silence is all there is to see). A closed connection is stronger news (a
        killed broker's kernel closes it at once), so followers also forget that leader.
        Either way one survivor, the lowest-id other voter, stands first: at once when the
        leader is gone, one election timeout after the silence began otherwise (the others a
        tick later at the earliest): one candidate, so no split vote. Pre-vote still guards a
        mistaken verdict (a one-way cut): a voter that still hears the leader refuses.
        """
        if node.role is Role.LEADER or node.leader != peer:
            return None
        woke = self.wake(state)
        others = [v for v in node.configuration.voters if v != peer]
        first = bool(others) and min(others) == self.node_id
        silent = 0 if gone else max(0, now - self._last_heard.get(peer, 0))
        return OrphanWake(gone=gone, stand_first=first, silent_ticks=silent, woke=woke)

    def voter_silent(self, state: QuietState, node: RaftNode, peer: int) -> bool:
        """``peer`` went silent (or its connection closed) and ``node`` leads a group ``peer``
        votes in: whether the group woke. A quiesced leader does not tick, so it never runs
        check-quorum: cut off from its followers (a partition, or both of them paused) it would
        go on believing it leads, and report so to every broker, long after the others elected
        a new leader. Woken, it ticks again: it steps down one election timeout later unless a
        majority still answers it (then it quiesces again once the group is idle and whole)."""
        if node.role is not Role.LEADER or peer not in node.configuration.voters:
            return False
        return self.wake(state)

    # -- groups ----------------------------------------------------------------------------------

    def quiesce_leader(self, state: QuietState, node: RaftNode) -> bool:
        """At a tick of an active group, before ticking its core (a tick makes a leader queue
        its heartbeat): whether it quiesces now instead. Then the caller stops ticking it and
        tells every other member (term and commit) to quiesce too (``quiesce_follower``).

        Only a leader idle for ``quiesce_after`` ticks whose core is ``quiescent`` (every member
        holds the whole log and was told the commit) and that hears every member quiesces: with
        a member silent it keeps ticking, so check-quorum sees whether a majority still answers
        (``voter_silent``).
        """
        if (
            node.role is Role.LEADER
            and state.idle_ticks >= self.quiesce_after
            and node.quiescent()
            and all(self.hears(m) for m in node.configuration.members if m != self.node_id)
        ):
            state.quiesced = True
            return True
        return False

    def ticked(self, state: QuietState) -> None:
        """The caller ticked the group's core (it did not quiesce)."""
        state.idle_ticks += 1

    def quiesce_follower(
        self,
        state: QuietState,
        node: RaftNode,
        durable_last: int,
        leader: int,
        term: int,
        commit: int,
    ) -> bool:
        """``leader`` told this member to quiesce at ``term`` and ``commit``: whether it does.

        Only a follower of that leader in that term, holding durably (``durable_last``, its
        storage's last index) exactly the log up to ``commit`` and committed there, with nothing
        left to process, quiesces: anything else would leave it asleep while behind.
        """
        if (
            node.role is Role.FOLLOWER
            and node.term == term
            and node.leader == leader
            and node.commit == commit == durable_last
            and not node.has_ready()
        ):
            state.quiesced = True
            return True
        return False

    def stepped(self, state: QuietState, msg: Message) -> bool:
        """A Raft message from a peer arrived for the group (before it is stepped): whether it
        woke the group. Anything from a peer means the group is active; anything but
        heartbeats (how an idle group stays alive) is traffic."""
        # ``wake``'s two lines, inline: this runs for every message a node receives.
        woke, state.quiesced = state.quiesced, False
        if not isinstance(msg, Heartbeat | HeartbeatResponse):
            state.idle_ticks = 0
        return woke

    def requested(self, state: QuietState) -> bool:
        """A local request for the group (a proposal, a read index, a membership change, a
        leadership transfer) is traffic: whether it woke the group."""
        state.idle_ticks = 0
        woke, state.quiesced = state.quiesced, False  # ``wake``, inline: once per proposal
        return woke

    def wrote(self, state: QuietState) -> None:
        """The group made new entries durable: traffic."""
        state.idle_ticks = 0

    def wake(self, state: QuietState) -> bool:
        """Wake the group (it ticks again); whether it was quiesced."""
        woke = state.quiesced
        state.quiesced = False
        return woke


__all__ = ["QUIESCE_AFTER_TICKS", "OrphanWake", "QuiescencePolicy", "QuietState"]
