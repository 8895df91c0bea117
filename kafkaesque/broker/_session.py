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
``FdStream`` or an ``SslFdStream`` (TLS), that task writes the replies now ready at once
(``send_now``), as an MQTT device's PUBACKs are (``mqtt._device``), instead of waking the writer
for a pass of the scheduler that costs far more than the write. What a full socket does not take
is kept, in order, for the writer, which also does all the writing on other streams (tests'
memory streams).

Graceful shutdown (``Draining``, see ``_shutdown``): once the broker starts to stop, the session
takes no new request. What it dispatched before finishes: a write waits for its commit (at the
new leader, through forwarding, once the leadership was handed over), a long poll (FETCH or CONS
with ``wait_ms``) is cut short and answers what there is now, maybe nothing, as if its wait had
ended. Every request it reads from then on (pipelined lines, say) is answered ``-ERR NOT_READY``
without being done, which clients retry through another broker. Once no reply is owed and
nothing more came for ``_LAST_LINES_S`` (50 ms), the session stops reading, sends its last
replies and the end of the stream, and closes.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Protocol

import trio

from kafkaesque.fd_stream import FdStream, SslFdStream
from kafkaesque.protocol import (
    BadCommand,
    Command,
    Cons,
    ErrorCode,
    ErrorReply,
    Fetch,
    LineDecoder,
    LineLimits,
    PublishBatch,
    PublishRecord,
    Pubs,
    Quit,
    Reply,
    encode_reply,
)

from ._shutdown import Draining

log = logging.getLogger("kafkaesque.broker.session")

_RECEIVE_BYTES = 64 * 1024
_SEND_COALESCE_BYTES = 256 * 1024
_PUBLISHES = (Pubs, PublishRecord, PublishBatch)
# The streams whose replies may be written at once by whoever sees them ready (``send_now``).
_FAST_STREAMS = (FdStream, SslFdStream)
# After its last reply and the end of the stream, a stopping session reads (and drops) what the
# client still sends for this long at most, until the client closes its end: closing a socket
# with unread bytes resets the connection, which may destroy replies the client has not read.
_LINGER_S = 1.0
# A stopping session that owes no reply reads on this long for lines already on their way.
_LAST_LINES_S = 0.05
SHUTTING_DOWN = encode_reply(
    ErrorReply(
        ErrorCode.NOT_READY,
        "the broker is shutting down: this connection takes no more requests (this one was not "
        "done); retry through another broker",
    )
)
"""The reply to a request read after the broker started to stop (see the module docstring)."""


class Slot(Protocol):
    """A reply's place in the pipeline."""

    def ready(self) -> bool: ...

    async def wait(self) -> None: ...

    def notify(self, waiter: Callable[[], None]) -> None:
        """Call ``waiter`` once the reply is ready (at once if it is), from the task that
        makes it ready; ``waiter`` must be quick and must not raise."""
        ...

    def encode(self) -> bytes: ...


def encode_replies(replies: Sequence[Reply]) -> bytes:
    """The wire bytes of ``replies``, in order (a multi-row reply)."""
    return b"".join(encode_reply(r) for r in replies)


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


ANONYMOUS = "User:ANONYMOUS"
"""The principal of every connection to a broker without a users file (ACLs may name it)."""


class Session:
    """What the broker remembers of one connection: the group members it joined, and who it is.

    ``address`` is the client's host (its IP address: failed AUTHs are counted per address),
    ``tls`` whether the connection is TLS (PLAIN is offered only then), ``principal`` who it
    is (``User:<name>`` once authenticated, ``ANONYMOUS`` on a broker without a users file,
    None while a broker with one waits for AUTH), ``sasl`` the SCRAM exchange in progress, if
    any (``kafkaesque.security.ScramServer``; an exchange object is used once).
    """

    __slots__ = ("address", "members", "principal", "sasl", "tls")

    def __init__(
        self, address: str = "", *, tls: bool = False, principal: str | None = ANONYMOUS
    ) -> None:
        self.members: set[str] = set()
        self.address = address
        self.tls = tls
        self.principal = principal
        self.sasl: object | None = None


Dispatch = Callable[[Command, trio.Nursery, Session], Slot]


async def serve_session(
    stream: trio.abc.Stream,
    dispatch: Dispatch,
    limits: LineLimits,
    max_inflight: int,
    on_close: Callable[[Session], None],
    on_bad: Callable[[BadCommand], None] = lambda event: None,
    draining: Draining | None = None,
    session: Session | None = None,
) -> None:
    """Serve one connection until the peer closes it, sends QUIT, or breaks the framing, or
    ``draining`` begins and the replies owed were sent (see the module docstring).

    ``on_close`` hears of the end, however it came (a consumer's connection closing is how its
    group learns that it left). ``on_bad`` hears of each line the decoder refused (the
    metrics count them), before its ``-ERR`` is queued. ``draining`` counts the connection
    among those the broker waits for when it stops. ``session`` is what the broker knows of the
    connection (its address, TLS, principal: see ``Session``); None: an anonymous one.
    """
    session = Session() if session is None else session
    try:
        await _serve(stream, dispatch, limits, max_inflight, session, on_bad, draining)
    finally:
        on_close(session)


