"""One local Spark session and one 3-broker cluster for the Spark tests (real JVM, real brokers).

The session is shared by every module of this package (starting a JVM costs 10-20 s of the
suite's budget): ``local[2]``, UI off, two shuffle partitions, workers running this interpreter.
It and its JVM are stopped when the package's tests end. The cluster rolls 4 KiB segments and
checks retention twice a second so a test can see retention delete records.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kafkaesque.spark_source import local_session, stop_session
from pyspark.sql import DataFrame, SparkSession

from kafkaesque.client import Client, Producer, ProducerConfig
from kafkaesque.local_cluster import LocalCluster

Published = dict[tuple[int, int], tuple[bytes, bytes, int]]
"""(partition, offset) -> (key, value, timestamp in ms) of what a test published."""


@pytest.fixture(scope="package")
def spark() -> Iterator[SparkSession]:
    session = local_session("kafkaesque-tests", master="local[2]", shuffle_partitions=2)
    try:
        yield session
    finally:
        stop_session(session)


@pytest.fixture(scope="package")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    args = ["--segment-bytes", "4096", "--retention-check-interval", "0.5"]
    with LocalCluster(str(tmp_path_factory.mktemp("spark-cluster")), 3, extra_args=args) as c:
        yield c


def publish(
    bootstrap: str,
    topic: str,
    count: int,
    *,
    partitions: int = 3,
    create: bool = True,
    value_size: int = 0,
    start: int = 0,
) -> Published:
    """Create ``topic`` (replication factor 3) unless told not to, publish ``count`` keyed
    records (``value_size`` pads values), and return where each one landed."""
    with Client(bootstrap) as client:
        if create:
            client.create_topic(topic, partitions, 3)
        with Producer(client, ProducerConfig(linger_ms=2)) as producer:
            sent = []
            for i in range(start, start + count):
                key, value = b"k%d" % (i % 17), b"v%d-" % i + b"x" * value_size
                future = producer.send(topic, value, key, headers=[("n", b"%d" % i)])
                sent.append((key, value, future))
            producer.flush()
        published: Published = {}
        for key, value, future in sent:
            meta = future.get()
            published[meta.partition, meta.offset] = (key, value, meta.timestamp)
        return published


def read(spark: SparkSession, bootstrap: str, **options: str) -> DataFrame:
    reader = spark.read.format("kafkaesque").option("bootstrap", bootstrap)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def rows_by_offset(df: DataFrame) -> Published:
    got: Published = {}
    for row in df.selectExpr(
        "partition", "offset", "key", "value", "unix_millis(timestamp)"
    ).collect():
        partition, offset, key, value, millis = row
        assert (partition, offset) not in got, "a record came twice"
        got[partition, offset] = (bytes(key), bytes(value), millis)
    return got
