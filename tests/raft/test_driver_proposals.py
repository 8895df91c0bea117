"""The driver's proposal path and its ordering duties, on in-process brokers (no sockets).

Three ``MultiRaft`` instances pass their transport items to each other by hand, so every send
can be checked against what the sender has made durable at that moment.
"""

from __future__ import annotations

import struct
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from kafkaesque.raft import (
    AppendEntries,
    AppendEntriesResponse,
    Configuration,
    HardState,
    Heartbeat,
    Ready,
    RequestVote,
    RequestVoteResponse,
    Role,
    from_wire,
)
from kafkaesque.raft._messages import TAGS
from kafkaesque.raft.driver import MultiRaft
from kafkaesque.raft.driver._round import replicates_only
from kafkaesque.storage import (
    BatchType,
    FsyncPolicy,
    InvalidBatchError,
    LogConfig,
    PartitionLog,
    Record,
    build_batch,
    decode_header,
    stamp,
)

GROUP = "g"


class Cluster:
    """Brokers whose sends go to a queue; ``settle`` delivers and processes until quiet.

    Every acknowledgement is checked as it is sent: the follower must already hold the
    acknowledged entries on disk (fsynced), the durability half of Raft's contract.
    """

    def __init__(self, root: Path, n: int, log_config: LogConfig | None = None) -> None:
        self.queue: list[tuple[int, int, Any]] = []
        self.early_appends = 0  # AppendEntries sent before the leader's own fsync covered them
        self.brokers = [
            MultiRaft(i, self._sender(i), state_dir=str(root / f"s{i}"), peers=range(n))
            for i in range(n)
        ]
        for b in self.brokers:
            b.add_replica(GROUP, str(root / f"b{b.node_id}"), range(n), log_config)

    def _sender(self, src: int) -> Any:
        def send(dst: int, item: Any) -> bool:
            if item[0] == 0:  # a Raft message
                self._check(src, item[2])
            self.queue.append((src, dst, item))
            return True

        return send

    def _check(self, src: int, wire: list[Any]) -> None:
        log = self.brokers[src].replicas[GROUP].log
        if wire[0] == 4 and wire[4]:  # a successful AppendEntriesResponse: [4, s, d, t, ok, i..]
            assert log.flushed_end_offset > wire[5], "acknowledged before it was durable"
        if wire[0] == 3 and wire[7]:  # AppendEntries with entries: [3, s, d, t, p, pt, c, ents]
            self.early_appends += log.flushed_end_offset <= wire[7][-1][2]

    async def settle(self, rounds: int = 50, cut_off: int | None = None) -> None:
        """Process and deliver until quiet; what goes to or from ``cut_off`` is lost."""
        for _ in range(rounds):
            for b in self.brokers:
                await b._process()
            if not self.queue and not any(b._dirty for b in self.brokers):
                return
            queue, self.queue = self.queue, []
            for src, dst, item in queue:
                if cut_off not in (src, dst):
                    self.brokers[dst].handle_items(src, [item])

    def leader(self) -> MultiRaft:
        (leader,) = [b for b in self.brokers if b.replicas[GROUP].role is Role.LEADER]
        return leader


def _batch(n: int = 3) -> bytes:
    return build_batch([Record(value=b"v%d" % i) for i in range(n)])


async def test_followers_acknowledge_only_durable_entries_and_the_leader_does_not_wait(
    tmp_path: Path,
) -> None:
    cluster = Cluster(tmp_path, 3)
    await cluster.settle()
    leader = cluster.leader()
    for _ in range(5):
        leader.propose_nowait(GROUP, _batch(), 3)
        await cluster.settle()
    assert leader.replicas[GROUP].commit_index == 15  # the no-op at 0, then 5 batches of 3
    # The leader replicated its entries before its own fsync of them (thesis §10.2.1).
    assert cluster.early_appends > 0
    leader.tick()  # the followers learn the last commit from the tick's heartbeat
    await cluster.settle()
    for b in cluster.brokers:
        records = b.replicas[GROUP].committed_records()
        assert [r.value for r in records] == [b"v0", b"v1", b"v2"] * 5


