"""Authentication and ACLs on real broker processes (issue 25, docs/security.md), spoken line by
line on raw sockets: SCRAM-SHA-256 driven by ``kafkaesque.security.ScramClient``.

The brokers have a users file (admin, alice, bob, mallory) and ``User:admin`` as a super user.
Failed AUTHs are limited per address (10 a minute, the default): each test that fails on
purpose connects from an address of its own on the loopback network (127.0.0.x), so that it
does not lock the others out.
"""

from __future__ import annotations

import base64
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafkaesque.client import Client as SyncClient
from kafkaesque.client import ClientConfig, KafkaesqueError, Security
from kafkaesque.local_cluster import LocalCluster
from kafkaesque.protocol import (
    AclRow,
    BrokerRow,
    ErrorCode,
    ErrorReply,
    GroupStateRow,
    OkReply,
    PartitionRow,
    ReplyDecoder,
    TopicRow,
)
from kafkaesque.security import ScramClient, derive_credential, plain_message, save_users

from .line_client import Answer, LineClient

USERS = ("admin", "alice", "bob", "mallory", "carol")
AUTH_LIMIT = 10  # BrokerConfig.auth_failure_limit's default
WAIT_S = 30.0


def password(user: str) -> str:
    return f"{user}-secret"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


class Client(LineClient):
    """A raw line client from a chosen loopback address (127.0.0.x)."""

    def __init__(self, address: tuple[str, int], source: str = "127.0.0.1") -> None:
        self.sock = socket.create_connection(address, timeout=WAIT_S, source_address=(source, 0))
        self.decoder = ReplyDecoder()

    def __enter__(self) -> Client:
        return self

    def login(self, user: str, secret: str | None = None) -> Answer:
        """A whole SCRAM exchange; the last answer (the server's proof checked when +OK)."""
        client = ScramClient(user, password(user) if secret is None else secret)
        first = self.call(f"AUTH SCRAM-SHA-256 {b64(client.first())}")
        if not isinstance(first, OkReply):
            return first
        word, challenge = first.text.split(" ")
        assert word == "continue", first
        last = self.call(f"AUTH SCRAM-SHA-256 {b64(client.final(base64.b64decode(challenge)))}")
        if isinstance(last, OkReply):
            word, name, server_final = last.text.split(" ")
            assert (word, name) == ("authenticated", user), last
            client.verify(base64.b64decode(server_final))
        return last


def refused(answer: Answer, code: ErrorCode = ErrorCode.NOT_AUTHORIZED) -> str:
    assert isinstance(answer, ErrorReply) and answer.code is code, answer
    return answer.message


class UsersCluster(LocalCluster):
    """A LocalCluster whose readiness check authenticates as the super user."""

    def _registered(self, broker: int) -> int:
        with Client(self.client_address(broker)) as c:
            c.sock.settimeout(2)
            if not isinstance(c.login("admin"), OkReply):
                return 0
            rows = c.call("METADATA")
        return sum(isinstance(r, BrokerRow) for r in rows) if isinstance(rows, list) else 0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UsersCluster]:
    base = tmp_path_factory.mktemp("access")
    users_file = str(base / "users")
    save_users(users_file, {u: derive_credential(password(u)) for u in USERS})
    args = ["--users-file", users_file, "--super-users", "User:admin"]
    with UsersCluster(str(base / "cluster"), 3, extra_args=args) as running:
        with admin(running) as c:
            assert c.ok("CREATE acl-t 1 3") in ("created", "exists")
        yield running


def admin(cluster: LocalCluster, broker: int = 0) -> Client:
    c = Client(cluster.client_address(broker))
    assert isinstance(c.login("admin"), OkReply)
    return c


def user(cluster: LocalCluster, name: str, broker: int = 0, source: str = "127.0.0.1") -> Client:
    c = Client(cluster.client_address(broker), source)
    assert isinstance(c.login(name), OkReply)
    return c


