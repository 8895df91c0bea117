"""The client's security (issue 25): ``Security`` and its Kafka-style options, the sans-I/O SASL
handshake against the real SCRAM server of ``kafkaesque.security``, and the sync and trio
connections doing real TLS (trustme certificates) and ``AUTH`` against a small broker stand-in
in a thread (the broker's own AUTH is tested with real brokers in test_security_client.py)."""

from __future__ import annotations

import base64
import pickle
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio
import trustme

from kafkaesque.client import (
    Client,
    ClientConfig,
    KafkaesqueConnectionError,
    KafkaesqueError,
    Security,
    SyncConnection,
    TrioConnection,
)
from kafkaesque.client._security import SaslHandshake
from kafkaesque.protocol import (
    Authenticate,
    ErrorCode,
    ErrorReply,
    LineDecoder,
    OkReply,
    Ping,
    Quit,
    Reply,
    auth_authenticated_reply,
    auth_continue_reply,
    encode_reply,
)
from kafkaesque.security import (
    AuthenticationFailed,
    ScramCredential,
    ScramServer,
    derive_credential,
    parse_plain,
    server_context,
    verify_password,
)

# --- Security and from_options ----------------------------------------------------------------


def test_the_default_is_plaintext() -> None:
    security = Security()
    assert (security.protocol, security.uses_tls, security.uses_sasl) == ("PLAINTEXT", False, False)
    assert security.ssl_context is None
    assert ClientConfig().security == security


def test_from_options_reads_kafkas_keys() -> None:
    security = Security.from_options(
        {
            "security.protocol": "sasl_ssl",
            "sasl.mechanism": "SCRAM-SHA-256",
            "sasl.username": "alice",
            "sasl.password": "s3cret",
            "ssl.truststore.location": "/etc/ca.pem",
            "ssl.truststore.type": "PEM",
            "ssl.keystore.location": "/etc/client.pem",
            "ssl.endpoint.identification.algorithm": "",
            "subscribe": "orders",  # not a security key: left alone
        }
    )
    assert security == Security(
        protocol="SASL_SSL",
        username="alice",
        password="s3cret",
        ssl_cafile="/etc/ca.pem",
        ssl_certfile="/etc/client.pem",
        ssl_check_hostname=False,
    )
    assert "s3cret" not in repr(security)


def test_from_options_takes_the_other_spellings() -> None:
    security = Security.from_options(
        {
            "security.protocol": "SSL",
            "ssl.cafile": "ca.pem",
            "ssl.certfile": "me.pem",
            "ssl.keyfile": "me.key",
        }
    )
    assert (security.ssl_cafile, security.ssl_certfile, security.ssl_keyfile) == (
        "ca.pem",
        "me.pem",
        "me.key",
    )
    assert security.ssl_check_hostname
    jaas = Security.from_options(
        {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule "
            'required username="bob" password="pa\\"ss";',
        }
    )
    assert (jaas.username, jaas.password) == ("bob", 'pa\\"ss')
    assert Security.from_options({}) == Security()


