"""Where a record without a partition goes, for every front that publishes on a client's behalf
(the line protocol's PUBS and PUB, REST produce): the producers' rule.

A partition the client names is kept (or refused when the topic lacks it); else a key picks it
(``partition_for_key``, the rule every client shares); else the broker deals records round-robin,
one counter per topic shared by the fronts, so that keyless records from telnet and REST spread
over the partitions together. Trio thread only.
"""

from __future__ import annotations

import itertools

from kafkaesque.protocol import partition_for_key

from ._errors import unknown_partition


class Partitioner:
    """The producers' rule (see the module docstring), with the broker's round-robin counters."""

    def __init__(self) -> None:
        self._round_robin: dict[str, itertools.count[int]] = {}

    def choose(self, topic: str, count: int, key: bytes | None, partition: int | None) -> int:
        """The partition of a record of ``topic`` (``count`` partitions) with ``key`` and the
        ``partition`` its client asked for (None: none); ``RequestError(UNKNOWN_PARTITION)``
        for a partition the topic does not have."""
        if partition is not None:
            if partition >= count:
                raise unknown_partition(topic, partition, count)
            return partition
        if key is not None:
            return partition_for_key(key, count)
        counter = self._round_robin.get(topic)
        if counter is None:
            counter = self._round_robin[topic] = itertools.count()
        return next(counter) % count
