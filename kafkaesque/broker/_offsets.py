"""Committed consumer-group offsets, kept in the internal topic ``__consumer_offsets``.

As Kafka and Redpanda keep them: a group's commits are records of one partition of a compacted
internal topic replicated by our own Raft (``partition_for_key(group)``), keyed by
``[group, topic, partition]`` with the offset as value, so the latest commit of each key wins
and compaction can drop the rest. COMMIT appends through the ordinary write path (any broker,
forwarded to the leader) and is acknowledged once the quorum has it.

OFFSETS is answered by the leader of the group's partition (forwarded there when needed) from a
table it builds by reading its committed log from where it stopped last time. Only the leader
answers, and only once it has committed an entry of its own term, so an acknowledged COMMIT is
always visible to the OFFSETS that follows it, whichever broker each went to.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgpack
import trio

from kafkaesque.protocol import (
    INTERNAL_TOPIC_PREFIX,
    Acks,
    Commit,
    EndReply,
    ErrorCode,
    FetchOffsets,
    OffsetRow,
    OkReply,
    Reply,
    encode_reply,
    partition_for_key,
)
from kafkaesque.raft import Role
from kafkaesque.storage import BatchType, Record, decode_records, iter_batches

from ._errors import RequestError
from ._metadata import TopicConfig, TopicExistsError, TopicInfo
from ._reads import read_committed

if TYPE_CHECKING:
    from ._broker import Broker

OFFSETS_TOPIC = INTERNAL_TOPIC_PREFIX + "consumer_offsets"
OFFSETS_PARTITIONS = 8
_READ_BYTES = 1 << 20
_LEADER_READY_POLL_S = 0.01

_Key = tuple[str, str, int]


@dataclass
class _Table:
    """The latest commit of every key of one offsets partition, read up to ``next_offset``."""

    next_offset: int = 0
    offsets: dict[_Key, int] = field(default_factory=dict)


class OffsetStore:
    """COMMIT and OFFSETS of one broker (see the module docstring)."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self._tables: dict[int, _Table] = {}
        self._lock = trio.Lock()  # one reader of the log at a time per broker

    async def execute(self, command: Commit | FetchOffsets, forwarded: bool) -> bytes:
        topic = self._broker.metadata.view.topics.get(command.topic)
        if topic is None:
            raise RequestError(ErrorCode.UNKNOWN_TOPIC, f"no topic {command.topic!r}")
        internal = await self._internal_topic()
        partition = partition_for_key(command.group.encode(), internal.config.partitions)
        if isinstance(command, Commit):
            return await self._commit(command, topic, partition)
        leader = self._broker.writes.leader_of(_group_id(partition))
        if leader != self._broker.config.id:
            if forwarded or leader is None:
                raise RequestError(
                    ErrorCode.NOT_LEADER,
                    f"{OFFSETS_TOPIC}/{partition} has no leader here; retry",
                )
            return await self._broker.forward_to(leader, command)
        offsets = await self._read(partition)
        rows: list[Reply] = [
            OffsetRow(command.topic, p, offsets.get((command.group, command.topic, p)))
            for p in range(topic.config.partitions)
        ]
        return b"".join(encode_reply(r) for r in [*rows, EndReply()])

    async def _commit(self, command: Commit, topic: TopicInfo, partition: int) -> bytes:
        if command.partition >= topic.config.partitions:
            raise RequestError(
                ErrorCode.UNKNOWN_PARTITION,
                f"{command.topic} has partitions 0..{topic.config.partitions - 1}",
            )
        record = Record(
            key=msgpack.packb([command.group, command.topic, command.partition]),
            value=msgpack.packb(command.offset),
        )
        flight, _ = self._broker.appender(OFFSETS_TOPIC, partition, Acks.QUORUM).add(record)
        await flight.done.wait()
        if flight.error is not None:
            raise flight.error
        return encode_reply(OkReply())

    async def _internal_topic(self) -> TopicInfo:
        view = self._broker.metadata.view
        info = view.topics.get(OFFSETS_TOPIC)
        if info is not None:
            return info
        config = TopicConfig(
            partitions=OFFSETS_PARTITIONS,
            replication_factor=min(3, max(1, len(view.brokers))),
            retention_ms=None,
            compact=True,
        )
        try:
            info = await self._broker.metadata.create_topic(OFFSETS_TOPIC, config)
        except TopicExistsError:  # another broker created it with its own view of the brokers
            info = self._broker.metadata.view.topics[OFFSETS_TOPIC]
        await self._broker.wait_for_leaders(info)
        return info

    async def _read(self, partition: int) -> dict[_Key, int]:
        """The table of ``partition``, caught up with everything committed (we lead it)."""
        group = self._broker.local_group(OFFSETS_TOPIC, partition)
        if group is None:
            raise RequestError(ErrorCode.NOT_LEADER, "no replica of the offsets partition here")
        deadline = trio.current_time() + self._broker.config.write_timeout_s
        # A new leader knows everything committed only once an entry of its term commits.
        while group.log.term_at(group.commit_index) != group.node.term:
            if group.role is not Role.LEADER or trio.current_time() > deadline:
                raise RequestError(ErrorCode.NOT_LEADER, "leadership of offsets moved; retry")
            await trio.sleep(_LEADER_READY_POLL_S)
        async with self._lock:
            table = self._tables.setdefault(partition, _Table())
            if table.next_offset < group.log.log_start_offset:
                table = self._tables[partition] = _Table(group.log.log_start_offset)
            while table.next_offset <= group.commit_index:
                fetched = read_committed(group, table.next_offset, _READ_BYTES)
                if not fetched.data:
                    break
                _apply(table, fetched.data)
                table.next_offset = fetched.next_offset
            return table.offsets


def _apply(table: _Table, data: bytes | memoryview) -> None:
    pos = 0
    for header in iter_batches(data, verify=False):
        batch = data[pos : pos + header.size]
        pos += header.size
        if header.batch_type is not BatchType.DATA:
            continue
        for record in decode_records(batch, header):
            if record.offset < table.next_offset or record.key is None:
                continue
            group, topic, partition = msgpack.unpackb(record.key)
            table.offsets[(group, topic, partition)] = msgpack.unpackb(record.value)


def _group_id(partition: int) -> str:
    return f"{OFFSETS_TOPIC}/{partition}"