def test_security_pickles_without_its_tls_context(pki: dict[str, str]) -> None:
    # Spark ships it to executors; a context built in the driver must not go along.
    security = Security("SASL_SSL", username="alice", password="pw", ssl_cafile=pki["ca"])
    assert security.ssl_context is not None
    copy = pickle.loads(pickle.dumps(security))
    assert copy == security and copy.password == "pw"
    assert copy.ssl_context is not None and copy.ssl_context is not security.ssl_context


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"sasl.usernam": "alice"}, "sasl.usernam"),
        ({"ssl.truststore.password": "x"}, "ssl.truststore.password"),
        ({"security.protocol": "TLS"}, "security.protocol must be"),
        ({"security.protocol": "SASL_SSL", "sasl.mechanism": "GSSAPI"}, "sasl.mechanism must"),
        ({"security.protocol": "SASL_SSL", "sasl.username": "alice"}, "a user name and a pass"),
        (
            {
                "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "PLAIN",
                "sasl.username": "a",
                "sasl.password": "p",
            },
            "PLAIN sends the password",
        ),
        ({"sasl.username": "a", "sasl.password": "p"}, "need SASL_SSL or SASL_PLAINTEXT"),
        ({"ssl.truststore.location": "ca.pem"}, "TLS files need SSL"),
        ({"security.protocol": "SSL", "ssl.truststore.type": "JKS"}, "must be PEM"),
        ({"security.protocol": "SSL", "ssl.keyfile": "k.pem"}, "needs its certificate"),
        (
            {"security.protocol": "SSL", "ssl.endpoint.identification.algorithm": "ldap"},
            "https or empty",
        ),
    ],
)
def test_from_options_refuses_what_cannot_work(options: dict[str, str], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        Security.from_options(options)


# --- The handshake, sans I/O, against the real SCRAM server --------------------------------------

ALICE = derive_credential("s3cret")
USERS = {"alice": ALICE}


def _scram_answers(server: ScramServer, command: Authenticate, *, final: bool) -> Reply:
    try:
        if not final:
            return auth_continue_reply(server.first(command.payload))
        return auth_authenticated_reply(server.username, server.final(command.payload))
    except AuthenticationFailed as exc:
        return ErrorReply(ErrorCode.AUTH_FAILED, str(exc))


def _run(security: Security, answer: Callable[[Authenticate, int], Reply]) -> str | None:
    handshake = SaslHandshake(security, "broker:9092")
    command: Authenticate | None = handshake.start()
    steps = 0
    while command is not None:
        assert steps < 3
        command = handshake.step(answer(command, steps))  # type: ignore[arg-type]
        steps += 1
    return handshake.username


SCRAM_ALICE = Security("SASL_PLAINTEXT", username="alice", password="s3cret")


def test_scram_handshake_against_the_scram_server() -> None:
    server = ScramServer(USERS.get)
    assert _run(SCRAM_ALICE, lambda c, n: _scram_answers(server, c, final=n == 1)) == "alice"


def test_a_wrong_password_is_auth_failed_and_not_retriable() -> None:
    server = ScramServer(USERS.get)
    wrong = Security("SASL_PLAINTEXT", username="alice", password="guess")
    with pytest.raises(KafkaesqueError) as caught:
        _run(wrong, lambda c, n: _scram_answers(server, c, final=n == 1))
    assert caught.value.code is ErrorCode.AUTH_FAILED
    assert not caught.value.retriable and not caught.value.outcome_unknown
    assert "authentication failed" in caught.value.message


def test_a_server_that_cannot_prove_the_password_is_refused() -> None:
    # A broker that lets anyone in (or a man in the middle) has no ServerKey: its server-final
    # signature is wrong, and the client must not believe it authenticated.
    server = ScramServer(USERS.get)

    def forged(command: Authenticate, step: int) -> Reply:
        reply = _scram_answers(server, command, final=step == 1)
        if step == 0:
            return reply
        return auth_authenticated_reply("alice", b"v=" + base64.b64encode(b"\0" * 32))

    with pytest.raises(KafkaesqueError, match="signature is wrong") as caught:
        _run(SCRAM_ALICE, forged)
    assert caught.value.code is ErrorCode.AUTH_FAILED


@pytest.mark.parametrize(
    "reply",
    [
        OkReply("authenticated alice"),  # SCRAM done without a server-final: no mutual auth
        OkReply("PONG"),
        ErrorReply(ErrorCode.UNKNOWN_COMMAND, "unknown command 'AUTH'; try HELP"),  # old broker
        ErrorReply(ErrorCode.NOT_AUTHORIZED, "no"),
    ],
)
def test_broken_or_refusing_answers_are_auth_failed(reply: Reply) -> None:
    with pytest.raises(KafkaesqueError) as caught:
        _run(SCRAM_ALICE, lambda c, n: reply)
    assert caught.value.code is ErrorCode.AUTH_FAILED
    assert "broker:9092" in caught.value.message


def test_a_retriable_answer_is_a_retriable_connection_error() -> None:
    busy = ErrorReply(ErrorCode.NOT_READY, "the broker is shutting down")
    with pytest.raises(KafkaesqueConnectionError) as caught:
        _run(SCRAM_ALICE, lambda c, n: busy)
    assert caught.value.retriable and not caught.value.outcome_unknown


def test_plain_sends_the_password_once_over_tls() -> None:
    security = Security("SASL_SSL", "PLAIN", username="alice", password="s3cret")
    sent: list[bytes] = []

    def answer(command: Authenticate, step: int) -> Reply:
        sent.append(command.payload)
        user, password = parse_plain(command.payload)
        assert verify_password(USERS[user], password)
        return auth_authenticated_reply(user)

    assert _run(security, answer) == "alice"
    assert sent == [b"\0alice\0s3cret"]
    with pytest.raises(KafkaesqueError):  # PLAIN has no server message
        _run(security, lambda c, n: auth_authenticated_reply("alice", b"v=x"))


# --- Real sockets: TLS and AUTH against a stand-in broker ---------------------------------------


@dataclass
class StandIn:
    """A line-protocol server that knows AUTH, PING and QUIT (PING needs AUTH when ``users``),
    one connection at a time, on a thread; ``forge_final`` makes it unable to prove passwords."""

    users: dict[str, ScramCredential] | None
    context: ssl.SSLContext | None = None
    forge_final: bool = False
    listener: socket.socket = field(init=False)
    stop: threading.Event = field(default_factory=threading.Event)
    refused: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.1)

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.listener.getsockname()[1])

    def serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5.0)
                try:
                    if self.context is not None:
                        conn = self.context.wrap_socket(conn, server_side=True)
                    self._session(conn)
                except OSError as exc:  # a client that refused our certificate, a reset
                    self.refused.append(type(exc).__name__)

    def _session(self, conn: socket.socket) -> None:
        decoder = LineDecoder()
        scram: ScramServer | None = None
        authenticated = self.users is None
        for _ in range(100):
            data = conn.recv(65536)
            if not data:
                return
            decoder.feed(data)
            for event in decoder.events():
                reply: Reply
                if isinstance(event, Authenticate) and self.users is not None:
                    scram, reply = self._auth(event, scram)
                    if isinstance(reply, OkReply) and reply.text.startswith("authenticated"):
                        authenticated = True
                elif isinstance(event, Ping):
                    reply = OkReply("PONG")
                    if not authenticated:
                        reply = ErrorReply(ErrorCode.NOT_AUTHORIZED, "authentication required")
                elif isinstance(event, Quit):
                    conn.sendall(encode_reply(OkReply("bye")))
                    return
                else:
                    reply = ErrorReply(ErrorCode.UNKNOWN_COMMAND, "not here")
                conn.sendall(encode_reply(reply))

    def _auth(
        self, event: Authenticate, scram: ScramServer | None
    ) -> tuple[ScramServer | None, Reply]:
        assert self.users is not None
        try:
            if event.mechanism == "PLAIN":
                user, password = parse_plain(event.payload)
                credential = self.users.get(user)
                if credential is None or not verify_password(credential, password):
                    raise AuthenticationFailed("authentication failed")
                return None, auth_authenticated_reply(user)
            if scram is None:
                scram = ScramServer(self.users.get)
                return scram, auth_continue_reply(scram.first(event.payload))
            final = scram.final(event.payload)
            if self.forge_final:
                final = b"v=" + base64.b64encode(bytes(32))
            return None, auth_authenticated_reply(scram.username, final)
        except AuthenticationFailed as exc:
            return None, ErrorReply(ErrorCode.AUTH_FAILED, str(exc))


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    directory = tmp_path_factory.mktemp("pki")
    ca, other_ca = trustme.CA(), trustme.CA()
    files = {"ca": directory / "ca.pem", "other_ca": directory / "other.pem"}
    ca.cert_pem.write_to_path(str(files["ca"]))
    other_ca.cert_pem.write_to_path(str(files["other_ca"]))
    cert = ca.issue_cert("127.0.0.1", "localhost")
    files["cert"] = directory / "broker.pem"
    files["key"] = directory / "broker.key"
    for blob in cert.cert_chain_pems:
        blob.write_to_path(str(files["cert"]), append=True)
    cert.private_key_pem.write_to_path(str(files["key"]))
    return {name: str(path) for name, path in files.items()}


