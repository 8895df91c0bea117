"""The producer's decisions, without I/O: accumulate, partition, batch, pick leaders, retry.

``ProducerCore`` is driven by the sync ``Producer`` and the trio ``AsyncProducer``; both only move
bytes and time. The driver's loop is::

    handle = core.append(topic, value, key=..., now_ms=now)      # the user's send()
    for send in core.ready(now):                                  # whenever woken
        write send.command to the connection of send.broker_id   # None: any broker
    core.on_response(send.batch_id, response, now)                # or core.on_error(...)
    if core.metadata_wanted: refresh METADATA, core.update_metadata(snapshot)
    sleep until core.next_wakeup_ms(now), a reply, or a new record

Delivery semantics. A batch that fails with a retriable error is sent again after a backoff, to
the leader the refreshed metadata names. Errors whose outcome is unknown (``TIMEOUT``, a connection
lost with the batch in flight) are retried too unless ``retry_unknown_outcome`` is False. With
``idempotent`` (the default) every batch carries this producer's id, epoch and the sequence of its
first record on its partition, and a retry resends the very same bytes, so the partition's leader
appends it once even if the first attempt was applied (exactly once, across leader failovers).
Without it, a retried batch may be stored twice (at least once). Records of one partition are kept
in order because, by default (``ordered``), a partition has at most one batch in flight: a retried
batch is never overtaken. A batch that fails for good leaves a gap in its partition's sequences, so
the producer takes a new random producer id for the batches it closes after that.

A silent leader. A broker paused (SIGSTOP) or cut off keeps its connections open and answers
nothing, and the partition's other replicas elect a new leader within about an election timeout.
So a batch that waits ``leader_check_ms`` for its reply makes the core ask for fresh metadata
(``check_leaders``; the driver reads it from another broker). If that metadata names another
leader for the batch's partition, ``replaced_leaders`` tells the driver to give up on the silent
broker's connection, exactly as if it had been lost: every request on it ends with an
outcome-unknown ``KafkaesqueConnectionError`` (reported through ``on_error``, once per send, as
any lost connection's are) and the usual retry rules resend it to the new leader, or fail it
when ``retry_unknown_outcome`` is False. If the metadata still names the same leader, the batch
keeps waiting (until ``request_timeout_ms``) and the check is repeated every
``leader_check_ms / 4`` while it waits.
"""

from __future__ import annotations

import secrets
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kafkaesque.protocol import (
    Acks,
    ErrorCode,
    ErrorReply,
    OkReply,
    PublishBatch,
    RemoteProtocolError,
    parse_published_reply,
    partition_for_key,
)
from kafkaesque.storage import HEADER_SIZE, Record

from ._encoding import Headers, Row, encode_batch
from ._errors import KafkaesqueConnectionError, KafkaesqueError
from ._metadata import ClusterMetadata, unknown_topic
from ._partitioner import PARTITIONINGS, Partitioning, RoundRobinPartitioner, StickyPartitioner
from ._retry import PRODUCER_RETRY, RetryPolicy, retry_decision
from ._wire import Response, shown

RECORD_OVERHEAD = 16
"""Bytes a record costs beyond its key, value and headers (msgpack framing, deltas): an estimate
used for ``batch_size``; the real batch is measured when it is built."""


