"""LineDecoder and encode_command: every command's syntax, every rejection, limits and telnet.

The seed's three commands are tested exactly as its users typed them. Byte streams are fed the
way sockets deliver them: whole, in halves, byte by byte, pipelined.
"""

from __future__ import annotations

import pytest

from kafkaesque.protocol import (
    COMMAND_WORDS,
    NEED_DATA,
    Acks,
    AlterTopic,
    BadCommand,
    Command,
    Commit,
    Cons,
    CreateTopic,
    DeleteTopic,
    DescribeTopic,
    EndReply,
    ErrorCode,
    Fetch,
    FetchFormat,
    FetchOffsets,
    FetchReplica,
    Fsync,
    Help,
    Idempotence,
    InfoRow,
    LineDecoder,
    LineEvent,
    LineLimits,
    ListTopics,
    LocalProtocolError,
    Metadata,
    Ping,
    PublishBatch,
    PublishRecord,
    Pubs,
    Quit,
    Subs,
    encode_command,
    help_replies,
    parse_seed_message,
)

SEED_JSON = b'{"Header": "h", "Key": "124", "Body": "Hello World!"}'


def decode(data: bytes, limits: LineLimits | None = None) -> list[LineEvent]:
    decoder = LineDecoder(limits) if limits else LineDecoder()
    decoder.feed(data)
    return list(decoder.events())


def decode_bytewise(data: bytes, limits: LineLimits | None = None) -> list[LineEvent]:
    decoder = LineDecoder(limits) if limits else LineDecoder()
    events: list[LineEvent] = []
    for i in range(len(data)):
        decoder.feed(data[i : i + 1])
        events.extend(decoder.events())
    return events


def one(line: bytes) -> LineEvent:
    events = decode(line)
    assert len(events) == 1, events
    return events[0]


def bad(line: bytes) -> BadCommand:
    event = one(line)
    assert isinstance(event, BadCommand), event
    return event


# --- The seed's commands, exactly as written ---------------------------------------------------


def test_seed_pubs_with_the_seeds_json_message() -> None:
    event = one(b"PUBS orders " + SEED_JSON + b"\r\n")
    assert event == Pubs("orders", SEED_JSON)
    assert isinstance(event, Pubs)
    seed = parse_seed_message(event.message)
    assert (seed.key, seed.value, seed.header) == (b"124", b"Hello World!", b"h")


def test_seed_pubs_plain_text_keeps_inner_and_trailing_spaces() -> None:
    assert one(b"PUBS topic_name hello   big world \n") == Pubs("topic_name", b"hello   big world ")


def test_seed_subs_with_and_without_partition_count() -> None:
    assert one(b"SUBS topic_name consumer_group\r\n") == Subs("topic_name", "consumer_group")
    assert one(b"SUBS topic_name consumer_group 3\r\n") == Subs("topic_name", "consumer_group", 3)


def test_subs_takes_a_session_timeout_of_its_own_after_the_partition_count() -> None:
    assert one(b"SUBS t g session_timeout_ms=3000\r\n") == Subs("t", "g", None, 3000)
    assert one(b"SUBS t g 2 SESSION_TIMEOUT_MS=3000\r\n") == Subs("t", "g", 2, 3000)
    for bad in (b"session_timeout_ms=0", b"session_timeout_ms=x", b"2 3", b"timeout=5"):
        event = one(b"SUBS t g " + bad + b"\r\n")
        assert isinstance(event, BadCommand) and event.code is ErrorCode.BAD_ARGS, bad
    event = one(b"SUBS t g session_timeout_ms=5 2\r\n")  # the count comes first
    assert isinstance(event, BadCommand) and event.code is ErrorCode.BAD_ARGS


def test_seed_cons() -> None:
    assert one(b"CONS topic_name sub-42 17\r\n") == Cons("topic_name", "sub-42", 17)


def test_command_words_are_case_insensitive() -> None:
    assert one(b"pubs t hi\n") == Pubs("t", b"hi")
    assert one(b"Ping\n") == Ping()


# --- Every command's syntax ---------------------------------------------------------------------

