"""The example job (examples/device_report.py) on the shared Spark session and real brokers.

Readings are published with known gaps, a duplicate and exact latencies (the producer sets each
record's timestamp), so the report's every figure is known in advance.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
from pyspark.sql import SparkSession

from kafkaesque.client import Client, Producer
from kafkaesque.local_cluster import LocalCluster

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "device_report.py"


@pytest.fixture(scope="module")
def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("device_report", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["device_report"] = module  # dataclasses and pickling look modules up by name
    spec.loader.exec_module(module)
    return module


def publish_readings(bootstrap: str, topic: str) -> None:
    """phone-a: serials 0-9 without 4 and 7, serial 2 twice, latency 10 ms + serial;
    phone-b: serials 5-8, latency 3, 8, 13 and 18 ms (their interpolated p99 is the float
    17.849999999999998), no ``device`` in the JSON (the key names it)."""
    base = 1_763_795_000_000
    with Client(bootstrap) as client, Producer(client) as producer:
        client.create_topic(topic, 3, 3)
        for serial in [0, 1, 2, 2, 3, 5, 6, 8, 9]:
            sent = base + serial * 1000
            value = {"device": "phone-a", "serial": serial, "ts_ms": sent}
            producer.send(
                topic, json.dumps(value).encode(), b"phone-a", timestamp_ms=sent + 10 + serial
            )
        for serial in range(5, 9):
            sent = base + serial * 1000
            value = {"serial": serial, "ts_ms": sent}
            latency = 3 + 5 * (serial - 5)
            producer.send(
                topic, json.dumps(value).encode(), b"phone-b", timestamp_ms=sent + latency
            )
        producer.send(topic, b"not a reading", b"phone-c")
        producer.flush()


def test_the_report_counts_loss_duplicates_and_latency(
    example: ModuleType, spark: SparkSession, cluster: LocalCluster
) -> None:
    publish_readings(cluster.bootstrap, "phones")
    report = example.device_report(example.readings(spark, cluster.bootstrap, "phones"))
    rows = [row.asDict() for row in report.collect()]
    # Percentiles are interpolated floats (18.919999999999998 on some Spark versions): the
    # report rounds them to hundredths, so they compare exactly.
    expected = [
        {
            "device": "phone-a",
            "messages": 9,
            "duplicated": 1,
            "lost": 2,
            "first_serial": 0,
            "last_serial": 9,
            "latency_p50_ms": 13.0,
            "latency_p99_ms": 18.92,
        },
        {
            "device": "phone-b",
            "messages": 4,
            "duplicated": 0,
            "lost": 0,
            "first_serial": 5,
            "last_serial": 8,
            "latency_p50_ms": 10.5,
            "latency_p99_ms": 17.85,
        },
    ]
    assert rows == expected


def test_the_demo_runs_end_to_end(
    example: ModuleType, spark: SparkSession, capsys: pytest.CaptureFixture[str]
) -> None:
    assert example.main(["--demo", "--devices", "3", "--readings", "60"], spark=spark) == 0
    out = capsys.readouterr().out
    # device 0 misses every 7th serial from 3 (9 of 60, 8 before its last), the others
    # every 50th from 3 (2 of 60)
    assert "published 167 demo readings" in out
    assert "3 devices, 167 messages, 12 lost, 0 duplicated" in out
