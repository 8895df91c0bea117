"""Batch reads through real Spark (local[2]) from a real 3-broker cluster.

A read of an offset range returns exactly what was published there (key, value, partition,
offset, timestamp), on the Arrow path and on the tuple path; bad options fail at planning with a
message naming the option; retention that deleted part of a range is an error naming the
partition and offsets, or a warning and a read of what remains.
"""

from __future__ import annotations

import json
import pickle
import shutil
import subprocess
import sys
import time
from typing import Any

import pytest
from kafkaesque.spark_source import (
    DataLossError,
    KafkaesqueBatchReader,
    KafkaesqueStreamReader,
    WorkerPythonError,
    register,
    worker_python,
)
from kafkaesque.spark_source._offsets import OffsetRange
from kafkaesque.spark_source._options import parse_options
from kafkaesque.spark_source._read import ReadSettings, fetch_range
from pyspark.sql import SparkSession

from kafkaesque.client import Client, TopicPartition
from kafkaesque.local_cluster import LocalCluster

from .conftest import Published, publish, read, rows_by_offset


@pytest.fixture(scope="module")
def readings(cluster: LocalCluster) -> Published:
    return publish(cluster.bootstrap, "readings", 3000)


@pytest.mark.parametrize("use_arrow", ["true", "false"])
def test_a_batch_read_returns_exactly_what_was_published(
    spark: SparkSession, cluster: LocalCluster, readings: Published, use_arrow: str
) -> None:
    df = read(spark, cluster.bootstrap, subscribe="readings", useArrow=use_arrow)
    assert rows_by_offset(df) == readings
    kinds = df.selectExpr("topic", "timestampType").distinct().collect()
    assert [tuple(r) for r in kinds] == [("readings", 0)]


def test_explicit_offset_ranges_split_for_min_partitions(
    spark: SparkSession, cluster: LocalCluster, readings: Published
) -> None:
    ends = {p: max(o for q, o in readings if q == p) + 1 for p in range(3)}
    starting = {"readings": {"0": 5, "1": -2, "2": 100}}
    ending = {"readings": {"0": 50, "1": -1, "2": ends[2] - 10}}
    want = {
        (p, o): v
        for (p, o), v in readings.items()
        if (p == 0 and 5 <= o < 50) or p == 1 or (p == 2 and 100 <= o < ends[2] - 10)
    }
    for use_arrow in ("true", "false"):
        df = read(
            spark,
            cluster.bootstrap,
            subscribe="readings",
            startingOffsets=json.dumps(starting),
            endingOffsets=json.dumps(ending),
            minPartitions="7",
            useArrow=use_arrow,
        )
        assert df.rdd.getNumPartitions() == 7
        assert rows_by_offset(df) == want


def test_headers_assign_and_pattern(
    spark: SparkSession, cluster: LocalCluster, readings: Published
) -> None:
    df = read(spark, cluster.bootstrap, assign='{"readings": [1]}', includeHeaders="true")
    rows = df.select("offset", "value", "headers").collect()
    assert len(rows) == sum(1 for p, _ in readings if p == 1)
    for row in rows:
        number = bytes(row.value).split(b"-")[0][1:]
        assert [(h.key, bytes(h.value)) for h in row.headers] == [("n", number)]
    pattern = read(spark, cluster.bootstrap, subscribePattern="read.n.s")
    assert pattern.count() == len(readings)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribe": "readings", "startingOfsets": "earliest"}, "unknown option"),
        ({"subscribe": "readings", "startingOffsets": "latest"}, '"latest" is not valid in a'),
        ({"subscribe": "no-such-topic"}, "topic 'no-such-topic' does not exist"),
        ({"assign": '{"readings": [9]}'}, "assign names partitions that do not exist: readings/9"),
        (
            {"subscribe": "readings", "endingOffsets": '{"readings": {"0": 1, "1": 1}}'},
            "missing: readings/2",
        ),
        (
            {
                "subscribe": "readings",
                "endingOffsets": '{"readings": {"0": 99999, "1": -1, "2": -1}}',
            },
            "endingOffsets for readings/0 is 99999, but the partition ends at",
        ),
    ],
)
def test_bad_options_fail_at_planning_naming_the_option(
    spark: SparkSession,
    cluster: LocalCluster,
    readings: Published,
    options: dict[str, str],
    message: str,
) -> None:
    with pytest.raises(Exception, match="OptionError") as caught:
        read(spark, cluster.bootstrap, **options).collect()
    assert message in str(caught.value)


