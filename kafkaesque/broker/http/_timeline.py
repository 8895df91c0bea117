"""The console's live timeline: what happened in the cluster, as this broker saw it, told to
every open console tab through one server-sent-events stream per tab.

``Timeline.add`` records an event (an election, a leader move, a broker leaving or coming
back, a rebalance, a refused login) in a ring of the last ``history`` events and hands it to
every open stream. Both are bounded: at most ``max_streams`` streams are open (one more is
refused, the caller answers 503), and each stream's queue holds at most ``queue`` events: when
a slow tab lets it fill, the oldest event is dropped and the stream is told how many it missed
(a ``dropped`` event), so a tab never holds the broker's memory hostage and never silently
shows a gap. Adding is synchronous and never blocks (it is called from the broker's loops).
"""

from __future__ import annotations

import collections
import itertools
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final

import trio

HISTORY: Final = 200
MAX_STREAMS: Final = 16
QUEUE: Final = 256


@dataclass(frozen=True, slots=True)
class TimelineEvent:
    """One thing that happened: ``seq`` numbers the events of this broker (from 1; an SSE
    ``id``), ``at`` is the wall-clock time in seconds, ``kind`` one of ``election``,
    ``leader``, ``broker``, ``controller``, ``rebalance``, ``login``, ``partition``,
    ``replication``, and
    ``text`` says it in words."""

    seq: int
    at: float
    kind: str
    text: str
    detail: dict[str, Any]

    def json(self) -> dict[str, Any]:
        return {"seq": self.seq, "at": self.at, "kind": self.kind, "text": self.text, **self.detail}


class TimelineStream:
    """One tab's queue of events (see the module docstring): ``get`` waits for the next one."""

    def __init__(self, capacity: int) -> None:
        self._queue: collections.deque[TimelineEvent] = collections.deque()
        self._capacity = capacity
        self.dropped = 0  # events dropped since the last ``take_dropped``
        self._wake = trio.Event()

    def put(self, event: TimelineEvent) -> None:
        if len(self._queue) >= self._capacity:
            self._queue.popleft()
            self.dropped += 1
        self._queue.append(event)
        self._wake.set()

    def take_dropped(self) -> int:
        """How many events were dropped since the last call (and forget them)."""
        dropped, self.dropped = self.dropped, 0
        return dropped

    def drain(self) -> list[TimelineEvent]:
        """The events queued now, oldest first (and empty the queue)."""
        events = list(self._queue)
        self._queue.clear()
        if self._wake.is_set():
            self._wake = trio.Event()
        return events

    async def wait(self) -> None:
        """Return once an event is queued (at once if one is)."""
        if not self._queue:
            await self._wake.wait()


class TooManyStreams(Exception):
    """Every stream slot is taken."""


class Timeline:
    """The events and the open streams (see the module docstring)."""

    def __init__(
        self,
        *,
        history: int = HISTORY,
        max_streams: int = MAX_STREAMS,
        queue: int = QUEUE,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._history: collections.deque[TimelineEvent] = collections.deque(maxlen=history)
        self._streams: set[TimelineStream] = set()
        self._max_streams = max_streams
        self._queue = queue
        self._clock = clock
        self._seq = itertools.count(1)

    @property
    def max_streams(self) -> int:
        return self._max_streams

    @property
    def streams(self) -> int:
        """Streams open now."""
        return len(self._streams)

    def add(self, kind: str, text: str, **detail: Any) -> TimelineEvent:
        """Record an event and queue it on every open stream."""
        event = TimelineEvent(next(self._seq), self._clock(), kind, text, detail)
        self._history.append(event)
        for stream in self._streams:
            stream.put(event)
        return event

    def recent(self, after: int = 0) -> list[TimelineEvent]:
        """The remembered events whose ``seq`` is above ``after``, oldest first."""
        return [e for e in self._history if e.seq > after]

    @contextmanager
    def open_stream(self) -> Iterator[TimelineStream]:
        """A stream for one tab, closed on exit. Raises ``TooManyStreams``."""
        if len(self._streams) >= self._max_streams:
            raise TooManyStreams(f"{self._max_streams} console streams are open already")
        stream = TimelineStream(self._queue)
        self._streams.add(stream)
        try:
            yield stream
        finally:
            self._streams.discard(stream)
