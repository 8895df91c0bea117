"""Crash consistency: whatever a crash or a disk does to the active segment's tail, reopening
yields a valid prefix of what was appended, never an exception and never garbage. Sealed
segments are trusted on open, but a flipped bit in one is reported when read, never hidden."""

from __future__ import annotations

import errno
import os
import random
import shutil
from pathlib import Path

import pytest

from kafkaesque.storage import (
    CorruptLogError,
    LogConfig,
    PartitionLog,
    Record,
    build_batch,
    decode_records,
    iter_batches,
    segment_data_end,
)

CONFIG = LogConfig(segment_bytes=2048, index_interval_bytes=128, segment_ms=None)


def _fill(directory: Path, batches: int) -> list[list[bytes]]:
    """Append ``batches`` batches of 1-4 records; return the values, batch by batch."""
    rng = random.Random(7)
    appended = []
    with PartitionLog.open(str(directory), CONFIG) as log:
        for i in range(batches):
            values = [b"value-%d-%d" % (i, j) * rng.randint(1, 3) for j in range(rng.randint(1, 4))]
            log.append(
                build_batch([Record(value=v, key=b"k%d" % i) for v in values]), term=1 + i // 7
            )
            appended.append(values)
        assert log.segment_count >= 3, "the test needs several segments"
    return appended


def _read_all(log: PartitionLog) -> list[list[bytes]]:
    out, offset = [], log.log_start_offset
    while offset < log.log_end_offset:
        result = log.read(offset, 1 << 16)
        pos = 0
        for header in iter_batches(result.data):
            batch = result.data[pos : pos + header.size]
            out.append([r.value or b"" for r in decode_records(batch, header)])
            pos += header.size
        offset = result.next_offset
    return out


def _active_segment(directory: Path) -> Path:
    return sorted(directory.glob("*.log"))[-1]


def _last_batch_position(segment: Path) -> int:
    data = segment.read_bytes()
    pos = last = 0
    for header in iter_batches(data):
        last = pos
        pos += header.size
    return last


def test_cutting_the_active_segment_anywhere_in_its_last_batch_keeps_the_prefix(
    tmp_path: Path,
) -> None:
    source = tmp_path / "source"
    appended = _fill(source, 40)
    active = _active_segment(source)
    size = active.stat().st_size
    last = _last_batch_position(active)
    for cut in range(last, size + 1):
        work = tmp_path / f"cut-{cut}"
        shutil.copytree(source, work)
        os.truncate(_active_segment(work), cut)
        with PartitionLog.open(str(work), CONFIG) as log:
            got = _read_all(log)
            if cut == size:
                assert got == appended and log.recovery is None
            else:
                assert got == appended[:-1], f"cut at byte {cut}"
                if not active.read_bytes()[last:cut].strip(b"\0"):
                    # A clean boundary, or a torn write of only the zero bytes that begin the
                    # header (a small base offset): no different from the preallocated space
                    # after the data, so nothing to cut and nothing to report.
                    assert log.recovery is None
                else:
                    assert log.recovery is not None and log.recovery.torn
                    assert log.recovery.valid_bytes == last
            # The log keeps working after recovery: the next append lands after the prefix.
            log.append(build_batch([Record(value=b"after")]), term=99)
            assert _read_all(log)[-1] == [b"after"]
        shutil.rmtree(work)


@pytest.mark.parametrize("seed", range(40))
def test_random_byte_flips_in_the_active_segment_yield_a_valid_prefix(
    tmp_path: Path, seed: int
) -> None:
    source = tmp_path / "source"
    appended = _fill(source, 30)
    active = _active_segment(source)
    data = bytearray(active.read_bytes())
    rng = random.Random(seed)
    for _ in range(rng.randint(1, 4)):
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    active.write_bytes(bytes(data))
    with PartitionLog.open(str(source), CONFIG) as log:
        got = _read_all(log)
        assert got == appended[: len(got)], "recovery kept something that was never appended"
        assert log.recovery is not None or got == appended


def test_garbage_appended_after_the_last_batch_is_cut_and_reported(tmp_path: Path) -> None:
    appended = _fill(tmp_path, 30)
    with open(_active_segment(tmp_path), "ab") as f:
        f.write(os.urandom(300))
    with PartitionLog.open(str(tmp_path), CONFIG) as log:
        assert _read_all(log) == appended
        assert log.recovery is not None and log.recovery.truncated_bytes == 300


