"""``SslFdStream``: TLS through the ssl module's own socket, on real loopback sockets, against
trio's ``SSLStream`` on the other end (an independent implementation of the same protocol)."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing
import trustme

from kafkaesque.fd_stream import SslFdStream

_CA = trustme.CA()
_SERVER = _CA.issue_cert("127.0.0.1")


def _server_context() -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    _SERVER.configure_cert(context)
    return context


def _client_context(ca: trustme.CA = _CA) -> ssl.SSLContext:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return context


@asynccontextmanager
async def _pair() -> AsyncIterator[tuple[SslFdStream, trio.SSLStream[trio.SocketStream]]]:
    """The broker's end (``SslFdStream``, server side) and a client's ``trio.SSLStream``."""
    [listener] = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listener.socket.getsockname()[1]
    client = trio.SSLStream(
        await trio.open_tcp_stream("127.0.0.1", port),
        _client_context(),
        server_hostname="127.0.0.1",
    )
    accepted = await listener.accept()
    servers: list[SslFdStream] = []
    async with trio.open_nursery() as nursery:

        async def serve() -> None:
            servers.append(await SslFdStream.open(accepted, _server_context(), server_side=True))

        nursery.start_soon(serve)
        await client.do_handshake()
    [server] = servers
    try:
        yield server, client
    finally:
        await server.aclose()
        await trio.aclose_forcefully(client)
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


async def test_send_now_keeps_what_tls_could_not_write_and_send_kept_finishes_in_order() -> None:
    async with _pair() as (server, client):
        assert server.send_now([b"head ", memoryview(b"and tail")])
        assert await _receive_exactly(client, 13) == b"head and tail"
        # Nobody reads: the socket fills, a write is cut short (OpenSSL wants to write), and it
        # and everything after it is kept, in order, for send_kept.
        blocks = [bytes([65 + k]) * (1 << 20) for k in range(32)]
        written = [server.send_now([block]) for block in blocks]
        assert not written[-1] and server.kept
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server.send_kept)
            got = await _receive_exactly(client, 32 << 20)
        assert got == b"".join(blocks) and not server.kept


async def test_closing_sends_close_notify_so_the_peer_sees_a_clean_end() -> None:
    async with _pair() as (server, client):
        await server.send_all(b"last")
        await server.aclose()
        assert await _receive_exactly(client, 4) == b"last"
        # trio's SSLStream raises BrokenResourceError on an end without close_notify.
        assert await client.receive_some() == b""


async def test_the_peer_closing_ends_the_stream_with_empty_bytes() -> None:
    async with _pair() as (server, client):
        await client.send_all(b"bye")
        await client.aclose()
        assert await _receive_exactly(server, 3) == b"bye"
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
        with pytest.raises(trio.BrokenResourceError):
            server.send_now([b"x"])
        await server.aclose()  # closing twice is fine


async def test_a_client_that_does_not_trust_the_certificate_fails_the_handshake() -> None:
    [listener] = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listener.socket.getsockname()[1]
    client = trio.SSLStream(
        await trio.open_tcp_stream("127.0.0.1", port),
        _client_context(trustme.CA()),  # another CA
        server_hostname="127.0.0.1",
    )
    accepted = await listener.accept()
    failures: list[BaseException] = []

    async def serve() -> None:
        try:
            await SslFdStream.open(accepted, _server_context(), server_side=True)
        except trio.BrokenResourceError as exc:
            failures.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        with pytest.raises(trio.BrokenResourceError):
            await client.do_handshake()
        await trio.aclose_forcefully(client)
    assert len(failures) == 1 and isinstance(failures[0].__cause__, ssl.SSLError | OSError)
    assert accepted.socket.fileno() == -1  # taken over, and closed by the failed open
    await listener.aclose()
