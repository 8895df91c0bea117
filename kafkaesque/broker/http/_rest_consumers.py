"""REST consumer instances (docs/http.md): Confluent REST Proxy v2's consumer model on our
consumer groups, served by any broker.

Our groups live at their coordinator and every broker forwards ``SUBS``, ``CONS``, ``COMMIT``,
``OFFSETS``, ``LEAVE`` and ``GROUPS`` there, so any broker can serve any instance if it can find
the instance's state. That state (its group, embedded format, ``auto.offset.reset``,
``auto.commit.enable``, the subscription id the coordinator issued for each subscribed topic, and
the position of each partition read) is one JSON record of the compacted internal topic
``__rest_consumers`` keyed ``<group>/<instance>``, read with ``LATEST`` (which reads one's own
acknowledged write, at the partition's leader) and written with ``PUBB`` after each change; a
deletion writes a tombstone. No broker keeps anything of an instance in memory: two requests of
one instance may go to two brokers, no sticky load balancer needed.

Lifetime: an instance lives until ``DELETE`` or until idle past its timeout (by default
``INSTANCE_TIMEOUT_MS``, 5 minutes, as Confluent's ``consumer.instance.timeout.ms``; the create
request's ``consumer.instance.timeout.ms`` sets one instance's), not as long as an HTTP
connection. Its
group members join with ``SUBS … session_timeout_ms=<that>`` and are not held by the connection
that sent the ``SUBS`` (its ``Session`` forgets them at once), so the coordinator expires them
once it has heard no ``CONS`` or ``COMMIT member=`` of theirs for that long; the instance is then
answered 404 (40403) and its record deleted. An instance with no subscription expires the same
time after its record was last written.

Positions: a records read sends ``CONS`` with the instance's positions (``p:o`` pairs, only for
partitions the member owns, learnt from ``GROUPS`` when it has none); a partition without one
starts at the group's committed offset, else at the log's start (``auto.offset.reset=earliest``)
or at its end at the first read (``latest``). The positions after the records returned are
saved with the instance; with ``auto.commit.enable`` they are also committed (``COMMIT …
member=``, so a member that lost the partition cannot commit it).

Concurrent requests of one instance are not serialized (as a Kafka consumer is not thread-safe):
the last write of its state wins.
"""

from __future__ import annotations

import base64
import functools
import json
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final

import trio

from kafkaesque.protocol import (
    INTERNAL_TOPIC_PREFIX,
    AclOperation,
    AclResource,
    Command,
    Commit,
    Cons,
    DescribeGroup,
    DescribeTopic,
    EndReply,
    ErrorCode,
    ErrorReply,
    FetchOffsets,
    GroupRow,
    Latest,
    Leave,
    ListTopics,
    MemberRow,
    MessageRow,
    OffsetRow,
    OkReply,
    PartitionRow,
    PublishBatch,
    Reply,
    Subs,
    TopicRow,
)
from kafkaesque.protocol.http import Request, Response, Target
from kafkaesque.storage import Record, build_batch

from .._errors import RequestError
from .._metadata import ClusterMetadata
from .._metadata_view import MetadataError, TopicConfig, TopicExistsError
from .._session import Session
from ._rest_errors import ORDINAL, RestError

STATE_TOPIC: Final = INTERNAL_TOPIC_PREFIX + "rest_consumers"
INSTANCE_TIMEOUT_MS: Final = 300_000
_MIN_TIMEOUT_MS: Final = 1_000
_MAX_TIMEOUT_MS: Final = 86_400_000
_BINARY: Final = "application/vnd.kafka.binary.v2+json"
_JSON: Final = "application/vnd.kafka.json.v2+json"
_V2: Final = "application/vnd.kafka.v2+json"
_NAME_RE: Final = re.compile(r"[A-Za-z0-9._-]{1,100}")
_MAX_TOPICS: Final = 100
_MAX_PATTERN: Final = 1000
_MAX_WAIT_MS: Final = 30_000
_DEFAULT_MAX_BYTES: Final = 1 << 20
_MAX_BYTES: Final = 8 << 20
_RETRIES: Final = 40  # retriable refusals of a state read or write (a new leader), 0.1 s apart
_RETRY_S: Final = 0.1
_INSTANCE_NOT_FOUND: Final = 40403
_INSTANCE_EXISTS: Final = 40902


Call = Callable[[Command, Session | None], Awaitable[list[Reply]]]
"""Dispatches a command as a connection's line (with its ``Session``) or as the broker's own
(None: not checked against the ACLs) and returns its replies."""
Authorize = Callable[[Session, AclOperation, AclResource, str], None]
"""Raises ``RequestError(NOT_AUTHORIZED)`` unless the session may do that (``AccessControl``)."""