async def test_a_ready_with_nothing_to_make_durable_is_handled_as_its_cause_arrives(
    tmp_path: Path,
) -> None:
    """Commit news needs no fsync: the follower exposes the commit while the frame that brings it
    (the leader's commit news, sent at the step that committed: ``eager_commit_news``) is
    handled (``handle_items``), not at a later pass of the driver's loop, and not at the next
    write or tick."""
    cluster = Cluster(tmp_path, 3)
    await cluster.settle()
    leader = cluster.leader()
    followers = [b for b in cluster.brokers if b is not leader]
    leader.propose_nowait(GROUP, _batch(), 3)
    for _ in range(20):  # the loops' passes, by hand, until the leader commits the batch
        for b in cluster.brokers:
            await b._process()
        queue, cluster.queue = cluster.queue, []
        for src, dst, item in queue:
            cluster.brokers[dst].handle_items(src, [item])
        if leader.replicas[GROUP].commit_index == 3:
            break
    assert leader.replicas[GROUP].commit_index == 3
    assert [f.replicas[GROUP].commit_index for f in followers] == [0, 0]
    # No tick: the step that committed (or the second answer's) told both followers at once,
    # in heartbeats that ask no answer.
    news = [
        (src, dst, item)
        for src, dst, item in cluster.queue
        if item[0] == 0 and item[2][0] == TAGS[Heartbeat]
    ]
    assert sorted(dst for _, dst, _ in news) == sorted(f.node_id for f in followers)
    for _, _, item in news:
        beat = from_wire(item[2])
        assert isinstance(beat, Heartbeat) and beat.reply is False
    for src, dst, item in news:
        cluster.brokers[dst].handle_items(src, [item])  # and no pass of the loop after it
    assert [f.replicas[GROUP].commit_index for f in followers] == [3, 3]
    assert not any(f._dirty for f in followers)
    await cluster.settle()
    for b in cluster.brokers:
        assert [r.value for r in b.replicas[GROUP].committed_records()] == [b"v0", b"v1", b"v2"]


async def test_a_commit_is_exposed_and_told_without_waiting_for_the_round_in_flight(
    tmp_path: Path,
) -> None:
    """The answers that commit batch A reach the leader while its own fsync of batch B is in
    flight (its Ready is out): A is committed at once (replies, long polls) and the followers
    are told at once, not when B's round ends; a follower told while it fsyncs B exposes A at
    once too. Only durable copies count: A was durable on all three."""
    cluster = Cluster(tmp_path, 3)
    await cluster.settle()
    leader = cluster.leader()
    followers = [b for b in cluster.brokers if b is not leader]
    start = leader.replicas[GROUP].commit_index
    a_last, _ = leader.propose_nowait(GROUP, _batch(), 3)
    await leader._process()  # A is durable at the leader; its appends are queued
    appends, cluster.queue = cluster.queue, []
    for src, dst, item in appends:
        cluster.brokers[dst].handle_items(src, [item])
    for f in followers:
        await f._process()  # A is durable at each follower; their answers are queued
    answers, cluster.queue = cluster.queue, []
    b_last, _ = leader.propose_nowait(GROUP, _batch(), 3)
    leader._busy += 1
    assert leader._begin_round()  # B's round: written, its fsync handed out, not collected
    leader._busy -= 1
    assert leader._round is not None
    for src, _, item in answers:
        leader.handle_items(src, [item])
    assert leader._round is not None  # B's round is still out ...
    assert leader.replicas[GROUP].commit_index == a_last > start  # ... and A is committed
    news = [
        (src, dst, item)
        for src, dst, item in cluster.queue
        if item[0] == 0 and item[2][0] == TAGS[Heartbeat]
    ]
    assert sorted(dst for _, dst, _ in news) == sorted(f.node_id for f in followers)
    b_appends = [(s, d, i) for s, d, i in cluster.queue if (s, d, i) not in news]
    cluster.queue = []
    for src, dst, item in b_appends:  # the followers start their rounds of B ...
        cluster.brokers[dst].handle_items(src, [item])
    for f in followers:
        f._busy += 1
        f._begin_round()
        f._busy -= 1
        assert f._round is not None
    for src, dst, item in news:  # ... and hear A's commit while they fsync B
        cluster.brokers[dst].handle_items(src, [item])
    assert [f.replicas[GROUP].commit_index for f in followers] == [a_last, a_last]
    for b in cluster.brokers:
        await b._process()
    await cluster.settle()
    leader.tick()
    await cluster.settle()
    for b in cluster.brokers:
        assert b.replicas[GROUP].commit_index == b_last
        assert [r.value for r in b.replicas[GROUP].committed_records()] == [b"v0", b"v1", b"v2"] * 2


