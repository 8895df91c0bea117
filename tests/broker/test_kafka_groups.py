"""Kafka consumer groups on a real 3-broker cluster, judged by Kafka's clients: confluent-kafka
(a current librdkafka), kcat (Debian's librdkafka 2.0.2, which looks for old exact versions) and
kafka-python (its own implementation of the protocol). Two members split a topic and rebalance;
commits are where a new member resumes; admin lists, describes and deletes; a Kafka group never
touches a line-protocol group of the same name; a coordinator killed under an idempotent
producer and a member loses no acknowledged record, no commit, and not even the generation."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from kafkaesque.client import Client
from kafkaesque.local_cluster import LocalCluster
from kafkaesque.protocol.kafka import HEARTBEAT, KafkaError, decode_response, encode_request

from .mqtt_helpers import read_topic
from .test_kafka_front import request

confluent_kafka = pytest.importorskip("confluent_kafka")
admin = pytest.importorskip("confluent_kafka.admin")

PARTITIONS = 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    directory = str(tmp_path_factory.mktemp("kafka-groups"))
    with LocalCluster(directory, 3, extra_args=["--group-initial-rebalance-delay", "0.3"]) as c:
        c.wait_ready()
        yield c


def produce(cluster: LocalCluster, topic: str, count: int, start: int = 0) -> None:
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": cluster.kafka_bootstrap, "acks": "all"}
    )
    for i in range(start, start + count):
        producer.produce(topic, b"v%d" % i, b"k%d" % i)
    assert producer.flush(30) == 0


def new_topic(cluster: LocalCluster, topic: str, records: int) -> None:
    with Client(cluster.bootstrap) as client:
        client.create_topic(topic, PARTITIONS, 3)
    produce(cluster, topic, records)


def consumer(cluster: LocalCluster, group: str, name: str, **extra: Any) -> Any:
    return confluent_kafka.Consumer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "group.id": group,
            "client.id": name,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 300,
            **extra,
        }
    )


def poll_until(
    consumers: list[Any], done: Any, seconds: float = 30.0
) -> list[tuple[int, int, bytes]]:
    """Poll every consumer in turn until ``done(got)``; (partition, offset, value) read."""
    got: list[tuple[int, int, bytes]] = []
    deadline = time.monotonic() + seconds
    while not done(got):
        assert time.monotonic() < deadline, f"timed out with {len(got)} records"
        for c in consumers:
            message = c.poll(0.1)
            if message is not None and message.error() is None:
                got.append((message.partition(), message.offset(), message.value()))
    return got


def ends(cluster: LocalCluster, topic: str) -> dict[int, int]:
    """Each partition's high watermark: where a group that read everything has committed
    (not the record count: a partition's log also holds its leaders' Raft no-ops)."""
    reader = confluent_kafka.Consumer(
        {"bootstrap.servers": cluster.kafka_bootstrap, "group.id": "-"}
    )
    try:
        return {
            p: reader.get_watermark_offsets(confluent_kafka.TopicPartition(topic, p), timeout=20)[1]
            for p in range(PARTITIONS)
        }
    finally:
        reader.close()


def generation_of(cluster: LocalCluster, broker: int, group: str, member_id: str) -> int:
    """The generation ``member_id`` is in at ``broker`` (its coordinator), found by asking
    with a Heartbeat of each generation in turn (a wrong one is ILLEGAL_GENERATION)."""
    for generation in range(1, 20):
        body = {"group_id": group, "generation_id": generation, "member_id": member_id}
        frame = encode_request(HEARTBEAT, 3, 1, "test", body)
        _, answer = decode_response(HEARTBEAT, 3, request(cluster.kafka_address(broker), frame))
        if answer["error_code"] in (KafkaError.NONE, KafkaError.REBALANCE_IN_PROGRESS):
            return generation
        assert answer["error_code"] == KafkaError.ILLEGAL_GENERATION, answer
    raise AssertionError(f"{member_id} is in no generation of {group} at broker {broker}")


def assigned(c: Any) -> list[int]:
    return sorted(tp.partition for tp in c.assignment())


def test_two_members_split_a_topic_rebalance_and_a_new_member_resumes_from_the_commits(
    cluster: LocalCluster,
) -> None:
    topic, group = "kg-split", "kg-split-group"
    new_topic(cluster, topic, 100)
    first = consumer(cluster, group, "first")
    first.subscribe([topic])
    got = poll_until([first], lambda g: len(g) >= 40)
    assert assigned(first) == list(range(PARTITIONS))  # alone: every partition
    first.commit(asynchronous=False)
    second = consumer(cluster, group, "second")
    second.subscribe([topic])
    # The second member's join rebalances the group: two partitions each, none shared.
    got += poll_until(
        [first, second],
        lambda g: len(assigned(first)) == len(assigned(second)) == PARTITIONS // 2,
    )
    assert set(assigned(first)).isdisjoint(assigned(second))
    everything = {b"v%d" % i for i in range(100)}
    got += poll_until([first, second], lambda g: {v for _, _, v in got + g} >= everything)
    first.commit(asynchronous=False)
    second.commit(asynchronous=False)
    committed = first.committed(
        [confluent_kafka.TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=20
    )
    # Each member commits its position: past the last record read, and past a Raft no-op
    # after it (a control batch, which clients skip): the partition's end.
    assert {tp.partition: tp.offset for tp in committed} == ends(cluster, topic)
    first.close()
    second.close()
    # A new member of the group starts where the group committed: only the new records.
    produce(cluster, topic, 10, start=100)
    third = consumer(cluster, group, "third")
    third.subscribe([topic])
    try:
        later = poll_until([third], lambda g: len(g) >= 10)
        time.sleep(1.0)
        later += poll_until([third], lambda g: True)
        assert sorted(v for _, _, v in later) == sorted(b"v%d" % i for i in range(100, 110))
    finally:
        third.close()


def test_admin_lists_describes_and_deletes_a_group(cluster: LocalCluster) -> None:
    topic, group = "kg-admin", "kg-admin-group"
    new_topic(cluster, topic, 8)
    member = consumer(cluster, group, "described")
    member.subscribe([topic])
    client = admin.AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    try:
        poll_until([member], lambda g: len(g) >= 8)
        member.commit(asynchronous=False)
        listed = client.list_consumer_groups().result(timeout=20)
        assert group in {g.group_id for g in listed.valid}
        [described] = client.describe_consumer_groups([group]).values()
        description = described.result(timeout=20)
        assert description.state == confluent_kafka.ConsumerGroupState.STABLE
        # Its coordinator's /metrics show its commits and its lag, as our groups'.
        samples = cluster.scrape(description.coordinator.id)
        shown = {
            (name, int(labels["partition"])): value
            for name, labels, value in samples
            if labels.get("group") == group
        }
        for p, end in ends(cluster, topic).items():
            assert shown["kafkaesque_consumer_group_committed_offset", p] == end
            assert shown["kafkaesque_consumer_group_lag", p] == 0
        [m] = description.members
        assert m.client_id == "described"
        assert sorted(tp.partition for tp in m.assignment.topic_partitions) == list(
            range(PARTITIONS)
        )
        # Not while it has a member (Kafka's NON_EMPTY_GROUP).
        with pytest.raises(confluent_kafka.KafkaException, match="NON_EMPTY_GROUP"):
            client.delete_consumer_groups([group])[group].result(timeout=20)
    finally:
        member.close()
    offsets = client.list_consumer_group_offsets(
        [confluent_kafka.ConsumerGroupTopicPartitions(group)]
    )[group].result(timeout=20)
    assert {tp.partition: tp.offset for tp in offsets.topic_partitions} == ends(cluster, topic)
    client.delete_consumer_groups([group])[group].result(timeout=20)
    [gone] = client.describe_consumer_groups([group]).values()
    assert gone.result(timeout=20).state == confluent_kafka.ConsumerGroupState.DEAD
    with pytest.raises(confluent_kafka.KafkaException, match="GROUP_ID_NOT_FOUND"):
        client.delete_consumer_groups([group])[group].result(timeout=20)


def test_admin_lists_groups_with_their_state_and_type_and_filters_by_them(
    cluster: LocalCluster,
) -> None:
    # ListGroups v4 (states filter) and v5 (group type): confluent-kafka-go's own suite lists
    # by state and checks the type. Before v4 was served, librdkafka listed every group
    # whatever the filter asked.
    topic, live, empty = "kg-listed", "kg-listed-live", "kg-listed-empty"
    new_topic(cluster, topic, 8)
    gone = consumer(cluster, empty, "gone")
    gone.subscribe([topic])
    poll_until([gone], lambda g: len(g) >= 8)
    gone.commit(asynchronous=False)
    gone.close()
    member = consumer(cluster, live, "live")
    member.subscribe([topic])
    client = admin.AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    State, Type = confluent_kafka.ConsumerGroupState, confluent_kafka.ConsumerGroupType

    def listed(**filters: Any) -> dict[str, tuple[Any, Any]]:
        found = client.list_consumer_groups(**filters).result(timeout=20)
        assert not found.errors
        return {g.group_id: (g.state, g.type) for g in found.valid if g.group_id in (live, empty)}

    try:
        poll_until([member], lambda g: len(g) >= 8)
        assert listed() == {live: (State.STABLE, Type.CLASSIC), empty: (State.EMPTY, Type.CLASSIC)}
        assert listed(states={State.STABLE}) == {live: (State.STABLE, Type.CLASSIC)}
        assert listed(states={State.EMPTY}) == {empty: (State.EMPTY, Type.CLASSIC)}
        assert set(listed(types={Type.CLASSIC})) == {live, empty}
        assert listed(types={Type.CONSUMER}) == {}  # KIP-848's groups: none served
    finally:
        member.close()


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed")
def test_kcat_balanced_consumer_reads_the_topic_through_a_group(cluster: LocalCluster) -> None:
    """Debian's kcat (librdkafka 2.0.2) turns its balanced consumer on only when the broker
    lists JoinGroup, SyncGroup, Heartbeat and LeaveGroup from v0 (shared/research)."""
    topic = "kg-kcat"
    new_topic(cluster, topic, 20)
    result = subprocess.run(
        [
            *("kcat", "-b", cluster.kafka_bootstrap, "-X", "auto.offset.reset=earliest"),
            *("-G", "kg-kcat-group", "-e", "-f", "%s\n", topic),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.split()) == sorted(f"v{i}" for i in range(20))


def test_kafka_python_consumes_in_a_group_and_commits(cluster: LocalCluster) -> None:
    kafka = pytest.importorskip("kafka")
    topic, group = "kg-kafka-python", "kg-kafka-python-group"
    new_topic(cluster, topic, 12)
    reader = kafka.KafkaConsumer(
        topic,
        bootstrap_servers=cluster.kafka_bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=15000,
    )
    try:
        got = []
        for message in reader:
            got.append(message.value)
            if len(got) == 12:
                break
        reader.commit()
        assert sorted(got) == sorted(b"v%d" % i for i in range(12))
        partitions = [kafka.TopicPartition(topic, p) for p in range(PARTITIONS)]
        assert {tp.partition: reader.committed(tp) for tp in partitions} == ends(cluster, topic)
    finally:
        reader.close()


def test_a_kafka_group_and_a_line_group_of_the_same_name_keep_their_own_offsets(
    cluster: LocalCluster,
) -> None:
    topic, group = "kg-shared", "kg-shared-name"
    new_topic(cluster, topic, 0)
    with Client(cluster.bootstrap) as client:
        client.commit(group, topic, 0, 5)
        tp = confluent_kafka.TopicPartition(topic, 0, 42)
        outsider = consumer(cluster, group, "manual")  # commits without joining the group
        try:
            outsider.commit(offsets=[tp], asynchronous=False)
            [kafka_side] = outsider.committed(
                [confluent_kafka.TopicPartition(topic, 0)], timeout=20
            )
        finally:
            outsider.close()
        assert kafka_side.offset == 42
        assert client.committed_offsets(group, topic)[0] == 5


def test_a_killed_coordinator_and_leader_lose_no_acked_record_and_no_commit(
    cluster: LocalCluster,
) -> None:
    """kill -9 of the group's coordinator (and of the partitions it leads) under an idempotent
    librdkafka producer and a group member: every acknowledged record is in the log exactly
    once, the member rejoins at the new coordinator and reads them all, and the group's
    commits survive."""
    topic, group = "kg-failover", "kg-failover-group"
    new_topic(cluster, topic, 40)
    member = consumer(cluster, group, "survivor")
    member.subscribe([topic])
    client = admin.AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
        }
    )
    acked: list[bytes] = []

    def report(error: Any, message: Any) -> None:
        if error is None:
            acked.append(message.value())

    coordinator = -1
    try:
        got = poll_until([member], lambda g: len(g) >= 40)
        member.commit(asynchronous=False)
        [described] = client.describe_consumer_groups([group]).values()
        coordinator = described.result(timeout=20).coordinator.id
        generation = generation_of(cluster, coordinator, group, member.memberid())
        for i in range(40, 240):
            producer.produce(topic, b"v%d" % i, b"k%d" % i, on_delivery=report)
            producer.poll(0)
            if i == 80:
                cluster.kill(coordinator)
            got += poll_until([member], lambda g: True)
        assert producer.flush(60) == 0
        assert len(acked) >= 150  # the kill costs retries, not the records
        wanted = {b"v%d" % i for i in range(40)} | set(acked)
        got += poll_until([member], lambda g: {v for _, _, v in got + g} >= wanted, seconds=60)
        member.commit(asynchronous=False)
        committed = member.committed(
            [confluent_kafka.TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=20
        )
        assert {tp.partition: tp.offset for tp in committed} == ends(cluster, topic)
        [described] = client.describe_consumer_groups([group]).values()
        successor = described.result(timeout=20).coordinator.id
        assert successor != coordinator
        # The new coordinator took the group over from its saved membership: no rebalance.
        assert generation_of(cluster, successor, group, member.memberid()) == generation
        in_log = Counter(r.value for r in read_topic(cluster.bootstrap, topic))
        assert {v for v in acked if in_log[v] != 1} == set()  # once each: no loss, no copy
    finally:
        member.close()
        if coordinator >= 0:
            cluster.start(coordinator)
            cluster.wait_ready()
