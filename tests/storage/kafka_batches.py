"""Kafka producers' batches, as a Produce request carries them, for tests of version-2 batches."""

from __future__ import annotations

import gzip
import struct
from collections.abc import Callable

import cramjam
from crc32c import crc32c

from kafkaesque.protocol.kafka import KafkaRecord, encode_batch

COMPRESS: dict[int, Callable[[bytes], bytes]] = {
    0: bytes,
    1: gzip.compress,
    2: lambda b: bytes(cramjam.snappy.compress_raw(b)),
    3: lambda b: bytes(cramjam.lz4.compress(b)),
    4: lambda b: bytes(cramjam.zstd.compress(b)),
}
"""Kafka's codecs by their attribute value, compressing as producers do."""


def kafka_batch(records: list[KafkaRecord], codec: int = 0, producer: int = -1) -> bytes:
    """A producer's RecordBatch v2 of ``records`` (deltas 0, 1, ...), compressed by ``codec``."""
    plain = encode_batch(
        0,
        records,
        last_offset_delta=len(records) - 1,
        producer_id=producer,
        producer_epoch=0 if producer >= 0 else -1,
        base_sequence=0 if producer >= 0 else -1,
    )
    head, body = bytearray(plain[:61]), COMPRESS[codec](plain[61:])
    struct.pack_into(">h", head, 21, codec)
    struct.pack_into(">i", head, 8, 61 - 12 + len(body))
    struct.pack_into(">I", head, 17, crc32c(bytes(head[21:]) + body))
    return bytes(head) + body
