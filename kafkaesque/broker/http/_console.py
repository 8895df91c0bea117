"""The admin port's HTTP API: ``/metrics`` and ``/healthz`` (monitoring, as ever), the web
console at ``/`` (docs/console.md) and the JSON it reads.

The console is plain HTML, CSS and JavaScript from the package's ``console/`` folder (no build
step, no library, nothing fetched from outside the machine: the page's Content-Security-Policy
allows only this origin). Its data:

- ``/api/overview``, ``/api/topics``, ``/api/topics/{t}``: the shared per-second
  ``Snapshot`` (``_snapshot``; the last two with the leaders' end offsets, also shared) and,
  for a topic, the Raft state of the groups hosted here;
- ``/api/events``: one server-sent-events stream per tab: the overview every second and the
  ``Timeline``'s events as they happen (bounded: see ``_timeline``);
- ``/api/rest/...``: the REST API itself (``RestApi``, docs/http.md) under a prefix, so what
  the console shows and does (end offsets, records, produce, groups, ACLs) goes through the very
  handlers, ACL checks and line-protocol commands REST clients use: nothing is implemented
  twice, and a console user can do only what the principal's ACLs allow;
- ``/api/mqtt``: the devices connected to this broker, the topic mapping, retained messages,
  ended persistent sessions, the counters; ``/api/mqtt/devices/{id}``: a device's log
  partitions, the groups reading them, its latest values (``_console_mqtt``);
- ``/api/groups/{g}``: REST's description of a group with each partition's lag in time too
  (``_console_groups``);
- ``/api/users``: the users file's names (read-only; for whom may describe the cluster);
- ``/api/whoami?topic=t``: who the caller is and whether it may write to ``t`` (the produce
  form is shown only then).

With a users file every ``/api`` path needs HTTP Basic (over TLS only), exactly as REST does;
``/metrics``, ``/healthz`` and the static files do not (Prometheus has no password, and the page
holds no data).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any, Final

import trio

from kafkaesque.protocol import CLUSTER_RESOURCE_NAME, AclOperation, AclResource
from kafkaesque.protocol.http import BadTarget, Request, Response, Target, parse_target
from kafkaesque.raft import Role

from .._errors import RequestError
from .._peer_views import ElectionNote
from ._console_groups import InnerRest, group_view
from ._console_mqtt import device_view, mqtt_screen
from ._console_topic import TopicReads
from ._rest import Caller, RestApi
from ._rest_errors import RestError
from ._rest_errors import allow as _allow
from ._service import Streamed
from ._snapshot import ClusterSnapshots, Snapshot, SnapshotProbes
from ._timeline import Timeline, TimelineStream, TooManyStreams

log = logging.getLogger("kafkaesque.broker.console")

Send = Callable[[bytes], Awaitable[None]]

PROMETHEUS_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
_STATIC_TYPES: Final = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".png": "image/png",
    ".svg": "image/svg+xml",
}
_SECURITY_HEADERS: Final = (
    (
        "Content-Security-Policy",
        "default-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    ),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-cache"),
)


def _load_static() -> dict[str, tuple[str, bytes]]:
    """The console's files by name (read once, when the broker starts)."""
    files: dict[str, tuple[str, bytes]] = {}
    folder = resources.files(__package__ or "kafkaesque.broker.http") / "console"
    for entry in folder.iterdir():
        suffix = "." + entry.name.rpartition(".")[2]
        if entry.is_file() and suffix in _STATIC_TYPES:
            files[entry.name] = (_STATIC_TYPES[suffix], entry.read_bytes())
    return files