def test_a_schema_of_ones_own_is_refused(spark: SparkSession, cluster: LocalCluster) -> None:
    reader = spark.read.format("kafkaesque").schema("value string")
    with pytest.raises(Exception, match="kafkaesque has a fixed schema"):
        reader.option("bootstrap", cluster.bootstrap).option("subscribe", "x").load().collect()


def wait_for_log_start(client: Client, topic: str) -> tuple[int, int]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        row = client.describe_topic(topic).partitions[0]
        if row.start_offset and row.end_offset:
            return row.start_offset, row.end_offset
        time.sleep(0.2)
    raise AssertionError("retention deleted nothing in 30 s")


def test_retention_deleted_part_of_the_range(
    spark: SparkSession, cluster: LocalCluster, caplog: pytest.LogCaptureFixture
) -> None:
    with Client(cluster.bootstrap) as client:
        client.create_topic("kept", 1, 3, retention_bytes=20_000)
        published = publish(
            cluster.bootstrap, "kept", 300, partitions=1, create=False, value_size=300
        )
        start, end = wait_for_log_start(client, "kept")
    from_zero = {"subscribe": "kept", "startingOffsets": '{"kept": {"0": 0}}'}
    with pytest.raises(Exception, match="partition kept/0: offsets 0 to") as caught:
        read(spark, cluster.bootstrap, **from_zero).collect()
    assert "DataLossError" in str(caught.value) and "failOnDataLoss=false" in str(caught.value)
    rest = read(spark, cluster.bootstrap, **from_zero, failOnDataLoss="false")
    offsets = sorted(r.offset for r in rest.select("offset").collect())
    # DESCRIBE's start and end are those of the replica that answered, and each replica deletes
    # at its own pace: what remains is everything published from the first offset read on.
    assert offsets and offsets[0] > 0
    assert offsets == sorted(o for _, o in published if o >= offsets[0])

    # The same, found by a task mid-read (retention ran after the plan was made).
    tp = TopicPartition("kept", 0)
    options = parse_options({"bootstrap": cluster.bootstrap, "subscribe": "kept"})
    settings = ReadSettings.of(options)
    with pytest.raises(DataLossError, match="partition kept/0: offsets 0 to"):
        list(fetch_range(OffsetRange(tp, 0, end), settings))
    lenient = ReadSettings(**{**settings.__dict__, "fail_on_data_loss": False})
    chunks = list(fetch_range(OffsetRange(tp, 0, end), lenient))
    assert chunks and chunks[0][1] >= start
    assert "retention deleted them" in caplog.text


def test_workers_run_an_interpreter_that_imports_the_package(spark: SparkSession) -> None:
    assert worker_python(spark) == sys.executable
    register(spark)  # checks the workers' interpreter, then registers again: harmless
    context: Any = spark.sparkContext
    system_python = shutil.which("python3", path="/usr/bin:/bin")
    for wrong in ["/nonexistent/python3", *([system_python] if system_python else [])]:
        context.pythonExec = wrong
        try:
            with pytest.raises(WorkerPythonError, match="set PYSPARK_PYTHON"):
                register(spark)
        finally:
            context.pythonExec = sys.executable


def test_a_partition_alone_is_enough_to_read_it(cluster: LocalCluster, readings: Published) -> None:
    # Spark hands each task a pickled input partition and a reader rebuilt from a pickle in
    # another process: nothing the driver's reader learnt may be needed. Read every planned
    # partition in a fresh interpreter that gets only the pickles.
    options = parse_options({"bootstrap": cluster.bootstrap, "subscribe": "readings"})
    planned = KafkaesqueBatchReader(options).partitions()
    script = (
        "import pickle, sys\n"
        "from kafkaesque.spark_source._read import read_partition\n"
        "parts = pickle.load(sys.stdin.buffer)\n"
        "print(sum(b.num_rows for p in parts for b in read_partition(p)))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script],
        input=pickle.dumps(planned),
        capture_output=True,
        check=True,
        timeout=120,
    )
    assert int(run.stdout) == len(readings)


def test_readers_travel_without_connections(cluster: LocalCluster) -> None:
    options = parse_options({"bootstrap": cluster.bootstrap, "subscribe": "readings"})
    reader = KafkaesqueStreamReader(options)
    offsets = reader.initialOffset()  # opens the reader's client
    copy = pickle.loads(pickle.dumps(reader))
    assert copy.options == options and copy._client is None
    assert copy.initialOffset() == offsets
    copy.stop()
    reader.stop()
