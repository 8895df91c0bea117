"""The answer path of a Kafka connection's pipelined Produce requests (issue 33: a librdkafka
producer heard its acknowledgement long after a consumer had read the record).

Units: ``send_in_order`` writes the answers in request order, all those already given in one
write (not one write and one pass of the scheduler each); ``ProduceInFlight.tell`` gives a
Produce's response from its writes' outcomes as their group tells them, in whatever order,
once, and ``expire`` answers the untold ones as unknown at the deadline. A process test: a
Produce whose quorum is gone is answered REQUEST_TIMED_OUT at its write timeout, in order, and
the connection serves on.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

import trio
import trio.testing

from kafkaesque.broker._errors import RequestError
from kafkaesque.broker._writes import LeaderWrite
from kafkaesque.broker.kafka._answers import Answer, send_in_order
from kafkaesque.broker.kafka._handlers import ProduceInFlight, _PartitionWrites
from kafkaesque.client import Client
from kafkaesque.local_cluster import LocalCluster
from kafkaesque.protocol import Acks, ErrorCode
from kafkaesque.protocol.kafka import (
    API_VERSIONS,
    METADATA,
    PRODUCE,
    KafkaError,
    KafkaRecord,
    Message,
    decode_response,
    encode_batch,
    encode_request,
)


class _Recorder(trio.abc.SendStream):
    """A send stream that keeps each ``send_all`` apart."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await trio.lowlevel.checkpoint()
        self.writes.append(bytes(data))

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


async def test_answers_given_out_of_order_go_out_in_order_and_together() -> None:
    """Five pipelined answers whose commits wake them last-first (as trio may run them): none
    is written before the first is given, then all five in request order, in ONE write."""
    stream = _Recorder()
    sending, in_order = trio.open_memory_channel[Answer](64)
    answers = [Answer() for _ in range(5)]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(send_in_order, stream, in_order)
        for answer in answers:
            await sending.send(answer)
        for i in (4, 3, 2, 1):
            answers[i].give(b"r%d" % i)
            await trio.testing.wait_all_tasks_blocked()
        assert stream.writes == []  # the first one holds the others back
        answers[0].give(b"r0")
        await trio.testing.wait_all_tasks_blocked()
        assert stream.writes == [b"r0r1r2r3r4"]
        empty, last = Answer(b""), Answer()  # acks=0: nothing to write
        await sending.send(empty)
        await sending.send(last)
        last.give(b"r5")
        await sending.aclose()
    assert stream.writes == [b"r0r1r2r3r4", b"r5"]


class _Write:
    """A stand-in for ``LeaderWrite``: its outcome is told when the test says."""

    def __init__(self, tells: bool = True) -> None:
        self._tells = tells
        self.callback: Callable[[tuple[int, int] | RequestError], None] | None = None

    def tells(self, acks: Acks) -> bool:
        return self._tells and acks is Acks.QUORUM

    def when_written(self, callback: Callable[[tuple[int, int] | RequestError], None]) -> None:
        self.callback = callback

    def tell(self, outcome: tuple[int, int] | RequestError) -> None:
        assert self.callback is not None, "not registered"
        self.callback(outcome)


def _partition(*writes: _Write, error: KafkaError | None = None) -> _PartitionWrites:
    return _PartitionWrites(error, cast(list[LeaderWrite], list(writes)))


def _body(*partitions: int) -> Message:
    data = [{"index": p, "records": b""} for p in partitions]
    return {"acks": -1, "topic_data": [{"name": "t", "partition_data": data}]}


def _results(response: Message | None) -> dict[int, tuple[int, int]]:
    assert response is not None
    [topic] = response["responses"]
    return {p["index"]: (p["error_code"], p["base_offset"]) for p in topic["partition_responses"]}


def test_a_produce_is_answered_once_when_its_last_write_is_told_in_any_order() -> None:
    writes = {0: [_Write(), _Write()], 1: [_Write()]}
    partitions = {("t", p): _partition(*ws) for p, ws in writes.items()}
    produce = ProduceInFlight(_body(0, 1), -1, partitions, deadline=10.0)
    responses: list[Message | None] = []
    assert produce.tell(responses.append)
    writes[1][0].tell((7, 7))
    writes[0][1].tell((5, 6))
    assert responses == []
    writes[0][0].tell((3, 4))
    assert len(responses) == 1
    assert _results(responses[0]) == {0: (KafkaError.NONE, 3), 1: (KafkaError.NONE, 7)}
    writes[0][0].tell((3, 4))
    produce.expire()
    assert len(responses) == 1  # once only


