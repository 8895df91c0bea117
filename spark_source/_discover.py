"""The driver's view of the cluster: which partitions a subscription reads, and their bounds.

Runs where Spark plans (the driver's Python planner), through the client library's ``Client``:
one ``LIST`` for a pattern, one ``DESCRIBE`` per topic (``Client.partition_offsets``: a broker
that holds no replica of a partition leaves its start and end out of its rows; the client asks
those of the partition's leader).
"""

from __future__ import annotations

from kafkaesque.client import Client, ErrorCode, KafkaesqueError, TopicPartition

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
    return {
        TopicPartition(topic, partition): Bounds(start, end)
        for partition, (start, end) in client.partition_offsets(topic).items()
    }
