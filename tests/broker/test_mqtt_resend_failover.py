"""A resend is not a second reading (issue 38 point 7): a QoS 1 PUBLISH whose first copy
committed, resent with DUP through another broker after its leader was killed -9, is in the
partition once.

The devices publish to the leader of ``readings`` (one partition, three replicas), the reading
commits (a consumer sees it through another broker), and the leader is killed before the device
read its PUBACK: the device reconnects to a survivor and sends the reading again with DUP set,
as MQTT-4.4.0-1 asks. Two devices, on two different survivors (so that one lookup runs on the
new leader itself and the other is forwarded to it):

* the demo's own device (``kafkaesque devices``' ``Device``, the one whose resend the README's
  demo counted as a duplicated reading);
* a raw one that sends the same bytes again with the DUP bit.

And when no leader answers the lookup within the write timeout (the other two brokers paused),
the resend is not appended (its first copy may be there): the broker closes the connection, and
the device's next resend, once a leader is back, is found.
"""

from __future__ import annotations

import random
import socket
import time
from collections import Counter
from collections.abc import Callable

import pytest
from kafkaesque.cli.devices_core import Device, DeviceConfig, DeviceState, Tally
from kafkaesque.cli.devices_report import parse_reading

from kafkaesque.client import Client
from kafkaesque.local_cluster import LocalCluster
from kafkaesque.protocol.mqtt import MqttVersion, Puback, Publish, encode_mqtt

from .mqtt_helpers import RULES, RawMqtt, read_topic, wait_for

V311 = MqttVersion.V311
RAW_TOPIC = "phones/phone-raw/spectrum"
RAW_READING = b'{"device": "phone-raw", "serial": 0}'


class DemoDevice:
    """``kafkaesque devices``' sans-I/O ``Device`` driven over a blocking socket."""

    def __init__(self, index: int) -> None:
        self.tally = Tally()
        self.device = Device(index, DeviceConfig(run="resend", subscribe=False), self.tally)
        self.sock: socket.socket | None = None

    def connect(self, address: tuple[str, int]) -> None:
        """Open a connection and handshake; what the device sends once ready (its resends)
        goes out at once."""
        if self.sock is not None:
            self.sock.close()
            self.device.reconnect()
        self.sock = socket.create_connection(address, timeout=10)
        self.sock.sendall(self.device.connect())
        self._answer_until(lambda: self.device.state is DeviceState.READY)

    def publish(self, count: int = 1) -> None:
        assert self.sock is not None
        self.sock.sendall(self.device.due(count, time.monotonic(), int(time.time() * 1000)))

    def wait_acknowledged(self, count: int) -> None:
        self._answer_until(lambda: self.tally.acknowledged >= count)

    def _answer_until(self, done: Callable[[], bool]) -> None:
        assert self.sock is not None
        deadline = time.monotonic() + 20
        while not done():
            assert time.monotonic() < deadline, "the device got no answer in time"
            data = self.sock.recv(65536)
            assert data, "the server closed the connection"
            out = self.device.receive(data, time.monotonic(), int(time.time() * 1000))
            if out:
                self.sock.sendall(out)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()


def test_a_resend_through_another_broker_after_kill_9_of_the_leader_is_not_appended_again(
    tmp_path: object,
) -> None:
    with LocalCluster(str(tmp_path), 3, mqtt=True, mqtt_rules=RULES) as cluster:
        with Client(cluster.bootstrap) as client:
            client.create_topic("readings", 1, 3)
            wait_for(
                lambda: client.describe_topic("readings").partitions[0].leader is not None,
                20,
                "a leader of readings/0",
            )
            leader = client.describe_topic("readings").partitions[0].leader
        assert leader is not None
        survivors = [i for i in range(3) if i != leader]
        bootstrap = "{}:{}".format(*cluster.client_address(survivors[0]))

        demo = DemoDevice(1)
        raw = RawMqtt(cluster.mqtt_address(leader))
        try:
            demo.connect(cluster.mqtt_address(leader))
            raw.connect("phone-raw")
            demo.publish()
            raw.send(encode_mqtt(Publish(RAW_TOPIC, RAW_READING, qos=1, packet_id=1), raw.version))
            # Both committed (a consumer sees only that), neither PUBACK read: kill the leader.
            wait_for(lambda: len(read_topic(bootstrap, "readings")) == 2, 20, "both readings")
            cluster.kill(leader)
            raw.close()

            demo.connect(cluster.mqtt_address(survivors[0]))  # resends reading 0 with DUP
            demo.wait_acknowledged(1)
            raw = RawMqtt(cluster.mqtt_address(survivors[1]))
            raw.connect("phone-raw")
            raw.send(
                encode_mqtt(
                    Publish(RAW_TOPIC, RAW_READING, qos=1, packet_id=1, dup=True), raw.version
                )
            )
            assert isinstance(raw.receive(timeout=20), Puback)
        finally:
            demo.close()
            raw.close()
        assert demo.tally.resent == 1
        records = read_topic(bootstrap, "readings")

    demo_readings = [parse_reading(r.value or b"") for r in records if r.key == b"phone-00001"]
    raw_readings = [r.value for r in records if r.key == b"phone-raw"]
    assert raw_readings == [RAW_READING], "the raw device's resend was appended again"
    assert [(r[1], r[2]) for r in demo_readings if r is not None] == [("phone-00001", 0)], (
        f"the demo device's resend was appended again: {demo_readings}"
    )


