"""Spark's own Kafka source and sink (``spark-sql-kafka-0-10`` 4.2.0, on the venv's Spark) against
a real 3-broker cluster through our Kafka front: batch reads with keys, headers and per-partition
offset ranges; Structured Streaming into a checkpointed Parquet sink, exactly once through a
driver kill -9 and a leader kill -9; and Spark's Kafka sink (batch and streaming) writing into
our topics, read back with our own client.

One cluster and one SparkSession for the module (a JVM start costs 10-25 s here); the streaming
test's driver is a process of its own (tests/peers/spark_kafka_driver.py), started twice.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafkaesque.spark_source import stop_session
from pyspark.sql import SparkSession
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    StringType,
    StructField,
    StructType,
)

from bench._spark_kafka_read import spark_kafka_available, spark_kafka_session
from kafkaesque.client import Client, Consumer, ConsumerRecord, Producer, ProducerConfig
from kafkaesque.local_cluster import LocalCluster

pytestmark = [
    pytest.mark.peers,
    pytest.mark.skipif(
        not spark_kafka_available(), reason="Spark's Kafka connector is missing: bin/fetch-peers"
    ),
]

OUTPUT_SCHEMA = "value STRING, partition INT, offset BIGINT"  # the driver's Parquet rows
DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "spark_kafka_driver.py")

# (partition, offset) -> (key, value, timestamp in ms, headers) of what a test published.
Published = dict[tuple[int, int], tuple[bytes | None, bytes, int, list[tuple[str, bytes]]]]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(str(tmp_path_factory.mktemp("spark-kafka")), 3) as c:
        c.wait_ready()
        yield c


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = spark_kafka_session("spark-kafka-tests")
    try:
        yield session
    finally:
        stop_session(session)


def publish(cluster: LocalCluster, topic: str, count: int) -> Published:
    """Create ``topic`` (3 partitions, RF 3) and publish ``count`` records: keyed but for every
    fifth, each with two headers (one repeated name, as Kafka allows)."""
    with Client(cluster.bootstrap) as client:
        client.create_topic(topic, 3, 3)
        with Producer(client, ProducerConfig(linger_ms=2)) as producer:
            sent = []
            for i in range(count):
                key = None if i % 5 == 0 else b"k%d" % (i % 7)
                value = b"v%d" % i
                headers = [("n", b"%d" % i), ("n", b"again")]
                sent.append(
                    (key, value, headers, producer.send(topic, value, key, headers=headers))
                )
            producer.flush()
        published: Published = {}
        for key, value, headers, future in sent:
            meta = future.get()
            published[meta.partition, meta.offset] = (key, value, meta.timestamp, headers)
        return published


def read_back(cluster: LocalCluster, topic: str) -> list[ConsumerRecord]:
    """Every record of ``topic``, through our own client (the line protocol)."""
    with Consumer(cluster.bootstrap) as consumer:
        consumer.assign_topic(topic)
        consumer.seek_to_beginning()
        return list(consumer.records(follow=False, poll_timeout=0.5))


def test_batch_read_returns_every_record_with_its_key_headers_and_position(
    spark: SparkSession, cluster: LocalCluster
) -> None:
    published = publish(cluster, "sk-batch", 60)
    df = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", cluster.kafka_bootstrap)
        .option("subscribe", "sk-batch")
        .option("includeHeaders", "true")
        .load()
    )
    got: Published = {}
    for row in df.selectExpr(
        "topic", "partition", "offset", "key", "value", "unix_millis(timestamp)", "headers"
    ).collect():
        topic, partition, offset, key, value, millis, headers = row
        assert topic == "sk-batch"
        assert (partition, offset) not in got, "a record came twice"
        got[partition, offset] = (
            None if key is None else bytes(key),
            bytes(value),
            millis,
            [(h.key, bytes(h.value)) for h in headers],
        )
    assert got == published

    # startingOffsets / endingOffsets as JSON per partition (-2 earliest, -1 latest).
    ends = {p: max(o for q, o in published if q == p) + 1 for p in range(3)}
    starts = {p: min(o for q, o in published if q == p) for p in range(3)}
    starting = {"sk-batch": {"0": starts[0] + 2, "1": -2, "2": starts[2] + 1}}
    ending = {"sk-batch": {"0": ends[0] - 1, "1": -1, "2": starts[2] + 3}}
    ranged = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", cluster.kafka_bootstrap)
        .option("subscribe", "sk-batch")
        .option("startingOffsets", json.dumps(starting))
        .option("endingOffsets", json.dumps(ending))
        .load()
        .select("partition", "offset")
        .collect()
    )
    wanted = {
        (p, o)
        for p, o in published
        if (p == 0 and starts[0] + 2 <= o < ends[0] - 1)
        or p == 1
        or (p == 2 and starts[2] + 1 <= o < starts[2] + 3)
    }
    assert sorted((r.partition, r.offset) for r in ranged) == sorted(wanted)


def test_spark_kafka_sink_writes_into_our_topics(
    spark: SparkSession, cluster: LocalCluster, tmp_path: Path
) -> None:
    with Client(cluster.bootstrap) as client:
        client.create_topic("sk-sink", 3, 3)
        client.create_topic("sk-sink-stream", 3, 3)
    header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    schema = StructType(
        [
            StructField("key", BinaryType()),
            StructField("value", BinaryType()),
            StructField("partition", IntegerType()),
            StructField("headers", ArrayType(header)),
        ]
    )
    rows = [
        (None if i % 4 == 0 else b"k%d" % i, b"w%d" % i, i % 3, [("h", b"%d" % i)])
        for i in range(30)
    ]
    (
        spark.createDataFrame(rows, schema)
        .write.format("kafka")
        .option("kafka.bootstrap.servers", cluster.kafka_bootstrap)
        .option("topic", "sk-sink")
        .save()
    )
    written = read_back(cluster, "sk-sink")
    assert sorted(((r.key, r.value, r.partition, r.headers) for r in written), key=repr) == sorted(
        ((key, value, partition, (("h", h[0][1]),)) for key, value, partition, h in rows), key=repr
    )

    # A streaming query from one of our topics into another, through Spark's source and sink.
    query = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", cluster.kafka_bootstrap)
        .option("subscribe", "sk-sink")
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr("key", "concat(value, '!') AS value")
        .writeStream.format("kafka")
        .option("kafka.bootstrap.servers", cluster.kafka_bootstrap)
        .option("topic", "sk-sink-stream")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120), "the streaming query did not finish in 120 s"
    assert query.exception() is None
    streamed = read_back(cluster, "sk-sink-stream")
    assert sorted(((r.key, r.value) for r in streamed), key=repr) == sorted(
        ((key, value + b"!") for key, value, _, _ in rows), key=repr
    )


class SerialProducer:
    """Publishes ``v000000``, ``v000001``, ... into a topic from a thread, ``rate`` a second until
    ``stop()`` (at most ``limit``), with our idempotent producer (a leader killed mid-send neither
    loses nor doubles a record). ``sent`` counts the records acknowledged once it has stopped."""

    def __init__(self, cluster: LocalCluster, topic: str, rate: float, limit: int) -> None:
        self.cluster, self.topic, self.rate, self.limit = cluster, topic, rate, limit
        self.sent = 0
        self.error: Exception | None = None
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            with (
                Client(self.cluster.bootstrap) as client,
                Producer(client, ProducerConfig(linger_ms=5)) as producer,
            ):
                futures = []
                for i in range(self.limit):
                    if self._stop.wait(1 / self.rate):
                        break
                    futures.append(producer.send(self.topic, b"v%06d" % i, b"%d" % i))
                producer.flush()
                for future in futures:
                    future.get()
                self.sent = len(futures)
        except Exception as exc:  # noqa: BLE001 (the test reports it)
            self.error = exc

    def stop(self, timeout: float) -> int:
        """Stop, wait for every record's acknowledgement, and return how many were sent."""
        self._stop.set()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"the producer did not finish in {timeout} s"
        assert self.error is None, self.error
        return self.sent