@dataclass(frozen=True, slots=True)
class ProducerConfig:
    """How a producer batches, acknowledges and retries. Times are milliseconds.

    - ``linger_ms``: how long a batch that is not full waits for more records before it is sent.
    - ``batch_size``: a batch is sent once its records (key, value, headers) reach this many bytes.
    - ``acks``: ``QUORUM`` (committed by a majority) or ``LEADER`` (appended by the leader).
    - ``max_in_flight``: batches sent to one broker and not yet answered (pipelining bound).
    - ``ordered``: at most one batch in flight per partition, so a retry cannot reorder records.
    - ``retry``: backoff and attempt budget; ``delivery_timeout_ms`` bounds the time from
      ``send`` to the outcome, retries included; ``request_timeout_ms`` bounds one attempt.
    - ``retry_unknown_outcome``: retry after an outcome-unknown error (may store duplicates).
    - ``leader_check_ms``: a batch unanswered this long makes the producer re-read the metadata;
      if its partition has another leader by then, the request is given up as a lost
      connection's would be (and resent to the new leader, or failed, as the two settings above
      say). About one election timeout of the brokers; a value at or above
      ``request_timeout_ms`` turns the check off.
    - ``max_buffered_bytes``: ``send`` waits while the records not yet delivered exceed this.
    - ``max_request_bytes``: a larger record is refused (``TOO_LARGE``); the broker's default
      payload limit is 8 MiB.
    - ``idempotent``: stamp batches with a producer id and sequences so that a retry is appended
      once (requires ``ordered``).
    - ``partitioner``: where unkeyed records go (``_partitioner``): ``sticky`` fills one
      partition's batch at a time (fewest, largest batches); ``round-robin`` sends each record to
      the next partition in turn, as the seed and the broker's ``PUBS`` do (an even spread even
      for a short burst, at the cost of smaller batches).
    """

    linger_ms: float = 5.0
    batch_size: int = 64 * 1024
    acks: Acks = Acks.QUORUM
    max_in_flight: int = 5
    ordered: bool = True
    retry: RetryPolicy = PRODUCER_RETRY
    retry_unknown_outcome: bool = True
    request_timeout_ms: float = 10_000.0
    delivery_timeout_ms: float = 30_000.0
    leader_check_ms: float = 1_000.0
    max_buffered_bytes: int = 32 * 1024 * 1024
    max_request_bytes: int = 8 * 1024 * 1024
    idempotent: bool = True
    partitioner: Partitioning = "sticky"

    def __post_init__(self) -> None:
        if self.partitioner not in PARTITIONINGS:
            raise ValueError(
                f"partitioner must be one of {', '.join(PARTITIONINGS)}, not {self.partitioner}"
            )
        if self.idempotent and not self.ordered:
            raise ValueError("an idempotent producer keeps one batch in flight per partition")
        if self.linger_ms < 0 or self.batch_size < 1 or self.max_in_flight < 1:
            raise ValueError("need linger_ms >= 0, batch_size >= 1 and max_in_flight >= 1")
        if min(self.request_timeout_ms, self.delivery_timeout_ms, self.leader_check_ms) <= 0:
            raise ValueError("timeouts must be positive")
        if self.max_request_bytes <= HEADER_SIZE or self.max_buffered_bytes < 1:
            raise ValueError("max_request_bytes and max_buffered_bytes are too small")


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    """Where a record was stored: its partition and offset, and the timestamp it carries."""

    topic: str
    partition: int
    offset: int
    timestamp: int


class DeliveryHandle:
    """The outcome of one record: pending, then delivered or failed, once and for good.

    ``result()`` returns the ``RecordMetadata`` or raises the ``KafkaesqueError`` the record failed
    with; while pending it raises ``RuntimeError``. Callbacks run (in the driver's thread or task)
    when the outcome is set, or at once if it is already set; they must not raise.

    A handle is a view of its record's place in a batch: the outcome is set once for the whole
    batch (no per-record work when a batch is answered), and ``RecordMetadata`` is built when
    asked for.
    """

    __slots__ = ("_batch", "_index")

    def __init__(self, batch: ProducerBatch, index: int) -> None:
        self._batch = batch
        self._index = index

    @property
    def topic(self) -> str:
        """The topic the record was sent to."""
        return self._batch.topic

    def done(self) -> bool:
        """Whether the outcome is known."""
        return self._batch.settled

    def result(self) -> RecordMetadata:
        """Where the record was stored; raises its ``KafkaesqueError`` if it failed."""
        batch = self._batch
        if batch.error is not None:
            raise batch.error
        if not batch.settled:
            raise RuntimeError("the record is not delivered yet (flush the producer first)")
        i = self._index
        return RecordMetadata(batch.topic, batch.partition, batch.base_offset + i, batch.ts[i])

    def exception(self) -> KafkaesqueError | None:
        """The error the record failed with, or None (delivered or pending)."""
        return self._batch.error

    def add_done_callback(self, callback: Callable[[DeliveryHandle], None]) -> None:
        """Call ``callback(self)`` once the outcome is known."""
        if self._batch.settled:
            callback(self)
        else:
            self._batch.callbacks.append((self, callback))


