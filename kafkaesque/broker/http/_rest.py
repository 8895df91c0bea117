"""The REST API (docs/http.md): Confluent REST Proxy v2 shapes, each call one line-protocol
command given to the broker's command handler.

Every call becomes the command it stands for (PUBB, FETCH, LATEST, TOPICS, DESCRIBE,
METADATA), dispatched with the connection's ``Session`` exactly as a line is, so the ACL
checks, forwarding to leaders, metrics and error codes are the line protocol's; the reply is
read back with the client's ``ReplyDecoder``. What this module adds is HTTP's: authentication
by HTTP Basic (PLAIN's check, so over TLS only), content negotiation, and the JSON shapes.

A produce request is checked whole before anything is written: a bad record (bad base64, a
partition the topic lacks, a wrong shape) refuses the request and writes nothing. Its records
go as one batch per partition, so each partition's records are written together or not at all;
each record's report says which.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import time
from dataclasses import dataclass
from typing import Any, Final

import trio

from kafkaesque.protocol import (
    Acks,
    AclOperation,
    AclResource,
    BrokerRow,
    Command,
    DataReply,
    DescribeTopic,
    ErrorCode,
    ErrorReply,
    Fetch,
    FetchFormat,
    Idempotence,
    Latest,
    LineLimits,
    ListTopics,
    MessageRow,
    Metadata,
    OkReply,
    PartitionRow,
    PublishBatch,
    RemoteProtocolError,
    Reply,
    ReplyDecoder,
    TopicRow,
    parse_published_reply,
)
from kafkaesque.protocol.http import BadTarget, Request, Response, Target, parse_target
from kafkaesque.storage import InvalidBatchError, Record, build_batch, data_raw_records

from .._access import AccessControl
from .._errors import RequestError
from .._session import Session
from ._openapi import openapi_document
from ._rest_admin import RestAdmin
from ._rest_consumers import RestConsumers
from ._rest_errors import ORDINAL as _ORDINAL
from ._rest_errors import RestError
from ._rest_errors import allow as _allow
from ._rest_errors import bad as _bad
from ._rest_errors import to_json as _json
from ._wiring import HttpWiring

log = logging.getLogger("kafkaesque.broker.http")

BINARY: Final = "application/vnd.kafka.binary.v2+json"
JSON_FORMAT: Final = "application/vnd.kafka.json.v2+json"
V2: Final = "application/vnd.kafka.v2+json"
_EMBEDDED: Final = {BINARY: "binary", JSON_FORMAT: "json"}
_ACCEPT_ANY: Final = ("", "*/*", "application/*", "application/json", V2)
_MAX_FETCH_BYTES: Final = 8 * 1024 * 1024
_MAX_WAIT_MS: Final = 30_000
_REPLY_LIMITS: Final = LineLimits(max_line_length=32 * 1024 * 1024, max_payload=64 * 1024 * 1024)
_RECORD_FIELDS: Final = frozenset({"key", "value", "partition", "headers"})
_REALM: Final = 'Basic realm="kafkaesque", charset="UTF-8"'


class Caller:
    """One HTTP connection's caller: its ``Session`` (who it is, for the ACL checks) and the
    ``Authorization`` value that authenticated it (a later request with the same one is not
    checked again: a password check costs a key derivation)."""

    __slots__ = ("authorization", "session")

    def __init__(self, session: Session) -> None:
        self.session = session
        self.authorization: str | None = None


@dataclass(frozen=True, slots=True)
class _Produced:
    """A record to publish, decoded and placed: its partition and its index in the request."""

    index: int
    partition: int
    record: Record


class RestApi:
    """Answers REST requests (see the module docstring); ``handle`` never raises."""

    def __init__(self, wiring: HttpWiring) -> None:
        self._w = wiring
        self._openapi = _json(openapi_document())
        self._consumers = RestConsumers(
            self._call, self._rows, wiring.metadata, wiring.access.check_operation
        )
        self._admin = RestAdmin(self._call, self._rows)

    async def handle(self, request: Request, caller: Caller) -> Response:
        """The response to ``request`` from ``caller``'s connection."""
        try:
            target = parse_target(request.target)
            await self.authenticate(request, caller)
            return await self._route(request, target, caller.session)
        except BadTarget as exc:
            return _bad(str(exc), 400).response()
        except RestError as exc:
            return exc.response()
        except Exception:  # a bug: answer it, log it, keep serving
            log.exception("REST %s %r failed", request.method, request.target[:200])
            return RestError(500, "INTERNAL", "internal error (logged)").response()

    async def call(self, command: Command, session: Session | None) -> list[Reply]:
        """``command``'s replies as a line of ``session``'s would get them (the console's
        reads beyond REST's: the same handler, ACL checks and forwarding)."""
        return await self._call(command, session)

    # -- authentication -------------------------------------------------------------------------

    @property
    def access(self) -> AccessControl:
        """The broker's access control (who a session is, what it may do)."""
        return self._w.access

    async def authenticate(self, request: Request, caller: Caller) -> None:
        """HTTP Basic against the users file (PLAIN's check: over TLS only); nothing to do on a
        broker without one. Raises ``RestError`` 401."""
        access = self._w.access
        if access.users is None:
            return
        authorization = request.header("authorization")
        if authorization is not None and authorization == caller.authorization:
            return
        if authorization is None or not authorization[:6].lower() == "basic ":
            raise RestError(
                401,
                "AUTH_FAILED",
                "this broker requires HTTP Basic authentication (over HTTPS)",
                detail=_ORDINAL[ErrorCode.AUTH_FAILED],
                headers=[("WWW-Authenticate", _REALM)],
            )
        try:
            user, _, password = base64.b64decode(
                authorization[6:].strip(), validate=True
            ).partition(b":")
        except (binascii.Error, ValueError):
            user, password = b"", b""
        session = caller.session
        caller.authorization = None
        session.principal = None
        step = await access.sasl_step(session, "PLAIN", b"\0" + user + b"\0" + password)
        if step.failure is not None:
            raise RestError(
                401,
                "AUTH_FAILED",
                step.failure,
                detail=_ORDINAL[ErrorCode.AUTH_FAILED],
                headers=[("WWW-Authenticate", _REALM)],
            )
        caller.authorization = authorization

    # -- routing --------------------------------------------------------------------------------

    async def _route(self, request: Request, target: Target, session: Session) -> Response:
        method = "GET" if request.method == "HEAD" else request.method
        if (answer := await self._admin.route(method, request, target, session)) is not None:
            return answer
        match target.segments:
            case ("openapi.json",):
                _allow(method, "GET")
                return Response(200, self._openapi)
            case ("topics",):
                _allow(method, "GET", "POST")
                return await self._list_topics(session)
            case ("topics", topic):
                _allow(method, "GET", "POST", "PATCH", "DELETE")
                if method == "POST":
                    return await self._produce(request, target, topic, None, session)
                return await self._describe(topic, session)
            case ("topics", topic, "partitions", partition):
                _allow(method, "POST")
                return await self._produce(request, target, topic, _partition(partition), session)
            case ("topics", topic, "partitions", partition, "records"):
                _allow(method, "GET")
                return await self._records(request, target, topic, _partition(partition), session)
            case ("topics", topic, "latest", _):
                _allow(method, "GET")
                return await self._latest(request, topic, target.raw_segments[3], session)
            case ("brokers",):
                _allow(method, "GET")
                return await self._brokers(session)
            case ("consumers", *_):
                return await self._consumers.route(method, request, target, session)
        raise RestError(404, "NOT_FOUND", f"no such resource: {'/' + '/'.join(target.segments)}")

    # -- the line protocol underneath -----------------------------------------------------------

    async def _call(self, command: Command, session: Session | None) -> list[Reply]:
        """``command``'s replies, dispatched as a line of ``session``'s would be (None: the
        broker's own command, not checked against the ACLs)."""
        async with trio.open_nursery() as nursery:
            slot = self._w.dispatch(command, nursery, session)
            await slot.wait()
            data = slot.encode()
        return _decode(data)

    async def _rows(self, command: Command, session: Session | None) -> list[Reply]:
        """A list reply's rows (without its ``+END``); ``RestError`` for an error reply."""
        replies = await self._call(command, session)
        if replies and isinstance(replies[0], ErrorReply):
            raise RestError.of(replies[0])
        return replies[:-1]

    # -- produce --------------------------------------------------------------------------------

    async def _produce(
        self,
        request: Request,
        target: Target,
        topic: str,
        partition: int | None,
        session: Session,
    ) -> Response:
        embedded = _EMBEDDED.get(_media_type(request.header("content-type")))
        if embedded is None:
            raise RestError(
                415,
                "UNSUPPORTED_MEDIA_TYPE",
                f"Content-Type must be {BINARY} or {JSON_FORMAT}",
            )
        document = _produce_document(request.body)
        records = document["records"]
        acks = _acks(target.query)
        producer = _idempotence_of(document, partition)
        info = self._w.metadata.view.topics.get(topic)
        if info is None:
            try:  # as PUBB is: one who may not write hears 403, topic or not
                self._w.access.check_operation(
                    session, AclOperation.WRITE, AclResource.TOPIC, topic
                )
            except RequestError as exc:
                raise RestError.of(exc.reply()) from exc
            raise RestError.of(ErrorReply(ErrorCode.UNKNOWN_TOPIC, f"topic {topic} does not exist"))
        count = info.config.partitions
        now = int(time.time() * 1000)
        placed: list[_Produced] = []
        for index, raw in enumerate(records):
            key, value, headers, asked = _decode_record(raw, index, embedded)
            if partition is not None:
                if asked is not None and asked != partition:
                    raise _bad(f"records[{index}].partition is {asked}, the path's {partition}")
                asked = partition
            try:
                chosen = self._w.partitioner.choose(topic, count, key, asked)
            except RequestError as exc:
                raise RestError.of(exc.reply()) from exc
            placed.append(_Produced(index, chosen, Record(value, key, headers, timestamp=now)))
        by_partition: dict[int, list[_Produced]] = {}
        for produced in placed:
            by_partition.setdefault(produced.partition, []).append(produced)
        reports: list[dict[str, Any]] = [{} for _ in placed]
        first_error: ErrorReply | None = None

        async def publish(p: int, group: list[_Produced]) -> None:
            nonlocal first_error
            if producer is None:
                batch = build_batch([g.record for g in group])
            else:
                batch = build_batch(
                    [g.record for g in group],
                    producer_id=producer.producer_id,
                    producer_epoch=producer.epoch,
                    base_sequence=producer.sequence,
                )
            replies = await self._call(PublishBatch(topic, p, batch, acks), session)
            reply = replies[0] if replies else ErrorReply(ErrorCode.INTERNAL, "no reply")
            if isinstance(reply, OkReply):
                _, base = parse_published_reply(reply)
                for i, g in enumerate(group):
                    reports[g.index] = {"partition": p, "offset": base + i}
                return
            if not isinstance(reply, ErrorReply):
                reply = ErrorReply(ErrorCode.INTERNAL, f"unexpected reply {reply!r}")
            first_error = first_error or reply
            error = RestError.of(reply)
            for g in group:
                reports[g.index] = {
                    "partition": p,
                    "offset": None,
                    "error_code": error.error_code,
                    "error": reply.message,
                    "retriable": error.retriable,
                    "maybe_applied": error.maybe_applied,
                }

        async with trio.open_nursery() as nursery:
            for p, group in by_partition.items():
                nursery.start_soon(publish, p, group)
        if first_error is not None and all(r.get("offset") is None for r in reports):
            raise RestError.of(first_error, extra={"offsets": reports})
        return Response(200, _json({"offsets": reports}), content_type=V2)

    # -- reads ----------------------------------------------------------------------------------

    async def _records(
        self, request: Request, target: Target, topic: str, partition: int, session: Session
    ) -> Response:
        embedded = _accepted(request)
        query = target.query
        if "offset" not in query:
            raise _bad("the query must give offset=N (the first offset to read)")
        offset = _int_param(query, "offset", 0, 2**63 - 1)
        assert offset is not None  # (it was given)
        max_bytes = _int_param(query, "max_bytes", 1, _MAX_FETCH_BYTES, None)
        wait_ms = _int_param(query, "timeout", 0, _MAX_WAIT_MS, None)
        replies = await self._call(
            Fetch(topic, partition, offset, max_bytes, wait_ms or None, FetchFormat.BATCH),
            session,
        )
        reply = replies[0]
        if isinstance(reply, ErrorReply):
            raise RestError.of(reply)
        if not isinstance(reply, DataReply):
            raise RestError(500, "INTERNAL", f"unexpected reply {reply!r}")
        try:
            body = _records_json(topic, partition, reply.payload, offset, embedded)
        except InvalidBatchError as exc:  # a replica's copy was bad: retry
            raise RestError(503, "INTERNAL", str(exc), retriable=True) from exc
        headers = [("Kafkaesque-Next-Offset", str(reply.next_offset))]
        if reply.high_watermark is not None:
            headers.append(("Kafkaesque-High-Watermark", str(reply.high_watermark)))
        return Response(200, body, content_type=_content_type(embedded), headers=headers)

    async def _latest(self, request: Request, topic: str, key: bytes, session: Session) -> Response:
        embedded = _accepted(request)
        rows = await self._rows(Latest(topic, key), session)
        if not rows or not isinstance(rows[0], MessageRow):
            raise RestError(404, "NO_VALUE", f"topic {topic} holds no value for this key", detail=0)
        row = rows[0]
        record = Record(row.value, row.key, offset=row.offset)
        body = _record_json(topic, row.partition, record, embedded)
        del body["timestamp"], body["headers"]  # LATEST's index keeps neither
        return Response(200, _json(body), content_type=_content_type(embedded))

    # -- metadata -------------------------------------------------------------------------------

    async def _list_topics(self, session: Session) -> Response:
        rows = await self._rows(ListTopics(), session)
        return Response(
            200, _json([r.topic for r in rows if isinstance(r, TopicRow)]), content_type=V2
        )

    async def _describe(self, topic: str, session: Session) -> Response:
        rows = await self._rows(DescribeTopic(topic), session)
        info = next((r for r in rows if isinstance(r, TopicRow)), None)
        if info is None:
            raise RestError(500, "INTERNAL", "DESCRIBE answered no topic row")
        configs: dict[str, Any] = {
            "partitions": info.partitions,
            "replication_factor": info.replication_factor,
            "retention_ms": info.retention_ms,
            "retention_bytes": info.retention_bytes,
            "compact": info.compact,
            "fsync": None if info.fsync is None else str(info.fsync),
        }
        partitions = [
            {
                "partition": r.partition,
                "leader": r.leader,
                "replicas": list(r.replicas),
                "start_offset": r.start_offset,
                "end_offset": r.end_offset,
            }
            for r in rows
            if isinstance(r, PartitionRow)
        ]
        body = {"name": info.topic, "configs": configs, "partitions": partitions}
        return Response(200, _json(body), content_type=V2)

    async def _brokers(self, session: Session) -> Response:
        rows = await self._rows(Metadata(), session)
        brokers = [r for r in rows if isinstance(r, BrokerRow)]
        body = {
            "brokers": [b.broker_id for b in brokers],
            "details": [
                {
                    "id": b.broker_id,
                    "host": b.host,
                    "port": b.port,
                    "mqtt_port": b.mqtt_port,
                    "mqtt_tls_port": b.mqtt_tls_port,
                    "mqtt_ws_port": b.mqtt_ws_port,
                    "kafka_port": b.kafka_port,
                    "http_port": b.http_port,
                }
                for b in brokers
            ],
        }
        return Response(200, _json(body), content_type=V2)


