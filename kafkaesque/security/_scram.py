"""SASL SCRAM-SHA-256 (RFC 5802, RFC 7677) and PLAIN (RFC 4616), sans I/O.

A ``ScramServer`` or ``ScramClient`` is one exchange: feed it the peer's bytes, send what it
returns. Neither touches a socket, a clock or a file; the broker and the client move the bytes
(in ``AUTH`` lines). Only ``n,,`` and ``y,,`` GS2 headers are accepted: channel binding is not
offered (TLS below already binds the connection to the server's certificate).
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

MECHANISM: Final = "SCRAM-SHA-256"
PLAIN_MECHANISM: Final = "PLAIN"
MIN_ITERATIONS: Final = 4096  # RFC 7677 §4: at least 4096
_MAX_CLIENT_ITERATIONS: Final = 1_000_000  # a client will not spend minutes on a hostile server
_SALT_BYTES: Final = 16
_KEY_BYTES: Final = 32  # SHA-256
_FAILED: Final = "authentication failed"
# Unknown users get a salt derived from their name with this process's key: the same name always
# gets the same salt (asking twice does not reveal that one of them is fake), and the salt cannot
# be told from a real one without the key.
_FAKE_SALT_KEY: Final = secrets.token_bytes(32)


class AuthenticationFailed(Exception):
    """The exchange failed: a wrong password, an unknown user, a malformed or out-of-order
    message, a replay. ``str(exc)`` is safe to send to the peer: a wrong password and an unknown
    user give the same text, "authentication failed"."""


@dataclass(frozen=True, slots=True)
class ScramCredential:
    """What the server keeps of a password (RFC 5802 §3): never the password itself.

    ``stored_key`` = H(HMAC(SaltedPassword, "Client Key")), ``server_key`` =
    HMAC(SaltedPassword, "Server Key"), SaltedPassword = PBKDF2-HMAC-SHA-256(password, salt,
    iterations)."""

    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


@functools.lru_cache(maxsize=16)
def _salted_password(password: str, salt: bytes, iterations: int) -> bytes:
    # Cached: a client opening many connections (bench, jepsen_like) derives once per password.
    return hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), salt, iterations)


def _hmac(key: bytes, message: bytes) -> bytes:
    return hmac.digest(key, message, "sha256")


def _xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b, strict=True))


def _keys(salted: bytes) -> tuple[bytes, bytes, bytes]:
    """(ClientKey, StoredKey, ServerKey) of a salted password."""
    client_key = _hmac(salted, b"Client Key")
    return client_key, hashlib.sha256(client_key).digest(), _hmac(salted, b"Server Key")


def derive_credential(
    password: str, *, salt: bytes | None = None, iterations: int = MIN_ITERATIONS
) -> ScramCredential:
    """The credential of ``password`` with a new random 16-byte salt (or ``salt``).

    Raises ValueError for fewer than MIN_ITERATIONS iterations or an empty salt. The password is
    used as its UTF-8 bytes (no SASLprep normalisation, as Kafka)."""
    if iterations < MIN_ITERATIONS:
        raise ValueError(f"SCRAM iterations must be at least {MIN_ITERATIONS}, not {iterations}")
    if salt is None:
        salt = secrets.token_bytes(_SALT_BYTES)
    if not salt:
        raise ValueError("SCRAM salt must not be empty")
    _, stored_key, server_key = _keys(_salted_password(password, salt, iterations))
    return ScramCredential(salt, iterations, stored_key, server_key)


def verify_password(credential: ScramCredential, password: str) -> bool:
    """Whether ``password`` is the one ``credential`` was derived from (PLAIN, MQTT CONNECT).

    Compares in constant time."""
    salted = hashlib.pbkdf2_hmac(
        "sha256", password.encode("utf-8"), credential.salt, credential.iterations
    )
    _, stored_key, server_key = _keys(salted)
    # Both keys, so a credential with a tampered ServerKey is not half-accepted.
    expected = credential.stored_key + credential.server_key
    return hmac.compare_digest(stored_key + server_key, expected)


def escape_username(name: str) -> str:
    """RFC 5802 §5.1 ``saslname``: '=' as '=3D', ',' as '=2C'."""
    return name.replace("=", "=3D").replace(",", "=2C")


def unescape_username(text: str) -> str:
    """The inverse of ``escape_username``; raises AuthenticationFailed on a bad '=' escape."""
    parts = text.split("=")
    out = [parts[0]]
    for part in parts[1:]:
        if part[:2] == "3D":
            out.append("=" + part[2:])
        elif part[:2] == "2C":
            out.append("," + part[2:])
        else:
            raise AuthenticationFailed("malformed SCRAM message: bad '=' escape in the username")
    return "".join(out)


def new_nonce() -> str:
    """24 random printable characters (base64url: no ',')."""
    return secrets.token_urlsafe(18)


def _valid_nonce(nonce: str) -> bool:
    # RFC 5802: printable ASCII but ','.
    return bool(nonce) and all(0x21 <= ord(c) <= 0x7E and c != "," for c in nonce)


def _text(message: bytes) -> str:
    try:
        return message.decode("utf-8")
    except UnicodeDecodeError:
        raise AuthenticationFailed("malformed SCRAM message: not UTF-8") from None


def _attributes(text: str, expected: str) -> list[tuple[str, str]]:
    """``a=v,b=w`` as pairs, whose names must start with ``expected`` (in order)."""
    pairs: list[tuple[str, str]] = []
    for part in text.split(","):
        if len(part) < 2 or part[1] != "=" or not part[0].isalpha():
            raise AuthenticationFailed("malformed SCRAM message")
        pairs.append((part[0], part[2:]))
    names = "".join(name for name, _ in pairs)
    if not names.startswith(expected):
        raise AuthenticationFailed(f"malformed SCRAM message: expected attributes {expected!r}")
    return pairs


def _b64decode(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise AuthenticationFailed("malformed SCRAM message: bad base64") from None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _fake_credential(username: str) -> ScramCredential:
    """A credential for a user who does not exist: it answers first() like a real one, and no
    proof matches it (its StoredKey is random)."""
    salt = _hmac(_FAKE_SALT_KEY, b"salt:" + username.encode("utf-8"))[:_SALT_BYTES]
    return ScramCredential(salt, MIN_ITERATIONS, secrets.token_bytes(32), secrets.token_bytes(32))


class ScramServer:
    """The server side of one SCRAM-SHA-256 exchange.

    ``first(client_first)`` returns server-first; ``final(client_final)`` returns server-final
    (``v=...``) when the proof is right. Every failure raises AuthenticationFailed and ends the
    exchange: any later call raises too (an exchange is used once, so a replayed client-final
    is refused; on a new exchange it fails because the server nonce differs). ``lookup`` returns
    a user's credential or None; an unknown user is answered with a fake salt derived from the
    name, and fails at ``final`` with the same message as a wrong password.
    """

    def __init__(
        self,
        lookup: Callable[[str], ScramCredential | None],
        nonce: Callable[[], str] | None = None,
    ) -> None:
        self._lookup = lookup
        self._new_nonce = nonce or new_nonce
        self._state = "first"  # first -> final -> done; any failure -> failed
        self._username: str | None = None
        self._credential: ScramCredential | None = None
        self._known = False
        self._gs2_header = ""
        self._client_first_bare = ""
        self._server_first = ""
        self._nonce = ""

    @property
    def username(self) -> str:
        """The (unescaped) user name the client gave; ValueError before ``first``."""
        if self._username is None:
            raise ValueError("no username before first()")
        return self._username

    @property
    def done(self) -> bool:
        """Whether ``final`` succeeded: the client proved it knows the password."""
        return self._state == "done"

    def first(self, client_first: bytes) -> bytes:
        """Server-first (``r=<nonce>,s=<salt>,i=<iterations>``) for the client-first message."""
        if self._state != "first":
            self._state = "failed"
            raise AuthenticationFailed("SCRAM message out of order")
        self._state = "failed"  # until this step succeeds
        text = _text(client_first)
        parts = text.split(",", 2)
        if len(parts) != 3:
            raise AuthenticationFailed("malformed SCRAM client-first message")
        cbind, authzid, bare = parts
        if cbind.startswith("p="):
            raise AuthenticationFailed("SCRAM channel binding is not supported")
        if cbind not in ("n", "y"):
            raise AuthenticationFailed("malformed SCRAM client-first message")
        attributes = _attributes(bare, "nr")
        if any(name == "m" for name, _ in attributes):
            raise AuthenticationFailed("SCRAM mandatory extensions are not supported")
        username = unescape_username(attributes[0][1])
        client_nonce = attributes[1][1]
        if not username or not _valid_nonce(client_nonce):
            raise AuthenticationFailed("malformed SCRAM client-first message")
        if authzid and (not authzid.startswith("a=") or unescape_username(authzid[2:]) != username):
            raise AuthenticationFailed("SCRAM authorization identity must be the username")
        server_nonce = self._new_nonce()
        if not _valid_nonce(server_nonce):
            raise ValueError(f"bad server nonce {server_nonce!r}")
        credential = self._lookup(username)
        self._known = credential is not None
        self._credential = credential or _fake_credential(username)
        self._username = username
        self._gs2_header = f"{cbind},{authzid},"
        self._client_first_bare = bare
        self._nonce = client_nonce + server_nonce
        self._server_first = (
            f"r={self._nonce},s={_b64(self._credential.salt)},i={self._credential.iterations}"
        )
        self._state = "final"
        return self._server_first.encode("ascii")

    def final(self, client_final: bytes) -> bytes:
        """Server-final (``v=<ServerSignature>``) if the client's proof is right."""
        if self._state != "final":
            self._state = "failed"
            raise AuthenticationFailed("SCRAM message out of order")
        self._state = "failed"
        text = _text(client_final)
        without_proof, sep, proof_attr = text.rpartition(",p=")
        if not sep:
            raise AuthenticationFailed("malformed SCRAM client-final message")
        attributes = _attributes(without_proof, "cr")
        if _b64decode(attributes[0][1]) != self._gs2_header.encode("utf-8"):
            raise AuthenticationFailed("SCRAM channel binding data does not match")
        # The nonce must end with the one server-first sent (RFC 5802 wants it equal): Kafka
        # checks only that (ScramSaslServer), and librdkafka, kcat's too, sends its own nonce
        # once more before it. The server's fresh part is still there, so a replayed exchange
        # still fails, and the proof covers the nonce as sent.
        nonce = attributes[1][1].encode()
        expected = self._nonce.encode()
        if len(nonce) < len(expected) or not hmac.compare_digest(
            nonce[len(nonce) - len(expected) :], expected
        ):
            raise AuthenticationFailed("SCRAM nonce does not match")
        proof = _b64decode(proof_attr)
        credential = self._credential
        assert credential is not None  # set by first()
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        signature = _hmac(credential.stored_key, auth_message)
        if len(proof) != len(signature):
            raise AuthenticationFailed(_FAILED)
        client_key = _xor(proof, signature)
        matches = hmac.compare_digest(hashlib.sha256(client_key).digest(), credential.stored_key)
        if not (matches and self._known):
            raise AuthenticationFailed(_FAILED)
        self._state = "done"
        return f"v={_b64(_hmac(credential.server_key, auth_message))}".encode("ascii")


