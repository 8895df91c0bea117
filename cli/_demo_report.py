"""What ``kafkaesque demo`` found: the log read back, a summary table, and a PNG plot.

The log is the witness: every reading in ``readings`` is read back from the first offset and
counted by (device, serial), so duplicates and latency (the record's timestamp, taken by the
broker that received the PUBLISH, minus the device's ``ts_ms``) come from what was stored, not
from what a client believes it sent.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from kafkaesque.client import Client, ClientConfig, Consumer

from ._demo_pipeline import READINGS, PipelineResult


@dataclass
class LogSummary:
    """The readings topic as read back after the run."""

    records: int = 0
    readings: Counter[tuple[str, int]] = field(default_factory=Counter)
    latencies_ms: list[float] = field(default_factory=list)
    per_second: dict[int, list[float]] = field(default_factory=lambda: defaultdict(list))

    @property
    def distinct(self) -> int:
        return len(self.readings)

    @property
    def duplicated(self) -> int:
        return sum(self.readings.values()) - len(self.readings)


def read_log(bootstrap: str, config: ClientConfig | None = None) -> LogSummary:
    """Read every record of ``readings`` from its first offset to its end."""
    summary = LogSummary()
    with Client(bootstrap, config=config or ClientConfig()) as client, Consumer(client) as consumer:
        consumer.assign_topic(READINGS)
        consumer.seek_to_beginning()
        for record in consumer.records(follow=False):
            summary.records += 1
            try:
                data = json.loads(record.value or b"")
                device, serial, sent_ms = str(data["device"]), int(data["serial"]), data["ts_ms"]
            except (ValueError, KeyError, TypeError):
                continue  # the failover probe's records, or anything else that is no reading
            summary.readings[(device, serial)] += 1
            latency = float(record.timestamp - int(sent_ms))
            summary.latencies_ms.append(latency)
            summary.per_second[int(sent_ms) // 1000].append(latency)
    return summary


def percentile(values: Iterable[float], q: float) -> float:
    """The ``q``-quantile (0..1) by the nearest-rank method; NaN for no values."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@dataclass(frozen=True)
class SparkTotals:
    devices: int
    messages: int
    lost: int
    duplicated: int
    latency_p50_ms: float
    latency_p99_ms: float


def summary_rows(
    result: PipelineResult, log: LogSummary, spark: SparkTotals | None
) -> list[tuple[str, str]]:
    """The summary table: (what, figure) pairs, in the order a reader asks for them."""
    devices = result.devices_report
    fault = result.fault

    def count(name: str) -> str:
        value = devices.get(name)
        return "?" if value is None else f"{int(value):,}"

    rows = [
        ("devices connected", count("connected")),
        ("readings sent", count("sent")),
        ("acknowledged (PUBACK after quorum commit)", count("acknowledged")),
        ("in the log (distinct device, serial)", f"{log.distinct:,}"),
        ("consumed by the controller (group)", f"{result.consumed:,}"),
        ("lost (acknowledged, not in the log)", count("lost")),
        # Beside the resends: "0 duplicated" says something only if readings were sent again.
        ("duplicated in the log", f"{log.duplicated:,} (of {count('resent')} readings resent)"),
        (
            "latency device -> log p50 / p99",
            f"{percentile(log.latencies_ms, 0.5):.0f} / "
            f"{percentile(log.latencies_ms, 0.99):.0f} ms",
        ),
        (
            "PUBACK latency p50 / p99",
            f"{_ms(devices.get('puback_p50_ms'))} / {_ms(devices.get('puback_p99_ms'))} ms",
        ),
        (
            f"fault: kill -9 broker {fault.broker} (leader of {READINGS}/{fault.partition})",
            f"failover gap {result.failover_gap_s:.2f} s",
        ),
        (
            "commands sent / delivered to phones",
            f"{result.commands_sent:,} / {count('commands_received')}",
        ),
    ]
    if spark is not None:
        rows.append(
            (
                "Spark: devices, messages, lost by serial gap, duplicated",
                f"{spark.devices:,}, {spark.messages:,}, {spark.lost:,}, {spark.duplicated:,}",
            )
        )
        rows.append(
            (
                "Spark: latency p50 / p99",
                f"{spark.latency_p50_ms:.0f} / {spark.latency_p99_ms:.0f} ms",
            )
        )
    return rows


