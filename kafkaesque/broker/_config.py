"""A broker's settings: who it is, where it listens, who its peers are, and its limits.

Addresses follow Kafka's ``controller.quorum.voters`` spelling, ``id@host:port``, so an operator
who knows Kafka reads them at once. A broker needs the Raft peer address and the controller
(pysyncobj) address of every broker of the cluster, itself included; clients' addresses are
learnt from the broker registry in the metadata.
"""

from __future__ import annotations

import ipaddress
import os
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from kafkaesque.protocol import LineLimits

from ._metadata_view import FSYNC_POLICIES

DEV_CLUSTER_SECRET = "kafkaesque-dev-secret"
"""The built-in development secret: a broker that uses it and listens beyond loopback refuses to
start unless ``insecure`` (everyone knows this secret)."""
MAX_PARTITIONS = 10_000  # partitions of one topic (CREATE refuses more)
INT16_MAX = 2**15 - 1  # the largest replication factor the protocol carries


class ConfigError(ValueError):
    """A setting is missing or malformed; the message names it."""


@dataclass(frozen=True)
class Address:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"

    @classmethod
    def parse(cls, text: str, what: str) -> Address:
        host, sep, port = text.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ConfigError(f"{what}: expected host:port, got {text!r}")
        return cls(host, int(port))


def parse_voters(text: str, what: str) -> dict[int, Address]:
    """``0@127.0.0.1:9093,1@127.0.0.1:9193`` → ``{0: Address, 1: Address}``."""
    voters: dict[int, Address] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        node, sep, addr = part.partition("@")
        if not sep or not node.isdigit():
            raise ConfigError(f"{what}: expected id@host:port, got {part!r}")
        if int(node) in voters:
            raise ConfigError(f"{what}: broker {node} is listed twice")
        voters[int(node)] = Address.parse(addr, what)
    if not voters:
        raise ConfigError(f"{what}: no brokers listed")
    return voters


def format_voters(voters: Mapping[int, Address]) -> str:
    return ",".join(f"{i}@{a}" for i, a in sorted(voters.items()))


KAFKA_PORT_OFFSET = 100
"""The Kafka listener's default port is the client port + this (9092 -> 9192)."""
HTTP_PORT_OFFSET = 200
"""The REST listener's default port is the client port + this (9092 -> 9292; docs/http.md)."""


