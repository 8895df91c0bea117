"""The client against real broker processes over TCP (the ``broker_cluster`` fixture).

One three-broker cluster serves the whole module; each test uses its own topic.
"""

from __future__ import annotations

from collections import defaultdict

import pytest
import trio

from kafkaesque.client import (
    AsyncClient,
    AsyncConsumer,
    Client,
    Consumer,
    ConsumerRecord,
    GroupConsumer,
    KafkaesqueError,
    OffsetReset,
    Producer,
    ProducerConfig,
    open_producer,
)
from kafkaesque.local_cluster import LocalCluster
from kafkaesque.protocol import ErrorCode, partition_for_key


def test_batched_keyed_records_read_back_in_order_by_offset(broker_cluster: LocalCluster) -> None:
    with Client(broker_cluster.bootstrap) as client:
        client.create_topic("orders", 3, 3)
        sent: defaultdict[int, list[tuple[int, bytes, bytes]]] = defaultdict(list)
        with Producer(client, ProducerConfig(linger_ms=2, batch_size=4096)) as producer:
            futures = [
                (
                    b"k%d" % (i % 7),
                    b"v%d" % i,
                    producer.send("orders", b"v%d" % i, b"k%d" % (i % 7)),
                )
                for i in range(3000)
            ]
            producer.flush()
        for key, value, future in futures:
            metadata = future.get()
            assert metadata.partition == partition_for_key(key, 3)
            sent[metadata.partition].append((metadata.offset, key, value))
        with Consumer(client) as consumer:
            consumer.assign_topic("orders")
            got: defaultdict[int, list[tuple[int, bytes | None, bytes | None]]] = defaultdict(list)
            for record in consumer.records(follow=False):
                got[record.partition].append((record.offset, record.key, record.value))
        assert got == sent  # every record, at the offset its future reported, in send order
        assert sorted(got) == [0, 1, 2]
        for rows in got.values():  # send order is offset order in each partition
            assert [o for o, _, _ in rows] == sorted(o for o, _, _ in rows)


def test_admin_create_describe_list_delete(broker_cluster: LocalCluster) -> None:
    with Client(broker_cluster.bootstrap) as client:
        assert client.ping() == "PONG"
        client.create_topic("admin-t", 2, 3, retention_ms=60_000, compact=True)
        with pytest.raises(KafkaesqueError) as info:
            client.create_topic("admin-t", 2, 3)
        assert info.value.code is ErrorCode.TOPIC_EXISTS
        description = client.describe_topic("admin-t")
        assert (description.topic.partitions, description.topic.replication_factor) == (2, 3)
        assert description.topic.compact and description.topic.retention_ms == 60_000
        assert [p.partition for p in description.partitions] == [0, 1]
        assert all(sorted(p.replicas) == [0, 1, 2] for p in description.partitions)
        assert "admin-t" in [t.topic for t in client.list_topics()]
        metadata = client.refresh_metadata()
        assert sorted(metadata.brokers) == [0, 1, 2] and metadata.partition_count("admin-t") == 2
        client.delete_topic("admin-t")
        with pytest.raises(KafkaesqueError) as info:
            client.describe_topic("admin-t")
        assert info.value.code is ErrorCode.UNKNOWN_TOPIC


def test_group_consumer_commits_and_resumes(broker_cluster: LocalCluster) -> None:
    with Client(broker_cluster.bootstrap) as client:
        client.create_topic("grouped", 2, 3)
        with Producer(client) as producer:
            for i in range(10):
                producer.send("grouped", b"m%d" % i, partition=i % 2)
        first = GroupConsumer(client, "grouped", "g1", auto_offset_reset=OffsetReset.EARLIEST)
        seen: list[ConsumerRecord] = []
        while len(seen) < 10:
            records = first.poll(1.0)
            assert records, "the group stopped short"
            seen += records
        first.commit()
        assert sorted(r.value or b"" for r in seen) == sorted(b"m%d" % i for i in range(10))
        committed = client.committed_offsets("g1", "grouped")
        assert set(committed) == {0, 1} and all(o is not None for o in committed.values())
        with Producer(client) as producer:
            producer.send("grouped", b"late", partition=1)
        resumed = GroupConsumer(client, "grouped", "g1")
        assert [r.value for r in resumed.poll(2.0)] == [b"late"]


async def test_trio_producer_and_a_follow_mode_consumer(broker_cluster: LocalCluster) -> None:
    async with AsyncClient(broker_cluster.bootstrap) as client:
        await client.create_topic("live", 1, 3)
        consumer = AsyncConsumer(client, auto_offset_reset="latest")
        await consumer.assign_topic("live")
        await consumer.seek_to_end()
        received: list[bytes] = []

        async def follow() -> None:
            async for record in consumer.records(follow=True, poll_timeout=0.5):
                assert record.value is not None
                received.append(record.value)
                if len(received) == 20:
                    return

        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(follow)
                await trio.sleep(0.2)  # the consumer is long-polling now
                async with open_producer(client) as producer:
                    futures = [await producer.send("live", b"n%d" % i) for i in range(20)]
                offsets = [(await f.get()).offset for f in futures]
        assert received == [b"n%d" % i for i in range(20)]
        assert offsets == sorted(offsets)
