"""The record scanner: the records of fetched batches into column buffers, compiled.

A version-1 batch body is ``record_count`` msgpack arrays ``[offset_delta, timestamp_delta, key,
value, headers]``; a version-2 one (a Kafka producer's batch stored verbatim) holds Kafka's
varint-framed records, which the caller hands over decompressed (docs/storage-format.md).
``scan`` walks either byte by byte in machine code (numba,
cached on disk after the first compilation) and writes what Arrow needs to build the columns
without one Python object per record: each record's offset and timestamp, and where its key,
value and headers lie in the payload. ``gather`` then copies the pieces of one binary column
into one contiguous buffer with its Arrow offsets.

Pure functions of arrays: no I/O, no Python objects, nothing raised from compiled code. A
malformed record returns an error code and the byte position where it was found (``ERRORS``
says what each means); the caller turns that into its own error.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

NIL = -1
"""The length recorded for a key or value that is msgpack nil (a null in Arrow)."""

OK = 0
TRUNCATED, NOT_A_RECORD, NOT_AN_INT, NOT_BYTES, BAD_HEADERS, TRAILING, TOO_BIG = range(1, 8)
ERRORS = {
    TRUNCATED: "a record runs past the end of its batch",
    NOT_A_RECORD: "a record is not an array of 5",
    NOT_AN_INT: "an offset or timestamp delta is not an integer",
    NOT_BYTES: "a key or value is neither bin nor nil",
    BAD_HEADERS: "the headers are not an array of [str, bin] pairs",
    TRAILING: "the batch holds bytes after its last record",
    TOO_BIG: "an integer does not fit in 64 bits",
}


@njit(cache=True, nogil=True)
def _int(buf: Any, p: int, end: int) -> tuple[int, int, int]:
    """The msgpack integer at ``p``: (value, next position, error code)."""
    if p >= end:
        return 0, p, TRUNCATED
    t = buf[p]
    if t <= 0x7F:
        return int(t), p + 1, OK
    if t >= 0xE0:
        return int(t) - 256, p + 1, OK
    if 0xCC <= t <= 0xCF:  # uint 8, 16, 32, 64
        width = 1 << (t - 0xCC)
        signed = False
    elif 0xD0 <= t <= 0xD3:  # int 8, 16, 32, 64
        width = 1 << (t - 0xD0)
        signed = True
    else:
        return 0, p, NOT_AN_INT
    if p + 1 + width > end:
        return 0, p, TRUNCATED
    value = np.uint64(0)
    for i in range(width):
        value = (value << np.uint64(8)) | np.uint64(buf[p + 1 + i])
    if signed:
        shift = np.uint64(64 - 8 * width)
        return int(np.int64(value << shift) >> np.int64(shift)), p + 1 + width, OK
    if value > np.uint64(0x7FFFFFFFFFFFFFFF):
        return 0, p, TOO_BIG
    return int(np.int64(value)), p + 1 + width, OK  # int() alone goes through a float


@njit(cache=True, nogil=True)
def _length(buf: Any, p: int, width: int) -> int:
    n = 0
    for i in range(width):
        n = (n << 8) | int(buf[p + i])
    return n


@njit(cache=True, nogil=True)
def _bytes(buf: Any, p: int, end: int, strings: bool) -> tuple[int, int, int, int]:
    """The msgpack bin (or, with ``strings``, str) at ``p``: (start, length, next position,
    error code); nil gives length ``NIL`` when bin is asked for."""
    if p >= end:
        return 0, 0, p, TRUNCATED
    t = buf[p]
    if strings and 0xA0 <= t <= 0xBF:
        width, n = 0, int(t) - 0xA0
    elif strings and 0xD9 <= t <= 0xDB:
        width = 1 << (t - 0xD9)
        n = -1
    elif not strings and 0xC4 <= t <= 0xC6:
        width = 1 << (t - 0xC4)
        n = -1
    elif not strings and t == 0xC0:
        return 0, NIL, p + 1, OK
    else:
        return 0, 0, p, BAD_HEADERS if strings else NOT_BYTES
    start = p + 1 + width
    if start > end:
        return 0, 0, p, TRUNCATED
    if width:
        n = _length(buf, p + 1, width)
    if start + n > end:
        return 0, 0, p, TRUNCATED
    return start, n, start + n, OK


@njit(cache=True, nogil=True)
def _array(buf: Any, p: int, end: int) -> tuple[int, int, int]:
    """The msgpack array header at ``p``: (element count, next position, error code)."""
    if p >= end:
        return 0, p, TRUNCATED
    t = buf[p]
    if 0x90 <= t <= 0x9F:
        return int(t) - 0x90, p + 1, OK
    if 0xDC <= t <= 0xDD:  # array 16, array 32
        width = 2 if t == 0xDC else 4
        if p + 1 + width > end:
            return 0, p, TRUNCATED
        return _length(buf, p + 1, width), p + 1 + width, OK
    return -1, p, OK


# Rows of the ``out`` array ``scan`` fills: one column per kept record.
OFFSET, MILLIS, KEY_START, KEY_LENGTH, VALUE_START, VALUE_LENGTH, HEADER_START, HEADER_COUNT = (
    range(8)
)
RECORD_FORMAT = 8  # the record's batch's FORMAT (how its headers are laid out)
OUT_ROWS = 9
# Columns of the ``batches`` array ``scan`` reads: one row per batch.
BODY_START, BODY_END, RECORD_COUNT, BASE_OFFSET, FIRST_TIMESTAMP, FORMAT = range(6)
MSGPACK, KAFKA = 0, 1
"""The values of ``FORMAT``: msgpack records (version 1), Kafka's records (version 2)."""


