"""The sparse time index of one segment (Kafka's ``TimeIndex``, KIP-33).

Each entry is taken at a batch boundary and says: every batch of the segment that starts before
``position`` has a max timestamp of at most ``timestamp``; the batch at ``position`` has base
offset ``offset``. Three big-endian fields, 16 bytes an entry: ``timestamp`` int64 (ms),
``offset - base_offset`` uint32, ``position`` uint32. Timestamps need not increase from batch to
batch, so an entry holds the largest timestamp *so far*: entries never decrease in timestamp.

An entry is added at the first batch boundary after at least ``interval_bytes`` of log since the
previous one (the offset index's rule), so a lookup narrows a search to one interval: for a
timestamp T, the last entry whose timestamp is below T starts the scan (nothing before it
reaches T), and the entry after it ends it (something before that one reaches T).

When a segment is sealed an entry for its end is added (``position`` = the segment's size,
``offset`` = its next offset): its timestamp is the segment's max timestamp, which retention and
lookups then read without walking the segment.

The index is derived data: never checksummed, rebuilt from the log when missing or when it does
not fit the segment (see ``Segment``).
"""

from __future__ import annotations

import struct
from array import array
from bisect import bisect_left

from ._index import append_unwritten, replace_index_file

_ENTRY = struct.Struct(">qII")
ENTRY_SIZE = _ENTRY.size
# Below every real timestamp: the max timestamp of nothing.
NO_TIMESTAMP = -(2**63)


class TimeIndex:
    """An in-memory sparse time index with an append-only file behind it.

    Not thread-safe. Batches must be reported (``maybe_add``) in log order.
    """

    def __init__(self, path: str, base_offset: int, interval_bytes: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self.interval_bytes = interval_bytes
        # Invariant: timestamps never decrease; offsets and positions strictly increase.
        self._timestamps = array("q")
        self._offsets = array("q")  # absolute
        self._positions = array("q")
        # The largest batch max timestamp reported so far (NO_TIMESTAMP: none yet).
        self.max_so_far = NO_TIMESTAMP
        self._bytes_since_entry = 0
        self._unwritten = bytearray()

    @classmethod
    def load(
        cls, path: str, base_offset: int, interval_bytes: int, log_size: int
    ) -> TimeIndex | None:
        """Read the index file of a segment of ``log_size`` bytes; None if it is missing or
        does not fit (an entry out of order or past the end, a partial entry): rebuild then.

        A loaded index knows its entries, not the batches after its last one: only a sealed
        segment's index (whose last entry is at the segment's end) is complete, and only such
        an index is appended to after loading (by ``unseal``, which rebuilds instead).
        """
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        if len(data) % ENTRY_SIZE:
            return None
        index = cls(path, base_offset, interval_bytes)
        last_ts, last_offset, last_pos = NO_TIMESTAMP, base_offset - 1, 0
        for ts, rel, pos in _ENTRY.iter_unpack(data):
            offset = base_offset + rel
            if ts < last_ts or offset <= last_offset or pos <= last_pos or pos > log_size:
                return None
            index._append(ts, offset, pos)
            last_ts, last_offset, last_pos = ts, offset, pos
        if index._timestamps:
            index.max_so_far = index._timestamps[-1]
        return index

    def __len__(self) -> int:
        return len(self._offsets)

    def _append(self, timestamp: int, offset: int, position: int) -> None:
        self._timestamps.append(timestamp)
        self._offsets.append(offset)
        self._positions.append(position)

    def maybe_add(self, offset: int, position: int, batch_size: int, max_timestamp: int) -> None:
        """Account for a batch of ``batch_size`` bytes at ``position`` (base ``offset``);
        index the boundary before it if the interval has passed."""
        if position > 0 and self._bytes_since_entry >= self.interval_bytes:
            self._add(offset, position)
        self._bytes_since_entry += batch_size
        self.max_so_far = max(self.max_so_far, max_timestamp)

    def _add(self, offset: int, position: int) -> None:
        self._append(self.max_so_far, offset, position)
        self._unwritten += _ENTRY.pack(self.max_so_far, offset - self.base_offset, position)
        self._bytes_since_entry = 0

    def seal(self, next_offset: int, size: int) -> None:
        """Index the segment's end (``size``, ``next_offset``) with its max timestamp."""
        if size > 0 and (not self._positions or self._positions[-1] < size):
            self._add(next_offset, size)

    def sealed_max_timestamp(self, size: int, next_offset: int) -> int | None:
        """The segment's max timestamp if the last entry is its end (a sealed segment's:
        position ``size``, offset ``next_offset``), else None."""
        if self._positions and self._positions[-1] == size and self._offsets[-1] == next_offset:
            return self._timestamps[-1]
        return None

    def lookup(self, timestamp: int) -> tuple[int, int, int | None]:
        """Where to look for the first batch holding a timestamp >= ``timestamp``.

        Returns ``(position, offset, end)``: scan the batches from ``position`` (whose base
        offset is ``offset``, or the segment's base at position 0); a batch reaching
        ``timestamp`` starts before ``end`` if the segment has one (None: the index cannot
        tell, it may lie anywhere after ``position``).
        """
        i = bisect_left(self._timestamps, timestamp)  # entries [0, i) are below the timestamp
        position, offset = (
            (self._positions[i - 1], self._offsets[i - 1]) if i else (0, self.base_offset)
        )
        end = self._positions[i] if i < len(self._positions) else None
        return position, offset, end

    def entries(self) -> list[tuple[int, int, int]]:
        """``(timestamp, offset, position)`` of every entry (tests, tools)."""
        return list(zip(self._timestamps, self._offsets, self._positions, strict=True))

    def flush(self) -> None:
        """Append the entries not yet written to the file (no fsync: the index is derived)."""
        append_unwritten(self.path, self._unwritten)

    def rewrite(self) -> None:
        """Write the whole index anew (after a rebuild)."""
        replace_index_file(
            self.path,
            (
                _ENTRY.pack(t, o - self.base_offset, p)
                for t, o, p in zip(self._timestamps, self._offsets, self._positions, strict=True)
            ),
        )
        self._unwritten.clear()
