"""Pre-vote (thesis §9.6), check-quorum (§6.2), leader stickiness (§4.2.3), transfer (§3.10)."""

from __future__ import annotations

import pytest

from kafkaesque.raft import (
    Election,
    ElectionCause,
    NotLeader,
    OrphanWake,
    ProposalDropped,
    RaftUsageError,
    RequestVote,
    RequestVoteResponse,
    Role,
    TimeoutNow,
)

from .harness import Net, drain, node, of_type


def test_prevote_keeps_a_partitioned_node_from_inflating_terms() -> None:
    """Thesis §9.6: "the Pre-Vote algorithm ... a candidate would first ask other servers whether
    its log was up-to-date enough to get their vote. Only if the candidate believed it could get
    votes from a majority of the cluster would it increment its term and start a normal
    election." A node cut off for many timeouts keeps its term, and rejoining deposes nobody."""
    net = Net()
    leader = net.elect(1)
    net.isolate(3)
    for _ in range(100):
        net.tick_all()
    assert net.nodes[3].term == 1
    net.heal()
    net.tick_all(30)
    assert leader.role is Role.LEADER and leader.term == 1
    assert {n.leader for n in net.nodes.values()} == {1}


def test_prevote_is_refused_to_a_stale_log() -> None:
    """§5.4.1 applies to pre-votes too: a node with a shorter log cannot even pass pre-vote."""
    net = Net()
    net.elect(1)
    net.isolate(3)
    net.propose(1, b"x")
    net.nodes[1].tick()  # (any traffic)
    net.heal()
    n2, n3 = net.nodes[2], net.nodes[3]
    n2.step(RequestVote(3, 2, 2, n3.log.last_index(), n3.log.last_term(), pre_vote=True))
    # Node 2 heard from the leader recently: it ignores the pre-vote entirely (stickiness).
    assert of_type(drain(n2, net.disks[2]), RequestVoteResponse) == []
    for _ in range(25):
        n2.tick()  # forget the leader: the pre-vote is now answered, but refused on the log
    drain(n2, net.disks[2])
    n2.step(RequestVote(3, 2, n2.term + 1, n3.log.last_index(), n3.log.last_term(), pre_vote=True))
    (resp,) = of_type(drain(n2, net.disks[2]), RequestVoteResponse)
    assert not resp.granted


def test_check_quorum_leader_steps_down_without_a_majority() -> None:
    """Thesis §6.2: "a leader [steps] down if an election timeout elapses without a successful
    round of heartbeats to a majority of its cluster". It then stops taking proposals."""
    net = Net()
    leader = net.elect(1)
    net.isolate(1)
    for _ in range(2 * 10):
        leader.tick()
        net.stabilize()
    assert leader.status().role is Role.FOLLOWER
    with pytest.raises(NotLeader):
        leader.propose(b"x")


def test_check_quorum_keeps_a_leader_that_hears_from_a_majority() -> None:
    """...and a leader heard by a majority keeps leading (one follower down is fine)."""
    net = Net()
    leader = net.elect(1)
    net.isolate(3)
    for _ in range(50):
        net.tick(1)
    assert leader.role is Role.LEADER


def test_stickiness_ignores_campaigns_while_the_leader_is_alive() -> None:
    """Thesis §4.2.3: "if a server receives a RequestVote request within the minimum election
    timeout of hearing from a current leader, it does not update its term or grant its vote"."""
    net = Net()
    net.elect(1)
    n2 = net.nodes[2]
    n2.step(RequestVote(3, 2, 5, 100, 100))  # a disruptive, up-to-date-looking candidate
    assert n2.term == 1 and of_type(drain(n2, net.disks[2]), RequestVoteResponse) == []
    for _ in range(10):
        n2.tick()  # the lease (one election timeout without contact) runs out
    drain(n2, net.disks[2])
    n2.step(RequestVote(3, 2, 5, 100, 100))
    assert n2.term == 5
    (resp,) = of_type(drain(n2, net.disks[2]), RequestVoteResponse)
    assert resp.granted


def test_transfer_campaign_overrides_stickiness() -> None:
    """Thesis §3.10: the target of a transfer campaigns at once; its RequestVote carries a flag
    so that voters who heard from the (old) leader recently still answer."""
    net = Net()
    net.elect(1)
    n2 = net.nodes[2]
    n2.step(RequestVote(3, 2, 2, 100, 100, transfer=True))
    (resp,) = of_type(drain(n2, net.disks[2]), RequestVoteResponse)
    assert resp.granted and n2.term == 2


