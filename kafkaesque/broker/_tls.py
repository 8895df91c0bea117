"""TLS on the broker's own listeners: the client port (line protocol), the admin port and the
Kafka port (``kafka_tls``; its handshake is ``server_handshake``, in ``broker.kafka``).

(MQTT's TLS listener has its own, ``broker.mqtt``; the peer transport's mutual TLS is in
``kafkaesque.raft.driver``.)

A port speaks one thing: with ``--client-tls`` the client port speaks TLS only, without it
plaintext only. A client that got it wrong learns so at once instead of hanging until its
timeout: the first bytes a connection sends are peeked at (``MSG_PEEK``: left in the socket, so
nothing has to be replayed and the plain path keeps its ``FdStream`` unwrapped), before
anything else reads them. A TLS connection starts with a handshake record, byte 0x16 then the
major version 0x03; a line-protocol command never starts with a control character.

- On a TLS port, a connection whose first byte is not 0x16 gets one line,
  ``-ERR BAD_ARGS this port speaks TLS: connect with TLS (docs/security.md)``, and is closed.
- On a plain port, a connection that starts with a ClientHello is closed with no reply (its TLS
  library reports the failure), logged at INFO.
- The handshake is bounded by ``HANDSHAKE_TIMEOUT_S`` (the peek included); a failed one is
  logged at INFO and counted, never raised.

Each is counted in ``kafkaesque_tls_refused_total{listener, reason}``. The server certificate
comes from a ``ReloadingContext``, asked once per connection, so a renewed certificate is
served to new connections without a restart.
"""

from __future__ import annotations

import logging
import socket
import ssl
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import trio
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from kafkaesque.fd_stream import FdStream, SslFdStream, peer_name
from kafkaesque.protocol import ErrorCode, ErrorReply, encode_reply
from kafkaesque.security import ReloadingContext, client_context, server_context

from ._config import BrokerConfig, ConfigError
from ._shutdown import Draining

log = logging.getLogger("kafkaesque.broker.tls")

HANDSHAKE_TIMEOUT_S = 10.0
"""A TLS connection must send its ClientHello and finish the handshake within this."""
_LINGER_S = 1.0  # a refused plaintext client has this long to read its -ERR line
_DISCARD_BYTES = 64 * 1024
_TLS_HANDSHAKE_RECORD = 0x16
_TLS_MAJOR_VERSION = 0x03
NOT_TLS_REPLY = encode_reply(
    ErrorReply(ErrorCode.BAD_ARGS, "this port speaks TLS: connect with TLS (docs/security.md)")
)
"""What a plaintext client on a TLS client port reads before the broker closes it."""


@dataclass(frozen=True)
class BrokerTls:
    """The TLS contexts of one broker's listeners, from its settings (None: that one is plain).

    ``client`` and ``admin`` follow their certificate files (``ReloadingContext``); the peer
    contexts are mutual TLS over ``tls_ca`` (the acceptor requires a certificate that CA signed,
    the dialer checks the acceptor's against it and against the address it dialled), loaded
    once: a renewed broker certificate reaches the peers at the next restart.
    """

    client: ReloadingContext | None = None
    admin: ReloadingContext | None = None
    kafka: ReloadingContext | None = None
    http: ReloadingContext | None = None
    peer_server: ssl.SSLContext | None = None
    peer_client: ssl.SSLContext | None = None

    @classmethod
    def load(cls, config: BrokerConfig) -> BrokerTls:
        """Read the certificates ``config`` names; ``ConfigError`` if one cannot be used."""
        cert, key, ca = config.tls_cert, config.tls_key, config.tls_ca
        if cert is None:  # validate(): no TLS setting without tls_cert
            return cls()
        try:
            client = ReloadingContext(cert, key) if config.client_tls else None
            admin = ReloadingContext(cert, key) if config.admin_tls else None
            kafka = ReloadingContext(cert, key) if config.kafka_tls else None
            http = ReloadingContext(cert, key) if config.http_tls else None
            peer_server = peer_client = None
            if config.peer_tls:
                peer_server = server_context(cert, key, client_ca=ca, require_client_cert=True)
                peer_client = client_context(ca, cert=cert, key=key)
        except (OSError, ssl.SSLError, ValueError) as exc:
            raise ConfigError(
                f"tls_cert/tls_key/tls_ca: cannot load the certificates: {exc}"
            ) from exc
        return cls(client, admin, kafka, http, peer_server, peer_client)


def looks_like_tls(prefix: bytes) -> bool:
    """Whether a connection's first bytes may be a TLS handshake record (a ClientHello):
    0x16, then 0x03 if the second byte arrived too."""
    if not prefix or prefix[0] != _TLS_HANDSHAKE_RECORD:
        return False
    return len(prefix) < 2 or prefix[1] == _TLS_MAJOR_VERSION


async def peek(stream: trio.SocketStream, size: int = 2) -> bytes:
    """Up to ``size`` of the first bytes ``stream``'s peer sent, left unread: waits until some
    arrived; ``b""`` if the peer closed (or the connection broke) before sending any."""
    try:
        return await stream.socket.recv(size, socket.MSG_PEEK)
    except OSError:
        return b""


