"""The record batch: the unit of the partition log, of Raft replication and of the wire.

The layout (all integers big-endian) is written down in docs/storage-format.md; this module is its
only implementation. A batch is pure bytes in, values out: no files here.

Two versions (``magic``) share the header and live side by side in one log; every reader goes
through the functions here, which read both:

* version 1 (``MAGIC``): the records are msgpack, as our producers and the line and MQTT fronts
  write them (C to read and write: docs/storage-format.md, "Which records are Kafka's");
* version 2 (``KAFKA_MAGIC``): a Kafka producer's RecordBatch v2 as it sent it, from its
  attributes on: its records (varint-framed, maybe compressed) and its own CRC. Our bytes 30-70
  are Kafka's 21-61 field for field, so the Kafka front stores a producer's batch with one CRC
  check and answers a Kafka fetch with 21 rebuilt bytes and the stored rest (``kafka_batch_parts``):
  no record re-encoded either way. Its records are read with Kafka's record codec
  (``kafkaesque.protocol.kafka``: one implementation of that format).

Two checksums protect a batch (the idea is Redpanda's header CRC beside Kafka's body CRC):

* ``crc`` covers the body (batch type through the last record; in version 2, Kafka's CRC, the
  body after the batch type, which must then be DATA). The producer computes it, so a consumer
  can verify end to end what the producer sent; the broker never rewrites the body.
* ``header_crc`` covers the fields a leader stamps when it appends (base offset, length, term,
  magic) and the body CRC, so stamping an offset costs a CRC over 25 bytes, not over the batch.
"""

from __future__ import annotations

import itertools
import operator
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import NamedTuple

import msgpack
from crc32c import crc32c

from kafkaesque.protocol.kafka import KafkaProtocolError, decompressed, record_tuples

from ._errors import InvalidBatchError

MAGIC = 1
KAFKA_MAGIC = 2
"""The version of a batch whose body is a Kafka producer's batch verbatim (see above)."""

# Field layout. Offsets are positions in the batch; see docs/storage-format.md.
_PREFIX = struct.Struct(">qiqbI")  # base_offset, batch_length, term, magic, header_crc
_BODY_CRC = struct.Struct(">I")
# batch type, attributes, last offset delta, first and max timestamp, producer id and epoch,
# base sequence, record count
_BODY = struct.Struct(">BHiqqqhii")
_HEADER = struct.Struct(">qiqbII" + _BODY.format[1:])  # the whole fixed header at once
_STAMPED = struct.Struct(">qiqb")  # the fields a leader stamps (and the two between)
_LENGTH_MAGIC = struct.Struct(">i8xb")  # batch_length, (term), magic
_HEADER_CRC = struct.Struct(">I")

HEADER_SIZE = _PREFIX.size + _BODY_CRC.size + _BODY.size  # 70
LENGTH_FIELD_END = 12  # batch_length counts the bytes after this position
_MAGIC_POS = 20
_HEADER_CRC_POS = 21
_BODY_CRC_POS = 25
_BODY_POS = 29
_KAFKA_BODY_POS = 30  # version 2: where Kafka's CRC starts covering (its attributes)
# A Kafka batch's first 21 bytes: baseOffset, batchLength, partitionLeaderEpoch, magic, crc.
_KAFKA_PREFIX = struct.Struct(">qiib")
_KAFKA_PREFIX_SIZE = _KAFKA_PREFIX.size + 4  # 21: where its attributes start
_KAFKA_CRC_POS = 17
_KAFKA_MAGIC_VALUE = 2  # Kafka's own RecordBatch v2
_SIZE_OVER_KAFKA = _KAFKA_BODY_POS - _KAFKA_PREFIX_SIZE  # 9: ours is that much longer

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1


class BatchType(IntEnum):
    """What a batch carries. Consumers see only DATA; the others are Raft's control batches."""

    DATA = 0
    NOOP = 1  # the no-op a new Raft leader appends at the start of its term
    CONFIG = 2  # a Raft membership change


_BATCH_TYPES = tuple(BatchType)  # indexable by the wire value (values are 0, 1, 2...)
_BATCH_TYPE_COUNT = len(_BATCH_TYPES)


@dataclass(frozen=True, slots=True)
class Record:
    """One record. ``offset`` and ``timestamp`` are absolute once read from a batch."""

    value: bytes | None
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp: int = 0  # milliseconds since the epoch
    offset: int = -1


