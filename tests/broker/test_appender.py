"""The partition appender (PUBS, PUB, MQTT): when it seals its open batch (Nagle's rule) and how
it stamps batches, over a write path that commits only when the test says so (a pure unit: the
appender's logic, no broker)."""

from __future__ import annotations

from typing import Any, cast

import trio
import trio.testing

from kafkaesque.broker._appender import Flight, PartitionAppender
from kafkaesque.broker._writes import WritePath
from kafkaesque.protocol import Acks
from kafkaesque.storage import NO_PRODUCER_ID, Record, decode_header


class _HeldWrites:
    """Records the size of each batch started; each write commits when ``commit`` is called."""

    timeout = 5.0

    def __init__(self) -> None:
        self.started: list[int] = []
        self.stamps: list[tuple[int, int]] = []  # (producer id, base sequence) of each batch
        self._held: list[tuple[int, trio.Event, list[int]]] = []  # count, committed, offsets
        self._next = 0

    def start(self, group_id: str, batch: bytes, count: int, *args: Any) -> None:
        self.started.append(count)
        header = decode_header(batch)
        self.stamps.append((header.producer_id, header.base_sequence))

    async def write(self, group_id: str, batch: bytes, count: int, *args: Any, **kw: Any) -> Any:
        committed, offsets = trio.Event(), list[int]()
        self._held.append((count, committed, offsets))
        await committed.wait()
        return offsets[0], offsets[1]

    def commit(self) -> None:
        """Commit the oldest write still held."""
        count, committed, offsets = self._held.pop(0)
        offsets += [self._next, self._next + count - 1]
        self._next += count
        committed.set()


async def _add(appender: PartitionAppender, n: int) -> Flight:
    flight = Flight(0)
    for i in range(n):
        flight, _ = appender.add(Record(value=b"reading %d" % i))
    await trio.testing.wait_all_tasks_blocked()
    return flight


async def test_small_batches_wait_for_the_one_in_flight_and_full_ones_are_pipelined() -> None:
    writes = _HeldWrites()
    appender = PartitionAppender("readings-0", 0, Acks.QUORUM, cast(WritePath, writes))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(appender.run, nursery)
        await _add(appender, 1)
        assert writes.started == [1]  # nothing in flight: a trickle goes out record by record
        waiting = await _add(appender, 10)
        assert writes.started == [1]  # one batch in flight: the next one grows meanwhile
        writes.commit()
        await trio.testing.wait_all_tasks_blocked()
        assert writes.started == [1, 10]
        await _add(appender, 64)
        assert writes.started == [1, 10, 64]  # big enough to go beside the one in flight
        writes.commit()
        writes.commit()
        await trio.testing.wait_all_tasks_blocked()
        assert waiting.done.is_set() and waiting.error is None and waiting.base == 1
        nursery.cancel_scope.cancel()


async def test_every_batch_carries_the_appenders_producer_id_and_its_next_sequence() -> None:
    # A PUB the broker retries after an unknown outcome must not be appended twice: the leader
    # recognises the retry by these stamps (issue 23: 22 plain PUBs were in the log twice).
    writes = _HeldWrites()
    appender = PartitionAppender("orders-0", 0, Acks.LEADER, cast(WritePath, writes))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(appender.run, nursery)
        await _add(appender, 1)
        await _add(appender, 3)
        writes.commit()
        await trio.testing.wait_all_tasks_blocked()
        await _add(appender, 2)
        writes.commit()
        await trio.testing.wait_all_tasks_blocked()
        assert writes.started == [1, 3, 2]
        producer_ids = {pid for pid, _ in writes.stamps}
        assert len(producer_ids) == 1 and NO_PRODUCER_ID not in producer_ids
        assert [seq for _, seq in writes.stamps] == [0, 1, 4]
        nursery.cancel_scope.cancel()
