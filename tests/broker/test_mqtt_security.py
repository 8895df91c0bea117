"""MQTT security against a real broker process: salted users (``--mqtt-users``), mosquitto-style
ACLs (``--mqtt-acl-file``) and TLS, driven by mosquitto_pub / mosquitto_sub, paho and raw
sockets; the authentication-failure limiter; an old plaintext users file refused at start."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as paho
import pytest
import trustme
from kafkaesque.cli.main import main

from kafkaesque.broker.mqtt._admission import check_password
from kafkaesque.client import (
    Client,
    ClientConfig,
    Consumer,
    KafkaesqueError,
    Security,
    SyncConnection,
)
from kafkaesque.local_cluster import LocalCluster, free_ports
from kafkaesque.protocol import BrokerRow, Metadata
from kafkaesque.protocol.mqtt import (
    Connack,
    MqttSubscription,
    MqttVersion,
    Puback,
    Publish,
    Suback,
    Subscribe,
    Will,
    encode_mqtt,
)
from kafkaesque.security import derive_credential, save_users
from tests.mosquitto import running_mosquitto

from .mqtt_helpers import RULES, PahoDevice, RawMqtt, keyed_records, wait_for

PASSWORDS = {"alice": "alice-pw", "bob": "bob-pw"}
ACL = """\
# no anonymous lines: a client without a user name could do nothing (and cannot connect)
user alice
topic readwrite phones/p1/#
user bob
topic read phones/+/status
pattern write phones/%c/spectrum
pattern read phones/%c/commands
pattern readwrite users/%u/#
"""
V5 = MqttVersion.V5
V311 = MqttVersion.V311


class Setup:
    """A test CA and the broker's certificate for 127.0.0.1; the users and ACL files."""

    def __init__(self, directory: Path) -> None:
        ca = trustme.CA()
        self.ca_file = directory / "ca.pem"
        ca.cert_pem.write_to_path(str(self.ca_file))
        server = ca.issue_cert("127.0.0.1")
        self.cert = directory / "broker.pem"
        self.key = directory / "broker.key"
        for blob in server.cert_chain_pems:
            blob.write_to_path(str(self.cert), append=True)
        server.private_key_pem.write_to_path(str(self.key))
        self.users = directory / "users"
        save_users(self.users, {u: derive_credential(p) for u, p in PASSWORDS.items()})
        self.acl = directory / "acl.conf"
        self.acl.write_text(ACL)

    def broker_args(self, tls_port: int) -> list[str]:
        return [
            "--mqtt-tls-listen", f"127.0.0.1:{tls_port}",
            "--mqtt-tls-cert", str(self.cert), "--mqtt-tls-key", str(self.key),
            "--mqtt-users", str(self.users), "--mqtt-acl-file", str(self.acl),
        ]  # fmt: skip


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Setup:
    return Setup(tmp_path_factory.mktemp("mqtt-security"))


@pytest.fixture(scope="module")
def secured(
    tmp_path_factory: pytest.TempPathFactory, setup: Setup
) -> Iterator[tuple[LocalCluster, int]]:
    """One broker with a plain and a TLS MQTT listener, users and ACLs."""
    [tls_port] = free_ports(1)
    data = str(tmp_path_factory.mktemp("secured"))
    with LocalCluster(
        data, 1, mqtt=True, mqtt_rules=RULES, extra_args=setup.broker_args(tls_port)
    ) as cluster:
        yield cluster, tls_port


def mosquitto(
    tool: str, port: int, setup: Setup, *args: str, user: str = "alice", password: str = ""
) -> subprocess.CompletedProcess[str]:
    """``mosquitto_pub``/``mosquitto_sub`` over TLS as ``user``; its result (never raises)."""
    return subprocess.run(
        [tool, "-h", "127.0.0.1", "-p", str(port), "--cafile", str(setup.ca_file),
         "-u", user, "-P", password or PASSWORDS[user], *args],
        check=False, capture_output=True, text=True, timeout=30,
    )  # fmt: skip


def raw(cluster: LocalCluster, version: MqttVersion = V5) -> RawMqtt:
    return RawMqtt(cluster.mqtt_address(0), version)


def samples(cluster: LocalCluster, name: str) -> dict[str, float]:
    """The samples of metric ``name``: by their ``action`` label ("" without)."""
    return {
        labels.get("action", ""): value
        for sample, labels, value in cluster.scrape(0)
        if sample == name
    }


