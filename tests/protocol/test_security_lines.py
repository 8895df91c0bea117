"""Security on the line protocol (issue 25): ``AUTH`` and ``ACL ADD|REMOVE|LIST`` lines, the
``+ACL`` row, the ``AUTH`` replies and their refusals of bad input (always ``BAD_ARGS`` with the
usage, never an exception: the decoder faces unauthenticated peers)."""

from __future__ import annotations

import base64
import itertools
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import given

from kafkaesque.protocol import (
    ANY_PRINCIPAL,
    AUTH_MECHANISMS,
    CLUSTER_RESOURCE_NAME,
    COMMAND_WORDS,
    AclAdd,
    AclList,
    AclOperation,
    AclPattern,
    AclPermission,
    AclRemove,
    AclResource,
    AclRow,
    Authenticate,
    BadCommand,
    EndReply,
    ErrorCode,
    InfoRow,
    LineDecoder,
    LocalProtocolError,
    OkReply,
    Ping,
    RemoteProtocolError,
    ReplyDecoder,
    acl_removed_reply,
    auth_authenticated_reply,
    auth_continue_reply,
    auth_reply_parts,
    encode_command,
    encode_reply,
    help_replies,
    parse_acl_removed_reply,
)

ALLOW, DENY = AclPermission.ALLOW, AclPermission.DENY
TOPIC, GROUP, CLUSTER = AclResource.TOPIC, AclResource.GROUP, AclResource.CLUSTER
LITERAL, PREFIXED = AclPattern.LITERAL, AclPattern.PREFIXED

ALICE_WRITES_ORDERS = AclRow("User:alice", ALLOW, AclOperation.WRITE, TOPIC, LITERAL, "orders")


def _decode_line(line: bytes) -> Any:
    decoder = LineDecoder()
    decoder.feed(line)
    events = list(decoder.events())
    assert len(events) == 1, events
    return events[0]


# --- AUTH -----------------------------------------------------------------------------------


CLIENT_FIRST = b"n,,n=alice,r=fyko+d2lbbFgONRv9qkxdawL"


@pytest.mark.parametrize(
    ("line", "command"),
    [
        (
            b"AUTH SCRAM-SHA-256 " + base64.b64encode(CLIENT_FIRST),
            Authenticate("SCRAM-SHA-256", CLIENT_FIRST),
        ),
        (b"auth scram-sha-256 YQ==", Authenticate("SCRAM-SHA-256", b"a")),
        (b"AUTH Plain AGFsaWNlAHNlY3JldA==", Authenticate("PLAIN", b"\0alice\0secret")),
    ],
)
def test_auth_lines_decode_with_the_mechanism_upper_case(line: bytes, command: object) -> None:
    assert _decode_line(line + b"\r\n") == command
    canonical = b"AUTH %s %s\r\n" % (
        command.mechanism.encode(),  # type: ignore[attr-defined]
        base64.b64encode(command.payload),  # type: ignore[attr-defined]
    )
    assert encode_command(command) == canonical  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("line", "says"),
    [
        (b"AUTH", "usage: AUTH SCRAM-SHA-256|PLAIN <base64>"),
        (b"AUTH SCRAM-SHA-256", "usage: AUTH"),
        (b"AUTH SCRAM-SHA-256 YQ== YQ==", "usage: AUTH"),
        (b"AUTH GSSAPI YQ==", "mechanism must be SCRAM-SHA-256|PLAIN, not 'GSSAPI'"),
        (b"AUTH SCRAM-SHA-1 YQ==", "mechanism must be"),
        (b"AUTH PLAIN YQ", "the payload is not base64"),  # padding missing
        (b"AUTH PLAIN Y!Q=", "the payload is not base64"),  # not of the alphabet
        (b"AUTH PLAIN YQ==YQ==", "the payload is not base64"),  # padding inside
        (b"AUTH PLAIN ====", "the payload is"),  # nothing in it
    ],
)
def test_malformed_auth_lines_are_bad_args_with_the_usage(line: bytes, says: str) -> None:
    event = _decode_line(line + b"\r\n")
    assert isinstance(event, BadCommand)
    assert event.code is ErrorCode.BAD_ARGS
    assert says in event.message
    assert not event.framing_error


