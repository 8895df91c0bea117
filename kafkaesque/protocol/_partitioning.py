"""Which partition a keyed record goes to: one rule shared by the broker and every client.

A key is hashed with CRC-32 (zlib's, the IEEE polynomial) and taken modulo the partition count,
so the same key always lands in the same partition while the count does not change (as in
Kafka, adding partitions moves keys). CRC-32 rather than Kafka's murmur2 because it runs in C in
the standard library: a client hashing a million keys a second must not pay for pure Python.
"""

from __future__ import annotations

import zlib


def partition_for_key(key: bytes, partitions: int) -> int:
    """The partition of ``key`` among ``partitions`` (>= 1): ``crc32(key) % partitions``."""
    if partitions < 1:
        raise ValueError(f"a topic has at least one partition, not {partitions}")
    return zlib.crc32(key) % partitions