def test_a_user_publishes_what_the_acl_grants_over_tls(
    secured: tuple[LocalCluster, int], setup: Setup
) -> None:
    """docs/mqtt.md's example: mosquitto_pub --cafile -u -P to the TLS port, allowed."""
    cluster, port = secured
    marker = uuid.uuid4().hex
    done = mosquitto("mosquitto_pub", port, setup, "-t", "phones/p1/spectrum", "-q", "1",
                     "-m", marker)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert marker.encode() in [r.value for r in keyed_records(cluster.bootstrap, "readings", "p1")]


def test_another_user_is_refused_and_nothing_is_appended(
    secured: tuple[LocalCluster, int], setup: Setup
) -> None:
    cluster, port = secured
    before = samples(cluster, "kafkaesque_mqtt_authorization_failures_total").get("publish", 0)
    refused = uuid.uuid4().hex
    v5 = mosquitto("mosquitto_pub", port, setup, "-V", "mqttv5", "-t", "phones/p1/spectrum",
                   "-q", "1", "-m", refused, user="bob")  # fmt: skip
    assert "not authorized" in (v5.stdout + v5.stderr).lower(), (v5.stdout, v5.stderr)
    # MQTT 3.1.1 has no way to say so: acknowledged (mosquitto_pub succeeds), then dropped.
    v311 = mosquitto("mosquitto_pub", port, setup, "-t", "phones/p1/spectrum", "-q", "1",
                     "-m", refused, user="bob")  # fmt: skip
    assert v311.returncode == 0, v311.stderr
    allowed = uuid.uuid4().hex  # after both, in the same partition (key p1)
    ok = mosquitto("mosquitto_pub", port, setup, "-t", "phones/p1/spectrum", "-q", "1",
                   "-m", allowed)  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    values = [r.value for r in keyed_records(cluster.bootstrap, "readings", "p1")]
    assert allowed.encode() in values and refused.encode() not in values
    after = samples(cluster, "kafkaesque_mqtt_authorization_failures_total")["publish"]
    assert after >= before + 2


def test_a_wrong_password_or_none_is_refused(
    secured: tuple[LocalCluster, int], setup: Setup
) -> None:
    cluster, port = secured
    before = samples(cluster, "kafkaesque_mqtt_auth_failures_total")[""]
    wrong = mosquitto("mosquitto_pub", port, setup, "-t", "phones/p1/spectrum", "-m", "x",
                      password="not-it")  # fmt: skip
    assert wrong.returncode != 0
    assert "bad user name or password" in wrong.stderr.lower(), wrong.stderr
    unknown = raw(cluster)
    anonymous = raw(cluster, V311)
    try:
        assert unknown.connect("d1", username="mallory", password=b"x").reason_code == 0x86
        assert anonymous.connect("d2").reason_code == 0x04
    finally:
        unknown.close()
        anonymous.close()
    assert samples(cluster, "kafkaesque_mqtt_auth_failures_total")[""] >= before + 2


@pytest.mark.parametrize("version", ["mqttv311", "mqttv5"])
def test_mosquitto_sub_is_refused_a_filter_it_may_not_read(
    secured: tuple[LocalCluster, int], setup: Setup, version: str
) -> None:
    _, port = secured
    refused = mosquitto("mosquitto_sub", port, setup, "-V", version, "-t", "phones/+/commands",
                        "-W", "10", user="bob")  # fmt: skip
    assert "denied" in (refused.stdout + refused.stderr).lower(), (refused.stdout, refused.stderr)


def test_patterns_give_each_client_its_own_topics(secured: tuple[LocalCluster, int]) -> None:
    cluster, _ = secured
    device = raw(cluster)
    try:
        assert device.connect("p7", username="bob", password=b"bob-pw").reason_code == 0
        for packet_id, topic, code in [
            (1, "phones/p7/spectrum", 0),  # %c
            (2, "phones/p8/spectrum", 0x87),
            (3, "users/bob/notes", 0),  # %u
            (4, "users/alice/notes", 0x87),
        ]:
            device.send(encode_mqtt(Publish(topic, b"x", qos=1, packet_id=packet_id), V5))
            assert device.receive() == Puback(packet_id, code), topic
        subscribe = Subscribe(
            9,
            (
                MqttSubscription("phones/p7/commands", 1),
                MqttSubscription("phones/+/commands", 1),
                MqttSubscription("phones/p2/status", 0),  # bob's own line
            ),
        )
        device.send(encode_mqtt(subscribe, V5))
        assert device.receive() == Suback(9, (1, 0x87, 0))
    finally:
        device.close()


