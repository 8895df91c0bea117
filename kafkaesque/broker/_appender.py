"""Coalescing single-record publishes into idempotent batches, one appender per partition.

Every producer of single records goes through here: PUBS and PUB lines, MQTT PUBLISHes, the MQTT
session store. A telnet client or a device sends one record at a time; one Raft entry per record
would cost a proposal, a log write and an acknowledgement each. Every record bound for a
partition therefore joins the appender's open batch, and no timer adds latency. When the batch is
sealed follows Nagle's rule, widened for a trickle: at once if no batch of this appender is in
flight, or if fewer than ``EAGER_FLIGHTS`` (two) are and each holds a single record; else only
once it holds ``_WORTH_PIPELINING_RECORDS`` records or ``_WORTH_PIPELINING_BYTES`` bytes;
otherwise it grows until a batch in flight is done. (With Nagle's rule alone, a record that came
while a lone record was in flight waited for that record's whole commit round: about a round of
latency per write at 1,000 msg/s, ``bench.write_trace``. Once batches in flight hold several
records, the load is no trickle and Nagle's rule holds as it was.) A trickle therefore goes out
record by record, a moderate load as one batch per commit round instead of one tiny batch per
arrival (every batch
costs a forward, a Raft entry on three brokers and a commit wait, whatever its size), and a heavy
load still keeps up to ``WINDOW`` full batches in flight.

Every batch is stamped with the appender's producer id and the sequence number of its first
record, as an idempotent producer's are (``_producers``). ``WritePath`` retries a batch whose
outcome was unknown (the leader died after the batch reached it), and the partition's leader, old
or new, then answers the retry with the offsets of the first append instead of appending it
again. A request the broker acknowledges, or retries on its own, is therefore in the log once:
the broker's retries never duplicate a record (only a client's own resend of a record without a
producer id can).

A patient appender (``patience_s`` above 0: the MQTT wing's) retries a batch that failed as a
failover makes writes fail (``NO_QUORUM``, ``NOT_LEADER``, ``TIMEOUT``: no leader with a quorum
yet, or no answer in time) for ``patience_s`` more, the same bytes under the same producer id
and sequence, as ``WritePath`` retries within one write timeout: a device then gets its
acknowledgement late instead of losing its connection. The line protocol's appenders are not
patient: a client hears ``NO_QUORUM`` or ``TIMEOUT`` after one write timeout, as documented.

The leader remembers the last ``WINDOW`` batches of a producer, so at most that many batches are
in flight at once (more wait sealed, in order; with up to 4096 records a batch that is no limit
on throughput). Each batch is retried on its own by ``WritePath``: when an earlier one has not
reached the leader yet (it is being retried: a new partition's first leader, a failover), the
leader refuses a later one as out of order, and the later one simply waits for the earlier ones
and tries again; if the gap does not fill, its records go again under a new producer id (see
``_after_refusal``). When a batch fails for good, its flight carries the error: a line-protocol
client gets it as its reply; an MQTT device's connection closes, so it resends what was not
acknowledged.

No task and no pass of the scheduler stands between a record and its batch's start: ``add``
seals and starts what Nagle's rule lets go, from the caller's own context (a connection's
reader), and a batch that finishes starts the next one from whoever finished it. A task per
appender woken by each write would cost a pass of the scheduler per record, several times the
work of the start itself. Starting is guarded against re-entrance: ``WritePath.when_written`` may
tell a batch's outcome at once (a duplicate the log holds already, a forward whose call ended
already), which finishes it and would start the next one from inside the start; the nested call
only asks the outer one to go on, so batches start in order, one at a time, never more than
``WINDOW`` in flight.

No task waits for a batch in the common case either: ``WritePath.when_written`` has whoever
learns the outcome call the appender back (the Raft step that sees this leader's commit reach
it, or the peer reader that brings the leader's answer to a forwarded batch), and that task
finishes the flight, whose waiters write the replies it freed, and starts the next batch. A
batch goes the task way (``_complete``: ``WritePath.write`` and its retries) when the write path
cannot tell its outcome (see ``when_written``), when it tells an attempt to go on with instead
(cut from the log before it committed, refused or lost on its way to the leader), or when it is
still untold at its deadline. ``run`` is the appender's one task: it watches those deadlines and
gives the nursery the ``_complete`` tasks run in; a batch that needs such a task before ``run``
started is started all the same and gets its task once ``run`` runs.
"""