VALID_LINES: list[tuple[bytes, Command]] = [
    (b"CONS t s 0:5,3:7", Cons("t", "s", ((0, 5), (3, 7)))),
    (b"CONS t s 5 max=10 wait_ms=250", Cons("t", "s", 5, 10, 250)),
    (b"CREATE orders 3 2", CreateTopic("orders", 3, 2)),
    (
        b"CREATE orders 3 2 retention_ms=-1 retention_bytes=1000 compact=yes",
        CreateTopic("orders", 3, 2, -1, 1000, True),
    ),
    (b"CREATE orders 1 1 COMPACT=False", CreateTopic("orders", 1, 1, compact=False)),
    (b"CREATE orders 1 1 fsync=Interval", CreateTopic("orders", 1, 1, fsync=Fsync.INTERVAL)),
    (
        b"CREATE orders 3 2 retention_ms=-1 retention_bytes=1000 compact=yes fsync=never",
        CreateTopic("orders", 3, 2, -1, 1000, True, Fsync.NEVER),
    ),
    (b"ALTER orders partitions=6", AlterTopic("orders", partitions=6)),
    (b"alter orders retention_ms=-1 compact=no", AlterTopic("orders", None, -1, None, False)),
    (
        b"ALTER orders compact=yes retention_bytes=10 retention_ms=5 partitions=2",
        AlterTopic("orders", 2, 5, 10, True),
    ),
    (b"LIST", ListTopics()),
    (b"DESCRIBE orders", DescribeTopic("orders")),
    (b"DESCRIBE __consumer_offsets", DescribeTopic("__consumer_offsets")),
    (b"DELETE orders", DeleteTopic("orders")),
    (b"PUB t hello world", PublishRecord("t", b"hello world")),
    (b"PUB t key=user-1 hello", PublishRecord("t", b"hello", key=b"user-1")),
    (b"PUB t key=a%20b%zz hi", PublishRecord("t", b"hi", key=b"a b%zz")),
    (b"PUB t key= hi", PublishRecord("t", b"hi", key=b"")),
    (b"PUB t partition=2 acks=leader hi", PublishRecord("t", b"hi", partition=2, acks=Acks.LEADER)),
    (
        b"PUB t partition=1 pid=7 epoch=2 seq=40 hi",
        PublishRecord("t", b"hi", partition=1, idempotence=Idempotence(7, 2, 40)),
    ),
    (b"PUB t -- key=not-an-option", PublishRecord("t", b"key=not-an-option")),
    (b"PUB t -- -- x", PublishRecord("t", b"-- x")),
    (b"PUB t 1+1=2", PublishRecord("t", b"1+1=2")),
    (b"FETCH t 0 100", Fetch("t", 0, 100)),
    (
        b"FETCH t 2 100 max_bytes=4096 wait_ms=500 format=text",
        Fetch("t", 2, 100, 4096, 500, FetchFormat.TEXT),
    ),
    (b"FETCH t 0 5 replica=local", Fetch("t", 0, 5, replica=FetchReplica.LOCAL)),
    (
        b"FETCH t 0 5 max_bytes=1 wait_ms=2 format=text replica=local",
        Fetch("t", 0, 5, 1, 2, FetchFormat.TEXT, FetchReplica.LOCAL),
    ),
    (b"FETCH t 0 5 REPLICA=Any", Fetch("t", 0, 5)),
    (b"COMMIT g t 1 99", Commit("g", "t", 1, 99)),
    (b"OFFSETS g t", FetchOffsets("g", "t")),
    (b"METADATA", Metadata()),
    (b"METADATA a b", Metadata(("a", "b"))),
    (b"HELP", Help()),
    (b"HELP fetch", Help("FETCH")),
    (b"PING", Ping()),
    (b"QUIT", Quit()),
]


@pytest.mark.parametrize(
    ("line", "expected"), VALID_LINES, ids=[v[0].decode() for v in VALID_LINES]
)
def test_command_syntax(line: bytes, expected: Command) -> None:
    assert one(line + b"\r\n") == expected
    # The canonical encoding of what was decoded decodes to the same command.
    assert one(encode_command(expected)) == expected


def test_pub_with_byte_count_takes_any_bytes() -> None:
    value = b"line one\r\nline two\xff\x00 "
    data = b"PUB t key=k bytes=%d\r\n%s\r\nPING\r\n" % (len(value), value)
    expected = [PublishRecord("t", value, key=b"k"), Ping()]
    assert decode(data) == expected
    assert decode_bytewise(data) == expected


def test_pub_with_zero_bytes_is_an_empty_value() -> None:
    assert decode(b"PUB t bytes=0\r\n\r\nPING\n") == [PublishRecord("t", b""), Ping()]


def test_pubb_carries_an_opaque_batch() -> None:
    batch = bytes(range(256)) * 3
    data = b"PUBB t 4 %d acks=leader\r\n%s\r\n" % (len(batch), batch)
    expected = [PublishBatch("t", 4, batch, Acks.LEADER)]
    assert decode(data) == expected
    assert decode_bytewise(data) == expected


def test_payload_may_end_with_lf_alone() -> None:
    assert decode(b"PUBB t 0 3\nabc\nPING\n") == [PublishBatch("t", 0, b"abc"), Ping()]


# --- Rejections: every error code the decoder produces ------------------------------------------