@njit(cache=True, nogil=True)
def _headers(buf: Any, p: int, end: int) -> tuple[int, int, int]:
    """Skip the header pairs at ``p``: (pair count, next position, error code)."""
    n = 0
    pairs, p, err = _array(buf, p, end)
    if err == OK and pairs < 0:
        err = BAD_HEADERS
    for _ in range(pairs if err == OK else 0):
        two, p, err = _array(buf, p, end)
        if err == OK and two != 2:
            err = BAD_HEADERS
        if err == OK:
            _start, _n, p, err = _bytes(buf, p, end, True)
        if err == OK:
            _start, n, p, err = _bytes(buf, p, end, False)
            if err == NOT_BYTES or (err == OK and n == NIL):
                err = BAD_HEADERS
        if err != OK:
            break
    return pairs, p, err


@njit(cache=True, nogil=True)
def _varint(buf: Any, p: int, end: int) -> tuple[int, int, int]:
    """Kafka's zig-zag varint at ``p``: (value, next position, error code)."""
    raw = np.uint64(0)
    shift = np.uint64(0)
    while True:
        if p >= end:
            return 0, p, TRUNCATED
        b = np.uint64(buf[p])
        p += 1
        if shift == np.uint64(63) and b & np.uint64(0x7E):
            return 0, p, TOO_BIG  # past 64 bits
        raw |= (b & np.uint64(0x7F)) << shift
        if b < np.uint64(0x80):
            break
        shift += np.uint64(7)
        if shift > np.uint64(63):
            return 0, p, TOO_BIG
    half = np.int64(raw >> np.uint64(1))
    return int(half ^ -np.int64(raw & np.uint64(1))), p, OK


@njit(cache=True, nogil=True)
def _kafka_bytes(buf: Any, p: int, end: int) -> tuple[int, int, int, int]:
    """Kafka's varint-length bytes at ``p``: (start, length (``NIL``: null), next position,
    error code)."""
    n, p, err = _varint(buf, p, end)
    if err != OK:
        return 0, 0, p, err
    if n == -1:
        return 0, NIL, p, OK
    if n < -1 or p + n > end:
        return 0, 0, p, TRUNCATED
    return p, n, p + n, OK


@njit(cache=True, nogil=True)
def _kafka_headers(buf: Any, p: int, end: int) -> tuple[int, int, int]:
    """Skip a Kafka record's headers at ``p``: (pair count, next position, error code)."""
    pairs, p, err = _varint(buf, p, end)
    if err == OK and (pairs < 0 or pairs > end - p):
        err = BAD_HEADERS
    for _ in range(pairs if err == OK else 0):
        _start, n, p, err = _kafka_bytes(buf, p, end)
        if err == OK and n == NIL:
            err = BAD_HEADERS  # a header key is never null
        if err == OK:
            _start, n, p, err = _kafka_bytes(buf, p, end)
        if err != OK:
            break
    return pairs, p, err


@njit(cache=True, nogil=True)
def _kafka_record(
    buf: Any, p: int, end: int
) -> tuple[int, int, int, int, int, int, int, int, int, int]:
    """The Kafka record at ``p``: (offset delta, timestamp delta, key start, key length, value
    start, value length, header start, header pairs, next position, error code)."""
    length, p, err = _varint(buf, p, end)
    if err == OK and (length < 2 or p + length > end):
        err = TRUNCATED
    if err != OK:
        return 0, 0, 0, 0, 0, 0, 0, 0, p, err
    stop = p + length
    p += 1  # the record's attributes (unused)
    delta = ts_delta = key_start = key_length = value_start = value_length = pairs = 0
    ts_delta, p, err = _varint(buf, p, stop)
    if err == OK:
        delta, p, err = _varint(buf, p, stop)
    if err == OK:
        key_start, key_length, p, err = _kafka_bytes(buf, p, stop)
    if err == OK:
        value_start, value_length, p, err = _kafka_bytes(buf, p, stop)
    header_start = p
    if err == OK:
        pairs, p, err = _kafka_headers(buf, p, stop)
    if err == OK and p != stop:
        err = NOT_A_RECORD
    return (
        delta,
        ts_delta,
        key_start,
        key_length,
        value_start,
        value_length,
        header_start,
        pairs,
        p,
        err,
    )


