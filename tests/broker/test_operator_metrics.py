"""The metrics an operator alerts on, collector by collector (no broker, no sockets).

Brokers up, under-replicated and offline partitions, consumer-group lag, and request labels in
protocol words: see ``kafkaesque.broker._metrics`` and docs/operations.md ("Metrics").
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from kafkaesque.broker._metrics import (
    MALFORMED_COMMAND,
    UNKNOWN_COMMAND,
    BrokerMetrics,
    ClusterProbes,
    InSyncTracker,
    command_word,
)
from kafkaesque.protocol import BadCommand, ErrorCode, LineDecoder
from kafkaesque.raft import Configuration, Role
from kafkaesque.raft.driver import RaftReplica

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: bytes) -> Samples:
    """Every sample of a scrape: (name, sorted labels) -> value."""
    out: Samples = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(found: Samples, name: str, **labels: str) -> float | None:
    return found.get((name, tuple(sorted(labels.items()))))


# -- fakes of a Raft group, as much of one as the collectors read ------------------------------


@dataclass
class FakeProgress:
    match: int


@dataclass
class FakeStatus:
    id: int
    last_index: int
    progress: dict[int, FakeProgress]
    lost_end: int | None = None


@dataclass
class FakeNode:
    id: int
    role: Role
    leader: int | None
    last_index: int
    matches: dict[int, int] = field(default_factory=dict)  # follower -> match (leader only)
    term: int = 1

    @property
    def configuration(self) -> Configuration:
        return Configuration(frozenset({self.id, *self.matches}))

    def status(self) -> FakeStatus:
        progress = {p: FakeProgress(m) for p, m in self.matches.items()}
        progress[self.id] = FakeProgress(self.last_index)
        return FakeStatus(self.id, self.last_index, progress if self.role is Role.LEADER else {})


@dataclass
class FakeLog:
    log_end_offset: int
    corruptions: int = 0


@dataclass
class FakeGroup:
    id: str
    node: FakeNode
    commit_index: int
    log: FakeLog
    divergences: int = 0


def led(log_id: str, me: int, end: int, matches: dict[int, int]) -> RaftReplica:
    node = FakeNode(me, Role.LEADER, me, end, matches)
    return cast(RaftReplica, FakeGroup(log_id, node, end, FakeLog(end + 1)))


def followed(log_id: str, me: int, leader: int | None, end: int) -> RaftReplica:
    node = FakeNode(me, Role.FOLLOWER, leader, end)
    return cast(RaftReplica, FakeGroup(log_id, node, end, FakeLog(end + 1)))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# -- in sync: Kafka's ISR rule, judged at scrape time ----------------------------------------


def test_a_follower_that_keeps_reaching_the_last_scrapes_end_stays_in_sync() -> None:
    clock = Clock()
    tracker = InSyncTracker(window_s=10.0, clock=clock)
    end = 100
    for _ in range(20):  # under load: always 5 behind the end, never at it
        tracker.begin()
        assert tracker.observe("t/0", 2, end - 5, end, heard=True)
        tracker.end()
        end += 50
        clock.now += 3.0


def test_a_stuck_follower_drops_out_after_the_window_and_comes_back_when_caught_up() -> None:
    clock = Clock()
    tracker = InSyncTracker(window_s=10.0, clock=clock)
    verdicts = []
    for step in range(8):
        tracker.begin()
        match = 10 if step < 6 else 1000  # stuck at 10, then catches up
        verdicts.append(tracker.observe("t/0", 2, match, 100 + step * 100, heard=True))
        tracker.end()
        clock.now += 4.0
    # first seen: benefit of one window (100.0 .. 110.0); out from 112.0; back at step 6.
    assert verdicts == [True, True, True, False, False, False, True, True]


def test_a_follower_not_heard_is_out_of_sync_at_once() -> None:
    tracker = InSyncTracker(clock=Clock())
    tracker.begin()
    assert not tracker.observe("t/0", 3, 100, 100, heard=False)
    tracker.end()


def test_a_follower_not_observed_in_a_round_is_forgotten() -> None:
    clock = Clock()
    tracker = InSyncTracker(window_s=10.0, clock=clock)
    tracker.begin()
    tracker.observe("t/0", 2, 0, 100, heard=True)
    tracker.end()
    clock.now += 50.0
    tracker.begin()  # t/0 no longer led here: not observed
    tracker.end()
    clock.now += 50.0
    tracker.begin()  # led again: first seen again, so in sync for one window
    assert tracker.observe("t/0", 2, 0, 100, heard=True)
    tracker.end()


def test_a_shorter_log_after_a_new_term_does_not_leave_a_follower_out_forever() -> None:
    clock = Clock()
    tracker = InSyncTracker(window_s=10.0, clock=clock)
    tracker.begin()
    tracker.observe("t/0", 2, 50, 200, heard=True)  # the end then included uncommitted entries
    tracker.end()
    for _ in range(5):
        clock.now += 5.0
        tracker.begin()
        assert tracker.observe("t/0", 2, 150, 150, heard=True)  # idle at the new, shorter end
        tracker.end()


# -- the partition gauges: under-replicated, in-sync replicas --------------------------------


def test_under_replicated_counts_led_partitions_with_a_follower_not_in_sync() -> None:
    groups = [
        led("a/0", 1, 10, {2: 10}),  # its one follower caught up and heard
        led("a/1", 1, 10, {2: 10, 3: 10}),  # broker 3 is not heard
        led("b/0", 1, 10, {3: 10}),  # broker 3 is not heard
        followed("a/2", 1, 3, 10),  # led elsewhere: not this broker's to report
    ]
    metrics = BrokerMetrics(1, lambda: groups)
    metrics.register_cluster(probes(hears=lambda peer: peer != 3))
    found = samples(metrics.expose())
    assert value(found, "kafkaesque_under_replicated_partitions", broker="1") == 2
    name = "kafkaesque_partition_under_replicated"
    under = {
        (t, p): value(found, name, broker="1", topic=t, partition=p)
        for t, p in (("a", "0"), ("a", "1"), ("b", "0"), ("a", "2"))
    }
    assert under == {("a", "0"): 0, ("a", "1"): 1, ("b", "0"): 1, ("a", "2"): None}
    in_sync = value(
        found, "kafkaesque_partition_in_sync_replicas", broker="1", topic="a", partition="1"
    )
    assert in_sync == 2


def test_without_cluster_probes_every_follower_counts_as_heard() -> None:
    metrics = BrokerMetrics(1, lambda: [led("a/0", 1, 10, {2: 10, 3: 10})])
    found = samples(metrics.expose())
    assert value(found, "kafkaesque_under_replicated_partitions", broker="1") == 0


# -- the cluster gauges: brokers up, offline partitions, consumer-group lag -------------------


def probes(
    *,
    registered: Iterable[int] = (1, 2, 3),
    hears: Any = lambda peer: True,
    partitions: Iterable[tuple[str, int]] = (),
    leaders: Mapping[tuple[str, int], int] | None = None,
    committed: Iterable[tuple[str, str, int, int]] = (),
    ends: Mapping[tuple[str, int], int] | None = None,
    asked: list[list[tuple[str, int]]] | None = None,
) -> ClusterProbes:
    async def read_ends(wanted: list[tuple[str, int]]) -> Mapping[tuple[str, int], int]:
        if asked is not None:
            asked.append(wanted)
        return {k: v for k, v in (ends or {}).items() if k in wanted}

    return ClusterProbes(
        registered=lambda: list(registered),
        hears=hears,
        partitions=lambda: list(partitions),
        leader_of=lambda t, p: (leaders or {}).get((t, p)),
        committed=lambda: list(committed),
        ends=read_ends,
    )


def test_broker_up_is_what_this_broker_hears_of_each_registered_broker() -> None:
    metrics = BrokerMetrics(1, list)
    metrics.register_cluster(probes(registered=(1, 2, 3, 4), hears=lambda peer: peer in (1, 2)))
    found = samples(metrics.expose())
    up = {p: value(found, "kafkaesque_broker_up", broker="1", peer=str(p)) for p in range(1, 6)}
    assert up == {1: 1, 2: 1, 3: 0, 4: 0, 5: None}


def test_a_broker_counts_itself_up_even_before_it_is_registered() -> None:
    metrics = BrokerMetrics(7, list)
    metrics.register_cluster(probes(registered=(), hears=lambda peer: False))
    found = samples(metrics.expose())
    assert value(found, "kafkaesque_broker_up", broker="7", peer="7") == 1


def test_offline_partitions_are_those_with_no_known_leader() -> None:
    metrics = BrokerMetrics(1, list)
    parts = [("a", 0), ("a", 1), ("a", 2), ("__consumer_offsets", 0)]
    metrics.register_cluster(probes(partitions=parts, leaders={("a", 0): 2, ("a", 2): 1}))
    found = samples(metrics.expose())
    assert value(found, "kafkaesque_offline_partitions", broker="1") == 2


def test_a_partition_led_here_without_a_quorum_heard_is_offline() -> None:
    groups = [
        led("a/0", 1, 10, {2: 10, 3: 10}),  # hears 1 of 3 voters (itself): stranded
        led("a/1", 1, 10, {2: 10}),  # hears 1 of 2: stranded too (no majority)
        led("a/2", 1, 10, {3: 10, 4: 10}),  # hears 2 of 3 (itself and 4): serving
    ]
    leaders = {("a", p): 1 for p in range(3)}
    metrics = BrokerMetrics(1, lambda: groups)
    parts = [("a", 0), ("a", 1), ("a", 2)]
    metrics.register_cluster(
        probes(partitions=parts, leaders=leaders, hears=lambda peer: peer == 4)
    )
    found = samples(metrics.expose())
    assert value(found, "kafkaesque_offline_partitions", broker="1") == 2


def test_consumer_group_lag_is_the_high_watermark_minus_the_committed_offset() -> None:
    asked: list[list[tuple[str, int]]] = []
    committed = [("g", "a", 0, 5), ("g", "a", 1, 30), ("h", "a", 0, 9), ("g", "gone", 0, 1)]
    ends = {("a", 0): 12, ("a", 1): 28}  # a/1: committed read after the end (never negative)
    metrics = BrokerMetrics(1, list)
    metrics.register_cluster(probes(committed=committed, ends=ends, asked=asked))
    assert value(samples(metrics.expose()), "kafkaesque_consumer_group_lag", broker="1",
                 group="g", topic="a", partition="0") is None  # fmt: skip
    found = samples(trio.run(metrics.scrape))
    assert asked == [[("a", 0), ("a", 1), ("gone", 0)]]  # each partition once, in one call

    def lag(group: str, topic: str, partition: int) -> float | None:
        labels = {"broker": "1", "group": group, "topic": topic, "partition": str(partition)}
        return value(found, "kafkaesque_consumer_group_lag", **labels)

    assert (lag("g", "a", 0), lag("g", "a", 1), lag("h", "a", 0)) == (7, 0, 3)
    assert lag("g", "gone", 0) is None  # its end is unknown: no figure rather than a wrong one
    committed_g0 = value(found, "kafkaesque_consumer_group_committed_offset", broker="1",
                         group="g", topic="a", partition="0")  # fmt: skip
    assert committed_g0 == 5


def test_a_failing_read_of_the_ends_leaves_the_scrape_without_lag_not_broken() -> None:
    calls = 0

    async def ends(wanted: list[tuple[str, int]]) -> Mapping[tuple[str, int], int]:
        nonlocal calls
        calls += 1
        if calls > 1:
            raise RuntimeError("a bug in reading the ends")
        return {("a", 0): 10}

    base = probes(committed=[("g", "a", 0, 4)])
    metrics = BrokerMetrics(1, list)
    metrics.register_cluster(
        ClusterProbes(
            base.registered, base.hears, base.partitions, base.leader_of, base.committed, ends
        )
    )
    name = "kafkaesque_consumer_group_lag"
    labels = {"broker": "1", "group": "g", "topic": "a", "partition": "0"}
    assert value(samples(trio.run(metrics.scrape)), name, **labels) == 6
    found = samples(trio.run(metrics.scrape))  # no stale figure, and the rest is all there
    assert value(found, name, **labels) is None
    assert value(found, "kafkaesque_broker_up", broker="1", peer="1") == 1


def test_no_coordinated_group_asks_for_no_ends() -> None:
    asked: list[list[tuple[str, int]]] = []
    metrics = BrokerMetrics(1, list)
    metrics.register_cluster(probes(asked=asked))
    trio.run(metrics.scrape)
    assert asked == []


# -- request labels: protocol words, a bounded set for what is not a command ------------------


@pytest.mark.parametrize(
    ("line", "word"),
    [
        (b"PUBS t hello", "PUBS"),
        (b"pubs t hello", "PUBS"),
        (b"PUB t key=k hello", "PUB"),
        (b"SUBS t g", "SUBS"),
        (b"CONS t 0.abc 0", "CONS"),
        (b"FETCH t 0 0", "FETCH"),
        (b"CREATE t 1 1", "CREATE"),
        (b"ALTER t partitions=4", "ALTER"),
        (b"LIST", "LIST"),
        (b"DESCRIBE t", "DESCRIBE"),
        (b"DELETE t", "DELETE"),
        (b"COMMIT g t 0 5", "COMMIT"),
        (b"OFFSETS g t", "OFFSETS"),
        (b"GROUPS g t", "GROUPS"),
        (b"LEAVE 0.abc", "LEAVE"),
        (b"METADATA", "METADATA"),
        (b"REASSIGN t 0 1,2", "REASSIGN"),
        (b"ADDBROKER 4 127.0.0.1:1 127.0.0.1:2", "ADDBROKER"),
        (b"HELP", "HELP"),
        (b"PING", "PING"),
        (b"QUIT", "QUIT"),
    ],
)
def test_a_command_is_labelled_by_the_word_the_client_typed(line: bytes, word: str) -> None:
    decoder = LineDecoder()
    decoder.feed(line + b"\r\n")
    (command,) = decoder.events()
    assert not isinstance(command, BadCommand), command
    assert command_word(command) == word


def test_a_batch_publish_is_labelled_pubb() -> None:
    decoder = LineDecoder()
    decoder.feed(b"PUBB t 0 3\r\nabc\r\n")
    (command,) = decoder.events()
    assert not isinstance(command, BadCommand)
    assert command_word(command) == "PUBB"


def test_unknown_and_malformed_lines_are_counted_under_two_labels_never_their_text() -> None:
    metrics = BrokerMetrics(1, list)
    decoder = LineDecoder()
    decoder.feed(b"FROBNICATE secret-token\r\nPUB\r\nxyzzy\r\nPING extra words\r\n")
    for event in decoder.events():
        assert isinstance(event, BadCommand)
        metrics.bad_command(event)
    found = samples(metrics.expose())
    requests = {
        dict(labels)["command"]: v
        for (name, labels), v in found.items()
        if name == "kafkaesque_requests_total"
    }
    assert requests == {UNKNOWN_COMMAND: 2, MALFORMED_COMMAND: 2}
    errors = {
        (dict(labels)["command"], dict(labels)["code"]): v
        for (name, labels), v in found.items()
        if name == "kafkaesque_request_errors_total"
    }
    assert errors == {
        (UNKNOWN_COMMAND, ErrorCode.UNKNOWN_COMMAND.name): 2,
        (MALFORMED_COMMAND, ErrorCode.BAD_ARGS.name): 2,
    }


# -- docs/operations.md: its table names every metric a broker exposes ------------------------


def _documented_metrics() -> set[str]:
    """The metric names in the first column of docs/operations.md's "Metrics" table."""
    page = (Path(__file__).parents[2] / "docs" / "operations.md").read_text()
    section = page.split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return {name for row in rows for name in re.findall(r"`(kafkaesque_\w+)`", row.split("|")[1])}


def test_the_operations_page_documents_every_metric_and_no_other() -> None:
    metrics = BrokerMetrics(1, list)
    metrics.register_cluster(probes())
    exposed = {
        line.split()[2]
        for line in metrics.expose().decode().splitlines()
        if line.startswith("# TYPE ") and not line.split()[2].endswith("_created")
    }
    assert _documented_metrics() == exposed
