"""A producer stops waiting on a paused leader once another broker leads (issue 23, point 2).

A broker stopped with SIGSTOP keeps its connections open and answers nothing; the partition's
other replicas elect a new leader within about an election timeout. The producer's batch that
went to the paused leader would wait for its whole ``request_timeout_ms``; instead, after
``leader_check_ms`` the producer re-reads the metadata from another broker, sees the new leader,
gives up on the silent connection as if it were lost, and resends the batch (same producer id
and sequence) to the new leader, which appends it once.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import trio

from kafkaesque.client import (
    AsyncClient,
    AsyncRecordFuture,
    Client,
    Consumer,
    DeliveryHandle,
    Producer,
    ProducerConfig,
    RecordFuture,
    open_producer,
)
from kafkaesque.local_cluster import LocalCluster

PAUSE_S = 8.0
# The new leader is elected within one or two election timeouts (0.5-1 s) of the pause, and the
# producer notices it one leader_check_ms (1 s) after its batch went out, or a quarter of it
# later: about 2 s, plus what a loaded two-core machine adds. Far below the pause (8 s) and the
# request timeout (10 s), which is what the producer waited before.
ACK_WITHIN_S = 3.0
SEND_EVERY_S = 0.02


def test_an_idempotent_producer_moves_to_the_new_leader_of_a_paused_one(tmp_path: Path) -> None:
    with LocalCluster(str(tmp_path), 3) as cluster, Client(cluster.bootstrap) as client:
        client.create_topic("paused", 1, 3)
        acked_at: dict[bytes, float] = {}
        sent: list[tuple[bytes, float, RecordFuture]] = []

        def on_ack(value: bytes) -> Callable[[DeliveryHandle], None]:
            def done(handle: DeliveryHandle) -> None:
                if handle.exception() is None:
                    acked_at[value] = time.monotonic()

            return done

        # Default request_timeout_ms (10 s) and leader_check_ms (1 s); idempotent by default.
        config = ProducerConfig(linger_ms=1.0)
        assert config.idempotent and config.request_timeout_ms > PAUSE_S
        with Producer(client, config) as producer:

            def produce_until(end: float) -> None:
                while time.monotonic() < end:
                    value = b"v%d" % len(sent)
                    future = producer.send("paused", value)
                    future.handle.add_done_callback(on_ack(value))
                    sent.append((value, time.monotonic(), future))
                    producer.poll(SEND_EVERY_S)

            produce_until(time.monotonic() + 1.0)
            producer.flush()
            leader = client.refresh_metadata(["paused"]).leader("paused", 0)
            assert leader is not None
            victim = leader.broker_id
            paused_at = time.monotonic()
            cluster.pause(victim)
            try:
                produce_until(paused_at + PAUSE_S)
            finally:
                cluster.resume(victim)
            produce_until(time.monotonic() + 1.0)
            producer.flush(30.0)

        # The first record sent after the pause was acknowledged long before the pause ended
        # (records sent later wait behind it: one batch in flight per partition).
        after = [(value, at) for value, at, _ in sent if at > paused_at]
        assert after
        first_value, first_sent = after[0]
        assert first_value in acked_at, "the first record sent during the pause failed"
        waited = acked_at[first_value] - paused_at
        print(f"first ack after the pause: {waited:.2f} s (sent {first_sent - paused_at:.2f} s)")
        assert waited < ACK_WITHIN_S, waited
        failed = [(v, f.handle.exception()) for v, _, f in sent if f.handle.exception()]
        assert not failed, failed[:3]

        _check_log(client, {value: future.handle for value, _, future in sent})


def _check_log(client: Client, sent: dict[bytes, DeliveryHandle]) -> None:
    """Every record is in the log once, at the offset its acknowledgement named."""
    with Consumer(client) as consumer:
        consumer.assign_topic("paused")
        stored = {r.offset: r.value for r in consumer.records(follow=False)}
    counts = Counter(stored.values())
    assert not [v for v, n in counts.items() if n > 1], "a resent batch was stored twice"
    for value, handle in sent.items():
        offset = handle.result().offset
        assert stored.get(offset) == value, f"acknowledged {value!r} at {offset} lost"
    assert len(stored) == len(sent)


def test_the_trio_producer_moves_to_the_new_leader_of_a_paused_one(tmp_path: Path) -> None:
    """The same with ``open_producer``: its send tasks waiting on the silent broker end when
    the connection is given up on, and the sender resends their batches."""
    with LocalCluster(str(tmp_path), 3) as cluster, Client(cluster.bootstrap) as client:
        client.create_topic("paused", 1, 3)
        leader = client.refresh_metadata(["paused"]).leader("paused", 0)
        assert leader is not None
        victim = leader.broker_id
        sent: list[tuple[bytes, float, AsyncRecordFuture]] = []
        acked_at: dict[bytes, float] = {}

        def on_ack(value: bytes) -> Callable[[DeliveryHandle], None]:
            def done(handle: DeliveryHandle) -> None:
                if handle.exception() is None:
                    acked_at[value] = trio.current_time()

            return done

        async def produce() -> float:
            async with (
                AsyncClient(cluster.bootstrap) as own,
                open_producer(own, ProducerConfig(linger_ms=1.0)) as producer,
            ):

                async def produce_until(end: float) -> None:
                    while trio.current_time() < end:
                        value = b"v%d" % len(sent)
                        future = await producer.send("paused", value)
                        future.handle.add_done_callback(on_ack(value))
                        sent.append((value, trio.current_time(), future))
                        await trio.sleep(SEND_EVERY_S)

                await produce_until(trio.current_time() + 1.0)
                await producer.flush()
                paused_at = trio.current_time()
                cluster.pause(victim)
                try:
                    await produce_until(paused_at + PAUSE_S)
                finally:
                    cluster.resume(victim)
                await produce_until(trio.current_time() + 1.0)
                await producer.flush(30.0)
                return paused_at

        try:
            paused_at = trio.run(produce)
        finally:
            cluster.resume(victim)
        first_value = next(value for value, at, _ in sent if at > paused_at)
        assert first_value in acked_at, "the first record sent during the pause failed"
        waited = acked_at[first_value] - paused_at
        print(f"first ack after the pause (trio): {waited:.2f} s")
        assert waited < ACK_WITHIN_S, waited
        failed = [(v, f.handle.exception()) for v, _, f in sent if f.handle.exception()]
        assert not failed, failed[:3]
        _check_log(client, {value: future.handle for value, _, future in sent})
