"""Where threads meet trio: the one module of the broker that crosses a thread boundary.

pysyncobj runs Raft in a thread (here a :class:`TickingThread` per SyncObj) and answers through
callbacks called on that thread; trio objects may only be touched on the trio thread, and the
event loop must never wait on a thread or a lock. Three tools keep the two apart:

- :func:`post` schedules a plain function on the trio thread from any thread
  (``TrioToken.run_sync_soon``): the only way anything travels from a foreign thread into trio.
- :class:`TickingThread` owns one dedicated thread: it builds an object there, ticks it in a
  loop, closes it there, and waits for the thread to end without blocking the event loop.
- :func:`call_replicated` calls a pysyncobj replicated method (or ``addNodeToCluster``) with
  ``callback=`` and waits in trio for the answer, with a timeout. Never ``sync=True``: that would
  block the event loop until the whole cluster answered.
- :func:`run_in_thread` runs a pure, CPU-bound function (a PBKDF2 password check) in trio's
  worker threads, so that the event loop goes on serving meanwhile.

Functions given to :func:`post` run inside trio's run loop, not in a task: they must be quick and
must not raise (an exception there crashes the whole ``trio.run``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Generic, NoReturn, TypeVar, TypeVarTuple

import outcome
import trio
from pysyncobj import FAIL_REASON

log = logging.getLogger("kafkaesque.broker.bridge")

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

_JOIN_POLL = 0.002  # seconds between two looks at a thread that already said it is ending

# pysyncobj's failures where the command certainly was not appended anywhere (or was overwritten
# before it committed): it is safe to send it again. LEADER_CHANGED (a forwarded command whose
# leader went away before it confirmed) and UNKNOWN_OUTCOME may still commit later.
_NOT_APPLIED = frozenset(
    {
        FAIL_REASON.QUEUE_FULL,
        FAIL_REASON.MISSING_LEADER,
        FAIL_REASON.NOT_LEADER,
        FAIL_REASON.DISCARDED,
        FAIL_REASON.REQUEST_DENIED,
    }
)
_REASON_NAMES = {value: name for name, value in vars(FAIL_REASON).items() if isinstance(value, int)}


class ReplicationError(Exception):
    """A replicated call did not succeed.

    ``reason`` is pysyncobj's ``FAIL_REASON`` code, or None when no answer came within the timeout.
    ``maybe_applied`` is False only when the command certainly was not applied and never will be;
    True means the outcome is unknown (it may still commit later).
    """

    def __init__(self, reason: int | None) -> None:
        self.reason = reason
        self.maybe_applied = reason not in _NOT_APPLIED
        name = "no answer in time" if reason is None else _REASON_NAMES.get(reason, str(reason))
        super().__init__(f"replicated call failed: {name}")


def post(token: trio.lowlevel.TrioToken, fn: Callable[[*Ts], object], *args: *Ts) -> bool:
    """Schedule ``fn(*args)`` on the trio thread of ``token``; callable from any thread.

    Calls are run in the order they were posted. Returns False, and drops the call, when that trio
    run has already finished: nobody is left to tell.
    """
    try:
        token.run_sync_soon(fn, *args)
    except trio.RunFinishedError:
        return False
    return True


async def call_replicated(method: Callable[..., object], *args: object, timeout: float) -> object:
    """Call ``method(*args, callback=...)`` and return the result its callback reports.

    ``method`` is a pysyncobj replicated method or ``SyncObj.addNodeToCluster``: it only enqueues
    the command (thread-safe, never blocks) and pysyncobj later calls the callback with
    ``(result, FAIL_REASON)`` on its own thread (or at once on this one, when its queue is full).
    The answer is handed back through :func:`post`.

    Raises :class:`ReplicationError` on a pysyncobj failure, or with reason None when no answer
    came within ``timeout`` seconds. Either way, and also when the caller is cancelled, a command
    that was not certainly refused may still be applied later: only ``maybe_applied=False`` means
    "failed".
    """
    token = trio.lowlevel.current_trio_token()
    answered = trio.Event()
    answers: list[tuple[object, int]] = []

    def settle(result: object, reason: int) -> None:  # on the trio thread, via post()
        answers.append((result, reason))
        answered.set()

    def on_answer(result: object, reason: int) -> None:  # on pysyncobj's thread
        # Must not raise: pysyncobj calls it in the middle of applying its log.
        post(token, settle, result, reason)

    method(*args, callback=on_answer)
    with trio.move_on_after(timeout):
        await answered.wait()
    if not answers:
        raise ReplicationError(None)
    result, reason = answers[0]
    if reason != FAIL_REASON.SUCCESS:
        raise ReplicationError(reason)
    return result


async def run_in_thread(fn: Callable[[*Ts], T], *args: *Ts) -> T:
    """``fn(*args)`` on one of trio's worker threads; its result, or what it raised.

    For pure functions that take long enough to stall every connection if run on the event loop
    (PLAIN's PBKDF2: milliseconds per check, on purpose). ``fn`` must not touch trio objects or
    broker state. Not cancellable while it runs (a thread cannot be interrupted): a cancellation
    takes effect when it returns.
    """
    return await trio.to_thread.run_sync(fn, *args)


class TickingThread(Generic[T]):
    """An object that lives in a thread of its own: built, ticked and closed there.

    Use::

        thread = await TickingThread.open(name, open_, tick, close)
        try:
            ...  # use thread.value; `await thread.wait()` to learn of a failure
        finally:
            await thread.aclose()

    In a new daemon thread called ``name``: ``obj = open_()``, then ``tick(obj)`` again and again
    until :meth:`aclose`, then ``close(obj)``. All three run on that thread only, so an object that
    is not thread-safe can be built and used there. ``tick`` must return every so often (a poll
    with a timeout) for a stop request to be seen. The thread stops at the first exception of
    ``tick`` (after calling ``close``).
    """

    value: T  # what open_ returned; set by open()

    def __init__(
        self,
        name: str,
        open_: Callable[[], T],
        tick: Callable[[T], None],
        close: Callable[[T], None],
        join_timeout: float,
    ) -> None:
        """Private: use :meth:`open`."""
        self.name = name
        self._join_timeout = join_timeout
        self._token = trio.lowlevel.current_trio_token()
        self._stopping = threading.Event()
        self._opened: list[outcome.Outcome[T]] = []  # filled once, on the trio thread
        self._ended: list[outcome.Outcome[None]] = []  # filled once; emptied when unwrapped
        self._open_done = trio.Event()
        self._end_done = trio.Event()
        self._open = open_
        self._tick = tick
        self._close = close
        self._thread = threading.Thread(target=self._body, name=name, daemon=True)

    @classmethod
    async def open(
        cls,
        name: str,
        open_: Callable[[], T],
        tick: Callable[[T], None],
        close: Callable[[T], None],
        *,
        join_timeout: float = 10.0,
    ) -> TickingThread[T]:
        """Start the thread and return once ``open_`` returned there; its result is ``value``.

        Raises what ``open_`` raised, once the thread has ended. If cancelled meanwhile, the
        thread is stopped (the object closed if it was opened) before the cancellation goes on.
        """
        self = cls(name, open_, tick, close, join_timeout)
        self._thread.start()
        opened = False
        try:
            await self._open_done.wait()
            self.value = self._opened[0].unwrap()
            opened = True
        finally:
            if not opened:
                await self.aclose()
        return self

    async def wait(self) -> NoReturn:
        """Wait as long as the thread runs; raise what ``tick`` or ``close`` raised if it stops.

        Meant to run in a task beside the object's users, so that a failure there cancels them.
        """
        await self._end_done.wait()
        if self._ended:
            self._ended.pop().unwrap()
        raise RuntimeError(f"thread {self.name} was stopped")

    async def aclose(self) -> None:
        """Stop the thread and wait for it to end; raise what ``close`` raised, if anything.

        Shielded from cancellation and polled without blocking the event loop, for up to
        ``join_timeout`` seconds; a thread still running then is logged as an error and left
        behind (it is a daemon thread). Calling it again is harmless.
        """
        self._stopping.set()
        with trio.move_on_after(self._join_timeout, shield=True) as scope:
            await self._end_done.wait()
            # The thread posted its end as its very last action: it is returning now.
            while self._thread.is_alive():
                await trio.sleep(_JOIN_POLL)
        if scope.cancelled_caught:
            log.error("thread %s did not stop within %.1f s", self.name, self._join_timeout)
        elif self._ended:
            self._ended.pop().unwrap()

    def _body(self) -> None:  # the thread
        result = outcome.capture(self._open)
        post(self._token, self._deliver_open, result)
        end: outcome.Outcome[None] = outcome.Value(None)
        if isinstance(result, outcome.Value):
            end = outcome.capture(self._loop, result.value)
            closed = outcome.capture(self._close, result.value)
            if isinstance(end, outcome.Value):
                end = closed
        post(self._token, self._deliver_end, end)

    def _loop(self, obj: T) -> None:  # the thread
        while not self._stopping.is_set():
            self._tick(obj)

    def _deliver_open(self, result: outcome.Outcome[T]) -> None:  # trio, via post()
        self._opened.append(result)
        self._open_done.set()

    def _deliver_end(self, result: outcome.Outcome[None]) -> None:  # trio, via post()
        self._ended.append(result)
        self._end_done.set()
