"""A broker's Prometheus metrics (prometheus-client), served at ``/metrics`` on the admin port.

Counters and histograms are updated where things happen; the per-partition gauges (leader,
term, commit index, follower lag) are read from the Raft groups when Prometheus scrapes, so an
idle broker with a thousand partitions pays nothing for them between scrapes. Each broker has its
own registry: several brokers in one process (the tests) do not mix their figures.
"""

from __future__ import annotations

import itertools
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from kafkaesque.protocol import ErrorCode
from kafkaesque.raft import Role
from kafkaesque.raft._driver import RaftGroup

_LATENCY_BUCKETS = (
    0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0
)  # fmt: skip


class BrokerMetrics:
    """Every metric of one broker; ``expose()`` renders them in the text format."""

    def __init__(self, broker_id: int, groups: Callable[[], Iterable[RaftGroup]]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self._requests = Counter(
            "kafkaesque_requests",
            "Client commands received, by command.",
            ["command"],
            registry=self.registry,
        )
        self._errors = Counter(
            "kafkaesque_request_errors",
            "Commands answered -ERR, by command and error code.",
            ["command", "code"],
            registry=self.registry,
        )
        self.elections = Counter(
            "kafkaesque_leader_elections",
            "Times a partition replica on this broker became leader.",
            registry=self.registry,
        )
        self.commit_latency = LatencyHistogram(
            "kafkaesque_commit_latency_seconds",
            "From a write's start to its acknowledgement (quorum commit, or leader append).",
        )
        self.fsync_latency = LatencyHistogram(
            "kafkaesque_fsync_latency_seconds",
            "Each group commit: the fsyncs of every log a Raft step touched, run in parallel.",
        )
        self.registry.register(self.commit_latency)
        self.registry.register(self.fsync_latency)
        self.connections = Counter(
            "kafkaesque_client_connections",
            "Client connections accepted.",
            registry=self.registry,
        )
        self.registry.register(_PartitionCollector(broker_id, groups))
        self._request_children: dict[str, Counter] = {}

    def register_mqtt(self, stats: Callable[[], Mapping[str, int]]) -> None:
        """Expose the MQTT listener's counters (read at scrape time: nothing per message)."""
        self.registry.register(_MqttCollector(stats))

    def request(self, command: str) -> None:
        child = self._request_children.get(command)
        if child is None:
            child = self._request_children[command] = self._requests.labels(command)
        child.inc()

    def error(self, command: str, code: ErrorCode) -> None:
        self._errors.labels(command, code.name).inc()

    def expose(self) -> bytes:
        return generate_latest(self.registry)


class LatencyHistogram(Collector):
    """A histogram of seconds observed on the event loop's thread, rendered when scraped.

    Observed once or twice per write: prometheus-client's ``Histogram`` takes a lock for its
    sum and one for a bucket (7 Python calls an observation, measured), this one bisects once.
    Not thread-safe: observe from one thread (the event loop's), as the broker does; a scrape
    from that thread too (the admin port's handler) reads a consistent state.
    """

    def __init__(
        self, name: str, documentation: str, buckets: tuple[float, ...] = _LATENCY_BUCKETS
    ) -> None:
        if list(buckets) != sorted(set(buckets)):
            raise ValueError(f"{name}: buckets must be increasing: {buckets}")
        self.name = name
        self.documentation = documentation
        self._bounds = buckets
        self._counts = [0] * (len(buckets) + 1)  # the last one: above every bound (+Inf)
        self._sum = 0.0

    def observe(self, seconds: float) -> None:
        """Count one observation (in the first bucket whose bound is >= ``seconds``)."""
        self._counts[bisect_left(self._bounds, seconds)] += 1
        self._sum += seconds

    def collect(self) -> Iterator[Metric]:
        cumulative = list(itertools.accumulate(self._counts))
        buckets = [(repr(float(b)), n) for b, n in zip(self._bounds, cumulative, strict=False)]
        buckets.append(("+Inf", cumulative[-1]))
        yield HistogramMetricFamily(
            self.name, self.documentation, buckets=buckets, sum_value=self._sum
        )


class _PartitionCollector(Collector):
    """Per-partition gauges, read from the Raft groups at scrape time."""

    def __init__(self, broker_id: int, groups: Callable[[], Iterable[RaftGroup]]) -> None:
        self._broker = str(broker_id)
        self._groups = groups

    def collect(self) -> Iterator[Metric]:
        labels = ["broker", "topic", "partition"]
        leader = GaugeMetricFamily(
            "kafkaesque_partition_leader", "The partition's leader (-1: unknown).", labels=labels
        )
        is_leader = GaugeMetricFamily(
            "kafkaesque_partition_is_leader", "1 if this broker leads the partition.", labels=labels
        )
        term = GaugeMetricFamily("kafkaesque_partition_term", "Raft term.", labels=labels)
        commit = GaugeMetricFamily(
            "kafkaesque_partition_commit_index", "Last committed offset.", labels=labels
        )
        end = GaugeMetricFamily(
            "kafkaesque_partition_log_end_offset", "Next offset of the local log.", labels=labels
        )
        corruptions = CounterMetricFamily(
            "kafkaesque_partition_corruptions",
            "Corrupt batches this replica found in its log (on read, by the scrub, on restart).",
            labels=labels,
        )
        repairing = GaugeMetricFamily(
            "kafkaesque_partition_repairing",
            "1 while this replica re-replicates entries it lost (it does not vote meanwhile).",
            labels=labels,
        )
        lag = GaugeMetricFamily(
            "kafkaesque_partition_follower_lag",
            "Offsets a follower is behind the leader's log (reported by the leader).",
            labels=[*labels, "follower"],
        )
        for group in self._groups():
            topic, _, partition = group.id.rpartition("/")
            key = [self._broker, topic, partition]
            node = group.node
            leader.add_metric(key, -1 if node.leader is None else node.leader)
            is_leader.add_metric(key, 1 if node.role is Role.LEADER else 0)
            term.add_metric(key, node.term)
            commit.add_metric(key, group.commit_index)
            end.add_metric(key, group.log.log_end_offset)
            corruptions.add_metric(key, group.log.corruptions)
            status = node.status()
            repairing.add_metric(key, 0 if status.lost_end is None else 1)
            if node.role is Role.LEADER:
                for peer, progress in status.progress.items():
                    if peer != status.id:
                        lag.add_metric([*key, str(peer)], status.last_index - progress.match)
        yield from (leader, is_leader, term, commit, end, corruptions, repairing, lag)


MQTT_GAUGES = frozenset({"connected", "subscriptions", "retained"})


class _MqttCollector(Collector):
    """The MQTT listener's figures: ``kafkaesque_mqtt_<name>`` (gauges and counters)."""

    def __init__(self, stats: Callable[[], Mapping[str, int]]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        for name, value in sorted(self._stats().items()):
            if name in MQTT_GAUGES:
                yield GaugeMetricFamily(f"kafkaesque_mqtt_{name}", f"MQTT {name}.", value=value)
            else:
                yield CounterMetricFamily(f"kafkaesque_mqtt_{name}", f"MQTT {name}.", value=value)
