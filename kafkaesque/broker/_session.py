"""One client connection speaking the line protocol: decode, dispatch, reply in order.

The reader decodes whatever the socket delivers. A run of publishes is handed to the broker at
once, without waiting for earlier ones to finish, so pipelined publishes proceed together (a
thousand pipelined PUBS become a few batches, appended in the order sent). Every other command
waits until everything before it has completed, and publishes wait for an earlier command that
is not a publish: a pasted ``CREATE t`` then ``PUBS t x`` then ``FETCH t 0 0`` behaves exactly as
if typed one at a time, as a Kafka client sees requests handled in order.

Each command leaves a ``Slot`` in a queue; the replies leave in the queue's order, those that
are ready coalesced into one write. The queue is bounded: a client that sends faster than its
commands complete is simply not read for a while (TCP backpressure), and never makes the broker
buffer without limit.

Who writes a reply: the task that made it ready, when it can (``_Pipeline.flush``). A publish's
reply is ready when its batch commits, which the Raft driver (or the peer connection bringing
the commit news) learns first; when the session's writer task is idle and the connection is an
``FdStream``, that task writes the replies now ready at once (``FdStream.send_now``), as an MQTT
device's PUBACKs are (``_mqtt_device``), instead of waking the writer for a pass of the
scheduler that costs far more than the write. What a full socket does not take is kept, in
order, for the writer, which also does all the writing on other streams (TLS, tests' memory
streams).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import Protocol

import trio

from kafkaesque._fd_stream import FdStream
from kafkaesque.protocol import (
    BadCommand,
    Command,
    LineDecoder,
    LineLimits,
    PublishBatch,
    PublishRecord,
    Pubs,
    Quit,
    encode_reply,
)

log = logging.getLogger("kafkaesque.broker.session")

_RECEIVE_BYTES = 64 * 1024
_SEND_COALESCE_BYTES = 256 * 1024
_PUBLISHES = (Pubs, PublishRecord, PublishBatch)


class Slot(Protocol):
    """A reply's place in the pipeline."""

    def ready(self) -> bool: ...

    async def wait(self) -> None: ...

    def notify(self, waiter: Callable[[], None]) -> None:
        """Call ``waiter`` once the reply is ready (at once if it is), from the task that
        makes it ready; ``waiter`` must be quick and must not raise."""
        ...

    def encode(self) -> bytes: ...


