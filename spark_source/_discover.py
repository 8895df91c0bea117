"""The driver's view of the cluster: which partitions a subscription reads, and their bounds.

Runs where Spark plans (the driver's Python planner), through the client library's ``Client``:
one ``LIST`` for a pattern, one ``DESCRIBE`` per topic. A broker that holds no replica of a
partition leaves its start and end out of its rows; those are asked of the partition's leader.
"""

from __future__ import annotations

from kafkaesque.client import (
    Call,
    Client,
    KafkaesqueError,
    ListResponse,
    Pinned,
    Response,
    TopicPartition,
)
from kafkaesque.protocol import DescribeTopic, ErrorCode, ErrorReply, PartitionRow

from ._offsets import Bounds, name
from ._options import OptionError, Subscription


def subscribed_topics(client: Client, subscription: Subscription) -> list[str]:
    """The topics ``subscription`` reads now (a pattern's matches among the existing topics)."""
    if subscription.pattern is not None:
        return [row.topic for row in client.list_topics() if subscription.matches(row.topic)]
    if subscription.assigned:
        return sorted({tp.topic for tp in subscription.assigned})
    return list(subscription.topics)


def discover(client: Client, subscription: Subscription) -> dict[TopicPartition, Bounds]:
    """Every partition ``subscription`` reads now, with its log start and high watermark.

    Raises ``OptionError`` for a topic named by ``subscribe`` or ``assign`` that does not exist,
    or a partition ``assign`` names that its topic does not have (a pattern that matches nothing
    reads nothing). Other failures are the client's ``KafkaesqueError`` after its retries.
    """
    bounds: dict[TopicPartition, Bounds] = {}
    for topic in subscribed_topics(client, subscription):
        try:
            rows = _partition_rows(client, topic)
        except KafkaesqueError as exc:
            if exc.code is not ErrorCode.UNKNOWN_TOPIC:
                raise
            if subscription.pattern is not None:
                continue  # deleted between LIST and DESCRIBE: no longer matched
            raise OptionError(
                f"topic {topic!r} does not exist ({subscription.describe()})"
            ) from exc
        for tp, row_bounds in rows.items():
            if not subscription.assigned or tp in subscription.assigned:
                bounds[tp] = row_bounds
    missing = [tp for tp in subscription.assigned if tp not in bounds]
    if missing:
        raise OptionError(
            "assign names partitions that do not exist: " + ", ".join(name(tp) for tp in missing)
        )
    return bounds


def partition_bounds(client: Client, tp: TopicPartition) -> Bounds | None:
    """One partition's bounds now, or None if its topic or the partition is gone."""
    try:
        rows = _partition_rows(client, tp.topic)
    except KafkaesqueError as exc:
        if exc.code is ErrorCode.UNKNOWN_TOPIC:
            return None
        raise
    return rows.get(tp)


def _partition_rows(client: Client, topic: str) -> dict[TopicPartition, Bounds]:
    rows = {row.partition: row for row in client.describe_topic(topic).partitions}
    unbounded = [row for row in rows.values() if row.start_offset is None or row.end_offset is None]
    if unbounded:
        client.refresh_metadata([topic])
        brokers = client.state.metadata.brokers
        for row in unbounded:
            leader = brokers.get(row.leader) if row.leader is not None else None
            if leader is None:
                raise KafkaesqueError(
                    ErrorCode.NOT_LEADER, f"{topic}/{row.partition} has no leader right now"
                )
            rows[row.partition] = _row_from(client, (leader.host, leader.port), row)
    bounds = {}
    for partition, row in rows.items():
        assert row.start_offset is not None and row.end_offset is not None
        bounds[TopicPartition(topic, partition)] = Bounds(row.start_offset, row.end_offset)
    return bounds


def _row_from(client: Client, address: tuple[str, int], row: PartitionRow) -> PartitionRow:
    """``row`` as the broker at ``address`` (a replica) describes it, with start and end."""

    def parse(response: Response) -> PartitionRow:
        if isinstance(response, ErrorReply):
            raise KafkaesqueError.from_reply(response)
        rows = response.rows if isinstance(response, ListResponse) else ()
        for got in rows:
            if not isinstance(got, PartitionRow) or got.partition != row.partition:
                continue
            if got.start_offset is not None and got.end_offset is not None:
                return got
        raise KafkaesqueError(
            ErrorCode.NOT_LEADER,
            f"{row.topic}/{row.partition}: the leader reported no offsets",
        )

    return client.call(Call(DescribeTopic(row.topic), parse, Pinned(address)))
