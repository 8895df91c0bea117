"""The multi-raft driver over real loopback TCP: three brokers, three groups, one process.

A leader's broker is stopped abruptly (its tasks cancelled, its files left as a crash leaves
them); a new leader must commit within two election timeouts, and no committed entry may be lost.
"""

from __future__ import annotations

import time
from pathlib import Path

import trio

from kafkaesque.local_cluster import free_ports
from kafkaesque.raft import Role
from kafkaesque.raft.driver import MultiRaft, PeerTransport
from kafkaesque.storage import Record, build_batch

GROUPS = ["t/0", "t/1", "t/2"]
ELECTION_TIMEOUT_TICKS = 20  # the upper end of the randomized timeout (2 x election_tick)


class Broker:
    def __init__(self, node_id: int, root: Path, peers: dict[int, tuple[str, int]]) -> None:
        self.id = node_id
        self.port = peers[node_id][1]
        self.raft = MultiRaft(node_id, self._send, state_dir=str(root / f"b{node_id}"), peers=peers)
        self.transport = PeerTransport(
            node_id,
            peers,
            cluster="t",
            secret=b"s",
            on_items=self.raft.handle_items,
            on_peer_change=self.raft.peer_changed,
        )
        for g in GROUPS:
            self.raft.add_replica(g, str(root / f"b{node_id}" / g.replace("/", "-")), peers)
        self.scope = trio.CancelScope()

    def _send(self, peer: int, item: object) -> bool:
        return self.transport.send(peer, item)

    async def run(self) -> None:
        with self.scope:
            async with trio.open_nursery() as nursery:
                await nursery.start(self.transport.run, "127.0.0.1", self.port)
                await nursery.start(self.raft.run)

    def committed_values(self, replica: str) -> list[bytes]:
        return [r.value or b"" for r in self.raft.replicas[replica].committed_records()]


async def _leader(brokers: list[Broker], replica: str, alive: set[int]) -> Broker:
    with trio.fail_after(10):
        while True:
            leaders = [
                b for b in brokers if b.id in alive and b.raft.replicas[replica].role is Role.LEADER
            ]
            if len(leaders) == 1:
                return leaders[0]
            await trio.sleep(0.02)


async def _propose_until_committed(
    brokers: list[Broker], replica: str, alive: set[int], value: bytes
) -> None:
    while True:
        leader = await _leader(brokers, replica, alive)
        try:
            await leader.raft.propose(replica, build_batch([Record(value=value)]), 1, timeout=2)
            return
        except Exception:  # noqa: BLE001 - NotLeader, lost or timed out: find the leader again
            await trio.sleep(0.02)


async def test_three_groups_replicate_and_survive_the_loss_of_a_leader(tmp_path: Path) -> None:
    ports = free_ports(3)
    peers = {i: ("127.0.0.1", ports[i]) for i in range(3)}
    brokers = [Broker(i, tmp_path, peers) for i in range(3)]
    alive = {0, 1, 2}
    async with trio.open_nursery() as nursery:
        for b in brokers:
            nursery.start_soon(b.run)
        for g in GROUPS:
            for i in range(5):
                await _propose_until_committed(brokers, g, alive, b"%s-%d" % (g.encode(), i))
        # Every broker ends up with every committed entry of every group.
        with trio.fail_after(5):
            while not all(
                b.committed_values(g) == [b"%s-%d" % (g.encode(), i) for i in range(5)]
                for b in brokers
                for g in GROUPS
            ):
                await trio.sleep(0.02)

        # Let the groups go quiet (quiescence), then stop the leader of t/0 abruptly.
        await trio.sleep(0.5)
        victim = await _leader(brokers, "t/0", alive)
        victim.scope.cancel()
        alive.discard(victim.id)
        # Measured in Raft ticks of a survivor, not seconds: a busy machine delays ticks, and
        # the bound is a property of the protocol (detection plus one election).
        witness = next(b for b in brokers if b.id in alive)
        stopped, ticks = time.monotonic(), witness.raft.ticks
        await _propose_until_committed(brokers, "t/0", alive, b"after")
        elapsed = witness.raft.ticks - ticks
        print(f"failover {time.monotonic() - stopped:.3f} s, {elapsed} ticks")
        assert elapsed <= 2 * ELECTION_TIMEOUT_TICKS, f"failover took {elapsed} ticks"
        # No committed entry was lost: every survivor converges on the whole history.
        want = [b"t/0-%d" % i for i in range(5)] + [b"after"]
        with trio.fail_after(5):
            while any(b.committed_values("t/0") != want for b in brokers if b.id in alive):
                await trio.sleep(0.02)
        nursery.cancel_scope.cancel()
    for b in brokers:
        if b.id in alive:
            b.raft.close()
