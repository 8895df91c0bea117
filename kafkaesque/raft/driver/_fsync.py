"""Long-lived threads for the driver's blocking durability work (fsyncs, state-file writes).

Every group commit hands its fsyncs to threads and waits for them, once per Raft step. With
``trio.to_thread`` each hand-off costs a task, a capacity-limiter round, a thread rename and an
outcome capture (measured: p50 114 µs around a 42 µs fsync, the first item of a broker's
profile at 1,000 writes/s). These workers are plain threads that live as long as the driver.

A job's end comes back through an eventfd that the waiting task itself polls, not through
``TrioToken.run_sync_soon``: that path wakes trio's system task first, which then wakes the
waiter, one more pass of the scheduler. Under load a pass runs every ready connection's task
(hundreds of devices), so each pass saved is milliseconds of every write's latency.

Lifetime: threads start on first use and stop at ``close()`` (the driver's), or with the
process; a job still running at close finishes first. Not thread-safe on the trio side: any task
of the trio thread may ``submit``, one task at a time may ``wait`` (the driver's loop).
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Sequence

import trio

Job = Callable[[], object]


class FsyncWorkers:
    """``threads`` workers that run blocking jobs for one trio run (see the module docstring)."""

    def __init__(self, threads: int, name: str = "kafkaesque-fsync") -> None:
        self._size = threads
        self._name = name
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        # What each finished job raised (None: it returned), then a count on the eventfd.
        self._ends: queue.SimpleQueue[BaseException | None] = queue.SimpleQueue()
        self._done_fd = -1
        self._threads: list[threading.Thread] = []

    def submit(self, job: Job) -> None:
        """Queue ``job`` for a worker and return at once; its end is told by ``take_ends``
        once ``wait`` returns (the caller must collect every end it submitted)."""
        self._ensure_started()
        self._jobs.put(job)

    async def wait(self) -> None:
        """Until at least one job submitted has ended since the last ``take_ends``.

        Not cancelled by a job's end alone: this is a plain wait on the eventfd, cancellable
        like any trio wait (a job still runs on; ``close`` waits for it)."""
        self._ensure_started()
        while True:
            await trio.lowlevel.wait_readable(self._done_fd)
            try:
                os.eventfd_read(self._done_fd)
                return
            except BlockingIOError:
                continue  # a spurious wake-up

    def take_ends(self) -> list[BaseException | None]:
        """The ends of the jobs that finished since the last call, in the order they ended:
        None for a job that returned, else what it raised. Never blocks."""
        ends: list[BaseException | None] = []
        while True:
            try:
                ends.append(self._ends.get_nowait())
            except queue.Empty:
                return ends

    async def run(self, jobs: Sequence[Job]) -> None:
        """Run ``jobs`` on the workers, concurrently; return when all are done.

        Re-raises the first job's exception, after every job has finished (a job is never left
        running behind its caller's back, so an fsync's file descriptor is not reused early).
        Not to be mixed with another caller's ``submit``: the ends are not told apart.
        """
        if not jobs:
            return
        for job in jobs:
            self.submit(job)
        pending = len(jobs)
        error: BaseException | None = None
        with trio.CancelScope(shield=True):  # the jobs run on regardless: wait for them
            while pending:
                await self.wait()
                for end in self.take_ends():
                    pending -= 1
                    if error is None:
                        error = end
        if error is not None:
            raise error

    def close(self) -> None:
        """Stop the workers once the jobs queued before have run."""
        for _ in self._threads:
            self._jobs.put(None)
        for thread in self._threads:
            thread.join()
        self._threads = []
        if self._done_fd >= 0:
            os.close(self._done_fd)
            self._done_fd = -1

    def _ensure_started(self) -> None:
        if self._threads:
            return
        if self._done_fd < 0:
            self._done_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        for i in range(self._size):
            thread = threading.Thread(
                target=self._work, args=(self._done_fd,), name=f"{self._name}-{i}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def _work(self, done_fd: int) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            error: BaseException | None = None
            try:
                job()
            except Exception as exc:  # noqa: BLE001 (a value for the waiting task, re-raised there)
                error = exc
            self._ends.put(error)
            os.eventfd_write(done_fd, 1)
