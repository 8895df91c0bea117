"""MemoryStorage (the RaftStorage contract), the core's log view, and follower progress."""

from __future__ import annotations

import pytest

from kafkaesque.raft import (
    Configuration,
    Entry,
    EntryKind,
    HardState,
    LogReset,
    MemoryStorage,
    RaftInvariantError,
    RaftLog,
)
from kafkaesque.raft._progress import Inflights, Progress, ProgressState, quorum_value

from .harness import entry, storage_with


def _disk() -> MemoryStorage:
    # terms by offset: 0:1  1-3:1  4:2  5-9:3
    return storage_with((1, 2, 3), [entry(1, 0), entry(1, 1, 3), entry(2, 4), entry(3, 5, 9)])


def test_empty_log_has_the_sentinel_term() -> None:
    disk = MemoryStorage()
    assert (disk.start_offset(), disk.last_index(), disk.term_at(-1)) == (0, -1, 0)
    assert disk.term_start_offset(1) == 0
    assert disk.initial_state().configs == ()


def test_term_at_any_offset_inside_a_batch() -> None:
    disk = _disk()
    assert [disk.term_at(i) for i in range(-1, 10)] == [0, 1, 1, 1, 1, 2, 3, 3, 3, 3, 3]
    with pytest.raises(IndexError):
        disk.term_at(10)


def test_entries_start_at_the_covering_entry_and_respect_the_budget() -> None:
    disk = _disk()
    assert [e.first for e in disk.entries(2, 0)] == [1]  # at least one entry
    assert [e.first for e in disk.entries(2, 2)] == [1, 4]
    assert [e.first for e in disk.entries(0, 1 << 20)] == [0, 1, 4, 5]
    assert disk.entries(10, 100) == []


def test_term_start_offsets() -> None:
    disk = _disk()
    assert [disk.term_start_offset(t) for t in (0, 1, 2, 3, 4)] == [0, 0, 4, 5, 10]


def test_truncate_compact_reset_and_configuration_history() -> None:
    conf = Configuration.of([1, 2], [3])
    disk = _disk()
    disk.append([Entry(3, 10, 10, EntryKind.CONFIG, conf.encode()), entry(3, 11)])
    assert [off for off, _ in disk.initial_state().configs] == [-1, 10]
    with pytest.raises(ValueError):
        disk.truncate(2)  # inside an entry
    disk.truncate(10)
    assert disk.last_index() == 9 and [o for o, _ in disk.initial_state().configs] == [-1]
    disk.compact(5)
    assert (disk.start_offset(), disk.term_at(4), disk.term_start_offset(1)) == (5, 2, 5)
    with pytest.raises(IndexError):
        disk.term_at(3)
    disk.reset(LogReset(100, 7, conf))
    assert (disk.start_offset(), disk.last_index(), disk.term_at(99)) == (100, 99, 7)
    assert disk.initial_state().configs == ((99, conf.encode()),)
    with pytest.raises(ValueError):
        disk.append([entry(6, 100)])  # a term older than the one at start - 1


def test_log_view_joins_storage_and_the_unstable_tail() -> None:
    disk = _disk()
    log = RaftLog(disk, commit=3, applied=None)
    log.truncate_and_append([entry(4, 5, 6), entry(4, 7)])  # replaces 5-9/3 in memory only
    assert disk.last_index() == 9  # storage still has the stale tail ...
    assert log.last_index() == 7 and log.term_at(6) == 4  # ... the view ignores it
    assert [e.first for e in log.entries(1, 1 << 20)] == [1, 4, 5, 7]
    assert [log.term_start_offset(t) for t in (2, 3, 4, 5)] == [4, 5, 5, 8]
    assert log.last_index_of_term(2) == 4 and log.last_index_of_term(3) is None
    reset, truncate_from, entries = log.take_pending()
    assert reset is None and truncate_from == 5 and [e.first for e in entries] == [5, 7]


def test_log_refuses_impossible_requests() -> None:
    disk = _disk()
    with pytest.raises(RaftInvariantError):
        RaftLog(disk, commit=12, applied=None)  # a persisted commit beyond the log
    log = RaftLog(disk, commit=4, applied=None)
    with pytest.raises(RaftInvariantError):
        log.commit_to(10)
    with pytest.raises(RaftInvariantError):
        log.truncate_and_append([entry(5, 6)])  # splits the entry 5-9


