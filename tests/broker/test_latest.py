"""The key index of ``LATEST`` (``kafkaesque.broker._latest``) against a scan of the log.

Hypothesis drives a real ``PartitionLog`` through appends (tombstones and unkeyed records too),
commits, truncations of the uncommitted tail, rolls, compaction and retention in any order; after
every step the index, caught up in small chunks, must answer for every key exactly what a scan
of the committed log finds: the newest committed record of the key, or nothing when that record
is a tombstone or retention deleted it.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import cast

import hypothesis.strategies as st
import pytest
import trio
import trio.testing
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kafkaesque.broker._errors import RequestError
from kafkaesque.broker._latest import KeyIndex, LatestIndexes, catch_up, record_at
from kafkaesque.protocol import ErrorCode
from kafkaesque.raft import NotLeader, Role
from kafkaesque.raft.driver import RaftReplica
from kafkaesque.storage import (
    BatchType,
    LogConfig,
    PartitionLog,
    Record,
    build_batch,
    decode_records,
    iter_batches,
)

KEYS = [bytes([c]) for c in b"abcdefghijkl"] + [None]


def scan_latest(plog: PartitionLog, end: int) -> dict[bytes, Record]:
    """The model: every key's newest record below ``end`` with a value, by reading everything."""
    newest: dict[bytes, Record] = {}
    offset = plog.log_start_offset
    while offset < end:
        result = plog.read(offset, 1 << 20, max_offset=end)
        if not result.data:
            break
        pos = 0
        for header in iter_batches(result.data, verify=False):
            batch = result.data[pos : pos + header.size]
            pos += header.size
            if header.batch_type is BatchType.DATA:
                for record in decode_records(batch, header):
                    if record.key is not None and record.offset >= offset:
                        newest[record.key] = record
        offset = result.next_offset
    return {k: r for k, r in newest.items() if r.value is not None}


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class KeyIndexMachine(RuleBasedStateMachine):
    @initialize(retention_bytes=st.sampled_from([None, 1200, 2500]))
    def open_log(self, retention_bytes: int | None) -> None:
        self.dir = tempfile.mkdtemp(prefix="kq-latest-")
        config = LogConfig(
            segment_bytes=1024,
            index_interval_bytes=128,
            retention_bytes=retention_bytes,
            retention_ms=None,
            segment_ms=None,
        )
        self.log = PartitionLog.open(self.dir, config, clock=FakeClock())
        self.index = KeyIndex(self.log.log_start_offset)
        self.hw = 0  # the commit bound: offsets below it are committed
        self.batch_ends: list[int] = []  # next offset of every batch appended and not truncated
        self.value = 0

    def teardown(self) -> None:
        if hasattr(self, "log"):
            self.log.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    @rule(
        keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=8),
        tombstones=st.lists(st.booleans(), min_size=8, max_size=8),
    )
    def append(self, keys: list[bytes | None], tombstones: list[bool]) -> None:
        records = []
        for key, tombstone in zip(keys, tombstones, strict=False):
            self.value += 1
            value = None if tombstone and key is not None else b"v%06d" % self.value * 24
            records.append(Record(value=value, key=key))
        self.log.append(build_batch(records), term=1)
        self.batch_ends.append(self.log.log_end_offset)

    @rule(data=st.data())
    def commit(self, data: st.DataObject) -> None:
        ahead = [e for e in self.batch_ends if e > self.hw]
        if ahead:
            self.hw = data.draw(st.sampled_from(ahead))

    @rule(data=st.data())
    def truncate_uncommitted(self, data: st.DataObject) -> None:
        # Raft cuts only what is not committed: at a batch boundary at or above the commit bound.
        cuts = [e for e in self.batch_ends if e >= self.hw and e < self.log.log_end_offset]
        if cuts:
            cut = data.draw(st.sampled_from(cuts))
            self.log.truncate(cut)
            self.batch_ends = [e for e in self.batch_ends if e <= cut]

    @rule()
    def roll(self) -> None:
        if self.log.log_end_offset > self.log.active_base_offset:
            self.log.roll()

    @rule()
    def compact(self) -> None:
        self.log.compact(max_offset=self.hw)

    @rule()
    def retention(self) -> None:
        self.log.enforce_retention(max_offset=self.hw)

    @precondition(lambda self: hasattr(self, "log"))
    @invariant()
    def index_answers_what_a_scan_finds(self) -> None:
        for _ in range(1000):
            if catch_up(self.index, self.log, self.hw, max_bytes=300):
                break
        else:
            pytest.fail("catch_up never reached the commit bound")
        assert self.index.next_offset >= self.hw
        expected = scan_latest(self.log, self.hw)
        for key in KEYS:
            if key is None:
                continue
            offset = self.index.offset_of(key)
            found = None if offset is None else record_at(self.log, offset, key, self.hw)
            want = expected.get(key)
            if want is None:
                assert found is None, (key, offset)
            else:
                assert found is not None, (key, offset, want)
                assert (found.offset, found.value) == (want.offset, want.value)
        assert len(self.index) <= len(expected)


TestKeyIndexMachine = KeyIndexMachine.TestCase
TestKeyIndexMachine.settings = settings(max_examples=100, stateful_step_count=50, deadline=None)


def _batch(base: int, records: list[tuple[bytes | None, bytes | None]]) -> bytes:
    return build_batch([Record(value=v, key=k) for k, v in records], base_offset=base)


