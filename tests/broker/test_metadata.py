"""The controller quorum (``kafkaesque.broker._metadata``) and its bridge to threads
(``_thread_bridge``).

Three layers, fastest first: the bridge with fake pysyncobj methods; the pure state machine
(``MetadataState``, ``assign_replicas``), with hypothesis for its invariants; then real pysyncobj
controllers on loopback, several in this process, each on its own thread, with short Raft
timeouts. Every wait on a cluster is bounded by ``WAIT``; every cluster checks on exit that no
controller thread is left.
"""

from __future__ import annotations

import dataclasses
import gzip
import pickle
import socket
import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st
from pysyncobj import FAIL_REASON

from kafkaesque.broker import _thread_bridge
from kafkaesque.broker._metadata import ClusterMetadata, ControllerSettings
from kafkaesque.broker._metadata_state import MetadataState
from kafkaesque.broker._metadata_view import (
    BrokerInfo,
    InvalidConfigError,
    MetadataError,
    MetadataUnavailable,
    MetadataView,
    TopicConfig,
    TopicExistsError,
    TopicInfo,
    UnknownTopicError,
    assign_replicas,
)
from kafkaesque.local_cluster import free_ports

SECRET = b"test-cluster-secret"
WAIT = 10.0  # seconds: bound on any wait for a cluster to elect, commit or converge
# Loopback timings: elections in a fraction of a second, a cut-off leader steps down in 1 s.
FAST = ControllerSettings(
    raft_min_timeout=0.3,
    raft_max_timeout=0.7,
    append_entries_period=0.05,
    connection_timeout=1.0,
    connection_retry_time=0.1,
    leader_fallback_timeout=1.0,
    tick_period=0.02,
)
THREAD_PREFIX = "kafkaesque-controller-"


# --- the bridge -------------------------------------------------------------------------------


async def test_call_replicated_hands_back_an_answer_from_another_thread() -> None:
    threads: list[threading.Thread] = []

    def method(x: int, *, callback: Callable[[object, int], None]) -> None:
        thread = threading.Thread(target=callback, args=(x * 2, FAIL_REASON.SUCCESS))
        threads.append(thread)
        thread.start()

    with trio.fail_after(WAIT):
        assert await _thread_bridge.call_replicated(method, 21, timeout=WAIT) == 42
    threads[0].join()


@pytest.mark.parametrize(
    ("reason", "maybe_applied"),
    [
        (FAIL_REASON.QUEUE_FULL, False),
        (FAIL_REASON.MISSING_LEADER, False),
        (FAIL_REASON.NOT_LEADER, False),
        (FAIL_REASON.DISCARDED, False),
        (FAIL_REASON.REQUEST_DENIED, False),
        (FAIL_REASON.LEADER_CHANGED, True),
        (FAIL_REASON.UNKNOWN_OUTCOME, True),
    ],
)
async def test_call_replicated_tells_failed_from_maybe(reason: int, maybe_applied: bool) -> None:
    def method(*, callback: Callable[[object, int], None]) -> None:
        callback(None, reason)  # at once, on this thread: what pysyncobj does for QUEUE_FULL

    with pytest.raises(_thread_bridge.ReplicationError) as info:
        await _thread_bridge.call_replicated(method, timeout=WAIT)
    assert (info.value.reason, info.value.maybe_applied) == (reason, maybe_applied)


async def test_call_replicated_without_an_answer_times_out_as_maybe(
    autojump_clock: trio.testing.MockClock,
) -> None:
    def method(*, callback: Callable[[object, int], None]) -> None:
        pass  # the command sits in pysyncobj's queue: no answer

    start = trio.current_time()
    with pytest.raises(_thread_bridge.ReplicationError) as info:
        await _thread_bridge.call_replicated(method, timeout=3.0)
    assert trio.current_time() - start == pytest.approx(3.0)
    assert info.value.reason is None
    assert info.value.maybe_applied