# -- helpers ------------------------------------------------------------------------------------


def _decode(data: bytes) -> list[Reply]:
    decoder = ReplyDecoder(_REPLY_LIMITS)
    decoder.feed(data)
    try:
        return list(decoder.events())
    except RemoteProtocolError as exc:  # our own handler's bytes: a bug
        raise RestError(500, "INTERNAL", f"the command's reply did not parse: {exc}") from exc


def _partition(text: str) -> int:
    if not text.isdigit() or len(text) > 9:
        raise _bad(f"a partition is a number >= 0, not {text[:40]!r}", 404)
    return int(text)


def _int_param(
    query: dict[str, str], name: str, low: int, high: int, default: int | None = 0
) -> int | None:
    text = query.get(name)
    if text is None:
        return default
    if not text.isdigit() or not low <= int(text) <= high:
        raise _bad(f"{name} must be a whole number in [{low}, {high}], not {text[:40]!r}")
    return int(text)


def _media_type(value: str | None) -> str:
    return (value or "").split(";", 1)[0].strip().lower()


def _accepted(request: Request) -> str:
    """The embedded format the client accepts: ``binary`` (also when it names none) or
    ``json``; ``RestError`` 406 for anything else."""
    accept = request.header("accept") or ""
    for choice in accept.split(","):
        media = _media_type(choice)
        if media in _EMBEDDED:
            return _EMBEDDED[media]
        if media in _ACCEPT_ANY:
            return "binary"
    raise RestError(406, "NOT_ACCEPTABLE", f"Accept must be {BINARY} or {JSON_FORMAT}")


