"""Corruption on real files (issue 8): found, reported, cut, remembered, repaired.

* A cut of the active segment's tail below the flushed-end watermark lost data that was fsynced,
  so may have been acknowledged: the log records ``lost_end_offset`` (durably) until it holds
  that much again. A cut of never-fsynced bytes (a torn write) is normal and records nothing.
* A bit flip in a sealed segment surfaces as ``CorruptLogError`` (file, byte, offset) on a read
  or a scrub, logged "corruption: ..." and counted; ``repair_corruption`` cuts the log before the
  bad batch and records what was lost.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from kafkaesque.storage import (
    CorruptLogError,
    FsyncPolicy,
    InvalidBatchError,
    LogConfig,
    PartitionLog,
    Record,
    build_batch,
    decode_records,
    iter_batches,
    segment_data_end,
)

CONFIG = LogConfig(segment_bytes=2048, index_interval_bytes=128, segment_ms=None)


def _batch(i: int) -> bytes:
    return build_batch([Record(value=b"value-%03d" % i * 4, key=b"k%d" % i)])


def _lost(log: PartitionLog) -> int | None:
    return log.lost_end_offset


def _values(log: PartitionLog, end: int | None = None) -> list[bytes]:
    out: list[bytes] = []
    offset = log.log_start_offset
    end = log.log_end_offset if end is None else end
    while offset < end:
        result = log.read(offset, 1 << 16, max_offset=end)
        pos = 0
        for header in iter_batches(result.data):
            batch = result.data[pos : pos + header.size]
            out.extend(r.value or b"" for r in decode_records(batch, header))
            pos += header.size
        offset = result.next_offset
    return out


def _stamped(log: PartitionLog, lo: int, hi: int) -> bytes:
    """The stored batches for offsets [lo, hi), as a leader would send them to a follower."""
    parts, offset = [], lo
    while offset < hi:
        result = log.read(offset, 1 << 20, max_offset=hi)
        parts.append(bytes(result.data))
        offset = result.next_offset
    return b"".join(parts)


def _fill(directory: Path, count: int, *, flush: bool = True) -> PartitionLog:
    log = PartitionLog.open(str(directory), CONFIG)
    for i in range(count):
        log.append(_batch(i), term=1)
        if flush:
            log.flush()
    return log


def _flip(path: Path, position: int, bit: int = 0x04) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= bit
    path.write_bytes(bytes(data))


def _last_batch_position(path: Path) -> int:
    data = path.read_bytes()
    pos = last = 0
    for header in iter_batches(data):
        last = pos
        pos += header.size
    return last


# -- the active segment's tail ----------------------------------------------------------------


def test_a_torn_tail_of_unflushed_writes_is_normal(tmp_path: Path) -> None:
    """kill -9 with writes not yet fsynced (so never acknowledged), then a torn last write:
    recovery cuts it and the replica has lost nothing it acknowledged."""
    log = _fill(tmp_path, 10)
    flushed = log.log_end_offset
    for i in range(10, 13):
        log.append(_batch(i), term=1)  # written, never fsynced
    log.abandon()
    active = sorted(tmp_path.glob("*.log"))[-1]
    # The file runs on with preallocated zeros: the last write is torn where its data ends.
    os.truncate(active, segment_data_end(str(active)) - 5)
    with PartitionLog.open(str(tmp_path), CONFIG) as log:
        assert log.recovery is not None and log.recovery.torn
        assert log.log_end_offset == flushed + 2
        assert log.lost_end_offset is None
        assert log.corruptions == 0


@pytest.mark.parametrize("cut", ["mid-batch", "batch-boundary"])
def test_a_cut_below_the_flushed_end_is_a_loss_remembered_until_repaired(
    tmp_path: Path, cut: str, caplog: pytest.LogCaptureFixture
) -> None:
    log = _fill(tmp_path, 12)
    end = log.log_end_offset
    log.close()
    active = sorted(tmp_path.glob("*.log"))[-1]
    last = _last_batch_position(active)
    os.truncate(active, last + 7 if cut == "mid-batch" else last)
    with caplog.at_level(logging.ERROR, "kafkaesque.storage"):
        log = PartitionLog.open(str(tmp_path), CONFIG)
    assert log.log_end_offset == end - 1
    assert log.lost_end_offset == end
    assert log.corruptions == 1
    assert any(r.message.startswith("corruption: ") for r in caplog.records)
    log.close()

    # Remembered across restarts (a state file), not re-derived from the log.
    log = PartitionLog.open(str(tmp_path), CONFIG)
    assert log.lost_end_offset == end
    # Re-replicated: appended again and fsynced up to the old end, the loss is over.
    log.append(_batch(11), term=1)
    assert log.lost_end_offset == end  # written, not yet durable
    log.flush()
    assert _lost(log) is None
    log.close()
    with PartitionLog.open(str(tmp_path), CONFIG) as log:
        assert log.lost_end_offset is None
        assert log.corruptions == 0


def test_a_raft_truncation_is_not_mistaken_for_a_loss(tmp_path: Path) -> None:
    """Raft cuts a divergent tail on purpose: the watermark goes down first."""
    log = _fill(tmp_path, 12)
    log.truncate(6)
    log.abandon()
    with PartitionLog.open(str(tmp_path), CONFIG) as log:
        assert log.log_end_offset == 6
        assert log.lost_end_offset is None and log.corruptions == 0


def test_without_a_watermark_a_cut_counts_as_a_loss(tmp_path: Path) -> None:
    """A log written before the watermark existed (or with a damaged one): safety first."""
    log = _fill(tmp_path, 5)
    log.close()
    os.truncate(tmp_path / ".lock", 0)  # the watermark lives in the lock file
    active = sorted(tmp_path.glob("*.log"))[-1]
    os.truncate(active, active.stat().st_size - 3)
    with PartitionLog.open(str(tmp_path), CONFIG) as log:
        assert log.log_end_offset == 4
        assert log.lost_end_offset == 5


def test_interval_policy_watermark_follows_the_interval_flushes(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes=2048, segment_ms=None, fsync=FsyncPolicy.INTERVAL)
    with PartitionLog.open(str(tmp_path), config) as log:
        log.append(_batch(0), term=1)
        log.flush()
    assert PartitionLog.open(str(tmp_path), config).lost_end_offset is None


# -- sealed segments ----------------------------------------------------------------------------


def _sealed_fixture(tmp_path: Path) -> tuple[PartitionLog, Path, int]:
    """A log of several segments; a bit flipped in a batch in the middle of the second one.
    Returns the (reopened) log, the damaged file and the offset of the damaged batch."""
    log = _fill(tmp_path, 60)
    assert log.segment_count >= 4
    log.close()
    second = sorted(tmp_path.glob("*.log"))[1]
    data = second.read_bytes()
    pos, bad_pos, bad_offset = 0, 0, 0
    for n, header in enumerate(iter_batches(data)):
        if n == 3:
            bad_pos, bad_offset = pos, header.base_offset
            break
        pos += header.size
    _flip(second, bad_pos + 70)  # inside the records: the body CRC fails
    return PartitionLog.open(str(tmp_path), CONFIG), second, bad_offset


def test_a_sealed_bit_flip_is_found_on_read_with_file_and_offset(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log, damaged, bad_offset = _sealed_fixture(tmp_path)
    assert log.lost_end_offset is None  # sealed segments are not read on open
    with (
        caplog.at_level(logging.ERROR, "kafkaesque.storage"),
        pytest.raises(CorruptLogError) as excinfo,
    ):
        log.read(bad_offset, 1 << 16)
    err = excinfo.value
    assert err.path == str(damaged) and err.offset == bad_offset
    assert log.corruptions == 1
    assert any("corruption: " in r.message and damaged.name in r.message for r in caplog.records)
    # What comes before the bad batch is still served.
    assert log.read(bad_offset - 1, 1).data
    log.close()


def test_repair_cuts_before_the_bad_batch_and_remembers_the_loss(tmp_path: Path) -> None:
    log, damaged, bad_offset = _sealed_fixture(tmp_path)
    end = log.log_end_offset
    good = _values(log, bad_offset)
    assert len(good) == bad_offset
    with pytest.raises(CorruptLogError) as excinfo:
        log.read(bad_offset, 1 << 16)
    assert log.repair_corruption(excinfo.value) == bad_offset
    assert log.log_end_offset == bad_offset
    assert log.lost_end_offset == end
    assert _values(log) == good
    assert sorted(tmp_path.glob("*.log"))[-1] == damaged  # later segments are gone
    log.verify()  # what is left is whole
    log.close()
    log = PartitionLog.open(str(tmp_path), CONFIG)
    assert log.lost_end_offset == end and log.log_end_offset == bad_offset
    log.close()


def test_a_repaired_log_takes_the_lost_batches_back_from_a_peer(tmp_path: Path) -> None:
    """Re-replication: a healthy copy's stamped batches are appended as a follower appends."""
    healthy = _fill(tmp_path / "healthy", 60)
    log, _, bad_offset = _sealed_fixture(tmp_path / "damaged")
    with pytest.raises(CorruptLogError) as excinfo:
        log.verify()
    log.repair_corruption(excinfo.value)
    log.append_replicated(_stamped(healthy, bad_offset, healthy.log_end_offset))
    log.flush()
    assert log.lost_end_offset is None
    assert _values(log) == _values(healthy)
    log.verify()
    log.close()
    healthy.close()


