"""Apache Kafka beside us, in the same run, driven by the same programs (issue 35).

    python -m bench.kafka [--quick]

Starts Apache Kafka 4.3.1 itself (``bench._kafka_cluster``: KRaft, 3 servers on this machine,
each broker and controller, each JVM's heap capped at 1 GiB, data in a scratch directory,
stopped by PID) and Kafkaesque (``LocalCluster``, 3 brokers), each with topics of 3 partitions
and 3 replicas, ``min.insync.replicas=2`` on Kafka (ours: a Raft majority), and drives both
through the Kafka protocol with the same clients, ``acks=all``, 100-byte values:

* (a) ``kafka-producer-perf-test`` (Kafka's ``ProducerPerformance``, the Java producer: a fixed
  number of 100-byte records, batched, linger 5 ms, as fast as it goes) -> ``produce_vs_kafka``
  (ours / Kafka records per second). Target (issue 35): >= 0.5.
* (b) the paced librdkafka producer (idempotent, as Kafka 4's clients are by default, linger
  1 ms) with an end-to-end librdkafka consumer in a group (``bench._kafka_load``, as
  ``bench.kafka_clients`` runs it on ours) at 1,000 and 10,000 msg/s -> ``e2e_1k_p99_vs_kafka``,
  ``e2e_10k_p99_vs_kafka`` (ours / Kafka p99). Target: 1k <= 2.
* (c) durability for durability: Kafka acknowledges from the page cache by default, our brokers
  after an fsync on a quorum. A second Kafka cluster with ``log.flush.interval.messages=1``
  (each replica fsyncs every message) against our default -> ``e2e_1k_p99_vs_kafka_fsync``
  (target <= 1); and ours with ``--fsync interval`` (acknowledged before the fsync, synced
  within a second) against Kafka's default -> ``e2e_1k_p99_interval_vs_kafka``.
* (d) Spark: Spark's Kafka source reads the records of (a) from each cluster, and our Spark
  source reads them from ours (``bench._spark_kafka_read``; left out when the connector's jars
  are not fetched) -> ``spark_read_vs_kafka``, ``our_source_vs_spark_kafka_source``.

Kafka's start-up (formatting, JVMs, elections, topic creation, followers starting to fetch) stays
out of every figure: each phase starts once each partition of its topic has a leader, a full ISR
and has acknowledged a probe record with ``acks=all``, after a first group commit (``probe``;
ours get the same). Why the producer is idempotent: without it librdkafka keeps up to 1,000,000
Produce requests in flight on a connection, each holding what lingered 1 ms, and Kafka serves one
request of a connection at a time (it mutes the channel until an ``acks=all`` Produce is
answered, a replication round later): the requests queue behind each other and at 1,000 msg/s
Kafka acknowledged in 2.6-3.4 s p50 and still rising at the end of the window. Idempotent, at
most 5 are in flight and the records that wait share the next batch, as with Kafka's Java
client (about 60 ms p50 on the same loaded machine). Our Kafka front appends pipelined requests
as it reads them (issue 33), which is why only Kafka showed it. Ends with one line
``RESULT`` with every figure, raw ones beside the ratios, and ``lost=…`` (records the e2e
consumers did not get: any is a failure).
"""

from __future__ import annotations

import argparse
import re
import shutil
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kafkaesque.client import Client
from kafkaesque.local_cluster import LocalCluster

from ._broker_procs import make_scratch
from ._kafka_cluster import KafkaCluster
from ._kafka_dist import PRODUCER_PERF_TEST, run_kafka_tool
from ._spark_kafka_read import (
    our_source_read_seconds,
    spark_kafka_available,
    spark_kafka_read_seconds,
)
from .broker import BROKERS, FULL, PARTITIONS, QUICK, Durations, Phase, _stop, e2e_phase
from .kafka_clients import KAFKA_LOAD

PRODUCE_TARGET = 0.5
E2E_1K_TARGET = 2.0
E2E_FSYNC_TARGET = 1.0
RECORD_BYTES = 100
LINGERS = {1_000: 1.0, 10_000: 1.0}  # the paced producer's linger.ms (both sides alike)