class ConsoleApi:
    """Answers the admin port's requests (see the module docstring); ``handle`` never raises.

    ``rest``: the broker's REST API (its handlers and authentication). ``scrape``: the
    Prometheus text of ``/metrics``. ``probes``: what the snapshots read. ``timeline``: the
    events the streams carry (the broker adds to it too: refused logins, rebalances).
    ``period_s``: how old a snapshot may get; ``clock``: the snapshots' (wall clock) time.
    ``mqtt``: the MQTT wing's description (None: this broker has no MQTT listener), and
    ``mqtt_device`` what it knows of one device (``_console_mqtt``).
    """

    def __init__(
        self,
        rest: RestApi,
        scrape: Callable[[], Awaitable[bytes]],
        probes: SnapshotProbes,
        timeline: Timeline,
        *,
        period_s: float = 1.0,
        clock: Callable[[], float] = time.time,
        mqtt: Callable[[], dict[str, Any]] | None = None,
        mqtt_device: Callable[[str], dict[str, Any] | None] | None = None,
    ) -> None:
        self._rest = rest
        self._scrape = scrape
        self._probes = probes
        self.timeline = timeline
        self.snapshots = ClusterSnapshots(probes, timeline, period_s=period_s, clock=clock)
        self._static = _load_static()
        self._mqtt = mqtt
        self._mqtt_device = mqtt_device
        self._topic_reads = TopicReads(rest)

    async def handle(self, request: Request, caller: Caller) -> Response | Streamed:
        """The response to ``request`` from ``caller``'s connection."""
        try:
            target = parse_target(request.target)
            return await self._route(request, target, caller)
        except BadTarget as exc:
            return RestError(400, "BAD_REQUEST", str(exc)).response()
        except RestError as exc:
            return exc.response()
        except Exception:  # a bug: answer it, log it, keep serving
            log.exception("admin %s %r failed", request.method, request.target[:200])
            return RestError(500, "INTERNAL", "internal error (logged)").response()

    async def _route(self, request: Request, target: Target, caller: Caller) -> Response | Streamed:
        method = "GET" if request.method == "HEAD" else request.method
        segments = target.segments
        if segments[:2] == ("api", "rest"):
            _same_origin(request)
            rest_target = request.target[len(b"/api/rest") :] or b"/"
            return await self._rest.handle(dataclasses.replace(request, target=rest_target), caller)
        match segments:
            case ("metrics",):
                _allow(method, "GET")
                text = await self._scrape()
                snapshot = await self.snapshots.current()  # the console's, shared
                return Response(200, text + _rates(snapshot), content_type=PROMETHEUS_TYPE)
            case ("healthz",):
                _allow(method, "GET")
                return Response(200, b"ok\n", content_type="text/plain")
            case ():
                _allow(method, "GET")
                return self._file("index.html")
            case ("static", name):
                _allow(method, "GET")
                return self._file(name)
            case ("api", *rest):
                await self._rest.authenticate(request, caller)
                _allow(method, "GET")
                if request.method == "HEAD" and tuple(rest) == ("events",):
                    return Response(200, b"", content_type="text/event-stream")  # no stream
                return await self._api(tuple(rest), target, caller)
        raise RestError(404, "NOT_FOUND", f"no such resource: {'/' + '/'.join(segments)}")

    def _file(self, name: str) -> Response:
        found = self._static.get(name)
        if found is None:
            raise RestError(404, "NOT_FOUND", f"no such file: {name[:80]}")
        content_type, body = found
        return Response(200, body, content_type=content_type, headers=_SECURITY_HEADERS)

    async def _api(
        self, path: tuple[str, ...], target: Target, caller: Caller
    ) -> Response | Streamed:
        match path:
            case ("overview",):
                return _answer((await self.snapshots.current()).overview())
            case ("topics",):
                snapshot = await self.snapshots.current()
                ends = await self.snapshots.exact_ends()
                return _answer(snapshot.topics(ends, self.snapshots.group_offsets()))
            case ("topics", topic):
                return _answer(await self._topic(topic))
            case ("timeline",):
                after = target.query.get("after", "0")
                seq = int(after) if after.isdigit() else 0
                return _answer([e.json() for e in self.timeline.recent(seq)])
            case ("mqtt",):
                if self._mqtt is None:
                    return _answer({"enabled": False})
                ends = await self.snapshots.exact_ends()
                return _answer({"enabled": True, **mqtt_screen(self._mqtt(), ends)})
            case ("mqtt", "devices", client_id):
                return _answer(await self._device(client_id, caller))
            case ("groups", group):
                return _answer(await group_view(InnerRest(self._rest, caller), group))
            case ("users",):
                return _answer(self._users(caller))
            case ("whoami",):
                return _answer(self._whoami(caller, target.query.get("topic")))
            case ("events",):
                return self._events(target)
        if (answer := await self._topic_reads.route(path, target, caller)) is not None:
            return answer  # a topic's offsets by time, search, export (``_console_topic``)
        raise RestError(404, "NOT_FOUND", f"no such resource: /api/{'/'.join(path)}")

    # -- screens --------------------------------------------------------------------------------

    async def _topic(self, topic: str) -> dict[str, Any]:
        """A topic's partitions: leader, replicas and high watermark from the snapshot; term,
        commit index, log end and (where led here) each follower's lag from the Raft groups
        hosted here, read now."""
        snapshot = await self.snapshots.current()
        ends = await self.snapshots.exact_ends()
        keys = sorted(k for k in snapshot.leaders if k[0] == topic)
        if not keys:
            raise RestError(404, "UNKNOWN_TOPIC", f"topic {topic} does not exist")
        hosted = {r.id: r for r in self._probes.replicas()}
        partitions = []
        for key in keys:
            row: dict[str, Any] = {
                "partition": key[1],
                "leader": snapshot.leaders[key],
                "replicas": list(snapshot.replicas.get(key, ())),
                "end_offset": ends.get(key),
                "term": None,
                "commit_index": None,
                "log_end": None,
                "followers": None,
                "under_replicated": key in snapshot.under_replicated,
                "election": _note_json(self._probes.election(f"{topic}/{key[1]}")),
            }
            replica = hosted.get(f"{topic}/{key[1]}")
            if replica is not None:
                node = replica.node
                row.update(
                    term=node.term,
                    commit_index=replica.commit_index,
                    log_end=replica.log.log_end_offset,
                )
                if node.role is Role.LEADER:
                    status = node.status()
                    row["followers"] = {
                        str(peer): status.last_index - progress.match
                        for peer, progress in sorted(status.progress.items())
                        if peer != status.id
                    }
            partitions.append(row)
        return {"name": topic, "seen_by": snapshot.broker_id, "partitions": partitions}

    async def _device(self, client_id: str, caller: Caller) -> dict[str, Any]:
        device = None if self._mqtt_device is None else self._mqtt_device(client_id)
        if device is None:
            raise RestError(404, "NOT_FOUND", f"this broker knows no MQTT device {client_id[:80]}")
        return await device_view(InnerRest(self._rest, caller), device)

    def _users(self, caller: Caller) -> dict[str, Any]:
        """The users file's names (never their keys), for whom may describe the cluster (as
        ``ACL LIST`` needs); ``users`` None: the broker has no users file (open)."""
        access = self._rest.access
        try:
            access.check_operation(
                caller.session, AclOperation.DESCRIBE, AclResource.CLUSTER, CLUSTER_RESOURCE_NAME
            )
        except RequestError as exc:
            raise RestError.of(exc.reply()) from exc
        return {"users": None if access.users is None else sorted(access.users.names())}

    def _whoami(self, caller: Caller, topic: str | None) -> dict[str, Any]:
        session = caller.session
        may_write = None
        if topic is not None:
            try:
                self._rest.access.check_operation(
                    session, AclOperation.WRITE, AclResource.TOPIC, topic
                )
                may_write = True
            except RequestError:
                may_write = False
        return {"principal": session.principal, "may_write": may_write}

    # -- the live stream ------------------------------------------------------------------------

    def _events(self, target: Target) -> Streamed:
        """The tab's stream: the remembered events after ``Last-Event-ID`` (or ``after``), then
        the overview every period and each new event as it happens."""
        if self.timeline.streams >= self.timeline.max_streams:
            raise RestError(503, "BUSY", "too many console streams are open; retry", retriable=True)
        after_text = target.query.get("after", "0")
        after = int(after_text) if after_text.isdigit() else 0

        async def run(send: Send) -> None:
            try:
                with self.timeline.open_stream() as stream:
                    await self._pump(stream, send, after)
            except TooManyStreams:
                await send(b"event: busy\ndata: {}\n\n")

        return Streamed(
            200,
            "text/event-stream",
            run,
            headers=(("Cache-Control", "no-cache"), ("X-Accel-Buffering", "no")),
        )

    async def _pump(self, stream: TimelineStream, send: Send, after: int) -> None:
        await send(b"retry: 2000\n\n")
        for event in self.timeline.recent(after):
            await send(_sse("timeline", event.json(), event.seq))
        period = self.snapshots.period_s
        next_snapshot = trio.current_time()
        while True:  # the overview every period is also the stream's heartbeat
            now = trio.current_time()
            if now >= next_snapshot:
                overview = (await self.snapshots.current()).overview()
                overview["streams"] = self.timeline.streams
                await send(_sse("overview", overview))
                next_snapshot = now + period
            with trio.move_on_at(next_snapshot):
                await stream.wait()
            dropped = stream.take_dropped()
            if dropped:
                await send(_sse("dropped", {"count": dropped}))
            for event in stream.drain():
                await send(_sse("timeline", event.json(), event.seq))


