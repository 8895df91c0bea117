"""``Forwarder``: a call to a partition's leader that went silent and was replaced ends at once.

Issue 23: a broker paused by SIGSTOP keeps its connections open, so nothing closes and no answer
comes; writes forwarded to it waited out their whole deadline while a new leader had long been
elected. The call now ends with ``LeaderReplaced`` (outcome unknown), and the write path answers
the retriable ``TIMEOUT`` instead of appending the batch a second time blindly.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from kafkaesque.broker._appender import PartitionAppender
from kafkaesque.broker._broker import Broker
from kafkaesque.broker._config import Address, BrokerConfig
from kafkaesque.broker._errors import RequestError
from kafkaesque.broker._forwarding import (
    Forwarder,
    ForwardTimeout,
    LeaderReplaced,
    _Call,
)
from kafkaesque.broker._leaders import Claim, LeaderTable
from kafkaesque.broker._writes import WritePath
from kafkaesque.protocol import (
    Acks,
    Appended,
    AppendRequest,
    Bounds,
    BoundsRequest,
    CommandReply,
    ErrorCode,
    FetchOffsets,
    FindResendRequest,
    GroupCommandRequest,
    LeaderClaims,
    Leave,
    PeerCall,
    PeerReply,
    Refused,
    Retry,
    Unknown,
    is_peer_item,
    peer_from_wire,
    peer_to_wire,
)
from kafkaesque.protocol._peer_messages import REQUEST_TAGS
from kafkaesque.raft import Role
from kafkaesque.raft.driver import MultiRaft
from kafkaesque.storage import Record, build_batch

PAUSED = 2


def _claim(term: int) -> Claim:
    return Claim(term, frozenset({0, 1, 2}), frozenset(), True)


def _append(group: str) -> AppendRequest:
    return AppendRequest(group, b"batch", 1, Acks.QUORUM, 5.0)


def _requests(wire: Wire) -> list[tuple[int, type]]:
    """Where each request sent went, and its type (read back as the peer would)."""
    out: list[tuple[int, type]] = []
    for peer, item in wire.sent:
        call = peer_from_wire(item)
        assert isinstance(call, PeerCall)
        out.append((peer, type(call.request)))
    return out


def _hears(peer: int) -> bool:
    return peer != PAUSED


class Wire:
    """The transport's ``send``: records what went where."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, list[Any]]] = []

    def send(self, peer: int, item: list[Any]) -> bool:
        self.sent.append((peer, item))
        return True


async def _ends_within(call: _Call, seconds: float) -> bool:
    with trio.move_on_after(seconds):
        await call.wait()
        return True
    return False


async def test_only_calls_to_a_silent_replaced_leader_are_ended() -> None:
    forwarder = Forwarder(Wire().send)
    leaders = {"t/0": 1, "t/1": PAUSED}  # t/0 has a new leader; t/1 none yet
    replaced = forwarder.start(PAUSED, _append("t/0"))
    waiting = forwarder.start(PAUSED, _append("t/1"))
    resend = forwarder.start(PAUSED, FindResendRequest("t/0", b"c", b"p", 7, 5.0))
    live = forwarder.start(0, _append("t/0"))  # its answer will come
    command = forwarder.start(PAUSED, GroupCommandRequest(Leave("0.x")))  # not a partition's

    assert forwarder.abandon_replaced(leaders.get, _hears) == 2
    assert replaced[1].ended and resend[1].ended
    assert not any(c.ended for _, c in (waiting, live, command))
    deadline = trio.current_time() + 30
    with pytest.raises(LeaderReplaced, match="outcome is unknown"):
        await forwarder.finish(*replaced, deadline)
    # Once its partition has a new leader, the second one ends too.
    leaders["t/1"] = 0
    assert forwarder.abandon_replaced(leaders.get, _hears) == 1
    assert await _ends_within(waiting[1], 1)
    # A late answer from the resumed broker is ignored; the live broker's answer is taken.
    forwarder.answered(waiting[0], Appended(5, 5))
    with pytest.raises(LeaderReplaced):
        await forwarder.finish(*waiting, deadline)
    forwarder.answered(live[0], Appended(3, 3))
    assert await forwarder.finish(*live, deadline) == Appended(3, 3)


