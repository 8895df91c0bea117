"""Spark benchmark: rows/s reading a topic with the ``kafkaesque`` source, beside Spark reading the
same records from a local JSON-lines file and from a local Parquet file, all in the same run.

    python -m bench.spark [--quick] [--records N] [--rounds N]

* The topic: 6 partitions, replication factor 3, on a local cluster of 3 broker processes;
  2,000,000 records of a 100-byte value and a 12-byte key (``--quick``: 600,000), loaded with
  the client library's ``Producer``.
* The baselines: the same records read back from the topic (by the client's ``fetch_batch``,
  the call the source's fetch loop makes, and the source's decoder, without Spark) and written
  as one Parquet file (the source's own schema) and one JSON-lines file (key and value as
  text), in the same run's scratch directory.
* A read is a full scan of every column into Spark rows (``write.format("noop")``): ``count()``
  would let Parquet answer from its footer without reading anything. Rounds alternate between
  the three sources and the best of each is kept (the machine is shared; the best is the least
  disturbed), after one unmeasured scan of each (the JVM compiles its hot paths on the first
  scans). Spark runs ``local[2]`` (this machine has 2 cores, shared with the brokers).
* Also printed, not in the RESULT line: the tuple path (``useArrow=false``) through Spark, one
  round (not with ``--quick``); and the two decoders alone (one core, no Spark, payloads fetched
  beforehand), where the Arrow path's gain shows undiluted by Spark's own per-row costs.

Ends with ``RESULT rows_per_s=… json_rows_per_s=… parquet_rows_per_s=… ratio_vs_json=…
ratio_vs_parquet=…``. Targets: ratio_vs_json >= 1.5; the moonshot ratio_vs_parquet >= 0.5.
Every process and the scratch directory are gone when it ends, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa  # type: ignore[import-untyped]
from kafkaesque.spark_source import local_session, stop_session
from pyspark.sql import DataFrame, SparkSession

from kafkaesque.client import Client
from kafkaesque.local_cluster import LocalCluster

from ._spark_data import JSON_SCHEMA, Fetched, fetch_topic, load_topic, write_baselines

TOPIC = "bench"
PARTITIONS = 6
FULL_RECORDS = 2_000_000
QUICK_RECORDS = 600_000
TARGET_VS_JSON = 1.5
MB = 1_000_000
MOONSHOT_VS_PARQUET = 0.5


@dataclass
class Source:
    """One way of reading the records, and the seconds each full scan took."""

    name: str
    frame: Callable[[], DataFrame]
    times: list[float]

    def best_rate(self, rows: int) -> float:
        return rows / min(self.times)


def decoder_alone(fetched: Fetched) -> tuple[float, float]:
    """Rows/s of the two decoders over one partition's payloads, fetched beforehand: what the
    fast path gains where Spark's own per-row costs do not dilute it. Best of three each."""
    rates = []
    for decode in (
        lambda: sum(b.num_rows for b in fetched.arrow(TOPIC)),
        lambda: fetched.tuples(TOPIC),
    ):
        best = float("inf")
        for _ in range(3):
            started = time.perf_counter()
            rows = decode()
            best = min(best, time.perf_counter() - started)
        rates.append(rows / best)
    return rates[0], rates[1]


