"""Hypothesis properties of the line protocol codec.

* Round trips: any valid commands (replies), encoded, concatenated, cut at random points and fed
  piece by piece, decode to the same commands (replies) in the same order, whatever the line
  endings (CRLF or LF) and however many empty lines sit between them.
* Robustness: arbitrary bytes never make ``LineDecoder`` raise; every command it does produce is
  valid (it re-encodes and decodes to itself); its buffer stays within the limits.
"""

from __future__ import annotations

import contextlib
import itertools

import hypothesis.strategies as st
from hypothesis import HealthCheck, given, settings

from kafkaesque.protocol import (
    AUTH_MECHANISMS,
    COMMAND_WORDS,
    NEED_DATA,
    Acks,
    AclAdd,
    AclList,
    AclOperation,
    AclPattern,
    AclPermission,
    AclRemove,
    AclResource,
    AclRow,
    AddBroker,
    AlterTopic,
    Authenticate,
    BadCommand,
    BrokerRow,
    Command,
    Commit,
    Cons,
    CreateTopic,
    DataReply,
    DeleteGroup,
    DeleteTopic,
    DescribeGroup,
    DescribeTopic,
    ElectLeaders,
    EndReply,
    ErrorCode,
    ErrorReply,
    Fetch,
    FetchFormat,
    FetchOffsets,
    FetchReplica,
    Fsync,
    GroupRow,
    GroupStateRow,
    Help,
    Idempotence,
    InfoRow,
    Latest,
    Leave,
    LineDecoder,
    LineEvent,
    LineLimits,
    ListGroups,
    ListTopics,
    MemberRow,
    MessageRow,
    Metadata,
    OffsetRow,
    OkReply,
    PartitionRow,
    Ping,
    PublishBatch,
    PublishRecord,
    Pubs,
    Quit,
    Reassign,
    RemoteProtocolError,
    RemoveBroker,
    Reply,
    ReplyDecoder,
    ResetKind,
    ResetOffsets,
    Subs,
    TopicRow,
    encode_command,
    encode_reply,
    escape_key,
    escape_value,
    unescape,
)

INT16, INT32, INT64 = 2**15 - 1, 2**31 - 1, 2**63 - 1

topics = st.from_regex(r"[A-Za-z0-9._-]{1,12}", fullmatch=True).filter(
    lambda t: t not in (".", "..") and not t.startswith("__")
)
readable_topics = topics | st.just("__consumer_offsets")
names = st.from_regex(r"[\x21-\x7e]{1,12}", fullmatch=True)
partitions = st.integers(0, INT32)
offsets = st.integers(0, INT64)
payloads = st.binary(max_size=40)
acks = st.sampled_from(Acks)


def _pubs_ok(message: bytes) -> bool:
    return b"\n" not in message and not message[:1].isspace() and message[-1:] != b"\r"


pubs = st.builds(Pubs, topics, st.binary(min_size=1, max_size=40).filter(_pubs_ok))


@st.composite
def publish_records(draw: st.DrawFn) -> PublishRecord:
    idempotence = draw(
        st.none() | st.builds(Idempotence, offsets, st.integers(0, INT16), partitions)
    )
    partition = draw(partitions if idempotence else st.none() | partitions)
    # Text-like values exercise the inline form ("--", options look-alikes); binary the bytes= one.
    value = draw(
        payloads
        | st.sampled_from([b"--", b"-- x", b"key=v", b"a=b c", b"bytes=3", b"x=", b"plain text"])
    )
    key = draw(st.none() | st.binary(max_size=10) | st.sampled_from([b"-", b"%41", b"a b", b"k=v"]))
    return PublishRecord(draw(topics), value, key, partition, draw(acks), idempotence)


@st.composite
def cons_offsets(draw: st.DrawFn) -> int | tuple[tuple[int, int], ...]:
    if draw(st.booleans()):
        return draw(offsets)
    keys = draw(st.lists(partitions, min_size=1, max_size=4, unique=True))
    return tuple((p, draw(offsets)) for p in keys)


optional_int32 = st.none() | st.integers(0, INT32)
retention = st.none() | st.integers(-1, INT64)
principals = st.just("User:*") | names.map("User:{}".format)


@st.composite
def acl_rows(draw: st.DrawFn) -> AclRow:
    resource = draw(st.sampled_from(AclResource))
    pattern = draw(st.sampled_from(AclPattern))
    if resource is AclResource.CLUSTER:
        pattern, name = AclPattern.LITERAL, "kafka-cluster"
    elif pattern is AclPattern.LITERAL:
        name = draw(st.just("*") | (readable_topics if resource is AclResource.TOPIC else names))
    else:
        name = draw((topics if resource is AclResource.TOPIC else names).filter(lambda n: n != "*"))
    return AclRow(
        draw(principals),
        draw(st.sampled_from(AclPermission)),
        draw(st.sampled_from(AclOperation)),
        resource,
        pattern,
        name,
    )


