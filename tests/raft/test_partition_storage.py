"""PartitionStorage answers every RaftStorage query exactly as the in-memory model does.

Hypothesis applies the same random Readys (appends of data, no-op and configuration entries,
truncations, log resets, new terms and votes) to ``MemoryStorage`` and to a ``PartitionStorage``
over a real ``PartitionLog``, reopening the latter at random, and compares every query.
"""

from __future__ import annotations

import shutil
import tempfile

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from kafkaesque.raft import (
    Configuration,
    Entry,
    EntryKind,
    HardState,
    LogReset,
    MemoryStorage,
    Ready,
)
from kafkaesque.raft.driver import PartitionStorage
from kafkaesque.storage import LogConfig, PartitionLog, Record, build_batch, decode_records

BOOT = Configuration(voters=frozenset({1, 2, 3}))
CONFIG = LogConfig(segment_bytes=4096, index_interval_bytes=128)


def _ready(
    *,
    entries: tuple[Entry, ...] = (),
    truncate_from: int | None = None,
    log_reset: LogReset | None = None,
    hard_state: HardState | None = None,
) -> Ready:
    return Ready(
        soft_state=None,
        hard_state=hard_state,
        log_reset=log_reset,
        truncate_from=truncate_from,
        entries=entries,
        messages=(),
        committed=None,
        read_states=(),
        dropped_reads=(),
    )


def _payload(entry: Entry) -> object:
    if entry.kind is EntryKind.DATA:
        return [r.value for r in decode_records(entry.data)]
    return entry.data


class StorageMachine(RuleBasedStateMachine):
    @initialize()
    def start(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="kq-raftstore-")
        self.model = MemoryStorage(BOOT)
        self.real = PartitionStorage(PartitionLog.open(self.dir, CONFIG), BOOT)
        self.term = 1
        self.counter = 0

    def teardown(self) -> None:
        if hasattr(self, "real"):
            self.real.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    def _next(self) -> int:
        return self.model.last_index() + 1

    @rule(
        kinds=st.lists(st.sampled_from(list(EntryKind)), min_size=1, max_size=5),
        new_term=st.booleans(),
    )
    def append(self, kinds: list[EntryKind], new_term: bool) -> None:
        if new_term:
            self.term += 1
        entries = []
        first = self._next()
        for kind in kinds:
            self.counter += 1
            if kind is EntryKind.DATA:
                count = 1 + self.counter % 4
                values = [b"%d-%d" % (self.counter, i) for i in range(count)]
                data = build_batch([Record(value=v) for v in values])
            elif kind is EntryKind.CONFIG:
                count = 1
                data = Configuration(voters=frozenset({1, 2, 3 + self.counter % 2})).encode()
            else:
                count, data = 1, b""
            entries.append(Entry(self.term, first, first + count - 1, kind, data))
            first += count
        rd = _ready(entries=tuple(entries))
        self.model.persist(rd)
        self.real.persist(rd)

    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        boundaries = [e.first for e in self.model.all_entries()]
        if not boundaries:
            return
        cut = data.draw(st.sampled_from(boundaries))
        rd = _ready(truncate_from=cut)
        self.model.persist(rd)
        self.real.persist(rd)

    @rule(gap=st.integers(0, 50))
    def reset(self, gap: int) -> None:
        start = self._next() + gap
        rd = _ready(log_reset=LogReset(start, self.term, BOOT))
        self.model.persist(rd)
        self.real.persist(rd)

    @rule(vote=st.sampled_from([None, 1, 2, 3]))
    def vote(self, vote: int | None) -> None:
        self.term += 1
        rd = _ready(hard_state=HardState(self.term, vote, -1))
        self.model.persist(rd)
        self.real.persist(rd)

    @rule(again=st.booleans())
    def reopen(self, again: bool) -> None:
        """Reopen with the bootstrap given again, or with none (as a broker does once the
        partition was reassigned): the first start kept it."""
        self.real.close()
        self.real = PartitionStorage(PartitionLog.open(self.dir, CONFIG), BOOT if again else None)

    @invariant()
    def same_answers(self) -> None:
        if not hasattr(self, "real"):
            return
        m, r = self.model, self.real
        assert r.start_offset() == m.start_offset()
        assert r.last_index() == m.last_index()
        for i in range(m.start_offset() - 1, m.last_index() + 1):
            assert r.term_at(i) == m.term_at(i), i
        # Outside [start - 1, last], both refuse: the core's log view relies on it to find
        # out-of-range lookups without asking for the start first.
        for i in (m.start_offset() - 2, m.last_index() + 1):
            for storage in (m, r):
                with pytest.raises(IndexError):
                    storage.term_at(i)
        got = list(r.entries(m.start_offset(), 1 << 30))
        want = list(m.entries(m.start_offset(), 1 << 30))
        assert [(e.term, e.first, e.last, e.kind) for e in got] == [
            (e.term, e.first, e.last, e.kind) for e in want
        ]
        assert [_payload(e) for e in got] == [_payload(e) for e in want]
        for term in range(0, self.term + 2):
            assert r.term_start_offset(term) == m.term_start_offset(term), term
        ri, mi = r.initial_state(), m.initial_state()
        assert ri.configs == mi.configs
        assert (ri.hard_state.term, ri.hard_state.vote) == (mi.hard_state.term, mi.hard_state.vote)


StorageMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)
TestPartitionStorage = StorageMachine.TestCase
