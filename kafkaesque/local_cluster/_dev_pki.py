"""A development PKI for local clusters: a CA, a certificate per broker, a users file.

``kafkaesque jepsen --secure``, ``kafkaesque demo --secure`` and the benchmarks start brokers
with TLS on the client and peer ports and SCRAM users; they need certificates that a real CA
would sign and a users file, made here with the ``cryptography`` package (a dependency of
pysyncobj) and written as PEM into one directory:

- ``ca.pem`` (the CA's certificate: the clients' and brokers' trust anchor) and
  ``ca-key.pem``;
- ``broker-<N>.pem`` and ``broker-<N>-key.pem`` per broker: its certificate, with the subject
  alternative names 127.0.0.1 and localhost (or the addresses given), usable as a server and as a
  client certificate (the peer transport is mutual TLS);
- ``users`` (``write_users``): salted SCRAM-SHA-256 entries, never a password.

``DevSecurity`` puts them together for one local cluster (one certificate every broker shares,
a user, the client's ``Security``) and ``SecureCluster`` is ``LocalCluster`` with brokers that
speak TLS on the client and peer ports and ask clients to authenticate (SCRAM), for
``kafkaesque demo --secure``, the benchmark and the tests.

This is for development and tests only: the keys are unencrypted, readable by the owner only,
and the CA key sits beside the certificates (docs/security.md says how to make real ones).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
import ssl
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kafkaesque.client import ClientConfig

from ._launcher import LocalCluster, one_attempt

DEFAULT_HOSTS = ("127.0.0.1", "localhost")
_VALID_DAYS = 30  # long enough for any local run, short enough not to matter if it leaks
_CA_FILE = "ca.pem"


@dataclass(frozen=True)
class BrokerCertificate:
    """The PEM files of one broker's certificate and key."""

    cert: str
    key: str


@dataclass(frozen=True)
class DevPki:
    """Where ``make_dev_pki`` wrote its files: ``ca`` (PEM) and one certificate per broker."""

    directory: str
    ca: str
    brokers: dict[int, BrokerCertificate]

    def broker_args(self, node_id: int) -> list[str]:
        """The ``kafkaesque broker`` flags for broker ``node_id``'s certificate and the CA."""
        mine = self.brokers[node_id]
        return ["--tls-cert", mine.cert, "--tls-key", mine.key, "--tls-ca", self.ca]


def make_dev_pki(
    directory: str, brokers: Iterable[int], *, hosts: Sequence[str] = DEFAULT_HOSTS
) -> DevPki:
    """Write a fresh CA and a certificate for each broker id in ``brokers`` into ``directory``
    (made if missing; files already there are replaced). ``hosts`` are each certificate's
    subject alternative names: IP addresses become IP SANs, the others DNS names."""
    os.makedirs(directory, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Kafkaesque development CA")])
    ca_cert = (
        _builder(ca_name, ca_name, ca_key.public_key(), now)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_path = os.path.join(directory, _CA_FILE)
    _write(ca_path, ca_cert.public_bytes(serialization.Encoding.PEM))
    _write(os.path.join(directory, "ca-key.pem"), _key_pem(ca_key))
    sans = _alternative_names(hosts)
    issued: dict[int, BrokerCertificate] = {}
    for node_id in brokers:
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"broker-{node_id}")])
        cert = (
            _builder(name, ca_name, key.public_key(), now)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(ca=False), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
            )
            .sign(ca_key, hashes.SHA256())
        )
        mine = BrokerCertificate(
            cert=os.path.join(directory, f"broker-{node_id}.pem"),
            key=os.path.join(directory, f"broker-{node_id}-key.pem"),
        )
        _write(mine.cert, cert.public_bytes(serialization.Encoding.PEM))
        _write(mine.key, _key_pem(key))
        issued[node_id] = mine
    return DevPki(directory=directory, ca=ca_path, brokers=issued)


def write_users(path: str, users: dict[str, str]) -> None:
    """Write a users file (``kafkaesque broker --users-file``) of ``users`` (name -> password):
    salted SCRAM-SHA-256 credentials, as ``kafkaesque user add`` writes them."""
    from kafkaesque.security import derive_credential, save_users

    save_users(path, {name: derive_credential(password) for name, password in users.items()})