def test_a_refused_auth_line_does_not_echo_its_payload() -> None:
    secret = base64.b64encode(b"\0alice\0hunter2")[:-1]  # padding cut: not base64 any more
    event = _decode_line(b"AUTH PLAIN " + secret + b"\r\n")
    assert isinstance(event, BadCommand)
    assert secret.decode() not in event.message


@pytest.mark.parametrize(
    "command",
    [
        Authenticate("scram-sha-256", b"x"),  # the event's mechanism is upper-case
        Authenticate("GSSAPI", b"x"),
        Authenticate("PLAIN", b""),
        Authenticate("PLAIN", "text"),  # type: ignore[arg-type]
    ],
)
def test_encode_refuses_an_auth_that_could_not_round_trip(command: Authenticate) -> None:
    with pytest.raises(LocalProtocolError):
        encode_command(command)


def test_auth_replies_carry_the_challenge_and_the_server_final() -> None:
    challenge = b"r=abc,s=c2FsdA==,i=4096"
    continue_reply = auth_continue_reply(challenge)
    assert encode_reply(continue_reply) == b"+OK continue " + base64.b64encode(challenge) + b"\r\n"
    assert auth_reply_parts(continue_reply.text) == ("continue", None, challenge)
    done = auth_authenticated_reply("alice", b"v=signature")
    assert done.text == "authenticated alice " + base64.b64encode(b"v=signature").decode()
    assert auth_reply_parts(done.text) == ("authenticated", "alice", b"v=signature")
    assert auth_reply_parts(auth_authenticated_reply("bob").text) == ("authenticated", "bob", b"")
    assert auth_reply_parts(auth_authenticated_reply("josé").text)[1] == "josé"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "PONG",
        "continue",
        "continue YQ== more",
        "continue not-base64!",
        "authenticated",
        "authenticated alice YQ",
        "authenticated alice YQ== more",
    ],
)
def test_a_malformed_auth_reply_breaks_the_exchange(text: str) -> None:
    with pytest.raises(RemoteProtocolError, match="malformed AUTH reply"):
        auth_reply_parts(text)


def test_auth_reply_builders_refuse_what_could_not_be_read_back() -> None:
    with pytest.raises(LocalProtocolError):
        auth_continue_reply(b"")
    with pytest.raises(LocalProtocolError):
        auth_authenticated_reply("two words")
    with pytest.raises(LocalProtocolError):
        auth_authenticated_reply("alice", b"")


# --- ACL ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "command"),
    [
        (b"ACL ADD User:alice allow write topic literal orders", AclAdd(ALICE_WRITES_ORDERS)),
        (
            b"ACL REMOVE User:* deny read topic prefixed logs.",
            AclRemove(AclRow(ANY_PRINCIPAL, DENY, AclOperation.READ, TOPIC, PREFIXED, "logs.")),
        ),
        (
            b"ACL ADD User:bob allow commit group literal billing",
            AclAdd(AclRow("User:bob", ALLOW, AclOperation.COMMIT, GROUP, LITERAL, "billing")),
        ),
        (
            b"ACL ADD User:ops allow admin cluster literal kafka-cluster",
            AclAdd(
                AclRow("User:ops", ALLOW, AclOperation.ADMIN, CLUSTER, LITERAL, "kafka-cluster")
            ),
        ),
        (
            b"ACL ADD User:carol allow all topic literal *",
            AclAdd(AclRow("User:carol", ALLOW, AclOperation.ALL, TOPIC, LITERAL, "*")),
        ),
        (
            b"ACL ADD User:dave allow describe topic literal __consumer_offsets",
            AclAdd(
                AclRow(
                    "User:dave", ALLOW, AclOperation.DESCRIBE, TOPIC, LITERAL, "__consumer_offsets"
                )
            ),
        ),
        (b"ACL LIST", AclList()),
        (b"ACL LIST User:alice", AclList("User:alice")),
        (b"ACL LIST User:*", AclList("User:*")),
        ("ACL LIST User:josé".encode(), AclList("User:josé")),  # user names may be UTF-8
    ],
)
def test_acl_lines_decode_and_encode_back(line: bytes, command: object) -> None:
    assert _decode_line(line + b"\r\n") == command
    assert encode_command(command) == line + b"\r\n"  # type: ignore[arg-type]


