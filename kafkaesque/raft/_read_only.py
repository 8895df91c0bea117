"""Pending read-index requests of a leader (Raft thesis §6.4).

A read arriving at a leader is tagged with the commit offset at that moment and with a heartbeat
"round". The leader then sends heartbeats carrying that round; once a majority of voters (counting
itself) have echoed a round at least as high, no other leader can have been elected when the read
arrived, so every write acknowledged before the read is at or below the tagged offset. The read is
answered when the applied offset reaches it. Reads arriving before the leader has committed an
entry of its own term wait for that commit first: before it, the leader's commit offset may lag
writes acknowledged by its predecessor.
"""

from __future__ import annotations

from collections import deque

from ._ready import ReadState


class ReadOnly:
    """Reads waiting for their heartbeat round to be confirmed, in arrival order."""

    def __init__(self) -> None:
        # Invariant: rounds are non-decreasing from left to right.
        self._pending: deque[tuple[int, bytes, int]] = deque()

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, round_: int, ctx: bytes, index: int) -> None:
        """Queue a read tagged with ``round_`` and commit offset ``index``."""
        self._pending.append((round_, ctx, index))

    def release(self, confirmed_round: int) -> list[ReadState]:
        """The reads whose round a majority has confirmed, oldest first."""
        out = []
        while self._pending and self._pending[0][0] <= confirmed_round:
            _, ctx, index = self._pending.popleft()
            out.append(ReadState(ctx, index))
        return out

    def drop_all(self) -> list[bytes]:
        """Forget every pending read (leadership lost) and return their contexts."""
        out = [ctx for _, ctx, _ in self._pending]
        self._pending.clear()
        return out