def counter(cluster: LocalCluster, broker: int, name: str, **labels: str) -> float:
    return float(
        sum(
            value
            for sample, got, value in cluster.scrape(broker)
            if sample == name and all(got.get(k) == v for k, v in labels.items())
        )
    )


# -- authentication ---------------------------------------------------------------------------


def test_before_auth_only_ping_help_quit_and_auth_are_answered(cluster: UsersCluster) -> None:
    with Client(cluster.client_address(1)) as c:
        for line in (
            "PUBS acl-t hello",
            "METADATA",
            "LIST",
            "CREATE sneaky 1 1",
            "FETCH acl-t 0 0",
            "REMOVEBROKER 2",
            "ACL LIST",
            "ACL ADD User:mallory allow all cluster literal kafka-cluster",
        ):
            message = refused(c.call(line))
            assert message == "authentication required: AUTH SCRAM-SHA-256 first (docs/security.md)"
        assert c.ok("PING") == "PONG"
        assert isinstance(c.call("HELP"), list)
        assert c.ok("QUIT") == "bye"
    assert (
        counter(cluster, 1, "kafkaesque_authorization_failures_total", operation="unauthenticated")
        >= 8
    )
    with admin(cluster, 1) as c:
        assert not any(isinstance(r, TopicRow) and r.topic == "sneaky" for r in c.rows("LIST"))


def test_scram_authenticates_then_publishes_work(cluster: UsersCluster) -> None:
    with user(cluster, "alice", broker=2) as c:
        partition, offset = c.ok("PUBS acl-t from alice").split()
        rows = c.rows(f"FETCH acl-t {partition} {offset} format=text")
    assert any(getattr(r, "value", None) == b"from alice" for r in rows)


def test_a_wrong_password_fails_and_the_connection_may_try_again(cluster: UsersCluster) -> None:
    with Client(cluster.client_address(0), "127.0.0.2") as c:
        assert refused(c.login("alice", "guess"), ErrorCode.AUTH_FAILED) == "authentication failed"
        assert refused(c.login("nobody", "guess"), ErrorCode.AUTH_FAILED) == "authentication failed"
        refused(c.call("PUBS acl-t x"))  # still not authenticated
        assert isinstance(c.login("alice"), OkReply)
        c.ok("PUBS acl-t x")


def test_replayed_and_truncated_exchanges_fail(cluster: UsersCluster) -> None:
    client = ScramClient("alice", password("alice"))
    first = f"AUTH SCRAM-SHA-256 {b64(client.first())}"
    with Client(cluster.client_address(0), "127.0.0.3") as recorded:
        challenge = recorded.ok(first).split(" ")[1]
        final = f"AUTH SCRAM-SHA-256 {b64(client.final(base64.b64decode(challenge)))}"
        assert recorded.ok(final).startswith("authenticated alice ")
    # The eavesdropper's replay, on a connection of its own: another server nonce.
    with Client(cluster.client_address(0), "127.0.0.3") as replay:
        replay.ok(first)
        assert "nonce" in refused(replay.call(final), ErrorCode.AUTH_FAILED)
        refused(replay.call(final), ErrorCode.AUTH_FAILED)  # a lone final starts nothing
        refused(replay.call("PUBS acl-t x"))
    # Truncated: the final message cut short, or never sent before another command.
    with Client(cluster.client_address(0), "127.0.0.3") as cut:
        fresh = ScramClient("alice", password("alice"))
        challenge = cut.ok(f"AUTH SCRAM-SHA-256 {b64(fresh.first())}").split(" ")[1]
        whole = fresh.final(base64.b64decode(challenge))
        refused(
            cut.call(f"AUTH SCRAM-SHA-256 {b64(whole[: len(whole) // 2])}"), ErrorCode.AUTH_FAILED
        )
        refused(cut.call("PUBS acl-t x"))
        half_done = ScramClient("alice", password("alice"))
        cut.ok(f"AUTH SCRAM-SHA-256 {b64(half_done.first())}")
        refused(cut.call("PUBS acl-t x"))  # mid-exchange: still not authenticated
        assert isinstance(cut.login("alice"), OkReply)  # a new exchange starts afresh


