"""Quiescence in the simulator: the driver's pure policy (``QuiescencePolicy``) on simulated nodes.

Each simulated node runs the policy as the driver does (``SimConfig.quiesce``): pings every tick,
an idle leader quiesces its group and tells its followers, a quiesced node does not tick. The
invariants: a quiet group stays quiet (no heartbeats, no election) while its leader is alive
and heard; a proposal wakes it and commits; a silent leader's (partitioned, paused, killed)
group does not stay quiet: the others elect a new leader within about two election timeouts.
The safety checker watches every event.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import run_state_machine_as_test

from kafkaesque.raft import QuiescencePolicy, QuietState, Role

from .machine import SIM_SETTINGS, machine
from .sim import Cluster, SimConfig, SimNode

ELECTION_TICK = 10  # RaftConfig's default, which the simulator uses

CASES = settings(max_examples=25, deadline=None, derandomize=True, database=None)
SEEDS = st.integers(0, 2**32 - 1)


def _run_until(cluster: Cluster, done: Callable[[], bool], ticks: int) -> int:
    """Step until ``done()``; return the ticks it took (fails after ``ticks``)."""
    start = cluster.now
    while not done():
        assert cluster.now - start < ticks * cluster.config.tick_every, cluster.format_trace()
        cluster.step()
    return (cluster.now - start) // cluster.config.tick_every


def _all_quiet(cluster: Cluster) -> bool:
    return all(n.quiet.quiesced for n in cluster.live())


def _quiet_cluster(config: SimConfig, seed: int, proposals: int) -> tuple[Cluster, SimNode]:
    """A cluster whose group elected a leader, committed ``proposals`` values and went quiet
    (every node quiesced) within a bounded number of ticks."""
    cluster = Cluster(config, seed)
    cluster.run(600, stop="leader")
    leader = cluster.leader()
    assert leader is not None
    cluster.run(2 * config.tick_every)  # the new leader's first heartbeats, answered
    votes = cluster.votes_asked
    for _ in range(proposals):
        cluster.propose(leader.id)
        cluster.run(cluster.rng.randint(1, 10))
    _run_until(cluster, lambda: _all_quiet(cluster), ticks=8 * ELECTION_TICK)
    assert leader.core is not None and leader.core.role is Role.LEADER
    assert cluster.leader() is leader
    # Nobody campaigned (not even a pre-vote) on the way: a leader quiesces only once every
    # follower can, so no follower is left ticking, unheard, towards its election timeout.
    assert cluster.votes_asked == votes, cluster.format_trace()
    return cluster, leader


@settings(CASES)
@given(
    seed=SEEDS,
    voters=st.sampled_from([3, 5]),
    proposals=st.integers(0, 4),
    sync_delay=st.sampled_from([0.0, 0.3]),
)
def test_a_quiet_group_stays_quiet_while_its_leader_is_heard(
    seed: int, voters: int, proposals: int, sync_delay: float
) -> None:
    """Once quiet, the group sends no Raft message at all (only the per-node pings), no
    follower campaigns and nobody's term moves, for many election timeouts."""
    config = SimConfig(voters=voters, spares=0, sync_delay=sync_delay, quiesce=True)
    cluster, leader = _quiet_cluster(config, seed, proposals)
    terms = {n.id: n.core.term for n in cluster.live() if n.core is not None}
    sent = cluster.raft_messages
    cluster.run(30 * ELECTION_TICK * config.tick_every)
    assert cluster.raft_messages == sent, cluster.format_trace()  # no heartbeat, no campaign
    assert _all_quiet(cluster)
    assert {n.id: n.core.term for n in cluster.live() if n.core is not None} == terms
    assert cluster.leader() is leader


@settings(CASES)
@given(seed=SEEDS, voters=st.sampled_from([3, 5]), at_follower=st.booleans())
def test_a_proposal_wakes_a_quiet_group_and_commits_everywhere(
    seed: int, voters: int, at_follower: bool
) -> None:
    """A proposal at the quiet leader commits on every voter within a few ticks, and the group
    goes quiet again. A proposal refused by a follower wakes nothing."""
    cluster, leader = _quiet_cluster(SimConfig(voters=voters, spares=0, quiesce=True), seed, 0)
    assert leader.core is not None
    if at_follower:
        follower = next(n for n in cluster.live() if n is not leader)
        cluster.propose(follower.id)  # NotLeader: refused, the group stays quiet
        assert _all_quiet(cluster)
    cluster.propose(leader.id)
    index = leader.core.log.last_index()
    assert not leader.quiet.quiesced
    voters_ = [cluster.nodes[v] for v in leader.core.configuration.voters]
    ticks = _run_until(
        cluster,
        lambda: all(v.core is not None and v.core.commit >= index for v in voters_),
        ticks=ELECTION_TICK,
    )
    assert ticks <= 3
    _run_until(cluster, lambda: _all_quiet(cluster), ticks=4 * ELECTION_TICK)
    assert cluster.leader() is leader


