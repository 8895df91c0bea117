"""Throughput of the MQTT bridge, mosquitto -> log, QoS 1 (a measurement, not a test).

    .venv/bin/python -m tests.broker.mqtt_bridge_throughput [--messages N] [--devices D]

Starts a 3-broker cluster and a mosquitto on loopback, then measures, for N messages of about
200 bytes (the device convention's spectrum readings) spread over D device topics:

* ``drain``: the messages are queued by mosquitto for the bridge's persistent session while the
  bridge is down; then the bridge starts: time until every message is committed and acknowledged.
  This is the bridge's own rate, publishers out of the picture.
* ``live``: the bridge runs while D ``mosquitto_pub`` processes publish: time from the first
  publish until the last message is acknowledged by the bridge.
* ``baseline``: the same records through the client library's producer straight into the log
  (the cluster's rate: the bridge cannot beat it), and the same publishers into mosquitto with
  nobody subscribed (the publishers' rate: ``live`` cannot beat it).

Every process started is stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import trio

from kafkaesque.client import AsyncClient, Client, open_producer
from kafkaesque.local_cluster import LocalCluster
from kafkaesque.mqtt_bridge import BridgeConfig, MqttBridge
from kafkaesque.protocol.mqtt import TopicMapping
from tests.broker.mqtt_bridge_helpers import mqtt_options, publish
from tests.mosquitto import Mosquitto, running_mosquitto

RULES = "phones/+/spectrum -> readings key=1\n"


def _payloads(device: str, count: int) -> list[bytes]:
    now = int(time.time() * 1000)
    return [
        json.dumps(
            {"device": device, "serial": i, "ts_ms": now, "spectrum": [0.123456] * 8}
        ).encode()
        for i in range(count)
    ]


async def _publish_all(server: Mosquitto, messages: int, devices: int) -> float:
    per_device = messages // devices
    batches = {f"phone-{d:05d}": _payloads(f"phone-{d:05d}", per_device) for d in range(devices)}
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        for device, payloads in batches.items():
            nursery.start_soon(publish, server, f"phones/{device}/spectrum", *payloads)
    return trio.current_time() - start


async def _produce_directly(bootstrap: str, messages: int, devices: int) -> float:
    """The same records through the client library's producer, no MQTT: the log's own rate."""
    per_device = messages // devices
    async with AsyncClient(bootstrap) as client, open_producer(client) as producer:
        start = trio.current_time()
        futures = []
        for d in range(devices):
            device = f"phone-{d:05d}"
            topic = f"phones/{device}/spectrum".encode()
            headers = [("mqtt.topic", topic), ("mqtt.qos", b"1")]
            for payload in _payloads(device, per_device):
                futures.append(
                    await producer.send("direct", payload, device.encode(), headers=headers)
                )
        for future in futures:
            await future.get()
        return trio.current_time() - start


async def _wait_acked(bridge: MqttBridge, count: int) -> None:
    with trio.fail_after(300):
        while bridge.stats.acked < count:
            await trio.sleep(0.01)


async def _measure(server: Mosquitto, bootstrap: str, messages: int, devices: int) -> None:
    total = messages // devices * devices
    mapping = TopicMapping.parse(RULES)

    def config(client_id: str) -> BridgeConfig:
        return BridgeConfig(mqtt_options(server, client_id), bootstrap, mapping=mapping)

    direct = await _produce_directly(bootstrap, messages, devices)
    print(f"baseline  producer -> log directly: {total / direct:10.0f} msg/s ({direct:.2f} s)")
    baseline = await _publish_all(server, messages, devices)
    print(f"baseline  publishers -> mosquitto: {total / baseline:10.0f} msg/s ({baseline:.2f} s)")

    # drain: create the session, stop, queue, start again.
    bridge = MqttBridge(config("bench-drain"))
    async with trio.open_nursery() as nursery:
        await nursery.start(bridge.run)
        bridge.stop()
    await _publish_all(server, messages, devices)
    bridge = MqttBridge(config("bench-drain"))
    async with trio.open_nursery() as nursery:
        start, cpu = trio.current_time(), time.process_time()
        await nursery.start(bridge.run)
        await _wait_acked(bridge, total)
        drain, cpu = trio.current_time() - start, time.process_time() - cpu
        bridge.stop()
    print(
        f"drain     mosquitto -> log (QoS 1): {total / drain:10.0f} msg/s ({drain:.2f} s, "
        f"bridge CPU {cpu / total * 1e6:.0f} us/msg)"
    )

    bridge = MqttBridge(config("bench-live"))
    async with trio.open_nursery() as nursery:
        await nursery.start(bridge.run)
        start = trio.current_time()
        await _publish_all(server, messages, devices)
        await _wait_acked(bridge, total)
        live = trio.current_time() - start
        bridge.stop()
    print(f"live      publishers -> log (QoS 1): {total / live:10.0f} msg/s ({live:.2f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--devices", type=int, default=10)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory() as tmp,
        LocalCluster(str(Path(tmp) / "cluster"), 3) as cluster,
        running_mosquitto(Path(tmp) / "mosquitto") as server,
    ):
        with Client(cluster.bootstrap) as client:
            client.create_topic("readings", 6, 3)
            client.create_topic("direct", 6, 3)
        trio.run(_measure, server, cluster.bootstrap, args.messages, args.devices)


if __name__ == "__main__":
    main()
