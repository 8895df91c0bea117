"""A paused leader (SIGSTOP) of quiesced groups is replaced within two election timeouts.

A paused broker keeps its TCP connections open (the kernel still ACKs) but reads and sends
nothing: no connection closes, so the only news is silence. Quiesced groups send no heartbeats
and their followers do not tick; what still runs is the driver's per-tick ping between brokers
(the coalesced node heartbeat). Issue 23: two of six quiesced partitions of a paused broker were
measured waiting for the pause to end.

Three ``MultiRaft`` instances pass their transport items by hand and are ticked by hand, so
the bound is counted in ticks, deterministically (one seed, one run). The paused broker is
neither ticked nor handed anything; what was sent to it waits, as in its socket buffer, and is
delivered when it resumes.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from kafkaesque.raft import Role
from kafkaesque.raft.driver import MultiRaft
from kafkaesque.storage import Record, build_batch

GROUPS = ["p/0", "p/1", "p/2"]
ELECTION_TICK = 10  # RaftConfig's default: campaigns after [10, 20) ticks


class Cluster:
    """Brokers whose sends go to a queue; a paused broker's mail waits until it resumes."""

    def __init__(self, root: Path, n: int, seed: int) -> None:
        self.queue: list[tuple[int, int, Any]] = []
        self.held: list[tuple[int, int, Any]] = []  # for the paused broker, in order
        self.paused: int | None = None
        self.brokers = [
            MultiRaft(
                i,
                self._sender(i),
                state_dir=str(root / f"s{i}"),
                peers=range(n),
                rng=random.Random(seed * 31 + i),
            )
            for i in range(n)
        ]
        for b in self.brokers:
            for g in GROUPS:
                b.add_replica(g, str(root / f"b{b.node_id}" / g.replace("/", "-")), range(n))

    def _sender(self, src: int) -> Any:
        def send(dst: int, item: Any) -> bool:
            self.queue.append((src, dst, item))
            return True

        return send

    def running(self) -> list[MultiRaft]:
        return [b for b in self.brokers if b.node_id != self.paused]

    async def settle(self, rounds: int = 60) -> None:
        """Process and deliver until quiet among the running brokers."""
        for _ in range(rounds):
            for b in self.running():
                await b._process()
            if not self.queue and not any(b._dirty for b in self.running()):
                return
            queue, self.queue = self.queue, []
            for src, dst, item in queue:
                if self.paused in (src, dst):
                    self.held.append((src, dst, item))
                else:
                    self.brokers[dst].handle_items(src, [item])
        raise AssertionError("the brokers did not settle")

    async def tick(self) -> None:
        for b in self.running():
            b.tick()
        await self.settle()

    def leaders(self, replica: str) -> list[int]:
        return [b.node_id for b in self.running() if b.replicas[replica].role is Role.LEADER]

    async def resume(self) -> None:
        """The paused broker reads what waited in its socket, then runs on."""
        self.paused = None
        held, self.held = self.held, []
        for src, dst, item in held:
            if dst != src:
                self.brokers[dst].handle_items(src, [item])
        await self.settle()


async def _quiet_cluster(tmp_path: Path, seed: int) -> Cluster:
    """Every group elected, written once, and quiesced on every broker."""
    cluster = Cluster(tmp_path, 3, seed)
    await cluster.settle()
    for _ in range(3 * ELECTION_TICK):
        if all(len(cluster.leaders(g)) == 1 for g in GROUPS):
            break
        await cluster.tick()
    for g in GROUPS:
        (leader,) = cluster.leaders(g)
        cluster.brokers[leader].propose_nowait(g, build_batch([Record(value=b"before")]), 1)
    await cluster.settle()
    for _ in range(10):
        await cluster.tick()
    assert all(replica.quiesced for b in cluster.brokers for replica in b.replicas.values())
    return cluster


@pytest.mark.parametrize("seed", range(8))
async def test_a_paused_leader_of_quiesced_groups_is_replaced_within_two_timeouts(
    tmp_path: Path, seed: int
) -> None:
    cluster = await _quiet_cluster(tmp_path, seed)
    victim = cluster.brokers[0]
    led = [g for g in GROUPS if victim.replicas[g].role is Role.LEADER]
    assert led, "broker 0 leads at least one group (the preferred-leader hash spreads them)"
    cluster.paused = victim.node_id
    replaced: dict[str, int] = {}
    for tick in range(1, 4 * ELECTION_TICK + 1):
        await cluster.tick()
        for g in led:
            if g not in replaced and cluster.leaders(g):
                replaced[g] = tick
        if len(replaced) == len(led):
            break
    # Detection of the silence (a few ticks of missing pings) is counted in the timeout, not
    # added to it: the group elects when a group that heard heartbeats stop would.
    assert replaced.keys() == set(led), f"never replaced: {set(led) - replaced.keys()}"
    assert max(replaced.values()) <= 2 * ELECTION_TICK, replaced

    # The new leaders take writes while the old one is paused.
    for g in led:
        (leader,) = cluster.leaders(g)
        cluster.brokers[leader].propose_nowait(g, build_batch([Record(value=b"during")]), 1)
    await cluster.settle()

    # Resumed, the old leader learns the higher term, steps down and catches up: no divergence.
    await cluster.resume()
    for _ in range(3 * ELECTION_TICK):
        await cluster.tick()
        if all(len(cluster.leaders(g)) == 1 for g in GROUPS) and all(
            len({b.replicas[g].commit_index for b in cluster.brokers}) == 1 for g in GROUPS
        ):
            break
    for g in led:
        assert victim.replicas[g].role is Role.FOLLOWER
        histories = {
            tuple(r.value for r in b.replicas[g].committed_records()) for b in cluster.brokers
        }
        assert histories == {(b"before", b"during")}, (g, histories)
    for b in cluster.brokers:
        b.close()
