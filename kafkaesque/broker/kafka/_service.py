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

from kafkaesque.fd_stream import peer_host
from kafkaesque.protocol.kafka import (
    KafkaProtocolError,
    KafkaRequest,
    KafkaServerConnection,
    encode_response,
)

from .._session import Session
from ._handlers import KafkaHandlers
from ._wiring import KafkaWiring

log = logging.getLogger("kafkaesque.broker.kafka")

_RECEIVE_BYTES: Final = 64 * 1024


class KafkaService:
    """The Kafka front of one broker (``run`` it in the broker's nursery)."""

    def __init__(self, wiring: KafkaWiring) -> None:
        self._w = wiring
        self.port: int | None = None
        self.handlers = KafkaHandlers(wiring, lambda: self.port)

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
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.handlers.groups.run)
            await nursery.start(trio.serve_listeners, self._serve, listeners)
            task_status.started(self.port)

    async def _serve(self, stream: trio.SocketStream) -> None:
        w = self._w
        session = w.access.new_session(peer_host(stream), tls=False)
        conn = KafkaServerConnection()
        stopping = False

        def stop() -> None:
            nonlocal stopping
            stopping = True

        try:
            with w.draining.connection(stop):
                async with stream:
                    while not stopping:
                        data = await stream.receive_some(_RECEIVE_BYTES)
                        if not data:
                            return
                        conn.feed(data)
                        while not stopping and (request := conn.next_request()) is not None:
                            if isinstance(request, KafkaRequest):
                                answer = await self._answer(request, session)
                            else:
                                answer = request.response
                            if answer:
                                await stream.send_all(answer)
        except KafkaProtocolError as exc:
            log.info("kafka %s: closing: %s", peer_host(stream), exc)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client went away
        except Exception:  # a bug in serving one client must not take the broker down
            log.exception("broker %d: a Kafka connection failed", w.config.id)

    async def _answer(self, request: KafkaRequest, session: Session) -> bytes:
        body = await self.handlers.by_key[request.api.key](request, session)
        if body is None:  # Produce with acks=0: no response at all
            return b""
        body.setdefault("throttle_time_ms", 0)
        return encode_response(request, body)
