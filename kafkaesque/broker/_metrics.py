"""A broker's Prometheus metrics (prometheus-client), served at ``/metrics`` on the admin port.

Counters and histograms are updated where things happen; the per-partition gauges (leader,
term, commit index, follower lag) are read from the Raft groups when Prometheus scrapes, so an
idle broker with a thousand partitions pays nothing for them between scrapes. Each broker has its
own registry: several brokers in one process (the tests) do not mix their figures.

The cluster-wide figures an operator alerts on are read at scrape time too, through
``ClusterProbes`` (callables: the metrics hold no ``Broker``): which brokers this one hears,
the partitions it leads whose followers are not all in sync (Kafka's UnderReplicatedPartitions),
the partitions with no known leader (Kafka's OfflinePartitionsCount), and the lag of the consumer
groups it coordinates. Requests are counted by their protocol word (``PUBS``, ``FETCH``), and a
line that is not a command by ``UNKNOWN`` (an unknown word) or ``MALFORMED`` (anything else the
decoder refused): a bounded set of labels, never the client's text.
"""

from __future__ import annotations

import itertools
import logging
import time
from bisect import bisect_left
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from kafkaesque.protocol import (
    BadCommand,
    Command,
    ErrorCode,
    LocalProtocolError,
    encode_command,
)
from kafkaesque.raft import Role
from kafkaesque.raft.driver import RaftReplica

log = logging.getLogger("kafkaesque.broker.metrics")

_LATENCY_BUCKETS = (
    0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0
)  # fmt: skip


UNKNOWN_COMMAND = "UNKNOWN"
"""The ``command`` label of a line whose first word is no command."""
MALFORMED_COMMAND = "MALFORMED"
"""The ``command`` label of any other line the decoder refused (bad arguments, too long, a
payload not followed by CRLF): the decoder does not say which command it was."""

IN_SYNC_WINDOW_S = 10.0
"""How long a follower may go without reaching where its leader's log ended at the previous
scrape before it counts as out of sync (Kafka's ``replica.lag.time.max.ms``, 30 s there; ours is
shorter because a Raft follower that keeps up is a few milliseconds behind)."""

_words: dict[type[Command], str] = {}


def command_word(command: Command) -> str:
    """The protocol word a client types for ``command`` (``Pubs`` -> ``PUBS``, ``AlterTopic`` ->
    ``ALTER``): the first word of its encoding, found once per command type and remembered.

    Taken from ``encode_command`` rather than from a table here so that the protocol stays the
    one place that knows the words (a command added there is labelled right with no change
    here). A command that cannot be encoded (never one decoded from a client's line) is labelled
    by its class name, not remembered.
    """
    kind = type(command)
    word = _words.get(kind)
    if word is None:
        try:
            word = encode_command(command).split(None, 1)[0].decode("ascii")
        except (LocalProtocolError, ValueError, IndexError):
            return kind.__name__
        _words[kind] = word
    return word


def bad_command_label(event: BadCommand) -> str:
    """``UNKNOWN`` for an unknown command word, else ``MALFORMED`` (see the module docstring)."""
    return UNKNOWN_COMMAND if event.code is ErrorCode.UNKNOWN_COMMAND else MALFORMED_COMMAND


@dataclass(frozen=True)
class ClusterProbes:
    """What the cluster-wide gauges read when scraped, each a callable of the broker's services.

    ``registered``: the broker ids of the metadata view's registry. ``hears(peer)``: whether this
    broker hears that peer now (the Raft driver's pings). ``partitions``: every partition of the
    metadata view, as (topic, partition). ``leader_of(topic, partition)``: its leader as known
    here, or None. ``committed``: (group, topic, partition, committed offset) of every group this
    broker coordinates. ``ends(partitions)``: the high watermark of each of those partitions as
    its leader has it now (awaited once per scrape; a partition left out has an unknown end).
    """

    registered: Callable[[], Iterable[int]]
    hears: Callable[[int], bool]
    partitions: Callable[[], Iterable[tuple[str, int]]]
    leader_of: Callable[[str, int], int | None]
    committed: Callable[[], Iterable[tuple[str, str, int, int]]]
    ends: Callable[[list[tuple[str, int]]], Awaitable[Mapping[tuple[str, int], int]]]