def test_failures_are_rate_limited_per_address_and_counted(cluster: UsersCluster) -> None:
    before = counter(cluster, 0, "kafkaesque_auth_failures_total")
    with Client(cluster.client_address(0), "127.0.0.4") as c:
        for _ in range(AUTH_LIMIT):
            assert (
                refused(c.login("bob", "guess"), ErrorCode.AUTH_FAILED) == "authentication failed"
            )
        message = refused(c.login("bob"), ErrorCode.AUTH_FAILED)  # the right password, unheard
    assert message.startswith("too many failed attempts from 127.0.0.4: retry in ")
    # A new connection from the same address is refused too; another address is not.
    with Client(cluster.client_address(0), "127.0.0.4") as again:
        assert refused(again.login("bob"), ErrorCode.AUTH_FAILED).startswith("too many")
        assert again.ok("PING") == "PONG"
    with user(cluster, "bob", source="127.0.0.5") as other:
        assert other.ok("PING") == "PONG"
    after = counter(cluster, 0, "kafkaesque_auth_failures_total")
    assert after - before >= AUTH_LIMIT + 2


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(junk=st.binary(max_size=300), encode=st.booleans())
def test_fuzzed_auth_lines_never_crash_the_broker(
    cluster: UsersCluster, junk: bytes, encode: bool
) -> None:
    payload = base64.b64encode(junk) if encode else junk.replace(b"\r", b"").replace(b"\n", b"")
    with Client(cluster.client_address(1), "127.0.0.6") as c:
        c.send(b"AUTH SCRAM-SHA-256 " + payload + b"\r\n")
        c.send(b"AUTH SCRAM-SHA-256 " + payload + b"\r\n")  # as a final step too
        c.send(b"PING\r\n")
        answers = [c.answer() for _ in range(3)]
    assert isinstance(answers[2], OkReply) and answers[2].text == "PONG", answers
    for answer in answers[:2]:
        assert isinstance(answer, ErrorReply | OkReply), answer
        if isinstance(answer, ErrorReply):
            assert answer.code in (ErrorCode.AUTH_FAILED, ErrorCode.BAD_ARGS), answer


def test_the_broker_survives_the_fuzzing(cluster: UsersCluster) -> None:
    for broker in range(3):
        assert cluster.procs[broker].poll() is None
        with user(cluster, "alice", broker) as c:
            assert c.ok("PING") == "PONG"


# -- authorization ----------------------------------------------------------------------------

# (what a command needs, the ACL words that grant it, the command line, ACLs it needs besides)
_MATRIX = [
    ("write topic acl-t", "write topic literal acl-t", "PUBS acl-t hello", []),
    ("read topic acl-t", "read topic literal acl-t", "FETCH acl-t 0 0", []),
    ("describe topic acl-t", "describe topic literal acl-t", "DESCRIBE acl-t", []),
    ("alter topic acl-t", "alter topic literal acl-t", "ALTER acl-t retention_ms=86400000", []),
    ("create topic acl-new", "create topic literal acl-new", "CREATE acl-new 1 1", []),
    ("delete topic acl-new", "delete topic literal acl-new", "DELETE acl-new", []),
    (
        "read group acl-g",
        "read group literal acl-g",
        "SUBS acl-t acl-g",
        ["read topic literal acl-t"],
    ),
    (
        "commit group acl-g",
        "commit group literal acl-g",
        "COMMIT acl-g acl-t 0 0",
        ["read topic literal acl-t"],
    ),
    ("describe group acl-g", "describe group literal acl-g", "OFFSETS acl-g acl-t", []),
    ("describe group acl-g", "describe group literal acl-g", "GROUPS acl-g", []),
    ("alter group acl-g", "alter group literal acl-g", "RESETOFFSETS acl-g acl-t earliest", []),
    ("delete group acl-g2", "delete group literal acl-g2", "DELGROUP acl-g2", []),
    (
        "admin cluster kafka-cluster",
        "admin cluster literal kafka-cluster",
        "REASSIGN acl-t 0 {replicas}",
        [],
    ),
    (
        "alter cluster kafka-cluster",
        "alter cluster literal kafka-cluster",
        "ACL ADD User:nobody allow read topic literal nothing",
        [],
    ),
    ("describe cluster kafka-cluster", "describe cluster literal kafka-cluster", "ACL LIST", []),
]


