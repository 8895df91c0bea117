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


# A text alphabet without surrogates (not encodable as UTF-8) and without NUL (PLAIN's separator).
names = st.text(st.characters(codec="utf-8", exclude_characters="\0"), min_size=1)


@settings(max_examples=40, deadline=None)
@given(username=names, password=st.text(st.characters(codec="utf-8")))
def test_any_user_and_password_round_trip(username: str, password: str) -> None:
    server = ScramServer({username: derive_credential(password)}.get)
    exchange(ScramClient(username, password), server)
    assert server.username == username and server.done


@settings(max_examples=300, deadline=None)
@given(message=st.binary(max_size=200))
def test_any_client_first_fails_cleanly(message: bytes) -> None:
    server = rfc_server()
    try:
        server.first(message)
    except AuthenticationFailed:
        return
    # Some random bytes are a well-formed client-first: then the exchange goes on, to a failure.
    with pytest.raises(AuthenticationFailed):
        server.final(RFC_CLIENT_FINAL)


def mutations() -> st.SearchStrategy[bytes]:
    """Valid messages cut, spliced or with bytes flipped, and random bytes."""
    valid = st.sampled_from([RFC_CLIENT_FIRST, RFC_CLIENT_FINAL, RFC_SERVER_FIRST])
    cut = st.tuples(valid, st.integers(0, 200)).map(lambda p: p[0][: p[1]])
    flipped = st.tuples(valid, st.integers(0, 110), st.integers(1, 255)).map(
        lambda p: p[0][: p[1]] + bytes([p[0][p[1] % len(p[0])] ^ p[2]]) + p[0][p[1] + 1 :]
    )
    spliced = st.tuples(valid, st.binary(max_size=20), st.integers(0, 110)).map(
        lambda p: p[0][: p[2]] + p[1] + p[0][p[2] :]
    )
    return st.one_of(st.binary(max_size=200), cut, flipped, spliced)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(message=mutations())
def test_any_client_final_fails_cleanly_unless_it_is_the_right_one(message: bytes) -> None:
    server = rfc_server()
    server.first(RFC_CLIENT_FIRST)
    try:
        answer = server.final(message)
    except AuthenticationFailed:
        assert not server.done
        return
    # Only the one right proof gets through (base64 allows no other spelling of it).
    assert message == RFC_CLIENT_FINAL and answer == RFC_SERVER_FINAL


@settings(max_examples=200, deadline=None)
@given(message=mutations())
def test_any_bytes_to_the_client_fail_cleanly(message: bytes) -> None:
    client = ScramClient("user", "pencil", nonce=RFC_CLIENT_NONCE)
    client.first()
    try:
        client.final(message)
    except AuthenticationFailed:
        return
    with pytest.raises(AuthenticationFailed):
        client.verify(message)


def test_replayed_client_final_on_the_same_exchange_fails() -> None:
    server = rfc_server()
    server.first(RFC_CLIENT_FIRST)
    server.final(RFC_CLIENT_FINAL)
    with pytest.raises(AuthenticationFailed, match="out of order"):
        server.final(RFC_CLIENT_FINAL)
    with pytest.raises(AuthenticationFailed):
        server.first(RFC_CLIENT_FIRST)


def test_replayed_client_final_on_a_new_exchange_fails() -> None:
    # An eavesdropper replays the recorded first and final messages: the server's new nonce
    # makes the old final's nonce wrong.
    server = ScramServer({"user": PENCIL}.get)  # random server nonces, as in production
    server_first = server.first(RFC_CLIENT_FIRST)
    assert server_first != RFC_SERVER_FIRST
    with pytest.raises(AuthenticationFailed, match="nonce"):
        server.final(RFC_CLIENT_FINAL)
    assert not server.done


def test_replay_with_the_new_nonce_but_the_old_proof_fails() -> None:
    server = ScramServer({"user": PENCIL}.get)
    nonce = server.first(RFC_CLIENT_FIRST).split(b",")[0][2:]
    replay = RFC_CLIENT_FINAL.replace(RFC_CLIENT_NONCE.encode() + RFC_SERVER_NONCE.encode(), nonce)
    with pytest.raises(AuthenticationFailed, match=r"^authentication failed$"):
        server.final(replay)