def test_post_after_the_trio_run_is_dropped() -> None:
    async def token() -> trio.lowlevel.TrioToken:
        return trio.lowlevel.current_trio_token()

    assert _thread_bridge.post(trio.run(token), print, "never printed") is False


async def test_ticking_thread_runs_on_its_own_thread_and_reports_a_tick_error() -> None:
    seen: list[str] = []

    def tick(name: str) -> None:
        seen.append(f"{name} on {threading.current_thread().name}")
        if len(seen) == 3:
            raise ValueError("tick failed")

    closed: list[str] = []
    with trio.fail_after(WAIT):
        thread = await _thread_bridge.TickingThread.open(
            "ticker", lambda: "obj", tick, closed.append
        )
        try:
            assert thread.value == "obj"
            with pytest.raises(ValueError, match="tick failed"):
                await thread.wait()
        finally:
            await thread.aclose()
    assert seen == ["obj on ticker"] * 3
    assert closed == ["obj"]  # closed after the error
    assert not [t for t in threading.enumerate() if t.name == "ticker"]


async def test_ticking_thread_reports_an_open_error_and_closes_nothing() -> None:
    def open_() -> str:
        raise OSError("port taken")

    closed: list[str] = []
    with trio.fail_after(WAIT), pytest.raises(OSError, match="port taken"):
        await _thread_bridge.TickingThread.open("opener", open_, lambda _: None, closed.append)
    assert closed == []
    assert not [t for t in threading.enumerate() if t.name == "opener"]


async def test_ticking_thread_reports_a_close_error_and_ends() -> None:
    def close(_: str) -> None:
        raise OSError("flush failed")

    with trio.fail_after(WAIT):
        thread = await _thread_bridge.TickingThread.open(
            "closer", lambda: "obj", lambda _: None, close
        )
        with pytest.raises(OSError, match="flush failed"):
            await thread.aclose()
        await thread.aclose()  # again: nothing left to report
    assert not [t for t in threading.enumerate() if t.name == "closer"]


# --- the state machine ------------------------------------------------------------------------


def _state_with_brokers(*ids: int) -> MetadataState:
    state = MetadataState()
    for broker_id in ids:
        state.register_broker(BrokerInfo(broker_id, "127.0.0.1", 9000, 9001, 9002))
    return state


def test_assignment_example_spreads_leaders_and_replicas() -> None:
    # crc32("orders") % 3 == 2: the first window starts at the third broker, 3; then windows of
    # two go on round the ring, and each is led by its least loaded broker.
    expected = ((3, 1), (2, 3), (1, 2), (3, 1), (2, 3), (1, 2))
    assert assign_replicas("orders", 6, 2, [3, 1, 2]) == expected
    # Two partitions of two replicas on four brokers use all four (crc32("orders") % 4 == 2).
    assert assign_replicas("orders", 2, 2, [4, 3, 2, 1]) == ((3, 4), (1, 2))


@given(
    ids=st.sets(st.integers(0, 1000), min_size=1, max_size=12),
    partitions=st.integers(0, 60),
    rf_seed=st.integers(0, 100),
    name=st.text(min_size=1, max_size=20),
    data=st.data(),
)
def test_assignment_is_even_and_deterministic(
    ids: set[int], partitions: int, rf_seed: int, name: str, data: st.DataObject
) -> None:
    rf = rf_seed % len(ids) + 1
    replicas = assign_replicas(name, partitions, rf, ids)
    assert len(replicas) == partitions
    for r in replicas:
        assert len(r) == rf == len(set(r))
        assert set(r) <= ids
    leaders = Counter(r[0] for r in replicas)
    load = Counter(b for r in replicas for b in r)
    # Every broker counted, so that an unused broker counts as 0.
    assert max(leaders[b] for b in ids) - min(leaders[b] for b in ids) <= 1
    assert max(load[b] for b in ids) - min(load[b] for b in ids) <= 1
    shuffled = data.draw(st.permutations(sorted(ids)))
    assert assign_replicas(name, partitions, rf, shuffled) == replicas


