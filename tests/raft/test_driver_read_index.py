"""``MultiRaft.read_index`` over real loopback TCP: a leader confirms a read point with a
heartbeat round answered by a majority; a leader cut off from the others cannot, so a stale
leader never serves a read (found by jepsen_like: a deposed group coordinator answered OFFSETS
with an offset older than one committed through its successor).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from kafkaesque.local_cluster import free_ports
from kafkaesque.raft import NotLeader
from kafkaesque.raft.driver import CommitTimeout

from .test_driver import Broker, _leader, _propose_until_committed


async def test_a_leader_answers_a_read_point_at_or_past_every_acknowledged_write(
    tmp_path: Path,
) -> None:
    ports = free_ports(3)
    peers = {i: ("127.0.0.1", ports[i]) for i in range(3)}
    brokers = [Broker(i, tmp_path, peers) for i in range(3)]
    alive = {0, 1, 2}
    async with trio.open_nursery() as nursery:
        for b in brokers:
            nursery.start_soon(b.run)
        for i in range(3):
            await _propose_until_committed(brokers, "t/0", alive, b"v%d" % i)
        leader = await _leader(brokers, "t/0", alive)
        last = leader.raft.replicas["t/0"].commit_index
        assert await leader.raft.read_index("t/0", timeout=5) >= last
        await trio.sleep(0.5)  # the group goes quiet: a read wakes it up
        assert await leader.raft.read_index("t/0", timeout=5) >= last
        follower = next(b for b in brokers if b is not leader)
        with pytest.raises(NotLeader):
            await follower.raft.read_index("t/0")

        # Cut the leader off (its peers stop: no heartbeat is answered): no read point.
        for b in brokers:
            if b is not leader:
                b.scope.cancel()
        with pytest.raises((CommitTimeout, NotLeader)):
            await leader.raft.read_index("t/0", timeout=1.5)
        nursery.cancel_scope.cancel()
    for b in brokers:
        b.raft.close()
