"""A streaming query through real Spark: stopped mid-stream, a batch replayed, restarted.

The sink (``foreachBatch``) writes each micro-batch it is handed to its own file, so the test
sees every delivery, replays included. After a stop, the last batch's commit is removed from the
checkpoint, as a crash between processing a batch and committing it leaves it: Spark then runs
that batch again with the offsets it logged, and the source must read exactly the same records.
The restart runs ``Trigger.AvailableNow``, which must end once it has read what was published
before it started. In the end every published record reached the sink exactly once.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import DataSourceStreamReader
from pyspark.sql.streaming.query import StreamingQuery

from kafkaesque.local_cluster import LocalCluster

from .conftest import publish

# Spark 4.2 added read limits, reportLatestOffset and Trigger.AvailableNow for Python sources;
# on 4.1 the source works without them (docs/spark.md), and this module checks what 4.1 offers.
SPARK_42 = hasattr(DataSourceStreamReader, "reportLatestOffset")

MAX_PER_TRIGGER = 400


def start_query(
    spark: SparkSession, bootstrap: str, checkpoint: Path, out: Path, **trigger: Any
) -> StreamingQuery:
    def sink(batch: DataFrame, batch_id: int) -> None:
        rows = sorted(tuple(r) for r in batch.select("partition", "offset", "value").collect())
        name = out / f"batch-{batch_id:04d}-{time.monotonic_ns()}.json"
        name.write_text(json.dumps([[p, o, bytes(v).decode()] for p, o, v in rows]))

    stream = (
        spark.readStream.format("kafkaesque")
        .option("bootstrap", bootstrap)
        .option("subscribe", "stream")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(MAX_PER_TRIGGER))
        .load()
    )
    return (
        stream.writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(**trigger)
        .start()
    )


def deliveries(out: Path) -> dict[int, list[list[list[Any]]]]:
    """batch id -> what each delivery of that batch held, in order."""
    found: dict[int, list[list[list[Any]]]] = defaultdict(list)
    for path in sorted(out.glob("batch-*.json"), key=lambda p: int(p.stem.split("-")[2])):
        found[int(path.stem.split("-")[1])].append(json.loads(path.read_text()))
    return found


def crash_after_sink(checkpoint: Path, batch_id: int) -> None:
    """Leave ``checkpoint`` as a crash right after the sink took ``batch_id`` leaves it: the
    batch's offsets logged, its commit not, nothing planned after it."""
    for log in ("offsets", "commits"):
        for path in (checkpoint / log).iterdir():
            name = path.name.strip(".").removesuffix(".crc")
            if not name.isdigit():
                # ``.1.<uuid>.tmp``: a write that stopping the query cut short. Spark reads only
                # the numbered files, as after a crash. (Seen once in CI.)
                continue
            number = int(name)
            if number > batch_id or (log == "commits" and number == batch_id):
                path.unlink()


def test_restart_from_checkpoint_delivers_every_record_exactly_once(
    spark: SparkSession, cluster: LocalCluster, tmp_path: Path
) -> None:
    checkpoint, out = tmp_path / "checkpoint", tmp_path / "out"
    out.mkdir()
    published = publish(cluster.bootstrap, "stream", 1500)

    query = start_query(
        spark, cluster.bootstrap, checkpoint, out, processingTime="100 milliseconds"
    )
    try:
        deadline = time.monotonic() + 120
        while len(deliveries(out)) < 2 and time.monotonic() < deadline:
            assert query.exception() is None, query.exception()
            if not SPARK_42 and deliveries(out) and len(published) == 1500:
                # Spark 4.1 reads everything in its first micro-batch (no read limits): a
                # second one needs more records.
                published.update(
                    publish(cluster.bootstrap, "stream", 300, create=False, start=1500)
                )
            time.sleep(0.2)
        lagging = [
            source
            for progress in query.recentProgress
            for source in progress.sources
            if source.latestOffset and source.latestOffset != source.endOffset
        ]
    finally:
        query.stop()
    assert len(deliveries(out)) >= 2, "the stream did not get going"
    if SPARK_42:  # reportLatestOffset: progress shows the ends beside the batch's end (lag)
        assert lagging and set(json.loads(lagging[0].latestOffset)) == {"stream"}

    published.update(publish(cluster.bootstrap, "stream", 600, create=False, start=len(published)))
    replayed = max(deliveries(out))
    crash_after_sink(checkpoint, replayed)

    if SPARK_42:
        query = start_query(spark, cluster.bootstrap, checkpoint, out, availableNow=True)
        try:
            assert query.awaitTermination(180), "Trigger.AvailableNow did not end"
            assert query.exception() is None
        finally:
            query.stop()
    else:  # Spark 4.1 has no Trigger.AvailableNow for Python sources: run until all is read
        query = start_query(
            spark, cluster.bootstrap, checkpoint, out, processingTime="100 milliseconds"
        )
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and sum(
                len(b[-1]) for b in deliveries(out).values()
            ) < len(published):
                assert query.exception() is None, query.exception()
                time.sleep(0.2)
        finally:
            query.stop()

    batches = deliveries(out)
    assert len(batches[replayed]) == 2, "the uncommitted batch was not replayed"
    assert batches[replayed][0] == batches[replayed][1], "a replay read different records"
    assert all(len(d) == 1 for b, d in batches.items() if b != replayed)
    delivered: dict[tuple[int, int], str] = {}
    for batch in batches.values():
        rows = batch[-1]
        if SPARK_42:  # Spark 4.1 has no read limits (and runs empty micro-batches)
            assert 0 < len(rows) <= MAX_PER_TRIGGER  # admission control: maxOffsetsPerTrigger
        for partition, offset, value in rows:
            assert (partition, offset) not in delivered, "a record was delivered twice"
            delivered[partition, offset] = value
    assert delivered == {k: v.decode() for k, (_, v, _) in published.items()}


def test_a_streams_bad_offsets_fail_the_query_with_the_sources_own_message(
    spark: SparkSession, cluster: LocalCluster, tmp_path: Path
) -> None:
    """endingOffsets (batch only) and a startingOffsets past the end: the query's error is the
    source's OptionError, not PySpark's UnboundLocalError nor a "topic recreated?" guess."""
    publish(cluster.bootstrap, "refused", 5, partitions=1)
    cases = [
        ({"endingOffsets": "latest"}, "endingOffsets is not valid in a streaming query"),
        (
            {"startingOffsets": '{"refused": {"0": 10000000}}'},
            "startingOffsets for refused/0 is 10000000, but the partition ends at ",
        ),
    ]
    for number, (options, message) in enumerate(cases):
        reader = spark.readStream.format("kafkaesque").option("bootstrap", cluster.bootstrap)
        for key, value in {"subscribe": "refused", **options}.items():
            reader = reader.option(key, value)
        query = (
            reader.load()
            .writeStream.format("noop")
            .option("checkpointLocation", str(tmp_path / f"checkpoint-{number}"))
            .start()
        )
        try:
            with pytest.raises(StreamingQueryException) as failed:
                query.awaitTermination(120)  # raises the query's error
        finally:
            query.stop()
        error = str(failed.value)
        assert message in error, error
        assert "UnboundLocalError" not in error and "recreated" not in error, error
