"""encode_reply and ReplyDecoder: every reply's bytes, list replies, +DATA, malformed servers."""

from __future__ import annotations

import pytest

from kafkaesque.protocol import (
    NEED_DATA,
    BrokerRow,
    DataReply,
    EndReply,
    ErrorCode,
    ErrorReply,
    Fsync,
    InfoRow,
    LineLimits,
    LocalProtocolError,
    MessageRow,
    OffsetRow,
    OkReply,
    PartitionRow,
    RemoteProtocolError,
    Reply,
    ReplyDecoder,
    TopicRow,
    encode_reply,
    escape_key,
    escape_value,
    parse_published_reply,
    published_reply,
    unescape,
)


def decode(data: bytes, limits: LineLimits | None = None) -> list[Reply]:
    decoder = ReplyDecoder(limits) if limits else ReplyDecoder()
    decoder.feed(data)
    return list(decoder.events())


ENCODINGS: list[tuple[Reply, bytes]] = [
    (OkReply(), b"+OK\r\n"),
    (OkReply("sub-7"), b"+OK sub-7\r\n"),
    (published_reply(2, 15), b"+OK 2 15\r\n"),
    (ErrorReply(ErrorCode.NOT_LEADER, "leader is 3"), b"-ERR NOT_LEADER leader is 3\r\n"),
    (ErrorReply(ErrorCode.TIMEOUT), b"-ERR TIMEOUT\r\n"),
    (DataReply(16, b"ab\r\ncd"), b"+DATA 16 6\r\nab\r\ncd\r\n"),
    (DataReply(16, b"", 20), b"+DATA 16 0 hw=20\r\n\r\n"),
    (MessageRow(0, 15, b"124", b"Hello World!"), b"+MSG 0 15 124 Hello World!\r\n"),
    (MessageRow(1, 3, None, b"100% sure"), b"+MSG 1 3 - 100% sure\r\n"),
    (MessageRow(1, 4, b"-", b"%41\r\n"), b"+MSG 1 4 %2D %2541%0D%0A\r\n"),
    (MessageRow(1, 5, b"", b""), b"+MSG 1 5  \r\n"),
    (MessageRow(1, 6, b"k", None), b"+MSG 1 6 k\r\n"),
    (MessageRow(1, 7, b"a b", b"\tcaf\xc3\xa9 \xff"), b"+MSG 1 7 a%20b \tcaf\xc3\xa9 %FF\r\n"),
    (EndReply(), b"+END\r\n"),
    (EndReply(((0, 16), (1, 4))), b"+END 0:16,1:4\r\n"),
    (TopicRow("orders", 3, 2), b"+TOPIC orders 3 2\r\n"),
    (TopicRow("orders", 3, 2, fsync=Fsync.INTERVAL), b"+TOPIC orders 3 2 fsync=interval\r\n"),
    (
        TopicRow("__consumer_offsets", 16, 3, 1000, -1, True),
        b"+TOPIC __consumer_offsets 16 3 retention_ms=1000 retention_bytes=-1 compact=yes\r\n",
    ),
    (PartitionRow("orders", 0, 1, (1, 2, 3)), b"+PARTITION orders 0 leader=1 replicas=1,2,3\r\n"),
    (
        PartitionRow("orders", 1, None, (2,), 0, 99),
        b"+PARTITION orders 1 leader=- replicas=2 start=0 end=99\r\n",
    ),
    (BrokerRow(1, "10.0.0.1", 9092), b"+BROKER 1 10.0.0.1 9092\r\n"),
    (
        BrokerRow(1, "10.0.0.1", 9092, 1883, 8883),
        b"+BROKER 1 10.0.0.1 9092 mqtt=1883 mqtt_tls=8883\r\n",
    ),
    (BrokerRow(2, "h", 9092, mqtt_tls_port=8883), b"+BROKER 2 h 9092 mqtt_tls=8883\r\n"),
    (BrokerRow(3, "h", 9092, 1883, None, 8080), b"+BROKER 3 h 9092 mqtt=1883 mqtt_ws=8080\r\n"),
    (
        BrokerRow(4, "h", 9092, kafka_port=9093, http_port=9292),
        b"+BROKER 4 h 9092 kafka=9093 http=9292\r\n",
    ),
    (OffsetRow("orders", 0, 15), b"+OFFSET orders 0 15\r\n"),
    (OffsetRow("orders", 1, None), b"+OFFSET orders 1 -\r\n"),
    (InfoRow("PING"), b"+INFO PING\r\n"),
    (InfoRow(""), b"+INFO\r\n"),
]