BAD_LINES: list[tuple[bytes, ErrorCode, str]] = [
    (b"FOO bar", ErrorCode.UNKNOWN_COMMAND, "unknown command 'FOO'"),
    (b"\x00\x01", ErrorCode.UNKNOWN_COMMAND, "unknown command"),
    (b"PUBS", ErrorCode.BAD_ARGS, "usage: PUBS <topic> <message>"),
    (b"PUBS orders", ErrorCode.BAD_ARGS, "usage: PUBS"),
    (b"SUBS t", ErrorCode.BAD_ARGS, "usage: SUBS"),
    (b"SUBS t g 0", ErrorCode.BAD_ARGS, "partitions must be an integer from 1"),
    (b"SUBS t g 1 2", ErrorCode.BAD_ARGS, "usage: SUBS"),
    (b"SUBS t g\x80 1", ErrorCode.BAD_ARGS, "invalid group"),
    (b"CONS t s", ErrorCode.BAD_ARGS, "usage: CONS"),
    (b"CONS t s -1", ErrorCode.BAD_ARGS, "offset must be"),
    (b"CONS t s 0:1,0:2", ErrorCode.BAD_ARGS, "partition 0 given twice"),
    (b"CONS t s 0:x", ErrorCode.BAD_ARGS, "offset must be an integer"),
    (b"CONS t s 1 max=0", ErrorCode.BAD_ARGS, "max must be"),
    (b"CONS t s 1 max=1 max=2", ErrorCode.BAD_ARGS, "given twice"),
    (b"CONS t s 1 limit=3", ErrorCode.BAD_ARGS, "unexpected argument 'limit=3'"),
    (b"CREATE t 0 1", ErrorCode.BAD_ARGS, "partitions must be"),
    (b"CREATE t 1 1 compact=maybe", ErrorCode.BAD_ARGS, "compact must be yes or no"),
    (b"CREATE t 1 1 retention_ms=-2", ErrorCode.BAD_ARGS, "retention_ms must be"),
    (b"CREATE t 1 1 retention_ms=1_000", ErrorCode.BAD_ARGS, "retention_ms must be"),
    (b"CREATE t 1 99999999999999999999", ErrorCode.BAD_ARGS, "replication_factor"),
    (b"CREATE t 1 1 fsync=sometimes", ErrorCode.BAD_ARGS, "fsync must be always|interval|never"),
    (b"ALTER t", ErrorCode.BAD_ARGS, "nothing to change"),
    (b"ALTER", ErrorCode.BAD_ARGS, "usage: ALTER"),
    (b"ALTER t partitions=0", ErrorCode.BAD_ARGS, "partitions must be"),
    (b"ALTER t partitions=x", ErrorCode.BAD_ARGS, "partitions must be"),
    (b"ALTER t retention_ms=-2", ErrorCode.BAD_ARGS, "retention_ms must be"),
    (b"ALTER t compact=maybe", ErrorCode.BAD_ARGS, "compact must be yes or no"),
    (b"ALTER t fsync=never", ErrorCode.BAD_ARGS, "unexpected argument 'fsync=never'"),
    (b"ALTER t replication_factor=5", ErrorCode.BAD_ARGS, "unexpected argument"),
    (b"ALTER t partitions=2 partitions=3", ErrorCode.BAD_ARGS, "given twice"),
    (b"ALTER __consumer_offsets partitions=99", ErrorCode.INVALID_TOPIC, "is internal"),
    (b"LIST all", ErrorCode.BAD_ARGS, "usage: LIST"),
    (b"DESCRIBE", ErrorCode.BAD_ARGS, "usage: DESCRIBE"),
    (b"PUB t", ErrorCode.BAD_ARGS, "missing message"),
    (b"PUB t key=k", ErrorCode.BAD_ARGS, "missing message"),
    (b"PUB t key=k --", ErrorCode.BAD_ARGS, "missing message"),
    (b"PUB t colour=red hi", ErrorCode.BAD_ARGS, "put -- before a message"),
    (b"PUB t acks=all hi", ErrorCode.BAD_ARGS, "acks must be quorum|leader"),
    (b"PUB t partition=1 pid=1 seq=2 hi", ErrorCode.BAD_ARGS, "go together"),
    (b"PUB t pid=1 epoch=0 seq=2 hi", ErrorCode.BAD_ARGS, "needs partition="),
    (b"PUB t partition=1 pid=1 epoch=40000 seq=2 hi", ErrorCode.BAD_ARGS, "epoch must be"),
    (b"FETCH t 0", ErrorCode.BAD_ARGS, "usage: FETCH"),
    (b"FETCH t 0 0 format=json", ErrorCode.BAD_ARGS, "format must be batch|text"),
    (b"FETCH t 0 0 max_bytes=0", ErrorCode.BAD_ARGS, "max_bytes must be"),
    (b"FETCH t 0 0 replica=leader", ErrorCode.BAD_ARGS, "replica must be any|local"),
    (b"COMMIT g t 0", ErrorCode.BAD_ARGS, "usage: COMMIT"),
    (b"OFFSETS g", ErrorCode.BAD_ARGS, "usage: OFFSETS"),
    (b"HELP NOPE", ErrorCode.BAD_ARGS, "no command 'NOPE'"),
    (b"PING pong", ErrorCode.BAD_ARGS, "usage: PING"),
    (b"QUIT now", ErrorCode.BAD_ARGS, "usage: QUIT"),
    (b"PUBB t 0", ErrorCode.BAD_ARGS, "usage: PUBB"),
    (b"PUBS bad/topic hi", ErrorCode.INVALID_TOPIC, "A-Z a-z 0-9 . _ -"),
    (b"PUBS .. hi", ErrorCode.INVALID_TOPIC, "cannot be '.' or '..'"),
    (b"PUBS " + b"t" * 250 + b" hi", ErrorCode.INVALID_TOPIC, "at most 249"),
    (b"PUBS caf\xc3\xa9 hi", ErrorCode.INVALID_TOPIC, "invalid topic name 'caf\\xc3\\xa9'"),
    (b"PUBS __consumer_offsets hi", ErrorCode.INVALID_TOPIC, "is internal"),
    (b"PUB __x hi", ErrorCode.INVALID_TOPIC, "is internal"),
    (b"CREATE __x 1 1", ErrorCode.INVALID_TOPIC, "is internal"),
    (b"DELETE __consumer_offsets", ErrorCode.INVALID_TOPIC, "is internal"),
    (b"METADATA ok b@d", ErrorCode.INVALID_TOPIC, "invalid topic name 'b@d'"),
]


