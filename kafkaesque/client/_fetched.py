"""Fetched batches left undecoded: ``FetchedBatch``, and where the records lie in its bytes.

``Client.fetch_batch`` hands back a ``FETCH`` reply's payload as the log stores it
(docs/storage-format.md): consecutive record batches, each a 70-byte header and then
``record_count`` msgpack arrays ``[offset_delta, timestamp_delta, key, value, headers]``. A
reader that decodes in bulk (the Spark source builds Arrow columns straight from these bytes)
asks ``data_batches`` where the data batches of an offset range lie, having had every batch's
CRCs checked, and reads the records in place; ``batch_records`` decodes one such batch the
ordinary way, record by record, with ``kafkaesque.storage``'s one record walk. Nothing here
does I/O but the ``fetch_batch`` call.
"""

from __future__ import annotations

from dataclasses import dataclass

from kafkaesque.protocol import Fetch
from kafkaesque.storage import (
    HEADER_SIZE,
    BatchType,
    InvalidBatchError,
    Record,
    data_records,
    decode_header,
    is_kafka_format,
    iter_batches,
    kafka_records_body,
)

from ._calls import Call
from ._consumer_core import TopicPartition
from ._wire import Response, expect_data


@dataclass(frozen=True, slots=True)
class FetchedBatch:
    """What one ``FETCH`` of ``topic``/``partition`` from ``offset`` returned, undecoded.

    ``payload`` holds whole committed record batches as stored, control batches included: the
    first may begin before ``offset``, and a batch is never cut. ``next_offset`` is where the
    broker says the next fetch starts (past control batches too); it is ``offset`` or below
    when there was nothing to return (a replica that is behind, a new leader that has not yet
    learnt the commit index). ``high_watermark`` is the partition's, when the broker said it.
    """

    topic: str
    partition: int
    offset: int
    payload: bytes
    next_offset: int
    high_watermark: int | None


@dataclass(frozen=True, slots=True)
class BatchSpan:
    """One data batch of a payload: where it lies, and what its header says.

    ``payload[start:end]`` is the whole batch; its ``record_count`` msgpack records lie in
    ``payload[records_start:end]``, or with ``kafka_format`` (a Kafka producer's batch stored
    verbatim) Kafka's records, compressed if ``compressed`` (``kafka_records`` gives them
    decompressed). Record ``i`` has offset ``base_offset`` plus its offset delta and timestamp
    ``first_timestamp`` plus its timestamp delta; ``last_offset`` is the highest offset the
    batch spans (compaction may have left gaps below it).
    """

    start: int
    records_start: int
    end: int
    record_count: int
    base_offset: int
    last_offset: int
    first_timestamp: int
    kafka_format: bool = False
    compressed: bool = False


class CorruptBatchError(Exception):
    """Fetched bytes that are not what the log stores: a batch that fails its CRC or whose
    records break the format. Never skipped: a reader stops rather than read wrong records.

    ``position`` is the byte of the payload where the bad batch starts; ``reason`` says what is
    wrong with it.
    """

    def __init__(self, reason: str, position: int) -> None:
        self.reason = reason
        self.position = position
        super().__init__(f"at byte {position}: {reason}")


def data_batches(payload: bytes | memoryview, lo: int, hi: int) -> list[BatchSpan]:
    """The data batches of ``payload`` holding records with offsets in ``[lo, hi)``, in order.

    Control batches and batches wholly outside the range are left out; the walk stops at the
    first batch at or past ``hi`` (batches are in offset order). Every batch walked has its CRCs
    checked first: raises ``CorruptBatchError`` at the first that fails.
    """
    found: list[BatchSpan] = []
    pos = 0
    try:
        for header in iter_batches(payload):
            start, pos = pos, pos + header.size
            if header.base_offset >= hi:
                break  # batches are in offset order: nothing further is in the range
            data = header.batch_type is BatchType.DATA and header.record_count > 0
            if data and header.next_offset > lo:
                found.append(
                    BatchSpan(
                        start,
                        start + HEADER_SIZE,
                        pos,
                        header.record_count,
                        header.base_offset,
                        header.last_offset,
                        header.first_timestamp,
                        is_kafka_format(payload[start : start + HEADER_SIZE]),
                        header.attributes != 0,  # (version 1: always 0)
                    )
                )
    except InvalidBatchError as exc:
        raise CorruptBatchError(str(exc), pos) from exc
    return found


def batch_records(payload: bytes | memoryview, span: BatchSpan) -> list[Record]:
    """Every record of the data batch at ``span`` (from ``data_batches``, which checked its
    CRCs), decoded as the log reads them (``value``, ``key``, ``headers``, ``timestamp``,
    ``offset``: no ``ConsumerRecord`` is built, one object a record is what a bulk reader can
    afford). Raises ``CorruptBatchError`` if its records break the format."""
    batch = memoryview(payload)[span.start : span.end]
    try:
        return list(data_records(batch, verify=False))
    except InvalidBatchError as exc:
        raise CorruptBatchError(str(exc), span.start) from exc


def kafka_records(payload: bytes | memoryview, span: BatchSpan) -> bytes:
    """The records of the ``kafka_format`` batch at ``span`` as Kafka lays them out,
    decompressed. Raises ``CorruptBatchError`` if they do not decompress."""
    batch = memoryview(payload)[span.start : span.end]
    try:
        return kafka_records_body(batch, decode_header(batch, verify=False))
    except InvalidBatchError as exc:
        raise CorruptBatchError(str(exc), span.start) from exc


def fetch_batch(
    topic: str, partition: int, offset: int, *, max_bytes: int | None, wait_ms: int | None
) -> Call[FetchedBatch]:
    """``FETCH`` from the partition's leader (any broker would forward it there), its payload
    left undecoded (see ``Client.fetch_batch``)."""

    def parse(response: Response) -> FetchedBatch:
        reply = expect_data(response)
        return FetchedBatch(
            topic, partition, offset, reply.payload, reply.next_offset, reply.high_watermark
        )

    return Call(
        Fetch(topic, partition, offset, max_bytes, wait_ms),
        parse,
        TopicPartition(topic, partition),
        extra_timeout_s=(wait_ms or 0) / 1000,
    )
