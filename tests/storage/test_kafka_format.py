"""Version-2 batches (a Kafka producer's batch stored verbatim): every reader of ours reads them
as it reads version 1, a fetch gives the producer's bytes back, and damage anywhere is refused."""

from __future__ import annotations

import struct
from typing import Any

import hypothesis.strategies as st
import pytest
from crc32c import crc32c
from hypothesis import given, settings

from kafkaesque.protocol.kafka import KafkaRecord, decode_batch
from kafkaesque.storage import (
    InvalidBatchError,
    LogConfig,
    PartitionLog,
    Record,
    build_batch,
    data_raw_records,
    data_records,
    decode_header,
    from_kafka_batch,
    is_kafka_format,
    kafka_batch_parts,
    stamp,
)
from tests.storage.kafka_batches import COMPRESS, kafka_batch

records_st = st.lists(
    st.tuples(
        st.integers(0, 1000),
        st.none() | st.binary(max_size=16),
        st.none() | st.binary(max_size=64),
        st.lists(st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=8)), max_size=3),
    ),
    min_size=1,
    max_size=20,
)


def _kafka_records(described: list[Any]) -> list[KafkaRecord]:
    return [
        KafkaRecord(i, 1_700_000_000_000 + ts, key, value, tuple(headers))
        for i, (ts, key, value, headers) in enumerate(described)
    ]


@settings(max_examples=60, deadline=None)
@given(
    records_st,
    st.sampled_from(sorted(COMPRESS)),
    st.integers(0, 2**40),
    st.integers(0, 2**30),
)
def test_every_reader_reads_what_the_producer_sent(
    described: list[Any], codec: int, base: int, term: int
) -> None:
    records = _kafka_records(described)
    sent = kafka_batch(records, codec)
    ours = stamp(from_kafka_batch(sent), base_offset=base, term=term)
    assert is_kafka_format(ours)
    header = decode_header(ours)  # both CRCs hold
    assert (header.base_offset, header.term, header.record_count) == (base, term, len(records))
    assert header.attributes == codec and header.size == len(ours)
    # The first timestamp is the least: what ours means by it.
    assert header.first_timestamp == min(r.timestamp for r in records)
    assert header.max_timestamp == max(r.timestamp for r in records)
    expected = [
        (
            base + r.offset_delta,
            r.timestamp,
            r.key,
            r.value,
            tuple((name, b"" if v is None else v) for name, v in r.headers),
        )
        for r in records
    ]
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in data_records(ours)] == (
        expected
    )
    raw = [
        (h.base_offset + d, h.first_timestamp + t, k, v, tuple((n.decode(), x) for n, x in hs))
        for h, (d, t, k, v, hs) in data_raw_records(ours)
    ]
    assert raw == expected
    # A Kafka fetch: the producer's bytes, at the offset and epoch the log gave them.
    head, rest = kafka_batch_parts(memoryview(ours), header, term)
    fetched = head + bytes(rest)
    assert fetched[21:] == sent[21:] and fetched[16] == 2
    again = decode_batch(fetched)
    assert again.base_offset == base and struct.unpack_from(">i", fetched, 12)[0] == term
    assert [(r.key, r.value, r.headers) for r in again.records] == [
        (r.key, r.value, r.headers) for r in records
    ]


def test_damage_anywhere_is_refused() -> None:
    """Kafka's CRC covers the body after the batch type, the header CRC the prefix and Kafka's
    CRC; the batch type, outside both, must say data."""
    records = _kafka_records([(i, b"k", b"v" * 20, [("h", b"x")]) for i in range(5)])
    ours = stamp(from_kafka_batch(kafka_batch(records, 4)), base_offset=3, term=2)
    decode_header(ours)
    for pos in range(len(ours)):
        damaged = bytearray(ours)
        damaged[pos] ^= 0x01
        if pos in range(8, 12):  # the length: a batch that does not fit, or runs short
            continue
        with pytest.raises(InvalidBatchError):
            decode_header(bytes(damaged))
    control = bytearray(ours)
    control[29] = 1  # a no-op's type
    with pytest.raises(InvalidBatchError, match="not data"):
        decode_header(bytes(control), verify=False)


def test_records_that_do_not_parse_are_refused_by_every_reader() -> None:
    """A CRC that holds over records that are not Kafka's (written by a bug, not a disk) is
    still refused with a clear error, never read as something else."""
    records = _kafka_records([(0, None, b"value", [])])
    sent = bytearray(kafka_batch(records))
    sent[61] = 0x7E  # the record says 63 bytes; fewer follow
    struct.pack_into(">I", sent, 17, crc32c(bytes(sent[21:])))
    ours = from_kafka_batch(bytes(sent))
    decode_header(ours)
    with pytest.raises(InvalidBatchError, match="malformed Kafka records"):
        list(data_records(ours))


def test_a_log_holds_both_versions_and_keeps_them_through_a_restart(tmp_path) -> None:  # type: ignore[no-untyped-def]
    kafka = from_kafka_batch(kafka_batch(_kafka_records([(0, b"k", b"kafka", [])]), 1, 42))
    with PartitionLog.open(str(tmp_path), LogConfig()) as log:
        log.append(build_batch([Record(b"ours")]), term=1)
        log.append(kafka, term=1)
        log.append(build_batch([Record(b"ours again")]), term=1)
        log.flush()
    with PartitionLog.open(str(tmp_path), LogConfig()) as log:  # recovery walks them all
        read = log.read(0).data
        assert [(r.offset, r.value) for r in data_records(read)] == [
            (0, b"ours"),
            (1, b"kafka"),
            (2, b"ours again"),
        ]
        assert log.log_end_offset == 3