@pytest.mark.parametrize(
    ("line", "code", "fragment"), BAD_LINES, ids=[b[0][:40].decode("latin-1") for b in BAD_LINES]
)
def test_bad_line_is_answered_and_the_next_line_still_parses(
    line: bytes, code: ErrorCode, fragment: str
) -> None:
    events = decode(line + b"\r\nPING\r\n")
    assert len(events) == 2, events
    error, after = events
    assert isinstance(error, BadCommand)
    assert error.code is code
    assert fragment in error.message
    assert not error.framing_error
    assert "\n" not in error.message and "\r" not in error.message
    assert error.reply().code is code
    assert after == Ping()


def test_error_messages_shorten_what_the_peer_sent() -> None:
    error = bad(b"X" * 1000 + b"\n")
    assert len(error.message) < 120
    assert error.message.endswith("...; try HELP")


# --- Payload framing ----------------------------------------------------------------------------


def test_rejected_pubb_still_skips_its_payload() -> None:
    # The payload holds what looks like commands: they must not be executed.
    payload = b"DELETE orders\r\n"
    data = b"PUBB __internal 0 %d\r\n%s\r\nPING\r\n" % (len(payload), payload)
    for events in (decode(data), decode_bytewise(data)):
        assert len(events) == 2
        error = events[0]
        assert isinstance(error, BadCommand) and error.code is ErrorCode.INVALID_TOPIC
        assert not error.framing_error
        assert events[1] == Ping()


def test_rejected_pub_with_byte_count_still_skips_its_payload() -> None:
    events = decode(b"PUB t colour=red bytes=4\r\nQUIT\r\nPING\r\n")
    assert [type(e) for e in events] == [BadCommand, Ping]
    assert decode(b"PUB t bytes=4 trailing\r\nQUIT\r\nPING\r\n")[1:] == [Ping()]


@pytest.mark.parametrize("line", [b"PUBB t 0 many", b"PUBB t 0 -3", b"PUB t bytes=lots"])
def test_unreadable_payload_length_is_a_framing_error(line: bytes) -> None:
    error = bad(line + b"\r\n")
    assert error.code is ErrorCode.BAD_ARGS
    assert error.framing_error


def test_payload_not_followed_by_crlf_is_a_framing_error_and_resyncs() -> None:
    # The client announced 3 bytes but sent 5: "de" and the rest of that line are dropped.
    data = b"PUBB t 0 3\r\nabcde junk\r\nPING\r\n"
    for events in (decode(data), decode_bytewise(data)):
        assert len(events) == 2, events
        error = events[0]
        assert isinstance(error, BadCommand) and error.framing_error
        assert "not followed by CRLF" in error.message
        assert events[1] == Ping()