@dataclass(frozen=True)
class Shape:
    """How much each phase does."""

    durations: Durations
    perf_records: int  # records kafka-producer-perf-test sends (and Spark reads)


QUICK_SHAPE = Shape(QUICK, 200_000)
FULL_SHAPE = Shape(FULL, 1_000_000)

PERF_LINE = re.compile(r"(\d+) records sent, ([\d.]+) records/sec .*?([\d.]+) ms 99th")


def probe(bootstrap: str, topics: list[str], partitions: int, timeout: float = 180.0) -> float:
    """Start-up kept out of the figures, on both sides alike; the seconds it took.

    First a group commit (Kafka creates its ``__consumer_offsets``, 50 partitions of 3 replicas,
    at the first FindCoordinator: left to the first e2e consumer, their followers starting to
    fetch stalled that phase's ``acks=all`` produces by up to ``replica.lag.time.max.ms``, 30 s,
    on a loaded machine). Then one record with ``acks=all`` into each partition of ``topics``
    (a new partition's ISR lists every replica before its followers fetch it). The e2e
    consumers count the probes as foreign records; the perf topic holds ``partitions`` records
    more than (a) wrote. ``RuntimeError`` if a step does not succeed within ``timeout``."""
    import confluent_kafka

    started = time.monotonic()
    deadline = started + timeout
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "bench-probe", "enable.auto.commit": False}
    )
    try:
        while True:
            try:
                consumer.commit(
                    offsets=[confluent_kafka.TopicPartition(topics[0], 0, 0)], asynchronous=False
                )
                break
            except confluent_kafka.KafkaException as error:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no group commit in {timeout:.0f} s: {error}") from error
                time.sleep(0.5)
    finally:
        consumer.close()
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    failed: list[str] = []

    def report(error: Any, message: Any) -> None:
        if error is not None:
            failed.append(f"{message.topic()}/{message.partition()}: {error}")

    for topic in topics:
        for partition in range(partitions):
            producer.produce(topic, b"probe", partition=partition, on_delivery=report)
    left = producer.flush(max(1.0, deadline - time.monotonic()))
    if left or failed:
        raise RuntimeError(f"probes not acknowledged in {timeout:.0f} s: {left} left, {failed}")
    return time.monotonic() - started


def perf_test(bootstrap: str, topic: str, records: int) -> dict[str, float]:
    """``kafka-producer-perf-test`` flat out: its final line's records/s and p99 (ms).
    ``RuntimeError`` with its output if it fails or prints no summary."""
    done = run_kafka_tool(
        PRODUCER_PERF_TEST,
        [
            "--topic", topic,
            "--num-records", str(records),
            "--record-size", str(RECORD_BYTES),
            "--throughput", "-1",
            "--producer-props", f"bootstrap.servers={bootstrap}", "acks=all",
            "linger.ms=5", f"batch.size={256 * 1024}",
        ],
        timeout=600,
    )  # fmt: skip
    found = PERF_LINE.findall(done.stdout)
    if done.returncode != 0 or not found:
        raise RuntimeError(
            f"kafka-producer-perf-test failed ({done.returncode}):\n"
            f"{done.stdout[-1500:]}\n{done.stderr[-1500:]}"
        )
    sent, rate, p99 = found[-1]
    if int(sent) != records:
        raise RuntimeError(f"kafka-producer-perf-test sent {sent} of {records} records")
    return {"msgs_per_s": float(rate), "p99_ms": float(p99)}


# -- (d) Spark: its own Kafka source against Kafka and against ours, and our source ---------------

SparkKafkaRead = Callable[[str, str, int], float]  # (bootstrap, topic, records) -> seconds
OurSourceRead = Callable[[str, str, int], float]  # (addresses, topic, records) -> seconds
SparkReaders = tuple[SparkKafkaRead, OurSourceRead]


