"""The peer transport over mutual TLS (real loopback TCP, certificates from trustme CAs): peers
of the cluster's CA talk; a peer with a certificate of another CA, or none, never reaches Raft,
and the others keep talking."""

from __future__ import annotations

import logging
import ssl
from collections import defaultdict
from typing import Any

import pytest
import trio
import trustme

from kafkaesque.local_cluster import free_ports
from kafkaesque.raft.driver import PeerTransport
from kafkaesque.raft.driver._wire import Hello, hello_frame, new_nonce

SECRET = b"cluster-secret"


def contexts(ca: trustme.CA, trusted: trustme.CA | None = None) -> tuple[ssl.SSLContext, ...]:
    """(server, client) contexts of a broker whose certificate ``ca`` signed, trusting
    ``trusted`` (default: the same CA), as the broker builds them for --peer-tls."""
    cert = ca.issue_cert("127.0.0.1", "localhost")
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.verify_mode = ssl.CERT_REQUIRED
    client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    for context in (server, client):
        cert.configure_cert(context)
        (trusted or ca).configure_trust(context)
    return server, client


class Node:
    def __init__(
        self,
        node_id: int,
        peers: dict[int, tuple[str, int]],
        tls: tuple[ssl.SSLContext, ...] | None,
    ) -> None:
        self.received: dict[int, list[Any]] = defaultdict(list)
        server, client = tls if tls is not None else (None, None)
        self.transport = PeerTransport(
            node_id,
            peers,
            cluster="test",
            secret=SECRET,
            on_items=self._on_items,
            server_ssl=server,
            client_ssl=client,
        )

    def _on_items(self, peer: int, items: list[Any]) -> None:
        self.received[peer].extend(items)


async def _until(predicate: Any, timeout: float = 10.0) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.01)


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def test_both_contexts_or_neither() -> None:
    server, _ = contexts(trustme.CA())
    with pytest.raises(ValueError, match="both"):
        PeerTransport(0, {}, cluster="t", secret=SECRET, on_items=print, server_ssl=server)


async def test_three_nodes_talk_over_mutual_tls(ca: trustme.CA) -> None:
    ports = free_ports(3)
    peers = {i: ("127.0.0.1", ports[i]) for i in range(3)}
    nodes = [Node(i, peers, contexts(ca)) for i in range(3)]
    async with trio.open_nursery() as nursery:
        for i, node in enumerate(nodes):
            await nursery.start(node.transport.run, "127.0.0.1", ports[i])
        await _until(lambda: all(len(n.transport.connected_peers()) == 2 for n in nodes))
        for i, node in enumerate(nodes):
            for j in range(3):
                if i != j:
                    for k in range(50):
                        assert node.transport.send(j, [i, j, k])
                    # ``post`` then ``flush`` (the Raft driver's path) goes through the writer.
                    assert node.transport.post(j, [i, j, "posted"])
            node.transport.flush()
        await _until(
            lambda: all(
                len(n.received[p]) == 51 for i, n in enumerate(nodes) for p in range(3) if p != i
            )
        )
        for j, node in enumerate(nodes):
            for i in range(3):
                if i != j:
                    assert node.received[i] == [[i, j, k] for k in range(50)] + [[i, j, "posted"]]
            assert node.transport.rejected == 0
        nursery.cancel_scope.cancel()


async def test_a_peer_with_another_cas_certificate_is_refused(
    ca: trustme.CA, caplog: pytest.LogCaptureFixture
) -> None:
    """Node 0 (right secret, certificate of another CA) dials node 2: refused, counted, logged,
    nothing delivered; nodes 1 and 2 go on talking."""
    caplog.set_level(logging.WARNING, logger="kafkaesque.raft.transport")
    ports = free_ports(3)
    peers = {i: ("127.0.0.1", ports[i]) for i in range(3)}
    stranger_ca = trustme.CA()
    intruder = Node(0, {0: peers[0], 2: peers[2]}, contexts(stranger_ca, trusted=ca))
    good = [Node(1, {1: peers[1], 2: peers[2]}, contexts(ca)), Node(2, peers, contexts(ca))]
    async with trio.open_nursery() as nursery:
        for node in good:
            await nursery.start(node.transport.run, *peers[node.transport.node_id])
        await _until(lambda: good[1].transport.connected_peers() == {1})
        await nursery.start(intruder.transport.run, *peers[0])
        await _until(lambda: good[1].transport.rejected >= 2)  # it redials: refused each time
        assert "TLS handshake failed" in caplog.text
        assert 0 not in good[1].transport.connected_peers()
        assert not good[1].received[0]
        assert good[0].transport.send(2, "still here")
        await _until(lambda: good[1].received[1] == ["still here"])
        nursery.cancel_scope.cancel()


async def test_the_dialer_refuses_an_acceptor_of_another_ca(ca: trustme.CA) -> None:
    """The acceptor (node 1) holds a certificate of another CA that trusts node 0's CA: node 0,
    the dialer, checks it against its own CA and refuses."""
    ports = free_ports(2)
    peers = {i: ("127.0.0.1", ports[i]) for i in range(2)}
    dialer = Node(0, peers, contexts(ca))
    acceptor = Node(1, peers, contexts(trustme.CA(), trusted=ca))
    async with trio.open_nursery() as nursery:
        await nursery.start(acceptor.transport.run, *peers[1])
        await nursery.start(dialer.transport.run, *peers[0])
        await _until(lambda: dialer.transport.rejected >= 1)
        assert not dialer.transport.connected_peers()
        assert not acceptor.transport.connected_peers()
        nursery.cancel_scope.cancel()


async def test_a_plaintext_dialer_never_reaches_a_tls_acceptor(ca: trustme.CA) -> None:
    ports = free_ports(2)
    peers = {i: ("127.0.0.1", ports[i]) for i in range(2)}
    acceptor = Node(1, peers, contexts(ca))
    async with trio.open_nursery() as nursery:
        await nursery.start(acceptor.transport.run, *peers[1])
        stream = await trio.open_tcp_stream(*peers[1])
        await stream.send_all(hello_frame(Hello("test", 0, 1, new_nonce())))
        with trio.fail_after(10):
            try:
                while await stream.receive_some(1024):
                    pass  # no challenge comes back (a TLS alert, maybe): the acceptor closes
            except trio.BrokenResourceError:
                pass  # or resets it: it closed with the hello unread
        await stream.aclose()
        await _until(lambda: acceptor.transport.rejected >= 1)
        assert not acceptor.transport.connected_peers()
        assert not acceptor.received
        nursery.cancel_scope.cancel()
