"""A deterministic simulator of a Raft group: the pure core, a fake network and fake disks.

No real time, no sockets, no threads: time is a step counter, the network is a list of packets
with delivery steps, each node's disk is a ``MemoryStorage`` that survives crashes, and all
randomness comes from one ``random.Random(seed)``, so a seed and the list of actions replay a run
exactly (TigerBeetle's VOPR, FoundationDB's simulation).

One step: every ``tick_every`` steps all live nodes tick; packets due are delivered (shuffled when
reordering is on); then every live node's Ready is processed as a driver would: persist, send,
advance. With ``sync_delay`` a Ready may stay "being persisted" until the next step while the node
keeps receiving messages, and a crash in between loses it. A crash loses everything the node did
not persist: its unstable entries and any hard state not yet in a Ready that was made durable.

Faults: message loss, duplication, reordering and delay; symmetric and one-way partitions (a cut
link drops packets in flight too, as a reset TCP connection does); crashes and restarts; pauses
(SIGSTOP: the node neither ticks nor acts, packets to it wait, as in its socket buffer, and are
delivered in order when it resumes; nothing is dropped, no connection closes). The
safety checker runs after every event; ``check_liveness`` heals everything and demands a leader
and a committed proposal within a bounded number of ticks.

With ``SimConfig.quiesce`` each node runs the driver's quiescence policy
(``kafkaesque.raft.QuiescencePolicy``) as the driver does: at each tick it pings every other
node, wakes the groups of a peer that went silent, and quiesces an idle leader (which then tells
its followers, ``Quiesce``) instead of ticking it; a quiesced node does not tick its core. Pings
and "quiesce" notes travel as packets under the same faults; a crash closes the others'
connections to the node (``QuiescencePolicy.disconnected``), a pause or a partition does not.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

from kafkaesque.raft import (
    Configuration,
    InvalidConfigChange,
    MemoryStorage,
    Message,
    NotLeader,
    OrphanWake,
    ProposalDropped,
    QuiescencePolicy,
    QuietState,
    RaftConfig,
    RaftInvariantError,
    RaftNode,
    RaftUsageError,
    Ready,
    RequestVote,
    RequestVoteResponse,
    Role,
    describe,
)

from .safety import LivenessViolation, SafetyChecker, SafetyViolation

# Ticks within which a healed cluster must elect a leader and commit a new proposal everywhere.
# Elections take 10-20 ticks; stickiness and check-quorum may each cost one more timeout.
LIVENESS_TICKS = 150


@dataclass(frozen=True)
class SimConfig:
    """The shape of one simulated run (chosen once per run)."""

    voters: int = 3
    spares: int = 1  # nodes outside the initial configuration, available to add
    max_msg_bytes: int = 1 << 20
    tick_every: int = 2  # steps per tick: message delays are measured in steps
    sync_delay: float = 0.0  # probability that a Ready stays unpersisted until the next step
    bugs: frozenset[str] = frozenset()
    quiesce: bool = False  # run the driver's quiescence policy (pings, quiet groups)


@dataclass
class Faults:
    """Network faults in force."""

    loss: float = 0.0
    dup: float = 0.0
    reorder: bool = False
    max_delay: int = 1  # a message takes 1..max_delay steps


@dataclass(frozen=True)
class Nemesis:
    """Fault rates applied at every step, and at protocol moments (FoundationDB's BUGGIFY).

    The targeted fault points are where classic Raft bugs hide: crashing a voter right after it
    sent its vote (a forgotten vote lets it vote twice), and cutting off or crashing a leader
    right after it was elected (before its no-op spreads) or right after its commit moved
    (Figure 8). Rates are per step or per event.
    """

    propose: float = 0.0  # a proposal at the leader
    crash: float = 0.0  # crash a random live node
    restart: float = 0.0  # restart a random crashed node
    partition: float = 0.0  # cut off a random node
    isolate_leader: float = 0.0  # cut off the current leader (it keeps taking proposals a while)
    heal: float = 0.0  # restore every link
    bounce_voter: float = 0.0  # crash and restart a node right after it granted a vote
    isolate_new_leader: float = 0.0  # cut off a leader right after its election
    crash_new_leader: float = 0.0
    isolate_on_commit: float = 0.0  # cut off a leader right after its commit moved
    crash_on_commit: float = 0.0

    @property
    def active(self) -> bool:
        return any(getattr(self, f) for f in self.__dataclass_fields__)


@dataclass
class SimNode:
    """One simulated broker hosting the group: a disk that survives, a core that does not."""

    id: int
    disk: MemoryStorage
    core: RaftNode | None = None
    pending: Ready | None = None  # taken from the core, not yet durable
    incarnation: int = 0
    # With ``SimConfig.quiesce``: the driver's policy and clock, lost in a crash like the core.
    policy: QuiescencePolicy | None = None
    quiet: QuietState = field(default_factory=QuietState)
    ticks: int = 0  # the node's own clock: a paused node's stands still


@dataclass(frozen=True)
class Ping:
    """The driver's per-node heartbeat (a transport item, not a Raft message)."""

    src: int
    dst: int


@dataclass(frozen=True)
class Quiesce:
    """A quiescing leader's note to a follower: quiesce at ``term`` and ``commit``."""

    src: int
    dst: int
    term: int
    commit: int


Packet = Message | Ping | Quiesce


@dataclass(order=True)
class _Packet:
    due: int
    seq: int
    msg: Packet = field(compare=False)
    # The receiver's incarnation when sent: a packet for a node that restarted since is lost, as
    # the TCP connection it travelled on died with the process.
    incarnation: int = field(default=0, compare=False)


class Cluster:
    """The simulated group. Every public method is one schedulable action."""

    def __init__(self, config: SimConfig, seed: int) -> None:
        self.config = config
        self.seed = seed
        self.rng = random.Random(seed)
        self.now = 0
        self.faults = Faults()
        self.nemesis = Nemesis()
        self._voted: list[int] = []
        self._leaders_seen: dict[int, tuple[int, int]] = {}  # node -> (term, commit) as leader
        self.blocked: set[tuple[int, int]] = set()
        self.paused: set[int] = set()
        self.packets: list[_Packet] = []
        self._seq = 0
        self._values = 0
        self._reads = 0
        self.trace: deque[tuple[int, str, object]] = deque(maxlen=400)
        self.raft_messages = 0  # Raft messages sent (pings and "quiesce" notes are not)
        self.votes_asked = 0  # RequestVotes sent, pre-votes included: campaigns
        self.events = 0
        bootstrap = Configuration.of(range(1, config.voters + 1))
        self.nodes: dict[int, SimNode] = {}
        for node_id in range(1, config.voters + config.spares + 1):
            disk = MemoryStorage(bootstrap if node_id <= config.voters else None)
            self.nodes[node_id] = SimNode(node_id, disk)
        self.checker = SafetyChecker(self.nodes, self.violation)
        for node in self.nodes.values():
            self._start(node)

    # -- reporting ------------------------------------------------------------------------------

    def note(self, kind: str, what: object) -> None:
        """Record an event for the failure trace (formatted lazily)."""
        self.trace.append((self.now, kind, what))

    def format_trace(self, last: int = 120) -> str:
        """The last events, one a line."""
        lines = []
        for now, kind, what in list(self.trace)[-last:]:
            text = (
                describe(what)  # type: ignore[arg-type]
                if kind in ("recv", "drop") and not isinstance(what, Ping | Quiesce)
                else str(what)
            )
            lines.append(f"  step {now:5d} {kind:7s} {text}")
        return "\n".join(lines)

    def _describe_failure(self, what: str) -> str:
        return (
            f"{what}\n(seed={self.seed}, {self.config}, step {self.now})\n"
            f"last events:\n{self.format_trace()}"
        )

    def violation(self, what: str) -> SafetyViolation:
        """Build the exception for a failed safety property, with the seed and the trace."""
        return SafetyViolation(self._describe_failure(what))

    # -- node lifecycle ------------------------------------------------------------------------

    def _start(self, node: SimNode) -> None:
        cfg = RaftConfig(
            node.id, max_msg_bytes=self.config.max_msg_bytes, testing_bugs=self.config.bugs
        )
        rng = random.Random(self.seed * 7919 + node.id * 104729 + node.incarnation)
        try:
            node.core = RaftNode(cfg, node.disk, rng)
        except RaftInvariantError as exc:
            raise self.violation(f"n{node.id} cannot restart: {exc}") from exc
        if self.config.quiesce:
            node.policy = QuiescencePolicy(node.id, cfg.election_tick)
            node.quiet = QuietState()
            node.ticks = 0
        self.checker.restarted(node)

    def live(self) -> list[SimNode]:
        """Nodes currently running (paused ones included: their process is alive)."""
        return [n for n in self.nodes.values() if n.core is not None]

    def _running(self) -> list[SimNode]:
        return [n for n in self.live() if n.id not in self.paused]

    def pause(self, node_id: int) -> None:
        """SIGSTOP a node: it stops ticking and acting; what is sent to it waits."""
        if self.nodes[node_id].core is not None and node_id not in self.paused:
            self.paused.add(node_id)
            self.note("pause", f"n{node_id}")

    def resume(self, node_id: int) -> None:
        """SIGCONT: the node reads what waited for it and runs on from where it stopped."""
        if node_id in self.paused:
            self.paused.discard(node_id)
            self.note("resume", f"n{node_id}")

    def crash(self, node_id: int) -> None:
        """Kill a node: what it did not persist is lost."""
        node = self.nodes[node_id]
        if node.core is None:
            return
        node.core = None
        node.pending = None
        node.policy = None
        node.incarnation += 1
        self.paused.discard(node_id)  # kill -9 ends a pause too
        self.note("crash", f"n{node_id}")
        for other in self.live():  # the kernel closes the dead node's connections at once
            if other.policy is not None:
                other.policy.disconnected(node_id)
                self._orphaned(other, node_id, gone=True)

    def restart(self, node_id: int) -> None:
        """Start a crashed node from its disk."""
        node = self.nodes[node_id]
        if node.core is not None:
            return
        self.note("restart", f"n{node_id} hard={node.disk.hard_state}")
        self._start(node)

    def lose_tail(self, node_id: int, from_offset: int, *, detected: bool = True) -> None:
        """A disk fault: crash ``node_id``, destroy its log from the entry holding
        ``from_offset`` on (durable, possibly acknowledged entries), and restart it.

        ``detected``: the node knows what it lost (``MemoryStorage.lose_from``, as recovery or
        a scrub tells the real driver). Without it the log is just shorter, which is what the
        code before issue 8 did with a cut tail: the node votes as if it never had the entries.
        """
        node = self.nodes[node_id]
        self.crash(node_id)
        disk = node.disk
        held = [e for e in disk.all_entries() if e.last >= from_offset]
        if held:
            cut = held[0].first
            if detected:
                disk.lose_from(cut)
            else:
                disk.truncate(cut)
                hard = disk.hard_state
                disk.set_hard_state(
                    type(hard)(hard.term, hard.vote, min(hard.commit, disk.last_index()))
                )
            self.note("nemesis", f"n{node_id} lost its log from {cut} (detected: {detected})")
        self.restart(node_id)

    def leader(self) -> SimNode | None:
        """The live leader of the highest term, if any."""
        best = None
        for node in self._running():  # a paused leader takes no requests
            assert node.core is not None
            if node.core.role is Role.LEADER and (
                best is None or best.core is None or node.core.term > best.core.term
            ):
                best = node
        return best

    # -- network ----------------------------------------------------------------------------------

    def _send(self, msg: Packet) -> None:
        if not isinstance(msg, Ping | Quiesce):
            self.raft_messages += 1
            self.votes_asked += isinstance(msg, RequestVote)
        if (msg.src, msg.dst) in self.blocked or self.rng.random() < self.faults.loss:
            if not isinstance(msg, Ping):  # pings would flood the trace
                self.note("drop", msg)
            return
        copies = 2 if self.rng.random() < self.faults.dup else 1
        for _ in range(copies):
            self._seq += 1
            due = self.now + self.rng.randint(1, self.faults.max_delay)
            incarnation = self.nodes[msg.dst].incarnation
            self.packets.append(_Packet(due, self._seq, msg, incarnation))

    def partition(self, side: set[int]) -> None:
        """Split the network into ``side`` and the rest (replacing any earlier cut)."""
        self.blocked = {
            (a, b) for a in self.nodes for b in self.nodes if (a in side) != (b in side)
        }
        self.note("net", f"partition {sorted(side)} | rest")

    def cut(self, src: int, dst: int) -> None:
        """Cut one direction of one link."""
        if src != dst:
            self.blocked.add((src, dst))
            self.note("net", f"cut n{src}->n{dst}")

    def heal(self) -> None:
        """Restore every link."""
        self.blocked.clear()
        self.note("net", "heal")

    def set_faults(self, faults: Faults) -> None:
        """Change loss, duplication, reordering and delay."""
        self.faults = faults
        self.note("net", str(faults))

    # -- the driver loop -----------------------------------------------------------------------

    def _after(self, node: SimNode) -> None:
        self.events += 1
        self.checker.check_node(node)

    def _complete(self, node: SimNode, rd: Ready) -> None:
        assert node.core is not None
        node.disk.persist(rd)
        self.checker.persisted(node, rd)
        if rd.entries and node.policy is not None:
            node.policy.wrote(node.quiet)
        for msg in rd.messages:
            self._send(msg)
            if isinstance(msg, RequestVoteResponse) and msg.granted and not msg.pre_vote:
                self._voted.append(node.id)
        if rd.soft_state is not None:
            self.note("role", f"n{node.id} {rd.soft_state.role.value} term {node.core.term}")
        try:
            node.core.advance(rd)
        except RaftInvariantError as exc:
            raise self.violation(f"n{node.id} advance: {exc}") from exc
        self._after(node)

    def _process_ready(self, node: SimNode) -> None:
        if node.pending is not None:
            rd, node.pending = node.pending, None
            self._complete(node, rd)
        assert node.core is not None
        if node.core.has_ready():
            rd = node.core.ready()
            if self.rng.random() < self.config.sync_delay:
                node.pending = rd
            else:
                self._complete(node, rd)

    def _deliver(self, packet: _Packet) -> None:
        msg = packet.msg
        node = self.nodes[msg.dst]
        if (
            node.core is None
            or node.incarnation != packet.incarnation
            or (msg.src, msg.dst) in self.blocked
        ):
            if not isinstance(msg, Ping):
                self.note("drop", msg)
            return
        if node.policy is not None:
            node.policy.heard(msg.src, node.ticks)  # any frame from a peer is news of it
        if isinstance(msg, Ping):
            return
        self.note("recv", msg)
        if isinstance(msg, Quiesce):
            if node.policy is not None and node.policy.quiesce_follower(
                node.quiet, node.core, node.disk.last_index(), msg.src, msg.term, msg.commit
            ):
                self.note("quiet", f"n{node.id} quiesced")
            return
        if node.policy is not None and node.policy.stepped(node.quiet, msg):
            self.note("quiet", f"n{node.id} woke: {type(msg).__name__} from n{msg.src}")
        try:
            node.core.step(msg)
        except RaftInvariantError as exc:
            raise self.violation(f"n{node.id} step: {exc}") from exc
        for news in node.core.commit_news():  # sent at once, as the driver does (issue 36)
            self._send(news)
        self._after(node)

    def _tick(self, node: SimNode) -> None:
        """One tick of a running node: the core's, or, with quiescence, the driver's tick."""
        assert node.core is not None
        policy = node.policy
        if policy is not None:
            node.ticks += 1
            peers = [p for p in self.nodes if p != node.id]
            for peer in peers:
                self._send(Ping(node.id, peer))
            for peer in policy.check_peers(peers, node.ticks):
                self._orphaned(node, peer, gone=False)
            if node.quiet.quiesced:
                return  # a quiesced group does not tick
            if policy.quiesce_leader(node.quiet, node.core):
                core = node.core
                self.note("quiet", f"n{node.id} quiesced its group at commit {core.commit}")
                for member in core.configuration.members:
                    if member != node.id:
                        self._send(Quiesce(node.id, member, core.term, core.commit))
                return
        try:
            node.core.tick()
        except RaftInvariantError as exc:
            raise self.violation(f"n{node.id} tick: {exc}") from exc
        if policy is not None:
            policy.ticked(node.quiet)
        self._after(node)

    def _orphaned(self, node: SimNode, peer: int, *, gone: bool) -> None:
        """``peer`` went silent (or its connection closed) for ``node``: wake the group if
        ``peer`` leads it, or if ``node`` leads it and ``peer`` votes in it, as the driver's
        ``_wake_orphans`` does."""
        assert node.core is not None and node.policy is not None
        if node.policy.voter_silent(node.quiet, node.core, peer):
            self.note("quiet", f"n{node.id} woke: voter n{peer} silent (gone: {gone})")
            return
        wake: OrphanWake | None = node.policy.orphaned(
            node.quiet, node.core, peer, node.ticks, gone=gone
        )
        if wake is None:
            return
        self.note("quiet", f"n{node.id}: leader n{peer} silent (gone: {gone}): {wake}")
        try:
            wake.apply(node.core)
        except RaftInvariantError as exc:
            raise self.violation(f"n{node.id} wake: {exc}") from exc
        self._after(node)

    def _requested(self, node: SimNode) -> None:
        """A local request at ``node`` (proposal, read, membership change): it wakes the group."""
        if node.policy is not None and node.policy.requested(node.quiet):
            self.note("quiet", f"n{node.id} woke: a request")

    def step(self) -> None:
        """Advance the simulation by one step."""
        self.now += 1
        if self.now % self.config.tick_every == 0:
            for node in self._running():
                self._tick(node)
        due = [p for p in self.packets if p.due <= self.now and p.msg.dst not in self.paused]
        if due:
            taken = {id(p) for p in due}
            self.packets = [p for p in self.packets if id(p) not in taken]
            if self.faults.reorder:
                self.rng.shuffle(due)
            else:
                due.sort()
            for packet in due:
                self._deliver(packet)
        for node in self._running():
            self._process_ready(node)
        if self.nemesis.active:
            self._nemesis_step()
        self._voted.clear()

    def _nemesis_step(self) -> None:
        nem, rng = self.nemesis, self.rng
        for node_id in self._voted:
            if rng.random() < nem.bounce_voter:
                self.note("nemesis", f"bounce n{node_id} after its vote")
                self.crash(node_id)
                self.restart(node_id)
        for node in self.live():
            core = node.core
            assert core is not None
            if core.role is not Role.LEADER:
                continue
            seen = self._leaders_seen.get(node.id)
            self._leaders_seen[node.id] = (core.term, core.commit)
            if seen is None or seen[0] != core.term:
                if rng.random() < nem.isolate_new_leader:
                    self.note("nemesis", f"isolate new leader n{node.id}")
                    self.partition({node.id})
                elif rng.random() < nem.crash_new_leader:
                    self.note("nemesis", f"crash new leader n{node.id}")
                    self.crash(node.id)
            elif core.commit > seen[1]:
                if rng.random() < nem.isolate_on_commit:
                    self.note("nemesis", f"isolate n{node.id} after its commit moved")
                    self.partition({node.id})
                elif rng.random() < nem.crash_on_commit:
                    self.note("nemesis", f"crash n{node.id} after its commit moved")
                    self.crash(node.id)
        ids = sorted(self.nodes)
        if rng.random() < nem.crash:
            self.crash(rng.choice(ids))
        if rng.random() < nem.restart:
            self.restart(rng.choice(ids))
        if rng.random() < nem.heal:
            self.heal()
        if rng.random() < nem.partition:
            self.partition({rng.choice(ids)})
        if rng.random() < nem.isolate_leader:
            leader = self.leader()
            if leader is not None:
                self.partition({leader.id})
        if rng.random() < nem.propose:
            leader = self.leader()
            if leader is not None:
                self.propose(leader.id)

    def run(self, steps: int, stop: str = "none") -> None:
        """Run up to ``steps`` steps; stop early right after a new leader ("leader") or a commit
        advance on a leader ("commit"), so the next action lands at that exact moment."""
        for _ in range(steps):
            before = self._mark()
            self.step()
            if stop != "none" and self._moved(before, stop):
                return

    def _mark(self) -> tuple[int, int]:
        leader = self.leader()
        if leader is None or leader.core is None:
            return (-1, -1)
        return (leader.core.term, leader.core.commit)

    def _moved(self, before: tuple[int, int], stop: str) -> bool:
        after = self._mark()
        if stop == "leader":
            return after[0] > before[0]
        return after[0] == before[0] and after[1] > before[1]

    # -- client actions ----------------------------------------------------------------------------

    def propose(self, node_id: int) -> None:
        """Propose a fresh value at a node (refusals are part of the game)."""
        node = self.nodes[node_id]
        if node.core is None or node_id in self.paused:
            return
        self._values += 1
        value = b"v%d" % self._values
        try:
            index = node.core.propose(value, 1 + self._values % 3)
        except (NotLeader, ProposalDropped) as exc:
            self.note("propose", f"n{node_id} refused {value!r}: {exc}")
            return
        self.note("propose", f"n{node_id} {value!r} -> {index} term {node.core.term}")
        self._requested(node)
        self._after(node)

    def transfer(self, to: int) -> None:
        """Ask the current leader to hand leadership to ``to``."""
        leader = self.leader()
        if leader is None or leader.core is None:
            return
        try:
            leader.core.transfer_leadership(to)
        except (NotLeader, RaftUsageError) as exc:
            self.note("transfer", f"n{leader.id} -> n{to} refused: {exc}")
            return
        self.note("transfer", f"n{leader.id} -> n{to}")
        self._requested(leader)

    def change_membership(self, kind: str, target: int) -> None:
        """Ask the current leader to add a learner, promote or remove ``target``."""
        leader = self.leader()
        if leader is None or leader.core is None:
            return
        core = leader.core
        method = {"add": core.add_learner, "promote": core.promote, "remove": core.remove}[kind]
        try:
            index = method(target)
        except (NotLeader, ProposalDropped, InvalidConfigChange) as exc:
            self.note("member", f"n{leader.id} {kind} n{target} refused: {exc}")
            return
        self.note("member", f"n{leader.id} {kind} n{target} at {index} -> {core.configuration}")
        self._requested(leader)
        self._after(leader)

    def compact(self, node_id: int) -> None:
        """Retention on one node: delete everything it has applied."""
        node = self.nodes[node_id]
        if node.core is None or node_id in self.paused:
            return
        to = node.core.applied + 1
        if to > node.disk.start_offset():
            node.disk.compact(to)
            self.note("compact", f"n{node_id} log now starts at {to}")

    def read(self, node_id: int) -> None:
        """Ask a node for a read index."""
        node = self.nodes[node_id]
        if node.core is None or node_id in self.paused:
            return
        self._reads += 1
        ctx = b"r%d" % self._reads
        try:
            node.core.read_index(ctx)
        except NotLeader:
            return
        self._requested(node)
        self.checker.read_asked(ctx)
        self.note("read", f"n{node_id} {ctx!r} (committed so far {self.checker.max_committed})")

    # -- liveness -------------------------------------------------------------------------------

    def check_liveness(self) -> int:
        """Heal everything, then demand that a leader commits a new proposal on every voter
        within ``LIVENESS_TICKS`` ticks; return the ticks it took.

        Raises:
            LivenessViolation: it did not happen in time.
        """
        self.heal()
        faults, nemesis = self.faults, self.nemesis
        self.set_faults(Faults())
        self.nemesis = Nemesis()
        for node_id in self.nodes:
            self.resume(node_id)
            self.restart(node_id)
        try:
            return self._await_commit_everywhere()
        finally:
            self.faults, self.nemesis = faults, nemesis

    def _await_commit_everywhere(self) -> int:
        start = self.now
        deadline = self.now + LIVENESS_TICKS * self.config.tick_every
        proposal: tuple[int, int, int] | None = None  # (leader, term, index)
        while self.now < deadline:
            self.step()
            leader = self.leader()
            if leader is None or leader.core is None:
                continue
            core = leader.core
            if proposal is None or proposal[:2] != (leader.id, core.term):
                try:
                    proposal = (leader.id, core.term, core.propose(b"live", 1))
                except (NotLeader, ProposalDropped):
                    continue
                self._requested(leader)
                self.note("propose", f"liveness probe at n{leader.id} -> {proposal}")
            _, term, index = proposal
            voters = [self.nodes[v] for v in core.configuration.voters]
            if all(
                v.core is not None
                and v.core.commit >= index
                and (v.core.log.start_offset() > index or v.core.log.term_at(index) == term)
                for v in voters
            ):
                return (self.now - start) // self.config.tick_every
        leader = self.leader()
        raise LivenessViolation(
            self._describe_failure(
                f"liveness: no proposal committed on every voter within {LIVENESS_TICKS} ticks "
                f"after healing (leader: {leader.id if leader else None})"
            )
        )
