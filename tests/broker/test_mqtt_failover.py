"""An acknowledged MQTT message is never lost: kill -9 a partition leader under QoS 1 load.

100 devices (trio tasks speaking MQTT through our codec on real sockets) publish QoS 1 readings
to the three brokers, a few PUBLISHes in flight each, as paho does. Partway through, the broker
leading partition 0 of ``readings`` is killed with SIGKILL. A device whose connection breaks
reconnects to another broker and resends what was not PUBACKed, with DUP set (MQTT-4.4.0-1).

Checked: every PUBACKed message is in the log, exactly once. A resend (DUP) is looked up in its
partition's log first and not appended again when its first copy committed
(``kafkaesque.broker._resends``: there were 42-77 duplicates of about 85 resends before; 0 in 12
runs since, and issue 38 asks for 0). The appenders' idempotent batches mean a batch retried by
the broker itself after the leader died is never appended twice.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest
import trio

from kafkaesque.client import Client
from kafkaesque.local_cluster import LocalCluster
from kafkaesque.protocol.mqtt import (
    Connack,
    Connect,
    MqttDecoder,
    MqttVersion,
    Puback,
    Publish,
    encode_mqtt,
)

from .mqtt_helpers import RULES, read_topic

DEVICES = 100
MESSAGES = 40  # per device
WINDOW = 5  # PUBLISHes in flight per device
V311 = MqttVersion.V311


class Device:
    """One device's state across its connections."""

    def __init__(self, name: str, brokers: list[tuple[str, int]], first: int) -> None:
        self.name = name
        self.brokers = brokers
        self.turn = first
        self.acked: set[int] = set()
        self.resent: set[int] = set()  # serials sent more than once
        self.sent: set[int] = set()
        self.next_serial = 0
        self.reconnects = 0

    async def run(self, deadline: float) -> None:
        while len(self.acked) < MESSAGES and trio.current_time() < deadline:
            address = self.brokers[self.turn % len(self.brokers)]
            self.turn += 1
            try:
                with trio.move_on_at(deadline):
                    await self._session(address)
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, EOFError):
                self.reconnects += 1
                await trio.sleep(0.2)

    async def _session(self, address: tuple[str, int]) -> None:
        stream = await trio.open_tcp_stream(*address)
        async with stream:
            decoder = MqttDecoder(server_side=False, version=V311)
            await stream.send_all(encode_mqtt(Connect(self.name, keep_alive=30), V311))
            pending: list[object] = []

            async def receive() -> object:
                while not pending:
                    data = await stream.receive_some(65536)
                    if not data:
                        raise EOFError
                    decoder.feed(data)
                    pending.extend(decoder.decode_many())
                return pending.pop(0)

            connack = await receive()
            assert isinstance(connack, Connack) and connack.reason_code == 0
            # Resend what was sent and not acknowledged (a new connection: DUP set).
            unacked = sorted(self.sent - self.acked)
            in_flight: set[int] = set()
            for serial in unacked:
                self.resent.add(serial)
                await stream.send_all(self._publish(serial, dup=True))
                in_flight.add(serial)
            while len(self.acked) < MESSAGES:
                while len(in_flight) < WINDOW and self.next_serial < MESSAGES:
                    serial = self.next_serial
                    self.next_serial += 1
                    self.sent.add(serial)
                    await stream.send_all(self._publish(serial))
                    in_flight.add(serial)
                packet = await receive()
                assert isinstance(packet, Puback)
                serial = packet.packet_id - 1
                self.acked.add(serial)
                in_flight.discard(serial)

    def _publish(self, serial: int, *, dup: bool = False) -> bytes:
        topic = f"phones/{self.name}/spectrum"
        payload = f"{self.name}:{serial}".encode()
        return encode_mqtt(Publish(topic, payload, qos=1, dup=dup, packet_id=serial + 1), V311)


async def _swarm(devices: list[Device], kill: object, seconds: float) -> None:
    deadline = trio.current_time() + seconds
    async with trio.open_nursery() as nursery:
        for device in devices:
            nursery.start_soon(device.run, deadline)
        # Kill once a third of the messages are acknowledged.
        while sum(len(d.acked) for d in devices) < DEVICES * MESSAGES // 3:
            await trio.sleep(0.02)
        await trio.to_thread.run_sync(kill)  # type: ignore[arg-type]


@pytest.mark.slow
def test_kill_9_of_the_leader_loses_no_acknowledged_message(tmp_path: object) -> None:
    with LocalCluster(str(tmp_path), 3, mqtt=True, mqtt_rules=RULES) as cluster:
        # Create the topic first (the first PUBLISH would) so that its leader is known.
        warm = Device("warm-up", cluster.mqtt_addresses, 0)
        trio.run(lambda: warm.run(trio.current_time() + 60))
        with Client(cluster.bootstrap) as client:
            leader = client.describe_topic("readings").partitions[0].leader
        assert leader is not None
        survivors = [a for i, a in enumerate(cluster.mqtt_addresses) if i != leader]
        # Devices start on every broker (the victim too) and reconnect to survivors only.
        devices = [Device(f"phone-{i:05d}", survivors, i) for i in range(DEVICES)]
        for i, device in enumerate(devices[: DEVICES // 3]):
            device.brokers = [cluster.mqtt_address(leader), *survivors]
            device.turn = 0 if i % 2 == 0 else 1
        started = time.monotonic()
        trio.run(_swarm, devices, lambda: cluster.kill(leader), 120.0)
        elapsed = time.monotonic() - started
        host, port = cluster.client_address(next(i for i in range(3) if i != leader))
        records = read_topic(f"{host}:{port}", "readings")
    counts = Counter(r.value for r in records)
    acked = {f"{d.name}:{s}".encode() for d in devices for s in d.acked}
    resent = {f"{d.name}:{s}".encode() for d in devices for s in d.resent}
    missing = [m for m in acked if counts[m] == 0]
    duplicated = [m for m, n in counts.items() if n > 1]
    not_explained = [m for m in duplicated if m not in resent]
    total_acked = len(acked)
    print(
        f"{total_acked} PUBACKed of {DEVICES * MESSAGES} in {elapsed:.1f} s; "
        f"reconnects {sum(d.reconnects for d in devices)}; resent {len(resent)}; "
        f"duplicates in the log {len(duplicated)} (all of resent messages: {not not_explained})"
    )
    assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {missing[:5]}"
    assert not not_explained, f"duplicates never resent by a device: {not_explained[:5]}"
    assert not duplicated, f"{len(duplicated)} resends appended again, e.g. {duplicated[:5]}"
    assert total_acked == DEVICES * MESSAGES  # everybody got through after the failover