class ReadySlot:
    """A reply known at once."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def ready(self) -> bool:
        return True

    async def wait(self) -> None:
        return None

    def notify(self, waiter: Callable[[], None]) -> None:
        waiter()

    def encode(self) -> bytes:
        return self.data


class TaskSlot:
    """A reply computed by a task; ``set`` fills it."""

    __slots__ = ("_waiters", "data", "done")

    def __init__(self) -> None:
        self.data = b""
        self.done = trio.Event()
        self._waiters: list[Callable[[], None]] = []

    def set(self, data: bytes) -> None:
        self.data = data
        self.done.set()
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter()

    def ready(self) -> bool:
        return self.done.is_set()

    async def wait(self) -> None:
        await self.done.wait()

    def notify(self, waiter: Callable[[], None]) -> None:
        if self.done.is_set():
            waiter()
        elif not self._waiters or self._waiters[-1] != waiter:  # == for bound methods
            self._waiters.append(waiter)

    def encode(self) -> bytes:
        return self.data


class Session:
    """What the broker remembers of one connection: the group members it joined."""

    __slots__ = ("members",)

    def __init__(self) -> None:
        self.members: set[str] = set()


Dispatch = Callable[[Command, trio.Nursery, Session], Slot]


async def serve_session(
    stream: trio.abc.Stream,
    dispatch: Dispatch,
    limits: LineLimits,
    max_inflight: int,
    on_close: Callable[[Session], None],
    on_bad: Callable[[BadCommand], None] = lambda event: None,
) -> None:
    """Serve one connection until the peer closes it, sends QUIT, or breaks the framing.

    ``on_close`` hears of the end, however it came (a consumer's connection closing is how its
    group learns that it left). ``on_bad`` hears of each line the decoder refused (the
    metrics count them), before its ``-ERR`` is queued.
    """
    session = Session()
    try:
        await _serve(stream, dispatch, limits, max_inflight, session, on_bad)
    finally:
        on_close(session)


async def _serve(
    stream: trio.abc.Stream,
    dispatch: Dispatch,
    limits: LineLimits,
    max_inflight: int,
    session: Session,
    on_bad: Callable[[BadCommand], None],
) -> None:
    decoder = LineDecoder(limits)
    queue: deque[Slot] = deque()
    state = _Pipeline(stream, queue, max_inflight)
    barrier: Slot | None = None  # the last command that was not a publish
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_write_loop, stream, state)
            while not state.closing:
                data = await stream.receive_some(_RECEIVE_BYTES)
                if not data:
                    break
                decoder.feed(data)
                for event in decoder.events():
                    if isinstance(event, BadCommand):
                        on_bad(event)
                        queue.append(ReadySlot(encode_reply(event.reply())))
                        if event.framing_error:
                            state.closing = True
                            break
                        continue
                    if isinstance(event, _PUBLISHES):
                        if barrier is not None and not barrier.ready():
                            state.flush()
                            await barrier.wait()
                    else:
                        state.flush()
                        await _settled(queue)
                    slot = dispatch(event, nursery, session)
                    queue.append(slot)
                    if not isinstance(event, _PUBLISHES):
                        barrier = slot
                    if isinstance(event, Quit):
                        state.closing = True
                        break
                state.flush()
                while len(queue) >= state.max_inflight:
                    await state.wait_for_room()
            state.closing = True
            state.flush()
            await state.drained.wait()  # the writer sends what is owed, then we hang up
            nursery.cancel_scope.cancel()
    except* (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # the client went away; its pending writes still complete, unanswered
    finally:
        state.broken = True  # replies that become ready from now on are not written
        with trio.CancelScope(shield=True):
            await stream.aclose()


async def _settled(queue: deque[Slot]) -> None:
    """Until every reply in ``queue`` is known (the writer may still be sending them)."""
    for slot in list(queue):
        if not slot.ready():
            await slot.wait()


class _Pipeline:
    """What the reader and writer of one session share: the queue of replies, and who writes
    the next ones (see the module docstring).

    Invariants: replies leave in the queue's order; bytes go to the stream from one task at a
    time (``send_now`` only while the writer task is idle, ``writing`` False); bytes
    ``send_now`` kept go before any later ones (the writer sends them first, and ``flush``
    leaves the writing to it while there are some).
    """

    def __init__(self, stream: trio.abc.Stream, queue: deque[Slot], max_inflight: int) -> None:
        self.queue = queue
        self.max_inflight = max_inflight
        self.closing = False
        self.writing = False  # the writer task is between its wake-up and its next wait
        self.broken = False  # a write failed, or the session ended
        self.drained = trio.Event()
        self._fd = stream if type(stream) is FdStream else None
        self._writer_wake = trio.Event()
        self._room = trio.Event()

    def flush(self) -> None:
        """Write the replies ready at the head of the queue from this task, or have the writer
        task write them; called by the reader, and by whoever makes the head's reply ready
        (a slot's ``notify``). Never waits, never raises."""
        fd = self._fd
        if fd is None or self.writing or self.broken or fd.kept:
            self._writer_wake.set()
            return
        out = self.take_ready()
        if out:
            try:
                if not fd.send_now([out]):
                    self._writer_wake.set()  # the socket is full: the writer sends the rest
            except trio.BrokenResourceError:
                self.broken = True
                self._writer_wake.set()  # the writer ends the session
                return
        if self.closing and not self.queue:
            self._writer_wake.set()  # the writer tells the reader all was sent

    def take_ready(self) -> bytes:
        """The encoded replies ready at the head of the queue (up to about
        ``_SEND_COALESCE_BYTES``), taken from it; the first one not ready will ``flush`` when
        it is."""
        queue = self.queue
        parts: list[bytes] = []  # joined once: += on bytes would copy the run for each reply
        size = 0
        while queue:
            slot = queue[0]
            if not slot.ready():
                slot.notify(self.flush)
                break
            queue.popleft()
            reply = slot.encode()
            parts.append(reply)
            size += len(reply)
            if size >= _SEND_COALESCE_BYTES:
                break
        if not parts:
            return b""
        self._room.set()
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def writer_idle(self) -> None:
        await self._writer_wake.wait()
        self._writer_wake = trio.Event()

    async def wait_for_room(self) -> None:
        await self._room.wait()
        self._room = trio.Event()


async def _write_loop(stream: trio.abc.Stream, state: _Pipeline) -> None:
    """The writer task: what ``flush`` leaves to it, until the reader is closing and all the
    replies were sent (then ``drained``)."""
    fd = stream if type(stream) is FdStream else None
    while True:
        state.writing = True
        if fd is not None and fd.kept:
            await fd.send_kept()
        if state.broken:
            raise trio.BrokenResourceError("a reply could not be written: the client went away")
        out = state.take_ready()
        if out:
            await stream.send_all(out)
            continue
        if state.closing and not state.queue:
            state.drained.set()
            return
        state.writing = False
        await state.writer_idle()
