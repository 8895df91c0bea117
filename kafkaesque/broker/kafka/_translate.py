"""Records between Kafka's RecordBatch v2 and our storage format, at the edge (pure).

Produce: a producer's batch is stored as it came, as a version-2 batch of ours (one Raft entry,
so it commits whole; its compression, CRC, null header values kept): the CRC checked, the
records walked once to check they parse, nothing re-encoded. A batch whose fields do not mean
what ours do (timestamps below the first record's or missing, offset deltas that do not count
from 0, log-append time, transactional or control bits), and the batches of a request without a
producer id when there are several, are translated into a version-1 batch instead, keys, values,
headers and timestamps kept (a header's null value stored as empty).

Fetch: a version-2 batch goes out as the Kafka batch it holds, its first 21 bytes rebuilt (base
offset and leader epoch); a version-1 batch (written by our own producers, the line protocol,
MQTT) becomes an uncompressed Kafka batch with the same base offset and offset span. Offsets
need no translation either way; Raft's own entries (a leader's no-op, a membership change)
become Kafka control batches, which every client skips while moving its position past them.
"""

from __future__ import annotations

import operator
import time
from typing import NamedTuple

from kafkaesque.protocol.kafka import (
    COMPRESSION_MASK,
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
    from_kafka_batch,
    is_kafka_format,
    kafka_batch_parts,
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
    its producer id, epoch and base sequence (the leader's producer state checks them), stored
    verbatim where its fields mean what ours do (``_verbatim``); a request's batches without a
    producer id as one, verbatim if there is only one. Otherwise translated: a record without a
    timestamp (negative) is stamped now, a header's null value is stored empty.

    A translated batch as producers write it (offset deltas 0, 1, ..., a record at the batch's
    base timestamp and none before it, no headers) goes from Kafka's record tuples to our
    batch's as they are (``pack_batch``): no object per record but its tuple, all packed in one
    call; any other goes through ``Record`` and ``build_batch``, which renumber, stamp and
    convert. Both give the same bytes for the same records (tests/broker/
    test_kafka_translate.py)."""
    now = int(time.time() * 1000)
    out: list[ProducedBatch] = []
    plain: list[tuple[memoryview, BatchHead, list[RecordTuple]]] = []
    for batch in iter_batch_bytes(record_set):
        head, body = open_batch(batch)
        records = record_tuples(body, head.record_count)  # every record checked: it parses
        if not records:
            continue
        if head.producer_id < 0:
            plain.append((batch, head, records))
        elif _verbatim(head, records):
            out.append(ProducedBatch(from_kafka_batch(batch), len(records)))
        else:
            out.append(
                _our_batch(
                    [(head, records)],
                    now,
                    producer_id=head.producer_id,
                    producer_epoch=head.producer_epoch,
                    base_sequence=head.base_sequence,
                )
            )
    if len(plain) == 1 and _verbatim(plain[0][1], plain[0][2]):
        out.insert(0, ProducedBatch(from_kafka_batch(plain[0][0]), len(plain[0][2])))
    elif plain:
        out.insert(0, _our_batch([(head, records) for _, head, records in plain], now))
    return out


def _verbatim(head: BatchHead, records: list[RecordTuple]) -> bool:
    """Whether a Kafka batch's header fields mean what a version-2 batch's must: no attribute
    but its codec, its first timestamp its least and not missing, its max timestamp its
    greatest, its offset deltas 0, 1, ... (as every producer writes them)."""
    count = len(records)
    return (
        head.attributes & ~COMPRESSION_MASK == 0
        and head.base_timestamp >= 0
        and head.last_offset_delta == count - 1
        and min(map(_TIMESTAMP_DELTA, records)) == 0  # one pass in C each, as in _our_batch
        and head.max_timestamp == head.base_timestamp + max(map(_TIMESTAMP_DELTA, records))
        and list(map(_DELTA, records)) == list(range(count))
    )


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
    """Our committed batches (whole, as a read returns them) as Kafka batches: a version-2
    batch as the producer's batch it holds, a version-1 one with the same base offset, offset
    deltas, first timestamp and timestamp deltas, each record encoded straight from the body's
    own fields (``raw_records``)."""
    view = memoryview(data)
    out = bytearray()
    pos = 0
    while pos < len(view):
        header = decode_header(view, pos, verify=False)  # the log verified them on read
        end = pos + header.size
        epoch = min(header.term, 0x7FFFFFFF)
        if is_kafka_format(view[pos:end]):  # a producer's batch as it came
            head, rest = kafka_batch_parts(view[pos:end], header, epoch)
            out += head
            out += rest
        elif header.batch_type is BatchType.DATA:
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