@pytest.fixture
def stand_in(request: pytest.FixtureRequest, pki: dict[str, str]) -> Iterator[StandIn]:
    options: dict[str, object] = getattr(request, "param", {})
    context = None
    if options.get("tls", True):
        context = server_context(pki["cert"], pki["key"])
    server = StandIn(USERS, context, forge_final=bool(options.get("forge_final")))
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.stop.set()
        thread.join(10)
        server.listener.close()
        assert not thread.is_alive()


def _sasl_ssl(pki: dict[str, str], password: str = "s3cret", **kw: object) -> Security:
    settings: dict[str, object] = {"ssl_cafile": pki["ca"], **kw}
    return Security("SASL_SSL", username="alice", password=password, **settings)  # type: ignore[arg-type]


def test_sync_connection_does_tls_and_scram_before_its_first_command(
    stand_in: StandIn, pki: dict[str, str]
) -> None:
    with SyncConnection(stand_in.address, security=_sasl_ssl(pki)) as connection:
        assert connection.authenticated_as == "alice"
        assert connection.request(Ping(), 5.0) == OkReply("PONG")


def test_trio_connection_does_tls_and_scram_before_its_first_command(
    stand_in: StandIn, pki: dict[str, str]
) -> None:
    async def main() -> None:
        connection = await TrioConnection.connect(stand_in.address, security=_sasl_ssl(pki))
        try:
            assert connection.authenticated_as == "alice"
            assert await connection.request(Ping(), 5.0) == OkReply("PONG")
        finally:
            await connection.aclose()

    trio.run(main)