class BatchHeader(NamedTuple):
    """The decoded fixed header of a batch. ``size`` is the whole batch in bytes.

    A NamedTuple rather than a dataclass: it is built for every batch on the append and read
    paths, and a tuple is built in a third of the time.
    """

    base_offset: int
    size: int
    term: int
    batch_type: BatchType
    attributes: int
    last_offset_delta: int
    first_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1


def build_batch(
    records: Sequence[Record],
    *,
    base_offset: int = 0,
    term: int = 0,
    batch_type: BatchType = BatchType.DATA,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    offset_deltas: Sequence[int] | None = None,
    last_offset_delta: int | None = None,
    max_timestamp: int = 0,
) -> bytes:
    """Encode ``records`` as one batch.

    Record offsets are ``base_offset + i`` unless ``offset_deltas`` is given (compaction keeps the
    original offsets of the records it retains, so deltas may have gaps); ``last_offset_delta``
    defaults to the last delta and may be larger (a compacted batch still spans its original
    offsets). ``max_timestamp`` is a floor for the batch's max timestamp (compaction keeps the
    original so time retention does not change). Raises ``ValueError`` for an empty batch of
    data, or deltas that do not increase.
    """
    # (Every write of a producer's records builds a batch here: the checks and loops below
    # keep to few calls; a range of deltas increases by construction.)
    if offset_deltas is None:
        offset_deltas = range(len(records))
    elif len(offset_deltas) != len(records):
        raise ValueError("offset_deltas must have one entry per record")
    elif any(b <= a for a, b in itertools.pairwise(offset_deltas)):
        raise ValueError("offset deltas must increase")
    if last_offset_delta is None:
        if not records:
            raise ValueError("a batch needs at least one record or an explicit last_offset_delta")
        last_offset_delta = offset_deltas[-1]
    elif records and last_offset_delta < offset_deltas[-1]:
        raise ValueError("last_offset_delta is below the last record's delta")
    timestamps = [r.timestamp for r in records]
    first_ts = min(timestamps, default=0)
    max_ts = max(max(timestamps, default=0), max_timestamp)
    return pack_batch(
        [
            (delta, r.timestamp - first_ts, r.key, r.value, r.headers)
            for delta, r in zip(offset_deltas, records, strict=True)
        ],
        first_timestamp=first_ts,
        max_timestamp=max_ts,
        last_offset_delta=last_offset_delta,
        base_offset=base_offset,
        term=term,
        batch_type=batch_type,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
    )


PackedRecord = tuple[int, int, bytes | None, bytes | None, Sequence[tuple[str, bytes]]]
"""A record as ``pack_batch`` takes it: (offset delta, timestamp delta from the batch's first
timestamp, key, value, headers)."""


def pack_batch(
    records: list[PackedRecord],
    *,
    first_timestamp: int,
    max_timestamp: int,
    last_offset_delta: int,
    base_offset: int = 0,
    term: int = 0,
    batch_type: BatchType = BatchType.DATA,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
) -> bytes:
    """Encode ``records``, given as the body holds them, as one batch: ``build_batch`` without
    its checks, for a caller that has the records' fields already (the Kafka front's produce
    reads them from a Kafka batch as tuples of this shape). The caller's contract, unchecked:
    offset deltas increase and stay within ``last_offset_delta``, timestamp deltas are not
    negative, ``max_timestamp`` is at least every record's timestamp.

    All records are packed by one call (a msgpack array, whose header is dropped): no call or
    object per record here.
    """
    count = len(records)
    packed = msgpack.packb(records, use_bin_type=True)
    # The array header msgpack wrote before the records: 1, 3 or 5 bytes by the count.
    body_records = memoryview(packed)[1 if count < 16 else 3 if count < 0x10000 else 5 :]
    body = (
        _BODY.pack(
            batch_type,
            0,
            last_offset_delta,
            first_timestamp,
            max_timestamp,
            producer_id,
            producer_epoch,
            base_sequence,
            count,
        )
        + body_records
    )
    body_crc = _BODY_CRC.pack(crc32c(body))
    length = HEADER_SIZE + len(body_records) - LENGTH_FIELD_END
    prefix = bytearray(_PREFIX.pack(base_offset, length, term, MAGIC, 0))
    _stamp_header_crc(prefix, body_crc)
    return bytes(prefix) + body_crc + body


def _stamp_header_crc(prefix: bytearray, body_crc: bytes) -> None:
    header_crc = crc32c(body_crc, crc32c(prefix[:_HEADER_CRC_POS]))
    struct.pack_into(">I", prefix, _HEADER_CRC_POS, header_crc)


