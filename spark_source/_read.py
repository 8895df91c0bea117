"""What one Spark task does: read one partition's offset range with ``FETCH``, through failover.

Runs in an executor's Python worker, which has nothing but the ``RangePartition`` it was handed
(the reader object it came from was pickled and rebuilt there, and holds no connection): the
range and the ``ReadSettings`` travel in it. The task opens its own ``Client``, asks for the
topic's metadata so its fetches go straight to the partition's leader, and pulls
``[from_offset, until_offset)`` chunk by chunk (``Client.fetch_batch``: the committed batches as
stored, decoded here in bulk). Only committed data is ever served (any replica
answers with what it knows committed), so a range planned below the high watermark reads the same
records on every attempt: that is what makes a retried task, or a micro-batch replayed after a
restart, produce exactly the rows of the first attempt.

Failover: a broker that dies or loses leadership fails a fetch; the client retries against the
new leader (or any replica) after refreshing its metadata, and this loop keeps trying as long as
it makes progress at least every ``failover_timeout_ms``. Retention that deleted the start of the
range is data loss: an error naming the partition and offsets under ``failOnDataLoss`` (the
default), else a warning and a read of what remains.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import InputPartition

from kafkaesque.client import Client, ErrorCode, FetchedBatch, KafkaesqueError, TopicPartition

from ._decode import arrow_batch, row_tuples
from ._discover import partition_bounds
from ._offsets import DataLossError, OffsetRange, data_loss_message, name
from ._options import SourceOptions, client_config

log = logging.getLogger("kafkaesque.spark_source")

FIRST_FETCH_BYTES = 1024 * 1024  # until the range's bytes per offset are known
MIN_FETCH_BYTES = 64 * 1024
EMPTY_WAIT_MS = 200  # a fetch that found nothing waits this long for data on the next try
RETRY_PAUSE_S = 0.2


class ReadStalledError(RuntimeError):
    """A range made no progress for ``failover_timeout_ms``; the message says where and why."""


@dataclass(frozen=True)
class ReadSettings:
    """What a task needs besides its range (picklable: it travels to the executors)."""

    bootstrap: str
    fail_on_data_loss: bool
    include_headers: bool
    use_arrow: bool
    fetch_max_bytes: int
    failover_timeout_ms: int
    security: Any = None  # kafkaesque.client.Security (the query's), None: plaintext

    @classmethod
    def of(cls, options: SourceOptions) -> ReadSettings:
        return cls(
            options.bootstrap,
            options.fail_on_data_loss,
            options.include_headers,
            options.use_arrow,
            options.fetch_max_bytes,
            options.failover_timeout_ms,
            options.security,
        )


@dataclass(frozen=True)
class RangePartition(InputPartition):
    """One Spark input partition: an offset range of one topic-partition, and how to read it."""

    range: OffsetRange
    settings: ReadSettings


def read_partition(partition: InputPartition) -> Iterator[Any]:
    """The rows of ``partition``: Arrow record batches (``useArrow``, the default) or tuples.

    Spark hands a placeholder ``InputPartition(None)`` when the plan has no range at all (an
    empty topic, or nothing new in a micro-batch): it reads nothing.
    """
    if not isinstance(partition, RangePartition):
        return iter(())
    return _rows(partition.range, partition.settings)


def _rows(rng: OffsetRange, settings: ReadSettings) -> Iterator[Any]:
    topic, number, until = rng.tp.topic, rng.tp.partition, rng.until_offset
    headers = settings.include_headers
    for payload, lo in fetch_range(rng, settings):
        if settings.use_arrow:
            batch = arrow_batch(payload, lo, until, topic, number, include_headers=headers)
            if batch is not None and batch.num_rows:
                yield batch
        else:
            yield from row_tuples(payload, lo, until, topic, number, include_headers=headers)


def fetch_range(
    rng: OffsetRange,
    settings: ReadSettings,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[tuple[bytes, int]]:
    """The ``FETCH`` payloads covering ``rng``, each with the offset it was fetched from (its
    first batch may begin before that offset, its last may reach past the range's end: the
    decoder cuts both). Connections close when the iteration ends or is abandoned.

    Raises ``DataLossError`` (see the module docstring), ``ReadStalledError``, and the client's
    ``KafkaesqueError`` for failures retrying cannot cure.
    """
    config = client_config(
        settings.security, request_timeout_ms=max(settings.failover_timeout_ms / 2, 1000.0)
    )
    with Client(settings.bootstrap, config=config) as client:
        yield from _RangeFetcher(client, rng, settings, clock, sleep).chunks()


class _RangeFetcher:
    """The fetch loop of one range (see ``fetch_range``)."""

    def __init__(
        self,
        client: Client,
        rng: OffsetRange,
        settings: ReadSettings,
        clock: Callable[[], float],
        sleep: Callable[[float], None],
    ) -> None:
        self.client = client
        self.rng = rng
        self.tp: TopicPartition = rng.tp
        self.settings = settings
        self.clock = clock
        self.sleep = sleep
        self.offset = rng.from_offset
        self.progress_at = clock()
        self.trouble = "no answer yet"  # why the last attempt made no progress

    def chunks(self) -> Iterator[tuple[bytes, int]]:
        until = self.rng.until_offset
        max_bytes = min(self.settings.fetch_max_bytes, FIRST_FETCH_BYTES)
        wait_ms = 0
        try:
            self.client.refresh_metadata([self.tp.topic])  # so fetches go to the leader
        except KafkaesqueError as exc:
            self.trouble = str(exc)  # any broker will do meanwhile
        while self.offset < until:
            fetched = self._fetch(max_bytes, wait_ms)
            if fetched is None:
                continue
            if fetched.next_offset <= self.offset:
                # Nothing yet: a replica that is behind, or a new leader that has not yet
                # learnt the commit index. Committed data below ``until`` does come.
                self.trouble = (
                    f"no data at offset {self.offset} (high watermark {fetched.high_watermark})"
                )
                self._check_stalled()
                wait_ms = EMPTY_WAIT_MS
                continue
            wait_ms = 0
            yield fetched.payload, self.offset
            per_offset = len(fetched.payload) / (fetched.next_offset - self.offset)
            wanted = int((until - fetched.next_offset) * per_offset * 1.1)
            max_bytes = max(MIN_FETCH_BYTES, min(self.settings.fetch_max_bytes, wanted))
            self._moved_to(fetched.next_offset)

    def _moved_to(self, offset: int) -> None:
        self.offset = offset
        self.progress_at = self.clock()

    def _fetch(self, max_bytes: int, wait_ms: int) -> FetchedBatch | None:
        """One fetch; None after a failure that was handled (retry), raising what cannot be."""
        try:
            return self.client.fetch_batch(
                self.tp.topic, self.tp.partition, self.offset, max_bytes=max_bytes, wait_ms=wait_ms
            )
        except KafkaesqueError as exc:
            error = exc
        if error.code is ErrorCode.OFFSET_OUT_OF_RANGE:
            try:
                if self._skip_deleted():
                    return None
            except KafkaesqueError as exc:  # the bounds could not be had: a failover under way
                error = exc
        elif not error.retriable:
            raise error
        self.trouble = str(error)
        self._check_stalled()
        self.sleep(RETRY_PAUSE_S)
        return None

    def _skip_deleted(self) -> bool:
        """After ``OFFSET_OUT_OF_RANGE``: if retention deleted the offsets from here on, deal
        with the loss and move past it (True). False when the offset lies beyond the end of the
        replica that answered: it may be behind, so the caller retries."""
        rng, offset = self.rng, self.offset
        bounds = partition_bounds(self.client, self.tp)
        if bounds is None:
            self._lost(offset, rng.until_offset, "the partition no longer exists")
            self._moved_to(rng.until_offset)
            return True
        if offset >= bounds.start:
            return False
        resume = min(bounds.start, rng.until_offset)
        if not (rng.from_earliest and offset == rng.from_offset):
            self._lost(offset, resume, f"retention deleted them; the log starts at {bounds.start}")
        self._moved_to(resume)
        return True

    def _lost(self, lost_from: int, lost_until: int, why: str) -> None:
        message = data_loss_message(self.tp, lost_from, lost_until, why)
        if self.settings.fail_on_data_loss:
            raise DataLossError(message)
        log.warning("%s; reading on from offset %d", message, lost_until)

    def _check_stalled(self) -> None:
        waited = self.clock() - self.progress_at
        if waited * 1000 >= self.settings.failover_timeout_ms:
            raise ReadStalledError(
                f"reading {name(self.tp)} made no progress at offset {self.offset} for "
                f"{waited:.0f} s (range {self.rng.from_offset} to {self.rng.until_offset - 1}; "
                f"failoverTimeoutMs={self.settings.failover_timeout_ms}): {self.trouble}"
            )