class BrokerMetrics:
    """Every metric of one broker; ``expose()`` renders them in the text format, ``scrape()``
    first reads what must be awaited (the consumer groups' log ends), then renders them."""

    def __init__(self, broker_id: int, replicas: Callable[[], Iterable[RaftReplica]]) -> None:
        self._broker_id = broker_id
        self._replicas = replicas
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
        # Security (docs/security.md): AUTHs answered AUTH_FAILED, and commands refused
        # NOT_AUTHORIZED by the operation they needed (a bounded set of labels).
        self._auth_failures = Counter(
            "kafkaesque_auth_failures",
            "AUTH attempts answered AUTH_FAILED (wrong credentials, a broken exchange, or an "
            "address refused for failing too often).",
            registry=self.registry,
        )
        self._authorization_failures = Counter(
            "kafkaesque_authorization_failures",
            "Commands refused NOT_AUTHORIZED, by the operation they needed (unauthenticated: "
            "the connection had not authenticated).",
            ["operation"],
            registry=self.registry,
        )
        self._mqtt_authorization_failures = Counter(
            "kafkaesque_mqtt_authorization_failures",
            "MQTT operations the ACL file refused, by action (publish, subscribe, receive, will).",
            ["action"],
            registry=self.registry,
        )
        self._in_sync = InSyncTracker()
        self._partitions = _PartitionCollector(broker_id, replicas, self._in_sync)
        self.registry.register(self._partitions)
        self._request_children: dict[str, Counter] = {}
        self._cluster: _ClusterCollector | None = None
        # Told of each refused login too (the console's timeline), after it is counted.
        self.on_auth_failed: Callable[[], None] = lambda: None

    def register_cluster(self, probes: ClusterProbes) -> None:
        """Expose the cluster-wide gauges (brokers up, under-replicated and offline partitions,
        consumer-group lag), read through ``probes`` at scrape time."""
        self._partitions.hears = probes.hears
        self._cluster = _ClusterCollector(self._broker_id, probes, self._replicas)
        self.registry.register(self._cluster)

    async def scrape(self) -> bytes:
        """``expose()``, after awaiting what the lag gauges need (the leaders' high watermarks
        of the partitions the coordinated groups committed in, each leader asked once)."""
        if self._cluster is not None:
            try:
                await self._cluster.refresh_lag()
            except Exception:  # a bug: the scrape goes on without lag figures, the broker serves
                log.exception("broker %d: reading the consumer groups' lag failed", self._broker_id)
                self._cluster.forget_lag()
        return self.expose()

    def bad_command(self, event: BadCommand) -> None:
        """Count a line the decoder refused, as a request and as an error (bounded labels)."""
        label = bad_command_label(event)
        self.request(label)
        self.error(label, event.code)

    def register_mqtt(self, stats: Callable[[], Mapping[str, int]]) -> None:
        """Expose the MQTT listener's counters (read at scrape time: nothing per message)."""
        self.registry.register(_MqttCollector(stats))

    def request(self, command: str) -> None:
        """Count one request labelled ``command`` (a protocol word: see ``command_word``)."""
        child = self._request_children.get(command)
        if child is None:
            child = self._request_children[command] = self._requests.labels(command)
        child.inc()

    def auth_failed(self) -> None:
        """Count one AUTH answered ``AUTH_FAILED`` (and tell ``on_auth_failed``)."""
        self._auth_failures.inc()
        self.on_auth_failed()

    def authorization_failed(self, operation: str) -> None:
        """Count one command refused ``NOT_AUTHORIZED`` for lack of ``operation`` (an ACL
        operation's word, or ``unauthenticated``)."""
        self._authorization_failures.labels(operation).inc()

    def mqtt_authorization_failed(self, action: str) -> None:
        """Count one MQTT ``action`` the ACL refused (a bounded set of words)."""
        self._mqtt_authorization_failures.labels(action).inc()

    def error(self, command: str, code: ErrorCode) -> None:
        """Count one ``-ERR code`` answered to a ``command`` (a protocol word)."""
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


