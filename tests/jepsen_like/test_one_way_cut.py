"""A follower its leader cannot hear (a one-way cut) still serves every acknowledged record.

The follower hears its leader, so its log and commit index stay current; nothing it sends
reaches the leader, so a read it forwards there is never answered, yet its connection looks up.
The read must then come from another replica (the third broker, or the follower's own copy),
and the reads after it must not wait for the silent leader again.

Three real brokers whose peer links run through ``ProxyLayer`` (the jepsen_like proxies).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
from kafkaesque.jepsen_like._cluster import JepsenCluster, NodeAddress, Placement, Question
from kafkaesque.jepsen_like._proxy import ProxyLayer

from kafkaesque.client import FetchResult
from kafkaesque.local_cluster import free_ports

pytestmark = pytest.mark.jepsen

NODES = 3
RECORDS = 50
# The leader's forward timeout for a read is its long-poll wait plus _READ_SLACK_S (1 s); any
# other answer is local to the follower or one hop to the third broker.
FORWARD_TIMEOUT_S = 5.0


@asynccontextmanager
async def _proxied_cluster(run_dir: Path) -> AsyncIterator[tuple[JepsenCluster, ProxyLayer]]:
    async with trio.open_nursery() as services:
        ports = free_ports(3 * NODES)
        placement = Placement(
            nodes={i: NodeAddress("127.0.0.1", *ports[3 * i : 3 * i + 3]) for i in range(NODES)}
        )
        proxies = ProxyLayer("127.0.0.1", seed=1)
        await proxies.link_all(services, placement, NODES)
        cluster = JepsenCluster(
            placement,
            os.path.join(run_dir, "data"),
            os.path.join(run_dir, "logs"),
            members=list(range(NODES)),
        )
        try:
            for node in range(NODES):
                cluster.start(node)
            await cluster.wait_ready()
            yield cluster, proxies
        finally:
            cluster.stop_all()
            services.cancel_scope.cancel()


async def _leader_of(cluster: JepsenCluster, topic: str) -> int:
    with trio.fail_after(30):
        while not (leaders := await cluster.leaders(topic)):
            await trio.sleep(0.2)
    return int(leaders[0])


def _values(fetched: FetchResult) -> list[str]:
    return [(r.value or b"").decode() for r in fetched.records]


def _fetch(offset: int, wait_ms: int) -> Question[FetchResult]:
    """``FETCH t 0 offset wait_ms=...`` (to the broker asked: it forwards to the leader)."""
    return lambda client: client.fetch("t", 0, offset, wait_ms=wait_ms)


async def test_a_follower_its_leader_cannot_hear_serves_every_acknowledged_record(
    tmp_path: Path,
) -> None:
    async with _proxied_cluster(tmp_path) as (cluster, proxies):
        await cluster.create_topic("t", 1, NODES)
        leader = await _leader_of(cluster, "t")
        follower, third = (n for n in range(NODES) if n != leader)
        proxies.cut(follower, leader)
        sent = [f"m{i}" for i in range(RECORDS)]
        for value in sent:
            await cluster.ask(third, _publish(value), timeout=30)  # acknowledged, or it raises

        # The first read waits for the leader in vain, then reads elsewhere.
        assert _values(await cluster.ask(follower, _fetch(0, 500), timeout=30)) == sent
        # The next ones pass the silent leader over.
        for _ in range(3):
            started = trio.current_time()
            fetched = await cluster.ask(follower, _fetch(0, 500), timeout=30)
            assert _values(fetched) == sent
            assert trio.current_time() - started < FORWARD_TIMEOUT_S, "waited for the leader"
        end = fetched.next_offset
        # A long-polling read at the follower gets a record published after it started.
        async with trio.open_nursery() as nursery:
            got: list[str] = []

            async def poll() -> None:
                got.extend(_values(await cluster.ask(follower, _fetch(end, 10000), timeout=30)))

            nursery.start_soon(poll)
            await trio.sleep(0.5)
            await cluster.ask(third, _publish("late"), timeout=30)
        assert got == ["late"]


def _publish(value: str) -> Question[tuple[int, int]]:
    """One record published through the broker asked (it forwards to the leader)."""
    return lambda client: client.publish("t", value.encode())
