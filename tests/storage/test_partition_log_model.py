"""PartitionLog against a simple in-memory model: any sequence of operations, same log.

Hypothesis drives append / read / truncate / roll / reopen (clean and after a kill) / retention
(by size and by time) / compaction in any order; after every step the whole log, read back from
its start, must equal the model, and every offset must report the term it was appended with.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from kafkaesque.storage import (
    AppendResult,
    LogConfig,
    OffsetOutOfRangeError,
    PartitionLog,
    Record,
    build_batch,
    data_records,
)

KEYS = [b"a", b"b", b"c", b"d", None]


@dataclass(frozen=True)
class ModelRecord:
    offset: int
    key: bytes | None
    value: bytes | None


@dataclass(frozen=True)
class ModelBatch:
    base: int
    last: int
    term: int
    timestamp: int


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class PartitionLogMachine(RuleBasedStateMachine):
    @initialize(
        segment_bytes=st.sampled_from([1024, 2048, 8192]),
        retention_bytes=st.sampled_from([None, 3000, 6000]),
    )
    def open_log(self, segment_bytes: int, retention_bytes: int | None) -> None:
        self.dir = tempfile.mkdtemp(prefix="kq-model-")
        self.clock = FakeClock()
        self.config = LogConfig(
            segment_bytes=segment_bytes,
            index_interval_bytes=256,
            retention_bytes=retention_bytes,
            retention_ms=60_000,
            segment_ms=None,
        )
        self.log = PartitionLog.open(self.dir, self.config, clock=self.clock)
        self.records: list[ModelRecord] = []
        self.batches: list[ModelBatch] = []
        self.term = 1
        self.next_value = 0

    def teardown(self) -> None:
        if hasattr(self, "log"):
            self.log.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    # -- operations ------------------------------------------------------------------------

    @rule(
        keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=12),
        new_term=st.booleans(),
        tombstone=st.booleans(),
    )
    def append(self, keys: list[bytes | None], new_term: bool, tombstone: bool) -> None:
        if new_term:
            self.term += 1
        records = self._new_records(keys, tombstone)
        self._appended(self.log.append(build_batch(records), term=self.term), records, self.term)

    @rule(
        batches=st.lists(
            st.tuples(
                st.lists(st.sampled_from(KEYS), min_size=1, max_size=12),
                st.booleans(),
                st.booleans(),
            ),
            min_size=1,
            max_size=8,
        )
    )
    def append_many(self, batches: list[tuple[list[bytes | None], bool, bool]]) -> None:
        # A group write: the same log as appending one by one (rolls included).
        pending = []
        for keys, new_term, tombstone in batches:
            self.term += new_term
            pending.append((self._new_records(keys, tombstone), self.term))
        results = self.log.append_many([(build_batch(r), term) for r, term in pending])
        for result, (records, term) in zip(results, pending, strict=True):
            self._appended(result, records, term)

    def _new_records(self, keys: list[bytes | None], tombstone: bool) -> list[Record]:
        records = []
        for i, key in enumerate(keys):
            self.next_value += 1
            value = None if tombstone and i == 0 and key is not None else b"v%d" % self.next_value
            records.append(Record(value=value, key=key, timestamp=int(self.clock.now)))
        return records

    def _appended(self, result: AppendResult, records: list[Record], term: int) -> None:
        assert result.base_offset == (self.batches[-1].last + 1 if self.batches else 0) or (
            not self.batches
        )
        for i, r in enumerate(records):
            self.records.append(ModelRecord(result.base_offset + i, r.key, r.value))
        self.batches.append(
            ModelBatch(result.base_offset, result.last_offset, term, int(self.clock.now))
        )
        self.clock.now += 10

    @rule(data=st.data(), max_bytes=st.sampled_from([1, 200, 1000, 1 << 20]))
    def read_somewhere(self, data: st.DataObject, max_bytes: int) -> None:
        start, end = self.log.log_start_offset, self.log.log_end_offset
        offset = data.draw(st.integers(start, end))
        result = self.log.read(offset, max_bytes)
        got = [r for r in _records(result.data) if r.offset >= offset]
        want = [r for r in self.records if r.offset >= offset]
        assert got == want[: len(got)]
        if want:
            # Whole batches come back, possibly emptied by compaction, but always progress.
            assert result.data, f"read at {offset} returned nothing though records follow"
            assert result.next_offset > offset
            assert not got or result.next_offset > got[-1].offset
        if not result.data:
            assert result.next_offset == offset

    @rule(data=st.data())
    def read_out_of_range(self, data: st.DataObject) -> None:
        start, end = self.log.log_start_offset, self.log.log_end_offset
        offset = data.draw(st.sampled_from([start - 1, end + 1, end + 100]))
        if offset < 0:
            return
        try:
            self.log.read(offset)
        except OffsetOutOfRangeError as exc:
            assert exc.log_start_offset == start and exc.log_end_offset == end
        else:
            raise AssertionError(f"read at {offset} outside [{start}, {end}] did not fail")

    @precondition(lambda self: bool(self.batches))
    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        candidates = [b for b in self.batches if b.base >= self.log.log_start_offset]
        if not candidates:
            return
        cut = data.draw(st.sampled_from(candidates)).base
        self.log.truncate(cut)
        self.records = [r for r in self.records if r.offset < cut]
        self.batches = [b for b in self.batches if b.base < cut]
        assert self.log.log_end_offset == cut
        self.term = max([b.term for b in self.batches], default=self.term)

    @rule()
    def roll(self) -> None:
        self.log.roll()

    @rule(killed=st.booleans())
    def reopen(self, killed: bool) -> None:
        if killed:
            self.log.abandon()
        else:
            self.log.close()
        self.log = PartitionLog.open(self.dir, self.config, clock=self.clock)
        assert self.log.recovery is None, "nothing was torn, yet recovery cut bytes"

    @rule()
    def retention_by_size(self) -> None:
        self._retention(size_only=True)

    @rule(advance_ms=st.sampled_from([0, 30_000, 61_000, 200_000]))
    def retention_by_time(self, advance_ms: int) -> None:
        self.clock.now += advance_ms
        self._retention(size_only=False)

    def _retention(self, *, size_only: bool) -> None:
        # With no batch old enough for time retention, only the size limit may delete.
        horizon = self.clock.now - self.config.retention_ms  # type: ignore[operator]
        size_only = size_only and all(b.timestamp >= horizon for b in self.batches)
        before = self.log.log_start_offset
        segments_before = self.log.segments()
        deleted = self.log.enforce_retention()
        start = self.log.log_start_offset
        assert start >= before
        assert [base for base, _, _ in segments_before[: len(deleted)]] == deleted
        if size_only and self.config.retention_bytes is not None and deleted:
            # It deletes only while the rest still holds at least the retained size.
            assert self.log.size_bytes >= self.config.retention_bytes
        self._drop_below(start)

    @rule()
    def compact(self) -> None:
        active_base = self.log.active_base_offset
        self.log.compact()
        latest = {r.key: r.offset for r in self.records if r.key is not None}
        self.records = [
            r
            for r in self.records
            if r.offset >= active_base or r.key is None or latest[r.key] == r.offset
        ]

    def _drop_below(self, start: int) -> None:
        self.records = [r for r in self.records if r.offset >= start]
        self.batches = [b for b in self.batches if b.last >= start]

    # -- the log equals the model ----------------------------------------------------------

    @invariant()
    def log_equals_model(self) -> None:
        if not hasattr(self, "log"):
            return
        start, end = self.log.log_start_offset, self.log.log_end_offset
        got: list[ModelRecord] = []
        offset = start
        while offset < end:
            result = self.log.read(offset, 4096)
            if not result.data:
                break
            got.extend(r for r in _records(result.data) if r.offset >= offset)
            offset = result.next_offset
        assert got == self.records
        expected_end = self.batches[-1].last + 1 if self.batches else end
        assert end == expected_end

    @invariant()
    def terms_match(self) -> None:
        if not hasattr(self, "log"):
            return
        for batch in self.batches:
            if batch.last >= self.log.log_start_offset - 1:
                assert self.log.term_at(batch.last) == batch.term
                assert self.log.term_at(max(batch.base, self.log.log_start_offset)) == batch.term


def _records(data: bytes | memoryview) -> list[ModelRecord]:
    return [ModelRecord(r.offset, r.key, r.value) for r in data_records(data)]


PartitionLogMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=50, deadline=None
)
TestPartitionLogModel = PartitionLogMachine.TestCase
