"""One timer for all the MQTT connections' deadlines (no CONNECT in time, or silence beyond 1.5
times the keep-alive).

A timeout around each read costs a cancel scope per packet, with its deadline registered and
withdrawn: 13 to 19 us of CPU per packet (``python -m bench.device_io``), a third more than the
rest of the packet's trip through the stream. Instead ``MqttService`` keeps its connections in a
heap by deadline and looks at the due ones every ``SCAN_S``. A packet only ever moves a
connection's deadline later, so an entry that comes up is checked against the connection's
deadline now and pushed back if that moved: a busy connection is looked at once per keep-alive
period, not once per packet. The one move earlier is the CONNECT's: the connect timeout
(``CONNECT_TIMEOUT_S``) becomes 1.5 times the keep-alive from then, which for a keep-alive
under about 6.7 s is sooner (MQTT-3.1.2-24, v5 §3.1.2.10). ``moved_earlier`` pushes a second
entry then, and the first becomes stale: it is skipped as it comes up. A closed connection
leaves as its deadline comes up, or, if that is far away (a keep-alive of 0 is never), when
closed ones have become half of the heap: it is then rebuilt without them.
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
        # For the items ``moved_earlier`` pushed again: id(item) -> [the order of its live
        # entry (-1: none left), how many entries it has in the heap]. Its other entries are
        # stale. An item is here only while it has entries, which keep it alive: its id is not
        # reused meanwhile.
        self._moved: dict[int, list[int]] = {}

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, item: T) -> None:
        """Watch ``item`` until its connection closes."""
        heapq.heappush(self._heap, (item.conn.deadline(), next(self._order), item))

    def moved_earlier(self, item: T) -> None:
        """``item``'s deadline may now be earlier than it was (its CONNECT was accepted):
        watch it by the deadline it has now. Only for an item ``due`` has not handed out."""
        conn = item.conn
        if conn.closed:
            return
        order = next(self._order)
        heapq.heappush(self._heap, (conn.deadline(), order, item))
        moved = self._moved.get(id(item))
        if moved is None:
            self._moved[id(item)] = [order, 2]  # this entry and the one ``add`` pushed
        else:
            moved[0] = order
            moved[1] += 1

    def _stale(self, order: int, item: T) -> bool:
        """Whether this entry was superseded by a later one of ``moved_earlier``."""
        moved = self._moved.get(id(item))
        return moved is not None and moved[0] != order

    def _left(self, order: int, item: T) -> None:
        """An entry of ``item`` left the heap for good."""
        moved = self._moved.get(id(item))
        if moved is None:
            return
        if moved[0] == order:
            moved[0] = -1
        moved[1] -= 1
        if moved[1] == 0:
            del self._moved[id(item)]

    def ended(self) -> None:
        """A connection closed (its state machine says so already)."""
        self._ended += 1
        if self._ended > _REBUILD_AFTER and 2 * self._ended > len(self._heap):
            kept = []
            for entry in self._heap:
                _, order, item = entry
                if item.conn.closed or self._stale(order, item):
                    self._left(order, item)
                else:
                    kept.append(entry)
            self._heap = kept
            heapq.heapify(self._heap)
            self._ended = 0

    def due(self, now: float) -> list[T]:
        """The open connections whose deadline is ``now`` or earlier; they leave the heap (the
        caller closes them). Closed connections leave it as their old deadline comes up."""
        heap = self._heap
        expired: list[T] = []
        while heap and heap[0][0] <= now:
            _, order, item = heapq.heappop(heap)
            if self._stale(order, item):
                self._left(order, item)
                continue  # its live entry is elsewhere in the heap (or was handed out)
            conn = item.conn
            if conn.closed:
                self._left(order, item)
                continue
            deadline = conn.deadline()
            if deadline <= now:
                self._left(order, item)
                expired.append(item)
            else:
                heapq.heappush(heap, (deadline, order, item))
        return expired
