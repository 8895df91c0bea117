"""Decoding fetched batches: the Arrow fast path equals the tuple path, in Spark's exact schema."""

from __future__ import annotations

import inspect
from datetime import UTC, datetime
from itertools import accumulate
from typing import Any

import pytest
from crc32c import crc32c
from hypothesis import given
from hypothesis import strategies as st
from kafkaesque.spark_source import CorruptDataError, arrow_schema, spark_schema
from kafkaesque.spark_source._decode import arrow_batch, row_tuples
from pyspark.sql.pandas.types import to_arrow_schema

from kafkaesque.protocol.kafka import KafkaRecord
from kafkaesque.storage import (
    HEADER_SIZE,
    BatchType,
    Record,
    build_batch,
    decode_header,
    from_kafka_batch,
    is_kafka_format,
    stamp,
)
from tests.storage.kafka_batches import COMPRESS, kafka_batch


def payload() -> bytes:
    """Offsets 0 (a Raft no-op), 1-3 (data), 4 (a configuration change), 5-9 (data, with a
    compacted gap at 7), as a FETCH returns them."""
    return b"".join(
        [
            build_batch([], base_offset=0, batch_type=BatchType.NOOP, last_offset_delta=0),
            build_batch(
                [
                    Record(b"v1", b"k", (("h", b"x"), ("g", b"")), 1_700_000_000_001),
                    Record(None, b"gone", (), 1_700_000_000_000),  # a tombstone
                    Record(b"v3", None, (), 1_700_000_000_005),
                ],
                base_offset=1,
            ),
            build_batch([Record(b"cfg")], base_offset=4, batch_type=BatchType.CONFIG),
            build_batch(
                [Record(b"v%d" % i, b"k%d" % i, (), 1_700_000_001_000 + i) for i in (5, 6, 8, 9)],
                base_offset=5,
                offset_deltas=[0, 1, 3, 4],
            ),
        ]
    )


def as_rows(batch: Any) -> list[tuple[Any, ...]]:
    columns = batch.to_pydict()
    return list(zip(*columns.values(), strict=True))


@pytest.mark.parametrize("include_headers", [False, True])
def test_arrow_schema_is_exactly_the_one_spark_derives(include_headers: bool) -> None:
    # Spark 4.2 renamed the UTC switch (4.1: timestamp_utc=True; 4.2+: timezone="UTC").
    utc: dict[str, Any] = (
        {"timezone": "UTC"}
        if "timezone" in inspect.signature(to_arrow_schema).parameters
        else {"timestamp_utc": True}
    )
    derived = to_arrow_schema(spark_schema(include_headers), **utc)
    assert arrow_schema(include_headers).equals(derived)
    assert (
        spark_schema(include_headers)
        .simpleString()
        .startswith(
            "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
            "timestamp:timestamp,timestampType:int"
        )
    )


@pytest.mark.parametrize("include_headers", [False, True])
def test_both_paths_give_the_same_rows_skipping_control_batches(include_headers: bool) -> None:
    batch = arrow_batch(payload(), 0, 100, "t", 3, include_headers=include_headers)
    tuples = list(row_tuples(payload(), 0, 100, "t", 3, include_headers=include_headers))
    assert batch is not None and batch.schema.equals(arrow_schema(include_headers))
    rows = as_rows(batch)
    if include_headers:  # Arrow gives structs as dicts
        rows = [(*r[:-1], [(h["key"], h["value"]) for h in r[-1]]) for r in rows]
    assert rows == tuples
    assert [r[4] for r in tuples] == [1, 2, 3, 5, 6, 8, 9]
    first = tuples[0]
    assert first[:5] == (b"k", b"v1", "t", 3, 1)
    assert first[5] == datetime(2023, 11, 14, 22, 13, 20, 1000, tzinfo=UTC)
    assert first[6] == 0
    assert tuples[1][1] is None and tuples[2][0] is None
    if include_headers:
        assert first[7] == [("h", b"x"), ("g", b"")]