@dataclass(eq=False)
class ProducerBatch:
    """Records bound for one partition, sent together as one ``PUBB``.

    Open (``payload`` None) while it accepts records; closed once built. Invariant: a closed
    batch's payload never changes, so a retry resends exactly the same bytes. Once settled,
    ``error`` (failed) or ``base_offset`` (delivered) is final and the records' bytes are
    released; ``ts`` stays, for ``RecordMetadata``.
    """

    batch_id: int
    topic: str
    partition: int
    created_ms: float
    base_ts: int = 0  # the first record's timestamp: rows count their timestamp deltas from it
    rows: list[Row] = field(default_factory=list)
    ts: list[int] = field(default_factory=list)  # each record's timestamp
    size: int = 0
    payload: bytes | None = None
    attempts: int = 0
    retry_at_ms: float = 0.0
    sent_to: int | None = None  # the broker its last attempt went to
    maybe_applied: bool = False  # an earlier attempt ended with an outcome-unknown error
    settled: bool = False
    base_offset: int = -1
    error: KafkaesqueError | None = None
    callbacks: list[tuple[DeliveryHandle, Callable[[DeliveryHandle], None]]] = field(
        default_factory=list
    )

    @property
    def count(self) -> int:
        """How many records the batch holds."""
        return len(self.ts)

    def append(
        self, key: bytes | None, value: bytes | None, headers: Headers, timestamp: int, size: int
    ) -> int:
        """Add a record (``size`` as ``batch_size`` counts it); return its index in the batch."""
        ts = self.ts
        index = len(ts)
        if not index:
            self.base_ts = timestamp
        self.rows.append((index, timestamp - self.base_ts, key, value, headers))  # a ``Row``
        ts.append(timestamp)
        self.size += size
        return index

    def close(self, producer: tuple[int, int, int] | None = None) -> None:
        """Build the batch's bytes (once), stamped with ``producer`` (id, epoch, sequence)."""
        if self.payload is None:
            if producer is None:
                self.payload = encode_batch(self.rows, self.base_ts, self.ts)
            else:
                self.payload = encode_batch(self.rows, self.base_ts, self.ts, producer)

    def settle(self, base_offset: int, error: KafkaesqueError | None) -> None:
        """Set the outcome of every record (once), run the callbacks, release the bytes."""
        if self.settled:
            return
        self.settled, self.base_offset, self.error = True, base_offset, error
        self.rows, self.payload = [], None
        callbacks, self.callbacks = self.callbacks, []
        for handle, callback in callbacks:
            callback(handle)


@dataclass(frozen=True, slots=True)
class SendRequest:
    """Send ``command`` (one ``PUBB``) to broker ``broker_id`` (None: any broker, which forwards
    it), then report the answer with ``on_response(batch_id, ...)`` or ``on_error``."""

    batch_id: int
    broker_id: int | None
    command: PublishBatch


def record_size(record: Record) -> int:
    """The bytes a record adds to a batch, as ``batch_size`` counts them (an estimate)."""
    return _size(record.key, record.value, record.headers)


def _size(key: bytes | None, value: bytes | None, headers: Headers) -> int:
    size = RECORD_OVERHEAD
    if key is not None:
        size += len(key)
    if value is not None:
        size += len(value)
    for name, data in headers:  # a loop, not sum(generator): once per record sent
        size += len(name) + len(data) + 2
    return size