@dataclass(slots=True)
class _Instance:
    """One consumer instance's state, as its ``__rest_consumers`` record holds it."""

    group: str
    name: str
    embedded: str  # "binary" or "json"
    reset: str  # "earliest" or "latest"
    auto_commit: bool
    written_ms: int
    timeout_ms: int = INSTANCE_TIMEOUT_MS
    subs: dict[str, str] = field(default_factory=dict)  # topic -> subscription id
    positions: dict[str, dict[int, int]] = field(default_factory=dict)  # topic -> p -> next
    pattern: str | None = None  # a topic_pattern subscription's regular expression

    def to_json(self) -> bytes:
        return _dumps(
            {
                "format": self.embedded,
                "reset": self.reset,
                "auto_commit": self.auto_commit,
                "written_ms": self.written_ms,
                "timeout_ms": self.timeout_ms,
                "subs": self.subs,
                "positions": {
                    t: {str(p): o for p, o in ps.items()} for t, ps in self.positions.items()
                },
                "pattern": self.pattern,
            }
        )

    @classmethod
    def from_json(cls, group: str, name: str, data: bytes) -> _Instance:
        doc = json.loads(data)
        return cls(
            group,
            name,
            doc["format"],
            doc["reset"],
            bool(doc["auto_commit"]),
            int(doc["written_ms"]),
            int(doc["timeout_ms"]),
            dict(doc["subs"]),
            {t: {int(p): int(o) for p, o in ps.items()} for t, ps in doc["positions"].items()},
            doc.get("pattern"),  # (absent from records written before patterns)
        )


