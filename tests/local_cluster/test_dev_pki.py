"""The development PKI (local_cluster): its certificates pass a real TLS handshake, both ways
(mutual TLS, as the peer transport does), checked against 127.0.0.1 and localhost; a certificate
from another development CA is refused; the users file it writes loads."""

from __future__ import annotations

import os
import socket
import ssl
import stat
import threading
from pathlib import Path

import pytest

from kafkaesque.local_cluster import DevPki, make_dev_pki, random_secret, write_users


def _server_context(pki: DevPki, node_id: int) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki.brokers[node_id].cert, pki.brokers[node_id].key)
    context.load_verify_locations(pki.ca)
    context.verify_mode = ssl.CERT_REQUIRED  # mutual TLS, as --peer-tls
    return context


def _client_context(pki: DevPki, ca: str, node_id: int) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=ca)
    context.load_cert_chain(pki.brokers[node_id].cert, pki.brokers[node_id].key)
    return context


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext, hostname: str) -> bytes:
    """Both ends of a socketpair shake hands (the server in a thread) and the client reads one
    line the server sends over TLS; an error on either side is raised here."""
    left, right = socket.socketpair()
    left.settimeout(10.0)
    right.settimeout(10.0)
    errors: list[BaseException] = []

    def serve() -> None:
        try:
            with server.wrap_socket(left, server_side=True) as tls:
                tls.sendall(b"+PONG\r\n")
        except (OSError, ssl.SSLError) as exc:
            errors.append(exc)

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        with client.wrap_socket(right, server_hostname=hostname) as tls:
            return tls.recv(64)
    finally:
        right.close()
        thread.join(timeout=10.0)
        left.close()
        assert not thread.is_alive()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> DevPki:
    return make_dev_pki(str(tmp_path_factory.mktemp("pki")), [1, 2])


@pytest.mark.parametrize("hostname", ["127.0.0.1", "localhost"])
def test_a_broker_certificate_passes_a_mutual_handshake(pki: DevPki, hostname: str) -> None:
    assert _handshake(_server_context(pki, 1), _client_context(pki, pki.ca, 2), hostname) == (
        b"+PONG\r\n"
    )


def test_a_name_not_in_the_certificate_is_refused(pki: DevPki) -> None:
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(_server_context(pki, 1), _client_context(pki, pki.ca, 2), "example.com")


def test_another_ca_is_not_trusted(pki: DevPki, tmp_path: Path) -> None:
    other = make_dev_pki(str(tmp_path / "other"), [1])
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(_server_context(other, 1), _client_context(pki, pki.ca, 2), "127.0.0.1")


def test_hosts_become_the_alternative_names(tmp_path: Path) -> None:
    pki = make_dev_pki(str(tmp_path), [7], hosts=["10.1.2.3", "broker7.example"])
    server = _server_context(pki, 7)
    for name in ("10.1.2.3", "broker7.example"):
        assert _handshake(server, _client_context(pki, pki.ca, 7), name) == b"+PONG\r\n"
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(server, _client_context(pki, pki.ca, 7), "127.0.0.1")


def test_files_are_private_and_flags_name_them(pki: DevPki) -> None:
    for path in (pki.ca, pki.brokers[1].cert, pki.brokers[1].key):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert pki.broker_args(2) == [
        "--tls-cert", pki.brokers[2].cert, "--tls-key", pki.brokers[2].key, "--tls-ca", pki.ca,
    ]  # fmt: skip


def test_the_users_file_holds_no_password_and_loads(tmp_path: Path) -> None:
    security = pytest.importorskip("kafkaesque.security")
    password = random_secret()
    path = str(tmp_path / "users")
    write_users(path, {"jepsen": password})
    text = Path(path).read_text()
    assert password not in text
    users = security.load_users(path)
    assert set(users) == {"jepsen"}
    assert security.verify_password(users["jepsen"], password)
    assert not security.verify_password(users["jepsen"], password + "x")


def test_a_secure_cluster_answers_its_user_over_tls_only(tmp_path: Path) -> None:
    from kafkaesque.client import Client, KafkaesqueError
    from kafkaesque.local_cluster import DevSecurity, SecureCluster

    security = DevSecurity.make(str(tmp_path / "security"), username="tester")
    with SecureCluster(str(tmp_path / "cluster"), 1, security=security) as cluster:
        address = cluster.client_address(0)
        with Client.pinned(address, config=cluster.client_config(10)) as client:
            assert 0 in client.refresh_metadata().brokers
        # Plaintext on the TLS port is told so; a wrong password is refused.
        assert _plaintext_ping(address).startswith(b"-ERR BAD_ARGS this port speaks TLS")
        wrong = DevSecurity(security.pki, security.users_file, "tester", "not-the-password")
        with (
            pytest.raises(KafkaesqueError, match="AUTH_FAILED"),
            Client.pinned(address, config=wrong.client_config()) as client,
        ):
            client.refresh_metadata()


def _plaintext_ping(address: tuple[str, int]) -> bytes:
    """``PING`` in plaintext, on purpose a raw socket: the client would speak TLS to a TLS port
    (as it should), and what is tested is the broker's answer to a client that does not."""
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(b"PING\r\n")
        data = b""
        while not data.endswith(b"\r\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        return data
