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

from kafkaesque.protocol.kafka import (
    KafkaRecord,
    control_batch,
    encode_batch,
    iter_batches,
)
from kafkaesque.storage import BatchType, Record, build_batch, decode_header, decode_records


def records_of(record_set: bytes) -> list[Record]:
    """The records of a Produce request's record set (``KafkaProtocolError`` if malformed,
    ``UnsupportedCompression`` for a codec not installed). A record without a timestamp
    (negative) is stamped now."""
    now = int(time.time() * 1000)
    records: list[Record] = []
    for batch in iter_batches(record_set):
        for r in batch.records:
            headers = tuple((name, b"" if value is None else value) for name, value in r.headers)
            stamp = r.timestamp if r.timestamp >= 0 else now
            records.append(Record(value=r.value, key=r.key, headers=headers, timestamp=stamp))
    return records


def our_batch(records: list[Record]) -> bytes:
    """Our batch of ``records`` (offsets from 0: the leader stamps the base)."""
    return build_batch(records)


def kafka_record_set(data: bytes | memoryview) -> bytes:
    """Our committed batches (whole, as a read returns them) as Kafka batches."""
    view = memoryview(data)
    out = bytearray()
    pos = 0
    while pos < len(view):
        header = decode_header(view, pos, verify=False)  # the log verified them on read
        end = pos + header.size
        epoch = min(header.term, 0x7FFFFFFF)
        if header.batch_type is BatchType.DATA:
            records = [
                KafkaRecord(r.offset - header.base_offset, r.timestamp, r.key, r.value, r.headers)
                for r in decode_records(view[pos:end], header)
            ]
            out += encode_batch(
                header.base_offset,
                records,
                last_offset_delta=header.last_offset_delta,
                leader_epoch=epoch,
            )
        else:
            out += control_batch(
                header.base_offset, header.last_offset_delta, header.max_timestamp, epoch
            )
        pos = end
    return bytes(out)
