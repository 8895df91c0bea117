"""The admin HTTP port: ``GET /metrics`` (Prometheus text format) and ``GET /healthz``.

A deliberately tiny HTTP/1.0 server on trio: one request per connection, a bounded request head
read within a timeout, no body. It serves monitoring, nothing else, so it needs no framework and
no thread. With ``--admin-tls`` the broker hands it a ``trio.SSLStream`` (HTTPS).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio

log = logging.getLogger("kafkaesque.broker.admin")

_MAX_HEAD = 8192
_READ_TIMEOUT_S = 5.0
_PROMETHEUS_TYPE = "text/plain; version=0.0.4; charset=utf-8"


Route = Callable[[], Awaitable[tuple[str, bytes]]]
"""A path's handler: ``(content type, body)``, awaited (a scrape may ask other brokers)."""


async def serve_admin_connection(stream: trio.abc.Stream, routes: dict[str, Route]) -> None:
    """Answer one request: ``await routes[path]()`` gives ``(content type, body)``."""
    try:
        head = b""
        with trio.move_on_after(_READ_TIMEOUT_S):
            while b"\r\n\r\n" not in head and b"\n\n" not in head and len(head) < _MAX_HEAD:
                data = await stream.receive_some(4096)
                if not data:
                    break
                head += data
        parts = head.split(b"\r\n", 1)[0].split()
        if len(parts) < 2 or parts[0] not in (b"GET", b"HEAD"):
            await _respond(stream, 400, "text/plain", b"bad request\n", head_only=False)
            return
        path = parts[1].decode("latin-1").split("?", 1)[0]
        route = routes.get(path)
        if route is None:
            await _respond(stream, 404, "text/plain", b"not found\n", head_only=False)
            return
        content_type, body = await route()
        await _respond(stream, 200, content_type, body, head_only=parts[0] == b"HEAD")
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return
    finally:
        await stream.aclose()


async def _respond(
    stream: trio.abc.Stream, status: int, content_type: str, body: bytes, *, head_only: bool
) -> None:
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found"}[status]
    head = (
        f"HTTP/1.0 {status} {reason}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    await stream.send_all(head if head_only else head + body)


def metrics_route(scrape: Callable[[], Awaitable[bytes]]) -> Route:
    """The ``/metrics`` route: ``await scrape()`` in the Prometheus text format."""

    async def route() -> tuple[str, bytes]:
        return _PROMETHEUS_TYPE, await scrape()

    return route


def static_route(content_type: str, body: bytes) -> Route:
    """A route that always answers ``body``."""

    async def route() -> tuple[str, bytes]:
        return content_type, body

    return route