class RestConsumers:
    """Serves ``/consumers/...`` (see the module docstring).

    ``call`` dispatches a command as the connection's line would be and returns its replies;
    ``rows`` the same for a list reply, raising the error answer of an error reply; ``metadata``
    creates ``__rest_consumers`` on first use; ``authorize`` checks a caller's right.

    Who may do what: an instance is its group's, so every request about one needs read on the
    group (as SUBS and CONS do), checked before its state is looked up: who may not read the
    group learns nothing of its instances. The state in ``__rest_consumers`` is the broker's own
    data, read and written without the caller's ACLs (a consumer needs no right on an internal
    topic); what the instance does with the caller's data (SUBS, CONS, COMMIT) is checked as
    the caller's."""

    def __init__(
        self,
        call: Call,
        rows: Call,
        metadata: ClusterMetadata,
        authorize: Authorize,
        instance_timeout_ms: int = INSTANCE_TIMEOUT_MS,
    ) -> None:
        self._call = call
        self._authorize = authorize
        self._rows = rows
        self._metadata = metadata
        self._timeout_ms = instance_timeout_ms
        self._creating: trio.Event | None = None

    async def route(
        self, method: str, request: Request, target: Target, session: Session
    ) -> Response:
        """The answer to ``method`` (HEAD counted as GET) on ``target``, a ``/consumers/...``
        path."""
        rest = target.segments[1:]
        match rest:
            case (group,):
                self._allow(method, "POST")
                return await self._create(request, _name(group, "group"), session)
            case (group, "instances", name):
                self._allow(method, "DELETE")
                return await self._delete(await self._load(group, name, session), session)
            case (group, "instances", name, "subscription"):
                self._allow(method, "GET", "POST", "DELETE")
                instance = await self._load(group, name, session)
                if method == "GET":
                    answer: dict[str, Any] = {"topics": sorted(instance.subs)}
                    if instance.pattern is not None:
                        answer["topic_pattern"] = instance.pattern
                    return _ok(answer)
                if method == "DELETE":
                    await self._unsubscribe(instance, session)
                    await self._save(instance, session)
                    return Response(204)
                return await self._subscribe(request, instance, session)
            case (group, "instances", name, "records"):
                self._allow(method, "GET")
                instance = await self._load(group, name, session)
                return await self._records(request, target.query, instance, session)
            case (group, "instances", name, "offsets"):
                self._allow(method, "GET", "POST")
                instance = await self._load(group, name, session)
                if method == "GET":
                    return await self._committed(request, instance, session)
                return await self._commit(request, instance, session)
            case (group, "instances", name, "positions", *where) if where in (
                [],
                ["beginning"],
                ["end"],
            ):
                self._allow(method, "POST")
                instance = await self._load(group, name, session)
                return await self._seek(request, instance, where[0] if where else None, session)
            case (group, "instances", name, "assignments"):
                self._allow(method, "GET")
                instance = await self._load(group, name, session)
                return _ok({"partitions": await self._assignments(instance, session)})
        raise RestError(404, "NOT_FOUND", f"no such resource: /consumers/{'/'.join(rest)}")

    def _allow(self, method: str, *allowed: str) -> None:
        if method not in allowed:
            raise RestError(
                405, "METHOD_NOT_ALLOWED", f"{method} is not served here: {', '.join(allowed)}"
            )

    def _bad(self, message: str) -> Exception:
        return RestError(422, "BAD_ARGS", message, detail=_BAD_ARGS)

    # -- instances ------------------------------------------------------------------------------

    def _may_read(self, group: str, session: Session) -> None:
        try:
            self._authorize(session, AclOperation.READ, AclResource.GROUP, group)
        except RequestError as exc:
            raise RestError.of(exc.reply()) from exc

    async def _create(self, request: Request, group: str, session: Session) -> Response:
        self._may_read(group, session)
        body = _body(request, self._bad, allow_empty=True) or {}
        known = {
            "name",
            "format",
            "auto.offset.reset",
            "auto.commit.enable",
            "consumer.instance.timeout.ms",
        }
        unknown = set(body) - known
        if unknown:
            raise self._bad(f"unknown fields: {', '.join(sorted(unknown))}")
        name = body.get("name")
        if name is None:
            name = f"rest-{secrets.token_hex(8)}"
        elif not isinstance(name, str) or not _NAME_RE.fullmatch(name):
            raise self._bad("name must be 1-100 of the characters A-Z a-z 0-9 . _ -")
        embedded = body.get("format", "binary")
        if embedded not in ("binary", "json"):
            raise self._bad('format must be "binary" or "json"')
        reset = body.get("auto.offset.reset", "latest")
        if reset in ("smallest", "largest"):  # the old consumer's words, which v2 accepts too
            reset = "earliest" if reset == "smallest" else "latest"
        if reset not in ("earliest", "latest"):
            raise self._bad('auto.offset.reset must be "earliest" or "latest"')
        auto_commit = body.get("auto.commit.enable", "true")
        if isinstance(auto_commit, str):
            auto_commit = auto_commit.lower()
        if auto_commit not in (True, False, "true", "false"):
            raise self._bad('auto.commit.enable must be "true" or "false"')
        timeout_ms = body.get("consumer.instance.timeout.ms", self._timeout_ms)
        if type(timeout_ms) is not int or not _MIN_TIMEOUT_MS <= timeout_ms <= _MAX_TIMEOUT_MS:
            raise self._bad(
                f"consumer.instance.timeout.ms must be a whole number in [{_MIN_TIMEOUT_MS}, "
                f"{_MAX_TIMEOUT_MS}]"
            )
        existing = await self._find(group, name)
        if existing is not None:
            raise RestError(
                409,
                "INSTANCE_EXISTS",
                f"consumer group {group} already has an instance {name}",
                detail=_INSTANCE_EXISTS % 100,
            )
        instance = _Instance(
            group, name, embedded, reset, auto_commit in (True, "true"), 0, timeout_ms
        )
        await self._save(instance, session)
        host = request.header("host") or "localhost"
        base = f"http://{host}/consumers/{group}/instances/{name}"
        return _ok({"instance_id": name, "base_uri": base})

    async def _delete(self, instance: _Instance, session: Session) -> Response:
        await self._unsubscribe(instance, session)
        await self._write(_key(instance.group, instance.name), None)
        return Response(204)

    async def _load(self, group: str, name: str, session: Session) -> _Instance:
        self._may_read(group, session)
        instance = await self._find(group, name)
        if instance is None:
            raise self._gone(group, name)
        if not instance.subs and _now_ms() - instance.written_ms > instance.timeout_ms:
            await self._write(_key(group, name), None)
            raise self._gone(group, name)
        return instance

    def _gone(self, group: str, name: str) -> Exception:
        return RestError(
            404,
            "INSTANCE_NOT_FOUND",
            f"consumer instance {name} of group {group} does not exist (deleted, or idle past "
            "its timeout)",
            detail=_INSTANCE_NOT_FOUND % 100,
        )

    async def _expired(self, instance: _Instance, session: Session) -> Exception:
        """The instance's members expired at their coordinator: it is gone; forget it."""
        await self._unsubscribe(instance, session)
        await self._write(_key(instance.group, instance.name), None)
        return self._gone(instance.group, instance.name)

    # -- subscription ---------------------------------------------------------------------------

    async def _subscribe(self, request: Request, instance: _Instance, session: Session) -> Response:
        body = _body(request, self._bad)
        if "topic_pattern" in body:
            if "topics" in body:
                raise self._bad("give topics or topic_pattern, not both")
            pattern = body["topic_pattern"]
            if not isinstance(pattern, str) or not pattern or len(pattern) > _MAX_PATTERN:
                raise self._bad(
                    f"topic_pattern must be a regular expression of 1 to {_MAX_PATTERN} characters"
                )
            try:
                re.compile(pattern)
            except re.error as exc:
                raise self._bad(f"topic_pattern is not a regular expression: {exc}") from exc
            await self._unsubscribe(instance, session)
            instance.pattern = pattern
            await self._join(instance, await self._pattern_topics(pattern, session), session)
            return Response(204)
        topics = body.get("topics")
        if (
            not isinstance(topics, list)
            or not topics
            or len(topics) > _MAX_TOPICS
            or not all(isinstance(t, str) and t for t in topics)
        ):
            raise self._bad(f'the body must be {{"topics": [1 to {_MAX_TOPICS} topic names]}}')
        await self._unsubscribe(instance, session)
        await self._join(instance, list(dict.fromkeys(topics)), session)
        return Response(204)

    async def _join(self, instance: _Instance, topics: list[str], session: Session) -> None:
        """SUBS the instance's group to each of ``topics`` and save the instance; a refusal
        leaves it subscribed to nothing (its pattern forgotten), as it is saved."""
        try:
            for topic in topics:
                await self._subs(instance, topic, session)
        except Exception:  # (not a cancellation: no await may run then)
            await self._unsubscribe(instance, session)
            await self._save(instance, session)
            raise
        await self._save(instance, session)

    async def _subs(self, instance: _Instance, topic: str, session: Session) -> None:
        replies = await self._call(
            Subs(topic, instance.group, session_timeout_ms=instance.timeout_ms), session
        )
        reply = replies[0] if replies else ErrorReply(ErrorCode.INTERNAL, "no reply")
        if isinstance(reply, ErrorReply):
            raise RestError.of(reply)
        if not isinstance(reply, OkReply) or not reply.text:
            raise RestError(500, "INTERNAL", f"SUBS answered {reply!r}")
        member = reply.text.split(None, 1)[0]
        # Not held by this HTTP connection: the instance outlives it (its own timeout).
        session.members.discard(member)
        instance.subs[topic] = member

    async def _pattern_topics(self, pattern: str, session: Session) -> list[str]:
        """The topics ``pattern`` matches whole (as Java's ``Pattern.matches``, which Kafka's
        pattern subscriptions use) among those the caller may see (``TOPICS`` filters by the
        describe right), internal topics left out (Kafka's ``exclude.internal.topics``), at
        most ``_MAX_TOPICS`` of them in name order."""
        rows = await self._rows(ListTopics(), session)
        names = sorted(r.topic for r in rows if isinstance(r, TopicRow))
        regex = re.compile(pattern)
        matched = [
            t for t in names if not t.startswith(INTERNAL_TOPIC_PREFIX) and regex.fullmatch(t)
        ]
        return matched[:_MAX_TOPICS]

    async def _follow_pattern(self, instance: _Instance, session: Session) -> None:
        """A pattern subscription follows the topics: one created since that matches is
        subscribed to, one deleted is left, as a Kafka consumer does at its metadata refresh.
        The broker's own metadata tells whether anything changed (no request when not)."""
        if instance.pattern is None:
            return
        regex = re.compile(instance.pattern)
        local = {
            t
            for t in self._metadata.view.topics
            if not t.startswith(INTERNAL_TOPIC_PREFIX) and regex.fullmatch(t)
        }
        if local == set(instance.subs):
            return
        wanted = await self._pattern_topics(instance.pattern, session)
        for topic in [t for t in instance.subs if t not in wanted]:
            await self._call(Leave(instance.subs.pop(topic)), session)
            instance.positions.pop(topic, None)
        new = [t for t in wanted if t not in instance.subs]
        for topic in new:
            await self._subs(instance, topic, session)
        await self._save(instance, session)

    async def _unsubscribe(self, instance: _Instance, session: Session) -> None:
        for member in instance.subs.values():
            await self._call(Leave(member), session)  # gone already is as good
        instance.subs.clear()
        instance.positions.clear()
        instance.pattern = None

    # -- records --------------------------------------------------------------------------------

    async def _records(
        self, request: Request, query: dict[str, str], instance: _Instance, session: Session
    ) -> Response:
        wait_ms = _int(query, "timeout", 0, _MAX_WAIT_MS, 0, self._bad)
        max_bytes = _int(query, "max_bytes", 1, _MAX_BYTES, _DEFAULT_MAX_BYTES, self._bad)
        embedded = _accepted(request, instance.embedded)
        await self._follow_pattern(instance, session)
        before = {t: dict(ps) for t, ps in instance.positions.items()}
        results: dict[str, list[Reply]] = {}
        expired = False

        async def consume(topic: str, member: str) -> None:
            nonlocal expired
            replies = await self._cons(instance, topic, member, wait_ms, session)
            if replies is None:
                expired = True
            else:
                results[topic] = replies

        await _together([functools.partial(consume, t, m) for t, m in instance.subs.items()])
        if expired:
            raise await self._expired(instance, session)
        out: list[dict[str, Any]] = []
        size = 0
        for topic in instance.subs:
            replies = results[topic]
            positions: dict[int, int] = {}
            cut: set[int] = set()
            for reply in replies:
                if isinstance(reply, MessageRow):
                    if reply.partition in cut:
                        continue
                    n = len(reply.key or b"") + len(reply.value or b"")
                    if out and size + n > max_bytes:
                        cut.add(reply.partition)
                        positions[reply.partition] = reply.offset
                        continue
                    size += n
                    out.append(_record_json(topic, reply, embedded))
                    positions[reply.partition] = reply.offset + 1
                elif isinstance(reply, EndReply):
                    for p, nxt in reply.next_offsets:
                        if p not in cut:
                            positions[p] = nxt
            instance.positions[topic] = positions
        if instance.positions != before:  # an empty poll writes nothing
            if instance.auto_commit:
                moved = {
                    t: {p: o for p, o in ps.items() if before.get(t, {}).get(p) != o}
                    for t, ps in instance.positions.items()
                }
                await self._commit_positions(instance, moved, session)
            await self._save(instance, session)
        return Response(200, _dumps(out), content_type=_BINARY if embedded == "binary" else _JSON)

    async def _cons(
        self, instance: _Instance, topic: str, member: str, wait_ms: int, session: Session
    ) -> list[Reply] | None:
        """CONS of one topic from the instance's positions; None if the member expired.

        CONS names partitions by ``p:o`` pairs and refuses one the member does not own, so with
        no position yet (or after ``NOT_ASSIGNED``: a rebalance took one) the member's partitions
        and their starts are asked of the group first (``_start``)."""
        for _ in range(3):
            positions = instance.positions.get(topic) or {}
            if not positions:
                started = await self._start(instance, topic, member, session)
                if started is None:
                    return None
                if not started:  # the member owns no partition (more members than partitions)
                    return [EndReply()]
                instance.positions[topic] = positions = started
            pairs = tuple(sorted(positions.items()))
            replies = await self._call(Cons(topic, member, pairs, None, wait_ms or None), session)
            first = replies[0] if replies else ErrorReply(ErrorCode.INTERNAL, "no reply")
            if not isinstance(first, ErrorReply):
                return replies
            if first.code is ErrorCode.UNKNOWN_SUBSCRIPTION:
                return None
            if first.code is not ErrorCode.NOT_ASSIGNED:
                raise RestError.of(first)
            instance.positions[topic] = {}
        raise RestError(503, "REBALANCING", "the group is rebalancing; retry", detail=0)

    async def _start(
        self, instance: _Instance, topic: str, member: str, session: Session
    ) -> dict[int, int] | None:
        """Where the member starts in each partition it owns: the group's committed offset,
        else the log's start (``earliest``) or end (``latest``). None if the member is gone."""
        replies = await self._call(DescribeGroup(instance.group, topic), session)
        first = replies[0] if replies else ErrorReply(ErrorCode.INTERNAL, "no reply")
        if isinstance(first, ErrorReply):
            if first.code is ErrorCode.UNKNOWN_GROUP:
                return None
            raise RestError.of(first)
        mine = [r for r in replies if isinstance(r, MemberRow) and r.member == member]
        if not mine:
            return None
        rows = {r.partition: r for r in replies if isinstance(r, GroupRow)}
        starts: dict[int, int] = {}
        for p in mine[0].partitions:
            row = rows.get(p)
            if row is not None and row.committed is not None:
                starts[p] = row.committed
            elif instance.reset == "latest" and row is not None and row.end is not None:
                starts[p] = row.end
            else:
                starts[p] = 0  # CONS reads from the log start when below it
        return starts

    async def _assignments(self, instance: _Instance, session: Session) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for topic, member in instance.subs.items():
            rows = await self._rows(DescribeGroup(instance.group, topic), session)
            mine = [r for r in rows if isinstance(r, MemberRow) and r.member == member]
            if not mine:
                raise await self._expired(instance, session)
            out += [{"topic": topic, "partition": p} for p in sorted(mine[0].partitions)]
        return out

    # -- offsets and positions ------------------------------------------------------------------

    async def _commit(self, request: Request, instance: _Instance, session: Session) -> Response:
        if not request.body.strip():
            await self._commit_positions(instance, instance.positions, session)
            return Response(204)
        wanted = _offsets(_body(request, self._bad), self._bad)
        for topic, partition, offset in wanted:
            await self._commit_one(instance, topic, partition, offset, session)
        return Response(204)

    async def _commit_positions(
        self, instance: _Instance, positions: dict[str, dict[int, int]], session: Session
    ) -> None:
        """Commit ``positions`` (topic -> partition -> offset), all at once."""
        await _together(
            [
                functools.partial(self._commit_one, instance, topic, partition, offset, session)
                for topic, offsets in positions.items()
                for partition, offset in offsets.items()
            ]
        )

    async def _commit_one(
        self, instance: _Instance, topic: str, partition: int, offset: int, session: Session
    ) -> None:
        member = instance.subs.get(topic)
        replies = await self._call(
            Commit(instance.group, topic, partition, offset, member), session
        )
        reply = replies[0] if replies else ErrorReply(ErrorCode.INTERNAL, "no reply")
        if isinstance(reply, ErrorReply):
            if reply.code is ErrorCode.OFFSET_OUT_OF_RANGE and "backwards" in reply.message:
                return  # already committed further (auto commit after a seek back): keep it
            if reply.code is ErrorCode.UNKNOWN_SUBSCRIPTION:
                raise await self._expired(instance, session)
            raise RestError.of(reply)

    async def _committed(self, request: Request, instance: _Instance, session: Session) -> Response:
        body = _body(request, self._bad, allow_empty=True)
        if body is None:
            wanted = [(t, p) for t, ps in instance.positions.items() for p in ps]
        else:
            wanted = _partitions(body, self._bad)
        committed: dict[str, dict[int, int | None]] = {}
        for topic in dict.fromkeys(t for t, _ in wanted):
            committed[topic] = {
                r.partition: r.offset
                for r in await self._rows(FetchOffsets(instance.group, topic), session)
                if isinstance(r, OffsetRow)
            }
        offsets = []
        for topic, partition in wanted:
            if partition not in committed[topic]:
                raise RestError(
                    404,
                    "UNKNOWN_PARTITION",
                    f"{topic} has no partition {partition}",
                    detail=_UNKNOWN_PARTITION,
                )
            offset = committed[topic][partition]
            offsets.append(
                {
                    "topic": topic,
                    "partition": partition,
                    "offset": -1 if offset is None else offset,
                    "metadata": "",
                }
            )
        return _ok({"offsets": offsets})

    async def _seek(
        self, request: Request, instance: _Instance, where: str | None, session: Session
    ) -> Response:
        body = _body(request, self._bad)
        if where is None:
            moves = _offsets(body, self._bad)
        else:
            wanted = _partitions(body, self._bad)
            bounds: dict[str, dict[int, tuple[int | None, int | None]]] = {}
            for topic in dict.fromkeys(t for t, _ in wanted):
                bounds[topic] = {
                    r.partition: (r.start_offset, r.end_offset)
                    for r in await self._rows(DescribeTopic(topic), session)
                    if isinstance(r, PartitionRow)
                }
            moves = []
            for topic, partition in wanted:
                start, end = bounds[topic].get(partition, (None, None))
                offset = start if where == "beginning" else end
                if offset is None:
                    raise RestError(
                        503, "NOT_READY", f"{topic}/{partition} has no bounds now; retry", detail=0
                    )
                moves.append((topic, partition, offset))
        for topic, partition, offset in moves:
            if topic not in instance.subs:
                raise RestError(
                    409,
                    "NOT_SUBSCRIBED",
                    f"the instance is not subscribed to {topic}",
                    detail=0,
                )
            instance.positions.setdefault(topic, {})[partition] = offset
        await self._save(instance, session)
        return Response(204)

    # -- the state record -----------------------------------------------------------------------

    async def _find(self, group: str, name: str) -> _Instance | None:
        # Created here if missing: this broker's view of the topics may lag the one that made
        # the instance, and "no such topic" must not read as "no such instance".
        await self._ensure_topic()
        error = ErrorReply(ErrorCode.INTERNAL, "no answer")
        for _ in range(_RETRIES):
            replies = await self._call(Latest(STATE_TOPIC, _key(group, name)), None)
            first = replies[0] if replies else ErrorReply(ErrorCode.INTERNAL, "no reply")
            if isinstance(first, ErrorReply):
                if not first.code.retriable:
                    raise RestError.of(first)
                error = first
                await trio.sleep(_RETRY_S)
                continue
            if isinstance(first, MessageRow) and first.value is not None:
                try:
                    return _Instance.from_json(group, name, first.value)
                except (ValueError, KeyError, TypeError, AttributeError) as exc:
                    raise RestError(500, "INTERNAL", f"instance record unreadable: {exc}") from exc
            return None
        raise RestError.of(error)

    async def _save(self, instance: _Instance, session: Session) -> None:
        instance.written_ms = _now_ms()
        await self._write(_key(instance.group, instance.name), instance.to_json())

    async def _write(self, key: bytes, value: bytes | None) -> None:
        await self._ensure_topic()
        batch = build_batch([Record(value, key, timestamp=_now_ms())])
        error = ErrorReply(ErrorCode.INTERNAL, "no answer")
        for _ in range(_RETRIES):
            replies = await self._call(PublishBatch(STATE_TOPIC, 0, batch), None)
            first = replies[0] if replies else ErrorReply(ErrorCode.INTERNAL, "no reply")
            if not isinstance(first, ErrorReply):
                return
            # A write whose outcome is unknown is safe to repeat: the latest record wins.
            if not (first.code.retriable or first.code.outcome_unknown):
                raise RestError.of(first)
            error = first
            await trio.sleep(_RETRY_S)
        raise RestError.of(error)

    async def _ensure_topic(self) -> None:
        """Create ``__rest_consumers`` (compacted, one partition) if it does not exist yet."""
        while STATE_TOPIC not in self._metadata.view.topics:
            if self._creating is not None:
                await self._creating.wait()
                continue
            self._creating = done = trio.Event()
            try:
                brokers = max(1, len(self._metadata.view.brokers))
                config = TopicConfig(partitions=1, replication_factor=min(3, brokers), compact=True)
                try:
                    await self._metadata.create_topic(STATE_TOPIC, config)
                except TopicExistsError:
                    pass  # another broker created it
                except MetadataError as exc:
                    raise RestError(
                        503, "NO_QUORUM", f"creating {STATE_TOPIC}: {exc}", detail=0
                    ) from exc
            finally:
                self._creating = None
                done.set()


