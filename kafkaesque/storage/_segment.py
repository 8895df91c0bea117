"""One segment of a partition log: ``<base>.log`` (batches), ``<base>.index`` (sparse offset
index), ``<base>.timeindex`` (sparse time index).

Files are named by their base offset zero-padded to 20 digits, so ``ls`` sorts them. A segment is
either *active* (the last one; appended to, scanned and validated on recovery) or *sealed*
(fsynced when it was rolled, trusted on open, its index loaded only when first read).

The active segment's file is *preallocated*: it is extended ahead of the appends in chunks
(``posix_fallocate``), so its length is not the data's end and the tail past the last batch
reads as zeros. An append then writes into blocks the file already has, and the fsync that
makes it durable has no file size or block allocation to journal: on ext4 that costs about a
third less CPU and time per fsync (``bench.write_path`` prints both, ``fsync_cpu_us`` and
``append_fsync_cpu_us``), as for etcd's preallocated WAL. Recovery takes a zero tail for the
unwritten space it is; sealing and closing cut the file to its data.

Every byte is CRC-checked once per process before it is served: appends are validated before
they are written, recovery validates the active segment, and a read verifies what no earlier
read (or append) verified. A bit flip in a sealed segment therefore surfaces as
``CorruptLogError`` naming the file and position, never as garbage handed to a consumer; a
flip that strikes the disk after this process verified those bytes is found by
``PartitionLog.verify`` (a scrub) or the next process.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from ._batch import (
    HEADER_SIZE,
    LENGTH_FIELD_END,
    BatchType,
    data_records,
    decode_header,
    peek_size,
)
from ._errors import CorruptLogError, InvalidBatchError
from ._index import OffsetIndex
from ._time_index import TimeIndex

log = logging.getLogger("kafkaesque.storage")

# Buffers one pwritev may take (POSIX guarantees 16; Linux takes 1024): callers stay below.
IOV_MAX = max(16, min(os.sysconf("SC_IOV_MAX"), 1024))
# The header fields a forward scan needs: base offset, length, and the last offset delta.
_SCAN = struct.Struct(">qi")
_SCAN_LAST_DELTA = struct.Struct(">i")
_LAST_DELTA_POS = 32
_SCAN_BYTES = _LAST_DELTA_POS + 4
_TIMESTAMPS = struct.Struct(">qq")  # first, max
_TIMESTAMPS_POS = 36
# Preallocation of the active segment: each extension is the data so far, within these bounds
# (a segment of a busy partition grows in few, large steps; an idle one holds 64 KiB).
PREALLOCATE_MIN = 64 * 1024
PREALLOCATE_MAX = 4 * 1024 * 1024


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}"


class BatchWrite(NamedTuple):
    """A checked batch on its way into a segment: its bytes (in consecutive parts) and facts."""

    parts: tuple[bytes | memoryview, ...]
    base: int
    last: int
    term: int
    size: int
    max_timestamp: int


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What recovery of the active segment cut off, if anything."""

    path: str
    valid_bytes: int
    truncated_bytes: int
    first_lost_offset: int  # the offset the cut batch would have started at
    reason: str
    torn: bool  # True: an incomplete last write; False: a bad batch with data after it


@dataclass(frozen=True, slots=True)
class _Scan:
    """Batches found by a scan of a segment's file."""

    valid_bytes: int
    next_offset: int | None
    max_timestamp: int
    terms: list[tuple[int, int]]  # (term, first offset) in file order
    error: str | None


