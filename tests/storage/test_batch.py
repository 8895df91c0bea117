"""The record batch format: round trips, stamping, and bad input rejected with a clear error."""

from __future__ import annotations

import struct

import hypothesis.strategies as st
import pytest
from hypothesis import given

from kafkaesque.storage import (
    HEADER_SIZE,
    BatchType,
    InvalidBatchError,
    LogConfig,
    PartitionLog,
    Record,
    build_batch,
    decode_header,
    decode_records,
    stamp,
)

records_st = st.lists(
    st.builds(
        Record,
        value=st.none() | st.binary(max_size=64),
        key=st.none() | st.binary(max_size=16),
        headers=st.lists(st.tuples(st.text(max_size=8), st.binary(max_size=8)), max_size=3).map(
            tuple
        ),
        timestamp=st.integers(0, 2**40),
    ),
    min_size=1,
    max_size=20,
)


@given(records=records_st, base=st.integers(0, 2**50), term=st.integers(0, 2**40))
def test_records_round_trip_with_their_offsets(records: list[Record], base: int, term: int) -> None:
    batch = build_batch(records, base_offset=base, term=term, producer_id=7, base_sequence=3)
    header = decode_header(batch)
    assert (header.base_offset, header.term, header.record_count) == (base, term, len(records))
    assert header.size == len(batch) and header.last_offset == base + len(records) - 1
    assert (header.producer_id, header.base_sequence) == (7, 3)
    got = decode_records(batch)
    assert [(r.key, r.value, r.headers, r.timestamp) for r in got] == [
        (r.key, r.value, r.headers, r.timestamp) for r in records
    ]
    assert [r.offset for r in got] == list(range(base, base + len(records)))


@given(records=records_st, base=st.integers(0, 2**50), term=st.integers(0, 2**40))
def test_stamping_changes_offset_and_term_and_keeps_the_body(
    records: list[Record], base: int, term: int
) -> None:
    batch = build_batch(records)
    stamped = stamp(batch, base_offset=base, term=term)
    header = decode_header(stamped)  # both CRCs still hold
    assert (header.base_offset, header.term) == (base, term)
    assert stamped[25:] == batch[25:]


def test_compacted_batches_keep_their_span_and_sparse_offsets() -> None:
    kept = [Record(value=b"x", key=b"a"), Record(value=b"y", key=b"b")]
    batch = build_batch(kept, base_offset=10, offset_deltas=[1, 4], last_offset_delta=6)
    header = decode_header(batch)
    assert (header.last_offset, header.record_count) == (16, 2)
    assert [r.offset for r in decode_records(batch)] == [11, 14]
    empty = build_batch([], base_offset=10, last_offset_delta=6, max_timestamp=5)
    assert decode_header(empty).record_count == 0 and decode_header(empty).max_timestamp == 5


def _valid() -> bytearray:
    return bytearray(build_batch([Record(value=b"hello", key=b"k")], base_offset=5, term=2))


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda b: b.__setitem__(slice(8, 12), struct.pack(">i", 10_000)), "length says"),
        (lambda b: b.__setitem__(slice(8, 12), struct.pack(">i", 20)), "shorter than the header"),
        (lambda b: b.__setitem__(20, 9), "magic"),
        (lambda b: b.__setitem__(len(b) - 1, b[-1] ^ 1), "body CRC"),
        (lambda b: b.__setitem__(3, b[3] ^ 1), "header CRC"),
        (lambda b: b.__setitem__(slice(21, 25), b"\0\0\0\0"), "header CRC"),
        (lambda b: b.__delitem__(slice(40, None)), "truncated batch header"),
    ],
)
def test_a_batch_that_lies_is_rejected_with_a_clear_error(mutate, message) -> None:  # type: ignore[no-untyped-def]
    batch = _valid()
    mutate(batch)
    with pytest.raises(InvalidBatchError, match=message):
        decode_header(bytes(batch))


def test_unknown_batch_type_and_contradicting_counts_are_rejected() -> None:
    # These fields sit inside the body CRC, so forge a batch whose CRCs are right.
    with pytest.raises(ValueError):
        BatchType(7)
    batch = build_batch([Record(value=b"a"), Record(value=b"b")])
    body = bytearray(batch)
    struct.pack_into(">i", body, 66, 5)  # record count 5 in a span of 2 offsets
    from crc32c import crc32c

    struct.pack_into(">I", body, 25, crc32c(bytes(body[29:])))
    fixed = stamp(bytes(body), base_offset=0, term=0)
    with pytest.raises(InvalidBatchError, match="contradicts"):
        decode_header(fixed)


def test_the_log_rejects_bad_batches_and_stays_unchanged(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with PartitionLog.open(str(tmp_path), LogConfig(max_batch_bytes=4096)) as log:
        good = build_batch([Record(value=b"ok")])
        log.append(good, term=1)
        corrupt = bytearray(good)
        corrupt[-1] ^= 0xFF
        big = build_batch([Record(value=b"x" * 5000)])
        for bad in (bytes(corrupt), good + good, good[:-3], big, b"", b"\x00" * HEADER_SIZE):
            with pytest.raises(InvalidBatchError):
                log.append(bad, term=1)
        with pytest.raises(ValueError, match="term"):
            log.append(good, term=0)
        # A follower's batch must continue the log exactly.
        elsewhere = stamp(good, base_offset=7, term=1)
        with pytest.raises(ValueError, match="does not continue"):
            log.append_replicated(elsewhere)
        assert log.log_end_offset == 1
        assert len(decode_records(log.read(0).data)) == 1


def test_data_records_walks_data_batches_from_an_offset_and_skips_control_batches() -> None:
    from kafkaesque.storage import data_records, end_offset

    first = build_batch([Record(b"a"), Record(b"b"), Record(b"c")], base_offset=10)
    control = build_batch([Record(b"noop")], base_offset=13, batch_type=BatchType.NOOP)
    last = build_batch([Record(b"d")], base_offset=14)
    buf = first + control + last
    assert [(r.offset, r.value) for r in data_records(buf)] == [
        (10, b"a"),
        (11, b"b"),
        (12, b"c"),
        (14, b"d"),
    ]
    assert [r.value for r in data_records(buf, 12)] == [b"c", b"d"]
    assert list(data_records(buf, 15)) == []
    assert end_offset(buf) == 15
    assert end_offset(first + control) == 14  # past the control batch too
    assert end_offset(b"") is None
    with pytest.raises(InvalidBatchError):
        list(data_records(first[:-1] + b"\x00"))
