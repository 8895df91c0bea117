"""SCRAM-SHA-256 (RFC 5802, RFC 7677) and PLAIN (RFC 4616): the RFC's vector, round trips,
and every way an exchange must fail."""

from __future__ import annotations

import base64

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafkaesque.security import (
    MIN_ITERATIONS,
    AuthenticationFailed,
    ScramClient,
    ScramCredential,
    ScramServer,
    derive_credential,
    parse_plain,
    plain_message,
    verify_password,
)

# RFC 7677 §3: the whole exchange, byte for byte.
RFC_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
RFC_CLIENT_NONCE = "rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
RFC_CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_FIRST = (
    b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
)
RFC_CLIENT_FINAL = (
    b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
)
RFC_SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="

PENCIL = derive_credential("pencil", salt=RFC_SALT)


def rfc_server(users: dict[str, ScramCredential] | None = None) -> ScramServer:
    return ScramServer((users or {"user": PENCIL}).get, nonce=lambda: RFC_SERVER_NONCE)


def test_rfc7677_client_messages() -> None:
    client = ScramClient("user", "pencil", nonce=RFC_CLIENT_NONCE)
    assert client.first() == RFC_CLIENT_FIRST
    assert client.final(RFC_SERVER_FIRST) == RFC_CLIENT_FINAL
    client.verify(RFC_SERVER_FINAL)


def test_rfc7677_server_messages() -> None:
    server = rfc_server()
    assert server.first(RFC_CLIENT_FIRST) == RFC_SERVER_FIRST
    assert server.username == "user"
    assert not server.done
    assert server.final(RFC_CLIENT_FINAL) == RFC_SERVER_FINAL
    assert server.done


def test_credential_and_verify_password() -> None:
    assert PENCIL.iterations == MIN_ITERATIONS
    assert verify_password(PENCIL, "pencil")
    assert not verify_password(PENCIL, "pencil ")
    assert not verify_password(PENCIL, "")
    fresh = derive_credential("pencil")
    assert fresh.salt != PENCIL.salt and len(fresh.salt) == 16
    assert verify_password(fresh, "pencil")
    with pytest.raises(ValueError, match="4096"):
        derive_credential("pencil", iterations=4095)


def exchange(client: ScramClient, server: ScramServer) -> None:
    server_first = server.first(client.first())
    server_final = server.final(client.final(server_first))
    client.verify(server_final)


def test_round_trip_with_escaped_name() -> None:
    name = "a=b,c"
    server = ScramServer({name: derive_credential("secret")}.get)
    client = ScramClient(name, "secret")
    first = client.first()
    assert b"n=a=3Db=2Cc," in first
    server_first = server.first(first)
    client.verify(server.final(client.final(server_first)))
    assert server.username == name and server.done
