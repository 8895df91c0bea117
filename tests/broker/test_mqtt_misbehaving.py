"""Bad input at scale (issue 38 point 6): a few hundred misbehaving connections against a real
broker process, each closed at a bounded cost and counted in /metrics, while a healthy device
connects and gets its PUBACKs.

The misbehaving: sockets that never send CONNECT (closed after the 10 s CONNECT timeout),
half-open devices (CONNECT with keep-alive 1, then silence: closed 1.5 s later), oversized
packets (closed as soon as the fixed header arrives), and wrong passwords in a loop from one
address (checked until the address's failure limit, then refused unheard). The guessers come
from 127.0.0.2, so the limit they reach does not block the healthy device on 127.0.0.1.
"""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import Iterator

import pytest

from kafkaesque.local_cluster import LocalCluster
from kafkaesque.protocol.mqtt import Connect, MqttVersion, encode_mqtt

from .mqtt_helpers import PahoDevice, RawMqtt, keyed_records, wait_for

SILENT = 200
HALF_OPEN = 40
OVERSIZED = 40
GUESSES = 30
# Fixed headers announcing 2 MiB, over the broker's 1 MiB maximum packet size: a CONNECT's, and
# a PUBLISH's sent in one write with a good CONNECT (the broker still checks its password).
OVERSIZED_CONNECT = bytes([0x10, 0x80, 0x80, 0x80, 0x01])
OVERSIZED_PUBLISH = bytes([0x30, 0x80, 0x80, 0x80, 0x01])
GOOD_CONNECT = encode_mqtt(
    Connect("oversized", username="dev", password=b"s3cret"), MqttVersion.V311
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    data = str(tmp_path_factory.mktemp("mqtt-misbehaving"))
    rules = "meters/+/reading -> readings key=1\n"
    with LocalCluster(data, 1, mqtt=True, mqtt_rules=rules, mqtt_users={"dev": "s3cret"}) as c:
        yield c


def mqtt_counters(cluster: LocalCluster) -> dict[str, float]:
    url = f"http://127.0.0.1:{cluster.ports[0].admin}/metrics"
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    return {
        line.split()[0].removeprefix("kafkaesque_mqtt_"): float(line.split()[1])
        for line in text.splitlines()
        if line.startswith("kafkaesque_mqtt_")
    }


def test_misbehaving_connections_are_closed_and_counted_and_a_healthy_device_goes_on(
    cluster: LocalCluster,
) -> None:
    address = cluster.mqtt_address(0)
    before = mqtt_counters(cluster)
    opened: list[socket.socket] = []
    try:
        for _ in range(SILENT):
            opened.append(socket.create_connection(address, timeout=10))
        half_open = []
        for i in range(HALF_OPEN):
            device = RawMqtt(address)
            opened.append(device.sock)
            connack = device.connect(
                f"half-open-{i}", username="dev", password=b"s3cret", keep_alive=1
            )
            assert connack.reason_code == 0
            half_open.append(device)
        for i in range(OVERSIZED):
            sock = socket.create_connection(address, timeout=10)
            opened.append(sock)
            sock.sendall(GOOD_CONNECT + OVERSIZED_PUBLISH if i % 2 else OVERSIZED_CONNECT)
        refused = 0
        for i in range(GUESSES):
            guesser = RawMqtt(address, source="127.0.0.2")
            try:
                connack = guesser.connect(f"guess-{i}", username="dev", password=b"wrong %d" % i)
            finally:
                guesser.close()
            refused += connack.reason_code != 0

        # All of that open or just refused: a healthy device connects and its PUBLISHes are
        # acknowledged (each publish waits for its PUBACK) and in the log.
        healthy = PahoDevice(address, "healthy-meter", username="dev", password="s3cret")
        try:
            healthy.wait_connected()
            for serial in range(20):
                healthy.publish("meters/m1/reading", b"%d" % serial, qos=1)
        finally:
            healthy.close()
        records = keyed_records(cluster.bootstrap, "readings", "m1")
        assert [r.value for r in records] == [b"%d" % s for s in range(20)]

        def closed_by_server(sock: socket.socket) -> bool:
            sock.settimeout(0.01)
            try:
                while sock.recv(65536):
                    pass
            except TimeoutError:
                return False
            except ConnectionResetError:
                pass
            return True

        # The CONNECT timeout (10 s) closes the silent sockets; keep-alive the half-open ones.
        wait_for(lambda: all(closed_by_server(s) for s in opened), 30, "every socket closed")
    finally:
        for sock in opened:
            sock.close()
    after = mqtt_counters(cluster)

    def grew(name: str) -> float:
        return after[f"{name}_total"] - before.get(f"{name}_total", 0.0)

    assert refused == GUESSES
    assert grew("connect_timeouts") == SILENT
    assert grew("keepalive_timeouts") == HALF_OPEN
    assert grew("oversized_packets") == OVERSIZED
    assert grew("auth_failures") == GUESSES
    assert grew("malformed_packets") == 0
    assert after["connected"] == 0