from __future__ import annotations

import functools
import logging
import secrets
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from kafkaesque.protocol import Acks, ErrorCode
from kafkaesque.storage import Record, build_batch

from ._errors import RequestError
from ._log_ids import log_id_of
from ._producers import WINDOW
from ._writes import Attempt, WritePath

log = logging.getLogger("kafkaesque.broker.appender")

_MAX_BATCH_RECORDS = 4096
_MAX_BATCH_BYTES = 1 << 20
# A batch this big is sealed even while another is in flight (below it, it waits: Nagle).
_WORTH_PIPELINING_RECORDS = 64
_WORTH_PIPELINING_BYTES = 64 << 10
# A batch is sealed at once, however small, while fewer than this many are in flight and each
# holds one record (a trickle); otherwise Nagle's rule. With one (Nagle's rule alone), a record
# that came while a lone record was in flight waited for its whole commit round, a fixed cost of
# about a round at 1,000 msg/s (``bench.write_trace``); bigger batches in flight mean a load
# that Nagle's rule serves better (docs/mqtt.md: fewer batches, lower p99 at 5,000 msg/s).
EAGER_FLIGHTS = 2
_RECORD_OVERHEAD_BYTES = 64  # what a record adds to a batch beyond its key and value, about
_REORDER_TRIES = 5
_REORDER_PAUSE_S = 0.002
# What a patient appender retries (see ``PartitionAppender``): a failover's errors.
_FAILOVER_CODES = frozenset({ErrorCode.TIMEOUT, ErrorCode.NO_QUORUM, ErrorCode.NOT_LEADER})


@dataclass(eq=False, slots=True)
class Flight:
    """One batch of records on its way into the log.

    Whoever waits for it either awaits ``done`` (a line-protocol reply) or registers a callback
    with ``notify`` (an MQTT connection, whose writer has other work than this flight). Once
    done, ``base`` is the offset of its first record, or ``error`` says why it failed."""

    partition: int
    done: trio.Event = field(default_factory=trio.Event)
    records: int = 0  # how many records, once started
    base: int = -1
    error: RequestError | None = None
    waiters: list[Callable[[], None]] = field(default_factory=list)

    def notify(self, waiter: Callable[[], None]) -> None:
        """Call ``waiter`` once the flight is done (at once if it is)."""
        if self.done.is_set():
            waiter()
        elif not self.waiters or self.waiters[-1] != waiter:  # == for bound methods
            self.waiters.append(waiter)

    def finish(self) -> None:
        """Mark the flight done (``base`` or ``error`` set) and call its waiters."""
        self.done.set()
        waiters, self.waiters = self.waiters, []
        for waiter in waiters:
            waiter()


@dataclass(eq=False, slots=True)
class _Told:
    """A started batch whose outcome its Raft group will tell (``WritePath.when_written``)."""

    flight: Flight
    records: list[Record]
    batch: bytes
    attempt: Attempt
    deadline: float
    waiting: bool = True  # False once told, or handed to a task at its deadline


def new_producer_id() -> int:
    """A random 62-bit producer id (as the client library's: collisions are negligible)."""
    return secrets.randbits(62)


