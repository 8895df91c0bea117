"""The Kafka-protocol load generators of ``bench.kafka_clients``, each run as its own process.

    python -m bench._kafka_load KIND [options]

librdkafka (confluent-kafka) against our brokers' Kafka listeners, measuring what
``bench._broker_load``'s ``producer``, ``publish`` and ``consume`` measure, with the same
100-byte values, stamps, pacing, warm-up and JSON events: ``kafka-producer`` (flat out),
``kafka-publish`` (at a fixed rate) and ``kafka-consume`` (in a consumer group).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import confluent_kafka

from ._broker_load import MESSAGE_BYTES, Pacer, Receipts, emit, stamped


def _producer(args: argparse.Namespace, **settings: Any) -> Any:
    return confluent_kafka.Producer(
        {"bootstrap.servers": args.bootstrap, "acks": "all", **settings}
    )


def run_kafka_producer(args: argparse.Namespace) -> None:
    """librdkafka flat out (acks=all, batches of ``--batch-size``, ``--linger-ms``): records
    acknowledged per second over the window after the warm-up."""
    producer = _producer(
        args,
        **{
            "linger.ms": args.linger_ms,
            "batch.size": args.batch_size,
            "queue.buffering.max.kbytes": args.buffer_bytes // 1024,
        },
    )
    value = bytes(i % 251 for i in range(MESSAGE_BYTES))
    counts = {"delivered": 0, "failed": 0}

    def report(error: Any, message: Any) -> None:
        counts["failed" if error is not None else "delivered"] += 1

    producer.list_topics(args.topic, timeout=30)
    emit("ready")
    produce, poll, topic = producer.produce, producer.poll, args.topic
    start = time.monotonic()
    measure_at, end_at = start + args.warmup, start + args.warmup + args.seconds
    first: tuple[float, int] | None = None
    sent = 0
    max_records = int(2_000_000 * (args.warmup + args.seconds))  # far above any real rate
    while sent < max_records:
        for _ in range(1000):
            try:
                produce(topic, value, on_delivery=report)
                sent += 1
            except BufferError:  # the queue is full: serve delivery reports, then go on
                poll(0.005)
        poll(0)
        now = time.monotonic()
        if first is None and now >= measure_at:
            first = (now, counts["delivered"])
            emit("measuring")
        if now >= end_at:
            break
    last = (time.monotonic(), counts["delivered"])
    producer.flush(60)
    if first is None:
        first = (start, 0)
    emit(
        "result",
        msgs_per_s=(last[1] - first[1]) / (last[0] - first[0]),
        window_s=last[0] - first[0],
        sent=sent,
        delivered=counts["delivered"],
        failed=counts["failed"],
    )


def run_kafka_publish(args: argparse.Namespace) -> None:
    """librdkafka at a fixed rate (acks=all, ``--linger-ms``, idempotent with
    ``--idempotence``), each value stamped."""
    producer = _producer(
        args, **{"linger.ms": args.linger_ms, "enable.idempotence": args.idempotence}
    )
    pacer = Pacer(args.rate, args.seconds, args.skip)
    counts = {"delivered": 0, "failed": 0}

    def send(due_ns: int, seq: int) -> None:
        def report(error: Any, message: Any) -> None:
            if error is None:
                counts["delivered"] += 1
                pacer.acked(due_ns, seq)
            else:
                counts["failed"] += 1

        producer.produce(args.topic, stamped(due_ns, seq), on_delivery=report)
        producer.poll(0)

    def wait(seconds: float) -> None:
        # poll serves delivery reports while it waits, but librdkafka counts its timeout in
        # whole milliseconds: a shorter wait is poll(0), and the pacer's loop spun on it (at
        # 1,000 msg/s, 80% of a core, taken from the brokers on a two-core machine).
        if seconds >= 0.001:
            producer.poll(seconds)
        else:
            producer.poll(0)
            time.sleep(seconds)

    producer.list_topics(args.topic, timeout=30)
    emit("ready")
    emit("measuring")
    pacer.run(send, wait)
    producer.flush(60)
    pacer.result(**counts)


def run_kafka_consume(args: argparse.Namespace) -> None:
    """A librdkafka consumer in a group (subscribe): each value's due-to-delivery latency."""
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": args.group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    receipts = Receipts(args.expect, args.skip)
    try:
        consumer.subscribe([args.topic])
        deadline = time.monotonic() + 60
        while not consumer.assignment() and time.monotonic() < deadline:
            consumer.poll(0.1)  # joins the group
        emit("ready")
        deadline = time.monotonic() + args.timeout
        while not receipts.complete and time.monotonic() < deadline:
            message = consumer.poll(args.poll_ms / 1000)
            if message is None or message.error() is not None:
                continue
            receipts.add(message.value() or b"", time.monotonic_ns())
    finally:
        consumer.close()
    receipts.result()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench._kafka_load", description=__doc__)
    kinds = parser.add_subparsers(dest="kind", required=True)
    p = kinds.add_parser("kafka-producer")
    p.add_argument("bootstrap", help="the Kafka listeners, host:port,...")
    p.add_argument("topic")
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--linger-ms", type=float, required=True)
    p.add_argument("--buffer-bytes", type=int, required=True)
    p.set_defaults(run=run_kafka_producer)
    p = kinds.add_parser("kafka-publish")
    p.add_argument("bootstrap", help="the Kafka listeners, host:port,...")
    p.add_argument("topic")
    p.add_argument("--rate", type=float, required=True)
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--skip", type=int, default=0, help="messages left out of the latencies")
    p.add_argument("--linger-ms", type=float, required=True)
    p.add_argument(
        "--idempotence",
        action="store_true",
        help="an idempotent producer (Kafka 4 clients' default): librdkafka then keeps at most "
        "5 requests in flight per connection instead of 1,000,000",
    )
    p.set_defaults(run=run_kafka_publish)
    p = kinds.add_parser("kafka-consume")
    p.add_argument("bootstrap", help="the Kafka listeners, host:port,...")
    p.add_argument("topic")
    p.add_argument("group")
    p.add_argument("--expect", type=int, required=True)
    p.add_argument("--skip", type=int, default=0, help="messages left out of the latencies")
    p.add_argument("--timeout", type=float, required=True)
    p.add_argument("--poll-ms", type=int, default=500, help="the longest wait of one poll")
    p.set_defaults(run=run_kafka_consume)
    args = parser.parse_args(argv)
    args.run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