def _ms(value: object) -> str:
    return "?" if not isinstance(value, int | float) else f"{value:.1f}"


def format_table(rows: list[tuple[str, str]]) -> str:
    width = max(len(name) for name, _ in rows)
    lines = [f"  {name:<{width}}  {value}" for name, value in rows]
    rule = "  " + "-" * (width + 2 + max(len(value) for _, value in rows))
    return "\n".join([rule, *lines, rule])


def plot(result: PipelineResult, log: LogSummary, path: str) -> None:
    """Throughput and latency per second of the run, with the fault's window shaded."""
    import matplotlib

    matplotlib.use("Agg")  # no display: a PNG file only
    import matplotlib.pyplot as plt

    seconds = sorted(log.per_second)
    if not seconds:
        raise ValueError("no readings to plot")
    start = result.started_at
    xs = [s - start for s in seconds]
    counts = [len(log.per_second[s]) for s in seconds]
    p50 = [percentile(log.per_second[s], 0.5) for s in seconds]
    p99 = [percentile(log.per_second[s], 0.99) for s in seconds]
    figure, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(10, 6))
    top.plot(xs, counts, color="tab:blue")
    top.set_ylabel("readings / s")
    top.set_title("kafkaesque demo: readings from devices into the log")
    bottom.plot(xs, p50, label="p50", color="tab:green")
    bottom.plot(xs, p99, label="p99", color="tab:orange")
    bottom.set_ylabel("device -> log latency (ms)")
    bottom.set_xlabel("seconds since start")
    bottom.set_yscale("symlog")
    fault = result.fault
    if not math.isnan(fault.killed_at):
        until = fault.restarted_at if not math.isnan(fault.restarted_at) else xs[-1] + start
        for axis in (top, bottom):
            axis.axvspan(fault.killed_at - start, until - start, color="tab:red", alpha=0.15)
            axis.axvline(fault.killed_at - start, color="tab:red")
        top.annotate(
            f"kill -9 broker {fault.broker}",
            (fault.killed_at - start, max(counts)),
            color="tab:red",
            xytext=(4, -12),
            textcoords="offset points",
        )
    bottom.legend(loc="upper right")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def failures(
    result: PipelineResult, log: LogSummary, spark: SparkTotals | None, devices: int
) -> list[str]:
    """What the run broke of the demo's promises, each a sentence (none: it kept them all).

    The demo's verdict: ``kafkaesque demo`` exits 1 on any of these, so its run (CI's main job
    is ``demo --quick``) is itself the end-to-end test. Every acknowledged reading is in the log
    once; every reading sent was acknowledged in the end (a device resends what was not); the
    controller's commands reach phones; Spark sees every device and no gap.
    """
    report = result.devices_report
    found: list[str] = []

    def count(name: str) -> int:
        value = report.get(name)
        if value is None:
            raise ValueError(f"the devices did not report {name!r}")
        return int(value)

    sent, lost = count("sent"), count("lost")
    if lost:
        found.append(f"{lost:,} acknowledged readings are not in the log")
    if count("acknowledged") != sent:
        found.append(
            f"{sent - count('acknowledged'):,} of {sent:,} readings were never acknowledged"
        )
    if log.distinct != sent:
        found.append(f"the log holds {log.distinct:,} distinct readings of the {sent:,} sent")
    if log.duplicated:
        found.append(f"{log.duplicated:,} readings are in the log more than once")
    if result.commands_sent and not count("commands_received"):
        found.append(f"none of the {result.commands_sent:,} commands reached a phone")
    if spark is not None and (spark.devices != devices or spark.lost):
        found.append(
            f"Spark saw {spark.devices:,} of {devices:,} devices and {spark.lost:,} readings "
            "missing by serial gap"
        )
    return found
