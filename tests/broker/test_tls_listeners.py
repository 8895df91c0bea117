"""TLS on the broker's client port, admin port and between brokers (issue 25): real broker
processes, certificates from a trustme test CA, ``openssl s_client`` and Python's ``ssl``."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trustme
from cryptography import x509

from kafkaesque.broker._shutdown import Draining
from kafkaesque.broker._tls import ClientPortGate, TlsRefusals
from kafkaesque.local_cluster import LocalCluster, parse_samples
from kafkaesque.protocol import BrokerRow, ErrorCode, ErrorReply, MessageRow, OkReply, ReplyDecoder

from .line_client import LineClient

_RETRY_S = 30.0


class Certificates:
    """A test CA and one certificate for 127.0.0.1 and localhost, in PEM files of ``directory``
    (``issue`` writes a new one over them)."""

    def __init__(self, directory: Path, ca: trustme.CA | None = None) -> None:
        self.ca = ca or trustme.CA()
        self.ca_file = directory / "ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_file))
        self.cert_file = directory / "broker.pem"
        self.key_file = directory / "broker.key"
        self.serial = self.issue()

    def issue(self) -> int:
        """Write a new certificate and key over the files; its serial number."""
        cert = self.ca.issue_cert("127.0.0.1", "localhost")
        chain = b"".join(blob.bytes() for blob in cert.cert_chain_pems)
        for path, data in ((self.cert_file, chain), (self.key_file, cert.private_key_pem.bytes())):
            temporary = path.with_suffix(".tmp")
            temporary.write_bytes(data)
            temporary.replace(path)  # whole, as a renewal tool would
        return x509.load_pem_x509_certificate(chain).serial_number

    def args(self) -> list[str]:
        return [
            "--tls-cert", str(self.cert_file),
            "--tls-key", str(self.key_file),
            "--tls-ca", str(self.ca_file),
        ]  # fmt: skip

    def client_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))


class TlsLineClient(LineClient):
    """``LineClient`` over TLS, the broker checked against the test CA and its IP address."""

    def __init__(self, address: tuple[str, int], context: ssl.SSLContext) -> None:
        raw = socket.create_connection(address, timeout=30)
        self.sock = context.wrap_socket(raw, server_hostname=address[0])
        self.decoder = ReplyDecoder()


class TlsCluster(LocalCluster):
    """``LocalCluster`` whose client and admin ports speak TLS: readiness asked over TLS."""

    def __init__(self, data_dir: str, n: int, certs: Certificates, **kwargs: Any) -> None:
        super().__init__(data_dir, n, **kwargs)
        self.certs = certs

    def _registered(self, broker: int) -> int:
        with TlsLineClient(self.client_address(broker), self.certs.client_context()) as client:
            client.send("METADATA\r\n")
            rows = client.answer()
        return sum(isinstance(row, BrokerRow) for row in rows) if isinstance(rows, list) else 0

    def scrape(self, broker: int) -> list[tuple[str, dict[str, str], float]]:
        url = f"https://127.0.0.1:{self.ports[broker].admin}/metrics"
        context = self.certs.client_context()
        with urllib.request.urlopen(url, timeout=10, context=context) as reply:
            samples: list[tuple[str, dict[str, str], float]] = parse_samples(reply.read().decode())
        return samples


def metric(samples: list[tuple[str, dict[str, str], float]], name: str, **labels: str) -> float:
    return sum(v for n, got, v in samples if n == name and labels.items() <= got.items())


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return Certificates(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def tls_cluster(
    tmp_path_factory: pytest.TempPathFactory, certs: Certificates
) -> Iterator[TlsCluster]:
    """Three brokers: mutual TLS between them, TLS on their client and admin ports."""
    args = [*certs.args(), "--client-tls", "--admin-tls", "--peer-tls"]
    data = str(tmp_path_factory.mktemp("tls"))
    with TlsCluster(data, 3, certs, extra_args=args) as cluster:
        yield cluster


def until_ok(client: LineClient, line: str) -> Any:
    """Send ``line`` until it is not a retriable error (leaders being elected), bounded."""
    deadline = time.monotonic() + _RETRY_S
    while True:
        client.send(line + "\r\n")
        answer = client.answer()
        retriable = (ErrorCode.NOT_READY, ErrorCode.NO_QUORUM, ErrorCode.NOT_LEADER)
        if not (isinstance(answer, ErrorReply) and answer.code in retriable):
            return answer
        assert time.monotonic() < deadline, answer
        time.sleep(0.2)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_openssl_s_client_shakes_hands_and_pings(
    tls_cluster: TlsCluster, certs: Certificates
) -> None:
    _, port = tls_cluster.client_address(0)
    result = subprocess.run(
        [
            "openssl", "s_client",
            "-connect", f"127.0.0.1:{port}",
            "-CAfile", str(certs.ca_file),
            "-verify_ip", "127.0.0.1",
            "-verify_return_error",
            "-ign_eof",  # read until the broker closes (after QUIT)
        ],
        input=b"PING\r\nQUIT\r\n",
        capture_output=True,
        timeout=30,
        check=False,
    )  # fmt: skip
    out = result.stdout.decode(errors="replace")
    assert result.returncode == 0, out + result.stderr.decode(errors="replace")
    assert "Verify return code: 0 (ok)" in out
    assert "+OK PONG\r\n" in out


def test_a_plaintext_client_on_the_tls_port_is_told(tls_cluster: TlsCluster) -> None:
    with socket.create_connection(tls_cluster.client_address(1), timeout=30) as sock:
        sock.sendall(b"PING\r\n")
        data = b""
        while chunk := sock.recv(4096):
            data += chunk
    assert data == b"-ERR BAD_ARGS this port speaks TLS: connect with TLS (docs/security.md)\r\n"
    samples = tls_cluster.scrape(1)
    assert metric(samples, "kafkaesque_tls_refused_total", reason="plaintext") >= 1


def test_the_cluster_elects_and_serves_pubs_and_fetch_over_tls(
    tls_cluster: TlsCluster, certs: Certificates
) -> None:
    context = certs.client_context()
    with TlsLineClient(tls_cluster.client_address(0), context) as client:
        assert isinstance(until_ok(client, "CREATE tls-orders 3 3"), OkReply)
        written = {}
        for i in range(6):
            answer = until_ok(client, f"PUBS tls-orders order-{i}")
            assert isinstance(answer, OkReply), answer
            partition, offset = map(int, answer.text.split())
            written[f"order-{i}"] = (partition, offset)
    read: dict[str, tuple[int, int]] = {}
    with TlsLineClient(tls_cluster.client_address(2), context) as client:  # another broker
        for partition in range(3):
            rows = until_ok(client, f"FETCH tls-orders {partition} 0 format=text")
            assert isinstance(rows, list), rows
            for row in rows:
                if isinstance(row, MessageRow):
                    read[(row.value or b"").decode()] = (partition, row.offset)
    assert read == written
    # The peers talk TLS: none refused another.
    for broker in range(3):
        assert metric(tls_cluster.scrape(broker), "kafkaesque_peer_connections_refused_total") == 0


def test_metrics_over_https_only(tls_cluster: TlsCluster) -> None:
    samples = tls_cluster.scrape(0)
    assert metric(samples, "kafkaesque_client_connections_total") >= 1
    port = tls_cluster.ports[0].admin
    with pytest.raises(OSError):  # plain HTTP gets no answer: the handshake fails
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read()
    assert metric(tls_cluster.scrape(0), "kafkaesque_tls_refused_total", listener="admin") >= 1


def peer_serial(address: tuple[str, int], context: ssl.SSLContext) -> int:
    with (
        socket.create_connection(address, timeout=30) as raw,
        context.wrap_socket(raw, server_hostname=address[0]) as sock,
    ):
        der = sock.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def test_a_renewed_certificate_is_served_to_new_connections(
    tls_cluster: TlsCluster, certs: Certificates
) -> None:
    context = certs.client_context()
    address = tls_cluster.client_address(0)
    before = peer_serial(address, context)
    assert before == certs.serial
    renewed = certs.issue()
    assert renewed != before
    deadline = time.monotonic() + _RETRY_S
    while (seen := peer_serial(address, context)) != renewed:  # checked once a second
        assert seen == before
        assert time.monotonic() < deadline, "the renewed certificate was never served"
        time.sleep(0.2)
    with TlsLineClient(address, context) as client:
        client.send("PING\r\n")
        assert client.answer() == OkReply("PONG")


def test_a_tls_client_on_a_plain_port_fails_cleanly(tmp_path: Path, certs: Certificates) -> None:
    with LocalCluster(str(tmp_path), 1) as cluster:
        address = cluster.client_address(0)
        context = certs.client_context()
        raw = socket.create_connection(address, timeout=30)
        with pytest.raises((ssl.SSLError, ConnectionError)):  # closed without a reply
            context.wrap_socket(raw, server_hostname=address[0])
        raw.close()
        with LineClient(address) as client:  # the broker still serves
            client.send("PING\r\n")
            assert client.answer() == OkReply("PONG")
        assert metric(cluster.scrape(0), "kafkaesque_tls_refused_total", reason="tls") == 1


def test_a_broker_with_another_cas_certificate_never_joins_the_raft_transport(
    tmp_path: Path, certs: Certificates
) -> None:
    """Broker 2's certificate (and the CA it trusts) is another CA's: brokers 0 and 1 refuse
    its peer connections, count them, and serve on between themselves."""
    (tmp_path / "stranger").mkdir()
    stranger = Certificates(tmp_path / "stranger")

    class Mixed(LocalCluster):
        def command(self, broker: int) -> list[str]:
            tls = (stranger if broker == 2 else certs).args()
            return [*super().command(broker), *tls, "--peer-tls"]

    with Mixed(str(tmp_path / "data"), 3) as cluster:
        with LineClient(cluster.client_address(0)) as client:
            assert isinstance(until_ok(client, "CREATE peers-tls 2 3"), OkReply)
            for i in range(4):
                assert isinstance(until_ok(client, f"PUBS peers-tls m{i}"), OkReply)
        with LineClient(cluster.client_address(1)) as client:
            got = []
            for partition in range(2):
                rows = until_ok(client, f"FETCH peers-tls {partition} 0 format=text")
                got += [row.value or b"" for row in rows if isinstance(row, MessageRow)]
        assert sorted(got) == [b"m0", b"m1", b"m2", b"m3"]
        refused = sum(
            metric(cluster.scrape(b), "kafkaesque_peer_connections_refused_total") for b in (0, 1)
        )
        assert refused >= 2  # brokers 0 and 1 both dial broker 2, and are refused or refuse
        assert "TLS handshake failed" in Path(cluster.log_path(0)).read_text()


# -- in process: the gate before a session --------------------------------------------------------


async def test_a_connection_that_never_spoke_is_closed_by_the_drain() -> None:
    """A plain port's gate waits for a client's first bytes without a bound (a pooled
    connection may stay quiet), but counts among the connections a drain waits for, and the
    drain ends that wait: the client reads the end of the stream."""
    draining = Draining()
    gate = ClientPortGate(None, TlsRefusals(), draining)
    [listener] = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listener.socket.getsockname()[1]
    admitted: list[trio.abc.Stream | None] = []
    async with trio.open_nursery() as nursery:

        async def admit_one() -> None:
            admitted.append(await gate.admit(await listener.accept()))

        nursery.start_soon(admit_one)
        client = await trio.open_tcp_stream("127.0.0.1", port)
        with trio.fail_after(10):
            while not draining.open:  # the gate is waiting for the first bytes
                await trio.sleep(0.01)
            draining.begin()
            await draining.wait_closed()
            assert await client.receive_some(100) == b""
    assert admitted == [None]
    await client.aclose()
    await listener.aclose()