class PartitionAppender:
    """The open batch of one partition and acks level; it seals and starts batches in order,
    from the context of whoever adds a record or finishes a batch (no task per write)."""

    def __init__(
        self,
        log_id: str,
        partition: int,
        acks: Acks,
        writes: WritePath,
        patience_s: float = 0.0,
        *,
        eager_flights: int = EAGER_FLIGHTS,
    ) -> None:
        if eager_flights < 1:
            raise ValueError("need eager_flights >= 1")
        self._eager = eager_flights
        self._log_id = log_id
        self._patience_s = patience_s
        self._partition = partition
        self._acks = acks
        self._writes = writes
        self._records: list[Record] = []
        self._bytes = 0
        self._flight = Flight(partition)
        self._sealed: deque[tuple[Flight, list[Record]]] = deque()
        self._order: list[Flight] = []  # batches started and not finished, in order
        # Invariant: at most ``WINDOW`` batches in ``_order``; open records only wait while one is.
        self._starting = False  # ``_start_what_may_go`` is running: a nested call defers to it
        self._again = False  # a nested call asked the running one to look again
        # Batches waiting to be told their outcome, in start order, so in deadline order.
        self._told: deque[_Told] = deque()
        self._nursery: trio.Nursery | None = None  # ``run``'s, for the batches that need a task
        # ``_complete``'s arguments for batches that needed a task before ``run`` gave the nursery.
        self._unspawned: list[tuple[Flight, list[Record], bytes, Attempt, float]] = []
        self._producer_id = new_producer_id()
        self._sequence = 0
        self.closed = False

    def add(self, record: Record) -> tuple[Flight, int]:
        """Queue ``record``; its offset will be ``flight.base + index`` once ``flight.done``.

        Before returning, starts what Nagle's rule lets go (the batch this record joined, when
        no batch is in flight), without awaiting. Raises ``RequestError`` (``UNKNOWN_TOPIC``)
        once the topic was deleted (``fail_all``).
        """
        if self.closed:
            raise RequestError(ErrorCode.UNKNOWN_TOPIC, "the topic was deleted")
        index = len(self._records)
        if index >= _MAX_BATCH_RECORDS or self._bytes >= _MAX_BATCH_BYTES:
            self._seal()
            index = 0
        flight = self._flight
        self._records.append(record)
        size = _RECORD_OVERHEAD_BYTES  # (no ``len`` of a missing key: calls count here, issue 22)
        if record.value:
            size += len(record.value)
        if record.key:
            size += len(record.key)
        self._bytes += size
        self._start_what_may_go()
        return flight, index

    async def settled(self) -> None:
        """Until every record added so far has its outcome (committed, or failed)."""
        flights = [*self._order, *(flight for flight, _ in self._sealed)]
        if self._records:
            flights.append(self._flight)
        for flight in flights:
            await flight.done.wait()

    def _seal(self) -> None:
        if self._records:
            self._sealed.append((self._flight, self._records))
            self._records, self._bytes, self._flight = [], 0, Flight(self._partition)

    def _start_what_may_go(self) -> None:
        """Seal the open batch if Nagle's rule says so, and start sealed batches in order while
        fewer than ``WINDOW`` are in flight.

        Re-entrant calls (a batch told its outcome inside ``when_written``, finishing it; a
        flight's waiter adding a record) do not start anything themselves: they ask the running
        call to look again once the current start is done, so batches never start out of order
        and no recursion grows with the number of batches.
        """
        if self._starting:
            self._again = True
            return
        self._starting = True
        try:
            while True:
                self._again = False
                if self._records and (
                    (len(self._order) < self._eager and self._trickle())
                    or (
                        len(self._order) < WINDOW
                        and (
                            len(self._records) >= _WORTH_PIPELINING_RECORDS
                            or self._bytes >= _WORTH_PIPELINING_BYTES
                        )
                    )
                ):
                    self._seal()
                while self._sealed and len(self._order) < WINDOW:
                    self._start(*self._sealed.popleft())
                if not self._again:
                    return
        finally:
            self._starting = False

    def _trickle(self) -> bool:
        """Whether every batch in flight is a single record (a trickle, or nothing in flight)."""
        return all(f.records == 1 for f in self._order)

    def _start(self, flight: Flight, records: list[Record]) -> None:
        """Stamp, build and start one sealed batch; have the group tell its outcome, or a task
        await it."""
        # The sequence is assigned at start, so batches carry increasing sequences in the order
        # they are proposed (forwarded ones too: the leader starts them in the order they
        # arrive, ``WritePath.start_forwarded``).
        count = len(records)
        flight.records = count
        stamp = (self._producer_id, self._sequence)
        self._sequence += count
        batch = build_batch(records, producer_id=stamp[0], base_sequence=stamp[1])
        deadline = trio.current_time() + self._writes.timeout
        attempt = self._writes.start(self._log_id, batch, count, self._acks, deadline)
        self._order.append(flight)
        told = _Told(flight, records, batch, attempt, deadline)
        self._told.append(told)  # before: the group may tell at once
        if not self._writes.when_written(
            attempt, self._acks, deadline, functools.partial(self._was_told, told)
        ):
            self._told.pop()
            self._spawn_complete(flight, records, batch, attempt, deadline)

    async def run(self, nursery: trio.Nursery) -> None:
        """Watch the deadlines of started batches until cancelled; a batch whose outcome needs
        awaiting is awaited in ``nursery`` (see the module docstring). Records added before this
        runs are started all the same; only their tasks, if any need one, wait for it."""
        self._nursery = nursery
        unspawned, self._unspawned = self._unspawned, []
        for args in unspawned:
            nursery.start_soon(self._complete, *args)
        await self._watch_deadlines()

    def _was_told(self, told: _Told, outcome: tuple[int, int] | Attempt) -> None:
        """The group's news of a batch (``WritePath.when_written``): finish its flight here, or
        hand the batch to a task that retries it."""
        if not told.waiting:
            return  # its deadline passed first: a task has it
        told.waiting = False
        if self._told[0] is told:
            self._told.popleft()  # the usual case: commits come in offset order
        else:
            self._told.remove(told)
        if isinstance(outcome, tuple):
            told.flight.base = outcome[0]
            self._finished(told.flight)
        else:
            self._to_task(told, outcome)

    def _to_task(self, told: _Told, attempt: Attempt) -> None:
        """Have a task await ``told``'s outcome from ``attempt`` on, with ``write``'s retries."""
        self._spawn_complete(told.flight, told.records, told.batch, attempt, told.deadline)

    def _spawn_complete(
        self, flight: Flight, records: list[Record], batch: bytes, attempt: Attempt, deadline: float
    ) -> None:
        """Start ``_complete`` in ``run``'s nursery, or once ``run`` gives it."""
        if self._nursery is None:
            self._unspawned.append((flight, records, batch, attempt, deadline))
        else:
            self._nursery.start_soon(self._complete, flight, records, batch, attempt, deadline)

    async def _watch_deadlines(self) -> None:
        """Hand each batch still untold at its deadline to a task, where ``WritePath.write``
        answers it as it would have (``TIMEOUT``: the outcome is unknown).

        Deadlines are one write timeout after their batch started, so the oldest batch's is the
        next: this wakes once per timeout while nothing is late, not once per batch.
        """
        while True:
            now = trio.current_time()
            told = self._told
            while told and told[0].deadline <= now:
                late = told.popleft()
                late.waiting = False
                self._to_task(late, late.attempt)
            await trio.sleep_until(told[0].deadline if told else now + self._writes.timeout)

    def _finished(self, flight: Flight) -> None:
        """``flight`` has its outcome: tell its waiters, and start what may go now."""
        self._order.remove(flight)
        flight.finish()
        if self._records or self._sealed:
            self._start_what_may_go()

    async def _complete(
        self,
        flight: Flight,
        records: list[Record],
        batch: bytes,
        attempt: Attempt | None,
        deadline: float,
    ) -> None:
        count = len(records)
        refusals = 0
        patient_until = deadline + self._patience_s
        try:
            while True:
                try:
                    flight.base, _ = await self._writes.write(
                        self._log_id, batch, count, self._acks, first=attempt, deadline=deadline
                    )
                    return
                except RequestError as exc:
                    now = trio.current_time()
                    if self._patience_s and exc.code in _FAILOVER_CODES and now < patient_until:
                        # No leader with a quorum yet, or the outcome unknown: the same batch
                        # again, under the same producer id and sequence, which the leader (old
                        # or new) answers with the first copy's offsets if it has it.
                        log.info("%s: %d records: %s; retrying", self._log_id, count, exc)
                        deadline = min(now + self._writes.timeout, patient_until)
                        attempt = None
                        continue
                    refusals += 1
                    if exc.code is not ErrorCode.OUT_OF_ORDER_SEQUENCE or refusals > _REORDER_TRIES:
                        raise
                    batch = await self._after_refusal(flight, records, batch, refusals)
                    attempt = None
        except RequestError as exc:
            log.info("%s: a batch of %d records failed: %s", self._log_id, count, exc)
            flight.error = exc
        finally:
            self._finished(flight)

    async def _after_refusal(
        self, flight: Flight, records: list[Record], batch: bytes, refusals: int
    ) -> bytes:
        """The batch to send after the leader refused ``batch`` as out of order.

        The leader has not appended it (a batch it holds would be in its window, which no more
        than ``WINDOW`` batches of ours can pass). Either an earlier batch overtaken on the way
        is not in yet (it is being retried, or was forwarded in the same frame and started after
        this one on the leader's side): once the earlier ones are done, the same batch is next.
        Or the sequence has a gap that will not fill (a new leader accepted a later batch of
        ours first, as it accepts any first sequence of a producer it does not know): then the
        records go again under a new producer id, at sequence 0, alone; so do later batches.
        That is safe even when an earlier attempt's outcome was unknown: the leader refuses
        only once an entry of its term has committed (``WritePath``), and then a first copy it
        does not hold can never commit.
        """
        earlier = self._order[: self._order.index(flight)]
        log.debug("%s: refused out of order (%d); %d earlier", self._log_id, refusals, len(earlier))
        for other in earlier:
            await other.done.wait()
        if refusals == 1:
            if not earlier:
                await trio.sleep(_REORDER_PAUSE_S)
            return batch
        self._producer_id, self._sequence = new_producer_id(), 0
        return build_batch(records, producer_id=new_producer_id(), base_sequence=0)

    def fail_all(self, error: RequestError) -> None:
        """The topic went away: fail what is queued, refuse what comes."""
        self.closed = True
        self._seal()
        for flight, _ in self._sealed:
            flight.error = error
            flight.finish()
        self._sealed.clear()


