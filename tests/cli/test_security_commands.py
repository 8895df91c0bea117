"""``kafkaesque user`` on a users file, and ``kafkaesque acl`` and the client commands' security
options against a real broker with TLS and a users file (issue 25), run as a user runs them."""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafkaesque.cli.client_options import security_from_args

from kafkaesque.client import Security
from kafkaesque.local_cluster import DevSecurity, SecureCluster
from kafkaesque.security import load_users, verify_password

from .test_client_commands import _kafkaesque


def kafkaesque(
    *args: str, env: dict[str, str] | None = None, stdin: bytes = b""
) -> subprocess.CompletedProcess[str]:
    # The user's settings go; KAFKAESQUE_WORKTREE (a development checkout's code, see
    # /work/wt/shim) stays, so that the command runs the code under test.
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("KAFKAESQUE_") or k == "KAFKAESQUE_WORKTREE"
    }
    return subprocess.run(
        [*_kafkaesque(), *args],
        input=stdin.decode(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**clean, **(env or {})},
    )


def ok(*args: str, env: dict[str, str] | None = None, stdin: bytes = b"") -> str:
    result = kafkaesque(*args, env=env, stdin=stdin)
    assert result.returncode == 0, result.stderr
    return result.stdout


def refused(*args: str, env: dict[str, str] | None = None, stdin: bytes = b"") -> str:
    result = kafkaesque(*args, env=env, stdin=stdin)
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert result.stderr.count("\n") == 1, result.stderr  # one line, no traceback
    return result.stderr


# --- kafkaesque user --------------------------------------------------------------------------


def test_user_add_list_remove_round_trip(tmp_path: Path) -> None:
    users = str(tmp_path / "users")
    out = ok("user", "add", "alice", "--users-file", users, env={"KAFKAESQUE_PASSWORD": "a-pw"})
    assert out == f"added user alice in {users}\n"
    ok("user", "add", "bob", "--users-file", users, "--password", "b-pw", "--iterations", "5000")
    assert ok("user", "list", "--users-file", users) == "alice\nbob\n"
    assert stat.S_IMODE(os.stat(users).st_mode) == 0o600
    text = Path(users).read_text()
    assert "a-pw" not in text and "b-pw" not in text  # salted hashes only
    loaded = load_users(users)
    assert verify_password(loaded["alice"], "a-pw") and not verify_password(loaded["alice"], "x")
    assert loaded["bob"].iterations == 5000

    out = ok("user", "add", "alice", "--users-file", users, "--password", "new-pw")
    assert out.startswith("updated user alice")
    assert verify_password(load_users(users)["alice"], "new-pw")
    assert ok("user", "remove", "bob", "--users-file", users) == f"removed user bob from {users}\n"
    assert ok("user", "list", "--users-file", users) == "alice\n"


def test_user_commands_refuse_what_cannot_work(tmp_path: Path) -> None:
    users = str(tmp_path / "users")
    assert "--password" in refused("user", "add", "alice", "--users-file", users)  # no password
    assert not Path(users).exists()
    assert "at least 4096" in refused(
        "user", "add", "a", "--users-file", users, "--password", "p", "--iterations", "10"
    )
    assert "':'" in refused("user", "add", "a:b", "--users-file", users, "--password", "p")
    ok("user", "add", "alice", "--users-file", users, "--password", "p")
    assert "no user 'carol'" in refused("user", "remove", "carol", "--users-file", users)
    assert "cannot read" in refused("user", "list", "--users-file", str(tmp_path / "missing"))


def test_user_import_hashes_an_old_plaintext_file(tmp_path: Path) -> None:
    old = tmp_path / "mqtt-users"
    old.write_text("# the devices\nphone-1:secret one\n\nphone-2:two\n")
    users = str(tmp_path / "users")
    ok("user", "add", "admin", "--users-file", users, "--password", "admin-pw")
    out = ok("user", "import", str(old), "--users-file", users)
    assert out == f"imported 2 user(s) from {old} into {users}\n"
    loaded = load_users(users)
    assert sorted(loaded) == ["admin", "phone-1", "phone-2"]
    assert verify_password(loaded["phone-1"], "secret one")
    assert verify_password(loaded["admin"], "admin-pw")
    # The old file itself is refused by a broker (and by user list) with the way out...
    assert "kafkaesque user import" in refused("user", "list", "--users-file", str(old))
    # ...and may be converted in place.
    ok("user", "import", str(old), "--users-file", str(old))
    assert sorted(load_users(old)) == ["phone-1", "phone-2"]
    broken = tmp_path / "broken"
    broken.write_text("no-colon-here\n")
    assert "line 1" in refused("user", "import", str(broken), "--users-file", users)