def spark_readers() -> SparkReaders | None:
    """Spark's Kafka source (``spark_kafka_read_seconds``) and our Spark source
    (``our_source_read_seconds``) as ``ours_run`` and ``kafka_run`` call them on the records of
    (a), or None (saying why) when the connector's jars are not fetched: (d) is left out."""
    if not spark_kafka_available():
        print("(d) left out: Spark's Kafka connector is not fetched (bin/fetch-peers)")
        return None
    return spark_kafka_read_seconds, our_source_read_seconds


def spark_figures(ours: dict[str, Any], kafka: dict[str, Any]) -> list[str]:
    """The RESULT fields of (d) from the runs' ``spark`` entries (empty without them):
    ``spark_read_vs_kafka`` (Spark's Kafka source: ours / Kafka read rate) and
    ``our_source_vs_spark_kafka_source`` (on ours: our Spark source / Spark's Kafka source)."""
    if "spark" not in ours or "spark" not in kafka:
        return []
    kafka_s, ours_s = kafka["spark"]["kafka_source_s"], ours["spark"]["kafka_source_s"]
    source_s = ours["spark"]["our_source_s"]
    read_ratio, source_ratio = _ratio(kafka_s, ours_s), _ratio(ours_s, source_s)
    print(
        f"(d) Spark reads the {ours['spark']['records']:,} records of (a): Spark's Kafka source "
        f"from Kafka {kafka_s:.1f} s, from ours {ours_s:.1f} s: {read_ratio:.2f}; our Spark "
        f"source from ours {source_s:.1f} s: {source_ratio:.2f} against Spark's Kafka source"
    )
    return [
        f"kafka_spark_read_s={kafka_s:.2f}",
        f"ours_spark_read_s={ours_s:.2f}",
        f"ours_source_read_s={source_s:.2f}",
        f"spark_read_vs_kafka={read_ratio:.2f}",
        f"our_source_vs_spark_kafka_source={source_ratio:.2f}",
    ]


# -- the runs ------------------------------------------------------------------------------------


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator > 0 else float("nan")


def _verdict(ok: bool) -> str:
    return "target met" if ok else "TARGET MISSED"


def _e2e(phase: Phase, bootstrap: str, topic: str, rate: int) -> dict[str, Any]:
    return e2e_phase(
        phase,
        bootstrap,
        topic,
        rate,
        LINGERS[rate],
        kinds="kafka-",
        module=KAFKA_LOAD,
        publisher_options=("--idempotence",),
    )


def _print_e2e(who: str, rate: int, result: dict[str, Any], started: float) -> None:
    print(
        f"      {who} at {rate:,} msg/s: e2e p50 {result['p50_ms']:.2f} ms p99 "
        f"{result['p99_ms']:.2f} ms (acks p99 {result['publisher']['ack_p99_ms']:.2f} ms), "
        f"missing {result['missing']} [{time.monotonic() - started:.0f} s]"
    )


def ours_run(
    root: Path, shape: Shape, *, fsync: str | None, rates: tuple[int, ...], perf: bool,
    started: float, spark: SparkReaders | None = None,
) -> dict[str, Any]:  # fmt: skip
    """One of our clusters (``--fsync`` ``fsync`` if given): (a) if ``perf`` (then (d) with
    ``spark``), (b) at ``rates``; its figures."""
    extra = ["--fsync", fsync] if fsync else []
    name = f"ours-{fsync or 'default'}"
    with LocalCluster(str(root / name), BROKERS, extra_args=extra) as cluster:
        topics = ["perf", *(f"e2e-{rate}" for rate in rates)]
        with Client(cluster.bootstrap) as client:
            for topic in topics:
                client.create_topic(topic, PARTITIONS, BROKERS)
        probed = probe(cluster.kafka_bootstrap, topics, PARTITIONS)
        print(
            f"{name}: Kafkaesque, {BROKERS} brokers ready, probes acked in {probed:.1f} s "
            f"[{time.monotonic() - started:.0f} s]"
        )
        phase = Phase([cluster.procs[i].pid for i in range(cluster.n)], shape.durations, None)
        readers: dict[str, Callable[[int], float]] = {}
        if spark is not None:
            kafka_source, our_source = spark
            readers["kafka_source_s"] = lambda held: kafka_source(
                cluster.kafka_bootstrap, "perf", held
            )
            readers["our_source_s"] = lambda held: our_source(cluster.bootstrap, "perf", held)
        return _phases(name, phase, cluster.kafka_bootstrap, shape, rates, perf, readers, started)


