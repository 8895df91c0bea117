"""The users file: salted credentials only, written atomically with mode 0600, reloaded when
it changes; the old plaintext format refused with the command that converts it."""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from kafkaesque.security import (
    ScramClient,
    ScramServer,
    UsersFileError,
    UserStore,
    check_username,
    derive_credential,
    import_plaintext,
    load_users,
    save_users,
    verify_password,
)
from kafkaesque.security._users import format_entry

ALICE = derive_credential("alice-pw")
BOB = derive_credential("bob-pw", iterations=5000)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_save_load_round_trip_with_mode_0600(tmp_path: Path) -> None:
    path = tmp_path / "users"
    save_users(path, {"bob": BOB, "alice": ALICE})
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert load_users(path) == {"alice": ALICE, "bob": BOB}
    text = path.read_text()
    assert "alice-pw" not in text and "bob-pw" not in text
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert lines[0].startswith("alice:SCRAM-SHA-256:4096:")
    assert lines[1].startswith("bob:SCRAM-SHA-256:5000:")
    assert [p.name for p in tmp_path.iterdir()] == ["users"]  # no temporary file left


def test_save_replaces_a_file_with_a_wider_mode(tmp_path: Path) -> None:
    path = tmp_path / "users"
    path.write_text("")
    path.chmod(0o644)
    save_users(path, {"alice": ALICE})
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    save_users(path, {})
    assert load_users(path) == {}


def test_comments_and_blank_lines_are_ignored(tmp_path: Path) -> None:
    path = tmp_path / "users"
    path.write_text(f"# users\n\n   \n{format_entry('alice', ALICE)}\n  # more\n")
    assert load_users(path) == {"alice": ALICE}


def test_a_loaded_credential_authenticates(tmp_path: Path) -> None:
    path = tmp_path / "users"
    save_users(path, {"alice": ALICE})
    users = load_users(path)
    assert verify_password(users["alice"], "alice-pw")
    server, client = ScramServer(users.get), ScramClient("alice", "alice-pw")
    client.verify(server.final(client.final(server.first(client.first()))))


@pytest.mark.parametrize("line", ["alice:secret", "alice", "alice:SCRAM-SHA-1:4096:a:b:c"])
def test_plaintext_line_is_refused_with_the_import_command(tmp_path: Path, line: str) -> None:
    path = tmp_path / "users"
    path.write_text(f"# old\n{format_entry('bob', BOB)}\n{line}\n")
    with pytest.raises(UsersFileError) as failure:
        load_users(path)
    assert str(failure.value) == (
        f"{path} line 3: not a salted SCRAM-SHA-256 entry (plaintext passwords are no longer "
        "accepted): convert the file with `kafkaesque user import FILE --users-file NEW`"
    )


def test_fewer_than_4096_iterations_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "users"
    weak = format_entry("alice", ALICE).replace(":4096:", ":4095:")
    path.write_text(weak + "\n")
    with pytest.raises(UsersFileError, match=r"line 1: user 'alice' has 4095 .*minimum 4096"):
        load_users(path)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda e: e[: e.rindex(":") + 1] + "!!", "bad base64"),
        (lambda e: e[: e.rindex(":") + 1] + "AAAA", "key length"),
        (lambda e: e + "\n" + e, "appears twice"),
    ],
)
def test_other_bad_entries(tmp_path: Path, change: Callable[[str], str], why: str) -> None:
    path = tmp_path / "users"
    path.write_text(change(format_entry("alice", ALICE)) + "\n")
    with pytest.raises(UsersFileError, match=why):
        load_users(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UsersFileError, match="cannot read"):
        load_users(tmp_path / "absent")


@pytest.mark.parametrize("name", ["", "a:b", "#a", "a b", "a\nb", "a\tb"])
def test_bad_user_names_are_not_saved(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError):
        check_username(name)
    with pytest.raises(ValueError):
        save_users(tmp_path / "users", {name: ALICE})
    assert not (tmp_path / "users").exists()


def test_import_plaintext() -> None:
    old = ["# mqtt users", "", "phone-1:pa:ss:word", "  phone-2:x  ", format_entry("alice", ALICE)]
    users = import_plaintext(old)
    assert sorted(users) == ["alice", "phone-1", "phone-2"]
    assert verify_password(users["phone-1"], "pa:ss:word")
    assert verify_password(users["phone-2"], "x")
    assert users["alice"] == ALICE  # already converted: kept as it is
    for bad, why in ((["nopassword"], "line 1: expected"), (["a:x", "a:y"], "line 2: user 'a'")):
        with pytest.raises(UsersFileError, match=why):
            import_plaintext(bad)


def test_user_store_reloads_on_change(tmp_path: Path) -> None:
    path = tmp_path / "users"
    save_users(path, {"alice": ALICE})
    clock = Clock()
    store = UserStore(path, clock=clock)
    assert store.credential("alice") == ALICE
    assert store.credential("bob") is None
    save_users(path, {"alice": ALICE, "bob": BOB})
    assert store.credential("bob") is None  # checked at most once a second
    clock.now += 1.0
    assert store.credential("bob") == BOB
    assert store.names() == ["alice", "bob"]


def test_user_store_keeps_the_old_users_when_a_reload_fails(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "users"
    save_users(path, {"alice": ALICE})
    clock = Clock()
    store = UserStore(path, clock=clock)
    path.write_text("alice:plaintext\n")
    clock.now += 5
    with caplog.at_level(logging.ERROR, logger="kafkaesque.security._users"):
        assert store.credential("alice") == ALICE
    assert "not a salted SCRAM-SHA-256 entry" in caplog.text
    path.unlink()
    clock.now += 5
    assert store.credential("alice") == ALICE
    save_users(path, {"bob": BOB})
    clock.now += 5
    assert store.credential("alice") is None
    assert store.credential("bob") == BOB


def test_user_store_refuses_a_bad_file_at_start(tmp_path: Path) -> None:
    path = tmp_path / "users"
    path.write_text("alice:plaintext\n")
    with pytest.raises(UsersFileError):
        UserStore(path)