@pytest.mark.parametrize(("reply", "expected"), ENCODINGS, ids=[repr(e[0])[:60] for e in ENCODINGS])
def test_reply_bytes_and_back(reply: Reply, expected: bytes) -> None:
    assert encode_reply(reply) == expected
    assert decode(expected) == [reply]
    assert decode(expected.replace(b"\r\n", b"\n", 1)) == [reply]  # LF-only servers/tests


def test_list_reply_rows_end_with_end() -> None:
    rows: list[Reply] = [MessageRow(0, i, None, b"m%d" % i) for i in range(5)]
    rows.append(EndReply(((0, 5),)))
    data = b"".join(encode_reply(r) for r in rows)
    decoder = ReplyDecoder()
    out: list[Reply] = []
    for i in range(len(data)):
        decoder.feed(data[i : i + 1])
        out.extend(decoder.events())
    assert out == rows


def test_data_reply_waits_for_its_whole_payload() -> None:
    decoder = ReplyDecoder()
    decoder.feed(b"+DATA 9 4\r\nab")
    assert decoder.next_event() is NEED_DATA
    decoder.feed(b"cd\r")
    assert decoder.next_event() is NEED_DATA
    decoder.feed(b"\n+OK\r\n")
    assert list(decoder.events()) == [DataReply(9, b"abcd"), OkReply()]
    assert decoder.buffered_bytes == 0


def test_unknown_error_code_from_a_newer_server_is_kept_as_internal() -> None:
    assert decode(b"-ERR QUOTA_EXCEEDED slow down\r\n") == [
        ErrorReply(ErrorCode.INTERNAL, "QUOTA_EXCEEDED slow down")
    ]


def test_a_broker_row_field_from_a_newer_broker_is_skipped() -> None:
    decoder = ReplyDecoder()
    decoder.feed(b"+BROKER 1 h 9092 amqp=5672 mqtt=1883\r\n")
    assert decoder.next_event() == BrokerRow(1, "h", 9092, mqtt_port=1883)


def test_human_text_with_invalid_utf8_is_shown_not_fatal() -> None:
    assert decode(b"+OK caf\xe9\r\n") == [OkReply("caf\ufffd")]


MALFORMED = [
    b"+WHAT is this",
    b"OK",
    b"-ERR",
    b"+DATA 1",
    b"+DATA x 1",
    b"+DATA 1 1 lw=3",
    b"+MSG 0 1",
    b"+MSG 0 -1 k v",
    b"+TOPIC t 0 1",
    b"+TOPIC t 1 1 compact=maybe",
    b"+TOPIC t 1 1 fsync=sometimes",
    b"+TOPIC t 1 1 colour=red",
    b"+TOPIC b@d 1 1",
    b"+PARTITION t 0 leader=1",
    b"+PARTITION t 0 leader=x replicas=1",
    b"+PARTITION t 0 leader=1 replicas=1 replicas=2",
    b"+BROKER 1 host",
    b"+BROKER 1 host 70000",
    b"+BROKER 1 host 9092 mqtt=x",
    b"+BROKER 1 host 9092 mqtt=70000",
    b"+BROKER 1 host 9092 mqtt_ws=-1",
    b"+BROKER 1 host 9092 amqp",
    b"+BROKER 1 host 9092 mqtt=1883 mqtt=1884",
    b"+BROKER 1 host 9092 http=-1",
    b"+OFFSET t 0",
    b"+END 0:1,0:2",
    b"+END 0-1",
    b"+END x",
]