async def test_a_commit_the_leaders_own_fsync_makes_is_exposed_at_its_end(
    tmp_path: Path,
) -> None:
    """One follower is cut off; the other answered A before the leader's own fsync of A ended.
    That fsync's end commits A (the leader counts itself once durable): A is exposed then, not
    at the end of the next round, which makes B (proposed meanwhile) durable."""
    cluster = Cluster(tmp_path, 3)
    await cluster.settle()
    leader = cluster.leader()
    near, far = [b for b in cluster.brokers if b is not leader]
    a_last, _ = leader.propose_nowait(GROUP, _batch(), 3)
    leader._busy += 1
    assert leader._begin_round()  # A written, its fsync handed out, not collected
    leader._busy -= 1
    appends, cluster.queue = cluster.queue, []
    for src, dst, item in appends:
        if dst == near.node_id:
            near.handle_items(src, [item])
    await near._process()
    answers, cluster.queue = cluster.queue, []
    for src, dst, item in answers:
        if dst == leader.node_id:
            leader.handle_items(src, [item])
    assert leader.replicas[GROUP].commit_index < a_last  # the leader's own copy is missing
    leader.propose_nowait(GROUP, _batch(), 3)  # B: waits for the next round
    while leader._round is not None:
        await leader._fsync_workers.wait()
        leader._collect()
    assert leader.replicas[GROUP].commit_index == a_last
    assert far.replicas[GROUP].commit_index < a_last


def test_only_a_leaders_replication_may_go_before_its_ready_is_durable() -> None:
    def ready(messages: tuple[Any, ...], hard: HardState | None = None) -> Ready:
        return Ready(None, hard, None, None, (), messages, None, (), ())

    persisted = HardState(term=3, vote=1, commit=5)
    append = AppendEntries(1, 2, 3, 5, 3, 5)
    heartbeat = Heartbeat(1, 2, 3, 5)
    assert replicates_only(ready((append, heartbeat)), persisted)
    assert replicates_only(ready((append,), HardState(3, 1, 9)), persisted)  # commit only
    assert not replicates_only(ready(()), persisted)
    # Acknowledgements and votes wait for the disk; so does anything beside a new term or vote.
    assert not replicates_only(ready((AppendEntriesResponse(2, 1, 3, True, 5),)), persisted)
    assert not replicates_only(ready((RequestVoteResponse(2, 1, 3, True),)), persisted)
    assert not replicates_only(ready((append, RequestVote(1, 3, 3, 5, 3))), persisted)
    assert not replicates_only(ready((append,), HardState(4, None, 5)), persisted)
    assert not replicates_only(ready((append,), HardState(3, 2, 5)), persisted)


