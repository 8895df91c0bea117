"""Long-lived threads for the driver's blocking durability work (fsyncs, state-file writes).

Every group commit hands its fsyncs to threads and waits for them, once per Raft step. With
``trio.to_thread`` each hand-off costs a task, a capacity-limiter round, a thread rename and an
outcome capture (measured: p50 114 µs around a 42 µs fsync, the first item of a broker's
profile at 1,000 writes/s). These workers are plain threads that live as long as the driver:
a job goes in a queue, and its end comes back to trio with one ``run_sync_soon``.

Lifetime: threads start on first use and stop at ``close()`` (the driver's), or with the
process; a job still running at close finishes first. Not thread-safe on the trio side: use from
the trio thread that owns the driver.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence

import trio

Job = Callable[[], object]


class _Batch:
    """Jobs handed out together; ``done`` is set once each has finished."""

    def __init__(self, count: int) -> None:
        self.pending = count
        self.error: BaseException | None = None
        self.done = trio.Event()

    def finished(self, error: BaseException | None) -> None:  # on the trio thread
        if error is not None and self.error is None:
            self.error = error
        self.pending -= 1
        if self.pending == 0:
            self.done.set()


class FsyncWorkers:
    """``threads`` workers that run blocking jobs for one trio run (see the module docstring)."""

    def __init__(self, threads: int, name: str = "kafkaesque-fsync") -> None:
        self._size = threads
        self._name = name
        self._queue: queue.SimpleQueue[tuple[Job, trio.lowlevel.TrioToken, _Batch] | None] = (
            queue.SimpleQueue()
        )
        self._threads: list[threading.Thread] = []

    async def run(self, jobs: Sequence[Job]) -> None:
        """Run ``jobs`` on the workers, concurrently; return when all are done.

        Re-raises the first job's exception, after every job has finished (a job is never left
        running behind its caller's back, so an fsync's file descriptor is not reused early).
        """
        if not jobs:
            return
        if not self._threads:
            self._start()
        token = trio.lowlevel.current_trio_token()
        batch = _Batch(len(jobs))
        for job in jobs:
            self._queue.put((job, token, batch))
        with trio.CancelScope(shield=True):  # the jobs run on regardless: wait for them
            await batch.done.wait()
        if batch.error is not None:
            raise batch.error

    def close(self) -> None:
        """Stop the workers once the jobs queued before have run."""
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            thread.join()
        self._threads = []

    def _start(self) -> None:
        for i in range(self._size):
            thread = threading.Thread(target=self._work, name=f"{self._name}-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            job, token, batch = item
            error: BaseException | None = None
            try:
                job()
            except Exception as exc:  # noqa: BLE001 (a value for the waiting task, re-raised there)
                error = exc
            try:
                token.run_sync_soon(batch.finished, error)
            except trio.RunFinishedError:
                return  # nobody waits any more: the trio run is over
