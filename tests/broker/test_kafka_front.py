"""The Kafka protocol on a real 3-broker cluster, judged by Kafka's own clients: kcat (Debian's,
librdkafka 2.0.2) and confluent-kafka (a current librdkafka). Records cross between the Kafka
front and our own protocol exactly; a produce to a non-leader is refused as Kafka refuses it;
garbage frames close one connection and harm nothing else."""

from __future__ import annotations

import json
import shutil
import socket
import struct
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafkaesque.client import Client, Producer
from kafkaesque.local_cluster import LocalCluster, broker_program, free_ports
from kafkaesque.protocol.kafka import (
    API_VERSIONS,
    METADATA,
    OFFSET_FOR_LEADER_EPOCH,
    PRODUCE,
    SASL_HANDSHAKE,
    KafkaError,
    KafkaRecord,
    decode_response,
    encode_batch,
    encode_request,
)
from kafkaesque.security import import_plaintext, save_users

from .mqtt_helpers import read_topic

confluent_kafka = pytest.importorskip("confluent_kafka")
pytest.importorskip("confluent_kafka.admin")
pytestmark = pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(str(tmp_path_factory.mktemp("kafka-front")), 3) as c:
        c.wait_ready()
        yield c


def create_topic(cluster: LocalCluster, name: str, partitions: int = 3) -> None:
    """Create ``name`` and return once every partition has a leader: until its election a
    partition's metadata says leader -1, as Kafka's does after CreateTopics (a kcat listing
    taken at once showed one, seen once in a full run)."""
    with Client(cluster.bootstrap) as client:
        client.create_topic(name, partitions, 3)
        deadline = time.monotonic() + 30
        while True:
            metadata = client.refresh_metadata([name])
            if all(metadata.leader(name, p) is not None for p in range(partitions)):
                return
            assert time.monotonic() < deadline, f"{name} has a partition without a leader"
            time.sleep(0.05)


def kcat(cluster: LocalCluster, *args: str, stdin: str | None = None) -> str:
    result = subprocess.run(
        ["kcat", "-b", cluster.kafka_bootstrap, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_kcat_lists_the_brokers_and_topics_with_their_leaders(cluster: LocalCluster) -> None:
    create_topic(cluster, "kf-list", 4)
    listing = json.loads(kcat(cluster, "-L", "-J"))
    assert sorted((b["id"], b["name"]) for b in listing["brokers"]) == [
        (i, f"127.0.0.1:{cluster.kafka_address(i)[1]}") for i in range(3)
    ]
    [topic] = [t for t in listing["topics"] if t["topic"] == "kf-list"]
    assert [p["partition"] for p in topic["partitions"]] == [0, 1, 2, 3]
    assert all(p["leader"] in (0, 1, 2) and len(p["replicas"]) == 3 for p in topic["partitions"])


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_kcat_produces_and_consumes_keys_headers_and_each_codec(
    cluster: LocalCluster, codec: str
) -> None:
    topic = f"kf-codec-{codec}"
    create_topic(cluster, topic)
    lines = "".join(f"key{i}:value-{codec}-{i}\n" for i in range(20))
    kcat(cluster, "-P", "-t", topic, "-K:", "-z", codec, "-H", "origin=kcat", stdin=lines)
    out = kcat(cluster, "-C", "-t", topic, "-e", "-J")
    got = [json.loads(line) for line in out.splitlines()]
    assert sorted((m["key"], m["payload"]) for m in got) == sorted(
        (f"key{i}", f"value-{codec}-{i}") for i in range(20)
    )
    assert all(m["headers"] == ["origin", "kcat"] for m in got)
    # The same records through our own protocol: keys, values and headers as sent.
    ours = read_topic(cluster.bootstrap, topic)
    assert sorted((r.key, r.value) for r in ours) == sorted(
        (b"key%d" % i, b"value-%s-%d" % (codec.encode(), i)) for i in range(20)
    )
    assert all(r.headers == (("origin", b"kcat"),) for r in ours)


def confluent_consume(cluster: LocalCluster, topic: str, count: int) -> list[Any]:
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "group.id": "unused",
            "enable.auto.commit": False,
        }
    )
    try:
        metadata = consumer.list_topics(topic, timeout=20)
        partitions = sorted(metadata.topics[topic].partitions)
        consumer.assign(
            [
                confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING)
                for p in partitions
            ]
        )
        got: list[Any] = []
        # Bounded in time, not in polls: a poll that finds nothing yet (the first fetches, a
        # loaded machine) must not cost a record (it cost 3 of 200 records in 1 run of 3).
        deadline = time.monotonic() + 40
        while len(got) < count and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None:
                assert message.error() is None, message.error()
                got.append(message)
        return got
    finally:
        consumer.close()