class Driver:
    """The streaming query's driver process (Python and its JVM, a process group of their own)."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.log = log
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, DRIVER, *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def kill(self) -> None:
        """kill -9 the driver and its JVM at once, as a crashed machine would."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            tail = self.log.read_text(errors="replace")[-3000:]
            raise AssertionError(f"the driver exited ({self.proc.returncode}):\n{tail}")


def test_streaming_into_parquet_is_exactly_once_through_driver_and_leader_kills(
    spark: SparkSession, cluster: LocalCluster, tmp_path: Path
) -> None:
    with Client(cluster.bootstrap) as client:
        client.create_topic("sk-stream", 3, 3)
    output, checkpoint, log = tmp_path / "out", tmp_path / "checkpoint", tmp_path / "driver.log"
    args = [cluster.kafka_bootstrap, "sk-stream", str(output), str(checkpoint), "400"]

    def written() -> int:
        # The file sink's own log (_spark_metadata) names the committed files: a batch cut
        # short by a kill leaves files that a reader must not (and does not) see.
        if not (output / "_spark_metadata").is_dir():
            return 0
        return spark.read.schema(OUTPUT_SCHEMA).parquet(str(output)).count()

    def wait_written(at_least: int, driver: Driver, timeout: float = 300) -> int:
        # Generous: a driver's JVM takes 15-70 s to start on two cores shared with the brokers
        # (and, here, with other work), and its first micro-batch as long again.
        deadline = time.monotonic() + timeout
        while (now := written()) < at_least:
            driver.check_alive()
            assert producer.error is None, producer.error
            assert time.monotonic() < deadline, f"{now} < {at_least} rows after {timeout} s"
            time.sleep(1)
        return now

    # Records keep arriving through every step, until the last one.
    producer = SerialProducer(cluster, "sk-stream", rate=20, limit=20_000)
    driver = Driver(args, log)
    try:
        wait_written(20, driver)
        driver.kill()
        driver = Driver(args, log)
        wait_written(written() + 20, driver)
        with Client(cluster.bootstrap) as client:
            leader = client.describe_topic("sk-stream").partitions[0].leader
        assert leader is not None
        cluster.kill(leader)
        time.sleep(2)
        cluster.start(leader)
        cluster.wait_ready()
        wait_written(written() + 20, driver)
        count = producer.stop(60)
        wait_written(count, driver)
        time.sleep(2)  # a duplicate would come in a later batch
        driver.check_alive()
    finally:
        producer.stop(60)
        driver.kill()
    out = spark.read.schema(OUTPUT_SCHEMA).parquet(str(output))
    rows = out.select("value", "partition", "offset").collect()
    serials = [int(r.value[1:]) for r in rows]
    assert len(serials) == count, f"{len(serials)} rows for {count} records"
    assert sorted(serials) == list(range(count))
    assert len({(r.partition, r.offset) for r in rows}) == count
