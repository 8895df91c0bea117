"""Crash consistency: whatever a crash or a disk does to the active segment's tail, reopening
yields a valid prefix of what was appended, never an exception and never garbage. Sealed
segments are trusted on open, but a flipped bit in one is reported when read, never hidden."""

from __future__ import annotations

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
                if cut == last:  # a clean boundary: nothing to cut, nothing to report
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