def _same_origin(request: Request) -> None:
    """Refuse (403) a write whose ``Origin`` is another site than this port: a page elsewhere
    must not produce, reset or delete through a browser that can reach the admin port (the
    REST listener's clients are programs, which send no ``Origin``)."""
    if request.method in ("GET", "HEAD"):
        return
    origin = request.header("origin")
    if origin is None:
        return
    host = request.header("host") or ""
    if origin.split("://", 1)[-1] != host:
        raise RestError(403, "NOT_AUTHORIZED", f"a write from another origin ({origin[:80]})")


def _rates(snapshot: Snapshot) -> bytes:
    """The snapshot's rates in the Prometheus text format (gauges)."""
    broker = snapshot.broker_id
    messages, log_bytes = snapshot.rates
    return (
        "# HELP kafkaesque_cluster_messages_per_second Offsets committed per second, all "
        "partitions, between the last two console snapshots.\n"
        "# TYPE kafkaesque_cluster_messages_per_second gauge\n"
        f'kafkaesque_cluster_messages_per_second{{broker="{broker}"}} {messages:.3f}\n'
        "# HELP kafkaesque_hosted_log_bytes_per_second Growth of the logs hosted here, bytes "
        "per second, between the last two console snapshots.\n"
        "# TYPE kafkaesque_hosted_log_bytes_per_second gauge\n"
        f'kafkaesque_hosted_log_bytes_per_second{{broker="{broker}"}} {log_bytes:.3f}\n'
    ).encode()


def _note_json(note: ElectionNote | None) -> dict[str, Any] | None:
    return None if note is None else note.json()


def _sse(kind: str, data: Any, seq: int | None = None) -> bytes:
    head = f"event: {kind}\n" + ("" if seq is None else f"id: {seq}\n")
    return (head + "data: " + json.dumps(data, separators=(",", ":")) + "\n\n").encode()


def _answer(body: Any) -> Response:
    return Response(
        200,
        json.dumps(body, separators=(",", ":")).encode(),
        headers=(("Cache-Control", "no-cache"),),
    )