@pytest.mark.parametrize("fault", ["partition", "pause", "crash"])
@settings(CASES)
@given(seed=SEEDS, voters=st.sampled_from([3, 5]))
def test_a_silent_leaders_quiet_group_elects_another_within_two_timeouts(
    fault: str, seed: int, voters: int
) -> None:
    """Cut the quiet leader off, SIGSTOP it or kill it: its followers do not stay quiet. They
    learn of the silence from the pings (or of the closed connection), wake, count the silence
    toward their election timeout and elect a new leader within two election timeouts; once
    the fault ends, a proposal commits on every voter."""
    cluster, old = _quiet_cluster(SimConfig(voters=voters, spares=0, quiesce=True), seed, 1)
    assert old.core is not None
    term = old.core.term
    if fault == "partition":
        cluster.partition({old.id})
    elif fault == "pause":
        cluster.pause(old.id)
    else:
        cluster.crash(old.id)

    def replaced() -> bool:
        new = cluster.leader()
        return new is not None and new is not old and new.core is not None and new.core.term > term

    ticks = _run_until(cluster, replaced, ticks=4 * ELECTION_TICK)
    assert ticks <= 2 * ELECTION_TICK, (ticks, cluster.format_trace())
    cluster.check_liveness()  # heals, resumes, restarts: the old leader rejoins and converges


@settings(CASES)
@given(seed=SEEDS, voters=st.sampled_from([3, 5]))
def test_a_quiet_leader_cut_off_from_its_followers_steps_down(seed: int, voters: int) -> None:
    """A quiesced leader does not tick; cut off from every follower it must still learn that
    it leads no majority (check-quorum), or it keeps telling every broker it leads. The silence
    wakes it, and it steps down within two election timeouts; healed, the group converges."""
    cluster, old = _quiet_cluster(SimConfig(voters=voters, spares=0, quiesce=True), seed, 1)
    assert old.core is not None
    cluster.partition({old.id})
    ticks = _run_until(
        cluster,
        lambda: old.core is not None and old.core.role is not Role.LEADER,
        ticks=4 * ELECTION_TICK,
    )
    assert ticks <= 2 * ELECTION_TICK, (ticks, cluster.format_trace())
    cluster.check_liveness()


def test_the_simulator_runs_quiescing_nodes_under_the_nemesis() -> None:
    """The hypothesis schedules of test_sim, with every node quiescing: safety after every
    event, and liveness (a proposal commits on every voter) after healing."""
    run_state_machine_as_test(
        machine(3, quiesce=True), settings=settings(SIM_SETTINGS, max_examples=40)
    )


def test_peers_go_silent_once_and_a_closed_connection_at_once() -> None:
    """The per-node heartbeat: a peer not heard for a third of an election timeout (at least
    two ticks) is reported silent once, heard again it is not; a closed connection makes it
    silent at once."""
    policy = QuiescencePolicy(1, ELECTION_TICK)
    assert policy.silence_ticks == 4
    for now in range(1, 5):
        policy.heard(2, now)
        policy.heard(3, now)
        assert policy.check_peers([2, 3], now) == []
    assert policy.check_peers([2, 3], 8) == []  # heard at 4: not yet silent
    policy.heard(2, 9)
    assert policy.check_peers([2, 3], 9) == [3]
    assert policy.check_peers([2, 3], 10) == []  # reported once
    assert policy.hears(2) and not policy.hears(3)
    policy.heard(3, 11)
    assert policy.check_peers([2, 3], 11) == [] and policy.hears(3)
    policy.disconnected(2)
    assert not policy.hears(2)
    assert policy.check_peers([2, 3], 12) == []  # already known silent: not reported again
    state = QuietState(quiesced=True)
    assert policy.requested(state) and not state.quiesced
    assert not policy.requested(state)
