"""The multi-raft driver: many Raft groups of one broker, over one transport, in one trio task.

Each tick (``tick_interval``, 50 ms by default) the driver ticks every active group and pings
every peer. Its loop follows each core's ``Ready`` contract for all groups at once:

1. take the Ready of every group that has one, and write it to that group's ``PartitionStorage``
   (all its entries in one group write); a leader's Ready that only replicates (AppendEntries and
   heartbeats, no new term or vote) has its messages sent first, so the followers write while
   the leader does (thesis §10.2.1, as etcd does: the leader counts itself only once durable);
2. fsync every log those Readys touched, and save the broker's ``HardStateStore`` (the term and
   vote of every group, one file) if a term or vote changed, as ONE job: group commit across
   groups. One job, not one per file: each job's end costs a hand-off back to the event loop,
   and under load those waits, not the fsyncs (~0.1 ms each), were most of a write's latency
   (measured: MQTT PUBACK p50 166 -> 35 ms at 5,000 msg/s). The usual job, fsyncs only, runs
   in the fsync helper process, which needs no GIL; one that saves the hard state runs on a
   worker thread (``FsyncWorkers``);
3. only then send the other Readys' messages (a vote or an acknowledgement is never sent before
   it is durable), expose the newly committed offsets and wake whoever waits for them;
4. advance every core.

Steps 1 and 2 (a round's start) run in the task that caused the round, as soon as no round is in
flight: a proposer's (``propose_nowait``), the peer connection's that brought the entries
(``handle_items``), the tick's. Steps 3 and 4 (its end) run in the driver's loop, which does
nothing but wait for the fsync workers' eventfd; a round's end then starts the next round of what
was marked meanwhile (group commit). A round therefore costs the scheduler one pass, at its end:
a follower's write is two passes in all (the frame that brings it, the fsync's end that
acknowledges it). One round at a time is in flight; a step, tick or round's end that marks several
groups starts one round for all of them, at its end (``_kick``).

A Ready with nothing to make durable (no log work, no new term or vote: a commit to expose and
commit news, mostly) is handled at once where the message that caused it is received, not in a
round: the steps that most often end a write's round cost no round at all.

Proposals are checked (one valid batch of data spanning the count given) before they join the
log: a bad batch is refused to its proposer, never found when the log is written.

Corruption (docs/storage-format.md, "Corruption and repair"): a batch that fails its checksum
when a group reads its log (AppendEntries for a follower, a consumer's fetch, the background
scrub of sealed segments at a bounded rate) raises ``CorruptLogError``. The group's core is set
aside at once (it steps nothing more; a leader first hands its leadership to its most caught-up
follower); at the next loop turn, with no Ready of that group in flight, its log is cut before
the bad batch, and a new core is built over it, as after a restart: a follower that neither
votes nor campaigns until it has re-replicated what it lost. The broker process goes on.

Quiescence (CockroachDB's idea): a leader whose followers hold its whole log and know its commit
index, and that saw no traffic for a few ticks, stops ticking and tells its followers to stop
too. An idle partition then costs nothing but its share of one ping per peer per tick. Any message
for a group wakes it; a follower also wakes when the leader's broker stops answering pings (the
per-node heartbeat: a killed broker's connection closes, but a paused one's stays open and says
nothing), and counts the ticks of that silence toward its election timeout, so a dead or paused
leader is replaced within one election timeout, as a leader of a busy group is. The core's
``QuiescencePolicy`` decides all of it (the simulator runs the same policy); the driver sends the
pings and the "quiesce" notes and keeps the set of groups it ticks.
"""

from __future__ import annotations

import functools
import logging
import random
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

import trio

from kafkaesque.storage import (
    CheckedBatch,
    CorruptLogError,
    FlushTicket,
    FsyncPolicy,
    LogConfig,
    PartitionLog,
    makedirs_durable,
)

from .. import (
    Configuration,
    LogDiverged,
    MalformedMessage,
    NotLeader,
    ProposalDropped,
    QuiescencePolicy,
    RaftConfig,
    RaftNode,
    Ready,
    Role,
    TimeoutNow,
    from_wire,
    to_wire,
)
from ._errors import CommitTimeout, ProposalLost
from ._fsync import FsyncWorkers
from ._hard_state_store import HardStateStore
from ._partition_storage import PartitionStorage
from ._replica import PendingRead, RaftReplica
from ._round import Round, make_durable, replicates_only

