"""TLS contexts: a handshake between our server and client contexts (in memory, ssl.MemoryBIO),
verification against the right CA only, mutual TLS, and a certificate renewed without a restart."""

from __future__ import annotations

import logging
import os
import ssl
from pathlib import Path

import pytest
import trustme

from kafkaesque.security import ReloadingContext, client_context, server_context


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Pki:
    """A CA and files for a server's certificate and key, and a client's (one PEM)."""

    def __init__(self, directory: Path, name: str = "ca") -> None:
        self.directory = directory
        self.ca = trustme.CA()
        self.ca_file = str(directory / f"{name}.pem")
        self.ca.cert_pem.write_to_path(self.ca_file)
        self.server_cert = str(directory / f"{name}-server.pem")
        self.server_key = str(directory / f"{name}-server.key")
        self.issue_server(self.server_cert, self.server_key)
        self.client_pem = str(directory / f"{name}-client.pem")
        self.ca.issue_cert("client-1").private_key_and_cert_chain_pem.write_to_path(self.client_pem)

    def issue_server(self, cert_path: str, key_path: str) -> None:
        cert = self.ca.issue_cert("127.0.0.1", "localhost")
        with open(cert_path, "wb") as f:
            for blob in cert.cert_chain_pems:
                f.write(blob.bytes())
        cert.private_key_pem.write_to_path(key_path)


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path, "ca")


@pytest.fixture
def other(tmp_path: Path) -> Pki:
    return Pki(tmp_path, "other")


def handshake(
    server: ssl.SSLContext, client: ssl.SSLContext, hostname: str = "127.0.0.1"
) -> tuple[ssl.SSLObject, ssl.SSLObject]:
    """Both sides of a handshake over memory BIOs, then one byte each way; raises the first
    side's ssl.SSLError. Returns (server side, client side)."""
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    from_server, from_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    s = server.wrap_bio(to_server, from_server, server_side=True)
    c = client.wrap_bio(to_client, from_client, server_hostname=hostname)
    done = {"s": False, "c": False}
    for _ in range(20):  # a TLS handshake takes a few flights
        for side, obj in (("c", c), ("s", s)):
            if not done[side]:
                try:
                    obj.do_handshake()
                    done[side] = True
                except ssl.SSLWantReadError:
                    pass
        to_server.write(from_client.read())
        to_client.write(from_server.read())
        if all(done.values()):
            break
    assert all(done.values()), "the handshake did not finish"
    # TLS 1.3: the server checks a client certificate after the client thinks it is done; the
    # data exchange makes every refusal show.
    c.write(b"x")
    to_server.write(from_client.read())
    assert s.read(1) == b"x"
    s.write(b"y")
    to_client.write(from_server.read())
    assert c.read(1) == b"y"
    return s, c


def test_server_and_client_contexts_talk(pki: Pki) -> None:
    server = server_context(pki.server_cert, pki.server_key)
    client = client_context(pki.ca_file)
    assert server.minimum_version == client.minimum_version == ssl.TLSVersion.TLSv1_2
    _, c = handshake(server, client)
    assert c.version() in ("TLSv1.2", "TLSv1.3")
    handshake(server, client, hostname="localhost")


def test_key_inside_the_certificate_file(pki: Pki, tmp_path: Path) -> None:
    both = tmp_path / "both.pem"
    both.write_bytes(Path(pki.server_key).read_bytes() + Path(pki.server_cert).read_bytes())
    handshake(server_context(str(both), None), client_context(pki.ca_file))


def test_a_client_with_another_ca_fails(pki: Pki, other: Pki) -> None:
    server = server_context(pki.server_cert, pki.server_key)
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(server, client_context(other.ca_file))


def test_the_name_is_checked_unless_told_not_to(pki: Pki) -> None:
    server = server_context(pki.server_cert, pki.server_key)
    with pytest.raises(ssl.SSLCertVerificationError, match=r"match"):
        handshake(server, client_context(pki.ca_file), hostname="10.1.2.3")
    handshake(server, client_context(pki.ca_file, check_hostname=False), hostname="10.1.2.3")
    # Even without the name check, the chain is verified.
    client = client_context(pki.ca_file, check_hostname=False)
    assert client.verify_mode == ssl.CERT_REQUIRED


