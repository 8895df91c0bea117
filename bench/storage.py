"""Storage benchmark: the partition log against plain file I/O, measured in the same run.

    python -m bench.storage [--quick] [--dir DIR]

* append: 100-byte records in batches of 1,000, pre-encoded by the producer (the broker only
  validates, stamps and writes), vs ``os.write`` of the same bytes to a plain file. Neither side
  fsyncs (the fsync cost is the same for both and policy-dependent); segments are 1 GiB so the
  measured window holds no roll.
* read: sequential ``PartitionLog.read`` in 1 MiB budgets (CRC-verified, the default) vs
  ``os.read`` of the same file in 1 MiB chunks; both from the page cache.
* Rounds alternate between the two sides and the best time of each is compared, since the
  machine is shared with other processes.
* reopen: open a 200 MB and a 2 GB log (default 64 MiB segments) after the writer was killed
  (no clean close), so recovery validates the active segment; warm page cache.

Ends with ``RESULT append_ratio=… read_ratio=… reopen_200m_s=… reopen_2g_s=…``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

from kafkaesque.storage import LogConfig, PartitionLog, Record, build_batch

RECORD_BYTES = 100
BATCH_RECORDS = 1000
MB = 1_000_000
ROUNDS = 5  # interleaved rounds; the best of each side is kept (the least disturbed by others)


def _batch(seed: int) -> bytes:
    value = (b"%08d" % seed) * (RECORD_BYTES // 8) + b"xxxx"
    return build_batch([Record(value=value[:RECORD_BYTES]) for _ in range(BATCH_RECORDS)])


def _plain_write(path: str, batches: list[bytes], rounds: int) -> float:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        start = time.perf_counter()
        for _ in range(rounds):
            for b in batches:
                os.write(fd, b)
        return time.perf_counter() - start
    finally:
        os.close(fd)


def _log_append(directory: str, batches: list[bytes], rounds: int) -> float:
    shutil.rmtree(directory, ignore_errors=True)
    config = LogConfig(segment_bytes=1 << 30)
    log = PartitionLog.open(directory, config)
    try:
        start = time.perf_counter()
        for _ in range(rounds):
            for b in batches:
                log.append(b, term=1)
        return time.perf_counter() - start
    finally:
        log.abandon()


def _plain_read(path: str) -> tuple[float, int]:
    fd = os.open(path, os.O_RDONLY)
    try:
        total = 0
        start = time.perf_counter()
        while chunk := os.read(fd, 1 << 20):
            total += len(chunk)
        return time.perf_counter() - start, total
    finally:
        os.close(fd)


def _log_read(directory: str) -> tuple[float, int]:
    log = PartitionLog.open(directory, LogConfig(segment_bytes=1 << 30))
    try:
        total, offset = 0, log.log_start_offset
        start = time.perf_counter()
        while offset < log.log_end_offset:
            result = log.read(offset, 1 << 20)
            total += len(result.data)
            offset = result.next_offset
        return time.perf_counter() - start, total
    finally:
        log.close()


def _build_log(directory: str, size_bytes: int, batch: bytes) -> None:
    log = PartitionLog.open(directory, LogConfig())
    try:
        for _ in range(size_bytes // len(batch)):
            log.append(batch, term=1)
    finally:
        log.abandon()  # as if the broker was killed: the next open must recover


def _reopen_seconds(directory: str, tries: int = 3) -> float:
    times = []
    for _ in range(tries):
        start = time.perf_counter()
        log = PartitionLog.open(directory, LogConfig())
        times.append(time.perf_counter() - start)
        log.abandon()
    return min(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.storage", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a shorter run (under 60 s)")
    parser.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    args = parser.parse_args(argv)
    scratch = tempfile.mkdtemp(prefix="kq-bench-storage-", dir=args.dir)
    try:
        return _run(scratch, quick=args.quick)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _run(scratch: str, *, quick: bool) -> int:
    batches = [_batch(i) for i in range(64)]
    batch_bytes = sum(len(b) for b in batches)
    rounds = max(1, (300 if quick else 1000) * MB // batch_bytes)
    volume = rounds * batch_bytes
    plain_path = os.path.join(scratch, "plain.bin")
    log_dir = os.path.join(scratch, "log")
    print(f"append: {volume / MB:.0f} MB as batches of {BATCH_RECORDS} x {RECORD_BYTES} B records")

    plain_t, log_t = [], []
    for _ in range(ROUNDS):  # interleave so both sides see the same machine
        plain_t.append(_plain_write(plain_path, batches, rounds))
        log_t.append(_log_append(log_dir, batches, rounds))
    plain_w, log_w = min(plain_t), min(log_t)
    records = rounds * len(batches) * BATCH_RECORDS
    print(f"  os.write        {volume / plain_w / MB:9.1f} MB/s")
    print(f"  PartitionLog    {volume / log_w / MB:9.1f} MB/s  {records / log_w:12,.0f} records/s")
    append_ratio = plain_w / log_w
    print(f"  ratio           {append_ratio:9.2f}  (target >= 0.7)")

    _log_append(log_dir, batches, rounds)  # leave one log and one plain file of the same bytes
    plain_r, log_r = [], []
    for _ in range(ROUNDS):
        plain_r.append(_plain_read(plain_path))
        log_r.append(_log_read(log_dir))
    pr = min(t for t, _ in plain_r)
    lr = min(t for t, _ in log_r)
    read_bytes = log_r[0][1]
    assert read_bytes == plain_r[0][1] == volume, (read_bytes, plain_r[0][1], volume)
    print("read (sequential, 1 MiB budget, page cache):")
    print(f"  os.read         {volume / pr / MB:9.1f} MB/s")
    print(f"  PartitionLog    {volume / lr / MB:9.1f} MB/s  (CRC-verified)")
    read_ratio = pr / lr
    print(f"  ratio           {read_ratio:9.2f}  (target >= 0.7)")
    shutil.rmtree(log_dir)
    os.unlink(plain_path)

    print("reopen after kill (64 MiB segments, active segment validated):")
    reopen = {}
    for label, size in (("200m", 200 * MB), ("2g", 2000 * MB)):
        directory = os.path.join(scratch, f"log-{label}")
        _build_log(directory, size, batches[0])
        reopen[label] = _reopen_seconds(directory)
        log = PartitionLog.open(directory, LogConfig())
        print(
            f"  {size / MB:6.0f} MB  {log.segment_count:3d} segments  "
            f"{reopen[label] * 1000:8.1f} ms"
        )
        log.abandon()
        shutil.rmtree(directory)
    print(f"  2 GB / 200 MB   {reopen['2g'] / reopen['200m']:9.2f}  (target: about 1; < 0.5 s)")
    print(
        f"RESULT append_ratio={append_ratio:.2f} read_ratio={read_ratio:.2f} "
        f"reopen_200m_s={reopen['200m']:.3f} reopen_2g_s={reopen['2g']:.3f} "
        f"append_mb_per_s={volume / log_w / MB:.0f} append_records_per_s={records / log_w:.0f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
