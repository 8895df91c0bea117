"""The users file: salted SCRAM-SHA-256 credentials, one user a line, never a password.

``<name>:SCRAM-SHA-256:<iterations>:<b64 salt>:<b64 StoredKey>:<b64 ServerKey>``; ``#`` comments
and blank lines are ignored. The line protocol (SCRAM, PLAIN) and MQTT (CONNECT's password,
checked with ``verify_password``) read the same file.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Final

from ._scram import MECHANISM, MIN_ITERATIONS, ScramCredential, derive_credential

log = logging.getLogger(__name__)

_RELOAD_EVERY_S: Final = 1.0
_KEY_BYTES: Final = 32


class UsersFileError(Exception):
    """A users file that cannot be read or has a bad line; the message names the file and line."""


def _plaintext_refused(where: str) -> UsersFileError:
    return UsersFileError(
        f"{where}: not a salted SCRAM-SHA-256 entry (plaintext passwords are no longer "
        "accepted): convert the file with `kafkaesque user import FILE --users-file NEW`"
    )


def check_username(name: str) -> None:
    """ValueError unless ``name`` can be a user: not empty, no ':', no whitespace or control
    characters, not starting with '#' (the file's comments)."""
    if not name:
        raise ValueError("a user name must not be empty")
    if ":" in name or name.startswith("#"):
        raise ValueError(f"a user name must not contain ':' nor start with '#': {name!r}")
    if any(c.isspace() or not c.isprintable() for c in name):
        raise ValueError(f"a user name must not contain spaces or control characters: {name!r}")


def format_entry(name: str, credential: ScramCredential) -> str:
    """One line of the file (without the newline)."""
    check_username(name)
    b64 = base64.b64encode
    return ":".join(
        (
            name,
            MECHANISM,
            str(credential.iterations),
            b64(credential.salt).decode("ascii"),
            b64(credential.stored_key).decode("ascii"),
            b64(credential.server_key).decode("ascii"),
        )
    )


def parse_entry(line: str, where: str) -> tuple[str, ScramCredential]:
    """(name, credential) of one line; UsersFileError naming ``where`` (``FILE line N``)."""
    fields = line.split(":")
    if len(fields) != 6 or fields[1] != MECHANISM or not fields[0]:
        raise _plaintext_refused(where)
    name, _, iterations_text, salt_text, stored_text, server_text = fields
    if not iterations_text.isdigit():
        raise _plaintext_refused(where)
    iterations = int(iterations_text)
    if iterations < MIN_ITERATIONS:
        raise UsersFileError(
            f"{where}: user {name!r} has {iterations} SCRAM iterations, fewer than the minimum "
            f"{MIN_ITERATIONS}: set the password again with `kafkaesque user add`"
        )
    try:
        salt, stored_key, server_key = (
            base64.b64decode(text, validate=True) for text in (salt_text, stored_text, server_text)
        )
    except (binascii.Error, ValueError):
        raise UsersFileError(f"{where}: user {name!r}: bad base64") from None
    if not salt or len(stored_key) != _KEY_BYTES or len(server_key) != _KEY_BYTES:
        raise UsersFileError(f"{where}: user {name!r}: wrong salt or key length")
    return name, ScramCredential(salt, iterations, stored_key, server_key)


def parse_users(text: str, path: str) -> dict[str, ScramCredential]:
    """The users of a file's ``text``; UsersFileError on a bad line or a user twice."""
    users: dict[str, ScramCredential] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{path} line {number}"
        name, credential = parse_entry(line, where)
        if name in users:
            raise UsersFileError(f"{where}: user {name!r} appears twice")
        users[name] = credential
    return users


def load_users(path: str | os.PathLike[str]) -> dict[str, ScramCredential]:
    """The users of the file at ``path``; UsersFileError if unreadable or malformed."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsersFileError(f"{os.fspath(path)}: cannot read the users file: {exc}") from exc
    return parse_users(text, os.fspath(path))


def save_users(path: str | os.PathLike[str], users: Mapping[str, ScramCredential]) -> None:
    """Write ``users`` to ``path`` atomically, mode 0600: a temporary file in the same
    directory, fsynced, renamed over ``path``, then the directory fsynced. A reader sees the
    old file or the new one, never half of one. ValueError for a bad user name."""
    lines = [format_entry(name, users[name]) for name in sorted(users)]
    text = "# kafkaesque users: name:SCRAM-SHA-256:iterations:salt:StoredKey:ServerKey\n"
    text += "".join(line + "\n" for line in lines)
    target = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(target))
    fd, temporary = tempfile.mkstemp(dir=directory, prefix=".users.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(f.fileno(), 0o600)  # mkstemp's mode already; said for the reader
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    directory_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(directory_fd)  # the rename itself survives a crash
    finally:
        os.close(directory_fd)


def import_plaintext(lines: Iterable[str]) -> dict[str, ScramCredential]:
    """Credentials for the old MQTT ``user:password`` lines (``#`` comments, blank lines
    skipped; each line stripped, the password is what follows the first ':'). A line that is
    already a SCRAM entry is kept as it is, so importing twice is harmless. UsersFileError
    (``line N: ...``) on a line without ':' or a bad name, or a user twice."""
    users: dict[str, ScramCredential] = {}
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, password = line.partition(":")
        if password.startswith(MECHANISM + ":"):
            name, credential = parse_entry(line, f"line {number}")
        else:
            if not sep or not password:
                raise UsersFileError(f"line {number}: expected user:password")
            try:
                check_username(name)
            except ValueError as exc:
                raise UsersFileError(f"line {number}: {exc}") from None
            credential = derive_credential(password)
        if name in users:
            raise UsersFileError(f"line {number}: user {name!r} appears twice")
        users[name] = credential
    return users


class UserStore:
    """The users of a file, reloaded when it changes, for a broker to look credentials up.

    ``credential(name)`` checks the file's identity (mtime, size, inode) at most once a second
    (``clock`` seconds) and reloads it when it changed; a reload that fails keeps the old users
    and logs the error. The first load happens in the constructor and raises UsersFileError:
    a broker with a bad users file does not start.
    """

    def __init__(
        self, path: str | os.PathLike[str], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.path = os.fspath(path)
        self._clock = clock
        self._identity = self._stat()
        self._users = load_users(self.path)
        self._checked_at = clock()

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def credential(self, name: str) -> ScramCredential | None:
        """``name``'s credential, or None for an unknown user."""
        now = self._clock()
        if now - self._checked_at >= _RELOAD_EVERY_S:
            self._checked_at = now
            self.reload_if_changed()
        return self._users.get(name)

    def names(self) -> list[str]:
        """The user names, sorted (as last loaded)."""
        return sorted(self._users)

    def reload_if_changed(self) -> bool:
        """Reload now if the file changed; whether the users were replaced."""
        identity = self._stat()
        if identity == self._identity:
            return False
        try:
            users = load_users(self.path)
        except UsersFileError as exc:
            log.error("users file not reloaded, keeping the %d users: %s", len(self._users), exc)
            self._identity = identity  # do not log again until it changes again
            return False
        self._identity = identity
        self._users = users
        log.info("users file %s reloaded: %d users", self.path, len(users))
        return True
