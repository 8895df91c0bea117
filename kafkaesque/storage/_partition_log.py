"""``PartitionLog``: one partition's log on disk, a directory of segments (the Raft log).

The directory holds ``<base>.log`` / ``<base>.index`` / ``<base>.timeindex`` per segment, the
term table (``term-starts``) and a ``.lock``. Offsets only increase and may have gaps (a
truncation to an offset inside a gap, compacted records); every offset belongs to at most one
batch, and batches are contiguous in the order they were appended.

Durability contract (docs/storage-format.md, "Durability"):

* ``append`` writes to the file (the page cache) and never fsyncs.
* ``flush`` (or a ``FlushTicket`` run on a worker thread) fsyncs the active segment; one flush
  after many appends is the group commit. ``durable_end_offset`` is the end of what may be
  acknowledged under the configured ``FsyncPolicy``:

  - ``ALWAYS`` (default): only flushed data. An acknowledged batch survives power loss.
  - ``INTERVAL``: everything written; flushed once ``fsync_interval_ms`` has passed
    (``flush_due``: the Raft driver runs that flush on its worker; ``maybe_flush`` here).
    Survives a crash of the process (kill -9); power loss may lose the last interval.
  - ``NEVER``: everything written; flushed only on roll and close. Survives kill -9 only.

* Rolling a segment always fsyncs it, so sealed segments are durable and trusted on open.
* Recovery validates only the active segment, so reopening costs the same for 200 MB or 2 GB.

Corruption (docs/storage-format.md, "Corruption and repair"): every flush also records the
flushed end (a watermark in the ``.lock`` file). A log that opens below it, or whose sealed
segment fails a read or a ``scrub_step`` (``CorruptLogError``, then ``repair_corruption`` cuts
before the bad batch), lost data it may have acknowledged: ``lost_end_offset`` says how far, and
stays set, durably, until the log is flushed up to there again (re-replicated).

Not thread-safe: one owner (task) calls everything, except ``FlushTicket.run``.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from bisect import bisect_right
from collections.abc import Callable, Iterable

from ._batch import BatchHeader, decode_header, stamped_prefix
from ._cleaner import CompactionResult, compact, expired_segments
from ._errors import CorruptLogError, InvalidBatchError, OffsetOutOfRangeError, StorageError
from ._recovery import LOCK_FILE, LossRecord, Scrubber, find_repair, load_segments, verify_segments
from ._segment import IOV_MAX, BatchWrite, RecoveryReport, Segment
from ._statefile import fsync_directory, makedirs_durable
from ._term_table import TermTable
from ._types import AppendResult, CheckedBatch, FlushTicket, FsyncPolicy, LogConfig, ReadResult

log = logging.getLogger("kafkaesque.storage")

_STAMP_END = 25  # bytes [0, 25) are rewritten when a leader stamps offset and term


def _tail(batch: bytes | memoryview) -> memoryview:
    """The part of a batch that stamping leaves alone (a view: never copied)."""
    return memoryview(batch)[_STAMP_END:]


def wall_clock_ms() -> float:
    return time.time() * 1000.0


class PartitionLog:
    """A partition's log: append, read, truncate, roll, retention, compaction, recovery.

    The log keeps its segments, their base offsets and the term table; the cleaner
    (``_cleaner``: retention, compaction) and recovery (``_recovery``: loading, the watermark
    and lost end, scrub, repair) work on the segments it hands them, and the log applies what
    they decide to its own bookkeeping.
    """

    def __init__(
        self,
        directory: str,
        config: LogConfig,
        clock: Callable[[], float],
        segments: list[Segment],
        terms: TermTable,
        lock_fd: int,
        recovery: RecoveryReport | None,
    ) -> None:
        self.directory = directory
        self.config = config
        self._clock = clock
        # Invariant: base offsets strictly increase; only the last segment is unsealed.
        self._segments = segments
        self._bases = [s.base_offset for s in segments]
        self._terms = terms
        self._lock_fd = lock_fd
        #: What recovery cut from the active segment when the log was opened (None: nothing).
        self.recovery = recovery
        self._generation = 0  # bumped by truncate/reset: outstanding flush tickets go stale
        self._flushed_end = self.log_end_offset  # recovery fsynced what it kept
        # The flushed-end watermark, the lost end and the corruption count.
        self._losses = LossRecord(directory, lock_fd)
        self._scrubber = Scrubber()
        self._last_flush_ms = clock()
        self._closed = False

    # -- opening and closing -----------------------------------------------------------------

    @classmethod
    def open(
        cls,
        directory: str,
        config: LogConfig | None = None,
        *,
        clock: Callable[[], float] = wall_clock_ms,
    ) -> PartitionLog:
        """Open (creating if needed) the log in ``directory`` and recover its active segment.

        Raises ``StorageError`` if another process holds the directory's lock, and
        ``CorruptLogError`` if the term table fails its checksum.
        """
        config = config or LogConfig()
        makedirs_durable(directory)
        lock_fd = os.open(os.path.join(directory, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock_fd)
            raise StorageError(f"{directory} is locked by another process") from None
        try:
            segments, terms, report = load_segments(directory, config)
            plog = cls(directory, config, clock, segments, terms, lock_fd, report)
            plog._losses.recover_lost_end(plog.log_end_offset, report, plog._active)
            return plog
        except BaseException:
            os.close(lock_fd)
            raise

    @property
    def lost_end_offset(self) -> int | None:
        """The end of what this replica may have acknowledged and lost (None: lost nothing).

        Set when recovery or ``repair_corruption`` cut data that had been fsynced; cleared,
        durably, once the log is fsynced up to it again (re-replicated). Until then Raft keeps
        this replica from voting (see docs/storage-format.md, "Corruption and repair").
        """
        return self._losses.lost_end

    @property
    def corruptions(self) -> int:
        """Corruption found in this log since it was opened (recovery cuts below the flushed
        end, checksum failures on reads and scrubs): a counter for metrics."""
        return self._losses.corruptions

    def close(self) -> None:
        """Flush and close. The log object must not be used afterwards."""
        if self._closed:
            return
        self._active.flush_index()
        self._active.sync()
        self._flushed_end = self.log_end_offset
        self._losses.note_flushed(self._flushed_end)
        self._terms.save()
        for seg in self._segments:
            seg.close()
        os.close(self._lock_fd)
        self._closed = True

    def abandon(self) -> None:
        """Drop the log as a killed process would: close descriptors, flush and fsync nothing.

        For crash tests: what was written stays in the page cache, the index files miss their
        last entries, and the next ``open`` must recover.
        """
        for seg in self._segments:
            seg.abandon()
        os.close(self._lock_fd)
        self._closed = True

    def __enter__(self) -> PartitionLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- facts ------------------------------------------------------------------------------

    @property
    def _active(self) -> Segment:
        return self._segments[-1]

    @property
    def log_start_offset(self) -> int:
        """The lowest offset the log can hold (retention and resets move it forward)."""
        return self._segments[0].base_offset

    @property
    def log_end_offset(self) -> int:
        """The offset the next appended batch gets (one past the last offset)."""
        return self._segments[-1].next_offset  # not ``_active``: read on every Raft lookup

    @property
    def active_base_offset(self) -> int:
        return self._active.base_offset

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self._segments)

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    @property
    def flushed_end_offset(self) -> int:
        """Everything below this offset has been fsynced."""
        return self._flushed_end

    @property
    def durable_end_offset(self) -> int:
        """The end of what may be acknowledged under the fsync policy (see module docstring)."""
        if self.config.fsync is FsyncPolicy.ALWAYS:
            return self._flushed_end
        return self.log_end_offset

    @property
    def last_term(self) -> int:
        return self._terms.last_term

    def term_at(self, offset: int) -> int | None:
        """The term of the batch holding ``offset``; valid from ``log_start - 1`` to the end.

        Offset -1 of a log that starts at 0 has term 0 (Raft's sentinel) unless a reset said
        otherwise. None outside that range.
        """
        # The bounds come straight from the segments (``log_start_offset``, ``log_end_offset``):
        # Raft asks this several times per write, and each property would be a call more.
        segments = self._segments
        if offset < segments[0].base_offset - 1 or offset >= segments[-1].next_offset:
            return None
        term = self._terms.term_at(offset)
        if term is None and offset == -1:
            return 0
        return term

    def term_starts(self) -> list[tuple[int, int]]:
        """The term → start-offset table, oldest first."""
        return self._terms.entries()

    def term_end(self, term: int) -> tuple[int, int]:
        """The largest term <= ``term`` in the log and the offset where it ends (see TermTable)."""
        return self._terms.end_of(term, self.log_end_offset)

    # -- appending ----------------------------------------------------------------------------

    def _check_batch(
        self, batch: bytes | memoryview, pos: int = 0, *, header_crc: bool = True
    ) -> BatchHeader:
        header = decode_header(batch, pos, verify=True, header_crc=header_crc)
        if header.size > self.config.max_batch_bytes:
            raise InvalidBatchError(
                f"batch of {header.size} bytes exceeds the limit of {self.config.max_batch_bytes}"
            )
        return header

    def _check_new_batch(
        self, batch: bytes | memoryview, *, compacted_ok: bool = False
    ) -> BatchHeader:
        """``compacted_ok``: a batch may hold fewer records than offsets (even none), as a
        batch of a compacted segment does when a leader replicates it to a follower behind; a
        producer's batch (``check_batch``) must not."""
        # The header CRC only guards the fields stamping rewrites, so it is not worth checking.
        header = self._check_batch(batch, header_crc=False)
        if header.size != len(batch):
            raise InvalidBatchError(
                f"batch length says {header.size} bytes but {len(batch)} were given"
            )
        if compacted_ok:
            if not 0 <= header.record_count <= header.last_offset_delta + 1:
                raise InvalidBatchError(
                    f"{header.record_count} records cannot fit in "
                    f"{header.last_offset_delta + 1} offsets"
                )
        elif header.record_count < 1 or header.last_offset_delta != header.record_count - 1:
            raise InvalidBatchError(
                f"a new batch needs contiguous offsets: {header.record_count} records "
                f"spanning {header.last_offset_delta + 1} offsets"
            )
        return header

    def check_batch(self, batch: bytes | memoryview, *, span: int | None = None) -> CheckedBatch:
        """Check ``batch`` as ``append`` would, and that it spans ``span`` offsets if given.

        A leader checks a producer's batch when it accepts it: an invalid batch must be refused
        to its producer then, not found once it is in the Raft log. The result carries the
        header with the bytes, so whoever goes on with the batch (the producer-state decision,
        the append) reads the header from it instead of parsing it again, and ``append_many``
        takes it unchecked. Raises ``InvalidBatchError``.
        """
        header = self._check_new_batch(batch)
        if span is not None and header.last_offset_delta + 1 != span:
            raise InvalidBatchError(
                f"the batch spans {header.last_offset_delta + 1} offsets, not {span}"
            )
        # Immutable bytes: what was checked is what will be written.
        return CheckedBatch(batch if type(batch) is bytes else bytes(batch), header)

    def append(self, batch: bytes | memoryview | CheckedBatch, *, term: int) -> AppendResult:
        """Append one batch as the leader: assign it the next offsets and stamp ``term``.

        Raises ``InvalidBatchError`` (nothing written) if the bytes are not exactly one valid
        batch with at least one record and contiguous offsets, or exceed ``max_batch_bytes``;
        ``ValueError`` if ``term`` is below the log's last term.
        """
        return self.append_many([(batch, term)])[0]

    def append_many(
        self, batches: Iterable[tuple[bytes | memoryview | CheckedBatch, int]]
    ) -> list[AppendResult]:
        """Append ``(batch, term)`` pairs as ``append`` does each, in order; return their offsets.

        A ``CheckedBatch`` (from ``check_batch``) is not checked again.

        Every batch is checked before any is written: on ``InvalidBatchError`` or ``ValueError``
        the log is unchanged. The batches reach the file in one ``pwritev`` per run that fits
        the active segment: a group write, where a system call and the bookkeeping of each
        batch cost more than its bytes.
        """
        base, last_term = self.log_end_offset, self._terms.last_term
        writes: list[BatchWrite] = []
        results: list[AppendResult] = []
        for batch, term in batches:
            if isinstance(batch, CheckedBatch):
                batch, header = batch
            else:
                header = self._check_new_batch(batch, compacted_ok=True)
            if term < last_term:
                raise ValueError(f"term {term} is below the log's last term {last_term}")
            last = base + header.last_offset_delta
            parts = (stamped_prefix(batch, base_offset=base, term=term), _tail(batch))
            writes.append(BatchWrite(parts, base, last, term, header.size, header.max_timestamp))
            results.append(AppendResult(base, last))
            base, last_term = last + 1, term
        self._write(writes)
        return results

    def append_replicated(self, data: bytes) -> AppendResult:
        """Append whole batches that a leader already stamped (the follower's path).

        The first batch must start at ``log_end_offset`` and each next batch right after the
        previous one; terms must not decrease. Everything is checked before anything is
        written: on ``InvalidBatchError`` or ``ValueError`` the log is unchanged.
        """
        view = memoryview(data)
        writes: list[BatchWrite] = []
        expected, last_term, pos = self.log_end_offset, self._terms.last_term, 0
        while pos < len(view):
            header = self._check_batch(view, pos)
            if header.base_offset != expected:
                raise ValueError(
                    f"batch at offset {header.base_offset} does not continue the log at {expected}"
                )
            if header.term < last_term:
                raise ValueError(f"batch term {header.term} is below the log's term {last_term}")
            writes.append(
                BatchWrite(
                    (view[pos : pos + header.size],),
                    header.base_offset,
                    header.last_offset,
                    header.term,
                    header.size,
                    header.max_timestamp,
                )
            )
            expected, last_term, pos = header.next_offset, header.term, pos + header.size
        if not writes:
            raise InvalidBatchError("no batch to append")
        self._write(writes)
        return AppendResult(writes[0].base, writes[-1].last)

    def _write(self, writes: list[BatchWrite]) -> None:
        """Write checked, stamped batches at the log end, rolling segments where they fill up.

        Each run that fits the active segment (and ``IOV_MAX``) is one ``pwritev``; the roll
        decisions are those that appending the batches one by one would make.
        """
        now = self._clock()
        if len(writes) == 1:  # a single ``append``: nothing to group
            w = writes[0]
            self._maybe_roll(w.size, now)
            if w.term != self._terms.last_term:
                self._terms.assign(w.term, w.base)  # durable at the next roll (or recovery)
            self._segments[-1].append(writes, now)  # (the active one, after any roll)
            return
        segment_ms, limit = self.config.segment_ms, self.config.segment_bytes
        i = 0
        while i < len(writes):
            self._maybe_roll(writes[i].size, now)
            active = self._active
            first_ms = active.first_append_ms if active.first_append_ms is not None else now
            # A segment old enough to roll takes its (first) batch alone.
            aged = segment_ms is not None and now - first_ms >= segment_ms
            room, total, buffers, j = limit - active.size, 0, 0, i
            while j < len(writes):
                w = writes[j]
                if j > i and (aged or total + w.size > room or buffers + len(w.parts) > IOV_MAX):
                    break
                total += w.size
                buffers += len(w.parts)
                if w.term != self._terms.last_term:
                    self._terms.assign(w.term, w.base)  # durable at the next roll (or recovery)
                j += 1
            active.append(writes[i:j], now)
            i = j

    def _maybe_roll(self, incoming: int, now: float) -> None:
        active = self._segments[-1]  # (``_active``, a call less on every append)
        if active.size == 0:
            return
        too_big = active.size + incoming > self.config.segment_bytes
        too_old = (
            self.config.segment_ms is not None
            and active.first_append_ms is not None
            and now - active.first_append_ms >= self.config.segment_ms
        )
        if too_big or too_old:
            self.roll()

    def roll(self) -> None:
        """Seal the active segment (fsync) and start a new one at the log end."""
        if self._active.size == 0:
            return
        self._active.seal()
        self._terms.save()  # every term begun in the sealed segment is now durable
        self._segments.append(
            Segment.create(self.directory, self.log_end_offset, self.config.index_interval_bytes)
        )
        self._bases.append(self.log_end_offset)
        fsync_directory(self.directory)

    # -- durability ---------------------------------------------------------------------------

    def flush(self) -> None:
        """fsync the active segment now: everything appended so far becomes durable."""
        end = self.log_end_offset
        self._active.sync()
        self._flushed_end = max(self._flushed_end, end)
        self._last_flush_ms = self._clock()
        self._losses.note_flushed(self._flushed_end)

    def flush_ticket(self) -> FlushTicket:
        """An fsync of the active segment to run on a worker thread (see ``FlushTicket``)."""
        return FlushTicket(self._active.dup_fd(), self.log_end_offset, self._generation)

    def flushed(self, ticket: FlushTicket) -> None:
        """Record a completed ticket; stale tickets (from before a truncation) are ignored."""
        if not ticket.done:
            raise ValueError("flush ticket has not run")
        if ticket.generation == self._generation:
            self._flushed_end = max(self._flushed_end, min(ticket.end_offset, self.log_end_offset))
            if self.config.fsync is FsyncPolicy.INTERVAL:  # only its interval needs the time
                self._last_flush_ms = self._clock()
            self._losses.note_flushed(self._flushed_end)

    def flush_due(self) -> bool:
        """Whether the policy wants a flush now: something is not fsynced, and the policy is
        ALWAYS, or INTERVAL and the interval has passed since the last flush."""
        if self._flushed_end >= self.log_end_offset:
            return False
        policy = self.config.fsync
        if policy is FsyncPolicy.NEVER:
            return False
        return (
            policy is FsyncPolicy.ALWAYS
            or self._clock() - self._last_flush_ms >= self.config.fsync_interval_ms
        )

    def maybe_flush(self) -> bool:
        """Flush here and now if the policy wants it (``flush_due``); a caller on an event loop
        hands a ``flush_ticket`` to a worker instead."""
        if not self.flush_due():
            return False
        self.flush()
        return True

    # -- reading ------------------------------------------------------------------------------

    def read(
        self, offset: int, max_bytes: int = 1 << 20, *, max_offset: int | None = None
    ) -> ReadResult:
        """Whole batches from the one holding ``offset`` on, up to ``max_bytes``.

        At least one batch is returned if any is readable, even one larger than ``max_bytes``,
        so readers always progress. Only batches wholly below ``max_offset`` are returned
        (the commit bound: consumers see committed data only). Raises
        ``OffsetOutOfRangeError`` below the log start or past the log end, and
        ``CorruptLogError`` if a batch fails its checksums.
        """
        start, end = self.log_start_offset, self.log_end_offset
        if offset < start or offset > end:
            raise OffsetOutOfRangeError(offset, start, end)
        i = bisect_right(self._bases, offset) - 1
        for seg in self._segments[i:]:
            if max_offset is not None and seg.base_offset >= max_offset:
                break
            try:
                pos = seg.locate(offset)
                if pos is None:
                    continue
                data, next_offset = seg.read(
                    pos, max_bytes, max_offset, verify=self.config.verify_reads
                )
            except CorruptLogError as exc:
                exc.offset = offset
                self._losses.report(f"{exc} (reading offset {offset} of {self.directory})")
                raise
            return ReadResult(data, next_offset if next_offset is not None else offset)
        return ReadResult(b"", offset)

    def offset_for_time(self, timestamp_ms: int, *, max_offset: int | None = None) -> int:
        """The earliest offset whose record timestamp is >= ``timestamp_ms`` (Kafka's
        ListOffsets by timestamp); the log end (or ``max_offset``, if lower) if there is none.

        Timestamps need not increase along the log, so this is the first record where the
        maximum timestamp so far reaches ``timestamp_ms``. Only data records below
        ``max_offset`` (the commit bound) count. Each segment's time index skips it whole or
        narrows it to one index interval, so the answer costs a bounded read. Raises
        ``CorruptLogError`` if a batch read fails its checksums.
        """
        end = self.log_end_offset if max_offset is None else min(max_offset, self.log_end_offset)
        for seg in self._segments:
            if seg.base_offset >= end:
                break
            try:
                found = seg.offset_for_time(timestamp_ms, end, verify=self.config.verify_reads)
            except CorruptLogError as exc:
                self._losses.report(f"{exc} (looking up time {timestamp_ms} in {self.directory})")
                raise
            if found is not None:
                return found
        return end

    # -- truncation and reset -------------------------------------------------------------------

    def truncate(self, offset: int) -> None:
        """Remove every batch at or after ``offset`` (Raft: a follower's log diverged there).

        ``offset`` must not fall inside a batch (``ValueError``) nor below the log start
        (``OffsetOutOfRangeError``). Afterwards ``log_end_offset == offset`` (if it was above).
        The cut is made durable before returning.
        """
        if offset >= self.log_end_offset:
            return
        if offset < self.log_start_offset:
            raise OffsetOutOfRangeError(offset, self.log_start_offset, self.log_end_offset)
        keep = bisect_right(self._bases, offset) - 1
        target = self._segments[keep]
        if target.base_offset < offset:
            # Validate the boundary before anything is deleted.
            pos = target.locate(offset)
            if pos is not None:
                first = decode_header(target.read(pos, 0, None, verify=False)[0], verify=False)
                if first.base_offset < offset:
                    raise ValueError(f"offset {offset} is inside the batch at {first.base_offset}")
        elif keep > 0 and target.base_offset == offset:
            keep -= 1  # the segment starting at ``offset`` goes whole
            target = self._segments[keep]
        self._generation += 1
        self._losses.lower_watermark(offset)
        # Newest first, so a crash midway leaves a prefix of the log: a valid shorter log.
        while len(self._segments) > keep + 1:
            self._segments.pop().delete()
            self._bases.pop()
        fsync_directory(self.directory)
        if target.sealed:
            target.unseal()
        target.truncate_to(offset)
        target.sync()
        self._terms.truncate_from_end(self.log_end_offset)
        self._flushed_end = min(self._flushed_end, self.log_end_offset)

    def reset(self, start_offset: int, term_before_start: int) -> None:
        """Discard everything and restart empty at ``start_offset``.

        Raft uses this when a follower's log ends below the leader's log start (retention
        removed what it is missing): its log restarts where the leader's does, and
        ``term_at(start_offset - 1)`` answers ``term_before_start``.
        """
        if start_offset < 0:
            raise ValueError("start_offset must not be negative")
        self._generation += 1
        self._losses.lower_watermark(start_offset)
        while self._segments:
            self._segments.pop().delete()
        self._bases.clear()
        fsync_directory(self.directory)
        self._terms.reset(term_before_start, start_offset - 1)
        self._segments.append(
            Segment.create(self.directory, start_offset, self.config.index_interval_bytes)
        )
        self._bases.append(start_offset)
        fsync_directory(self.directory)
        self._flushed_end = start_offset
        # A reset past what a corrupt log lost ends that loss.
        self._losses.note_flushed(self._flushed_end)

    # -- retention and compaction ---------------------------------------------------------------

    def enforce_retention(self, *, max_offset: int | None = None) -> list[int]:
        """Delete the oldest sealed segments beyond the size or age limits; return their bases.

        Only segments wholly below ``max_offset`` go (Raft passes its commit bound, so nothing
        uncommitted is removed). The active segment is never deleted.
        """
        doomed = expired_segments(self._segments, self.config, self._clock(), max_offset=max_offset)
        if not doomed:
            return []
        # Oldest first, so a crash midway leaves a suffix: the log start just moved less far.
        for seg in doomed:
            seg.delete()
        fsync_directory(self.directory)
        del self._segments[: len(doomed)]
        del self._bases[: len(doomed)]
        self._terms.truncate_from_start(self.log_start_offset)
        log.info(
            "%s: retention deleted %d segment(s); log starts at %d",
            self.directory,
            len(doomed),
            self.log_start_offset,
        )
        return [s.base_offset for s in doomed]

    def compact(self, *, max_offset: int | None = None) -> CompactionResult:
        """Keep only the latest record of each key in the sealed segments.

        The latest record is looked for in the whole log below ``max_offset`` (the active
        segment included, which is itself never rewritten). Records without a key, and control
        batches, are kept. Tombstones (a key with a None value) are kept as the key's latest
        record. A batch keeps its offsets and span even when records go (an emptied batch stays
        as a header), so offsets, terms and Raft's view of the log do not change.
        """
        return compact(
            self.directory,
            self._segments,
            max_offset=max_offset,
            verify=self.config.verify_reads,
            rewritten=self._scrubber.rewritten,
        )

    # -- inspection (tests, tools) ---------------------------------------------------------------

    def segments(self) -> list[tuple[int, int, bool]]:
        """``(base_offset, size_bytes, sealed)`` of every segment, oldest first."""
        return [(s.base_offset, s.size, s.sealed) for s in self._segments]

    def verify(self) -> None:
        """Scrub: check every batch of every segment again; ``CorruptLogError`` at the first bad.

        Reads check each byte once per process; this checks everything, whatever was checked.
        """
        verify_segments(self._segments)

    # -- corruption: scrubbing and repair ---------------------------------------------------------

    def scrub_step(self, max_bytes: int) -> bool:
        """Check about ``max_bytes`` more of the sealed segments; return True after a full pass.

        A background scrub at a bounded rate: each call reads and re-checks the next whole
        batches (at least one) from where the last call stopped, going round the sealed
        segments (the active one is checked by recovery and by every append). Raises
        ``CorruptLogError`` (logged and counted) at a bad batch; ``repair_corruption`` then
        cuts the log before it.
        """
        try:
            return self._scrubber.step(self._segments, self._bases, max_bytes)
        except CorruptLogError as exc:
            self._losses.report(f"{exc} (scrub of {self.directory})")
            raise

    def repair_corruption(self, error: CorruptLogError) -> int:
        """Cut the log before the first bad batch of the segment ``error`` names; return the
        new log end.

        The segment is read whole and every batch checked; the log keeps what comes before the
        first bad one and drops everything after it (later segments too: a log has no holes).
        If that drops data that was durable (and so may have been acknowledged), the old
        durable end is recorded first, durably, as ``lost_end_offset``. Nothing is cut if the
        segment turns out valid (the fault was elsewhere, or already repaired).
        """
        repair = find_repair(self._segments, error)
        if repair is None:
            return self.log_end_offset
        self._losses.record_repair(repair, self.log_end_offset, self.durable_end_offset)
        self._generation += 1
        self._losses.lower_watermark(repair.new_end)
        while len(self._segments) > repair.position + 1:  # newest first: a valid prefix
            self._segments.pop().delete()
            self._bases.pop()
        fsync_directory(self.directory)
        repair.cut()
        self._terms.truncate_from_end(self.log_end_offset)
        self._terms.save()
        self._flushed_end = min(self._flushed_end, self.log_end_offset)
        self._scrubber.restart()
        return self.log_end_offset
