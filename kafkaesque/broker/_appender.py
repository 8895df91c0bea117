"""Coalescing single-record publishes (PUBS, PUB) into batches, one appender per partition.

A telnet client or a pipelining program sends one record a line; one Raft entry per record would
cost a proposal, a log write and an acknowledgement each. Every record bound for a partition
therefore joins the appender's open batch; the appender's task closes the batch whenever it gets
to run (by then the session has decoded everything the socket delivered), starts its write at
once, in order, and moves on to the next batch while that one commits. No timer adds latency:
the batch is whatever arrived while the previous step ran (Nagle without the delay).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import trio

from kafkaesque.protocol import Acks, ErrorCode
from kafkaesque.storage import Record, build_batch

from ._errors import RequestError
from ._writes import Attempt, WritePath

_MAX_BATCH_RECORDS = 4096
_MAX_BATCH_BYTES = 1 << 20


@dataclass(eq=False, slots=True)
class Flight:
    """One batch of records on its way into the log; every record's reply waits on it."""

    partition: int
    done: trio.Event = field(default_factory=trio.Event)
    base: int = -1
    error: RequestError | None = None


class PartitionAppender:
    """The open batch of one partition and acks level, and the task that writes batches."""

    def __init__(self, group_id: str, partition: int, acks: Acks, writes: WritePath) -> None:
        self._group_id = group_id
        self._partition = partition
        self._acks = acks
        self._writes = writes
        self._records: list[Record] = []
        self._bytes = 0
        self._flight = Flight(partition)
        self._sealed: list[tuple[Flight, bytes, int]] = []  # batches not yet started, in order
        self._wake = trio.Event()
        self.closed = False

    def add(self, record: Record) -> tuple[Flight, int]:
        """Queue ``record``; its offset will be ``flight.base + index`` once ``flight.done``."""
        if self.closed:
            raise RequestError(ErrorCode.UNKNOWN_TOPIC, "the topic was deleted")
        if len(self._records) >= _MAX_BATCH_RECORDS or self._bytes >= _MAX_BATCH_BYTES:
            self._seal()
        index = len(self._records)
        self._records.append(record)
        self._bytes += len(record.value or b"") + len(record.key or b"") + 16
        self._wake.set()
        return self._flight, index

    def _seal(self) -> None:
        if self._records:
            records, flight = self._records, self._flight
            self._records, self._bytes, self._flight = [], 0, Flight(self._partition)
            self._sealed.append((flight, build_batch(records), len(records)))

    async def run(self, nursery: trio.Nursery) -> None:
        """Write batches until cancelled; each batch's outcome is awaited in ``nursery``."""
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            self._seal()
            sealed, self._sealed = self._sealed, []
            for flight, batch, count in sealed:
                deadline = trio.current_time() + self._writes.timeout
                attempt = self._writes.start(self._group_id, batch, count, self._acks, deadline)
                nursery.start_soon(self._complete, flight, batch, count, attempt, deadline)

    async def _complete(
        self, flight: Flight, batch: bytes, count: int, attempt: Attempt, deadline: float
    ) -> None:
        try:
            flight.base, _ = await self._writes.write(
                self._group_id,
                batch,
                count,
                self._acks,
                first=attempt,
                deadline=deadline,
            )
        except RequestError as exc:
            flight.error = exc
        finally:
            flight.done.set()

    def fail_all(self, error: RequestError) -> None:
        """The topic went away: fail what is queued, refuse what comes."""
        self.closed = True
        self._seal()
        for flight, _, _ in self._sealed:
            flight.error = error
            flight.done.set()
        self._sealed = []