# -- helpers ------------------------------------------------------------------------------------

_BAD_ARGS: Final = ORDINAL[ErrorCode.BAD_ARGS]
_UNKNOWN_PARTITION: Final = ORDINAL[ErrorCode.UNKNOWN_PARTITION]


async def _together(jobs: list[Callable[[], Awaitable[None]]]) -> None:
    """Run ``jobs`` concurrently; raise the first one's exception as itself (a request's error
    answer), not inside an exception group."""
    failures: list[Exception] = []

    async def run(job: Callable[[], Awaitable[None]]) -> None:
        try:
            await job()
        except Exception as exc:  # noqa: BLE001 (raised below, after the others ended)
            failures.append(exc)

    async with trio.open_nursery() as nursery:
        for job in jobs:
            nursery.start_soon(run, job)
    if failures:
        raise failures[0]


def _now_ms() -> int:
    return int(time.time() * 1000)


def _key(group: str, name: str) -> bytes:
    return f"{group}/{name}".encode()


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def _ok(value: Any) -> Response:
    return Response(200, _dumps(value), content_type=_V2)


def _name(text: str, what: str) -> str:
    if not _NAME_RE.fullmatch(text):
        raise RestError(
            422, "BAD_ARGS", f"a {what} name is 1-100 of A-Z a-z 0-9 . _ -", detail=_BAD_ARGS
        )
    return text