class ScramClient:
    """The client side of one SCRAM-SHA-256 exchange: ``first()``, ``final(server_first)``,
    ``verify(server_final)``. ``verify`` checks the server's signature (mutual authentication: a
    server without the credential cannot produce it) and raises AuthenticationFailed if wrong."""

    def __init__(self, username: str, password: str, nonce: str | None = None) -> None:
        if not username:
            raise ValueError("SCRAM username must not be empty")
        self._username = username
        self._password = password
        self._nonce = nonce if nonce is not None else new_nonce()
        if not _valid_nonce(self._nonce):
            raise ValueError(f"bad client nonce {self._nonce!r}")
        self._state = "first"
        self._client_first_bare = f"n={escape_username(username)},r={self._nonce}"
        self._server_signature = b""

    def first(self) -> bytes:
        """Client-first: ``n,,n=<user>,r=<nonce>``."""
        if self._state != "first":
            raise AuthenticationFailed("SCRAM message out of order")
        self._state = "final"
        return f"n,,{self._client_first_bare}".encode()

    def final(self, server_first: bytes) -> bytes:
        """Client-final (``c=biws,r=<nonce>,p=<proof>``) for the server-first message."""
        if self._state != "final":
            raise AuthenticationFailed("SCRAM message out of order")
        self._state = "failed"
        text = _text(server_first)
        if text.startswith("e="):
            raise AuthenticationFailed(f"server refused: {text[2:]}")
        attributes = _attributes(text, "rsi")
        nonce, salt_text, iterations_text = (value for _, value in attributes[:3])
        if not nonce.startswith(self._nonce) or len(nonce) == len(self._nonce):
            raise AuthenticationFailed("SCRAM server nonce does not extend the client's")
        if not _valid_nonce(nonce):
            raise AuthenticationFailed("malformed SCRAM server-first message")
        salt = _b64decode(salt_text)
        if not iterations_text.isdigit() or not salt:
            raise AuthenticationFailed("malformed SCRAM server-first message")
        iterations = int(iterations_text)
        if not MIN_ITERATIONS <= iterations <= _MAX_CLIENT_ITERATIONS:
            raise AuthenticationFailed(f"SCRAM iteration count {iterations} out of range")
        client_key, stored_key, server_key = _keys(
            _salted_password(self._password, salt, iterations)
        )
        without_proof = f"c={_b64(b'n,,')},r={nonce}"
        auth_message = f"{self._client_first_bare},{text},{without_proof}".encode()
        proof = _xor(client_key, _hmac(stored_key, auth_message))
        self._server_signature = _hmac(server_key, auth_message)
        self._state = "verify"
        return f"{without_proof},p={_b64(proof)}".encode()

    def verify(self, server_final: bytes) -> None:
        """Check server-final; raises AuthenticationFailed unless ``v=`` is the right signature."""
        if self._state != "verify":
            raise AuthenticationFailed("SCRAM message out of order")
        self._state = "failed"
        text = _text(server_final)
        if text.startswith("e="):
            raise AuthenticationFailed(f"server refused: {text[2:]}")
        attributes = _attributes(text, "v")
        signature = _b64decode(attributes[0][1])
        if not hmac.compare_digest(signature, self._server_signature):
            raise AuthenticationFailed("the server's SCRAM signature is wrong")
        self._state = "done"


def parse_plain(message: bytes) -> tuple[str, str]:
    """(user, password) of a PLAIN message ``authzid NUL user NUL password`` (RFC 4616).

    Raises AuthenticationFailed if malformed, if user or password is empty, or if authzid is
    neither empty nor the user."""
    parts = message.split(b"\0")
    if len(parts) != 3:
        raise AuthenticationFailed("malformed PLAIN message")
    try:
        authzid, user, password = (part.decode("utf-8") for part in parts)
    except UnicodeDecodeError:
        raise AuthenticationFailed("malformed PLAIN message: not UTF-8") from None
    if not user or not password:
        raise AuthenticationFailed("malformed PLAIN message")
    if authzid and authzid != user:
        raise AuthenticationFailed("PLAIN authorization identity must be the username")
    return user, password


def plain_message(user: str, password: str) -> bytes:
    """The PLAIN message for ``user`` and ``password`` (empty authzid); ValueError on a NUL."""
    if "\0" in user or "\0" in password:
        raise ValueError("PLAIN user and password must not contain NUL")
    return f"\0{user}\0{password}".encode()
