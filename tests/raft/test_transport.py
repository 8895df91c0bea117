"""The peer transport over real loopback TCP: one connection per pair, authenticated, resilient."""

from __future__ import annotations

import logging
import socket
import struct
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from kafkaesque.local_cluster import free_ports
from kafkaesque.raft.driver import PeerTransport
from kafkaesque.raft.driver._wire import (
    FrameDecoder,
    Hello,
    check_challenge,
    encode_frame,
    hello_frame,
    new_nonce,
    proof_frame,
)

SECRET = b"cluster-secret"


class Node:
    def __init__(self, node_id: int, peers: dict[int, tuple[str, int]], secret: bytes = SECRET):
        self.received: dict[int, list[Any]] = defaultdict(list)
        self.transport = PeerTransport(
            node_id, peers, cluster="test", secret=secret, on_items=self._on_items
        )

    def _on_items(self, peer: int, items: list[Any]) -> None:
        self.received[peer].extend(items)


async def _until(predicate: Any, timeout: float = 5.0) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.01)


@asynccontextmanager
async def _connected(n: int) -> AsyncIterator[tuple[list[Node], list[int]]]:
    """``n`` nodes on loopback ports, each connected to every other; stopped on exit."""
    ports = free_ports(n)
    peers = {i: ("127.0.0.1", ports[i]) for i in range(n)}
    nodes = [Node(i, peers) for i in range(n)]
    async with trio.open_nursery() as nursery:
        for i, node in enumerate(nodes):
            await nursery.start(node.transport.run, "127.0.0.1", ports[i])
        await _until(lambda: all(len(x.transport.connected_peers()) == n - 1 for x in nodes))
        yield nodes, ports
        nursery.cancel_scope.cancel()


async def test_three_nodes_exchange_messages_over_one_connection_per_pair() -> None:
    async with _connected(3) as (nodes, _):
        for i, node in enumerate(nodes):
            for j in range(3):
                if i != j:
                    for k in range(100):
                        assert node.transport.send(j, [i, j, k])
        await _until(
            lambda: all(
                len(n.received[p]) == 100 for i, n in enumerate(nodes) for p in range(3) if p != i
            )
        )
        for j, node in enumerate(nodes):
            for i in range(3):
                if i != j:
                    assert node.received[i] == [[i, j, k] for k in range(100)]  # in order
            # 200 items sent in one burst travel in few frames (coalescing), not 200.
            assert node.transport.frames_sent < 20


async def test_a_stranger_without_the_secret_is_refused_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ports = free_ports(3)
    peers = {0: ("127.0.0.1", ports[0]), 1: ("127.0.0.1", ports[1])}
    good = [Node(0, peers), Node(1, peers)]
    intruder = Node(2, {1: ("127.0.0.1", ports[1]), 2: ("127.0.0.1", ports[2])}, b"guess")
    caplog.set_level(logging.WARNING, logger="kafkaesque.raft.transport")
    async with trio.open_nursery() as nursery:
        await nursery.start(good[0].transport.run, "127.0.0.1", ports[0])
        await nursery.start(good[1].transport.run, "127.0.0.1", ports[1])
        await _until(lambda: good[0].transport.connected_peers() == {1})
        # A raw stranger claiming to be node 0, without the secret.
        stream = await trio.open_tcp_stream("127.0.0.1", ports[1])
        await stream.send_all(hello_frame(Hello("test", 0, 1, new_nonce())))
        await stream.send_all(encode_frame({"t": "proof", "mac": b"x" * 32}))
        with trio.fail_after(5):
            while await stream.receive_some(1024):
                pass  # the acceptor closes the connection
        await stream.aclose()
        # The real node 0 is still connected and served.
        assert good[1].transport.connected_peers() == {0}
        assert good[0].transport.send(1, "still here")
        await _until(lambda: good[1].received[0] == ["still here"])
        assert good[1].transport.rejected >= 1
        assert "closed a connection" in caplog.text
        del intruder
        nursery.cancel_scope.cancel()


async def test_garbage_after_the_handshake_closes_only_that_connection() -> None:
    async with _connected(2) as (nodes, ports):
        # Someone who knows the secret, posing as node 0, then sends a corrupt frame.
        stream = await trio.open_tcp_stream("127.0.0.1", ports[1])
        hello = Hello("test", 0, 1, new_nonce())
        await stream.send_all(hello_frame(hello))
        decoder = FrameDecoder()
        frames: list[Any] = []
        while not frames:
            frames = decoder.feed(await stream.receive_some(4096))
        nonce = check_challenge(frames[0], SECRET, hello)
        await stream.send_all(proof_frame(SECRET, hello, nonce))
        await stream.send_all(struct.pack(">II", 5, 0) + b"hello")  # CRC 0: corrupt
        with trio.fail_after(5):
            while await stream.receive_some(1024):
                pass  # node 1 closes it
        await stream.aclose()
        assert nodes[1].transport.rejected == 1
        # The real node 0 (whose connection the impostor displaced) redials and is served.
        await _until(lambda: nodes[1].transport.connected_peers() == {0})
        await _until(lambda: nodes[0].transport.send(1, "again"))
        await _until(lambda: "again" in nodes[1].received[0])


async def test_a_restarted_peer_is_reconnected() -> None:
    ports = free_ports(2)
    peers = {i: ("127.0.0.1", ports[i]) for i in range(2)}
    first = Node(0, peers)
    async with trio.open_nursery() as nursery:
        await nursery.start(first.transport.run, "127.0.0.1", ports[0])
        for attempt in range(2):
            second = Node(1, peers)  # a fresh process each time
            async with trio.open_nursery() as inner:
                await inner.start(second.transport.run, "127.0.0.1", ports[1])
                await _until(lambda s=second: s.transport.connected_peers() == {0})
                await _until(lambda a=attempt: first.transport.send(1, a))
                await _until(lambda s=second, a=attempt: s.received[0] == [a])
                inner.cancel_scope.cancel()
            await _until(lambda: not first.transport.connected_peers())
        nursery.cancel_scope.cancel()