def _body(request: Request, bad: Callable[[str], Exception], *, allow_empty: bool = False) -> Any:
    if not request.body.strip():
        if allow_empty:
            return None
        raise bad("the request needs a JSON body")
    try:
        document = json.loads(request.body)
    except (UnicodeDecodeError, ValueError) as exc:
        raise bad(f"the body is not JSON: {exc}") from exc
    if not isinstance(document, dict):
        raise bad("the body must be a JSON object")
    return document


def _int(
    query: dict[str, str],
    name: str,
    low: int,
    high: int,
    default: int,
    bad: Callable[[str], Exception],
) -> int:
    text = query.get(name)
    if text is None:
        return default
    if not text.isdigit() or not low <= int(text) <= high:
        raise bad(f"{name} must be a whole number in [{low}, {high}], not {text[:40]!r}")
    return int(text)


def _accepted(request: Request, embedded: str) -> str:
    """The instance's format, if ``Accept`` allows it; 406 if it names another."""
    accept = request.header("accept") or ""
    wanted = _BINARY if embedded == "binary" else _JSON
    for choice in accept.split(","):
        media = choice.split(";", 1)[0].strip().lower()
        if media in ("", "*/*", "application/*", "application/json", _V2, wanted):
            return embedded
    raise RestError(406, "NOT_ACCEPTABLE", f"this instance's records are {wanted}")