@njit(cache=True, nogil=True)
def scan(buf: Any, batches: Any, lo: int, hi: int, out: Any) -> tuple[int, int, int, int]:
    """Walk the records of each row of ``batches`` (``BODY_START`` … ``FORMAT``) in ``buf``
    and write those with offsets in ``[lo, hi)`` into the columns of ``out`` (rows ``OFFSET`` …
    ``RECORD_FORMAT``; as many columns as the batches hold records). A nil key or value has
    length ``NIL``; ``HEADER_START`` is where a record's header pairs begin.

    Returns ``(kept, error, error_position, header_pairs)``: ``error`` is ``OK`` or a key of
    ``ERRORS``, and ``header_pairs`` the kept records' header pairs in all.
    """
    kept = 0
    pairs_kept = 0
    p = 0
    for b in range(batches.shape[0]):
        p = batches[b, BODY_START]
        end = batches[b, BODY_END]
        kind = batches[b, FORMAT]
        for _ in range(batches[b, RECORD_COUNT]):
            delta = ts_delta = key_start = key_length = value_start = value_length = pairs = 0
            if kind == KAFKA:
                (
                    delta,
                    ts_delta,
                    key_start,
                    key_length,
                    value_start,
                    value_length,
                    header_start,
                    pairs,
                    p,
                    err,
                ) = _kafka_record(buf, p, end)
            else:
                fields, p, err = _array(buf, p, end)
                if err == OK and fields != 5:
                    err = NOT_A_RECORD
                if err == OK:
                    delta, p, err = _int(buf, p, end)
                if err == OK:
                    ts_delta, p, err = _int(buf, p, end)
                if err == OK:
                    key_start, key_length, p, err = _bytes(buf, p, end, False)
                if err == OK:
                    value_start, value_length, p, err = _bytes(buf, p, end, False)
                header_start = p
                if err == OK:
                    pairs, p, err = _headers(buf, p, end)
            if err != OK:
                return kept, err, p, pairs_kept
            offset = batches[b, BASE_OFFSET] + delta
            if lo <= offset < hi:
                out[OFFSET, kept] = offset
                out[MILLIS, kept] = batches[b, FIRST_TIMESTAMP] + ts_delta
                out[KEY_START, kept] = key_start
                out[KEY_LENGTH, kept] = key_length
                out[VALUE_START, kept] = value_start
                out[VALUE_LENGTH, kept] = value_length
                out[HEADER_START, kept] = header_start
                out[HEADER_COUNT, kept] = pairs
                out[RECORD_FORMAT, kept] = kind
                pairs_kept += pairs
                kept += 1
        if p != end:
            return kept, TRAILING, p, pairs_kept
    return kept, OK, p, pairs_kept


@njit(cache=True, nogil=True)
def gather(buf: Any, starts: Any, lengths: Any, n: int) -> tuple[Any, Any]:
    """The first ``n`` pieces ``buf[starts[i] : starts[i] + lengths[i]]`` back to back:
    (Arrow int32 offsets, data); a ``NIL`` piece is empty."""
    offsets = np.empty(n + 1, np.int32)
    size = 0
    offsets[0] = 0
    for i in range(n):
        if lengths[i] > 0:
            size += lengths[i]
        offsets[i + 1] = size
    data = np.empty(size, np.uint8)
    at = 0
    for i in range(n):
        length = lengths[i]
        if length > 0:
            start = starts[i]
            data[at : at + length] = buf[start : start + length]
            at += length
    return offsets, data


# Rows of the ``pieces`` array ``header_pieces`` fills: one column per header pair.
PAIR_KEY_START, PAIR_KEY_LENGTH, PAIR_VALUE_START, PAIR_VALUE_LENGTH = range(4)
PIECE_ROWS = 4


@njit(cache=True, nogil=True)
def header_pieces(buf: Any, out: Any, kept: int, pieces: Any) -> None:
    """Write where the keys and values of the header pairs of the first ``kept`` records of
    ``out`` (as ``scan`` left it, so already checked) lie into the columns of ``pieces`` (rows
    ``PAIR_KEY_START`` … ``PAIR_VALUE_LENGTH``, one column per pair, in record order). A
    Kafka header's null value is empty, as the record walk of ``kafkaesque.storage`` reads it."""
    end = len(buf)
    j = 0
    for i in range(kept):
        if out[RECORD_FORMAT, i] == KAFKA:
            _pairs, p, _err = _varint(buf, out[HEADER_START, i], end)
            for _ in range(out[HEADER_COUNT, i]):
                pieces[PAIR_KEY_START, j], pieces[PAIR_KEY_LENGTH, j], p, _err = _kafka_bytes(
                    buf, p, end
                )
                start, length, p, _err = _kafka_bytes(buf, p, end)
                pieces[PAIR_VALUE_START, j] = start
                pieces[PAIR_VALUE_LENGTH, j] = 0 if length == NIL else length
                j += 1
            continue
        _pairs, p, _err = _array(buf, out[HEADER_START, i], end)
        for _ in range(out[HEADER_COUNT, i]):
            _two, p, _err = _array(buf, p, end)
            pieces[PAIR_KEY_START, j], pieces[PAIR_KEY_LENGTH, j], p, _err = _bytes(
                buf, p, end, True
            )
            pieces[PAIR_VALUE_START, j], pieces[PAIR_VALUE_LENGTH, j], p, _err = _bytes(
                buf, p, end, False
            )
            j += 1