def test_transfer_to_an_up_to_date_follower() -> None:
    """Thesis §3.10: "the prior leader sends a TimeoutNow request to the target server ... the
    target server [starts] a new election", skipping pre-vote."""
    net = Net()
    net.elect(1)
    net.propose(1, b"x")
    net.nodes[1].transfer_leadership(2)
    net.stabilize()
    assert any(isinstance(m, TimeoutNow) and m.dst == 2 for m in net.sent)
    assert not any(isinstance(m, RequestVote) and m.src == 2 and m.pre_vote for m in net.sent)
    assert net.nodes[2].role is Role.LEADER and net.nodes[2].term == 2
    assert net.nodes[1].role is Role.FOLLOWER


def test_transfer_catches_a_lagging_target_up_first() -> None:
    """Thesis §3.10: "the prior leader ... [brings] the target server's log up to date"."""
    net = Net()
    net.elect(1)
    net.isolate(3)
    for i in range(5):
        net.propose(1, b"%d" % i)
    net.heal()
    net.nodes[1].transfer_leadership(3)
    net.stabilize()
    timeout_now = [i for i, m in enumerate(net.sent) if isinstance(m, TimeoutNow)]
    assert len(timeout_now) == 1
    assert net.nodes[3].role is Role.LEADER
    assert net.disks[3].last_index() >= net.disks[1].last_index() - 1


def test_transfer_refuses_proposals_and_gives_up_after_an_election_timeout() -> None:
    """Thesis §3.10: "the prior leader stops accepting new client requests" during the transfer,
    and "if the transfer does not complete within an election timeout, the prior leader aborts
    the transfer and resumes accepting client requests"."""
    net = Net()
    leader = net.elect(1)
    net.isolate(2)
    leader.transfer_leadership(2)
    with pytest.raises(ProposalDropped):
        leader.propose(b"x")
    for _ in range(10):
        net.tick(1)
    assert leader.role is Role.LEADER
    assert leader.propose(b"x") > 0


def test_transfer_to_a_non_voter_is_misuse() -> None:
    net = Net()
    net.elect(1)
    with pytest.raises(RaftUsageError):
        net.nodes[1].transfer_leadership(9)
    with pytest.raises(NotLeader):
        net.nodes[2].transfer_leadership(3)


def test_split_vote_resolves_by_randomized_timeouts() -> None:
    """§5.2: randomized timeouts make split votes rare and short: a cluster where every node
    times out by itself still elects exactly one leader."""
    net = Net(ids=(1, 2, 3, 4, 5))
    for _ in range(60):
        net.tick_all()
        if any(n.role is Role.LEADER for n in net.nodes.values()):
            break
    leaders = [n for n in net.nodes.values() if n.role is Role.LEADER]
    assert len(leaders) == 1
    assert all(n.leader == leaders[0].id for n in net.nodes.values())


def test_votes_are_counted_in_the_candidates_configuration() -> None:
    """A pre-candidate needs a majority of its voters; answers from strangers do not count."""
    n, _ = node(1, (1, 2, 3))
    n.campaign()
    n.step(RequestVoteResponse(7, 1, 1, True, True))
    n.step(RequestVoteResponse(8, 1, 1, True, True))
    assert n.role is Role.PRE_CANDIDATE


def test_a_follower_that_forgets_a_dead_leader_answers_campaigns_at_once() -> None:
    """etcd's ForgetLeader: when the driver knows the leader's broker is gone (its connection
    closed), stickiness must not delay the election by a whole timeout; the vote itself still
    needs an up-to-date log."""
    net = Net()
    net.elect(1)
    n2 = net.nodes[2]
    n2.forget_leader()
    assert n2.leader is None
    n2.step(RequestVote(3, 2, 5, 100, 100))  # no ticks needed: no lease without a leader
    assert n2.term == 5
    (resp,) = of_type(drain(n2, net.disks[2]), RequestVoteResponse)
    assert resp.granted
    # The leader itself ignores the call: only a follower forgets its leader.
    n1 = net.nodes[1]
    n1.forget_leader()
    assert n1.role is Role.LEADER and n1.leader == 1


