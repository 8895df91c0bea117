"""The Kafka front's cost: librdkafka against our own client library, on the same cluster, in
the same run (issue 33).

    python -m bench.kafka_clients [--quick] [--trace [--full]] [--profile DIR]

3 brokers on loopback (``LocalCluster``), replication factor 3, a Raft majority on disk before
every acknowledgement (acks=all on the Kafka side), 3 partitions a topic, 100-byte values, each
load generator its own process (``bench._broker_load``'s kinds). The Kafka front is an adapter
over the same write and read paths as our protocol, so its figures should stay close to ours:

* (a) produce throughput, flat out: librdkafka (confluent-kafka; batch 256 KiB, linger 5 ms,
  acks=all) against our batching ``Producer`` (the same batch size and linger), records
  acknowledged per second after a warm-up. Target: ``kafka_produce_vs_native >= 0.8``.
* (b) end to end at 1,000 and 10,000 msg/s: a paced librdkafka producer (linger 0 ms at 1k,
  1 ms at 10k, as ours) and a librdkafka consumer in a consumer group (subscribe: our Kafka
  group coordinator) against our paced ``Producer`` and ``GroupConsumer``; each message's time
  from when it was due to when the consumer had it, p50 and p99 (the first half second left
  out). Targets: ``kafka_e2e_1k_p99_vs_native <= 1.25`` and ``kafka_e2e_10k_p99_vs_native <=
  1.25``.

Each figure is printed with the CPU the brokers and the load used; each (b) also with the
producer's acknowledgement latency (due time to delivery report, p50/p99) beside its end to end
latency, since a record a consumer reads before its producer hears "yes" points at the answer
path rather than at the commit. ``--trace`` runs (b) only (the quick durations unless
``--full``); ``--profile DIR`` records the brokers with py-spy during each phase and prints
their hottest functions (``bench.broker``'s). Ends with ``RESULT
kafka_produce_msgs_per_s=… native_produce_msgs_per_s=… kafka_produce_vs_native=…
kafka_e2e_1k_p50_ms=… kafka_e2e_1k_p99_ms=… native_e2e_1k_p50_ms=… native_e2e_1k_p99_ms=…
kafka_e2e_1k_p99_vs_native=…`` and the same for ``10k``, then ``lost=…`` (records the consumers
did not get, over every e2e phase; any is a failure).
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

from kafkaesque.client import Client
from kafkaesque.local_cluster import LocalCluster

from ._broker_procs import make_scratch
from .broker import (
    BROKERS,
    E2E_RUNS,
    FULL,
    PARTITIONS,
    PRODUCER_BATCH_BYTES,
    PRODUCER_BUFFER_BYTES,
    PRODUCER_LINGER_MS,
    QUICK,
    Durations,
    Phase,
    _stop,
    e2e_phase,
    flat_out_phase,
    producer_phase,
)

KAFKA_LOAD = "bench._kafka_load"
PRODUCE_TARGET = 0.8
E2E_TARGET = 1.25


def kafka_producer_phase(phase: Phase, bootstrap: str, topic: str) -> dict[str, Any]:
    return flat_out_phase(
        phase,
        "kafka-producer",
        phase.durations.producer,
        bootstrap,
        topic,
        f"--batch-size={PRODUCER_BATCH_BYTES}",
        f"--linger-ms={PRODUCER_LINGER_MS}",
        f"--buffer-bytes={PRODUCER_BUFFER_BYTES}",
        module=KAFKA_LOAD,
    )


def _ratio(ours: float, theirs: float) -> float:
    return ours / theirs if theirs > 0 else float("nan")


def _verdict(ok: bool) -> str:
    return "target met" if ok else "TARGET MISSED"


def _acks(result: dict[str, Any]) -> str:
    """The publisher's acknowledgement latency beside the consumer's end to end latency."""
    published = result["publisher"]
    return (
        f"acks p50 {published['ack_p50_ms']:.2f} ms p99 {published['ack_p99_ms']:.2f} ms, "
        f"e2e p50 {result['p50_ms']:.2f} ms p99 {result['p99_ms']:.2f} ms"
    )


def run(root: Path, durations: Durations, *, trace: bool, profile_dir: Path | None) -> int:
    """The phases on one cluster; with ``trace`` (b) only. Returns 1 if a record was lost."""
    started = time.monotonic()
    with LocalCluster(str(root / "cluster"), BROKERS) as cluster:
        rates = [rate for rate, _ in E2E_RUNS]
        topics = [] if trace else ["native-producer", "kafka-producer"]
        topics += [f"{side}-e2e-{rate}" for rate in rates for side in ("native", "kafka")]
        with Client(cluster.bootstrap) as client:
            for topic in topics:
                client.create_topic(topic, PARTITIONS, BROKERS)
        print(
            f"cluster: {BROKERS} brokers, replication factor {BROKERS}, a Raft majority on disk "
            f"before each ack (acks=all), {PARTITIONS} partitions a topic, 100-byte values "
            f"[{time.monotonic() - started:.0f} s]"
        )
        phase = Phase([cluster.procs[i].pid for i in range(cluster.n)], durations, profile_dir)
        fields: list[str] = []
        if not trace:
            native = producer_phase(phase, cluster.bootstrap, "native-producer")
            kafka = kafka_producer_phase(phase, cluster.kafka_bootstrap, "kafka-producer")
            produce_ratio = _ratio(kafka["msgs_per_s"], native["msgs_per_s"])
            print(
                f"(a) produce, flat out (batch {PRODUCER_BATCH_BYTES // 1024} KiB, linger "
                f"{PRODUCER_LINGER_MS:g} ms): librdkafka {kafka['msgs_per_s']:,.0f} msg/s, our "
                f"Producer {native['msgs_per_s']:,.0f} msg/s: {produce_ratio:.2f} "
                f"({_verdict(produce_ratio >= PRODUCE_TARGET)}: >= {PRODUCE_TARGET})"
            )
            print(f"      librdkafka {kafka['cpu']}\n      ours {native['cpu']}")
            fields += [
                f"kafka_produce_msgs_per_s={kafka['msgs_per_s']:.0f}",
                f"native_produce_msgs_per_s={native['msgs_per_s']:.0f}",
                f"kafka_produce_vs_native={produce_ratio:.2f}",
            ]
        e2e: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}
        for rate, linger in E2E_RUNS:
            ours = e2e_phase(phase, cluster.bootstrap, f"native-e2e-{rate}", rate, linger)
            theirs = e2e_phase(
                phase,
                cluster.kafka_bootstrap,
                f"kafka-e2e-{rate}",
                rate,
                linger,
                kinds="kafka-",
                module=KAFKA_LOAD,
            )
            e2e[rate] = (theirs, ours)
            ratio = _ratio(theirs["p99_ms"], ours["p99_ms"])
            print(
                f"(b) end to end at {rate:,} msg/s (linger {linger:g} ms): librdkafka p50 "
                f"{theirs['p50_ms']:.2f} ms p99 {theirs['p99_ms']:.2f} ms, ours p50 "
                f"{ours['p50_ms']:.2f} ms p99 {ours['p99_ms']:.2f} ms: p99 ratio {ratio:.2f} "
                f"({_verdict(ratio <= E2E_TARGET)}: <= {E2E_TARGET}) "
                f"[{time.monotonic() - started:.0f} s]"
            )
            print(f"      librdkafka {_acks(theirs)}\n      ours       {_acks(ours)}")
            print(f"      librdkafka {theirs['cpu']}\n      ours {ours['cpu']}")
    lost = sum(side["missing"] for pair in e2e.values() for side in pair)
    for rate, (theirs, ours) in e2e.items():
        k = f"{rate // 1000}k"
        fields += [
            f"kafka_e2e_{k}_p50_ms={theirs['p50_ms']:.2f}",
            f"kafka_e2e_{k}_p99_ms={theirs['p99_ms']:.2f}",
            f"native_e2e_{k}_p50_ms={ours['p50_ms']:.2f}",
            f"native_e2e_{k}_p99_ms={ours['p99_ms']:.2f}",
            f"kafka_e2e_{k}_p99_vs_native={_ratio(theirs['p99_ms'], ours['p99_ms']):.2f}",
        ]
        if trace:
            fields += [
                f"kafka_ack_{k}_p50_ms={theirs['publisher']['ack_p50_ms']:.2f}",
                f"kafka_ack_{k}_p99_ms={theirs['publisher']['ack_p99_ms']:.2f}",
                f"native_ack_{k}_p50_ms={ours['publisher']['ack_p50_ms']:.2f}",
                f"native_ack_{k}_p99_ms={ours['publisher']['ack_p99_ms']:.2f}",
            ]
    fields.append(f"lost={lost}")
    print("RESULT " + " ".join(fields))
    return 1 if lost else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.kafka_clients",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--quick", action="store_true", help="a shorter run (about 60 s on a quiet machine)"
    )
    parser.add_argument(
        "--trace",
        action="store_true",
        help="(b) only, each producer's ack latency beside its end to end latency "
        "(the quick durations unless --full)",
    )
    parser.add_argument("--full", action="store_true", help="with --trace: the full durations")
    parser.add_argument("--profile", type=Path, metavar="DIR", help="py-spy the brokers")
    args = parser.parse_args(argv)
    if args.full and not args.trace:
        parser.error("--full goes with --trace (without it, leave out --quick)")
    quick = args.quick or (args.trace and not args.full)
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGHUP, _stop)
    root = make_scratch()
    try:
        return run(root, QUICK if quick else FULL, trace=args.trace, profile_dir=args.profile)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
