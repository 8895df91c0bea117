"""The consumer's decisions, without I/O: positions, what to fetch next, decoding what came back.

``ConsumerCore`` holds the position (the next offset to read) of every assigned partition and
turns replies into ``ConsumerRecord`` values. Drivers (``Consumer``, ``AsyncConsumer``) send the
``Fetch`` commands it plans to each partition's leader and hand back the replies.

Positions follow Kafka's rules: a fetch reply moves the position to its ``next_offset`` (past
control batches too, so offsets may have gaps); ``seek`` sets it; a partition whose position is
unknown (``None``: just assigned, or ``OFFSET_OUT_OF_RANGE``) is reset by ``auto_offset_reset``
(``earliest``: the log start; ``latest``: the high watermark) before it is fetched.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

from kafkaesque.protocol import (
    DataReply,
    ErrorCode,
    ErrorReply,
    Fetch,
    MessageRow,
    PartitionRow,
    RemoteProtocolError,
)
from kafkaesque.storage import InvalidBatchError, data_records

from ._errors import KafkaesqueConnectionError, KafkaesqueError
from ._wire import ListResponse, Response, shown


class TopicPartition(NamedTuple):
    """One partition of one topic."""

    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class ConsumerRecord:
    """A record as a consumer sees it. ``timestamp`` is -1 and ``headers`` empty for records read
    through a group subscription (``CONS`` shows neither)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int = -1
    headers: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True, slots=True)
class FetchResult:
    """What one ``FETCH`` returned: the data records at or after the offset asked for, where the
    next fetch starts, and the partition's high watermark when the broker reported it."""

    records: tuple[ConsumerRecord, ...]
    next_offset: int
    high_watermark: int | None


class OffsetReset(StrEnum):
    """Where a consumer starts in a partition it has no position for."""

    EARLIEST = "earliest"
    LATEST = "latest"
    NONE = "none"  # raise OFFSET_OUT_OF_RANGE instead


def decode_fetch(topic: str, partition: int, offset: int, reply: DataReply) -> FetchResult:
    """The records of a ``+DATA`` reply to ``FETCH topic partition offset``.

    Control batches (Raft no-ops, configuration) are skipped, as are records below ``offset``
    (the first batch may start before it). Every batch's CRCs are checked: a corrupt batch raises
    ``KafkaesqueConnectionError`` (not retriable), never a silently wrong record.
    """
    try:
        records = [
            ConsumerRecord(topic, partition, r.offset, r.key, r.value, r.timestamp, r.headers)
            for r in data_records(memoryview(reply.payload), offset)
        ]
    except InvalidBatchError as exc:
        raise KafkaesqueConnectionError(
            f"corrupt data from {topic}/{partition} at offset {offset}: {exc}",
            sent=True,
            retriable=False,
        ) from exc
    return FetchResult(tuple(records), max(reply.next_offset, offset), reply.high_watermark)


def decode_messages(topic: str, response: ListResponse) -> list[ConsumerRecord]:
    """The ``+MSG`` rows of a ``CONS`` (or ``FETCH format=text``) reply as records."""
    records: list[ConsumerRecord] = []
    for row in response.rows:
        if not isinstance(row, MessageRow):
            raise RemoteProtocolError(f"expected +MSG rows, got {shown(row)}")
        records.append(ConsumerRecord(topic, row.partition, row.offset, row.key, row.value))
    return records


