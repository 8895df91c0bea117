"""``--secure`` runs: TLS on every broker port, SCRAM users, mutual TLS between brokers.

``SecureSetup.make`` writes a development PKI (``kafkaesque.cli._dev_pki``: a CA, a certificate
per broker whose alternative names are every address a broker is reached at) and a users file
with one generated user, and draws a random cluster secret. Brokers then start with
``--client-tls --peer-tls --admin-tls``, their certificate, ``--users-file`` and the secret in
``KAFKAESQUE_CLUSTER_SECRET`` (``broker_args``, ``broker_env``); every client of the run, the
workload's (``client_security``: SASL_SSL) and the harness's own line-protocol questions
(``open_stream``: TLS, then the SCRAM exchange of ``AUTH``, docs/protocol.md), authenticates as
that user. The user is a super user: the run tests the transport, not ACLs.
"""

from __future__ import annotations

import base64
import os
import ssl
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import trio
from kafkaesque.cli._dev_pki import DevPki, make_dev_pki, random_secret, write_users

USER = "jepsen"
_LINE_LIMIT = 64 * 1024  # an AUTH reply is a few hundred bytes


class AuthError(OSError):
    """The broker refused the TLS handshake or the SCRAM exchange (an ``OSError``, so that the
    harness treats it as a broker it could not ask)."""


@dataclass(frozen=True)
class SecureSetup:
    """The certificates, user and secret of one secure run (see the module docstring)."""

    pki: DevPki
    users_file: str
    username: str
    password: str = field(repr=False)
    cluster_secret: str = field(repr=False)

    @classmethod
    def make(cls, directory: str, nodes: Iterable[int], hosts: Iterable[str]) -> SecureSetup:
        """Write the PKI and users file into ``directory``; ``hosts`` are the addresses brokers
        are reached at (their own, proxies'), added to 127.0.0.1 and localhost."""
        names = list(dict.fromkeys(["127.0.0.1", "localhost", *hosts]))
        pki = make_dev_pki(os.path.join(directory, "pki"), nodes, hosts=names)
        password = random_secret()
        users_file = os.path.join(directory, "users")
        write_users(users_file, {USER: password})
        return cls(pki, users_file, USER, password, random_secret())

    def broker_args(self, node: int) -> list[str]:
        """The security flags of broker ``node``'s command line."""
        return [
            *self.pki.broker_args(node),
            "--client-tls", "--peer-tls", "--admin-tls",
            "--users-file", self.users_file,
            "--super-users", f"User:{self.username}",
        ]  # fmt: skip

    def broker_env(self) -> dict[str, str]:
        """Environment of every broker: the cluster's secret (never on a command line)."""
        return {"KAFKAESQUE_CLUSTER_SECRET": self.cluster_secret}

    def client_security(self) -> Any:
        """``kafkaesque.client.Security`` for SASL_SSL as this run's user."""
        from kafkaesque.client import Security

        return Security(
            protocol="SASL_SSL",
            sasl_mechanism="SCRAM-SHA-256",
            username=self.username,
            password=self.password,
            ssl_cafile=self.pki.ca,
        )

    def ssl_context(self) -> ssl.SSLContext:
        """A client context that trusts the run's CA (and checks the broker's name)."""
        return ssl.create_default_context(cafile=self.pki.ca)

    async def open_stream(self, address: tuple[str, int]) -> trio.abc.Stream:
        """A line-protocol connection to ``address``: TCP, TLS, then ``AUTH SCRAM-SHA-256``
        until ``+OK authenticated`` (the server's signature checked). ``OSError`` (``AuthError``
        for a refusal) if it cannot; the stream is closed then."""
        tcp = await trio.open_tcp_stream(*address)
        stream = trio.SSLStream(tcp, self.ssl_context(), server_hostname=address[0])
        try:
            await stream.do_handshake()
            await scram_login(stream, self.username, self.password)
        except (trio.BrokenResourceError, ssl.SSLError) as exc:
            await trio.aclose_forcefully(stream)
            raise AuthError(f"TLS to {address[0]}:{address[1]}: {exc}") from exc
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise
        return stream


async def scram_login(stream: trio.abc.Stream, username: str, password: str) -> None:
    """The SCRAM-SHA-256 exchange of the line protocol's ``AUTH`` on ``stream`` (nothing else
    may be in flight on it). Raises ``AuthError`` on a refusal or a wrong server signature."""
    from kafkaesque.security import AuthenticationFailed, ScramClient

    scram = ScramClient(username, password)
    reader = _LineReader(stream)
    reply = await _auth(stream, reader, scram.first())
    kind, _, payload = _auth_reply(reply)
    if kind != "continue":
        raise AuthError(f"AUTH answered {reply!r} to the first message")
    reply = await _auth(stream, reader, scram.final(payload))
    kind, _, payload = _auth_reply(reply)
    if kind != "authenticated":
        raise AuthError(f"AUTH answered {reply!r} to the final message")
    try:
        scram.verify(payload)
    except AuthenticationFailed as exc:
        raise AuthError(f"the broker's SCRAM signature is wrong: {exc}") from exc


async def _auth(stream: trio.abc.Stream, reader: _LineReader, message: bytes) -> str:
    await stream.send_all(b"AUTH SCRAM-SHA-256 " + base64.b64encode(message) + b"\r\n")
    reply = await reader.line()
    if not reply.startswith("+OK "):
        raise AuthError(f"AUTH refused: {reply}")
    return reply


def _auth_reply(text: str) -> tuple[str, str | None, bytes]:
    """``+OK continue <b64>`` or ``+OK authenticated <user> [<b64>]`` (docs/protocol.md)."""
    parts = text.split()
    try:
        if parts[1] == "continue" and len(parts) == 3:
            return "continue", None, base64.b64decode(parts[2], validate=True)
        if parts[1] == "authenticated" and len(parts) in (3, 4):
            payload = base64.b64decode(parts[3], validate=True) if len(parts) == 4 else b""
            return "authenticated", parts[2], payload
    except (IndexError, ValueError):
        pass
    raise AuthError(f"AUTH answered {text!r}")


class _LineReader:
    """Reads ``\\r\\n``-ended lines from a stream; keeps what follows the line."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.buffer = b""

    async def line(self) -> str:
        while b"\r\n" not in self.buffer:
            if len(self.buffer) > _LINE_LIMIT:
                raise AuthError("a reply line longer than 64 KiB")
            chunk = await self.stream.receive_some(4096)
            if not chunk:
                raise AuthError("the broker closed the connection during AUTH")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\r\n", 1)
        return line.decode(errors="replace")