def test_a_will_the_client_may_not_publish_refuses_the_connect(
    secured: tuple[LocalCluster, int],
) -> None:
    cluster, _ = secured
    device = raw(cluster)
    try:
        will = Will("phones/p8/spectrum", b"gone", 0, False)
        connack = device.connect("p7", username="bob", password=b"bob-pw", will=will)
        assert connack == Connack(False, 0x87)
        assert device.closed_by_server()
    finally:
        device.close()
    assert samples(cluster, "kafkaesque_mqtt_authorization_failures_total")["will"] >= 1


def test_a_device_round_trip_over_tls_with_credentials(
    secured: tuple[LocalCluster, int], setup: Setup
) -> None:
    """paho over TLS as alice: subscribes to and publishes on what the ACL grants her."""
    _, port = secured

    def secure(client: paho.Client) -> None:
        client.tls_set(ca_certs=str(setup.ca_file))

    phone = PahoDevice(
        ("127.0.0.1", port),
        f"alice-{uuid.uuid4().hex[:6]}",
        username="alice",
        password=PASSWORDS["alice"],
        configure=secure,
    )
    try:
        phone.wait_connected()
        assert phone.connack == [0]
        phone.subscribe("phones/p1/#", qos=1)
        marker = uuid.uuid4().hex.encode()
        phone.publish("phones/p1/spectrum", marker, qos=1)
        wait_for(lambda: marker in phone.payloads(), 10, "the message back")
    finally:
        phone.close()


def test_the_users_file_is_read_again_when_it_changes(
    secured: tuple[LocalCluster, int], setup: Setup
) -> None:
    cluster, _ = secured
    users = {u: derive_credential(p) for u, p in PASSWORDS.items()}
    save_users(setup.users, {**users, "carol": derive_credential("carol-pw")})
    try:

        def carol_connects() -> bool:
            device = raw(cluster)
            try:
                return device.connect("c1", username="carol", password=b"carol-pw").reason_code == 0
            finally:
                device.close()

        # The file is looked at once a second at most; each refused try counts against the
        # address (FailureLimiter), so try a few times, slowly.
        for _ in range(5):
            time.sleep(1.5)
            if carol_connects():
                break
        else:
            raise AssertionError("the new user was not taken")
    finally:
        save_users(setup.users, users)


def test_an_address_that_failed_too_often_is_refused_unheard(tmp_path: Path, setup: Setup) -> None:
    """BrokerConfig.auth_failure_limit (10 in 60 s by default): then even the right password
    gets CONNACK not authorized (0x87). A broker of its own: the limit holds 127.0.0.1 for a
    minute."""
    with LocalCluster(
        str(tmp_path), 1, mqtt=True, extra_args=["--mqtt-users", str(setup.users)]
    ) as cluster:
        for attempt in range(10):
            device = raw(cluster)
            try:
                connack = device.connect(f"d{attempt}", username="alice", password=b"guess")
                assert connack.reason_code == 0x86
            finally:
                device.close()
        device = raw(cluster)
        try:
            connack = device.connect("d", username="alice", password=PASSWORDS["alice"].encode())
            assert connack.reason_code == 0x87
        finally:
            device.close()


def test_an_old_plaintext_users_file_stops_the_broker_with_the_way_out(tmp_path: Path) -> None:
    old = tmp_path / "mqtt-users.txt"
    old.write_text("alice:secret\n")
    result = subprocess.run(
        [sys.executable, "-m", "kafkaesque.cli", "broker", "--id", "0",
         "--data-dir", str(tmp_path), "--client", "127.0.0.1:0",
         "--peers", "0@127.0.0.1:0", "--controllers", "0@127.0.0.1:0",
         "--mqtt-listen", "127.0.0.1:0", "--mqtt-users", str(old)],
        check=False, cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode != 0
    [line] = result.stderr.strip().splitlines()
    assert f"{old} line 1: not a salted SCRAM-SHA-256 entry" in line
    assert "kafkaesque user import" in line


def test_kafkaesque_devices_over_tls_with_credentials(
    secured: tuple[LocalCluster, int], setup: Setup
) -> None:
    """``kafkaesque devices --tls --cafile``: to the TLS listener the cluster advertises, with
    the password from the environment; each phone publishes phones/<id>/spectrum (pattern %c)."""
    cluster, _ = secured
    options = ["-n", "3", "--interval", "0.1", "--duration", "1", "--processes", "1", "--json",
               "--bootstrap", cluster.bootstrap, "--tls", "--cafile", str(setup.ca_file),
               "--username", "bob"]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "kafkaesque.cli", "devices", *options],
        env={**os.environ, "KAFKAESQUE_MQTT_PASSWORD": PASSWORDS["bob"]},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["connected"] == 3 and report["sent"] > 0, report
    assert report["acknowledged"] == report["sent"] and report["lost"] == 0
    assert report["consumed"] == report["sent"]  # read back from the log


