"""The term → start-offset table of a partition (Kafka's leader-epoch cache).

Entry ``(term, start)`` says: the first batch of ``term`` in this log starts at offset ``start``.
Terms and starts both strictly increase. Raft uses the table to answer "what is the term of the
entry at offset X" without reading the log, and "where does term T end" for fast divergence
backtracking.

The file is written whole (temp file, fsync, rename, fsync of the directory) by ``save``, which
``PartitionLog`` calls when it seals a segment, resets the log, and closes; in between, changes
stay in memory. That is safe because recovery validates the active segment batch by batch and
rebuilds the table's entries from there on (``rebuild_from``), while every term that began in a
sealed segment was saved when that segment was sealed. Not fsyncing on every new term matters:
an election in 1,000 groups would otherwise cost 2,000 fsyncs on the broker's event loop.
"""

from __future__ import annotations

from bisect import bisect_right

from ._statefile import read_state_file, write_state_file

FILE_NAME = "term-starts"


class TermTable:
    """Terms and their start offsets, persisted in ``<dir>/term-starts``. Not thread-safe."""

    def __init__(self, directory: str) -> None:
        self._directory = directory
        # Invariant: both lists strictly increase and have the same length.
        self._terms: list[int] = []
        self._starts: list[int] = []
        self._dirty = False

    @classmethod
    def load(cls, directory: str) -> TermTable:
        table = cls(directory)
        state = read_state_file(directory, FILE_NAME)
        if state is not None:
            for term, start in state["entries"]:
                table._terms.append(int(term))
                table._starts.append(int(start))
            table._check()
        return table

    def _check(self) -> None:
        for i in range(1, len(self._terms)):
            if not (self._terms[i] > self._terms[i - 1] and self._starts[i] > self._starts[i - 1]):
                raise AssertionError(f"term table out of order: {self.entries()}")

    def _persist(self) -> None:
        self._check()
        self._dirty = True

    def save(self) -> None:
        """Make the table durable (if it changed since the last save)."""
        if self._dirty:
            write_state_file(self._directory, FILE_NAME, {"entries": self.entries()})
            self._dirty = False

    def rebuild_from(self, offset: int, seen: list[tuple[int, int]], end_offset: int) -> None:
        """Recovery: replace what the table says from ``offset`` on by ``seen``.

        ``seen`` lists the ``(term, first offset)`` of the batches actually found from ``offset``
        to ``end_offset`` (the validated active segment), which are the truth there.
        """
        self.truncate_from_end(offset)
        for term, start in seen:
            if term != self.last_term:
                self.assign(term, start)
        self.truncate_from_end(end_offset)

    def entries(self) -> list[tuple[int, int]]:
        return list(zip(self._terms, self._starts, strict=True))

    @property
    def last_term(self) -> int:
        return self._terms[-1] if self._terms else 0

    def term_at(self, offset: int) -> int | None:
        """The term of the batch holding ``offset``, or None if the table does not reach back."""
        i = bisect_right(self._starts, offset)
        return self._terms[i - 1] if i else None

    def start_of(self, term: int) -> int | None:
        """The first offset of ``term`` in the log, or None if the log holds no batch of it."""
        i = bisect_right(self._terms, term)
        return self._starts[i - 1] if i and self._terms[i - 1] == term else None

    def end_of(self, term: int, log_end_offset: int) -> tuple[int, int]:
        """Kafka's OffsetForLeaderEpoch: the largest term <= ``term`` and the offset where it ends.

        Returns ``(found_term, end_offset)``: ``end_offset`` is the start of the next higher term
        in the log, or ``log_end_offset``. ``(0, 0)`` when the log holds no term <= ``term``.
        """
        i = bisect_right(self._terms, term)
        if not i:
            return 0, 0
        end = self._starts[i] if i < len(self._starts) else log_end_offset
        return self._terms[i - 1], end

    def assign(self, term: int, start: int) -> None:
        """Record that ``term`` begins at ``start`` (no-op if ``term`` is already the last term)."""
        if self._terms and term == self._terms[-1]:
            return
        if self._terms and (term < self._terms[-1] or start <= self._starts[-1]):
            raise ValueError(
                f"term {term} at {start} does not follow the last entry "
                f"({self._terms[-1]} at {self._starts[-1]})"
            )
        self._terms.append(term)
        self._starts.append(start)
        self._persist()

    def truncate_from_end(self, end_offset: int) -> None:
        """Drop entries whose start is at or past ``end_offset`` (the log was cut there)."""
        i = bisect_right(self._starts, end_offset - 1)
        if i < len(self._starts):
            del self._terms[i:]
            del self._starts[i:]
            self._persist()

    def truncate_from_start(self, start_offset: int) -> None:
        """Forget the entries that only describe offsets below ``start_offset - 1``.

        Raft needs the term of the entry just before the log start (prevLogTerm when it sends
        from the start), so the entry covering ``start_offset - 1`` stays.
        """
        i = bisect_right(self._starts, start_offset - 1)
        if i > 1:
            del self._terms[: i - 1]
            del self._starts[: i - 1]
            self._persist()

    def reset(self, term: int, start: int) -> None:
        """Replace the table by the single entry ``(term, start)`` (a log reset); saved at once."""
        self._terms = [term] if term > 0 else []
        self._starts = [start] if term > 0 else []
        self._persist()
        self.save()