def stamped_prefix(batch: bytes | memoryview, *, base_offset: int, term: int) -> bytes:
    """The first 25 bytes of ``batch`` with base offset and term replaced, header CRC redone.

    ``stamped_prefix(b, ...) + b[25:]`` is the stamped batch: the body (and its CRC) is never
    touched, so a leader assigns offsets without re-encoding or copying the records. (On the
    append path of every batch: built in one pack, not patched into a copy.)
    """
    length, magic = _LENGTH_MAGIC.unpack_from(batch, LENGTH_FIELD_END - 4)
    head = _STAMPED.pack(base_offset, length, term, magic)
    return head + _HEADER_CRC.pack(crc32c(batch[_BODY_CRC_POS:_BODY_POS], crc32c(head)))


def stamp(batch: bytes | memoryview, *, base_offset: int, term: int) -> bytes:
    """Return ``batch`` with its base offset and term replaced (see ``stamped_prefix``)."""
    return stamped_prefix(batch, base_offset=base_offset, term=term) + bytes(batch[_BODY_CRC_POS:])


def peek_size(buf: bytes | memoryview, pos: int = 0) -> int | None:
    """The size of the batch starting at ``pos``, or None if fewer than 12 bytes remain."""
    if len(buf) - pos < LENGTH_FIELD_END:
        return None
    length: int = struct.unpack_from(">i", buf, pos + 8)[0]
    return LENGTH_FIELD_END + length


def decode_header(
    buf: bytes | memoryview, pos: int = 0, *, verify: bool = True, header_crc: bool = True
) -> BatchHeader:
    """Decode and check the batch at ``buf[pos:]``.

    With ``verify`` (the default) both CRCs are checked and the batch must lie wholly inside
    ``buf``; ``header_crc=False`` skips the header CRC, for a leader that overwrites the stamped
    fields anyway (their length and magic are still checked, and the body CRC).
    Raises ``InvalidBatchError`` naming what is wrong: a short buffer, a length that lies,
    an unknown magic or batch type, a CRC mismatch, or counts that contradict each other.
    """
    avail = len(buf) - pos
    if avail < HEADER_SIZE:
        raise InvalidBatchError(f"truncated batch header: {avail} of {HEADER_SIZE} bytes")
    (
        base_offset,
        length,
        term,
        magic,
        stored_header_crc,
        body_crc,
        btype,
        attrs,
        last_delta,
        first_ts,
        max_ts,
        pid,
        epoch,
        seq,
        count,
    ) = _HEADER.unpack_from(buf, pos)
    size = LENGTH_FIELD_END + length
    if magic == MAGIC:
        body_pos = _BODY_POS
    elif magic == KAFKA_MAGIC:
        body_pos = _KAFKA_BODY_POS
        if btype != BatchType.DATA:  # outside every CRC: a wrong one is refused outright
            raise InvalidBatchError(f"a Kafka-format batch of type {btype}, not data")
    else:
        raise InvalidBatchError(f"unknown batch format version (magic) {magic}")
    if size < HEADER_SIZE:
        raise InvalidBatchError(f"batch length {length} is shorter than the header")
    if verify:
        if type(buf) is not memoryview:  # (a final class: no isinstance call needed)
            buf = memoryview(buf)  # slicing bytes would copy the whole body for the CRC
        if size > avail:
            raise InvalidBatchError(f"batch length says {size} bytes but only {avail} are there")
        if header_crc:
            body_crc_bytes = buf[pos + _BODY_CRC_POS : pos + _BODY_POS]
            want = crc32c(body_crc_bytes, crc32c(buf[pos : pos + _HEADER_CRC_POS]))
            if want != stored_header_crc:
                raise InvalidBatchError(f"header CRC mismatch at offset {base_offset}")
        if crc32c(buf[pos + body_pos : pos + size]) != body_crc:
            raise InvalidBatchError(f"body CRC mismatch in batch at offset {base_offset}")
    if btype >= _BATCH_TYPE_COUNT:
        raise InvalidBatchError(f"unknown batch type {btype}")
    batch_type = _BATCH_TYPES[btype]
    if count < 0 or last_delta < 0 or (count > 0 and last_delta < count - 1):
        raise InvalidBatchError(f"record count {count} contradicts offset span {last_delta + 1}")
    if base_offset < 0 or term < 0:
        raise InvalidBatchError(f"negative base offset {base_offset} or term {term}")
    return BatchHeader(
        base_offset,
        size,
        term,
        batch_type,
        attrs,
        last_delta,
        first_ts,
        max_ts,
        pid,
        epoch,
        seq,
        count,
    )