def test_confluent_kafka_produces_with_acks_all_and_reads_back_exactly(
    cluster: LocalCluster,
) -> None:
    topic = "kf-confluent"
    create_topic(cluster, topic)
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": cluster.kafka_bootstrap, "acks": "all", "linger.ms": 5}
    )
    reports: list[Any] = []
    sent = [
        (None, b"no key"),
        (b"k1", None),  # a null value (a tombstone)
        (b"k2", b""),
        (b"k3", b"x" * 10_000),
    ]
    for key, value in sent:
        producer.produce(
            topic,
            value,
            key,
            headers=[("h", b"1")],
            on_delivery=lambda e, m: reports.append((e, m)),
        )
    assert producer.flush(30) == 0
    assert all(error is None for error, _ in reports), reports
    assert all(m.offset() >= 0 for _, m in reports)
    got = confluent_consume(cluster, topic, len(sent))
    assert sorted((m.key() or b"", m.value() or b"-") for m in got) == sorted(
        (k or b"", b"-" if v is None else v or b"-") for k, v in sent
    )
    assert {(m.partition(), m.offset()) for m in got} == {
        (m.partition(), m.offset()) for _, m in reports
    }
    assert all(m.headers() == [("h", b"1")] for m in got)


def test_records_written_by_our_protocol_are_read_exactly_by_confluent_kafka(
    cluster: LocalCluster,
) -> None:
    topic = "kf-ours"
    create_topic(cluster, topic)
    with Client(cluster.bootstrap) as client, Producer(client) as producer:
        futures = [
            producer.send(topic, b"value-%d" % i, key=b"key-%d" % i, headers=(("n", b"%d" % i),))
            for i in range(30)
        ]
        written = [f.get(30) for f in futures]
    got = confluent_consume(cluster, topic, 30)
    assert sorted((m.key(), m.value(), tuple(m.headers())) for m in got) == sorted(
        (b"key-%d" % i, b"value-%d" % i, (("n", b"%d" % i),)) for i in range(30)
    )
    assert sorted((m.partition(), m.offset()) for m in got) == sorted(
        (w.partition, w.offset) for w in written
    )
    low, high = _watermarks(cluster, topic, got[0].partition())
    assert 0 <= low < high


def _watermarks(cluster: LocalCluster, topic: str, partition: int) -> tuple[int, int]:
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": cluster.kafka_bootstrap, "group.id": "w"}
    )
    try:
        low, high = consumer.get_watermark_offsets(
            confluent_kafka.TopicPartition(topic, partition), timeout=20
        )
        return int(low), int(high)
    finally:
        consumer.close()


def request(address: tuple[str, int], frame: bytes) -> bytes:
    """Send one request frame; the response frame (without its size)."""
    with socket.create_connection(address, timeout=20) as sock:
        sock.sendall(frame)
        size = struct.unpack(">i", _exactly(sock, 4))[0]
        return _exactly(sock, size)


def _exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, "the broker closed the connection"
        data += chunk
    return data


