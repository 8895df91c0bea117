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

from kafkaesque.broker._broker import Broker
from kafkaesque.broker._config import Address, BrokerConfig
from kafkaesque.broker._errors import RequestError
from kafkaesque.broker._forwarding import Forwarder, LeaderReplaced, _Call
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
    peer_from_wire,
    peer_to_wire,
)
from kafkaesque.protocol._peer import REQUEST_TAGS
from kafkaesque.raft._driver import MultiRaft
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
        await call.done.wait()
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
    assert replaced[1].done.is_set() and resend[1].done.is_set()
    assert not any(c.done.is_set() for _, c in (waiting, live, command))
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
        assert len(dropped) == 3
        assert broker.leaders.leader("t/0") == 1  # the claims after them were taken
        # The bounds request was answered (this broker leads nothing), the call's answer taken.
        assert [(p, peer_from_wire(i)) for p, i in sent[1:]] == [(1, PeerReply(9, Bounds((None,))))]
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
                got = await broker.forward_to(1, FetchOffsets("g", "t"))
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