async def test_an_invalid_proposal_is_refused_and_the_group_goes_on(tmp_path: Path) -> None:
    # Found while moving batch checks out of the write path: an invalid batch (or a count that
    # disagrees with it) was accepted into the Raft log and then stopped the driver when the
    # log was written, for every group of the broker.
    cluster = Cluster(tmp_path, 1, LogConfig(max_batch_bytes=2048))
    await cluster.settle()
    raft = cluster.leader()
    good = _batch()
    corrupt = bytearray(good)
    corrupt[-1] ^= 0xFF
    config = build_batch(
        [Record(value=Configuration.of([0, 7]).encode())], batch_type=BatchType.CONFIG
    )
    cases: list[tuple[bytes, int]] = [
        (bytes(corrupt), 3),
        (good, 2),  # the batch spans 3 offsets
        (good + good, 3),
        (_batch(300), 300),  # over max_batch_bytes
        (config, 1),  # a control batch would be read back as a membership change
        (stamp(good, base_offset=0, term=0)[:-1], 3),
    ]
    for batch, count in cases:
        with pytest.raises(InvalidBatchError):
            raft.propose_nowait(GROUP, batch, count)
        with pytest.raises(InvalidBatchError):
            await raft.propose(GROUP, batch, count)
    assert raft.propose_nowait(GROUP, good, 3)[0] == 3
    await cluster.settle()
    assert raft.replicas[GROUP].commit_index == 3
    assert raft.replicas[GROUP].node.configuration.voters == {0}


