"""The Kafka listener of a broker: accepts connections and serves each, one request at a time.

Kafka answers the requests of one connection in order and reads the next only once the
previous one is answered (SocketServer "mutes" the channel); clients rely on the order, so this
serves one request at a time per connection. A protocol violation (a frame too large, an API
or version not served, a request that does not parse) closes the connection, as Kafka does;
a bug in serving one request is logged and closes that connection only. A broker that stops
(``Draining``) finishes the request in hand and closes.
"""

from __future__ import annotations

import errno
import logging
from typing import Final

import trio
from prometheus_client import CollectorRegistry

from kafkaesque.fd_stream import peer_host
from kafkaesque.protocol.kafka import (
    API_VERSIONS,
    SASL_AUTHENTICATE,
    SASL_HANDSHAKE,
    KafkaProtocolError,
    KafkaRequest,
    KafkaServerConnection,
    encode_response,
    frame_bytes,
)

from .._errors import RequestError
from .._session import Session
from .._tls import TlsRefusals, server_handshake
from ._admin_handlers import KafkaAdminHandlers, KafkaSession
from ._handlers import KafkaHandlers
from ._wiring import KafkaWiring

log = logging.getLogger("kafkaesque.broker.kafka")

_RECEIVE_BYTES: Final = 64 * 1024
# What a connection may ask before it authenticates (on a broker with a users file).
_BEFORE_AUTHENTICATION: Final = frozenset(
    {API_VERSIONS.key, SASL_HANDSHAKE.key, SASL_AUTHENTICATE.key}
)


class KafkaService:
    """The Kafka front of one broker (``run`` it in the broker's nursery)."""

    def __init__(self, wiring: KafkaWiring) -> None:
        self._w = wiring
        self.port: int | None = None
        self.handlers = KafkaHandlers(wiring, lambda: self.port)
        # SASL, ACLs, configs, partitions: their own module, served beside the others.
        self.admin = KafkaAdminHandlers(wiring)
        self.handlers.by_key.update(self.admin.by_key)

    async def run(
        self, *, task_status: trio.TaskStatus[int | None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen and serve until cancelled; ``started`` with the bound port (None: the default
        port was taken and the listener stays off, with a warning)."""
        config = self._w.config
        where = config.kafka_listener
        if where is None:
            task_status.started(None)
            return
        try:
            listeners = await trio.open_tcp_listeners(where.port, host=where.host)
        except OSError as exc:
            if config.kafka is not None or exc.errno != errno.EADDRINUSE:
                raise
            log.warning(
                "broker %d: no Kafka listener: the default %s is taken (%s); "
                "set --kafka-listen host:port, or --kafka-listen off",
                config.id,
                where,
                exc.strerror,
            )
            task_status.started(None)
            return
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started(self.port)
        await trio.serve_listeners(self._serve, listeners)

    async def _serve(self, stream: trio.SocketStream) -> None:
        w = self._w
        address = peer_host(stream)
        served: trio.abc.Stream = stream
        if w.tls is not None:  # the port speaks TLS only (docs/security.md)
            wrapped = await server_handshake(
                stream,
                w.tls.context,
                listener="kafka",
                where=address,
                refusals=w.tls_refusals or TlsRefusals(CollectorRegistry()),
            )
            if wrapped is None:
                return
            served = wrapped
        principal = w.access.new_session(address, tls=w.tls is not None).principal
        session = KafkaSession(address, tls=w.tls is not None, principal=principal)
        conn = KafkaServerConnection()
        stopping = False

        def stop() -> None:
            nonlocal stopping
            stopping = True

        try:
            with w.draining.connection(stop):
                async with served:
                    while not stopping and not session.close:
                        data = await served.receive_some(_RECEIVE_BYTES)
                        if not data:
                            return
                        conn.feed(data)
                        while not (stopping or session.close):
                            answer = await self._next_answer(conn, session)
                            if answer is None:
                                break
                            if answer:
                                await served.send_all(answer)
        except KafkaProtocolError as exc:
            log.info("kafka %s: closing: %s", address, exc)
        except RequestError as exc:  # a request before authentication: counted, closed
            log.info("kafka %s: closing: %s", address, exc.message)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client went away
        except Exception:  # a bug in serving one client must not take the broker down
            log.exception("broker %d: a Kafka connection failed", w.config.id)

    async def _next_answer(
        self, conn: KafkaServerConnection, session: KafkaSession
    ) -> bytes | None:
        """The bytes answering the next whole request on ``conn`` (b"": none is owed), or None
        until more bytes come. Before a session authenticates (on a broker with a users file)
        only ApiVersions and the SASL APIs are served: anything else raises ``RequestError``
        (counted as a refusal) and the connection is closed, as Kafka closes it."""
        if session.raw_tokens:  # after a SaslHandshake v0: bare SASL tokens
            token = conn.next_frame()
            if token is None:
                return None
            reply, failure = await self.admin.sasl_token(session, token)
            return b"" if failure is not None else frame_bytes(reply)
        request = conn.next_request()
        if request is None:
            return None
        if not isinstance(request, KafkaRequest):
            return request.response
        if session.principal is None and request.api.key not in _BEFORE_AUTHENTICATION:
            self._w.access.require_authentication(session)
        return await self._answer(request, session)

    async def _answer(self, request: KafkaRequest, session: Session) -> bytes:
        body = await self.handlers.by_key[request.api.key](request, session)
        if body is None:  # Produce with acks=0: no response at all
            return b""
        body.setdefault("throttle_time_ms", 0)
        return encode_response(request, body)