class TlsRefusals:
    """``kafkaesque_tls_refused_total{listener, reason}``: connections a listener closed for
    speaking the wrong protocol (``plaintext`` on a TLS port, ``tls`` on a plain one) or for a
    failed TLS handshake (``handshake``)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self._counter = Counter(
            "kafkaesque_tls_refused",
            "Connections closed for a failed TLS handshake or the wrong protocol on the port.",
            ["listener", "reason"],
            registry=registry,
        )

    def count(self, listener: str, reason: str) -> None:
        self._counter.labels(listener=listener, reason=reason).inc()


class PeerRefusals(Collector):
    """``kafkaesque_peer_connections_refused_total``: peer connections closed for failing the
    handshake (TLS or the cluster secret) or breaking the protocol (the transport's count)."""

    def __init__(self, count: Callable[[], int]) -> None:
        self._count = count

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(
            "kafkaesque_peer_connections_refused",
            "Peer connections refused: a failed TLS or secret handshake, or a protocol error.",
            value=self._count(),
        )


async def server_handshake(
    stream: trio.abc.Stream,
    context: ssl.SSLContext,
    *,
    listener: str,
    where: str,
    refusals: TlsRefusals,
    https: bool = False,
) -> trio.SSLStream[trio.abc.Stream] | None:
    """``stream`` wrapped in TLS, its handshake done within ``HANDSHAKE_TIMEOUT_S``; None (the
    stream closed, the failure logged at INFO and counted) if it failed. ``https``: the
    HTTPS-compatible mode (a peer may close without ``close_notify``)."""
    tls = trio.SSLStream(stream, context, server_side=True, https_compatible=https)
    try:
        with trio.fail_after(HANDSHAKE_TIMEOUT_S):
            await tls.do_handshake()
    except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError) as exc:
        why = "timed out" if isinstance(exc, trio.TooSlowError) else _reason(exc)
        log.info("%s port: TLS handshake with %s failed: %s", listener, where, why)
        refusals.count(listener, "handshake")
        await trio.aclose_forcefully(tls)
        return None
    return tls


class ClientPortGate:
    """What the client port does with a connection before its line-protocol session: the
    protocol check and, on a TLS port, the handshake (see the module docstring).

    ``context``: None for a plain port, else the server context (asked once per connection:
    it follows its certificate files). Trio thread only.
    """

    def __init__(
        self, context: ReloadingContext | None, refusals: TlsRefusals, draining: Draining
    ) -> None:
        self._context = context
        self._refusals = refusals
        self._draining = draining

    @property
    def tls(self) -> bool:
        return self._context is not None

    async def admit(self, stream: trio.SocketStream) -> trio.abc.Stream | None:
        """The stream to serve the session on (an ``FdStream``, or an ``SslFdStream`` on a
        TLS port), or None: ``stream`` was refused and closed.

        The wait for the first bytes counts among the connections a draining broker waits
        for, and ends when the drain begins (the connection is closed, having asked nothing).
        On a plain port it is not bounded otherwise (a pooled connection may stay quiet).
        Never raises for what the client did: a bug is logged and the connection closed.
        """
        try:
            return await self._admit(stream)
        except Exception:  # a bug in admitting one client must not take the broker down
            log.exception("client port: admitting a connection failed")
            await trio.aclose_forcefully(stream)
            return None

    async def _admit(self, stream: trio.SocketStream) -> trio.abc.Stream | None:
        where = peer_name(stream)
        prefix = b""
        with trio.CancelScope() as scope, self._draining.connection(scope.cancel):
            if self._context is not None:
                scope.deadline = trio.current_time() + HANDSHAKE_TIMEOUT_S
            prefix = await peek(stream)
        if not prefix:  # closed, or drained, or (TLS) no ClientHello within the handshake bound
            if self._context is not None and scope.cancelled_caught and not self._draining.begun:
                log.info("client port: %s sent no TLS ClientHello in time", where)
                self._refusals.count("client", "handshake")
            await trio.aclose_forcefully(stream)
            return None
        if self._context is None:
            if looks_like_tls(prefix):
                log.info("client port: %s began a TLS handshake on the plain port: closed", where)
                self._refusals.count("client", "tls")
                await trio.aclose_forcefully(stream)
                return None
            return FdStream(stream)
        if not looks_like_tls(prefix):
            log.info("client port: %s spoke plaintext on the TLS port: told and closed", where)
            self._refusals.count("client", "plaintext")
            await _tell_and_close(stream, NOT_TLS_REPLY)
            return None
        try:
            with trio.fail_after(HANDSHAKE_TIMEOUT_S):
                return await SslFdStream.open(stream, self._context.context, server_side=True)
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError) as exc:
            why = "timed out" if isinstance(exc, trio.TooSlowError) else _reason(exc)
            log.info("client port: TLS handshake with %s failed: %s", where, why)
            self._refusals.count("client", "handshake")
            await trio.aclose_forcefully(stream)  # closed already unless it timed out early
            return None


async def _tell_and_close(stream: trio.SocketStream, reply: bytes) -> None:
    """Send ``reply``, half-close, and read what the peer sent (up to ``_DISCARD_BYTES``, for
    ``_LINGER_S`` at most) before closing: closing with unread bytes would reset the
    connection, and a reset may discard the reply before the peer reads it."""
    with trio.move_on_after(_LINGER_S):
        try:
            await stream.send_all(reply)
            await stream.send_eof()
            discarded = 0
            while discarded < _DISCARD_BYTES:
                data = await stream.receive_some(4096)
                if not data:
                    break
                discarded += len(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
    await trio.aclose_forcefully(stream)


def _reason(exc: BaseException) -> str:
    """The SSL error under a trio stream error, said short (``CERTIFICATE_VERIFY_FAILED``...)."""
    cause = exc.__cause__ or exc.__context__
    if isinstance(cause, ssl.SSLError):
        return cause.reason or str(cause)
    return str(cause or exc) or type(exc).__name__