async def test_a_proposal_is_parsed_once_and_carried_checked_into_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parse once (issue 22): the check at proposal rides with the entry (``Entry.prepared``)
    to the log's append, which does not decode the batch again; a batch the caller checked
    (``check_proposal``) is not decoded at all, only held to its count."""
    from kafkaesque.storage import _partition_log

    cluster = Cluster(tmp_path, 1)
    await cluster.settle()
    raft = cluster.leader()
    replica = raft.replicas[GROUP]
    batch = _batch()
    decoded: list[int] = []
    real = decode_header

    def counting(*args: Any, **kwargs: Any) -> Any:
        decoded.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(_partition_log, "decode_header", counting)
    for _ in range(4):
        raft.propose_nowait(GROUP, batch, 3)
    assert len(decoded) == 4  # the checks
    checked = replica.storage.check_proposal(batch, 3)
    assert len(decoded) == 5
    with pytest.raises(InvalidBatchError, match="not 2"):
        raft.propose_nowait(GROUP, checked, 2)
    raft.propose_nowait(GROUP, checked, 3)
    await cluster.settle()
    assert len(decoded) == 5 and replica.commit_index == 15
    # What the log wrote is the batch stamped at each offset.
    data = replica.log.read(1).data
    assert struct.unpack_from(">q", data, 0)[0] == 1
    assert [r.offset for r in replica.committed_records()] == list(range(1, 16))


async def _leader_with_commit_waiter(
    tmp_path: Path,
) -> tuple[Cluster, MultiRaft, list[int], Callable[[int, int], Awaitable[None]]]:
    """Three brokers with a leader; a task body that waits on the leader's
    ``replica.wait_committed``, and the commit indexes it woke at."""
    cluster = Cluster(tmp_path, 3)
    await cluster.settle()
    leader = cluster.leader()
    replica = leader.replicas[GROUP]
    woken_at: list[int] = []

    async def wait(last: int, term: int) -> None:
        await replica.wait_committed(last, term)
        woken_at.append(replica.commit_index)

    return cluster, leader, woken_at, wait


async def test_a_commit_waiter_wakes_when_its_offset_commits_and_not_before(
    tmp_path: Path,
) -> None:
    cluster, leader, woken_at, wait = await _leader_with_commit_waiter(tmp_path)
    replica = leader.replicas[GROUP]
    async with trio.open_nursery() as nursery:
        last, term = leader.propose_nowait(GROUP, _batch(), 3)
        nursery.start_soon(wait, last + 3, term)  # the next batch's last offset
        await trio.testing.wait_all_tasks_blocked()
        await cluster.settle()
        await trio.testing.wait_all_tasks_blocked()
        assert replica.commit_index == last and woken_at == []
        leader.propose_nowait(GROUP, _batch(), 3)
        await cluster.settle()
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert woken_at == [last + 3]


async def _elect_another_leader(cluster: Cluster, old: MultiRaft) -> None:
    """Cut ``old`` off until another broker leads ``GROUP``, which then commits a batch of its own
    (over ``old``'s uncommitted entries at the same offsets)."""
    others = [b for b in cluster.brokers if b is not old]
    for _ in range(100):  # election timeouts pass without a word from the old leader
        if any(b.replicas[GROUP].role is Role.LEADER for b in others):
            break
        for b in others:
            b.tick()
        await cluster.settle(cut_off=old.node_id)
    new = next(b for b in others if b.replicas[GROUP].role is Role.LEADER)
    new.propose_nowait(GROUP, _batch(1), 1)
    await cluster.settle(cut_off=old.node_id)


async def _let_the_new_leader_reach(cluster: Cluster) -> None:
    """Ticks with every broker connected: the new leader's heartbeats reach the old one, which
    drops its cut entries."""
    for _ in range(10):
        for b in cluster.brokers:
            b.tick()
        await cluster.settle()


async def test_a_commit_waiter_wakes_short_of_the_commit_when_its_entry_is_cut(
    tmp_path: Path,
) -> None:
    cluster, old, woken_at, wait = await _leader_with_commit_waiter(tmp_path)
    replica = old.replicas[GROUP]
    async with trio.open_nursery() as nursery:
        last, term = old.propose_nowait(GROUP, _batch(), 3)  # never leaves the old leader
        nursery.start_soon(wait, last, term)
        await _elect_another_leader(cluster, old)
        assert woken_at == []
        await _let_the_new_leader_reach(cluster)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert len(woken_at) == 1 and woken_at[0] < last
    assert replica.log.log_end_offset <= last or replica.log.term_at(last) != term


async def test_commit_callbacks_run_once_in_offset_order_from_the_step_that_commits(
    tmp_path: Path,
) -> None:
    # Issue 22: the broker's appender finishes a batch from the callback, with no task waiting.
    cluster = Cluster(tmp_path, 3)
    await cluster.settle()
    leader = cluster.leader()
    replica = leader.replicas[GROUP]
    heard: list[tuple[str, int]] = []
    first, term = leader.propose_nowait(GROUP, _batch(), 3)
    second, _ = leader.propose_nowait(GROUP, _batch(), 3)
    replica.on_committed(second, term, lambda: heard.append(("second", replica.commit_index)))
    replica.on_committed(first, term, lambda: heard.append(("first", replica.commit_index)))
    assert heard == []
    await cluster.settle()
    assert [name for name, _ in heard] == ["first", "second"]
    assert heard[0][1] >= first and heard[1][1] >= second
    replica.on_committed(first, term, lambda: heard.append(("late", replica.commit_index)))
    assert heard[-1] == ("late", second)  # already committed: called at once
    leader.propose_nowait(GROUP, _batch(), 3)
    await cluster.settle()
    assert len(heard) == 3 and replica._waiters == []  # each called once


async def test_a_commit_callback_runs_once_when_its_entry_is_cut(
    tmp_path: Path,
) -> None:
    cluster = Cluster(tmp_path, 3)
    await cluster.settle()
    old = cluster.leader()
    replica = old.replicas[GROUP]
    heard: list[tuple[int, int]] = []  # (commit index, log end) when called
    last, term = old.propose_nowait(GROUP, _batch(), 3)  # never leaves the old leader
    replica.on_committed(
        last, term, lambda: heard.append((replica.commit_index, replica.log.log_end_offset))
    )
    await _elect_another_leader(cluster, old)
    assert heard == []
    await _let_the_new_leader_reach(cluster)
    assert len(heard) == 1
    commit, end = heard[0]
    assert commit < last and end <= last  # called at the cut, not at a later commit
    assert replica.log.log_end_offset <= last or replica.log.term_at(last) != term
    assert replica._waiters == []  # and it is called no more


async def _deliver_forever(cluster: Cluster) -> None:
    """The running brokers' network: deliver what was sent, as a peer connection's task would."""
    while True:
        queue, cluster.queue = cluster.queue, []
        for src, dst, item in queue:
            cluster.brokers[dst].handle_items(src, [item])
        await trio.sleep(0.001)


async def test_a_round_starts_where_its_cause_is_handled_and_acks_wait_for_the_disk(
    tmp_path: Path,
) -> None:
    """With the loops running, a proposal is written, replicated and handed to the fsync worker
    before ``propose_nowait`` returns, and a follower writes what a frame brings before
    ``handle_items`` returns: neither waits for a pass of the driver's loop. Every
    acknowledgement is still checked durable as it is sent (``Cluster._check``)."""
    cluster = Cluster(tmp_path, 3)
    await cluster.settle()
    leader = cluster.leader()
    followers = [b for b in cluster.brokers if b is not leader]
    async with trio.open_nursery() as nursery:
        for b in cluster.brokers:
            await nursery.start(b.run)
        glog = leader.replicas[GROUP].log
        end = glog.log_end_offset
        last, _ = leader.propose_nowait(GROUP, _batch(), 3)
        assert glog.log_end_offset == end + 3  # written, no await in between
        appends = [
            (dst, item) for src, dst, item in cluster.queue if item[0] == 0 and item[2][0] == 3
        ]
        assert sorted(dst for dst, _ in appends) == sorted(f.node_id for f in followers)
        assert leader._round is not None  # its fsync is in flight
        follower = followers[0]
        flog = follower.replicas[GROUP].log
        (item,) = [item for dst, item in appends if dst == follower.node_id]
        cluster.queue.clear()
        follower.handle_items(leader.node_id, [item])
        assert flog.log_end_offset == end + 3 and follower._round is not None
        assert not [i for s, _, i in cluster.queue if s == follower.node_id and i[0] == 0]
        nursery.start_soon(_deliver_forever, cluster)
        with trio.fail_after(10):
            while leader.replicas[GROUP].commit_index < last:
                await trio.sleep(0.005)
        for i in range(20):  # and a stream of proposals, each committed in order
            last, _ = leader.propose_nowait(GROUP, build_batch([Record(value=b"s%d" % i)]), 1)
            with trio.fail_after(10):
                while leader.replicas[GROUP].commit_index < last:
                    await trio.sleep(0.001)
        nursery.cancel_scope.cancel()
    values = [r.value for r in leader.replicas[GROUP].committed_records()]
    assert values == [b"v0", b"v1", b"v2"] + [b"s%d" % i for i in range(20)]
    for b in cluster.brokers:
        b.close()


async def test_an_interval_logs_due_flush_runs_on_the_worker_never_on_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found in review: under ``FsyncPolicy.INTERVAL`` the driver fsynced a due log with
    ``maybe_flush``, on the event loop (a blocking call there stalls every group)."""
    cluster = Cluster(tmp_path, 3, LogConfig(fsync=FsyncPolicy.INTERVAL, fsync_interval_ms=0))
    await cluster.settle()
    leader = cluster.leader()

    def on_the_loop(self: PartitionLog) -> None:
        raise AssertionError("an fsync on the event loop")

    monkeypatch.setattr(PartitionLog, "flush", on_the_loop)
    last, _ = leader.propose_nowait(GROUP, _batch(), 3)
    await cluster.settle()
    for b in cluster.brokers:
        glog = b.replicas[GROUP].log
        assert glog.flushed_end_offset == last + 1  # flushed, by a ticket on the worker
    assert leader.replicas[GROUP].commit_index == last