def test_feed_skips_the_records_before_next_offset_of_a_batch_that_starts_earlier() -> None:
    index = KeyIndex(2)
    index.feed(_batch(0, [(b"a", b"old"), (b"b", b"old"), (b"a", b"new")]), 3)
    assert index.offset_of(b"a") == 2
    assert index.offset_of(b"b") is None  # offset 1 is before the index's start
    assert index.next_offset == 3


def test_a_tombstone_removes_its_key_and_a_later_value_brings_it_back() -> None:
    index = KeyIndex(0)
    index.feed(_batch(0, [(b"k", b"1"), (b"k", None), (None, b"unkeyed")]), 3)
    assert index.offset_of(b"k") is None
    assert len(index) == 0
    index.feed(_batch(3, [(b"k", b"2")]), 4)
    assert index.offset_of(b"k") == 3


def test_feed_refuses_to_go_back_and_forget_below_moves_the_start() -> None:
    index = KeyIndex(0)
    index.feed(_batch(0, [(b"a", b"1"), (b"b", b"2")]), 2)
    with pytest.raises(ValueError):
        index.feed(b"", 1)
    assert index.forget_below(1) == 1
    assert index.offset_of(b"a") is None and index.offset_of(b"b") == 1
    assert index.forget_below(1) == 0
    with pytest.raises(ValueError):
        KeyIndex(-1)


def test_record_at_answers_none_for_an_offset_of_another_key_or_below_the_start(
    tmp_path: Path,
) -> None:
    plog = PartitionLog.open(str(tmp_path), LogConfig(segment_ms=None))
    try:
        plog.append(_batch(0, [(b"a", b"1"), (b"b", b"2")]), term=1)
        found = record_at(plog, 1, b"b", 2)
        assert found is not None and (found.offset, found.key, found.value) == (1, b"b", b"2")
        assert record_at(plog, 1, b"a", 2) is None
        assert record_at(plog, 5, b"a", 2) is None
    finally:
        plog.close()


# -- LatestIndexes: the leader's lifecycle of an index ---------------------------------------------


@dataclass(eq=False)
class FakeGroup:
    """What ``LatestIndexes`` reads of a ``RaftReplica``: a real log, a role, a commit index."""

    id: str
    log: PartitionLog
    role: Role = Role.LEADER
    commit_index: int = -1
    corrupt: object = None
    changed: trio.Event = field(default_factory=trio.Event)

    def commit(self) -> None:
        self.commit_index = self.log.log_end_offset - 1
        self.changed.set()
        self.changed = trio.Event()

    def report_corruption(self, exc: object) -> None:
        raise AssertionError(f"no corruption expected: {exc}")


def _indexes(group: FakeGroup, compacted: list[bool]) -> LatestIndexes:
    async def read_index(log_id: str) -> int:
        # No checkpoint, as a leader that confirmed at once: the lookup runs on without yielding.
        if group.role is not Role.LEADER:
            raise NotLeader(None)
        return group.commit_index

    return LatestIndexes(
        lambda: {group.id: cast(RaftReplica, group)}, lambda _: compacted[0], read_index
    )


async def _eventually(lookup: Callable[[], Awaitable[Record | None]]) -> Record | None:
    """``lookup`` once it stops answering NOT_READY (the index is built)."""
    for _ in range(200):
        try:
            return await lookup()
        except RequestError as exc:
            assert exc.code is ErrorCode.NOT_READY, exc
        await trio.sleep(0.05)
    raise AssertionError("the index was never ready")


async def test_a_leader_builds_its_index_in_the_background_and_drops_it_when_it_stops_leading(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    plog = PartitionLog.open(str(tmp_path), LogConfig(segment_ms=None))
    group = FakeGroup("beats/0", plog)
    # About 3 MiB: the build takes several chunks, with checkpoints between them.
    for n in range(300):
        plog.append(_batch(0, [(b"dev-%d" % (n % 50), b"%05d" % n + b"x" * 10_000)]), term=1)
    group.commit()
    compacted = [True]
    indexes = _indexes(group, compacted)
    lookup = partial(indexes.lookup, cast(RaftReplica, group))
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(indexes.run)
            with pytest.raises(RequestError) as early:
                await lookup(b"dev-7")
            assert early.value.code is ErrorCode.NOT_READY
            found = await _eventually(lambda: lookup(b"dev-7"))
            assert found is not None and found.value is not None
            assert found.value[:5] == b"00257"  # the newest of dev-7: 257 = 5 * 50 + 7
            assert indexes.keys("beats/0") == 50

            # Read your writes: a record committed just now is the answer at once.
            plog.append(_batch(0, [(b"dev-7", b"fresh"), (b"dev-8", None)]), term=1)
            group.commit()
            found = await lookup(b"dev-7")
            assert found is not None and found.value == b"fresh"
            assert await lookup(b"dev-8") is None  # a tombstone: no value
            assert indexes.keys("beats/0") == 49

            # Deposed: NOT_LEADER, and the index goes (memory only where a broker leads).
            group.role = Role.FOLLOWER
            with pytest.raises(RequestError) as deposed:
                await lookup(b"dev-7")
            assert deposed.value.code is ErrorCode.NOT_LEADER
            await trio.sleep(3)
            assert indexes.keys("beats/0") is None

            # Leading again: rebuilt from the log, the same answers.
            group.role = Role.LEADER
            found = await _eventually(lambda: lookup(b"dev-7"))
            assert found is not None and found.value == b"fresh"

            # No longer compacted: the index is dropped at its next look.
            compacted[0] = False
            await trio.sleep(3)
            assert indexes.keys("beats/0") is None
            nursery.cancel_scope.cancel()
    finally:
        plog.close()
