"""The simulator against the real core (no planted bugs): 3 and 5 voters, hypothesis schedules."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

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
