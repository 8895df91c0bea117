"""Kafka's RecordBatch v2 (magic 2): decode what producers send, encode what consumers fetch.

Layout (https://kafka.apache.org/documentation/#recordbatch), big-endian: baseOffset int64,
batchLength int32 (the bytes after it), partitionLeaderEpoch int32, magic int8 = 2, crc uint32
(CRC-32C of everything after it), attributes int16 (bits 0-2 compression: none, gzip, snappy,
lz4, zstd; bit 3 log-append time; bit 4 transactional; bit 5 control), lastOffsetDelta int32,
baseTimestamp int64, maxTimestamp int64, producerId int64, producerEpoch int16, baseSequence
int32, then the record count int32 and the records (compressed together when compressed). A
record: varint length, int8 attributes, varlong timestamp delta, varint offset delta, varint
key length and key (-1: null), varint value length and value, varint header count, each a
varint-length UTF-8 key and a varint-length value (-1: null).

Compression: gzip (the standard library), snappy, lz4 and zstd (``cramjam``); a batch in an
unknown codec gets ``UnsupportedCompression``. Fetch responses are written uncompressed.

Pure; a malformed batch raises ``KafkaProtocolError``.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple

import cramjam
from crc32c import crc32c

from ._wire import KafkaProtocolError, encode_varint

_HEAD: Final = struct.Struct(">qiibIhiqqqhii")
HEAD_SIZE: Final = _HEAD.size  # 61
_CRC_POS: Final = 17
_ATTRIBUTES_POS: Final = 21
MAGIC: Final = 2
COMPRESSION_MASK: Final = 0x07
TRANSACTIONAL: Final = 0x10
CONTROL: Final = 0x20
CONTROL_KEY: Final = struct.Struct(">hh")
RAFT_CONTROL_TYPE: Final = 0x7FFF
"""The control record type of Raft's own entries (a leader's no-op, a membership change): a
type no Kafka client knows, which they skip as they skip every control batch (Java's
ControlRecordType.UNKNOWN, librdkafka's "unsupported control record")."""


class UnsupportedCompression(KafkaProtocolError):
    """A batch compressed with a codec this broker cannot read (Kafka error 76)."""


class KafkaRecord(NamedTuple):
    """One record: ``offset_delta`` from the batch's base offset, ``timestamp`` absolute.

    A NamedTuple rather than a frozen dataclass: every record a Kafka producer sends is built
    as one, and a frozen dataclass's ``__init__`` (a ``setattr`` per field) was a fifth of a
    broker's CPU under a flat-out librdkafka producer."""

    offset_delta: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()


@dataclass(frozen=True, slots=True)
class KafkaBatch:
    """A decoded RecordBatch v2."""

    base_offset: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records: tuple[KafkaRecord, ...]

    @property
    def control(self) -> bool:
        return bool(self.attributes & CONTROL)

    @property
    def transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL)


def _snappy_decompress(data: bytes) -> bytes:
    """Raw snappy (librdkafka), or the xerial framing Kafka's Java client writes: a 16-byte
    header, then blocks of an int32 size and raw snappy."""
    if not data.startswith(_XERIAL):
        return bytes(cramjam.snappy.decompress_raw(data))
    out = bytearray()
    pos = 16
    while pos < len(data):
        if pos + 4 > len(data):
            raise KafkaProtocolError("truncated xerial snappy block")
        (size,) = struct.unpack_from(">i", data, pos)
        if size < 0 or pos + 4 + size > len(data):
            raise KafkaProtocolError(f"xerial snappy block of {size} bytes does not fit")
        out += cramjam.snappy.decompress_raw(data[pos + 4 : pos + 4 + size])
        pos += 4 + size
    return bytes(out)


_XERIAL: Final = b"\x82SNAPPY\x00"


def _lz4_decompress(data: bytes) -> bytes:
    return bytes(cramjam.lz4.decompress(data))  # the LZ4 frame format (KIP-57)


def _zstd_decompress(data: bytes) -> bytes:
    return bytes(cramjam.zstd.decompress(data))


_DECOMPRESS: Final[dict[int, Callable[[bytes], bytes]]] = {
    1: gzip.decompress,
    2: _snappy_decompress,
    3: _lz4_decompress,
    4: _zstd_decompress,
}
_CODECS: Final = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}