commands: st.SearchStrategy[Command] = st.one_of(
    pubs,
    publish_records(),
    st.builds(PublishBatch, topics, partitions, payloads, acks),
    st.builds(
        Subs,
        readable_topics,
        names,
        st.none() | st.integers(1, INT32),
        st.none() | st.integers(1, INT32),
    ),
    st.builds(
        Cons,
        readable_topics,
        names,
        cons_offsets(),
        st.none() | st.integers(1, INT32),
        optional_int32,
    ),
    st.builds(
        CreateTopic,
        topics,
        st.integers(1, INT32),
        st.integers(1, INT16),
        retention,
        retention,
        st.booleans(),
        st.none() | st.sampled_from(Fsync),
    ),
    st.builds(
        AlterTopic,
        topics,
        st.none() | st.integers(1, INT32),
        retention,
        retention,
        st.none() | st.booleans(),
    ).filter(lambda a: (a.partitions, a.retention_ms, a.retention_bytes, a.compact) != (None,) * 4),
    st.just(ListTopics()),
    st.builds(DescribeTopic, readable_topics),
    st.builds(DeleteTopic, topics),
    st.builds(
        Fetch,
        readable_topics,
        partitions,
        offsets,
        st.none() | st.integers(1, INT32),
        optional_int32,
        st.sampled_from(FetchFormat),
        st.sampled_from(FetchReplica),
    ),
    st.builds(Latest, readable_topics, st.binary(min_size=1)),
    st.builds(Commit, names, readable_topics, partitions, offsets, st.none() | names),
    st.builds(FetchOffsets, names, readable_topics),
    st.builds(DescribeGroup, names, st.none() | readable_topics),
    st.just(ListGroups()),
    st.builds(
        ResetOffsets,
        names,
        readable_topics,
        st.sampled_from([ResetKind.EARLIEST, ResetKind.LATEST]),
        st.none(),
        st.booleans(),
    ),
    st.builds(
        ResetOffsets,
        names,
        readable_topics,
        st.sampled_from([ResetKind.OFFSET, ResetKind.TIME]),
        offsets,
        st.booleans(),
    ),
    st.builds(DeleteGroup, names),
    st.builds(Leave, names),
    st.builds(Metadata, st.lists(readable_topics, max_size=3).map(tuple)),
    st.builds(
        Reassign,
        readable_topics,
        partitions,
        st.lists(partitions, min_size=1, max_size=5, unique=True).map(tuple),
    ),
    st.builds(
        AddBroker,
        partitions,
        st.builds("{}:{}".format, names.filter(lambda n: ":" not in n), st.integers(0, 65535)),
        st.builds("{}:{}".format, names.filter(lambda n: ":" not in n), st.integers(0, 65535)),
    ),
    st.builds(RemoveBroker, partitions),
    st.builds(ElectLeaders),
    st.builds(ElectLeaders, readable_topics),
    st.builds(ElectLeaders, readable_topics, partitions),
    st.builds(Authenticate, st.sampled_from(AUTH_MECHANISMS), st.binary(min_size=1, max_size=60)),
    st.builds(AclAdd, acl_rows()),
    st.builds(AclRemove, acl_rows()),
    st.builds(AclList, st.none() | principals),
    st.builds(Help, st.none() | st.sampled_from(COMMAND_WORDS)),
    st.just(Ping()),
    st.just(Quit()),
)


def _with_lf_endings(encoded: bytes) -> bytes:
    """The same command with LF instead of CRLF after its line and after its payload."""
    line_end = encoded.index(b"\r\n")
    head, rest = encoded[:line_end], encoded[line_end + 2 :]
    if not rest:
        return head + b"\n"
    return head + b"\n" + rest[:-2] + b"\n"


