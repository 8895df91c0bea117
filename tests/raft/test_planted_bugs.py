"""The simulator finds three classic Raft bugs when they are planted (and only then).

Each bug is switched on through ``RaftConfig.testing_bugs`` (default: none). The search uses the
simulator's settings (``SIM_SETTINGS``) with a hunting budget of 400 examples instead of 100:
run alone, every bug is found within 11 examples, but Hypothesis mixes literal constants of
every imported local module into its generation, so in the full suite the same derandomized
search differs, and the Figure-8 bug on 5 voters took 153 examples. The default run skips
hypothesis' shrinking to stay fast; the slow run shrinks and prints the minimal trace.
"""

from __future__ import annotations

import time

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from kafkaesque.raft import (
    BUG_COMMIT_OLD_TERM,
    BUG_FORGET_VOTE,
    BUG_VOTE_WITHOUT_LOG_CHECK,
    Role,
)

from .machine import SIM_SETTINGS, machine
from .safety import SafetyViolation
from .sim import Cluster, SimConfig

BUGS = [BUG_COMMIT_OLD_TERM, BUG_VOTE_WITHOUT_LOG_CHECK, BUG_FORGET_VOTE]
HUNT_EXAMPLES = 400
NO_SHRINK = settings(
    SIM_SETTINGS,
    max_examples=HUNT_EXAMPLES,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)


@pytest.mark.parametrize("voters", [3, 5])
@pytest.mark.parametrize("bug", BUGS)
def test_simulator_finds_planted_bug(bug: str, voters: int) -> None:
    cls = machine(voters, frozenset({bug}))
    start = time.monotonic()
    with pytest.raises(SafetyViolation) as found:
        run_state_machine_as_test(cls, settings=NO_SHRINK)
    assert cls.stats.first_failure is not None
    examples, actions, sim_steps, _ = cls.stats.first_failure
    print(
        f"\n{bug} ({voters} voters): found after {examples} examples, {actions} actions, "
        f"{sim_steps} simulated steps, {time.monotonic() - start:.1f}s: "
        f"{str(found.value).splitlines()[0]}"
    )


@pytest.mark.slow
@pytest.mark.parametrize("bug", BUGS)
def test_simulator_shrinks_planted_bug_to_a_short_trace(bug: str) -> None:
    cls = machine(3, frozenset({bug}))
    with pytest.raises(SafetyViolation) as found:
        run_state_machine_as_test(cls, settings=SIM_SETTINGS)
    steps = "\n".join(getattr(found.value, "__notes__", []))  # hypothesis' shrunk action list
    print(f"\n{bug}: first found at {cls.stats.first_failure}\n{steps}\n{found.value}")


def _figure8(bugs: frozenset[str]) -> tuple[Cluster, int]:
    """Figure 8 scripted: A (term 1) appends entries nobody else has and is cut off; B wins term 2
    and is cut off before its no-op spreads; A wins term 3 with C, replicates one old entry per
    message, is cut off right after its commit moves; then B runs again."""
    cluster = Cluster(SimConfig(voters=3, spares=0, max_msg_bytes=0, tick_every=1, bugs=bugs), 1)

    def until(done: object, limit: int = 2000) -> None:
        for _ in range(limit):
            cluster.step()
            if callable(done) and done():
                return
        raise AssertionError("scenario stalled")

    def leader_is(pick: object, commit: int = -1) -> bool:
        leader = cluster.leader()
        return (
            leader is not None
            and leader.core is not None
            and callable(pick)
            and pick(leader.id)
            and leader.core.commit >= commit
        )

    until(lambda: leader_is(lambda _: True, 0))
    a = cluster.leader().id  # type: ignore[union-attr]
    cluster.partition({a})
    cluster.propose(a)
    cluster.propose(a)
    until(lambda: leader_is(lambda i: i != a))
    b = cluster.leader().id  # type: ignore[union-attr]
    cluster.partition({b})
    until(lambda: leader_is(lambda i: i == a, 1))
    cluster.partition({a})
    until(
        lambda: any(
            n.core is not None and n.core.role is Role.LEADER and n.core.term > 3
            for n in cluster.nodes.values()
        )
    )
    return cluster, b


def test_figure8_scripted_is_caught_only_with_the_bug() -> None:
    with pytest.raises(SafetyViolation, match="leader completeness"):
        _figure8(frozenset({BUG_COMMIT_OLD_TERM}))
    cluster, b = _figure8(frozenset())
    # The correct core commits A's entries only with its term-3 no-op, which C then holds, so C
    # (never B, which lacks them) leads the next term.
    leader = cluster.leader()
    assert leader is not None and leader.id != b
