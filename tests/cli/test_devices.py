"""``kafkaesque devices``: the device session (pure), the loss check (pure), and whole runs
against a real mosquitto and against a real cluster's MQTT listener."""

from __future__ import annotations

import inspect
import json
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafkaesque.cli.devices import mqtt_listeners, run_devices
from kafkaesque.cli.devices_core import (
    Device,
    DeviceConfig,
    DeviceState,
    ReadingTemplate,
    Tally,
    commands_topic,
    reading_payload,
    readings_topic,
    spectrum_for,
)
from kafkaesque.cli.devices_fleet import Fleet, FleetSpec, reconnect_delay
from kafkaesque.cli.devices_report import Report, check_log, parse_reading

from kafkaesque.client import Client, ClusterMetadata, Producer, ProducerConfig
from kafkaesque.local_cluster import LocalCluster, free_ports
from kafkaesque.protocol import BrokerRow
from kafkaesque.protocol.mqtt import (
    Connack,
    Connect,
    MqttDecoder,
    MqttSubscription,
    MqttVersion,
    Puback,
    Publish,
    Suback,
    Subscribe,
    encode_mqtt,
)

V311 = MqttVersion.V311
MOSQUITTO = "/usr/sbin/mosquitto"
REPO = Path(__file__).resolve().parents[2]


# -- the device session, pure ---------------------------------------------------------------------


@pytest.mark.parametrize("qos", [0, 1])
@pytest.mark.parametrize(
    ("serial", "ts_ms", "packet_id"),
    [(0, 1763790000123, 1), (42, 1763790000999, 43), (9_999_999_999, 9_999_999_999_999, 65535)],
)
def test_a_reading_template_encodes_what_the_codec_encodes(
    qos: int, serial: int, ts_ms: int, packet_id: int
) -> None:
    device = "phone-00007"
    payload = reading_payload("r1", device, serial, ts_ms, spectrum_for(device))
    expected = encode_mqtt(
        Publish(readings_topic(device), payload, qos=qos, packet_id=packet_id if qos else 0), V311
    )
    assert ReadingTemplate("r1", device, qos).packet(serial, ts_ms, packet_id) == expected
    body = json.loads(payload)
    assert (body["device"], body["serial"], body["ts_ms"]) == (device, serial, ts_ms)
    assert len(body["spectrum"]) == 8


def test_a_reading_payload_parses_back() -> None:
    payload = reading_payload("abc", "phone-00003", 17, 1763790000123, spectrum_for("x"))
    assert parse_reading(payload) == ("abc", "phone-00003", 17, 1763790000123)
    assert parse_reading(b'{"command": "reboot"}') is None


def _ready_device(window: int = 4, subscribe: bool = True) -> tuple[Device, Tally, MqttDecoder]:
    """A device past CONNACK (and SUBACK), and a server-side decoder of what it sent."""
    tally = Tally()
    device = Device(3, DeviceConfig(run="t", window=window, subscribe=subscribe), tally)
    server = MqttDecoder()
    server.feed(device.connect())
    (connect,) = server.decode_many()
    assert isinstance(connect, Connect) and connect.client_id == "phone-00003"
    answer = device.receive(encode_mqtt(Connack(), V311), 0.0, 0)
    if subscribe:
        assert device.state is DeviceState.SUBSCRIBING
        assert answer == encode_mqtt(
            Subscribe(1, (MqttSubscription(commands_topic(device.id), qos=1),)), V311
        )
        assert device.receive(encode_mqtt(Suback(1, (1,)), V311), 0.0, 0) == b""
    assert device.state is DeviceState.READY
    return device, tally, server


def _publishes(server: MqttDecoder, data: bytes) -> list[Publish]:
    server.feed(data)
    packets = server.decode_many()
    assert all(isinstance(p, Publish) for p in packets)
    return [p for p in packets if isinstance(p, Publish)]


