"""``startingTimestamp`` and ``startingOffsetsByTimestamp``, with Spark's Kafka source semantics.

A query starts each partition at the earliest offset whose record timestamp is >= the time
(resolved through the client's ``offsets_for_times``); a partition with no such record fails the
query (``startingOffsetsByTimestampStrategy=error``, the default) or starts at its end
(``latest``). ``startingTimestamp`` takes precedence over ``startingOffsetsByTimestamp``, which
takes precedence over ``startingOffsets``. Options and resolution are checked pure first, then
batch reads through real Spark (local[2]) and a stream's first offsets against the cluster.
"""

from __future__ import annotations

import json

import pytest
from kafkaesque.spark_source import KafkaesqueStreamReader
from kafkaesque.spark_source._offsets import Bounds, resolve_times, times_for
from kafkaesque.spark_source._options import Mode, OptionError, parse_options
from pyspark.sql import SparkSession

from kafkaesque.client import Client, Producer, TopicPartition
from kafkaesque.local_cluster import LocalCluster

from .conftest import read

A0, A1 = TopicPartition("a", 0), TopicPartition("a", 1)
BASE = {"bootstrap": "127.0.0.1:9092", "subscribe": "a"}


# -- options and resolution (pure) ----------------------------------------------------------------


def test_precedence_and_defaults() -> None:
    both = parse_options(
        {**BASE, "startingTimestamp": "500", "startingOffsetsByTimestamp": '{"a": {"0": 7}}'}
    )
    assert both.starting_times == 500 and not both.latest_if_no_time_match
    by_partition = parse_options(
        {
            **BASE,
            "startingoffsetsbytimestamp": '{"a": {"0": 7, "1": 9}}',  # Spark lower-cases keys
            "startingOffsetsByTimestampStrategy": "LATEST",
        }
    )
    assert by_partition.starting_times == {A0: 7, A1: 9}
    assert by_partition.latest_if_no_time_match
    assert parse_options(BASE).starting_times is None


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"startingTimestamp": "yesterday"}, "startingTimestamp must be a timestamp"),
        ({"startingTimestamp": "-5"}, "startingTimestamp must be a timestamp"),
        ({"startingOffsetsByTimestamp": "{"}, "startingOffsetsByTimestamp must be JSON"),
        ({"startingOffsetsByTimestamp": '{"a": {"0": -1}}'}, "partition 0: -1"),
        ({"startingOffsetsByTimestamp": '{"a": {"x": 5}}'}, "partition 'x'"),
        ({"startingOffsetsByTimestamp": '{"b": {"0": 5}}'}, "names topic 'b'"),
        ({"startingOffsetsByTimestampStrategy": "skip"}, 'must be "error" or "latest"'),
        ({"endingTimestamp": "5"}, "'endingTimestamp' of Spark's Kafka source is not supported"),
    ],
)
def test_bad_time_options_are_refused_by_name(options: dict[str, str], message: str) -> None:
    with pytest.raises(OptionError, match=message):
        parse_options({**BASE, **options})


def test_assigned_partitions_each_need_a_timestamp() -> None:
    assign = {"bootstrap": "h:1", "assign": '{"a": [0, 1]}'}
    with pytest.raises(OptionError, match="must give a timestamp for every assigned partition"):
        parse_options({**assign, "startingOffsetsByTimestamp": '{"a": {"0": 5}}'})


def test_times_cover_exactly_the_partitions_read() -> None:
    bounds = {A0: Bounds(0, 10), A1: Bounds(0, 10)}
    assert times_for(42, bounds) == {A0: 42, A1: 42}
    assert times_for({A0: 1, A1: 2}, bounds) == {A0: 1, A1: 2}
    with pytest.raises(OptionError, match="missing: a/1"):
        times_for({A0: 1}, bounds)
    with pytest.raises(OptionError, match="not read or do not exist: a/2"):
        times_for({A0: 1, A1: 2, TopicPartition("a", 2): 3}, bounds)


