"""One timer for all the MQTT connections' deadlines (no CONNECT in time, or silence beyond 1.5
times the keep-alive).

A timeout around each read costs a cancel scope per packet, with its deadline registered and
withdrawn: 13 to 19 us of CPU per packet (``python -m bench.device_io``), a third more than the
rest of the packet's trip through the stream. Instead ``MqttService`` keeps its connections in a
heap by deadline and looks at the due ones every ``SCAN_S``. A connection's deadline only ever
moves later (a packet arrived, or the CONNECT did), so an entry that comes up is checked against
the connection's deadline now and pushed back if that moved: each connection is in the heap
once, and a busy one is looked at once per keep-alive period, not once per packet. A closed
connection leaves as its deadline comes up, or, if that is far away (a keep-alive of 0 is
never), when closed ones have become half of the heap: it is then rebuilt without them.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Final, Generic, Protocol, TypeVar

SCAN_S: Final = 0.25  # so a connection is closed at most this late
_REBUILD_AFTER: Final = 64


class Watched(Protocol):
    """What the heap needs of a connection's state machine."""

    @property
    def closed(self) -> bool: ...

    def deadline(self) -> float: ...


class _HasConn(Protocol):
    @property
    def conn(self) -> Watched: ...


T = TypeVar("T", bound=_HasConn)


class Deadlines(Generic[T]):
    """The live connections by deadline; not thread-safe (trio thread only)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, T]] = []
        self._order = itertools.count()  # ties go in order of arrival; T need not compare
        self._ended = 0  # connections ended since the last rebuild (an upper bound of those here)

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, item: T) -> None:
        """Watch ``item`` until its connection closes."""
        heapq.heappush(self._heap, (item.conn.deadline(), next(self._order), item))

    def ended(self) -> None:
        """A connection closed (its state machine says so already)."""
        self._ended += 1
        if self._ended > _REBUILD_AFTER and 2 * self._ended > len(self._heap):
            self._heap = [entry for entry in self._heap if not entry[2].conn.closed]
            heapq.heapify(self._heap)
            self._ended = 0

    def due(self, now: float) -> list[T]:
        """The open connections whose deadline is ``now`` or earlier; they leave the heap (the
        caller closes them). Closed connections leave it as their old deadline comes up."""
        heap = self._heap
        expired: list[T] = []
        while heap and heap[0][0] <= now:
            _, order, item = heapq.heappop(heap)
            conn = item.conn
            if conn.closed:
                continue
            deadline = conn.deadline()
            if deadline <= now:
                expired.append(item)
            else:
                heapq.heappush(heap, (deadline, order, item))
        return expired