@given(st.integers(0, 11), st.integers(0, 11))
def test_only_offsets_in_the_range_come_out(lo: int, hi: int) -> None:
    batch = arrow_batch(payload(), lo, hi, "t", 0, include_headers=False)
    tuples = list(row_tuples(payload(), lo, hi, "t", 0, include_headers=False))
    expected = [o for o in (1, 2, 3, 5, 6, 8, 9) if lo <= o < hi]
    assert [r[4] for r in tuples] == expected
    assert (as_rows(batch) if batch is not None else []) == tuples


def test_a_corrupt_batch_is_an_error_never_skipped() -> None:
    data = bytearray(payload())
    data[-3] ^= 0xFF  # inside the last batch's records: its body CRC no longer matches
    with pytest.raises(CorruptDataError, match="corrupt batch from t/0"):
        arrow_batch(bytes(data), 0, 100, "t", 0, include_headers=False)
    with pytest.raises(CorruptDataError, match="corrupt batch from t/0"):
        list(row_tuples(bytes(data), 0, 100, "t", 0, include_headers=False))


HEADER_CRC_AT, BODY_CRC_AT, BODY_AT, COUNT_AT = 21, 25, 29, 66  # docs/storage-format.md


def with_crcs_redone(batch: bytearray) -> bytes:
    """``batch`` with both CRCs computed again: what a buggy producer would send."""
    # Version 2: Kafka's CRC, from after the batch type.
    body_at = BODY_AT + 1 if is_kafka_format(bytes(batch)) else BODY_AT
    body_crc = crc32c(bytes(batch[body_at:])).to_bytes(4, "big")
    batch[BODY_CRC_AT:BODY_AT] = body_crc
    batch[HEADER_CRC_AT:BODY_CRC_AT] = crc32c(
        body_crc, crc32c(bytes(batch[:HEADER_CRC_AT]))
    ).to_bytes(4, "big")
    return bytes(batch)


def test_records_that_break_the_format_are_an_error() -> None:
    # CRCs right, contents wrong (a buggy producer): the header says two records, the body
    # holds one. The fast path must fail, not invent or drop rows.
    batch = bytearray(build_batch([Record(b"v")], base_offset=1, last_offset_delta=1))
    batch[COUNT_AT : COUNT_AT + 4] = (2).to_bytes(4, "big")
    good = build_batch([Record(b"v")], base_offset=0)
    with pytest.raises(CorruptDataError, match="malformed records from t/0"):
        arrow_batch(good + with_crcs_redone(batch), 0, 100, "t", 0, include_headers=False)


def test_a_timestamp_spark_cannot_hold_is_an_error_in_both_paths() -> None:
    # Found by the damaged-record test: the tuple path crashed with OverflowError, and the
    # Arrow path would have read another time (microseconds past int64).
    data = build_batch([Record(b"v", timestamp=2**62)], base_offset=0)
    with pytest.raises(CorruptDataError, match="at offset 0: timestamp"):
        arrow_batch(data, 0, 100, "t", 0, include_headers=False)
    with pytest.raises(CorruptDataError, match="at offset 0: timestamp"):
        list(row_tuples(data, 0, 100, "t", 0, include_headers=False))


records = st.builds(
    Record,
    value=st.none() | st.binary(max_size=300),  # bin 8 and bin 16
    key=st.none() | st.binary(max_size=20),
    headers=st.lists(st.tuples(st.text(max_size=40), st.binary(max_size=40)), max_size=3).map(
        tuple
    ),
    # Deltas from the batch's first timestamp in every msgpack integer width.
    timestamp=st.integers(0, 2**41),
)