def test_the_writes_untold_at_the_deadline_are_answered_as_timed_out() -> None:
    first, second = _Write(), _Write()
    partitions = {("t", 0): _partition(first), ("t", 1): _partition(second)}
    produce = ProduceInFlight(_body(0, 1), -1, partitions, deadline=10.0)
    responses: list[Message | None] = []
    assert produce.tell(responses.append)
    first.tell(RequestError(ErrorCode.NOT_LEADER, "moved"))
    produce.expire()
    assert _results(responses[0]) == {
        0: (KafkaError.NOT_LEADER_OR_FOLLOWER, -1),
        1: (KafkaError.REQUEST_TIMED_OUT, -1),
    }
    second.tell((1, 1))
    assert len(responses) == 1  # a late commit changes nothing


def test_a_produce_whose_writes_cannot_be_told_is_left_to_a_task() -> None:
    """acks=1 (and any write that cannot tell) registers nothing: the caller awaits ``answer``;
    a Produce refused before any write answers at once."""
    write = _Write(tells=False)
    produce = ProduceInFlight(_body(0), -1, {("t", 0): _partition(write)}, 10.0)
    assert not produce.tell(lambda response: None)
    assert write.callback is None
    refused = _partition(error=KafkaError.INVALID_REQUIRED_ACKS)
    answered: list[Message | None] = []
    assert ProduceInFlight(_body(0), 5, {("t", 0): refused}, 10.0).tell(answered.append)
    assert _results(answered[0]) == {0: (KafkaError.INVALID_REQUIRED_ACKS, -1)}


def _exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, "the broker closed the connection"
        data += chunk
    return data


def _frames(sock: socket.socket, n: int) -> list[bytes]:
    out = []
    for _ in range(n):
        size = struct.unpack(">i", _exactly(sock, 4))[0]
        out.append(_exactly(sock, size))
    return out


def test_a_produce_without_quorum_is_answered_timed_out_in_order_and_the_connection_serves_on(
    tmp_path: Path,
) -> None:
    """Both followers paused: two pipelined acks=-1 Produces are never told by their group, so
    the connection's deadline watch answers each REQUEST_TIMED_OUT (the outcome is unknown) at
    the write timeout, and the ApiVersions sent behind them is answered after them."""
    with LocalCluster(str(tmp_path), 3, extra_args=["--write-timeout", "2"]) as cluster:
        with Client(cluster.bootstrap) as client:
            client.create_topic("lonely", 1, 3)
        meta = encode_request(METADATA, 8, 1, "t", {"topics": [{"name": "lonely"}]})
        leader = -1
        for _ in range(50):  # bounded: the leader is known within a few seconds
            with socket.create_connection(cluster.kafka_address(0), timeout=20) as sock:
                sock.sendall(meta)
                [frame] = _frames(sock, 1)
            [topic] = decode_response(METADATA, 8, frame)[1]["topics"]
            leader = topic["partitions"][0]["leader_id"] if topic["partitions"] else -1
            if leader >= 0:
                break
            time.sleep(0.1)
        assert leader >= 0
        frames = []
        for seq in range(2):
            batch = encode_batch(0, [KafkaRecord(0, 1, None, b"v%d" % seq)], last_offset_delta=0)
            data = [{"index": 0, "records": batch}]
            body = {
                "acks": -1,
                "timeout_ms": 5000,
                "topic_data": [{"name": "lonely", "partition_data": data}],
            }
            frames.append(encode_request(PRODUCE, 7, seq, "t", body))
        frames.append(encode_request(API_VERSIONS, 0, 9, "t", {}))
        with socket.create_connection(cluster.kafka_address(leader), timeout=30) as sock:
            for other in range(3):
                if other != leader:
                    cluster.pause(other)
            try:
                sock.sendall(b"".join(frames))
                answers = _frames(sock, 3)
            finally:
                for other in range(3):
                    if other != leader:
                        cluster.resume(other)
    assert [struct.unpack(">i", a[:4])[0] for a in answers] == [0, 1, 9]
    for answer in answers[:2]:
        [p] = decode_response(PRODUCE, 7, answer)[1]["responses"][0]["partition_responses"]
        assert p["error_code"] == KafkaError.REQUEST_TIMED_OUT, p
    assert decode_response(API_VERSIONS, 0, answers[2])[1]["error_code"] == KafkaError.NONE