class BatchHead(NamedTuple):
    """A RecordBatch v2's header fields (``open_batch``): a ``KafkaBatch`` without records."""

    base_offset: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int


RecordTuple = tuple[int, int, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]
"""A record as ``record_tuples`` reads it: (offset delta, timestamp delta from the batch's base
timestamp, key, value, headers), in the shape our storage packs (``storage.pack_batch``)."""


def iter_batch_bytes(data: bytes | memoryview) -> Iterator[memoryview]:
    """The batches of a Produce request's record set, in order, each whole (framing checked,
    nothing else: ``open_batch`` checks the rest)."""
    view = memoryview(data)
    pos = 0
    while pos < len(view):
        if len(view) - pos < HEAD_SIZE:
            raise KafkaProtocolError(f"truncated batch header at {pos}")
        (length,) = struct.unpack_from(">i", view, pos + 8)
        size = 12 + length
        if length < HEAD_SIZE - 12 or pos + size > len(view):
            raise KafkaProtocolError(f"batch length {length} at {pos} does not fit")
        yield view[pos : pos + size]
        pos += size


def iter_batches(data: bytes | memoryview) -> Iterator[KafkaBatch]:
    """The batches of a Produce request's record set, in order, decoded."""
    for batch in iter_batch_bytes(data):
        yield decode_batch(batch)


def open_batch(batch: bytes | memoryview) -> tuple[BatchHead, bytes]:
    """One whole batch's header, checked (magic, CRC-32C, counts), and its records' bytes,
    decompressed (``record_tuples`` reads them)."""
    (
        base_offset,
        _length,
        _epoch,
        magic,
        crc,
        attributes,
        last_delta,
        base_ts,
        max_ts,
        producer_id,
        producer_epoch,
        base_sequence,
        count,
    ) = _HEAD.unpack_from(batch, 0)
    if magic != MAGIC:
        raise KafkaProtocolError(f"record batch magic {magic}: only v2 (magic 2) is accepted")
    if crc32c(batch[_ATTRIBUTES_POS:]) != crc:
        raise KafkaProtocolError("record batch CRC mismatch")
    if count < 0 or last_delta < 0 or count > last_delta + 1:
        raise KafkaProtocolError(f"record count {count} contradicts the offset span {last_delta}")
    body = decompressed(attributes, batch[HEAD_SIZE:])
    head = BatchHead(
        base_offset,
        attributes,
        last_delta,
        base_ts,
        max_ts,
        producer_id,
        producer_epoch,
        base_sequence,
        count,
    )
    return head, body


def decompressed(attributes: int, records: bytes | memoryview) -> bytes:
    """A batch's records (the bytes after its header) as ``record_tuples`` reads them: as they
    are, or decompressed by the codec ``attributes`` name (``UnsupportedCompression`` for an
    unknown one, ``KafkaProtocolError`` for bytes that do not decompress)."""
    codec = attributes & COMPRESSION_MASK
    if not codec:
        return bytes(records)
    decompress = _DECOMPRESS.get(codec)
    if decompress is None:
        raise UnsupportedCompression(f"unknown compression codec {codec}")
    try:
        return decompress(bytes(records))
    except (OSError, EOFError, ValueError, zlib.error, cramjam.DecompressionError) as exc:
        raise KafkaProtocolError(f"{_CODECS[codec]} body does not decompress: {exc}") from None


def decode_batch(batch: bytes | memoryview) -> KafkaBatch:
    """One whole batch: header checked (magic, CRC-32C, counts), records decoded."""
    head, body = open_batch(batch)
    base_ts = head.base_timestamp
    records = tuple(
        KafkaRecord(delta, base_ts + ts_delta, key, value, headers)
        for delta, ts_delta, key, value, headers in record_tuples(body, head.record_count)
    )
    return KafkaBatch(*head[:-1], records)


