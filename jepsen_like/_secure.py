"""``--secure`` runs: TLS on every broker port, SCRAM users, mutual TLS between brokers.

``SecureSetup.make`` writes a development PKI (``kafkaesque.local_cluster``: a CA, a certificate
per broker whose alternative names are every address a broker is reached at) and a users file
with one generated user, and draws a random cluster secret. Brokers then start with
``--client-tls --peer-tls --admin-tls``, their certificate, ``--users-file`` and the secret in
``KAFKAESQUE_CLUSTER_SECRET`` (``broker_args``, ``broker_env``); every client of the run, the
workload's (``client_security``: SASL_SSL) and the harness's own line-protocol questions
(``open_stream``: TLS, then the SCRAM exchange of ``AUTH``, docs/protocol.md), authenticates as
that user. The user is a super user: the run tests the transport, not ACLs.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import trio

from kafkaesque.local_cluster import DevSecurity, random_secret

USER = "jepsen"


class AuthError(OSError):
    """The broker refused the TLS handshake or the SCRAM exchange (an ``OSError``, so that the
    harness treats it as a broker it could not ask)."""


@dataclass(frozen=True)
class SecureSetup(DevSecurity):
    """The certificates, user and secret of one secure run (see the module docstring): a
    ``DevSecurity`` with a certificate per broker, the admin port on TLS too, and a random
    cluster secret."""

    cluster_secret: str = field(default="", repr=False)

    @classmethod
    def make_run(cls, directory: str, nodes: Iterable[int], hosts: Iterable[str]) -> SecureSetup:
        """Write the PKI and users file into ``directory``; ``hosts`` are the addresses brokers
        are reached at (their own, proxies'), added to 127.0.0.1 and localhost."""
        names = list(dict.fromkeys(["127.0.0.1", "localhost", *hosts]))
        pki, users_file, password = cls.files(directory, USER, nodes, names)
        return cls(pki, users_file, USER, password, random_secret())

    def broker_args(self, node: int = 0, *, super_user: bool = True) -> list[str]:
        """The security flags of broker ``node``'s command line."""
        return [*super().broker_args(node, super_user=super_user), "--admin-tls"]

    def broker_env(self) -> dict[str, str]:
        """Environment of every broker: the cluster's secret (never on a command line)."""
        return {"KAFKAESQUE_CLUSTER_SECRET": self.cluster_secret}

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
