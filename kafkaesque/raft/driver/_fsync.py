"""The driver's blocking durability work: fsyncs in a helper process, state files on threads.

Every group commit hands its durability work off the event loop and waits for it, once per
Raft step. On threads: with ``trio.to_thread`` each hand-off costs a task, a capacity-limiter
round, a thread rename and an outcome capture (measured: p50 114 µs around a 42 µs fsync, the
first item of a broker's profile at 1,000 writes/s). These workers are plain threads that live
as long as the driver.

A job's end comes back through an eventfd that the waiting task itself polls, not through
``TrioToken.run_sync_soon``: that path wakes trio's system task first, which then wakes the
waiter, one more pass of the scheduler. Under load a pass runs every ready connection's task
(hundreds of devices), so each pass saved is milliseconds of every write's latency.

A log's fsyncs go further: ``submit_fsyncs`` sends the descriptors to a helper process
(``_fsync_helper.py``) that fdatasyncs them and adds to the same eventfd. A thread, however
little Python it runs, needs the GIL after its fsync and again to tell its end, and waits for it
while the event loop runs; on two shared cores, at 1,000 writes/s over three partitions, the
fsync's hand-off took 0.6 ms at the median and 2.5 ms at p90 around a 0.13 ms fdatasync. With
the process a write there was acknowledged 30-45% sooner at the median (``bench.write_trace``)
and the p99 from publish to delivery went from 22.8 to 19.8 ms (medians of five alternating
``bench.broker --quick`` runs). What needs Python (the hard-state file) stays on the threads; it
is written only when a term or vote moves.

Lifetime: threads and the helper start on first use and stop at ``close()`` (the driver's), or
with the process (the helper reads end of file when its broker dies); a job still running at
close finishes first. ``check`` raises once the helper died on its own: the fsyncs it held have
an unknown outcome, so the driver stops. Not thread-safe on the trio side: any task of the trio
thread may ``submit``, one task at a time may ``wait`` (the driver's loop).
"""

from __future__ import annotations

import collections
import os
import queue
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import trio

from kafkaesque.storage import FlushTicket

from ._fsync_helper import MAX_FDS  # the helper's own bound (a plain script: no side effect)

Job = Callable[[], object]

HELPER = Path(__file__).with_name("_fsync_helper.py")
HELPER_STOP_S = 5.0  # how long ``close`` waits for the helper's own end before killing it


class FsyncHelperDied(RuntimeError):
    """The fsync helper process ended while its broker ran: the outcome of the fsyncs it held
    is unknown, so nothing after them may be acknowledged (fatal for the driver)."""


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
        self._helper: subprocess.Popen[bytes] | None = None
        self._helper_socket: socket.socket | None = None
        # The tickets of each request the helper has not answered yet, oldest first.
        self._in_helper: collections.deque[Sequence[FlushTicket]] = collections.deque()

    def submit(self, job: Job) -> None:
        """Queue ``job`` for a worker and return at once; its end is told by ``take_ends``
        once ``wait`` returns (the caller must collect every end it submitted)."""
        self._ensure_started()
        self._jobs.put(job)

    def submit_fsyncs(self, tickets: Sequence[FlushTicket]) -> None:
        """Hand ``tickets``' descriptors to the helper process, which fdatasyncs them in order,
        and close them here; their end is told by ``take_ends`` once ``wait`` returns, as a
        job's: None when every ticket is fsynced (each ticket then ``done``), else the
        ``OSError`` of the first failure."""
        if not tickets:
            raise ValueError("no tickets to fsync")
        sock = self._ensure_helper()
        for start in range(0, len(tickets), MAX_FDS):
            part = tickets[start : start + MAX_FDS]
            last = start + MAX_FDS >= len(tickets)
            try:
                socket.send_fds(sock, [b"." if last else b"+"], [t.fd for t in part])
            except OSError as exc:  # EPIPE, ECONNRESET: the helper is gone
                raise FsyncHelperDied(f"the fsync helper took no request: {exc}") from exc
            for ticket in part:
                os.close(ticket.fd)
                ticket.fd = -1
        self._in_helper.append(tickets)

    def check(self) -> None:
        """Raise ``FsyncHelperDied`` if the helper process ended on its own."""
        if self._helper is not None and self._helper.poll() is not None:
            raise FsyncHelperDied(
                f"the fsync helper (pid {self._helper.pid}) ended with status "
                f"{self._helper.returncode}; {len(self._in_helper)} request(s) unanswered"
            )

    @property
    def helper_pid(self) -> int | None:
        """The helper process's id, once started."""
        return None if self._helper is None else self._helper.pid

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
                break
        while self._in_helper:
            assert self._helper_socket is not None
            try:
                answer = self._helper_socket.recv(16, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            if not answer:
                raise FsyncHelperDied("the fsync helper closed its socket")
            tickets = self._in_helper.popleft()
            failure = int(answer)
            if failure:
                ends.append(
                    OSError(failure, f"fdatasync in the fsync helper: {os.strerror(failure)}")
                )
            else:
                for ticket in tickets:
                    ticket.done = True
                ends.append(None)
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
        """Stop the workers and the helper once the jobs queued before have run."""
        for _ in self._threads:
            self._jobs.put(None)
        for thread in self._threads:
            thread.join()
        self._threads = []
        if self._helper_socket is not None:
            self._helper_socket.close()  # end of file: the helper answers what it holds, ends
            self._helper_socket = None
        if self._helper is not None:
            try:
                self._helper.wait(HELPER_STOP_S)
            except subprocess.TimeoutExpired:
                self._helper.kill()
                self._helper.wait()
            self._helper = None
        self._in_helper.clear()
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

    def _ensure_helper(self) -> socket.socket:
        if self._helper_socket is not None:
            return self._helper_socket
        if self._done_fd < 0:
            self._done_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._helper = subprocess.Popen(
                [sys.executable, "-I", "-S", str(HELPER), str(theirs.fileno()), str(self._done_fd)],
                pass_fds=(theirs.fileno(), self._done_fd),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._helper_socket = ours
        return ours

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
