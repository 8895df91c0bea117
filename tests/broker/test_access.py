"""AccessControl (issue 25, docs/security.md): AUTH for a session, the failure limit with a
fake clock, and the decisions on commands, without a broker."""

from __future__ import annotations

import base64
from collections import Counter
from pathlib import Path

import pytest

from kafkaesque.broker._access import (
    AUTHENTICATION_REQUIRED,
    NOT_ENABLED,
    AccessControl,
)
from kafkaesque.broker._config import Address, BrokerConfig, ConfigError
from kafkaesque.broker._errors import RequestError
from kafkaesque.broker._session import ANONYMOUS, Session
from kafkaesque.fd_stream import peer_host
from kafkaesque.protocol import (
    NEED_DATA,
    AclOperation,
    AclPattern,
    AclPermission,
    AclResource,
    AclRow,
    Authenticate,
    Command,
    CreateTopic,
    DeleteGroup,
    ErrorCode,
    ErrorReply,
    Fetch,
    Help,
    ListTopics,
    OkReply,
    Ping,
    Pubs,
    Reassign,
    Reply,
    ReplyDecoder,
    Subs,
)
from kafkaesque.security import (
    Authorizer,
    FailureLimiter,
    ScramClient,
    UserStore,
    derive_credential,
    plain_message,
    save_users,
)

SCRAM = "SCRAM-SHA-256"
LIMIT = 3
WINDOW_S = 60.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeMetrics:
    def __init__(self) -> None:
        self.auth_failures = 0
        self.refused: Counter[str] = Counter()

    def auth_failed(self) -> None:
        self.auth_failures += 1

    def authorization_failed(self, operation: str) -> None:
        self.refused[operation] += 1


@pytest.fixture(scope="module")
def users_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("users") / "users"
    save_users(
        path,
        {name: derive_credential(f"{name}-pw") for name in ("alice", "bob", "admin", "a,b=c")},
    )
    return str(path)


def make_access(
    users_file: str | None, clock: FakeClock | None = None
) -> tuple[AccessControl, FakeMetrics]:
    clock = clock or FakeClock()
    metrics = FakeMetrics()
    users = None if users_file is None else UserStore(users_file, clock=clock)
    access = AccessControl(
        users, Authorizer(["User:admin"]), FailureLimiter(LIMIT, WINDOW_S, clock=clock), metrics
    )
    return access, metrics


def decode(data: bytes) -> Reply:
    decoder = ReplyDecoder()
    decoder.feed(data)
    event = decoder.next_event()
    assert event is not NEED_DATA
    assert decoder.next_event() is NEED_DATA, "one reply"
    return event


async def step(access: AccessControl, session: Session, payload: bytes, mech: str = SCRAM) -> Reply:
    return decode(await access.authenticate(session, Authenticate(mech, payload)))


async def scram_login(access: AccessControl, session: Session, user: str, password: str) -> Reply:
    """A whole SCRAM exchange; the last reply (the server's signature checked if it is +OK)."""
    client = ScramClient(user, password)
    first = await step(access, session, client.first())
    assert isinstance(first, OkReply), first
    word, challenge = first.text.split(" ")
    assert word == "continue"
    last = await step(access, session, client.final(base64.b64decode(challenge)))
    if isinstance(last, OkReply):
        word, name, server_final = last.text.split(" ")
        assert (word, name) == ("authenticated", user)
        client.verify(base64.b64decode(server_final))
    return last


def failed(reply: Reply) -> str:
    assert isinstance(reply, ErrorReply) and reply.code is ErrorCode.AUTH_FAILED, reply
    return reply.message


def acl(
    principal: str,
    operation: AclOperation,
    resource: AclResource,
    name: str,
    *,
    permission: AclPermission = AclPermission.ALLOW,
    pattern: AclPattern = AclPattern.LITERAL,
) -> AclRow:
    return AclRow(principal, permission, operation, resource, pattern, name)


def who(session: Session, *, sasl: bool = False) -> object:
    """The session's principal (or SASL exchange): read through a call, so that the type
    checker does not take an earlier assert for the value after an AUTH."""
    return session.sasl if sasl else session.principal


def enforcing(access: AccessControl) -> bool:
    return access.enforcing