def record_tuples(body: bytes, count: int) -> list[RecordTuple]:
    """The ``count`` records that are the whole of ``body`` (a batch's records, decompressed),
    as tuples (``RecordTuple``); ``KafkaProtocolError`` if they are malformed, fewer or more.

    Every record of every Produce passes here: one pass with local indexing, each varint's
    one- and two-byte forms (almost all of a record's) read inline by a table lookup, no object
    per record but its tuple, no call per field; fields that overrun their record are caught by
    the record's end check (positions only grow), and reads past ``body`` by the
    ``IndexError``. Rarer forms go through ``_varint``. (It was most of a broker's CPU under a
    flat-out Kafka producer.)"""
    end = len(body)
    pos = 0
    out: list[RecordTuple] = []
    append = out.append
    no_headers: tuple[tuple[str, bytes | None], ...] = ()
    zigzag = _ZIGZAG
    try:
        for _ in range(count):
            # The record's length.
            b = body[pos]
            if b < 0x80:
                length = zigzag[b]
                pos += 1
            elif (c := body[pos + 1]) < 0x80:
                length = zigzag[(b & 0x7F) | c << 7]
                pos += 2
            else:
                length, pos = _varint(body, pos, end)
            if length < 0 or length > end - pos:
                raise KafkaProtocolError(f"record length {length} with {end - pos} bytes left")
            stop = pos + length
            # Attributes (unused), then the timestamp delta.
            b = body[pos + 1]
            if b < 0x80:
                ts_delta = zigzag[b]
                pos += 2
            else:
                ts_delta, pos = _varint(body, pos + 1, stop)
            # The offset delta.
            b = body[pos]
            if b < 0x80:
                delta = zigzag[b]
                pos += 1
            elif (c := body[pos + 1]) < 0x80:
                delta = zigzag[(b & 0x7F) | c << 7]
                pos += 2
            else:
                delta, pos = _varint(body, pos, stop)
            # The key: null (zig-zag -1: the byte 1) or bytes.
            b = body[pos]
            if b == 1:
                key = None
                pos += 1
            else:
                key, pos = _varbytes(body, pos, stop)
            # The value.
            b = body[pos]
            if b < 0x80:
                size = zigzag[b]
                pos += 1
            elif (c := body[pos + 1]) < 0x80:
                size = zigzag[(b & 0x7F) | c << 7]
                pos += 2
            else:
                size, pos = _varint(body, pos, stop)
            if size >= 0:
                value: bytes | None = body[pos : pos + size]
                pos += size
            elif size == -1:
                value = None
            else:
                raise KafkaProtocolError(f"value length {size}")
            # The headers: almost always none (the byte 0).
            if body[pos] == 0:
                headers = no_headers
                pos += 1
            else:
                headers, pos = _headers(body, pos, stop)
            if pos != stop:
                raise KafkaProtocolError("a record's length does not match its fields")
            append((delta, ts_delta, key, value, headers))
    except IndexError:
        raise KafkaProtocolError(f"truncated records: {count} said, {len(out)} whole") from None
    if pos != end:
        raise KafkaProtocolError(f"{end - pos} bytes after the batch's {count} records")
    return out


_ZIGZAG: Final = tuple((raw >> 1) ^ -(raw & 1) for raw in range(1 << 14))
"""The value of each one- or two-byte varint's 14 bits (zig-zag decoded): one lookup."""


def _headers(body: bytes, pos: int, stop: int) -> tuple[tuple[tuple[str, bytes | None], ...], int]:
    """A record's headers at ``pos`` (their count first), and the position after them."""
    n, pos = _varint(body, pos, stop)
    if n < 0 or n > stop - pos:
        raise KafkaProtocolError(f"header count {n}")
    headers = []
    for _ in range(n):
        name, pos = _varbytes(body, pos, stop)
        if name is None:
            raise KafkaProtocolError("a header key is null")
        header_value, pos = _varbytes(body, pos, stop)
        try:
            headers.append((name.decode(), header_value))
        except UnicodeDecodeError:
            raise KafkaProtocolError("a header key is not UTF-8") from None
    return tuple(headers), pos


def _varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """The zig-zag varint at ``pos`` (before ``end``), and the position after it."""
    if pos >= end:
        raise KafkaProtocolError("truncated varint")
    byte = data[pos]
    if byte < 0x80:  # one byte: the common case
        return (byte >> 1) ^ -(byte & 1), pos + 1
    raw = byte & 0x7F
    shift = 7
    pos += 1
    while True:
        if pos >= end:
            raise KafkaProtocolError("truncated varint")
        byte = data[pos]
        pos += 1
        raw |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (raw >> 1) ^ -(raw & 1), pos
        shift += 7
        if shift > 63:
            raise KafkaProtocolError("varint longer than 10 bytes")


