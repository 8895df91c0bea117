"""One Raft group hosted by a broker: its core, its storage, and who waits for its commits.

The driver (``MultiRaft``) owns the groups and moves their commit index; readers and proposers
wait on a ``RaftReplica`` (``wait_committed``, ``on_committed``, ``changed``).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from kafkaesque.storage import (
    CorruptLogError,
    PartitionLog,
    Record,
    data_records,
)

from .. import LogDiverged, QuietState, RaftNode, Role
from ._partition_storage import PartitionStorage


@dataclass(eq=False)
class PendingRead:
    """A read-index request: ``index`` once confirmed, None if leadership was lost first."""

    done: trio.Event = field(default_factory=trio.Event)
    index: int | None = None


@dataclass(eq=False)
class RaftReplica:
    """One Raft group hosted here: its core, its storage, and who waits for its commits."""

    id: str
    node: RaftNode
    storage: PartitionStorage
    commit_index: int = -1
    # Quiescence (``QuiescencePolicy``): only the driver's policy changes it.
    quiet: QuietState = field(default_factory=QuietState)
    # (offset, seq, term, callback): who waits for an offset to commit in its term, a heap.
    # Invariant: each callback is in it once, and is called once, as it leaves it.
    _waiters: list[tuple[int, int, int, Callable[[], None]]] = field(default_factory=list)
    _seq: int = 0
    # Set (and replaced) whenever the commit index moves: long-polling readers wait on it.
    changed: trio.Event = field(default_factory=trio.Event)
    # Corruption (or a divergence from the leader's log below the commit) found and not yet
    # repaired: the core is set aside until the driver repairs.
    corrupt: CorruptLogError | LogDiverged | None = None
    # Times the log was cut where it disagreed with the leader's below the commit (a metric).
    divergences: int = 0
    _on_corrupt: Callable[[RaftReplica, CorruptLogError], None] | None = None
    # Read-index requests waiting for their read point (``MultiRaft.read_index``), by ctx.
    _reads: dict[bytes, PendingRead] = field(default_factory=dict)

    def report_corruption(self, error: CorruptLogError) -> None:
        """A read of this group's log (a consumer's fetch, say) found ``error``: repair it.

        The driver cuts the log before the bad batch at its next turn and re-replicates it.
        """
        if self._on_corrupt is not None:
            self._on_corrupt(self, error)

    @property
    def quiesced(self) -> bool:
        """Whether the group is quiesced here (not ticked until something wakes it)."""
        return self.quiet.quiesced

    @property
    def log(self) -> PartitionLog:
        return self.storage.log

    @property
    def role(self) -> Role:
        return self.node.role

    @property
    def leader(self) -> int | None:
        return self.node.leader

    @property
    def committed_in_term(self) -> bool:
        """Whether an entry of this node's current term has committed here (a new leader's
        no-op, at least). Only then does a new leader know everything committed before it:
        until then an entry of an earlier term that its log lacks may still commit through the
        deposed leader that holds it; afterwards never (Raft's Log Matching and Leader
        Completeness)."""
        return self.log.term_at(self.commit_index) == self.node.term

    def committed_records(self, start: int | None = None) -> list[Record]:
        """The data records committed from ``start`` (default: the log start) on.

        Only committed data is returned (what consumers may see); control batches are skipped.
        """
        out: list[Record] = []
        offset = self.log.log_start_offset if start is None else start
        while offset <= self.commit_index:
            result = self.log.read(offset, 1 << 20, max_offset=self.commit_index + 1)
            if not result.data:
                break
            out.extend(data_records(result.data, offset, verify=False))  # the log verified them
            offset = result.next_offset
        return out

    async def wait_committed(self, last: int, term: int) -> None:
        """Until the commit index reaches ``last`` (proposed in ``term``), or the entries from
        ``last`` on are lost here (truncated, the log reset or repaired, the group removed).

        The caller tells which from ``commit_index`` and the log. Unlike ``changed``, it wakes
        its caller once, not at every move of the commit index: a leader with many writes in
        flight would otherwise wake each of them at every commit.
        """
        done = trio.Event()
        self.on_committed(last, term, done.set)
        await done.wait()

    def on_committed(self, last: int, term: int, callback: Callable[[], None]) -> None:
        """Call ``callback`` once, when the commit index reaches ``last`` (proposed in
        ``term``) or the entries from ``last`` on are lost here, as ``wait_committed`` wakes:
        at once if the commit index is already there.

        No task waits: the callback runs in whichever task moves the commit index or cuts the
        log (the driver's loop, a peer connection's reader handling commit news, the task
        removing the group), in the middle of its step. So it must be quick, must not raise,
        and tells what happened from ``commit_index`` and the log, as ``wait_committed``'s
        caller does. Callbacks run in the order of their offsets.
        """
        if self.commit_index >= last:
            callback()
            return
        self._seq += 1
        heapq.heappush(self._waiters, (last, self._seq, term, callback))

    def _notify(self) -> None:
        self.changed.set()
        self.changed = trio.Event()
        waiters = self._waiters
        while waiters and waiters[0][0] <= self.commit_index:
            heapq.heappop(waiters)[3]()  # popped first: a callback may add waiters

    def _fail_waiters_above(self, offset: int) -> None:
        """Call the waiters of offsets from ``offset`` on: their entries are gone (they see
        that from the log: ``ProposalLost`` for ``propose``)."""
        cut = [item for item in self._waiters if item[0] >= offset]
        if not cut:
            return
        self._waiters = [item for item in self._waiters if item[0] < offset]
        heapq.heapify(self._waiters)
        for item in sorted(cut):  # (offset, seq) are unique: callbacks are never compared
            item[3]()