def refused(access: AccessControl, command: Command, session: Session) -> str:
    with pytest.raises(RequestError) as info:
        access.check(command, session)
    assert info.value.code is ErrorCode.NOT_AUTHORIZED
    return info.value.message


# -- authentication ---------------------------------------------------------------------------


async def test_a_scram_exchange_authenticates_the_session(users_file: str) -> None:
    access, metrics = make_access(users_file)
    session = access.new_session("10.0.0.1", tls=False)
    assert who(session) is None and enforcing(access)
    assert isinstance(await scram_login(access, session, "alice", "alice-pw"), OkReply)
    assert who(session) == "User:alice" and who(session, sasl=True) is None
    assert metrics.auth_failures == 0
    # A user name with the characters SCRAM escapes.
    other = access.new_session("10.0.0.1", tls=False)
    assert isinstance(await scram_login(access, other, "a,b=c", "a,b=c-pw"), OkReply)
    assert who(other) == "User:a,b=c"


async def test_a_wrong_password_or_unknown_user_fails_alike_and_may_retry(
    users_file: str,
) -> None:
    access, metrics = make_access(users_file)
    session = access.new_session("10.0.0.2", tls=False)
    wrong = failed(await scram_login(access, session, "alice", "nope"))
    unknown = failed(await scram_login(access, session, "mallory", "nope"))
    assert wrong == unknown == "authentication failed"
    assert who(session) is None and who(session, sasl=True) is None
    assert metrics.auth_failures == 2
    assert isinstance(await scram_login(access, session, "alice", "alice-pw"), OkReply)
    assert who(session) == "User:alice"
    # A failed AUTH later leaves the principal as it was.
    failed(await scram_login(access, session, "bob", "nope"))
    assert who(session) == "User:alice"


async def test_a_replayed_exchange_fails(users_file: str) -> None:
    access, _ = make_access(users_file)
    client = ScramClient("alice", "alice-pw")
    first = client.first()
    recorded = access.new_session("10.0.0.3", tls=False)
    challenge = await step(access, recorded, first)
    assert isinstance(challenge, OkReply)
    final = client.final(base64.b64decode(challenge.text.split(" ")[1]))
    assert isinstance(await step(access, recorded, final), OkReply)
    # An eavesdropper replays both messages on a connection of its own: the server's nonce
    # differs, so the recorded proof does not match.
    replay = access.new_session("10.0.0.4", tls=False)
    assert isinstance(await step(access, replay, first), OkReply)
    assert "nonce" in failed(await step(access, replay, final))
    assert who(replay) is None
    # The final message alone, as a first step, is not a client-first message.
    failed(await step(access, access.new_session("10.0.0.4", tls=False), final))