@pytest.mark.parametrize("cut", [0, 1, 10, len(RFC_CLIENT_FINAL) - 1])
def test_truncated_client_final_fails(cut: int) -> None:
    server = rfc_server()
    server.first(RFC_CLIENT_FIRST)
    with pytest.raises(AuthenticationFailed):
        server.final(RFC_CLIENT_FINAL[:cut])


@pytest.mark.parametrize("cut", [0, 3, 6, 12, len(RFC_CLIENT_FIRST) - len(RFC_CLIENT_NONCE)])
def test_truncated_client_first_fails(cut: int) -> None:
    with pytest.raises(AuthenticationFailed):
        rfc_server().first(RFC_CLIENT_FIRST[:cut])


def test_truncated_server_final_fails_at_the_client() -> None:
    client = ScramClient("user", "pencil", nonce=RFC_CLIENT_NONCE)
    client.first()
    client.final(RFC_SERVER_FIRST)
    with pytest.raises(AuthenticationFailed):
        client.verify(RFC_SERVER_FINAL[:-2])


def failure_of(server: ScramServer, client: ScramClient) -> str:
    server_first = server.first(client.first())
    with pytest.raises(AuthenticationFailed) as failure:
        server.final(client.final(server_first))
    return str(failure.value)


def test_wrong_password_and_unknown_user_fail_alike() -> None:
    users = {"user": PENCIL}
    wrong = failure_of(ScramServer(users.get), ScramClient("user", "pen"))
    unknown = failure_of(ScramServer(users.get), ScramClient("nobody", "pencil"))
    assert wrong == unknown == "authentication failed"


def test_unknown_user_gets_a_stable_fake_salt() -> None:
    def first(name: str) -> list[bytes]:
        return ScramServer({"user": PENCIL}.get).first(f"n,,n={name},r=abc".encode()).split(b",")

    once, again, other = first("nobody"), first("nobody"), first("somebody")
    assert once[1] == again[1] != other[1]  # the same name, the same salt: nothing to compare
    assert once[2] == b"i=4096"
    assert len(base64.b64decode(once[1][2:])) == len(PENCIL.salt)


def test_server_with_a_wrong_credential_fails_mutual_authentication() -> None:
    # A server that does not know the password cannot sign: the client refuses it.
    impostor = ScramServer({"user": derive_credential("other", salt=RFC_SALT)}.get)
    client = ScramClient("user", "pencil")
    server_first = impostor.first(client.first())
    client_final = client.final(server_first)
    with pytest.raises(AuthenticationFailed):
        impostor.final(client_final)
    forged = b"v=" + base64.b64encode(bytes(32))
    with pytest.raises(AuthenticationFailed, match="signature"):
        client.verify(forged)


@pytest.mark.parametrize(
    ("message", "why"),
    [
        (b"p=tls-unique,,n=user,r=abc", "channel binding"),
        (b"n,,m=ext,n=user,r=abc", "malformed"),
        (b"n,a=other,n=user,r=abc", "authorization identity"),
        (b"n,,n=us=3Xer,r=abc", "escape"),
        (b"n,,n=user,r=a,bc", "malformed"),
        (b"n,,n=,r=abc", "malformed"),
        (b"n,,r=abc,n=user", "malformed"),
        (b"\xff\xfe", "UTF-8"),
    ],
)
def test_bad_client_first(message: bytes, why: str) -> None:
    with pytest.raises(AuthenticationFailed, match=why):
        rfc_server().first(message)


def test_authorization_identity_equal_to_the_user_and_y_flag_are_accepted() -> None:
    assert rfc_server().first(b"n,a=user,n=user,r=abc").startswith(b"r=abc")
    assert rfc_server().first(b"y,,n=user,r=abc").startswith(b"r=abc")


def test_channel_binding_data_must_match_the_header() -> None:
    server = rfc_server()
    server.first(b"y,," + RFC_CLIENT_FIRST[3:])
    with pytest.raises(AuthenticationFailed, match="channel binding"):
        server.final(RFC_CLIENT_FINAL)  # c=biws is "n,,", not "y,,"


