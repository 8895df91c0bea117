"""Ready-made Spark transforms for the MQTT readings topic: per-device counts, loss, latency.

A reading is what a device published over MQTT (see docs/mqtt.md and ``kafkaesque devices``): a
JSON object ``{"device": "phone-00017", "serial": 42, "ts_ms": 1763795000123, ...}``, with
``serial`` counting up from the device's first reading and ``ts_ms`` the device's clock (ms since
the epoch) when it sent it. The record's key is the device id (the MQTT mapping's key), used when
the JSON has no ``device``. ``examples/device_report.py`` and ``kafkaesque demo`` use these.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

__all__ = ["device_report", "readings"]


def readings(
    spark: SparkSession,
    bootstrap: str,
    topic: str = "readings",
    starting: str = "earliest",
    options: Mapping[str, str] | None = None,
) -> DataFrame:
    """The topic's readings: ``device``, ``serial``, ``sent_ms`` (device clock), ``logged_ms``
    (record timestamp), ``partition``, ``offset``. Records that are not readings (no serial) are
    left out. ``options``: more source options (security: ``security.protocol``,
    ``sasl.username``... see docs/spark.md)."""
    raw = (
        spark.read.format("kafkaesque")
        .option("bootstrap", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", starting)
        .options(**dict(options or {}))
        .load()
    )
    value = F.col("value").cast("string")
    return raw.select(
        F.coalesce(F.get_json_object(value, "$.device"), F.col("key").cast("string")).alias(
            "device"
        ),
        F.get_json_object(value, "$.serial").cast("long").alias("serial"),
        F.get_json_object(value, "$.ts_ms").cast("long").alias("sent_ms"),
        F.unix_millis("timestamp").alias("logged_ms"),
        "partition",
        "offset",
    ).where(F.col("serial").isNotNull() & F.col("device").isNotNull())


LATENCY_DECIMALS = 2
"""Latency percentiles are rounded to hundredths of a millisecond: both timestamps are whole
milliseconds, so more digits would only show the interpolation's float noise
(``3.8200000000000003``)."""


def device_report(rows: DataFrame) -> DataFrame:
    """One row per device, sorted by device: ``messages``, ``duplicated``, ``lost``,
    ``first_serial``, ``last_serial``, ``latency_p50_ms``, ``latency_p99_ms`` (interpolated
    percentiles, rounded to ``LATENCY_DECIMALS``)."""
    latency = F.col("logged_ms") - F.col("sent_ms")
    per_device = rows.groupBy("device").agg(
        F.count(F.lit(1)).alias("messages"),
        F.count_distinct("serial").alias("distinct"),
        F.min("serial").alias("first_serial"),
        F.max("serial").alias("last_serial"),
        F.percentile(latency, F.array(F.lit(0.5), F.lit(0.99))).alias("latency"),
    )
    return per_device.select(
        "device",
        "messages",
        (F.col("messages") - F.col("distinct")).alias("duplicated"),
        (F.col("last_serial") - F.col("first_serial") + 1 - F.col("distinct")).alias("lost"),
        "first_serial",
        "last_serial",
        F.round(F.col("latency")[0], LATENCY_DECIMALS).alias("latency_p50_ms"),
        F.round(F.col("latency")[1], LATENCY_DECIMALS).alias("latency_p99_ms"),
    ).orderBy("device")
