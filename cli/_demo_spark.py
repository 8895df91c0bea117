"""The demo's Spark job: the readings topic through ``spark_source``, on an embedded Spark.

Per device: messages, loss by serial-number gap, duplicates and latency percentiles
(``kafkaesque.spark_source.device_report``); the demo prints the first rows and the totals.
"""

from __future__ import annotations

from collections.abc import Mapping

from ._demo_pipeline import READINGS
from ._demo_report import SparkTotals


def spark_report(
    bootstrap: str, show: int = 5, options: Mapping[str, str] | None = None
) -> SparkTotals:
    """Run the per-device report on a ``local[2]`` Spark; print ``show`` rows; the totals.
    ``options``: more source options (its security)."""
    from kafkaesque.spark_source import local_session, stop_session
    from kafkaesque.spark_source.device_report import device_report, readings
    from pyspark.sql import functions as F

    spark = local_session("kafkaesque-demo", master="local[2]")
    try:
        rows = readings(spark, bootstrap, READINGS, options=options).cache()
        report = device_report(rows).cache()
        shown = report.select(
            "device",
            "messages",
            "duplicated",
            "lost",
            F.round("latency_p50_ms", 1).alias("latency_p50_ms"),
            F.round("latency_p99_ms", 1).alias("latency_p99_ms"),
        )
        shown.show(n=show, truncate=False)  # Spark prints to stdout
        totals = report.agg(
            F.count(F.lit(1)).alias("devices"),
            F.sum("messages").alias("messages"),
            F.sum("lost").alias("lost"),
            F.sum("duplicated").alias("duplicated"),
        ).first()
        latency = rows.select(
            F.percentile(F.col("logged_ms") - F.col("sent_ms"), F.array(F.lit(0.5), F.lit(0.99)))
        ).first()
        if totals is None or latency is None:
            raise ValueError("Spark returned no totals")
        p50, p99 = latency[0] or [float("nan"), float("nan")]
        return SparkTotals(
            devices=int(totals["devices"]),
            messages=int(totals["messages"] or 0),
            lost=int(totals["lost"] or 0),
            duplicated=int(totals["duplicated"] or 0),
            latency_p50_ms=float(p50),
            latency_p99_ms=float(p99),
        )
    finally:
        stop_session(spark)
