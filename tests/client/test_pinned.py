"""Pinned clients (every call to one broker) and the operator's admin calls (``ADDBROKER``,
``REMOVEBROKER``, ``REASSIGN``): routes, wire lines, results and errors, against a scripted
broker; then a pinned ``AsyncClient`` against a real socket that names other brokers."""

from __future__ import annotations

import socket
from functools import partial
from typing import Any

import pytest
import trio

from kafkaesque.client import (
    AsyncClient,
    Client,
    ClientConfig,
    ClusterMetadata,
    KafkaesqueConnectionError,
    KafkaesqueError,
    ListResponse,
    PinnedState,
    RetryPolicy,
    SyncConnection,
    TopicPartition,
)
from kafkaesque.client import _calls as calls
from kafkaesque.client import _steps as steps
from kafkaesque.protocol import (
    AddBroker,
    BrokerRow,
    EndReply,
    ErrorCode,
    ErrorReply,
    Metadata,
    OkReply,
    PartitionRow,
    Ping,
    Reassign,
    RemoteProtocolError,
    RemoveBroker,
    encode_command,
)

from .test_steps import CONFIG, drive


def _metadata(leader: int) -> ListResponse:
    rows = (BrokerRow(0, "h0", 1), BrokerRow(1, "h1", 2), PartitionRow("t", 0, leader, (0, 1)))
    return ListResponse(rows, EndReply())


def test_a_pinned_state_sends_every_request_to_its_broker_even_after_a_refresh() -> None:
    state = PinnedState([("pinned", 9)])
    state.update_metadata(ClusterMetadata.from_response(_metadata(0)))
    replies = iter([ErrorReply(ErrorCode.NOT_LEADER, "moved"), _metadata(1), OkReply("PONG")])
    call = calls.Call(Ping(), calls._pong, TopicPartition("t", 0))
    result, seen = drive(steps.run_call(state, CONFIG, call), lambda request: next(replies))
    assert result == "PONG"
    requests = [s for s in seen if isinstance(s, steps.Request)]
    assert [type(r.command) for r in requests] == [Ping, Metadata, Ping]
    assert {r.address for r in requests} == {("pinned", 9)}, "rerouted to another broker"
    assert state.candidates() == [("pinned", 9)]
    assert state.address_for(calls.Pinned(("elsewhere", 1))) == ("pinned", 9)
    assert state.metadata.leader("t", 0) == BrokerRow(1, "h1", 2), "what it said is kept"


def test_pinned_clients_take_exactly_one_address() -> None:
    for client in (Client.pinned("10.0.0.3:7000"), Client.pinned(("10.0.0.3", 7000))):
        assert isinstance(client.state, PinnedState)
        assert client.state.candidates() == [("10.0.0.3", 7000)]
    config = ClientConfig(request_timeout_ms=500)
    asynchronous = AsyncClient.pinned("[::1]:7000", config=config)
    assert isinstance(asynchronous.state, PinnedState) and asynchronous.config is config
    assert asynchronous.state.candidates() == [("::1", 7000)]
    with pytest.raises(ValueError, match="one address"):
        Client.pinned("a:1,b:2")


def _line(command: Any) -> bytes:
    return encode_command(command)


def test_the_operator_calls_speak_the_documented_lines() -> None:
    add = calls.add_broker(3, "10.0.0.4:9001", "10.0.0.4:9002")
    assert _line(add.command) == b"ADDBROKER 3 10.0.0.4:9001 10.0.0.4:9002\r\n"
    assert add.parse(OkReply("added")) is None
    assert not add.idempotent, "a retry could meet the member the first attempt admitted"
    remove = calls.remove_broker(2, 300.0)
    assert _line(remove.command) == b"REMOVEBROKER 2\r\n" and remove.idempotent
    assert remove.extra_timeout_s == 300.0, "the answer comes once the moves are done"
    assert remove.parse(OkReply("moved=3")) == 3
    reassign = calls.reassign("t", 1, (0, 2), 30.0)
    assert reassign.command == Reassign("t", 1, (0, 2)) and reassign.idempotent
    assert _line(reassign.command) == b"REASSIGN t 1 0,2\r\n"
    assert isinstance(add.command, AddBroker) and isinstance(remove.command, RemoveBroker)
    elect = calls.elect_leaders("t", 1, ("10.0.0.4", 9092))
    assert _line(elect.command) == b"ELECTLEADERS t 1\r\n" and elect.idempotent
    assert elect.route == calls.Pinned(("10.0.0.4", 9092)), "each broker moves what it leads"
    assert elect.parse(OkReply("moved=2 skipped=1")) == 2
    assert _line(calls.elect_leaders(None, None, ("h", 1)).command) == b"ELECTLEADERS\r\n"
    with pytest.raises(RemoteProtocolError, match="ELECTLEADERS answered"):
        elect.parse(OkReply("what"))