def iter_batches(buf: bytes | memoryview, *, verify: bool = True) -> Iterator[BatchHeader]:
    """Walk consecutive whole batches in ``buf``; raise ``InvalidBatchError`` at a bad one."""
    pos = 0
    while pos < len(buf):
        header = decode_header(buf, pos, verify=verify)
        yield header
        pos += header.size


def data_records(
    buf: bytes | memoryview, from_offset: int = 0, *, verify: bool = True
) -> Iterator[Record]:
    """The records of the data batches in ``buf`` (consecutive whole batches, as a read
    returns them) whose offset is ``from_offset`` or later, in offset order.

    The one record walk of every reader: control batches (leader no-ops, configuration
    changes) are skipped as Kafka consumers skip control records, and a batch that starts before
    ``from_offset`` gives only its later records. ``verify=False`` skips the CRC checks, for
    bytes the log verified on read. Raises ``InvalidBatchError`` at a bad batch.
    """
    for header, batch in _data_batches(buf, from_offset, verify):
        for record in decode_records(batch, header):
            if record.offset >= from_offset:
                yield record


def data_raw_records(
    buf: bytes | memoryview, from_offset: int = 0, *, verify: bool = True
) -> Iterator[tuple[BatchHeader, RawRecord]]:
    """``data_records``' walk, each record as the body holds it (``raw_records``) with its
    batch's header (its offset is ``header.base_offset`` plus the delta, its timestamp
    ``header.first_timestamp`` plus the other): for a reader that writes the fields out in
    another format and would only take a ``Record`` apart again."""
    for header, batch in _data_batches(buf, from_offset, verify):
        first = from_offset - header.base_offset
        for record in raw_records(batch, header):
            if record[0] >= first:
                yield header, record


def _data_batches(
    buf: bytes | memoryview, from_offset: int, verify: bool
) -> Iterator[tuple[BatchHeader, bytes | memoryview]]:
    """The data batches of ``buf`` that hold a record at ``from_offset`` or later."""
    pos = 0
    while pos < len(buf):
        header = decode_header(buf, pos, verify=verify)
        end = pos + header.size
        if header.batch_type is BatchType.DATA and header.next_offset > from_offset:
            yield header, buf[pos:end]
        pos = end


def end_offset(buf: bytes | memoryview) -> int | None:
    """The offset after the last whole batch in ``buf`` (where the next read starts: past
    control batches too), or None for no batch. Reads headers only, without CRC checks."""
    pos = 0
    end: int | None = None
    while pos < len(buf):
        header = decode_header(buf, pos, verify=False)
        end = header.next_offset
        pos += header.size
    return end


RawRecord = tuple[int, int, bytes | None, bytes | None, tuple[tuple[bytes, bytes], ...]]
"""A record as the body holds it: (offset delta, timestamp delta from the batch's first
timestamp, key, value, headers with their names as UTF-8 bytes)."""


def raw_records(batch: bytes | memoryview, header: BatchHeader) -> list[RawRecord]:
    """The records of one batch as the body holds them (no ``Record`` built: for a reader that
    re-encodes them, as the Kafka front's fetch does); checked as ``decode_records`` checks.
    A Kafka-format batch's header values that are null come as empty bytes."""
    if batch[_MAGIC_POS] == KAFKA_MAGIC:
        kafka = _kafka_records(batch, header)
        if not any(map(_HEADERS_OF, kafka)):  # as almost always: the tuples are as ours
            return kafka  # type: ignore[return-value]  # (no header to differ in type)
        return [
            (delta, ts_delta, key, value, _raw_headers(headers) if headers else ())
            for delta, ts_delta, key, value, headers in kafka
        ]
    unpacker = msgpack.Unpacker(use_list=False, raw=True, max_buffer_size=max(len(batch), 1024))
    unpacker.feed(batch[HEADER_SIZE : header.size])
    try:
        records: list[RawRecord] = list(unpacker)
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError) as exc:
        raise InvalidBatchError(
            f"malformed records in batch at {header.base_offset}: {exc}"
        ) from exc
    if len(records) != header.record_count or any(len(r) != 5 for r in records):
        raise InvalidBatchError(
            f"batch at {header.base_offset} says {header.record_count} records, "
            f"holds {len(records)}"
        )
    return records


