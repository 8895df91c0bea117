"""Which partition a record goes to, without I/O.

A record with a key goes to ``kafkaesque.protocol.partition_for_key(key, partitions)``:
``zlib.crc32(key) % partitions``, the one rule the broker also applies to ``PUBS``/``PUB`` keys,
so a key lands in the same partition whichever way it was published. The mapping never changes
between runs or processes (Python's ``hash`` is salted per process and is not used); it changes
when the partition count does, as in Kafka.

A record without a key goes, by the producer's ``partitioner`` setting, either

- ``round-robin``: to the next partition in turn, record by record, as the seed's producer and
  the broker's own ``PUBS``/``PUB`` do (``RoundRobinPartitioner``). A thousand lines spread
  evenly over every partition, whatever the pace they arrive at; or
- ``sticky`` (Kafka's KIP-480): every unkeyed record of a topic goes to the same partition until
  the batch being filled there is closed, then the next partition in turn is used. Batches fill
  up instead of spreading one record over each partition, and over time the load goes
  round-robin; but a short burst lands in one or two partitions (``StickyPartitioner``).
"""

from __future__ import annotations

from typing import Literal

Partitioning = Literal["round-robin", "sticky"]
"""How a producer spreads unkeyed records: one partition after the other record by record
(``round-robin``), or batch by batch (``sticky``)."""
PARTITIONINGS: tuple[Partitioning, ...] = ("round-robin", "sticky")


class RoundRobinPartitioner:
    """The partition of unkeyed records, per topic: the next one in turn for every record.

    The first unkeyed record of a topic goes to partition 0, the next to 1, and so on, wrapping
    at the partition count given with each call (so a topic recreated with another count keeps
    working). Deterministic, so tests can predict it.
    """

    def __init__(self) -> None:
        self._next: dict[str, int] = {}

    def partition(self, topic: str, partitions: int) -> int:
        """Where the next unkeyed record of ``topic`` goes; each call moves on by one."""
        current = self._next.get(topic, 0) % partitions
        self._next[topic] = current + 1
        return current


class StickyPartitioner:
    """The partition of unkeyed records, per topic: one partition until told to move on.

    ``partition(topic, partitions)`` is the current sticky partition (starting at 0);
    ``batch_closed(topic, partition, partitions)`` moves the topic on to the next partition when the
    closed batch was the sticky one. Deterministic, so tests can predict it.
    """

    def __init__(self) -> None:
        self._current: dict[str, int] = {}

    def partition(self, topic: str, partitions: int) -> int:
        """Where the next unkeyed record of ``topic`` goes."""
        current = self._current.get(topic, 0)
        if current >= partitions:  # the topic was recreated with fewer partitions
            current = self._current[topic] = 0
        return current

    def batch_closed(self, topic: str, partition: int, partitions: int) -> None:
        """A batch of ``topic`` was closed on ``partition``: unkeyed records move on if it was
        the sticky one."""
        if self._current.get(topic, 0) == partition:
            self._current[topic] = (partition + 1) % partitions
