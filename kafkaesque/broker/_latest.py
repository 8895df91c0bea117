"""``LATEST topic key``: a compacted topic's newest committed value for a key, from an index.

Seed 002 serves each producer's latest heartbeat by id: a compacted topic keyed by id, asked
"what is the newest record of this key?". Reading the partition from its start for that would
cost the whole log; instead the leader of each partition of a compacted topic keeps a
``KeyIndex``: key -> offset of the key's newest committed record. A lookup reads one batch (the
one holding that offset), not the log.

The index, per partition led here (``LatestIndexes``):

* covers the committed prefix ``[log start, next_offset)`` of the log only, so it never holds
  an offset a Raft truncation could remove (truncation cuts uncommitted entries only);
* is built from the log when this replica becomes leader, by a task of its own that reads
  ``_CHUNK_BYTES`` at a time with a checkpoint between chunks, so a new leader serves writes and
  FETCHes meanwhile; until it has caught up once, ``LATEST`` answers ``NOT_READY`` (retriable);
* follows the commit index as records commit (the task wakes on ``RaftReplica.changed``), and a
  lookup first indexes whatever committed since (at most ``_LOOKUP_CATCH_UP_BYTES``; more than
  that answers ``NOT_READY``), so a client reads its own acknowledged write;
* follows retention: keys whose newest record lies below the log start are forgotten (a key
  deleted by retention answers "no value"). Compaction needs nothing: it keeps each key's
  newest record at its offset (``PartitionLog.compact``), and the index points at exactly those;
* forgets a key when its newest record is a tombstone (a None value): "no value", and the
  memory stays bounded by the number of live keys (about 100 bytes a key plus the key itself);
* is dropped when this replica stops leading the partition, the topic stops being compacted,
  or the group leaves this broker; the next leader builds its own.

A lookup confirms leadership with a Raft read index first (``MultiRaft.read_index``), so a
deposed leader that has not heard of its successor, or a new leader whose commit index has not
reached its predecessor's yet, never answers an older value than one already acknowledged.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import trio

from kafkaesque.protocol import ErrorCode, is_internal_topic
from kafkaesque.raft import NotLeader, Role
from kafkaesque.raft.driver import CommitTimeout, RaftReplica
from kafkaesque.storage import (
    CorruptLogError,
    OffsetOutOfRangeError,
    PartitionLog,
    Record,
    data_records,
)

from ._errors import RequestError

log = logging.getLogger("kafkaesque.broker.latest")

_CHUNK_BYTES = 1 << 20  # one read of a (re)build or follow step; a checkpoint after each
_LOOKUP_CATCH_UP_BYTES = 4 << 20  # what a lookup indexes itself before answering NOT_READY
_SCAN_EVERY_S = 0.1  # how often the groups led here are looked at for new or lost leaderships
_RECHECK_S = 2.0  # a follow task re-checks its leadership at least this often when idle


class KeyIndex:
    """Key -> offset of its newest record, over the log prefix ``[start, next_offset)``.

    Pure (no I/O of its own): ``feed`` it whole batches as ``PartitionLog.read`` returns them,
    in log order. Records without a key are not indexed; a tombstone (a None value) removes its
    key. Invariant: every offset held is in ``[start, next_offset)`` and is the newest record
    of its key there, and that record has a value.
    """

    def __init__(self, start_offset: int) -> None:
        if start_offset < 0:
            raise ValueError("start_offset must not be negative")
        self.next_offset = start_offset
        self._offsets: dict[bytes, int] = {}
        self._floor = start_offset  # no offset below it is held (the last forget_below)

    def __len__(self) -> int:
        return len(self._offsets)

    def offset_of(self, key: bytes) -> int | None:
        """The offset of ``key``'s newest record with a value, None if it has none here."""
        return self._offsets.get(key)

    def feed(self, data: bytes | memoryview, next_offset: int) -> None:
        """Index the records of ``data`` (whole batches, as a log read returns them) at or
        after ``next_offset``'s current value, then move it to ``next_offset`` (the read's:
        past the last batch, control batches included). The first batch may begin before the
        current ``next_offset``: its older records are skipped. Raises ``ValueError`` if
        ``next_offset`` would go back."""
        if next_offset < self.next_offset:
            raise ValueError(f"next_offset {next_offset} is before {self.next_offset}")
        start = self.next_offset
        offsets = self._offsets
        for record in data_records(data, start, verify=False):  # the log verified them on read
            if record.key is None:
                continue
            if record.value is None:
                offsets.pop(record.key, None)
            else:
                offsets[record.key] = record.offset
        self.next_offset = next_offset

    def forget_below(self, log_start: int) -> int:
        """Forget the keys whose newest record lies below ``log_start`` (retention deleted it);
        return how many. A pass over every key: called only when the log start moved."""
        if log_start <= self._floor:
            return 0
        self._floor = log_start
        gone = [k for k, o in self._offsets.items() if o < log_start]
        for key in gone:
            del self._offsets[key]
        self.next_offset = max(self.next_offset, log_start)
        return len(gone)