def random_secret(nbytes: int = 24) -> str:
    """A random password or cluster secret (URL-safe text, ``nbytes`` of entropy)."""
    return secrets.token_urlsafe(nbytes)


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    now: datetime.datetime,
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))  # clocks a little apart
        .not_valid_after(now + datetime.timedelta(days=_VALID_DAYS))
    )


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=not ca,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def _alternative_names(hosts: Sequence[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, 0o600)  # an existing file keeps its mode through O_CREAT


@dataclass(frozen=True)
class DevSecurity:
    """A local cluster's security: one certificate every broker of it presents (SANs 127.0.0.1
    and localhost: they all listen there), a users file with one user, and the flags and client
    settings that go with them."""

    pki: DevPki
    users_file: str
    username: str
    password: str = field(repr=False)

    @classmethod
    def files(
        cls,
        directory: str,
        username: str,
        brokers: Iterable[int] = (0,),
        hosts: Sequence[str] = DEFAULT_HOSTS,
    ) -> tuple[DevPki, str, str]:
        """Write the PKI (``<directory>/pki``, a certificate per broker id in ``brokers``
        naming ``hosts``) and the users file (``<directory>/users``) with ``username`` and a
        random password: the PKI, the users file's path, the password."""
        pki = make_dev_pki(os.path.join(directory, "pki"), brokers, hosts=hosts)
        password = random_secret()
        users_file = os.path.join(directory, "users")
        write_users(users_file, {username: password})
        return pki, users_file, password

    @classmethod
    def make(cls, directory: str, username: str = "demo") -> DevSecurity:
        """``files`` for one certificate every broker of a loopback cluster shares."""
        pki, users_file, password = cls.files(directory, username)
        return cls(pki, users_file, username, password)

    def broker_args(self, node: int = 0, *, super_user: bool = True) -> list[str]:
        """The ``kafkaesque broker`` flags: broker ``node``'s certificate, TLS on the client and
        peer ports, the users file, and (``super_user``) the user as a super user."""
        return [
            *self.pki.broker_args(node),
            "--client-tls", "--peer-tls",
            "--users-file", self.users_file,
            *(["--super-users", f"User:{self.username}"] if super_user else []),
        ]  # fmt: skip

    def client_security(self) -> Any:
        """``kafkaesque.client.Security``: SASL_SSL with SCRAM-SHA-256 as the user."""
        from kafkaesque.client import Security

        return Security(
            protocol="SASL_SSL",
            sasl_mechanism="SCRAM-SHA-256",
            username=self.username,
            password=self.password,
            ssl_cafile=self.pki.ca,
        )

    def client_config(self, **settings: Any) -> Any:
        """A ``kafkaesque.client.ClientConfig`` with ``client_security`` and ``settings``."""
        from kafkaesque.client import ClientConfig

        return ClientConfig(security=self.client_security(), **settings)

    def ssl_context(self) -> ssl.SSLContext:
        """A client context that trusts the CA (and checks the broker's name)."""
        return ssl.create_default_context(cafile=self.pki.ca)


class SecureCluster(LocalCluster):
    """``LocalCluster`` whose brokers speak TLS on the client and peer ports and require SCRAM
    (``security.broker_args``); its own questions (readiness) go over TLS as the user.
    ``extra_args`` come after the security flags.

    ``mqtt_tls`` (with ``mqtt=True``): each broker's MQTT listener (``mqtt_address``) speaks
    TLS with the same certificate, and devices authenticate against the same users file."""

    def __init__(
        self,
        data_dir: str,
        n: int = 3,
        *,
        security: DevSecurity,
        mqtt_tls: bool = False,
        **kwargs: Any,
    ) -> None:
        extra = kwargs.pop("extra_args", None) or []
        super().__init__(data_dir, n, extra_args=[*security.broker_args(), *extra], **kwargs)
        self.security = security
        self.mqtt_tls = mqtt_tls

    def command(self, broker: int) -> list[str]:
        command = super().command(broker)
        if self.mqtt and self.mqtt_tls:
            at = command.index("--mqtt-listen")
            cert = self.security.pki.brokers[0]
            command[at] = "--mqtt-tls-listen"
            command += ["--mqtt-tls-cert", cert.cert, "--mqtt-tls-key", cert.key]
            command += ["--mqtt-users", self.security.users_file]
        return command

    def client_config(self, timeout: float) -> ClientConfig:
        """One attempt within ``timeout``, over TLS as the cluster's user."""
        return one_attempt(timeout, self.security.client_security())