def test_a_produce_to_a_broker_that_does_not_lead_the_partition_is_refused_with_6(
    cluster: LocalCluster,
) -> None:
    topic = "kf-leader"
    create_topic(cluster, topic, 1)
    listing = json.loads(kcat(cluster, "-L", "-J", "-t", topic))
    leader = listing["topics"][0]["partitions"][0]["leader"]
    other = (leader + 1) % 3
    batch = encode_batch(0, [KafkaRecord(0, 1, None, b"v")], last_offset_delta=0)
    body = {
        "acks": -1,
        "timeout_ms": 5000,
        "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": batch}]}],
    }
    for broker, expected in ((other, KafkaError.NOT_LEADER_OR_FOLLOWER), (leader, KafkaError.NONE)):
        frame = request(cluster.kafka_address(broker), encode_request(PRODUCE, 7, 1, "t", body))
        _, answer = decode_response(PRODUCE, 7, frame)
        [partition] = answer["responses"][0]["partition_responses"]
        assert partition["error_code"] == expected, (broker, partition)


def test_offset_for_leader_epoch_answers_where_each_epoch_ends(cluster: LocalCluster) -> None:
    """The partition's leader says where its current epoch (the Raft term Metadata gives)
    ends: at the high watermark once the writes are acknowledged; a stale current epoch is
    FENCED_LEADER_EPOCH (74), and another broker is not the leader (6)."""
    topic = "kf-epochs"
    create_topic(cluster, topic, 1)
    kcat(cluster, "-P", "-t", topic, "-X", "acks=all", stdin="a\nb\nc\n")
    frame = encode_request(METADATA, 8, 1, "t", {"topics": [{"name": topic}]})
    _, metadata = decode_response(METADATA, 8, request(cluster.kafka_address(0), frame))
    [partition] = metadata["topics"][0]["partitions"]
    leader, epoch = partition["leader_id"], partition["leader_epoch"]
    _, high = _watermarks(cluster, topic, 0)

    def ask(broker: int, current: int, wanted: int) -> dict[str, Any]:
        body = {
            "replica_id": -1,
            "topics": [
                {
                    "topic": topic,
                    "partitions": [
                        {"partition": 0, "current_leader_epoch": current, "leader_epoch": wanted}
                    ],
                }
            ],
        }
        frame = encode_request(OFFSET_FOR_LEADER_EPOCH, 3, 1, "t", body)
        address = cluster.kafka_address(broker)
        _, answer = decode_response(OFFSET_FOR_LEADER_EPOCH, 3, request(address, frame))
        [result] = answer["topics"][0]["partitions"]
        return dict(result)

    now = ask(leader, epoch, epoch)
    assert (now["error_code"], now["leader_epoch"], now["end_offset"]) == (0, epoch, high)
    assert ask(leader, epoch - 1, epoch)["error_code"] == KafkaError.FENCED_LEADER_EPOCH
    assert ask(leader, epoch + 1, epoch)["error_code"] == KafkaError.UNKNOWN_LEADER_EPOCH
    assert ask(leader, -1, epoch + 5)["end_offset"] == -1  # an epoch that never was
    other = (leader + 1) % 3
    assert ask(other, epoch, epoch)["error_code"] == KafkaError.NOT_LEADER_OR_FOLLOWER


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    st.one_of(
        st.binary(max_size=64),
        st.tuples(st.integers(-5, 40), st.integers(-3, 20), st.binary(max_size=40)).map(
            lambda t: struct.pack(">hhi", t[0], t[1], 1) + t[2]
        ),
    ),
    st.integers(-10, 1 << 31),
)
def test_garbage_frames_close_one_connection_and_harm_nothing_else(
    cluster: LocalCluster, payload: bytes, size: int
) -> None:
    address = cluster.kafka_address(0)
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(struct.pack(">i", size & 0x7FFFFFFF if size >= 0 else size) + payload)
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(10)
        try:
            while sock.recv(65536):
                pass  # an answer (a frame that parsed), then the close
        except ConnectionResetError:
            pass
    frame = request(address, encode_request(API_VERSIONS, 2, 5, "after", {}))
    correlation_id, body = decode_response(API_VERSIONS, 2, frame)
    assert correlation_id == 5 and body["error_code"] == KafkaError.NONE


