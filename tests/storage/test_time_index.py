"""The sparse time index and ``PartitionLog.offset_for_time`` (Kafka's ListOffsets by time).

The answer for a timestamp T is the earliest offset whose record timestamp is >= T (timestamps
need not increase), or the log end (the commit bound, if lower) when there is none. A
hypothesis state machine checks it against a brute-force scan through appends with
non-monotonic timestamps, control batches, truncations, rolls, retention, compaction and
reopens; unit tests check the index itself, the bounded read, and its rebuild on recovery.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from kafkaesque.storage import (
    BatchType,
    LogConfig,
    PartitionLog,
    Record,
    build_batch,
    data_records,
    iter_batches,
)
from kafkaesque.storage._segment import Segment
from kafkaesque.storage._time_index import ENTRY_SIZE, NO_TIMESTAMP, TimeIndex

CONFIG = LogConfig(segment_bytes=2048, index_interval_bytes=128, segment_ms=None)


def _batch(*timestamps: int, key: bytes | None = None) -> bytes:
    return build_batch([Record(value=b"v" * 20, key=key, timestamp=t) for t in timestamps])


def _all_records(plog: PartitionLog, max_offset: int | None = None) -> list[Record]:
    """Every data record of the log, read from its start (the brute force)."""
    out: list[Record] = []
    offset, end = plog.log_start_offset, plog.log_end_offset
    while offset < end:
        result = plog.read(offset, 4096, max_offset=max_offset)
        if not result.data:
            break
        out.extend(data_records(memoryview(result.data), offset))
        offset = result.next_offset
    return out


def _brute_force(plog: PartitionLog, timestamp: int, max_offset: int | None = None) -> int:
    end = plog.log_end_offset if max_offset is None else min(max_offset, plog.log_end_offset)
    for record in _all_records(plog, max_offset):
        if record.offset < end and record.timestamp >= timestamp:
            return record.offset
    return end


# -- the index itself ---------------------------------------------------------------------------


def test_entries_hold_the_max_so_far_at_interval_boundaries(tmp_path: Path) -> None:
    index = TimeIndex(str(tmp_path / "t"), 100, interval_bytes=100)
    # (offset, position, size, max timestamp): timestamps go down and up again.
    batches = [(100, 0, 60, 50), (102, 60, 60, 30), (104, 120, 60, 80), (106, 180, 60, 10)]
    for offset, pos, size, ts in batches:
        index.maybe_add(offset, pos, size, ts)
    # No entry at position 0 (nothing before it); one after >= 100 bytes: before 104 at 120.
    assert index.entries() == [(50, 104, 120)]
    assert index.max_so_far == 80
    index.seal(108, 240)
    assert index.entries() == [(50, 104, 120), (80, 108, 240)]
    assert index.sealed_max_timestamp(240, 108) == 80
    assert index.sealed_max_timestamp(240, 107) is None  # not this segment's end
    assert index.sealed_max_timestamp(180, 106) is None
    # Below or at 50: nothing before 120 is excluded; above 50: start at 120, end at 240.
    assert index.lookup(50) == (0, 100, 120)
    assert index.lookup(51) == (120, 104, 240)
    assert index.lookup(81) == (240, 108, None)


def test_load_refuses_an_index_that_does_not_fit(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    index = TimeIndex(path, 0, interval_bytes=10)
    for i in range(5):
        index.maybe_add(i * 2, i * 20, 20, 1000 + i)
    index.flush()
    loaded = TimeIndex.load(path, 0, 10, log_size=100)
    assert loaded is not None and loaded.entries() == index.entries()
    assert TimeIndex.load(path, 0, 10, log_size=50) is None  # an entry past the log end
    assert TimeIndex.load(str(tmp_path / "missing"), 0, 10, log_size=100) is None
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[:-3])  # a partial entry
    assert TimeIndex.load(path, 0, 10, log_size=100) is None
    # Entries out of order (timestamps going down): garbage.
    Path(path).write_bytes(data[ENTRY_SIZE : 2 * ENTRY_SIZE] + data[:ENTRY_SIZE])
    assert TimeIndex.load(path, 0, 10, log_size=100) is None


# -- PartitionLog.offset_for_time -----------------------------------------------------------------


def test_offset_for_time_with_timestamps_out_of_order(tmp_path: Path) -> None:
    with PartitionLog.open(str(tmp_path), CONFIG) as plog:
        plog.append(_batch(100, 300, 200), term=1)  # offsets 0-2
        plog.append(_batch(150), term=1)  # 3
        plog.append(_batch(400, 50), term=1)  # 4-5
        assert plog.offset_for_time(0) == 0
        assert plog.offset_for_time(100) == 0
        assert plog.offset_for_time(101) == 1
        assert plog.offset_for_time(250) == 1  # 300 at offset 1, though 200 comes after
        assert plog.offset_for_time(301) == 4
        assert plog.offset_for_time(400) == 4
        assert plog.offset_for_time(401) == 6  # none: the log end
        # The commit bound: only offsets below it count, and it is the "end".
        assert plog.offset_for_time(301, max_offset=4) == 4
        assert plog.offset_for_time(101, max_offset=1) == 1
        assert plog.offset_for_time(0, max_offset=10) == 0


def test_control_batches_are_skipped(tmp_path: Path) -> None:
    with PartitionLog.open(str(tmp_path), CONFIG) as plog:
        noop = build_batch([], batch_type=BatchType.NOOP, last_offset_delta=0, max_timestamp=999)
        plog.append(noop, term=1)  # offset 0, consumers never see it
        plog.append(_batch(500), term=1)  # 1
        assert plog.offset_for_time(0) == 1
        assert plog.offset_for_time(600) == 2


def test_lookup_reads_one_interval_of_a_large_log(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes=16 * 1024, index_interval_bytes=512, segment_ms=None)
    with PartitionLog.open(str(tmp_path), config) as plog:
        for i in range(600):
            # Mostly increasing, with a dip every few batches.
            plog.append(_batch(i * 10 - (25 if i % 7 == 3 else 0)), term=1)
        assert plog.segment_count > 2
        seg = plog._segments[1]  # a sealed middle segment
        index = seg._loaded_time_index()
        assert len(index) > 5
        for ts in (seg.base_offset * 10 + 5, seg.base_offset * 10 + 333):
            pos, _, end = index.lookup(ts)
            assert end is not None and end - pos < 2 * config.index_interval_bytes
            found = plog.offset_for_time(ts)
            assert found == _brute_force(plog, ts)
            # The record found lies in the interval the index named.
            assert seg.locate(found) is not None and pos <= seg.locate(found) < end  # type: ignore[operator]


def test_sealed_max_timestamp_comes_from_the_index(tmp_path: Path) -> None:
    with PartitionLog.open(str(tmp_path), CONFIG) as plog:
        for ts in (700, 900, 800) * 20:
            plog.append(_batch(ts), term=1)
        assert plog.segment_count > 1
    with PartitionLog.open(str(tmp_path), CONFIG) as plog:
        seg = plog._segments[0]
        assert seg.sealed_max_timestamp() == 900
        # Read from the index's last entry, not from a walk of the log.
        assert seg._time_index is not None and seg._time_index.entries()[-1][0] == 900


# -- recovery -----------------------------------------------------------------------------------


def _fill(path: Path) -> list[int]:
    timestamps = [(i * 37) % 101 + 1000 * (i // 40) for i in range(120)]
    with PartitionLog.open(str(path), CONFIG) as plog:
        for ts in timestamps:
            plog.append(_batch(ts), term=1)
        assert plog.segment_count > 2
    return timestamps


PROBES = [0, 50, 100, 1000, 1050, 1101, 2000, 2040, 3000]


@pytest.mark.parametrize("damage", ["delete", "garbage", "truncate", "swap"])
def test_a_lost_or_damaged_time_index_is_rebuilt(tmp_path: Path, damage: str) -> None:
    _fill(tmp_path)
    with PartitionLog.open(str(tmp_path), CONFIG) as plog:
        want = {ts: _brute_force(plog, ts) for ts in PROBES}
    files = sorted(tmp_path.glob("*.timeindex"))
    assert len(files) > 2
    for f in files:
        data = f.read_bytes()
        if damage == "delete":
            f.unlink()
        elif damage == "garbage":
            f.write_bytes(b"\xff" * len(data))
        elif damage == "truncate":
            f.write_bytes(data[: len(data) // 2])
        else:
            # Still in order, but naming offsets and positions that are not batch starts.
            f.write_bytes(
                b"".join(
                    data[i : i + 8]
                    + bytes(
                        a ^ b
                        for a, b in zip(data[i + 8 : i + 16], b"\0\0\0\1\0\0\0\1", strict=True)
                    )
                    for i in range(0, len(data), ENTRY_SIZE)
                )
            )
    with PartitionLog.open(str(tmp_path), CONFIG) as plog:
        assert {ts: plog.offset_for_time(ts) for ts in PROBES} == want
    # The rebuilt files are whole again: a fresh open answers the same with them as they are.
    with PartitionLog.open(str(tmp_path), CONFIG) as plog:
        assert {ts: plog.offset_for_time(ts) for ts in PROBES} == want


def test_crash_leaves_the_active_time_index_to_recovery(tmp_path: Path) -> None:
    plog = PartitionLog.open(str(tmp_path), CONFIG)
    for ts in (10, 30, 20, 40) * 30:
        plog.append(_batch(ts), term=1)
    want = {ts: _brute_force(plog, ts) for ts in (5, 25, 35, 41)}
    plog.abandon()  # the active index's last entries were never written
    with PartitionLog.open(str(tmp_path), CONFIG) as plog:
        assert {ts: plog.offset_for_time(ts) for ts in want} == want


def test_every_time_index_goes_with_its_segment(tmp_path: Path) -> None:
    config = LogConfig(
        segment_bytes=2048, index_interval_bytes=128, segment_ms=None, retention_bytes=6000
    )
    with PartitionLog.open(str(tmp_path), config) as plog:
        for i in range(100):
            plog.append(_batch(i, key=b"k%d" % (i % 3)), term=1)
        assert plog.compact().segments_rewritten > 0
        assert plog.enforce_retention()
        plog.truncate(plog.log_end_offset - 5)
        for ts in (0, 80, 90, 94, 95):
            assert plog.offset_for_time(ts) == _brute_force(plog, ts)
        logs = {p.stem for p in tmp_path.glob("*.log")}
        assert {p.stem for p in tmp_path.glob("*.timeindex")} == logs
        plog.reset(500, 1)
        assert [p.name for p in tmp_path.glob("*.timeindex")] == [f"{500:020d}.timeindex"]


def _max_header_timestamp(seg: Segment) -> int:
    data, _ = seg.read(0, seg.size, None, verify=False) if seg.size else (b"", None)
    return max((h.max_timestamp for h in iter_batches(data, verify=False)), default=0)


def _check_time_index(seg: Segment) -> None:
    """Every entry is at a batch start (or the end), and no batch before it is newer."""
    index = seg._time_index
    if index is None:
        return
    data, _ = seg.read(0, seg.size, None, verify=False) if seg.size else (b"", None)
    starts: dict[int, tuple[int, int]] = {}  # position -> (base offset, max ts before it)
    pos, max_before = 0, NO_TIMESTAMP
    for header in iter_batches(data, verify=False):
        starts[pos] = (header.base_offset, max_before)
        max_before = max(max_before, header.max_timestamp)
        pos += header.size
    starts[pos] = (seg.next_offset, max_before)
    for ts, offset, position in index.entries():
        assert position in starts, f"{seg.log_path}: entry at {position} is no batch start"
        assert starts[position][0] == offset
        assert ts >= starts[position][1]
    assert index.max_so_far == max_before


# -- the model ----------------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


TIMESTAMPS = st.integers(min_value=0, max_value=2_000)
KEYS = [b"a", b"b", b"c", None]


class TimeIndexMachine(RuleBasedStateMachine):
    """Any sequence of operations: ``offset_for_time`` equals a scan of the whole log."""

    @initialize(
        segment_bytes=st.sampled_from([1024, 2048]),
        interval=st.sampled_from([1, 100, 400]),
    )
    def open_log(self, segment_bytes: int, interval: int) -> None:
        self.dir = tempfile.mkdtemp(prefix="kq-timeindex-")
        self.clock = FakeClock()
        self.config = LogConfig(
            segment_bytes=segment_bytes,
            index_interval_bytes=interval,
            retention_bytes=3000,
            # Record timestamps are 0-2,000 and the clock reads 1,000,000: segments whose
            # newest record is below 1,000 go by time (from their time index's end entry).
            retention_ms=999_000,
            segment_ms=None,
        )
        self.log = PartitionLog.open(self.dir, self.config, clock=self.clock)
        self.term = 1

    def teardown(self) -> None:
        if hasattr(self, "log"):
            self.log.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    @rule(records=st.lists(st.tuples(st.sampled_from(KEYS), TIMESTAMPS), min_size=1, max_size=6))
    def append(self, records: list[tuple[bytes | None, int]]) -> None:
        batch = build_batch([Record(value=b"x" * 30, key=k, timestamp=t) for k, t in records])
        self.log.append(batch, term=self.term)

    @rule(ts=TIMESTAMPS)
    def append_control(self, ts: int) -> None:
        self.term += 1
        noop = build_batch([], batch_type=BatchType.NOOP, last_offset_delta=0, max_timestamp=ts)
        self.log.append(noop, term=self.term)

    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        start, end = self.log.log_start_offset, self.log.log_end_offset
        if end <= start:
            return
        starts = []
        offset = start
        while offset < end:  # batch boundaries only
            result = self.log.read(offset, 1)
            starts.append(next(iter_batches(result.data)).base_offset)
            offset = result.next_offset
        self.log.truncate(data.draw(st.sampled_from([s for s in starts if s >= start])))

    @rule()
    def roll(self) -> None:
        self.log.roll()

    @rule()
    def retention(self) -> None:
        self.log.enforce_retention()

    @rule()
    def compact(self) -> None:
        self.log.compact()

    @rule(killed=st.booleans())
    def reopen(self, killed: bool) -> None:
        if killed:
            self.log.abandon()
        else:
            self.log.close()
        self.log = PartitionLog.open(self.dir, self.config, clock=self.clock)

    @invariant()
    def time_indexes_tell_the_truth(self) -> None:
        if not hasattr(self, "log"):
            return
        for seg in self.log._segments:
            _check_time_index(seg)
            if seg.sealed:  # retention reads this from the index's end entry
                assert seg.sealed_max_timestamp() == _max_header_timestamp(seg)

    @invariant()
    def lookups_equal_a_scan(self) -> None:
        if not hasattr(self, "log"):
            return
        records = _all_records(self.log)
        end = self.log.log_end_offset
        probes = {0, 1, 999, 1000, 2000, 2001} | {r.timestamp for r in records}
        probes |= {r.timestamp + 1 for r in records}
        for ts in sorted(probes):
            want = next((r.offset for r in records if r.timestamp >= ts), end)
            assert self.log.offset_for_time(ts) == want, f"timestamp {ts}"
        # Under a commit bound in the middle of the log.
        bound = (self.log.log_start_offset + end) // 2
        for ts in sorted(probes)[::3]:
            below = (r.offset for r in records if r.timestamp >= ts and r.offset < bound)
            got = self.log.offset_for_time(ts, max_offset=bound)
            assert got == next(below, min(bound, end)), f"{ts} below {bound}"


TestTimeIndexMachine = TimeIndexMachine.TestCase
TestTimeIndexMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


def test_a_segment_of_control_batches_ages_from_when_it_was_written(tmp_path: Path) -> None:
    """A new leader's no-op carries timestamp 0: a segment holding only that is as old as its
    file, as in Kafka, not 56 years old (retention took offset 0 of a new partition at its
    first check, and Spark's reader reported offset 0 lost)."""
    now = time.time() * 1000
    config = LogConfig(segment_ms=None, retention_ms=3_600_000)
    with PartitionLog.open(str(tmp_path), config, clock=lambda: now) as plog:
        plog.append(build_batch([], batch_type=BatchType.NOOP, last_offset_delta=0), term=1)
        plog.roll()
        plog.append(_batch(int(now)), term=1)
        assert plog.enforce_retention() == []
        assert plog.log_start_offset == 0
        hours_ago = time.time() - 2 * 3600
        os.utime(tmp_path / f"{0:020d}.log", (hours_ago, hours_ago))
        assert plog.enforce_retention() == [0]
        assert plog.log_start_offset == 1
