"""Group writes: many batches in one ``pwritev``, the same log as one by one, all or nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kafkaesque.storage import (
    InvalidBatchError,
    LogConfig,
    PartitionLog,
    Record,
    _segment,
    build_batch,
    decode_header,
    decode_records,
    iter_batches,
)

BATCHES = [
    build_batch([Record(value=b"r%d-%d" % (i, j)) for j in range(i % 3 + 1)]) for i in range(40)
]
TERMS = [1 + i // 15 for i in range(40)]


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.name != ".lock"}


def test_a_group_write_leaves_the_same_files_as_appends_one_by_one(tmp_path: Path) -> None:
    # Small segments, so the group crosses several rolls; the index and term table too.
    config = LogConfig(segment_bytes=1024, index_interval_bytes=128)
    one, many = tmp_path / "one", tmp_path / "many"
    with PartitionLog.open(str(one), config, clock=lambda: 5.0) as log:
        singles = [log.append(b, term=t) for b, t in zip(BATCHES, TERMS, strict=True)]
    with PartitionLog.open(str(many), config, clock=lambda: 5.0) as log:
        grouped = log.append_many(zip(BATCHES, TERMS, strict=True))
        assert log.segment_count > 3
    assert grouped == singles
    assert _files(many) == _files(one)


def test_a_bad_batch_anywhere_in_a_group_writes_nothing(tmp_path: Path) -> None:
    corrupt = bytearray(BATCHES[1])
    corrupt[-1] ^= 0xFF
    with PartitionLog.open(str(tmp_path)) as log:
        log.append(BATCHES[0], term=2)
        with pytest.raises(InvalidBatchError):
            log.append_many([(BATCHES[0], 2), (bytes(corrupt), 2)])
        with pytest.raises(ValueError, match="term"):
            log.append_many([(BATCHES[0], 3), (BATCHES[0], 2)])
        assert log.log_end_offset == 1
        assert log.append_many([]) == []
        assert [r.value for r in decode_records(log.read(0).data)] == [b"r0-0"]


def test_a_group_of_more_batches_than_iov_max_is_split(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    real = os.pwritev

    def counting(fd: int, buffers: list[bytes], offset: int) -> int:
        calls.append(len(buffers))
        return real(fd, buffers, offset)

    monkeypatch.setattr(os, "pwritev", counting)
    tiny = build_batch([Record(value=b"t")])
    n = _segment.IOV_MAX  # two buffers a batch: at least two writes
    with PartitionLog.open(str(tmp_path)) as log:
        log.append_many([(tiny, 1)] * n)
        assert log.log_end_offset == n
        assert sum(1 for _ in iter_batches(log.read(0, 1 << 20).data)) == n
    assert len(calls) >= 2 and max(calls) <= _segment.IOV_MAX


def test_a_short_write_is_finished_and_a_stuck_one_cut_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.pwritev

    def halting(fd: int, buffers: list[bytes], offset: int) -> int:
        # Writes at most 100 bytes a call, as a write interrupted early may.
        data = b"".join(bytes(b) for b in buffers)[:100]
        return real(fd, [data], offset)

    monkeypatch.setattr(os, "pwritev", halting)
    with PartitionLog.open(str(tmp_path / "short")) as log:
        log.append_many(zip(BATCHES[:5], TERMS, strict=False))
        log.flush()
        records = [r.value for r in decode_records(log.read(0, 1 << 20).data[: len(BATCHES[0])])]
        assert records == [b"r0-0"]
    with PartitionLog.open(str(tmp_path / "short")) as log:
        assert log.recovery is None and log.log_end_offset == sum(i % 3 + 1 for i in range(5))

    def stuck(fd: int, buffers: list[bytes], offset: int) -> int:
        return real(fd, [bytes(buffers[0])[:10]], offset) if offset == 0 else 0

    monkeypatch.setattr(os, "pwritev", stuck)
    with PartitionLog.open(str(tmp_path / "stuck")) as log:
        with pytest.raises(OSError, match="no progress"):
            log.append_many(zip(BATCHES[:5], TERMS, strict=False))
        assert log.log_end_offset == 0
    assert os.path.getsize(tmp_path / "stuck" / "00000000000000000000.log") == 0


def test_a_checked_batch_carries_its_header_to_the_append(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parse once: ``check_batch`` returns the batch with its header, and appending that is
    not parsed again; plain bytes are checked as they are appended."""
    from kafkaesque.storage import _partition_log

    decoded: list[int] = []
    real = decode_header

    def counting(*args: object, **kwargs: bool) -> object:
        decoded.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    batch = BATCHES[2]
    with PartitionLog.open(str(tmp_path)) as log:
        checked = log.check_batch(batch, span=3)
        assert checked.header.record_count == 3 and checked.data is batch
        with pytest.raises(InvalidBatchError, match="spans 3 offsets, not 2"):
            log.check_batch(batch, span=2)
        monkeypatch.setattr(_partition_log, "decode_header", counting)
        log.append_many([(checked, 1), (checked, 1)])
        assert decoded == []
        log.append(batch, term=1)
        assert decoded == [1]
        # A mutable buffer is copied when checked: what was checked is what is written.
        mutable = bytearray(batch)
        copied = log.check_batch(memoryview(mutable))
        mutable[-1] ^= 0xFF
        log.append(copied, term=1)
        assert log.log_end_offset == 4 * 3
        assert log.read(9, 1 << 20).data[: len(batch)][-1] == batch[-1]