async def test_a_truncated_exchange_fails_and_a_new_one_starts_afresh(users_file: str) -> None:
    access, _ = make_access(users_file)
    session = access.new_session("10.0.0.5", tls=False)
    client = ScramClient("alice", "alice-pw")
    challenge = await step(access, session, client.first())
    assert isinstance(challenge, OkReply)
    final = client.final(base64.b64decode(challenge.text.split(" ")[1]))
    failed(await step(access, session, final[: len(final) // 2]))
    assert who(session) is None and who(session, sasl=True) is None
    truncated = ScramClient("alice", "alice-pw").first()[:5]
    failed(await step(access, session, truncated))
    assert isinstance(await scram_login(access, session, "alice", "alice-pw"), OkReply)


async def test_failures_are_limited_per_address_and_the_limit_passes(users_file: str) -> None:
    clock = FakeClock()
    access, metrics = make_access(users_file, clock)
    session = access.new_session("10.0.0.6", tls=False)
    for _ in range(LIMIT):
        failed(await scram_login(access, session, "alice", "nope"))
    blocked = failed(await step(access, session, ScramClient("alice", "alice-pw").first()))
    assert blocked == f"too many failed attempts from 10.0.0.6: retry in {WINDOW_S:.0f} s"
    clock.now += 20
    blocked = failed(await step(access, session, ScramClient("alice", "alice-pw").first()))
    assert blocked.endswith("retry in 40 s")
    assert metrics.auth_failures == LIMIT + 2  # refusals unheard count too
    # Another address is not affected; this one may try again once the window has passed.
    other = access.new_session("10.0.0.7", tls=False)
    assert isinstance(await scram_login(access, other, "alice", "alice-pw"), OkReply)
    clock.now += WINDOW_S
    assert isinstance(await scram_login(access, session, "alice", "alice-pw"), OkReply)
    # A success forgets the address's failures.
    for _ in range(LIMIT - 1):
        failed(await scram_login(access, session, "alice", "nope"))
    assert isinstance(await scram_login(access, session, "alice", "alice-pw"), OkReply)
    failed(await scram_login(access, session, "alice", "nope"))
    assert isinstance(await scram_login(access, session, "alice", "alice-pw"), OkReply)


async def test_plain_only_over_tls(users_file: str) -> None:
    access, metrics = make_access(users_file)
    plaintext = access.new_session("10.0.0.8", tls=False)
    why = failed(await step(access, plaintext, plain_message("alice", "alice-pw"), "PLAIN"))
    assert "TLS" in why and who(plaintext) is None
    assert access.limiter.blocked("10.0.0.8") == 0.0
    tls = access.new_session("10.0.0.8", tls=True)
    assert failed(await step(access, tls, plain_message("alice", "no"), "PLAIN")) == (
        "authentication failed"
    )
    assert failed(await step(access, tls, plain_message("who", "no"), "plain")) == (
        "authentication failed"
    )
    malformed = access.new_session("10.0.0.11", tls=True)
    failed(await step(access, malformed, b"no separators", "PLAIN"))
    reply = await step(access, tls, plain_message("bob", "bob-pw"), "PLAIN")
    assert isinstance(reply, OkReply) and reply.text == "authenticated bob"
    assert who(tls) == "User:bob"
    assert metrics.auth_failures == 4


async def test_without_a_users_file_every_session_is_anonymous(users_file: str) -> None:
    access, metrics = make_access(None)
    session = access.new_session("10.0.0.9", tls=True)
    assert who(session) == ANONYMOUS and not enforcing(access)
    assert failed(await step(access, session, ScramClient("a", "b").first())) == NOT_ENABLED
    assert who(session) == ANONYMOUS
    assert metrics.auth_failures == 1
    # ACLs turn enforcement on, for the anonymous principal too; none turn it off again.
    access.set_acls(frozenset({acl(ANONYMOUS, AclOperation.READ, AclResource.TOPIC, "t")}))
    assert enforcing(access)
    access.check(Fetch("t", 0, 0), session)
    refused(access, Pubs("t", b"x"), session)
    access.set_acls(frozenset())
    assert not enforcing(access)


async def test_an_unknown_mechanism_is_refused(users_file: str) -> None:
    access, _ = make_access(users_file)
    session = access.new_session("10.0.0.10", tls=True)
    assert "not offered" in failed(await step(access, session, b"x", "GSSAPI"))


# -- authorization ----------------------------------------------------------------------------


def authenticated(principal: str) -> Session:
    return Session("10.1.0.1", tls=False, principal=principal)


def test_before_authentication_only_ping_help_quit_and_auth(users_file: str) -> None:
    access, metrics = make_access(users_file)
    session = access.new_session("10.1.0.2", tls=False)
    allowed: list[Command] = [Ping(), Help(), Authenticate(SCRAM, b"x")]
    for command in allowed:
        access.check(command, session)
    others: list[Command] = [Pubs("t", b"x"), ListTopics(), CreateTopic("t", 1, 1)]
    for command in others:
        assert refused(access, command, session) == AUTHENTICATION_REQUIRED
    assert metrics.refused == {"unauthenticated": 3}
    assert access.visible(session, AclResource.TOPIC, ["a"]) == ["a"]  # no ACLs: all
    # Authenticated, with no ACLs configured: anything goes.
    access.check(Reassign("t", 0, (1, 2)), authenticated("User:bob"))


def test_each_resource_kind_is_refused_without_its_acl_and_allowed_with_it(
    users_file: str,
) -> None:
    access, metrics = make_access(users_file)
    bob = authenticated("User:bob")
    unrelated = acl("User:alice", AclOperation.READ, AclResource.TOPIC, "x")
    access.set_acls(frozenset({unrelated}))
    cases: list[tuple[Command, AclRow]] = [
        (Pubs("orders", b"x"), acl("User:bob", AclOperation.WRITE, AclResource.TOPIC, "orders")),
        (DeleteGroup("g"), acl("User:bob", AclOperation.DELETE, AclResource.GROUP, "g")),
        (
            Reassign("orders", 0, (1,)),
            acl("User:bob", AclOperation.ADMIN, AclResource.CLUSTER, "kafka-cluster"),
        ),
    ]
    for command, needed in cases:
        message = refused(access, command, bob)
        assert message == f"User:bob may not {needed.operation} {needed.resource} {needed.name}"
        access.set_acls(frozenset({unrelated, needed}))
        access.check(command, bob)
        access.set_acls(frozenset({unrelated}))
    assert metrics.refused == {"write": 1, "delete": 1, "admin": 1}
    # Super users pass whatever the ACLs say.
    access.check(Reassign("orders", 0, (1,)), authenticated("User:admin"))


def test_every_requirement_of_a_command_is_checked(users_file: str) -> None:
    access, _ = make_access(users_file)
    bob = authenticated("User:bob")
    read_topic = acl("User:bob", AclOperation.READ, AclResource.TOPIC, "t")
    read_group = acl("User:bob", AclOperation.READ, AclResource.GROUP, "g")
    access.set_acls(frozenset({read_topic}))
    assert refused(access, Subs("t", "g"), bob) == "User:bob may not read group g"
    access.set_acls(frozenset({read_group}))
    assert refused(access, Subs("t", "g"), bob) == "User:bob may not read topic t"
    access.set_acls(frozenset({read_topic, read_group}))
    access.check(Subs("t", "g"), bob)


def test_deny_wins_prefixes_match_and_wildcards(users_file: str) -> None:
    access, _ = make_access(users_file)
    bob = authenticated("User:bob")
    everyone = acl(
        "User:*", AclOperation.WRITE, AclResource.TOPIC, "logs-", pattern=AclPattern.PREFIXED
    )
    deny = acl(
        "User:bob",
        AclOperation.WRITE,
        AclResource.TOPIC,
        "logs-secret",
        permission=AclPermission.DENY,
    )
    access.set_acls(frozenset({everyone, deny}))
    access.check(Pubs("logs-web", b"x"), bob)
    access.check(Pubs("logs-secret", b"x"), authenticated("User:alice"))
    assert refused(access, Pubs("logs-secret", b"x"), bob) == (
        "User:bob may not write topic logs-secret"
    )
    refused(access, Pubs("log", b"x"), bob)  # shorter than the prefix
    # An allowed write implies describe, so the topics show in listings (a denied write
    # does not deny describe, as in Kafka); others do not.
    assert access.visible(bob, AclResource.TOPIC, ["logs-web", "logs-secret", "other"]) == [
        "logs-web",
        "logs-secret",
    ]
    # The cache follows the ACLs: a new set decides afresh.
    access.set_acls(frozenset({deny}))
    refused(access, Pubs("logs-web", b"x"), bob)


def test_check_operation_covers_auto_creation(users_file: str) -> None:
    access, metrics = make_access(users_file)
    bob = authenticated("User:bob")
    write = acl("User:bob", AclOperation.WRITE, AclResource.TOPIC, "new")
    access.set_acls(frozenset({write}))
    access.check(Pubs("new", b"x"), bob)
    with pytest.raises(RequestError) as info:
        access.check_operation(bob, AclOperation.CREATE, AclResource.TOPIC, "new")
    assert info.value.message == "User:bob may not create topic new"
    assert metrics.refused == {"create": 1}


def test_peer_host_of_a_stream_without_a_socket_is_empty() -> None:
    import trio.testing

    left, _ = trio.testing.memory_stream_pair()
    assert peer_host(left) == ""


def broker_config(tmp_path: Path, users_file: str | None = None) -> BrokerConfig:
    here = Address("127.0.0.1", 1)
    return BrokerConfig(0, str(tmp_path), here, {0: here}, {0: here}, users_file=users_file)


def test_a_users_file_that_cannot_be_read_stops_the_broker_with_a_config_error(
    tmp_path: Path,
) -> None:
    plaintext = tmp_path / "old-users"
    plaintext.write_text("alice:password\n")
    for path in (plaintext, tmp_path / "missing"):
        config = broker_config(tmp_path, users_file=str(path))
        with pytest.raises(ConfigError, match="users_file"):
            AccessControl.from_config(config, FakeMetrics())
    access = AccessControl.from_config(broker_config(tmp_path), FakeMetrics())
    assert access.users is None and not enforcing(access)