async def test_a_calls_end_is_told_once_by_callback_unless_its_finish_took_it_over() -> None:
    forwarder = Forwarder(Wire().send)
    told: list[str] = []
    answered = forwarder.start(1, _append("t/0"))
    forwarder.on_done(answered[1], lambda: told.append("answered"))
    lost = forwarder.start(PAUSED, _append("t/0"))

    def start_another() -> None:  # a callback may start calls while the forwarder loops
        told.append("lost")
        forwarder.start(1, _append("t/0"))

    forwarder.on_done(lost[1], start_another)
    awaited = forwarder.start(1, _append("t/1"))
    forwarder.on_done(awaited[1], lambda: told.append("awaited"))

    forwarder.answered(answered[0], Appended(2, 2))
    forwarder.answered(answered[0], Appended(9, 9))  # a second answer changes nothing
    assert told == ["answered"] and answered[1].answer == Appended(2, 2)
    forwarder.peer_gone(PAUSED)
    forwarder.peer_gone(PAUSED)
    assert told == ["answered", "lost"] and lost[1].lost
    with pytest.raises(ForwardTimeout):  # its deadline passed: the awaiter took it over
        await forwarder.finish(*awaited, trio.current_time())
    forwarder.answered(awaited[0], Appended(3, 3))
    assert told == ["answered", "lost"]
    # Told at once when it has ended already; a told call's finish answers at once too.
    forwarder.on_done(answered[1], lambda: told.append("again"))
    assert told[-1] == "again"
    assert await forwarder.finish(*answered, trio.current_time() + 1) == Appended(2, 2)


class _ForwardingWrites:
    """A write path on broker 0, which hosts no replica of ``t/0``: its writes are forwarded
    to broker ``PAUSED``, the partition's leader at term 3. ``outcome`` collects each write's
    offsets or ``RequestError``."""

    def __init__(self, tmp_path: Path) -> None:
        self.wire = Wire()
        self.forwarder = Forwarder(self.wire.send)
        self.table = LeaderTable()
        self.table.report(PAUSED, {"t/0": _claim(3)})
        self.raft = MultiRaft(0, self.wire.send, state_dir=str(tmp_path))
        self.writes = WritePath(0, self.raft, self.table, self.forwarder, timeout=30.0)
        self.outcome: list[object] = []

    async def write(self, batch: bytes) -> None:
        try:
            self.outcome.append(await self.writes.write("t/0", batch, 1, Acks.QUORUM))
        except RequestError as exc:
            self.outcome.append(exc)


async def test_a_write_forwarded_to_a_replaced_leader_is_answered_timeout_not_resent(
    tmp_path: Path,
) -> None:
    f = _ForwardingWrites(tmp_path)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(f.write, build_batch([Record(value=b"x")]))
        await trio.testing.wait_all_tasks_blocked()
        assert _requests(f.wire) == [(PAUSED, AppendRequest)]
        f.table.report(1, {"t/0": _claim(4)})  # a new leader, and broker 2 stays silent
        started = trio.current_time()
        f.forwarder.abandon_replaced(f.writes.leader_of, _hears)
    assert trio.current_time() - started < 5  # not the 30 s deadline
    (error,) = f.outcome
    assert isinstance(error, RequestError) and error.code is ErrorCode.TIMEOUT
    assert error.code.retriable
    # The batch was not sent again to the new leader: it may already be in its log.
    assert _requests(f.wire) == [(PAUSED, AppendRequest)]
    f.raft.close()