def _varbytes(data: bytes, pos: int, end: int) -> tuple[bytes | None, int]:
    """The varint-length bytes at ``pos`` (-1: null), and the position after them."""
    size, pos = _varint(data, pos, end)
    if size == -1:
        return None, pos
    if size < -1 or size > end - pos:
        raise KafkaProtocolError(f"length {size} runs past the end ({end - pos} left)")
    return data[pos : pos + size], pos + size


def encode_batch(
    base_offset: int,
    records: Sequence[KafkaRecord],
    *,
    last_offset_delta: int,
    leader_epoch: int = -1,
    attributes: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
) -> bytes:
    """An uncompressed RecordBatch v2 of ``records`` (their deltas and timestamps as given)."""
    base_ts = min((r.timestamp for r in records), default=-1)
    max_ts = max((r.timestamp for r in records), default=-1)
    body = bytearray()
    for r in records:
        headers = [(name.encode(), value) for name, value in r.headers]
        encode_record(body, r.timestamp - base_ts, r.offset_delta, r.key, r.value, headers)
    return frame_batch(
        base_offset,
        body,
        record_count=len(records),
        last_offset_delta=last_offset_delta,
        base_ts=base_ts,
        max_ts=max_ts,
        leader_epoch=leader_epoch,
        attributes=attributes,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
    )


def frame_batch(
    base_offset: int,
    body: bytes | bytearray,
    *,
    record_count: int,
    last_offset_delta: int,
    base_ts: int,
    max_ts: int,
    leader_epoch: int = -1,
    attributes: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
) -> bytes:
    """An uncompressed RecordBatch v2 around ``body``, ``record_count`` records that
    ``encode_record`` wrote: its header, with the CRC-32C of both."""
    head = bytearray(
        _HEAD.pack(
            base_offset,
            HEAD_SIZE - 12 + len(body),
            leader_epoch,
            MAGIC,
            0,
            attributes & ~COMPRESSION_MASK,
            last_offset_delta,
            base_ts,
            max_ts,
            producer_id,
            producer_epoch,
            base_sequence,
            record_count,
        )
    )
    crc = crc32c(body, crc32c(head[_ATTRIBUTES_POS:]))
    struct.pack_into(">I", head, _CRC_POS, crc)
    head += body
    return bytes(head)


def encode_record(
    out: bytearray,
    timestamp_delta: int,
    offset_delta: int,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[bytes, bytes | None]],
) -> None:
    """Append one record of a RecordBatch v2 to ``out`` (header names already UTF-8)."""
    # The parts first, then their size in front: no record-sized buffer built and copied.
    parts = [encode_varint(timestamp_delta), encode_varint(offset_delta)]
    if key is None:
        parts.append(_NULL_LENGTH)
    else:
        parts += (encode_varint(len(key)), key)
    if value is None:
        parts.append(_NULL_LENGTH)
    else:
        parts += (encode_varint(len(value)), value)
    parts.append(encode_varint(len(headers)))
    for name, header in headers:
        parts += (encode_varint(len(name)), name)
        if header is None:
            parts.append(_NULL_LENGTH)
        else:
            parts += (encode_varint(len(header)), header)
    out += encode_varint(1 + sum(map(len, parts)))
    out.append(0)  # attributes
    for part in parts:
        out += part


_NULL_LENGTH: Final = encode_varint(-1)


def control_batch(base_offset: int, last_offset_delta: int, timestamp: int, epoch: int) -> bytes:
    """A control batch standing for one of Raft's own entries over its offsets."""
    record = KafkaRecord(0, timestamp, CONTROL_KEY.pack(0, RAFT_CONTROL_TYPE), b"")
    return encode_batch(
        base_offset,
        [record],
        last_offset_delta=last_offset_delta,
        leader_epoch=epoch,
        attributes=CONTROL,
    )


__all__ = [
    "BatchHead",
    "KafkaBatch",
    "KafkaRecord",
    "UnsupportedCompression",
    "control_batch",
    "decode_batch",
    "decompressed",
    "encode_batch",
    "encode_record",
    "frame_batch",
    "iter_batch_bytes",
    "iter_batches",
    "open_batch",
    "record_tuples",
    "RecordTuple",
]
