"""The REST API's admin calls (docs/http.md "Admin"): topics (create, alter, delete), consumer
groups (list, describe, lags, reset with a dry-run preview, delete) and ACLs (list, add, remove).

Each call is the line-protocol command it stands for (CREATE, ALTER, DELETE, GROUPS, OFFSETS,
RESETOFFSETS, COMMIT, DELGROUP, ACL): the JSON is turned into the command's *line*, and that
line is read by the line protocol's own ``LineDecoder``, so a name, a number or an enum is
checked by exactly the rules a typed line meets (nothing is validated twice, differently). A
value with a space or a control character could split into two words of the line, so such a
value is refused (422) before the line is built. The command then goes through the handler
with the connection's ``Session`` (``call``/``rows``, given by ``RestApi``): ACLs, forwarding
and error codes are the line protocol's.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Awaitable, Callable
from typing import Any, Final

from kafkaesque.protocol import (
    NEED_DATA,
    AclAdd,
    AclRow,
    BadCommand,
    Command,
    ErrorCode,
    ErrorReply,
    GroupRow,
    GroupStateRow,
    LineDecoder,
    MemberRow,
    OffsetRow,
    OkReply,
    PartitionRow,
    Reply,
)
from kafkaesque.protocol.http import Request, Response, Target

from .._session import Session
from ._rest_errors import RestError, allow, bad, to_json

Call = Callable[[Command, Session], Awaitable[list[Reply]]]
"""``RestApi``'s ``_call`` (a command's replies) or ``_rows`` (a list's rows, errors raised)."""

V2: Final = "application/vnd.kafka.v2+json"

# Topic configs as Kafka names them -> the CREATE/ALTER option they set.
_CONFIGS: Final = {
    "retention.ms": "retention_ms",
    "retention.bytes": "retention_bytes",
    "cleanup.policy": "compact",
    "fsync": "fsync",  # ours (CREATE only): a topic's own --fsync policy
}
_ACL_FIELDS: Final = (
    "principal",
    "permission",
    "operation",
    "resource_type",
    "pattern_type",
    "resource_name",
)
_ACL_DEFAULTS: Final = {"permission": "allow", "pattern_type": "literal"}
_RESET_TO: Final = ("earliest", "latest", "offset", "datetime", "shift")


class RestAdmin:
    """Serves the admin paths; ``route`` answers them and returns None for any other path (or a
    method of a shared path, such as ``GET /topics``, that ``RestApi`` serves itself).
    ``call`` gives a command's replies, ``rows`` a list reply's rows (``RestError`` for an
    error reply); both dispatch with the session given."""

    def __init__(self, call: Call, rows: Call) -> None:
        self._call = call
        self._rows = rows

    async def route(
        self, method: str, request: Request, target: Target, session: Session
    ) -> Response | None:
        match target.segments:
            case ("topics",) if method == "POST":
                return await self._create(_body(request), session)
            case ("topics", topic) if method in ("PATCH", "DELETE"):
                if method == "DELETE":
                    await self._ok(["DELETE", topic], session)
                    return Response(204, b"")
                return await self._alter(topic, _body(request), session)
            case ("topics", topic, "configs"):
                allow(method, "POST")
                return await self._alter(topic, _body(request), session)
            case ("consumer-groups",):
                allow(method, "GET")
                return await self._groups(session)
            case ("consumer-groups", group):
                allow(method, "GET", "DELETE")
                if method == "DELETE":
                    await self._ok(["DELGROUP", group], session)
                    return Response(204, b"")
                return await self._describe_group(group, target.query.get("topic"), session)
            case ("consumer-groups", group, "lags"):
                allow(method, "GET")
                lags = await self._partitions(group, target.query.get("topic"), session)
                return _answer(200, {"group_id": group, "lags": [_lag(r) for r in lags]})
            case ("consumer-groups", group, "reset"):
                allow(method, "POST")
                return await self._reset(group, _body(request), session)
            case ("acls",):
                allow(method, "GET", "POST", "DELETE")
                if method == "GET":
                    return await self._list_acls(target.query, session)
                if method == "POST":
                    add = _command(["ACL", "ADD", *_acl_words(_acl_row(_body(request)))])
                    await self._ok(add, session)
                    assert isinstance(add, AclAdd)  # (what ACL ADD decodes to)
                    return _answer(201, _acl_json(add.acl))
                fields = _body(request) if request.body.strip() else dict(target.query)
                return await self._remove_acls(fields, session)
        return None

    # -- the line protocol underneath -----------------------------------------------------------

    async def _ok(self, command: list[str] | Command, session: Session) -> OkReply:
        """The ``+OK`` of ``command`` (or of the command its words make); ``RestError`` for
        anything else."""
        if isinstance(command, list):
            command = _command(command)
        replies = await self._call(command, session)
        reply = replies[0] if replies else ErrorReply(ErrorCode.INTERNAL, "no reply")
        if isinstance(reply, ErrorReply):
            raise RestError.of(reply)
        if not isinstance(reply, OkReply):
            raise RestError(500, "INTERNAL", f"unexpected reply {reply!r}")
        return reply

    # -- topics ---------------------------------------------------------------------------------

    async def _create(self, body: dict[str, Any], session: Session) -> Response:
        _known(body, {"topic_name", "partitions_count", "replication_factor", "configs"})
        name = _field(body, "topic_name", str)
        partitions = _field(body, "partitions_count", int)
        replication = _field(body, "replication_factor", int)
        options = _options(body.get("configs"), create=True)
        await self._ok(["CREATE", name, str(partitions), str(replication), *options], session)
        body = {
            "topic_name": name,
            "partitions_count": partitions,
            "replication_factor": replication,
            "configs": _configs_of(body.get("configs")),
        }
        return _answer(201, body)

    async def _alter(self, topic: str, body: dict[str, Any], session: Session) -> Response:
        _known(body, {"partitions_count", "configs"})
        options = _options(body.get("configs"), create=False)
        if "partitions_count" in body:
            options.insert(0, f"partitions={_field(body, 'partitions_count', int)}")
        if not options:
            raise bad("nothing to change: give partitions_count or configs")
        await self._ok(["ALTER", topic, *options], session)
        changed = _configs_of(body.get("configs"))
        if "partitions_count" in body:
            changed["partitions_count"] = body["partitions_count"]
        return _answer(200, {"topic_name": topic, "altered": changed})

    # -- consumer groups ------------------------------------------------------------------------

    async def _groups(self, session: Session) -> Response:
        rows = await self._rows(_command(["GROUPS"]), session)
        groups: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            if isinstance(r, GroupStateRow):
                topic = {"topic": r.topic, "state": r.state, "members": r.members}
                groups.setdefault(r.group, []).append(topic)
        body = [
            {"group_id": g, "state": _state(topics), "topics": topics}
            for g, topics in sorted(groups.items())
        ]
        return _answer(200, body)

    async def _describe_group(self, group: str, topic: str | None, session: Session) -> Response:
        rows = await self._rows(_command(["GROUPS", group, *_opt(topic)]), session)
        topics: dict[str, dict[str, Any]] = {}

        def of(name: str) -> dict[str, Any]:
            return topics.setdefault(
                name, {"topic": name, "state": None, "members": [], "partitions": []}
            )

        for r in rows:
            if isinstance(r, GroupStateRow):
                of(r.topic)["state"] = r.state
            elif isinstance(r, MemberRow):
                member = {"member_id": r.member, "partitions": list(r.partitions)}
                of(r.topic)["members"].append(member)
            elif isinstance(r, GroupRow):
                of(r.topic)["partitions"].append(_lag(r))
        listed = list(topics.values())
        return _answer(200, {"group_id": group, "state": _state(listed), "topics": listed})

    async def _partitions(self, group: str, topic: str | None, session: Session) -> list[GroupRow]:
        rows = await self._rows(_command(["GROUPS", group, *_opt(topic)]), session)
        return [r for r in rows if isinstance(r, GroupRow)]

    async def _reset(self, group: str, body: dict[str, Any], session: Session) -> Response:
        """``RESETOFFSETS`` (``to``: earliest, latest, offset, datetime); ``shift`` as the CLI's
        ``--shift-by``: each partition's committed offset moved by N within its start and end,
        written as a reset to the lowest then a COMMIT forward for the others (commits only
        move forward). ``dry_run``: the same checks and answer, nothing written.

        A shift is several commands, as the CLI's is: a member joining between them makes the
        reset refuse (409); one failing among the COMMITs leaves the partitions before it moved
        (the answer is that COMMIT's error: read the group's offsets before shifting again, as a
        shift is relative)."""
        _known(body, {"topic", "to", "offset", "datetime", "shift", "dry_run"})
        topic = _field(body, "topic", str)
        to = _field(body, "to", str)
        dry_run = body.get("dry_run", False)
        if type(dry_run) is not bool:
            raise bad("dry_run must be true or false")
        if to == "shift":
            return await self._shift(group, topic, _field(body, "shift", int), dry_run, session)
        if to in ("earliest", "latest"):
            where = to
        elif to == "offset":
            where = f"offset={_field(body, 'offset', int)}"
        elif to == "datetime":
            where = f"time={_time_ms(body.get('datetime'))}"
        else:
            raise bad(f"to must be one of {', '.join(_RESET_TO)}, not {to[:40]!r}")
        rows = await self._rows(
            _command(["RESETOFFSETS", group, topic, where, *_dry(dry_run)]), session
        )
        offsets = {r.partition: r.offset for r in rows if isinstance(r, OffsetRow)}
        return _reset_answer(group, topic, dry_run, offsets)

    async def _shift(
        self, group: str, topic: str, shift: int, dry_run: bool, session: Session
    ) -> Response:
        committed = {
            r.partition: r.offset
            for r in await self._rows(_command(["OFFSETS", group, topic]), session)
            if isinstance(r, OffsetRow)
        }
        targets: dict[int, int] = {}
        for r in await self._rows(_command(["DESCRIBE", topic]), session):
            if not isinstance(r, PartitionRow):
                continue
            current = committed.get(r.partition)
            if current is None:
                raise RestError(
                    409,
                    "NO_COMMITTED_OFFSET",
                    f"group {group} has no committed offset on {topic} partition {r.partition} "
                    "to shift: reset it to earliest, latest or an offset first",
                )
            if r.start_offset is None or r.end_offset is None:
                raise RestError.of(
                    ErrorReply(
                        ErrorCode.NOT_READY, f"{topic} {r.partition}'s offsets are not known yet"
                    )
                )
            targets[r.partition] = min(max(current + shift, r.start_offset), r.end_offset)
        lowest = min(targets.values(), default=0)
        words = ["RESETOFFSETS", group, topic, f"offset={lowest}", *_dry(dry_run)]
        placed = await self._rows(_command(words), session)
        if not dry_run:
            at = {r.partition: r.offset for r in placed if isinstance(r, OffsetRow)}
            for partition, offset in sorted(targets.items()):
                here = at.get(partition)
                if here is None or here < offset:
                    await self._ok(["COMMIT", group, topic, str(partition), str(offset)], session)
        return _reset_answer(group, topic, dry_run, targets)

    # -- ACLs -----------------------------------------------------------------------------------

    async def _list_acls(self, query: dict[str, str], session: Session) -> Response:
        return _answer(200, await self._matching_acls(query, session))

    async def _matching_acls(self, query: dict[str, Any], session: Session) -> list[dict[str, str]]:
        """The ACLs (as JSON) whose fields equal every field ``query`` names (ACL LIST, then
        filtered); 422 for an unknown field."""
        unknown = set(query) - set(_ACL_FIELDS)
        if unknown:
            raise bad(f"unknown filters: {', '.join(sorted(unknown))}; filter by {_ACL_FIELDS}")
        principal = query.get("principal")
        if principal is not None and not isinstance(principal, str):
            raise bad("principal must be a string")
        rows = await self._rows(_command(["ACL", "LIST", *_opt(principal)]), session)
        acls = [_acl_json(r) for r in rows if isinstance(r, AclRow)]
        return [a for a in acls if all(a[k] == v for k, v in query.items())]

    async def _remove_acls(self, fields: dict[str, Any], session: Session) -> Response:
        """``DELETE /acls``: every ACL the filter matches (a field not given matches any, as
        Kafka's DeleteAcls filters), each removed by ``ACL REMOVE``; the answer lists them. An
        empty filter is refused: removing every ACL is said field by field, not by omission."""
        if not fields:
            raise bad(f"DELETE /acls needs a filter: one or more of {', '.join(_ACL_FIELDS)}")
        matched = await self._matching_acls(fields, session)
        removed = []
        for acl in matched:
            reply = await self._ok(["ACL", "REMOVE", *_acl_words(_acl_row(acl))], session)
            if reply.text.rpartition("=")[2] == "1":  # (0: removed meanwhile by another call)
                removed.append(acl)
        return _answer(200, {"removed": len(removed), "acls": removed})


# -- helpers ------------------------------------------------------------------------------------


def _answer(status: int, body: Any) -> Response:
    return Response(status, to_json(body), content_type=V2)


def _command(words: list[str]) -> Command:
    """The command the line ``words`` make, read by the line protocol's decoder; ``RestError``
    (422, or the decoder's code) for a word that would not stay one word, or a bad line."""
    for word in words:
        if not word or any(c.isspace() or not c.isprintable() for c in word):
            raise bad(f"{word[:60]!r} must be non-empty, without spaces or control characters")
    decoder = LineDecoder()
    decoder.feed(" ".join(words).encode() + b"\r\n")
    event = decoder.next_event()
    if isinstance(event, BadCommand):
        raise RestError.of(event.reply())
    if event is NEED_DATA:  # (the line ends with CRLF: a bug)
        raise RestError(500, "INTERNAL", f"the line {words[0]} did not decode")
    return event


def _body(request: Request) -> dict[str, Any]:
    try:
        document = json.loads(request.body or b"{}")
    except (UnicodeDecodeError, ValueError) as exc:
        raise bad(f"the body is not JSON: {exc}") from exc
    if not isinstance(document, dict):
        raise bad("the body must be a JSON object")
    return document


def _known(body: dict[str, Any], fields: set[str]) -> None:
    unknown = set(body) - fields
    if unknown:
        raise bad(f"unknown fields: {', '.join(sorted(unknown))} (known: {sorted(fields)})")


def _field(body: dict[str, Any], name: str, kind: type) -> Any:
    value = body.get(name)
    if type(value) is not kind:
        what = "a whole number" if kind is int else "a string"
        raise bad(f"{name} must be {what}")
    return value


def _dry(dry_run: bool) -> list[str]:
    return ["dry_run=yes"] if dry_run else []


def _opt(value: str | None) -> list[str]:
    return [] if value is None else [value]


def _configs_of(raw: Any) -> dict[str, str]:
    """``configs`` as ``{name: value}``: given so, or as Confluent's ``[{name, value}]``."""
    if raw is None:
        return {}
    if isinstance(raw, list):
        pairs = {}
        for item in raw:
            if not isinstance(item, dict) or set(item) != {"name", "value"}:
                raise bad('configs must be {"name": value, ...} or [{"name": ..., "value": ...}]')
            pairs[item["name"]] = item["value"]
        raw = pairs
    if not isinstance(raw, dict):
        raise bad('configs must be {"name": value, ...} or [{"name": ..., "value": ...}]')
    configs = {}
    for name, value in raw.items():
        if not isinstance(name, str) or not isinstance(value, str | int) or type(value) is bool:
            raise bad(f"config {str(name)[:60]!r} must have a string or number value")
        configs[name] = str(value)
    return configs


def _options(raw: Any, *, create: bool) -> list[str]:
    """``configs`` as CREATE's or ALTER's ``name=value`` options; ``RestError`` 422
    (``INVALID_CONFIG``) for a config we do not have."""
    options = []
    for name, value in _configs_of(raw).items():
        option = _CONFIGS.get(name)
        if option is None or (option == "fsync" and not create):
            known = [n for n in _CONFIGS if create or n != "fsync"]
            raise RestError(
                422,
                "INVALID_CONFIG",
                f"unknown config {name[:60]!r}; known: {', '.join(known)}",
            )
        if option == "compact":
            if value not in ("compact", "delete"):
                raise RestError(
                    422, "INVALID_CONFIG", f"cleanup.policy is compact or delete, not {value!r}"
                )
            value = "yes" if value == "compact" else "no"
        options.append(f"{option}={value}")
    return options


def _state(topics: list[dict[str, Any]]) -> str:
    """A group's state over its topics: ``Stable`` if it has members on any, else ``Empty``."""
    return "Stable" if any(t["state"] == "Stable" for t in topics) else "Empty"


def _lag(r: GroupRow) -> dict[str, Any]:
    # (a commit past the end, made before a truncation, is no negative lag: nothing to read)
    lag = None if r.committed is None or r.end is None else max(0, r.end - r.committed)
    return {
        "topic": r.topic,
        "partition": r.partition,
        "owner": r.owner,
        "committed_offset": r.committed,
        "end_offset": r.end,
        "lag": lag,
    }


def _time_ms(value: Any) -> int:
    """``datetime`` of a reset: milliseconds since the epoch, or ISO 8601 (with a zone)."""
    if type(value) is int and value >= 0:
        return value
    if isinstance(value, str):
        try:
            parsed = datetime.datetime.fromisoformat(value)
        except ValueError:
            parsed = None
        if parsed is not None and parsed.tzinfo is not None and parsed.year >= 1970:
            return int(parsed.timestamp() * 1000)
    raise bad(
        "datetime must be milliseconds since the epoch or ISO 8601 with a zone "
        "(2026-11-26T08:00:00Z)"
    )


def _reset_answer(
    group: str, topic: str, dry_run: bool, offsets: dict[int, int] | dict[int, int | None]
) -> Response:
    body = {
        "group_id": group,
        "topic": topic,
        "dry_run": dry_run,
        "offsets": [{"partition": p, "offset": o} for p, o in sorted(offsets.items())],
    }
    return _answer(200, body)


def _acl_row(fields: dict[str, Any]) -> dict[str, str]:
    """An ACL's six fields (permission allow and pattern_type literal unless given), as
    strings; ``RestError`` 422 for a missing or unknown one."""
    _known(fields, set(_ACL_FIELDS))
    row = {}
    for name in _ACL_FIELDS:
        value = fields.get(name, _ACL_DEFAULTS.get(name))
        if not isinstance(value, str):
            raise bad(f"an ACL needs {name} (a string)")
        row[name] = value
    return row


def _acl_words(row: dict[str, str]) -> list[str]:
    """The words of ``ACL ADD``/``REMOVE``: principal permission operation resource pattern
    name."""
    return [row[name] for name in _ACL_FIELDS]


def _acl_json(acl: AclRow) -> dict[str, str]:
    return {
        "principal": acl.principal,
        "permission": str(acl.permission),
        "operation": str(acl.operation),
        "resource_type": str(acl.resource),
        "pattern_type": str(acl.pattern),
        "resource_name": acl.name,
    }


# -- the OpenAPI paths (merged into openapi_document's) -----------------------------------------

_ERROR: Final = {
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
}
_COMMON_ERRORS: Final = (401, 403, 404, 409, 422, 500, 503, 504)


def _operation(
    summary: str,
    status: int,
    answer: dict[str, Any] | None,
    *,
    parameters: list[dict[str, Any]] | None = None,
    body: dict[str, Any] | None = None,
) -> dict[str, Any]:
    responses: dict[str, Any] = {
        str(s): {"description": "An error (docs/http.md, Errors)", **_ERROR} for s in _COMMON_ERRORS
    }
    if answer is None:
        responses[str(status)] = {"description": "Done"}
    else:
        responses[str(status)] = {"description": "Done", "content": {V2: {"schema": answer}}}
    operation: dict[str, Any] = {"summary": summary, "responses": responses}
    if parameters:
        operation["parameters"] = parameters
    if body is not None:
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": body}},
        }
    return operation