@dataclass(frozen=True)
class BrokerConfig:
    """Everything one broker process needs. ``validate()`` checks the whole."""

    id: int
    data_dir: str
    client: Address
    peers: Mapping[int, Address]  # Raft transport address of every broker, this one included
    controllers: Mapping[int, Address]  # pysyncobj address of every broker, this one included
    admin: Address | None = None  # /metrics
    mqtt: Address | None = None  # the MQTT listener (disabled when None)
    # The MQTT-over-TLS listener (disabled when None), its certificate chain and key (PEM), and
    # the CA that signs the devices' certificates, if they must present one (mutual TLS).
    mqtt_tls: Address | None = None
    mqtt_tls_cert: str | None = None
    mqtt_tls_key: str | None = None
    mqtt_tls_client_ca: str | None = None
    mqtt_ws: Address | None = None  # the MQTT-over-WebSocket listener (disabled when None)
    # The Kafka protocol listener (docs/kafka.md): on by default, at the client host and the
    # client port + KAFKA_PORT_OFFSET (``kafka_listener``), unless ``kafka_off``.
    kafka: Address | None = None
    kafka_off: bool = False
    # The REST listener (docs/http.md): on by default, at the client host and the client port +
    # HTTP_PORT_OFFSET (``http_listener``), unless ``http_off``.
    http: Address | None = None
    http_off: bool = False
    mqtt_rules: str | None = None  # a file of topic mapping rules (None: the default mapping)
    # Devices' salted users, in users_file's format (None: anonymous devices).
    mqtt_users: str | None = None
    # Log topics the mapping names are created on first use with these (RF capped by brokers).
    mqtt_partitions: int = 6
    mqtt_replication_factor: int = 3
    advertised_host: str | None = None  # the host clients are told (default: client.host)
    cluster_secret: str = DEV_CLUSTER_SECRET
    # Security (docs/security.md). The broker's certificate chain and key (PEM), and the CA that
    # signs the cluster's certificates (brokers' for mutual TLS between peers, clients' if any).
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    client_tls: bool = False  # the client port speaks TLS (only: a plaintext client is refused)
    admin_tls: bool = False  # the admin port (/metrics) speaks HTTPS
    peer_tls: bool = False  # the Raft transport between brokers is mutual TLS over tls_ca
    kafka_tls: bool = False  # the Kafka port speaks TLS (only), with tls_cert (docs/kafka.md)
    http_tls: bool = False  # the REST port speaks HTTPS (only), with tls_cert (docs/http.md)
    # SCRAM-SHA-256 credentials (salted; `kafkaesque user add`): with it, every line-protocol
    # connection must AUTH before anything but PING, HELP and QUIT. None: no authentication.
    users_file: str | None = None
    # Principals ("User:alice") that every ACL check lets through, as Kafka's super.users.
    super_users: tuple[str, ...] = ()
    mqtt_acl_file: str | None = None  # mosquitto acl_file semantics (None: no MQTT ACLs)
    # Failed AUTHs an address may make in auth_failure_window_s before it is refused unheard.
    auth_failure_limit: int = 10
    auth_failure_window_s: float = 60.0
    # Listening beyond loopback without authentication, or with DEV_CLUSTER_SECRET: refused
    # at start unless this is set (`--insecure`).
    insecure: bool = False
    join: bool = False  # a broker added to a running cluster
    # Topics that PUBS, PUB, PUBB and SUBS name are created on first use, as Kafka's
    # auto.create.topics.enable does, with these partitions and replicas (the replication factor
    # is capped at the brokers registered when the creation is applied). False: UNKNOWN_TOPIC.
    auto_create_topics: bool = True
    default_partitions: int = 3
    default_replication_factor: int = 3
    # Partition defaults and limits.
    default_retention_ms: int | None = 7 * 24 * 3600 * 1000
    default_retention_bytes: int | None = None
    segment_bytes: int = 64 * 1024 * 1024
    # When partition logs are fsynced (docs/operations.md, "Durability settings"): "always"
    # (before acknowledging), "interval" (every fsync_interval_ms), "never" (the OS decides).
    # A topic's own fsync setting overrides it.
    fsync: str = "always"
    fsync_interval_ms: int = 1000
    limits: LineLimits = field(default_factory=LineLimits)
    # How long a write may wait for a leader with a quorum before NO_QUORUM / TIMEOUT.
    write_timeout_s: float = 10.0
    retention_check_interval_s: float = 30.0
    # A group member not heard from (SUBS, CONS, COMMIT) for this long leaves its group.
    group_session_timeout_s: float = 10.0
    # How long a Kafka group with no members waits for more after the first JoinGroup before it
    # forms its first generation (Kafka's group.initial.rebalance.delay.ms).
    group_initial_rebalance_delay_s: float = 3.0
    max_connections: int = 15_000
    max_inflight_per_connection: int = 4096
    tick_interval_s: float = 0.05
    # Leader transfers a second this broker may start to give the groups it leads back to their
    # preferred replicas (the first of each partition's replicas); 0: no balancing (_balancer).
    leader_balance_rate: float = 50.0

    def validate(self) -> BrokerConfig:
        if self.id not in self.peers:
            raise ConfigError(f"peers: broker {self.id} itself is not listed")
        if self.id not in self.controllers:
            raise ConfigError(f"controllers: broker {self.id} itself is not listed")
        if set(self.peers) != set(self.controllers) and not self.join:
            raise ConfigError("peers and controllers must list the same brokers")
        if not self.cluster_secret:
            raise ConfigError("cluster_secret must not be empty")
        if not 1 <= self.default_partitions <= MAX_PARTITIONS:
            raise ConfigError(f"default_partitions must be between 1 and {MAX_PARTITIONS}")
        if not 1 <= self.default_replication_factor <= INT16_MAX:
            raise ConfigError(f"default_replication_factor must be between 1 and {INT16_MAX}")
        if self.write_timeout_s <= 0:
            raise ConfigError("write_timeout_s must be positive")
        if self.fsync not in FSYNC_POLICIES:
            raise ConfigError(
                f"fsync must be one of {', '.join(FSYNC_POLICIES)}, not {self.fsync!r}"
            )
        if type(self.fsync_interval_ms) is not int or self.fsync_interval_ms < 1:
            raise ConfigError(
                f"fsync_interval_ms must be a whole number of milliseconds >= 1, "
                f"not {self.fsync_interval_ms!r}"
            )
        if not (
            isinstance(self.leader_balance_rate, int | float) and self.leader_balance_rate >= 0
        ):
            raise ConfigError(
                f"leader_balance_rate must be a number >= 0, not {self.leader_balance_rate!r}"
            )
        if type(self.auth_failure_limit) is not int or self.auth_failure_limit < 0:
            raise ConfigError(
                f"auth_failure_limit must be a whole number >= 0, not {self.auth_failure_limit!r}"
            )
        if not (
            isinstance(self.auth_failure_window_s, int | float) and self.auth_failure_window_s > 0
        ):
            raise ConfigError(
                f"auth_failure_window_s must be a number > 0, not {self.auth_failure_window_s!r}"
            )
        if (
            self.client_tls or self.admin_tls or self.peer_tls or self.kafka_tls or self.http_tls
        ) and self.tls_cert is None:
            raise ConfigError(
                "client_tls, admin_tls, peer_tls, kafka_tls and http_tls need tls_cert "
                "(and tls_key)"
            )
        if self.peer_tls and self.tls_ca is None:
            raise ConfigError("peer_tls needs tls_ca, the CA that signs every broker's certificate")
        if self.mqtt_tls is not None and self.mqtt_tls_cert is None:
            raise ConfigError("mqtt_tls needs mqtt_tls_cert (and mqtt_tls_key unless in it)")
        return self

    @property
    def mqtt_enabled(self) -> bool:
        """Whether devices may connect: over TCP, TLS, WebSocket, or several."""
        return self.mqtt is not None or self.mqtt_tls is not None or self.mqtt_ws is not None

    @property
    def broker_dir(self) -> str:
        """``<data_dir>/<id>``: this broker's partitions live in ``<broker_dir>/<topic>/<p>``."""
        return os.path.join(self.data_dir, str(self.id))

    @property
    def client_host(self) -> str:
        return self.advertised_host or self.client.host

    @property
    def kafka_listener(self) -> Address | None:
        """Where the Kafka protocol listens: ``kafka``, else beside the client port (port 0
        stays 0, any free port); None when ``kafka_off``."""
        if self.kafka_off:
            return None
        if self.kafka is not None:
            return self.kafka
        port = self.client.port + KAFKA_PORT_OFFSET if self.client.port else 0
        return Address(self.client.host, port)

    @property
    def http_listener(self) -> Address | None:
        """Where the REST API listens: ``http``, else beside the client port (port 0 stays 0,
        any free port); None when ``http_off``."""
        if self.http_off:
            return None
        if self.http is not None:
            return self.http
        port = self.client.port + HTTP_PORT_OFFSET if self.client.port else 0
        return Address(self.client.host, port)