def catch_up(index: KeyIndex, plog: PartitionLog, end: int, max_bytes: int) -> bool:
    """Feed ``index`` the log from its ``next_offset`` toward ``end`` (the high watermark: the
    commit index + 1), reading about ``max_bytes`` at most (at least one batch). Returns
    whether it reached ``end``.

    Retention that ran past ``next_offset`` is followed: the index forgets what it deleted and
    goes on from the new log start. Raises ``CorruptLogError`` from the read.
    """
    index.forget_below(plog.log_start_offset)
    budget = max_bytes
    while index.next_offset < end:
        if budget <= 0:
            return False
        try:
            result = plog.read(index.next_offset, min(budget, _CHUNK_BYTES), max_offset=end)
        except OffsetOutOfRangeError:
            if index.next_offset >= plog.log_start_offset:
                raise  # past the end: the caller's ``end`` is wrong
            index.forget_below(plog.log_start_offset)
            continue
        if not result.data:
            # Nothing readable below ``end`` from here: only gaps (truncated-away offsets).
            index.feed(b"", end)
            return True
        index.feed(result.data, result.next_offset)
        budget -= len(result.data)
    return True


def record_at(plog: PartitionLog, offset: int, key: bytes, end: int) -> Record | None:
    """The record of ``key`` at ``offset`` (below ``end``), None if the log no longer holds it
    there. One read of the batch that holds the offset. Raises ``CorruptLogError``."""
    try:
        result = plog.read(offset, 1, max_offset=end)  # 1 byte: just the batch holding it
    except OffsetOutOfRangeError:
        return None
    # The first record at or after ``offset``: the one at ``offset``, unless compaction (or a
    # control batch) left none there.
    for record in data_records(result.data, offset, verify=False):
        return record if record.offset == offset and record.key == key else None
    return None


@dataclass(eq=False)
class _Led:
    """The index of one group led here, and whether it has caught up with the commit index
    once (before that, lookups answer NOT_READY)."""

    replica: RaftReplica
    index: KeyIndex
    ready: bool = False
    done: bool = False  # dropped: its task stops
    cancel: trio.CancelScope = field(default_factory=trio.CancelScope)