def kafka_run(
    root: Path, shape: Shape, *, fsync: bool, rates: tuple[int, ...], perf: bool,
    started: float, spark: SparkReaders | None = None,
) -> dict[str, Any]:  # fmt: skip
    """One Kafka cluster (each message fsynced if ``fsync``): (a) if ``perf`` (then (d) with
    ``spark``), (b) at ``rates``; its figures."""
    name = "kafka-fsync" if fsync else "kafka-default"
    with KafkaCluster(root / name, BROKERS, fsync_every_message=fsync) as kafka:
        topics = ["perf", *(f"e2e-{rate}" for rate in rates)]
        for topic in topics:
            kafka.create_topic(topic, PARTITIONS)
        probed = probe(kafka.bootstrap, topics, PARTITIONS)
        print(
            f"{name}: Apache Kafka 4.3.1, {BROKERS} KRaft servers ready, min.insync.replicas=2"
            f"{', log.flush.interval.messages=1' if fsync else ''}, probes acked in "
            f"{probed:.1f} s [{time.monotonic() - started:.0f} s]"
        )
        phase = Phase(kafka.pids, shape.durations, None)
        readers: dict[str, Callable[[int], float]] = {}
        if spark is not None:
            kafka_source, _ = spark
            readers["kafka_source_s"] = lambda held: kafka_source(kafka.bootstrap, "perf", held)
        return _phases(name, phase, kafka.bootstrap, shape, rates, perf, readers, started)


def _phases(
    name: str, phase: Phase, bootstrap: str, shape: Shape, rates: tuple[int, ...], perf: bool,
    readers: dict[str, Callable[[int], float]], started: float,
) -> dict[str, Any]:  # fmt: skip
    """A ready cluster's phases, the same on both sides: (a) kafka-producer-perf-test through
    ``bootstrap`` if ``perf``, then (d) each of ``readers`` (a figure's name -> a read of that
    many records of the perf topic, in seconds), then (b) at ``rates``; its figures."""
    out: dict[str, Any] = {"e2e": {}}
    if perf:
        out["perf"] = perf_test(bootstrap, "perf", shape.perf_records)
        print(f"      {name} perf-test: {out['perf']['msgs_per_s']:,.0f} msg/s")
        if readers:
            held = shape.perf_records + PARTITIONS  # (and a probe record a partition)
            out["spark"] = {"records": held, **{k: read(held) for k, read in readers.items()}}
    for rate in rates:
        out["e2e"][rate] = _e2e(phase, bootstrap, f"e2e-{rate}", rate)
        _print_e2e(name, rate, out["e2e"][rate], started)
    return out