@st.composite
def batches(draw: st.DrawFn) -> bytes:
    """Data batches, with offset gaps (compaction) of every msgpack integer width, and Kafka
    producers' batches stored verbatim (version 2), compressed or not."""
    parts, base = [], 0
    for _ in range(draw(st.integers(1, 4))):
        batch = draw(st.lists(records, min_size=1, max_size=8))
        codec = draw(st.none() | st.sampled_from(sorted(COMPRESS)))
        if codec is not None:  # a Kafka producer's: deltas 0, 1, ...
            kafka = [
                KafkaRecord(i, r.timestamp, r.key, r.value, r.headers) for i, r in enumerate(batch)
            ]
            stored = from_kafka_batch(kafka_batch(kafka, codec))
            parts.append(stamp(stored, base_offset=base, term=1))
            base += len(batch)
            continue
        gaps = draw(st.lists(st.integers(1, 2**20), min_size=len(batch), max_size=len(batch)))
        deltas = list(accumulate(gaps, initial=0))[: len(batch)]
        parts.append(build_batch(batch, base_offset=base, offset_deltas=deltas))
        base += deltas[-1] + 1
    return b"".join(parts)


@given(batches(), st.integers(0, 2**23), st.integers(0, 2**23), st.booleans())
def test_both_paths_agree_on_any_records(
    data: bytes, lo: int, hi: int, include_headers: bool
) -> None:
    batch = arrow_batch(data, lo, hi, "t", 1, include_headers=include_headers)
    tuples = list(row_tuples(data, lo, hi, "t", 1, include_headers=include_headers))
    rows = as_rows(batch) if batch is not None else []
    if include_headers:
        rows = [(*r[:-1], [(h["key"], h["value"]) for h in r[-1]]) for r in rows]
    assert rows == tuples


@given(batches(), st.data())
def test_a_damaged_record_is_an_error_or_read_as_the_reference_reads_it(
    data: bytes, draw: st.DataObject
) -> None:
    # A byte of a record changed, CRCs redone: the fast path never crashes and never reads
    # anything the reference decoder (msgpack itself) does not read the same way.
    first = bytearray(data[: decode_header(data).size])
    at = draw.draw(st.integers(HEADER_SIZE, len(first) - 1))  # a byte of the records
    first[at] = draw.draw(st.integers(0, 255))
    damaged = with_crcs_redone(first) + data[len(first) :]
    try:
        tuples = list(row_tuples(damaged, 0, 2**62, "t", 1, include_headers=True))
    except CorruptDataError:
        with pytest.raises(CorruptDataError, match="malformed record"):
            arrow_batch(damaged, 0, 2**62, "t", 1, include_headers=True)
        return
    try:
        batch = arrow_batch(damaged, 0, 2**62, "t", 1, include_headers=True)
    except CorruptDataError:
        return  # stricter than msgpack (a str key, say): refused, never misread
    rows = as_rows(batch) if batch is not None else []
    assert [(*r[:-1], [(h["key"], h["value"]) for h in r[-1]]) for r in rows] == tuples


@pytest.mark.parametrize("codec", sorted(COMPRESS))
def test_a_kafka_producers_batch_reads_alike_in_both_paths(codec: int) -> None:
    """A version-2 batch (nulls, a header with a null value: read as empty) beside ours."""
    sent = [
        KafkaRecord(0, 1_700_000_000_000, None, b"v", (("h", None), ("g", b"x"))),
        KafkaRecord(1, 1_700_000_000_007, b"k", None),
    ]
    data = payload() + stamp(from_kafka_batch(kafka_batch(sent, codec)), base_offset=10, term=1)
    batch = arrow_batch(data, 9, 100, "t", 0, include_headers=True)
    assert batch is not None
    rows = [(*r[:-1], [(h["key"], h["value"]) for h in r[-1]]) for r in as_rows(batch)]
    assert rows == list(row_tuples(data, 9, 100, "t", 0, include_headers=True))
    assert [(r[0], r[1], r[4], r[-1]) for r in rows] == [
        (b"k9", b"v9", 9, []),
        (None, b"v", 10, [("h", b""), ("g", b"x")]),
        (b"k", None, 11, []),
    ]