# --- The client commands' security options ------------------------------------------------------


class _Args:
    def __init__(self, **kw: object) -> None:
        self.__dict__.update(kw)


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({}, Security()),
        ({"tls": True}, Security("SSL")),
        ({"tls_ca": "ca.pem"}, Security("SSL", ssl_cafile="ca.pem")),
        (
            {"tls_ca": "ca.pem", "user": "alice", "password": "pw"},
            Security("SASL_SSL", username="alice", password="pw", ssl_cafile="ca.pem"),
        ),
        (
            {"user": "alice", "password": "pw"},
            Security("SASL_PLAINTEXT", username="alice", password="pw"),
        ),
        (
            {"tls": True, "user": "alice", "password": "pw", "sasl_mechanism": "PLAIN"},
            Security("SASL_SSL", "PLAIN", username="alice", password="pw"),
        ),
    ],
)
def test_security_options_name_kafkas_protocols(
    options: dict[str, object], expected: Security, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KAFKAESQUE_PASSWORD", raising=False)
    assert security_from_args(_Args(**options)) == expected


# --- kafkaesque acl, and the client commands over TLS + SCRAM, against a broker -----------------


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SecureCluster, DevSecurity]]:
    root = tmp_path_factory.mktemp("secure-cli")
    security = DevSecurity.make(str(root), username="admin")
    # A second user, added the way an operator does: the broker rereads the file.
    ok("user", "add", "alice", "--users-file", security.users_file, "--password", "alice-pw")
    with SecureCluster(str(root / "data"), 1, security=security) as cluster:
        cluster.wait_ready()
        yield cluster, security


def _env(cluster: SecureCluster, user: str, password: str) -> dict[str, str]:
    return {
        "KAFKAESQUE_BOOTSTRAP": cluster.bootstrap,
        "KAFKAESQUE_USER": user,
        "KAFKAESQUE_PASSWORD": password,
    }


def test_acl_add_list_remove_and_what_they_allow(
    secure: tuple[SecureCluster, DevSecurity],
) -> None:
    cluster, security = secure
    ca = ["--tls-ca", security.pki.ca]
    admin = _env(cluster, "admin", security.password)
    alice = _env(cluster, "alice", "alice-pw")
    ok(
        "topic",
        "create",
        "orders",
        "--partitions",
        "1",
        "--replication-factor",
        "1",
        *ca,
        env=admin,
    )
    assert ok("acl", "list", *ca, env=admin).startswith("no ACLs")

    out = ok(
        "acl", "add", "--principal", "User:alice", "--allow", "--operation", "write",
        "--topic", "orders", *ca, env=admin,
    )  # fmt: skip
    assert out == "added: User:alice allow write topic literal orders\n"
    ok("acl", "add", "--principal", "alice", "--operation", "read", "--topic", "ord", "--prefixed",
       *ca, env=admin)  # fmt: skip
    listed = ok("acl", "list", *ca, env=admin).splitlines()
    assert listed[0].split() == [
        "PRINCIPAL",
        "PERMISSION",
        "OPERATION",
        "RESOURCE",
        "PATTERN",
        "NAME",
    ]
    assert [line.split() for line in listed[1:]] == [
        ["User:alice", "allow", "read", "topic", "prefixed", "ord"],
        ["User:alice", "allow", "write", "topic", "literal", "orders"],
    ]
    only = ok("acl", "list", "--principal", "User:nobody", *ca, env=admin)
    assert only == "no ACLs\n"

    # alice may write orders, and nothing else: the ACLs are on.
    assert ok("produce", "orders", *ca, env=alice, stdin=b"one\n").startswith("produced 1 of 1")
    denied = refused("topic", "create", "other", "--partitions", "1", "--replication-factor", "1",
                     *ca, env=alice)  # fmt: skip
    assert "NOT_AUTHORIZED" in denied and "User:alice" in denied
    denied = refused("acl", "list", *ca, env=alice)
    assert "NOT_AUTHORIZED" in denied

    removed = ok(
        "acl", "remove", "--principal", "User:alice", "--operation", "write", "--topic",
        "orders", *ca, env=admin,
    )  # fmt: skip
    assert removed == "removed: User:alice allow write topic literal orders\n"
    again = ok(
        "acl", "remove", "--principal", "User:alice", "--operation", "write", "--topic",
        "orders", *ca, env=admin,
    )  # fmt: skip
    assert again.startswith("no such ACL")
    assert "NOT_AUTHORIZED" in refused("produce", "orders", *ca, env=alice, stdin=b"two\n")