def run(root: Path, shape: Shape) -> int:
    """Every phase, each cluster in turn (one cluster at a time on the shared cores). Returns 1
    if an e2e consumer missed a record."""
    started = time.monotonic()
    both = (1_000, 10_000)
    spark = spark_readers()
    ours = ours_run(root, shape, fsync=None, rates=both, perf=True, started=started, spark=spark)
    interval = ours_run(root, shape, fsync="interval", rates=(1_000,), perf=False, started=started)
    kafka = kafka_run(root, shape, fsync=False, rates=both, perf=True, started=started, spark=spark)
    kafka_fsync = kafka_run(root, shape, fsync=True, rates=(1_000,), perf=False, started=started)

    produce = _ratio(ours["perf"]["msgs_per_s"], kafka["perf"]["msgs_per_s"])
    print(
        f"(a) kafka-producer-perf-test, {shape.perf_records:,} records of {RECORD_BYTES} bytes: "
        f"ours {ours['perf']['msgs_per_s']:,.0f} msg/s, Kafka {kafka['perf']['msgs_per_s']:,.0f}"
        f" msg/s: {produce:.2f} ({_verdict(produce >= PRODUCE_TARGET)}: >= {PRODUCE_TARGET})"
    )
    fields = [
        f"ours_produce_msgs_per_s={ours['perf']['msgs_per_s']:.0f}",
        f"kafka_produce_msgs_per_s={kafka['perf']['msgs_per_s']:.0f}",
        f"produce_vs_kafka={produce:.2f}",
    ]
    for rate in both:
        k = f"{rate // 1000}k"
        mine, theirs = ours["e2e"][rate], kafka["e2e"][rate]
        ratio = _ratio(mine["p99_ms"], theirs["p99_ms"])
        target = (
            f" ({_verdict(ratio <= E2E_1K_TARGET)}: <= {E2E_1K_TARGET})" if rate == 1000 else ""
        )
        print(
            f"(b) e2e at {rate:,} msg/s: ours p99 {mine['p99_ms']:.2f} ms, Kafka p99 "
            f"{theirs['p99_ms']:.2f} ms: {ratio:.2f}{target}"
        )
        fields += [
            f"ours_e2e_{k}_p50_ms={mine['p50_ms']:.2f}",
            f"ours_e2e_{k}_p99_ms={mine['p99_ms']:.2f}",
            f"kafka_e2e_{k}_p50_ms={theirs['p50_ms']:.2f}",
            f"kafka_e2e_{k}_p99_ms={theirs['p99_ms']:.2f}",
            f"e2e_{k}_p99_vs_kafka={ratio:.2f}",
        ]
    fsync_ratio = _ratio(ours["e2e"][1000]["p99_ms"], kafka_fsync["e2e"][1000]["p99_ms"])
    interval_ratio = _ratio(interval["e2e"][1000]["p99_ms"], kafka["e2e"][1000]["p99_ms"])
    print(
        f"(c) at 1,000 msg/s: ours (fsync before the ack) p99 {ours['e2e'][1000]['p99_ms']:.2f}"
        f" ms, Kafka fsyncing every message p99 {kafka_fsync['e2e'][1000]['p99_ms']:.2f} ms: "
        f"{fsync_ratio:.2f} ({_verdict(fsync_ratio <= E2E_FSYNC_TARGET)}: <= "
        f"{E2E_FSYNC_TARGET}); ours --fsync interval p99 "
        f"{interval['e2e'][1000]['p99_ms']:.2f} ms, Kafka's default p99 "
        f"{kafka['e2e'][1000]['p99_ms']:.2f} ms: {interval_ratio:.2f}"
    )
    fields += [
        f"kafka_fsync_e2e_1k_p50_ms={kafka_fsync['e2e'][1000]['p50_ms']:.2f}",
        f"kafka_fsync_e2e_1k_p99_ms={kafka_fsync['e2e'][1000]['p99_ms']:.2f}",
        f"e2e_1k_p99_vs_kafka_fsync={fsync_ratio:.2f}",
        f"ours_interval_e2e_1k_p50_ms={interval['e2e'][1000]['p50_ms']:.2f}",
        f"ours_interval_e2e_1k_p99_ms={interval['e2e'][1000]['p99_ms']:.2f}",
        f"e2e_1k_p99_interval_vs_kafka={interval_ratio:.2f}",
    ]
    fields += spark_figures(ours, kafka)
    runs = [ours, interval, kafka, kafka_fsync]
    lost = sum(result["missing"] for r in runs for result in r["e2e"].values())
    fields.append(f"lost={lost}")
    print("RESULT " + " ".join(fields))
    return 1 if lost else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.kafka",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--quick", action="store_true", help="a shorter run (a few minutes on a quiet machine)"
    )
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGHUP, _stop)
    root = make_scratch()
    try:
        return run(root, QUICK_SHAPE if args.quick else FULL_SHAPE)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
