"""The console's server side without a browser: the bounded timeline streams, the shared
snapshot (built at most once a period, its changes on the timeline) and the admin port's
server-sent-events answer, over trio memory streams with the mock clock.

The browser tests (test_console_browser.py) run the same against a real cluster."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import trio
import trio.testing

from kafkaesque.broker import BrokerConfig
from kafkaesque.broker import _metadata_view as mv
from kafkaesque.broker._access import AccessControl
from kafkaesque.broker._session import Session
from kafkaesque.broker.http import (
    ConsoleApi,
    HttpServer,
    HttpWiring,
    SnapshotProbes,
    Timeline,
)
from kafkaesque.broker.http._rest import Caller, RestApi
from kafkaesque.broker.http._timeline import TooManyStreams
from kafkaesque.local_cluster import write_users
from kafkaesque.protocol.http import HttpLimits, Request, Response
from kafkaesque.security import Authorizer, FailureLimiter, UserStore


class World:
    """What the probes read: registered brokers, who is heard, leaders, high watermarks."""

    def __init__(self) -> None:
        self.heard = {1: True, 2: True}
        self.leaders: dict[tuple[str, int], int | None] = {("t", 0): 1, ("t", 1): 2}
        self.ends: dict[tuple[str, int], int] = {("t", 0): 10, ("t", 1): 5}
        self.ends_asked = 0
        self.offsets: list[tuple[str, str, int, int]] = []

    def view(self) -> mv.MetadataView:
        brokers = {b: mv.BrokerInfo(b, "127.0.0.1", 9000 + b, 0, 0) for b in (0, 1, 2)}
        topic = mv.TopicInfo("t", cast(mv.TopicConfig, None), ((1, 2, 0), (2, 0, 1)))
        return mv.MetadataView(1, brokers, {"t": topic}, controller_leader=0)

    async def read_ends(self, wanted: list[tuple[str, int]]) -> Mapping[tuple[str, int], int]:
        self.ends_asked += 1
        await trio.sleep(0.01)  # one request to the leaders
        return {k: self.ends[k] for k in wanted if k in self.ends}

    def replicas(self) -> list[Any]:
        """The Raft groups hosted here (broker 0 follows both partitions)."""
        return [
            SimpleNamespace(
                id=f"{t}/{p}",
                node=SimpleNamespace(term=1, role=None),
                commit_index=end - 1,
                log=SimpleNamespace(size_bytes=100 * end),
            )
            for (t, p), end in self.ends.items()
        ]

    def probes(self) -> SnapshotProbes:
        return SnapshotProbes(
            broker_id=0,
            view=self.view,
            hears=lambda b: self.heard.get(b, False),
            leader_of=lambda t, p: self.leaders.get((t, p)),
            replicas=self.replicas,
            ends=self.read_ends,
            group_offsets=lambda: self.offsets,
        )


def test_a_full_stream_drops_its_oldest_events_and_counts_them() -> None:
    timeline = Timeline(queue=3, max_streams=1)
    with timeline.open_stream() as stream:
        for i in range(5):
            timeline.add("election", f"e{i}")
        assert [e.text for e in stream.drain()] == ["e2", "e3", "e4"]
        assert stream.take_dropped() == 2 and stream.take_dropped() == 0
        with pytest.raises(TooManyStreams), timeline.open_stream():
            pass
    assert timeline.streams == 0
    assert [e.seq for e in timeline.recent(after=3)] == [4, 5]


async def test_one_snapshot_a_period_however_many_ask(
    autojump_clock: trio.testing.MockClock,
) -> None:
    world = World()
    api = ConsoleApi(
        cast(Any, None), _no_scrape, world.probes(), Timeline(), clock=trio.current_time
    )
    async with trio.open_nursery() as nursery:
        for _ in range(20):
            nursery.start_soon(api.snapshots.current)
            nursery.start_soon(api.snapshots.exact_ends)
    assert api.snapshots.built == 1 and world.ends_asked == 1
    await trio.sleep(1.0)
    await api.snapshots.current()
    assert api.snapshots.built == 2


async def test_changes_between_snapshots_go_on_the_timeline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    world = World()
    timeline = Timeline()
    api = ConsoleApi(cast(Any, None), _no_scrape, world.probes(), timeline, clock=trio.current_time)
    first = await api.snapshots.current()
    assert first.overview()["under_replicated_count"] == 0
    world.heard[2] = False
    world.leaders[("t", 1)] = None
    world.ends[("t", 0)] = 30
    await trio.sleep(2.0)
    second = await api.snapshots.current()
    texts = [(e.kind, e.text) for e in timeline.recent()]
    assert ("broker", "broker 2 is down (broker 0 no longer hears it)") in texts
    assert ("partition", "t/1 has no leader (was broker 2)") in texts
    assert ("replication", "t/0, t/1 under-replicated") in texts
    overview = second.overview()
    assert overview["under_replicated_count"] == 2 and overview["leaderless"] == ["t/1"]
    assert overview["messages_per_s"] == 10.0  # 20 offsets in 2 s
    assert overview["bytes_per_s"] == 1000.0
    world.heard[2] = True
    await trio.sleep(2.0)
    await api.snapshots.current()
    texts = [(e.kind, e.text) for e in timeline.recent()]
    assert ("replication", "t/0, t/1 fully replicated again") in texts


async def test_the_event_stream_carries_the_overview_and_each_event(
    autojump_clock: trio.testing.MockClock,
) -> None:
    world = World()
    timeline = Timeline(max_streams=1)
    api = ConsoleApi(_open_rest(), _no_scrape, world.probes(), timeline, clock=trio.current_time)
    server = HttpServer(
        api.handle, access=cast(Any, None), limits=HttpLimits(), broker_id=0, listener="admin"
    )
    received = bytearray()
    server_end, client_end = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_exchange, server, server_end)
        await client_end.send_all(b"GET /api/events HTTP/1.1\r\nHost: x\r\n\r\n")
        with trio.move_on_after(2.5):
            while data := await client_end.receive_some(65536):
                received += data
                if b"event: overview" in received and not timeline.recent():
                    timeline.add("election", "t/0: broker 2 elected leader in term 3")
        # A HEAD asks for no stream (h11 would refuse a body after its answer).
        head_server, head_client = trio.testing.memory_stream_pair()
        nursery.start_soon(_exchange, server, head_server)
        await head_client.send_all(
            b"HEAD /api/events HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        assert (await head_client.receive_some(65536)).startswith(b"HTTP/1.1 200 ")
        # A second tab over the cap is refused (503), not queued.
        second_server, second_client = trio.testing.memory_stream_pair()
        nursery.start_soon(_exchange, server, second_server)
        await second_client.send_all(b"GET /api/events HTTP/1.1\r\nHost: x\r\n\r\n")
        refused = await second_client.receive_some(65536)
        await client_end.aclose()  # the tab closes: its stream ends
    head = bytes(received).split(b"\r\n\r\n", 1)[0]
    assert b"200 OK" in head and b"text/event-stream" in head
    assert received.count(b"event: overview") >= 2
    assert b"event: timeline\nid: 1\n" in received and b"elected leader in term 3" in received
    assert refused.startswith(b"HTTP/1.1 503 ")
    assert timeline.streams == 0


async def test_a_write_from_another_origin_is_refused() -> None:
    api = ConsoleApi(_open_rest(), _no_scrape, World().probes(), Timeline())
    request = Request(
        "POST",
        b"/api/rest/topics/t",
        (("host", "127.0.0.1:9095"), ("origin", "http://evil.example")),
        b"{}",
    )
    answer = await api.handle(request, Caller(Session()))
    assert isinstance(answer, Response) and answer.status == 403


async def test_a_tab_that_stops_reading_loses_its_stream(
    autojump_clock: trio.testing.MockClock,
) -> None:
    timeline = Timeline()
    api = ConsoleApi(_open_rest(), _no_scrape, World().probes(), timeline, clock=trio.current_time)
    server = HttpServer(
        api.handle, access=cast(Any, None), limits=HttpLimits(), broker_id=0, listener="admin"
    )
    # Lockstep: a send waits until the other side reads, as a full socket buffer makes it.
    server_end, client_end = trio.testing.lockstep_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_exchange, server, server_end)
        await client_end.send_all(b"GET /api/events HTTP/1.1\r\nHost: x\r\n\r\n")
        first = await client_end.receive_some(65536)
        assert b"200 OK" in first
        await trio.sleep(5.0)
        assert timeline.streams == 1  # stalled, but not yet given up
        await trio.sleep(60.0)  # the client reads nothing more
        assert timeline.streams == 0
        nursery.cancel_scope.cancel()


async def test_with_a_users_file_the_data_needs_credentials_and_monitoring_does_not(
    tmp_path: Path,
) -> None:
    users = tmp_path / "users"
    write_users(str(users), {"alice": "alice-secret"})
    metrics = SimpleNamespace(auth_failed=lambda: None, authorization_failed=lambda op: None)
    access = AccessControl(UserStore(str(users)), Authorizer(), FailureLimiter(10, 60), metrics)
    rest = RestApi(
        HttpWiring(
            config=cast(BrokerConfig, SimpleNamespace(id=0)),
            dispatch=cast(Any, None),
            metadata=cast(Any, None),
            partitioner=cast(Any, None),
            access=access,
            draining=cast(Any, None),
        )
    )
    api = ConsoleApi(rest, _no_scrape, World().probes(), Timeline())
    server = HttpServer(
        api.handle, access=access, limits=HttpLimits(), broker_id=0, listener="admin"
    )
    answers = {}
    paths = ("/api/overview", "/api/events", "/api/users", "/api/rest/topics")
    for path in (*paths, "/healthz", "/metrics", "/"):
        server_end, client_end = trio.testing.memory_stream_pair()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_exchange, server, server_end)
            await client_end.send_all(
                b"GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % path.encode()
            )
            received = b""
            while data := await client_end.receive_some(65536):
                received += data
        answers[path] = received.split(b" ", 2)[1]
    assert answers == {
        "/api/overview": b"401",
        "/api/events": b"401",
        "/api/users": b"401",
        "/api/rest/topics": b"401",
        "/healthz": b"200",
        "/metrics": b"200",
        "/": b"200",
    }


async def _exchange(server: HttpServer, stream: trio.abc.Stream) -> None:
    async with stream:
        await server._exchange(stream, Caller(Session()), [], lambda: False)


async def _no_scrape() -> bytes:
    return b""


def _open_rest() -> Any:
    """A RestApi as on a broker without a users file: everyone is let in."""

    async def authenticate(request: object, caller: object) -> None:
        return None

    return SimpleNamespace(authenticate=authenticate)


async def test_the_topics_list_names_each_topics_groups_and_their_largest_lag(
    autojump_clock: trio.testing.MockClock,
) -> None:
    world = World()
    world.offsets = [("billing", "t", 0, 4), ("billing", "t", 1, 5), ("audit", "t", 0, 12)]
    api = ConsoleApi(_open_rest(), _no_scrape, world.probes(), Timeline(), clock=trio.current_time)
    (row,) = await _topics(api)
    # ends: t/0 10, t/1 5; billing lags 6 and 0, audit committed past the end read: 0
    assert (row["groups"], row["max_lag"]) == (["audit", "billing"], 6)
    world.offsets = []
    await trio.sleep(2.0)
    (row,) = await _topics(api)
    assert (row["groups"], row["max_lag"]) == ([], None)


async def _topics(api: ConsoleApi) -> list[dict[str, Any]]:
    request = Request("GET", b"/api/topics", (("host", "127.0.0.1:9095"),))
    answer = await api.handle(request, Caller(Session()))
    assert isinstance(answer, Response) and answer.status == 200
    rows: list[dict[str, Any]] = json.loads(answer.body)
    return rows
