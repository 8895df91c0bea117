"""The term → start-offset table (Kafka's leader-epoch cache)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kafkaesque.storage import LogConfig, PartitionLog, Record, build_batch
from kafkaesque.storage._term_table import TermTable


def test_lookups_and_term_ends(tmp_path: Path) -> None:
    table = TermTable(str(tmp_path))
    for term, start in [(1, 0), (3, 10), (4, 25)]:
        table.assign(term, start)
    assert [table.term_at(o) for o in (0, 9, 10, 24, 25, 1000)] == [1, 1, 3, 3, 4, 4]
    assert table.term_at(-1) is None
    assert table.end_of(2, 40) == (1, 10)  # term 2 never led here: term 1 ends at 10
    assert table.end_of(4, 40) == (4, 40)
    assert table.end_of(0, 40) == (0, 0)
    assert TermTable.load(str(tmp_path)).entries() == []  # changes stay in memory until saved
    table.save()
    assert TermTable.load(str(tmp_path)).entries() == table.entries()


def test_terms_must_increase(tmp_path: Path) -> None:
    table = TermTable(str(tmp_path))
    table.assign(2, 5)
    table.assign(2, 9)  # same term again: nothing to record
    with pytest.raises(ValueError):
        table.assign(1, 10)
    with pytest.raises(ValueError):
        table.assign(3, 5)


def test_truncation_from_both_ends(tmp_path: Path) -> None:
    table = TermTable(str(tmp_path))
    for term, start in [(1, 0), (2, 10), (3, 20), (4, 30)]:
        table.assign(term, start)
    table.truncate_from_end(20)
    assert table.entries() == [(1, 0), (2, 10)]
    table.truncate_from_start(15)  # offset 14 (term 2) must still answer
    assert table.entries() == [(2, 10)]
    assert table.term_at(14) == 2


def test_the_log_answers_the_term_before_its_start_after_a_reset(tmp_path: Path) -> None:
    with PartitionLog.open(str(tmp_path), LogConfig()) as log:
        log.append(build_batch([Record(value=b"a")]), term=1)
        log.reset(100, term_before_start=6)
        assert (log.log_start_offset, log.log_end_offset) == (100, 100)
        assert log.term_at(99) == 6 and log.term_at(100) is None
        log.append(build_batch([Record(value=b"b")]), term=7)
    with PartitionLog.open(str(tmp_path), LogConfig()) as log:
        assert (log.log_start_offset, log.log_end_offset, log.term_at(100)) == (100, 101, 7)
        assert log.term_at(99) == 6


def test_a_reset_to_offset_zero_keeps_the_term_it_was_given(tmp_path: Path) -> None:
    """Regression (found by the Raft storage differential test): the sentinel term 0 at offset
    -1 applies only when nothing else is known."""
    with PartitionLog.open(str(tmp_path), LogConfig()) as log:
        assert log.term_at(-1) == 0
        log.reset(0, term_before_start=1)
        assert log.term_at(-1) == 1


def test_terms_learnt_since_the_last_save_survive_a_kill(tmp_path: Path) -> None:
    """The table is saved when segments seal; recovery relearns newer terms from the batches."""
    config = LogConfig(segment_bytes=1024)
    log = PartitionLog.open(str(tmp_path), config)
    for term in (1, 1, 2, 3, 3, 5):
        for _ in range(4):
            log.append(build_batch([Record(value=b"x" * 40)]), term=term)
    want = log.term_starts()
    assert log.segment_count > 1
    log.abandon()  # no close: the table file lags behind the log
    with PartitionLog.open(str(tmp_path), config) as log:
        assert log.term_starts() == want
        assert [log.term_at(o) for o in range(24)] == [1] * 8 + [2] * 4 + [3] * 8 + [5] * 4