def _cut(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


@given(
    st.lists(
        st.tuples(commands, st.booleans(), st.sampled_from([b"", b"\r\n", b"  \n"])), max_size=12
    ),
    st.lists(st.integers(0, 10_000), max_size=20),
)
def test_commands_survive_any_chunking(
    items: list[tuple[Command, bool, bytes]], cuts: list[int]
) -> None:
    stream = b""
    for command, lf_only, blank in items:
        encoded = encode_command(command)
        stream += blank + (_with_lf_endings(encoded) if lf_only else encoded)
    decoder = LineDecoder()
    decoded: list[LineEvent] = []
    for piece in _cut(stream, cuts):
        decoder.feed(piece)
        decoded.extend(decoder.events())
    assert decoded == [command for command, _, _ in items]
    assert decoder.buffered_bytes == 0


# RFC 854's commands, as a telnet client may send them in the middle of a line (none holds LF:
# the decoder strips telnet inside a line).
telnet_commands = st.one_of(
    st.sampled_from([bytes((0xFF, c)) for c in range(0xF0, 0xFA)]),  # SE, NOP, ..., GA
    st.builds(
        lambda verb, option: bytes((0xFF, verb, option)),
        st.integers(0xFB, 0xFE),  # WILL, WONT, DO, DONT
        st.integers(0, 255).filter(lambda b: b != 0x0A),
    ),
    st.binary(max_size=8)
    .filter(lambda b: b"\n" not in b)
    .map(lambda b: b"\xff\xfa" + b.replace(b"\xff", b"\xff\xff") + b"\xff\xf0"),
)


def _line_positions(encoded: bytes) -> list[int]:
    """Where a telnet command may go into an encoded command: in its line (not its payload),
    not right after a 0xFF (which may be the first half of an IAC IAC)."""
    line_end = encoded.index(b"\r\n")
    return [i for i in range(line_end + 1) if i == 0 or encoded[i - 1] != 0xFF]


@given(
    st.lists(st.tuples(commands, st.lists(st.tuples(st.integers(0), telnet_commands))), max_size=8),
    st.lists(st.integers(0, 10_000), max_size=20),
)
def test_telnet_commands_anywhere_in_a_line_are_dropped_whole(
    items: list[tuple[Command, list[tuple[int, bytes]]]], cuts: list[int]
) -> None:
    stream = b""
    for command, insertions in items:
        encoded = encode_command(command)
        positions = _line_positions(encoded)
        # From the last position back, so that no command goes inside another.
        for at, telnet in sorted(
            ((positions[where % len(positions)], telnet) for where, telnet in insertions),
            key=lambda item: item[0],
            reverse=True,
        ):
            encoded = encoded[:at] + telnet + encoded[at:]
        stream += encoded
    decoder = LineDecoder()
    decoder.feed(b"\xff\xf1\r\n")  # IAC NOP: the connection is a telnet client's from now on
    assert isinstance(next(decoder.events()), BadCommand)
    decoded: list[LineEvent] = []
    for piece in _cut(stream, cuts):
        decoder.feed(piece)
        decoded.extend(decoder.events())
    assert decoded == [command for command, _ in items]


@given(pubs, st.integers(0), st.integers(0, 0xEF).filter(lambda b: b != 0x0A))
def test_a_lone_iac_never_yields_altered_bytes(command: Pubs, where: int, after: int) -> None:
    # 0xFF followed by a byte that is no telnet command: the line is refused, never decoded
    # into a message or topic with bytes dropped. (Not an LF: that ends the line there, and the
    # rest is a line of its own, rightly decoded.)
    encoded = encode_command(command)
    positions = _line_positions(encoded)
    at = positions[where % len(positions)]
    if encoded[at : at + 1] == b"\xff":
        return  # the inserted IAC would pair with an escaped 0xFF: not a lone one
    encoded = encoded[:at] + b"\xff" + bytes((after,)) + encoded[at:]
    decoder = LineDecoder()
    decoder.feed(encoded + b"PING\r\n")
    events = list(decoder.events())
    assert events[-1] == Ping()
    assert all(isinstance(e, BadCommand) and e.code is ErrorCode.BAD_ARGS for e in events[:-1])


texts = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\r\n"), max_size=30)
next_offsets = st.lists(st.tuples(partitions, offsets), max_size=4, unique_by=lambda p: p[0]).map(
    tuple
)

replies: st.SearchStrategy[Reply] = st.one_of(
    st.builds(OkReply, texts),
    st.builds(ErrorReply, st.sampled_from(ErrorCode), texts),
    st.builds(DataReply, offsets, st.binary(max_size=60), st.none() | offsets),
    st.builds(
        MessageRow, partitions, offsets, st.none() | st.binary(max_size=12), st.none() | payloads
    ),
    st.builds(
        TopicRow,
        readable_topics,
        st.integers(1, INT32),
        st.integers(1, INT16),
        retention,
        retention,
        st.booleans(),
        st.none() | st.sampled_from(Fsync),
    ),
    st.builds(
        PartitionRow,
        readable_topics,
        partitions,
        st.none() | partitions,
        st.lists(partitions, min_size=1, max_size=5).map(tuple),
        st.none() | offsets,
        st.none() | offsets,
    ),
    st.builds(
        BrokerRow,
        partitions,
        names,
        st.integers(0, 65535),
        st.none() | st.integers(0, 65535),
        st.none() | st.integers(0, 65535),
        st.none() | st.integers(0, 65535),
        st.none() | st.integers(0, 65535),
        st.none() | st.integers(0, 65535),
    ),
    st.builds(OffsetRow, readable_topics, partitions, st.none() | offsets),
    st.builds(
        GroupRow,
        names,
        readable_topics,
        partitions,
        st.none() | names.filter(lambda n: n != "-"),
        st.none() | offsets,
        st.none() | offsets,
    ),
    st.builds(GroupStateRow, names, readable_topics, names, partitions),
    st.builds(
        MemberRow,
        names,
        readable_topics,
        names,
        st.lists(partitions, max_size=5).map(tuple),
    ),
    st.builds(InfoRow, texts),
    acl_rows(),
    st.builds(EndReply, next_offsets),
)


@given(st.lists(replies, max_size=15), st.lists(st.integers(0, 10_000), max_size=20))
def test_replies_survive_any_chunking(expected: list[Reply], cuts: list[int]) -> None:
    stream = b"".join(encode_reply(reply) for reply in expected)
    decoder = ReplyDecoder()
    decoded: list[Reply] = []
    for piece in _cut(stream, cuts):
        decoder.feed(piece)
        decoded.extend(decoder.events())
    assert decoded == expected
    assert decoder.buffered_bytes == 0


@given(st.binary(max_size=60))
def test_escaping_round_trips(raw: bytes) -> None:
    key = escape_key(raw)
    assert unescape(key) == raw
    assert not any(c <= 0x20 or c in (0x7F, 0xFF) for c in key)
    value = escape_value(raw)
    assert unescape(value) == raw
    assert b"\n" not in value and b"\r" not in value and b"\xff" not in value


# --- Robustness against whatever a peer sends --------------------------------------------------

# Fragments that steer random input toward the grammar's corners, mixed with raw bytes.
fragments = st.sampled_from(
    [
        *(w.encode() + b" " for w in COMMAND_WORDS),
        b"t ",
        b"__consumer_offsets ",
        b"0 ",
        b"3 ",
        b"-1 ",
        b"0:1,2:3 ",
        b"key=k ",
        b"partition=1 ",
        b"acks=leader ",
        b"pid=1 epoch=0 seq=0 ",
        b"bytes=3 ",
        b"max=2 ",
        b"format=text ",
        b"compact=yes ",
        b"SCRAM-SHA-256 ",
        b"plain ",
        b"biws ",
        b"YQ== ",
        b"ADD ",
        b"LIST ",
        b"User:alice ",
        b"User:* ",
        b"allow ",
        b"write ",
        b"topic ",
        b"cluster ",
        b"prefixed ",
        b"kafka-cluster ",
        b"* ",
        b"-- ",
        b"\r\n",
        b"\n",
        b"\r",
        b"\xff",
        b"\xff\xf4",
        b"\xff\xfa",
        b"\x00",
    ]
)
noise = st.lists(fragments | st.binary(max_size=6), max_size=40).map(b"".join)
SMALL = LineLimits(max_line_length=64, max_payload=16)


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(noise, st.lists(st.integers(0, 10_000), max_size=10), st.sampled_from([SMALL, LineLimits()]))
def test_any_bytes_give_valid_events_and_bounded_memory(
    data: bytes, cuts: list[int], limits: LineLimits
) -> None:
    decoder = LineDecoder(limits)
    bound = max(limits.max_line_length, limits.max_payload) + 1
    for piece in _cut(data, cuts):
        decoder.feed(piece)
        while (event := decoder.next_event()) is not NEED_DATA:
            if isinstance(event, BadCommand):
                assert event.message and "\n" not in event.message
                continue
            # Whatever the decoder accepts is valid: it encodes, and decodes to itself.
            again = LineDecoder()
            again.feed(encode_command(event))
            assert list(again.events()) == [event]
        assert decoder.buffered_bytes <= bound


@given(noise)
def test_a_telnet_line_after_any_garbage_line_is_understood(garbage: bytes) -> None:
    # Garbage without a payload-announcing command cannot swallow the next line.
    garbage = garbage.replace(b"PUB", b"PUX")
    decoder = LineDecoder(SMALL)
    decoder.feed(garbage + b"\r\nPING\r\n")
    events = list(decoder.events())
    assert events[-1] == Ping()


@given(st.binary(max_size=200))
def test_reply_decoder_raises_only_remote_protocol_errors(data: bytes) -> None:
    decoder = ReplyDecoder(LineLimits(max_line_length=64, max_payload=16))
    decoder.feed(data)
    with contextlib.suppress(RemoteProtocolError):  # any other exception fails the test
        list(decoder.events())
