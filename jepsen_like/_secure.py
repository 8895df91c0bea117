"""``--secure`` runs: TLS on every broker port, SCRAM users, mutual TLS between brokers.

``SecureSetup.make`` writes a development PKI (``kafkaesque.cli.dev_pki``: a CA, a certificate
per broker whose alternative names are every address a broker is reached at) and a users file
with one generated user, and draws a random cluster secret. Brokers then start with
``--client-tls --peer-tls --admin-tls``, their certificate, ``--users-file`` and the secret in
``KAFKAESQUE_CLUSTER_SECRET`` (``broker_args``, ``broker_env``); every client of the run, the
workload's (``client_security``: SASL_SSL) and the harness's own line-protocol questions
(``open_stream``: TLS, then the SCRAM exchange of ``AUTH``, docs/protocol.md), authenticates as
that user. The user is a super user: the run tests the transport, not ACLs.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import trio
from kafkaesque.cli.dev_pki import DevPki, make_dev_pki, random_secret, write_users

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
            await scram_login(stream, self.client_security(), f"{address[0]}:{address[1]}")
        except (trio.BrokenResourceError, ssl.SSLError) as exc:
            await trio.aclose_forcefully(stream)
            raise AuthError(f"TLS to {address[0]}:{address[1]}: {exc}") from exc
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise
        return stream


async def scram_login(stream: trio.abc.Stream, security: Any, where: str) -> None:
    """The line protocol's ``AUTH`` exchange on ``stream`` (nothing else may be in flight on
    it), as the client library does it (its sans-I/O ``SaslHandshake``: the server's signature
    checked). Raises ``AuthError`` on a refusal or a wrong server signature."""
    from kafkaesque.client import KafkaesqueError, SaslHandshake
    from kafkaesque.protocol import (
        NEED_DATA,
        Authenticate,
        ErrorReply,
        OkReply,
        ReplyDecoder,
        encode_command,
    )

    handshake = SaslHandshake(security, where)
    decoder = ReplyDecoder()
    try:
        command: Authenticate | None = handshake.start()
        while command is not None:
            await stream.send_all(encode_command(command))
            reply = decoder.next_event()
            while reply is NEED_DATA:
                chunk = await stream.receive_some(4096)
                if not chunk:
                    raise AuthError(f"{where}: the broker closed the connection during AUTH")
                decoder.feed(chunk)
                reply = decoder.next_event()
            if not isinstance(reply, OkReply | ErrorReply):
                raise AuthError(f"{where}: AUTH answered {reply!r}")
            command = handshake.step(reply)
    except KafkaesqueError as exc:
        raise AuthError(str(exc)) from exc