async def _serve(
    stream: trio.abc.Stream,
    dispatch: Dispatch,
    limits: LineLimits,
    max_inflight: int,
    session: Session,
    on_bad: Callable[[BadCommand], None],
    draining: Draining | None,
) -> None:
    decoder = LineDecoder(limits)
    queue: deque[Slot] = deque()
    state = _Pipeline(stream, queue, max_inflight)
    barrier: Slot | None = None  # the last command that was not a publish
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_write_loop, stream, state)
            with draining.connection(state.stop_taking) if draining else nullcontext():
                while not state.closing:
                    data = await state.receive(stream)
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
                        if state.stopping and not isinstance(event, Quit):
                            queue.append(ReadySlot(SHUTTING_DOWN))
                            continue
                        if isinstance(event, _PUBLISHES):
                            if barrier is not None and not barrier.ready():
                                state.flush()
                                await barrier.wait()
                        else:
                            state.flush()
                            await _settled(queue)
                        if state.stopping and not isinstance(event, Quit):
                            queue.append(ReadySlot(SHUTTING_DOWN))  # began while it waited
                            continue
                        if isinstance(event, Fetch | Cons) and event.wait_ms:
                            slot = _long_poll(event, dispatch, nursery, session, state)
                        else:
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
                if state.stopping:
                    await _linger(stream)
            nursery.cancel_scope.cancel()
    except* (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # the client went away; its pending writes still complete, unanswered
    finally:
        state.broken = True  # replies that become ready from now on are not written
        with trio.CancelScope(shield=True):
            await stream.aclose()


def _long_poll(
    command: Fetch | Cons,
    dispatch: Dispatch,
    nursery: trio.Nursery,
    session: Session,
    state: _Pipeline,
) -> Slot:
    """Dispatch a long poll (a read with ``wait_ms``) so that a drain can cut it short
    (``_Pipeline.stop_taking``).

    The poll runs in a cancel scope of its own; when the drain cancels it, the same read is
    dispatched again without ``wait_ms``, and its answer (what there is now, maybe nothing, as
    when a wait ends) is the reply. A read changes no data, so reading twice is harmless.
    """
    slot = TaskSlot()
    scope = trio.CancelScope()

    async def run() -> None:
        reply: Slot | None = None
        state.polls.add(scope)
        try:
            with scope:
                async with trio.open_nursery() as polling:
                    reply = dispatch(command, polling, session)
                    await reply.wait()
        finally:
            state.polls.discard(scope)
        if reply is None or not reply.ready():  # cut short: read what there is now
            async with trio.open_nursery() as reading:
                reply = dispatch(dataclasses.replace(command, wait_ms=None), reading, session)
                await reply.wait()
        slot.set(reply.encode())

    nursery.start_soon(run)
    return slot


async def _linger(stream: trio.abc.Stream) -> None:
    """End the stream of a stopping session, then read and drop what the client still sends
    until it closes its end (at most ``_LINGER_S``): see ``_LINGER_S``."""
    if not isinstance(stream, FdStream | trio.abc.HalfCloseableStream):
        return
    with trio.move_on_after(_LINGER_S):
        await stream.send_eof()
        while await stream.receive_some(_RECEIVE_BYTES):
            pass


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
        self.stopping = False  # the broker drains: no new request is taken (``stop_taking``)
        self.polls: set[trio.CancelScope] = set()  # the long polls running (``_long_poll``)
        self._receiving: trio.CancelScope | None = None  # while the reader waits for bytes
        self.writing = False  # the writer task is between its wake-up and its next wait
        self.broken = False  # a write failed, or the session ended
        self.drained = trio.Event()
        self._fd = stream if isinstance(stream, _FAST_STREAMS) else None
        self._writer_wake = trio.Event()
        self._room = trio.Event()

    def stop_taking(self) -> None:
        """The broker started to stop (``Draining.begin``): take no new request, cut the long
        polls short, and stop reading soon if no reply is owed (``_LAST_LINES_S``). Never waits
        or raises."""
        self.stopping = True
        for scope in list(self.polls):
            scope.cancel()
        self._stop_reading_if_done()

    def _stop_reading_if_done(self) -> None:
        if self.stopping and not self.queue and self._receiving is not None:
            # Not at once: lines already on their way are read and answered NOT_READY, so a
            # client that streams them learns to stop (found by the pipelined-writes drain test
            # under load: a stream that was never refused ran on past the linger, and the
            # close reset the connection under replies the client had not read yet).
            scope = self._receiving
            scope.deadline = min(scope.deadline, trio.current_time() + _LAST_LINES_S)

    async def receive(self, stream: trio.abc.Stream) -> bytes | bytearray:
        """The client's next bytes; b"" at the end of its stream, or once the session stops
        taking requests and owes no reply and nothing more came (``stop_taking``)."""
        with trio.CancelScope() as scope:
            if self.stopping and not self.queue:
                scope.deadline = trio.current_time() + _LAST_LINES_S
            self._receiving = scope
            try:
                return await stream.receive_some(_RECEIVE_BYTES)
            finally:
                self._receiving = None
        return b""  # nothing more came (``_stop_reading_if_done``)

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
            if self.queue and self.queue[0].ready():
                # More was ready than one write takes (``_SEND_COALESCE_BYTES``): the writer
                # sends the rest. No one else would: these replies notify no one any more, and
                # a reader held at ``max_inflight`` waits for them to leave (found by the
                # pipelined-writes drain test under load: a read's worth of refused lines,
                # 3,000 NOT_READY replies, more than one write; the session stalled until the
                # shutdown deadline cut it, and the client saw ECONNRESET).
                self._writer_wake.set()
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
        if not queue:
            self._stop_reading_if_done()
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
    fd = stream if isinstance(stream, _FAST_STREAMS) else None
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
