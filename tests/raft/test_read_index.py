"""Read-index (thesis §6.4): linearizable reads served by a leader without writing the log.

"The leader ... records its current commit index in a local variable readIndex ... sends a new
round of heartbeats ... once it has received acknowledgments from a majority of the cluster, it
knows it was the leader at the time it sent the heartbeats"; before its first commit in a term it
waits: "the leader ... [must] commit a blank no-op entry ... at the start of its term".
"""

from __future__ import annotations

import pytest

from kafkaesque.raft import (
    AppendEntriesResponse,
    Heartbeat,
    HeartbeatResponse,
    NotLeader,
    ReadState,
    RequestVoteResponse,
    Role,
)

from .harness import Net, node, of_type, take_ready


def test_read_is_answered_after_a_heartbeat_round_reaches_a_majority() -> None:
    net = Net()
    leader = net.elect(1)
    net.propose(1, b"x")
    leader.read_index(b"r1")
    rd = leader.ready()
    assert rd.read_states == ()
    (round_,) = {m.round for m in of_type(rd.messages, Heartbeat)}
    assert round_ >= 1
    net.disks[1].persist(rd)
    leader.advance(rd)
    leader.step(HeartbeatResponse(2, 1, leader.term, round_))
    assert leader.ready().read_states == (ReadState(b"r1", leader.commit),)


def test_reads_in_one_batch_share_a_round() -> None:
    net = Net()
    leader = net.elect(1)
    for i in range(5):
        leader.read_index(b"%d" % i)
    beats = of_type(leader.ready().messages, Heartbeat)
    assert len(beats) == 2  # one per follower, not one per read


def test_read_waits_for_the_first_commit_of_the_term() -> None:
    n, disk = node(1)
    n.campaign()
    n.step(RequestVoteResponse(2, 1, 1, True, True))
    n.step(RequestVoteResponse(2, 1, 1, True))
    assert n.role is Role.LEADER and n.commit == -1
    n.read_index(b"early")
    rd = take_ready(n, disk)  # the no-op goes out; no read round yet
    assert rd.read_states == () and of_type(rd.messages, Heartbeat) == []
    n.step(AppendEntriesResponse(2, 1, 1, True, 0))
    assert n.commit == 0
    beats = [b for b in of_type(take_ready(n, disk).messages, Heartbeat) if b.reply]
    assert {b.round for b in beats} == {1}
    n.step(HeartbeatResponse(2, 1, 1, 1))
    assert n.ready().read_states == (ReadState(b"early", 0),)


def test_read_index_ends_up_answered_in_a_stable_cluster() -> None:
    net = Net()
    leader = net.elect(1)
    got: list[ReadState] = []
    leader.read_index(b"r")
    for _ in range(5):
        if leader.has_ready():
            rd = leader.ready()
            got.extend(rd.read_states)
            net.disks[1].persist(rd)
            for m in rd.messages:
                net.nodes[m.dst].step(m)
            leader.advance(rd)
        for i in (2, 3):
            n = net.nodes[i]
            while n.has_ready():
                rd = n.ready()
                net.disks[i].persist(rd)
                for m in rd.messages:
                    leader.step(m)
                n.advance(rd)
    assert got == [ReadState(b"r", leader.commit)]


def test_isolated_leader_never_answers_and_drops_reads_when_deposed() -> None:
    net = Net()
    leader = net.elect(1)
    net.isolate(1)
    leader.read_index(b"stale?")
    answered: list[ReadState] = []
    dropped: list[bytes] = []
    for _ in range(25):
        leader.tick()
        while leader.has_ready():
            rd = leader.ready()
            answered.extend(rd.read_states)
            dropped.extend(rd.dropped_reads)
            net.disks[1].persist(rd)
            leader.advance(rd)
    assert answered == [] and dropped == [b"stale?"] and leader.role is Role.FOLLOWER


def test_single_voter_answers_at_once_and_followers_refuse() -> None:
    net = Net(ids=(1,))
    leader = net.elect(1)
    leader.read_index(b"solo")
    assert leader.ready().read_states == (ReadState(b"solo", 0),)
    follower, _ = node(2)
    with pytest.raises(NotLeader):
        follower.read_index(b"x")
