"""What the client knows of the cluster, and the pure mapping from list replies to results.

``ClusterMetadata`` is an immutable snapshot built from a ``METADATA`` reply: the brokers and, per
topic, each partition's leader and replicas. The rows are the protocol's own (``BrokerRow``,
``PartitionRow``, ``TopicRow``): no second vocabulary for the same facts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from kafkaesque.protocol import (
    BrokerRow,
    ErrorCode,
    OffsetRow,
    PartitionRow,
    RemoteProtocolError,
    TopicRow,
)

from ._errors import KafkaesqueError
from ._wire import ListResponse, shown

DEFAULT_PORT = 9092

Address = tuple[str, int]


def parse_bootstrap(bootstrap: str | Iterable[str]) -> list[Address]:
    """``"host:port,host:port"`` (or a list of ``host:port``) as addresses; port defaults to 9092.

    Raises ``ValueError`` for an empty list or a port that is not a number in [1, 65535].
    IPv6 literals are written in brackets: ``[::1]:9092``.
    """
    items = bootstrap.split(",") if isinstance(bootstrap, str) else list(bootstrap)
    addresses: list[Address] = []
    for item in (i.strip() for i in items):
        if not item:
            continue
        if item.startswith("["):
            host, _, rest = item[1:].partition("]")
            port_text = rest.removeprefix(":")
        else:
            host, colon, port_text = item.rpartition(":")
            if not colon:
                host, port_text = item, ""
        if not port_text:
            port = DEFAULT_PORT
        elif port_text.isdigit() and 1 <= int(port_text) <= 65535:
            port = int(port_text)
        else:
            raise ValueError(f"bad port in bootstrap address {item!r}")
        if not host:
            raise ValueError(f"no host in bootstrap address {item!r}")
        addresses.append((host, port))
    if not addresses:
        raise ValueError("the bootstrap list is empty")
    return addresses


def one_address(address: str | Address) -> list[Address]:
    """``address`` (``"host:port"`` or a pair) as a bootstrap list of one; ``ValueError`` for
    none or several."""
    if isinstance(address, tuple):
        return [address]
    addresses = parse_bootstrap(address)
    if len(addresses) != 1:
        raise ValueError(f"one address expected, not {address!r}")
    return addresses


@dataclass(frozen=True, slots=True)
class ClusterMetadata:
    """A snapshot of the cluster: brokers by id, and each known topic's partitions in order.

    ``partitions[topic]`` holds one ``PartitionRow`` per partition, sorted by partition number;
    a topic absent from it is unknown to this snapshot (it may exist and not have been asked for).
    """

    brokers: Mapping[int, BrokerRow] = field(default_factory=dict)
    partitions: Mapping[str, tuple[PartitionRow, ...]] = field(default_factory=dict)

    @classmethod
    def from_response(cls, response: ListResponse) -> ClusterMetadata:
        """Build the snapshot from a ``METADATA`` reply (``+BROKER`` then ``+PARTITION`` rows)."""
        brokers: dict[int, BrokerRow] = {}
        by_topic: dict[str, list[PartitionRow]] = {}
        for row in response.rows:
            if isinstance(row, BrokerRow):
                brokers[row.broker_id] = row
            elif isinstance(row, PartitionRow):
                by_topic.setdefault(row.topic, []).append(row)
            else:
                raise RemoteProtocolError(f"unexpected row in METADATA: {shown(row)}")
        return cls(
            brokers,
            {t: tuple(sorted(rows, key=lambda r: r.partition)) for t, rows in by_topic.items()},
        )

    def merged(self, newer: ClusterMetadata, topics: Iterable[str] = ()) -> ClusterMetadata:
        """This snapshot updated by ``newer``: its brokers, and its rows for each topic it names.

        ``topics`` are the topics ``newer`` was asked about: one it does not mention no longer
        exists and is forgotten. (A ``METADATA`` without topics describes every topic, and then
        ``newer`` replaces this snapshot.)
        """
        partitions = dict(self.partitions)
        for topic in topics:
            partitions.pop(topic, None)
        partitions.update(newer.partitions)
        return ClusterMetadata(dict(newer.brokers) or dict(self.brokers), partitions)

    def partition_count(self, topic: str) -> int | None:
        """How many partitions ``topic`` has, or None if this snapshot does not know the topic."""
        rows = self.partitions.get(topic)
        return None if rows is None else len(rows)

    def partition(self, topic: str, partition: int) -> PartitionRow | None:
        """The row of one partition, or None if unknown."""
        rows = self.partitions.get(topic, ())
        if 0 <= partition < len(rows) and rows[partition].partition == partition:
            return rows[partition]
        return next((r for r in rows if r.partition == partition), None)

    def leader(self, topic: str, partition: int) -> BrokerRow | None:
        """Where the partition's leader listens, or None (unknown partition, election, no row)."""
        row = self.partition(topic, partition)
        if row is None or row.leader is None:
            return None
        return self.brokers.get(row.leader)


@dataclass(frozen=True, slots=True)
class TopicDescription:
    """The answer to ``DESCRIBE``: the topic's settings and one row per partition, in order."""

    topic: TopicRow
    partitions: tuple[PartitionRow, ...]

    @classmethod
    def from_response(cls, response: ListResponse) -> TopicDescription:
        """Build it from a ``DESCRIBE`` reply (one ``+TOPIC`` row, then ``+PARTITION`` rows)."""
        topics = [r for r in response.rows if isinstance(r, TopicRow)]
        partitions = [r for r in response.rows if isinstance(r, PartitionRow)]
        if len(topics) != 1 or len(topics) + len(partitions) != len(response.rows):
            raise RemoteProtocolError(f"DESCRIBE answered {shown(response)}")
        return cls(topics[0], tuple(sorted(partitions, key=lambda r: r.partition)))


def topics_from_response(response: ListResponse) -> list[TopicRow]:
    """The ``+TOPIC`` rows of a ``LIST`` reply, sorted by name."""
    rows = [r for r in response.rows if isinstance(r, TopicRow)]
    if len(rows) != len(response.rows):
        raise RemoteProtocolError(f"LIST answered {shown(response)}")
    return sorted(rows, key=lambda r: r.topic)


def offsets_from_response(response: ListResponse) -> dict[int, int | None]:
    """Partition → committed offset (None: none committed) from an ``OFFSETS`` reply."""
    rows = [r for r in response.rows if isinstance(r, OffsetRow)]
    if len(rows) != len(response.rows):
        raise RemoteProtocolError(f"OFFSETS answered {shown(response)}")
    return {r.partition: r.offset for r in rows}


def unknown_topic(topic: str) -> KafkaesqueError:
    """The error for a topic the cluster's metadata does not list (retriable, as the broker's)."""
    return KafkaesqueError(ErrorCode.UNKNOWN_TOPIC, f"topic {topic} is not in the metadata")
