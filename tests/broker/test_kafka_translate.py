"""A Produce's Kafka batches as our batches (``produced_batches``) and back (``kafka_record_set``):
a producer's batch is stored verbatim (version 2) and fetched as it came; any other is
translated, the one-pass path giving the same bytes as the general one; every field survives."""

from __future__ import annotations

import struct
import time
from typing import Any

import cramjam
import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

import kafkaesque.broker.kafka._translate as translate
from kafkaesque.broker.kafka import ProducedBatch, kafka_record_set, produced_batches
from kafkaesque.protocol.kafka import (
    KafkaProtocolError,
    KafkaRecord,
    decode_batch,
    encode_batch,
    encode_record,
    frame_batch,
    iter_batch_bytes,
)
from kafkaesque.storage import (
    Record,
    build_batch,
    decode_header,
    decode_records,
    is_kafka_format,
    raw_records,
    stamp,
)


def reference(record_set: bytes) -> list[ProducedBatch]:
    """What ``produced_batches`` gave before its one-pass path (records decoded into objects,
    then ``build_batch``), for records with timestamps (none negative)."""
    out: list[ProducedBatch] = []
    plain: list[Record] = []
    for view in iter_batch_bytes(record_set):
        batch = decode_batch(view)
        records = [
            Record(
                r.value,
                r.key,
                tuple((name, b"" if v is None else v) for name, v in r.headers),
                r.timestamp,
            )
            for r in batch.records
        ]
        if batch.producer_id < 0 or not records:
            plain += records
            continue
        data = build_batch(
            records,
            producer_id=batch.producer_id,
            producer_epoch=batch.producer_epoch,
            base_sequence=batch.base_sequence,
        )
        out.append(ProducedBatch(data, len(records)))
    if plain:
        out.insert(0, ProducedBatch(build_batch(plain), len(plain)))
    return out


def _kafka_batch(records: list[KafkaRecord], producer: tuple[int, int, int] | None) -> bytes:
    pid, epoch, seq = producer or (-1, -1, -1)
    return encode_batch(
        0,
        records,
        last_offset_delta=len(records) - 1,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
    )


headers = st.lists(st.tuples(st.text(max_size=6), st.none() | st.binary(max_size=6)), max_size=2)
# Timestamp offsets from the batch's first: mostly producers' (from 0, rising), sometimes not.
batches = st.tuples(
    st.integers(0, 1 << 42),
    st.lists(
        st.tuples(
            st.integers(-3, 300),
            st.none() | st.binary(max_size=20),
            st.none() | st.binary(max_size=300),
            st.one_of(st.just([]), headers),
        ),
        min_size=1,
        max_size=20,
    ),
    st.none() | st.tuples(st.integers(0, 1 << 40), st.integers(0, 100), st.integers(0, 1000)),
    st.booleans(),  # offset deltas 0, 1, ... (as producers write them) or spaced out
)


def _records(base: int, rs: list[Any], dense: bool, zero_first: bool) -> list[KafkaRecord]:
    out = []
    for i, (ts, key, value, hs) in enumerate(rs):
        ts = 0 if zero_first and i == 0 else ts
        out.append(KafkaRecord(i if dense else 3 * i, base + max(ts, -base), key, value, tuple(hs)))
    return out


@settings(max_examples=150, deadline=None)
@given(st.lists(batches, min_size=1, max_size=3), st.booleans())
def test_the_batches_are_those_of_records_built_one_by_one(
    described: list[Any], zero_first: bool
) -> None:
    record_set = b"".join(
        _kafka_batch(_records(base, rs, dense, zero_first), producer)
        for base, rs, producer, dense in described
    )
    ours = produced_batches(record_set)
    expected = reference(record_set)
    # Verbatim or translated, each batch reads as the records built one by one would.
    assert [_meaning(b) for b in ours] == [_meaning(b) for b in expected]
    for batch, built in zip(ours, expected, strict=True):
        if not is_kafka_format(batch.data):
            assert batch == built  # the one-pass translation: the very same bytes
    for batch in ours:
        assert len(decode_records(batch.data)) == batch.record_count


def _meaning(batch: ProducedBatch) -> tuple[Any, ...]:
    """What a batch says to every reader of ours: its header's fields and its records."""
    h = decode_header(batch.data)
    records = [
        (r.offset, r.timestamp, r.key, r.value, r.headers) for r in decode_records(batch.data)
    ]
    fields = (h.producer_id, h.producer_epoch, h.base_sequence, h.last_offset_delta)
    return (batch.record_count, fields, h.first_timestamp, h.max_timestamp, records)