class ProducerCore:
    """Per-partition accumulators, the partitioner, in-flight bookkeeping and retry decisions.

    Pure: time comes in as ``now_ms`` (any monotonic clock in milliseconds), metadata through
    ``update_metadata``, replies through ``on_response``/``on_error``. Nothing here blocks, sleeps
    or raises for a broker's error: a failed record's error is a value in its ``DeliveryHandle``.
    """

    def __init__(self, config: ProducerConfig | None = None) -> None:
        self.config = config or ProducerConfig()
        self._metadata = ClusterMetadata()
        self._metadata_wanted = False
        self._sticky = StickyPartitioner()
        # Set when unkeyed records go round-robin; then the sticky partitioner is never asked.
        self._round_robin = (
            RoundRobinPartitioner() if self.config.partitioner == "round-robin" else None
        )
        self._next_id = 0
        # Invariant: every batch not settled is in exactly one place: _open (at most one per
        # partition, still accepting records), a _queued deque (closed, waiting to be sent or
        # retried, oldest first) or _in_flight (sent, not answered).
        self._open: dict[tuple[str, int], ProducerBatch] = {}
        self._queued: dict[tuple[str, int], deque[ProducerBatch]] = {}
        # Batch id -> (batch, the broker it went to, when it was sent).
        self._in_flight: dict[int, tuple[ProducerBatch, int | None, float]] = {}
        # Batches in flight whose broker the driver was told to give up on (replaced_leaders):
        # each is still in _in_flight until the driver reports its end, so it is not resent
        # before then, and it is not reported twice.
        self._abandoned: set[int] = set()
        self._next_leader_check_ms = 0.0  # a leader check is asked for at most this often
        self._in_flight_per_broker: dict[int | None, int] = {}
        self._busy_partitions: set[tuple[str, int]] = set()
        self._producer_id = _new_producer_id()
        self._sequences: dict[tuple[str, int], int] = {}  # next sequence per partition
        self._buffered_bytes = 0
        self._pending_records = 0
        # The open batch of each topic's sticky partition, for ``add``'s fast path.
        self._sticky_open: dict[str, ProducerBatch] = {}
        # A batch takes a record only while its size stays within this bound.
        self._batch_limit = min(self.config.batch_size, self.config.max_request_bytes - HEADER_SIZE)
        self.changes = 0  # counts batches opened and closed: a driver's cue that ready() may act
        self.delivered = 0  # records acknowledged since the start
        self.failed = 0  # records failed since the start

    # -- metadata ------------------------------------------------------------------------------

    @property
    def metadata(self) -> ClusterMetadata:
        """The snapshot leaders and partition counts are read from."""
        return self._metadata

    @property
    def metadata_wanted(self) -> bool:
        """True when a reply said the metadata is stale (leader moved, broker gone)."""
        return self._metadata_wanted

    def update_metadata(self, metadata: ClusterMetadata) -> None:
        """Take a fresh snapshot; clears ``metadata_wanted``.

        A batch waiting out a backoff whose partition now has another leader than the broker
        that failed it goes at once (as Kafka's producer does since KIP-951): the backoff spares
        the broker that refused, and the new leader refused nothing. A graceful stop or a
        failover then costs one round trip, not a backoff."""
        self._metadata = metadata
        self._metadata_wanted = False
        self._sticky_open.clear()  # partition counts may have changed
        for tp, queue in self._queued.items():
            head = queue[0] if queue else None
            if head is not None and head.retry_at_ms and head.sent_to != self._leader_id(tp):
                head.retry_at_ms = 0.0

    def want_metadata(self) -> None:
        """Ask the driver for a refresh (as a stale-leader error would)."""
        self._metadata_wanted = True

    # -- accumulating --------------------------------------------------------------------------

    @property
    def buffered_bytes(self) -> int:
        """Bytes of records accepted and not settled yet (``max_buffered_bytes`` bounds it)."""
        return self._buffered_bytes

    @property
    def pending(self) -> int:
        """Records accepted and not settled yet (delivered or failed)."""
        return self._pending_records

    def has_room(self) -> bool:
        """Whether ``append`` may take another record without exceeding the buffer bound."""
        return self._buffered_bytes < self.config.max_buffered_bytes

    def choose_partition(self, topic: str, key: bytes | None, partition: int | None) -> int:
        """The partition a record goes to: ``partition`` if given, else by key hash, else by the
        ``partitioner`` setting (round-robin moves on by one partition at each call).

        Raises ``KafkaesqueError``: ``UNKNOWN_TOPIC`` (retriable) if the metadata does not know the
        topic, ``UNKNOWN_PARTITION`` for a partition out of range.
        """
        count = self._metadata.partition_count(topic)
        if count is None:
            raise unknown_topic(topic)
        if partition is not None:
            if not 0 <= partition < count:
                raise KafkaesqueError(
                    ErrorCode.UNKNOWN_PARTITION,
                    f"topic {topic} has partitions 0 to {count - 1}, not {partition}",
                )
            return partition
        if key is not None:
            return partition_for_key(key, count)
        if self._round_robin is not None:
            return self._round_robin.partition(topic, count)
        return self._sticky.partition(topic, count)

    def append(
        self,
        topic: str,
        record: Record,
        *,
        partition: int | None = None,
        now_ms: float,
    ) -> DeliveryHandle:
        """Accept ``record`` for ``topic``; return the handle that will report its outcome.

        The partition is chosen by ``choose_partition`` (same errors). Raises ``KafkaesqueError``
        ``TOO_LARGE`` for a record that cannot fit in one request. Does not check the buffer
        bound: the driver waits for ``has_room`` first.
        """
        return self.add(
            topic,
            record.value,
            record.key,
            record.headers,
            record.timestamp,
            partition=partition,
            now_ms=now_ms,
        )

    def add(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        headers: Headers,
        timestamp: int,
        *,
        partition: int | None = None,
        now_ms: float,
    ) -> DeliveryHandle:
        """``append`` of a record given by its fields (the drivers' path: no ``Record`` built)."""
        size = _size(key, value, headers)
        # The fast path, for most records: unkeyed, into the open batch of the sticky partition
        # (never filled when unkeyed records go round-robin).
        batch = self._sticky_open.get(topic) if key is None and partition is None else None
        if batch is None or batch.size + size > self._batch_limit:
            batch = self._batch_for(topic, key, partition, size, now_ms)
        index = batch.append(key, value, headers, timestamp, size)
        self._buffered_bytes += size
        self._pending_records += 1
        if batch.size >= self.config.batch_size:
            self._close(batch)
        return DeliveryHandle(batch, index)

    def _batch_for(
        self, topic: str, key: bytes | None, partition: int | None, size: int, now_ms: float
    ) -> ProducerBatch:
        """The open batch a record of ``size`` bytes joins (opened, or the full one closed)."""
        config = self.config
        if size + HEADER_SIZE > config.max_request_bytes:
            raise KafkaesqueError(
                ErrorCode.TOO_LARGE,
                f"a record of {size} bytes exceeds max_request_bytes ({config.max_request_bytes})",
            )
        sticky = partition is None and key is None and self._round_robin is None
        chosen = self.choose_partition(topic, key, partition)
        tp = (topic, chosen)
        batch = self._open.get(tp)
        if batch is not None and batch.size + size > self._batch_limit:
            self._close(batch)
            batch = None
            if sticky:  # the sticky partition moved on
                chosen = self.choose_partition(topic, None, None)
                tp = (topic, chosen)
                batch = self._open.get(tp)
        if batch is None:
            batch = ProducerBatch(self._new_id(), topic, chosen, now_ms)
            self._open[tp] = batch
            self.changes += 1
        if sticky:
            self._sticky_open[topic] = batch
        return batch

    def flush(self) -> None:
        """Close every open batch now (linger no longer applies to them)."""
        for batch in list(self._open.values()):
            self._close(batch)

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def _close(self, batch: ProducerBatch) -> None:
        tp = (batch.topic, batch.partition)
        del self._open[tp]
        if self.config.idempotent:
            sequence = self._sequences.get(tp, 0)
            self._sequences[tp] = sequence + batch.count
            batch.close((self._producer_id, 0, sequence))
        else:
            batch.close()
        self.changes += 1
        self._queued.setdefault(tp, deque()).append(batch)
        self._move_sticky(batch)

    def _move_sticky(self, batch: ProducerBatch) -> None:
        if self._sticky_open.get(batch.topic) is batch:
            del self._sticky_open[batch.topic]
        count = self._metadata.partition_count(batch.topic)
        if count is not None:
            self._sticky.batch_closed(batch.topic, batch.partition, count)

    def _leader_id(self, tp: tuple[str, int]) -> int | None:
        leader = self._metadata.leader(*tp)
        return None if leader is None else leader.broker_id

    def _may_send(self, tp: tuple[str, int], broker_id: int | None) -> bool:
        """Whether the bounds let a batch of ``tp`` go to ``broker_id`` now."""
        if self.config.ordered and tp in self._busy_partitions:
            return False
        return self._in_flight_per_broker.get(broker_id, 0) < self.config.max_in_flight

    def _blocked(self, tp: tuple[str, int]) -> bool:
        """Whether a batch closed now for ``tp`` would wait (``ordered``: one in flight)."""
        return self.config.ordered and (tp in self._busy_partitions or bool(self._queued.get(tp)))

    # -- sending -------------------------------------------------------------------------------

    def ready(self, now_ms: float) -> list[SendRequest]:
        """The batches to send now, marked in flight.

        Closes open batches older than ``linger_ms``; fails batches whose delivery timeout passed
        while they waited; then, per partition in order, takes the oldest closed batches whose
        backoff is over, while their partition has nothing in flight (``ordered``) and their
        broker has fewer than ``max_in_flight`` batches in flight. A partition with no known
        leader goes to any broker and asks for a metadata refresh.

        With ``ordered``, a lingering batch whose partition could not take it anyway (a batch
        in flight or waiting there) stays open and keeps taking records until the partition is
        free or the batch full, as Kafka's accumulator does: under load, batches grow instead of
        queueing one small batch per linger, and unkeyed records move on to the next partition
        meanwhile (the sticky partitioner is told the batch is done).
        """
        for batch in list(self._open.values()):
            if now_ms - batch.created_ms >= self.config.linger_ms:
                if self._blocked((batch.topic, batch.partition)):
                    self._move_sticky(batch)
                else:
                    self._close(batch)
        self._expire(now_ms)
        sends: list[SendRequest] = []
        for tp, queue in self._queued.items():
            broker_id = self._leader_id(tp)
            if broker_id is None:
                self._metadata_wanted = True
            while queue and queue[0].retry_at_ms <= now_ms and self._may_send(tp, broker_id):
                batch = queue.popleft()
                batch.attempts += 1
                self._in_flight[batch.batch_id] = (batch, broker_id, now_ms)
                in_flight = self._in_flight_per_broker.get(broker_id, 0) + 1
                self._in_flight_per_broker[broker_id] = in_flight
                self._busy_partitions.add(tp)
                assert batch.payload is not None  # closed batches are built
                command = PublishBatch(tp[0], tp[1], batch.payload, self.config.acks)
                sends.append(SendRequest(batch.batch_id, broker_id, command))
        for tp in [tp for tp, queue in self._queued.items() if not queue]:
            del self._queued[tp]
        return sends

    def next_wakeup_ms(self, now_ms: float) -> float | None:
        """When ``ready`` may have something new to do without any reply coming: the earliest
        linger expiry, end of a backoff or delivery deadline of a waiting batch (None: nothing)."""
        times = [
            b.created_ms + self.config.linger_ms
            for tp, b in self._open.items()
            if not self._blocked(tp)  # a reply unblocks it, and the driver acts on replies
        ]
        for tp, queue in self._queued.items():
            if not queue:
                continue
            if self._may_send(tp, self._leader_id(tp)):  # else only a reply can let it go
                times.append(queue[0].retry_at_ms)
            # The head is the oldest (a retried batch goes back to the head): it expires first.
            times.append(queue[0].created_ms + self.config.delivery_timeout_ms)
        oldest = self._oldest_watched_send()
        if oldest is not None:  # the next leader check (``check_leaders``)
            times.append(max(oldest + self.config.leader_check_ms, self._next_leader_check_ms))
        return max(min(times), now_ms) if times else None

    # -- silent leaders ------------------------------------------------------------------------

    def _oldest_watched_send(self) -> float | None:
        """When the oldest batch in flight to a known broker, not given up on, was sent."""
        abandoned = self._abandoned
        times = [
            sent_ms
            for batch_id, (_, broker_id, sent_ms) in self._in_flight.items()
            if broker_id is not None and batch_id not in abandoned
        ]
        return min(times) if times else None

    def _silent(self, now_ms: float) -> dict[int, tuple[ProducerBatch, int]]:
        """Batch id -> (batch, broker) of the batches unanswered for ``leader_check_ms`` or
        more, sent to a known broker and not given up on yet."""
        limit = now_ms - self.config.leader_check_ms
        abandoned = self._abandoned
        return {
            batch_id: (batch, broker_id)
            for batch_id, (batch, broker_id, sent_ms) in self._in_flight.items()
            if broker_id is not None and sent_ms <= limit and batch_id not in abandoned
        }

    def check_leaders(self, now_ms: float) -> frozenset[int]:
        """The brokers that have left a batch unanswered for ``leader_check_ms`` or more.

        When there are some and a check is due (at most every ``leader_check_ms / 4``), asks for
        a metadata refresh (``metadata_wanted``). The driver reads it from a broker not in this
        set (it tries them last), gives it to ``update_metadata``, then calls
        ``replaced_leaders``. A driver calls this whenever it wakes, before it refreshes."""
        silent = frozenset(broker_id for _, broker_id in self._silent(now_ms).values())
        if silent and now_ms >= self._next_leader_check_ms:
            self._metadata_wanted = True
            self._next_leader_check_ms = now_ms + self.config.leader_check_ms / 4
        return silent

    def replaced_leaders(self, now_ms: float) -> frozenset[int]:
        """The brokers to give up on: each has left a batch unanswered for ``leader_check_ms``
        or more while the metadata now names another broker as its partition's leader.

        The driver ends every request in flight on such a broker's connection as a lost
        connection's (``on_error`` with an outcome-unknown, retriable error, once per send) and
        does not send on that connection again: a late reply is never read. Each batch in flight
        there is returned once; it stays in flight (its partition busy, so it is not resent)
        until the driver reports its end.
        """
        silent = self._silent(now_ms)
        moved = frozenset(
            broker_id
            for batch, broker_id in silent.values()
            if self._leader_id((batch.topic, batch.partition)) not in (None, broker_id)
        )
        if moved:
            self._abandoned.update(
                batch_id
                for batch_id, (_, broker_id, _) in self._in_flight.items()
                if broker_id in moved
            )
        return moved

    # -- outcomes ------------------------------------------------------------------------------

    def on_response(self, batch_id: int, response: Response, now_ms: float) -> None:
        """Settle or retry the batch ``batch_id`` given its reply (``+OK partition offset`` or
        ``-ERR``). A reply of the wrong shape fails the batch as a protocol violation."""
        if isinstance(response, ErrorReply):
            self.on_error(batch_id, KafkaesqueError.from_reply(response), now_ms)
            return
        try:
            if not isinstance(response, OkReply):
                raise RemoteProtocolError(f"PUBB answered {shown(response)}")
            partition, base_offset = parse_published_reply(response)
        except RemoteProtocolError as exc:
            violation = KafkaesqueConnectionError(str(exc), sent=True, retriable=False)
            self.on_error(batch_id, violation, now_ms)
            return
        batch = self._take_in_flight(batch_id)
        if batch is None:
            return
        if partition != batch.partition:
            violation = KafkaesqueConnectionError(
                f"PUBB to partition {batch.partition} answered for partition {partition}",
                sent=True,
                retriable=False,
            )
            self._fail(batch, violation)
            return
        self._settled(batch)
        self.delivered += batch.count
        batch.settle(base_offset, None)

    def on_error(self, batch_id: int, error: KafkaesqueError, now_ms: float) -> None:
        """The attempt of batch ``batch_id`` failed with ``error``: queue it again at the head of
        its partition after a backoff, or fail its records (see ``retry_decision``)."""
        batch = self._take_in_flight(batch_id)
        if batch is None:
            return
        batch.maybe_applied = batch.maybe_applied or error.outcome_unknown
        decision = retry_decision(
            self.config.retry,
            error,
            batch.attempts,
            idempotent=self.config.retry_unknown_outcome,
        )
        deadline = batch.created_ms + self.config.delivery_timeout_ms
        if decision is None or now_ms + decision.delay_s * 1000 >= deadline:
            self._fail(batch, error)
            return
        if decision.refresh_metadata:
            self._metadata_wanted = True
        batch.retry_at_ms = now_ms + decision.delay_s * 1000
        self._queued.setdefault((batch.topic, batch.partition), deque()).appendleft(batch)

    def fail_all(self, error: KafkaesqueError) -> None:
        """Fail every record not settled yet (a producer closed before they were delivered).
        Batches in flight are forgotten: their replies, if any come, are ignored."""
        self.flush()
        for queue in self._queued.values():
            for batch in queue:
                self._fail(batch, error)
        self._queued.clear()
        for batch_id in list(self._in_flight):
            sent = self._take_in_flight(batch_id)
            if sent is not None:
                sent.maybe_applied = True  # it was sent: it may land anyway
                self._fail(sent, error)

    def in_flight_ids(self) -> Sequence[int]:
        """The ids of the batches sent and not answered."""
        return list(self._in_flight)

    def _take_in_flight(self, batch_id: int) -> ProducerBatch | None:
        # None: the batch was failed meanwhile (fail_all); its late reply is ignored.
        entry = self._in_flight.pop(batch_id, None)
        if entry is None:
            return None
        batch, broker_id, _ = entry
        batch.sent_to = broker_id
        self._abandoned.discard(batch_id)
        self._in_flight_per_broker[broker_id] -= 1
        self._busy_partitions.discard((batch.topic, batch.partition))
        return batch

    def _expire(self, now_ms: float) -> None:
        for queue in self._queued.values():
            while queue and now_ms - queue[0].created_ms >= self.config.delivery_timeout_ms:
                batch = queue.popleft()
                self._fail(
                    batch,
                    KafkaesqueError(
                        ErrorCode.TIMEOUT,
                        f"not delivered within delivery_timeout_ms "
                        f"({self.config.delivery_timeout_ms:g}) after {batch.attempts} attempts",
                        outcome_unknown=batch.maybe_applied,
                    ),
                )

    def _fail(self, batch: ProducerBatch, error: KafkaesqueError) -> None:
        if batch.maybe_applied and not error.outcome_unknown:
            # An earlier attempt ended in doubt: the last error's "not applied" is not the whole
            # story, and "failed" must not be reported where "maybe" is the truth.
            error = KafkaesqueError(
                error.code,
                f"{error.message} (an earlier attempt may have been applied)",
                retriable=error.retriable,
                outcome_unknown=True,
            )
        self._settled(batch)
        self.failed += batch.count
        batch.settle(-1, error)
        if self.config.idempotent:
            # Its sequences are a gap the leader would refuse every later batch for: start over
            # as a new producer (batches already closed keep their identity and may fail too).
            self._producer_id = _new_producer_id()
            self._sequences.clear()

    def _settled(self, batch: ProducerBatch) -> None:
        self._buffered_bytes -= batch.size
        self._pending_records -= batch.count


class ProducerCounters:
    """The I/O-free half of a producer (sync and trio): its configuration and record counts."""

    _core: ProducerCore

    @property
    def config(self) -> ProducerConfig:
        """The producer's configuration."""
        return self._core.config

    @property
    def pending(self) -> int:
        """Records sent and not yet delivered or failed."""
        return self._core.pending

    @property
    def delivered(self) -> int:
        """Records acknowledged so far (by a quorum, with the default ``acks``)."""
        return self._core.delivered

    @property
    def failed(self) -> int:
        """Records failed so far (their futures hold the errors)."""
        return self._core.failed


def _new_producer_id() -> int:
    """A random 62-bit producer id: collisions are as likely as guessing a 62-bit secret."""
    return secrets.randbits(62)
