"""The gaps of the clients covered elsewhere, on a real 3-broker cluster: kafka-python's
idempotent producer with acks=all (headers, null keys and values, each codec it offers), its
group of two with a rebalance, and its offsets_for_times; confluent-kafka's offsets_for_times and
kcat's ``-o s@<ms>`` (seek by timestamp); and a record produced with confluent-kafka read exactly
by a line-protocol CONS over a raw socket and by MQTT egress (a gzip batch, decompressed for the
device)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from kafkaesque.client import Client
from kafkaesque.local_cluster import LocalCluster

from .mqtt_helpers import RULES, PahoDevice, wait_for

confluent_kafka = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")

PARTITIONS = 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    directory = str(tmp_path_factory.mktemp("kafka-gaps"))
    with LocalCluster(
        directory,
        3,
        mqtt=True,
        mqtt_rules=RULES,
        extra_args=["--group-initial-rebalance-delay", "0.3"],
    ) as c:
        c.wait_ready()
        yield c


def create_topic(cluster: LocalCluster, topic: str, partitions: int = 1) -> None:
    with Client(cluster.bootstrap) as client:
        client.create_topic(topic, partitions, 3)


def timed_topic(cluster: LocalCluster, topic: str) -> int:
    """``topic`` with ten records t0..t9, one a second apart from a minute ago; the base time."""
    create_topic(cluster, topic)
    base = int(time.time() * 1000) - 60_000
    producer = confluent_kafka.Producer({"bootstrap.servers": cluster.kafka_bootstrap})
    for i in range(10):
        producer.produce(topic, b"t%d" % i, partition=0, timestamp=base + 1000 * i)
    assert producer.flush(30) == 0
    return base


@pytest.mark.parametrize("codec", [None, "gzip", "snappy", "lz4", "zstd"])
def test_kafka_python_idempotent_producer_writes_headers_and_nulls_with_each_codec(
    cluster: LocalCluster, codec: str | None
) -> None:
    topic = f"kp-codec-{codec or 'none'}"
    create_topic(cluster, topic)
    # kafka-python refuses a record with neither key nor value, so none is sent.
    sent = [
        (b"k0", b"v0", [("h", b"1"), ("empty", b"")]),
        (None, b"no key", []),
        (b"tombstone", None, [("why", b"deleted")]),
        (b"big", b"x" * 10_000, []),
        (b"empty", b"", []),
    ]
    producer = kafka.KafkaProducer(
        bootstrap_servers=cluster.kafka_bootstrap,
        acks="all",
        enable_idempotence=True,
        compression_type=codec,
    )
    try:
        futures = [
            producer.send(topic, value, key, headers, partition=0) for key, value, headers in sent
        ]
        offsets = [f.get(timeout=30).offset for f in futures]
    finally:
        producer.close(timeout=10)
    assert offsets == sorted(offsets)
    consumer = kafka.KafkaConsumer(
        bootstrap_servers=cluster.kafka_bootstrap, auto_offset_reset="earliest"
    )
    try:
        consumer.assign([kafka.TopicPartition(topic, 0)])
        got: list[Any] = []
        deadline = time.monotonic() + 30
        while len(got) < len(sent):
            assert time.monotonic() < deadline, got
            for records in consumer.poll(timeout_ms=200).values():
                got.extend(records)
    finally:
        consumer.close()
    assert [(r.key, r.value, list(r.headers)) for r in got] == sent


def test_kafka_python_group_of_two_rebalances_and_reads_everything(cluster: LocalCluster) -> None:
    topic, group = "kp-group", "kp-group-g"
    create_topic(cluster, topic, PARTITIONS)
    producer = confluent_kafka.Producer({"bootstrap.servers": cluster.kafka_bootstrap})
    for i in range(100):
        producer.produce(topic, b"v%d" % i, b"k%d" % i)
    assert producer.flush(30) == 0
    got: list[bytes] = []
    assignments: dict[str, list[int]] = {}
    stop = threading.Event()
    errors: list[Exception] = []

    def member(name: str) -> None:
        # kafka-python rejoins only inside poll(): each member polls on its own thread.
        consumer = kafka.KafkaConsumer(
            topic,
            bootstrap_servers=cluster.kafka_bootstrap,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            session_timeout_ms=6000,
            heartbeat_interval_ms=300,
        )
        try:
            deadline = time.monotonic() + 40
            while not stop.is_set() and time.monotonic() < deadline:
                for records in consumer.poll(timeout_ms=100, max_records=10).values():
                    got.extend(r.value for r in records)
                assignments[name] = sorted(tp.partition for tp in consumer.assignment())
            consumer.commit()
        except Exception as exc:  # noqa: BLE001 - any failure is reported by the test's thread
            errors.append(exc)
        finally:
            consumer.close()

    first = threading.Thread(target=member, args=("first",))
    second = threading.Thread(target=member, args=("second",))
    first.start()
    try:
        deadline = time.monotonic() + 30
        while len(got) < 10 or "first" not in assignments:
            assert time.monotonic() < deadline and not errors, errors
            time.sleep(0.05)
        alone = assignments["first"]
        second.start()
        while not (
            len(assignments.get("first", [])) == len(assignments.get("second", [])) == 2
            and len(set(got)) >= 100
        ):
            assert time.monotonic() < deadline + 20 and not errors, (assignments, errors)
            time.sleep(0.05)
        halves = dict(assignments)
    finally:
        stop.set()
        first.join(20)
        if second.ident is not None:  # started
            second.join(20)
    assert not errors, errors
    assert alone == list(range(PARTITIONS))
    assert sorted(halves["first"] + halves["second"]) == list(range(PARTITIONS))
    assert set(got) == {b"v%d" % i for i in range(100)}


def test_kafka_python_offsets_for_times(cluster: LocalCluster) -> None:
    base = timed_topic(cluster, "kp-times")
    tp = kafka.TopicPartition("kp-times", 0)
    consumer = kafka.KafkaConsumer(bootstrap_servers=cluster.kafka_bootstrap)
    try:
        found = consumer.offsets_for_times({tp: base + 3500})[tp]
        beyond = consumer.offsets_for_times({tp: base + 99_000})[tp]
        consumer.assign([tp])
        consumer.seek(tp, found.offset)
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(got) < 6:
            assert time.monotonic() < deadline, got
            for records in consumer.poll(timeout_ms=200).values():
                got.extend(r.value for r in records)
    finally:
        consumer.close()
    assert found.timestamp == base + 4000  # the found record's own, not the time asked
    assert beyond is None
    assert got == [b"t%d" % i for i in range(4, 10)]


def test_confluent_kafka_offsets_for_times_seeks_by_timestamp(cluster: LocalCluster) -> None:
    base = timed_topic(cluster, "ck-times")
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": cluster.kafka_bootstrap, "group.id": "-"}
    )
    try:
        asked = confluent_kafka.TopicPartition("ck-times", 0, base + 3500)
        [found] = consumer.offsets_for_times([asked], timeout=20)
        consumer.assign([found])
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(got) < 6:
            assert time.monotonic() < deadline, got
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                got.append(message.value())
    finally:
        consumer.close()
    assert got == [b"t%d" % i for i in range(4, 10)]


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed")
def test_kcat_seeks_by_timestamp(cluster: LocalCluster) -> None:
    base = timed_topic(cluster, "kc-times")
    result = subprocess.run(
        [
            *("kcat", "-b", cluster.kafka_bootstrap, "-C", "-t", "kc-times", "-p", "0"),
            *("-o", f"s@{base + 3500}", "-e", "-f", "%s %T\n"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines()]
    assert rows == [[f"t{i}", str(base + 1000 * i)] for i in range(4, 10)]


def test_a_record_produced_with_confluent_kafka_is_read_exactly_by_cons(
    cluster: LocalCluster,
) -> None:
    topic = "ck-to-cons"
    create_topic(cluster, topic)
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": cluster.kafka_bootstrap, "acks": "all"}
    )
    sent = [(b"k 1", b"Hello World!"), (None, b"100% sure"), (b"gone", None)]
    for key, value in sent:
        producer.produce(topic, value, key, partition=0, headers=[("h", b"x")])
    assert producer.flush(30) == 0
    with socket.create_connection(cluster.client_address(1), timeout=30) as sock:
        reader = sock.makefile("rb")

        def call(line: str) -> list[bytes]:
            sock.sendall(line.encode() + b"\n")
            rows: list[bytes] = []
            while True:
                reply = reader.readline().rstrip(b"\r\n")
                assert not reply.startswith(b"-ERR"), reply
                if reply.startswith(b"+OK"):
                    return [reply]
                rows.append(reply)
                if reply.startswith(b"+END"):
                    return rows

        [joined] = call(f"SUBS {topic} ck-cons")
        member = joined.split()[1].decode()
        rows: list[bytes] = []
        deadline = time.monotonic() + 30
        while len([r for r in rows if r.startswith(b"+MSG")]) < len(sent):
            assert time.monotonic() < deadline, rows
            rows = call(f"CONS {topic} {member} 0 wait_ms=200")
    messages = [r.split(b" ", 4) for r in rows if r.startswith(b"+MSG")]
    # +MSG <partition> <offset> <key> <value>: keys percent-escaped, '-' for none.
    assert [(m[3], m[4] if len(m) > 4 else None) for m in messages] == [
        (b"k%201", b"Hello World!"),
        (b"-", b"100% sure"),
        (b"gone", None),
    ]


def test_records_produced_with_confluent_kafka_reach_an_mqtt_subscriber_exactly(
    cluster: LocalCluster,
) -> None:
    # RULES maps phones/+/commands to the log topic commands, keyed by the device: a record
    # keyed p-kafka goes out on phones/p-kafka/commands.
    phone = PahoDevice(cluster.mqtt_address(0), "p-kafka")
    try:
        phone.wait_connected()
        phone.subscribe("phones/p-kafka/commands", qos=1)
        producer = confluent_kafka.Producer(
            {
                "bootstrap.servers": cluster.kafka_bootstrap,
                "acks": "all",
                "compression.type": "gzip",
                "linger.ms": 50,  # one batch of both
            }
        )
        sent = [b'{"command": "blink"}', bytes(range(256))]
        for value in sent:
            producer.produce("commands", value, b"p-kafka")
        assert producer.flush(30) == 0
        wait_for(lambda: len(phone.payloads()) >= len(sent), 20, "the commands")
        assert phone.payloads() == sent
        assert {m.topic for m in phone.messages} == {"phones/p-kafka/commands"}
    finally:
        phone.close()