def _replicas(cluster: LocalCluster) -> str:
    with admin(cluster) as c:
        rows = c.rows("METADATA acl-t")
    (row,) = [r for r in rows if isinstance(r, PartitionRow)]
    return ",".join(map(str, row.replicas))


def test_every_operation_is_refused_without_its_acl_and_allowed_with_it(
    cluster: UsersCluster,
) -> None:
    replicas = _replicas(cluster)
    with admin(cluster) as root, user(cluster, "mallory") as mallory:
        # Some ACL must exist for any to be enforced (none: the cluster is open).
        root.ok("ACL ADD User:carol allow read topic literal elsewhere")
        for needs, grant, line, besides in _MATRIX:
            line = line.format(replicas=replicas)
            for extra in besides:
                root.ok(f"ACL ADD User:mallory allow {extra}")
            message = refused(mallory.call(line))
            assert message == f"User:mallory may not {needs}", line
            root.ok(f"ACL ADD User:mallory allow {grant}")
            answer = mallory.call(line)
            assert not (
                isinstance(answer, ErrorReply) and answer.code is ErrorCode.NOT_AUTHORIZED
            ), (line, answer)
            for words in [grant, *besides]:
                assert root.ok(f"ACL REMOVE User:mallory allow {words}") == "removed=1"
        assert refused(mallory.call("REMOVEBROKER 2")) == (
            "User:mallory may not admin cluster kafka-cluster"
        )
        assert refused(mallory.call("ADDBROKER 7 127.0.0.1:1 127.0.0.1:2")) == (
            "User:mallory may not admin cluster kafka-cluster"
        )
        root.ok("ACL REMOVE User:carol allow read topic literal elsewhere")
        root.ok("ACL REMOVE User:nobody allow read topic literal nothing")
    assert counter(cluster, 0, "kafkaesque_authorization_failures_total", operation="write") >= 1


def test_deny_wins_and_prefixes_match(cluster: UsersCluster) -> None:
    with admin(cluster) as root, user(cluster, "carol") as carol:
        root.ok("CREATE pre-a 1 3")
        root.ok("CREATE pre-secret 1 3")
        root.ok("ACL ADD User:* allow write topic prefixed pre-")
        root.ok("ACL ADD User:carol deny write topic literal pre-secret")
        try:
            carol.ok("PUBS pre-a fine")
            assert refused(carol.call("PUBS pre-secret no")) == (
                "User:carol may not write topic pre-secret"
            )
            refused(carol.call("PUBS acl-t no"))  # outside the prefix
            with user(cluster, "alice") as alice:  # the deny names carol only
                alice.ok("PUBS pre-secret yes")
            # Listings show what the principal may describe (a write implies it).
            listed = {r.topic for r in carol.rows("LIST") if isinstance(r, TopicRow)}
            assert {"pre-a", "pre-secret"} <= listed and "acl-t" not in listed
            partitions = {r.topic for r in carol.rows("METADATA") if isinstance(r, PartitionRow)}
            assert "acl-t" not in partitions and "pre-a" in partitions
        finally:
            root.ok("ACL REMOVE User:* allow write topic prefixed pre-")
            root.ok("ACL REMOVE User:carol deny write topic literal pre-secret")


def test_auto_creation_needs_create_too(cluster: UsersCluster) -> None:
    with admin(cluster) as root, user(cluster, "carol") as carol:
        root.ok("ACL ADD User:carol allow write topic prefixed auto-")
        try:
            assert (
                refused(carol.call("PUBS auto-one x")) == "User:carol may not create topic auto-one"
            )
            root.ok("ACL ADD User:carol allow create topic prefixed auto-")
            carol.ok("PUBS auto-one x")
        finally:
            root.ok("ACL REMOVE User:carol allow write topic prefixed auto-")
            root.ok("ACL REMOVE User:carol allow create topic prefixed auto-")


