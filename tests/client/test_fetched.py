"""``fetch_batch``, ``data_batches``, ``batch_records`` and ``partition_offsets``: batches left
undecoded for bulk readers, and every partition's bounds (no sockets)."""

from __future__ import annotations

from typing import Any

import pytest

from kafkaesque.client import (
    BatchSpan,
    ClusterState,
    CorruptBatchError,
    FetchedBatch,
    KafkaesqueError,
    ListResponse,
    batch_records,
    data_batches,
    decode_fetch,
)
from kafkaesque.client import _fetched as fetched
from kafkaesque.client import _log_bounds as log_bounds
from kafkaesque.client import _steps as steps
from kafkaesque.protocol import (
    BrokerRow,
    DataReply,
    DescribeTopic,
    EndReply,
    ErrorCode,
    ErrorReply,
    Fetch,
    Metadata,
    PartitionRow,
    TopicRow,
)
from kafkaesque.storage import HEADER_SIZE, BatchType, Record, build_batch

from .test_steps import CONFIG, drive


def payload() -> bytes:
    """Offsets 0 (a Raft no-op), 1-3 (data), 4 (a configuration batch), 5-6 (data)."""
    return b"".join(
        [
            build_batch([], base_offset=0, batch_type=BatchType.NOOP, last_offset_delta=0),
            build_batch([Record(b"v%d" % i, b"k", (), 10 + i) for i in (1, 2, 3)], base_offset=1),
            build_batch([Record(b"cfg")], base_offset=4, batch_type=BatchType.CONFIG),
            build_batch([Record(b"v5", None, (("h", b"x"),), 20), Record(b"v6")], base_offset=5),
        ]
    )


def test_data_batches_say_where_the_records_of_a_range_lie() -> None:
    data = payload()
    spans = data_batches(data, 0, 100)
    assert [(s.base_offset, s.last_offset, s.record_count) for s in spans] == [(1, 3, 3), (5, 6, 2)]
    first = spans[0]
    assert first.records_start == first.start + HEADER_SIZE
    assert data[first.start : first.end] == build_batch(
        [Record(b"v%d" % i, b"k", (), 10 + i) for i in (1, 2, 3)], base_offset=1
    )
    assert first.first_timestamp == 11
    assert spans[1].end == len(data)
    # Only batches with records in [lo, hi): none past hi, none wholly below lo.
    assert [s.base_offset for s in data_batches(data, 4, 5)] == []
    assert [s.base_offset for s in data_batches(data, 3, 5)] == [1]
    assert [s.base_offset for s in data_batches(data, 4, 100)] == [5]


def test_batch_records_decode_one_batch_as_the_consumer_reads_it() -> None:
    data = payload()
    records = [r for s in data_batches(data, 0, 100) for r in batch_records(data, s)]
    consumed = decode_fetch("t", 2, 0, DataReply(7, data)).records
    assert [(r.offset, r.key, r.value, r.timestamp, r.headers) for r in records] == [
        (r.offset, r.key, r.value, r.timestamp, r.headers) for r in consumed
    ]
    assert [r.offset for r in records] == [1, 2, 3, 5, 6]
    assert records[3].headers == (("h", b"x"),) and records[3].key is None


def test_a_corrupt_batch_is_an_error_naming_where_it_starts() -> None:
    data = bytearray(payload())
    data[-3] ^= 0xFF  # inside the last batch's records: its body CRC no longer matches
    last = data_batches(payload(), 0, 100)[-1]
    with pytest.raises(CorruptBatchError, match="body CRC mismatch") as info:
        data_batches(bytes(data), 0, 100)
    assert info.value.position == last.start


def test_records_that_break_the_format_are_an_error() -> None:
    span = BatchSpan(0, HEADER_SIZE, HEADER_SIZE + 1, 1, 0, 0, 0)
    batch = bytearray(build_batch([Record(b"v")], base_offset=0))
    broken = bytes(batch[: HEADER_SIZE + 1])  # a record cut short, unchecked (no CRC pass)
    with pytest.raises(CorruptBatchError):
        batch_records(broken, span)


def test_fetch_batch_leaves_the_payload_undecoded() -> None:
    call = fetched.fetch_batch("t", 1, 3, max_bytes=100, wait_ms=200)
    assert call.command == Fetch("t", 1, 3, 100, 200)
    assert call.extra_timeout_s == 0.2
    assert call.parse(DataReply(7, payload(), 9)) == FetchedBatch("t", 1, 3, payload(), 7, 9)
    with pytest.raises(KafkaesqueError, match="OFFSET_OUT_OF_RANGE"):
        call.parse(ErrorReply(ErrorCode.OFFSET_OUT_OF_RANGE, "deleted"))


def test_partition_offsets_ask_the_leader_of_a_partition_the_answer_left_unbounded() -> None:
    topic = TopicRow("t", 2, 2)
    described = ListResponse(
        (
            topic,
            PartitionRow("t", 0, 0, (0, 1), start_offset=3, end_offset=9),
            PartitionRow("t", 1, 1, (1, 2)),  # the broker asked holds no replica of it
        ),
        EndReply(),
    )
    metadata = ListResponse(
        (BrokerRow(0, "h0", 1), BrokerRow(1, "h1", 2), PartitionRow("t", 1, 1, (1, 2))),
        EndReply(),
    )
    at_leader = ListResponse(
        (topic, PartitionRow("t", 1, 1, (1, 2), start_offset=0, end_offset=4)), EndReply()
    )
    asked: list[tuple[Any, Any]] = []

    def answer(request: steps.Request) -> Any:
        asked.append((request.address, request.command))
        if isinstance(request.command, Metadata):
            return metadata
        return at_leader if request.address == ("h1", 2) else described

    state = ClusterState([("boot", 9)])
    result, _ = drive(log_bounds.partition_offsets(state, CONFIG, "t"), answer)
    assert result == {0: (3, 9), 1: (0, 4)}
    assert asked[-1] == (("h1", 2), DescribeTopic("t"))


def test_partition_offsets_without_a_leader_is_not_leader() -> None:
    described = ListResponse((TopicRow("t", 1, 1), PartitionRow("t", 0, None, (0,))), EndReply())
    metadata = ListResponse((BrokerRow(0, "h0", 1), PartitionRow("t", 0, None, (0,))), EndReply())

    def answer(request: steps.Request) -> Any:
        return metadata if isinstance(request.command, Metadata) else described

    with pytest.raises(KafkaesqueError, match="NOT_LEADER"):
        drive(log_bounds.partition_offsets(ClusterState([("boot", 9)]), CONFIG, "t"), answer)