def decode_records(batch: bytes | memoryview, header: BatchHeader | None = None) -> list[Record]:
    """Unpack the records of one batch (the consumer side; the broker never does this)."""
    if header is None:
        header = decode_header(batch)
    if batch[_MAGIC_POS] == KAFKA_MAGIC:
        base, first_ts = header.base_offset, header.first_timestamp
        return [
            Record(
                value,
                key,
                tuple((name, b"" if v is None else v) for name, v in headers) if headers else (),
                first_ts + ts_delta,
                base + delta,
            )
            for delta, ts_delta, key, value, headers in _kafka_records(batch, header)
        ]
    unpacker = msgpack.Unpacker(use_list=False, raw=False, max_buffer_size=max(len(batch), 1024))
    unpacker.feed(batch[HEADER_SIZE : header.size])
    records: list[Record] = []
    try:
        for item in unpacker:
            delta, ts_delta, key, value, headers = item
            records.append(
                Record(
                    value=value,
                    key=key,
                    headers=tuple((str(k), bytes(v)) for k, v in headers),
                    timestamp=header.first_timestamp + ts_delta,
                    offset=header.base_offset + delta,
                )
            )
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError) as exc:
        raise InvalidBatchError(
            f"malformed records in batch at {header.base_offset}: {exc}"
        ) from exc
    if len(records) != header.record_count:
        raise InvalidBatchError(
            f"batch at {header.base_offset} says {header.record_count} records, "
            f"holds {len(records)}"
        )
    return records


_HEADERS_OF = operator.itemgetter(4)


def _raw_headers(
    headers: tuple[tuple[str, bytes | None], ...],
) -> tuple[tuple[bytes, bytes], ...]:
    return tuple((name.encode(), b"" if value is None else value) for name, value in headers)


def _kafka_records(
    batch: bytes | memoryview, header: BatchHeader
) -> list[tuple[int, int, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]]:
    """A version-2 batch's records, decompressed, as Kafka's record codec reads them."""
    body = kafka_records_body(batch, header)
    try:
        return record_tuples(body, header.record_count)
    except KafkaProtocolError as exc:
        raise InvalidBatchError(
            f"malformed Kafka records in batch at {header.base_offset}: {exc}"
        ) from exc


def kafka_records_body(batch: bytes | memoryview, header: BatchHeader) -> bytes:
    """A version-2 batch's records as Kafka lays them out, decompressed: for a reader that
    walks them itself (the Spark source's compiled scanner). ``InvalidBatchError`` if they do
    not decompress."""
    try:
        return decompressed(header.attributes, batch[HEADER_SIZE : header.size])
    except KafkaProtocolError as exc:
        raise InvalidBatchError(
            f"malformed Kafka records in batch at {header.base_offset}: {exc}"
        ) from exc


def is_kafka_format(batch: bytes | memoryview) -> bool:
    """Whether the whole batch ``batch`` is version 2 (a Kafka producer's batch verbatim)."""
    return batch[_MAGIC_POS] == KAFKA_MAGIC


def from_kafka_batch(kafka: bytes | memoryview) -> bytes:
    """Our version-2 batch holding the Kafka RecordBatch v2 ``kafka`` verbatim from its
    attributes on, its CRC as ours; base offset and term 0 until a leader stamps them.

    The caller has checked ``kafka`` whole (magic 2, its CRC, its records: ``decode_header``
    checks the CRC again, and a reader of ours would refuse records that do not parse), and that
    its fields mean what ours do: a data batch whose first timestamp is its least and whose
    offset deltas count from 0.
    """
    size = len(kafka) + _SIZE_OVER_KAFKA
    prefix = bytearray(_PREFIX.pack(0, size - LENGTH_FIELD_END, 0, KAFKA_MAGIC, 0))
    crc = bytes(kafka[_KAFKA_CRC_POS:_KAFKA_PREFIX_SIZE])
    _stamp_header_crc(prefix, crc)
    return b"".join((prefix, crc, bytes((BatchType.DATA,)), kafka[_KAFKA_PREFIX_SIZE:]))


def kafka_batch_parts(
    batch: memoryview, header: BatchHeader, leader_epoch: int
) -> tuple[bytes, memoryview]:
    """The Kafka batch a version-2 ``batch`` holds, in two parts: its first 21 bytes rebuilt
    (``header``'s base offset, ``leader_epoch``, the stored CRC) and the stored rest."""
    head = _KAFKA_PREFIX.pack(
        header.base_offset,
        header.size - _SIZE_OVER_KAFKA - LENGTH_FIELD_END,
        leader_epoch,
        _KAFKA_MAGIC_VALUE,
    )
    return head + bytes(batch[_BODY_CRC_POS:_BODY_POS]), batch[_KAFKA_BODY_POS : header.size]