async def test_items_sent_right_behind_the_handshake_are_delivered() -> None:
    """Regression: a dialer's first items can share a TCP read with its proof; they must be
    delivered, not taken for a handshake violation (found by bench.raft at 1,000 groups)."""
    ports = free_ports(2)
    peers = {1: ("127.0.0.1", ports[1])}
    node = Node(1, {0: ("127.0.0.1", ports[0]), **peers})
    async with trio.open_nursery() as nursery:
        await nursery.start(node.transport.run, "127.0.0.1", ports[1])
        stream = await trio.open_tcp_stream("127.0.0.1", ports[1])
        hello = Hello("test", 0, 1, new_nonce())
        await stream.send_all(hello_frame(hello))
        decoder = FrameDecoder()
        frames: list[Any] = []
        while not frames:
            frames = decoder.feed(await stream.receive_some(4096))
        nonce = check_challenge(frames[0], SECRET, hello)
        await stream.send_all(proof_frame(SECRET, hello, nonce) + encode_frame(["first", "items"]))
        await _until(lambda: node.received[0] == ["first", "items"])
        assert node.transport.rejected == 0
        await stream.aclose()
        nursery.cancel_scope.cancel()


async def test_posted_items_wait_for_flush_which_writes_them_from_the_caller() -> None:
    async with _connected(2) as (nodes, _):
        sender = nodes[0].transport
        for k in range(3):
            assert sender.post(1, ["posted", k])
        await trio.sleep(0.2)
        assert nodes[1].received[0] == []  # posting alone sends nothing
        frames = sender.frames_sent
        sender.flush()
        assert sender.frames_sent == frames + 1  # written by flush itself, as one frame
        assert sender.send(1, ["sent", 3])
        await _until(lambda: len(nodes[1].received[0]) == 4)
        assert nodes[1].received[0] == [["posted", 0], ["posted", 1], ["posted", 2], ["sent", 3]]


async def test_send_now_writes_from_the_caller_with_what_was_posted() -> None:
    # Issue 36: a forwarded append and its answer are sent with ``send_now``: ``send`` would
    # wake the writer task, a pass of the scheduler on each hop of the write.
    async with _connected(2) as (nodes, _):
        sender = nodes[0].transport
        assert sender.post(1, ["posted", 0])
        frames = sender.frames_sent
        assert sender.send_now(1, ["now", 1])
        assert sender.frames_sent == frames + 1  # written here, with no await, as one frame
        assert sender.send(1, ["sent", 2])
        assert sender.frames_sent == frames + 1  # ``send`` leaves it to the writer task
        await _until(lambda: len(nodes[1].received[0]) == 3)
        assert nodes[1].received[0] == [["posted", 0], ["now", 1], ["sent", 2]]
        assert not sender.send_now(7, ["to nobody"])  # not a peer: dropped, not queued


@asynccontextmanager
async def _node_and_raw_peer() -> AsyncIterator[tuple[Node, trio.SocketStream, FrameDecoder]]:
    """Node 1 running, and a raw connection it takes for its peer 0 (handshake done)."""
    ports = free_ports(2)
    node = Node(1, {i: ("127.0.0.1", ports[i]) for i in range(2)})
    async with trio.open_nursery() as nursery:
        await nursery.start(node.transport.run, "127.0.0.1", ports[1])
        stream = await trio.open_tcp_stream("127.0.0.1", ports[1])
        hello = Hello("test", 0, 1, new_nonce())
        await stream.send_all(hello_frame(hello))
        decoder = FrameDecoder(64 << 20)
        frames: list[Any] = []
        while not frames:
            frames = decoder.feed(await stream.receive_some(4096))
        nonce = check_challenge(frames[0], SECRET, hello)
        await stream.send_all(proof_frame(SECRET, hello, nonce))
        await _until(lambda: node.transport.connected_peers() == {0})
        yield node, stream, decoder
        await stream.aclose()
        nursery.cancel_scope.cancel()


async def test_what_a_full_socket_leaves_of_a_flush_is_sent_by_the_writer_in_order() -> None:
    async with _node_and_raw_peer() as (node, stream, decoder):
        blob = b"x" * 100_000
        # 12 MB posted while the peer reads nothing: far more than the socket buffers take.
        for k in range(60):
            assert node.transport.post(0, [k, blob])
        node.transport.flush()
        for k in range(60, 120):  # queued behind the rest, by both paths
            if k % 2:
                assert node.transport.send(0, [k, blob])
            else:
                assert node.transport.post(0, [k, blob])
                node.transport.flush()
        items: list[Any] = []
        with trio.fail_after(20):
            while len(items) < 120:
                for frame in decoder.feed(await stream.receive_some(1 << 20)):
                    items.extend(frame)
        assert [item[0] for item in items] == list(range(120))
        assert all(item[1] == blob for item in items)


async def test_a_flush_into_a_closed_connection_closes_it_and_raises_nothing() -> None:
    async with _node_and_raw_peer() as (node, stream, _):
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await stream.aclose()  # a reset, not a polite close
        with trio.fail_after(5):
            while node.transport.connected_peers():
                node.transport.post(0, ["into the void", b"y" * 10_000])
                node.transport.flush()
                await trio.sleep(0.01)
        assert not node.transport.post(0, "after")  # dropped and counted, not queued
        assert node.transport.dropped >= 1
