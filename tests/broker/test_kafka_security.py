"""SASL and TLS on the Kafka port, judged by Kafka's own clients (confluent-kafka, kcat) against
real brokers with a users file (issue 33): SCRAM-SHA-256 on the plain port, PLAIN only over TLS,
a wrong password refused with 58 and counted, nothing served before authentication."""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import subprocess
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from kafkaesque.broker._config import MAX_PARTITIONS
from kafkaesque.client import Client, Consumer
from kafkaesque.local_cluster import DevSecurity, SecureCluster, write_users
from kafkaesque.protocol.kafka import (
    API_VERSIONS,
    DESCRIBE_ACLS,
    METADATA,
    SASL_AUTHENTICATE,
    SASL_HANDSHAKE,
    Api,
    KafkaError,
    Message,
    decode_response,
    encode_request,
    frame_bytes,
)
from kafkaesque.security import ScramClient

confluent_kafka = pytest.importorskip("confluent_kafka")
pytest.importorskip("confluent_kafka.admin")

BOB, BOB_PASSWORD = "bob", "bob-secret-1"


def _secure(root: Any, kafka_tls: bool) -> tuple[DevSecurity, list[str]]:
    security = DevSecurity.make(str(root))
    users = os.path.join(str(root), "users-kafka")
    # The cluster's own user (a super user), and bob, whom no ACL names.
    write_users(users, {security.username: security.password, BOB: BOB_PASSWORD})
    # No failure limit: librdkafka retries a wrong password at once, which would shut the
    # address out for the tests that follow.
    extra = ["--users-file", users, "--auth-failure-limit", "0"]
    extra += ["--kafka-tls"] if kafka_tls else []
    return security, extra


@pytest.fixture(scope="module")
def sasl_plain_port(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[SecureCluster, DevSecurity]]:
    """One broker whose Kafka port is plaintext, with a users file (SASL_PLAINTEXT)."""
    root = tmp_path_factory.mktemp("kafka-sasl")
    security, extra = _secure(root, kafka_tls=False)
    with SecureCluster(str(root / "c"), 1, security=security, extra_args=extra) as cluster:
        cluster.wait_ready()
        yield cluster, security


@pytest.fixture(scope="module")
def sasl_tls_port(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[SecureCluster, DevSecurity]]:
    """One broker whose Kafka port speaks TLS (--kafka-tls), with a users file (SASL_SSL)."""
    root = tmp_path_factory.mktemp("kafka-sasl-ssl")
    security, extra = _secure(root, kafka_tls=True)
    with SecureCluster(str(root / "c"), 1, security=security, extra_args=extra) as cluster:
        cluster.wait_ready()
        yield cluster, security


def scram_settings(cluster: SecureCluster, user: str, password: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": cluster.kafka_bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": user,
        "sasl.password": password,
    }


def plain_tls_settings(cluster: SecureCluster, security: DevSecurity) -> dict[str, Any]:
    return {
        "bootstrap.servers": cluster.kafka_bootstrap,
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": security.pki.ca,
        "sasl.mechanism": "PLAIN",
        "sasl.username": security.username,
        "sasl.password": security.password,
    }


def produce_and_consume(settings: dict[str, Any], topic: str) -> list[tuple[bytes, bytes]]:
    """Create ``topic`` (1 partition), produce three records with acks=all, read them back."""
    admin = confluent_kafka.admin.AdminClient(settings)
    for future in admin.create_topics([confluent_kafka.admin.NewTopic(topic, 1, 1)]).values():
        future.result(30)
    producer = confluent_kafka.Producer({**settings, "acks": "all"})
    reports: list[Any] = []
    for i in range(3):
        producer.produce(topic, b"v%d" % i, b"k%d" % i, on_delivery=lambda e, m: reports.append(e))
    assert producer.flush(30) == 0
    assert reports == [None, None, None]
    consumer = confluent_kafka.Consumer(
        {**settings, "group.id": "unused", "enable.auto.commit": False}
    )
    try:
        consumer.assign(
            [confluent_kafka.TopicPartition(topic, 0, confluent_kafka.OFFSET_BEGINNING)]
        )
        got: list[tuple[bytes, bytes]] = []
        for _ in range(150):
            if len(got) == 3:
                break
            message = consumer.poll(0.2)
            if message is not None:
                assert message.error() is None, message.error()
                got.append((message.key(), message.value()))
        return got
    finally:
        consumer.close()


def metric(cluster: SecureCluster, prefix: str) -> float:
    """The value of the one ``/metrics`` line that starts with ``prefix`` (0 if none yet)."""
    url = f"http://127.0.0.1:{cluster.ports[0].admin}/metrics"
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    lines = [x for x in text.splitlines() if x.startswith(prefix)]
    assert len(lines) <= 1, lines
    return float(lines[0].split()[-1]) if lines else 0.0