def test_a_bit_flip_in_a_length_field_is_corruption_not_a_crash(tmp_path: Path) -> None:
    log = _fill(tmp_path, 60)
    log.close()
    first = sorted(tmp_path.glob("*.log"))[0]
    data = first.read_bytes()
    second_batch = next(iter_batches(data)).size
    _flip(first, second_batch + 9, 0x40)  # the length field of the second batch
    (tmp_path / (first.stem + ".index")).unlink()  # force a header walk too
    log = PartitionLog.open(str(tmp_path), CONFIG)
    with pytest.raises(CorruptLogError) as excinfo:
        _values(log)
    assert log.repair_corruption(excinfo.value) == 1
    assert len(_values(log)) == 1
    log.close()


def test_the_scrub_finds_a_sealed_flip_in_bounded_steps(tmp_path: Path) -> None:
    log, damaged, _ = _sealed_fixture(tmp_path)
    steps = 0
    with pytest.raises(CorruptLogError) as excinfo:
        while steps < 1000:
            steps += 1
            log.scrub_step(300)
    assert excinfo.value.path == str(damaged)
    assert steps > 2  # it went a little at a time
    assert log.corruptions == 1
    log.close()


def test_the_scrub_of_a_clean_log_goes_round(tmp_path: Path) -> None:
    log = _fill(tmp_path, 60)
    sealed = sum(size for _, size, sealed in log.segments() if sealed)
    passes = [log.scrub_step(500) for _ in range(2 * (sealed // 500 + 4))]
    assert passes.count(True) >= 2  # full passes, again and again
    assert log.corruptions == 0
    log.close()


def test_compaction_under_a_scrub_in_progress_is_not_taken_for_corruption(
    tmp_path: Path,
) -> None:
    # Found by a jepsen_like run: the scrub stopped inside a sealed segment of a compacted
    # topic, compaction rewrote that segment smaller, and the scrub resumed at its old byte
    # position, in the middle of a batch: "corruption", and a healthy log was cut.
    log = PartitionLog.open(str(tmp_path), CONFIG)
    for i in range(60):
        log.append(build_batch([Record(value=b"v%03d" % i * 8, key=b"k%d" % (i % 3))]), term=1)
    log.flush()
    first_sealed = log.segments()[0]
    assert first_sealed[2]
    log.scrub_step(first_sealed[1] // 2)  # stops halfway through the first segment
    assert log.compact().segments_rewritten >= 1
    for _ in range(100):
        log.scrub_step(300)
    assert log.corruptions == 0
    log.close()


def test_a_compacted_segment_replicates_to_a_follower_behind(tmp_path: Path) -> None:
    # Found by a jepsen_like run: a leader compacted __consumer_offsets, a follower behind
    # received the compacted batches (fewer records than offsets, some none at all) and its
    # append refused them as "a new batch needs contiguous offsets", which stopped the broker.
    leader = PartitionLog.open(str(tmp_path / "leader"), CONFIG)
    for i in range(60):
        leader.append(build_batch([Record(value=b"v%03d" % i * 8, key=b"k%d" % (i % 3))]), term=1)
    leader.flush()
    assert leader.compact().segments_rewritten >= 1
    follower = PartitionLog.open(str(tmp_path / "follower"), CONFIG)
    offset = 0
    while offset < leader.log_end_offset:
        result = leader.read(offset, 1 << 16)
        pos = 0
        batches = []
        for header in iter_batches(result.data):
            batches.append((bytes(result.data[pos : pos + header.size]), header.term))
            pos += header.size
        follower.append_many(batches)
        offset = result.next_offset
    assert follower.log_end_offset == leader.log_end_offset
    assert _values(follower) == _values(leader)
    with pytest.raises(InvalidBatchError, match="contiguous"):  # a producer's batch may not
        follower.check_batch(_emptied(leader))
    leader.close()
    follower.close()


def _emptied(log: PartitionLog) -> bytes:
    """The first batch of ``log`` that compaction emptied (no records left)."""
    result = log.read(log.log_start_offset, 1 << 20)
    pos = 0
    for header in iter_batches(result.data):
        if header.record_count == 0:
            return bytes(result.data[pos : pos + header.size])
        pos += header.size
    raise AssertionError("no emptied batch")