def _where(item: Any, i: int, bad: Callable[[str], Exception]) -> tuple[str, int]:
    if (
        not isinstance(item, dict)
        or not isinstance(item.get("topic"), str)
        or type(item.get("partition")) is not int
        or item["partition"] < 0
    ):
        raise bad(f"item {i} must name a topic (string) and a partition (whole number >= 0)")
    return item["topic"], item["partition"]


def _partitions(body: Any, bad: Callable[[str], Exception]) -> list[tuple[str, int]]:
    items = body.get("partitions")
    if not isinstance(items, list):
        raise bad('the body must be {"partitions": [{"topic", "partition"}, ...]}')
    return [_where(item, i, bad) for i, item in enumerate(items)]


def _offsets(body: Any, bad: Callable[[str], Exception]) -> list[tuple[str, int, int]]:
    items = body.get("offsets")
    if not isinstance(items, list):
        raise bad('the body must be {"offsets": [{"topic", "partition", "offset"}, ...]}')
    out = []
    for i, item in enumerate(items):
        topic, partition = _where(item, i, bad)
        offset = item.get("offset")
        if type(offset) is not int or offset < 0:
            raise bad(f"item {i}: offset must be a whole number >= 0")
        out.append((topic, partition, offset))
    return out


def _record_json(topic: str, row: MessageRow, embedded: str) -> dict[str, Any]:
    if embedded == "binary":
        key: Any = None if row.key is None else base64.b64encode(row.key).decode("ascii")
        value: Any = None if row.value is None else base64.b64encode(row.value).decode("ascii")
    else:
        key = None if row.key is None else row.key.decode("utf-8", "replace")
        try:
            value = None if row.value is None else json.loads(row.value)
        except (UnicodeDecodeError, ValueError) as exc:
            raise RestError(
                406,
                "NOT_JSON",
                f"the record at {topic}/{row.partition} offset {row.offset} is not JSON; read it "
                'with an instance of format "binary"',
            ) from exc
    return {
        "topic": topic,
        "partition": row.partition,
        "offset": row.offset,
        "key": key,
        "value": value,
    }


