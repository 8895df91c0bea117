"""The log read back for resumed sessions, decoded once per broker and indexed by MQTT topic.

A resumed persistent session catches up from its stored position in each partition it reads
(``_resume``, ``SessionKeeper._redeliver``). In a reconnect storm hundreds of sessions catch up
on the same partitions at once, from nearby positions: read and decoded by each of them, a
partition of N records costs N record decodings, MQTT topic mappings and subscription matches
per session. A py-spy profile of the survivors of ``bench.fleet``'s storm (5,000 devices, 1,666
resumed) had three quarters of their time there, and the storm never ended (issue 38).

``ReplayCache`` reads each stretch of a partition once (concurrent readers of the same offset
share one fetch), decodes its records once, and indexes them by MQTT topic: a session whose
subscriptions name exact topics (no wildcard), as a device's commands topic does, then visits
only the records of those topics and the ones it owes (``candidates``), whatever the partition's
traffic. The stretches are committed records, which never change; they are dropped once unused
for ``_KEEP_S`` (looked at when another is kept) or when the cache holds more than
``_MAX_RECORDS`` records or ``_MAX_BYTES`` bytes of payloads.
"""

from __future__ import annotations

import bisect
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Final, NamedTuple

import trio

from kafkaesque.protocol.mqtt import Origin, TopicMapping, origin_of
from kafkaesque.storage import data_records, end_offset

from .._read_path import ReadPath
from ._resume import Position

_FETCH_BYTES: Final = 1 << 18
_KEEP_S: Final = 5.0  # a stretch unused this long goes
# Over all stretches; past either, the least recently used go first.
_MAX_RECORDS: Final = 200_000
_MAX_BYTES: Final = 64 << 20


class Replayed(NamedTuple):
    """One record as a catch-up needs it: its MQTT topic (None: it maps to none) and origin."""

    offset: int
    topic: str | None
    payload: bytes
    origin: Origin
    timestamp: int


@dataclass(eq=False, slots=True)
class Stretch:
    """The committed records of a partition read from ``start`` on, up to ``end`` (exclusive;
    past control batches too). ``log_start``: where the read began (later than ``start`` when
    retention had passed it: the records before it are gone)."""

    start: int
    end: int
    log_start: int
    records: list[Replayed]
    offsets: list[int] = field(default_factory=list)  # of ``records``, ascending
    by_topic: dict[str, list[int]] = field(default_factory=dict)  # topic -> indexes, ascending
    used: float = 0.0  # trio time of the last use
    size: int = 0  # the payloads' bytes

    def __post_init__(self) -> None:
        self.offsets = [r.offset for r in self.records]
        self.size = sum(len(r.payload) for r in self.records)
        for i, record in enumerate(self.records):
            if record.topic is not None:
                self.by_topic.setdefault(record.topic, []).append(i)

    def candidates(
        self, low: int, high: int, topics: Collection[str] | None, owed: Iterable[int]
    ) -> list[Replayed]:
        """The records in ``[low, high)`` of the MQTT ``topics`` (None: of every topic), and at
        the ``owed`` offsets, in offset order."""
        first = bisect.bisect_left(self.offsets, low)
        last = bisect.bisect_left(self.offsets, high)
        if topics is None:
            return self.records[first:last]
        picked: set[int] = set()
        for topic in topics:
            indexes = self.by_topic.get(topic)
            if indexes:
                picked.update(
                    indexes[bisect.bisect_left(indexes, first) : bisect.bisect_left(indexes, last)]
                )
        for offset in owed:
            i = bisect.bisect_left(self.offsets, offset)
            if first <= i < last and self.offsets[i] == offset:
                picked.add(i)
        return [self.records[i] for i in sorted(picked)]


class ReplayCache:
    """Stretches of log partitions read for catch-ups, shared by every session of this broker
    (see the module docstring). Trio thread only."""

    def __init__(self, reads: ReadPath, mapping: TopicMapping) -> None:
        self._reads = reads
        self._mapping = mapping
        self._stretches: dict[Position, list[Stretch]] = {}  # by start, ascending
        self._loading: dict[Position, dict[int, trio.Event]] = {}  # reads in progress, by start
        self._records = 0
        self._bytes = 0

    async def read(self, where: Position, offset: int) -> Stretch | None:
        """A stretch holding ``offset`` (``start <= offset < end``), read now if none is known;
        None when the read found nothing (a replica behind: try again in a moment). Raises
        ``RequestError`` as ``ReadPath.follow`` does."""
        while True:
            found = self._find(where, offset)
            if found is not None:
                found.used = trio.current_time()
                return found
            loading = self._loading.setdefault(where, {})
            # A read in progress from this offset or before it may well cover it (sessions
            # resume from nearby offsets): wait for it rather than read the same records again.
            earlier = [event for start, event in loading.items() if start <= offset]
            if not earlier:
                break
            await earlier[0].wait()
        done = loading[offset] = trio.Event()
        try:
            fetched, start = await self._reads.follow(*where, offset, _FETCH_BYTES, 0)
            end = end_offset(fetched.data)
            if end is None:
                return None
            stretch = Stretch(offset, end, start, self._decode(where[0], fetched.data, start))
        finally:
            del loading[offset]
            done.set()
        stretch.used = trio.current_time()
        self._keep(where, stretch)
        return stretch

    def _decode(self, topic: str, data: bytes | memoryview, start: int) -> list[Replayed]:
        mqtt_topic_for = self._mapping.mqtt_topic_for
        # The log verified the batches on read.
        return [
            Replayed(
                r.offset,
                mqtt_topic_for(topic, r.key, r.headers),
                r.value or b"",
                origin_of(r.headers),
                r.timestamp,
            )
            for r in data_records(data, start, verify=False)
        ]

    def _find(self, where: Position, offset: int) -> Stretch | None:
        stretches = self._stretches.get(where)
        if not stretches:
            return None
        i = bisect.bisect_right([s.start for s in stretches], offset) - 1
        # Stretches may overlap (read from different offsets): the one starting last before
        # ``offset`` may end before it while an earlier one covers it.
        while i >= 0:
            if offset < stretches[i].end:
                return stretches[i]
            i -= 1
        return None

    def _keep(self, where: Position, stretch: Stretch) -> None:
        stretches = self._stretches.setdefault(where, [])
        bisect.insort(stretches, stretch, key=lambda s: s.start)
        self._records += len(stretch.records)
        self._bytes += stretch.size
        now = trio.current_time()
        every = [(s.used, w, s) for w, ss in self._stretches.items() for s in ss]
        every.sort(key=lambda t: t[0])
        for used, w, s in every:
            full = self._records > _MAX_RECORDS or self._bytes > _MAX_BYTES
            if used > now - _KEEP_S and not full:
                break
            if s is stretch:
                continue
            self._stretches[w].remove(s)
            self._records -= len(s.records)
            self._bytes -= s.size
        for w in [w for w, ss in self._stretches.items() if not ss]:
            del self._stretches[w]