WRITE_TIMEOUT_S = 3.0


def test_a_resend_whose_lookup_times_out_is_not_appended(tmp_path: object) -> None:
    extra = ["--write-timeout", str(WRITE_TIMEOUT_S)]
    with LocalCluster(str(tmp_path), 3, mqtt=True, mqtt_rules=RULES, extra_args=extra) as cluster:
        with Client(cluster.bootstrap) as client:
            client.create_topic("readings", 1, 3)
            wait_for(
                lambda: client.describe_topic("readings").partitions[0].leader is not None,
                20,
                "a leader of readings/0",
            )
            leader = client.describe_topic("readings").partitions[0].leader
        assert leader is not None
        here = (leader + 1) % 3  # a follower: the device's broker
        others = [i for i in range(3) if i != here]
        bootstrap = "{}:{}".format(*cluster.client_address(here))
        reading = encode_mqtt(Publish(RAW_TOPIC, RAW_READING, qos=1, packet_id=1), V311)
        resend = encode_mqtt(Publish(RAW_TOPIC, RAW_READING, qos=1, packet_id=1, dup=True), V311)

        device = RawMqtt(cluster.mqtt_address(here))
        device.connect("phone-raw")
        device.send(reading)
        assert isinstance(device.receive(timeout=20), Puback)  # committed
        device.close()  # as if the PUBACK had been lost with the connection
        for broker in others:
            cluster.pause(broker)
        try:
            device = RawMqtt(cluster.mqtt_address(here))
            device.connect("phone-raw")
            device.send(resend)
            # The lookup gives up after the write timeout; the quorum is back just after. An
            # append started then would land (its own deadline runs on): a second reading.
            time.sleep(WRITE_TIMEOUT_S + 0.5)
        finally:
            for broker in others:
                cluster.resume(broker)
        answer = device.receive(timeout=20)
        device.close()
        if answer is None:  # closed by the broker: the device sends it again
            device = RawMqtt(cluster.mqtt_address(here))
            device.connect("phone-raw")
            device.send(resend)
            answer = device.receive(timeout=20)
            device.close()
        assert isinstance(answer, Puback)
        records = read_topic(bootstrap, "readings")
    assert [r.value for r in records if r.key == b"phone-raw"] == [RAW_READING]


ROUNDS = 6
DEVICES_PER_ROUND = 8
BURST = 20  # readings each device sends just before the kill


@pytest.mark.slow
def test_bursts_cut_by_kill_9_at_random_moments_are_logged_once(tmp_path: object) -> None:
    """The same at random moments: each round, the demo's devices publish a burst to the
    leader, which is killed -9 from 0 to 30 ms later (readings appended, replicated or not,
    committed or not, acknowledged or not), and they resend what was not acknowledged through
    the survivors; the killed broker comes back for the next round. Every reading is in the log
    once (each was eventually acknowledged)."""
    rng = random.Random(38)
    devices: list[DemoDevice] = []
    with LocalCluster(str(tmp_path), 3, mqtt=True, mqtt_rules=RULES) as cluster:
        with Client(cluster.bootstrap) as client:
            client.create_topic("readings", 1, 3)
        for round_ in range(ROUNDS):
            with Client(cluster.bootstrap) as client:
                wait_for(
                    lambda: client.describe_topic("readings").partitions[0].leader is not None,
                    20,
                    "a leader of readings/0",
                )
                leader = client.describe_topic("readings").partitions[0].leader
            assert leader is not None
            survivors = [i for i in range(3) if i != leader]
            batch = [DemoDevice(round_ * DEVICES_PER_ROUND + i) for i in range(DEVICES_PER_ROUND)]
            devices += batch
            try:
                for device in batch:
                    device.connect(cluster.mqtt_address(leader))
                for device in batch:
                    device.publish(BURST)
                time.sleep(rng.uniform(0.0, 0.03))
                cluster.kill(leader)
                for i, device in enumerate(batch):  # resends the unacknowledged, with DUP
                    device.connect(cluster.mqtt_address(survivors[i % 2]))
                for device in batch:
                    device.wait_acknowledged(BURST)
            finally:
                for device in batch:
                    device.close()
            cluster.start(leader)
            cluster.wait_ready()
        bootstrap = "{}:{}".format(*cluster.client_address(0))
        records = read_topic(bootstrap, "readings")
    seen = Counter(
        (reading[1], reading[2])
        for reading in (parse_reading(r.value or b"") for r in records)
        if reading is not None
    )
    expected = {(d.device.id, s) for d in devices for s in range(BURST)}
    resent = sum(d.tally.resent for d in devices)
    print(f"{len(expected)} readings, {resent} resent")
    assert set(seen) == expected, "a reading is missing"
    duplicated = sorted(k for k, n in seen.items() if n > 1)
    assert not duplicated, f"{len(duplicated)} of {resent} resends logged twice: {duplicated[:5]}"
