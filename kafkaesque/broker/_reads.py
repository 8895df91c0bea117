"""Reading committed data from a local replica: the FETCH and CONS paths.

Any replica may serve a read, the leader or a follower: each only ever returns batches wholly
below its own commit index (what it knows committed), so a consumer never sees a write that
could still be lost; a follower may merely be a moment behind the leader. Batches are returned
as stored (the consumer decodes them); the text forms decode them here for people.
"""

from __future__ import annotations

from typing import NamedTuple

import trio

from kafkaesque.protocol import ErrorCode, MessageRow
from kafkaesque.raft import Role
from kafkaesque.raft.driver import RaftReplica
from kafkaesque.storage import (
    CorruptLogError,
    OffsetOutOfRangeError,
    data_records,
    end_offset,
)

from ._errors import RequestError

DEFAULT_FETCH_BYTES = 1 << 20
DEFAULT_CONS_MESSAGES = 1000  # records a CONS returns when it names no max


class Fetched(NamedTuple):
    data: bytes | memoryview  # whole batches; the first may start before the offset asked for
    next_offset: int
    high_watermark: int  # the commit index + 1: everything below it is committed


def read_committed(replica: RaftReplica, offset: int, max_bytes: int) -> Fetched:
    """Committed batches of ``replica`` from ``offset`` (``RequestError`` when out of range).

    A follower's out of range may only mean it is behind: ``beyond_follower`` tells the caller
    to ask the leader instead.
    """
    log = replica.log
    hw = replica.commit_index + 1
    start, end = log.log_start_offset, log.log_end_offset
    if offset < start or offset > end:
        raise RequestError(
            ErrorCode.OFFSET_OUT_OF_RANGE,
            f"offset {offset} is outside the log [{start}, {max(end, hw)}]",
        )
    if offset >= hw:
        return Fetched(b"", offset, hw)
    try:
        result = log.read(offset, max_bytes, max_offset=hw)
    except OffsetOutOfRangeError as exc:  # retention ran between the check and the read
        raise RequestError(ErrorCode.OFFSET_OUT_OF_RANGE, str(exc)) from exc
    except CorruptLogError as exc:
        # Never bad data, never a crash: this replica cuts its log before the bad batch and
        # re-replicates it from the leader; the consumer retries (here or at another replica).
        replica.report_corruption(exc)
        raise RequestError(
            ErrorCode.INTERNAL,
            f"{replica.id}: corruption: {exc}; this replica is repairing its copy, retry",
        ) from exc
    return Fetched(result.data, result.next_offset, hw)


def committed_offset_for_time(replica: RaftReplica, time_ms: int) -> int | None:
    """The earliest committed offset of this replica whose record timestamp is >= ``time_ms``
    (the high watermark if none is): ``DESCRIBE time=``. None if the lookup met corruption:
    the replica repairs its copy (as after a read) and the caller leaves the answer out."""
    try:
        return replica.log.offset_for_time(time_ms, max_offset=replica.commit_index + 1)
    except CorruptLogError as exc:
        replica.report_corruption(exc)
        return None


def beyond_follower(replica: RaftReplica, offset: int) -> bool:
    """Whether ``offset`` lies past the end of a follower (the leader may have it)."""
    return replica.role is not Role.LEADER and offset > replica.log.log_end_offset


async def fetch_committed(
    replica: RaftReplica, offset: int, max_bytes: int, wait_s: float
) -> Fetched:
    """``read_committed``, waiting up to ``wait_s`` for data when there is none yet."""
    deadline = trio.current_time() + wait_s
    while True:
        fetched = read_committed(replica, offset, max_bytes)
        if fetched.data or trio.current_time() >= deadline:
            return fetched
        with trio.move_on_at(deadline):
            await replica.changed.wait()


def message_rows(
    partition: int, fetched: Fetched, offset: int, limit: int
) -> tuple[list[MessageRow], int]:
    """The data records of ``fetched`` at or after ``offset`` (at most ``limit``) as rows.

    Returns the rows and the offset to read from next. Control batches (Raft no-ops and
    configuration changes) are skipped, so offsets in the rows may have gaps.
    """
    rows: list[MessageRow] = []
    next_offset = offset
    for record in data_records(fetched.data, offset, verify=False):  # verified on read
        if len(rows) >= limit:
            return rows, next_offset
        rows.append(MessageRow(partition, record.offset, record.key, record.value))
        next_offset = record.offset + 1
    end = end_offset(fetched.data)  # past trailing control batches too
    if end is not None:
        next_offset = max(next_offset, end)
    return rows, max(next_offset, min(fetched.next_offset, fetched.high_watermark))
