"""The storage the core reads, as a small Protocol, and an in-memory implementation.

The core only READS storage; the driver writes it by following each ``Ready`` (see ``_ready``).
``PartitionLog`` implements this Protocol through an adapter; ``MemoryStorage`` implements it for
tests and the simulator.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ._membership import Configuration
from ._ready import LogReset, Ready
from ._types import Entry, EntryKind, HardState


@dataclass(frozen=True, slots=True)
class InitialState:
    """What a restarting node reads once, at construction.

    ``configs`` holds ``(offset, Configuration.encode())`` for the CONFIG entries still in the log,
    in offset order, preceded by the configuration in force at ``start_offset - 1`` (at offset
    ``start_offset - 1`` or below: the last CONFIG entry retention deleted, the configuration of the
    last log reset, or the bootstrap configuration seeded when the group was created at offset -1).
    Empty for a node that was never told a configuration (it waits for a leader to add it).

    ``lost_end`` is set when the disk lost entries this node may have acknowledged (corruption
    cut its log below what it had made durable): the end of what it may have acknowledged. The
    node neither votes nor campaigns until its log reaches it again (re-replicated from a
    leader); see ``RaftNode``.
    """

    hard_state: HardState
    configs: tuple[tuple[int, bytes], ...]
    lost_end: int | None = None


class RaftStorage(Protocol):
    """The durable log as the core sees it. All offsets are partition offsets.

    Contract shared by all methods: they reflect every ``Ready`` the driver has made durable and
    nothing else. The driver never changes the log outside a ``Ready``, except retention, which may
    raise ``start_offset`` up to (at most) the applied offset + 1 at an entry boundary.
    """

    def initial_state(self) -> InitialState:
        """The persisted hard state and configuration history (read once, at construction)."""
        ...

    def start_offset(self) -> int:
        """The first offset the log holds (0 until retention or a log reset moves it)."""
        ...

    def last_index(self) -> int:
        """The last offset the log holds; ``start_offset() - 1`` when it holds no entry."""
        ...

    def term_at(self, index: int) -> int:
        """The term of the entry covering ``index``, for ``start - 1 <= index <= last``.

        Any offset inside a batch works (the term→start-offset table, like Kafka's leader-epoch
        cache, answers it). ``start - 1`` is answered from the table even after retention deleted
        that entry, and is 0 for an empty, never-compacted log. Outside the range: ``IndexError``.
        """
        ...

    def entries(self, lo: int, max_bytes: int) -> Sequence[Entry]:
        """Entries from the one covering ``lo`` onwards, in order, for ``start <= lo <= last + 1``.

        Stops before the entry that would make the sum of ``Entry.size`` exceed ``max_bytes``, but
        always returns at least one entry when ``lo <= last``. Outside the range: ``IndexError``.
        """
        ...

    def term_start_offset(self, term: int) -> int:
        """The first offset ``>= start_offset()`` whose term is ``>= term``; ``last + 1`` if none.

        Terms never decrease along a log, so this answers both "where does term T start" and
        "where does the first term after T start" (fast backtracking of §5.3).
        """
        ...


class MemoryStorage:
    """An in-memory ``RaftStorage`` plus the writes a driver does (a model of one node's disk).

    Everything written here is "durable": the simulator keeps the object across a crash.
    Not thread-safe.
    """

    def __init__(self, bootstrap: Configuration | None = None) -> None:
        """An empty log at offset 0; ``bootstrap`` seeds the group's first configuration."""
        self._start = 0
        self._prev_term = 0  # term at start - 1
        self._entries: list[Entry] = []
        # Parallel to _entries, for bisection by offset and by term.
        self._lasts: list[int] = []
        self._terms: list[int] = []
        self._hard = HardState()
        self._configs: list[tuple[int, bytes]] = []
        if bootstrap is not None:
            self._configs.append((-1, bootstrap.encode()))
        # Invariant: None or > last_index() + 1 (what a corrupted disk lost; see ``lose_from``).
        self._lost_end: int | None = None

    # -- RaftStorage ------------------------------------------------------------------------

    def initial_state(self) -> InitialState:
        return InitialState(self._hard, tuple(self._configs), self._lost_end)

    def start_offset(self) -> int:
        return self._start

    def last_index(self) -> int:
        return self._lasts[-1] if self._lasts else self._start - 1

    def term_at(self, index: int) -> int:
        if index == self._start - 1:
            return self._prev_term
        if not self._start <= index <= self.last_index():
            raise IndexError(f"offset {index} outside [{self._start - 1}, {self.last_index()}]")
        return self._terms[bisect_left(self._lasts, index)]

    def entries(self, lo: int, max_bytes: int) -> list[Entry]:
        if not self._start <= lo <= self.last_index() + 1:
            raise IndexError(f"offset {lo} outside [{self._start}, {self.last_index() + 1}]")
        out: list[Entry] = []
        size = 0
        entries = self._entries
        for pos in range(bisect_left(self._lasts, lo), len(entries)):
            e = entries[pos]
            if out and size + len(e.data) > max_bytes:
                break
            out.append(e)
            size += len(e.data)
        return out

    def term_start_offset(self, term: int) -> int:
        pos = bisect_left(self._terms, term)
        return self._entries[pos].first if pos < len(self._entries) else self.last_index() + 1

    # -- writes (the driver's side) ---------------------------------------------------------

    @property
    def hard_state(self) -> HardState:
        """The persisted hard state."""
        return self._hard

    def all_entries(self) -> list[Entry]:
        """A copy of every entry held (tests and the simulator's checks)."""
        return list(self._entries)

    def persist(self, rd: Ready) -> None:
        """Make a Ready durable in the documented order: reset, truncate, append, hard state."""
        if rd.log_reset is not None:
            self.reset(rd.log_reset)
        if rd.truncate_from is not None:
            self.truncate(rd.truncate_from)
        if rd.entries:
            self.append(rd.entries)
        if rd.hard_state is not None:
            self._hard = rd.hard_state

    def set_hard_state(self, hs: HardState) -> None:
        """Persist a hard state."""
        self._hard = hs

    def append(self, entries: Sequence[Entry]) -> None:
        """Append contiguous entries right after the last offset.

        Raises:
            ValueError: the entries do not continue the log, or a term goes backwards.
        """
        expect, term = self.last_index() + 1, self.term_at(self.last_index())
        for e in entries:
            if e.first != expect or e.term < term:
                raise ValueError(f"entry {e.first}-{e.last}/{e.term} cannot follow {expect - 1}")
            self._entries.append(e)
            self._lasts.append(e.last)
            self._terms.append(e.term)
            if e.kind is EntryKind.CONFIG:
                self._configs.append((e.last, e.data))
            expect, term = e.last + 1, e.term
        if self._lost_end is not None and expect >= self._lost_end:
            self._lost_end = None  # re-replicated: whole again

    def lose_from(self, from_offset: int) -> None:
        """Model a disk fault found by a scrub or on recovery: the entries from ``from_offset``
        (an entry boundary) are gone although they were durable, and possibly acknowledged.

        As ``PartitionLog.repair_corruption`` does, the log is cut and the old end is recorded
        as ``InitialState.lost_end`` until the log reaches it again. The simulator restarts the
        node afterwards (the driver rebuilds a group's core after a repair).
        """
        end = self.last_index() + 1
        if from_offset >= end:
            return
        self.truncate(from_offset)
        self._lost_end = max(end, self._lost_end or 0)
        self._hard = HardState(
            self._hard.term, self._hard.vote, min(self._hard.commit, self.last_index())
        )

    def truncate(self, from_offset: int) -> None:
        """Delete every entry at or after ``from_offset`` (an entry boundary)."""
        if from_offset > self.last_index():
            return
        pos = bisect_left(self._lasts, from_offset)
        if from_offset < self._start or self._entries[pos].first != from_offset:
            raise ValueError(f"{from_offset} is not an entry boundary at or after the start")
        del self._entries[pos:], self._lasts[pos:], self._terms[pos:]
        self._configs = [(off, data) for off, data in self._configs if off < from_offset]

    def reset(self, reset: LogReset) -> None:
        """Discard the whole log; it now starts, empty, at ``reset.start``."""
        self._entries.clear()
        self._lasts.clear()
        self._terms.clear()
        self._start = reset.start
        self._prev_term = reset.prev_term
        self._configs = [(reset.start - 1, reset.config.encode())]
        if self._lost_end is not None and reset.start >= self._lost_end:
            self._lost_end = None  # what was lost is below the leader's log start: committed

    def compact(self, to: int) -> None:
        """Retention: delete the entries below ``to`` (an entry boundary, at most ``last + 1``).

        The caller must not pass the applied offset + 1 (only committed entries may go).
        """
        if to <= self._start:
            return
        if to > self.last_index() + 1:
            raise ValueError(f"cannot compact to {to} beyond last + 1 = {self.last_index() + 1}")
        self._prev_term = self.term_at(to - 1)
        pos = bisect_left(self._lasts, to)
        if pos < len(self._entries) and self._entries[pos].first != to:
            raise ValueError(f"{to} is not an entry boundary")
        del self._entries[:pos], self._lasts[:pos], self._terms[:pos]
        self._start = to
        # Keep the configuration in force at to - 1 (the last one below), and all later ones.
        below = [c for c in self._configs if c[0] < to]
        self._configs = below[-1:] + [c for c in self._configs if c[0] >= to]