class LatestIndexes:
    """The key indexes of the compacted partitions this broker leads (see the module doc).

    ``replicas`` gives the Raft groups hosted here (the broker's ``raft.replicas``), ``compacted``
    whether a group's topic is compacted now, ``read_index`` the Raft read index of a group
    (raises ``NotLeader`` or ``CommitTimeout``). Use from the broker's trio thread only.
    """

    def __init__(
        self,
        replicas: Callable[[], dict[str, RaftReplica]],
        compacted: Callable[[str], bool],
        read_index: Callable[[str], Awaitable[int]],
    ) -> None:
        self._groups = replicas
        self._compacted = compacted
        self._read_index = read_index
        self._led: dict[str, _Led] = {}
        # Internal compacted topics (consumer offsets, MQTT retained messages) are indexed only
        # once a LATEST asked for them: nobody asks for most, and their keys cost memory.
        self._asked: set[str] = set()
        self._nursery: trio.Nursery | None = None

    def keys(self, log_id: str) -> int | None:
        """How many keys the index of ``log_id`` holds (None: no index here): for tests and
        metrics."""
        led = self._led.get(log_id)
        return None if led is None else len(led.index)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start an index for every compacted group that becomes led here; until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            try:
                while True:
                    self._start_new()
                    await trio.sleep(_SCAN_EVERY_S)
            finally:
                self._nursery = None

    def _start_new(self) -> None:
        for log_id, replica in list(self._groups().items()):
            if log_id in self._led or replica.role is not Role.LEADER:
                continue
            internal = is_internal_topic(log_id.rpartition("/")[0])
            if (not internal or log_id in self._asked) and self._compacted(log_id):
                self._start(replica)

    def _start(self, replica: RaftReplica) -> _Led:
        led = _Led(replica, KeyIndex(replica.log.log_start_offset))
        self._led[replica.id] = led
        if self._nursery is not None:
            self._nursery.start_soon(self._follow, led)
        return led

    def _current(self, led: _Led) -> bool:
        """Whether ``led`` still describes a compacted group led here (else it is dropped)."""
        replica = led.replica
        if (
            not led.done
            and self._groups().get(replica.id) is replica
            and replica.role is Role.LEADER
            and replica.corrupt is None
            and replica.log.log_end_offset >= led.index.next_offset
            and self._compacted(replica.id)
        ):
            return True
        self._drop(led)
        return False

    def _drop(self, led: _Led) -> None:
        led.done = True
        led.cancel.cancel()
        if self._led.get(led.replica.id) is led:
            del self._led[led.replica.id]
            log.debug("%s: key index dropped", led.replica.id)

    async def _follow(self, led: _Led) -> None:
        """(Re)build ``led``'s index from the log, then follow the commit index, a chunk at a
        time, until the group is no longer led here."""
        replica = led.replica
        with led.cancel:
            while self._current(led):
                changed = replica.changed  # taken before reading: a commit meanwhile wakes us
                try:
                    reached = catch_up(
                        led.index, replica.log, replica.commit_index + 1, _CHUNK_BYTES
                    )
                except CorruptLogError as exc:
                    replica.report_corruption(exc)
                    self._drop(led)
                    return
                if reached:
                    if not led.ready:
                        led.ready = True
                        log.info("%s: key index ready (%d keys)", replica.id, len(led.index))
                    with trio.move_on_after(_RECHECK_S):
                        await changed.wait()
                else:
                    await trio.lowlevel.checkpoint()

    async def lookup(self, replica: RaftReplica, key: bytes) -> Record | None:
        """The newest committed record of ``key`` in ``replica`` (led here), None if it has no
        value (never written, deleted by a tombstone, or by retention).

        Raises ``RequestError``: ``NOT_LEADER`` (this replica does not lead the group, or could
        not confirm that it still does), ``NOT_READY`` (the index is still being built, or is
        far behind: retry after a backoff), ``INTERNAL`` (corruption: this replica repairs).
        """
        try:
            await self._read_index(replica.id)
        except (NotLeader, CommitTimeout) as exc:
            raise RequestError(
                ErrorCode.NOT_LEADER, f"{replica.id}: this broker cannot confirm it leads ({exc})"
            ) from exc
        led = self._led.get(replica.id)
        if led is not None and (led.replica is not replica or not self._current(led)):
            led = None
        if led is None:
            if replica.role is not Role.LEADER:
                raise RequestError(ErrorCode.NOT_LEADER, f"{replica.id}: not the leader any more")
            self._asked.add(replica.id)
            self._start(replica)
            raise _not_ready(replica.id, "is being built (this broker just became the leader)")
        if not led.ready:
            raise _not_ready(replica.id, f"is being built ({led.index.next_offset} indexed)")
        end = replica.commit_index + 1
        try:
            if not catch_up(led.index, replica.log, end, _LOOKUP_CATCH_UP_BYTES):
                raise _not_ready(replica.id, "is catching up with a burst of writes")
            offset = led.index.offset_of(key)
            if offset is None:
                return None
            record = record_at(replica.log, offset, key, end)
        except CorruptLogError as exc:
            replica.report_corruption(exc)
            self._drop(led)
            raise RequestError(
                ErrorCode.INTERNAL,
                f"{replica.id}: corruption: {exc}; this replica is repairing its copy, retry",
            ) from exc
        if record is None:
            # Below the log start (retention ran since the catch-up) or gone from the log in a
            # way the index did not see: never guess. A fresh index answers the retry.
            if offset < replica.log.log_start_offset:
                led.index.forget_below(replica.log.log_start_offset)
                return None
            log.warning(
                "%s: key index disagrees with the log at %d; rebuilding", replica.id, offset
            )
            self._drop(led)
            raise _not_ready(replica.id, "is being rebuilt")
        return record


def _not_ready(log_id: str, what: str) -> RequestError:
    return RequestError(ErrorCode.NOT_READY, f"{log_id}: the key index {what}; retry")