def test_due_readings_beyond_the_window_wait_for_pubacks() -> None:
    device, tally, server = _ready_device(window=4)
    sent = _publishes(server, device.due(10, now=1.0, now_ms=1000))
    assert [json.loads(p.payload)["serial"] for p in sent] == [0, 1, 2, 3]
    assert device.backlog == 6 and len(device.inflight) == 4
    # Two PUBACKs, split at an awkward byte: two readings more, stamped with the new time.
    acks = b"".join(encode_mqtt(Puback(p.packet_id), V311) for p in sent[:2])
    assert device.receive(acks[:3], now=2.0, now_ms=2000) == b""
    more = _publishes(server, device.receive(acks[3:], now=2.0, now_ms=2000))
    assert [json.loads(p.payload)["serial"] for p in more] == [4, 5]
    assert {json.loads(p.payload)["ts_ms"] for p in more} == {2000}
    assert (tally.sent, tally.acknowledged) == (6, 2)
    assert device.unacknowledged() == [2, 3, 4, 5]


def test_pubacks_inside_the_window_give_latencies() -> None:
    device, tally, server = _ready_device(window=10, subscribe=False)
    tally.window_start, tally.window_end = 0.0, 5.0
    sent = _publishes(server, device.due(2, now=1.0, now_ms=1000))
    acks = b"".join(encode_mqtt(Puback(p.packet_id), V311) for p in sent)
    device.receive(acks, now=1.25, now_ms=1250)
    assert list(tally.puback_ms) == [250.0, 250.0]
    assert tally.acknowledged_in_window == 2


def test_flat_out_keeps_the_window_full_and_stop_ends_it() -> None:
    device, tally, server = _ready_device(window=3, subscribe=False)
    first = _publishes(server, device.flat_out(0.0, 0))
    assert len(first) == 3
    refill = _publishes(server, device.receive(encode_mqtt(Puback(first[0].packet_id), V311), 0, 0))
    assert len(refill) == 1 and len(device.inflight) == 3
    device.stop()
    assert device.receive(encode_mqtt(Puback(first[1].packet_id), V311), 0, 0) == b""
    assert tally.acknowledged == 2 and tally.sent == 4


def test_after_a_reconnect_the_unacknowledged_readings_go_again_with_dup() -> None:
    device, tally, server = _ready_device(window=5)
    sent = _publishes(server, device.due(3, now=1.0, now_ms=1000))
    device.receive(encode_mqtt(Puback(sent[0].packet_id), V311), now=1.0, now_ms=1000)
    device.reconnect()  # the connection was lost with readings 1 and 2 unacknowledged
    server = MqttDecoder()
    server.feed(device.connect())
    server.decode_many()
    assert device.receive(encode_mqtt(Connack(), V311), 2.0, 2000)  # SUBSCRIBE again
    again = _publishes(server, device.receive(encode_mqtt(Suback(1, (1,)), V311), 2.0, 2000))
    assert [(json.loads(p.payload)["serial"], p.dup, p.packet_id) for p in again] == [
        (1, True, sent[1].packet_id),
        (2, True, sent[2].packet_id),
    ]
    # The same messages (their first timestamp): the brokers find a resend by its packet id and
    # value, and a re-stamped one was logged as a second reading (issue 38).
    assert [p.payload for p in again] == [p.payload for p in sent[1:]]
    assert tally.resent == 2 and tally.sent == 3


def test_a_persistent_session_must_be_there_when_the_device_comes_back() -> None:
    tally = Tally()
    device = Device(5, DeviceConfig(run="t", subscribe=False, clean=False), tally)
    server = MqttDecoder()
    server.feed(device.connect())
    (connect,) = server.decode_many()
    assert isinstance(connect, Connect) and connect.clean_start is False
    device.receive(encode_mqtt(Connack(), V311), 0.0, 0)  # the first time: nothing to find
    assert device.state is DeviceState.READY
    assert (tally.sessions_resumed, tally.sessions_lost) == (0, 0)
    device.reconnect()
    device.receive(encode_mqtt(Connack(session_present=True), V311), 1.0, 0)
    assert (tally.sessions_resumed, tally.sessions_lost) == (1, 0)
    device.reconnect()
    device.receive(encode_mqtt(Connack(session_present=False), V311), 2.0, 0)
    assert device.state is DeviceState.READY  # it goes on, with a new session
    assert (tally.sessions_resumed, tally.sessions_lost) == (1, 1)
    assert "session was gone" in tally.errors[-1]