def _content_type(embedded: str) -> str:
    return BINARY if embedded == "binary" else JSON_FORMAT


def _produce_document(body: bytes) -> dict[str, Any]:
    """A produce request's body: ``{"records": [...]}`` with at least one record, and the
    optional producer fields; 422 for anything else."""
    try:
        document = json.loads(body)
    except (UnicodeDecodeError, ValueError) as exc:
        raise _bad(f"the body is not JSON: {exc}") from exc
    if not isinstance(document, dict) or not isinstance(document.get("records"), list):
        raise _bad('the body must be {"records": [...]}')
    unknown = set(document) - {"records", *_PRODUCER_FIELDS}
    if unknown:
        raise _bad(f"the body has unknown fields: {', '.join(sorted(unknown))}")
    if not document["records"]:
        raise _bad("records is empty")
    return document


# The idempotent producer's fields of a produce body, with their bounds (Kafka's: a 64-bit id
# that is not negative, a 16-bit epoch, a 31-bit sequence).
_PRODUCER_FIELDS: Final = {
    "producer_id": (0, (1 << 63) - 1),
    "producer_epoch": (0, (1 << 15) - 1),
    "sequence": (0, (1 << 31) - 1),
}


def _idempotence_of(document: dict[str, Any], partition: int | None) -> Idempotence | None:
    """The producer identity of a produce body (all three fields or none), as ``PUB pid= epoch=
    seq=`` takes it: the partition's leader answers a retried request with the first one's
    offsets instead of writing it again. Sequences count a producer's records on one partition,
    so only a request to one partition (``/topics/{t}/partitions/{p}``) may carry them."""
    given = {name: document[name] for name in _PRODUCER_FIELDS if name in document}
    if not given:
        return None
    if len(given) < len(_PRODUCER_FIELDS):
        missing = ", ".join(sorted(set(_PRODUCER_FIELDS) - set(given)))
        raise _bad(
            f"an idempotent produce needs producer_id, producer_epoch and sequence: "
            f"{missing} missing"
        )
    for name, value in given.items():
        low, high = _PRODUCER_FIELDS[name]
        if type(value) is not int or not low <= value <= high:
            raise _bad(f"{name} must be a whole number in [{low}, {high}]")
    if partition is None:
        raise _bad(
            "sequences count a producer's records on one partition: an idempotent produce "
            "goes to /topics/{topic}/partitions/{partition}"
        )
    return Idempotence(given["producer_id"], given["producer_epoch"], given["sequence"])


