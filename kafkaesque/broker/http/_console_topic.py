"""The topic screen's reads beyond the REST API's (docs/console.md): a partition's first offset
at or after a time, a bounded key or value search, and the export of a range as JSON lines.

Each is line-protocol commands run as the caller's session (``RestApi.call``), so the same
handler, ACL checks, forwarding and read path as REST's reads and the line protocol's:

- ``GET /api/topics/{t}/offsets?time=MS``: ``DESCRIBE t time=MS`` (Kafka's ListOffsets by
  timestamp, through the time index): per partition the earliest offset whose record timestamp
  is >= MS (the end offset when none is);
- ``GET /api/topics/{t}/partitions/{p}/search?offset=N&q=TEXT&in=key|value|exact-key&limit=L``:
  reads forward from N (``FETCH``, a batch at a time) and keeps the records whose key or value
  holds ``q`` (or whose key is exactly ``q``). It scans at most ``limit`` records (at most
  ``SCAN_CAP``, 10,000: a search can never pin the broker) and says how many it scanned and
  where the next search would start; at most ``MATCH_CAP`` matches are returned;
- ``GET /api/topics/{t}/partitions/{p}/export?offset=N&end=M``: the records of ``[N, M)`` (at
  most ``SCAN_CAP`` of them) as JSON lines, a download (``Content-Disposition``), each line a
  record in the REST API's binary format (key, value and header values base64), the format
  ``POST /topics/{t}`` takes back.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Final

from kafkaesque.protocol import (
    DataReply,
    DescribeTopic,
    ErrorReply,
    Fetch,
    FetchFormat,
    PartitionRow,
)
from kafkaesque.protocol.http import Response, Target
from kafkaesque.storage import InvalidBatchError, Record, data_records

from ._rest import Caller, RestApi, _record_json
from ._rest_errors import RestError
from ._rest_errors import bad as _bad

SCAN_CAP: Final = 10_000
MATCH_CAP: Final = 200
_READ_BYTES: Final = 1024 * 1024  # one FETCH of a search or an export
_MAX_OFFSET: Final = 2**63 - 1
_SKIPS: Final = 64
_MATCHERS: Final[dict[str, Callable[[Record, bytes], bool]]] = {
    "key": lambda r, q: r.key is not None and q in r.key,
    "exact-key": lambda r, q: r.key == q,
    "value": lambda r, q: r.value is not None and q in r.value,
}


class TopicReads:
    """Answers the paths of the module docstring (``route``); errors are ``RestError``."""

    def __init__(self, rest: RestApi) -> None:
        self._rest = rest

    async def route(self, path: tuple[str, ...], target: Target, caller: Caller) -> Response | None:
        """The answer to ``/api/`` + ``path``, or None when the path is not one of these."""
        match path:
            case ("topics", topic, "offsets"):
                return _answer(await self.offsets_at(topic, target.query, caller))
            case ("topics", topic, "partitions", p, "search"):
                return _answer(await self.search(topic, _partition(p), target.query, caller))
            case ("topics", topic, "partitions", p, "export"):
                return await self.export(topic, _partition(p), target.query, caller)
        return None

    async def offsets_at(self, topic: str, query: dict[str, str], caller: Caller) -> dict[str, Any]:
        """Per partition, the first offset at or after ``time`` (ms since the epoch)."""
        time_ms = _int(query, "time", 0, _MAX_OFFSET)
        replies = await self._rest.call(DescribeTopic(topic, time_ms), caller.session)
        if replies and isinstance(replies[0], ErrorReply):
            raise RestError.of(replies[0])
        rows = [r for r in replies if isinstance(r, PartitionRow)]
        return {
            "time_ms": time_ms,
            "partitions": [
                {"partition": r.partition, "offset": r.time_offset, "end_offset": r.end_offset}
                for r in rows
            ],
        }

    async def search(
        self, topic: str, partition: int, query: dict[str, str], caller: Caller
    ) -> dict[str, Any]:
        """The records from ``offset`` on whose key or value matches (module docstring)."""
        start = _int(query, "offset", 0, _MAX_OFFSET)
        field = query.get("in", "value")
        matcher = _MATCHERS.get(field)
        if matcher is None:
            raise _bad(f"in= must be one of {', '.join(_MATCHERS)}, not {field[:40]!r}")
        needle = query.get("q", "").encode()
        if not needle and field != "exact-key":
            raise _bad("q= must give the text to look for")
        limit = _int(query, "limit", 1, SCAN_CAP, SCAN_CAP)
        matches: list[dict[str, Any]] = []
        found = scanned = 0
        next_offset, end_reached = start, False
        while scanned < limit:
            records, after = await self._read(topic, partition, next_offset, caller)
            if not records:
                end_reached = True
                break
            for record in records[: limit - scanned]:
                scanned += 1
                next_offset = record.offset + 1
                if matcher(record, needle):
                    found += 1
                    if len(matches) < MATCH_CAP:
                        matches.append(_record_json(topic, partition, record, "binary"))
            if scanned < limit:
                next_offset = after
        return {
            "from": start,
            "next_offset": next_offset,
            "scanned": scanned,
            "limit": limit,
            "end_reached": end_reached,
            "found": found,
            "matches": matches,
        }

    async def export(
        self, topic: str, partition: int, query: dict[str, str], caller: Caller
    ) -> Response:
        """The records of ``[offset, end)`` (at most ``SCAN_CAP``) as JSON lines."""
        start = _int(query, "offset", 0, _MAX_OFFSET)
        end = _int(query, "end", start, _MAX_OFFSET, start + SCAN_CAP)
        end = min(end, start + SCAN_CAP)
        lines: list[bytes] = []
        offset = start
        while offset < end:
            records, after = await self._read(topic, partition, offset, caller)
            if not records:
                break
            for record in records:
                if record.offset >= end:
                    break
                body = _record_json(topic, partition, record, "binary")
                lines.append(json.dumps(body, separators=(",", ":")).encode() + b"\n")
            offset = after
        name = f"{topic}-{partition}-{start}.jsonl".replace('"', "_")
        return Response(
            200,
            b"".join(lines),
            content_type="application/x-ndjson",
            headers=(
                ("Content-Disposition", f'attachment; filename="{name}"'),
                ("Cache-Control", "no-cache"),
            ),
        )

    async def _read(
        self, topic: str, partition: int, offset: int, caller: Caller
    ) -> tuple[list[Record], int]:
        """The records of one ``FETCH`` from ``offset`` (as the caller), and the next offset;
        no records: the end (or ``_SKIPS`` reads of control batches only, leaders' no-ops)."""
        for _ in range(_SKIPS):
            fetch = Fetch(topic, partition, offset, _READ_BYTES, None, FetchFormat.BATCH)
            reply = (await self._rest.call(fetch, caller.session))[0]
            if isinstance(reply, ErrorReply):
                raise RestError.of(reply)
            if not isinstance(reply, DataReply):
                raise RestError(500, "INTERNAL", f"unexpected reply {reply!r:.80}")
            try:
                records = list(data_records(reply.payload, offset))
            except InvalidBatchError as exc:  # a replica's copy was bad: retry
                raise RestError(503, "INTERNAL", str(exc), retriable=True) from exc
            if records or reply.next_offset <= offset:
                return records, max(reply.next_offset, offset)
            offset = reply.next_offset  # control batches only: nothing to show, read on
        return [], offset


def _partition(text: str) -> int:
    if not text.isdigit() or len(text) > 9:
        raise _bad(f"not a partition number: {text[:40]!r}", 404)
    return int(text)


def _int(query: dict[str, str], name: str, low: int, high: int, default: int | None = None) -> int:
    text = query.get(name)
    if text is None:
        if default is None:
            raise _bad(f"the query must give {name}=N")
        return default
    if not text.isdigit() or not low <= int(text) <= high:
        raise _bad(f"{name}= must be an integer from {low} to {high}, not {text[:40]!r}")
    return int(text)


def _answer(body: Any) -> Response:
    return Response(
        200,
        json.dumps(body, separators=(",", ":")).encode(),
        headers=(("Cache-Control", "no-cache"),),
    )
