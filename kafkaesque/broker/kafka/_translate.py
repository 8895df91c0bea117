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

import operator
import time
from typing import NamedTuple

from kafkaesque.protocol.kafka import (
    BatchHead,
    RecordTuple,
    control_batch,
    encode_record,
    frame_batch,
    iter_batch_bytes,
    open_batch,
    record_tuples,
)
from kafkaesque.storage import (
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    BatchType,
    Record,
    build_batch,
    decode_header,
    pack_batch,
    raw_records,
)


class ProducedBatch(NamedTuple):
    """One of our batches made of a producer's batch: its bytes and record count."""

    data: bytes
    record_count: int


def produced_batches(record_set: bytes) -> list[ProducedBatch]:
    """A Produce request's record set as our batches (``KafkaProtocolError`` if malformed,
    ``UnsupportedCompression`` for an unknown codec): one per idempotent producer's batch, with
    its producer id, epoch and base sequence (the leader's producer state checks them); the
    records of batches without a producer id together, one Raft entry. A record without a
    timestamp (negative) is stamped now; a header's null value is stored empty.

    A batch as producers write it (offset deltas 0, 1, ..., a record at the batch's base
    timestamp and none before it, no headers) goes from Kafka's record tuples to
    our batch's as they are (``pack_batch``): no object per record but its tuple, all packed
    in one call; any other goes through ``Record`` and ``build_batch``, which renumber, stamp
    and convert. Both give the same bytes for the same records (tests/broker/
    test_kafka_translate.py)."""
    now = int(time.time() * 1000)
    out: list[ProducedBatch] = []
    plain: list[tuple[BatchHead, list[RecordTuple]]] = []
    for batch in iter_batch_bytes(record_set):
        head, body = open_batch(batch)
        records = record_tuples(body, head.record_count)
        if head.producer_id < 0 or not records:
            if records:
                plain.append((head, records))
            continue
        out.append(
            _our_batch(
                [(head, records)],
                now,
                producer_id=head.producer_id,
                producer_epoch=head.producer_epoch,
                base_sequence=head.base_sequence,
            )
        )
    if plain:
        out.insert(0, _our_batch(plain, now))
    return out


_DELTA = operator.itemgetter(0)
_TIMESTAMP_DELTA = operator.itemgetter(1)
_HEADERS = operator.itemgetter(4)


def _our_batch(
    batches: list[tuple[BatchHead, list[RecordTuple]]],
    now: int,
    *,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
) -> ProducedBatch:
    """Kafka batches' records (none empty) as one of our batches."""
    if len(batches) == 1:
        head, records = batches[0]
        base_ts, count = head.base_timestamp, len(records)
        # Each check one pass in C over the tuples, not a Python step per record.
        first_ts_delta = min(map(_TIMESTAMP_DELTA, records))
        if (
            first_ts_delta == 0
            and base_ts >= 0
            and not any(map(_HEADERS, records))
            and list(map(_DELTA, records)) == list(range(count))
        ):
            data = pack_batch(
                records,  # type: ignore[arg-type]  # no headers: no null header value
                first_timestamp=base_ts,
                max_timestamp=base_ts + max(map(_TIMESTAMP_DELTA, records)),
                last_offset_delta=count - 1,
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                base_sequence=base_sequence,
            )
            return ProducedBatch(data, count)
    ours = [
        Record(
            value,
            key,
            _headers(headers) if headers else (),  # most records have none: no loop
            head.base_timestamp + ts_delta if head.base_timestamp + ts_delta >= 0 else now,
        )
        for head, records in batches
        for _delta, ts_delta, key, value, headers in records
    ]
    data = build_batch(
        ours, producer_id=producer_id, producer_epoch=producer_epoch, base_sequence=base_sequence
    )
    return ProducedBatch(data, len(ours))


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