class Segment:
    """A segment's files and the in-memory facts about them. Not thread-safe."""

    def __init__(
        self,
        directory: str,
        base_offset: int,
        *,
        index_interval_bytes: int,
        size: int,
        next_offset: int,
        sealed: bool,
    ) -> None:
        self.base_offset = base_offset
        self.log_path = os.path.join(directory, segment_name(base_offset) + ".log")
        self.index_path = os.path.join(directory, segment_name(base_offset) + ".index")
        self.time_index_path = os.path.join(directory, segment_name(base_offset) + ".timeindex")
        self._interval = index_interval_bytes
        # Invariant: every byte below size is whole, valid batches; a sealed segment's file is
        # exactly that long, an active one's may run on with preallocated zeros to _allocated.
        self.size = size
        self._allocated = size
        # The offset after this segment's last batch (for a sealed segment: the next base).
        self.next_offset = next_offset
        self.sealed = sealed
        self.max_timestamp: int | None = None
        self.first_append_ms: float | None = None
        self._index: OffsetIndex | None = None
        # Invariant: when set, it has seen every batch of the segment (its max_so_far is the
        # segment's max timestamp); a sealed segment's ends with an entry at ``size``.
        self._time_index: TimeIndex | None = None
        self._fd: int | None = None
        # Invariant: every batch below this position passed both CRCs in this process.
        self._verified = 0

    # -- opening -----------------------------------------------------------------------------

    @classmethod
    def create(cls, directory: str, base_offset: int, index_interval_bytes: int) -> Segment:
        seg = cls(
            directory,
            base_offset,
            index_interval_bytes=index_interval_bytes,
            size=0,
            next_offset=base_offset,
            sealed=False,
        )
        seg._fd = os.open(seg.log_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        seg._index = OffsetIndex(seg.index_path, base_offset, index_interval_bytes)
        seg._index.rewrite()
        seg._time_index = TimeIndex(seg.time_index_path, base_offset, index_interval_bytes)
        seg._time_index.rewrite()
        seg.max_timestamp = 0
        return seg

    @classmethod
    def open_sealed(
        cls, directory: str, base_offset: int, next_offset: int, index_interval_bytes: int
    ) -> Segment:
        """Open a sealed segment without reading it (its contents are trusted)."""
        path = os.path.join(directory, segment_name(base_offset) + ".log")
        return cls(
            directory,
            base_offset,
            index_interval_bytes=index_interval_bytes,
            size=os.stat(path).st_size,
            next_offset=next_offset,
            sealed=True,
        )

    @classmethod
    def recover_active(
        cls, directory: str, base_offset: int, index_interval_bytes: int
    ) -> tuple[Segment, RecoveryReport | None, list[tuple[int, int]]]:
        """Open the active segment, validating every batch and cutting a bad tail.

        Returns the segment, a report if bytes were cut, and the (term, first offset) pairs of
        the batches that remain (to reconcile the term table).
        """
        seg = cls(
            directory,
            base_offset,
            index_interval_bytes=index_interval_bytes,
            size=0,
            next_offset=base_offset,
            sealed=False,
        )
        seg._fd = os.open(seg.log_path, os.O_RDWR | os.O_CREAT, 0o644)
        file_size = os.fstat(seg._fd).st_size
        data = os.pread(seg._fd, file_size, 0) if file_size else b""
        index = OffsetIndex(seg.index_path, base_offset, index_interval_bytes)
        time_index = TimeIndex(seg.time_index_path, base_offset, index_interval_bytes)
        scan = _scan(memoryview(data), base_offset, index, time_index)
        # Zeros after the last batch are preallocated space nothing was written to (or nothing
        # reached the disk in): not a cut. Only what was written past the valid batches is.
        data_end = _data_end(data, scan.valid_bytes)
        report = None
        if scan.valid_bytes < data_end:
            rest = data_end - scan.valid_bytes
            torn = _looks_torn(data, scan.valid_bytes, data_end)
            report = RecoveryReport(
                path=seg.log_path,
                valid_bytes=scan.valid_bytes,
                truncated_bytes=rest,
                first_lost_offset=scan.next_offset if scan.next_offset is not None else base_offset,
                reason=scan.error or "trailing bytes",
                torn=torn,
            )
            log.warning(
                "%s: cut %d bytes at byte %d (offset %d): %s (%s)",
                seg.log_path,
                rest,
                scan.valid_bytes,
                report.first_lost_offset,
                report.reason,
                "torn write" if torn else "CORRUPTION: valid-looking data followed the bad batch",
            )
            os.ftruncate(seg._fd, scan.valid_bytes)
            os.fsync(seg._fd)
            file_size = scan.valid_bytes
        seg.size = seg._verified = scan.valid_bytes
        seg._allocated = file_size
        seg.next_offset = scan.next_offset if scan.next_offset is not None else base_offset
        seg.max_timestamp = scan.max_timestamp
        index.rewrite()
        seg._index = index
        time_index.rewrite()
        seg._time_index = time_index
        return seg, report, scan.terms

    # -- the index ----------------------------------------------------------------------------

    def _loaded_index(self) -> OffsetIndex:
        if self._index is None:
            index = OffsetIndex.load(self.index_path, self.base_offset, self._interval, self.size)
            last = index.last_entry()
            if (last is None and self.size > 0) or (last is not None and last[1] >= self.size):
                # Missing or stale (derived data): rebuild it from the log, headers only.
                index = OffsetIndex(self.index_path, self.base_offset, self._interval)
                self._scan_headers(index)
                index.rewrite()
            self._index = index
        return self._index

    def _scan_headers(self, index: OffsetIndex, time_index: TimeIndex | None = None) -> int:
        """Walk the headers of a trusted segment, filling ``index`` (and ``time_index`` if
        given); return the max timestamp."""
        fd = self._read_fd()
        pos, max_ts = 0, 0
        while pos < self.size:
            head = os.pread(fd, HEADER_SIZE, pos)
            if len(head) < HEADER_SIZE:
                raise CorruptLogError(self.log_path, pos, "segment ends inside a batch header")
            base, length = _SCAN.unpack_from(head)
            size = LENGTH_FIELD_END + length
            if size < HEADER_SIZE or pos + size > self.size:
                raise CorruptLogError(self.log_path, pos, f"batch length {length} does not fit")
            index.maybe_add(base, pos, size)
            batch_max = _TIMESTAMPS.unpack_from(head, _TIMESTAMPS_POS)[1]
            if time_index is not None:
                time_index.maybe_add(base, pos, size, batch_max)
            max_ts = max(max_ts, batch_max)
            pos += size
        return max_ts

    def _loaded_time_index(self) -> TimeIndex:
        """The time index, loaded (or rebuilt from the headers if missing or not fitting).

        Only a sealed segment's is ever loaded: the active segment's is built by ``create``,
        recovery and truncation, and kept in memory.
        """
        if self._time_index is None:
            path, base, size = self.time_index_path, self.base_offset, self.size
            index = TimeIndex.load(path, base, self._interval, size)
            end = None if index is None else index.sealed_max_timestamp(size, self.next_offset)
            if index is None or (size > 0 and end is None):
                index = self._rebuild_time_index()
            self._time_index = index
        return self._time_index

    def _rebuild_time_index(self) -> TimeIndex:
        """Build the time index anew from the batch headers (derived data) and write it."""
        index = TimeIndex(self.time_index_path, self.base_offset, self._interval)
        scratch = OffsetIndex(self.index_path, self.base_offset, self._interval)
        max_ts = self._scan_headers(scratch, index)
        if self.sealed:
            index.seal(self.next_offset, self.size)
        index.rewrite()
        if self.max_timestamp is None:
            self.max_timestamp = max_ts
        return index

    def sealed_max_timestamp(self) -> int:
        """The largest batch timestamp in the segment (read once, then cached)."""
        if self.max_timestamp is None:
            # The sealed time index ends with the segment's max timestamp: no walk of the log.
            self.max_timestamp = max(self._loaded_time_index().max_so_far, 0)
        return self.max_timestamp

    def retention_timestamp(self) -> float:
        """The time (ms since the epoch) time retention ages this sealed segment from: its max
        record timestamp, or, when no batch carries one (only a new leader's no-op or a
        configuration change, whose control batches have timestamp 0), the time its file was
        last written, as Kafka's ``LogSegment.largestTimestamp`` does. Without that rule such a
        segment would look 56 years old and go at the first retention check."""
        max_ts = self.sealed_max_timestamp()
        return max_ts if max_ts > 0 else os.stat(self.log_path).st_mtime * 1000

    # -- I/O ----------------------------------------------------------------------------------

    def _read_fd(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.log_path, os.O_RDONLY)
        return self._fd

    def append(self, batches: Sequence[BatchWrite], now_ms: float) -> None:
        """Write checked batches, in order, at the end of the segment: one ``pwritev`` for all.

        The caller keeps the run within the segment's size and ``IOV_MAX`` buffers in all.
        """
        if self.sealed or self._fd is None:
            raise AssertionError(f"append to sealed segment {self.log_path}")
        parts: list[bytes | memoryview] = []
        size = 0
        for batch in batches:
            parts.extend(batch.parts)
            size += batch.size
        try:
            if self.size + size > self._allocated:
                self._preallocate(self.size + size)
            _write_fully(self._fd, parts, self.size, size)
        except OSError:
            # Disk full or an I/O error: cut the file back so it holds only whole batches.
            os.ftruncate(self._fd, self.size)
            self._allocated = self.size
            raise
        index = self._index if self._index is not None else self._loaded_index()
        time_index = self._time_index if self._time_index is not None else self._loaded_time_index()
        pos = self.size
        max_timestamp = self.max_timestamp
        for batch in batches:
            index.maybe_add(batch.base, pos, batch.size)
            time_index.maybe_add(batch.base, pos, batch.size, batch.max_timestamp)
            pos += batch.size
            if max_timestamp is None or batch.max_timestamp > max_timestamp:
                max_timestamp = batch.max_timestamp
        if self._verified == self.size:  # the caller validated the batches before writing them
            self._verified += size
        self.size += size
        self.next_offset = batches[-1].last + 1
        self.max_timestamp = max_timestamp
        if self.first_append_ms is None:
            self.first_append_ms = now_ms

    def _preallocate(self, end: int) -> None:
        """Extend the file past ``end`` by a chunk of zeros (see the module docstring)."""
        assert self._fd is not None
        chunk = min(max(self.size, PREALLOCATE_MIN), PREALLOCATE_MAX)
        try:
            os.posix_fallocate(self._fd, self._allocated, end + chunk - self._allocated)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            # A full disk refuses the chunk, not necessarily the write: it may still fit (if
            # not, ``append`` cuts the file back to its data).
            self._allocated = end
            return
        self._allocated = end + chunk

    def locate(self, offset: int) -> int | None:
        """Position of the first batch whose last offset is >= ``offset``; None past the end."""
        fd = self._read_fd()
        pos = self._loaded_index().lookup(offset)
        while pos < self.size:
            head = os.pread(fd, _SCAN_BYTES, pos)
            if len(head) < _SCAN_BYTES:
                raise CorruptLogError(self.log_path, pos, "segment ends inside a batch header")
            base, length = _SCAN.unpack_from(head)
            (last_delta,) = _SCAN_LAST_DELTA.unpack_from(head, _LAST_DELTA_POS)
            if base + last_delta >= offset:
                return pos
            size = LENGTH_FIELD_END + length
            if size < HEADER_SIZE:
                raise CorruptLogError(self.log_path, pos, f"batch length {length} is too short")
            pos += size
        return None

    def offset_for_time(
        self, timestamp: int, max_offset: int | None, *, verify: bool
    ) -> int | None:
        """The offset of the first data record at or after which a record's timestamp reaches
        ``timestamp``: the earliest record whose timestamp is >= it. None if no record of the
        segment below ``max_offset`` (if given) has one.

        Timestamps need not increase: the time index (maxima so far) narrows the search to one
        index interval, whose batches are then walked by their headers; only a batch whose max
        timestamp reaches ``timestamp`` is read and decoded. (A compacted batch keeps its max
        timestamp though the record that had it may be gone: the walk then goes on.) Raises
        ``CorruptLogError`` if a batch read fails its checksums.
        """
        time_index = self._loaded_time_index()
        if time_index.max_so_far < timestamp:
            return None  # the common skip of an older segment: no read at all
        fd = self._read_fd()
        pos, offset, _ = time_index.lookup(timestamp)
        if pos > 0 and pos < self.size:
            head = os.pread(fd, _SCAN_BYTES, pos)
            if len(head) < _SCAN_BYTES or _SCAN.unpack_from(head)[0] != offset:
                # An index that does not fit its log (damaged, derived data): rebuild it.
                log.warning("%s: time index does not fit the log: rebuilt", self.time_index_path)
                self._time_index = time_index = self._rebuild_time_index()
                pos, offset, _ = time_index.lookup(timestamp)
        while pos < self.size:
            head = os.pread(fd, HEADER_SIZE, pos)
            if len(head) < HEADER_SIZE:
                raise CorruptLogError(self.log_path, pos, "segment ends inside a batch header")
            try:
                header = decode_header(head, verify=False)
                if max_offset is not None and header.base_offset >= max_offset:
                    return None
                if header.batch_type is BatchType.DATA and header.max_timestamp >= timestamp:
                    data, _ = self.read(pos, header.size, None, verify=verify)
                    for record in data_records(data):  # one batch; CRCs checked even without verify
                        if max_offset is not None and record.offset >= max_offset:
                            return None
                        if record.timestamp >= timestamp:
                            return record.offset
            except InvalidBatchError as exc:
                raise CorruptLogError(self.log_path, pos, str(exc)) from exc
            pos += header.size
        return None

    def read(
        self,
        position: int,
        max_bytes: int,
        max_offset: int | None,
        *,
        verify: bool,
        recheck: bool = False,
    ) -> tuple[bytes | memoryview, int | None]:
        """Whole batches from ``position``: at most ``max_bytes`` unless the first batch is larger.

        Only batches whose last offset is below ``max_offset`` (if given) are returned. Returns
        the bytes and the offset after the last batch returned (None if nothing was returned).
        With ``verify`` every batch not yet verified in this process is CRC-checked, with
        ``recheck`` every batch read. Raises ``CorruptLogError`` (with the batch's position).
        """
        fd = self._read_fd()
        want = min(max(max_bytes, HEADER_SIZE), self.size - position)
        data = os.pread(fd, want, position)
        first_size = peek_size(data)
        if first_size is None or first_size > self.size - position:
            raise CorruptLogError(self.log_path, position, "batch runs past the segment end")
        if first_size > len(data):
            # The first batch is larger than max_bytes: return it whole so readers progress.
            data = os.pread(fd, first_size, position)
        view = memoryview(data)
        end, next_offset = 0, None
        while len(view) - end >= HEADER_SIZE:
            size = peek_size(view, end)
            if size is not None and size > len(view) - end:
                break  # the budget ends inside this batch
            if max_offset is not None:
                # Before the checksum: a batch past the bound is not ours to check (a bad one
                # there must not fail a read of what comes before it).
                base = _SCAN.unpack_from(view, end)[0]
                if (
                    base + _SCAN_LAST_DELTA.unpack_from(view, end + _LAST_DELTA_POS)[0]
                    >= max_offset
                ):
                    break
            try:
                check = verify and (recheck or position + end >= self._verified)
                header = decode_header(view, end, verify=check)
            except InvalidBatchError as exc:
                raise CorruptLogError(self.log_path, position + end, str(exc)) from exc
            if max_offset is not None and header.last_offset >= max_offset:
                break
            end += header.size
            next_offset = header.next_offset
        if verify and position <= self._verified < position + end:
            self._verified = position + end
        # A view, not a slice: copying a megabyte to drop a partial last batch costs as much
        # as reading it.
        return (data if end == len(data) else view[:end]), next_offset

    def scrub(self) -> None:
        """Re-verify every batch of the segment; ``CorruptLogError`` at the first bad one."""
        self._verified = 0
        if self.size:
            self.read(0, self.size, None, verify=True)

    def verify_chunk(self, position: int, max_bytes: int) -> int:
        """Re-verify the whole batches from ``position`` within about ``max_bytes`` (at least
        one); return the position after them. A scrub's step: whatever earlier reads checked,
        these bytes are read from the file and checked again.

        Raises ``CorruptLogError`` at the first batch that fails.
        """
        if position >= self.size:
            return self.size
        data, _ = self.read(position, max_bytes, None, verify=True, recheck=True)
        return position + len(data)

    def scan_all(self) -> tuple[_Scan, OffsetIndex]:
        """Read the whole file and check every batch, as recovery checks the active segment.

        Returns the scan (``error`` is None when every batch is valid) and an index of the
        valid prefix, for ``cut_after_scan``.
        """
        data = os.pread(self._read_fd(), self.size, 0) if self.size else b""
        index = OffsetIndex(self.index_path, self.base_offset, self._interval)
        scan = _scan(memoryview(data), self.base_offset, index)
        if scan.error is None and scan.valid_bytes < self.size:
            scan = _Scan(
                scan.valid_bytes, scan.next_offset, scan.max_timestamp, scan.terms, "short read"
            )
        return scan, index

    def cut_after_scan(self, scan: _Scan, index: OffsetIndex) -> None:
        """Keep only the valid prefix ``scan`` found; the segment becomes the active one.

        The caller deleted every later segment first. The index is the one the scan rebuilt
        from the valid prefix, so a header garbled by the fault is never trusted. Durable on
        return.
        """
        if self._fd is not None:
            os.close(self._fd)
        self._fd = os.open(self.log_path, os.O_RDWR)
        os.ftruncate(self._fd, scan.valid_bytes)
        os.fsync(self._fd)
        self.size = self._verified = self._allocated = scan.valid_bytes
        self.next_offset = scan.next_offset if scan.next_offset is not None else self.base_offset
        self.max_timestamp = scan.max_timestamp
        index.rewrite()
        self._index = index
        # The valid prefix was just checked whole: its headers are trusted for the time index.
        time_index = TimeIndex(self.time_index_path, self.base_offset, self._interval)
        scratch = OffsetIndex(self.index_path, self.base_offset, self._interval)
        self._scan_headers(scratch, time_index)
        time_index.rewrite()
        self._time_index = time_index
        self.sealed = False

    def truncate_to(self, offset: int) -> None:
        """Cut the segment so that it ends just before ``offset`` (a batch boundary or the end)."""
        if offset >= self.next_offset:
            return
        pos = self.locate(offset)
        if pos is None:
            return
        head = os.pread(self._read_fd(), _SCAN_BYTES, pos)
        base, _ = _SCAN.unpack_from(head)
        if base < offset:
            raise ValueError(f"offset {offset} is inside the batch that starts at {base}")
        if self.sealed or self._fd is None:
            raise AssertionError("truncate a sealed segment: unseal it first")
        os.ftruncate(self._fd, pos)
        self.size = self._allocated = pos
        self._verified = min(self._verified, pos)
        self.next_offset = max(offset, self.base_offset)
        index = self._loaded_index()
        index.truncate_to_position(pos)
        scratch = OffsetIndex(self.index_path, self.base_offset, self._interval)
        # The time index is rebuilt by the same walk: its entries hold maxima of what was cut.
        time_index = TimeIndex(self.time_index_path, self.base_offset, self._interval)
        self.max_timestamp = self._scan_headers(scratch, time_index)
        time_index.rewrite()
        self._time_index = time_index

    def unseal(self) -> None:
        """Make a sealed segment active again (truncation removed everything after it)."""
        if self._fd is not None:
            os.close(self._fd)
        self._fd = os.open(self.log_path, os.O_RDWR)
        self._loaded_index()
        # A sealed index ends with an entry at the segment's end: a true entry (nothing before
        # it is newer), so appends go on after it.
        self._loaded_time_index()
        if self.max_timestamp is None:
            self.sealed_max_timestamp()
        self.sealed = False

    def seal(self) -> None:
        """Flush the index and make the segment durable; it is read-only from now on."""
        if self.sealed:
            return
        index = self._loaded_index()
        index.flush()
        time_index = self._loaded_time_index()
        time_index.seal(self.next_offset, self.size)
        time_index.flush()
        if self._fd is not None:
            self._trim()
            os.fsync(self._fd)
        for path in (self.index_path, self.time_index_path):
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        self.sealed = True

    def _trim(self) -> None:
        """Cut the preallocated tail: the file ends where the data does."""
        if self._fd is not None and self._allocated > self.size:
            os.ftruncate(self._fd, self.size)
            self._allocated = self.size

    def sync(self) -> None:
        """Make the log file's data durable (the index is derived and rebuilt on recovery).

        ``fdatasync``: with the file preallocated there is no metadata a read needs to journal.
        """
        if self._fd is not None:
            os.fdatasync(self._fd)

    def dup_fd(self) -> int:
        """A duplicate of the write descriptor, so a worker thread can fsync it safely."""
        if self._fd is None:
            raise AssertionError("segment has no open descriptor")
        return os.dup(self._fd)

    def flush_index(self) -> None:
        if self._index is not None:
            self._index.flush()
        if self._time_index is not None:
            self._time_index.flush()

    def close(self) -> None:
        self.flush_index()
        if self._fd is not None:
            if not self.sealed:
                self._trim()
            os.close(self._fd)
            self._fd = None

    def abandon(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def delete(self) -> None:
        self.close()
        for path in (self.index_path, self.time_index_path, self.log_path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def replace_contents(self, cleaned_path: str) -> None:
        """Swap in a rewritten (compacted) log file for this sealed segment."""
        self.close()
        self._index = None
        self._time_index = None
        # The indexes go first: a crash between the two steps leaves a log with no index,
        # which is rebuilt on first read, never a stale index over a new log.
        for path in (self.index_path, self.time_index_path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        os.replace(cleaned_path, self.log_path)
        self.size = os.stat(self.log_path).st_size
        self._verified = 0
        self.max_timestamp = None
        index = self._loaded_index()
        index.rewrite()
        self._loaded_time_index()


def _scan(
    data: memoryview, base_offset: int, index: OffsetIndex, time_index: TimeIndex | None = None
) -> _Scan:
    """Validate consecutive batches from the start of ``data``; stop at the first bad one."""
    pos, next_offset, max_ts = 0, None, 0
    terms: list[tuple[int, int]] = []
    expected = base_offset
    error = None
    while pos < len(data):
        try:
            header = decode_header(data, pos, verify=True)
        except InvalidBatchError as exc:
            error = str(exc)
            break
        if header.base_offset < expected:
            error = f"batch base offset {header.base_offset} is below the expected {expected}"
            break
        index.maybe_add(header.base_offset, pos, header.size)
        if time_index is not None:
            time_index.maybe_add(header.base_offset, pos, header.size, header.max_timestamp)
        if not terms or header.term != terms[-1][0]:
            terms.append((header.term, header.base_offset))
        pos += header.size
        next_offset = expected = header.next_offset
        max_ts = max(max_ts, header.max_timestamp)
    return _Scan(pos, next_offset, max_ts, terms, error)


def _write_fully(fd: int, parts: list[bytes | memoryview], position: int, size: int) -> None:
    """``pwritev`` all of ``parts`` at ``position``, going on after a short write.

    POSIX lets a write stop early without an error, and a group write of megabytes sometimes
    does (seen in the Raft benchmark); only a write that makes no progress is a failure. Raises
    ``OSError`` then, or whatever ``pwritev`` raises (ENOSPC, EIO).
    """
    written = os.pwritev(fd, parts, position)
    while written < size:
        rest = _skip(parts, written)
        more = os.pwritev(fd, rest, position + written)
        if more <= 0:
            raise OSError(errno.ENOSPC, f"no progress writing at byte {position + written}")
        written += more


def _skip(parts: list[bytes | memoryview], count: int) -> list[bytes | memoryview]:
    """``parts`` without their first ``count`` bytes."""
    for i, part in enumerate(parts):
        if count < len(part):
            return [memoryview(part)[count:], *parts[i + 1 :]]
        count -= len(part)
    return []


def segment_data_end(path: str) -> int:
    """Where the data of the segment file at ``path`` ends: after its valid batches, before
    the preallocated zeros an active segment's file runs on with (or garbage a crash left).

    For tools and tests that damage or inspect a segment's tail; a log never needs it.
    """
    with open(path, "rb") as f:
        data = f.read()
    name = os.path.basename(path).removesuffix(".log")
    base = int(name) if name.isdigit() else 0
    index = OffsetIndex(path + ".scratch-index", base, 1 << 30)  # in memory, never written
    return _scan(memoryview(data), base, index).valid_bytes


def _data_end(data: bytes, start: int) -> int:
    """The position after the last non-zero byte of ``data`` at or after ``start`` (else
    ``start``): the end of what was written into a preallocated file."""
    end = len(data)
    step = 1 << 16
    while end > start:
        low = max(start, end - step)
        chunk = data[low:end]
        if chunk.count(0) != len(chunk):
            return low + len(chunk.rstrip(b"\0"))
        end = low
    return start


def _looks_torn(data: bytes, pos: int, data_end: int) -> bool:
    """True if the bad batch at ``pos`` claims to run past ``data_end``, the end of what was
    written: a torn write (its tail never reached the file)."""
    if data_end - pos < LENGTH_FIELD_END:
        return True
    length: int = struct.unpack_from(">i", data, pos + 8)[0]
    return pos + LENGTH_FIELD_END + length > data_end