@pytest.mark.parametrize("line", MALFORMED, ids=[m.decode() for m in MALFORMED])
def test_malformed_reply_breaks_the_stream_for_good(line: bytes) -> None:
    decoder = ReplyDecoder()
    decoder.feed(b"+OK\r\n" + line + b"\r\n+OK\r\n")
    assert decoder.next_event() == OkReply()
    with pytest.raises(RemoteProtocolError, match="malformed reply"):
        decoder.next_event()
    with pytest.raises(RemoteProtocolError, match="broke earlier"):
        decoder.next_event()
    decoder.feed(b"+OK\r\n")
    with pytest.raises(RemoteProtocolError):
        decoder.next_event()


def test_data_payload_not_followed_by_crlf_breaks_the_stream() -> None:
    with pytest.raises(RemoteProtocolError, match="not followed by CRLF"):
        decode(b"+DATA 1 2\r\nabc\r\n")


def test_reply_limits() -> None:
    limits = LineLimits(max_line_length=64, max_payload=10)
    assert decode(b"+OK " + b"x" * 60 + b"\r\n", limits) == [OkReply("x" * 60)]
    with pytest.raises(RemoteProtocolError, match="longer than 64"):
        decode(b"+OK " + b"x" * 61 + b"\r\n", limits)
    with pytest.raises(RemoteProtocolError, match="longer than 64"):
        decode(b"+OK " + b"x" * 100, limits)  # no newline yet, already too long
    with pytest.raises(RemoteProtocolError, match="payload larger than 10"):
        decode(b"+DATA 0 11\r\n", limits)


def test_reply_decoder_feed_type_checked() -> None:
    with pytest.raises(LocalProtocolError):
        ReplyDecoder().feed("+OK\r\n")  # type: ignore[arg-type]


def test_published_reply_round_trip_and_rejection() -> None:
    assert parse_published_reply(published_reply(3, 2**40)) == (3, 2**40)
    for text in ("", "3", "3 x", "3 4 5", "-1 4"):
        with pytest.raises(RemoteProtocolError):
            parse_published_reply(OkReply(text))


UNENCODABLE: list[Reply] = [
    OkReply("two\nlines"),
    OkReply("cr\r"),
    OkReply("\ud800"),
    ErrorReply("TIMEOUT", "x"),  # type: ignore[arg-type]
    ErrorReply(ErrorCode.TIMEOUT, "a\r\nb"),
    DataReply(-1, b""),
    DataReply(0, "text"),  # type: ignore[arg-type]
    MessageRow(0, 0, "k", b"v"),  # type: ignore[arg-type]
    EndReply(((0, 1), (0, 2))),
    TopicRow("t", 0, 1),
    TopicRow("t", 1, 1, compact=None),  # type: ignore[arg-type]
    TopicRow("t", 1, 1, fsync="never"),  # type: ignore[arg-type]
    PartitionRow("t", 0, 1, ()),
    PartitionRow("t", 0, -1, (1,)),
    BrokerRow(1, "two words", 1),
    BrokerRow(1, "h", 65536),
    BrokerRow(1, "h", 1, mqtt_port=-1),
    OffsetRow("t", 0, -5),
    InfoRow(None),  # type: ignore[arg-type]
]


@pytest.mark.parametrize("reply", UNENCODABLE, ids=[repr(r)[:60] for r in UNENCODABLE])
def test_encode_reply_refuses_what_could_not_round_trip(reply: Reply) -> None:
    with pytest.raises(LocalProtocolError, match="cannot encode"):
        encode_reply(reply)


def test_encode_reply_refuses_non_replies() -> None:
    with pytest.raises(LocalProtocolError, match="not a reply"):
        encode_reply("+OK")  # type: ignore[arg-type]


def test_escaping_leaves_ordinary_text_alone() -> None:
    for text in (b"Hello World!", b"100%", b"50% off", b"caf\xc3\xa9", b"tab\there", b"%zz"):
        assert escape_value(text) == text
    assert escape_key(b"user-1") == b"user-1"
    assert escape_key(b"a b") == b"a%20b"
    assert escape_value(b"%4A") == b"%254A"
    assert unescape(b"%254A") == b"%4A"
    assert unescape(b"%%41%4") == b"%A%4"
