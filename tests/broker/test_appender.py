"""When the MQTT appender seals its open batch: Nagle's rule over a write path that commits
only when the test says so (a pure unit: the appender's logic, no broker)."""

from __future__ import annotations

from typing import Any, cast

import trio
import trio.testing

from kafkaesque.broker._mqtt_appender import IdempotentAppender, MqttFlight
from kafkaesque.broker._writes import WritePath
from kafkaesque.storage import Record


class _HeldWrites:
    """Records the size of each batch started; each write commits when ``commit`` is called."""

    timeout = 5.0

    def __init__(self) -> None:
        self.started: list[int] = []
        self._held: list[tuple[int, trio.Event, list[int]]] = []  # count, committed, offsets
        self._next = 0

    def start(self, group_id: str, batch: bytes, count: int, *args: Any) -> None:
        self.started.append(count)

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


async def _add(appender: IdempotentAppender, n: int) -> MqttFlight:
    flight = MqttFlight(0)
    for i in range(n):
        flight, _ = appender.add(Record(value=b"reading %d" % i))
    await trio.testing.wait_all_tasks_blocked()
    return flight


async def test_small_batches_wait_for_the_one_in_flight_and_full_ones_are_pipelined() -> None:
    writes = _HeldWrites()
    appender = IdempotentAppender("readings-0", 0, cast(WritePath, writes))
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