def test_steps_out_of_order_fail() -> None:
    with pytest.raises(AuthenticationFailed, match="out of order"):
        rfc_server().final(RFC_CLIENT_FINAL)
    client = ScramClient("user", "pencil")
    with pytest.raises(AuthenticationFailed, match="out of order"):
        client.final(RFC_SERVER_FIRST)
    with pytest.raises(ValueError):
        _ = rfc_server().username


def test_client_refuses_a_server_nonce_that_does_not_extend_its_own() -> None:
    client = ScramClient("user", "pencil", nonce="other")
    client.first()
    with pytest.raises(AuthenticationFailed, match="nonce"):
        client.final(RFC_SERVER_FIRST)


@pytest.mark.parametrize("iterations", [1, 4095, 10**9])
def test_client_refuses_iteration_counts_out_of_range(iterations: int) -> None:
    client = ScramClient("user", "pencil", nonce=RFC_CLIENT_NONCE)
    client.first()
    server_first = RFC_SERVER_FIRST.replace(b"i=4096", f"i={iterations}".encode())
    with pytest.raises(AuthenticationFailed, match="iteration"):
        client.final(server_first)


def test_server_error_message_reaches_the_client() -> None:
    client = ScramClient("user", "pencil")
    client.first()
    with pytest.raises(AuthenticationFailed, match="server refused: unknown-user"):
        client.final(b"e=unknown-user")


def test_plain() -> None:
    assert plain_message("alice", "s3cret") == b"\0alice\0s3cret"
    assert parse_plain(b"\0alice\0s3cret") == ("alice", "s3cret")
    assert parse_plain(b"alice\0alice\0s3cret") == ("alice", "s3cret")
    for bad in (b"", b"alice\0s3cret", b"\0\0s3cret", b"\0alice\0", b"bob\0alice\0x", b"\0a\0b\0c"):
        with pytest.raises(AuthenticationFailed):
            parse_plain(bad)
    with pytest.raises(AuthenticationFailed, match="UTF-8"):
        parse_plain(b"\0\xff\0x")
    with pytest.raises(ValueError):
        plain_message("a\0b", "x")


@settings(max_examples=200)
@given(user=names, password=names)
def test_plain_round_trip(user: str, password: str) -> None:
    assert parse_plain(plain_message(user, password)) == (user, password)


@given(message=st.binary(max_size=100))
def test_plain_any_bytes_fail_cleanly(message: bytes) -> None:
    try:
        user, password = parse_plain(message)
    except AuthenticationFailed:
        return
    assert user and password


def _librdkafka_client_final(server_first: bytes, nonce: str) -> bytes:
    """A client-final for the RFC exchange whose nonce is ``nonce`` (as sent), proof right."""
    import hashlib
    import hmac

    salted = hashlib.pbkdf2_hmac("sha256", b"pencil", RFC_SALT, 4096)
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    stored_key = hashlib.sha256(client_key).digest()
    without_proof = f"c=biws,r={nonce}"
    auth = b"%s,%s,%s" % (RFC_CLIENT_FIRST[3:], server_first, without_proof.encode())
    signature = hmac.digest(stored_key, auth, "sha256")
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()


def test_a_nonce_that_ends_with_the_servers_is_accepted_as_kafka_accepts_it() -> None:
    # librdkafka (kcat, confluent-kafka) sends its own nonce again before the whole nonce;
    # Kafka's server checks only that the nonce ends with its own (ScramSaslServer).
    full = RFC_CLIENT_NONCE + RFC_SERVER_NONCE
    server = rfc_server()
    server_first = server.first(RFC_CLIENT_FIRST)
    server.final(_librdkafka_client_final(server_first, RFC_CLIENT_NONCE + full))
    assert server.done
    # The server's nonce must still end it: one with anything after it fails.
    server = rfc_server()
    server_first = server.first(RFC_CLIENT_FIRST)
    with pytest.raises(AuthenticationFailed, match="nonce"):
        server.final(_librdkafka_client_final(server_first, full + "x"))
