"""The console's consumer-group screen: a group's lag per partition in records and in time.

``/api/groups/{group}`` is REST's ``GET /consumer-groups/{group}`` (state, members, committed
offset, end offset and lag in records per partition, from ``GROUPS``) with, per partition,
``lag_ms``: how old the oldest unconsumed record is, the record at the committed offset against
now (0 when the group is caught up; None when nothing is committed or the record is gone). It
reads that one record per lagging partition through REST's read (``FETCH``: the same read path,
ACL checks and forwarding as any read), only when a group's screen asks, never in the shared
snapshot; at most ``MAX_TIME_READS`` of them per request, ``READ_PARALLEL`` at a time.

``InnerRest`` is how the console's JSON asks the REST API: a request to its very handlers, as
the caller (with the ``Authorization`` it authenticated with), so nothing is implemented twice
and a console user reads only what the principal's ACLs allow.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, Final
from urllib.parse import quote

import trio

from kafkaesque.protocol.http import Request, Response

from ._rest import Caller, RestApi
from ._rest_errors import RestError

MAX_TIME_READS: Final = 256
READ_PARALLEL: Final = 8
_BINARY: Final = "application/vnd.kafka.binary.v2+json"


def segment(text: str | bytes) -> str:
    """``text`` as one path segment (every reserved byte escaped, ``/`` too)."""
    return quote(text, safe="")


class InnerRest:
    """GETs of the REST API as ``caller`` (see the module docstring)."""

    def __init__(self, rest: RestApi, caller: Caller) -> None:
        self._rest = rest
        self._caller = caller

    async def get(self, path: str) -> tuple[Any, Response]:
        """The JSON body and the response of ``GET path`` (a REST path, its segments escaped);
        ``RestError`` (the status and message REST answered) for anything but a 200."""
        headers = [("host", "console"), ("accept", _BINARY)]
        if self._caller.authorization is not None:
            headers.append(("authorization", self._caller.authorization))
        request = Request("GET", path.encode("ascii"), tuple(headers))
        response = await self._rest.handle(request, self._caller)
        try:
            body = json.loads(response.body) if response.body else None
        except ValueError:
            body = None
        if response.status != 200:
            message = body.get("message") if isinstance(body, dict) else None
            code = body.get("code") if isinstance(body, dict) else None
            raise RestError(response.status, str(code or "ERROR"), str(message or path))
        return body, response


async def group_view(
    rest: InnerRest, group: str, *, clock: Callable[[], float] = time.time
) -> dict[str, Any]:
    """REST's description of ``group`` with ``lag_ms`` (and ``oldest_unconsumed_ms``, the
    record's timestamp) per partition (see the module docstring)."""
    body, _ = await rest.get(f"/consumer-groups/{segment(group)}")
    rows = [(t["topic"], p) for t in body["topics"] for p in t["partitions"]]
    await add_lag_times(rest, rows, clock)
    return dict(body)


async def add_lag_times(
    rest: InnerRest,
    rows: list[tuple[str, dict[str, Any]]],
    clock: Callable[[], float] = time.time,
) -> None:
    """Set ``lag_ms`` and ``oldest_unconsumed_ms`` on each (topic, REST lag row): one record
    read per lagging partition, the first ``MAX_TIME_READS`` of them (the others get None)."""
    limiter = trio.CapacityLimiter(READ_PARALLEL)
    now_ms = int(clock() * 1000)
    reads = 0

    async def oldest(topic: str, row: dict[str, Any]) -> None:
        async with limiter:
            path = (
                f"/topics/{segment(topic)}/partitions/{int(row['partition'])}/records"
                f"?offset={int(row['committed_offset'])}&max_bytes=1"
            )
            try:
                records, _ = await rest.get(path)
            except RestError:  # gone (retention), no leader now: unknown, not an error
                return
        first = next((r for r in records if r["offset"] >= row["committed_offset"]), None)
        if first is not None and first["timestamp"]:
            row["oldest_unconsumed_ms"] = first["timestamp"]
            row["lag_ms"] = max(0, now_ms - int(first["timestamp"]))

    async with trio.open_nursery() as nursery:
        for topic, row in rows:
            row["lag_ms"] = row["oldest_unconsumed_ms"] = None
            lag = row.get("lag")
            if lag is None:
                continue
            if lag == 0:
                row["lag_ms"] = 0
            elif reads < MAX_TIME_READS:
                reads += 1
                nursery.start_soon(oldest, topic, row)
