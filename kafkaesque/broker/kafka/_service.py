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
order (``_answers``). A pipelined Produce costs no task: its Raft group tells its commit, which
gives its response (``ProduceInFlight.tell``), and one task per connection watches the
deadlines of those still untold (``_Expiry``); only acks=0 and 1 await theirs in a task.

A protocol violation (a frame too large, an API or version not served, a request that does not
parse, a request before SASL authentication on a broker with a users file) closes the
connection, as Kafka does; a bug in serving one request is logged and closes that connection
only. A broker that stops (``Draining``) answers the requests it has read and closes.
"""

from __future__ import annotations

import functools
import logging
from collections import deque
from collections.abc import Callable
from typing import Final

import trio
from prometheus_client import CollectorRegistry

from kafkaesque.fd_stream import peer_host
from kafkaesque.protocol.kafka import (
    API_VERSIONS,
    PRODUCE,
    SASL_AUTHENTICATE,
    SASL_HANDSHAKE,
    KafkaProtocolError,
    KafkaRequest,
    KafkaServerConnection,
    Message,
    encode_response,
    frame_bytes,
)

from .._default_listener import open_listeners
from .._errors import RequestError
from .._session import Session
from .._tls import TlsRefusals, server_handshake
from ._admin_handlers import KafkaAdminHandlers, KafkaSession
from ._answers import Answer, send_in_order
from ._handlers import KafkaHandlers, ProduceInFlight
from ._wiring import KafkaWiring

log = logging.getLogger("kafkaesque.broker.kafka")

_RECEIVE_BYTES: Final = 64 * 1024
# What a connection may ask before it authenticates (on a broker with a users file).
_BEFORE_AUTHENTICATION: Final = frozenset(
    {API_VERSIONS.key, SASL_HANDSHAKE.key, SASL_AUTHENTICATE.key}
)
_PIPELINE: Final = 64  # requests of one connection read and not yet answered


class _Expiry:
    """The Produces of one connection told by their groups (``ProduceInFlight.tell``), in the
    order begun, which is their deadlines' order: ``run`` expires each one still unanswered at
    its deadline. Answered ones are dropped as new ones come, so the queue holds about those in
    flight, not the write timeout's worth of requests and their batches."""

    def __init__(self) -> None:
        self._pending: deque[ProduceInFlight] = deque()
        self._arrived = trio.Event()
        self._scope = trio.CancelScope()

    def stop(self) -> None:
        """End ``run``: every response was written (none is left to expire)."""
        self._scope.cancel()

    def add(self, produce: ProduceInFlight) -> None:
        pending = self._pending
        while pending and pending[0].done:
            pending.popleft()
        pending.append(produce)
        self._arrived.set()

    async def run(self) -> None:
        """Until ``stop``: sleep until the oldest unanswered one's deadline, expire it."""
        pending = self._pending
        with self._scope:
            await self._expire(pending)

    async def _expire(self, pending: deque[ProduceInFlight]) -> None:
        while True:
            while pending and pending[0].done:
                pending.popleft()
            if not pending:
                self._arrived = trio.Event()
                await self._arrived.wait()
                continue
            await trio.sleep_until(pending[0].deadline)
            now = trio.current_time()
            while pending and (pending[0].done or pending[0].deadline <= now):
                pending.popleft().expire()


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
        listeners = await open_listeners(
            where,
            explicit=config.kafka is not None,
            what="Kafka",
            flag="--kafka-listen",
            broker_id=config.id,
        )
        if listeners is None:
            task_status.started(None)
            return
        self.port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.handlers.groups.run)
            await nursery.start(trio.serve_listeners, self._serve, listeners)
            task_status.started(self.port)

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
        stopping = False

        def stop() -> None:
            nonlocal stopping
            stopping = True

        try:
            with w.draining.connection(stop):
                async with served, trio.open_nursery() as nursery:
                    answers, in_order = trio.open_memory_channel[Answer](_PIPELINE)
                    expiry = _Expiry()
                    nursery.start_soon(expiry.run)
                    nursery.start_soon(self._send_answers, served, in_order, expiry)
                    async with answers:
                        await self._read_requests(
                            served,
                            session,
                            nursery,
                            answers,
                            expiry,
                            lambda: stopping or session.close,
                        )
        except* KafkaProtocolError as group:
            log.info("kafka %s: closing: %s", address, group.exceptions[0])
        except* RequestError as group:  # a request before authentication: counted, closed
            log.info("kafka %s: closing: %s", address, group.exceptions[0])
        except* (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client went away
        except* Exception:  # a bug in serving one client must not take the broker down
            log.exception("broker %d: a Kafka connection failed", w.config.id)

    async def _read_requests(
        self,
        stream: trio.abc.Stream,
        session: KafkaSession,
        nursery: trio.Nursery,
        answers: trio.MemorySendChannel[Answer],
        expiry: _Expiry,
        stopping: Callable[[], bool],
    ) -> None:
        """Read and start requests until the client closes or the broker stops; each one's
        ``Answer`` goes into ``answers`` in request order (see the module docstring).

        Before a session authenticates (on a broker with a users file) only ApiVersions and
        the SASL APIs are served: anything else raises ``RequestError`` (counted as a refusal)
        and the connection is closed, as Kafka closes it."""
        conn = KafkaServerConnection()
        unanswered: list[Answer] = []  # Produce requests still waiting for their quorum

        async def after_earlier() -> None:  # what is not a Produce runs alone, in order
            for earlier in unanswered:
                await earlier.done.wait()
            unanswered.clear()

        while not stopping():
            data = await stream.receive_some(_RECEIVE_BYTES)
            if not data:
                return
            conn.feed(data)
            while not stopping():
                if session.raw_tokens:  # after a SaslHandshake v0: bare SASL tokens
                    token = conn.next_frame()
                    if token is None:
                        break
                    await after_earlier()
                    reply, failure = await self.admin.sasl_token(session, token)
                    await answers.send(Answer(b"" if failure is not None else frame_bytes(reply)))
                    continue
                request = conn.next_request()
                if request is None:
                    break
                if not isinstance(request, KafkaRequest):
                    await answers.send(Answer(request.response))
                    continue
                if session.principal is None and request.api.key not in _BEFORE_AUTHENTICATION:
                    self._w.access.require_authentication(session)
                if request.api is PRODUCE:
                    answer = Answer()
                    produce = self.handlers.begin_produce(request, session)
                    if produce.tell(functools.partial(self._produced, request, answer)):
                        expiry.add(produce)
                    else:
                        nursery.start_soon(self._finish_produce, request, produce, answer)
                    unanswered = [a for a in unanswered if not a.done.is_set()]
                    unanswered.append(answer)
                    await answers.send(answer)
                else:
                    await after_earlier()
                    await answers.send(Answer(await self._answer(request, session)))

    def _produced(self, request: KafkaRequest, answer: Answer, body: Message | None) -> None:
        answer.give(b"" if body is None else self._encode(request, body))

    async def _finish_produce(
        self, request: KafkaRequest, produce: ProduceInFlight, answer: Answer
    ) -> None:
        self._produced(request, answer, await produce.answer())

    @staticmethod
    async def _send_answers(
        stream: trio.abc.Stream, in_order: trio.MemoryReceiveChannel[Answer], expiry: _Expiry
    ) -> None:
        """Every response, in order, until the reader closed the channel; then the deadline
        watch ends (it may still be needed until then, for a Produce read last)."""
        await send_in_order(stream, in_order)
        expiry.stop()

    async def _answer(self, request: KafkaRequest, session: Session) -> bytes:
        body = await self.handlers.by_key[request.api.key](request, session)
        if body is None:  # Produce with acks=0: no response at all
            return b""
        return self._encode(request, body)

    @staticmethod
    def _encode(request: KafkaRequest, body: Message) -> bytes:
        body.setdefault("throttle_time_ms", 0)
        return encode_response(request, body)