def test_acl_words_are_case_insensitive_but_names_are_not() -> None:
    event = _decode_line(b"acl add User:alice ALLOW Write TOPIC Literal Orders\r\n")
    assert event == AclAdd(
        AclRow("User:alice", ALLOW, AclOperation.WRITE, TOPIC, LITERAL, "Orders")
    )
    assert _decode_line(b"acl list\r\n") == AclList()


@pytest.mark.parametrize(
    ("line", "says"),
    [
        (b"ACL", "usage: ACL ADD|REMOVE <principal>"),
        (b"ACL SHOW", "usage: ACL"),
        (b"ACL LIST User:a User:b", "usage: ACL"),
        (b"ACL ADD User:alice allow write topic literal", "usage: ACL"),
        (b"ACL ADD User:alice allow write topic literal orders extra", "usage: ACL"),
        (b"ACL ADD alice allow write topic literal orders", "invalid principal 'alice'"),
        (b"ACL ADD User: allow write topic literal orders", "invalid principal"),
        (b"ACL ADD Group:x allow write topic literal orders", "invalid principal"),
        (b"ACL LIST alice", "invalid principal"),
        (b"ACL ADD User:alice permit write topic literal orders", "permission must be allow|deny"),
        (b"ACL ADD User:alice allow fly topic literal orders", "operation must be read|write"),
        (b"ACL ADD User:alice allow write table literal orders", "resource must be topic|group"),
        (b"ACL ADD User:alice allow write topic exact orders", "pattern must be literal|prefixed"),
        (b"ACL ADD User:alice allow write topic literal bad/name", "invalid topic name"),
        (b"ACL ADD User:alice allow write topic prefixed *", "not *"),
        (b"ACL ADD User:alice allow write group prefixed *", "not *"),
        (b"ACL ADD User:alice allow admin cluster literal other", "kafka-cluster"),
        (b"ACL ADD User:alice allow admin cluster prefixed kafka-cluster", "kafka-cluster"),
        (b"ACL ADD User:alice allow admin cluster literal *", "kafka-cluster"),
        (b"ACL ADD User:al\xe9 allow write topic literal orders", "invalid principal"),
    ],
)
def test_malformed_acl_lines_are_bad_args(line: bytes, says: str) -> None:
    event = _decode_line(line + b"\r\n")
    assert isinstance(event, BadCommand), event
    assert event.code is ErrorCode.BAD_ARGS
    assert says in event.message


@pytest.mark.parametrize(
    "command",
    [
        AclAdd(AclRow("alice", ALLOW, AclOperation.WRITE, TOPIC, LITERAL, "orders")),
        AclAdd(AclRow("User:alice", "allow", AclOperation.WRITE, TOPIC, LITERAL, "o")),  # type: ignore[arg-type]
        AclRemove(AclRow("User:alice", ALLOW, AclOperation.WRITE, TOPIC, LITERAL, "a b")),
        AclRemove(AclRow("User:alice", ALLOW, AclOperation.ADMIN, CLUSTER, LITERAL, "c")),
        AclAdd("ACL ADD ..."),  # type: ignore[arg-type]
        AclList("alice"),
    ],
)
def test_encode_refuses_an_acl_that_could_not_round_trip(command: Any) -> None:
    with pytest.raises(LocalProtocolError):
        encode_command(command)


def test_acl_rows_and_removed_count_are_read_back() -> None:
    rows = [
        ALICE_WRITES_ORDERS,
        AclRow("User:*", DENY, AclOperation.ALL, GROUP, PREFIXED, "tmp-"),
        AclRow("User:ops", ALLOW, AclOperation.ALTER, CLUSTER, LITERAL, CLUSTER_RESOURCE_NAME),
    ]
    stream = b"".join(encode_reply(row) for row in rows) + encode_reply(EndReply())
    assert encode_reply(rows[0]) == b"+ACL User:alice allow write topic literal orders\r\n"
    decoder = ReplyDecoder()
    decoder.feed(stream + encode_reply(acl_removed_reply(1)))
    replies = list(decoder.events())
    assert replies[:-1] == [*rows, EndReply()]
    assert replies[-1] == OkReply("removed=1")
    assert parse_acl_removed_reply(OkReply("removed=0")) == 0
    with pytest.raises(RemoteProtocolError):
        parse_acl_removed_reply(OkReply("gone"))


