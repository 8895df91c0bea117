"""The benchmark's records: loading the topic, and the two baseline files written from it."""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]
from kafkaesque.spark_source import arrow_batch, row_tuples
from pyspark.sql import SparkSession

from kafkaesque.client import Client, Producer, ProducerConfig

VALUE_BYTES = 100
FETCH_BYTES = 1024 * 1024  # what the source fetches at a time by default (fetchMaxBytes)
EMPTY_WAIT_MS = 200  # a fetch that found nothing waits this long for data on the next try
FETCH_PATIENCE_S = 30.0
DEVICES = 1000
JSON_SCHEMA = (
    "key string, value string, topic string, partition int, offset long, "
    "timestamp timestamp, timestampType int"
)
"""The JSON-lines file holds the source's columns with key and value as text (JSON has no
bytes); Spark is given the schema, so it does not scan the file to infer one."""


def value_of(i: int) -> bytes:
    """Record ``i``'s value: a 100-byte JSON reading, unique per record. Its tail is hex noise
    (a hash), so Parquet's compression does not shrink it to nothing: ``x`` padding would make
    the Parquet file a few MB for 2 million records, a flattering baseline no real data gives."""
    head = b'{"device":"device-%05d","serial":%d,"dbm":-%d,"sig":"' % (
        i % DEVICES,
        i // DEVICES,
        40 + i % 60,
    )
    noise = hashlib.blake2b(b"%d" % i, digest_size=32).hexdigest().encode()
    return head + noise[: VALUE_BYTES - len(head) - 2] + b'"}'


def load_topic(bootstrap: str, topic: str, records: int) -> None:
    """Publish ``records`` keyed records (``device-NNNNN``) into ``topic`` and wait until the
    cluster has acknowledged every one (quorum acks)."""
    config = ProducerConfig(linger_ms=5, batch_size=256 * 1024, max_buffered_bytes=64 << 20)
    with Client(bootstrap) as client, Producer(client, config) as producer:
        for i in range(records):
            producer.send(topic, value_of(i), b"device-%05d" % (i % DEVICES))
        producer.flush()
        if producer.failed:
            raise RuntimeError(f"{producer.failed} records were not delivered")


@dataclass(frozen=True)
class Fetched:
    """One partition's payloads as ``FETCH`` returned them, each with the offset it was asked
    from, and the partition's end."""

    partition: int
    end: int
    payloads: list[tuple[bytes, int]]

    def arrow(self, topic: str) -> list[pa.RecordBatch]:
        """The records as Arrow batches (the source's fast path)."""
        batches = (
            arrow_batch(p, lo, self.end, topic, self.partition, include_headers=False)
            for p, lo in self.payloads
        )
        return [b for b in batches if b is not None]

    def tuples(self, topic: str) -> int:
        """How many records the tuple path decodes (the rows are dropped)."""
        return sum(
            1
            for p, lo in self.payloads
            for _ in row_tuples(p, lo, self.end, topic, self.partition, include_headers=False)
        )


def fetch_topic(bootstrap: str, topic: str) -> list[Fetched]:
    """Every partition of ``topic``, fetched by offset with the client's ``fetch_batch`` (the
    call the source's fetch loop makes), ``FETCH_BYTES`` at a time.

    Raises ``RuntimeError`` if a partition makes no progress for ``FETCH_PATIENCE_S``.
    """
    fetched = []
    with Client(bootstrap) as client:
        client.refresh_metadata([topic])  # so fetches go to the leaders
        for row in client.describe_topic(topic).partitions:
            assert row.start_offset is not None and row.end_offset is not None
            payloads: list[tuple[bytes, int]] = []
            offset, wait_ms = row.start_offset, 0
            progress_at = time.monotonic()
            while offset < row.end_offset:
                got = client.fetch_batch(
                    topic, row.partition, offset, max_bytes=FETCH_BYTES, wait_ms=wait_ms
                )
                if got.next_offset <= offset:  # a leader that has not yet learnt the commit
                    if time.monotonic() - progress_at > FETCH_PATIENCE_S:
                        raise RuntimeError(f"no data at {topic}/{row.partition} offset {offset}")
                    wait_ms = EMPTY_WAIT_MS
                    continue
                payloads.append((got.payload, offset))
                offset, wait_ms, progress_at = got.next_offset, 0, time.monotonic()
            fetched.append(Fetched(row.partition, row.end_offset, payloads))
    return fetched


def write_baselines(
    spark: SparkSession, table: pa.Table, directory: str, splits: int
) -> tuple[str, str]:
    """Write ``table`` as one Parquet file (pyarrow; a few row groups per split, so Spark can
    read it in parallel) and, from it, one JSON-lines file (Spark's JSON writer, key and value
    as text); returns their paths."""
    parquet_path = os.path.join(directory, "records.parquet")
    pq.write_table(table, parquet_path, row_group_size=max(table.num_rows // (4 * splits), 1))
    json_dir = os.path.join(directory, "json")
    spark.read.parquet(parquet_path).selectExpr(
        "cast(key as string) key", "cast(value as string) value", "topic", "partition",
        "offset", "timestamp", "timestampType",
    ).coalesce(1).write.json(json_dir)  # fmt: skip
    (name,) = [n for n in os.listdir(json_dir) if n.startswith("part-") and n.endswith(".json")]
    return os.path.join(json_dir, name), parquet_path