def test_payload_cr_not_followed_by_lf_is_a_framing_error() -> None:
    event = decode(b"PUBB t 0 3\r\nabc\rX\nPING\n")
    assert isinstance(event[0], BadCommand) and event[0].framing_error
    assert event[1:] == [Ping()]


# --- Limits -------------------------------------------------------------------------------------

SMALL = LineLimits(max_line_length=64, max_payload=100)


def test_line_at_the_limit_passes_and_one_byte_more_is_too_large() -> None:
    at_limit = b"PUBS t " + b"x" * (64 - 7)
    assert decode(at_limit + b"\r\n", SMALL) == [Pubs("t", b"x" * 57)]
    assert decode_bytewise(at_limit + b"\r\n", SMALL) == [Pubs("t", b"x" * 57)]
    error = decode(at_limit + b"y\r\nPING\r\n", SMALL)
    assert isinstance(error[0], BadCommand) and error[0].code is ErrorCode.TOO_LARGE
    assert error[1:] == [Ping()]


def test_oversized_line_is_reported_early_and_never_buffered_whole() -> None:
    decoder = LineDecoder(SMALL)
    decoder.feed(b"PUBS t " + b"x" * 100)
    error = decoder.next_event()
    assert isinstance(error, BadCommand) and error.code is ErrorCode.TOO_LARGE
    assert "dropped up to its end" in error.message
    assert decoder.next_event() is NEED_DATA
    for _ in range(1000):  # 1 MB more of the same line: none of it is kept, not even once
        decoder.feed(b"x" * 1000)
        assert decoder.buffered_bytes == 0
        assert decoder.next_event() is NEED_DATA
        assert decoder.buffered_bytes == 0
    decoder.feed(b"xxx\r\nPING\r\n")
    assert list(decoder.events()) == [Ping()]


def test_oversized_payload_is_rejected_before_it_arrives_then_skipped() -> None:
    decoder = LineDecoder(SMALL)
    decoder.feed(b"PUBB t 0 1000000\r\n")
    error = decoder.next_event()
    assert isinstance(error, BadCommand) and error.code is ErrorCode.TOO_LARGE
    assert not error.framing_error
    assert "skipping" in error.message
    for _ in range(100):
        decoder.feed(b"PING\r\n" * 1666 + b"PING")  # 10000 bytes that look like commands
        assert decoder.buffered_bytes == 0  # dropped by feed itself, never copied
        assert decoder.next_event() is NEED_DATA
        assert decoder.buffered_bytes == 0
    decoder.feed(b"\r\nPING\r\n")
    assert list(decoder.events()) == [Ping()]


def test_skipped_payload_line_end_is_dropped_with_anything_before_it() -> None:
    # 120 bytes announced and sent, then "xyz" the sender added by mistake: the decoder drops it
    # with the line end instead of answering it as one more command (one reply per command).
    data = b"PUBB t 0 120\r\n" + b"b" * 120 + b"xyz\r\nPING\r\n"
    for events in (decode(data, SMALL), decode_bytewise(data, SMALL)):
        assert [type(e) for e in events] == [BadCommand, Ping]


def test_payload_at_the_limit_passes() -> None:
    batch = b"b" * 100
    assert decode(b"PUBB t 0 100\r\n" + batch + b"\r\n", SMALL) == [PublishBatch("t", 0, batch)]
    error = decode(b"PUBB t 0 101\r\n" + batch + b"b\r\nPING\n", SMALL)
    assert isinstance(error[0], BadCommand) and error[0].code is ErrorCode.TOO_LARGE
    assert error[1:] == [Ping()]


def test_limits_refuse_unusable_values() -> None:
    with pytest.raises(ValueError, match="unusable limits"):
        LineLimits(max_line_length=10)
    with pytest.raises(ValueError, match="unusable limits"):
        LineLimits(max_payload=-1)


def test_buffer_is_compacted_as_lines_are_consumed() -> None:
    decoder = LineDecoder()
    for _ in range(1000):
        decoder.feed(b"PUBS t hello\r\nPUBS t hel")
        decoder.feed(b"lo\r\n")
        assert list(decoder.events()) == [Pubs("t", b"hello")] * 2
        assert decoder.buffered_bytes == 0


# --- Streams: halves, pipelining, line endings, telnet ------------------------------------------


def test_half_line_needs_data_until_its_newline() -> None:
    decoder = LineDecoder()
    assert decoder.next_event() is NEED_DATA
    decoder.feed(b"PUBS orders half")
    assert decoder.next_event() is NEED_DATA
    assert decoder.buffered_bytes == len(b"PUBS orders half")
    decoder.feed(b" a line\r")
    assert decoder.next_event() is NEED_DATA
    decoder.feed(b"\n")
    assert decoder.next_event() == Pubs("orders", b"half a line")
    assert decoder.next_event() is NEED_DATA