def _librdkafka_like(count: int = 500) -> tuple[bytes, list[KafkaRecord]]:
    value = bytes(range(100))
    records = [KafkaRecord(i, 1_764_000_000_000 + i // 100, None, value) for i in range(count)]
    return _kafka_batch(records, None), records


def test_a_producers_batch_is_stored_verbatim_and_every_field_survives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nothing re-encoded for a batch as producers write it (the translation's cost was most
    of a leader's CPU under librdkafka), and the records read back as sent."""
    record_set, sent = _librdkafka_like()

    def not_here(*args: Any, **kwargs: Any) -> bytes:
        raise AssertionError("the batch was translated")

    monkeypatch.setattr(translate, "build_batch", not_here)
    monkeypatch.setattr(translate, "pack_batch", not_here)
    (batch,) = produced_batches(record_set)
    assert is_kafka_format(batch.data)
    assert batch.data[30:] == record_set[21:]  # from the attributes on, the producer's bytes
    header = decode_header(batch.data)
    assert (header.record_count, header.last_offset_delta) == (len(sent), len(sent) - 1)
    assert (header.first_timestamp, header.max_timestamp) == (sent[0].timestamp, sent[-1].timestamp)
    read = decode_records(batch.data, header)
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in read] == [
        (r.offset_delta, r.timestamp, r.key, r.value, ()) for r in sent
    ]


def test_a_compressed_idempotent_batch_keeps_its_producer_fields() -> None:
    records = [KafkaRecord(i, 5000 + i, b"k%d" % i, b"v" * 50, ()) for i in range(40)]
    batch = bytearray(_kafka_batch(records, (77, 3, 1000)))
    body = bytes(cramjam.zstd.compress(bytes(batch[61:])))
    head = batch[:61]
    struct.pack_into(">h", head, 21, 4)
    struct.pack_into(">i", head, 8, 61 - 12 + len(body))
    struct.pack_into(">I", head, 17, crc32c(bytes(head[21:]) + body))
    (ours,) = produced_batches(bytes(head) + body)
    assert is_kafka_format(ours.data)  # stored compressed, as it came
    header = decode_header(ours.data)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (77, 3, 1000)
    assert [r.key for r in decode_records(ours.data)] == [r.key for r in records]
    assert [r[2] for r in raw_records(ours.data, header)] == [r.key for r in records]
    # A fetch answers the producer's batch at the offset and epoch the log gave it.
    fetched = kafka_record_set(stamp(ours.data, base_offset=500, term=9))
    assert fetched[21:] == bytes(head[21:]) + body
    again = decode_batch(fetched)  # its CRC and length hold
    assert (again.base_offset, again.attributes, again.producer_id) == (500, 4, 77)
    assert struct.unpack_from(">i", fetched, 12)[0] == 9  # the leader epoch: the Raft term
    assert [r.value for r in again.records] == [r.value for r in records]


def test_batches_whose_fields_mean_otherwise_are_translated() -> None:
    """A version-2 batch's fields must mean what ours do; a Kafka batch whose first timestamp
    is not its least, whose offset deltas skip, or with log-append time, is translated."""
    body = bytearray()
    encode_record(body, 0, 0, None, b"a", [])
    encode_record(body, -1000, 1, None, b"b", [])  # before the batch's base timestamp
    early = frame_batch(0, body, record_count=2, last_offset_delta=1, base_ts=5000, max_ts=5000)
    spaced = [KafkaRecord(0, 5000, None, b"a"), KafkaRecord(2, 5000, None, b"b")]
    log_append = bytearray(_kafka_batch([KafkaRecord(0, 5000, None, b"a")], None))
    struct.pack_into(">h", log_append, 21, 0x08)
    struct.pack_into(">I", log_append, 17, crc32c(bytes(log_append[21:])))
    for record_set in (
        early,
        encode_batch(0, spaced, last_offset_delta=2),
        bytes(log_append),
    ):
        (ours,) = produced_batches(record_set)
        assert not is_kafka_format(ours.data)
        kept = [(r.key, r.value) for r in decode_batch(record_set).records]
        assert [(r.key, r.value) for r in decode_records(ours.data)] == kept


def test_several_plain_batches_of_one_request_are_one_entry() -> None:
    """The batches of a request without a producer id commit together, as one of ours."""
    one = _kafka_batch([KafkaRecord(0, 5000, None, b"a")], None)
    two = _kafka_batch([KafkaRecord(0, 6000, None, b"b"), KafkaRecord(1, 6000, None, b"c")], None)
    (ours,) = produced_batches(one + two)
    assert ours.record_count == 3 and not is_kafka_format(ours.data)
    (alone,) = produced_batches(one)
    assert is_kafka_format(alone.data)


def test_a_record_without_a_timestamp_is_stamped_now() -> None:
    before = int(time.time() * 1000)
    records = [KafkaRecord(0, -1, None, b"a"), KafkaRecord(1, -1, None, b"b")]
    (ours,) = produced_batches(_kafka_batch(records, None))
    stamped = [r.timestamp for r in decode_records(ours.data)]
    assert all(before <= t <= int(time.time() * 1000) for t in stamped)


def test_a_good_batch_before_a_corrupt_one_is_refused_with_it() -> None:
    """Nothing of a record set with a bad batch is written: the error comes before any batch."""
    good, _ = _librdkafka_like(10)
    bad = bytearray(good)
    bad[-3] ^= 0xFF  # inside the last record, CRC left as it was
    with pytest.raises(KafkaProtocolError, match="CRC"):
        produced_batches(good + bytes(bad))
    truncated = bytearray(good)
    struct.pack_into(">i", truncated, 57, 11)  # one more record than the body holds
    struct.pack_into(">i", truncated, 23, 11)  # (and the offset span to match)
    struct.pack_into(">I", truncated, 17, crc32c(bytes(truncated[21:])))
    with pytest.raises(KafkaProtocolError, match="truncated"):
        produced_batches(good + bytes(truncated))