def test_assignment_needs_enough_brokers() -> None:
    with pytest.raises(ValueError):
        assign_replicas("t", 1, 3, [1, 2])


def test_create_topic_is_idempotent_and_rejects_another_config() -> None:
    state = _state_with_brokers(1, 2, 3)
    created = state.create_topic("t", TopicConfig(4, 2))
    version = state.version
    assert state.create_topic("t", TopicConfig(4, 2)) == created
    assert state.version == version  # no change, no new version
    assert isinstance(state.create_topic("t", TopicConfig(4, 3)), TopicExistsError)
    assert isinstance(state.create_topic("t", TopicConfig(4, 2, compact=True)), TopicExistsError)
    assert state.topics == {"t": created}


def test_a_different_config_is_refused_with_readable_values() -> None:
    state = _state_with_brokers(1, 2, 3)
    state.create_topic("t", TopicConfig(4, 2, retention_ms=60_000))
    refused = state.create_topic("t", TopicConfig(3, 3, compact=True))
    assert isinstance(refused, TopicExistsError)
    assert str(refused) == (
        "topic 't' exists with partitions=4 replication_factor=2 retention_ms=60000 "
        "retention_bytes=unlimited compact=no, not partitions=3 replication_factor=3 "
        "retention_ms=unlimited retention_bytes=unlimited compact=yes"
    )
    assert "TopicConfig" not in str(state.set_replicas("t", 0, (1, 1)))


def test_auto_create_answers_any_existing_topic_and_caps_replicas_at_the_brokers() -> None:
    state = _state_with_brokers(1, 2)
    created = state.create_topic("t", TopicConfig(3, 3), auto=True)
    assert isinstance(created, TopicInfo)
    assert created.config == TopicConfig(3, 2)  # two brokers registered: two replicas
    version = state.version
    # Another broker's auto-create with other defaults: the topic that exists, unchanged.
    assert state.create_topic("t", TopicConfig(6, 1), auto=True) == created
    assert state.version == version
    # A plain CREATE keeps its rules: another config is refused, too many replicas too.
    assert isinstance(state.create_topic("t", TopicConfig(6, 1)), TopicExistsError)
    assert isinstance(state.create_topic("u", TopicConfig(1, 3)), InvalidConfigError)
    # An auto-create of an invalid name is refused like any other.
    assert isinstance(state.create_topic("a/b", TopicConfig(1, 1), auto=True), InvalidConfigError)
    assert isinstance(
        MetadataState().create_topic("t", TopicConfig(1, 1), auto=True), InvalidConfigError
    )


@pytest.mark.parametrize(
    ("name", "config"),
    [
        ("t", TopicConfig(2, 4)),  # more replicas than registered brokers
        ("t", TopicConfig(0, 1)),
        ("t", TopicConfig(1, 0)),
        ("t", TopicConfig(1, 1, retention_ms=0)),
        ("t", TopicConfig(1, 1, retention_bytes=-1)),
        ("a/b", TopicConfig(1, 1)),
        ("..", TopicConfig(1, 1)),
        ("", TopicConfig(1, 1)),
        ("x" * 250, TopicConfig(1, 1)),
    ],
)
def test_create_topic_refuses_an_invalid_config(name: str, config: TopicConfig) -> None:
    state = _state_with_brokers(1, 2, 3)
    assert isinstance(state.create_topic(name, config), InvalidConfigError)
    assert (state.version, state.topics) == (3, {})


def test_delete_topic_removes_it_once() -> None:
    state = _state_with_brokers(1, 2)
    state.create_topic("a", TopicConfig(2, 1))
    state.create_topic("b", TopicConfig(2, 1))
    version = state.version
    assert state.delete_topic("a") is None
    assert set(state.topics) == {"b"}
    assert state.version == version + 1
    assert isinstance(state.delete_topic("a"), UnknownTopicError)
    assert state.version == version + 1


