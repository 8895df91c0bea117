"""The per-link TCP proxy: forwards both ways, and cuts, stalls, delays and resets on demand.

Real sockets on loopback: an echo server behind one ``Link``; the test is the dialling side.
"""

from __future__ import annotations

import trio
from kafkaesque.jepsen_like._proxy import ProxyLayer


async def _echo(stream: trio.SocketStream) -> None:
    async with stream:
        try:
            async for data in stream:
                await stream.send_all(data)
        except trio.BrokenResourceError:
            pass


async def _start(nursery: trio.Nursery) -> tuple[ProxyLayer, int]:
    listeners = await nursery.start(trio.serve_tcp, _echo, 0)
    target = ("127.0.0.1", listeners[0].socket.getsockname()[1])
    proxies = ProxyLayer("127.0.0.1", seed=1)
    port = await proxies.add_link(nursery, 0, 1, target)
    return proxies, port


async def _roundtrip(port: int, data: bytes = b"ping") -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(data)
        got = b""
        while len(got) < len(data):
            chunk = await stream.receive_some()
            if not chunk:
                break
            got += chunk
        return got


async def test_a_link_forwards_both_directions() -> None:
    async with trio.open_nursery() as nursery:
        _, port = await _start(nursery)
        with trio.fail_after(10):
            assert await _roundtrip(port) == b"ping"
        nursery.cancel_scope.cancel()


async def test_a_two_way_cut_closes_connections_until_healed() -> None:
    async with trio.open_nursery() as nursery:
        proxies, port = await _start(nursery)
        with trio.fail_after(10):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(b"a")
            assert await stream.receive_some() == b"a"
            proxies.cut(0, 1)
            proxies.cut(1, 0)
            assert await stream.receive_some() == b""  # the live connection is closed
            await stream.aclose()
            assert await _roundtrip(port) == b""  # and new ones are closed at once
            proxies.heal()
            assert await _roundtrip(port) == b"ping"
        nursery.cancel_scope.cancel()


async def test_a_one_way_cut_holds_bytes_and_delivers_them_after_healing() -> None:
    async with trio.open_nursery() as nursery:
        proxies, port = await _start(nursery)
        with trio.fail_after(10):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            proxies.cut(0, 1)
            await stream.send_all(b"held")
            with trio.move_on_after(0.5) as waited:
                await stream.receive_some()
            assert waited.cancelled_caught  # nothing reached the server, so nothing came back
            proxies.heal()
            assert await stream.receive_some() == b"held"
            await stream.aclose()
        nursery.cancel_scope.cancel()


async def test_latency_delays_every_chunk() -> None:
    async with trio.open_nursery() as nursery:
        proxies, port = await _start(nursery)
        proxies.set_delay(0.2)
        with trio.fail_after(10):
            start = trio.current_time()
            assert await _roundtrip(port) == b"ping"
            assert trio.current_time() - start >= 0.4  # 0.2 s each way
        nursery.cancel_scope.cancel()


async def test_loss_resets_connections() -> None:
    async with trio.open_nursery() as nursery:
        proxies, port = await _start(nursery)
        proxies.set_loss(1.0)
        with trio.fail_after(10):
            assert await _roundtrip(port) == b""
        nursery.cancel_scope.cancel()
