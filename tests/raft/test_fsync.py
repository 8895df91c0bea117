"""``FsyncWorkers``: blocking jobs on long-lived threads, and fsyncs in a helper process,
awaited from trio."""

from __future__ import annotations

import errno
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import trio

from kafkaesque.raft.driver import FsyncHelperDied, FsyncWorkers
from kafkaesque.raft.driver._fsync_helper import MAX_FDS
from kafkaesque.storage import FlushTicket


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


def _ticket(path: Path) -> FlushTicket:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.write(fd, b"record")
    return FlushTicket(fd, 1, 0)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def _ends(workers: FsyncWorkers) -> list[BaseException | None]:
    with trio.fail_after(10):
        while True:
            await workers.wait()
            ends = workers.take_ends()
            if ends:
                return ends


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


async def test_the_helper_process_fsyncs_tickets_in_one_request_and_ends_with_close(
    tmp_path: Path,
) -> None:
    workers = FsyncWorkers(1, "test-helper")
    before = _open_fds()
    tickets = [_ticket(tmp_path / f"segment-{i}") for i in range(MAX_FDS + 47)]  # two messages
    workers.submit_fsyncs(tickets)
    assert all(t.fd == -1 for t in tickets) and not any(t.done for t in tickets)
    assert await _ends(workers) == [None]  # one end for the whole request
    assert all(t.done for t in tickets)
    pid = workers.helper_pid
    assert pid is not None
    # Its socket and the eventfd are this process's only new descriptors: the tickets' are closed.
    assert _open_fds() <= before + 2
    workers.close()
    assert _gone(pid)


async def test_a_failed_fsync_in_the_helper_is_an_end_with_its_errno(tmp_path: Path) -> None:
    workers = FsyncWorkers(1, "test-helper-fail")
    read_end, write_end = os.pipe()  # fdatasync on a pipe fails with EINVAL
    bad = [_ticket(tmp_path / "before"), FlushTicket(read_end, 1, 0), _ticket(tmp_path / "after")]
    workers.submit_fsyncs(bad)
    [end] = await _ends(workers)
    assert isinstance(end, OSError) and end.errno == errno.EINVAL
    assert not any(t.done for t in bad)
    good = [_ticket(tmp_path / "next")]  # the next request starts clean
    workers.submit_fsyncs(good)
    assert await _ends(workers) == [None] and good[0].done
    os.close(write_end)
    workers.close()


async def test_a_helper_that_died_is_reported_and_one_interrupted_from_its_group_is_not(
    tmp_path: Path,
) -> None:
    workers = FsyncWorkers(1, "test-helper-death")
    workers.submit_fsyncs([_ticket(tmp_path / "segment")])
    assert await _ends(workers) == [None]
    pid = workers.helper_pid
    assert pid is not None
    os.kill(pid, signal.SIGINT)  # a Ctrl-C reaches the broker's whole process group
    os.kill(pid, signal.SIGTERM)
    await trio.sleep(0.2)
    workers.check()  # still there: its broker ends it
    os.kill(pid, signal.SIGKILL)
    with trio.fail_after(10):
        while True:
            try:
                workers.check()
            except FsyncHelperDied as exc:
                assert str(pid) in str(exc)
                break
            await trio.sleep(0.01)
    workers.close()
