"""The REST listener's connection loop over trio memory streams, on trio's mock clock: the
request-head timeout (also against a client that trickles bytes), the idle timeout, the cap on
connections, pipelined requests answered in order."""

from __future__ import annotations

import base64
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import trio
import trio.testing

from kafkaesque.broker import BrokerConfig
from kafkaesque.broker._access import AccessControl
from kafkaesque.broker._session import Session
from kafkaesque.broker.http import HttpService, HttpWiring
from kafkaesque.broker.http._rest import Caller
from kafkaesque.local_cluster import write_users
from kafkaesque.protocol.http import HttpLimits
from kafkaesque.security import Authorizer, FailureLimiter, UserStore

LIMITS = HttpLimits(head_timeout_s=2.0, idle_timeout_s=30.0, max_connections=1)


def service(access: AccessControl | None = None) -> HttpService:
    # Only what these requests reach: by default no users file (the access control's ``users``).
    wiring = HttpWiring(
        config=cast(BrokerConfig, SimpleNamespace(id=1)),
        dispatch=cast(Any, None),
        metadata=cast(Any, None),
        partitioner=cast(Any, None),
        access=access or cast(Any, SimpleNamespace(users=None, check_operation=None)),
        draining=cast(Any, None),
        limits=LIMITS,
    )
    return HttpService(wiring)


async def read_all(stream: trio.abc.Stream) -> bytes:
    out = b""
    while data := await stream.receive_some(65536):
        out += data
    return out


async def exchange(
    client_sends: list[tuple[float, bytes]],
    access: AccessControl | None = None,
    session: Session | None = None,
) -> tuple[bytes, float]:
    """Serve one connection whose client sends each ``(delay, bytes)`` in turn; what the
    server sent until it closed, and when it closed."""
    server_end, client_end = trio.testing.memory_stream_pair()
    http = service(access)
    closed_at = 0.0

    async def serve() -> None:
        nonlocal closed_at
        async with server_end:
            await http._server._exchange(
                server_end, Caller(session or Session()), [], lambda: False
            )
        closed_at = trio.current_time()

    async def send() -> None:
        for delay, data in client_sends:
            await trio.sleep(delay)
            try:
                await client_end.send_all(data)
            except trio.BrokenResourceError:
                return

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        nursery.start_soon(send)
        received = await read_all(client_end)
    return received, closed_at


async def test_a_request_head_not_whole_in_time_is_answered_408(
    autojump_clock: trio.testing.MockClock,
) -> None:
    start = trio.current_time()
    received, closed = await exchange([(0, b"GET /openapi.json HT")])
    assert received.startswith(b"HTTP/1.1 408 ") and b"Connection: close\r\n" in received
    assert closed - start == LIMITS.head_timeout_s


async def test_a_client_trickling_its_head_is_cut_at_the_head_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    start = trio.current_time()
    trickle = [(0.5, bytes([b])) for b in b"GET /openapi.json HTTP/1.1\r\nHost: x\r\n"]
    received, closed = await exchange(trickle)
    assert received.startswith(b"HTTP/1.1 408 ")
    assert closed - start == 0.5 + LIMITS.head_timeout_s  # from the first byte on


async def test_an_idle_connection_is_closed_after_the_idle_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    start = trio.current_time()
    received, closed = await exchange([])
    assert received == b"" and closed - start == LIMITS.idle_timeout_s


async def test_pipelined_requests_are_answered_in_order_on_one_connection(
    autojump_clock: trio.testing.MockClock,
) -> None:
    requests = (
        b"GET /openapi.json HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET /openapi.json HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    received, _ = await exchange([(0, requests)])
    statuses = re.findall(rb"HTTP/1\.1 (\d{3}) ", received)
    assert statuses == [b"200", b"404", b"200"]


async def test_a_connection_over_the_cap_is_answered_503() -> None:
    http = service()
    http.open = LIMITS.max_connections
    server_end, client_end = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(http._serve, cast(trio.SocketStream, server_end))
        received = await read_all(client_end)
    assert received.startswith(b"HTTP/1.1 503 ") and b"Retry-After: 1" in received


async def test_basic_credentials_over_plain_http_are_refused_as_plain_is(tmp_path: Path) -> None:
    users = tmp_path / "users"
    write_users(str(users), {"alice": "alice-secret"})
    metrics = SimpleNamespace(auth_failed=lambda: None, authorization_failed=lambda op: None)
    access = AccessControl(UserStore(str(users)), Authorizer(), FailureLimiter(10, 60), metrics)
    token = base64.b64encode(b"alice:alice-secret")
    for headers in (b"", b"Authorization: Basic " + token + b"\r\n"):
        request = b"GET /openapi.json HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + headers
        received, _ = await exchange(
            [(0, request + b"\r\n")], access, access.new_session("127.0.0.1", tls=False)
        )
        assert received.startswith(b"HTTP/1.1 401 "), received
        assert b'WWW-Authenticate: Basic realm="kafkaesque"' in received
    assert b"only over TLS" in received  # the right password, but not over HTTPS
