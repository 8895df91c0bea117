"""A replica whose disk lost entries it may have acknowledged (issue 8), in the simulator.

The rule under test (Protocol-Aware Recovery, FAST '18): a node that knows it lost durable
entries (``InitialState.lost_end``) grants no vote or pre-vote and does not campaign until its
log has been re-replicated from a leader up to what it lost; a leader that hears a follower's
log end below its match lowers the match, so a stale acknowledgement never counts for entries
the follower no longer holds, and resends what is missing.
"""

from __future__ import annotations

import random

import pytest

from kafkaesque.raft import (
    AppendEntries,
    AppendEntriesResponse,
    HardState,
    Heartbeat,
    LogDiverged,
    RaftInvariantError,
    RequestVote,
    RequestVoteResponse,
    Role,
)

from .harness import drain, entry, node, of_type, storage_with
from .safety import SafetyViolation
from .sim import Cluster, SimConfig, SimNode


def _steps_until(cluster: Cluster, done: object, limit: int = 2000) -> None:
    for _ in range(limit):
        if done():  # type: ignore[operator]
            return
        cluster.step()
    raise AssertionError("condition not reached")


def _leader(cluster: Cluster) -> SimNode:
    _steps_until(cluster, lambda: cluster.leader() is not None)
    leader = cluster.leader()
    assert leader is not None and leader.core is not None
    return leader


def _committed_on_two(detected: bool) -> tuple[Cluster, int, int, int, int]:
    """3 nodes; an entry committed on the leader A and B only (C cut off); then B's disk loses
    it (detected or not) and A crashes. Returns the cluster, A, B, C and the entry's offset."""
    cluster = Cluster(SimConfig(voters=3, spares=0), seed=3)
    a = _leader(cluster)
    b, c = sorted(set(cluster.nodes) - {a.id})
    cluster.run(50)
    cluster.partition({c})
    cluster.propose(a.id)
    assert a.core is not None
    offset = a.core.log.last_index()
    _steps_until(
        cluster,
        lambda: (
            a.core is not None
            and a.core.commit >= offset
            and cluster.nodes[b].disk.last_index() >= offset
        ),
    )
    assert cluster.nodes[c].disk.last_index() < offset  # only A and B hold it
    cluster.lose_tail(b, offset, detected=detected)
    cluster.crash(a.id)
    cluster.heal()
    return cluster, a.id, b, c, offset


def test_undetected_loss_loses_a_committed_entry() -> None:
    """The fault the issue describes, with the loss unnoticed (the code before issue 8): B votes
    as if it never had the entry, B and C elect a leader without it, and the simulator's leader
    completeness check fires."""
    cluster, _, _, _, _ = _committed_on_two(detected=False)
    with pytest.raises(SafetyViolation, match="leader completeness"):
        cluster.run(3000)


def test_detected_loss_blocks_elections_until_the_entry_is_back() -> None:
    """B knows what it lost: it neither votes nor campaigns, so B and C cannot elect a leader
    (no leader while A is down, rather than one without the committed entry). When A returns
    a leader with the entry is elected, and B re-replicates it and may vote again."""
    cluster, a, b, c, offset = _committed_on_two(detected=True)
    node_b = cluster.nodes[b]
    assert node_b.core is not None
    assert node_b.core.status().lost_end is not None
    cluster.run(3000)  # many election timeouts
    assert cluster.leader() is None
    cluster.restart(a)
    cluster.check_liveness()
    for n in (a, b, c):
        core = cluster.nodes[n].core
        assert core is not None and core.commit >= offset
        assert core.log.last_index() >= offset
    assert node_b.core is not None and node_b.core.status().lost_end is None
    assert node_b.disk.initial_state().lost_end is None


