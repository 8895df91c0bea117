"""Group admin on the line protocol (issue 26): ``GROUPS`` with 0, 1 or 2 arguments,
``RESETOFFSETS``, ``DELGROUP``, their rows, their refusals of bad input, and the client call
that reads a ``GROUPS <group>`` answer."""

from __future__ import annotations

from typing import Any

import pytest

from kafkaesque.client import GroupDescription, ListResponse
from kafkaesque.client import _calls as calls
from kafkaesque.protocol import (
    BadCommand,
    DeleteGroup,
    DescribeGroup,
    EndReply,
    ErrorCode,
    GroupRow,
    GroupStateRow,
    InfoRow,
    LineDecoder,
    ListGroups,
    LocalProtocolError,
    MemberRow,
    OffsetRow,
    RemoteProtocolError,
    ReplyDecoder,
    ResetKind,
    ResetOffsets,
    encode_command,
    help_replies,
)


def _decode_line(line: bytes) -> Any:
    decoder = LineDecoder()
    decoder.feed(line)
    events = list(decoder.events())
    assert len(events) == 1, events
    return events[0]


@pytest.mark.parametrize(
    ("line", "command"),
    [
        (b"GROUPS", ListGroups()),
        (b"GROUPS crew", DescribeGroup("crew")),
        (b"GROUPS crew orders", DescribeGroup("crew", "orders")),
        (b"RESETOFFSETS crew orders earliest", ResetOffsets("crew", "orders", ResetKind.EARLIEST)),
        (b"RESETOFFSETS crew orders LATEST", ResetOffsets("crew", "orders", ResetKind.LATEST)),
        (
            b"RESETOFFSETS crew orders offset=42",
            ResetOffsets("crew", "orders", ResetKind.OFFSET, 42),
        ),
        (
            b"RESETOFFSETS crew orders time=1700000000000",
            ResetOffsets("crew", "orders", ResetKind.TIME, 1700000000000),
        ),
        (
            b"RESETOFFSETS crew orders latest dry_run=yes",
            ResetOffsets("crew", "orders", ResetKind.LATEST, None, True),
        ),
        (
            b"RESETOFFSETS crew orders offset=7 dry_run=yes",
            ResetOffsets("crew", "orders", ResetKind.OFFSET, 7, True),
        ),
        (b"DELGROUP crew", DeleteGroup("crew")),
    ],
)
def test_group_admin_lines_decode_and_encode_back(line: bytes, command: object) -> None:
    assert _decode_line(line + b"\r\n") == command
    assert encode_command(command) == line.replace(b"LATEST", b"latest") + b"\r\n"  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("line", "says"),
    [
        (b"GROUPS a b c", "usage: GROUPS [<group> [<topic>]]"),
        (b"RESETOFFSETS crew orders", "usage: RESETOFFSETS"),
        (b"RESETOFFSETS crew orders soon", "earliest, latest, offset=<n> or time=<ms>, not 'soon'"),
        (b"RESETOFFSETS crew orders earliest=1", "not 'earliest=1'"),
        (b"RESETOFFSETS crew orders offset=", "offset must be an integer"),
        (b"RESETOFFSETS crew orders offset=-1", "offset must be an integer"),
        (b"RESETOFFSETS crew orders time=noon", "time must be an integer"),
        (b"RESETOFFSETS crew bad/topic latest", "topic"),
        (b"RESETOFFSETS crew orders latest dry_run=maybe", "dry_run must be yes or no"),
        (b"RESETOFFSETS crew orders latest execute=yes", "unexpected argument 'execute=yes'"),
        (b"RESETOFFSETS crew orders latest dry_run=yes x", "usage: RESETOFFSETS"),
        (b"DELGROUP", "usage: DELGROUP <group>"),
        (b"DELGROUP a b", "usage: DELGROUP <group>"),
    ],
)
def test_bad_group_admin_lines_are_refused_with_the_usage(line: bytes, says: str) -> None:
    event = _decode_line(line + b"\r\n")
    assert isinstance(event, BadCommand)
    assert event.code in (ErrorCode.BAD_ARGS, ErrorCode.INVALID_TOPIC)
    assert says in event.message


def test_a_reset_that_mixes_kind_and_value_cannot_be_encoded() -> None:
    with pytest.raises(LocalProtocolError):
        encode_command(ResetOffsets("g", "t", ResetKind.EARLIEST, 3))
    with pytest.raises(LocalProtocolError):
        encode_command(ResetOffsets("g", "t", ResetKind.OFFSET))
    with pytest.raises(LocalProtocolError):
        encode_command(ListGroups(3))  # a coordinator's share of GROUPS: never on a line
    with pytest.raises(ValueError, match="takes a value"):
        calls.reset_offsets("g", "t", "time")
    with pytest.raises(ValueError, match="takes no value"):
        calls.reset_offsets("g", "t", "latest", 5)
    with pytest.raises(ValueError):
        calls.reset_offsets("g", "t", "yesterday")


def test_help_names_the_group_admin_commands() -> None:
    words = " ".join(r.text for r in help_replies(None) if isinstance(r, InfoRow))
    for word in ("GROUPS [<group> [<topic>]]", "RESETOFFSETS", "DELGROUP <group>"):
        assert word in words


@pytest.mark.parametrize(
    "line",
    [
        b"+GROUPSTATE crew orders Stable",  # a field short
        b"+GROUPSTATE crew orders Stable -1",
        b"+MEMBER crew orders 0.ab",
        b"+MEMBER crew orders 0.ab 1,x",
    ],
)
def test_malformed_group_rows_break_the_reply_stream(line: bytes) -> None:
    decoder = ReplyDecoder()
    decoder.feed(line + b"\r\n")
    with pytest.raises(RemoteProtocolError):
        decoder.next_event()


def test_a_groups_answer_is_cut_into_one_description_per_topic() -> None:
    a, b = GroupStateRow("crew", "a", "Stable", 2), GroupStateRow("crew", "b", "Empty", 0)
    members = (MemberRow("crew", "a", "0.x", (0,)), MemberRow("crew", "a", "0.y", ()))
    rows_a = (GroupRow("crew", "a", 0, "0.x", 4, 9),)
    rows_b = (GroupRow("crew", "b", 0, None, 2, 2), GroupRow("crew", "b", 1, None, None, 0))
    answer = ListResponse((a, *members, *rows_a, b, *rows_b), EndReply())
    described = calls.describe_consumer_group("crew").parse(answer)
    assert described == [GroupDescription(a, members, rows_a), GroupDescription(b, (), rows_b)]
    assert [d.topic for d in described] == ["a", "b"]
    with pytest.raises(RemoteProtocolError):  # rows before any +GROUPSTATE
        calls.describe_consumer_group("crew").parse(ListResponse(rows_a, EndReply()))
    reset = ListResponse((OffsetRow("a", 0, 3), OffsetRow("a", 1, 0)), EndReply())
    assert calls.reset_offsets("crew", "a", "earliest").parse(reset) == {0: 3, 1: 0}