class ConsumerCore:
    """Assigned partitions and their positions; fetch planning; reply handling. Pure.

    Invariant: ``positions`` has exactly the assigned partitions; a value is the next offset to
    read, or None while the partition waits for a reset.
    """

    def __init__(
        self,
        *,
        reset: OffsetReset = OffsetReset.EARLIEST,
        max_bytes: int = 1024 * 1024,
    ) -> None:
        if max_bytes < 1:
            raise ValueError("max_bytes must be positive")
        self.reset = reset
        self.max_bytes = max_bytes
        self.positions: dict[TopicPartition, int | None] = {}
        self.high_watermarks: dict[TopicPartition, int] = {}
        self._turn = 0  # round-robin start, so one busy partition cannot starve the others

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Replace the assignment. Partitions kept keep their positions; new ones need a reset."""
        wanted = list(dict.fromkeys(partitions))
        self.positions = {tp: self.positions.get(tp) for tp in wanted}

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Read ``tp`` from ``offset`` next. Raises ``ValueError`` if ``tp`` is not assigned."""
        if tp not in self.positions:
            raise ValueError(f"{tp.topic}/{tp.partition} is not assigned")
        if offset < 0:
            raise ValueError("offsets are not negative")
        self.positions[tp] = offset

    def needs_reset(self) -> list[TopicPartition]:
        """Assigned partitions without a position."""
        return [tp for tp, position in self.positions.items() if position is None]

    def apply_reset(self, rows: Mapping[TopicPartition, PartitionRow]) -> None:
        """Give every partition that needs a reset its start (``earliest``) or end (``latest``)
        offset, from ``DESCRIBE`` rows. Raises ``KafkaesqueError`` ``OFFSET_OUT_OF_RANGE`` with
        ``reset=none``, and ``UNKNOWN_PARTITION`` for a partition the rows do not have."""
        for tp in self.needs_reset():
            if self.reset is OffsetReset.NONE:
                raise KafkaesqueError(
                    ErrorCode.OFFSET_OUT_OF_RANGE,
                    f"no position for {tp.topic}/{tp.partition} and auto_offset_reset is 'none'",
                )
            row = rows.get(tp)
            if row is None:
                raise KafkaesqueError(
                    ErrorCode.UNKNOWN_PARTITION, f"{tp.topic} has no partition {tp.partition}"
                )
            if self.reset is OffsetReset.EARLIEST:
                self.positions[tp] = row.start_offset or 0
            else:
                self.positions[tp] = row.end_offset or 0

    def plan(self, wait_ms: int) -> list[tuple[TopicPartition, Fetch]]:
        """One ``Fetch`` per positioned partition, starting at a rotating partition.

        ``wait_ms`` is shared out: each fetch waits ``wait_ms // n`` at most, so a pipeline of n
        long polls on one connection (answered in order) takes about ``wait_ms`` in all.
        """
        ready = [(tp, pos) for tp, pos in self.positions.items() if pos is not None]
        if not ready:
            return []
        self._turn = (self._turn + 1) % len(ready)
        ready = ready[self._turn :] + ready[: self._turn]
        each = max(wait_ms, 0) // len(ready)
        return [
            (tp, Fetch(tp.topic, tp.partition, pos, max_bytes=self.max_bytes, wait_ms=each))
            for tp, pos in ready
        ]

    def on_fetch(self, tp: TopicPartition, fetch: Fetch, response: Response) -> FetchResult:
        """Decode the reply to ``fetch`` and move the position past it.

        An ``OFFSET_OUT_OF_RANGE`` reply clears the position (a reset follows) unless ``reset`` is
        ``none``; other errors are raised as ``KafkaesqueError``. A reply for a position that
        moved meanwhile (a ``seek``) is decoded but leaves the position alone.
        """
        if isinstance(response, ErrorReply):
            error = KafkaesqueError.from_reply(response)
            if error.code is ErrorCode.OFFSET_OUT_OF_RANGE and self.reset is not OffsetReset.NONE:
                if self.positions.get(tp) == fetch.offset:
                    self.positions[tp] = None
                return FetchResult((), fetch.offset, None)
            raise error
        if not isinstance(response, DataReply):
            raise RemoteProtocolError(f"FETCH answered {shown(response)}")
        result = decode_fetch(tp.topic, tp.partition, fetch.offset, response)
        if result.high_watermark is not None:
            self.high_watermarks[tp] = result.high_watermark
        if self.positions.get(tp) == fetch.offset:
            self.positions[tp] = result.next_offset
        return result


class ConsumerPositions:
    """The I/O-free half of a consumer (sync and trio): assignment, seek, position."""

    _core: ConsumerCore

    def assign(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        """Read exactly these partitions (positions of partitions kept are kept; new ones start
        where ``auto_offset_reset`` says unless ``seek`` says otherwise)."""
        self._core.assign(TopicPartition(*tp) for tp in partitions)

    def assignment(self) -> list[TopicPartition]:
        """The assigned partitions."""
        return list(self._core.positions)

    def seek(self, tp: TopicPartition | tuple[str, int], offset: int) -> None:
        """Read ``tp`` from ``offset`` next (``ValueError`` if it is not assigned)."""
        self._core.seek(TopicPartition(*tp), offset)

    def position(self, tp: TopicPartition | tuple[str, int]) -> int | None:
        """The next offset to read in ``tp`` (None until the reset policy gives one)."""
        return self._core.positions[TopicPartition(*tp)]

    def _seek_rows(self, rows: Mapping[TopicPartition, PartitionRow], *, end: bool) -> None:
        for tp, row in rows.items():
            self._core.seek(tp, (row.end_offset if end else row.start_offset) or 0)

    def _reached(self, ends: Mapping[TopicPartition, int]) -> bool:
        return all((self._core.positions.get(tp) or 0) >= end for tp, end in ends.items())