def test_a_recovering_node_refuses_votes_and_does_not_campaign() -> None:
    disk = storage_with([1, 2, 3], [entry(1, 0), entry(1, 1)], HardState(1, None, 1))
    disk.lose_from(1)  # offset 1 was durable (acknowledged) and is gone
    n, disk = node(2, disk=disk)
    assert n.status().lost_end == 2
    for pre in (True, False):
        n.step(RequestVote(3, 2, 2, 5, 1, pre))
        (answer,) = of_type(drain(n, disk), RequestVoteResponse)
        assert not answer.granted
    for _ in range(100):
        n.tick()
    assert not of_type(drain(n, disk), RequestVote)
    assert n.role is Role.FOLLOWER
    n.campaign()
    assert n.role is Role.FOLLOWER and not of_type(drain(n, disk), RequestVote)

    # The leader of term 2 re-replicates offset 1: the node is whole and votes again.
    n.step(AppendEntries(1, 2, 2, 0, 1, 1, (entry(1, 1), entry(2, 2))))
    drain(n, disk)
    assert n.status().lost_end is None and disk.initial_state().lost_end is None
    n.forget_leader()  # (no leader stickiness in the way)
    n.step(RequestVote(3, 2, 3, 2, 2, True))
    (answer,) = of_type(drain(n, disk), RequestVoteResponse)
    assert answer.granted


def test_a_recovering_follower_told_of_a_commit_beyond_its_log_says_where_it_ends() -> None:
    """A heartbeat's commit is at most the follower's match: beyond the log of a follower that
    lost entries, the leader's match is stale. The follower commits what it has and answers
    with a rejection that tells the leader where its log ends."""
    disk = storage_with([1, 2, 3], [entry(1, 0), entry(1, 1), entry(1, 2)], HardState(1, None, 0))
    disk.lose_from(1)
    n, disk = node(2, disk=disk)
    n.step(Heartbeat(1, 2, 1, 2, 0))
    rejections = [m for m in of_type(drain(n, disk), AppendEntriesResponse) if not m.success]
    assert [(m.conflict_term, m.conflict_index) for m in rejections] == [(None, 1)]
    assert n.commit == 0
    assert n.status().lost_end == 3


def test_an_unexplained_commit_beyond_the_log_is_still_an_invariant_error() -> None:
    """Without a known loss it can only be a protocol bug: the node stops (the simulator's
    planted-bug tests rely on it)."""
    disk = storage_with([1, 2, 3], [entry(1, 0)], HardState(1, None, -1))
    n, disk = node(2, disk=disk)
    with pytest.raises(RaftInvariantError, match="beyond the last offset"):
        n.step(Heartbeat(1, 2, 1, 3, 0))


def test_without_durable_acks_a_commit_beyond_the_log_is_answered_not_fatal() -> None:
    """``--fsync interval``: a follower's acknowledged tail may be gone after a power cut with
    nothing on its disk to say so. A heartbeat's commit beyond its log is then no invariant
    broken (it crashed the broker): the follower says where its log ends and commits nothing
    (what it holds may be entries the quorum lost)."""
    disk = storage_with([1, 2, 3], [entry(1, 0)], HardState(1, None, -1))
    n, disk = node(2, disk=disk, durable_acks=False)
    n.step(Heartbeat(1, 2, 1, 3, 0))
    rejections = [m for m in of_type(drain(n, disk), AppendEntriesResponse) if not m.success]
    assert [(m.conflict_term, m.conflict_index) for m in rejections] == [(None, 1)]
    assert n.commit == -1


def test_without_durable_acks_the_first_committed_entry_the_leader_lacks_is_found() -> None:
    """Ours: term 1 at 0-1, term 2 at 2-4, all committed. The leader of term 3 holds 0-2 and
    its own term from 3 on (a quorum lost 3-4 in a power cut). Its stale match for us points at
    4: we say we do not hold its entry there and to resend from where our term 2 starts; its
    resend shows 3 is the first entry that is not ours (``LogDiverged``: the driver cuts there).
    Entries that match are acknowledged as far as they go, not up to our whole commit."""
    log = [entry(1, 0), entry(1, 1), entry(2, 2), entry(2, 3), entry(2, 4)]
    n, disk = node(2, disk=storage_with([1, 2, 3], log, HardState(2, None, 4)), durable_acks=False)
    n.step(AppendEntries(1, 2, 3, 4, 3, 5, (entry(3, 5),)))
    (answer,) = of_type(drain(n, disk), AppendEntriesResponse)
    assert (answer.success, answer.conflict_term, answer.conflict_index) == (False, None, 2)
    n.step(AppendEntries(1, 2, 3, 0, 1, 5, (entry(1, 1),)))
    (answer,) = of_type(drain(n, disk), AppendEntriesResponse)
    assert (answer.success, answer.index) == (True, 1)
    with pytest.raises(LogDiverged) as found:
        n.step(AppendEntries(1, 2, 3, 1, 1, 5, (entry(2, 2), entry(3, 3), entry(3, 4))))
    assert found.value.offset == 3
    # With durable acknowledgements the committed prefix is trusted (Leader Completeness).
    n, disk = node(2, disk=storage_with([1, 2, 3], log, HardState(2, None, 4)))
    n.step(AppendEntries(1, 2, 3, 1, 1, 5, (entry(2, 2), entry(3, 3), entry(3, 4))))
    (answer,) = of_type(drain(n, disk), AppendEntriesResponse)
    assert (answer.success, answer.index) == (True, 4)


