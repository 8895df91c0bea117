"""The core's view of the log: storage's durable prefix plus an in-memory unstable tail.

Offsets below ``_offset`` are read from storage; offsets at or above it from ``_unstable``, the
entries not yet made durable (a follower's freshly received entries, a leader's proposals). When a
follower's log diverges, ``_offset`` moves below storage's last offset: storage still holds the
stale entries until the next ``Ready`` (which carries ``truncate_from``) is made durable, and this
view ignores them. A pending ``LogReset`` hides storage entirely until it is durable.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

from ._errors import RaftInvariantError
from ._ready import LogReset
from ._storage import RaftStorage
from ._types import Entry


def _last_of(e: Entry) -> int:
    return e.last


def _term_of(e: Entry) -> int:
    return e.term


class RaftLog:
    """Log view, commit and applied offsets of one node. Not thread-safe."""

    def __init__(self, storage: RaftStorage, commit: int, applied: int | None) -> None:
        """Open over ``storage`` with the persisted ``commit`` and the driver's ``applied``.

        Raises:
            RaftInvariantError: the persisted commit lies beyond the persisted log.
        """
        self._storage = storage
        self._reset: LogReset | None = None  # a log reset not yet durable
        self._reset_handed = False  # ... and already handed out in a Ready
        # Invariant: storage holds (validly) every offset in [start, _offset - 1].
        self._offset = storage.last_index() + 1
        # Invariant: the term at ``_offset - 1`` (the last durable entry, or ``start - 1``). It
        # is the term asked for most (a leader's prev_term and commit check, a follower's
        # match), kept here so that those cost no trip through storage's layers. Only a Ready
        # changes storage below ``_offset`` (a reset), and retention keeps ``start - 1``'s term.
        self._stable_term = storage.term_at(self._offset - 1)
        # Invariant: contiguous, _unstable[0].first == _offset.
        self._unstable: list[Entry] = []
        # Entries of _unstable handed out in the current Ready (0 outside ready()/advance()).
        self._handed = 0
        start = storage.start_offset()
        # Invariant: start - 1 <= applied <= commit <= last_index(). Everything below the start
        # is committed (retention and log resets only ever drop committed entries).
        self.commit = max(commit, start - 1)
        self.applied = max(start - 1, -1 if applied is None else applied)
        if self.commit > self.last_index():
            raise RaftInvariantError(
                f"persisted commit {self.commit} beyond the persisted log's end {self.last_index()}"
            )
        if self.applied > self.commit:
            raise RaftInvariantError(f"applied {self.applied} beyond commit {self.commit}")

    # -- reading ----------------------------------------------------------------------------

    def start_offset(self) -> int:
        """The first offset the log holds."""
        return self._reset.start if self._reset is not None else self._storage.start_offset()

    def last_index(self) -> int:
        """The last offset the log holds (``start_offset() - 1`` when empty)."""
        return self._unstable[-1].last if self._unstable else self._offset - 1

    def last_term(self) -> int:
        """The term of the last entry (or of ``start - 1`` when the log is empty)."""
        return self._unstable[-1].term if self._unstable else self._stable_term

    def stable_last(self) -> int:
        """The last offset known durable (what a leader may count for itself)."""
        return self._offset - 1

    def _upos(self, index: int) -> int:
        """The position of the unstable entry covering ``index`` (``len`` if beyond)."""
        unstable = self._unstable
        if unstable and index <= unstable[0].last:
            return 0  # the usual case (often the only entry): no bisection, no key calls
        return bisect_left(unstable, index, key=_last_of)

    def term_at(self, index: int) -> int:
        """The term at ``index`` for ``start - 1 <= index <= last``.

        Raises:
            RaftInvariantError: ``index`` is outside that range (the caller skipped a check).
        """
        if index >= self._offset:
            if index > self.last_index():
                raise RaftInvariantError(f"term_at({index}) beyond last {self.last_index()}")
            return self._unstable[self._upos(index)].term
        term = self._stored_term(index)
        if term is None:
            start = self.start_offset()
            raise RaftInvariantError(f"term_at({index}) below start - 1 = {start - 1}")
        return term

    def _stored_term(self, index: int) -> int | None:
        """The term at ``index < _offset`` (durable, or the pending reset's ``start - 1``);
        None below ``start - 1``.

        Storage reports an offset below its ``start - 1`` itself (``IndexError``; it holds every
        offset from there to ``_offset - 1``): asking it for its start first would cost a call
        through its layers on every lookup, and the leader looks terms up several times a write.
        """
        if index == self._offset - 1:
            return self._stable_term
        if self._reset is not None:
            return None  # a reset log holds nothing below its start - 1 (= _offset - 1)
        try:
            return self._storage.term_at(index)
        except IndexError:
            return None

    def match_term(self, index: int, term: int) -> bool:
        """Whether the log holds ``index`` (or it is ``start - 1``) with term ``term``."""
        if index >= self._offset:
            return index <= self.last_index() and self._unstable[self._upos(index)].term == term
        return self._stored_term(index) == term

    def entries(self, lo: int, max_bytes: int) -> list[Entry]:
        """Entries from the one covering ``lo`` (``start <= lo <= last``), within ``max_bytes``.

        At least one entry is returned; see ``RaftStorage.entries`` for the budget rule.
        """
        # Storage's start is only read when ``lo`` is below the unstable tail: it never lies
        # above ``_offset`` (retention deletes only committed entries that storage holds, and
        # a log reset starts at ``_offset``), and a leader mostly sends from the unstable tail.
        if lo > self.last_index() or (lo < self._offset and lo < self.start_offset()):
            raise RaftInvariantError(f"entries({lo}) outside [{self.start_offset()}, last]")
        out: list[Entry] = []
        size = 0
        if lo < self._offset:
            for e in self._storage.entries(lo, max_bytes):
                if e.last >= self._offset:
                    break  # a stale entry awaiting truncation
                out.append(e)
                size += len(e.data)
            if not out or out[-1].last != self._offset - 1:
                return out  # the budget ran out inside the durable part
            lo = self._offset
        unstable = self._unstable
        for pos in range(self._upos(lo), len(unstable)):
            e = unstable[pos]
            if out and size + len(e.data) > max_bytes:
                break
            out.append(e)
            size += len(e.data)
        return out

    def entries_between(self, lo: int, hi: int) -> list[Entry]:
        """Every entry covering an offset in ``[lo, min(hi, last)]`` (tests, small ranges)."""
        out: list[Entry] = []
        hi = min(hi, self.last_index())
        while lo <= hi:
            chunk = self.entries(lo, 0)  # one entry at a time: O(log n) each
            for e in chunk:
                if e.first > hi:
                    return out
                out.append(e)
            lo = chunk[-1].last + 1
        return out

    def term_start_offset(self, term: int) -> int:
        """The first offset ``>= start`` whose term is ``>= term``; ``last + 1`` if none."""
        if self._reset is None:
            found = self._storage.term_start_offset(term)
            if found < self._offset:
                return found
        pos = bisect_left(self._unstable, term, key=_term_of)
        return self._unstable[pos].first if pos < len(self._unstable) else self.last_index() + 1

    def last_index_of_term(self, term: int) -> int | None:
        """The last offset of ``term`` in the log (from ``start`` on), or None if none."""
        first = self.term_start_offset(term)
        if first > self.last_index() or self.term_at(first) != term:
            return None
        return self.term_start_offset(term + 1) - 1

    def is_up_to_date(self, last_index: int, last_term: int) -> bool:
        """Raft §5.4.1: is a log ending at (last_index, last_term) at least as up-to-date?"""
        mine = self.last_term()
        return last_term > mine or (last_term == mine and last_index >= self.last_index())

    def find_conflict(self, entries: Sequence[Entry]) -> int:
        """Position of the first entry not already in the log (new or conflicting), or len.

        The caller has checked that the entry before ``entries[0]`` matches, so by Log Matching a
        same-term entry here has the same boundaries and content.
        """
        last = self.last_index()
        for i, e in enumerate(entries):
            if e.last > last or self.term_at(e.last) != e.term:
                return i
        return len(entries)

    # -- writing ----------------------------------------------------------------------------

    def append(self, entries: Sequence[Entry]) -> None:
        """Append entries that continue the log (a leader's own proposals)."""
        expect = self.last_index() + 1
        for e in entries:
            if e.first != expect:
                raise RaftInvariantError(f"append at {e.first}, expected {expect}")
            expect = e.last + 1
        self._unstable.extend(entries)

    def truncate_and_append(self, entries: Sequence[Entry]) -> None:
        """Replace everything from ``entries[0].first`` on by ``entries``.

        Raises:
            RaftInvariantError: the truncation would drop a committed offset, or does not start
                at an entry boundary.
        """
        after = entries[0].first
        if after <= self.commit:
            raise RaftInvariantError(
                f"entry {after}-{entries[0].last}/{entries[0].term} conflicts with the committed "
                f"prefix (commit {self.commit})"
            )
        last = self.last_index()
        if after > last + 1:
            raise RaftInvariantError(f"append at {after} leaves a gap after {last}")
        if after == last + 1:
            pass  # nothing to cut: the common case, a follower's next entries
        elif after >= self._offset:
            keep = self._upos(after)
            if keep < len(self._unstable) and self._unstable[keep].first != after:
                raise RaftInvariantError(f"truncation at {after} splits an entry")
            del self._unstable[keep:]
            self._handed = min(self._handed, keep)
        else:
            if self._storage.entries(after, 0)[0].first != after:
                raise RaftInvariantError(f"truncation at {after} splits an entry")
            self._offset = after
            self._stable_term = self._storage.term_at(after - 1)  # after - 1 >= commit >= start - 1
            self._unstable = []
            self._handed = 0
        self.append(entries)

    def commit_to(self, index: int) -> bool:
        """Raise the commit offset to ``index`` if higher; return whether it moved.

        Raises:
            RaftInvariantError: ``index`` is beyond the last offset.
        """
        if index <= self.commit:
            return False
        if index > self.last_index():
            raise RaftInvariantError(
                f"commit {index} beyond the last offset {self.last_index()}: log lost or corrupted"
            )
        self.commit = index
        return True

    def restore(self, reset: LogReset) -> None:
        """Start over with an empty log at ``reset.start`` (everything below is committed)."""
        if reset.start - 1 <= self.commit:
            raise RaftInvariantError(f"log reset to {reset.start} at or below commit {self.commit}")
        self._reset = reset
        self._reset_handed = False
        self._offset = reset.start
        self._stable_term = reset.prev_term
        self._unstable = []
        self._handed = 0
        self.commit = reset.start - 1
        self.applied = max(self.applied, reset.start - 1)

    # -- Ready bookkeeping ------------------------------------------------------------------

    def reset_pending(self) -> bool:
        """Whether a log reset is not yet durable (storage's entries are hidden until it is)."""
        return self._reset is not None

    def has_pending(self) -> bool:
        """Whether a Ready would carry log work (a reset or entries to persist)."""
        return (self._reset is not None and not self._reset_handed) or self._handed < len(
            self._unstable
        )

    def take_pending(self) -> tuple[LogReset | None, int | None, tuple[Entry, ...]]:
        """Hand out (log_reset, truncate_from, entries) for a Ready and mark them in progress.

        Called only when the previous Ready was advanced, so storage reflects every earlier Ready
        and a first entry at or below storage's last offset means a divergent tail to delete.
        """
        reset = None
        if self._reset is not None and not self._reset_handed:
            reset = self._reset
            self._reset_handed = True
        entries = tuple(self._unstable[self._handed :])
        self._handed = len(self._unstable)
        truncate_from = None
        if entries and self._reset is None and entries[0].first <= self._storage.last_index():
            truncate_from = entries[0].first
        return reset, truncate_from, entries

    def persisted(self, reset: LogReset | None, entries: Sequence[Entry]) -> None:
        """The driver made ``reset`` and ``entries`` of a Ready durable.

        Entries truncated in memory since that Ready stay unstable (their replacements come in the
        next Ready); the prefix that still matches becomes stable.
        """
        if reset is not None and self._reset is reset:
            self._reset = None
        self._handed = 0
        if self._reset is not None:
            return  # a newer reset will wipe what was just written
        for e in reversed(entries):
            if e.last >= self._offset and e.last <= self.last_index():
                pos = self._upos(e.last)
                # Mostly the very entry handed out (``is`` spares the field-by-field ``==``);
                # an equal one that replaced it after a truncation holds the same, too.
                if self._unstable[pos] is e or self._unstable[pos] == e:
                    del self._unstable[: pos + 1]
                    self._offset = e.last + 1
                    self._stable_term = e.term
                    break

    def applied_to(self, index: int) -> None:
        """The driver exposed everything up to ``index``."""
        if index > self.commit:
            raise RaftInvariantError(f"applied {index} beyond commit {self.commit}")
        self.applied = max(self.applied, index)
