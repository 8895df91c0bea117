"""Peer transport: one authenticated TCP connection per broker pair, frames of msgpack.

The broker with the lower id dials; the higher one accepts; both directions share the
connection (so N brokers hold N(N-1)/2 connections, whatever the number of Raft groups).
``send`` never blocks: items are queued per peer, and that peer's writer task sends everything
queued as one frame, which is how the messages of many groups, heartbeats above all, travel
together. Items for a peer that is not connected are dropped and counted: Raft retransmits.

``post`` queues without waking the writer, and ``flush`` then writes what was posted at once
from the caller's task, when the writer is idle and the socket takes it (else the writer is
woken to send it). The Raft driver posts a step's messages and flushes at the step's end: they
still travel as one frame, and a pass of the scheduler is saved on every hop of a write's
round. Under load a pass runs every ready task of the broker (hundreds of MQTT devices, say),
so the pass, not the CPU, is what each hop costs in latency.

Mutual TLS (``server_ssl`` and ``client_ssl``, both or neither): every connection is wrapped
in TLS before the handshake above, the acceptor requiring a certificate that the cluster's CA
signed (its context says so), the dialer checking the acceptor's against the same CA and the
address it dialled. A peer whose certificate fails is refused (logged, counted in ``rejected``)
and never reaches Raft. The HMAC handshake still runs inside: TLS says the peer holds a
certificate of the cluster, the handshake which broker it is. Over TLS the connection is an
``SslFdStream`` (OpenSSL's own socket, with ``FdStream``'s ``send_now``), so ``flush`` works as
on a plain one, and a frame goes out as one TLS record or a few (its buffers joined).

Lifetime: everything runs inside ``PeerTransport.run`` (listener, dialers, one nursery per
connection); cancelling it closes every connection.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import trio

from kafkaesque.fd_stream import FdStream, SslFdStream, peer_name

from ._wire import (
    DEFAULT_MAX_FRAME,
    FrameDecoder,
    FrameEncoder,
    Hello,
    PeerProtocolError,
    challenge_frame,
    check_challenge,
    check_proof,
    hello_frame,
    new_nonce,
    parse_hello,
    proof_frame,
)

log = logging.getLogger("kafkaesque.raft.transport")

HANDSHAKE_TIMEOUT_S = 5.0
# A dialer whose peer refuses connections (it is down) tries again after 50 ms, doubling up to
# this: a refused connect on a LAN costs next to nothing, and a restarted peer waited up to the
# whole cap (1 s before issue 23) before the first Raft message could reach it.
_DIAL_BACKOFF_MAX_S = 0.25
_RECEIVE_BYTES = 256 * 1024


@dataclass(slots=True, eq=False)
class _Link:
    """What this node knows about its connection to one peer."""

    address: tuple[str, int]
    outbox: list[Any] = field(default_factory=list)
    wake: trio.Event = field(default_factory=trio.Event)
    connected: bool = False
    scope: trio.CancelScope | None = None  # of the live connection, to replace it
    live: _Connection | None = None  # the live connection, once its handshake is done


@dataclass(slots=True, eq=False)
class _Connection:
    """The sending side of one connection to a peer: its writer task's or ``flush``'s."""

    stream: FdStream | SslFdStream
    encoder: FrameEncoder = field(default_factory=FrameEncoder)
    writing: bool = False  # the writer task is sending: ``flush`` must leave it the outbox


class PeerTransport:
    """This broker's connections to its peers. Not thread-safe: use it from its trio thread.

    ``on_items(peer_id, items)`` is called (synchronously, in order) for every frame received;
    it must not block. ``on_peer_change(peer_id, connected)`` is told when a connection comes or
    goes (a killed peer's connection closes at once: faster news than missing pings).
    Peers are identified by node id; ``peers`` maps each to its address. ``server_ssl`` and
    ``client_ssl``: mutual TLS between peers (see the module docstring); both or neither.
    """

    def __init__(
        self,
        node_id: int,
        peers: Mapping[int, tuple[str, int]],
        *,
        cluster: str,
        secret: bytes,
        on_items: Callable[[int, list[Any]], None],
        max_frame: int = DEFAULT_MAX_FRAME,
        max_queued_items: int = 100_000,
        on_peer_change: Callable[[int, bool], None] | None = None,
        server_ssl: ssl.SSLContext | None = None,
        client_ssl: ssl.SSLContext | None = None,
    ) -> None:
        if not secret:
            raise ValueError("a cluster secret is required")
        if (server_ssl is None) != (client_ssl is None):
            raise ValueError("mutual TLS needs both server_ssl and client_ssl (or neither)")
        self._server_ssl = server_ssl
        self._client_ssl = client_ssl
        self.node_id = node_id
        self._cluster = cluster
        self._secret = secret
        self._on_items = on_items
        self._on_peer_change = on_peer_change
        self._max_frame = max_frame
        self._max_queued = max_queued_items
        self._links = {p: _Link(a) for p, a in peers.items() if p != node_id}
        self._posted: set[_Link] = set()  # links with items ``post``ed and not yet flushed
        self._nursery: trio.Nursery | None = None
        #: Items dropped because their peer was disconnected or its queue full.
        self.dropped = 0
        #: Connections closed because the peer broke the protocol or failed authentication.
        self.rejected = 0
        self.frames_sent = 0
        self.frames_received = 0

    # -- public -------------------------------------------------------------------------------

    def send(self, peer: int, item: Any) -> bool:
        """Queue ``item`` for ``peer``; False (and counted in ``dropped``) if it cannot go now."""
        link = self._queue(peer, item)
        if link is None:
            return False
        link.wake.set()
        return True

    def post(self, peer: int, item: Any) -> bool:
        """``send`` without waking the writer: ``item`` waits for the next ``flush``."""
        link = self._queue(peer, item)
        if link is None:
            return False
        self._posted.add(link)
        return True

    def send_now(self, peer: int, item: Any) -> bool:
        """``post`` then ``flush``: ``item`` (and whatever else was posted) is written from the
        caller now where the peer's writer is idle and its socket has room, else handed to the
        writer. For a request or answer that no step's end will flush (a forwarded append and
        its answer): ``send`` would cost a pass of the scheduler to wake the writer, on each
        hop of the write. False (and counted in ``dropped``) if it cannot go now."""
        if not self.post(peer, item):
            return False
        self.flush()
        return True

    def _queue(self, peer: int, item: Any) -> _Link | None:
        link = self._links.get(peer)
        if link is None or not link.connected or len(link.outbox) >= self._max_queued:
            self.dropped += 1
            return None
        link.outbox.append(item)
        return link

    def flush(self) -> None:
        """Send what was posted: written now where the peer's writer is idle and its socket
        has room, else handed to the writer. Never blocks."""
        posted, self._posted = self._posted, set()
        for link in posted:
            conn = link.live
            if not link.outbox:
                continue
            if conn is None or conn.writing or conn.stream.kept:
                link.wake.set()
                continue
            items, link.outbox = link.outbox, []
            written = True
            try:
                for frame in conn.encoder.frames(items):
                    self.frames_sent += 1
                    written = conn.stream.send_now(frame) and written
            except trio.BrokenResourceError:
                if link.scope is not None:
                    link.scope.cancel()  # a broken connection: close it; the dialer redials
            finally:
                conn.encoder.release()
            if not written:  # the socket is full: the writer sends what it kept
                link.wake.set()

    def connected_peers(self) -> set[int]:
        return {p for p, link in self._links.items() if link.connected}

    def add_peer(self, peer: int, address: tuple[str, int]) -> None:
        """Learn a new peer (membership change); dial it if this node is the dialer."""
        if peer == self.node_id or peer in self._links:
            return
        self._links[peer] = _Link(address)
        if self._nursery is not None and self.node_id < peer:
            self._nursery.start_soon(self._dial_forever, peer)

    async def run(
        self,
        host: str,
        port: int,
        *,
        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Listen on ``host:port`` (0: any free port), dial the lower-id side's peers, forever.

        ``task_status.started`` gets the bound port.
        """
        listeners = await trio.open_tcp_listeners(port, host=host)
        bound = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(trio.serve_listeners, self._accept, listeners)
            for peer in self._links:
                if self.node_id < peer:
                    nursery.start_soon(self._dial_forever, peer)
            task_status.started(bound)

    # -- connections --------------------------------------------------------------------------

    async def _dial_forever(self, peer: int) -> None:
        backoff = 0.05
        while True:
            link = self._links[peer]
            try:
                sock = await trio.open_tcp_stream(*link.address)
            except OSError:
                await trio.sleep(backoff)
                backoff = min(backoff * 2, _DIAL_BACKOFF_MAX_S)
                continue
            backoff = 0.05
            decoder = FrameDecoder(self._max_frame)
            early: list[Any] = []
            stream: trio.abc.Stream = sock
            try:
                with trio.fail_after(HANDSHAKE_TIMEOUT_S):
                    if self._client_ssl is not None:
                        stream = await _tls_handshake(
                            sock, self._client_ssl, server_hostname=link.address[0]
                        )
                    hello = Hello(self._cluster, self.node_id, peer, new_nonce())
                    await stream.send_all(hello_frame(hello))
                    acceptor_nonce = check_challenge(
                        await self._next_frame(stream, decoder, early), self._secret, hello
                    )
                    await stream.send_all(proof_frame(self._secret, hello, acceptor_nonce))
            except (PeerProtocolError, trio.TooSlowError, trio.BrokenResourceError, OSError) as exc:
                self._refuse(peer, link.address, exc)
                await trio.aclose_forcefully(stream)
                await trio.sleep(backoff)
                continue
            await self._run_connection(peer, stream, decoder, early)
            await trio.sleep(backoff)

    async def _accept(self, sock: trio.SocketStream) -> None:
        decoder = FrameDecoder(self._max_frame)
        where = peer_name(sock)
        early: list[Any] = []
        stream: trio.abc.Stream = sock
        try:
            with trio.fail_after(HANDSHAKE_TIMEOUT_S):
                if self._server_ssl is not None:
                    stream = await _tls_handshake(sock, self._server_ssl, server_side=True)
                hello = parse_hello(
                    await self._next_frame(stream, decoder, early), self._cluster, self.node_id
                )
                if hello.dialer not in self._links or hello.dialer > self.node_id:
                    raise PeerProtocolError(f"node {hello.dialer} is not a peer that dials here")
                nonce = new_nonce()
                await stream.send_all(challenge_frame(self._secret, hello, nonce))
                proof = await self._next_frame(stream, decoder, early)
                check_proof(proof, self._secret, hello, nonce)
        except (PeerProtocolError, trio.TooSlowError, trio.BrokenResourceError, OSError) as exc:
            self._refuse(None, where, exc)
            await trio.aclose_forcefully(stream)
            return
        old = self._links[hello.dialer].scope
        if old is not None:
            old.cancel()  # the peer restarted: its new connection replaces the old one
        await self._run_connection(hello.dialer, stream, decoder, early)

    async def _next_frame(
        self, stream: trio.abc.Stream, decoder: FrameDecoder, early: list[Any]
    ) -> Any:
        """The next frame; frames that arrived with it wait in ``early`` (the peer may send its
        first items right behind its last handshake frame)."""
        while not early:
            data = await stream.receive_some(_RECEIVE_BYTES)
            if not data:
                raise PeerProtocolError("connection closed during the handshake")
            early.extend(decoder.feed(bytes(data)))
        return early.pop(0)

    async def _run_connection(
        self, peer: int, stream: trio.abc.Stream, decoder: FrameDecoder, early: list[Any]
    ) -> None:
        link = self._links[peer]
        # The handshake is done: now for the hot path. The FdStream owns ``stream`` from here
        # on, and closes it (it must know: it caches the descriptor); over TLS, the
        # SslFdStream already does.
        fast: FdStream | SslFdStream
        if isinstance(stream, SslFdStream):
            fast = stream
        else:
            assert isinstance(stream, trio.SocketStream)
            fast = FdStream(stream)
        with trio.CancelScope() as scope:
            link.scope = scope
            link.connected = True
            log.info("node %d: connected to node %d", self.node_id, peer)
            if self._on_peer_change is not None:
                self._on_peer_change(peer, True)
            try:
                conn = link.live = _Connection(fast)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._write_loop, link, conn)
                    self._deliver(peer, early)
                    # The reader is a task of its own rather than awaited here: a coroutine
                    # woken resumes every frame of its task's await chain, so each read would
                    # also resume this function and the handshake's (a call each per read).
                    nursery.start_soon(self._read_loop, peer, fast, decoder, nursery.cancel_scope)
            except* PeerProtocolError as replica:
                for exc in replica.exceptions:
                    self._refuse(peer, link.address, exc)
            except* (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass  # the peer went away; the dialer reconnects
            finally:
                link.connected = False
                if link.scope is scope:
                    link.live = None
                    link.scope = None
                    self.dropped += len(link.outbox)
                    link.outbox.clear()
                log.info("node %d: disconnected from node %d", self.node_id, peer)
                if self._on_peer_change is not None and link.scope is None:
                    self._on_peer_change(peer, False)
        await trio.aclose_forcefully(fast)

    async def _read_loop(
        self,
        peer: int,
        stream: FdStream | SslFdStream,
        decoder: FrameDecoder,
        connection: trio.CancelScope,
    ) -> None:
        """Deliver what ``peer`` sends until it closes the connection, then end the
        connection (``connection``: its writer too). Raises what reading raises."""
        while True:
            data = await stream.receive_some(_RECEIVE_BYTES)
            if not data:
                connection.cancel()
                return
            self._deliver(peer, decoder.feed(data))

    def _deliver(self, peer: int, frames: list[Any]) -> None:
        for frame in frames:
            if type(frame) is not list:  # (msgpack gives plain lists: no isinstance call)
                raise PeerProtocolError(f"expected a list of items, got {type(frame).__name__}")
            self.frames_received += 1
            self._on_items(peer, frame)

    async def _write_loop(self, link: _Link, conn: _Connection) -> None:
        stream, encoder = conn.stream, conn.encoder
        while True:
            await link.wake.wait()
            link.wake = trio.Event()
            conn.writing = True
            try:
                await stream.send_kept()
                items, link.outbox = link.outbox, []
                for frame in encoder.frames(items):
                    if isinstance(stream, SslFdStream):
                        await stream.send_all(b"".join(frame))  # a record, not one per buffer
                    else:
                        for buffer in frame:
                            await stream.send_all(buffer)
                    self.frames_sent += 1
            finally:
                encoder.release()
                conn.writing = False

    def _refuse(self, peer: int | None, where: object, exc: BaseException) -> None:
        self.rejected += isinstance(exc, PeerProtocolError)
        who = f"node {peer}" if peer is not None else "a connection"
        log.warning("node %d: closed %s from %s: %s", self.node_id, who, where, exc)


async def _tls_handshake(
    sock: trio.SocketStream,
    context: ssl.SSLContext,
    *,
    server_side: bool = False,
    server_hostname: str | None = None,
) -> SslFdStream:
    """``sock`` (taken over) under TLS, handshake done. A handshake that fails (a certificate
    from another CA, no certificate, not TLS at all) raises ``PeerProtocolError``: the
    connection is refused and counted; a connection that broke is ``trio.BrokenResourceError``
    as before."""
    try:
        return await SslFdStream.open(
            sock, context, server_side=server_side, server_hostname=server_hostname
        )
    except trio.BrokenResourceError as exc:
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, ssl.SSLError):
            raise PeerProtocolError(f"TLS handshake failed: {cause.reason or cause}") from exc
        raise