class InSyncTracker:
    """Which followers of the partitions led here are in sync: Kafka's ISR rule, judged at each
    scrape (nothing is tracked between scrapes, so an unscraped broker pays nothing).

    A follower is in sync when this broker hears it (``heard``) and it was seen, within
    ``window_s``, to have reached the offset its leader's log ended at when the previous scrape
    looked (a follower that keeps up under load is a few entries behind the end at any instant,
    but always past where the end was a scrape ago). A follower seen for the first time gets the
    benefit of one window: a leader that just took over knows nothing of how it did before.

    ``observe`` is called once per (partition, follower) between ``begin`` and ``end``; followers
    not observed in a round are forgotten (the partition is no longer led here).
    """

    def __init__(
        self, window_s: float = IN_SYNC_WINDOW_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._window_s = window_s
        self._clock = clock
        # (partition, follower) -> (the leader's end when last observed, when it was caught up)
        self._seen: dict[tuple[str, int], tuple[int, float]] = {}
        self._next: dict[tuple[str, int], tuple[int, float]] = {}
        self._now = 0.0

    def begin(self) -> None:
        """Start a round (one scrape)."""
        self._now = self._clock()
        self._next = {}

    def observe(self, partition: str, follower: int, match: int, end: int, heard: bool) -> bool:
        """Whether ``follower`` of ``partition`` is in sync; ``match`` is the last offset it is
        known to hold, ``end`` the leader's last offset now."""
        key = (partition, follower)
        previous = self._seen.get(key)
        if previous is None:
            caught_at = self._now
        else:
            target, caught_at = previous
            # min: a leader that lost and regained the partition may have a shorter log now.
            if match >= min(target, end):
                caught_at = self._now
        self._next[key] = (end, caught_at)
        return heard and self._now - caught_at <= self._window_s

    def end(self) -> None:
        """End the round: forget the followers it did not observe."""
        self._seen, self._next = self._next, {}


class _PartitionCollector(Collector):
    """Per-partition gauges, read from the Raft groups at scrape time."""

    def __init__(
        self,
        broker_id: int,
        replicas: Callable[[], Iterable[RaftReplica]],
        in_sync: InSyncTracker,
    ) -> None:
        self._broker = str(broker_id)
        self._replicas = replicas
        self._in_sync = in_sync
        self.hears: Callable[[int], bool] = lambda peer: True  # until ClusterProbes say

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
        divergences = CounterMetricFamily(
            "kafkaesque_partition_divergences",
            "Times this replica cut its log where it disagreed with its leader's below its "
            "commit: a quorum lost records committed here (fsync policy interval or never, "
            "then a power cut).",
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
        in_sync = GaugeMetricFamily(
            "kafkaesque_partition_in_sync_replicas",
            "Replicas in sync, the leader included (reported by the leader).",
            labels=labels,
        )
        under = GaugeMetricFamily(
            "kafkaesque_partition_under_replicated",
            "1 if a replica of this partition led here is not in sync (reported by the leader).",
            labels=labels,
        )
        under_count = 0
        self._in_sync.begin()
        for replica in self._replicas():
            topic, _, partition = replica.id.rpartition("/")
            key = [self._broker, topic, partition]
            node = replica.node
            leader.add_metric(key, -1 if node.leader is None else node.leader)
            is_leader.add_metric(key, 1 if node.role is Role.LEADER else 0)
            term.add_metric(key, node.term)
            commit.add_metric(key, replica.commit_index)
            end.add_metric(key, replica.log.log_end_offset)
            corruptions.add_metric(key, replica.log.corruptions)
            divergences.add_metric(key, replica.divergences)
            status = node.status()
            repairing.add_metric(key, 0 if status.lost_end is None else 1)
            if node.role is Role.LEADER:
                synced = 1  # the leader itself
                followers = 0
                for peer, progress in status.progress.items():
                    if peer != status.id:
                        followers += 1
                        lag.add_metric([*key, str(peer)], status.last_index - progress.match)
                        synced += self._in_sync.observe(
                            replica.id, peer, progress.match, status.last_index, self.hears(peer)
                        )
                in_sync.add_metric(key, synced)
                short = 1 if synced < followers + 1 else 0
                under.add_metric(key, short)
                under_count += short
        self._in_sync.end()
        yield from (leader, is_leader, term, commit, end, corruptions, divergences, repairing)
        yield lag
        yield from (in_sync, under)
        count = GaugeMetricFamily(
            "kafkaesque_under_replicated_partitions",
            "Partitions led here with a replica not in sync (Kafka's UnderReplicatedPartitions).",
            labels=["broker"],
        )
        count.add_metric([self._broker], under_count)
        yield count


class _ClusterCollector(Collector):
    """The gauges of the cluster as this broker sees it: brokers up, offline partitions, and the
    lag of the consumer groups it coordinates (see ``ClusterProbes``)."""

    def __init__(
        self, broker_id: int, probes: ClusterProbes, replicas: Callable[[], Iterable[RaftReplica]]
    ) -> None:
        self._id = broker_id
        self._broker = str(broker_id)
        self._probes = probes
        self._replicas = replicas
        # (group, topic, partition) -> (committed, high watermark), as of the last refresh
        self._lag: dict[tuple[str, str, int], tuple[int, int]] = {}

    async def refresh_lag(self) -> None:
        """Read the coordinated groups' committed offsets and their partitions' high watermarks
        (one request per leader, all at once: ``ClusterProbes.ends``) for the next ``collect``.

        The committed offsets are read again after the await: a commit made meanwhile is shown
        (against a high watermark read a moment before, so the lag never shows negative: 0).
        """
        wanted = sorted({(topic, p) for _, topic, p, _ in self._probes.committed()})
        ends = await self._probes.ends(wanted) if wanted else {}
        self._lag = {
            (group, topic, p): (offset, ends[(topic, p)])
            for group, topic, p, offset in self._probes.committed()
            if (topic, p) in ends
        }

    def forget_lag(self) -> None:
        """Show no lag figures until the next refresh (better none than stale ones)."""
        self._lag = {}

    def collect(self) -> Iterator[Metric]:
        probes = self._probes
        up = GaugeMetricFamily(
            "kafkaesque_broker_up",
            "1 if this broker hears the registered broker `peer` (itself included), else 0.",
            labels=["broker", "peer"],
        )
        for peer in sorted({*probes.registered(), self._id}):
            heard = peer == self._id or probes.hears(peer)
            up.add_metric([self._broker, str(peer)], 1 if heard else 0)
        stranded = self._stranded()
        offline = sum(
            1
            for t, p in probes.partitions()
            if (t, p) in stranded or probes.leader_of(t, p) is None
        )
        offline_family = GaugeMetricFamily(
            "kafkaesque_offline_partitions",
            "Partitions with no leader known here, or led here without a quorum of voters heard "
            "(Kafka's OfflinePartitionsCount).",
            labels=["broker"],
        )
        offline_family.add_metric([self._broker], offline)
        labels = ["broker", "group", "topic", "partition"]
        committed = GaugeMetricFamily(
            "kafkaesque_consumer_group_committed_offset",
            "A group's committed offset (the next it reads), for groups coordinated here.",
            labels=labels,
        )
        lag = GaugeMetricFamily(
            "kafkaesque_consumer_group_lag",
            "High watermark minus committed offset, for groups coordinated here.",
            labels=labels,
        )
        for (group, topic, p), (offset, end) in sorted(self._lag.items()):
            key = [self._broker, group, topic, str(p)]
            committed.add_metric(key, offset)
            lag.add_metric(key, max(0, end - offset))
        yield from (up, offline_family, committed, lag)

    def _stranded(self) -> set[tuple[str, int]]:
        """The partitions this broker leads without hearing a majority of their voters (itself
        included): it can commit nothing, as if there were no leader. An idle Raft leader is
        quiescent and does not tick, so it only steps down (check-quorum) once woken; until
        then only this count tells that it is cut off."""
        hears = self._probes.hears
        stranded = set()
        for replica in self._replicas():
            node = replica.node
            if node.role is not Role.LEADER:
                continue
            voters = node.configuration.voters
            heard = sum(1 for v in voters if v == self._id or hears(v))
            if 2 * heard <= len(voters):
                topic, _, partition = replica.id.rpartition("/")
                stranded.add((topic, int(partition)))
        return stranded


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
