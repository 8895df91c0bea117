"""The Kafka-protocol load generators of ``bench.kafka_clients``: librdkafka (confluent-kafka)
against our brokers' Kafka listeners, the same measurements as ``bench._broker_load``'s
``producer``, ``publish`` and ``consume`` (and run by its ``main``, as kinds ``kafka-producer``,
``kafka-publish`` and ``kafka-consume``): the same 100-byte values, stamps, pacing, warm-up and
JSON events. ``confluent_kafka`` is imported only by these.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from ._broker_load import MESSAGE_BYTES, Pacer, Receipts, emit, stamped


def _producer(args: argparse.Namespace, **settings: Any) -> Any:
    import confluent_kafka

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
    """librdkafka at a fixed rate (acks=all, ``--linger-ms``), each value stamped."""
    producer = _producer(args, **{"linger.ms": args.linger_ms})
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
        producer.poll(seconds)  # serves delivery reports while it waits

    producer.list_topics(args.topic, timeout=30)
    emit("ready")
    emit("measuring")
    pacer.run(send, wait)
    producer.flush(60)
    pacer.result(**counts)


def run_kafka_consume(args: argparse.Namespace) -> None:
    """A librdkafka consumer in a group (subscribe): each value's due-to-delivery latency."""
    import confluent_kafka

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
