"""MQTT over TLS (``--mqtt-tls-listen``): real paho clients against a real broker, with
certificates from a test CA (trustme); with ``--mqtt-tls-client-ca``, devices must present a
certificate that CA signed (mutual TLS)."""

from __future__ import annotations

import socket
import ssl
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as paho
import pytest
import trustme

from kafkaesque.client import Client
from kafkaesque.local_cluster import LocalCluster, free_ports
from kafkaesque.protocol.mqtt import Connect, MqttVersion, encode_mqtt

from .mqtt_helpers import RULES, PahoDevice, assert_round_trip, keyed_records

PLAIN_CONNECT = encode_mqtt(Connect("raw-device", keep_alive=60), MqttVersion.V311)


class Certificates:
    """A test CA, the broker's certificate for 127.0.0.1, and a device's certificate."""

    def __init__(self, directory: Path) -> None:
        self.ca = trustme.CA()
        self.ca_file = directory / "ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_file))
        server = self.ca.issue_cert("127.0.0.1")
        self.server_file = directory / "broker.pem"
        self.server_key = directory / "broker.key"
        for blob in server.cert_chain_pems:
            blob.write_to_path(str(self.server_file), append=True)
        server.private_key_pem.write_to_path(str(self.server_key))
        self.device_file = directory / "device.pem"
        self.ca.issue_cert("device-1").private_key_and_cert_chain_pem.write_to_path(
            str(self.device_file)
        )


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return Certificates(tmp_path_factory.mktemp("certs"))


def tls_cluster(data: str, certs: Certificates, *, client_ca: bool) -> tuple[LocalCluster, int]:
    [port] = free_ports(1)
    args = [
        "--mqtt-tls-listen", f"127.0.0.1:{port}",
        "--mqtt-tls-cert", str(certs.server_file),
        "--mqtt-tls-key", str(certs.server_key),
    ]  # fmt: skip
    if client_ca:
        args += ["--mqtt-tls-client-ca", str(certs.ca_file)]
    return LocalCluster(data, 1, mqtt=True, mqtt_rules=RULES, extra_args=args), port


@pytest.fixture(scope="module")
def server_tls(
    tmp_path_factory: pytest.TempPathFactory, certs: Certificates
) -> Iterator[tuple[LocalCluster, int]]:
    cluster, port = tls_cluster(str(tmp_path_factory.mktemp("tls")), certs, client_ca=False)
    with cluster:
        yield cluster, port


def tls_device(
    port: int, client_id: str, certs: Certificates, *, device_cert: bool = False
) -> PahoDevice:
    def secure(client: paho.Client) -> None:
        client.tls_set(
            ca_certs=str(certs.ca_file),
            certfile=str(certs.device_file) if device_cert else None,
        )

    return PahoDevice(("127.0.0.1", port), client_id, configure=secure)


def test_a_device_publishes_and_subscribes_over_tls(
    server_tls: tuple[LocalCluster, int], certs: Certificates
) -> None:
    cluster, port = server_tls
    device = f"phone-{uuid.uuid4().hex[:8]}"
    assert_round_trip(tls_device(port, device, certs), device, cluster.bootstrap)


def test_metadata_says_where_a_broker_listens_for_mqtt(
    server_tls: tuple[LocalCluster, int],
) -> None:
    cluster, port = server_tls
    with Client(cluster.bootstrap) as client:
        broker = client.refresh_metadata().brokers[0]
    assert (broker.mqtt_port, broker.mqtt_tls_port) == (cluster.mqtt_address(0)[1], port)


def test_mosquitto_pub_publishes_over_tls(
    server_tls: tuple[LocalCluster, int], certs: Certificates
) -> None:
    """What docs/mqtt.md shows: the broker's TLS flags, and mosquitto_pub --cafile."""
    cluster, port = server_tls
    device = f"phone-{uuid.uuid4().hex[:8]}"
    subprocess.run(
        ["mosquitto_pub", "-h", "127.0.0.1", "-p", str(port), "--cafile", str(certs.ca_file),
         "-q", "1", "-t", f"phones/{device}/spectrum", "-m", "-71"],
        check=True, timeout=30,
    )  # fmt: skip
    records = keyed_records(cluster.bootstrap, "readings", device)
    assert [r.value for r in records] == [b"-71"]


def test_plain_mqtt_on_the_tls_port_is_refused_and_harms_no_one(
    server_tls: tuple[LocalCluster, int], certs: Certificates
) -> None:
    cluster, port = server_tls
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(PLAIN_CONNECT)
        sock.settimeout(10)
        try:
            answer = sock.recv(1024)
        except ConnectionResetError:
            answer = b""
        assert not answer.startswith(b"\x20")  # no CONNACK: the TLS handshake failed
    # The TLS and the plain listener both still serve.
    device = tls_device(port, "after-garbage", certs)
    plain = PahoDevice(cluster.mqtt_address(0), "plain-device")
    try:
        device.wait_connected()
        plain.wait_connected()
        assert device.connack == [0] and plain.connack == [0]
    finally:
        device.close()
        plain.close()


def test_with_a_client_ca_a_device_needs_a_certificate_it_signed(
    tmp_path: Path, certs: Certificates
) -> None:
    cluster, port = tls_cluster(str(tmp_path), certs, client_ca=True)
    with cluster:
        signed = tls_device(port, "signed-device", certs, device_cert=True)
        try:
            signed.wait_connected()
            assert signed.connack == [0]
        finally:
            signed.close()
        # Without a certificate the handshake fails: paho never gets a CONNACK.
        context = ssl.create_default_context(cafile=str(certs.ca_file))
        with (
            socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
            pytest.raises((ssl.SSLError, ConnectionResetError)),
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            tls.sendall(PLAIN_CONNECT)
            if not tls.recv(1024):  # TLS 1.3: the refusal comes with the first read
                raise ConnectionResetError("closed without a CONNACK")