def _acks(query: dict[str, str]) -> Acks:
    """``?acks=``: ``all`` or ``-1`` (the default: answered once a Raft majority has the
    records on disk), ``1`` or ``leader`` (once the leader appended them: lost if it dies before
    they commit). ``0`` is refused: an HTTP answer always waits for the write's outcome."""
    text = query.get("acks", "all")
    if text in ("all", "-1", "quorum"):
        return Acks.QUORUM
    if text in ("1", "leader"):
        return Acks.LEADER
    raise _bad(
        f"acks must be all (-1) or 1, not {text[:20]!r} (acks=0 is not offered: an HTTP answer "
        "waits for the write's outcome)"
    )


def _decode_record(
    raw: Any, index: int, embedded: str
) -> tuple[bytes | None, bytes | None, tuple[tuple[str, bytes], ...], int | None]:
    """``(key, value, headers, partition)`` of ``records[index]``; ``RestError`` 422 if bad."""
    where = f"records[{index}]"
    if not isinstance(raw, dict):
        raise _bad(f"{where} must be an object")
    unknown = set(raw) - _RECORD_FIELDS
    if unknown:
        raise _bad(f"{where} has unknown fields: {', '.join(sorted(unknown))}")
    partition = raw.get("partition")
    if partition is not None and (type(partition) is not int or not 0 <= partition < 1_000_000_000):
        raise _bad(f"{where}.partition must be a whole number >= 0")
    if embedded == "binary":
        key = _base64(raw.get("key"), f"{where}.key")
        value = _base64(raw.get("value"), f"{where}.value")
    else:
        key = _json_key(raw.get("key"))
        value = None if raw.get("value") is None else _json(raw["value"])
    return key, value, _headers(raw.get("headers"), where), partition


