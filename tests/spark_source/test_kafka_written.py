"""Records written over the Kafka protocol (confluent-kafka: gzip and zstd batches, headers,
null keys and values, the producer's own timestamps) are read exactly by the Spark source, on
the package's shared Spark session and cluster (a small job: about a second)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from pyspark.sql import SparkSession

from kafkaesque.client import Client
from kafkaesque.local_cluster import LocalCluster

from .conftest import read

confluent_kafka = pytest.importorskip("confluent_kafka")


def test_records_produced_with_confluent_kafka_are_read_exactly_by_spark(
    spark: SparkSession, cluster: LocalCluster
) -> None:
    topic = "kafka-written"
    with Client(cluster.bootstrap) as client:
        client.create_topic(topic, 2, 3)
    # Recent times: the package's cluster checks retention often, and a segment of records
    # older than the retention time would be deleted before Spark reads it.
    base = int(time.time() * 1000) - 60_000
    records = [
        (b"k0", b"v0", [("h", b"1"), ("empty", b"")]),
        (None, b"no key", []),
        (b"tombstone", None, [("why", b"deleted")]),
        (None, None, []),
        (b"big", b"x" * 10_000, []),
    ]
    sent: dict[tuple[int, int], tuple[Any, ...]] = {}

    def delivered(error: Any, message: Any) -> None:
        assert error is None, error
        key, value, headers, stamp = records_by_value[message.value(), message.key()]
        sent[message.partition(), message.offset()] = (key, value, headers, stamp)

    records_by_value: dict[tuple[Any, Any], tuple[Any, ...]] = {}
    for codec in ("gzip", "zstd"):
        producer = confluent_kafka.Producer(
            {"bootstrap.servers": cluster.kafka_bootstrap, "acks": "all", "compression.type": codec}
        )
        for i, (key, value, headers) in enumerate(records):
            key = None if key is None else key + codec.encode()
            value = None if value is None else value + codec.encode()
            stamp = base + 1000 * i + (0 if codec == "gzip" else 500)
            records_by_value[value, key] = (key, value, headers, stamp)
            partition = i % 2
            producer.produce(
                topic,
                value,
                key,
                partition=partition,
                headers=headers,
                timestamp=stamp,
                on_delivery=delivered,
            )
        assert producer.flush(30) == 0
    assert len(sent) == 2 * len(records)
    df = read(spark, cluster.bootstrap, subscribe=topic, includeHeaders="true")
    got: dict[tuple[int, int], tuple[Any, ...]] = {}
    for row in df.selectExpr(
        "partition", "offset", "key", "value", "headers", "unix_millis(timestamp) AS millis"
    ).collect():
        assert (row.partition, row.offset) not in got, "a record came twice"
        got[row.partition, row.offset] = (
            None if row.key is None else bytes(row.key),
            None if row.value is None else bytes(row.value),
            [(h.key, bytes(h.value)) for h in row.headers or []],
            row.millis,
        )
    assert got == sent