# -- the OpenAPI document's part ----------------------------------------------------------------

_NAME_SCHEMA: Final = {"type": "string", "pattern": "^[A-Za-z0-9._-]{1,100}$"}
_STATUSES: Final = {
    "401": "Authentication required or failed (HTTP Basic over HTTPS)",
    "403": "Not allowed by the ACLs",
    "404": "Unknown instance (error_code 40403), topic or partition",
    "405": "Method not allowed",
    "406": "The Accept header names another format than the instance's, or a record is not JSON",
    "409": "The instance exists (40902), or a seek names a topic not subscribed",
    "413": "The request body is too large",
    "416": "A commit names an offset outside the log",
    "422": "The payload or a parameter is malformed",
    "500": "Internal error",
    "503": "Retriable: retry after the Retry-After seconds",
    "504": "Timed out: a write may or may not have been applied (maybe_applied)",
}


def _error_responses(*statuses: int) -> dict[str, Any]:
    error = {"$ref": "#/components/schemas/Error"}
    every = (401, 403, 404, 405, 413, 500, 503, 504, *statuses)
    return {
        str(s): {
            "description": _STATUSES[str(s)],
            "content": {"application/json": {"schema": error}},
        }
        for s in sorted(set(every))
    }


def _json_body(schema: dict[str, Any], required: bool = True) -> dict[str, Any]:
    return {"required": required, "content": {_V2: {"schema": schema}}}


def _object(required: list[str], **properties: Any) -> dict[str, Any]:
    return {"type": "object", "required": required, "properties": properties}


def _done(what: str) -> dict[str, Any]:
    return {"204": {"description": what}}


