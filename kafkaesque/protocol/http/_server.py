"""``HttpServerConnection``: one HTTP/1.1 server connection as a state machine on h11.

Bytes in (``feed``), whole requests out (``next_event``: a ``Request`` with its body, a
``BadRequest`` to answer and close on, ``Closed``, or ``NEED_DATA``), responses in
(``respond``), bytes out. No sockets, no clock: the caller moves the bytes and keeps the time
(``idle`` tells it which of its two timeouts applies).

Keep-alive and pipelining come from h11: a request read after another waits (h11 pauses) until
the one before it was answered, so pipelined requests are answered in the order they came. A
body is capped at ``HttpLimits.max_body``: a ``Content-Length`` above it is refused (413) before
a byte of the body is read, a chunked body as soon as it grows past it; the head at
``max_head`` (431). A request h11 cannot parse is answered with h11's status hint (400 mostly).
After any ``BadRequest`` the connection closes once its answer is sent: the byte stream can no
longer be trusted, or would cost reading an unwanted body.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Final

import h11

_REASONS: Final = {
    100: "Continue",
    200: "OK",
    204: "No Content",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    406: "Not Acceptable",
    408: "Request Timeout",
    409: "Conflict",
    413: "Content Too Large",
    415: "Unsupported Media Type",
    416: "Range Not Satisfiable",
    422: "Unprocessable Content",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """What one connection may cost. ``max_head``: request line and headers, in bytes;
    ``max_body``: a request's body; ``head_timeout_s``: from a request's first byte to its
    last; ``idle_timeout_s``: a kept-alive connection waiting for its next request;
    ``max_connections``: open connections per listener (the trio side enforces the last three).
    """

    max_head: int = 16 * 1024
    max_body: int = 1024 * 1024
    head_timeout_s: float = 10.0
    idle_timeout_s: float = 60.0
    max_connections: int = 256


class NeedData(Enum):
    NEED_DATA = "NEED_DATA"


NEED_DATA: Final = NeedData.NEED_DATA


@dataclass(frozen=True, slots=True)
class Request:
    """A whole request. ``headers``: lower-case names and their values, in order."""

    method: str
    target: bytes
    headers: tuple[tuple[str, str], ...]
    body: bytes = b""

    def header(self, name: str) -> str | None:
        """The value of header ``name`` (lower case), the first if repeated; None if absent."""
        for key, value in self.headers:
            if key == name:
                return value
        return None


@dataclass(frozen=True, slots=True)
class BadRequest:
    """A request the connection refuses: answer it with ``status`` (``respond``), then close."""

    status: int
    message: str


@dataclass(frozen=True, slots=True)
class Closed:
    """The client closed its side cleanly, between requests."""


ServerEvent = Request | BadRequest | Closed | NeedData


@dataclass(frozen=True, slots=True)
class Response:
    """A response with a whole body; ``Content-Length`` is added, ``headers`` are the others."""

    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: Sequence[tuple[str, str]] = field(default=())


class HttpServerConnection:
    """The server side of one connection (see the module docstring).

    Usage: ``feed(data)`` (``b""`` at the end of the stream), then ``next_event()`` until
    ``NEED_DATA``; answer every ``Request`` and ``BadRequest`` with ``respond`` before the next
    one is given; send ``data_to_send()`` (a ``100 Continue``) whenever it is not empty; close
    once ``closing`` after the last bytes went out.
    """

    def __init__(self, limits: HttpLimits = HttpLimits()) -> None:
        self.limits = limits
        self._h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=limits.max_head)
        self._head: h11.Request | None = None  # the request whose body is being read
        self._body = bytearray()
        self._method = ""  # of the request being answered (HEAD gets no body)
        self._outbox = bytearray()
        self.closing = False  # the connection ends once the response owed is sent

    @property
    def idle(self) -> bool:
        """Whether no request is under way: nothing of the next one has arrived yet."""
        return (
            self._head is None
            and self._h11.their_state is h11.IDLE
            and not self._h11.trailing_data[0]
        )

    def feed(self, data: bytes) -> None:
        """Bytes from the client; ``b""``: the client closed its side."""
        self._h11.receive_data(data)

    def data_to_send(self) -> bytes:
        """Bytes the connection owes the client besides responses (``100 Continue``)."""
        out = bytes(self._outbox)
        self._outbox.clear()
        return out

    def next_event(self) -> ServerEvent:
        """The next whole request or refusal (see the class docstring). After a ``BadRequest``
        or ``Closed`` there is nothing more: ``NEED_DATA`` for good."""
        if self.closing:
            return NEED_DATA
        try:
            while True:
                event = self._h11.next_event()
                if event is h11.NEED_DATA or event is h11.PAUSED:
                    return NEED_DATA
                if isinstance(event, h11.Request):
                    refusal = self._start(event)
                    if refusal is not None:
                        return refusal
                elif isinstance(event, h11.Data):
                    self._body += event.data
                    if len(self._body) > self.limits.max_body:
                        return self._refuse(413, self._too_large())
                elif isinstance(event, h11.EndOfMessage):
                    head, self._head = self._head, None
                    assert head is not None  # h11: a body ends only after its head
                    body, self._body = bytes(self._body), bytearray()
                    return Request(
                        head.method.decode("ascii"),
                        head.target,
                        tuple((k.decode("latin-1"), v.decode("latin-1")) for k, v in head.headers),
                        body,
                    )
                elif isinstance(event, h11.ConnectionClosed):
                    self.closing = True
                    return Closed()
        except h11.RemoteProtocolError as exc:
            self._method = ""
            return self._refuse(exc.error_status_hint, f"malformed request: {exc}")

    def _start(self, head: h11.Request) -> BadRequest | None:
        self._head = head
        self._method = head.method.decode("ascii")
        self._body.clear()
        length = _content_length(head)
        if length is not None and length > self.limits.max_body:
            return self._refuse(413, self._too_large())
        if self._h11.they_are_waiting_for_100_continue:
            self._outbox += self._h11.send(h11.InformationalResponse(status_code=100, headers=[]))
        return None

    def _too_large(self) -> str:
        return f"the request body exceeds {self.limits.max_body} bytes"

    def _refuse(self, status: int, message: str) -> BadRequest:
        self.closing = True
        self._head = None
        return BadRequest(status, message)

    def respond(self, response: Response, *, close: bool = False) -> bytes:
        """The bytes of ``response`` to the request (or ``BadRequest``) being answered; readies
        the connection for the next request, or sets ``closing``. ``close``: the connection
        closes after it in any case (it says ``Connection: close``)."""
        conn = self._h11
        self.closing = self.closing or close
        headers = [
            ("Content-Type", response.content_type),
            ("Content-Length", str(len(response.body))),
            *response.headers,
        ]
        if self.closing:
            headers.append(("Connection", "close"))
        out = conn.send(
            h11.Response(
                status_code=response.status,
                headers=headers,
                reason=_REASONS.get(response.status, "").encode(),
            )
        )
        if response.body and self._method != "HEAD":
            out += conn.send(h11.Data(data=response.body))
        out += conn.send(h11.EndOfMessage())
        if conn.our_state is h11.DONE and conn.their_state is h11.DONE and not self.closing:
            conn.start_next_cycle()
        else:
            self.closing = True
        return out

    def start_stream(
        self, status: int, content_type: str, headers: Sequence[tuple[str, str]] = ()
    ) -> bytes:
        """The head of a streamed response (server-sent events) to the request being
        answered: its body follows in ``stream_data`` pieces (chunked; to an HTTP/1.0 client,
        until the connection closes) and ends with ``end_stream``. The connection closes after
        it (``closing``): a stream is the last thing a connection carries."""
        self.closing = True
        return self._h11.send(
            h11.Response(
                status_code=status,
                headers=[("Content-Type", content_type), *headers, ("Connection", "close")],
                reason=_REASONS.get(status, "").encode(),
            )
        )

    def stream_data(self, data: bytes) -> bytes:
        """The bytes that carry ``data`` (not empty) of a streamed response."""
        return self._h11.send(h11.Data(data=data)) or b""

    def end_stream(self) -> bytes:
        """The bytes that end a streamed response."""
        return self._h11.send(h11.EndOfMessage()) or b""


def _content_length(head: h11.Request) -> int | None:
    for name, value in head.headers:
        if name == b"content-length":
            return int(value)  # h11 checked it is digits
    return None
