"""Each partition's log bounds (start and high watermark), asked of its leader where need be.

``DESCRIBE`` answered by a broker that holds no replica of a partition leaves that partition's
start and end out of its row; ``partition_offsets`` asks those of the partition's leader, so a
reader planning by offset (the Spark source's driver) gets every partition's bounds.
"""

from __future__ import annotations

from kafkaesque.protocol import DescribeTopic, ErrorCode, ErrorReply, PartitionRow

from . import _calls as calls
from . import _steps as steps
from ._calls import Call, Pinned
from ._errors import KafkaesqueError
from ._metadata import Address
from ._wire import ListResponse, Response


def partition_offsets(
    state: steps.ClusterState, config: steps.ClientConfig, topic: str
) -> steps.Steps[dict[int, tuple[int, int]]]:
    """Partition → ``(start, end)`` of ``topic`` (see ``Client.partition_offsets``): one
    ``DESCRIBE``, then, for the partitions its rows leave unbounded, a metadata refresh and one
    ``DESCRIBE`` of each such partition's leader. ``UNKNOWN_TOPIC``; ``NOT_LEADER`` for such a
    partition without a leader right now (an election)."""
    description = yield from steps.run_call(state, config, calls.describe_topic(topic))
    rows = {row.partition: row for row in description.partitions}
    unbounded = [row for row in rows.values() if row.start_offset is None or row.end_offset is None]
    if unbounded:
        snapshot = yield from steps.run_call(state, config, calls.metadata((topic,)))
        state.update_metadata(snapshot, (topic,))
        brokers = state.metadata.brokers
        for row in unbounded:
            leader = brokers.get(row.leader) if row.leader is not None else None
            if leader is None:
                raise KafkaesqueError(
                    ErrorCode.NOT_LEADER, f"{topic}/{row.partition} has no leader right now"
                )
            call = _describe_at((leader.host, leader.port), row)
            rows[row.partition] = yield from steps.run_call(state, config, call)
    bounds = {}
    for partition, row in rows.items():
        assert row.start_offset is not None and row.end_offset is not None
        bounds[partition] = (row.start_offset, row.end_offset)
    return bounds


def _describe_at(address: Address, row: PartitionRow) -> Call[PartitionRow]:
    """``row`` as the broker at ``address`` (a replica) describes it, with start and end."""

    def parse(response: Response) -> PartitionRow:
        if isinstance(response, ErrorReply):
            raise KafkaesqueError.from_reply(response)
        rows = response.rows if isinstance(response, ListResponse) else ()
        for got in rows:
            if not isinstance(got, PartitionRow) or got.partition != row.partition:
                continue
            if got.start_offset is not None and got.end_offset is not None:
                return got
        raise KafkaesqueError(
            ErrorCode.NOT_LEADER,
            f"{row.topic}/{row.partition}: the leader reported no offsets",
        )

    return Call(DescribeTopic(row.topic), parse, Pinned(address))
