"""Recovery of a partition log: loading it at open, its flushed-end watermark and lost end,
the scrub, and the repair of corruption.

Kafka's ``LogLoader`` beside its ``UnifiedLog``: these work on the segments the log hands them
and on the state they own, never on the log's own bookkeeping.

* ``load_segments`` opens a log directory: sealed segments are trusted, the active one is
  validated and a bad tail cut (``Segment.recover_active``), the term table reconciled.
* ``LossRecord`` keeps what the log may have acknowledged: the flushed-end watermark (in the
  ``.lock`` file), the lost end (a state file) and the count of corruption found; at open it
  decides whether recovery lost acknowledged data (``recover_lost_end``).
* ``Scrubber`` re-checks the sealed segments at a bounded rate; ``verify_segments`` checks them all.
* ``find_repair`` finds where a log with a bad batch must be cut; the log cuts it.

The contract is docs/storage-format.md, "Corruption and repair". Not thread-safe: the log's
owner calls these.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import struct
from bisect import bisect_right
from collections.abc import Callable, Sequence
from typing import NamedTuple

from crc32c import crc32c

from ._errors import CorruptLogError
from ._segment import RecoveryReport, Segment
from ._statefile import fsync_directory, read_state_file, write_state_file
from ._term_table import TermTable
from ._types import LogConfig

log = logging.getLogger("kafkaesque.storage")

# The flushed-end watermark: the end of what was fsynced (so may have been acknowledged). It is
# the content of the ``.lock`` file, which the log holds open anyway (no descriptor more per
# partition): 8-byte offset + 4-byte CRC32C, rewritten in place (not fsynced) after each flush.
LOCK_FILE = ".lock"
_WATERMARK = struct.Struct(">qI")
# The lost end: what a replica may have acknowledged and no longer holds (a state file).
LOST_END_FILE = "lost-end"


class LoadedLog(NamedTuple):
    """What ``load_segments`` found: the segments (oldest first, the active one last), the
    term table, and what recovery cut from the active segment (None: nothing)."""

    segments: list[Segment]
    terms: TermTable
    report: RecoveryReport | None


def load_segments(directory: str, config: LogConfig) -> LoadedLog:
    """Open the segments in ``directory`` (an empty log at 0 if there are none) and recover
    the active one; the caller holds the directory's lock.

    Raises ``CorruptLogError`` if the term table fails its checksum.
    """
    bases = []
    for name in os.listdir(directory):
        if name.endswith((".tmp", ".cleaned")):
            # Leftovers of an interrupted state-file write or compaction: never adopted.
            os.unlink(os.path.join(directory, name))
        elif name.endswith(".log") and name[:-4].isdigit():
            bases.append(int(name[:-4]))
    bases.sort()
    interval = config.index_interval_bytes
    segments = [
        Segment.open_sealed(directory, base, nxt, interval)
        for base, nxt in itertools.pairwise(bases)
    ]
    active, report, seen_terms = Segment.recover_active(
        directory, bases[-1] if bases else 0, interval
    )
    segments.append(active)
    if not bases:
        # A new log: its files' entries, and its own entry in the parent (makedirs_durable did
        # that when it created the directory; again here for a crash between the two), are
        # durable before anything is written to it.
        fsync_directory(directory)
        fsync_directory(os.path.dirname(os.path.abspath(directory)))
    terms = TermTable.load(directory)
    # The active segment's batches are the truth about its terms: the table is saved only
    # when a segment is sealed (and on close), so its tail may be stale or missing.
    terms.rebuild_from(active.base_offset, seen_terms, active.next_offset)
    terms.save()
    return LoadedLog(segments, terms, report)


def _read_watermark(fd: int) -> int | None:
    """The flushed end the lock file records; None if it is empty (a log from before the
    watermark) or damaged."""
    data = os.pread(fd, _WATERMARK.size, 0)
    if len(data) < _WATERMARK.size:
        return None
    end, crc = _WATERMARK.unpack(data)
    return int(end) if crc32c(data[:8]) == crc else None


class LossRecord:
    """What a log may have acknowledged and what it lost, durably: the flushed-end watermark
    in the lock file ``lock_fd`` (the log's, held open), the lost end in ``LOST_END_FILE``, and
    the corruption found since the log was opened."""

    def __init__(self, directory: str, lock_fd: int) -> None:
        self.directory = directory
        self._lock_fd = lock_fd
        #: Corruption found in this log since it was opened (recovery cuts below the flushed
        #: end, checksum failures on reads and scrubs): a counter for metrics.
        self.corruptions = 0
        # Invariant: the lock file holds watermark (or less, before its first write).
        self.watermark = _read_watermark(lock_fd)
        # Invariant: None or > the log's end offset, and durable in LOST_END_FILE.
        self.lost_end: int | None = None

    def report(self, what: str) -> None:
        """Count and log corruption found in the log."""
        self.corruptions += 1
        log.error("corruption: %s", what)

    def recover_lost_end(self, end: int, report: RecoveryReport | None, active: Segment) -> None:
        """Decide whether recovery lost data this replica may have acknowledged.

        ``end`` is the end of the log as opened, ``report`` what recovery cut from the
        ``active`` segment. A cut at or above the flushed-end watermark only removed writes
        that were never fsynced (a torn tail after a crash or power loss): normal, nothing was
        acknowledged. A log that ends below the watermark (cut by recovery, or truncated at a
        batch boundary behind our back) lost fsynced data: corruption, and the replica must not
        vote until it has re-replicated up to the old watermark. Without a readable watermark
        (a log written before it existed, or the watermark itself damaged) a cut counts as a
        loss of the cut batch at least: safety first.
        """
        state = read_state_file(self.directory, LOST_END_FILE)
        lost = None if state is None or state.get("lost_end") is None else int(state["lost_end"])
        if self.watermark is not None:
            # Also catches a tail cut at a batch boundary, which recovery cannot see.
            cut_lost = self.watermark
        else:
            cut_lost = report.first_lost_offset + 1 if report is not None else end
        if cut_lost > end:
            how = (
                f"{report.truncated_bytes} bytes cut at byte {report.valid_bytes}: {report.reason}"
                if report is not None
                else "the log ends below its flushed end"
            )
            self.report(
                f"{self.directory}: offsets [{end}, {cut_lost}) were fsynced and are gone ({how}); "
                "this replica re-replicates them before it votes again"
            )
            lost = max(lost or 0, cut_lost)
        if lost is not None and lost <= end:
            lost = None
        if lost != (None if state is None else state.get("lost_end")):
            write_state_file(self.directory, LOST_END_FILE, {"lost_end": lost})
        self.lost_end = lost
        if self.watermark is None or self.watermark < end:
            # Written before a crash and never flushed: make it durable now, so that the
            # flushed end the log starts with (its whole length) is true.
            active.sync()
            self.write_watermark(end, sync=True)
        elif self.watermark > end:
            # Now that the loss is on record, the watermark may describe this log again.
            self.write_watermark(end, sync=True)
        else:
            # Read back from the page cache, maybe never synced (a crash of the process only).
            os.fsync(self._lock_fd)
        # Invariant from here on: the lock file durably holds a watermark <= the durable end of
        # the log. The raises of note_flushed are not fsynced: after a power loss the file holds
        # one of the values written (12 bytes in one sector), never nothing, so a torn tail
        # above it is a normal loss of unsynced writes, not corruption (issue 36).

    def write_watermark(self, end: int, *, sync: bool) -> None:
        """Record that everything below ``end`` was fsynced (``sync``: durably, now)."""
        data = struct.pack(">q", end)
        os.pwrite(self._lock_fd, data + struct.pack(">I", crc32c(data)), 0)
        if sync:
            os.fsync(self._lock_fd)
        self.watermark = end

    def note_flushed(self, end: int) -> None:
        """The flushed end moved up to ``end``: raise the watermark; clear a lost end now
        re-replicated."""
        if self.watermark is None or end > self.watermark:
            # Not fsynced: it only has to survive what the flushed data survives, a crash of
            # the process; after a power loss an older value is read, which flags less.
            self.write_watermark(end, sync=False)
        if self.lost_end is not None and end >= self.lost_end:
            write_state_file(self.directory, LOST_END_FILE, {"lost_end": None})
            log.warning(
                "%s: re-replicated up to the lost end %d: repaired", self.directory, self.lost_end
            )
            self.lost_end = None

    def lower_watermark(self, end: int) -> None:
        """Before the log is cut to ``end`` on purpose: a later open must not take the cut
        for a loss (durable first, so a crash between the two steps errs on neither side)."""
        if self.watermark is None or self.watermark > end:
            self.write_watermark(end, sync=True)

    def record_repair(self, repair: Repair, log_end: int, durable_end: int) -> None:
        """Before the log is cut for ``repair``: report the corruption and, if the cut drops
        data that was durable (``durable_end``: so may have been acknowledged), record the old
        durable end, durably, as the lost end."""
        lost = max(durable_end, self.lost_end or 0)
        self.report(
            f"{repair.segment.log_path}: bad batch at byte {repair.valid_bytes} ({repair.error}): "
            f"cutting the log at offset {repair.new_end} (it ended at {log_end}, durable to {lost})"
        )
        if lost > repair.new_end and lost != self.lost_end:
            write_state_file(self.directory, LOST_END_FILE, {"lost_end": lost})
            self.lost_end = lost


def verify_segments(segments: Sequence[Segment]) -> None:
    """Check every batch of every segment again; ``CorruptLogError`` at the first bad."""
    for seg in segments:
        seg.scrub()


class Scrubber:
    """A background scrub's place in a log's sealed segments (see ``step``)."""

    def __init__(self) -> None:
        self._at = (0, 0)  # (segment base, byte position) the scrub resumes at

    def step(self, segments: Sequence[Segment], bases: Sequence[int], max_bytes: int) -> bool:
        """Check about ``max_bytes`` more of the sealed segments of ``segments`` (the whole
        log, the active one last; ``bases`` their base offsets); return True after a full pass.

        Each call reads and re-checks the next whole batches (at least one) from where the
        last call stopped, going round the sealed segments. Raises ``CorruptLogError`` at a
        bad batch (and stays where it was).
        """
        sealed = segments[:-1]
        if not sealed:
            return True
        base, pos = self._at
        i = bisect_right(bases, base) - 1
        if i < 0 or i >= len(sealed):
            i, pos = 0, 0
        elif bases[i] != base:
            pos = 0
        budget = max_bytes
        while budget > 0:
            seg = sealed[i]
            end = seg.verify_chunk(pos, budget)
            budget -= max(end - pos, 1)
            pos = end
            if pos >= seg.size:
                i, pos = i + 1, 0
                if i >= len(sealed):
                    self._at = (0, 0)
                    return True
        self._at = (sealed[i].base_offset, pos)
        return False

    def rewritten(self, seg: Segment) -> None:
        """``seg``'s file was rewritten (compacted)."""
        if self._at[0] == seg.base_offset:
            # The scrub's byte position was in the old file: in the new one it may fall
            # inside a batch, which would read as corruption. Start that segment again.
            self._at = (seg.base_offset, 0)

    def restart(self) -> None:
        """Start the next pass from the first sealed segment (the log was cut)."""
        self._at = (0, 0)


class Repair(NamedTuple):
    """Where ``find_repair`` found a log must be cut: before the first bad batch of
    ``segment``, the ``position``-th of the log, at byte ``valid_bytes`` (what was bad:
    ``error``), so that the log ends at ``new_end``."""

    position: int
    segment: Segment
    valid_bytes: int
    error: str
    new_end: int
    #: Cut the segment after its valid prefix; it becomes the active one. The caller deletes
    #: every later segment first (a log has no holes). Durable on return.
    cut: Callable[[], None]


def find_repair(segments: Sequence[Segment], error: CorruptLogError) -> Repair | None:
    """Where to cut the log ``segments`` for the corruption ``error`` reported: the segment it
    names is read whole and every batch checked. None if no segment of the log has that file
    or the segment turns out valid (the fault was elsewhere, or already repaired)."""
    i = next((j for j, s in enumerate(segments) if s.log_path == error.path), None)
    if i is None:
        return None
    seg = segments[i]
    scan, index = seg.scan_all()
    if scan.error is None:
        return None
    new_end = scan.next_offset if scan.next_offset is not None else seg.base_offset
    cut = functools.partial(seg.cut_after_scan, scan, index)
    return Repair(i, seg, scan.valid_bytes, scan.error, new_end, cut)