def test_the_client_authenticates_every_connection_it_opens(
    stand_in: StandIn, pki: dict[str, str]
) -> None:
    host, port = stand_in.address
    with Client(f"{host}:{port}", config=ClientConfig(security=_sasl_ssl(pki))) as client:
        assert client.ping() == "PONG"
    plain = ClientConfig(
        security=Security("SASL_SSL", "PLAIN", "alice", "s3cret", ssl_cafile=pki["ca"])
    )
    with Client(f"{host}:{port}", config=plain) as client:
        assert client.ping() == "PONG"


def _connect_both(address: tuple[str, int], security: Security) -> list[KafkaesqueError]:
    """The error each of the sync and the trio connection raises."""
    errors: list[KafkaesqueError] = []
    with pytest.raises(KafkaesqueError) as caught:
        SyncConnection(address, security=security, connect_timeout_s=2.0)
    errors.append(caught.value)

    async def main() -> None:
        with pytest.raises(KafkaesqueError) as caught:
            await TrioConnection.connect(address, security=security, timeout_s=2.0)
        errors.append(caught.value)

    trio.run(main)
    return errors


def test_a_wrong_password_fails_both_connections_with_auth_failed(
    stand_in: StandIn, pki: dict[str, str]
) -> None:
    for error in _connect_both(stand_in.address, _sasl_ssl(pki, password="guess")):
        assert error.code is ErrorCode.AUTH_FAILED
        assert not error.retriable
        assert "authentication failed" in error.message


def test_a_broker_whose_certificate_another_ca_signed_is_refused(
    stand_in: StandIn, pki: dict[str, str]
) -> None:
    for error in _connect_both(stand_in.address, _sasl_ssl(pki, ssl_cafile=pki["other_ca"])):
        assert error.code is ErrorCode.AUTH_FAILED
        assert not error.retriable
        assert "certificate verify failed" in error.message


@pytest.mark.parametrize("stand_in", [{"forge_final": True}], indirect=True)
def test_a_broker_that_cannot_prove_the_password_is_refused(
    stand_in: StandIn, pki: dict[str, str]
) -> None:
    for error in _connect_both(stand_in.address, _sasl_ssl(pki)):
        assert error.code is ErrorCode.AUTH_FAILED
        assert "signature is wrong" in error.message


@pytest.mark.parametrize("stand_in", [{"tls": False}], indirect=True)
def test_scram_without_tls_and_tls_to_a_plaintext_port(
    stand_in: StandIn, pki: dict[str, str]
) -> None:
    with SyncConnection(stand_in.address, security=SCRAM_ALICE) as connection:
        assert connection.request(Ping(), 5.0) == OkReply("PONG")
    # TLS to a port that does not speak it: never a silent plaintext connection.
    for error in _connect_both(stand_in.address, _sasl_ssl(pki)):
        assert isinstance(error, KafkaesqueError)
        assert error.code is ErrorCode.AUTH_FAILED or isinstance(error, KafkaesqueConnectionError)


def test_unreadable_tls_files_are_auth_failed(tmp_path: Path) -> None:
    missing = Security("SSL", ssl_cafile=str(tmp_path / "nope.pem"))
    with socket.create_server(("127.0.0.1", 0)) as listener:
        address = ("127.0.0.1", listener.getsockname()[1])
        for error in _connect_both(address, missing):
            assert error.code is ErrorCode.AUTH_FAILED
            assert "cannot load the TLS files" in error.message
