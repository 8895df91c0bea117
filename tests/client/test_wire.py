"""``ConnectionCore``: replies matched to requests by order, list replies gathered, bad shapes."""

from __future__ import annotations

import pytest

from kafkaesque.client import ConnectionCore, ListResponse
from kafkaesque.client._wire import expect_ok, shown
from kafkaesque.protocol import (
    BrokerRow,
    DataReply,
    DescribeTopic,
    EndReply,
    ErrorCode,
    ErrorReply,
    Fetch,
    FetchFormat,
    ListTopics,
    Metadata,
    OkReply,
    PartitionRow,
    Ping,
    RemoteProtocolError,
    Reply,
    TopicRow,
    encode_reply,
)


def server_bytes(*replies: Reply) -> bytes:
    return b"".join(encode_reply(r) for r in replies)


def test_pipelined_replies_come_back_with_their_tokens_in_order() -> None:
    core: ConnectionCore[str] = ConnectionCore()
    assert core.send(Ping(), "a") == b"PING\r\n"
    core.send(Metadata(), "b")
    core.send(Fetch("t", 0, 5), "c")
    assert core.in_flight == 3
    wire = server_bytes(
        OkReply("PONG"),
        BrokerRow(0, "127.0.0.1", 9092),
        PartitionRow("t", 0, 0, (0,)),
        EndReply(),
        DataReply(7, b"xyz", 9),
    )
    done = []
    for i in range(len(wire)):  # one byte at a time: framing never depends on chunking
        done += core.receive_data(wire[i : i + 1])
    assert [token for token, _ in done] == ["a", "b", "c"]
    assert done[0][1] == OkReply("PONG")
    assert done[1][1] == ListResponse(
        (BrokerRow(0, "127.0.0.1", 9092), PartitionRow("t", 0, 0, (0,))), EndReply()
    )
    assert done[2][1] == DataReply(7, b"xyz", 9)
    assert core.in_flight == 0


def test_an_error_replaces_a_whole_list() -> None:
    core: ConnectionCore[int] = ConnectionCore()
    core.send(DescribeTopic("t"), 1)
    core.send(ListTopics(), 2)
    wire = server_bytes(
        ErrorReply(ErrorCode.UNKNOWN_TOPIC, "no topic 't'"), TopicRow("a", 1, 1), EndReply()
    )
    (first, second) = core.receive_data(wire)
    assert first == (1, ErrorReply(ErrorCode.UNKNOWN_TOPIC, "no topic 't'"))
    assert second == (2, ListResponse((TopicRow("a", 1, 1),), EndReply()))


def test_fetch_format_text_is_a_list() -> None:
    core: ConnectionCore[int] = ConnectionCore()
    core.send(Fetch("t", 0, 0, format=FetchFormat.TEXT), 1)
    assert core.receive_data(server_bytes(EndReply(((0, 3),)))) == [
        (1, ListResponse((), EndReply(((0, 3),))))
    ]


@pytest.mark.parametrize(
    ("command", "replies"),
    [
        (Ping(), (TopicRow("a", 1, 1),)),  # a row to a one-line command
        (ListTopics(), (OkReply(),)),  # one line to a list command
        (ListTopics(), (TopicRow("a", 1, 1), ErrorReply(ErrorCode.INTERNAL))),  # -ERR mid-list
        (None, (OkReply(),)),  # a reply nobody asked for
    ],
)
def test_replies_out_of_shape_break_the_connection(
    command: Ping | ListTopics | None, replies: tuple[Reply, ...]
) -> None:
    core: ConnectionCore[int] = ConnectionCore()
    if command is not None:
        core.send(command, 1)
    with pytest.raises(RemoteProtocolError):
        core.receive_data(server_bytes(*replies))
    with pytest.raises(RemoteProtocolError):  # and for good
        core.send(Ping(), 2)


def test_a_reply_out_of_shape_is_quoted_as_the_broker_sent_it() -> None:
    core: ConnectionCore[int] = ConnectionCore()
    core.send(ListTopics(), 1)
    with pytest.raises(RemoteProtocolError) as info:
        core.receive_data(server_bytes(OkReply("0 1")))
    assert str(info.value) == "expected rows and +END, got +OK 0 1"
    with pytest.raises(RemoteProtocolError) as info:
        expect_ok(ListResponse((TopicRow("t", 3, 3),), EndReply()))
    assert str(info.value).startswith("expected +OK, got +TOPIC t 3 3")
    assert str(info.value).endswith(" | +END")
    assert "TopicRow(" not in str(info.value)


def test_shown_cuts_long_answers() -> None:
    rows = tuple(PartitionRow("topic", p, 0, (0, 1, 2)) for p in range(50))
    text = shown(ListResponse(rows, EndReply()), limit=60)
    assert len(text) == 60 and text.endswith("...") and text.startswith("+PARTITION topic 0 ")
    assert shown(()) == "nothing"
