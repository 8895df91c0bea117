"""aiokafka (a pure-Python asyncio Kafka client, its own protocol implementation) on a real
3-broker cluster: its admin client creates, describes and deletes a topic; an idempotent
producer with acks=all writes headers, null keys and values with each codec it offers (none,
gzip, snappy, lz4, zstd: cramjam) and they read back exactly; a group of two members splits a
topic after a rebalance, commits, and a new member resumes from the commits; offsets_for_times
seeks by timestamp. Each test runs its own asyncio loop (the suite's async tests are trio's)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pytest

from kafkaesque.local_cluster import LocalCluster

aiokafka = pytest.importorskip("aiokafka")
from aiokafka.admin import AIOKafkaAdminClient, NewTopic  # noqa: E402
from aiokafka.structs import TopicPartition  # noqa: E402

PARTITIONS = 4
T = TypeVar("T")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    directory = str(tmp_path_factory.mktemp("kafka-aiokafka"))
    with LocalCluster(directory, 3, extra_args=["--group-initial-rebalance-delay", "0.3"]) as c:
        c.wait_ready()
        yield c


def run(make: Callable[[], Coroutine[Any, Any, T]], seconds: float = 60.0) -> T:
    """Run one coroutine in a fresh asyncio loop, bounded in time."""

    async def bounded() -> T:
        return await asyncio.wait_for(make(), seconds)

    return asyncio.run(bounded())


async def create_topic(cluster: LocalCluster, topic: str, partitions: int = PARTITIONS) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, partitions, 3)])
    finally:
        await admin.close()


def producer(cluster: LocalCluster, **extra: Any) -> Any:
    return aiokafka.AIOKafkaProducer(
        bootstrap_servers=cluster.kafka_bootstrap, acks="all", enable_idempotence=True, **extra
    )


def group_member(cluster: LocalCluster, group: str, topic: str) -> Any:
    return aiokafka.AIOKafkaConsumer(
        topic,
        bootstrap_servers=cluster.kafka_bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=6000,
        heartbeat_interval_ms=300,
    )


async def read_all(cluster: LocalCluster, topic: str, count: int, partitions: int) -> list[Any]:
    """``count`` records of ``topic`` read from the start by an assigned (group-less) consumer."""
    consumer = aiokafka.AIOKafkaConsumer(
        bootstrap_servers=cluster.kafka_bootstrap, auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        got: list[Any] = []
        while len(got) < count:
            for records in (await consumer.getmany(timeout_ms=200)).values():
                got.extend(records)
        return got
    finally:
        await consumer.stop()


def test_aiokafka_admin_creates_describes_and_deletes_a_topic(cluster: LocalCluster) -> None:
    async def scenario() -> tuple[list[str], Any, list[str]]:
        admin = AIOKafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic("ak-admin", 3, 3)])
            listed = await admin.list_topics()
            described = await admin.describe_topics(["ak-admin"])
            await admin.delete_topics(["ak-admin"])
            for _ in range(100):  # the deletion reaches every broker's metadata view
                after = await admin.list_topics()
                if "ak-admin" not in after:
                    break
                await asyncio.sleep(0.1)
            return listed, described, after
        finally:
            await admin.close()

    listed, described, after = run(scenario)
    assert "ak-admin" in listed
    [topic] = described
    assert topic["error_code"] == 0, topic
    assert sorted(p["partition"] for p in topic["partitions"]) == [0, 1, 2]
    assert all(len(p["replicas"]) == 3 for p in topic["partitions"])
    assert "ak-admin" not in after


@pytest.mark.parametrize("codec", [None, "gzip", "snappy", "lz4", "zstd"])
def test_aiokafka_idempotent_producer_writes_headers_and_null_keys_and_values_with_each_codec(
    cluster: LocalCluster, codec: str | None
) -> None:
    topic = f"ak-codec-{codec or 'none'}"
    # aiokafka refuses a record with neither key nor value (its own assert), so none is sent.
    sent = [
        (b"k0", b"v0", [("h", b"1"), ("empty", b"")]),
        (None, b"no key", []),
        (b"tombstone", None, [("why", b"deleted")]),
        (b"big", b"x" * 10_000, []),
        (b"empty", b"", []),
    ]

    async def scenario() -> list[Any]:
        await create_topic(cluster, topic, 1)
        p = producer(cluster, compression_type=codec)
        await p.start()
        try:
            batch = [
                await p.send(topic, value, key=key, headers=headers, partition=0)
                for key, value, headers in sent
            ]
            metadata = await asyncio.gather(*batch)
        finally:
            await p.stop()
        assert [m.offset for m in metadata] == sorted(m.offset for m in metadata)
        return await read_all(cluster, topic, len(sent), 1)

    got = run(scenario)
    assert [(r.key, r.value, list(r.headers)) for r in got] == sent


def test_aiokafka_group_of_two_rebalances_commits_and_a_new_member_resumes(
    cluster: LocalCluster,
) -> None:
    topic, group = "ak-group", "ak-group-g"
    first_values = {b"v%d" % i for i in range(100)}
    later_values = {b"v%d" % i for i in range(100, 120)}

    async def produce(values: set[bytes]) -> None:
        p = producer(cluster)
        await p.start()
        try:
            for value in sorted(values):
                await p.send(topic, value, key=value)
            await p.flush()
        finally:
            await p.stop()

    async def poll(
        members: list[Any], got: list[bytes], done: Callable[[], bool], seconds: float = 30.0
    ) -> None:
        deadline = time.monotonic() + seconds
        while not done():
            assert time.monotonic() < deadline, f"timed out with {len(got)} records"
            for member in members:
                batches = await member.getmany(timeout_ms=100, max_records=10)
                got.extend(r.value for records in batches.values() for r in records)

    def assigned(member: Any) -> list[int]:
        return sorted(tp.partition for tp in member.assignment())

    async def describe(group: str) -> tuple[Any, Any, dict[Any, Any]]:
        admin = AIOKafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap)
        await admin.start()
        try:
            [answer] = await admin.describe_consumer_groups([group])
            listed = await admin.list_consumer_groups()
            offsets = await admin.list_consumer_group_offsets(group)
            return answer.groups, listed, offsets
        finally:
            await admin.close()

    async def scenario() -> tuple[list[int], list[int], list[int], list[bytes]]:
        await create_topic(cluster, topic)
        await produce(first_values)
        first = group_member(cluster, group, topic)
        await first.start()
        second = group_member(cluster, group, topic)
        try:
            got: list[bytes] = []
            await poll([first], got, lambda: len(got) >= 30)
            alone = assigned(first)
            await first.commit()
            await second.start()
            # The second member's join rebalances the group: two partitions each.
            await poll(
                [first, second],
                got,
                lambda: len(assigned(first)) == len(assigned(second)) == PARTITIONS // 2,
            )
            halves = (assigned(first), assigned(second))
            await poll([first, second], got, lambda: set(got) >= first_values)
            await first.commit()
            await second.commit()
            described, listed, offsets = await describe(group)
            ends = await first.end_offsets([TopicPartition(topic, p) for p in range(PARTITIONS)])
        finally:
            await second.stop()
            await first.stop()
        await produce(later_values)
        third = group_member(cluster, group, topic)
        await third.start()
        try:
            resumed: list[bytes] = []
            await poll([third], resumed, lambda: set(resumed) >= later_values)
            # Anything from before the commits would come with them; give it a last chance.
            batches = await third.getmany(timeout_ms=500)
            resumed.extend(r.value for records in batches.values() for r in records)
        finally:
            await third.stop()
        # DescribeGroups v0: (error, group, state, protocol type, protocol, members).
        [(error, name, state, kind, _, members)] = described
        assert (error, name, state, kind, len(members)) == (0, group, "Stable", "consumer", 2)
        assert (group, "consumer") in listed
        assert {tp: o.offset for tp, o in offsets.items()} == ends  # all read, all committed
        return alone, halves[0], halves[1], resumed

    alone, half_a, half_b, resumed = run(scenario, 90.0)
    assert alone == list(range(PARTITIONS))
    assert sorted(half_a + half_b) == list(range(PARTITIONS))
    assert len(half_a) == len(half_b) == PARTITIONS // 2
    assert sorted(resumed) == sorted(later_values)  # exactly what came after the commits


def test_aiokafka_offsets_for_times_seeks_by_timestamp(cluster: LocalCluster) -> None:
    topic = "ak-times"
    base = int(time.time() * 1000) - 60_000

    async def scenario() -> tuple[Any, Any, list[bytes]]:
        await create_topic(cluster, topic, 1)
        p = producer(cluster)
        await p.start()
        try:
            for i in range(10):
                await (await p.send(topic, b"t%d" % i, partition=0, timestamp_ms=base + 1000 * i))
        finally:
            await p.stop()
        consumer = aiokafka.AIOKafkaConsumer(bootstrap_servers=cluster.kafka_bootstrap)
        await consumer.start()
        try:
            tp = TopicPartition(topic, 0)
            consumer.assign([tp])
            # Between the 4th and 5th records: the 5th is the first at or after it.
            found = (await consumer.offsets_for_times({tp: base + 3500}))[tp]
            beyond = (await consumer.offsets_for_times({tp: base + 99_000}))[tp]
            consumer.seek(tp, found.offset)
            got: list[bytes] = []
            while len(got) < 6:
                batches = await consumer.getmany(tp, timeout_ms=200)
                got.extend(r.value for r in batches.get(tp, []))
            return found, beyond, got
        finally:
            await consumer.stop()

    found, beyond, got = run(scenario)
    assert found.timestamp == base + 4000
    assert beyond is None  # no record that late
    assert got == [b"t%d" % i for i in range(4, 10)]