def _param(name: str, where: str, example: object, *, required: bool = True) -> dict[str, Any]:
    schema = {"type": "string", "pattern": "^[A-Za-z0-9._:*-]+$", "maxLength": 249}
    return {"name": name, "in": where, "required": required, "schema": schema, "example": example}


def _object(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = list(required)
    return schema


_INT: Final = {"type": "integer"}
_NULL_INT: Final = {"type": "integer", "nullable": True}
_STR: Final = {"type": "string"}
_CONFIGS_SCHEMA: Final = {
    "description": "retention.ms, retention.bytes, cleanup.policy (compact|delete), fsync "
    '(create only): {"name": value} or [{"name": ..., "value": ...}]',
    "oneOf": [
        {"type": "object", "additionalProperties": {}},
        {"type": "array", "items": _object({"name": _STR, "value": _STR}, ("name", "value"))},
    ],
}
_LAG: Final = _object(
    {
        "topic": _STR,
        "partition": _INT,
        "owner": {"type": "string", "nullable": True},
        "committed_offset": _NULL_INT,
        "end_offset": _NULL_INT,
        "lag": _NULL_INT,
    }
)
_ACL: Final = _object({name: _STR for name in _ACL_FIELDS})
_GROUP_TOPIC: Final = _object({"topic": _STR, "state": _STR, "members": _INT})


def add_admin_paths(paths: dict[str, Any]) -> None:
    """Add the admin operations to the OpenAPI document's ``paths`` (in place: ``/topics`` and
    ``/topics/{topic}`` are shared with ``RestApi``'s own)."""
    topic = _param("topic", "path", "phone-beats")
    group = _param("group", "path", "dashboard")
    group_topic = _param("topic", "query", "phone-beats", required=False)
    acl_filters = [_param(name, "query", None, required=False) for name in _ACL_FIELDS]
    for p in acl_filters:
        del p["example"]
    alter = _object(
        {"partitions_count": {"type": "integer", "minimum": 1}, "configs": _CONFIGS_SCHEMA}
    )
    offsets = _object(
        {
            "group_id": _STR,
            "topic": _STR,
            "dry_run": {"type": "boolean"},
            "offsets": {
                "type": "array",
                "items": _object({"partition": _INT, "offset": _NULL_INT}),
            },
        }
    )
    ours: dict[str, dict[str, Any]] = {
        "/topics": {
            "post": _operation(
                "Create a topic (CREATE)",
                201,
                _object({"topic_name": _STR, "partitions_count": _INT, "replication_factor": _INT}),
                body=_object(
                    {
                        "topic_name": _STR,
                        "partitions_count": {"type": "integer", "minimum": 1},
                        "replication_factor": {"type": "integer", "minimum": 1},
                        "configs": _CONFIGS_SCHEMA,
                    },
                    ("topic_name", "partitions_count", "replication_factor"),
                ),
            )
        },
        "/topics/{topic}": {
            "patch": _operation(
                "Alter a topic (ALTER)",
                200,
                _object({"topic_name": _STR, "altered": {"type": "object"}}),
                parameters=[topic],
                body=alter,
            ),
            "delete": _operation("Delete a topic (DELETE)", 204, None, parameters=[topic]),
        },
        "/topics/{topic}/configs": {
            "post": _operation(
                "Alter a topic's configs (ALTER)",
                200,
                _object({"topic_name": _STR, "altered": {"type": "object"}}),
                parameters=[topic],
                body=alter,
            )
        },
        "/consumer-groups": {
            "get": _operation(
                "List the consumer groups (GROUPS)",
                200,
                {
                    "type": "array",
                    "items": _object(
                        {
                            "group_id": _STR,
                            "state": _STR,
                            "topics": {"type": "array", "items": _GROUP_TOPIC},
                        }
                    ),
                },
            )
        },
        "/consumer-groups/{group}": {
            "get": _operation(
                "Describe a group: state, members, lag per partition (GROUPS group)",
                200,
                _object({"group_id": _STR, "state": _STR, "topics": {"type": "array"}}),
                parameters=[group, group_topic],
            ),
            "delete": _operation(
                "Delete an inactive group (DELGROUP)", 204, None, parameters=[group]
            ),
        },
        "/consumer-groups/{group}/lags": {
            "get": _operation(
                "A group's lag per partition (GROUPS group)",
                200,
                _object({"group_id": _STR, "lags": {"type": "array", "items": _LAG}}),
                parameters=[group, group_topic],
            )
        },
        "/consumer-groups/{group}/reset": {
            "post": _operation(
                "Reset an inactive group's offsets on a topic, or preview it (RESETOFFSETS)",
                200,
                offsets,
                parameters=[group],
                body=_object(
                    {
                        "topic": _STR,
                        "to": {"type": "string", "enum": list(_RESET_TO)},
                        "offset": {"type": "integer", "minimum": 0},
                        "datetime": {"description": "ms since the epoch or ISO 8601 with a zone"},
                        "shift": _INT,
                        "dry_run": {"type": "boolean"},
                    },
                    ("topic", "to"),
                ),
            )
        },
        "/acls": {
            "get": _operation(
                "List ACLs, filtered by any field (ACL LIST)",
                200,
                {"type": "array", "items": _ACL},
                parameters=acl_filters,
            ),
            "post": _operation(
                "Add an ACL (ACL ADD)",
                201,
                _ACL,
                body=_object(
                    {name: _STR for name in _ACL_FIELDS},
                    ("principal", "operation", "resource_type", "resource_name"),
                ),
            ),
            "delete": _operation(
                "Remove the ACLs a filter matches, given in the body or the query (a field not "
                "given matches any; ACL LIST, then ACL REMOVE of each)",
                200,
                _object({"removed": _INT, "acls": {"type": "array", "items": _ACL}}),
                parameters=acl_filters,
            ),
        },
    }
    for path, operations in ours.items():
        paths.setdefault(path, {}).update(operations)
