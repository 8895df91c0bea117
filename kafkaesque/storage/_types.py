"""The partition log's small value types: its settings, and what its calls return.

Pure values, no files: ``FlushTicket.run`` is the one method that does I/O (an fsync on a
worker thread, see ``PartitionLog.flush_ticket``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

from ._batch import BatchHeader


class FsyncPolicy(StrEnum):
    """When appended data reaches the disk; see ``PartitionLog``'s module docstring for what
    each promises."""

    ALWAYS = "always"
    INTERVAL = "interval"
    NEVER = "never"


@dataclass(frozen=True, slots=True)
class LogConfig:
    """Per-partition settings. ``None`` disables a limit."""

    segment_bytes: int = 64 * 1024 * 1024
    segment_ms: int | None = 7 * 24 * 3600 * 1000
    index_interval_bytes: int = 4096
    retention_bytes: int | None = None
    retention_ms: int | None = 7 * 24 * 3600 * 1000
    fsync: FsyncPolicy = FsyncPolicy.ALWAYS
    fsync_interval_ms: int = 1000
    max_batch_bytes: int = 8 * 1024 * 1024
    verify_reads: bool = True

    def __post_init__(self) -> None:
        if not 1024 <= self.segment_bytes <= 2**32 - 1:
            # The sparse index stores 32-bit positions.
            raise ValueError("segment_bytes must be between 1024 and 4 GiB - 1")
        if self.index_interval_bytes < 1:
            raise ValueError("index_interval_bytes must be positive")
        if self.max_batch_bytes > 2**31 - 1:
            raise ValueError("max_batch_bytes must fit in the 32-bit batch length field")


class AppendResult(NamedTuple):
    base_offset: int
    last_offset: int


class ReadResult(NamedTuple):
    """Whole batches, and the offset to read from next (after the last batch returned).

    The first batch may begin before the offset asked for (it holds that offset); readers skip
    the records below it. ``data`` is empty when nothing at or after the offset is readable.
    """

    data: bytes | memoryview
    next_offset: int


@dataclass(slots=True)
class FlushTicket:
    """An fsync to run off the owner's thread: ``run()`` in a worker, then ``log.flushed(t)``."""

    fd: int
    end_offset: int
    generation: int
    done: bool = False

    def run(self) -> None:
        try:
            os.fdatasync(self.fd)  # the segment is preallocated: data, no metadata (_segment.py)
        finally:
            os.close(self.fd)
        self.done = True


class CheckedBatch(NamedTuple):
    """A batch that ``PartitionLog.check_batch`` passed, and its header (see there).

    Made by ``check_batch`` only: ``append_many`` trusts the header to be the bytes'.
    """

    data: bytes
    header: BatchHeader
