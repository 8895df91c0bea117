"""Per-device report of the MQTT readings topic, with Spark: messages, loss, latency percentiles.

    python examples/device_report.py --bootstrap 127.0.0.1:9092    # a running cluster
    python examples/device_report.py --demo                         # a demo cluster of its own
    spark-submit --master spark://host:7077 examples/device_report.py --bootstrap broker:9092

A reading is what a device published over MQTT: a JSON object ``{"device": "phone-00017",
"serial": 42, "ts_ms": 1763795000123, ...}``, with ``serial`` counting up from the device's
first reading and ``ts_ms`` the device's clock (ms since the epoch) when it sent it. The record's
key is the device id (the MQTT mapping's key), used when the JSON has no ``device``. The
transforms live in ``kafkaesque.spark_source.device_report``. For each device:

* ``messages``: readings in the topic; ``duplicated``: readings beyond the first of a serial;
* ``lost``: serials missing between the first and last seen (the seed's loss by serial gap);
* ``latency_p50_ms`` / ``latency_p99_ms``: the record's timestamp (when the log took it) minus
  the reading's ``ts``.

Runs on an embedded ``local[*]`` Spark by default (its Python workers are this interpreter, which
has kafkaesque), or unchanged on a cluster under spark-submit: the executors then need kafkaesque
installed and network access to the brokers.

Most of a small run's time is Spark's own: starting the JVM, then, for the first query of the
session, starting the Python workers and compiling the plan; the last line (on stderr) says how
long each part took. docs/spark.md has measured figures.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from kafkaesque.spark_source import local_session, register, stop_session
from kafkaesque.spark_source.device_report import device_report, readings
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from kafkaesque.client import Client, Producer


def publish_demo_readings(bootstrap: str, topic: str, devices: int, per_device: int) -> int:
    """Publish serial-numbered readings for ``devices`` devices, every 7th serial of device 0
    and every 50th of the others left out (lost), with latencies of 5-45 ms. Returns how many
    readings were published."""
    published = 0
    now = int(time.time() * 1000)
    with Client(bootstrap) as client, Producer(client) as producer:
        for serial in range(per_device):
            for d in range(devices):
                if serial % (7 if d == 0 else 50) == 3:
                    continue
                device = f"phone-{d:03d}"
                sent = now + serial * 100
                value = f'{{"device":"{device}","serial":{serial},"ts_ms":{sent},"dbm":-{40 + d}}}'
                producer.send(
                    topic,
                    value.encode(),
                    device.encode(),
                    timestamp_ms=sent + 5 + (serial * 7 + d) % 41,
                )
                published += 1
        producer.flush()
    return published


@contextmanager
def demo_cluster(topic: str) -> Iterator[str]:
    """A local 3-broker cluster in a scratch directory with ``topic`` (6 partitions, RF 3);
    yields its bootstrap. Every broker and the directory are gone afterwards."""
    from kafkaesque.local_cluster import LocalCluster

    scratch = tempfile.mkdtemp(prefix="kq-example-")
    try:
        with LocalCluster(os.path.join(scratch, "cluster"), 3) as cluster:
            with Client(cluster.bootstrap) as client:
                client.create_topic(topic, 6, 3)
            yield cluster.bootstrap
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main(argv: Sequence[str] | None = None, spark: SparkSession | None = None) -> int:
    """Run the report; ``spark``: a session to use (and leave running) instead of starting one."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", help="the brokers, host:port,... (not with --demo)")
    parser.add_argument("--topic", default="readings", help="the readings topic (readings)")
    parser.add_argument("--master", default="local[*]", help="Spark master when run with python")
    parser.add_argument("--demo", action="store_true", help="run against a demo cluster")
    parser.add_argument("--devices", type=int, default=20, help="demo devices (20)")
    parser.add_argument("--readings", type=int, default=500, help="demo readings per device")
    args = parser.parse_args(argv)
    if args.demo == bool(args.bootstrap):
        parser.error("give either --bootstrap or --demo")
    own = spark is None
    started = time.monotonic()
    if spark is None:
        if "PYSPARK_GATEWAY_PORT" in os.environ:  # under spark-submit: its master and settings
            spark = SparkSession.builder.appName("device-report").getOrCreate()
            register(spark)
        else:
            spark = local_session("device-report", master=args.master)
    session_s = time.monotonic() - started if own else None
    try:
        if args.demo:
            with demo_cluster(args.topic) as bootstrap:
                sent = publish_demo_readings(bootstrap, args.topic, args.devices, args.readings)
                print(f"published {sent:,} demo readings to {args.topic}")
                return _report(spark, bootstrap, args.topic, session_s)
        return _report(spark, args.bootstrap, args.topic, session_s)
    finally:
        if own:
            stop_session(spark)


def _report(spark: SparkSession, bootstrap: str, topic: str, session_s: float | None) -> int:
    """Print the per-device table and the totals; then, on stderr, where the time went
    (``session_s``: how long starting Spark took, None when the session was given)."""
    started = time.monotonic()
    report = device_report(readings(spark, bootstrap, topic)).cache()
    report.show(n=1000, truncate=False)
    totals = report.agg(
        F.count(F.lit(1)).alias("devices"),
        F.sum("messages").alias("messages"),
        F.sum("lost").alias("lost"),
        F.sum("duplicated").alias("duplicated"),
    ).first()
    assert totals is not None
    print(
        f"{totals['devices']} devices, {totals['messages']} messages, "
        f"{totals['lost']} lost, {totals['duplicated']} duplicated"
    )
    report.unpersist()
    timing = f"report {time.monotonic() - started:.1f} s"
    if session_s is not None:
        timing = f"Spark session started in {session_s:.1f} s; {timing}"
    print(timing, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
