"""``ConsumerCore`` and ``decode_fetch``: positions, fetch plans, control batches, resets."""

from __future__ import annotations

import pytest

from kafkaesque.client import (
    ConsumerCore,
    KafkaesqueConnectionError,
    KafkaesqueError,
    OffsetReset,
    TopicPartition,
    decode_fetch,
)
from kafkaesque.protocol import DataReply, ErrorCode, ErrorReply, Fetch, PartitionRow
from kafkaesque.storage import BatchType, Record, build_batch

TP = TopicPartition("t", 0)


def payload() -> bytes:
    """Offsets 0 (a Raft no-op), 1-3 (data, keyed), 4 (a configuration batch)."""
    return b"".join(
        [
            build_batch([], base_offset=0, batch_type=BatchType.NOOP, last_offset_delta=0),
            build_batch(
                [Record(b"v%d" % i, b"k", (("h", b"x"),), 50 + i) for i in range(3)],
                base_offset=1,
            ),
            build_batch([Record(b"cfg")], base_offset=4, batch_type=BatchType.CONFIG),
        ]
    )


def test_decode_skips_control_batches_and_records_before_the_offset() -> None:
    result = decode_fetch("t", 0, 2, DataReply(5, payload(), 9))
    assert [(r.offset, r.value, r.key, r.timestamp) for r in result.records] == [
        (2, b"v1", b"k", 51),
        (3, b"v2", b"k", 52),
    ]
    assert result.records[0].headers == (("h", b"x"),)
    assert (result.next_offset, result.high_watermark) == (5, 9)


def test_a_corrupt_batch_is_an_error_never_a_wrong_record() -> None:
    data = bytearray(payload())
    data[-3] ^= 0xFF
    with pytest.raises(KafkaesqueConnectionError) as info:
        decode_fetch("t", 0, 0, DataReply(5, bytes(data)))
    assert not info.value.retriable


def test_positions_move_with_fetches_unless_a_seek_came_between() -> None:
    core = ConsumerCore()
    core.assign([TP])
    core.seek(TP, 0)
    ((tp, fetch),) = core.plan(wait_ms=100)
    assert fetch == Fetch("t", 0, 0, max_bytes=1024 * 1024, wait_ms=100)
    assert len(core.on_fetch(tp, fetch, DataReply(5, payload())).records) == 3
    assert core.positions[TP] == 5
    ((_, again),) = core.plan(wait_ms=0)
    core.seek(TP, 1)
    core.on_fetch(TP, again, DataReply(9, b""))
    assert core.positions[TP] == 1


def test_plans_rotate_and_share_the_wait() -> None:
    core = ConsumerCore()
    tps = [TopicPartition("t", p) for p in range(3)]
    core.assign(tps)
    for tp in tps:
        core.seek(tp, 0)
    first = core.plan(wait_ms=300)
    second = core.plan(wait_ms=300)
    assert [f.wait_ms for _, f in first] == [100] * 3
    assert [tp for tp, _ in first] != [tp for tp, _ in second]
    assert sorted(tp for tp, _ in first) == tps


def test_out_of_range_resets_by_policy() -> None:
    rows = {TP: PartitionRow("t", 0, 0, (0,), start_offset=10, end_offset=20)}
    for reset, expected in ((OffsetReset.EARLIEST, 10), (OffsetReset.LATEST, 20)):
        core = ConsumerCore(reset=reset)
        core.assign([TP])
        assert core.needs_reset() == [TP]
        core.apply_reset(rows)
        ((_, fetch),) = core.plan(0)
        core.on_fetch(TP, fetch, ErrorReply(ErrorCode.OFFSET_OUT_OF_RANGE, "gone"))
        assert core.needs_reset() == [TP]
        core.apply_reset(rows)
        assert core.positions[TP] == expected
    strict = ConsumerCore(reset=OffsetReset.NONE)
    strict.assign([TP])
    with pytest.raises(KafkaesqueError):
        strict.apply_reset(rows)
    strict.seek(TP, 3)
    with pytest.raises(KafkaesqueError) as info:
        strict.on_fetch(TP, strict.plan(0)[0][1], ErrorReply(ErrorCode.OFFSET_OUT_OF_RANGE))
    assert info.value.code is ErrorCode.OFFSET_OUT_OF_RANGE


def test_seek_needs_an_assigned_partition() -> None:
    core = ConsumerCore()
    with pytest.raises(ValueError):
        core.seek(TP, 0)