def test_client_commands_refuse_bad_credentials_and_missing_tls(
    secure: tuple[SecureCluster, DevSecurity],
) -> None:
    cluster, security = secure
    ca = ["--tls-ca", security.pki.ca]
    wrong = refused("topic", "list", *ca, env=_env(cluster, "admin", "wrong"))
    assert "AUTH_FAILED" in wrong
    no_password = _env(cluster, "admin", "")
    del no_password["KAFKAESQUE_PASSWORD"]
    assert "needs a password" in refused("topic", "list", *ca, env=no_password)
    plain = refused("topic", "list", "--sasl-mechanism", "PLAIN", env=_env(cluster, "admin", "x"))
    assert "PLAIN sends the password" in plain
    # Without --tls-ca the system's CAs do not trust the test CA.
    untrusted = refused("topic", "list", "--tls", env=_env(cluster, "admin", security.password))
    assert "AUTH_FAILED" in untrusted and "certificate verify failed" in untrusted
    ok("topic", "list", *ca, env=_env(cluster, "admin", security.password))


def test_membership_and_placement_commands_need_the_cluster_admin_right(
    secure: tuple[SecureCluster, DevSecurity],
) -> None:
    """Issue 37 point 7: ``broker add``, ``topic reassign`` and ``topic elect-leaders`` say
    NOT_AUTHORIZED to a user without ``admin`` on the cluster, in one line."""
    cluster, security = secure
    ca = ["--tls-ca", security.pki.ca]
    alice = _env(cluster, "alice", "alice-pw")
    admin = _env(cluster, "admin", security.password)
    # One ACL closes the cluster (without any, everyone authenticated may do anything).
    acl = ("--principal", "User:alice", "--operation", "read", "--topic", "placement-only")
    ok("acl", "add", *acl, *ca, env=admin)
    for args in (
        ("broker", "add", "5", "127.0.0.1:1", "127.0.0.1:2"),
        ("topic", "elect-leaders"),
    ):
        denied = refused(*args, *ca, env=alice)
        assert "NOT_AUTHORIZED" in denied and "User:alice" in denied, (args, denied)
    elected = ok("topic", "elect-leaders", *ca, env=admin)
    assert elected.startswith("TOPIC") and "pending" not in elected, elected
    ok("acl", "remove", *acl, *ca, env=admin)


def test_acl_options_are_checked_before_connecting(tmp_path: Path) -> None:
    env = {"KAFKAESQUE_BOOTSTRAP": "127.0.0.1:1"}
    bad_principal = refused(
        "acl", "add", "--principal", "User:", "--operation", "read", "--topic", "t", env=env
    )
    assert "--principal 'User:'" in bad_principal
    bad = refused("acl", "add", "--principal", "User:a", "--operation", "read", "--topic", "a/b",
                  env=env)  # fmt: skip
    assert "--topic 'a/b'" in bad
    star = refused("acl", "add", "--principal", "User:a", "--operation", "read", "--group", "*",
                   "--prefixed", env=env)  # fmt: skip
    assert "not *" in star
    usage = kafkaesque("acl", "add", "--principal", "User:a", "--operation", "fly", "--topic", "t")
    assert usage.returncode == 2 and "invalid choice" in usage.stderr