def auth_failures(cluster: SecureCluster) -> float:
    return metric(cluster, "kafkaesque_auth_failures_total ")


def tls_refused(cluster: SecureCluster) -> float:
    return metric(cluster, 'kafkaesque_tls_refused_total{listener="kafka",reason="handshake"}')


# -- a raw client of our codec: what exactly the broker answers --------------------------------


class RawKafka:
    """One connection that sends requests and reads answers (bare frames too)."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.sock = socket.create_connection(address, timeout=10)
        self.correlation = 0

    def __enter__(self) -> RawKafka:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def call(self, api: Api, version: int, body: Message) -> Message:
        self.correlation += 1
        self.sock.sendall(encode_request(api, version, self.correlation, "raw", body))
        correlation, answer = decode_response(api, version, self.frame())
        assert correlation == self.correlation
        return answer

    def frame(self) -> bytes:
        (size,) = struct.unpack(">i", self._exactly(4))
        return self._exactly(size)

    def closed(self) -> bool:
        """Whether the broker closed the connection (within the socket's timeout)."""
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True

    def _exactly(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("closed by the broker")
            data += chunk
        return data


def scram_login(raw: RawKafka, user: str, password: str) -> Message:
    """Handshake v1 then SCRAM in SaslAuthenticate v1; the last answer."""
    shake = raw.call(SASL_HANDSHAKE, 1, {"mechanism": "SCRAM-SHA-256"})
    assert shake == {"error_code": 0, "mechanisms": ["SCRAM-SHA-256"]}
    client = ScramClient(user, password)
    first = raw.call(SASL_AUTHENTICATE, 1, {"auth_bytes": client.first()})
    assert first["error_code"] == 0, first
    return raw.call(SASL_AUTHENTICATE, 1, {"auth_bytes": client.final(first["auth_bytes"])})


def test_before_authentication_only_api_versions_and_sasl_are_served(
    sasl_plain_port: tuple[SecureCluster, DevSecurity],
) -> None:
    cluster, _ = sasl_plain_port
    address = cluster.kafka_address(0)
    with RawKafka(address) as raw:
        versions = raw.call(API_VERSIONS, 2, {})
        assert {a["api_key"] for a in versions["api_keys"]} >= {17, 36, 29, 30, 31, 32, 37, 44}
        raw.sock.sendall(encode_request(METADATA, 4, 9, "raw", {}))  # not authenticated yet
        assert raw.closed()
    with RawKafka(address) as raw:  # PLAIN is not offered on a plaintext port
        shake = raw.call(SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"})
        assert shake == {
            "error_code": KafkaError.UNSUPPORTED_SASL_MECHANISM,
            "mechanisms": ["SCRAM-SHA-256"],
        }
    with RawKafka(address) as raw:  # SaslAuthenticate without a handshake: refused, closed
        answer = raw.call(SASL_AUTHENTICATE, 1, {"auth_bytes": b"n,,n=bob,r=abc"})
        assert answer["error_code"] == KafkaError.ILLEGAL_SASL_STATE
        assert raw.closed()


def test_scram_in_sasl_authenticate_then_requests_are_served(
    sasl_plain_port: tuple[SecureCluster, DevSecurity],
) -> None:
    cluster, _ = sasl_plain_port
    with RawKafka(cluster.kafka_address(0)) as raw:
        last = scram_login(raw, BOB, BOB_PASSWORD)
        assert last["error_code"] == 0 and last["auth_bytes"].startswith(b"v="), last
        metadata = raw.call(METADATA, 4, {})
        assert [b["node_id"] for b in metadata["brokers"]] == [0]


def test_a_wrong_password_answers_58_closes_and_is_counted(
    sasl_plain_port: tuple[SecureCluster, DevSecurity],
) -> None:
    cluster, _ = sasl_plain_port
    before = auth_failures(cluster)
    with RawKafka(cluster.kafka_address(0)) as raw:
        last = scram_login(raw, BOB, "not-bobs-password")
        assert last["error_code"] == KafkaError.SASL_AUTHENTICATION_FAILED, last
        assert "Authentication failed" in last["error_message"]
        assert raw.closed()
    assert auth_failures(cluster) == before + 1


def test_sasl_handshake_v0_exchanges_bare_tokens(
    sasl_plain_port: tuple[SecureCluster, DevSecurity],
) -> None:
    cluster, _ = sasl_plain_port
    with RawKafka(cluster.kafka_address(0)) as raw:
        shake = raw.call(SASL_HANDSHAKE, 0, {"mechanism": "SCRAM-SHA-256"})
        assert shake["error_code"] == 0
        client = ScramClient(BOB, BOB_PASSWORD)
        raw.sock.sendall(frame_bytes(client.first()))
        raw.sock.sendall(frame_bytes(client.final(raw.frame())))
        client.verify(raw.frame())  # the server proved it knows bob's credential
        assert raw.call(METADATA, 4, {})["brokers"]


def test_confluent_kafka_over_sasl_plaintext_with_scram(
    sasl_plain_port: tuple[SecureCluster, DevSecurity],
) -> None:
    cluster, security = sasl_plain_port
    settings = scram_settings(cluster, security.username, security.password)
    got = produce_and_consume(settings, "ks-scram")
    assert got == [(b"k0", b"v0"), (b"k1", b"v1"), (b"k2", b"v2")]


def test_confluent_kafka_with_a_wrong_password_is_refused(
    sasl_plain_port: tuple[SecureCluster, DevSecurity],
) -> None:
    cluster, security = sasl_plain_port
    errors: list[Any] = []
    settings = {
        **scram_settings(cluster, security.username, "wrong"),
        "error_cb": errors.append,
    }
    producer = confluent_kafka.Producer(settings)
    producer.produce("ks-refused", b"never")
    for _ in range(50):
        producer.poll(0.1)
        if errors:
            break
    assert any(e.code() == confluent_kafka.KafkaError._AUTHENTICATION for e in errors), errors


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed")
def test_kcat_lists_over_sasl_plaintext(
    sasl_plain_port: tuple[SecureCluster, DevSecurity],
) -> None:
    cluster, security = sasl_plain_port
    result = subprocess.run(
        ["kcat", "-b", cluster.kafka_bootstrap, "-L", "-J",
         "-X", "security.protocol=SASL_PLAINTEXT", "-X", "sasl.mechanism=SCRAM-SHA-256",
         "-X", f"sasl.username={security.username}", "-X", f"sasl.password={security.password}"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert [b["id"] for b in json.loads(result.stdout)["brokers"]] == [0]


def test_confluent_kafka_over_sasl_ssl_with_plain(
    sasl_tls_port: tuple[SecureCluster, DevSecurity],
) -> None:
    cluster, security = sasl_tls_port
    got = produce_and_consume(plain_tls_settings(cluster, security), "ks-plain-tls")
    assert got == [(b"k0", b"v0"), (b"k1", b"v1"), (b"k2", b"v2")]


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed")
def test_kcat_produces_and_consumes_over_sasl_ssl_with_scram(
    sasl_tls_port: tuple[SecureCluster, DevSecurity],
) -> None:
    cluster, security = sasl_tls_port
    options = [
        "-b", cluster.kafka_bootstrap,
        "-X", "security.protocol=SASL_SSL", "-X", f"ssl.ca.location={security.pki.ca}",
        "-X", "sasl.mechanism=SCRAM-SHA-256",
        "-X", f"sasl.username={BOB}", "-X", f"sasl.password={BOB_PASSWORD}",
    ]  # fmt: skip

    def kcat(*args: str, stdin: str | None = None) -> str:
        result = subprocess.run(
            ["kcat", *options, *args],
            input=stdin, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        return result.stdout

    # docs/kafka.md's command: -L over SASL_SSL (there as alice, here as bob).
    assert '"id":0' in kcat("-L", "-J").replace(" ", "")
    kcat("-P", "-t", "ks-kcat-tls", "-K:", stdin="a:1\nb:2\n")
    out = kcat("-C", "-t", "ks-kcat-tls", "-e", "-f", "%k=%s\n")
    assert sorted(out.split()) == ["a=1", "b=2"]


def test_a_plaintext_client_on_the_tls_kafka_port_learns_nothing(
    sasl_tls_port: tuple[SecureCluster, DevSecurity],
) -> None:
    cluster, _ = sasl_tls_port
    before = tls_refused(cluster)
    with RawKafka(cluster.kafka_address(0)) as raw:
        raw.sock.sendall(encode_request(API_VERSIONS, 2, 1, "raw", {}))
        with pytest.raises((ConnectionError, OSError)):
            raw.frame()
    assert tls_refused(cluster) == before + 1


# -- ACLs, configs and partitions through confluent-kafka's AdminClient -------------------------


def kafka_admin(cluster: SecureCluster, user: str, password: str) -> Any:
    return confluent_kafka.admin.AdminClient(scram_settings(cluster, user, password))


def our_client(cluster: SecureCluster, security: DevSecurity) -> Client:
    return Client(cluster.bootstrap, config=security.client_config())


def test_acls_are_created_described_and_deleted_through_the_same_acls_as_ours(
    sasl_plain_port: tuple[SecureCluster, DevSecurity],
) -> None:
    cluster, security = sasl_plain_port
    a = confluent_kafka.admin
    admin = kafka_admin(cluster, security.username, security.password)  # a super user
    bindings = [
        a.AclBinding(a.ResourceType.TOPIC, "ks-acl", a.ResourcePatternType.LITERAL,
                     f"User:{BOB}", "*", a.AclOperation.READ, a.AclPermissionType.ALLOW),
        a.AclBinding(a.ResourceType.GROUP, "ks-", a.ResourcePatternType.PREFIXED,
                     f"User:{BOB}", "*", a.AclOperation.DESCRIBE, a.AclPermissionType.DENY),
    ]  # fmt: skip
    for future in admin.create_topics([a.NewTopic("ks-acl", 1, 1)]).values():
        future.result(30)
    for future in admin.create_acls(bindings).values():
        future.result(30)
    try:
        with our_client(cluster, security) as client:  # the line protocol's ACL LIST
            listed = client.list_acls(f"User:{BOB}")
        rows = {(r.operation, r.resource, r.pattern, r.name, r.permission) for r in listed}
        assert rows == {  # (StrEnums: equal to their words)
            ("read", "topic", "literal", "ks-acl", "allow"),
            ("describe", "group", "prefixed", "ks-", "deny"),
        }
        everything = a.AclBindingFilter(
            a.ResourceType.ANY, None, a.ResourcePatternType.ANY,
            None, None, a.AclOperation.ANY, a.AclPermissionType.ANY,
        )  # fmt: skip
        described = admin.describe_acls(everything).result(30)
        assert sorted(described, key=str) == sorted(bindings, key=str)
        # A MATCH filter selects the ACLs that apply to a name: the prefixed one for ks-g1.
        applies = a.AclBindingFilter(
            a.ResourceType.GROUP, "ks-g1", a.ResourcePatternType.MATCH,
            None, None, a.AclOperation.ANY, a.AclPermissionType.ANY,
        )  # fmt: skip
        assert admin.describe_acls(applies).result(30) == [bindings[1]]
        # bob may not change ACLs (alter on the cluster), nor list them (describe on it).
        bobs = kafka_admin(cluster, BOB, BOB_PASSWORD)
        [refused] = bobs.create_acls([bindings[0]]).values()
        with pytest.raises(confluent_kafka.KafkaException, match="CLUSTER_AUTHORIZATION_FAILED"):
            refused.result(30)
        # (librdkafka shows bob an empty list: it drops DescribeAcls' top-level error.)
        with RawKafka(cluster.kafka_address(0)) as raw:
            scram_login(raw, BOB, BOB_PASSWORD)
            any_acl = {"resource_type_filter": 1, "pattern_type_filter": 1, "operation": 1,
                       "permission_type": 1}  # fmt: skip
            answer = raw.call(DESCRIBE_ACLS, 1, any_acl)
            # bob's requests are checked as User:bob against these ACLs: read on ks-acl
            # implies describe; another topic is hidden, whether it exists or not.
            asked = {"topics": [{"name": "ks-acl"}, {"name": "ks-hidden"}],
                     "allow_auto_topic_creation": False}  # fmt: skip
            topics = raw.call(METADATA, 4, asked)["topics"]
        assert answer["error_code"] == KafkaError.CLUSTER_AUTHORIZATION_FAILED, answer
        assert answer["resources"] == []
        assert [(t["name"], t["error_code"]) for t in topics] == [
            ("ks-acl", KafkaError.NONE),
            ("ks-hidden", KafkaError.TOPIC_AUTHORIZATION_FAILED),
        ]
        # A host other than * has no equivalent here.
        with_host = a.AclBinding(a.ResourceType.TOPIC, "t", a.ResourcePatternType.LITERAL,
                                 f"User:{BOB}", "10.0.0.1", a.AclOperation.READ,
                                 a.AclPermissionType.ALLOW)  # fmt: skip
        [bad] = admin.create_acls([with_host]).values()
        with pytest.raises(confluent_kafka.KafkaException, match="host"):
            bad.result(30)
    finally:
        bob_filter = a.AclBindingFilter(a.ResourceType.ANY, None, a.ResourcePatternType.ANY,
                                        f"User:{BOB}", None, a.AclOperation.ANY,
                                        a.AclPermissionType.ANY)  # fmt: skip
        [deleted] = admin.delete_acls([bob_filter]).values()
        assert sorted(deleted.result(30), key=str) == sorted(bindings, key=str)
    with our_client(cluster, security) as client:
        assert client.list_acls(f"User:{BOB}") == []


def test_topic_configs_are_described_and_altered_as_alter_does(
    sasl_plain_port: tuple[SecureCluster, DevSecurity],
) -> None:
    cluster, security = sasl_plain_port
    a = confluent_kafka.admin
    admin = kafka_admin(cluster, security.username, security.password)
    topic = "ks-config"
    new = a.NewTopic(topic, 1, 1, config={"retention.ms": "3600000"})
    for future in admin.create_topics([new]).values():
        future.result(30)
    resource = a.ConfigResource(a.ResourceType.TOPIC, topic)
    [described] = admin.describe_configs([resource]).values()
    configs = described.result(30)
    assert configs["retention.ms"].value == "3600000"
    assert configs["cleanup.policy"].value == "delete"
    assert (
        configs["min.insync.replicas"].value == "1" and configs["min.insync.replicas"].is_read_only
    )
    changes = a.ConfigResource(a.ResourceType.TOPIC, topic, incremental_configs=[
        a.ConfigEntry("retention.ms", "7200000", incremental_operation=a.AlterConfigOpType.SET),
        a.ConfigEntry("cleanup.policy", "compact", incremental_operation=a.AlterConfigOpType.SET),
        a.ConfigEntry("retention.bytes", None, incremental_operation=a.AlterConfigOpType.DELETE),
    ])  # fmt: skip
    for future in admin.incremental_alter_configs([changes]).values():
        future.result(30)
    with our_client(cluster, security) as client:  # the same topic config as ALTER's
        row = client.describe_topic(topic).topic
    assert (row.retention_ms, row.compact, row.retention_bytes) == (7200000, True, None)
    [again] = admin.describe_configs([resource]).values()
    # Compacted, and still cut at retention.ms: in Kafka's words, compact,delete.
    assert again.result(30)["cleanup.policy"].value == "compact,delete"
    read_only = a.ConfigResource(a.ResourceType.TOPIC, topic, incremental_configs=[
        a.ConfigEntry("min.insync.replicas", "2", incremental_operation=a.AlterConfigOpType.SET),
    ])  # fmt: skip
    [refused] = admin.incremental_alter_configs([read_only]).values()
    with pytest.raises(confluent_kafka.KafkaException, match="INVALID_CONFIG"):
        refused.result(30)


def test_create_partitions_grows_a_topic_as_alter_does(
    sasl_plain_port: tuple[SecureCluster, DevSecurity],
) -> None:
    cluster, security = sasl_plain_port
    a = confluent_kafka.admin
    admin = kafka_admin(cluster, security.username, security.password)
    topic = "ks-grow"
    for future in admin.create_topics([a.NewTopic(topic, 1, 1)]).values():
        future.result(30)
    for future in admin.create_partitions([a.NewPartitions(topic, 3)]).values():
        future.result(30)
    with our_client(cluster, security) as client:
        assert len(client.describe_topic(topic).partitions) == 3
    [shrink] = admin.create_partitions([a.NewPartitions(topic, 2)]).values()
    with pytest.raises(confluent_kafka.KafkaException, match="INVALID_PARTITIONS"):
        shrink.result(30)
    [too_many] = admin.create_partitions([a.NewPartitions(topic, MAX_PARTITIONS + 1)]).values()
    with pytest.raises(confluent_kafka.KafkaException, match="INVALID_PARTITIONS"):
        too_many.result(30)
    metadata = admin.list_topics(topic, timeout=20)
    assert sorted(metadata.topics[topic].partitions) == [0, 1, 2]


def test_kafka_python_authenticates_with_scram_and_produces(
    sasl_plain_port: tuple[SecureCluster, DevSecurity],
) -> None:
    kafka = pytest.importorskip("kafka")
    cluster, security = sasl_plain_port
    settings: dict[str, Any] = {
        "bootstrap_servers": cluster.kafka_bootstrap,
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-256",
        "sasl_plain_username": BOB,
        "sasl_plain_password": BOB_PASSWORD,
    }
    producer = kafka.KafkaProducer(acks="all", **settings)
    try:
        sent = producer.send("ks-kafka-python", key=b"k", value=b"from kafka-python")
        assert sent.get(timeout=30).offset >= 0
    finally:
        producer.close(timeout=5)
    with our_client(cluster, security) as client, Consumer(client) as consumer:
        consumer.assign_topic("ks-kafka-python")
        consumer.seek_to_beginning()
        [record] = list(consumer.records(follow=False))
    assert (record.key, record.value) == (b"k", b"from kafka-python")