@pytest.mark.parametrize("producer_id", [None, 77], ids=["no-producer-id", "producer-id"])
async def test_after_a_lost_connection_only_a_batch_with_a_producer_id_is_sent_again(
    tmp_path: Path, producer_id: int | None
) -> None:
    # Issue 23: the leader died after the batch reached it, and the new leader may hold it. A
    # batch with a producer id is sent again (the leader answers a duplicate with the first
    # copy's offsets); one without is answered TIMEOUT, never appended a second time.
    f = _ForwardingWrites(tmp_path)
    if producer_id is None:
        batch = build_batch([Record(value=b"x")])
    else:
        batch = build_batch([Record(value=b"x")], producer_id=producer_id, base_sequence=0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(f.write, batch)
        await trio.testing.wait_all_tasks_blocked()
        assert _requests(f.wire) == [(PAUSED, AppendRequest)]
        f.table.report(1, {"t/0": _claim(4)})
        f.forwarder.peer_gone(PAUSED)  # its connection closed before it answered
        with trio.move_on_after(2):  # the retry comes after a short back-off
            while producer_id is not None and len(f.wire.sent) < 2:
                await trio.sleep(0.01)
        if producer_id is not None:
            assert _requests(f.wire) == [(PAUSED, AppendRequest), (1, AppendRequest)]
            nursery.cancel_scope.cancel()
    if producer_id is None:
        (error,) = f.outcome
        assert isinstance(error, RequestError) and error.code is ErrorCode.TIMEOUT
        assert _requests(f.wire) == [(PAUSED, AppendRequest)]
    f.raft.close()


def _idle_broker(tmp_path: Path) -> Broker:
    """A broker that is built but not run: its peer-item handling can be driven by hand."""
    local = Address("127.0.0.1", 1)  # never bound: the broker does not run
    config = BrokerConfig(
        id=0,
        data_dir=str(tmp_path),
        client=local,
        peers={0: local, 1: local},
        controllers={0: local, 1: local},
    )
    return Broker(config)


async def test_a_malformed_peer_message_is_dropped_and_logged_and_the_rest_are_served(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    broker = _idle_broker(tmp_path)
    wire = Wire()
    sent = wire.sent
    broker.forwarder._send = wire.send  # what it sends to peers is recorded
    req, call = broker.forwarder.start(1, _append("t/0"))
    claims = LeaderClaims({"t/0": _claim(3)})
    items: list[Any] = [
        [REQUEST_TAGS[AppendRequest], 7, "t/0", "not bytes", 1, "quorum", 1.0],
        [REQUEST_TAGS[GroupCommandRequest], 8, [99, "g"]],  # a newer broker's group command
        [10, 1, "t/0", b"b", 1, "quorum", 5.0],  # the retired positional APPEND
        [peer_to_wire(PeerReply(req, Appended(1, 1)))[0], req, "garbage"],
        peer_to_wire(claims),
        peer_to_wire(PeerCall(9, BoundsRequest(("t/0",)))),
        peer_to_wire(PeerReply(req, Appended(4, 4))),
    ]
    with caplog.at_level(logging.WARNING, "kafkaesque.broker"):
        broker._on_items(1, items)
    try:
        dropped = [r for r in caplog.records if "dropped a malformed message" in r.message]
        assert len(dropped) == 2
        assert broker.leaders.leader("t/0") == 1  # the claims after them were taken
        # A call whose id could be read is refused at once, so its caller need not wait out its
        # deadline; the bounds request was answered (this broker leads nothing), the call's
        # answer taken.
        answered = [(p, peer_from_wire(i)) for p, i in sent[1:]]
        assert [(p, m.req, type(m.answer)) for p, m in answered if isinstance(m, PeerReply)] == [
            (1, 7, Refused),
            (1, 8, Refused),
            (1, 9, Bounds),
        ]
        refusal = answered[1][1]
        assert isinstance(refusal, PeerReply) and isinstance(refusal.answer, Refused)
        assert refusal.answer.code is ErrorCode.BAD_ARGS
        assert "unknown group command tag 99" in refusal.answer.message
        assert "older version" in refusal.answer.message
        assert await broker.forwarder.finish(req, call, trio.current_time() + 1) == Appended(4, 4)
    finally:
        broker.raft.close()


async def test_a_forwarded_group_command_reply_is_relayed_as_the_coordinator_encoded_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = _idle_broker(tmp_path)
    wire = Wire()
    sent = wire.sent
    broker.forwarder._send = wire.send  # what it sends to peers is recorded
    coordinator_reply = b"+OFFSET t 0 5\r\n+END\r\n"
    try:
        async with trio.open_nursery() as nursery:

            async def forward() -> None:
                got = await broker.relay.forward_to(1, FetchOffsets("g", "t"))
                assert got is coordinator_reply or got == coordinator_reply
                nursery.cancel_scope.cancel()

            nursery.start_soon(forward)
            await trio.testing.wait_all_tasks_blocked()
            ((peer, item),) = sent
            call = peer_from_wire(item)
            assert isinstance(call, PeerCall)
            assert peer == 1
            assert call.request == GroupCommandRequest(FetchOffsets("g", "t"))
            broker._on_items(
                1, [peer_to_wire(PeerReply(call.req, CommandReply(coordinator_reply)))]
            )
            await trio.sleep(5)
            raise AssertionError("the forwarded command was not answered")
    finally:
        broker.raft.close()


# -- a forwarded append over real Raft groups, with no task per request ---------------------------
# Issue 22: the leader spawned a task per forwarded append to await its commit, and the forwarding
# broker's appender one per batch to await the leader's answer. Both are now told by callback: the
# leader answers from the Raft step that sees the commit, the forwarder finishes the flight from
# the task that reads the answer. Brokers here are Raft drivers, write paths and forwarders whose
# items (Raft's and the peer messages) the test delivers by hand: no sockets.

GROUP = "readings/0"


class _Cluster:
    """``n`` brokers' Raft drivers, write paths and forwarders, wired through one queue that
    ``settle`` delivers. A broker in ``dead`` neither sends nor receives (its peers' transports
    say it is not connected); nor do two brokers whose pair is in ``cut`` (a partition)."""

    def __init__(self, root: Path, n: int, nursery: trio.Nursery, timeout: float = 30.0) -> None:
        self.queue: list[tuple[int, int, Any]] = []
        self.dead: set[int] = set()
        self.cut: set[frozenset[int]] = set()
        self.drop_replies_of: int | None = None  # answers this broker sends are lost
        self.nursery = nursery  # where the leaders' rare-path tasks run
        self.rafts = [
            MultiRaft(i, self._sender(i), state_dir=str(root / f"s{i}"), peers=range(n))
            for i in range(n)
        ]
        for raft in self.rafts:
            raft.add_replica(GROUP, str(root / f"b{raft.node_id}"), range(n))
        self.forwarders = [Forwarder(self._sender(i)) for i in range(n)]
        self.tables = [LeaderTable() for _ in range(n)]  # peers' claims, as each broker heard
        self.writes = [
            WritePath(i, self.rafts[i], self.tables[i], self.forwarders[i], timeout=timeout)
            for i in range(n)
        ]
        self.replies: list[tuple[int, int, Any]] = []  # (from, to, PeerReply) as sent

    def _sender(self, src: int) -> Any:
        def send(dst: int, item: Any) -> bool:
            if not self.linked(src, dst):
                return False
            self.queue.append((src, dst, item))
            return True

        return send

    def _deliver(self, src: int, dst: int, item: Any) -> None:
        if not is_peer_item(item):
            self.rafts[dst].handle_items(src, [item])
            return
        msg = peer_from_wire(item)
        if isinstance(msg, PeerReply):
            self.replies.append((src, dst, item))
            if src != self.drop_replies_of:
                self.forwarders[dst].answered(msg.req, msg.answer)
        elif isinstance(msg, PeerCall) and isinstance(msg.request, AppendRequest):
            self.writes[dst].serve_forwarded(src, msg.req, msg.request, self.nursery)
        else:
            raise AssertionError(f"unexpected peer message {msg!r}")

    def linked(self, src: int, dst: int) -> bool:
        """Whether ``src`` and ``dst`` can talk (both alive, their link not cut)."""
        return src not in self.dead and dst not in self.dead and {src, dst} not in self.cut

    def isolate(self, broker: int, *, but: tuple[int, ...] = ()) -> None:
        """Cut every link of ``broker`` except those to ``but``."""
        for other in range(len(self.rafts)):
            if other != broker and other not in but:
                self.cut.add(frozenset((broker, other)))

    async def round(self) -> bool:
        """Process every live broker once, then deliver what they sent; False if quiet."""
        for raft in self.rafts:
            if raft.node_id not in self.dead:
                await raft._process()
        if not self.queue and not any(raft._dirty for raft in self.rafts):
            return False
        queue, self.queue = self.queue, []
        for src, dst, item in queue:
            if self.linked(src, dst):
                self._deliver(src, dst, item)
        return True

    async def settle(self, ticks: int = 0) -> None:
        """Tick ``ticks`` times, then process and deliver until quiet."""
        for _ in range(ticks):
            for raft in self.rafts:
                if raft.node_id not in self.dead:
                    raft.tick()
        for _ in range(50):
            if not await self.round():
                return

    def leader(self) -> int:
        (leader,) = [
            r.node_id
            for r in self.rafts
            if r.node_id not in self.dead and r.replicas[GROUP].role is Role.LEADER
        ]
        return leader

    def values(self, broker: int) -> list[bytes | None]:
        return [r.value for r in self.rafts[broker].replicas[GROUP].committed_records()]

    def close(self) -> None:
        for raft in self.rafts:
            raft.close()


class _Spawns(trio.abc.Instrument):
    """The names of the tasks spawned while it is installed (their last dotted part)."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        self.names.append(task.name.rsplit(".", 1)[-1])


async def test_a_forwarded_append_is_answered_and_its_flight_finished_with_no_task(
    tmp_path: Path,
) -> None:
    async with trio.open_nursery() as nursery:
        cluster = _Cluster(tmp_path, 3, nursery)
        try:
            await cluster.settle()
            leader = cluster.leader()
            via = (leader + 1) % 3
            appender = PartitionAppender(GROUP, 0, Acks.QUORUM, cluster.writes[via])
            nursery.start_soon(appender.run, nursery)
            appender.add(Record(value=b"warm-up"))  # the leader starts its one deadline watcher
            await trio.testing.wait_all_tasks_blocked()
            await cluster.settle()
            await trio.testing.wait_all_tasks_blocked()
            cluster.replies.clear()
            spawns = _Spawns()
            trio.lowlevel.add_instrument(spawns)
            try:
                flight, index = appender.add(Record(value=b"reading"))
                await trio.testing.wait_all_tasks_blocked()
                assert not flight.done.is_set()
                await cluster.settle()  # forwarded, proposed, committed, answered
                assert flight.done.is_set()
                await trio.testing.wait_all_tasks_blocked()
            finally:
                trio.lowlevel.remove_instrument(spawns)
            assert spawns.names == []  # neither the leader nor the forwarder spawned a task
            assert flight.error is None and flight.base + index == 2  # the leader's no-op is 0
            assert cluster.values(leader) == [b"warm-up", b"reading"]
            # The answer is what the task used to send: the offsets, nothing else.
            ((src, dst, item),) = cluster.replies
            assert (src, dst) == (leader, via)
            reply = peer_from_wire(item)
            assert isinstance(reply, PeerReply)
            assert item == peer_to_wire(PeerReply(reply.req, Appended(2, 2)))
            nursery.cancel_scope.cancel()
        finally:
            cluster.close()


def _request(batch: bytes, seconds: float) -> AppendRequest:
    return AppendRequest(GROUP, batch, 1, Acks.QUORUM, seconds)


def _answers(cluster: _Cluster) -> list[Any]:
    return [peer_from_wire(item) for _, _, item in cluster.replies]


async def test_a_forwarded_append_not_committed_by_its_deadline_is_answered_unknown_by_a_task(
    tmp_path: Path,
) -> None:
    async with trio.open_nursery() as nursery:
        cluster = _Cluster(tmp_path, 3, nursery)
        try:
            await cluster.settle()
            leader = cluster.leader()
            writes = cluster.writes[leader]
            spawns = _Spawns()
            trio.lowlevel.add_instrument(spawns)
            try:
                writes.serve_forwarded(
                    1, 7, _request(build_batch([Record(value=b"a")]), 0.3), nursery
                )
                writes.serve_forwarded(
                    1, 8, _request(build_batch([Record(value=b"b")]), 0.2), nursery
                )
                cluster.dead |= {b for b in range(3) if b != leader}  # no quorum hears of them
                await cluster.settle()
                assert spawns.names == ["_watch_forwarded"]  # one watcher, no task per append
                with trio.fail_after(5):
                    while len(_answers(cluster)) < 2:
                        await cluster.settle()
                        await trio.sleep(0.01)
            finally:
                trio.lowlevel.remove_instrument(spawns)
            # Each answered at its own deadline, the earlier one first, by a task of its own.
            assert spawns.names == ["_watch_forwarded", "_answer_forwarded", "_answer_forwarded"]
            first, second = _answers(cluster)
            assert first == PeerReply(8, Unknown("offset 2 not committed in time"))
            assert second == PeerReply(7, Unknown("offset 1 not committed in time"))
            nursery.cancel_scope.cancel()
        finally:
            cluster.close()


async def test_a_forwarded_append_cut_before_it_commits_is_answered_retry_at_once(
    tmp_path: Path,
) -> None:
    async with trio.open_nursery() as nursery:
        cluster = _Cluster(tmp_path, 3, nursery)
        try:
            await cluster.settle()
            old = cluster.leader()
            term = cluster.rafts[old].replicas[GROUP].node.term
            cluster.writes[old].serve_forwarded(
                1, 7, _request(build_batch([Record(value=b"a")]), 30.0), nursery
            )
            cluster.dead.add(old)  # it never leaves the old leader
            await cluster.settle()
            for _ in range(100):
                await cluster.settle(ticks=1)
                if any(
                    r.replicas[GROUP].role is Role.LEADER for r in cluster.rafts if r.node_id != old
                ):
                    break
            new = cluster.leader()
            cluster.rafts[new].propose_nowait(GROUP, build_batch([Record(value=b"b")]), 1)
            await cluster.settle()
            assert cluster.replies == []
            spawns = _Spawns()
            trio.lowlevel.add_instrument(spawns)
            try:
                cluster.dead.clear()  # the new leader's appends reach the old one, which cuts
                for _ in range(10):
                    await cluster.settle(ticks=1)
            finally:
                trio.lowlevel.remove_instrument(spawns)
            assert "_answer_forwarded" not in spawns.names
            ((_, to, item),) = cluster.replies
            reply = peer_from_wire(item)
            assert to == 1 and isinstance(reply, PeerReply) and reply.req == 7
            assert isinstance(reply.answer, Retry)  # definitely not written: the peer retries
            assert f"offset 1 of term {term} was" in reply.answer.reason
            assert cluster.values(new) == [b"b"]
            nursery.cancel_scope.cancel()
        finally:
            cluster.close()


async def test_a_forward_whose_leader_dies_before_answering_is_retried_and_written_once(
    tmp_path: Path,
) -> None:
    # The leader commits the batch, then dies before its answer arrives: the forwarder's call
    # ends lost, the flight goes the task way, and the retry (same producer id and sequence)
    # is answered by the new leader with the first copy's offset instead of a second copy.
    async with trio.open_nursery() as nursery:
        cluster = _Cluster(tmp_path, 3, nursery)
        try:
            await cluster.settle()
            old = cluster.leader()
            via = (old + 1) % 3
            appender = PartitionAppender(GROUP, 0, Acks.QUORUM, cluster.writes[via])
            nursery.start_soon(appender.run, nursery)
            cluster.drop_replies_of = old
            flight, index = appender.add(Record(value=b"reading"))
            await trio.testing.wait_all_tasks_blocked()
            await cluster.settle()  # proposed, replicated, committed; the answer is lost
            assert len(cluster.replies) == 1 and not flight.done.is_set()
            assert cluster.values(old) == [b"reading"]
            spawns = _Spawns()
            trio.lowlevel.add_instrument(spawns)
            try:
                cluster.dead.add(old)
                cluster.forwarders[via].peer_gone(old)  # its connection closed: outcome unknown
                await trio.testing.wait_all_tasks_blocked()
                assert spawns.names == ["_complete"]  # the retries go the task way
                with trio.fail_after(10):
                    while not flight.done.is_set():
                        await cluster.settle(ticks=1)
                        await trio.sleep(0.005)  # the task's back-off
            finally:
                trio.lowlevel.remove_instrument(spawns)
            assert flight.error is None
            new = cluster.leader()
            assert new != old
            records = cluster.rafts[new].replicas[GROUP].committed_records()
            assert [r.value for r in records].count(b"reading") == 1
            assert [r.offset for r in records if r.value == b"reading"] == [flight.base + index]
            nursery.cancel_scope.cancel()
        finally:
            cluster.close()
