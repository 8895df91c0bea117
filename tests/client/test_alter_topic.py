"""The client library's topic administration of issue 26: ``create_topic(fsync=)`` and
``alter_topic``, blocking and trio, against real brokers."""

from __future__ import annotations

import pytest

from kafkaesque.client import AsyncClient, Client, KafkaesqueError
from kafkaesque.local_cluster import LocalCluster
from kafkaesque.protocol import ErrorCode, Fsync


async def test_the_trio_client_creates_with_a_policy_and_alters(
    broker_cluster: LocalCluster,
) -> None:
    async with AsyncClient(broker_cluster.bootstrap) as client:
        await client.create_topic("async-alter", 1, 3, fsync=Fsync.INTERVAL)
        assert await client.alter_topic("async-alter", partitions=2, retention_bytes=1 << 20)
        assert not await client.alter_topic("async-alter", partitions=2)  # in force already
        described = await client.describe_topic("async-alter")
        t = described.topic
        assert (t.partitions, t.retention_bytes, t.compact, t.fsync) == (
            2,
            1 << 20,
            False,
            Fsync.INTERVAL,
        )
        assert [p.partition for p in described.partitions] == [0, 1]
        with pytest.raises(KafkaesqueError) as refused:
            await client.alter_topic("async-alter", partitions=1)
        assert refused.value.code is ErrorCode.INVALID_CONFIG
        with pytest.raises(ValueError, match="at least one setting"):
            await client.alter_topic("async-alter")


def test_the_blocking_client_alters_and_refuses_an_empty_change(
    broker_cluster: LocalCluster,
) -> None:
    with Client(broker_cluster.bootstrap) as client:
        client.create_topic("sync-alter", 1, 3)
        assert client.alter_topic("sync-alter", compact=True, retention_ms=-1)
        t = client.describe_topic("sync-alter").topic
        assert (t.compact, t.retention_ms, t.fsync) == (True, None, None)
        with pytest.raises(KafkaesqueError) as refused:
            client.alter_topic("no-such-topic", partitions=3)
        assert refused.value.code is ErrorCode.UNKNOWN_TOPIC
        with pytest.raises(ValueError, match="at least one setting"):
            client.alter_topic("sync-alter")