@pytest.mark.parametrize(
    "line",
    [
        b"+ACL User:alice allow write topic literal",  # a field short
        b"+ACL User:alice allow write topic literal orders x",  # one too many
        b"+ACL alice allow write topic literal orders",  # no User:
        b"+ACL User:alice ALLOW write topic literal orders",  # replies are canonical
        b"+ACL User:alice allow write queue literal orders",
        b"+ACL User:alice allow write cluster literal orders",
    ],
)
def test_a_malformed_acl_row_breaks_the_reply_stream(line: bytes) -> None:
    decoder = ReplyDecoder()
    decoder.feed(line + b"\r\n")
    with pytest.raises(RemoteProtocolError):
        list(decoder.events())


def test_help_names_auth_and_acl() -> None:
    assert "AUTH" in COMMAND_WORDS and "ACL" in COMMAND_WORDS
    usages = [r.text for r in help_replies(None) if isinstance(r, InfoRow)]
    assert "AUTH SCRAM-SHA-256|PLAIN <base64>" in usages
    assert any(u.startswith("ACL ADD|REMOVE <principal>") for u in usages)
    assert help_replies("AUTH")[1].text.startswith("One step of a SASL exchange")  # type: ignore[union-attr]


# --- Fuzz: an unauthenticated peer's junk never breaks the decoder --------------------------

acl_words = st.sampled_from(
    [
        b"ADD",
        b"REMOVE",
        b"LIST",
        b"User:alice",
        b"User:*",
        b"User:",
        b"allow",
        b"deny",
        b"write",
        b"all",
        b"topic",
        b"group",
        b"cluster",
        b"literal",
        b"prefixed",
        b"kafka-cluster",
        b"*",
        b"orders",
    ]
)
# Junk within one line: an LF would start another command, which is not what this checks.
tokens = acl_words | st.binary(min_size=1, max_size=8).filter(lambda b: b"\n" not in b)


@given(
    st.sampled_from([b"AUTH", b"auth", b"ACL", b"acl"]),
    st.lists(tokens, max_size=9),
    st.sampled_from([b" ", b"\t", b"  "]),
)
def test_junk_auth_and_acl_lines_never_raise(word: bytes, args: list[bytes], sep: bytes) -> None:
    decoder = LineDecoder()
    decoder.feed(sep.join([word, *args]) + b"\r\nPING\r\n")
    events = list(decoder.events())
    assert events[-1] == Ping()
    for event in events[:-1]:
        if isinstance(event, BadCommand):
            assert event.code in (ErrorCode.BAD_ARGS, ErrorCode.UNKNOWN_COMMAND)
            continue
        assert isinstance(event, (Authenticate, AclAdd, AclRemove, AclList))
        again = LineDecoder()
        again.feed(encode_command(event))
        assert list(again.events()) == [event]


line_bytes = st.binary(max_size=80).map(lambda b: bytes(c for c in b if c not in b"\r\n\xff"))


@given(st.sampled_from(AUTH_MECHANISMS), line_bytes | st.binary(max_size=60).map(base64.b64encode))
def test_auth_base64_junk_is_refused_or_decoded_exactly(mechanism: str, raw: bytes) -> None:
    decoder = LineDecoder()
    decoder.feed(b"AUTH " + mechanism.encode() + b" " + raw + b"\r\n")
    (event,) = decoder.events()
    if isinstance(event, Authenticate):
        (token,) = raw.split()
        assert event == Authenticate(mechanism, base64.b64decode(token))
        assert event.payload
    else:
        assert isinstance(event, BadCommand) and event.code is ErrorCode.BAD_ARGS


def test_the_documented_auth_and_acl_lines_decode_as_the_docs_say() -> None:
    page = Path(__file__).parents[2] / "docs" / "protocol.md"
    lines = page.read_text(encoding="utf-8").splitlines()
    checked = 0
    for line, answer in itertools.pairwise(lines):
        if not line.startswith(("AUTH ", "ACL ")):
            continue
        event = _decode_line(line.encode() + b"\r\n")
        if answer.startswith("-ERR"):
            assert isinstance(event, BadCommand)
            assert encode_reply(event.reply()) == answer.encode() + b"\r\n"
        else:
            assert isinstance(event, (Authenticate, AclAdd, AclRemove, AclList)), line
            assert encode_command(event) == line.encode() + b"\r\n"
        checked += 1
    assert checked == 7  # two AUTH steps, five ACL lines