def test_kafkaesque_devices_with_a_wrong_password_connects_none(
    secured: tuple[LocalCluster, int], setup: Setup
) -> None:
    _, port = secured
    options = ["-n", "1", "--duration", "1", "--processes", "1", "--mqtt", f"127.0.0.1:{port}",
               "--cafile", str(setup.ca_file), "--username", "bob",
               "--password", "nope"]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "kafkaesque.cli", "devices", *options],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode != 0
    assert "no device could connect" in done.stderr


def test_the_bridge_reads_an_upstream_mosquitto_over_tls_with_credentials(
    secured: tuple[LocalCluster, int], setup: Setup, tmp_path: Path
) -> None:
    """``kafkaesque mqtt-bridge --upstream-cafile --username --password`` against a mosquitto
    that takes only TLS and its password file: what is published there lands in the log."""
    cluster, _ = secured
    passwords = tmp_path / "mosquitto.passwd"
    subprocess.run(
        ["mosquitto_passwd", "-b", "-c", str(passwords), "bridge", "up-pw"], check=True, timeout=30
    )
    tls = (
        f"cafile {setup.ca_file}\ncertfile {setup.cert}\nkeyfile {setup.key}\n"
        f"allow_anonymous false\npassword_file {passwords}\n"
        # (as root mosquitto would switch to its own user, who cannot read the test files)
        + ("user root\n" if os.geteuid() == 0 else "")
    )
    topic = f"bridged_{uuid.uuid4().hex[:8]}"
    rules = tmp_path / "rules"
    rules.write_text(f"phones/+/spectrum -> {topic} key=1\n")
    with running_mosquitto(tmp_path / "upstream", tls) as upstream:
        bridge = subprocess.Popen(
            [sys.executable, "-m", "kafkaesque.cli", "mqtt-bridge",
             "--upstream", upstream.address, "--upstream-cafile", str(setup.ca_file),
             "--username", "bridge", "--bootstrap", cluster.bootstrap, "--rules", str(rules),
             "--client-id", f"bridge-{topic}", "--replication-factor", "1",
             "--stats-interval", "0"],
            env={**os.environ, "KAFKAESQUE_MQTT_PASSWORD": "up-pw"},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert _read_line(bridge, 60) == "ready"
            marker = uuid.uuid4().hex
            subprocess.run(
                ["mosquitto_pub", "-h", "127.0.0.1", "-p", str(upstream.port),
                 "--cafile", str(setup.ca_file), "-u", "bridge", "-P", "up-pw",
                 "-t", "phones/up1/spectrum", "-q", "1", "-m", marker],
                check=True, timeout=30,
            )  # fmt: skip

            def bridged() -> bool:
                try:
                    records = keyed_records(cluster.bootstrap, topic, "up1")
                except KafkaesqueError:  # the bridge creates the topic with the first message
                    return False
                return marker.encode() in [r.value for r in records]

            wait_for(bridged, 30, "the bridged message in the log")
        finally:
            _stop(bridge)


def _read_line(process: subprocess.Popen[str], timeout: float) -> str:
    """The next line ``process`` prints (stripped), or "" if none within ``timeout``."""
    assert process.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(timeout):
            return ""
    return process.stdout.readline().strip()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--upstream-cafile", "/nonexistent/ca.pem"], "--upstream TLS: cannot load"),
        (["--upstream-keyfile", "k.pem"], "--upstream-keyfile needs --upstream-certfile"),
    ],
)
def test_the_bridges_tls_options_are_checked_at_start(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["mqtt-bridge", "--upstream", "h:1", *flags]) == 1
    assert message in capsys.readouterr().err