def test_set_replicas_checks_its_arguments() -> None:
    state = _state_with_brokers(1, 2, 3)
    state.create_topic("t", TopicConfig(2, 2))
    moved = state.set_replicas("t", 1, (3, 2, 1))
    assert not isinstance(moved, MetadataError)
    assert moved.replicas[1] == (3, 2, 1)
    assert state.topics["t"] == moved
    # Partition 1's group no longer starts from its replicas: a new replica joins as a spare.
    assert (moved.bootstrap(0), moved.bootstrap(1)) == (moved.replicas[0], None)
    assert isinstance(state.set_replicas("nope", 0, (1,)), UnknownTopicError)
    for partition, replicas in [(2, (1,)), (-1, (1,)), (0, ()), (0, (1, 1)), (0, (1, 9))]:
        assert isinstance(state.set_replicas("t", partition, replicas), InvalidConfigError)
    grown = state.alter_topic("t", {"partitions": 3})
    assert not isinstance(grown, MetadataError)
    assert grown.reassigned == {1} and grown.bootstrap(2) == grown.replicas[2]


def test_dump_round_trips_in_plain_values() -> None:
    state = _state_with_brokers(1, 2, 3)
    state.register_broker(BrokerInfo(4, "h", 1, 2, 3, admin_port=4, mqtt_port=5))
    state.create_topic("t", TopicConfig(3, 2, retention_ms=10, retention_bytes=20, compact=True))
    state.create_topic("u", TopicConfig(1, 3))
    state.set_replicas("t", 2, (4, 1))
    dump = state.to_primitive()
    allowed = (dict, list, tuple, str, int, bool, type(None))

    def plain(value: object) -> bool:
        if isinstance(value, dict):
            return all(plain(k) and plain(v) for k, v in value.items())
        if isinstance(value, list | tuple):
            return type(value) in allowed and all(plain(v) for v in value)
        return type(value) in allowed

    assert plain(dump)
    again = MetadataState.from_primitive(dump)
    assert again.snapshot(None) == state.snapshot(None)
    assert list(again.topics) == ["t", "u"]  # creation order survives
    assert again.topics["t"].reassigned == {2}
    # A dump from before partitions were marked reassigned still reads: none is.
    older = {**dump, "topics": [(n, c, r) for n, c, r, _ in dump["topics"]]}
    assert MetadataState.from_primitive(older).topics["t"].reassigned == frozenset()
    # A dump from when the metadata held consumer-group subscriptions still reads; they are dropped.
    old = {**dump, "subscriptions": [("s", "t", "g", (0, 1))]}
    assert MetadataState.from_primitive(old).snapshot(None) == state.snapshot(None)
    with pytest.raises(ValueError):
        MetadataState.from_primitive({**dump, "format": 99})


# --- real controllers on loopback -------------------------------------------------------------


def _controller_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX)]


def _state_of(view: MetadataView) -> tuple[object, ...]:
    """A view without its controller leader (which replicas may learn at different times)."""
    return (view.version, dict(view.brokers), dict(view.topics))