def test_half_payload_needs_data_until_its_crlf() -> None:
    decoder = LineDecoder()
    decoder.feed(b"PUBB t 0 4\r\nab")
    assert decoder.next_event() is NEED_DATA
    decoder.feed(b"cd")
    assert decoder.next_event() is NEED_DATA
    decoder.feed(b"\r")
    assert decoder.next_event() is NEED_DATA
    decoder.feed(b"\n")
    assert decoder.next_event() == PublishBatch("t", 0, b"abcd")


def test_pipelined_commands_come_out_in_order() -> None:
    commands: list[Command] = [Pubs("t", b"m%d" % i) for i in range(50)]
    commands += [PublishBatch("t", 0, b"x\r\n" * 3), Subs("t", "g"), Cons("t", "s", 0), Quit()]
    data = b"".join(encode_command(c) for c in commands)
    assert decode(data) == commands
    assert decode_bytewise(data) == commands


def test_crlf_lf_mix_stray_cr_empty_lines_and_spaces() -> None:
    data = b"\r\n\n   \r\n\t\nPING\n  PING  \r\nPING\r\r\nPUBS t  spaced out  \r\nLIST   \n"
    assert decode(data) == [Ping(), Ping(), Ping(), Pubs("t", b"spaced out  "), ListTopics()]


def test_telnet_negotiation_is_stripped() -> None:
    # Ctrl-C in telnet: IAC IP, IAC DO TIMING-MARK; a subnegotiation; IAC NOP mid-word. The
    # first turns telnet mode on (its line is refused, saying so); the others are dropped.
    data = b"\xff\xf4\xff\xfd\x06PING\r\n\xff\xfa\x18\x00xterm\xff\xf0PING\r\nPI\xff\xf1NG\r\n"
    first, *rest = decode(data)
    assert isinstance(first, BadCommand) and "telnet command" in first.message
    assert rest == [Ping(), Ping()]


def test_a_raw_client_never_loses_a_telnet_command_byte_silently() -> None:
    # Issue 37: 0xFF 0xF1 on a connection that never spoke telnet was dropped with +OK.
    first = bad(b"PUBS t a\xff\xf1b\r\n")
    assert first.code is ErrorCode.BAD_ARGS
    assert "0xFF 0xF1 at column 9 are a telnet command" in first.message
    assert "from now on" in first.message
    assert decode(b"PUBS t a\xff\xffb\r\n") == [Pubs("t", b"a\xffb")]  # IAC IAC: no mode


def test_telnet_escaped_iac_is_a_data_byte() -> None:
    assert one(b"PUBS t a\xff\xffb\r\n") == Pubs("t", b"a\xffb")
    assert one(encode_command(Pubs("t", b"\xff\xff!"))) == Pubs("t", b"\xff\xff!")
    # Inside a subnegotiation, IAC IAC is data of the subnegotiation: dropped with it.
    assert telnet_one_line(b"PUBS t a\xff\xfa\x18\xff\xffx\xff\xf0b\r\n") == Pubs("t", b"ab")


def telnet_one_line(line: bytes) -> LineEvent:
    """The one event of ``line`` on a connection in telnet mode (turned on by an IAC NOP)."""
    events = decode(b"\xff\xf1\r\n" + line)
    assert len(events) == 2 and isinstance(events[0], BadCommand), events
    return events[1]


@pytest.mark.parametrize(
    "command",
    [
        b"\xff\xf1",
        b"\xff\xf9",
        b"\xff\xf0",
        b"\xff\xfb\x01",
        b"\xff\xfe\xff",
        b"\xff\xfa\x1f\xff\xf0",
    ],
    ids=["NOP", "GA", "SE", "WILL ECHO", "DONT 255", "SB ... SE"],
)
def test_each_kind_of_telnet_command_is_dropped_whole(command: bytes) -> None:
    # RFC 854: 2-byte commands, 3-byte negotiations and subnegotiations; nothing else goes.
    assert telnet_one_line(b"PUBS t a" + command + b"b\r\n") == Pubs("t", b"ab")


@pytest.mark.parametrize(
    ("line", "what"),
    [
        (b"PUBS or\xffders x", "at column 8 is followed by 0x64, which is no telnet command"),
        (b"PUBS t a\xffb", "at column 9 is followed by 0x62"),
        (b"PUBS t ab\xff", "ends the line"),
        (b"PUBS t ab\xff\r", "is followed by 0x0D"),
        (b"PUBS t ab\xff\xfb", "no option byte"),
        (b"PUBS t a\xff\xfa\x18xterm", "subnegotiation (SB) with no IAC SE"),
        (b"PI\xff\x00NG", "is followed by 0x00"),
    ],
)
def test_a_lone_iac_refuses_the_line_instead_of_altering_it(line: bytes, what: str) -> None:
    # 0xFF followed by a byte that is no telnet command is not telnet: neither the IAC nor
    # its neighbour is dropped (which turned "or\xffders" into the topic "orers").
    event = bad(line + b"\n")
    assert event.code is ErrorCode.BAD_ARGS and not event.framing_error
    assert what in event.message and "IAC IAC" in event.message
    # The next line is read as usual.
    assert decode(line + b"\nPING\r\n")[1:] == [Ping()]


