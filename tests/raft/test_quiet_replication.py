"""What a leader leaves unsaid: a commit that is the only news asks no answer (by default it goes
at once, ``eager_commit_news``; without it, with the next AppendEntries or heartbeat), and a
follower that replication already shows alive gets no heartbeat.

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


def test_a_commit_goes_at_once_to_the_followers_that_hold_it_and_asks_no_answer() -> None:
    """``eager_commit_news`` (the default): a follower learns a commit one message after the
    leader, not at the next write or tick (50 ms), so a long poll served by its replica hands
    the record over at once. A write costs six messages: to each follower the append, its
    answer and the commit, which asks no answer."""
    net = Net()
    leader = net.elect(1)
    net.tick(1)
    net.sent.clear()
    index = net.propose(1, b"x")
    assert leader.commit == index
    assert [net.nodes[n].commit for n in (2, 3)] == [index] * 2
    beats = of_type(net.sent, Heartbeat)
    told = sorted((m.dst, m.commit, m.reply) for m in beats)
    assert told == [(2, index, False), (3, index, False)]
    assert of_type(net.sent, HeartbeatResponse) == []
    assert len(net.sent) == 6
    # Nothing is told twice: the next write's AppendEntries carries the commit it knows.
    net.sent.clear()
    second = net.propose(1, b"y")
    assert [net.nodes[n].commit for n in (2, 3)] == [second] * 2
    assert len(of_type(net.sent, Heartbeat)) == 2
    # A follower is told only what it holds: one cut off hears nothing until it catches up.
    net.isolate(3)
    net.sent.clear()
    third = net.propose(1, b"z")
    assert [(m.dst, m.commit) for m in of_type(net.sent, Heartbeat)] == [(2, third)]
    assert net.nodes[3].commit == second
    net.heal()
    net.tick(1)
    assert net.nodes[3].commit == third


def test_a_commit_that_is_the_only_news_waits_for_what_is_sent_anyway() -> None:
    """Without ``eager_commit_news``, §5.3: the leader includes its commit index "in future
    AppendEntries RPCs (including heartbeats)". A write costs four messages (to each follower
    the append and its answer), not six: the commit goes with the next AppendEntries or the
    tick's heartbeat."""
    net = Net(eager_commit_news=False)
    leader = net.elect(1)
    net.tick(1)  # the followers learn the no-op's commit
    before = leader.commit
    net.sent.clear()
    index = net.propose(1, b"x")
    appends = of_type(net.sent, AppendEntries)
    assert all(m.entries for m in appends), "no empty AppendEntries: the commit goes alone"
    assert of_type(net.sent, Heartbeat) == [] and of_type(net.sent, HeartbeatResponse) == []
    assert len(net.sent) == 4  # to each follower: the append and its answer
    assert leader.commit == index
    assert [net.nodes[n].commit for n in (2, 3)] == [before] * 2
    # The next write's AppendEntries brings it ...
    net.sent.clear()
    second = net.propose(1, b"y")
    assert {(m.dst, m.commit) for m in of_type(net.sent, AppendEntries)} == {(2, index), (3, index)}
    assert [net.nodes[n].commit for n in (2, 3)] == [index] * 2
    # ... or the tick's heartbeat, which asks no answer of a follower whose answer is in.
    net.sent.clear()
    net.tick(1)
    beats = of_type(net.sent, Heartbeat)
    assert {(m.dst, m.commit, m.reply) for m in beats} == {(2, second, False), (3, second, False)}
    assert of_type(net.sent, HeartbeatResponse) == []
    assert [net.nodes[n].commit for n in (2, 3)] == [second] * 2
    # Told once: the next tick sends them the usual heartbeat (they answered nothing since).
    net.sent.clear()
    net.tick(1)
    assert {(m.dst, m.reply) for m in of_type(net.sent, Heartbeat)} == {(2, True), (3, True)}


def test_a_leader_is_quiescent_only_once_every_follower_was_told_the_commit() -> None:
    """The driver stops ticking a quiescent group: a follower not told the latest commit by
    then would never hear it (its commit would stay behind while the group sleeps)."""
    net = Net(eager_commit_news=False)
    leader = net.elect(1)
    net.propose(1, b"x")
    assert [n.log.last_index() for n in net.nodes.values()] == [leader.commit] * 3
    assert not leader.quiescent()  # everyone holds everything, but the commit was not told
    net.tick(1)
    assert leader.quiescent()
    assert all(n.commit == leader.commit for n in net.nodes.values())
    assert not net.nodes[2].quiescent()  # only a leader quiesces its group


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


def test_a_follower_whose_answer_is_on_its_way_hears_the_commit_at_the_next_heartbeat() -> None:
    """The first answer commits. The other follower has the entry on its way: an empty
    AppendEntries now would cost it an answer and the leader a step to read it, and so would
    commit news once its answer is in. Without ``eager_commit_news``, both hear the commit with
    the tick's heartbeat, which needs no reply."""
    net = Net(eager_commit_news=False)
    leader = net.elect(1)
    nodes, disks = net.nodes, net.disks
    index = leader.propose(b"x", 1)
    answers: dict[int, Message] = {}
    for append in drain(leader, disks[1]):
        nodes[append.dst].step(append)
        [answers[append.dst]] = drain(nodes[append.dst], disks[append.dst])
    leader.step(answers[2])
    assert drain(leader, disks[1]) == []  # nothing for anybody yet
    assert leader.commit == index
    leader.step(answers[3])
    assert drain(leader, disks[1]) == []
    leader.tick()
    beats = drain(leader, disks[1])
    assert {(type(m), m.dst) for m in beats} == {(Heartbeat, 2), (Heartbeat, 3)}
    for beat in beats:
        assert isinstance(beat, Heartbeat)
        assert (beat.commit, beat.reply) == (index, False)
        nodes[beat.dst].step(beat)
        assert drain(nodes[beat.dst], disks[beat.dst]) == []
        assert nodes[beat.dst].commit == index