class Cluster:
    """The controllers of one test; each runs in its own cancel scope of the test's nursery."""

    def __init__(self, nursery: trio.Nursery, tmp_path: Path, ids: list[int]) -> None:
        self._nursery = nursery
        self._tmp_path = tmp_path
        self.controllers = {
            i: ("127.0.0.1", p) for i, p in zip(ids, free_ports(len(ids)), strict=True)
        }
        self.running: dict[int, ClusterMetadata] = {}
        self._stops: dict[int, tuple[trio.CancelScope, trio.Event]] = {}

    async def start(
        self,
        broker_id: int,
        *,
        join: bool = False,
        timeout: float = 5.0,
        settings: ControllerSettings = FAST,
        on_change: Callable[[MetadataView], None] | None = None,
    ) -> ClusterMetadata:
        md = ClusterMetadata(
            broker_id,
            self.controllers,
            str(self._tmp_path / str(broker_id)),
            SECRET,
            timeout=timeout,
            on_change=on_change,
            join=join,
            settings=settings,
        )
        scope = trio.CancelScope()
        stopped = trio.Event()

        async def run(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            try:
                with scope:
                    await md.run(task_status=task_status)
            finally:
                stopped.set()

        await self._nursery.start(run)
        self.running[broker_id] = md
        self._stops[broker_id] = (scope, stopped)
        return md

    async def stop(self, broker_id: int) -> None:
        del self.running[broker_id]
        scope, stopped = self._stops.pop(broker_id)
        scope.cancel()
        with trio.fail_after(WAIT):
            await stopped.wait()

    async def ready(self) -> None:
        with trio.fail_after(WAIT):
            for md in self.running.values():
                await md.wait_ready()

    async def converged(self) -> MetadataView:
        """Wait until every running controller has applied the same state; return one view."""
        with trio.fail_after(WAIT):
            while True:
                views = [md.view for md in self.running.values()]
                if all(_state_of(v) == _state_of(views[0]) for v in views):
                    return views[0]
                await trio.sleep(0.01)

    async def register_all(self, via: ClusterMetadata) -> None:
        for broker_id, (host, port) in self.controllers.items():
            await via.register_broker(BrokerInfo(broker_id, host, 9000 + broker_id, 0, port))


@asynccontextmanager
async def open_cluster(
    tmp_path: Path,
    size: int,
    *,
    start: bool = True,
    timeout: float = 5.0,
    settings: ControllerSettings = FAST,
) -> AsyncIterator[Cluster]:
    """A cluster of ``size`` controllers (ids 1..size), all started unless ``start`` is False."""
    assert not _controller_threads()
    async with trio.open_nursery() as nursery:
        cluster = Cluster(nursery, tmp_path, list(range(1, size + 1)))
        if start:
            for broker_id in cluster.controllers:
                await cluster.start(broker_id, timeout=timeout, settings=settings)
        yield cluster
        nursery.cancel_scope.cancel()
    assert not _controller_threads(), "run() returned with its controller thread alive"


async def test_three_controllers_elect_replicate_and_converge(tmp_path: Path) -> None:
    seen: list[MetadataView] = []
    async with open_cluster(tmp_path, 3, start=False) as cluster:
        one = await cluster.start(1, on_change=seen.append)
        two = await cluster.start(2)
        three = await cluster.start(3)
        await cluster.ready()
        leaders = {md.view.controller_leader for md in cluster.running.values()}
        assert len(leaders) == 1
        assert leaders <= {1, 2, 3}
        assert all(len(md.members) == 3 for md in cluster.running.values())

        await cluster.register_all(via=two)
        topic = await three.create_topic("orders", TopicConfig(6, 3))
        assert three.view.topics["orders"] == topic  # a caller reads its own write
        assert Counter(r[0] for r in topic.replicas) == {1: 2, 2: 2, 3: 2}
        assert await one.create_topic("orders", TopicConfig(6, 3)) == topic
        with pytest.raises(TopicExistsError):
            await two.create_topic("orders", TopicConfig(3, 3))
        with pytest.raises(InvalidConfigError):
            await two.create_topic("wide", TopicConfig(1, 4))
        with pytest.raises(UnknownTopicError):
            await one.delete_topic("nope")

        moved = await two.set_replicas("orders", 0, (2, 3))
        assert moved.replicas[0] == (2, 3)

        view = await cluster.converged()
        assert set(view.brokers) == {1, 2, 3}
        assert view.topics["orders"] == moved

        await two.delete_topic("orders")
        view = await cluster.converged()
        assert view.topics == {}
        # on_change saw the views of member 1 in order, up to the latest.
        with trio.fail_after(WAIT):
            while not seen or seen[-1] is not one.view:
                await trio.sleep(0.01)
        versions = [v.version for v in seen]
        assert versions == sorted(versions)


async def test_concurrent_auto_creates_on_two_controllers_make_one_topic(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, 3) as cluster:
        await cluster.ready()
        one, two = cluster.running[1], cluster.running[2]
        await cluster.register_all(via=one)
        await cluster.converged()
        answers: dict[int, TopicInfo] = {}

        async def create(md: ClusterMetadata, key: int, config: TopicConfig) -> None:
            answers[key] = await md.create_topic("raced", config, auto=True)

        # Each with its own defaults, at once: the first applied wins, the other gets it.
        async with trio.open_nursery() as nursery:
            nursery.start_soon(create, one, 1, TopicConfig(3, 3))
            nursery.start_soon(create, two, 2, TopicConfig(5, 2))
        assert answers[1] == answers[2]
        assert answers[1].config in (TopicConfig(3, 3), TopicConfig(5, 2))
        view = await cluster.converged()
        assert view.topics == {"raced": answers[1]}
        # A plain CREATE of the same topic with another config is still refused.
        other = TopicConfig(4, 3) if answers[1].config != TopicConfig(4, 3) else TopicConfig(6, 3)
        with pytest.raises(TopicExistsError):
            await one.create_topic("raced", other)


async def test_restart_keeps_the_state_from_journal_and_dump(tmp_path: Path) -> None:
    # A tiny compaction threshold: the state also goes through pysyncobj's full dump.
    settings = dataclasses.replace(FAST, log_compaction_min_entries=3)
    async with open_cluster(tmp_path, 3, settings=settings) as cluster:
        await cluster.ready()
        first = cluster.running[1]
        await cluster.register_all(via=first)
        for n in range(6):
            await first.create_topic(f"t{n}", TopicConfig(n + 1, 2))
        before = await cluster.converged()
        for broker_id in [1, 2, 3]:
            await cluster.stop(broker_id)
        assert not _controller_threads()
        assert any((tmp_path / str(i) / "controller.dump").exists() for i in [1, 2, 3])
        assert all((tmp_path / str(i) / "controller.journal").exists() for i in [1, 2, 3])

        for broker_id in [1, 2, 3]:
            await cluster.start(broker_id, settings=settings)
        await cluster.ready()
        after = await cluster.converged()
        assert _state_of(after) == _state_of(before)
        await cluster.running[2].create_topic("later", TopicConfig(1, 3))  # still writable


async def test_a_dump_of_an_unknown_format_stops_the_controller(tmp_path: Path) -> None:
    # pysyncobj logs and swallows a failure to load its dump, then never applies again: the
    # controller must fail instead of serving an empty or stale view.
    settings = dataclasses.replace(FAST, log_compaction_min_entries=3)
    async with open_cluster(tmp_path, 1, settings=settings) as cluster:
        await cluster.ready()
        for n in range(6):
            await cluster.running[1].register_broker(BrokerInfo(n, "h", 1, 2, 3))
        await cluster.stop(1)
    dump = tmp_path / "1" / "controller.dump"
    with gzip.open(dump, "rb") as f:
        content = pickle.load(f)
    content[0][1]["format"] = 99  # [SyncObj's own fields, our consumer's], then pysyncobj's
    with gzip.open(dump, "wb") as f:
        pickle.dump(content, f)

    md = ClusterMetadata(1, cluster.controllers, str(tmp_path / "1"), SECRET, settings=settings)
    unreadable = pytest.RaisesExc(RuntimeError, match="cannot read the metadata dump")
    with trio.fail_after(WAIT), pytest.RaisesGroup(unreadable):
        await md.run()
    assert not _controller_threads()


async def test_one_loss_still_commits_and_a_lone_member_is_unavailable(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, 3, timeout=1.0) as cluster:
        await cluster.ready()
        await cluster.register_all(via=cluster.running[1])
        leader = cluster.running[1].view.controller_leader
        assert leader is not None
        await cluster.stop(leader)

        # At once, while the survivors still follow the dead leader: retried until a new one.
        survivor_id, last_id = cluster.running
        survivor, last = cluster.running[survivor_id], cluster.running[last_id]
        with trio.fail_after(WAIT):
            while True:
                try:
                    await survivor.create_topic("after-loss", TopicConfig(2, 2))
                    break
                except MetadataUnavailable:
                    pass  # the election took longer than the 1 s timeout: ask again
        with trio.fail_after(WAIT):
            await last.wait_changed(survivor.view.version - 1)
        assert "after-loss" in last.view.topics

        await cluster.stop(survivor_id)
        start = trio.current_time()
        with pytest.raises(MetadataUnavailable) as info:
            await last.create_topic("alone", TopicConfig(1, 1))
        assert trio.current_time() - start < 1.0 + 0.5
        assert info.value.maybe_applied  # not committed in time: outcome unknown
        assert "alone" not in last.view.topics


async def test_add_controller_grows_the_quorum_to_four(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, 4, start=False) as cluster:
        for broker_id in [1, 2, 3]:
            await cluster.start(broker_id)
        await cluster.ready()
        first = cluster.running[1]
        await cluster.register_all(via=first)
        await first.create_topic("t", TopicConfig(4, 3))

        joiner = await cluster.start(4, join=True)
        host, port = cluster.controllers[4]
        new_address = f"{host}:{port}"
        await cluster.running[2].add_controller(4, cluster.controllers[4])
        await cluster.running[3].add_controller(4, cluster.controllers[4])  # idempotent
        await cluster.ready()
        view = await cluster.converged()
        assert "t" in joiner.view.topics
        assert view.version == joiner.view.version
        with trio.fail_after(WAIT):
            while not all(len(md.members) == 4 for md in cluster.running.values()):
                await trio.sleep(0.01)
        assert all(new_address in md.members for md in cluster.running.values())

        # Four members: with one down, three still make a majority, the joiner among them.
        await cluster.stop(1)
        await joiner.create_topic("after", TopicConfig(1, 3))
        assert "after" in (await cluster.converged()).topics


async def test_no_thread_is_left_after_run_is_cancelled(tmp_path: Path) -> None:
    before = set(threading.enumerate())
    async with open_cluster(tmp_path, 1) as cluster:
        await cluster.ready()  # a single controller elects itself
        md = cluster.running[1]
        await md.register_broker(BrokerInfo(1, "127.0.0.1", 1, 2, 3))
        assert [t.name for t in _controller_threads()] == [f"{THREAD_PREFIX}1"]
        await cluster.stop(1)
        assert set(threading.enumerate()) == before
        with pytest.raises(MetadataUnavailable) as info:
            await md.register_broker(BrokerInfo(1, "127.0.0.1", 1, 2, 3))
        assert not info.value.maybe_applied
        # Its port is free again.
        with socket.socket() as s:
            s.bind(cluster.controllers[1])


async def test_run_raises_oserror_when_the_port_is_taken(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        md = ClusterMetadata(1, {1: taken.getsockname()}, str(tmp_path), SECRET, settings=FAST)
        with trio.fail_after(WAIT), pytest.raises(OSError, match="cannot bind"):
            await md.run()
    assert not _controller_threads()


async def test_commands_before_run_are_a_usage_error(tmp_path: Path) -> None:
    md = ClusterMetadata(1, {1: ("127.0.0.1", 1)}, str(tmp_path), SECRET)
    with pytest.raises(RuntimeError):
        await md.register_broker(BrokerInfo(1, "127.0.0.1", 1, 2, 3))
    with pytest.raises(ValueError):
        ClusterMetadata(2, {1: ("127.0.0.1", 1)}, str(tmp_path), SECRET)
    with pytest.raises(ValueError):
        ClusterMetadata(1, {1: ("127.0.0.1", 1)}, str(tmp_path), b"")
