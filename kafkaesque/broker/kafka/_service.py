"""The Kafka listener of a broker: accepts connections and serves each, in order.

Kafka answers the requests of one connection in order and reads the next only once the
previous one is answered (SocketServer "mutes" the channel); clients rely on that order: each
request takes effect after the ones before it and is answered after them. This keeps both and
overlaps one thing Kafka does not need to: the wait of a Produce for its quorum. Our acks=-1
means a Raft majority has the batch on disk, so a Produce takes an fsync round; a client that
pipelines Produce requests (librdkafka sends each batch as soon as it may, up to
``max.in.flight``) would wait one fsync round per request if they were served one at a time. So
a Produce's batches are appended when it is read, in order, and the next request is read while
it waits (up to ``_PIPELINE`` unanswered); any other request first waits until every request
before it is answered, then runs alone, as Kafka would run it. Responses go out in request
order. A protocol violation (a frame too large, an API
or version not served, a request that does not parse) closes the connection, as Kafka does;
a bug in serving one request is logged and closes that connection only. A broker that stops
(``Draining``) finishes the request in hand and closes.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable
from typing import Final

import trio

from kafkaesque.fd_stream import peer_host
from kafkaesque.protocol.kafka import (
    PRODUCE,
    KafkaProtocolError,
    KafkaRequest,
    KafkaServerConnection,
    Message,
    encode_response,
)

from .._session import Session
from ._handlers import KafkaHandlers, ProduceInFlight
from ._wiring import KafkaWiring

log = logging.getLogger("kafkaesque.broker.kafka")

_RECEIVE_BYTES: Final = 64 * 1024
_PIPELINE: Final = 64  # requests of one connection read and not yet answered


class _Answer:
    """The response to one request, in the connection's order: ``data`` once ``done``."""

    def __init__(self, data: bytes | None = None) -> None:
        self.done = trio.Event()
        self.data = b""
        if data is not None:
            self.give(data)

    def give(self, data: bytes) -> None:
        self.data = data
        self.done.set()


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
        stopping = False

        def stop() -> None:
            nonlocal stopping
            stopping = True

        try:
            with w.draining.connection(stop):
                async with stream, trio.open_nursery() as nursery:
                    answers, in_order = trio.open_memory_channel[_Answer](_PIPELINE)
                    nursery.start_soon(self._send_answers, stream, in_order)
                    async with answers:
                        await self._read_requests(
                            stream, session, nursery, answers, lambda: stopping
                        )
        except KafkaProtocolError as exc:
            log.info("kafka %s: closing: %s", peer_host(stream), exc)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client went away
        except Exception:  # a bug in serving one client must not take the broker down
            log.exception("broker %d: a Kafka connection failed", w.config.id)

    async def _read_requests(
        self,
        stream: trio.SocketStream,
        session: Session,
        nursery: trio.Nursery,
        answers: trio.MemorySendChannel[_Answer],
        stopping: Callable[[], bool],
    ) -> None:
        """Read and start requests until the client closes or the broker stops; each one's
        ``_Answer`` goes into ``answers`` in request order (see the module docstring)."""
        conn = KafkaServerConnection()
        unanswered: list[_Answer] = []  # Produce requests still waiting for their quorum
        while not stopping():
            data = await stream.receive_some(_RECEIVE_BYTES)
            if not data:
                return
            conn.feed(data)
            while not stopping() and (request := conn.next_request()) is not None:
                if not isinstance(request, KafkaRequest):
                    await answers.send(_Answer(request.response))
                elif request.api is PRODUCE:
                    answer = _Answer()
                    waiting = self.handlers.begin_produce(request, session)
                    nursery.start_soon(self._finish_produce, request, waiting, answer)
                    unanswered = [a for a in unanswered if not a.done.is_set()]
                    unanswered.append(answer)
                    await answers.send(answer)
                else:
                    for earlier in unanswered:  # it runs after them, as Kafka would run it
                        await earlier.done.wait()
                    unanswered.clear()
                    await answers.send(_Answer(await self._answer(request, session)))

    async def _finish_produce(
        self, request: KafkaRequest, waiting: ProduceInFlight, answer: _Answer
    ) -> None:
        body = await waiting()
        answer.give(b"" if body is None else self._encode(request, body))

    @staticmethod
    async def _send_answers(
        stream: trio.SocketStream, in_order: trio.MemoryReceiveChannel[_Answer]
    ) -> None:
        async with in_order:
            async for answer in in_order:
                await answer.done.wait()
                if answer.data:  # acks=0: no response at all
                    await stream.send_all(answer.data)

    async def _answer(self, request: KafkaRequest, session: Session) -> bytes:
        body = await self.handlers.by_key[request.api.key](request, session)
        if body is None:  # Produce with acks=0: no response at all
            return b""
        return self._encode(request, body)

    @staticmethod
    def _encode(request: KafkaRequest, body: Message) -> bytes:
        body.setdefault("throttle_time_ms", 0)
        return encode_response(request, body)
