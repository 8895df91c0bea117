"""The sparse offset index of one segment (Kafka's ``OffsetIndex``).

Each entry maps the base offset of a batch (relative to the segment's base offset) to the byte
position where that batch starts: two big-endian uint32, 8 bytes an entry. An entry is added only
after at least ``interval_bytes`` of log since the previous one, so a lookup lands at most that
many bytes (plus one batch) before its target.

The index is derived data: it is never checksummed; recovery rebuilds it from the log when it is
missing or does not fit the segment.
"""

from __future__ import annotations

import os
import struct
from array import array
from bisect import bisect_right
from collections.abc import Iterable

_ENTRY = struct.Struct(">II")
ENTRY_SIZE = _ENTRY.size


class OffsetIndex:
    """An in-memory sparse index with an append-only file behind it.

    Not thread-safe. Entries must be added in increasing offset and position order.
    """

    def __init__(self, path: str, base_offset: int, interval_bytes: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self.interval_bytes = interval_bytes
        self._offsets = array("q")  # absolute offsets, increasing
        self._positions = array("q")
        self._bytes_since_entry = 0
        self._unwritten = bytearray()

    @classmethod
    def load(cls, path: str, base_offset: int, interval_bytes: int, log_size: int) -> OffsetIndex:
        """Read the index file; entries past ``log_size`` or out of order are dropped."""
        index = cls(path, base_offset, interval_bytes)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return index
        usable = len(data) - len(data) % ENTRY_SIZE
        last_offset, last_pos = -1, -1
        for rel, pos in _ENTRY.iter_unpack(data[:usable]):
            offset = base_offset + rel
            if offset <= last_offset or pos <= last_pos or pos >= log_size:
                break
            index._offsets.append(offset)
            index._positions.append(pos)
            last_offset, last_pos = offset, pos
        return index

    def __len__(self) -> int:
        return len(self._offsets)

    def maybe_add(self, offset: int, position: int, batch_size: int) -> None:
        """Account for a batch appended at ``position``; index it if the interval has passed."""
        if not self._offsets or self._bytes_since_entry >= self.interval_bytes:
            self._offsets.append(offset)
            self._positions.append(position)
            self._unwritten += _ENTRY.pack(offset - self.base_offset, position)
            self._bytes_since_entry = 0
        self._bytes_since_entry += batch_size

    def lookup(self, offset: int) -> int:
        """The position of the last indexed batch whose base offset is <= ``offset`` (or 0)."""
        i = bisect_right(self._offsets, offset)
        return self._positions[i - 1] if i else 0

    def last_entry(self) -> tuple[int, int] | None:
        return (self._offsets[-1], self._positions[-1]) if self._offsets else None

    def truncate_to_position(self, position: int) -> None:
        """Drop entries at or past ``position`` (the log is being cut there)."""
        i = bisect_right(self._positions, position - 1)
        del self._offsets[i:]
        del self._positions[i:]
        self._unwritten.clear()
        self._bytes_since_entry = self.interval_bytes  # index the next batch appended
        self.rewrite()

    def flush(self) -> None:
        """Append the entries not yet written to the file (no fsync: the index is derived)."""
        append_unwritten(self.path, self._unwritten)

    def rewrite(self) -> None:
        """Write the whole index anew (after a rebuild or a truncation)."""
        replace_index_file(
            self.path,
            (
                _ENTRY.pack(o - self.base_offset, p)
                for o, p in zip(self._offsets, self._positions, strict=True)
            ),
        )
        self._unwritten.clear()


def append_unwritten(path: str, unwritten: bytearray) -> None:
    """Append a sparse index's entries not yet written to its file, and forget them (no fsync:
    an index is derived, rebuilt from the log when it does not fit)."""
    if unwritten:
        with open(path, "ab") as f:
            f.write(unwritten)
        unwritten.clear()


def replace_index_file(path: str, entries: Iterable[bytes]) -> None:
    """Write a sparse index's file anew with ``entries``: a temporary file renamed over it, so
    a crash leaves the old file or the new one."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(b"".join(entries))
    os.replace(tmp, path)
