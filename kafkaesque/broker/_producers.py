"""Idempotent producers: a partition leader appends a retried batch once.

A producer stamps each batch with its producer id, epoch and the sequence number of its first
record, counting its records per partition (the batch header's fields, as in Kafka). The leader
keeps, per producer, the last ``WINDOW`` batches it appended (Kafka and Redpanda keep five) and
decides for each new batch:

* the same sequences as a batch in the window: a retry. It is not appended again; it is
  answered with the original batch's offsets once those commit;
* the next sequence (the last one + 1): appended, and remembered;
* an older epoch: ``FENCED``; a newer epoch: a new session, whose sequences start at 0;
* anything else: ``OUT_OF_ORDER_SEQUENCE`` (an earlier batch was lost, or the producer
  reordered its retries); nothing is written. The write path gives that answer only once the
  leader has committed an entry of its term (until then, a retriable "not yet"): before, a copy
  of the batch in a deposed leader's log may still commit, and a producer told "not written"
  would send its records again.

The window lives with the leader, for its term. A new leader rebuilds it from its own log before
it decides on a producer's batch (``rebuild``), so a batch retried after a failover is still
appended once: its first append is either in the new leader's log (a duplicate) or was
truncated away (then it is appended now). The rebuild reads at most ``REBUILD_BYTES`` from the
log's end; a producer silent for longer than that is treated as new, as Kafka forgets producers
after a while.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

from kafkaesque.protocol import ErrorCode
from kafkaesque.storage import NO_PRODUCER_ID, BatchHeader, BatchType, PartitionLog, iter_batches

WINDOW = 5
SEQUENCES = 1 << 31
"""Sequence numbers are Kafka's int32 and wrap from 2**31 - 1 to 0 (a long-lived producer's
next batch after 2**31 records starts at 0 again, and is not out of order)."""
REBUILD_BYTES = 256 * 1024 * 1024
_READ_BYTES = 4 * 1024 * 1024


class Appended(NamedTuple):
    base_sequence: int
    last_sequence: int
    first_offset: int
    last_offset: int


class Accept(NamedTuple):
    """Append the batch (then ``ProducerStates.record`` it)."""


class Duplicate(NamedTuple):
    """A retry of a batch already in the log at these offsets."""

    first_offset: int
    last_offset: int


class Refuse(NamedTuple):
    code: ErrorCode
    message: str


Decision = Accept | Duplicate | Refuse


@dataclass
class _Producer:
    epoch: int
    window: deque[Appended] = field(default_factory=lambda: deque(maxlen=WINDOW))


class ProducerStates:
    """The windows of every producer of one partition, as its leader in ``term`` knows them."""

    def __init__(self, term: int) -> None:
        self.term = term
        self._producers: dict[int, _Producer] = {}

    def decide(self, header: BatchHeader) -> Decision:
        """What to do with a batch carrying a producer id (pure: changes nothing)."""
        pid, epoch, base = header.producer_id, header.producer_epoch, header.base_sequence
        last = (base + header.record_count - 1) % SEQUENCES
        producer = self._producers.get(pid)
        if base < 0:
            return Refuse(ErrorCode.OUT_OF_ORDER_SEQUENCE, "an idempotent batch needs seq >= 0")
        if producer is None:
            return Accept()  # a new producer (or one forgotten): any first sequence
        if epoch < producer.epoch:
            return Refuse(
                ErrorCode.FENCED,
                f"producer {pid} epoch {epoch} is fenced by epoch {producer.epoch}",
            )
        if epoch > producer.epoch:
            if base != 0:
                return Refuse(
                    ErrorCode.OUT_OF_ORDER_SEQUENCE,
                    f"a new epoch {epoch} of producer {pid} starts at seq 0, not {base}",
                )
            return Accept()
        for appended in producer.window:
            if (appended.base_sequence, appended.last_sequence) == (base, last):
                return Duplicate(appended.first_offset, appended.last_offset)
        expected = (producer.window[-1].last_sequence + 1) % SEQUENCES if producer.window else 0
        if base != expected:
            return Refuse(
                ErrorCode.OUT_OF_ORDER_SEQUENCE,
                f"producer {pid} epoch {epoch}: expected seq {expected}, got {base}",
            )
        return Accept()

    def record(self, header: BatchHeader, first_offset: int, last_offset: int) -> None:
        """The batch was appended at these offsets."""
        pid, epoch = header.producer_id, header.producer_epoch
        producer = self._producers.get(pid)
        if producer is None or epoch > producer.epoch:
            producer = self._producers[pid] = _Producer(epoch)
        last_sequence = (header.base_sequence + header.record_count - 1) % SEQUENCES
        producer.window.append(
            Appended(header.base_sequence, last_sequence, first_offset, last_offset)
        )


def rebuild(log: PartitionLog, term: int) -> ProducerStates:
    """The producer windows of everything in ``log`` (its last ``REBUILD_BYTES``)."""
    states = ProducerStates(term)
    # Whole segments back from the newest (always read), while they fit in REBUILD_BYTES.
    start, total = log.log_end_offset, 0
    for base, size, _ in reversed(log.segments()):
        if total and total + size > REBUILD_BYTES:
            break
        total += size
        start = base
    offset, end = max(start, log.log_start_offset), log.log_end_offset
    while offset < end:
        data = log.read(offset, _READ_BYTES).data
        if not data:
            break
        for header in iter_batches(data, verify=False):  # the log verified them on read
            if header.batch_type is BatchType.DATA and header.producer_id != NO_PRODUCER_ID:
                states.record(header, header.base_offset, header.last_offset)
            offset = header.next_offset
    return states