def test_an_idempotent_confluent_kafka_producer_writes_each_record_once(
    cluster: LocalCluster,
) -> None:
    topic = "kf-idempotent"
    create_topic(cluster, topic)
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": cluster.kafka_bootstrap, "enable.idempotence": True, "linger.ms": 2}
    )
    reports: list[Any] = []
    for i in range(200):
        producer.produce(
            topic, b"v%d" % i, b"k%d" % (i % 7), on_delivery=lambda e, m: reports.append((e, m))
        )
    assert producer.flush(30) == 0
    assert [e for e, _ in reports if e is not None] == []
    got = confluent_consume(cluster, topic, 200)
    assert sorted(m.value() for m in got) == sorted(b"v%d" % i for i in range(200))


def _produce_idempotent(
    cluster: LocalCluster, broker: int, topic: str, epoch: int, seq: int, value: bytes
) -> tuple[int, int]:
    """(error code, base offset) of one idempotent batch of producer 4242 sent to ``broker``."""
    batch = encode_batch(
        0,
        [KafkaRecord(0, 1, None, value)],
        last_offset_delta=0,
        producer_id=4242,
        producer_epoch=epoch,
        base_sequence=seq,
    )
    body = {
        "acks": -1,
        "timeout_ms": 5000,
        "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": batch}]}],
    }
    frame = request(cluster.kafka_address(broker), encode_request(PRODUCE, 7, 1, "t", body))
    [p] = decode_response(PRODUCE, 7, frame)[1]["responses"][0]["partition_responses"]
    return p["error_code"], p["base_offset"]


def test_idempotent_batches_retries_gaps_and_old_epochs_answer_as_kafka(
    cluster: LocalCluster,
) -> None:
    topic = "kf-sequences"
    create_topic(cluster, topic, 1)
    leader = json.loads(kcat(cluster, "-L", "-J", "-t", topic))["topics"][0]["partitions"][0][
        "leader"
    ]
    first = _produce_idempotent(cluster, leader, topic, 0, 0, b"a")
    assert first[0] == KafkaError.NONE
    assert _produce_idempotent(cluster, leader, topic, 0, 0, b"a") == first  # a retry: once
    assert _produce_idempotent(cluster, leader, topic, 0, 5, b"c")[0] == (
        KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER
    )
    assert _produce_idempotent(cluster, leader, topic, 1, 0, b"d")[0] == KafkaError.NONE
    assert _produce_idempotent(cluster, leader, topic, 0, 1, b"e")[0] == (
        KafkaError.INVALID_PRODUCER_EPOCH
    )
    values = kcat(cluster, "-C", "-t", topic, "-e", "-f", "%s\n").split()
    assert values == ["a", "d"]