def test_log_view_bounds_after_retention_and_under_a_pending_reset() -> None:
    disk = _disk()
    log = RaftLog(disk, commit=9, applied=9)
    log.append([entry(3, 10, 11)])  # unstable
    disk.compact(5)  # retention, behind the view's back (as the broker's is): start - 1 = 4
    assert [log.term_at(i) for i in (4, 5, 9, 10, 11)] == [2, 3, 3, 3, 3]
    for outside in (3, 12):
        with pytest.raises(RaftInvariantError):
            log.term_at(outside)
    assert log.match_term(4, 2) and log.match_term(9, 3) and log.match_term(11, 3)
    for index, term in ((3, 1), (4, 1), (9, 2), (11, 2), (12, 3)):
        assert not log.match_term(index, term), (index, term)
    assert [e.first for e in log.entries(5, 1 << 20)] == [5, 10]
    assert [e.first for e in log.entries(11, 0)] == [10]
    for outside in (4, 12):
        with pytest.raises(RaftInvariantError):
            log.entries(outside, 1 << 20)

    log.restore(LogReset(100, 7, Configuration.of([1, 2, 3])))  # empty until it is durable
    assert log.term_at(99) == 7 and log.match_term(99, 7)
    assert not log.match_term(99, 6) and not log.match_term(98, 7) and not log.match_term(100, 7)
    for outside in (98, 100):
        with pytest.raises(RaftInvariantError):
            log.term_at(outside)
    for outside in (99, 100):
        with pytest.raises(RaftInvariantError):
            log.entries(outside, 1 << 20)


def test_log_view_term_at_its_durable_end_follows_truncation_persistence_and_reset() -> None:
    # The view keeps the term of its last durable entry (the one asked for most): every way
    # that entry changes must change it too.
    disk = _disk()
    log = RaftLog(disk, commit=3, applied=None)
    assert (log.term_at(9), log.last_term(), log.match_term(9, 3)) == (3, 3, True)
    log.truncate_and_append([entry(4, 5, 6)])  # cuts into the durable part: 4 is its end now
    assert (log.term_at(4), log.match_term(4, 2), log.match_term(4, 3)) == (2, True, False)
    assert (log.term_at(6), log.last_term()) == (4, 4)
    _, truncate_from, entries = log.take_pending()
    assert truncate_from == 5
    disk.truncate(5)
    disk.append(entries)
    log.persisted(None, entries)
    assert (log.stable_last(), log.term_at(6), log.last_term(), log.match_term(6, 4)) == (
        6,
        4,
        4,
        True,
    )
    log.append([entry(5, 7)])  # unstable: the durable end's term stays
    assert (log.term_at(6), log.term_at(7), log.last_term()) == (4, 5, 5)
    log.restore(LogReset(100, 7, Configuration.of([1, 2, 3])))
    assert (log.term_at(99), log.last_term(), log.match_term(99, 7)) == (7, 7, True)
    assert RaftLog(disk, commit=6, applied=None).last_term() == 4  # read from storage at start


def test_restart_commit_is_at_least_start_minus_one() -> None:
    disk = _disk()
    disk.compact(5)
    disk.set_hard_state(HardState(3, None, 1))
    assert RaftLog(disk, commit=1, applied=None).commit == 4


def test_inflight_window_and_stale_rejections() -> None:
    window = Inflights(2)
    window.add(3)
    window.add(7)
    assert window.full()
    with pytest.raises(RaftInvariantError):
        window.add(9)
    window.free_le(5)
    assert len(window) == 1

    pr = Progress(next_index=10, max_inflight=4, is_learner=False)
    pr.maybe_update(4)
    pr.become_replicate()
    pr.sent_entries(8)
    pr.sent_entries(12)
    assert pr.next == 13
    assert not pr.maybe_decr_to(3, 0)  # rejected below the match: stale
    assert pr.maybe_decr_to(8, 6)
    assert (pr.state, pr.next) == (ProgressState.PROBE, 6)
    assert not pr.maybe_decr_to(9, 5)  # not the probe we sent: stale
    assert pr.maybe_decr_to(5, 0) and pr.next == 5  # never at or below the match


@pytest.mark.parametrize(
    ("values", "expected"),
    [([5], 5), ([5, 3, 9], 5), ([5, 3, 9, 1], 3), ([7, 7, 1, 1, 1], 1), ([], -1)],
)
def test_quorum_value(values: list[int], expected: int) -> None:
    assert quorum_value(values, len(values)) == expected