def test_without_durable_acks_entries_below_the_log_start_are_not_checked() -> None:
    """A leader's resend may start below our log start (retention deleted it here, committed
    long ago): those entries are not compared (their terms are gone), the rest are."""
    log = [entry(1, i) for i in range(8)]
    disk = storage_with([1, 2, 3], log, HardState(1, None, 7))
    disk.compact(5)
    n, disk = node(2, disk=disk, durable_acks=False)
    n.step(AppendEntries(1, 2, 1, 1, 1, 7, tuple(entry(1, i) for i in range(2, 7))))
    (answer,) = of_type(drain(n, disk), AppendEntriesResponse)
    assert (answer.success, answer.index) == (True, 6)


def test_leader_lowers_a_stale_match_and_repairs_an_idle_follower() -> None:
    """B loses its tail and restarts before the leader notices: the leader's match for B is
    stale. With no new proposal, the heartbeats alone get B repaired."""
    cluster = Cluster(SimConfig(voters=3, spares=0), seed=5)
    a = _leader(cluster)
    b = min(set(cluster.nodes) - {a.id})
    for _ in range(3):
        cluster.propose(a.id)
    cluster.run(200)
    assert a.core is not None
    last = a.core.log.last_index()
    assert cluster.nodes[b].disk.last_index() == last
    cluster.lose_tail(b, last - 1)
    node_b = cluster.nodes[b]
    assert node_b.core is not None and node_b.core.log.last_index() < last
    cluster.run(400)
    assert cluster.leader() is a
    assert node_b.core.log.last_index() == last
    assert node_b.core.status().lost_end is None
    assert node_b.core.commit == a.core.commit


@pytest.mark.parametrize("seed", range(30))
def test_random_faults_with_single_replica_disk_loss(seed: int) -> None:
    """Crashes, partitions, proposals, retention and, one node at a time, the loss of a random
    durable tail: the safety checker (leader completeness, state-machine safety) holds
    throughout and a healed cluster commits again."""
    rng = random.Random(seed)
    cluster = Cluster(SimConfig(voters=3, spares=0, sync_delay=0.2), seed)
    ids = sorted(cluster.nodes)
    for _ in range(80):
        action = rng.randrange(8)
        if action == 0:
            cluster.run(rng.randint(20, 300))
        elif action in (1, 2):
            leader = cluster.leader()
            if leader is not None:
                for _ in range(rng.randint(1, 3)):
                    cluster.propose(leader.id)
        elif action == 3:
            cluster.crash(rng.choice(ids))
        elif action == 4:
            cluster.restart(rng.choice(ids))
        elif action == 6:
            cluster.compact(rng.choice(ids))  # retention: repairs may need InstallLogStart
        elif action == 5:
            if rng.random() < 0.5:
                cluster.partition({rng.choice(ids)})
            else:
                cluster.heal()
        # A minority fault: only when no replica is still repairing an earlier loss.
        elif all(n.disk.initial_state().lost_end is None for n in cluster.nodes.values()):
            victim = cluster.nodes[rng.choice(ids)]
            last = victim.disk.last_index()
            if last >= 0:
                cluster.lose_tail(victim.id, rng.randint(max(0, last - 6), last))
        cluster.run(rng.randint(1, 60))
    cluster.check_liveness()
