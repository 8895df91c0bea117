"""``FsyncWorkers``: blocking jobs on long-lived threads, awaited from trio."""

from __future__ import annotations

import threading
import time

import pytest

from kafkaesque.raft.driver import FsyncWorkers


async def test_jobs_run_on_the_workers_concurrently_and_all_finish() -> None:
    workers = FsyncWorkers(3, "test-fsync")
    names: list[str] = []

    def job() -> None:
        time.sleep(0.05)
        names.append(threading.current_thread().name)

    started = time.monotonic()
    await workers.run([job, job, job])
    assert time.monotonic() - started < 0.15 * 2  # three sleeps of 50 ms, side by side
    assert len(names) == 3 and all(n.startswith("test-fsync-") for n in names)
    workers.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("test-fsync-")]


async def test_a_failing_job_is_raised_after_the_others_finished() -> None:
    workers = FsyncWorkers(2, "test-fsync-fail")
    finished: list[int] = []

    def bad() -> None:
        raise OSError("disk gone")

    def slow() -> None:
        time.sleep(0.05)
        finished.append(1)

    with pytest.raises(OSError, match="disk gone"):
        await workers.run([bad, slow])
    assert finished == [1]
    workers.close()