def test_acls_added_at_one_broker_are_enforced_at_another(cluster: UsersCluster) -> None:
    with admin(cluster, 0) as root, user(cluster, "alice", broker=2) as alice:
        root.ok("ACL ADD User:alice deny write topic literal acl-t")
        try:
            deadline = time.monotonic() + WAIT_S
            answer = alice.call("PUBS acl-t x")
            while not isinstance(answer, ErrorReply) and time.monotonic() < deadline:
                time.sleep(0.05)
                answer = alice.call("PUBS acl-t x")
            assert refused(answer) == "User:alice may not write topic acl-t"
        finally:
            root.ok("ACL REMOVE User:alice deny write topic literal acl-t")
    with admin(cluster, 1) as other:
        rows = other.rows("ACL LIST")
    assert all(isinstance(r, AclRow) for r in rows[:-1])


def test_acls_survive_a_restart(tmp_path_factory: pytest.TempPathFactory) -> None:
    base = tmp_path_factory.mktemp("restart")
    users_file = str(base / "users")
    save_users(users_file, {u: derive_credential(password(u)) for u in ("admin", "bob")})
    args = ["--users-file", users_file, "--super-users", "User:admin"]
    acl = "User:bob allow write topic prefixed keep-"
    with UsersCluster(str(base / "cluster"), 3, extra_args=args) as running:
        with admin(running) as root:
            root.ok(f"ACL ADD {acl}")
            root.ok("CREATE keep-t 1 3")
        for broker in range(3):
            running.stop(broker)
        assert running.alive() == []
        for broker in range(3):
            running.start(broker)
        running.wait_ready(60)
        with admin(running, 1) as root:
            rows = root.rows("ACL LIST User:bob")
        acls = [r for r in rows if isinstance(r, AclRow)]
        assert len(acls) == 1, rows
        row = acls[0]
        assert (row.principal, row.operation, row.resource, row.pattern, row.name) == (
            "User:bob",
            "write",
            "topic",
            "prefixed",
            "keep-",
        )
        with user(running, "bob", broker=2) as bob:
            bob.ok("PUBS keep-t still allowed")
            refused(bob.call("CREATE other 1 1"))


def test_no_users_file_means_anonymous_and_auth_is_not_enabled(
    broker_cluster: LocalCluster,
) -> None:
    with LineClient(broker_cluster.client_address(0)) as c:
        assert c.ok("PING") == "PONG"
        client = ScramClient("alice", "x")
        message = refused(
            c.call(f"AUTH SCRAM-SHA-256 {b64(client.first())}"), ErrorCode.AUTH_FAILED
        )
        assert message == "authentication is not enabled on this broker"
        c.ok("CREATE anon-t 1 3")
        c.ok("PUBS anon-t x")


# -- PLAIN: over TLS only ---------------------------------------------------------------------


def test_plain_is_refused_on_a_plaintext_listener(cluster: UsersCluster) -> None:
    with Client(cluster.client_address(0), "127.0.0.7") as c:
        message = refused(
            c.call(f"AUTH PLAIN {b64(plain_message('alice', password('alice')))}"),
            ErrorCode.AUTH_FAILED,
        )
        assert "TLS" in message
        refused(c.call("PUBS acl-t x"))


class TlsClient(Client):
    def __init__(self, address: tuple[str, int], context: ssl.SSLContext) -> None:
        raw = socket.create_connection(address, timeout=WAIT_S)
        self.sock = context.wrap_socket(raw, server_hostname=address[0])
        self.decoder = ReplyDecoder()