def test_mutual_tls(pki: Pki, other: Pki) -> None:
    server = server_context(
        pki.server_cert, pki.server_key, client_ca=pki.ca_file, require_client_cert=True
    )
    s, _ = handshake(server, client_context(pki.ca_file, cert=pki.client_pem))
    peer = s.getpeercert()
    assert peer is not None and "client-1" in str(peer.get("subjectAltName"))
    with pytest.raises(ssl.SSLError):
        handshake(server, client_context(pki.ca_file))  # no certificate
    with pytest.raises(ssl.SSLError):
        handshake(server, client_context(pki.ca_file, cert=other.client_pem))  # another CA


def test_optional_client_certificate(pki: Pki, other: Pki) -> None:
    server = server_context(pki.server_cert, pki.server_key, client_ca=pki.ca_file)
    s, _ = handshake(server, client_context(pki.ca_file))
    assert not s.getpeercert()
    s, _ = handshake(server, client_context(pki.ca_file, cert=pki.client_pem))
    assert s.getpeercert()
    with pytest.raises(ssl.SSLError):  # presented, so checked
        handshake(server, client_context(pki.ca_file, cert=other.client_pem))


def test_bad_arguments(pki: Pki) -> None:
    with pytest.raises(ValueError, match="client_ca"):
        server_context(pki.server_cert, pki.server_key, require_client_cert=True)
    with pytest.raises(ValueError, match="cert"):
        client_context(pki.ca_file, key=pki.server_key)
    with pytest.raises(ssl.SSLError):
        server_context(pki.ca_file, pki.server_key)  # a certificate that is not the key's
    with pytest.raises(OSError):
        server_context(pki.server_cert + ".absent", None)


def bump(*paths: str) -> None:
    """A later mtime, as a renewal by a tool that writes within the same second would not."""
    for path in paths:
        st = os.stat(path)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))


def test_reloading_context_picks_up_a_renewed_certificate(pki: Pki, other: Pki) -> None:
    clock = Clock()
    reloading = ReloadingContext(pki.server_cert, pki.server_key, clock=clock)
    context = reloading.context
    handshake(context, client_context(pki.ca_file))
    # Renewed (here by another CA, so the clients can tell which one they got).
    other.issue_server(pki.server_cert, pki.server_key)
    bump(pki.server_cert, pki.server_key)
    assert reloading.context is context
    handshake(context, client_context(pki.ca_file))  # not checked again within the second
    clock.now += 1.0
    assert reloading.context is context  # the same object: listeners keep theirs
    assert reloading.reloads == 1
    handshake(context, client_context(other.ca_file))
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(context, client_context(pki.ca_file))


def test_reloading_context_keeps_the_old_certificate_when_a_reload_fails(
    pki: Pki, other: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    reloading = ReloadingContext(pki.server_cert, pki.server_key, clock=clock)
    # A renewal half done: the new certificate, the old key.
    other.issue_server(pki.server_cert, str(Path(pki.server_key).with_suffix(".new")))
    bump(pki.server_cert)
    clock.now += 1.0
    with caplog.at_level(logging.ERROR, logger="kafkaesque.security._tls"):
        context = reloading.context
    assert "not reloaded" in caplog.text
    assert reloading.reloads == 0
    handshake(context, client_context(pki.ca_file))  # still the old pair, still matching
    # The key arrives: the next check loads the pair.
    os.replace(str(Path(pki.server_key).with_suffix(".new")), pki.server_key)
    bump(pki.server_key)
    clock.now += 1.0
    handshake(reloading.context, client_context(other.ca_file))
    assert reloading.reloads == 1


def test_reloading_context_with_mutual_tls(pki: Pki) -> None:
    reloading = ReloadingContext(
        pki.server_cert, pki.server_key, client_ca=pki.ca_file, require_client_cert=True
    )
    with pytest.raises(ssl.SSLError):
        handshake(reloading.context, client_context(pki.ca_file))
    handshake(reloading.context, client_context(pki.ca_file, cert=pki.client_pem))
