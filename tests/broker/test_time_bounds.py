"""``DESCRIBE time=`` inside a broker: a leader answers a peer's ``BoundsRequest`` with the offset
for the time from its committed log, and a broker asks the leader of each group it does not lead.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kafkaesque.protocol import (
    Bounds,
    BoundsRequest,
    PeerCall,
    PeerReply,
    peer_from_wire,
    peer_to_wire,
)
from kafkaesque.raft import Role
from kafkaesque.storage import PartitionLog, Record, build_batch
from tests.broker.test_forwarding import Wire, _idle_broker


@dataclass
class FakeGroup:
    """What ``ReadPath.led_bounds`` reads of a Raft group: its role, log and commit index."""

    role: Role
    log: PartitionLog
    commit_index: int
    leader: int | None = 0


@pytest.fixture
def led_log(tmp_path: Path) -> Any:
    plog = PartitionLog.open(str(tmp_path / "log"))
    for ts in (1_000, 3_000, 2_000, 5_000):  # offsets 0..3
        plog.append(build_batch([Record(b"v", timestamp=ts)]), term=1)
    yield plog
    plog.close()


def test_a_leader_answers_the_offset_for_a_time_among_committed_records(
    tmp_path: Path, led_log: PartitionLog
) -> None:
    broker = _idle_broker(tmp_path / "broker")
    wire = Wire()
    broker.forwarder._send = wire.send
    # Committed up to offset 2: the record stamped 5,000 at offset 3 is not.
    broker.raft.replicas["t/0"] = FakeGroup(Role.LEADER, led_log, 2)  # type: ignore[assignment]
    broker.raft.replicas["t/1"] = FakeGroup(Role.FOLLOWER, led_log, 2)  # type: ignore[assignment]
    try:
        items = [
            peer_to_wire(PeerCall(5, BoundsRequest(("t/0", "t/1"), 2_500))),
            peer_to_wire(PeerCall(6, BoundsRequest(("t/0",), 4_000))),
            peer_to_wire(PeerCall(7, BoundsRequest(("t/0",)))),
        ]
        broker._on_items(1, items)
        answers = [peer_from_wire(item) for _, item in wire.sent]
        assert answers == [
            PeerReply(5, Bounds(((0, 3, 1), None))),  # 3,000 at offset 1; t/1 is not led here
            PeerReply(6, Bounds(((0, 3, 3),))),  # none committed: the high watermark
            PeerReply(7, Bounds(((0, 3),))),
        ]
    finally:
        broker.raft.replicas.clear()  # fakes: nothing of theirs to close
        broker.raft.close()


async def test_a_broker_asks_the_leader_for_the_groups_it_does_not_lead(
    tmp_path: Path, led_log: PartitionLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = _idle_broker(tmp_path / "broker")
    broker.raft.replicas["t/0"] = FakeGroup(Role.LEADER, led_log, 3)  # type: ignore[assignment]
    asked: list[tuple[int, Any]] = []

    async def call(peer: int, request: Any, *, deadline: float) -> Any:
        asked.append((peer, request))
        return Bounds(((7, 9, 8), (0, 1)))  # the second lacks the offset: left out

    monkeypatch.setattr(broker.forwarder, "call", call)
    monkeypatch.setattr(broker.writes, "leader_of", lambda log_id: 1)
    try:
        found = await broker.reads.leader_bounds(["t/0", "t/1", "t/2"], time_ms=2_500)
        assert asked == [(1, BoundsRequest(("t/1", "t/2"), 2_500))]
        assert found == {"t/0": (0, 4, 1), "t/1": (7, 9, 8)}
    finally:
        broker.raft.replicas.clear()  # fakes: nothing of theirs to close
        broker.raft.close()