def test_reconnect_delays_back_off_exponentially_with_full_jitter() -> None:
    rng = random.Random(7)
    for tries, bound in ((0, 0.5), (1, 1.0), (3, 4.0), (4, 8.0), (40, 8.0)):
        delays = [reconnect_delay(tries, rng) for _ in range(200)]
        assert all(0.0 <= d < bound for d in delays)
        assert max(delays) > 0.8 * bound and min(delays) < 0.2 * bound  # spread, not lockstep


def test_a_qos1_command_is_acknowledged_and_timed() -> None:
    device, tally, _ = _ready_device()
    command = Publish(
        commands_topic(device.id), b'{"command": "reboot", "ts_ms": 5000}', qos=1, packet_id=9
    )
    answer = device.receive(encode_mqtt(command, V311), now=0.0, now_ms=5030)
    assert answer == encode_mqtt(Puback(9), V311)
    assert tally.commands == 1 and list(tally.command_ms) == [30.0]


def test_a_refused_connect_fails_the_device() -> None:
    tally = Tally()
    device = Device(0, DeviceConfig(run="t"), tally)
    device.receive(encode_mqtt(Connack(reason_code=5), V311), 0.0, 0)
    assert device.state is DeviceState.FAILED
    assert "code 5" in tally.errors[0]


# -- the loss check, pure -------------------------------------------------------------------------


def test_a_gap_in_the_serials_is_a_lost_acknowledged_reading() -> None:
    devices: dict[str, tuple[int, list[int]]] = {"phone-00000": (10, []), "phone-00001": (3, [])}
    seen = [("phone-00000", s) for s in range(10) if s != 4]
    seen += [("phone-00001", s) for s in (0, 1, 2)]
    check = check_log(devices, seen)
    assert check.lost == 1 and check.lost_examples == (("phone-00000", 4),)
    assert (check.consumed, check.duplicated, check.missing_unacknowledged) == (12, 0, 0)


def test_missing_unacknowledged_readings_are_not_lost() -> None:
    check = check_log({"phone-00000": (5, [3, 4])}, [("phone-00000", s) for s in (0, 1, 2, 3)])
    assert (check.lost, check.missing_unacknowledged) == (0, 1)


def test_at_qos0_a_missing_reading_is_not_lost() -> None:
    check = check_log({"phone-00000": (3, [])}, [("phone-00000", 0)], acknowledged=False)
    assert (check.lost, check.missing_unacknowledged) == (0, 2)


def test_duplicates_and_unexpected_readings_are_counted() -> None:
    seen = [("phone-00000", 0), ("phone-00000", 0), ("phone-00000", 1), ("phone-00009", 0)]
    check = check_log({"phone-00000": (2, [])}, seen)
    assert (check.consumed, check.duplicated, check.unexpected, check.lost) == (4, 1, 1, 0)


# -- against a real mosquitto ---------------------------------------------------------------------