def is_loopback(host: str) -> bool:
    """Whether listening on ``host`` keeps a port on this machine: ``localhost``, 127.0.0.0/8,
    ``::1``. A wildcard (``0.0.0.0``, ``::``), another address, or any other name is not."""
    host = host.strip().removeprefix("[").removesuffix("]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve anywhere


def listen_addresses(config: BrokerConfig) -> list[tuple[str, Address]]:
    """Every address ``config`` listens on, by setting name (this broker's own peer and
    controller addresses, not the others')."""
    found = [
        ("client", config.client),
        ("peers", config.peers[config.id]),
        ("controllers", config.controllers[config.id]),
    ]
    optional = [
        ("admin", config.admin),
        ("mqtt", config.mqtt),
        ("mqtt_tls", config.mqtt_tls),
        ("mqtt_ws", config.mqtt_ws),
        ("kafka", config.kafka_listener),
        ("http", config.http_listener),
    ]
    return found + [(name, address) for name, address in optional if address is not None]


_MQTT_LISTENERS = ("mqtt", "mqtt_tls", "mqtt_ws")
_INSECURE_HINT = "or pass --insecure (insecure = true) to run it open anyway"


def check_exposure(
    config: BrokerConfig, bound: Sequence[tuple[str, Address]] | None = None
) -> None:
    """Safe defaults (docs/security.md): refuse a broker that listens beyond loopback without
    authentication, or with ``DEV_CLUSTER_SECRET``, unless ``config.insecure``.

    Beyond loopback every listener needs the users file (a cluster without one is open only on
    loopback), MQTT's listeners need ``mqtt_users`` as well, and the cluster secret must not be
    the well-known development one. Raises ``ConfigError`` naming the setting and ``--insecure``.

    ``bound``: the addresses the kernel really bound, by setting name (the broker checks them
    once its listeners are up, since a library may bind wider than it was told); without it, the
    configured ones (checked before anything binds).
    """
    if config.insecure:
        return
    listening = listen_addresses(config) if bound is None else bound
    exposed = [(name, a) for name, a in listening if not is_loopback(a.host)]
    for name, address in exposed:
        where = f"{name} listens on {address}, beyond loopback,"
        if config.cluster_secret == DEV_CLUSTER_SECRET:
            raise ConfigError(
                f"{where} with the built-in development cluster secret, which everyone knows: "
                f"set cluster_secret ($KAFKAESQUE_CLUSTER_SECRET), {_INSECURE_HINT}"
            )
        if config.users_file is None:
            raise ConfigError(
                f"{where} without authentication: give users_file (--users-file, made with "
                f"`kafkaesque user add`; docs/security.md), {_INSECURE_HINT}"
            )
        if name in _MQTT_LISTENERS and config.mqtt_users is None:
            raise ConfigError(
                f"{where} with anonymous devices: give mqtt_users (--mqtt-users), {_INSECURE_HINT}"
            )


def open_warning(config: BrokerConfig, client_port: int) -> str | None:
    """The line a broker without a users file says at start (None with one): anyone who can
    reach its client port may do anything."""
    if config.users_file is not None:
        return None
    everywhere = all(is_loopback(a.host) for _, a in listen_addresses(config))
    scope = "listening on loopback only" if everywhere else "--insecure: beyond loopback too"
    return (
        f"broker {config.id}: no --users-file: anyone who can reach "
        f"{config.client.host}:{client_port} may do anything ({scope})"
    )


_ADDRESS_FIELDS = {"client", "admin", "mqtt", "mqtt_tls", "mqtt_ws", "kafka", "http"}
_VOTER_FIELDS = {"peers", "controllers"}


def load_config(path: str, overrides: Mapping[str, Any] | None = None) -> BrokerConfig:
    """Read a TOML file whose keys are ``BrokerConfig``'s fields; ``overrides`` win."""
    try:
        with open(path, "rb") as f:
            raw: dict[str, Any] = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    raw.update({k: v for k, v in (overrides or {}).items() if v is not None})
    return config_from_mapping(raw)


def config_from_mapping(raw: Mapping[str, Any]) -> BrokerConfig:
    """Build a ``BrokerConfig`` from plain values (strings for addresses, as in the TOML)."""
    known = {f.name for f in fields(BrokerConfig)}
    unknown = set(raw) - known - {"max_line_length", "max_payload"}
    if unknown:
        raise ConfigError(f"unknown settings: {', '.join(sorted(unknown))}")
    values: dict[str, Any] = {}
    for name, value in raw.items():
        if name in ("kafka", "http") and value == "off":
            values[f"{name}_off"] = True  # (the Kafka and REST listeners are on unless told so)
        elif name in _ADDRESS_FIELDS and value is not None:
            values[name] = value if isinstance(value, Address) else Address.parse(value, name)
        elif name in _VOTER_FIELDS and isinstance(value, str):
            values[name] = parse_voters(value, name)
        elif name in known:
            values[name] = value
    for required in ("id", "data_dir", "client", "peers", "controllers"):
        if required not in values:
            raise ConfigError(f"missing setting: {required}")
    limits = LineLimits()
    if "max_line_length" in raw or "max_payload" in raw:
        try:
            limits = replace(
                limits,
                **{k: int(raw[k]) for k in ("max_line_length", "max_payload") if k in raw},
            )
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        values["limits"] = limits
    try:
        config = BrokerConfig(**values)
    except TypeError as exc:
        raise ConfigError(str(exc)) from exc
    return config.validate()