class Appenders:
    """The broker's appenders, one per (topic, partition, acks) that was published to here.

    Built by the broker with the write path they write through and its nursery (None while the
    broker is not running): each appender's ``run`` is a task of the broker, as it outlives the
    request that made it.
    """

    def __init__(self, writes: WritePath, nursery: Callable[[], trio.Nursery | None]) -> None:
        self._writes = writes
        self._nursery = nursery
        self._appenders: dict[tuple[str, int, Acks, float], PartitionAppender] = {}

    def get(
        self, topic: str, partition: int, acks: Acks, patience_s: float = 0.0
    ) -> PartitionAppender:
        """The partition's appender for ``acks`` and ``patience_s`` (see ``PartitionAppender``),
        made (and its task started) on first use. Raises ``RequestError`` ``BUSY`` when the
        broker is not running (shutting down)."""
        key = (topic, partition, acks, patience_s)
        appender = self._appenders.get(key)
        if appender is None:
            nursery = self._nursery()
            if nursery is None:
                raise RequestError(ErrorCode.BUSY, "the broker is shutting down")
            appender = PartitionAppender(
                log_id_of(topic, partition), partition, acks, self._writes, patience_s
            )
            self._appenders[key] = appender
            nursery.start_soon(appender.run, nursery)
        return appender

    def topic_deleted(self, topic: str, partition: int) -> None:
        """The partition's topic was deleted: its appenders go, failing the writes queued."""
        for key in [k for k in self._appenders if k[:2] == (topic, partition)]:
            appender = self._appenders.pop(key)
            appender.fail_all(RequestError(ErrorCode.UNKNOWN_TOPIC, "the topic was deleted"))