def test_a_lost_index_is_rebuilt(tmp_path: Path) -> None:
    appended = _fill(tmp_path, 30)
    for index in tmp_path.glob("*.index"):
        index.unlink()
    with PartitionLog.open(str(tmp_path), CONFIG) as log:
        assert _read_all(log) == appended


def test_a_bit_flip_in_a_sealed_segment_is_reported_not_dropped(tmp_path: Path) -> None:
    _fill(tmp_path, 40)
    first = sorted(tmp_path.glob("*.log"))[0]
    data = bytearray(first.read_bytes())
    data[200] ^= 0x10
    first.write_bytes(bytes(data))
    with PartitionLog.open(str(tmp_path), CONFIG) as log:
        # Sealed segments are trusted on open (no scan), so opening succeeds...
        assert log.recovery is None
        # ...but the corruption surfaces, with the file and position, when the data is read.
        with pytest.raises(CorruptLogError) as excinfo:
            _read_all(log)
        assert first.name in str(excinfo.value)
        with pytest.raises(CorruptLogError):
            log.verify()


def test_a_second_process_cannot_open_the_same_log(tmp_path: Path) -> None:
    from kafkaesque.storage import StorageError

    with PartitionLog.open(str(tmp_path), CONFIG), pytest.raises(StorageError, match="locked"):
        PartitionLog.open(str(tmp_path), CONFIG)


# -- preallocation --------------------------------------------------------------------------


def test_the_active_segment_is_preallocated_and_its_zero_tail_is_not_a_cut(tmp_path: Path) -> None:
    """A killed broker leaves the active file longer than its data (zeros): recovery keeps every
    batch, reports nothing, and appends go on right after the data."""
    log = PartitionLog.open(str(tmp_path), LogConfig(segment_ms=None))
    values = [[b"v%d" % i] for i in range(20)]
    for v in values:
        log.append(build_batch([Record(value=x) for x in v]), term=1)
    log.flush()
    log.abandon()
    active = _active_segment(tmp_path)
    data_end = segment_data_end(str(active))
    assert active.stat().st_size >= 64 * 1024 > data_end, "preallocated ahead of the data"
    assert not active.read_bytes()[data_end:].strip(b"\0")
    with PartitionLog.open(str(tmp_path), LogConfig(segment_ms=None)) as log:
        assert log.recovery is None and log.lost_end_offset is None and log.corruptions == 0
        assert _read_all(log) == values
        log.append(build_batch([Record(value=b"after")]), term=2)
        assert _read_all(log) == [*values, [b"after"]]
    # A clean close cuts the file to its data.
    assert active.stat().st_size == segment_data_end(str(active))


def test_a_torn_write_into_preallocated_space_is_cut(tmp_path: Path) -> None:
    """The head of a batch reached the file, its tail did not (zeros after it): a torn write."""
    log = PartitionLog.open(str(tmp_path), LogConfig(segment_ms=None))
    log.append(build_batch([Record(value=b"kept")]), term=1)
    log.flush()
    end = log.log_end_offset
    batch = build_batch([Record(value=b"torn" * 50)], base_offset=end)
    log.abandon()
    active = _active_segment(tmp_path)
    data_end = segment_data_end(str(active))
    with open(active, "r+b") as f:
        f.seek(data_end)
        f.write(batch[: len(batch) // 2])
    size = active.stat().st_size
    with PartitionLog.open(str(tmp_path), LogConfig(segment_ms=None)) as log:
        assert log.recovery is not None and log.recovery.torn
        assert log.recovery.valid_bytes == data_end
        assert log.recovery.truncated_bytes <= len(batch) // 2 < size - data_end
        assert log.log_end_offset == end and log.lost_end_offset is None
        assert _read_all(log) == [[b"kept"]]


def test_sealed_segments_hold_only_their_data(tmp_path: Path) -> None:
    _fill(tmp_path, 40)
    for path in sorted(tmp_path.glob("*.log")):
        assert path.stat().st_size == segment_data_end(str(path)) > 0


def test_a_full_disk_refusing_the_preallocation_does_not_refuse_the_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    with PartitionLog.open(str(tmp_path), LogConfig(segment_ms=None)) as log:
        for i in range(3):
            log.append(build_batch([Record(value=b"v%d" % i)]), term=1)
        assert _read_all(log) == [[b"v0"], [b"v1"], [b"v2"]]
    active = _active_segment(tmp_path)
    assert active.stat().st_size == segment_data_end(str(active))