def test_a_partition_without_a_matching_record_fails_or_starts_at_its_end() -> None:
    times = {A0: 100, A1: 100}
    bounds = {A0: Bounds(0, 10), A1: Bounds(2, 8)}
    found = {A0: 4, A1: 8}  # a/1: the end, so no record reached the time
    with pytest.raises(OptionError, match=r"a/1 has no record at or after timestamp 100"):
        resolve_times(100, times, found, bounds, latest_if_no_match=False)
    assert resolve_times(100, times, found, bounds, latest_if_no_match=True) == {A0: 4, A1: 8}
    # Records arrived after the lookup: its answer (the end then) is below the later end.
    later = {A0: Bounds(0, 10), A1: Bounds(2, 12)}
    assert resolve_times(100, times, found, later, latest_if_no_match=False) == {A0: 4, A1: 8}


# -- against the cluster ------------------------------------------------------------------------

# Per partition, the records' timestamps in offset order: not monotonic.
STAMPS = {0: [1_000, 3_000, 2_000, 5_000, 4_000], 1: [100, 200, 300]}


@pytest.fixture(scope="module")
def stamped(cluster: LocalCluster) -> dict[int, list[int]]:
    """Topic ``stamped`` (2 partitions): partition -> the offsets of its records, in order."""
    offsets: dict[int, list[int]] = {}
    with Client(cluster.bootstrap) as client:
        client.create_topic("stamped", 2, 3)
        with Producer(client) as producer:
            futures = {
                p: [
                    producer.send("stamped", b"%d-%d" % (p, i), partition=p, timestamp_ms=ts)
                    for i, ts in enumerate(stamps)
                ]
                for p, stamps in STAMPS.items()
            }
            producer.flush()
        for p, sent in futures.items():
            offsets[p] = [f.get().offset for f in sent]
    return offsets


def _values(spark: SparkSession, cluster: LocalCluster, **options: str) -> list[str]:
    df = read(spark, cluster.bootstrap, subscribe="stamped", **options)
    return sorted(bytes(r.value).decode() for r in df.select("value").collect())


def test_a_batch_query_starts_at_the_first_record_reaching_the_time(
    spark: SparkSession, cluster: LocalCluster, stamped: dict[int, list[int]]
) -> None:
    # 250 ms: partition 0 from its first record, partition 1 from the one stamped 300.
    assert _values(spark, cluster, startingTimestamp="250") == [
        "0-0", "0-1", "0-2", "0-3", "0-4", "1-2"
    ]  # fmt: skip
    by_partition = json.dumps({"stamped": {"0": 2_500, "1": 150}})
    # 2,500 ms: from the record stamped 3,000, the 2,000 after it included.
    assert _values(spark, cluster, startingOffsetsByTimestamp=by_partition) == [
        "0-1", "0-2", "0-3", "0-4", "1-1", "1-2"
    ]  # fmt: skip
    # startingTimestamp wins over both others, as in Spark's Kafka source.
    assert _values(
        spark,
        cluster,
        startingTimestamp="4500",
        startingOffsetsByTimestamp=by_partition,
        startingOffsets="earliest",
        startingOffsetsByTimestampStrategy="latest",
    ) == ["0-3", "0-4"]


def test_no_record_that_recent_fails_the_query_unless_the_strategy_is_latest(
    spark: SparkSession, cluster: LocalCluster, stamped: dict[int, list[int]]
) -> None:
    with pytest.raises(Exception, match="OptionError") as caught:
        _values(spark, cluster, startingTimestamp="4500")
    assert "partition stamped/1 has no record at or after timestamp 4500" in str(caught.value)
    assert (
        _values(
            spark, cluster, startingTimestamp="5001", startingOffsetsByTimestampStrategy="latest"
        )
        == []
    )


def test_a_stream_starts_at_the_offsets_for_the_times(
    cluster: LocalCluster, stamped: dict[int, list[int]]
) -> None:
    options = {
        "bootstrap": cluster.bootstrap,
        "subscribe": "stamped",
        "startingOffsetsByTimestamp": json.dumps({"stamped": {"0": 4_200, "1": 9_999}}),
        "startingOffsetsByTimestampStrategy": "latest",
    }
    reader = KafkaesqueStreamReader(parse_options(options, Mode.STREAMING))
    try:
        first = reader.initialOffset()
    finally:
        reader.stop()
    end_1 = stamped[1][-1] + 1
    assert first == {"stamped": {"0": stamped[0][3], "1": end_1}}
