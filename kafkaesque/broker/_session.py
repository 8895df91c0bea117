"""One client connection speaking the line protocol: decode, dispatch, reply in order.

The reader decodes whatever the socket delivers. A run of publishes is handed to the broker at
once, without waiting for earlier ones to finish, so pipelined publishes proceed together (a
thousand pipelined PUBS become a few batches, appended in the order sent). Every other command
waits until everything before it has completed, and publishes wait for an earlier command that
is not a publish: a pasted ``CREATE t`` then ``PUBS t x`` then ``FETCH t 0 0`` behaves exactly as
if typed one at a time, as a Kafka client sees requests handled in order.

Each command leaves a ``Slot`` in a queue; the writer sends the replies in the queue's order,
coalescing those that are ready into one write. The queue is bounded: a client that sends faster
than its commands complete is simply not read for a while (TCP backpressure), and never makes
the broker buffer without limit.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import Protocol

import trio

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

    def encode(self) -> bytes:
        return self.data


class TaskSlot:
    """A reply computed by a task; ``set`` fills it."""

    __slots__ = ("data", "done")

    def __init__(self) -> None:
        self.data = b""
        self.done = trio.Event()

    def set(self, data: bytes) -> None:
        self.data = data
        self.done.set()

    def ready(self) -> bool:
        return self.done.is_set()

    async def wait(self) -> None:
        await self.done.wait()

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
) -> None:
    """Serve one connection until the peer closes it, sends QUIT, or breaks the framing.

    ``on_close`` hears of the end, however it came (a consumer's connection closing is how its
    group learns that it left).
    """
    session = Session()
    try:
        await _serve(stream, dispatch, limits, max_inflight, session)
    finally:
        on_close(session)


async def _serve(
    stream: trio.abc.Stream,
    dispatch: Dispatch,
    limits: LineLimits,
    max_inflight: int,
    session: Session,
) -> None:
    decoder = LineDecoder(limits)
    queue: deque[Slot] = deque()
    state = _Pipeline(max_inflight)
    barrier: Slot | None = None  # the last command that was not a publish
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_write_loop, stream, queue, state)
            while not state.closing:
                data = await stream.receive_some(_RECEIVE_BYTES)
                if not data:
                    break
                decoder.feed(data)
                for event in decoder.events():
                    if isinstance(event, BadCommand):
                        queue.append(ReadySlot(encode_reply(event.reply())))
                        if event.framing_error:
                            state.closing = True
                            break
                        continue
                    if isinstance(event, _PUBLISHES):
                        if barrier is not None and not barrier.ready():
                            state.wake_writer()
                            await barrier.wait()
                    else:
                        state.wake_writer()
                        await _settled(queue)
                    slot = dispatch(event, nursery, session)
                    queue.append(slot)
                    if not isinstance(event, _PUBLISHES):
                        barrier = slot
                    if isinstance(event, Quit):
                        state.closing = True
                        break
                state.wake_writer()
                while len(queue) >= state.max_inflight:
                    await state.wait_for_room()
            state.closing = True
            state.wake_writer()
            await state.drained.wait()  # the writer sends what is owed, then we hang up
            nursery.cancel_scope.cancel()
    except* (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # the client went away; its pending writes still complete, unanswered
    finally:
        with trio.CancelScope(shield=True):
            await stream.aclose()


async def _settled(queue: deque[Slot]) -> None:
    """Until every reply in ``queue`` is known (the writer may still be sending them)."""
    for slot in list(queue):
        if not slot.ready():
            await slot.wait()


class _Pipeline:
    """What the reader and writer of one session share."""

    def __init__(self, max_inflight: int) -> None:
        self.max_inflight = max_inflight
        self.closing = False
        self.drained = trio.Event()
        self._writer_wake = trio.Event()
        self._room = trio.Event()

    def wake_writer(self) -> None:
        self._writer_wake.set()

    async def writer_idle(self) -> None:
        await self._writer_wake.wait()
        self._writer_wake = trio.Event()

    def room(self) -> None:
        self._room.set()

    async def wait_for_room(self) -> None:
        await self._room.wait()
        self._room = trio.Event()


async def _write_loop(stream: trio.abc.Stream, queue: deque[Slot], state: _Pipeline) -> None:
    while True:
        if not queue:
            if state.closing:
                state.drained.set()
                return
            await state.writer_idle()
            continue
        out = bytearray()
        while queue and len(out) < _SEND_COALESCE_BYTES:
            slot = queue[0]
            if not slot.ready():
                if out:
                    break
                await slot.wait()
            queue.popleft()
            out += slot.encode()
        state.room()
        await stream.send_all(out)