def test_pipelined_requests_take_effect_and_are_answered_in_the_order_sent(
    cluster: LocalCluster,
) -> None:
    """Twenty idempotent Produce requests and a Metadata in the middle, sent back to back on
    one connection without waiting: the answers come in the order sent, every batch is
    appended once and in sequence order (the broker reads the next Produce while the earlier
    ones wait for their quorum), and the Metadata is answered after the Produces before it."""
    topic = "kf-pipelined"
    create_topic(cluster, topic, 1)
    leader = json.loads(kcat(cluster, "-L", "-J", "-t", topic))["topics"][0]["partitions"][0][
        "leader"
    ]
    frames = []
    for seq in range(20):
        batch = encode_batch(
            0,
            [KafkaRecord(0, 1, None, b"v%d" % seq)],
            last_offset_delta=0,
            producer_id=4343,
            producer_epoch=0,
            base_sequence=seq,
        )
        body = {
            "acks": -1,
            "timeout_ms": 5000,
            "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": batch}]}],
        }
        frames.append(encode_request(PRODUCE, 7, seq, "t", body))
        if seq == 9:
            frames.append(encode_request(METADATA, 8, 100, "t", {"topics": [{"name": topic}]}))
    with socket.create_connection(cluster.kafka_address(leader), timeout=20) as sock:
        sock.sendall(b"".join(frames))
        answers = []
        for _ in frames:
            size = struct.unpack(">i", _exactly(sock, 4))[0]
            answers.append(_exactly(sock, size))
    correlations = [struct.unpack(">i", a[:4])[0] for a in answers]
    assert correlations == [*range(10), 100, *range(10, 20)]
    bases = []
    for answer in answers[:10] + answers[11:]:
        [p] = decode_response(PRODUCE, 7, answer)[1]["responses"][0]["partition_responses"]
        assert p["error_code"] == KafkaError.NONE
        bases.append(p["base_offset"])
    assert bases == sorted(bases) and len(set(bases)) == 20
    values = kcat(cluster, "-C", "-t", topic, "-e", "-f", "%s\n").split()
    assert values == [f"v{seq}" for seq in range(20)]


def test_confluent_kafka_admin_creates_and_deletes_topics(cluster: LocalCluster) -> None:
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    new = confluent_kafka.admin.NewTopic(
        "kf-admin", num_partitions=2, replication_factor=3, config={"retention.ms": "3600000"}
    )
    for future in admin.create_topics([new]).values():
        future.result(30)
    again = admin.create_topics([confluent_kafka.admin.NewTopic("kf-admin", 2, 3)])
    with pytest.raises(confluent_kafka.KafkaException, match="TOPIC_ALREADY_EXISTS"):
        again["kf-admin"].result(30)
    assert "kf-admin" in admin.list_topics(timeout=20).topics
    with Client(cluster.bootstrap) as client:
        described = client.describe_topic("kf-admin")
    assert len(described.partitions) == 2
    for future in admin.delete_topics(["kf-admin"]).values():
        future.result(30)
    with Client(cluster.bootstrap) as client:
        assert "kf-admin" not in client.refresh_metadata().partitions


def test_create_topics_refuses_a_bad_count_with_kafkas_codes_and_validate_only_too(
    cluster: LocalCluster,
) -> None:
    # confluent-kafka-go's TestAdminTopics found it: validate_only answered success for a
    # replication factor above the brokers, and creating answered INVALID_CONFIG (40).
    a = confluent_kafka.admin
    admin = a.AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    for validate_only in (True, False):
        results = admin.create_topics(
            [
                a.NewTopic("kf-rf13", 1, 13),
                a.NewTopic("kf-huge", 20_000, 3),
                a.NewTopic("kf-fine", 2, 3),
            ],
            validate_only=validate_only,
        )
        with pytest.raises(confluent_kafka.KafkaException, match="INVALID_REPLICATION_FACTOR"):
            results["kf-rf13"].result(30)
        with pytest.raises(confluent_kafka.KafkaException, match="INVALID_PARTITIONS"):
            results["kf-huge"].result(30)
        results["kf-fine"].result(30)
        topics = admin.list_topics(timeout=20).topics
        assert ("kf-fine" in topics) is not validate_only
        assert "kf-rf13" not in topics and "kf-huge" not in topics
    for future in admin.delete_topics(["kf-fine"]).values():
        future.result(30)


def test_describing_a_topic_that_does_not_exist_answers_unknown_topic(
    cluster: LocalCluster,
) -> None:
    # Metadata without auto-creation, as the admin's describeTopics asks (Kafka Connect does
    # before it creates a source connector's topic): 3, not 29, when nothing forbids describing.
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    names = confluent_kafka.TopicCollection(["kf-never-made"])
    [future] = admin.describe_topics(names).values()
    with pytest.raises(confluent_kafka.KafkaException, match="UNKNOWN_TOPIC"):
        future.result(30)