def consumer_paths() -> dict[str, Any]:
    """The OpenAPI 3.0 paths of ``/consumers/...`` (merged into ``openapi_document``)."""
    group = {
        "name": "group",
        "in": "path",
        "required": True,
        "schema": _NAME_SCHEMA,
        "description": "the consumer group",
        "example": "dashboards",
    }
    instance = {**group, "name": "instance", "description": "the instance id", "example": "one"}
    both = [group, instance]
    where = _object(
        ["topic", "partition"],
        topic={"type": "string", "minLength": 1},
        partition={"type": "integer", "minimum": 0, "maximum": 999999999},
    )
    offset = {**where, "required": ["topic", "partition", "offset"]}
    offset["properties"] = {**where["properties"], "offset": {"type": "integer", "minimum": 0}}
    partitions = _object(["partitions"], partitions={"type": "array", "items": where})
    offsets = _object(["offsets"], offsets={"type": "array", "items": offset})
    record = _object(
        ["topic", "partition", "offset"],
        topic={"type": "string"},
        partition={"type": "integer"},
        offset={"type": "integer"},
        key={"nullable": True},
        value={"nullable": True},
    )
    base = "/consumers/{group}/instances/{instance}"
    return {
        "/consumers/{group}": {
            "post": {
                "summary": "Create a consumer instance of the group (its state a record of "
                "__rest_consumers; served by any broker)",
                "parameters": [group],
                "requestBody": _json_body(
                    {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "name": _NAME_SCHEMA,
                            "format": {"type": "string", "enum": ["binary", "json"]},
                            "auto.offset.reset": {
                                "type": "string",
                                "enum": ["earliest", "latest"],
                            },
                            "auto.commit.enable": {"type": "string", "enum": ["true", "false"]},
                            "consumer.instance.timeout.ms": {
                                "type": "integer",
                                "minimum": _MIN_TIMEOUT_MS,
                                "maximum": _MAX_TIMEOUT_MS,
                            },
                        },
                    },
                    required=False,
                ),
                "responses": {
                    "200": {
                        "description": "The instance",
                        "content": {
                            _V2: {
                                "schema": _object(
                                    ["instance_id", "base_uri"],
                                    instance_id={"type": "string"},
                                    base_uri={"type": "string"},
                                )
                            }
                        },
                    },
                    **_error_responses(409, 422),
                },
            }
        },
        base: {
            "delete": {
                "summary": "Delete the instance (LEAVE its members)",
                "parameters": both,
                "responses": {**_done("Deleted"), **_error_responses()},
            }
        },
        f"{base}/subscription": {
            "get": {
                "summary": "The topics subscribed",
                "parameters": both,
                "responses": {
                    "200": {
                        "description": "The topics",
                        "content": {
                            _V2: {
                                "schema": _object(
                                    ["topics"],
                                    topics={"type": "array", "items": {"type": "string"}},
                                    topic_pattern={"type": "string"},
                                )
                            }
                        },
                    },
                    **_error_responses(),
                },
            },
            "post": {
                "summary": "Subscribe to topics, or to the topics a regular expression matches "
                "whole (followed as topics come and go), replacing the subscription (SUBS each)",
                "parameters": both,
                "requestBody": _json_body(
                    {
                        "oneOf": [
                            _object(
                                ["topics"],
                                topics={
                                    "type": "array",
                                    "minItems": 1,
                                    "maxItems": _MAX_TOPICS,
                                    "items": {"type": "string", "minLength": 1},
                                },
                            ),
                            _object(
                                ["topic_pattern"],
                                topic_pattern={
                                    "type": "string",
                                    "minLength": 1,
                                    "maxLength": _MAX_PATTERN,
                                },
                            ),
                        ]
                    }
                ),
                "responses": {**_done("Subscribed"), **_error_responses(422)},
            },
            "delete": {
                "summary": "Unsubscribe from every topic (LEAVE)",
                "parameters": both,
                "responses": {**_done("Unsubscribed"), **_error_responses()},
            },
        },
        f"{base}/records": {
            "get": {
                "summary": "Records from the instance's positions (CONS each topic)",
                "parameters": [
                    *both,
                    {
                        "name": "timeout",
                        "in": "query",
                        "schema": {"type": "integer", "minimum": 0, "maximum": _MAX_WAIT_MS},
                        "description": "milliseconds to wait for a first record",
                    },
                    {
                        "name": "max_bytes",
                        "in": "query",
                        "schema": {"type": "integer", "minimum": 1, "maximum": _MAX_BYTES},
                        "description": "keys and values of at most this many bytes (but one)",
                    },
                ],
                "responses": {
                    "200": {
                        "description": "The records, key and value in the instance's format",
                        "content": {
                            _BINARY: {"schema": {"type": "array", "items": record}},
                            _JSON: {"schema": {"type": "array", "items": record}},
                        },
                    },
                    **_error_responses(406, 422),
                },
            }
        },
        f"{base}/offsets": {
            "get": {
                "summary": "The group's committed offsets of the partitions read (OFFSETS); a "
                'body {"partitions": [...]} names others',
                "parameters": both,
                "responses": {
                    "200": {
                        "description": "Committed offsets (-1: none)",
                        "content": {
                            _V2: {
                                "schema": _object(
                                    ["offsets"], offsets={"type": "array", "items": offset}
                                )
                            }
                        },
                    },
                    **_error_responses(422),
                },
            },
            "post": {
                "summary": "Commit the given offsets, or without a body the positions (COMMIT)",
                "parameters": both,
                "requestBody": _json_body(offsets, required=False),
                "responses": {**_done("Committed"), **_error_responses(416, 422)},
            },
        },
        f"{base}/positions": {
            "post": {
                "summary": "Move the positions (the next records read)",
                "parameters": both,
                "requestBody": _json_body(offsets),
                "responses": {**_done("Moved"), **_error_responses(409, 422)},
            }
        },
        f"{base}/positions/beginning": {
            "post": {
                "summary": "Move the positions to the partitions' log starts (DESCRIBE)",
                "parameters": both,
                "requestBody": _json_body(partitions),
                "responses": {**_done("Moved"), **_error_responses(409, 422)},
            }
        },
        f"{base}/positions/end": {
            "post": {
                "summary": "Move the positions to the partitions' ends (DESCRIBE)",
                "parameters": both,
                "requestBody": _json_body(partitions),
                "responses": {**_done("Moved"), **_error_responses(409, 422)},
            }
        },
        f"{base}/assignments": {
            "get": {
                "summary": "The partitions the instance's members own (GROUPS)",
                "parameters": both,
                "responses": {
                    "200": {
                        "description": "The partitions",
                        "content": {_V2: {"schema": partitions}},
                    },
                    **_error_responses(),
                },
            }
        },
    }
