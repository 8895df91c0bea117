"""The simulator against the real core (no planted bugs): 3 and 5 voters, hypothesis schedules."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from kafkaesque.raft import Role

from .machine import SIM_SETTINGS, machine
from .sim import Cluster, SimConfig


def test_three_voters() -> None:
    run_state_machine_as_test(machine(3), settings=SIM_SETTINGS)


def test_five_voters() -> None:
    run_state_machine_as_test(machine(5), settings=SIM_SETTINGS)


@pytest.mark.slow
@pytest.mark.parametrize("voters", [3, 5])
def test_soak(voters: int) -> None:
    """Ten times the default budget, with fresh (non-derandomized) examples every run."""
    soak = settings(SIM_SETTINGS, max_examples=1000, derandomize=False)
    run_state_machine_as_test(machine(voters), settings=soak)


def test_same_seed_same_run() -> None:
    """Determinism (madsim's check): one seed and one schedule give one trace."""

    def trace(seed: int) -> list[tuple[int, str, object]]:
        cluster = Cluster(SimConfig(voters=3, sync_delay=0.5), seed)
        cluster.run(200)
        cluster.propose(1)
        cluster.propose(2)
        cluster.crash(1)
        cluster.run(200)
        cluster.check_liveness()
        return list(cluster.trace)

    assert trace(7) == trace(7)
    assert trace(7) != trace(8)


@pytest.mark.parametrize("seed", range(12))
def test_a_paused_leader_is_replaced_and_rejoins_without_divergence(seed: int) -> None:
    """Issue 23 in the simulator: SIGSTOP the leader (it neither ticks nor acts; what is sent to
    it waits and arrives, in order, when it resumes; no connection closes). The others elect a
    new leader within two election timeouts (four when a random tie splits the vote: the core
    alone has no tie-breaker; the driver's ``stand_first`` is checked in test_driver_pause), which
    commits while the old one sleeps; resumed, the old leader reads its stale mail, steps down
    and converges. The safety checker watches every event."""
    cluster = Cluster(SimConfig(voters=3, spares=0, sync_delay=0.3), seed)
    cluster.run(600, stop="leader")
    old = cluster.leader()
    assert old is not None and old.core is not None
    cluster.propose(old.id)
    cluster.run(40)
    cluster.pause(old.id)
    paused_at = cluster.now
    while (new := cluster.leader()) is None and cluster.now - paused_at < 200:
        cluster.step()
    assert new is not None and new.core is not None and new.id != old.id
    ticks = (cluster.now - paused_at) // cluster.config.tick_every
    assert ticks <= 4 * 10, ticks
    cluster.propose(new.id)
    cluster.run(40)
    assert old.core.role is Role.LEADER  # asleep, it still believes it leads
    cluster.resume(old.id)
    cluster.run(100)
    assert old.core.status().role is not Role.LEADER and old.core.term == new.core.term
    cluster.check_liveness()  # a proposal commits on every voter, the old leader included
