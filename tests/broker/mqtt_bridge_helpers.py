"""Helpers of the MQTT bridge tests: run a bridge in the test's nursery, publish with
``mosquitto_pub``, read a log topic back."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import trio

from kafkaesque.client import (
    AsyncClient,
    AsyncConsumer,
    ConsumerRecord,
    KafkaesqueError,
    OffsetReset,
)
from kafkaesque.mqtt_bridge import BridgeConfig, MqttBridge
from kafkaesque.protocol.mqtt import MqttClientOptions
from tests.mosquitto import Mosquitto


def mqtt_options(server: Mosquitto, client_id: str, **overrides: object) -> MqttClientOptions:
    return MqttClientOptions(server.host, server.port, client_id, **overrides)  # type: ignore[arg-type]


@asynccontextmanager
async def running_bridge(config: BridgeConfig) -> AsyncIterator[MqttBridge]:
    """A bridge running (subscribed) for the body; stopped cleanly after it."""
    bridge = MqttBridge(config)
    async with trio.open_nursery() as nursery:
        await nursery.start(bridge.run)
        try:
            yield bridge
        finally:
            bridge.stop()
            nursery.cancel_scope.deadline = trio.current_time() + 20


async def publish(
    server: Mosquitto, topic: str, *messages: bytes, qos: int = 1, v5: Sequence[str] = ()
) -> None:
    """Publish ``messages`` in order over one ``mosquitto_pub`` connection (one per line, so no
    newline inside a message) and wait until the server has acknowledged them. ``v5``: more
    arguments that make it an MQTT 5 client (``-D publish <property> <value>...``)."""
    args = ["mosquitto_pub", "-h", server.host, "-p", str(server.port), "-q", str(qos), "-t", topic]
    if v5:
        args += ["-V", "mqttv5", *v5]
    if len(messages) == 1:
        await trio.run_process([*args, "-s"], stdin=messages[0])
    else:
        await trio.run_process([*args, "-l"], stdin=b"".join(m + b"\n" for m in messages))


async def read_topic(
    bootstrap: str, topic: str, count: int, timeout: float = 30.0
) -> list[ConsumerRecord]:
    """The first ``count`` records of ``topic`` (all partitions), waiting up to ``timeout``;
    then a short extra wait to catch records beyond ``count`` (duplicates)."""
    async with AsyncClient(bootstrap) as client:
        with trio.fail_after(timeout):
            while True:
                try:
                    await client.partitions_for(topic)
                    break
                except KafkaesqueError:  # the bridge creates the topic on first use
                    await trio.sleep(0.1)
        consumer = AsyncConsumer(client, auto_offset_reset=OffsetReset.EARLIEST)
        await consumer.assign_topic(topic)
        records: list[ConsumerRecord] = []
        with trio.fail_after(timeout):
            while len(records) < count:
                records.extend(await consumer.poll(0.5))
        records.extend(await consumer.poll(0.5))
        return records
