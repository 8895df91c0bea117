"""Records between Kafka's RecordBatch v2 and our storage format, at the edge (pure).

Produce: a Kafka record set becomes one of our batches (one Raft entry, so a producer's batch
commits whole), its records' keys, values, headers and timestamps kept. Fetch: each of our
batches becomes a Kafka batch with the same base offset and offset span, so offsets need no
translation; Raft's own entries (a leader's no-op, a membership change) become Kafka control
batches, which every client skips while moving its position past them.

What does not survive the trip: a header's null value (stored as empty: our headers carry
bytes), the producer's batch boundaries and compression (a fetch answers uncompressed batches,
one per Raft entry), and the producer's own CRC (our body CRC covers what we store).
"""

from __future__ import annotations

import time
from typing import NamedTuple

from kafkaesque.protocol.kafka import (
    control_batch,
    encode_record,
    frame_batch,
    iter_batches,
)
from kafkaesque.storage import BatchType, Record, build_batch, decode_header, raw_records


class ProducedBatch(NamedTuple):
    """One of our batches made of a producer's batch: its bytes and record count."""

    data: bytes
    record_count: int


def produced_batches(record_set: bytes) -> list[ProducedBatch]:
    """A Produce request's record set as our batches (``KafkaProtocolError`` if malformed,
    ``UnsupportedCompression`` for an unknown codec): one per idempotent producer's batch, with
    its producer id, epoch and base sequence (the leader's producer state checks them); the
    records of batches without a producer id together, one Raft entry. A record without a
    timestamp (negative) is stamped now."""
    now = int(time.time() * 1000)
    out: list[ProducedBatch] = []
    plain: list[Record] = []
    for batch in iter_batches(record_set):
        records = [
            Record(
                r.value,
                r.key,
                _headers(r.headers) if r.headers else (),  # most records have none: no loop
                r.timestamp if r.timestamp >= 0 else now,
            )
            for r in batch.records
        ]
        if batch.producer_id < 0 or not records:
            plain += records
            continue
        data = build_batch(
            records,
            producer_id=batch.producer_id,
            producer_epoch=batch.producer_epoch,
            base_sequence=batch.base_sequence,
        )
        out.append(ProducedBatch(data, len(records)))
    if plain:
        out.insert(0, ProducedBatch(build_batch(plain), len(plain)))
    return out


def _headers(headers: tuple[tuple[str, bytes | None], ...]) -> tuple[tuple[str, bytes], ...]:
    return tuple((name, b"" if value is None else value) for name, value in headers)


def kafka_record_set(data: bytes | memoryview) -> bytes:
    """Our committed batches (whole, as a read returns them) as Kafka batches: the same base
    offset, offset deltas, first timestamp and timestamp deltas, so each record is encoded
    straight from the body's own fields (``raw_records``)."""
    view = memoryview(data)
    out = bytearray()
    pos = 0
    while pos < len(view):
        header = decode_header(view, pos, verify=False)  # the log verified them on read
        end = pos + header.size
        epoch = min(header.term, 0x7FFFFFFF)
        if header.batch_type is BatchType.DATA:
            body = bytearray()
            for delta, ts_delta, key, value, headers in raw_records(view[pos:end], header):
                encode_record(body, ts_delta, delta, key, value, headers)
            out += frame_batch(
                header.base_offset,
                body,
                record_count=header.record_count,
                last_offset_delta=header.last_offset_delta,
                base_ts=header.first_timestamp,
                max_ts=header.max_timestamp,
                leader_epoch=epoch,
            )
        else:
            out += control_batch(
                header.base_offset, header.last_offset_delta, header.max_timestamp, epoch
            )
        pos = end
    return bytes(out)