class TlsUsersCluster(UsersCluster):
    """Client port in TLS only; readiness asked over TLS as the super user, with PLAIN."""

    context: ssl.SSLContext

    def _registered(self, broker: int) -> int:
        with TlsClient(self.client_address(broker), self.context) as c:
            c.sock.settimeout(2)
            c.ok(f"AUTH PLAIN {b64(plain_message('admin', password('admin')))}")
            rows = c.call("METADATA")
        return sum(isinstance(r, BrokerRow) for r in rows) if isinstance(rows, list) else 0


def test_plain_authenticates_over_tls(tmp_path: Path) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_file, key_file = tmp_path / "broker.pem", tmp_path / "broker.key"
    cert_file.write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
    key_file.write_bytes(cert.private_key_pem.bytes())
    users_file = str(tmp_path / "users")
    save_users(users_file, {u: derive_credential(password(u)) for u in ("admin", "alice")})
    args = [
        "--users-file", users_file, "--super-users", "User:admin",
        "--tls-cert", str(cert_file), "--tls-key", str(key_file), "--client-tls",
    ]  # fmt: skip
    context = ssl.create_default_context()
    ca.configure_trust(context)
    running = TlsUsersCluster(str(tmp_path / "cluster"), 1, extra_args=args)
    running.context = context
    with running:
        with TlsClient(running.client_address(0), context) as c:
            refused(c.call("PUBS tls-t x"))
            wrong = plain_message("alice", "guess")
            assert refused(c.call(f"AUTH PLAIN {b64(wrong)}"), ErrorCode.AUTH_FAILED) == (
                "authentication failed"
            )
            right = plain_message("alice", password("alice"))
            assert c.ok(f"AUTH PLAIN {b64(right)}") == "authenticated alice"
            c.ok("PUBS tls-t over tls")
        with TlsClient(running.client_address(0), context) as c:  # SCRAM over TLS too
            assert isinstance(c.login("alice"), OkReply)
            c.ok("PUBS tls-t with scram")


def test_groups_lists_only_the_groups_the_principal_may_describe(cluster: UsersCluster) -> None:
    with admin(cluster) as root, user(cluster, "carol", broker=1) as carol:
        for group in ("vis-a", "vis-b"):
            root.ok(f"COMMIT {group} acl-t 0 0")
        root.ok("ACL ADD User:carol allow describe group literal vis-a")
        try:
            deadline = time.monotonic() + WAIT_S
            seen: set[str] = set()
            while "vis-a" not in seen and time.monotonic() < deadline:
                seen = {r.group for r in carol.rows("GROUPS") if isinstance(r, GroupStateRow)}
                time.sleep(0.05)
            assert "vis-a" in seen and "vis-b" not in seen, seen
            everything = {r.group for r in root.rows("GROUPS") if isinstance(r, GroupStateRow)}
            assert {"vis-a", "vis-b"} <= everything
        finally:
            root.ok("ACL REMOVE User:carol allow describe group literal vis-a")


def test_the_client_library_says_not_authorized_for_a_hidden_topic(cluster: UsersCluster) -> None:
    # Issue 37: METADATA hides a topic bob may not describe, and the client said UNKNOWN_TOPIC
    # ("not in the metadata"); it says NOT_AUTHORIZED, for a topic that exists and one that does
    # not alike (the existence stays hidden), and the refusal is counted.
    security = Security(protocol="SASL_PLAINTEXT", username="bob", password=password("bob"))
    before = counter(cluster, 0, "kafkaesque_authorization_failures_total")
    host, port = cluster.client_address(0)
    with admin(cluster) as root:
        root.ok("ACL ADD User:carol allow write topic prefixed hidden-")  # ACLs are enforced
        try:
            with SyncClient(f"{host}:{port}", config=ClientConfig(security=security)) as c:
                for topic in ("acl-t", "no-such-topic-here"):
                    with pytest.raises(KafkaesqueError) as caught:
                        c.partitions_for(topic)
                    assert caught.value.code is ErrorCode.NOT_AUTHORIZED, (topic, caught.value)
        finally:
            root.ok("ACL REMOVE User:carol allow write topic prefixed hidden-")
    assert counter(cluster, 0, "kafkaesque_authorization_failures_total") >= before + 2