def _wait_port(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """A real mosquitto on a free loopback port, killed afterwards."""
    if not os.path.exists(MOSQUITTO):
        pytest.skip("mosquitto is not installed")
    (port,) = free_ports(1)
    conf = tmp_path / "mosquitto.conf"
    conf.write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
        "max_inflight_messages 0\nmax_queued_messages 100000\n"
    )
    proc = subprocess.Popen(
        [MOSQUITTO, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        _wait_port(port)
        yield "127.0.0.1", port
    finally:
        proc.kill()
        proc.wait()


def _spec(address: tuple[str, int], **changes: object) -> FleetSpec:
    settings: dict[str, object] = {
        "addresses": (address,),
        "devices": 40,
        "config": DeviceConfig(run="test", window=20),
        "interval": 0.05,
        "duration": 1.5,
        "drain": 10.0,
    }
    settings.update(changes)
    return FleetSpec(**settings)


def test_every_paced_reading_is_acknowledged_by_mosquitto(mosquitto: tuple[str, int]) -> None:
    report = run_devices(_spec(mosquitto), processes=2)
    assert report.connected == 40 and report.failed == 0 and report.dropped == 0
    assert report.sent > 40
    assert report.acknowledged == report.sent
    assert report.unacknowledged == 0
    assert report.puback_p50_ms is not None and report.puback_p99_ms is not None
    assert report.puback_p50_ms <= report.puback_p99_ms


def test_flat_out_counts_add_up(mosquitto: tuple[str, int]) -> None:
    report = run_devices(_spec(mosquitto, interval=0.0, devices=10), processes=1)
    assert report.sent > 1000
    assert report.acknowledged + report.unacknowledged == report.sent
    assert report.acknowledged == report.sent  # the drain waited for every PUBACK
    assert report.msgs_per_s > 0


def test_qos0_readings_are_sent_without_acknowledgements(mosquitto: tuple[str, int]) -> None:
    spec = _spec(mosquitto, config=DeviceConfig(run="q0", qos=0), devices=5)
    report = run_devices(spec, processes=1)
    assert report.sent > 5 and report.acknowledged == 0 and report.unacknowledged == 0


def test_commands_reach_their_devices(mosquitto: tuple[str, int]) -> None:
    host, port = mosquitto
    spec = _spec(mosquitto, devices=6, interval=None, duration=30.0)
    with Fleet(spec, processes=2) as fleet:
        assert fleet.wait_ready(60).connected == 6
        fleet.go()
        for device in ("phone-00000", "phone-00004"):
            payload = json.dumps({"command": "ping", "ts_ms": int(time.time() * 1000)})
            publish = ["mosquitto_pub", "-h", host, "-p", str(port), "-q", "1"]
            subprocess.run(
                [*publish, "-t", commands_topic(device), "-m", payload],
                check=True,
                timeout=30,
            )
        time.sleep(0.5)  # the deliveries are in flight on loopback
        fleet.stop()
        result = fleet.result(60)
    assert result.commands == 2
    assert len(result.command_ms) == 2 and all(ms >= 0 for ms in result.command_ms)


def test_the_command_prints_a_json_report(mosquitto: tuple[str, int]) -> None:
    host, port = mosquitto
    options = ["-n", "20", "--interval", "0.1", "--duration", "1", "--processes", "2", "--json"]
    out = subprocess.run(
        [sys.executable, "-m", "kafkaesque.cli", "devices", "--mqtt", f"{host}:{port}", *options],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    report = json.loads(out.stdout)
    assert report["connected"] == 20
    assert report["sent"] == report["acknowledged"] > 0
    assert report["lost"] is None  # no --bootstrap: the log was not read


def test_the_mqtt_listeners_are_the_ones_the_brokers_advertise_in_broker_order() -> None:
    brokers = {
        2: BrokerRow(2, "10.0.0.2", 9112, mqtt_port=9116),
        0: BrokerRow(0, "10.0.0.0", 9092, mqtt_port=9096, mqtt_tls_port=8883),
        1: BrokerRow(1, "10.0.0.1", 9102),  # no MQTT listener on this one
    }
    assert mqtt_listeners(ClusterMetadata(brokers)) == (("10.0.0.0", 9096), ("10.0.0.2", 9116))
    assert mqtt_listeners(ClusterMetadata({1: brokers[1]})) == ()


def test_without_a_cluster_to_ask_the_command_says_to_give_mqtt() -> None:
    (port,) = free_ports(1)  # nobody listens there
    result = subprocess.run(
        [sys.executable, "-m", "kafkaesque.cli", "devices", "-n", "1", "--duration", "1"],
        cwd=REPO,
        env={**os.environ, "KAFKAESQUE_BOOTSTRAP": f"127.0.0.1:{port}"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1
    assert result.stderr.startswith(
        f"kafkaesque devices: cannot ask the cluster at 127.0.0.1:{port} for its MQTT listeners"
    ), result.stderr
    assert "--mqtt host:port" in result.stderr and len(result.stderr.splitlines()) == 1


def test_unreachable_devices_are_reported_as_failed() -> None:
    (port,) = free_ports(1)  # nobody listens there
    spec = _spec(("127.0.0.1", port), devices=3, connect_timeout=5.0)
    with Fleet(spec, processes=1) as fleet:
        ready = fleet.wait_ready(60)
    assert (ready.connected, ready.failed) == (0, 3)
    assert ready.errors and "ECONNREFUSED" in ready.errors[0]


# -- against the cluster's MQTT listener ----------------------------------------------------------

RULES = "phones/+/spectrum -> readings key=1\nphones/+/commands -> commands key=1\n"
needs_mqtt_listener = pytest.mark.skipif(
    "mqtt" not in inspect.signature(LocalCluster).parameters,
    reason="the broker has no MQTT listener yet (LocalCluster(mqtt=True) is missing)",
)


@pytest.fixture(scope="module")
def mqtt_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Three brokers with MQTT listeners and the devices' rules; readings and commands exist."""
    directory = tmp_path_factory.mktemp("mqtt-cluster")
    with LocalCluster(str(directory), 3, mqtt=True, mqtt_rules=RULES) as cluster:
        with Client(cluster.bootstrap) as client:
            client.create_topic("readings", 6, 3)
            client.create_topic("commands", 3, 3)
        yield cluster


def _cluster_run(cluster: LocalCluster) -> Report:
    addresses = tuple(cluster.mqtt_addresses)
    spec = _spec(addresses[0], addresses=addresses, devices=30, interval=0.1, duration=2.0)
    return run_devices(spec, processes=2, bootstrap=cluster.bootstrap)


@needs_mqtt_listener
def test_no_acknowledged_reading_is_lost_by_the_cluster(mqtt_cluster: LocalCluster) -> None:
    report = _cluster_run(mqtt_cluster)
    assert report.connected == 30 and report.sent > 0
    assert report.acknowledged + report.unacknowledged == report.sent
    assert report.lost == 0 and report.unexpected == 0
    # Every reading sent is in the log once, or missing without an acknowledgement.
    assert report.consumed - report.duplicated + report.missing_unacknowledged == report.sent
    assert report.e2e_p50_ms is not None


@needs_mqtt_listener
def test_the_command_finds_the_clusters_mqtt_listeners_and_reads_the_log_back(
    mqtt_cluster: LocalCluster,
) -> None:
    # As a user runs it: no --mqtt and no --bootstrap, the cluster named by the environment
    # as for the other client commands.
    options = ["-n", "6", "--interval", "0.1", "--duration", "1", "--processes", "1", "--json"]
    out = subprocess.run(
        [sys.executable, "-m", "kafkaesque.cli", "devices", *options],
        cwd=REPO,
        env={**os.environ, "KAFKAESQUE_BOOTSTRAP": mqtt_cluster.bootstrap},
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    )
    report = json.loads(out.stdout)
    assert report["connected"] == 6 and report["sent"] > 0
    assert report["lost"] == 0 and report["consumed"] > 0  # the log was read back


@needs_mqtt_listener
def test_the_cluster_acknowledges_every_reading(mqtt_cluster: LocalCluster) -> None:
    report = _cluster_run(mqtt_cluster)
    assert report.dropped == 0, report.errors
    assert report.acknowledged == report.sent
    assert report.consumed == report.sent and report.duplicated == 0


@needs_mqtt_listener
def test_commands_in_the_log_reach_their_devices(mqtt_cluster: LocalCluster) -> None:
    addresses = tuple(mqtt_cluster.mqtt_addresses)
    # The run lasts 8 s: ample time for the deliveries, which are not awaited one by one.
    spec = _spec(addresses[0], addresses=addresses, devices=9, interval=None, duration=8.0)
    with Fleet(spec, processes=1) as fleet:
        assert fleet.wait_ready(60).connected == 9
        fleet.go()
        with Producer(mqtt_cluster.bootstrap, ProducerConfig(linger_ms=0.0)) as producer:
            for k in range(9):
                payload = json.dumps({"command": "ping", "ts_ms": int(time.time() * 1000)})
                producer.send("commands", payload.encode(), key=f"phone-{k:05d}".encode())
            producer.flush(30)
        result = fleet.result(60)
    assert result.commands == 9
    assert all(ms >= 0 for ms in result.command_ms)