def test_a_refused_telnet_line_that_announces_a_payload_skips_it() -> None:
    # The payload must not be read as command lines, even though its line was refused.
    events = decode(b"PUB t key=a\xffb bytes=6\r\nPING\r\n\r\nPING\r\n")
    assert len(events) == 2
    assert isinstance(events[0], BadCommand) and "telnet IAC" in events[0].message
    assert events[1] == Ping()


def test_a_topic_name_with_an_escaped_iac_is_an_invalid_name() -> None:
    event = bad(b"PUBS or\xff\xffders x\r\n")
    assert event.code is ErrorCode.INVALID_TOPIC and "invalid topic name" in event.message


def test_line_of_only_telnet_negotiation_is_ignored() -> None:
    # Once in telnet mode (the first one is refused, saying so).
    events = decode(b"\xff\xfb\x01\r\n\xff\xfb\x01\r\nPING\r\n")
    assert isinstance(events[0], BadCommand) and events[1:] == [Ping()]


def test_non_utf8_message_is_kept_as_bytes() -> None:
    message = b"caf\xe9 \x80\x81 \xc3\x28"
    assert one(b"PUBS t " + message + b"\r\n") == Pubs("t", message)
    seed = parse_seed_message(message)
    assert (seed.key, seed.value) == (None, message)


def test_feed_accepts_bytes_like_and_refuses_the_rest() -> None:
    decoder = LineDecoder()
    decoder.feed(bytearray(b"PI"))
    decoder.feed(memoryview(b"NG\r\n"))
    decoder.feed(b"")
    assert list(decoder.events()) == [Ping()]
    with pytest.raises(LocalProtocolError, match="takes bytes, not str"):
        decoder.feed("PING\r\n")  # type: ignore[arg-type]


def test_topic_cache_stays_bounded_and_correct() -> None:
    decoder = LineDecoder()
    decoder.feed(b"".join(b"PUBS t%d x\r\n" % i for i in range(10_000)))
    events = list(decoder.events())
    assert events == [Pubs(f"t{i}", b"x") for i in range(10_000)]
    decoder.feed(b"PUBS __consumer_offsets x\r\nDESCRIBE __consumer_offsets\r\n")
    first, second = decoder.events()
    assert isinstance(first, BadCommand) and first.code is ErrorCode.INVALID_TOPIC
    assert second == DescribeTopic("__consumer_offsets")
    decoder.feed(b"PUBS __consumer_offsets x\r\n")  # now cached as valid: still not writable
    assert isinstance(decoder.next_event(), BadCommand)


# --- encode_command -----------------------------------------------------------------------------

ENCODINGS: list[tuple[Command, bytes]] = [
    (Pubs("orders", SEED_JSON), b"PUBS orders " + SEED_JSON + b"\r\n"),
    (Subs("t", "g", 2), b"SUBS t g 2\r\n"),
    (Subs("t", "g", None, 500), b"SUBS t g session_timeout_ms=500\r\n"),
    (Cons("t", "s", ((1, 5), (0, 2)), max_messages=3), b"CONS t s 1:5,0:2 max=3\r\n"),
    (PublishRecord("t", b"hi there", key=b"k 1"), b"PUB t key=k%201 hi there\r\n"),
    (PublishRecord("t", b"a=b"), b"PUB t -- a=b\r\n"),
    (PublishRecord("t", b"--"), b"PUB t -- --\r\n"),
    (PublishRecord("t", b" lead"), b"PUB t bytes=5\r\n lead\r\n"),
    (PublishRecord("t", b"a\nb", acks=Acks.LEADER), b"PUB t acks=leader bytes=3\r\na\nb\r\n"),
    (
        PublishRecord("t", b"x", partition=0, idempotence=Idempotence(1, 2, 3)),
        b"PUB t partition=0 pid=1 epoch=2 seq=3 x\r\n",
    ),
    (PublishBatch("t", 1, b"\r\n"), b"PUBB t 1 2\r\n\r\n\r\n"),
    (CreateTopic("t", 3, 1, compact=True), b"CREATE t 3 1 compact=yes\r\n"),
    (CreateTopic("t", 3, 1, fsync=Fsync.ALWAYS), b"CREATE t 3 1 fsync=always\r\n"),
    (AlterTopic("t", compact=False), b"ALTER t compact=no\r\n"),
    (
        AlterTopic("t", 4, -1, 100, True),
        b"ALTER t partitions=4 retention_ms=-1 retention_bytes=100 compact=yes\r\n",
    ),
    (Fetch("t", 0, 9, format=FetchFormat.TEXT), b"FETCH t 0 9 format=text\r\n"),
    (Fetch("t", 0, 9, replica=FetchReplica.LOCAL), b"FETCH t 0 9 replica=local\r\n"),
    (Metadata(("a", "b")), b"METADATA a b\r\n"),
    (Help("PUB"), b"HELP PUB\r\n"),
]


