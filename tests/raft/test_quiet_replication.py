"""What a leader leaves unsaid: a commit that is the only news asks no answer, and a follower
that replication already shows alive gets no heartbeat.

Each message costs both brokers a decode, a step and often a driver turn; at a few hundred
writes a second, answers to commit news and heartbeats beside a steady flow of appends were a
third of the Raft messages (measured on ``bench.mqtt``'s paced phase).
"""

from __future__ import annotations

from kafkaesque.raft import AppendEntries, Heartbeat, HeartbeatResponse, Message

from .harness import Net, drain, of_type


def _heartbeats_of_a_tick(net: Net) -> set[int]:
    """Tick the leader (node 1) and settle; the followers its tick sent a heartbeat."""
    net.sent.clear()
    net.tick(1)
    return {m.dst for m in of_type(net.sent, Heartbeat) if m.src == 1 and m.reply}


def test_a_commit_that_is_the_only_news_asks_no_answer() -> None:
    net = Net()
    leader = net.elect(1)
    net.sent.clear()
    index = net.propose(1, b"x")
    appends = of_type(net.sent, AppendEntries)
    assert all(m.entries for m in appends), "no empty AppendEntries: the commit goes alone"
    notices = of_type(net.sent, Heartbeat)
    assert {(m.dst, m.commit, m.reply) for m in notices} == {(2, index, False), (3, index, False)}
    assert of_type(net.sent, HeartbeatResponse) == []
    assert len(net.sent) == 6  # to each follower: the append, its answer, the commit
    assert [net.nodes[n].commit for n in (1, 2, 3)] == [index] * 3
    assert leader.commit == index


def test_a_follower_that_answered_and_holds_everything_gets_no_heartbeat() -> None:
    net = Net()
    leader = net.elect(1)
    net.isolate(3)
    net.propose(1, b"x")  # node 2 answers and is told the commit; node 3 hears nothing
    net.heal()
    assert _heartbeats_of_a_tick(net) == {3}  # and node 3 catches up through appends it answers
    # Node 2 answered nothing since the last heartbeat: it gets one again; node 3 does not.
    assert _heartbeats_of_a_tick(net) == {2}
    assert net.nodes[3].commit == leader.commit


def test_a_follower_that_answered_but_lags_still_gets_its_heartbeat() -> None:
    """Its heartbeat's answer is what makes the leader resend what was lost."""
    net = Net()
    leader = net.elect(1)
    net.propose(1, b"x")  # node 2 answers
    net.isolate(2)
    net.propose(1, b"y")  # lost on the way to node 2
    net.heal()
    assert 2 in _heartbeats_of_a_tick(net)
    assert net.nodes[2].commit == leader.commit


def test_a_follower_whose_answer_is_on_its_way_hears_the_commit_once_it_answers() -> None:
    """The first answer commits. The other follower has the entry on its way: an empty
    AppendEntries now would cost it an answer and the leader a step to read it. It hears the
    commit once its own answer is in, in a heartbeat that needs no reply."""
    net = Net()
    leader = net.elect(1)
    nodes, disks = net.nodes, net.disks
    index = leader.propose(b"x", 1)
    answers: dict[int, Message] = {}
    for append in drain(leader, disks[1]):
        nodes[append.dst].step(append)
        [answers[append.dst]] = drain(nodes[append.dst], disks[append.dst])
    leader.step(answers[2])
    news = drain(leader, disks[1])
    assert leader.commit == index
    assert [(type(m), m.dst) for m in news] == [(Heartbeat, 2)]  # nothing for node 3 yet
    leader.step(answers[3])
    [late] = drain(leader, disks[1])
    assert isinstance(late, Heartbeat)
    assert (late.dst, late.commit, late.reply) == (3, index, False)
    nodes[3].step(late)
    assert drain(nodes[3], disks[3]) == []
    assert nodes[3].commit == index
