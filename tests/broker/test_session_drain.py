"""A line-protocol session while its broker drains (``Draining``), in process: no broker.

The session over a socket pair; the test plays the broker's dispatch (holding or answering each
command's reply) and the client (a plain non-blocking socket). Process tests of the same, with a
SIGTERMed broker: ``test_drain_connections``.
"""

from __future__ import annotations

import socket

import trio
import trio.testing

from kafkaesque.broker._session import (
    SHUTTING_DOWN,
    ReadySlot,
    Session,
    Slot,
    TaskSlot,
    serve_session,
)
from kafkaesque.broker._shutdown import Draining
from kafkaesque.fd_stream import FdStream
from kafkaesque.protocol import Command, DataReply, Fetch, LineLimits, OkReply, encode_reply


class _Broker:
    """The dispatch of the tests' sessions: a long poll (FETCH with ``wait_ms``) waits until
    cancelled, a FETCH without answers at once, anything else waits for the test (``held``)."""

    def __init__(self) -> None:
        self.commands: list[Command] = []
        self.held: list[TaskSlot] = []
        self.polls_cancelled = 0

    def dispatch(self, command: Command, nursery: trio.Nursery, session: Session) -> Slot:
        self.commands.append(command)
        if isinstance(command, Fetch) and command.wait_ms:
            slot = TaskSlot()
            nursery.start_soon(self._poll, slot)
            return slot
        if isinstance(command, Fetch):
            return ReadySlot(encode_reply(DataReply(command.offset, b"", command.offset)))
        slot = TaskSlot()
        self.held.append(slot)
        return slot

    async def _poll(self, slot: TaskSlot) -> None:
        try:
            await trio.sleep_forever()
        finally:
            self.polls_cancelled += 1


async def _session(
    nursery: trio.Nursery, broker: _Broker, draining: Draining, *, send_buffer: int = 0
) -> socket.socket:
    """A session served over a socket pair; its client end. ``send_buffer``: the session's
    socket send buffer asked for (the kernel caps and doubles it), else the default."""
    server_end, client = socket.socketpair()
    if send_buffer:
        server_end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
    client.setblocking(False)
    stream = FdStream(trio.SocketStream(trio.socket.from_stdlib_socket(server_end)))
    nursery.start_soon(
        serve_session,
        stream,
        broker.dispatch,
        LineLimits(),
        64,
        lambda session: None,
        lambda event: None,
        draining,
    )
    await trio.testing.wait_all_tasks_blocked()
    return client


async def _read_to_end(client: socket.socket) -> bytes:
    """Everything the session sends until the end of its stream (bounded by the caller)."""
    got = b""
    while True:
        await trio.lowlevel.wait_readable(client)
        data = client.recv(1 << 16)
        if not data:
            return got
        got += data


async def test_an_idle_session_closes_as_soon_as_the_drain_begins() -> None:
    broker, draining = _Broker(), Draining()
    async with trio.open_nursery() as nursery:
        client = await _session(nursery, broker, draining)
        assert draining.open == 1
        draining.begin()
        with trio.fail_after(5):
            assert await _read_to_end(client) == b""
        client.close()  # the session, lingering for the client's end, closes now
        with trio.fail_after(5):
            await draining.wait_closed()
    assert broker.commands == []


async def test_a_write_taken_before_the_drain_is_answered_then_the_session_closes() -> None:
    broker, draining = _Broker(), Draining()
    async with trio.open_nursery() as nursery:
        client = await _session(nursery, broker, draining)
        client.sendall(b"PUBS t one\r\n")
        await trio.testing.wait_all_tasks_blocked()
        draining.begin()
        await trio.testing.wait_all_tasks_blocked()
        assert draining.open == 1  # it owes a reply: it waits for it
        broker.held[0].set(encode_reply(OkReply("0 0")))
        with trio.fail_after(5):
            assert await _read_to_end(client) == b"+OK 0 0\r\n"
        client.close()
        with trio.fail_after(5):
            await draining.wait_closed()


async def test_a_long_poll_answers_at_once_and_a_later_line_is_refused() -> None:
    broker, draining = _Broker(), Draining()
    async with trio.open_nursery() as nursery:
        client = await _session(nursery, broker, draining)
        # The PUBS waits behind the poll (a command that is not a publish), unread by the drain.
        client.sendall(b"FETCH t 0 5 wait_ms=60000\r\nPUBS t late\r\n")
        await trio.testing.wait_all_tasks_blocked()
        assert len(broker.commands) == 1
        draining.begin()
        with trio.fail_after(5):
            got = await _read_to_end(client)
        client.close()
        with trio.fail_after(5):
            await draining.wait_closed()
    assert broker.polls_cancelled == 1
    # The poll was read again without waiting; the PUBS was never dispatched.
    assert [type(c) for c in broker.commands] == [Fetch, Fetch]
    again = broker.commands[1]
    assert isinstance(again, Fetch) and again.wait_ms is None and again.offset == 5
    assert got == encode_reply(DataReply(5, b"", 5)) + SHUTTING_DOWN
    assert SHUTTING_DOWN.startswith(b"-ERR NOT_READY ")


async def test_a_session_opened_after_the_drain_began_closes_at_once() -> None:
    broker, draining = _Broker(), Draining()
    draining.begin()
    async with trio.open_nursery() as nursery:
        client = await _session(nursery, broker, draining)
        with trio.fail_after(5):
            assert await _read_to_end(client) == b""
        client.close()


async def test_more_refusals_than_one_write_takes_all_leave_and_the_session_closes() -> None:
    """A read's worth of lines after the drain began: their NOT_READY replies, all ready at
    once, are more than one write takes (``_SEND_COALESCE_BYTES``, 256 KiB). The rest leaves
    too. (It stayed in the queue, with the reader held at ``max_inflight``, until the broker's
    shutdown deadline cut the connection: seen under load as ECONNRESET in the pipelined-writes
    drain test.) The session's send buffer takes a whole write at once, as TCP's does."""
    broker, draining = _Broker(), Draining()
    lines = 3000
    assert lines * len(SHUTTING_DOWN) > 256 * 1024
    async with trio.open_nursery() as nursery:
        client = await _session(nursery, broker, draining, send_buffer=1 << 20)
        draining.begin()
        client.sendall(b"PUBS t late\r\n" * lines)  # 42 kB: taken in one read
        with trio.fail_after(5):
            got = await _read_to_end(client)
        client.close()
        with trio.fail_after(5):
            await draining.wait_closed()
    assert got == SHUTTING_DOWN * lines
    assert broker.commands == []