def scan(df: DataFrame) -> float:
    """Seconds to read every row and column of ``df`` into Spark rows and drop them."""
    start = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="600,000 records, no Spark scan of the tuple path"
    )
    parser.add_argument("--records", type=int, help=f"records in the topic ({FULL_RECORDS:,})")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds per source (3)")
    args = parser.parse_args(argv)
    records = args.records or (QUICK_RECORDS if args.quick else FULL_RECORDS)
    scratch = tempfile.mkdtemp(prefix="kq-bench-spark-")
    try:
        with LocalCluster(f"{scratch}/cluster", 3) as cluster:
            started = time.perf_counter()
            with Client(cluster.bootstrap) as client:
                client.create_topic(TOPIC, PARTITIONS, 3)
            load_topic(cluster.bootstrap, TOPIC, records)
            load_s = time.perf_counter() - started
            print(f"loaded   {records:,} records into {TOPIC} ({PARTITIONS} partitions, RF 3) "
                  f"in {load_s:.1f} s ({records / load_s:,.0f}/s)", flush=True)  # fmt: skip
            spark = local_session(
                "bench-spark",
                master="local[2]",
                shuffle_partitions=2,
                conf={"spark.local.dir": f"{scratch}/spark"},
            )
            try:
                return _measure(spark, cluster.bootstrap, scratch, records, args.rounds, args.quick)
            finally:
                stop_session(spark)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _measure(
    spark: SparkSession, bootstrap: str, scratch: str, records: int, rounds: int, quick: bool
) -> int:
    def topic(use_arrow: bool = True) -> DataFrame:
        return (
            spark.read.format("kafkaesque")
            .option("bootstrap", bootstrap)
            .option("subscribe", TOPIC)
            .option("useArrow", str(use_arrow).lower())
            .load()
        )

    started = time.perf_counter()
    fetched = fetch_topic(bootstrap, TOPIC)
    table = pa.Table.from_batches([b for f in fetched for b in f.arrow(TOPIC)])
    counted = table.num_rows
    json_path, parquet_path = write_baselines(spark, table, scratch, PARTITIONS)
    del table
    print(f"baselines written from the topic in {time.perf_counter() - started:.1f} s: "
          f"{os.path.getsize(json_path) / MB:,.0f} MB of JSON lines, "
          f"{os.path.getsize(parquet_path) / MB:,.0f} MB of Parquet", flush=True)  # fmt: skip
    if counted != records:
        print(f"FAILED: the topic read back {counted:,} rows, {records:,} were published")
        return 1

    def in_splits(path: str, read: Callable[[], DataFrame]) -> Callable[[], DataFrame]:
        # One file each, read in as many splits as the topic has partitions, so every reader
        # has the same parallelism (Spark would read a small file in one task, on one core).
        def frame() -> DataFrame:
            split = os.path.getsize(path) // PARTITIONS + 1
            spark.conf.set("spark.sql.files.maxPartitionBytes", str(split))
            spark.conf.set("spark.sql.files.openCostInBytes", str(split // 4))
            return read()

        return frame

    sources = [
        Source("kafkaesque", topic, []),
        Source(
            "json-lines",
            in_splits(json_path, lambda: spark.read.schema(JSON_SCHEMA).json(json_path)),
            [],
        ),
        Source("parquet", in_splits(parquet_path, lambda: spark.read.parquet(parquet_path)), []),
    ]
    print("tasks per scan: " + ", ".join(
        f"{s.name} {s.frame().rdd.getNumPartitions()}" for s in sources), flush=True)  # fmt: skip
    for source in sources:  # warm-up (the JVM compiles on first scans), and a check: a value
        # Spark could not parse would be a null, and skipping it would flatter that reader
        nulls = source.frame().where("key is null or value is null or timestamp is null").count()
        if nulls:
            print(f"FAILED: {source.name} read {nulls:,} rows with nulls")
            return 1
    for i in range(rounds):
        for source in sources:
            source.times.append(scan(source.frame()))
        print(f"round {i + 1}: " + "  ".join(
            f"{s.name} {records / s.times[-1]:,.0f} rows/s" for s in sources
        ), flush=True)  # fmt: skip
    tuples = None if quick else records / scan(topic(use_arrow=False))
    alone_arrow, alone_tuples = decoder_alone(fetched[0])

    ours, json_rate, parquet_rate = (s.best_rate(records) for s in sources)
    print()
    print(f"{'source':<28} {'rows/s (best)':>14} {'vs json':>8} {'vs parquet':>10}")
    rows = [("kafkaesque (Arrow batches)", ours), ("kafkaesque (tuples, 1 run)", tuples)]
    for name, rate in [*rows, ("json-lines file", json_rate), ("parquet file", parquet_rate)]:
        if rate is None:
            continue
        print(f"{name:<28} {rate:>14,.0f} {rate / json_rate:>8.2f} {rate / parquet_rate:>10.2f}")
    print(
        f"decoders alone (one core, no Spark, payloads already fetched): Arrow batches "
        f"{alone_arrow:,.0f} rows/s, tuples {alone_tuples:,.0f} rows/s "
        f"({alone_arrow / alone_tuples:.1f}x)"
    )
    vs_json, vs_parquet = ours / json_rate, ours / parquet_rate
    met = "met" if vs_json >= TARGET_VS_JSON else "MISSED"
    moonshot = "met" if vs_parquet >= MOONSHOT_VS_PARQUET else "not met"
    print(
        f"target ratio_vs_json >= {TARGET_VS_JSON}: {met}; "
        f"moonshot ratio_vs_parquet >= {MOONSHOT_VS_PARQUET}: {moonshot}"
    )
    if records < FULL_RECORDS:
        # Each scan of a Python data source pays about 0.35 s of Spark's own fixed cost, a JSON
        # scan about 0.15 s: on a smaller topic that weighs on the ratio (docs/spark.md).
        print(
            f"(the targets are set for {FULL_RECORDS:,} records; on {records:,} Spark's fixed "
            "cost per scan of a Python data source, about 0.35 s, lowers the ratios)"
        )
    print(
        f"RESULT rows_per_s={ours:.0f} json_rows_per_s={json_rate:.0f} "
        f"parquet_rows_per_s={parquet_rate:.0f} ratio_vs_json={vs_json:.2f} "
        f"ratio_vs_parquet={vs_parquet:.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