@pytest.mark.parametrize(
    ("command", "expected"), ENCODINGS, ids=[repr(e[0])[:50] for e in ENCODINGS]
)
def test_encode_command_is_canonical(command: Command, expected: bytes) -> None:
    assert encode_command(command) == expected
    assert one(expected) == command


UNENCODABLE: list[Command] = [
    Pubs("t", b""),
    Pubs("t", b"a\nb"),
    Pubs("t", b" lead"),
    Pubs("t", b"cr\r"),
    Pubs("t", "text"),  # type: ignore[arg-type]
    Pubs("bad topic", b"x"),
    Pubs("__internal", b"x"),
    Subs("t", "two words"),
    Subs("t", "g", 0),
    Cons("t", "s", -1),
    Cons("t", "s", ()),
    Cons("t", "s", ((0, 1), (0, 2))),
    Cons("t", "s", True),
    CreateTopic("t", 1, 0),
    CreateTopic("t", 1, 1, compact=1),  # type: ignore[arg-type]
    CreateTopic("t", 1, 1, retention_ms=-2),
    CreateTopic("t", 1, 1, fsync="always"),  # type: ignore[arg-type]
    AlterTopic("t"),
    AlterTopic("t", partitions=0),
    AlterTopic("t", compact=1),  # type: ignore[arg-type]
    AlterTopic("__x", partitions=2),
    PublishRecord("t", b"x", idempotence=Idempotence(1, 1, 1)),
    PublishRecord("t", b"x", key="k"),  # type: ignore[arg-type]
    PublishRecord("t", b"x", acks="quorum"),  # type: ignore[arg-type]
    PublishRecord("t", b"x", partition=2**31),
    PublishBatch("t", 0, bytearray(b"x")),  # type: ignore[arg-type]
    Fetch("t", 0, 0, max_bytes=0),
    Fetch("t", 0, 0, format="text"),  # type: ignore[arg-type]
    Fetch("t", 0, 0, replica="local"),  # type: ignore[arg-type]
    Commit("g", "t", 0, 2**63),
    Metadata(["a"]),  # type: ignore[arg-type]
    Help("pubs"),
    DeleteTopic("."),
]


@pytest.mark.parametrize("command", UNENCODABLE, ids=[repr(c)[:60] for c in UNENCODABLE])
def test_encode_command_refuses_what_could_not_round_trip(command: Command) -> None:
    with pytest.raises(LocalProtocolError, match="cannot encode"):
        encode_command(command)


def test_encode_command_refuses_non_commands() -> None:
    with pytest.raises(LocalProtocolError, match="not a command"):
        encode_command(b"PING")  # type: ignore[arg-type]


# --- HELP ---------------------------------------------------------------------------------------


def test_help_lists_every_command_and_explains_one() -> None:
    summary = help_replies()
    assert summary[-1] == EndReply()
    rows = summary[:-1]
    assert all(isinstance(row, InfoRow) for row in rows)
    texts = [row.text for row in rows if isinstance(row, InfoRow)]
    for word in COMMAND_WORDS:
        assert any(text.startswith(word + " ") or text == word for text in texts), word
    pubs = help_replies("PUBS")
    assert pubs[0] == InfoRow("PUBS <topic> <message>")
    assert pubs[-1] == EndReply()
    with pytest.raises(LocalProtocolError):
        help_replies("NOPE")


def test_nvt_cr_nul_is_a_carriage_return() -> None:
    # What a piped telnet sends for "PUBS t x\r\n" and "PING\r\n" (RFC 854: CR NUL, CR LF).
    assert decode(b"PUBS t x\r\x00\r\nPING\r\x00\r\n") == [Pubs("t", b"x"), Ping()]
    assert one(b"PUBS t a\r\x00b\r\n") == Pubs("t", b"a\rb")  # a CR inside stays a CR


def test_exit_ends_the_session_as_quit_does() -> None:
    assert decode(b"exit\r\nQUIT\r\nExit\n") == [Quit(), Quit(), Quit()]
