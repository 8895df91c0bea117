"""The REST listener of a broker: accepts connections and serves each, one request at a time.

The trio side of the HTTP front only moves bytes and keeps time: the protocol is
``kafkaesque.protocol.http.HttpServerConnection`` (h11), what a request means is ``RestApi``.
A connection's requests are answered in the order they came (pipelined ones too: the codec
gives the next only once the one before it was answered). Limits (``HttpLimits``): at most
``max_connections`` open (one more is answered 503 and closed), a request must arrive whole
within ``head_timeout_s`` of its first byte (else 408 and close), a kept-alive connection idle
for ``idle_timeout_s`` is closed. A broker that stops (``Draining``) finishes the request in
hand, then closes; an idle connection closes at once.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Final

import trio
import trio.lowlevel
from prometheus_client import CollectorRegistry

from kafkaesque.fd_stream import peer_host
from kafkaesque.protocol.http import (
    NEED_DATA,
    BadRequest,
    Closed,
    HttpLimits,
    HttpServerConnection,
    Request,
    Response,
)
from kafkaesque.security import ReloadingContext

from .._access import AccessControl
from .._default_listener import open_listeners
from .._shutdown import Draining
from .._tls import TlsRefusals, server_handshake
from ._rest import Caller, RestApi
from ._rest_errors import error_body
from ._wiring import HttpWiring

log = logging.getLogger("kafkaesque.broker.http")

_RECEIVE_BYTES: Final = 64 * 1024
_LINGER_S: Final = 1.0
_STREAM_SEND_S: Final = 15.0
_LINGER_BYTES: Final = 4 * 1024 * 1024
_BUSY: Final = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Retry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
)


@dataclass(frozen=True, slots=True)
class Streamed:
    """A response whose body is written as it comes (server-sent events): ``run(send)`` sends
    the pieces and returns when the stream is over; it is cancelled when the client goes away
    or the broker stops. The connection closes after it."""

    status: int
    content_type: str
    run: Callable[[Callable[[bytes], Awaitable[None]]], Awaitable[None]]
    headers: Sequence[tuple[str, str]] = ()


Handler = Callable[[Request, Caller], Awaitable[Response | Streamed]]
"""What a listener's requests mean: the answer to a request from a connection's caller; it
never raises (a bug is answered 500 by the handler itself)."""


class HttpServer:
    """Serves the connections of one HTTP listener with ``handler`` (see the module docstring):
    the REST listener's and the admin port's. ``draining``: the broker's graceful shutdown of
    client connections (None: the connections end when the broker's nursery is cancelled, as
    the admin port's do, so monitoring answers until the very end)."""

    def __init__(
        self,
        handler: Handler,
        *,
        access: AccessControl,
        limits: HttpLimits,
        broker_id: int,
        listener: str,
        tls: ReloadingContext | None = None,
        tls_refusals: TlsRefusals | None = None,
        draining: Draining | None = None,
    ) -> None:
        self._handler = handler
        self._access = access
        self._limits = limits
        self._broker_id = broker_id
        self._listener = listener
        self._tls = tls
        self._tls_refusals = tls_refusals
        self._draining = draining
        self.open = 0  # connections being served

    async def serve(self, stream: trio.SocketStream) -> None:
        """Serve one accepted connection until it ends (``trio.serve_listeners``' handler)."""
        if self.open >= self._limits.max_connections:
            body = error_body(50300, "BUSY", "too many HTTP connections; retry", True, False)
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await stream.send_all(_BUSY % (len(body), body))
            await stream.aclose()
            return
        self.open += 1
        try:
            await self._serve_admitted(stream)
        finally:
            self.open -= 1

    async def _serve_admitted(self, stream: trio.SocketStream) -> None:
        address = peer_host(stream)
        served: trio.abc.Stream = stream
        if self._tls is not None:  # the port speaks HTTPS only
            wrapped = await server_handshake(
                stream,
                self._tls.context,
                listener=self._listener,
                where=address,
                refusals=self._tls_refusals or TlsRefusals(CollectorRegistry()),
                https=True,
            )
            if wrapped is None:
                return
            served = wrapped
        session = self._access.new_session(address, tls=self._tls is not None)
        stopping = False
        waiting: list[trio.CancelScope] = []  # the idle wait for a next request, if any

        def stop() -> None:
            nonlocal stopping
            stopping = True
            for scope in waiting:
                scope.cancel()

        try:
            with (
                self._draining.connection(stop)
                if self._draining is not None
                else contextlib.nullcontext()
            ):
                async with served:
                    await self._exchange(served, Caller(session), waiting, lambda: stopping)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client went away
        except Exception:  # a bug in serving one client must not take the broker down
            log.exception("broker %d: an HTTP connection failed", self._broker_id)

    async def _exchange(
        self,
        stream: trio.abc.Stream,
        caller: Caller,
        waiting: list[trio.CancelScope],
        stopping: Callable[[], bool],
    ) -> None:
        limits = self._limits
        conn = HttpServerConnection(limits)
        deadline = float("inf")  # of the request under way (its head and body)
        while True:
            event = conn.next_event()
            if event is NEED_DATA:
                if conn.closing or stopping():
                    return
                if conn.idle:
                    deadline = float("inf")
                    scope = trio.move_on_after(limits.idle_timeout_s)
                    waiting.append(scope)
                else:
                    if deadline == float("inf"):
                        deadline = trio.current_time() + limits.head_timeout_s
                    scope = trio.move_on_at(deadline)
                data = None
                with scope:
                    data = await stream.receive_some(_RECEIVE_BYTES)
                if scope in waiting:
                    waiting.remove(scope)
                if data is None:  # timed out (or the broker stops)
                    if not conn.idle:
                        out = conn.respond(_timeout_response(limits.head_timeout_s), close=True)
                        await stream.send_all(out)
                    return
                was_idle = conn.idle
                conn.feed(bytes(data))
                if was_idle and not conn.idle:
                    deadline = trio.current_time() + limits.head_timeout_s
                if extra := conn.data_to_send():
                    await stream.send_all(extra)
            elif isinstance(event, Closed):
                return
            elif isinstance(event, BadRequest):
                body = error_body(event.status * 100, "BAD_REQUEST", event.message, False, False)
                await stream.send_all(conn.respond(Response(event.status, body)))
                await _linger(stream)
                return
            else:
                assert isinstance(event, Request)
                deadline = float("inf")
                response = await self._handler(event, caller)
                if isinstance(response, Streamed):
                    await _stream(stream, conn, response)
                    return
                await stream.send_all(conn.respond(response))


class HttpService:
    """The REST listener of one broker (``run`` it in the broker's nursery)."""

    def __init__(self, wiring: HttpWiring) -> None:
        self._w = wiring
        self.api = RestApi(wiring)
        self.port: int | None = None
        self._server = HttpServer(
            self.api.handle,
            access=wiring.access,
            limits=wiring.limits,
            broker_id=wiring.config.id,
            listener="http",
            tls=wiring.tls,
            tls_refusals=wiring.tls_refusals,
            draining=wiring.draining,
        )

    @property
    def open(self) -> int:
        """Connections being served."""
        return self._server.open

    @open.setter
    def open(self, value: int) -> None:
        self._server.open = value

    async def _serve(self, stream: trio.SocketStream) -> None:
        await self._server.serve(stream)

    async def run(
        self, *, task_status: trio.TaskStatus[int | None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen and serve until cancelled; ``started`` with the bound port (None: off, or the
        default port was taken and the listener stays off, with a warning)."""
        config = self._w.config
        where = config.http_listener
        if where is None:
            task_status.started(None)
            return
        listeners = await open_listeners(
            where,
            explicit=config.http is not None,
            what="REST",
            flag="--http-listen",
            broker_id=config.id,
        )
        if listeners is None:
            task_status.started(None)
            return
        self.port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, self._server.serve, listeners)
            task_status.started(self.port)


async def _stream(stream: trio.abc.Stream, conn: HttpServerConnection, response: Streamed) -> None:
    """Send ``response``'s head, then its pieces until it ends or the client closes (a read
    that sees the end of the stream cancels the writer: a silent client that went away is
    otherwise only found by the next write), or a piece cannot be sent within
    ``_STREAM_SEND_S`` (a client that stopped reading, or vanished without a word: its socket's
    buffer is full, and a stream slot would stay taken for good)."""
    await stream.send_all(
        conn.start_stream(response.status, response.content_type, response.headers)
    )

    stalled = False
    async with trio.open_nursery() as nursery:

        async def send(data: bytes) -> None:
            nonlocal stalled
            if not data:
                return
            with trio.move_on_after(_STREAM_SEND_S) as scope:
                await stream.send_all(conn.stream_data(data))
            if scope.cancelled_caught:  # a client that reads nothing: its stream ends
                stalled = True
                nursery.cancel_scope.cancel()
                await trio.lowlevel.checkpoint()

        async def watch() -> None:
            while await stream.receive_some(_RECEIVE_BYTES):
                pass  # a client sends nothing more on a stream; whatever it sends is dropped
            nursery.cancel_scope.cancel()

        nursery.start_soon(watch)
        await response.run(send)
        nursery.cancel_scope.cancel()
    if stalled:  # a piece went out half: the connection just closes
        return
    with (
        contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError),
        trio.move_on_after(_STREAM_SEND_S),
    ):
        await stream.send_all(conn.end_stream())


async def _linger(stream: trio.abc.Stream) -> None:
    """Read (and drop) what the client still sends, for a moment and a few MiB at most, before
    the connection closes: closing with unread bytes resets it, and the reset may destroy the
    answer before the client reads it (a client sends a refused body whole, then reads)."""
    left = _LINGER_BYTES
    with trio.move_on_after(_LINGER_S):
        while left > 0:
            data = await stream.receive_some(_RECEIVE_BYTES)
            if not data:
                return
            left -= len(data)


def _timeout_response(seconds: float) -> Response:
    message = f"the request did not arrive whole within {seconds:g} s"
    return Response(408, error_body(40800, "TIMEOUT", message, True, False))