def test_remove_broker_errors_keep_their_code_and_a_garbled_answer_is_a_violation() -> None:
    state = PinnedState([("pinned", 9)])
    once = ClientConfig(retry=RetryPolicy(max_attempts=1))
    busy = ErrorReply(ErrorCode.BUSY, "it leads the controller quorum")
    with pytest.raises(KafkaesqueError) as refused:
        drive(steps.run_call(state, once, calls.remove_broker(1, 0.0)), lambda r: busy)
    assert refused.value.code is ErrorCode.BUSY
    assert refused.value.message == "it leads the controller quorum"
    garbled = OkReply("what")
    with pytest.raises(KafkaesqueConnectionError, match="'\\+OK what'") as broken:
        drive(steps.run_call(state, once, calls.remove_broker(1, 0.0)), lambda r: garbled)
    assert not broken.value.retriable


async def _serve_one_broker(stream: trio.SocketStream, seen: list[bytes]) -> None:
    """A broker that lists brokers elsewhere (a closed port) and answers PING and ADDBROKER."""
    buffer = b""
    while data := await stream.receive_some(4096):
        buffer += data
        while b"\r\n" in buffer:
            line, buffer = buffer.split(b"\r\n", 1)
            seen.append(line)
            if line == b"METADATA":
                await stream.send_all(b"+BROKER 0 127.0.0.1 1\r\n+BROKER 1 127.0.0.1 2\r\n+END\r\n")
            elif line.startswith(b"ADDBROKER"):
                await stream.send_all(b"-ERR NOT_READY the broker is starting; retry\r\n")
            else:
                await stream.send_all(b"+OK PONG\r\n")


async def test_a_pinned_async_client_asks_its_broker_only() -> None:
    seen: list[bytes] = []
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            partial(trio.serve_tcp, lambda s: _serve_one_broker(s, seen), 0, host="127.0.0.1")
        )
        port = listeners[0].socket.getsockname()[1]
        config = ClientConfig(retry=RetryPolicy(max_attempts=2, backoff_ms=1, backoff_max_ms=1))
        async with AsyncClient.pinned(("127.0.0.1", port), config=config) as client:
            assert sorted((await client.refresh_metadata()).brokers) == [0, 1]
            assert await client.ping() == "PONG"
            with pytest.raises(KafkaesqueError) as not_ready:  # "not ready", not "port closed"
                await client.add_broker(2, "127.0.0.1:3", "127.0.0.1:4")
            assert not_ready.value.code is ErrorCode.NOT_READY
        nursery.cancel_scope.cancel()
    # The retry after NOT_READY re-read METADATA from the same broker and sent ADDBROKER there
    # again (NOT_READY means it was not applied), never to port 1 or 2.
    add = b"ADDBROKER 2 127.0.0.1:3 127.0.0.1:4"
    assert seen == [b"METADATA", b"PING", add, b"METADATA", add]


def test_a_detached_connection_hands_its_socket_over_and_is_closed_for_the_client() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        connection = SyncConnection(server.getsockname()[:2], connect_timeout_s=5)
        peer, _ = server.accept()
        with peer:
            sock = connection.detach()
            with sock:
                sock.sendall(b"PING\r\n")
                assert peer.recv(100) == b"PING\r\n"
            assert connection.closed
            with pytest.raises(KafkaesqueConnectionError, match="detached"):
                connection.send(Ping())
            with pytest.raises(RuntimeError, match="cannot detach"):
                connection.detach()
