"""The fsync policy decides what may be acknowledged (``durable_end_offset``)."""

from __future__ import annotations

import threading
from pathlib import Path

from kafkaesque.storage import FsyncPolicy, LogConfig, PartitionLog, Record, build_batch

BATCH = build_batch([Record(value=b"x")])


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def test_always_acknowledges_only_what_a_flush_made_durable(tmp_path: Path) -> None:
    with PartitionLog.open(str(tmp_path), LogConfig(fsync=FsyncPolicy.ALWAYS)) as log:
        for _ in range(3):
            log.append(BATCH, term=1)
        assert log.durable_end_offset == 0
        assert log.maybe_flush()  # group commit: one fsync covers all three appends
        assert log.durable_end_offset == 3
        assert not log.maybe_flush()  # nothing new to flush


def test_interval_flushes_on_its_schedule_and_acknowledges_written_data(tmp_path: Path) -> None:
    clock = Clock()
    config = LogConfig(fsync=FsyncPolicy.INTERVAL, fsync_interval_ms=100)
    with PartitionLog.open(str(tmp_path), config, clock=clock) as log:
        log.append(BATCH, term=1)
        assert log.durable_end_offset == 1 and log.flushed_end_offset == 0
        clock.now = 50
        assert not log.maybe_flush()
        clock.now = 150
        assert log.maybe_flush() and log.flushed_end_offset == 1


def test_never_leaves_flushing_to_roll_and_close(tmp_path: Path) -> None:
    with PartitionLog.open(str(tmp_path), LogConfig(fsync=FsyncPolicy.NEVER)) as log:
        log.append(BATCH, term=1)
        assert not log.maybe_flush()
        assert log.durable_end_offset == 1 and log.flushed_end_offset == 0


def test_a_flush_ticket_runs_on_another_thread(tmp_path: Path) -> None:
    with PartitionLog.open(str(tmp_path), LogConfig()) as log:
        log.append(BATCH, term=1)
        ticket = log.flush_ticket()
        log.append(BATCH, term=1)  # appends go on while the fsync runs
        worker = threading.Thread(target=ticket.run)
        worker.start()
        worker.join()
        log.flushed(ticket)
        assert log.durable_end_offset == 1  # the ticket covered what was there when it was made


def test_a_ticket_from_before_a_truncation_is_ignored(tmp_path: Path) -> None:
    with PartitionLog.open(str(tmp_path), LogConfig()) as log:
        for _ in range(3):
            log.append(BATCH, term=1)
        ticket = log.flush_ticket()
        log.truncate(1)
        log.append(BATCH, term=2)
        ticket.run()
        log.flushed(ticket)
        assert log.durable_end_offset == 0  # offset 1 now holds new, unflushed data
