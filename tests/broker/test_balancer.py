"""Leader balancing (issue 26): each broker gives the groups it leads back to their preferred
replicas, only to one that is a caught-up, live voter, at a limited rate, and never back and
forth. In one process with three drivers; with real processes after a rolling restart."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest
import trio

from bench.ops import PartitionProbes
from kafkaesque.broker import ConfigError, config_from_mapping
from kafkaesque.broker._balancer import (
    DEFAULT_LEADER_BALANCE_RATE,
    LeaderBalancer,
    TokenBucket,
    preferred_target,
)
from kafkaesque.client import Client
from kafkaesque.local_cluster import LocalCluster, free_ports
from kafkaesque.raft import Configuration, ProgressInfo, ProgressState, Role, Status

from ..raft.test_driver import GROUPS, Broker, _propose_until_committed
from .test_config import BASE


def _status(
    me: int,
    progress: dict[int, tuple[int, bool, bool]],
    voters: set[int],
    *,
    role: Role = Role.LEADER,
    commit: int = 10,
) -> Status:
    infos = {
        node: ProgressInfo(match, match + 1, ProgressState.REPLICATE, active, learner, 0)
        for node, (match, active, learner) in progress.items()
    }
    return Status(
        me, 3, me, role, me, commit, commit, 0, 12, Configuration(frozenset(voters)), None, infos
    )


def test_a_group_moves_only_to_a_live_caught_up_preferred_voter() -> None:
    ok = _status(0, {0: (12, True, False), 1: (10, True, False), 2: (4, True, False)}, {0, 1, 2})
    assert preferred_target(ok, 1, {1, 2}) == 1  # holds everything committed (10)
    assert preferred_target(ok, 2, {1, 2}) is None  # behind the commit
    assert preferred_target(ok, 1, {2}) is None  # not connected
    assert preferred_target(ok, 0, {1, 2}) is None  # already led by its preferred replica
    quiet = _status(0, {0: (12, True, False), 1: (10, False, False)}, {0, 1})
    assert preferred_target(quiet, 1, {1}) is None  # not heard from lately
    learner = _status(0, {0: (12, True, False), 1: (10, True, True)}, {0})
    assert preferred_target(learner, 1, {1}) is None  # a learner, not a voter
    follower = _status(0, {}, {0, 1}, role=Role.FOLLOWER)
    assert preferred_target(follower, 1, {1}) is None  # only a leader moves its group


def test_the_token_bucket_limits_the_rate_and_the_burst() -> None:
    bucket = TokenBucket(rate=10.0, capacity=2.0)
    bucket.refill(0.0)
    assert not bucket.take()  # starts empty
    bucket.refill(0.15)
    assert bucket.take() and not bucket.take()  # 1.5 tokens
    bucket.refill(10.0)  # a long idle time saves up only the capacity
    assert [bucket.take() for _ in range(3)] == [True, True, False]


async def test_every_group_goes_back_to_its_preferred_replica_and_stays(tmp_path: Path) -> None:
    ports = free_ports(3)
    peers = {i: ("127.0.0.1", ports[i]) for i in range(3)}
    brokers = [Broker(i, tmp_path, peers) for i in range(3)]
    alive = {0, 1, 2}
    preferred = {g: i for i, g in enumerate(GROUPS)}  # t/0 -> 0, t/1 -> 1, t/2 -> 2
    balancers = [
        LeaderBalancer(b.raft, preferred.get, b.transport.connected_peers, rate=100.0, hold_s=0.5)
        for b in brokers
    ]
    async with trio.open_nursery() as nursery:
        for b in brokers:
            nursery.start_soon(b.run)
        for g in GROUPS:
            await _propose_until_committed(brokers, g, alive, b"before")

        def leaders() -> dict[str, int | None]:
            return {
                g: next((b.id for b in brokers if b.raft.replicas[g].role is Role.LEADER), None)
                for g in GROUPS
            }

        # Broker 0 takes every group (as if the others had restarted).
        for g in GROUPS:
            with trio.fail_after(10):
                while leaders()[g] != 0:
                    leader = leaders()[g]
                    if leader is not None:
                        brokers[leader].raft.transfer_leadership(g, 0)
                    await trio.sleep(0.05)
        assert leaders() == {g: 0 for g in GROUPS}
        for balancer in balancers:
            nursery.start_soon(balancer.run)
        with trio.fail_after(15):
            while leaders() != preferred:
                await trio.sleep(0.02)
        # Settled: nobody moves anything any more (no fight), and the groups take writes.
        moved = sum(b.transfers for b in balancers)
        # Only broker 0 gave anything away: two groups (asked again only if one was slow).
        assert balancers[0].transfers >= 2 and moved == balancers[0].transfers
        await trio.sleep(1.5)
        assert leaders() == preferred and sum(b.transfers for b in balancers) == moved
        for g in GROUPS:
            await _propose_until_committed(brokers, g, alive, b"after")
        nursery.cancel_scope.cancel()
    for b in brokers:
        b.raft.close()


async def test_a_stopped_balancer_or_a_zero_rate_moves_nothing(tmp_path: Path) -> None:
    ports = free_ports(3)
    peers = {i: ("127.0.0.1", ports[i]) for i in range(3)}
    brokers = [Broker(i, tmp_path, peers) for i in range(3)]
    away = {g: 9 for g in GROUPS}  # preferred replicas that are not voters
    async with trio.open_nursery() as nursery:
        for b in brokers:
            nursery.start_soon(b.run)
        for g in GROUPS:
            await _propose_until_committed(brokers, g, {0, 1, 2}, b"x")
        everyone = {g: (brokers[0].id + 1) % 3 for g in GROUPS}
        idle = LeaderBalancer(brokers[0].raft, everyone.get, lambda: {1, 2}, rate=0.0, hold_s=0)
        stopped = LeaderBalancer(brokers[0].raft, everyone.get, lambda: {1, 2}, hold_s=0)
        stopped.stop()
        absent = LeaderBalancer(brokers[0].raft, away.get, lambda: {1, 2, 9}, hold_s=0)
        with trio.move_on_after(1.0):
            async with trio.open_nursery() as inner:
                for balancer in (idle, stopped, absent):
                    inner.start_soon(balancer.run)
        assert (idle.transfers, stopped.transfers, absent.transfers) == (0, 0, 0)
        nursery.cancel_scope.cancel()
    for b in brokers:
        b.raft.close()


# -- real processes -----------------------------------------------------------------------------


def _leader_counts(client: Client, topic: str) -> Counter[int | None]:
    rows = client.refresh_metadata().partitions[topic]
    return Counter(row.leader for row in rows)


def test_leaders_spread_evenly_again_after_a_rolling_restart_without_client_errors(
    tmp_path: Path,
) -> None:
    with LocalCluster(str(tmp_path), 3) as cluster:
        with Client(cluster.bootstrap) as client:
            client.create_topic("spread", 6, 3)
            deadline = time.monotonic() + 30
            while _leader_counts(client, "spread") != {0: 2, 1: 2, 2: 2}:
                assert time.monotonic() < deadline, _leader_counts(client, "spread")
                time.sleep(0.1)
        with PartitionProbes(cluster.bootstrap, "spread", 6, pause_s=0.01) as probes:
            cluster.restart_rolling(timeout=60)
            with Client(cluster.bootstrap) as client:
                # The last broker restarted led nothing when it came back: it gets its two back.
                deadline = time.monotonic() + 40
                while (counts := _leader_counts(client, "spread")) != {0: 2, 1: 2, 2: 2}:
                    assert time.monotonic() < deadline, f"leaders stayed uneven: {counts}"
                    time.sleep(0.2)
                took = 40 - (deadline - time.monotonic())
            print(f"even again {took:.1f} s after the rolling restart")
            time.sleep(0.5)
        assert probes.errors == []
        assert probes.verify() == (0, 0)  # (lost, read twice)


@pytest.mark.parametrize("rate", [-1, "fast", float("nan")])
def test_a_leader_balance_rate_must_be_a_number_at_least_zero(rate: object) -> None:
    with pytest.raises(ConfigError, match="leader_balance_rate must be a number >= 0"):
        config_from_mapping({**BASE, "leader_balance_rate": rate})
    assert config_from_mapping({**BASE, "leader_balance_rate": 0}).leader_balance_rate == 0
    assert config_from_mapping(BASE).leader_balance_rate == DEFAULT_LEADER_BALANCE_RATE