def test_a_compact_only_topic_is_never_cut_by_retention_as_in_kafka(cluster: LocalCluster) -> None:
    # Kafka Connect creates its config and offsets topics with cleanup.policy=compact alone and
    # reads them whole at every start: the broker's default retention must not apply to them.
    a = confluent_kafka.admin
    admin = a.AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    new = [
        a.NewTopic("kf-compact", 1, 3, config={"cleanup.policy": "compact"}),
        a.NewTopic(
            "kf-both", 1, 3, config={"cleanup.policy": "compact,delete", "retention.ms": "60000"}
        ),
        a.NewTopic("kf-bad-policy", 1, 3, config={"cleanup.policy": "compact,shred"}),
    ]
    results = admin.create_topics(new)
    results["kf-compact"].result(30)
    results["kf-both"].result(30)
    with pytest.raises(confluent_kafka.KafkaException, match="INVALID_CONFIG"):
        results["kf-bad-policy"].result(30)
    with Client(cluster.bootstrap) as client:
        compact = client.describe_topic("kf-compact").topic
        both = client.describe_topic("kf-both").topic
    assert (compact.compact, compact.retention_ms, compact.retention_bytes) == (True, None, None)
    assert (both.compact, both.retention_ms) == (True, 60000)
    resources = [a.ConfigResource(a.ResourceType.TOPIC, t) for t in ("kf-compact", "kf-both")]
    described = [f.result(30) for f in admin.describe_configs(resources).values()]
    assert [d["cleanup.policy"].value for d in described] == ["compact", "compact,delete"]
    assert described[0]["retention.ms"].value == "-1"
    for future in admin.delete_topics(["kf-compact", "kf-both"]).values():
        future.result(30)


def test_with_a_users_file_an_unauthenticated_kafka_client_is_refused_and_learns_nothing(
    tmp_path: Any,
) -> None:
    # With a users file, a request other than ApiVersions and SASL's before authentication
    # closes the connection unanswered, as Kafka does (SASL itself: test_kafka_security.py).
    users = tmp_path / "users"
    save_users(str(users), import_plaintext(["alice:secret"]))
    client, peer, controller, kafka = free_ports(4)
    broker = subprocess.Popen(
        [*broker_program(), "broker", "--id", "0", "--data-dir", str(tmp_path / "d"),
         "--client", f"127.0.0.1:{client}", "--peers", f"0@127.0.0.1:{peer}",
         "--controllers", f"0@127.0.0.1:{controller}", "--kafka-listen", f"127.0.0.1:{kafka}",
         "--users-file", str(users), "--exit-with-parent"],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert broker.stdout is not None
        assert "ready" in [broker.stdout.readline().strip() for _ in range(2)]
        for topic in ("__consumer_offsets", "no-such-topic"):
            body = {"topics": [{"name": topic}], "allow_auto_topic_creation": True}
            with pytest.raises((AssertionError, ConnectionError)):  # closed
                request(("127.0.0.1", kafka), encode_request(METADATA, 4, 1, "t", body))
        with pytest.raises((AssertionError, ConnectionError)):
            request(("127.0.0.1", kafka), encode_request(METADATA, 4, 2, "t", {}))
    finally:
        broker.terminate()
        broker.wait(30)
        assert broker.stdout is not None
        broker.stdout.close()


def test_without_a_users_file_sasl_handshake_answers_illegal_sasl_state(
    cluster: LocalCluster,
) -> None:
    frame = request(
        cluster.kafka_address(0), encode_request(SASL_HANDSHAKE, 1, 3, "t", {"mechanism": "PLAIN"})
    )
    assert decode_response(SASL_HANDSHAKE, 1, frame)[1] == {
        "error_code": KafkaError.ILLEGAL_SASL_STATE,
        "mechanisms": [],
    }
