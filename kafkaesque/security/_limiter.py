"""Rate-limiting authentication failures per address, so a password cannot be guessed fast."""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Final

MAX_ADDRESSES: Final = 10_000


class FailureLimiter:
    """At most ``limit`` failed authentications per address in any ``window_s`` seconds.

    ``blocked(address)`` is how long (seconds of ``clock``) the address must wait before it may
    try again, 0.0 if it may now; ``failed`` records a failure, ``succeeded`` forgets the
    address. The address is the peer's host (not its port: a new connection must not reset
    it). Memory is bounded: at most MAX_ADDRESSES addresses are kept, the one that failed least
    recently forgotten first. ``limit`` 0 turns limiting off.
    """

    def __init__(
        self, limit: int, window_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if limit < 0 or window_s < 0:
            raise ValueError("limit and window_s must not be negative")
        self.limit = limit
        self.window_s = window_s
        self._clock = clock
        # address -> times of its recent failures (at most `limit`), least recent address first
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def _recent(self, address: str, now: float) -> deque[float] | None:
        times = self._failures.get(address)
        if times is None:
            return None
        while times and times[0] <= now - self.window_s:
            times.popleft()
        if not times:
            del self._failures[address]
            return None
        return times

    def blocked(self, address: str) -> float:
        """Seconds until ``address`` may try again; 0.0 if it may now."""
        if self.limit == 0:
            return 0.0
        now = self._clock()
        times = self._recent(address, now)
        if times is None or len(times) < self.limit:
            return 0.0
        return max(0.0, times[0] + self.window_s - now)

    def failed(self, address: str) -> None:
        """Record a failed authentication from ``address``."""
        if self.limit == 0:
            return
        now = self._clock()
        times = self._recent(address, now)
        if times is None:
            times = self._failures[address] = deque(maxlen=self.limit)
        times.append(now)
        self._failures.move_to_end(address)
        while len(self._failures) > MAX_ADDRESSES:
            self._failures.popitem(last=False)

    def succeeded(self, address: str) -> None:
        """Forget ``address``'s failures."""
        self._failures.pop(address, None)

    def __len__(self) -> int:
        """How many addresses are remembered."""
        return len(self._failures)