def test_a_silent_leaders_followers_count_the_silence_and_one_stands_first() -> None:
    """Issue 23: quiesced followers do not tick, so the driver tells them how long the
    leader's broker has been silent. That silence counts toward the election timeout, and the
    survivor named to stand first campaigns exactly one timeout after the silence began, when
    the other's stickiness has just ended: elected at once, no random tie to split the vote."""
    net = Net()
    net.elect(1)
    net.isolate(1)  # paused: nothing in or out, and no connection closes
    silent = 5  # the ticks the driver took to call the leader's broker silent
    net.nodes[2].leader_silent_for(silent, stand_first=True)
    net.nodes[3].leader_silent_for(silent)
    ticks = silent
    while net.nodes[2].role is not Role.LEADER and ticks < 3 * 10:
        net.tick_all()
        ticks += 1
    assert net.nodes[2].role is Role.LEADER and net.nodes[3].leader == 2
    assert ticks == 10  # election_tick after the silence began, not silent + a fresh timeout


def test_silence_is_ignored_by_a_leader_and_a_leaderless_node_and_must_not_be_negative() -> None:
    net = Net()
    leader = net.elect(1)
    net.isolate(1)
    leader.leader_silent_for(100)
    # A leader's clock is its own: check-quorum passes at tick 10 (the election's answers
    # count) and fails at tick 20 (thesis §6.2), not earlier.
    net.tick(1, 19)
    assert leader.role is Role.LEADER
    net.tick(1)
    assert leader.status().role is Role.FOLLOWER
    lone, _ = node(1)
    lone.leader_silent_for(100, stand_first=True)  # no leader known: nothing to count
    lone.tick()
    assert lone.role is Role.FOLLOWER  # its own timeout runs as before: no campaign yet
    with pytest.raises(RaftUsageError):
        net.nodes[2].leader_silent_for(-1)


# -- why an election was held (``RaftNode.last_election``: data set where campaigns start) ------


def test_the_first_election_of_a_group_is_caused_by_its_start_up() -> None:
    net = Net()
    leader = net.elect(1)
    assert leader.last_election == Election(1, ElectionCause.STARTUP)
    assert net.nodes[2].last_election is None  # never led


def test_an_election_after_the_leader_went_silent_is_caused_by_its_timeout() -> None:
    net = Net()
    net.elect(1)
    net.isolate(1)
    for _ in range(40):
        net.tick(2)
        net.tick(3)
        if Role.LEADER in (net.nodes[2].role, net.nodes[3].role):
            break
    winner = next(n for n in (net.nodes[2], net.nodes[3]) if n.role is Role.LEADER)
    assert winner.last_election == Election(2, ElectionCause.TIMEOUT)


def test_an_election_asked_by_the_driver_when_the_leader_is_gone_says_so() -> None:
    """The driver saw the leader's connection close: the survivor that stands first says why
    (``OrphanWake``, the quiescence policy's verdict, applied to its core)."""
    net = Net()
    net.elect(1)
    net.isolate(1)
    net.nodes[3].forget_leader()
    OrphanWake(gone=True, stand_first=True, silent_ticks=0, woke=False).apply(net.nodes[2])
    net.stabilize()
    assert net.nodes[2].last_election == Election(2, ElectionCause.LEADER_GONE)


def test_a_transferred_leadership_is_caused_by_the_transfer() -> None:
    net = Net()
    net.elect(1)
    net.nodes[1].transfer_leadership(2)
    net.stabilize()
    assert net.nodes[2].last_election == Election(2, ElectionCause.TRANSFER)
    assert net.nodes[1].last_election == Election(1, ElectionCause.STARTUP)  # its own, kept


def test_a_leader_that_stepped_down_by_check_quorum_and_won_again_says_so() -> None:
    """Thesis §6.2: the leader cut off from everyone steps down; the others, cut off too, cannot
    elect anyone (pre-vote fails); healed, the old leader's campaign is the step-down's."""
    net = Net()
    leader = net.elect(1)
    for n in (1, 2, 3):
        net.isolate(n)
    for _ in range(40):
        net.tick_all()
    assert leader.status().role is not Role.LEADER
    assert {n.term for n in net.nodes.values()} == {1}  # pre-votes kept the terms
    net.heal()
    for _ in range(40):
        net.tick(1)
        if leader.role is Role.LEADER:
            break
    assert leader.last_election == Election(2, ElectionCause.CHECK_QUORUM)
