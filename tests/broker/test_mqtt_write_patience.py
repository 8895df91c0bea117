"""A failover costs a device latency, not its connection (issue 38, reconnect storm point 2).

A device publishes QoS 1 readings to a broker that does not lead the readings' partition. The
leader and the third broker freeze (SIGSTOP: hung or swamped machines, as the survivors of a
reconnect storm were), so for 2 s the partition has no leader with a quorum; then the third
broker comes back and, with the device's broker, elects a new leader (the old one is killed
later). The write timeout is set short (0.5 s), so the writes in flight fail retriably (no
answer in time, no leader with a quorum) long before the new leader is elected. Checked: the
device's broker retries them through the failover instead of closing the device's connection
(which the device then resends over, feeding a reconnect storm), every reading gets its
PUBACK on the same connection, and every acknowledged reading is in the log. Without the
retries, the broker disconnected the device half a second into the outage. (A SIGKILL of the
leader alone is no test of this: its peers see its connections close, and the election that
follows is quicker than any sensible write timeout.)
"""

from __future__ import annotations

import time
from collections import Counter

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

from .mqtt_helpers import RULES, read_topic, wait_for

V311 = MqttVersion.V311
WINDOW = 5  # PUBLISHes in flight
OUTAGE_S = 2.0  # without a leader with a quorum
AFTER_KILL_S = 3.0  # publishing on after the outage


async def _publish_through(address: tuple[str, int], outage: object, acked: list[int]) -> bool:
    """Publish readings until ``AFTER_KILL_S`` after ``outage`` ran, then until
    every one is acknowledged. Returns whether the connection stayed up (False: the broker
    closed it)."""
    stream = await trio.open_tcp_stream(*address)
    async with stream:
        decoder = MqttDecoder(server_side=False, version=V311)
        await stream.send_all(encode_mqtt(Connect("phone-1", keep_alive=60), V311))
        pending: list[object] = []

        async def receive() -> object | None:
            while not pending:
                data = await stream.receive_some(65536)
                if not data:
                    return None  # closed by the broker
                decoder.feed(data)
                pending.extend(decoder.decode_many())
            return pending.pop(0)

        connack = await receive()
        assert isinstance(connack, Connack) and connack.reason_code == 0
        serial = 0
        in_flight: set[int] = set()
        stop_at: float | None = None
        with trio.fail_after(60):
            while stop_at is None or trio.current_time() < stop_at or in_flight:
                while len(in_flight) < WINDOW and (
                    stop_at is None or trio.current_time() < stop_at
                ):
                    serial += 1
                    payload = f"phone-1:{serial}".encode()
                    publish = Publish("phones/phone-1/spectrum", payload, qos=1, packet_id=serial)
                    await stream.send_all(encode_mqtt(publish, V311))
                    in_flight.add(serial)
                    await trio.sleep(0.02)
                packet = await receive()
                if packet is None:
                    return False
                assert isinstance(packet, Puback), packet
                in_flight.discard(packet.packet_id)
                acked.append(packet.packet_id)
                if stop_at is None and len(acked) >= 20:
                    await trio.to_thread.run_sync(outage)  # type: ignore[arg-type]
                    stop_at = trio.current_time() + AFTER_KILL_S
        return True


def test_a_device_keeps_its_connection_and_gets_its_pubacks_through_a_failover(
    tmp_path: object,
) -> None:
    with LocalCluster(
        str(tmp_path), 3, mqtt=True, mqtt_rules=RULES, extra_args=["--write-timeout", "0.5"]
    ) as cluster:
        with Client(cluster.bootstrap) as client:
            client.create_topic("readings", 1, 3)
            wait_for(lambda: client.describe_topic("readings").partitions[0].leader is not None)
            leader = client.describe_topic("readings").partitions[0].leader
        assert leader is not None
        other = (leader + 1) % 3
        third = (leader + 2) % 3

        def outage() -> None:
            cluster.pause(leader)
            cluster.pause(third)
            time.sleep(OUTAGE_S)
            cluster.resume(third)

        acked: list[int] = []
        device = cluster.mqtt_address(other)
        stayed = trio.run(_publish_through, device, outage, acked)
        cluster.kill(leader)
        host, port = cluster.client_address(other)
        records = read_topic(f"{host}:{port}", "readings")
    assert stayed, f"the broker closed the device's connection after {len(acked)} PUBACKs"
    in_log = Counter(r.value for r in records)
    missing = [s for s in acked if f"phone-1:{s}".encode() not in in_log]
    assert not missing, f"acknowledged readings missing from the log: {missing[:5]}"
    twice = [value for value, n in in_log.items() if n > 1]
    assert not twice, f"readings in the log twice (a retried batch appended again): {twice[:5]}"
    assert len(acked) > 20  # and it published through the failover
