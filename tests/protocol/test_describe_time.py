"""``DESCRIBE <topic> time=<ms>`` (offsets for times): the command, its rows, the peer request
that asks a leader, and the client call that reads the answer."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from kafkaesque.client import KafkaesqueError, ListResponse
from kafkaesque.client import _calls as calls
from kafkaesque.protocol import (
    BadCommand,
    Bounds,
    BoundsRequest,
    DescribeTopic,
    EndReply,
    ErrorCode,
    LineDecoder,
    MalformedPeerMessage,
    PartitionRow,
    PeerCall,
    PeerReply,
    ReplyDecoder,
    TopicRow,
    encode_command,
    encode_reply,
    peer_from_wire,
    peer_to_wire,
)


def _decode_line(line: bytes) -> Any:
    decoder = LineDecoder()
    decoder.feed(line)
    events = list(decoder.events())
    assert len(events) == 1, events
    return events[0]


def _through_msgpack(value: Any) -> Any:
    return msgpack.unpackb(msgpack.packb(value, use_bin_type=True), raw=False)


@pytest.mark.parametrize(
    ("line", "command"),
    [
        (b"DESCRIBE orders\r\n", DescribeTopic("orders")),
        (b"DESCRIBE orders time=0\r\n", DescribeTopic("orders", 0)),
        (b"describe orders time=1764000000000\r\n", DescribeTopic("orders", 1764000000000)),
    ],
)
def test_describe_with_and_without_a_time(line: bytes, command: DescribeTopic) -> None:
    assert _decode_line(line) == command
    assert _decode_line(encode_command(command)) == command


@pytest.mark.parametrize(
    ("line", "says"),
    [
        (b"DESCRIBE orders time=-1\r\n", "time"),
        (b"DESCRIBE orders time=soon\r\n", "time"),
        (b"DESCRIBE orders at=5\r\n", "at"),
        (b"DESCRIBE orders time=1 time=2\r\n", "time"),
        (b"DESCRIBE orders time=1 extra=2\r\n", "DESCRIBE"),
    ],
)
def test_a_bad_time_is_refused(line: bytes, says: str) -> None:
    event = _decode_line(line)
    assert isinstance(event, BadCommand) and event.code is ErrorCode.BAD_ARGS
    assert says in event.message


def test_partition_rows_carry_the_offset_for_the_time() -> None:
    row = PartitionRow("orders", 1, 2, (0, 1, 2), 0, 40, 17)
    data = encode_reply(row)
    assert data == b"+PARTITION orders 1 leader=2 replicas=0,1,2 start=0 end=40 time_offset=17\r\n"
    decoder = ReplyDecoder()
    decoder.feed(data + encode_reply(PartitionRow("orders", 0, None, (1,))))
    assert list(decoder.events()) == [row, PartitionRow("orders", 0, None, (1,))]


def test_bounds_request_with_a_time_crosses_the_wire() -> None:
    for msg in (
        PeerCall(3, BoundsRequest(("t/0", "t/1"), 1234)),
        PeerCall(3, BoundsRequest(("t/0",))),
        PeerReply(3, Bounds(((0, 10, 4), None, (2, 2, 2)))),
        PeerReply(3, Bounds(((0, 10), None))),
    ):
        assert peer_from_wire(_through_msgpack(peer_to_wire(msg))) == msg
    # A request without a time is the very bytes a broker from before it sends.
    assert peer_to_wire(PeerCall(3, BoundsRequest(("t/0",))))[2:] == [["t/0"]]
    wire = peer_to_wire(PeerCall(3, BoundsRequest(("t/0",), 5)))
    wire[-1] = -5
    with pytest.raises(MalformedPeerMessage):
        peer_from_wire(wire)
    bad_bounds: Any = peer_to_wire(PeerReply(3, Bounds(((0, 10, 4),))))
    bad_bounds[-1][-1][-1] = [0, 1, 2, 3]
    with pytest.raises(MalformedPeerMessage):
        peer_from_wire(bad_bounds)


def _describe_reply(*rows: PartitionRow) -> ListResponse:
    return ListResponse((TopicRow("t", len(rows), 1), *rows), EndReply())


def test_the_call_reads_each_partitions_offset() -> None:
    call = calls.offsets_for_time("t", 500)
    assert call.command == DescribeTopic("t", 500)
    reply = _describe_reply(
        PartitionRow("t", 0, 1, (1,), 0, 9, 3), PartitionRow("t", 1, 1, (1,), 0, 5, 5)
    )
    assert call.parse(reply) == {0: 3, 1: 5}


def test_a_partition_no_leader_answered_for_is_retriable() -> None:
    call = calls.offsets_for_time("t", 500)
    reply = _describe_reply(
        PartitionRow("t", 0, None, (1,)), PartitionRow("t", 1, 1, (1,), 0, 5, 5)
    )
    with pytest.raises(KafkaesqueError) as info:
        call.parse(reply)
    assert info.value.code is ErrorCode.NOT_LEADER and info.value.retriable
    assert "partition(s) 0" in str(info.value)