log = logging.getLogger("kafkaesque.raft.driver")

# Transport items: [kind, ...]
_MSG = 0  # [0, group, wire message]
_QUIESCE = 1  # [1, group, term, commit]
_PING = 2  # [2]
# The background scrub reads this much of one group's sealed segments per tick (about 1.3 MB/s
# at the default tick): restart time and foreground work do not grow with the log's size.
SCRUB_BYTES_PER_TICK = 64 * 1024


class MultiRaft:
    """All Raft groups of one broker. Use from one trio thread; ``run`` owns its tasks.

    ``send(peer, item)`` queues a transport item (``PeerTransport.send``); the transport calls
    ``handle_items`` with what arrives. With ``flush`` (``PeerTransport.post`` as ``send``,
    ``PeerTransport.flush``), what a step or a tick queued goes out at its end, from this task.
    """

    def __init__(
        self,
        node_id: int,
        send: Callable[[int, Any], bool],
        *,
        flush: Callable[[], None] | None = None,
        state_dir: str,
        peers: Iterable[int] = (),
        tick_interval: float = 0.05,
        raft_config: Callable[[int], RaftConfig] | None = None,
        rng: random.Random | None = None,
        scrub_bytes_per_tick: int = SCRUB_BYTES_PER_TICK,
    ) -> None:
        self.node_id = node_id
        self._send = send
        self._flush = flush or _nothing
        makedirs_durable(state_dir)
        self.hard_states = HardStateStore(state_dir)
        self._peers = set(peers) - {node_id}
        self.tick_interval = tick_interval
        self._raft_config = raft_config or (lambda i: RaftConfig(id=i))
        self._rng = rng or random.Random()
        self.replicas: dict[str, RaftReplica] = {}
        self._dirty: set[RaftReplica] = set()
        # Invariant: exactly the groups that are not quiesced (only these are ticked).
        self._active: set[RaftReplica] = set()
        # The round in flight: Readys written and handed to the fsync workers, not yet finished.
        # Invariant: at most one; a group has at most one Ready out, in it or being settled.
        self._round: Round | None = None
        self._running = False  # ``run``'s loop collects the rounds' ends (tests call ``_process``)
        self._busy = 0  # inside a step, tick or round's end: the kick waits for its end
        self._ticks = 0
        self._read_seq = 0  # read-index request ids (ctx), unique in this driver
        # Which groups tick and which peers are heard: a pure policy, clocked by ``_ticks``.
        self._quiet = QuiescencePolicy(node_id, self._raft_config(node_id).election_tick)
        self.fsyncs = 0
        self._fsync_workers = FsyncWorkers(1, f"kafkaesque-fsync-{node_id}")
        # Told how long each group commit (the parallel fsyncs of one step) took: for metrics.
        self.on_group_commit: Callable[[float], None] | None = None
        self.readies = 0
        #: Corrupt batches found in this broker's logs and repaired (a counter for metrics).
        self.corruptions = 0
        self._scrub_bytes = scrub_bytes_per_tick
        self._scrub_order: list[str] = []  # groups in the order the scrub visits them
        self._scrub_next = 0
        self._corrupt: set[RaftReplica] = set()  # set aside, repaired at the next loop turn

    # -- groups -------------------------------------------------------------------------------

    def add_replica(
        self,
        log_id: str,
        directory: str,
        bootstrap: Iterable[int] | None,
        log_config: LogConfig | None = None,
        *,
        preferred: int | None = None,
    ) -> RaftReplica:
        """Open (or reopen) the group's log in ``directory`` and start its core.

        ``bootstrap``: the voters of a new group's first configuration (a group that has one
        on disk keeps it); None for a replica joining a running group, which knows no
        configuration, never campaigns, and learns its membership from the leader.
        ``preferred`` is the replica that should lead a new group (default: a stable hash of
        the group id over the voters); it stands for election at once.
        """
        if log_id in self.replicas:
            return self.replicas[log_id]
        storage = PartitionStorage(
            PartitionLog.open(directory, log_config),
            None if bootstrap is None else Configuration(voters=frozenset(bootstrap)),
            hard_states=self.hard_states,
            key=log_id,
        )
        node = RaftNode(self._node_config(storage), storage, self._rng)
        replica = RaftReplica(log_id, node, storage, _on_corrupt=self._corrupted)
        self.replicas[log_id] = replica
        self._scrub_order.append(log_id)
        if storage.log.lost_end_offset is not None:
            log.error(
                "corruption: node %d: %s lost offsets up to %d it may have acknowledged; it "
                "re-replicates them and does not vote until then",
                self.node_id,
                log_id,
                storage.log.lost_end_offset,
            )
        self._active.add(replica)
        self._peers |= set(node.configuration.members) - {self.node_id}
        if preferred is None and node.configuration.voters:
            preferred = preferred_leader(log_id, node.configuration.voters)
        if node.term == 0 and preferred == self.node_id:
            # A new group: its preferred replica stands at once instead of every replica
            # waiting out a random timeout (1,000 new groups would otherwise split votes for
            # a minute). A stable hash spreads the leaders over the brokers.
            node.campaign()
        self._mark(replica)
        return replica

    def add_peer(self, node: int) -> None:
        """``node`` joined the cluster: ping it every tick like the other peers."""
        if node != self.node_id:
            self._peers.add(node)

    # -- membership changes (the caller leads the group; one change at a time) --------------

    def add_learner(self, log_id: str, node: int) -> int:
        """Propose adding ``node`` to ``log_id`` as a learner (see ``RaftNode.add_learner``)."""
        self.add_peer(node)
        return self._change(log_id, lambda n: n.add_learner(node))

    def promote(self, log_id: str, node: int) -> int:
        """Propose making caught-up learner ``node`` a voter (see ``RaftNode.promote``)."""
        return self._change(log_id, lambda n: n.promote(node))

    def remove_member(self, log_id: str, node: int) -> int:
        """Propose removing ``node`` from ``log_id`` (see ``RaftNode.remove``)."""
        return self._change(log_id, lambda n: n.remove(node))

    def transfer_leadership(self, log_id: str, to: int) -> None:
        """Hand the leadership of ``log_id`` to voter ``to`` (see ``RaftNode``)."""
        self._change(log_id, lambda n: n.transfer_leadership(to))

    def _change(self, log_id: str, change: Callable[[RaftNode], int | None]) -> int:
        replica = self.replicas[log_id]
        if replica.corrupt is not None:
            raise ProposalDropped(f"{log_id} is repairing its log")
        try:
            result = change(replica.node)
        except CorruptLogError as exc:
            self._corrupted(replica, exc)
            raise ProposalDropped(f"{log_id}: corruption found, repairing: {exc}") from exc
        self._wake_replica(replica)
        return -1 if result is None else result

    def remove_replica(self, log_id: str) -> str | None:
        """Stop hosting ``log_id`` (its topic was deleted) and close its log.

        Returns the log's directory for the caller to delete (None if not hosted). Proposals
        still waiting for a commit wake up and fail; the group's hard state is forgotten.
        """
        replica = self.replicas.pop(log_id, None)
        if replica is None:
            return None
        self._active.discard(replica)
        self._dirty.discard(replica)
        self._corrupt.discard(replica)
        self._scrub_order.remove(log_id)
        replica._fail_waiters_above(0)
        replica._notify()
        self.hard_states.forget(log_id)
        directory = replica.log.directory
        replica.storage.close()
        return directory

    def close(self) -> None:
        self._fsync_workers.close()
        for replica in self.replicas.values():
            replica.storage.close()
        self.replicas.clear()
        self.hard_states.save()

    # -- requests ---------------------------------------------------------------------------

    async def propose(
        self, log_id: str, batch: bytes | CheckedBatch, count: int, *, timeout: float = 5.0
    ) -> tuple[int, int]:
        """Append ``batch`` (``count`` offsets) as the leader and wait until it is committed.

        Returns its ``(first, last)`` offsets. Raises ``InvalidBatchError`` (a ``ValueError``:
        not one valid batch of ``count`` offsets), ``NotLeader`` (with the leader's id when
        known) or ``ProposalDropped`` before appending; after appending, ``ProposalLost`` if
        another entry committed at its offset (definitely failed, retry) or ``CommitTimeout``
        (unknown: not committed in time, or cut from this log only, which another replica that
        holds it may still commit).
        """
        replica = self.replicas[log_id]
        last = self._propose(replica, batch, count)
        term = replica.node.term
        with trio.move_on_after(timeout):
            await replica.wait_committed(last, term)
        held = replica.storage.log.term_at(last)
        if replica.commit_index >= last and held == term:
            return last - count + 1, last
        if replica.commit_index >= last and held is not None:
            raise ProposalLost(f"offset {last} of term {term} was overwritten before commit")
        if held != term:
            # Cut from this log only: a replica that received it may still be elected and
            # commit it (issue 36). Unknown until another entry commits at its offset.
            raise CommitTimeout(
                f"offset {last} of term {term} was cut from this log before it committed "
                "(outcome unknown)"
            )
        raise CommitTimeout(f"offset {last} not committed within {timeout} s (outcome unknown)")

    async def read_index(self, log_id: str, *, timeout: float = 5.0) -> int:
        """A linearizable read point (Raft thesis §6.4): wait until this leader has confirmed,
        with a heartbeat round answered by a majority, that it still leads, and until its commit
        index has reached the commit index it had when asked. Every write acknowledged before
        the call is then at or below ``replica.commit_index``: state read now is not stale, even if
        another leader was elected behind this one's back.

        Raises ``NotLeader`` (not the leader, or leadership lost before the read was confirmed)
        or ``CommitTimeout`` (no answer within ``timeout``: a partition, say; retry).
        """
        replica = self.replicas[log_id]
        if replica.corrupt is not None:
            raise NotLeader(None)
        self._read_seq += 1
        ctx = self._read_seq.to_bytes(8, "big")
        replica.node.read_index(ctx)  # raises NotLeader
        pending = replica._reads[ctx] = PendingRead()
        self._wake_replica(replica)
        try:
            with trio.move_on_after(timeout):
                await pending.done.wait()
                while pending.index is not None and replica.commit_index < pending.index:
                    await replica.changed.wait()
        finally:
            replica._reads.pop(ctx, None)
        if not pending.done.is_set():
            raise CommitTimeout(f"{log_id}: no read point within {timeout} s")
        if pending.index is None:
            raise NotLeader(replica.node.leader)
        if replica.commit_index < pending.index:
            raise CommitTimeout(f"{log_id}: not applied up to the read point within {timeout} s")
        return pending.index

    def propose_nowait(
        self, log_id: str, batch: bytes | CheckedBatch, count: int
    ) -> tuple[int, int]:
        """Append ``batch`` as the leader without waiting; return ``(last offset, term)``.

        ``batch`` may be one this group's log checked already (``check_proposal``): it is not
        parsed again.

        The entry is committed once ``group.commit_index >= last`` while the log still holds it
        in ``term`` (``replica.wait_committed`` waits for that); this is the
        pipelining path (a broker's ingress), ``propose`` the one-at-a-time one. Raises
        ``InvalidBatchError``, ``NotLeader`` or ``ProposalDropped`` (nothing appended).
        """
        replica = self.replicas[log_id]
        return self._propose(replica, batch, count), replica.node.term

    def _propose(self, replica: RaftReplica, batch: bytes | CheckedBatch, count: int) -> int:
        if replica.corrupt is not None:
            raise NotLeader(None)  # set aside while its log is repaired
        # Checked before it joins the Raft log: a bad batch, or a count that disagrees with it,
        # is refused here (it would otherwise stop the driver when the log is written).
        checked = replica.storage.check_proposal(batch, count)
        last = replica.node.propose(checked.data, count, checked)
        self._wake_replica(replica)
        return last

    @property
    def ticks(self) -> int:
        """Ticks since this driver started (its clock, in Raft time)."""
        return self._ticks

    def leader_of(self, log_id: str) -> int | None:
        return self.replicas[log_id].leader

    def hears(self, peer: int) -> bool:
        """Whether ``peer`` answered this broker's pings lately (it is not silent)."""
        return self._quiet.hears(peer)

    # -- the transport side -----------------------------------------------------------------

    def handle_items(self, peer: int, items: list[Any]) -> None:
        """Take a frame's items from ``peer`` (the transport's ``on_items`` callback)."""
        self._quiet.heard(peer, self._ticks)
        self._busy += 1
        try:
            self._handle_items(peer, items)
        finally:
            self._busy -= 1
        self._kick()
        self._flush()

    def _handle_items(self, peer: int, items: list[Any]) -> None:
        stepped: dict[RaftReplica, None] = {}  # in order, once each
        for item in items:
            try:
                kind = item[0]
                if kind == _MSG:
                    replica = self.replicas.get(item[1])
                    if replica is None or replica.corrupt is not None:
                        continue  # not (yet) here, or being repaired: the sender retries
                    msg = from_wire(item[2])
                    if self._quiet.stepped(replica.quiet, msg):  # anything from a peer wakes it
                        self._active.add(replica)
                    try:
                        replica.node.step(msg)
                    except (CorruptLogError, LogDiverged) as exc:
                        self._corrupted(replica, exc)
                        continue
                    stepped[replica] = None
                elif kind == _QUIESCE:
                    self._maybe_quiesce_follower(peer, item[1], item[2], item[3])
            except (MalformedMessage, IndexError, TypeError, KeyError) as exc:
                log.warning(
                    "node %d: dropped a malformed item from node %d: %s", self.node_id, peer, exc
                )
        for replica in stepped:
            if replica.corrupt is None and self.replicas.get(replica.id) is replica:
                self._settle(replica)

    def _settle(self, replica: RaftReplica) -> None:
        """Handle ``replica``'s Ready here and now if it has nothing to make durable (a commit
        to expose, commit news: what most steps of a replicating group leave); else leave it
        to the loop. That saves the loop a pass of the scheduler on each such step."""
        node = replica.node
        if not node.has_ready():
            # Nothing to do, or a Ready is out (its ``advance`` looks again): a commit this
            # step made need not wait for that Ready's fsync.
            self._commit_early(replica)
            return
        if node.ready_needs_storage():
            self._commit_early(replica)  # nor for the round that will make this Ready durable
            self._mark(replica)
            return
        try:
            rd = node.ready()
            replica.storage.persist(rd)  # only a hard state that needs no save: it is in memory
        except CorruptLogError as exc:
            self._corrupted(replica, exc)
            return
        self.readies += 1
        self._after_persist(replica, rd, False)

    def _commit_early(self, replica: RaftReplica) -> None:
        """Expose the commit a step made, and send its commit news, without waiting for the
        group's next Ready (``RaftNode.exposable_commit``, ``commit_news``).

        A leader whose own fsync of the next entries is in flight commits an entry as its
        followers' answers come; a follower learns a commit while it writes the next entries.
        Their round's end would otherwise hold every acknowledgement, long poll and follower's
        commit a round longer: about an fsync per write at a steady 1,000 writes/s
        (``bench.write_trace``). Safe: the commit counts only durable copies (the leader's
        own only once durable), so an acknowledgement still means a majority has the entry on
        disk."""
        node = replica.node
        for msg in node.commit_news():
            self._send(msg.dst, [_MSG, replica.id, to_wire(msg)])
        commit = node.exposable_commit()
        if commit > replica.commit_index:
            replica.commit_index = commit
            replica._notify()

    def peer_changed(self, peer: int, connected: bool) -> None:
        """The transport's news: a lost connection makes ``peer`` silent at once."""
        if not connected:
            self._quiet.disconnected(peer)
            self._wake_orphans(peer, gone=True)

    def _maybe_quiesce_follower(self, peer: int, log_id: str, term: int, commit: int) -> None:
        replica = self.replicas.get(log_id)
        if replica is None:
            return
        last = replica.storage.last_index()
        if self._quiet.quiesce_follower(replica.quiet, replica.node, last, peer, term, commit):
            self._active.discard(replica)

    # -- the loop -----------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Tick, and finish each round as its durability work ends, until cancelled.

        Rounds start where their cause is handled (``_kick``): this task only waits for the
        fsync workers' eventfd, so a round costs it one pass of the scheduler, at its end.
        """
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._tick_loop)
            self._running = True
            try:
                task_status.started()
                self._kick()  # what was marked before the loop ran (groups added, say)
                self._flush()
                while True:
                    await self._fsync_workers.wait()
                    self._collect()
                    self._kick()
                    self._flush()
            finally:
                self._running = False

    async def _tick_loop(self) -> None:
        next_at = trio.current_time()
        while True:
            next_at += self.tick_interval
            await trio.sleep_until(next_at)
            if trio.current_time() - next_at > 10 * self.tick_interval:
                next_at = trio.current_time()  # we fell far behind (a pause): do not burst
            self._fsync_workers.check()  # a dead fsync helper stops the driver (its docstring)
            self.tick()
            self._flush()

    def tick(self) -> None:
        """One tick: ping peers, tick active groups, quiesce idle leaders, wake orphaned ones."""
        self._busy += 1
        try:
            self._tick()
        finally:
            self._busy -= 1
        self._kick()

    def _tick(self) -> None:
        self._ticks += 1
        for peer in self._peers:
            self._send(peer, [_PING])
        for peer in self._quiet.check_peers(self._peers, self._ticks):
            self._wake_orphans(peer, gone=False)
        for replica in list(self._active):
            node = replica.node
            # Checked before ticking: a tick makes a leader queue its heartbeat.
            if self._quiet.quiesce_leader(replica.quiet, node):
                self._quiesce_followers(replica)
                continue
            try:
                node.tick()
            except CorruptLogError as exc:
                self._corrupted(replica, exc)
                continue
            self._quiet.ticked(replica.quiet)
            self._mark(replica)
        self._scrub_one()

    # -- corruption -------------------------------------------------------------------------

    def _scrub_one(self) -> None:
        """Scrub the next group's sealed segments a little (one group a tick, round robin)."""
        if self._scrub_bytes <= 0 or not self._scrub_order:
            return
        self._scrub_next %= len(self._scrub_order)
        replica = self.replicas[self._scrub_order[self._scrub_next]]
        if replica.corrupt is not None:
            return
        try:
            if replica.log.scrub_step(self._scrub_bytes):
                self._scrub_next += 1  # a full pass over this group: on to the next
        except CorruptLogError as exc:
            self._corrupted(replica, exc)

    def _node_config(self, storage: PartitionStorage) -> RaftConfig:
        """The core's settings for a group over ``storage``: acknowledgements are durable only
        if its log fsyncs each write before they go out."""
        config = self._raft_config(self.node_id)
        durable = storage.log.config.fsync is FsyncPolicy.ALWAYS
        return config if config.durable_acks == durable else replace(config, durable_acks=durable)

    def _corrupted(self, replica: RaftReplica, error: CorruptLogError | LogDiverged) -> None:
        """Set ``replica``'s core aside (it must act on its log no more) until ``_repair``: its
        log is corrupt, or (``LogDiverged``) disagrees with the leader's below its commit."""
        if self.replicas.get(replica.id) is not replica or replica.corrupt is not None:
            return
        if isinstance(error, LogDiverged):
            log.error(
                "diverged: node %d: %s: %s (a quorum lost entries committed here: acknowledged "
                "before fsync, then a power cut); cutting the log there",
                self.node_id,
                replica.id,
                error,
            )
        else:
            log.error("corruption: node %d: %s: %s; repairing", self.node_id, replica.id, error)
        node = replica.node
        if node.role is Role.LEADER:
            # Step down first: hand the group to the follower that holds most of the log.
            status = node.status()
            best = max(
                (
                    p
                    for p in status.progress
                    if p != self.node_id and p in status.configuration.voters
                ),
                key=lambda p: status.progress[p].match,
                default=None,
            )
            if best is not None:
                self._send(
                    best, [_MSG, replica.id, to_wire(TimeoutNow(self.node_id, best, node.term))]
                )
        replica.corrupt = error
        self._active.discard(replica)
        self._dirty.discard(replica)
        self._corrupt.add(replica)
        self._kick()

    def _repair(self, replica: RaftReplica) -> None:
        """Cut ``replica``'s log before the bad batch (or where it diverged) and start a new
        core over it (no Ready of the group is in flight): a follower that re-replicates what it
        lost."""
        error = replica.corrupt
        if error is None:
            return
        if isinstance(error, LogDiverged):
            end = replica.storage.cut_diverged(error.offset)
        else:
            end = replica.storage.repair_corruption(error)
        replica._fail_waiters_above(end)
        # What readers take as committed goes down with the log: above its end a reader would
        # wait for offsets that are not there, or (once the leader resends them) be handed
        # entries this replica has not seen committed yet.
        replica.commit_index = min(replica.commit_index, end - 1)
        replica.node = RaftNode(self._node_config(replica.storage), replica.storage, self._rng)
        replica.corrupt = None
        if isinstance(error, LogDiverged):
            replica.divergences += 1
            log.error(
                "diverged: node %d: %s: log cut to end at %d; following the leader's log from "
                "there",
                self.node_id,
                replica.id,
                end,
            )
        else:
            self.corruptions += 1
            log.error(
                "corruption: node %d: %s: log cut to end at %d; re-replicating from the leader "
                "(no vote until offset %s is back)",
                self.node_id,
                replica.id,
                end,
                replica.log.lost_end_offset,
            )
        replica._notify()
        self._quiet.wake(replica.quiet)
        self._active.add(replica)
        self._mark(replica)

    def _wake_orphans(self, peer: int, *, gone: bool) -> None:
        """``peer`` went silent (or, with ``gone``, its connection closed): a rare sweep over the
        groups it leads here, each woken and told what the policy decided
        (``QuiescencePolicy.orphaned``), and over the quiesced groups led here that it votes in,
        woken so that check-quorum runs (``QuiescencePolicy.voter_silent``)."""
        for replica in self.replicas.values():
            if self._quiet.voter_silent(replica.quiet, replica.node, peer):
                self._active.add(replica)
                self._mark(replica)
                log.info("node %d: %s woke up, voter %d is silent", self.node_id, replica.id, peer)
                continue
            wake = self._quiet.orphaned(replica.quiet, replica.node, peer, self._ticks, gone=gone)
            if wake is None:
                continue
            self._active.add(replica)
            wake.apply(replica.node)
            self._mark(replica)
            if wake.woke:
                log.info("node %d: %s woke up, node %d is silent", self.node_id, replica.id, peer)

    def _quiesce_followers(self, replica: RaftReplica) -> None:
        """The policy quiesced the leader's ``replica``: stop ticking it, and tell every other
        member the term and commit to quiesce at."""
        self._active.discard(replica)
        node = replica.node
        for peer in node.configuration.members:
            if peer != self.node_id:
                self._send(peer, [_QUIESCE, replica.id, node.term, node.commit])

    def _mark(self, replica: RaftReplica) -> None:
        if self.replicas.get(replica.id) is not replica:
            return  # removed while a step was in flight: its log is closed
        self._dirty.add(replica)
        self._kick()

    def _wake_replica(self, replica: RaftReplica) -> None:
        """A local request for ``replica`` (a proposal, a read, a membership change) wakes it."""
        woke = self._quiet.requested(replica.quiet)
        if not woke and replica in self._dirty:
            return  # already active, marked and the loop woken: a proposal burst
        self._active.add(replica)
        self._mark(replica)

    def _kick(self) -> None:
        """Start a round if work is marked, none is in flight, and no step, tick or round's
        end is under way (that one kicks at its end, so a frame's or a tick's groups go in one
        round). A round therefore starts in the task that caused it (a proposer's, the peer
        connection's that brought the entries): no pass of the scheduler of its own."""
        idle = self._running and not self._busy and self._round is None
        if idle and (self._dirty or self._corrupt):
            self._start_round()

    def _start_round(self) -> None:
        """Write the Readys of the marked groups and hand their fsyncs to the worker as one
        job (group commit); a round with nothing to make durable is finished here and now."""
        self._busy += 1
        try:
            while self._round is None and (self._dirty or self._corrupt):
                if not self._begin_round():
                    break
        finally:
            self._busy -= 1

    def _begin_round(self) -> bool:
        """One round's start; False if no marked group had a Ready."""
        # Here no Ready is in flight: the groups set aside for corruption can be repaired.
        corrupt, self._corrupt = self._corrupt, set()
        for replica in corrupt:
            if self.replicas.get(replica.id) is replica:
                self._repair(replica)
        dirty, self._dirty = self._dirty, set()
        readies: list[tuple[RaftReplica, Ready, bool]] = []
        for replica in dirty:
            if replica.corrupt is not None or not replica.node.has_ready():
                continue
            try:
                rd = replica.node.ready()
                early = replicates_only(rd, replica.storage.hard_state)
                if early:
                    # A leader replicates while it writes to its own disk (thesis §10.2.1, as
                    # etcd does): it counts itself only for what is durable (``advance``), and
                    # these messages acknowledge nothing and announce no vote.
                    self._send_messages(replica, rd)
                replica.storage.persist(rd)
            except CorruptLogError as exc:
                self._corrupted(replica, exc)  # this Ready is dropped, as a crash would drop it
                continue
            readies.append((replica, rd, early))
        if not readies:
            return False
        self.readies += len(readies)
        tickets: list[tuple[PartitionLog, FlushTicket]] = []
        for replica, rd, _ in readies:
            glog = replica.storage.log
            wrote = rd.entries or rd.truncate_from is not None or rd.log_reset is not None
            # An INTERVAL log's flush, when due, joins the round's job too: never an fsync on
            # the event loop (its acknowledgements need not wait for it, but waiting once an
            # interval costs less than a job of its own).
            if wrote and (glog.config.fsync is FsyncPolicy.ALWAYS or glog.flush_due()):
                tickets.append((glog, glog.flush_ticket()))
        snapshot = self.hard_states.snapshot() if self.hard_states.dirty else None
        self._flush()  # the leaders' appends go out while their entries are made durable here
        # (The group commit's duration is real time, whatever clock drives the ticks.)
        rnd = Round(readies, tickets, snapshot is not None, time.perf_counter())
        if not tickets and snapshot is None:
            self._end_round(rnd)
            return True
        self._round = rnd
        if snapshot is None:  # the usual round: the logs' fsyncs only, in the helper process
            self._fsync_workers.submit_fsyncs([t for _, t in tickets])
        else:
            self._fsync_workers.submit(
                functools.partial(make_durable, [t for _, t in tickets], self.hard_states, snapshot)
            )
        return True

    def _collect(self) -> None:
        """Finish the round in flight if its job has ended (``run``'s loop, after a wake-up).

        A failed fsync is fatal: it is raised, and stops the driver (the log's durability is
        unknown: no acknowledgement may follow)."""
        for error in self._fsync_workers.take_ends():
            if error is not None:
                raise error
            rnd, self._round = self._round, None
            if rnd is None:
                raise AssertionError("a durability job ended with no round in flight")
            self.fsyncs += len(rnd.tickets) + rnd.hard_states
            if self.on_group_commit is not None:
                self.on_group_commit(time.perf_counter() - rnd.started)
            for glog, ticket in rnd.tickets:
                glog.flushed(ticket)
            self._busy += 1
            try:
                self._end_round(rnd)
            finally:
                self._busy -= 1

    def _end_round(self, rnd: Round) -> None:
        for replica, rd, sent in rnd.readies:
            self._after_persist(replica, rd, sent)

    async def _process(self) -> None:
        """One round by hand, for tests that drive brokers without ``run``: start a round
        from what is marked (if none is in flight), wait until it is durable, finish it."""
        if self._round is None:
            self._busy += 1
            try:
                if self._dirty or self._corrupt:
                    self._begin_round()
            finally:
                self._busy -= 1
        while self._round is not None:
            await self._fsync_workers.wait()
            self._collect()

    def _send_messages(self, replica: RaftReplica, rd: Ready) -> None:
        for msg in rd.messages:
            self._send(msg.dst, [_MSG, replica.id, to_wire(msg)])

    def _after_persist(self, replica: RaftReplica, rd: Ready, sent: bool) -> None:
        if not sent:
            self._send_messages(replica, rd)
        if rd.entries:
            self._quiet.wrote(replica.quiet)
        # The commit index first: a waiter whose entry was cut tells from it whether another
        # entry committed in its place (lost for good) or not (it may still commit elsewhere).
        if rd.committed is not None:
            replica.commit_index = max(replica.commit_index, rd.committed[1])
        if rd.truncate_from is not None:
            replica._fail_waiters_above(rd.truncate_from)
        if rd.log_reset is not None:
            replica._fail_waiters_above(rd.log_reset.start)
        if rd.committed is not None or rd.truncate_from is not None or rd.log_reset is not None:
            replica._notify()
        for state in rd.read_states:
            pending = replica._reads.get(state.ctx)
            if pending is not None:
                pending.index = state.index
                pending.done.set()
        for ctx in rd.dropped_reads:
            pending = replica._reads.get(ctx)
            if pending is not None:
                pending.done.set()  # index None: leadership was lost
        replica.node.advance(rd)
        # A leader that counts itself now (its fsync ended after a follower's) commits here:
        # exposed at once, not at the end of the next round (its next entries' fsync).
        self._commit_early(replica)
        if replica.node.has_ready():
            self._mark(replica)


def _nothing() -> None:
    pass


def preferred_leader(log_id: str, voters: Iterable[int]) -> int | None:
    """The replica that should lead ``log_id``: a stable hash over the sorted voters."""
    ordered = sorted(voters)
    return ordered[zlib.crc32(log_id.encode()) % len(ordered)] if ordered else None


__all__ = ["MultiRaft", "preferred_leader"]
