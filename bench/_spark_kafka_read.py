"""Spark's own Kafka source and sink (``spark-sql-kafka-0-10``) beside Kafkaesque's source.

The connector's jars are pinned in peers/spark-kafka/pom.xml and fetched by ``bin/fetch-peers``
into peers/spark-kafka/libs/ (its own directory: the connector's kafka-clients 3.9 must not meet
Kafka 4.3.1's in peers/kafka/libs/). A session gets them as ``spark.jars``
(:func:`spark_kafka_conf`), never through ``spark.jars.packages``, so nothing is downloaded while
a test or benchmark runs.

The two read timings are for ``bench.kafka`` (its ``spark_read_vs_kafka`` and
``our_source_vs_spark_kafka_source`` figures): a batch read of a whole topic, every row and column
into Spark rows, its records counted and checked; the session's start-up is not timed.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Mapping, Sequence

from kafkaesque.spark_source import local_session, stop_session
from pyspark.sql import DataFrame, SparkSession

from .spark import scan

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPARK_KAFKA_LIBS = os.path.join(ROOT, "peers", "spark-kafka", "libs")
FETCH_PEERS = os.path.join(ROOT, "bin", "fetch-peers")


class SparkKafkaMissing(RuntimeError):
    """The connector's jars are not fetched; ``bin/fetch-peers`` fetches them."""


def spark_kafka_jars() -> list[str]:
    """The connector's jars (paths), or :class:`SparkKafkaMissing` saying how to fetch them."""
    jars = sorted(glob.glob(os.path.join(SPARK_KAFKA_LIBS, "*.jar")))
    if not os.path.isfile(os.path.join(SPARK_KAFKA_LIBS, ".stamp")) or not jars:
        raise SparkKafkaMissing(f"Spark's Kafka connector is not in {SPARK_KAFKA_LIBS}: "
                                f"run {FETCH_PEERS}")  # fmt: skip
    return jars


def spark_kafka_available() -> bool:
    """Whether :func:`spark_kafka_jars` would answer (for a test's skip condition)."""
    try:
        spark_kafka_jars()
    except SparkKafkaMissing:
        return False
    return True


def spark_kafka_conf(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Session settings that make ``format("kafka")`` available: the jars as ``spark.jars``."""
    return {"spark.jars": ",".join(spark_kafka_jars()), **(extra or {})}


def spark_kafka_session(app_name: str, extra: Mapping[str, str] | None = None) -> SparkSession:
    """A local session (``local[2]``, as every Spark test and benchmark here) with both sources:
    ``format("kafka")`` (Spark's) and ``format("kafkaesque")`` (ours). Stop it with
    ``stop_session``."""
    spark: SparkSession = local_session(
        app_name, master="local[2]", shuffle_partitions=2, conf=spark_kafka_conf(extra)
    )
    return spark


def _timed_scan(df: DataFrame, records: int, source: str) -> float:
    """Seconds to read every row and column of ``df`` (a ``noop`` write: ``count()`` alone
    would let a source skip decoding), then a check that it holds ``records`` rows.

    First, unmeasured, the first rows of it (``limit``): a session's first query pays one-time
    costs (Python workers starting and importing the source, the JVM compiling the plan's
    code, the Kafka consumer's classes loading) that are start-up, not reading."""
    df.limit(1000).collect()
    seconds = scan(df)
    counted = df.count()
    assert counted == records, f"{source} read {counted:,} records, expected {records:,}"
    return seconds


def spark_kafka_read_seconds(bootstrap: str, topic: str, records: int) -> float:
    """Seconds for Spark's Kafka source to read all of ``topic`` (``records`` records) through
    the Kafka listeners ``bootstrap`` (``host:port,...``: Kafka's or ours); start-up excluded."""
    spark = spark_kafka_session("bench-spark-kafka-source")
    try:
        df = (
            spark.read.format("kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .option("endingOffsets", "latest")
            .load()
        )
        return _timed_scan(df, records, "Spark's Kafka source")
    finally:
        stop_session(spark)


def our_source_read_seconds(addresses: str | Sequence[str], topic: str, records: int) -> float:
    """Seconds for Kafkaesque's own source (``format("kafkaesque")``) to read all of ``topic``
    through the client listeners ``addresses`` (``host:port,...`` or a list of them); start-up
    excluded."""
    bootstrap = addresses if isinstance(addresses, str) else ",".join(addresses)
    spark = local_session("bench-kafkaesque-source", master="local[2]", shuffle_partitions=2)
    try:
        df = (
            spark.read.format("kafkaesque")
            .option("bootstrap", bootstrap)
            .option("subscribe", topic)
            .load()
        )
        return _timed_scan(df, records, "the kafkaesque source")
    finally:
        stop_session(spark)
