"""``FdStream``: the stream of the broker's TCP connections, on real loopback sockets."""

from __future__ import annotations

import socket
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from kafkaesque.fd_stream import FdListener, FdStream


@asynccontextmanager
async def _pair() -> AsyncIterator[tuple[FdStream, trio.SocketStream]]:
    """An ``FdStream`` (the server end, as the listener makes it) and a plain client stream."""
    [inner] = await trio.open_tcp_listeners(0, host="127.0.0.1")
    listener = FdListener(inner)
    port = inner.socket.getsockname()[1]
    client = await trio.open_tcp_stream("127.0.0.1", port)
    server = await listener.accept()
    try:
        yield server, client
    finally:
        await server.aclose()
        await client.aclose()
        await listener.aclose()


async def _receive_exactly(stream: trio.abc.ReceiveStream, size: int) -> bytes:
    got = bytearray()
    while len(got) < size:
        data = await stream.receive_some(65536)
        assert data, f"the stream ended after {len(got)} of {size} bytes"
        got += data
    return bytes(got)


async def test_bytes_go_both_ways_in_order() -> None:
    up = bytes(range(256)) * 8192  # 2 MiB: more than the socket buffers hold at once
    down = up[::-1]
    async with _pair() as (server, client):
        got: dict[str, bytes] = {}

        async def receive(name: str, stream: trio.abc.ReceiveStream, size: int) -> None:
            got[name] = await _receive_exactly(stream, size)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(receive, "server", server, len(up))
            nursery.start_soon(receive, "client", client, len(down))
            nursery.start_soon(client.send_all, up)
            nursery.start_soon(server.send_all, memoryview(down))
        assert got == {"server": up, "client": down}


async def test_a_send_that_does_not_fit_waits_for_room_and_lets_others_run() -> None:
    data = b"x" * (16 << 20)  # far more than loopback buffers: send_all must wait for the reader
    async with _pair() as (server, client):
        ticks = 0
        sent = trio.Event()

        async def tick() -> None:
            nonlocal ticks
            while not sent.is_set():
                ticks += 1
                await trio.sleep(0)

        async def send() -> None:
            await server.send_all(data)
            sent.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(tick)
            nursery.start_soon(send)
            await trio.sleep(0.05)
            assert not sent.is_set()  # nobody read yet: the send waits
            assert ticks > 1  # ... without holding the event loop
            assert await _receive_exactly(client, len(data)) == data
        assert sent.is_set()


async def test_an_empty_send_and_a_sized_receive() -> None:
    async with _pair() as (server, client):
        await server.send_all(b"")
        await server.send_all(bytearray(b"abc"))
        assert await client.receive_some(3) == b"abc"
        await client.send_all(b"hello")
        assert await server.receive_some(2) == b"he"
        assert await server.receive_some() == b"llo"
        with pytest.raises(ValueError):
            await server.receive_some(0)


async def test_the_peer_closing_ends_the_stream_with_empty_bytes() -> None:
    async with _pair() as (server, client):
        await client.send_all(b"last")
        await client.aclose()
        assert await _receive_exactly(server, 4) == b"last"
        assert await server.receive_some() == b""


async def test_closing_wakes_a_waiting_reader_and_every_later_call_fails_closed() -> None:
    async with _pair() as (server, _client):
        outcome: list[BaseException] = []

        async def read() -> None:
            try:
                await server.receive_some()
            except trio.ClosedResourceError as exc:
                outcome.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            await trio.testing.wait_all_tasks_blocked()
            await server.aclose()
        assert len(outcome) == 1
        with pytest.raises(trio.ClosedResourceError):
            await server.receive_some()
        with pytest.raises(trio.ClosedResourceError):
            await server.send_all(b"x")
        with pytest.raises(trio.ClosedResourceError):
            await server.wait_send_all_might_not_block()
        await server.aclose()  # closing twice is fine


async def test_a_reset_connection_is_a_broken_stream() -> None:
    async with _pair() as (server, client):
        # SO_LINGER with a zero timeout: close sends a RST, not a FIN.
        client.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await client.aclose()
        with pytest.raises(trio.BrokenResourceError):
            await server.receive_some()
        with pytest.raises(trio.BrokenResourceError):
            for _ in range(100):  # the first writes may still land in the socket buffer
                await server.send_all(b"x" * 65536)


async def test_send_now_writes_what_the_socket_takes_keeps_the_rest_and_never_waits() -> None:
    async with _pair() as (server, client):
        assert server.send_now([b"head ", memoryview(b"and tail")])
        assert await _receive_exactly(client, 13) == b"head and tail"
        # Nobody reads: the socket fills, a write is cut short, and the rest is kept in order.
        blocks = [bytes([65 + k]) * (1 << 20) for k in range(32)]
        written = [server.send_now([block]) for block in blocks]
        assert not written[-1] and server.kept
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server.send_kept)
            got = await _receive_exactly(client, 32 << 20)
        assert got == b"".join(blocks) and not server.kept


async def test_send_now_on_a_broken_or_closed_stream_raises_broken() -> None:
    async with _pair() as (server, client):
        client.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await client.aclose()  # a reset
        with pytest.raises(trio.BrokenResourceError):
            for _ in range(100):  # the reset reaches the socket after a write or two
                server.send_now([b"z" * 1000])
                await trio.sleep(0.01)
        await server.aclose()
        with pytest.raises(trio.BrokenResourceError):
            server.send_now([b"after close"])


async def test_a_closed_stream_never_touches_a_socket_that_reuses_its_descriptor() -> None:
    async with _pair() as (server, _client):
        number = server._fileno  # (the descriptor the stream caches)
        await server.aclose()
        # The kernel hands out the lowest free number: the next sockets get the old one back.
        a, b = socket.socketpair()
        try:
            assert number in (a.fileno(), b.fileno())
            a.send(b"to b")
            b.send(b"to a")
            with pytest.raises(trio.BrokenResourceError):
                server.send_now([b"stale"])
            with pytest.raises(trio.ClosedResourceError):
                await server.send_all(b"stale")
            with pytest.raises(trio.ClosedResourceError):
                await server.receive_some()
            with pytest.raises(trio.ClosedResourceError):
                await server.wait_send_all_might_not_block()
            # Nothing was written to, or read from, the new sockets.
            assert (a.recv(100), b.recv(100)) == (b"to a", b"to b")
        finally:
            a.close()
            b.close()