# -- a cluster whose line protocol wants authentication ---------------------------------------

ADMIN = Security(protocol="SASL_PLAINTEXT", username="admin", password="admin-pw")


class AuthenticatingCluster(LocalCluster):
    """A cluster started with ``--users-file``: its readiness check authenticates first."""

    def _registered(self, broker: int) -> int:
        try:
            with SyncConnection(
                self.client_address(broker), security=ADMIN, connect_timeout_s=2
            ) as connection:
                rows = connection.request(Metadata(()), 2)
        except KafkaesqueError:
            return 0
        return sum(isinstance(r, BrokerRow) for r in getattr(rows, "rows", ()))


def read_as(security: Security, bootstrap: str, topic: str, key: str) -> list[bytes]:
    """The values of ``topic``'s records under ``key``, read as ``security`` says."""
    with (
        Client(bootstrap, config=ClientConfig(security=security)) as client,
        Consumer(client) as consumer,
    ):
        consumer.assign_topic(topic)
        consumer.seek_to_beginning()
        return [r.value or b"" for r in consumer.records(follow=False) if r.key == key.encode()]


def test_the_bridge_and_the_devices_authenticate_to_the_cluster(
    tmp_path: Path, setup: Setup
) -> None:
    """``--user`` with the password in $KAFKAESQUE_PASSWORD (``--password`` is MQTT's): the
    bridge appends into a cluster that wants SCRAM, and ``kafkaesque devices`` finds its MQTT
    listeners and reads its log back there."""
    users = tmp_path / "cluster-users"
    credentials = {"admin": "admin-pw", "svc": "svc-pw"}
    save_users(users, {u: derive_credential(p) for u, p in credentials.items()})
    topic = f"bridged_{uuid.uuid4().hex[:8]}"
    rules = tmp_path / "rules"
    rules.write_text(f"phones/+/spectrum -> {topic} key=1\n")
    args = ["--users-file", str(users), "--super-users", "User:admin"]
    env = {**os.environ, "KAFKAESQUE_PASSWORD": "svc-pw"}
    svc = Security(protocol="SASL_PLAINTEXT", username="svc", password="svc-pw")
    with (
        AuthenticatingCluster(
            str(tmp_path / "cluster"), 1, mqtt=True, mqtt_rules=RULES, extra_args=args
        ) as cluster,
        running_mosquitto(tmp_path / "upstream") as upstream,
    ):
        bridge = subprocess.Popen(
            [sys.executable, "-m", "kafkaesque.cli", "mqtt-bridge",
             "--upstream", upstream.address, "--bootstrap", cluster.bootstrap,
             "--rules", str(rules), "--client-id", f"bridge-{topic}",
             "--replication-factor", "1", "--stats-interval", "0", "--user", "svc"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert _read_line(bridge, 60) == "ready"
            upstream.publish("phones/up2/spectrum", "via-bridge")

            def bridged() -> bool:
                try:
                    return b"via-bridge" in read_as(svc, cluster.bootstrap, topic, "up2")
                except KafkaesqueError:
                    return False

            wait_for(bridged, 30, "the bridged message in the log")
        finally:
            _stop(bridge)
        options = ["-n", "2", "--interval", "0.1", "--duration", "1", "--processes", "1",
                   "--json", "--bootstrap", cluster.bootstrap, "--user", "svc"]  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-m", "kafkaesque.cli", "devices", *options],
            env=env, capture_output=True, text=True, timeout=180, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert report["connected"] == 2 and report["consumed"] == report["sent"] > 0, report
        with pytest.raises(KafkaesqueError):  # the cluster does want the credentials
            read_as(Security(), cluster.bootstrap, topic, "up2")


def _stop(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)
    for stream in (process.stdout, process.stderr):
        if stream is not None:
            stream.close()


def test_check_password_takes_a_decoy_for_unknown_users() -> None:
    right, decoy = derive_credential("right"), derive_credential("decoy")
    assert check_password(right, decoy, b"right")
    assert not check_password(right, decoy, b"wrong")
    assert not check_password(right, decoy, None)
    assert not check_password(right, decoy, b"\xff\xfe")  # not UTF-8
    assert not check_password(None, decoy, b"decoy")  # an unknown user never passes
