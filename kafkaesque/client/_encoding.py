"""A producer's records as one record batch, encoded in a few C calls.

The layout is docs/storage-format.md's and ``kafkaesque.storage.build_batch`` is its reference
implementation; ``tests/client/test_encoding.py`` checks byte for byte that both agree. This copy
is the producer's hot path: it takes the record fields as plain tuples (no ``Record`` object per
message) and packs all the records with one msgpack call, about four times faster than
``build_batch`` for 100-byte records. Only what a producer sends is covered: a data batch with
contiguous offsets from 0, base offset and term 0 (the leader stamps them), no producer id.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import TypeAlias

import msgpack
from crc32c import crc32c

Headers: TypeAlias = tuple[tuple[str, bytes], ...]
Row: TypeAlias = tuple[int, int, bytes | None, bytes | None, Headers]
"""One record as a batch being filled holds it: ``(offset_delta, timestamp_delta, key, value,
headers)``, the timestamp delta counted from the batch's first record (``base_ts``), so that
the usual batch, whose first record is its earliest, is packed as it stands."""

_MAGIC = 1
_DATA = 0
_NONE = -1  # no producer id, epoch or sequence
_PREFIX = struct.Struct(">qiqb")  # base_offset, batch_length, term, magic
_BODY = struct.Struct(">BHiqqqhii")  # type, attributes, last delta, timestamps, pid, epoch, seq, n
_U32 = struct.Struct(">I")
_HEADER_SIZE = _PREFIX.size + 4 + 4 + _BODY.size  # prefix, header CRC, body CRC, body header: 70
_LENGTH_FIELD_END = 12  # batch_length counts the bytes after it


def _array_header_size(n: int) -> int:
    """Bytes of the msgpack array header for ``n`` items (fixarray, array 16, array 32)."""
    if n < 16:
        return 1
    return 3 if n < 1 << 16 else 5


def encode_batch(
    rows: Sequence[Row],
    base_ts: int,
    timestamps: Sequence[int],
    producer: tuple[int, int, int] = (_NONE, _NONE, _NONE),
) -> bytes:
    """The batch of ``rows`` (timestamp deltas from ``base_ts``; ``timestamps[i]`` is row i's):
    what ``build_batch`` makes of the same records, stamped with ``producer`` (id, epoch, base
    sequence) for an idempotent producer. ``ValueError`` for no rows."""
    n = len(rows)
    if n == 0 or len(timestamps) != n:
        raise ValueError("a batch needs at least one record, and one timestamp per record")
    first_ts, max_ts = min(timestamps), max(timestamps)
    if first_ts != base_ts:  # deltas count from the earliest record, which came later
        shift = base_ts - first_ts
        rows = [(i, ts + shift, key, value, hs) for i, ts, key, value, hs in rows]
    packed = msgpack.Packer(use_bin_type=True).pack(rows)
    records = memoryview(packed)[_array_header_size(n) :]  # the array's items, back to back
    body_header = _BODY.pack(_DATA, 0, n - 1, first_ts, max_ts, *producer, n)
    body_crc = _U32.pack(crc32c(records, crc32c(body_header)))
    prefix = _PREFIX.pack(0, _HEADER_SIZE + len(records) - _LENGTH_FIELD_END, 0, _MAGIC)
    header_crc = _U32.pack(crc32c(body_crc, crc32c(prefix)))
    return b"".join((prefix, header_crc, body_crc, body_header, records))
