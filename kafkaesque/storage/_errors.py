"""Storage errors, sorted by who must act (the project's error taxonomy).

* ``InvalidBatchError``: bytes handed to us (by a producer, a peer, or read back from a torn tail)
  are not a valid batch. The caller rejects them; nothing is written.
* ``OffsetOutOfRangeError``: a read or truncate names an offset the log does not hold. Retriable
  by the caller with an offset in range (``log_start_offset`` .. ``log_end_offset``).
* ``CorruptLogError``: data the log had trusted (a sealed segment) fails its checksum. Fatal for
  that replica's copy: never silently dropped, always reported with the file and position.
"""

from __future__ import annotations


class StorageError(Exception):
    """Base of every error raised by ``kafkaesque.storage``."""


class InvalidBatchError(StorageError, ValueError):
    """The bytes are not a valid record batch (bad length, CRC, magic, type or counts)."""


class OffsetOutOfRangeError(StorageError, LookupError):
    """The offset is below the log start or above the log end."""

    def __init__(self, offset: int, start: int, end: int) -> None:
        super().__init__(f"offset {offset} is out of range [{start}, {end}]")
        self.offset = offset
        self.log_start_offset = start
        self.log_end_offset = end


class CorruptLogError(StorageError):
    """A sealed segment (trusted data) failed validation: a disk fault, reported, never hidden."""

    def __init__(self, path: str, position: int, reason: str) -> None:
        super().__init__(f"corrupt sealed segment {path} at byte {position}: {reason}")
        self.path = path
        self.position = position
        self.reason = reason
        #: The offset being read when the fault was found (the bad batch holds it or follows
        #: it); None when the fault was not found by a read at an offset (a scrub, a state file).
        self.offset: int | None = None