def _base64(value: Any, where: str) -> bytes | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise _bad(f"{where} must be a base64 string or null")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise _bad(f"{where} is not base64: {exc}") from exc


def _json_key(key: Any) -> bytes | None:
    """A key in the json format: a string is its UTF-8 text (so ``/latest/phone-1`` finds the
    key ``"phone-1"``), anything else its compact JSON."""
    if key is None:
        return None
    if isinstance(key, str):
        return key.encode()
    return _json(key)


def _headers(raw: Any, where: str) -> tuple[tuple[str, bytes], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise _bad(f'{where}.headers must be a list of {{"name": ..., "value": base64}}')
    headers = []
    for i, header in enumerate(raw):
        if (
            not isinstance(header, dict)
            or set(header) - {"name", "value"}
            or not isinstance(header.get("name"), str)
        ):
            raise _bad(f'{where}.headers[{i}] must be {{"name": string, "value": base64}}')
        value = _base64(header.get("value"), f"{where}.headers[{i}].value")
        headers.append((header["name"], value or b""))
    return tuple(headers)


def _records_json(topic: str, partition: int, payload: bytes, offset: int, embedded: str) -> bytes:
    """The JSON array of the data records of ``payload`` from ``offset`` as ``_record_json``
    shows each (the same text), written from the fields the batches hold: a read's cost is per
    record, and a ``Record`` and a dict per record were most of it. Raises what
    ``_record_json`` and ``data_raw_records`` raise."""
    head = f'{{"topic":{_text(topic)},"partition":{partition},"offset":'
    rows = []
    for header, (delta, ts_delta, key, value, headers) in data_raw_records(payload, offset):
        at = header.base_offset + delta
        if embedded == "binary":
            key_text, value_text = _b64_json(key), _b64_json(value)
        else:
            key_text = "null" if key is None else _text(key.decode("utf-8", "replace"))
            value_text = "null"
            if value is not None:
                value_text = _json(_json_value(topic, partition, at, value)).decode()
        names = ",".join(
            f'{{"name":{_text(name.decode("utf-8", "replace"))},"value":{_b64_json(data)}}}'
            for name, data in headers
        )
        rows.append(
            f'{head}{at},"timestamp":{header.first_timestamp + ts_delta},"key":{key_text},'
            f'"value":{value_text},"headers":[{names}]}}'
        )
    return ("[" + ",".join(rows) + "]").encode()


def _text(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _b64_json(data: bytes | None) -> str:
    return "null" if data is None else f'"{binascii.b2a_base64(data, newline=False).decode()}"'


def _json_value(topic: str, partition: int, offset: int, value: bytes) -> Any:
    """A value in the json format: what its JSON text says (406 when it is not JSON)."""
    try:
        return json.loads(value)
    except (UnicodeDecodeError, ValueError) as exc:
        raise RestError(
            406,
            "NOT_JSON",
            f"the record at {topic}/{partition} offset {offset} is not JSON; "
            f"read it with Accept: {BINARY}",
        ) from exc


def _record_json(topic: str, partition: int, record: Record, embedded: str) -> dict[str, Any]:
    """A record as the REST API shows it, its key and value in ``embedded`` format."""
    if embedded == "binary":
        key: Any = _b64(record.key)
        value: Any = _b64(record.value)
    else:
        key = None if record.key is None else record.key.decode("utf-8", "replace")
        value = (
            None
            if record.value is None
            else _json_value(topic, partition, record.offset, record.value)
        )
    return {
        "topic": topic,
        "partition": partition,
        "offset": record.offset,
        "timestamp": record.timestamp,
        "key": key,
        "value": value,
        "headers": [{"name": n, "value": _b64(v)} for n, v in record.headers],
    }


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")
