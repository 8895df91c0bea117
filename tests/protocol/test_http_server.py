"""The HTTP/1.1 server codec, with h11 on the client side too: no sockets."""

from __future__ import annotations

import h11
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafkaesque.protocol.http import (
    NEED_DATA,
    BadRequest,
    BadTarget,
    Closed,
    HttpLimits,
    HttpServerConnection,
    Request,
    Response,
    parse_target,
)


def _client_bytes(*requests: tuple[str, str, bytes]) -> bytes:
    """The bytes an h11 client sends for ``(method, target, body)`` requests, pipelined."""
    out = b""
    for method, target, body in requests:
        client = h11.Connection(h11.CLIENT)
        headers = [("Host", "x"), ("Content-Length", str(len(body)))]
        out += client.send(h11.Request(method=method, target=target, headers=headers))
        out += client.send(h11.Data(data=body)) if body else b""
        out += client.send(h11.EndOfMessage())
    return out


def _events(server: HttpServerConnection) -> list[object]:
    events: list[object] = []
    while (event := server.next_event()) is not NEED_DATA:
        events.append(event)
    return events


def _responses(data: bytes) -> list[tuple[int, bytes]]:
    """``(status, body)`` of every response in ``data``, read by an h11 client."""
    client = h11.Connection(h11.CLIENT)
    found: list[tuple[int, bytes]] = []
    client.receive_data(data)
    status, body = 0, b""
    while True:
        if client.our_state is h11.IDLE:  # pretend each request was sent (h11 needs it)
            client.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
            client.send(h11.EndOfMessage())
        event = client.next_event()
        if event is h11.NEED_DATA or isinstance(event, h11.ConnectionClosed):
            return found
        if isinstance(event, h11.Response):
            status, body = event.status_code, b""
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            found.append((status, body))
            if client.our_state is h11.DONE and client.their_state is h11.DONE:
                client.start_next_cycle()
            else:
                return found


def test_pipelined_keep_alive_requests_are_answered_in_order() -> None:
    server = HttpServerConnection()
    server.feed(_client_bytes(("GET", "/a", b""), ("POST", "/b", b"body"), ("GET", "/c", b"")))
    out = b""
    seen = []
    for _ in range(10):
        events = _events(server)
        if not events:
            break
        for event in events:
            assert isinstance(event, Request)
            seen.append((event.method, event.target, event.body))
            out += server.respond(Response(200, event.target))
    assert seen == [("GET", b"/a", b""), ("POST", b"/b", b"body"), ("GET", b"/c", b"")]
    assert _responses(out) == [(200, b"/a"), (200, b"/b"), (200, b"/c")]
    assert not server.closing and server.idle


def test_a_request_split_at_every_byte_is_the_same_request() -> None:
    data = _client_bytes(("POST", "/topics/t?x=1", b'{"records": []}'))
    server = HttpServerConnection()
    events: list[object] = []
    for i in range(len(data)):
        server.feed(data[i : i + 1])
        events += _events(server)
    assert events == [
        Request(
            "POST",
            b"/topics/t?x=1",
            (("host", "x"), ("content-length", "15")),
            b'{"records": []}',
        )
    ]


@pytest.mark.parametrize(
    "data",
    [
        b"GARBAGE\r\n\r\n",
        b"GET / HTTP/1.1\r\nno colon here\r\n\r\n",
        b"GET / HTTP/1.1\r\n\r\n",  # HTTP/1.1 requires Host
        b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    ],
)
def test_a_malformed_request_is_answered_400_and_the_connection_closes(data: bytes) -> None:
    server = HttpServerConnection()
    server.feed(data)
    events = _events(server)
    assert len(events) == 1 and isinstance(events[0], BadRequest), events
    assert events[0].status == 400
    out = server.respond(Response(events[0].status, b"bad"))
    assert out.startswith(b"HTTP/1.1 400 ") and b"connection: close" in out.lower()
    assert server.closing
    assert _events(server) == []


def test_a_body_over_the_cap_is_refused_413_before_it_is_read() -> None:
    server = HttpServerConnection(HttpLimits(max_body=10))
    server.feed(b"POST /t HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\n")
    events = _events(server)
    assert events == [BadRequest(413, "the request body exceeds 10 bytes")]
    out = server.respond(Response(413))
    assert out.startswith(b"HTTP/1.1 413 ") and server.closing


def test_a_chunked_body_growing_over_the_cap_is_refused_413() -> None:
    server = HttpServerConnection(HttpLimits(max_body=10))
    server.feed(b"POST /t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    server.feed(b"6\r\nabcdef\r\n")
    assert _events(server) == []
    server.feed(b"6\r\nabcdef\r\n")
    events = _events(server)
    assert len(events) == 1 and isinstance(events[0], BadRequest) and events[0].status == 413


def test_a_body_at_the_cap_is_taken() -> None:
    server = HttpServerConnection(HttpLimits(max_body=10))
    server.feed(_client_bytes(("POST", "/t", b"0123456789")))
    (event,) = _events(server)
    assert isinstance(event, Request) and event.body == b"0123456789"


def test_a_head_over_the_cap_is_refused_431() -> None:
    server = HttpServerConnection(HttpLimits(max_head=200))
    server.feed(b"GET / HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 300)
    (event,) = _events(server)
    assert isinstance(event, BadRequest) and event.status == 431


def test_idle_tells_between_requests_from_inside_one() -> None:
    server = HttpServerConnection()
    assert server.idle
    server.feed(b"GET / HT")
    assert _events(server) == [] and not server.idle


def test_expect_100_continue_is_answered() -> None:
    server = HttpServerConnection()
    server.feed(b"POST /t HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n")
    assert _events(server) == []
    assert server.data_to_send().startswith(b"HTTP/1.1 100 ")
    server.feed(b"hi")
    (event,) = _events(server)
    assert isinstance(event, Request) and event.body == b"hi"


def test_the_end_of_the_stream_between_requests_is_closed() -> None:
    server = HttpServerConnection()
    server.feed(b"")
    assert _events(server) == [Closed()]


def test_a_head_request_gets_headers_without_the_body() -> None:
    server = HttpServerConnection()
    server.feed(_client_bytes(("HEAD", "/", b"")))
    (event,) = _events(server)
    assert isinstance(event, Request) and event.method == "HEAD"
    out = server.respond(Response(200, b"12345"))
    assert out.endswith(b"\r\n\r\n") and b"content-length: 5" in out.lower()


def test_targets_are_split_and_decoded() -> None:
    target = parse_target(b"/topics/a%2Fb/latest/k%C3%A9y/?offset=5&x=&offset=6")
    assert target.segments == ("topics", "a/b", "latest", "kéy")
    assert target.raw_segments[3] == "kéy".encode()
    assert target.query == {"offset": "6", "x": ""}
    with pytest.raises(BadTarget):
        parse_target(b"*")
    with pytest.raises(BadTarget):
        parse_target(b"/a%FF")


@given(st.binary(max_size=300), st.integers(min_value=1, max_value=50))
def test_no_bytes_crash_the_codec(data: bytes, step: int) -> None:
    server = HttpServerConnection(HttpLimits(max_head=256, max_body=64))
    for i in range(0, len(data), step):
        server.feed(data[i : i + step])
        for event in _events(server):
            if isinstance(event, Request | BadRequest):
                server.respond(Response(400 if isinstance(event, BadRequest) else 200))
