"""Paper-sentence tests (like etcd's raft_paper_test.go): each test cites the sentence it checks.

Paper = "In Search of an Understandable Consensus Algorithm (Extended Version)"; thesis = Ongaro's
dissertation "Consensus: Bridging Theory and Practice".
"""

from __future__ import annotations

import random

import pytest

from kafkaesque.raft import (
    BUG_COMMIT_OLD_TERM,
    BUG_FORGET_VOTE,
    AppendEntries,
    AppendEntriesResponse,
    EntryKind,
    HardState,
    Heartbeat,
    MemoryStorage,
    NotLeader,
    RaftConfig,
    RaftInvariantError,
    RaftLog,
    RaftNode,
    RequestVote,
    RequestVoteResponse,
    Role,
)

from .harness import Net, drain, entry, node, of_type, storage_with, take_ready


def _leader_of_term(term: int, node_id: int = 1, voters: tuple[int, ...] = (1, 2, 3)) -> RaftNode:
    """A node that is leader in ``term``, built through a real election."""
    disk = storage_with(voters, hard=HardState(term - 1, None, -1))
    n, _ = node(node_id, voters, disk=disk)
    n.campaign()
    for v in voters[1:]:
        n.step(RequestVoteResponse(v, node_id, term, True, True))
    for v in voters[1:]:
        n.step(RequestVoteResponse(v, node_id, term, True, False))
    assert n.role is Role.LEADER and n.term == term
    return n


# -- §5.1 -----------------------------------------------------------------------------------------


def test_nodes_start_as_followers() -> None:
    """§5.2: "When servers start up, they begin as followers." """
    n, _ = node(1)
    assert n.role is Role.FOLLOWER and n.term == 0 and n.leader is None


@pytest.mark.parametrize("role", ["follower", "candidate", "leader"])
def test_higher_term_makes_any_role_a_follower(role: str) -> None:
    """§5.1: "If one server's current term is smaller than the other's, then it updates its
    current term to the larger value. If a candidate or leader discovers that its term is out of
    date, it immediately reverts to follower state." """
    n, _ = node(1)
    if role == "candidate":
        n.campaign()
        n.step(RequestVoteResponse(2, 1, 1, True, True))
        assert n.role is Role.CANDIDATE
    elif role == "leader":
        n = _leader_of_term(1)
    n.step(AppendEntries(2, 1, 5, -1, 0, -1))
    assert (n.role, n.term, n.leader, n.status().vote) == (Role.FOLLOWER, 5, 2, None)


def test_stale_term_requests_are_rejected() -> None:
    """§5.1: "If a server receives a request with a stale term number, it rejects the request."
    The answer carries the newer term so a deposed leader steps down (etcd does the same)."""
    n, disk = node(1, disk=storage_with((1, 2, 3), hard=HardState(3, None, -1)))
    n.step(AppendEntries(2, 1, 2, -1, 0, -1, (entry(2, 0),)))
    msgs = drain(n, disk)
    assert n.log.last_index() == -1
    (resp,) = of_type(msgs, AppendEntriesResponse)
    assert resp.term == 3 and not resp.success
    n.step(Heartbeat(2, 1, 2, -1))
    assert of_type(drain(n, disk), Heartbeat) == [] and n.term == 3


# -- §5.2 -----------------------------------------------------------------------------------------


def test_leader_sends_heartbeats_every_heartbeat_tick() -> None:
    """§5.2: "Leaders send periodic heartbeats ... to all followers in order to maintain their
    authority." Heartbeats are their own cheap message type (coalesced per broker pair)."""
    n = _leader_of_term(1)
    disk = storage_with((1, 2, 3))
    drain(n, disk)
    n.tick()
    beats = of_type(n.ready().messages, Heartbeat)
    assert sorted(b.dst for b in beats) == [2, 3] and all(b.term == 1 for b in beats)


def test_follower_prevotes_then_campaigns_after_timeout() -> None:
    """§5.2: "If a follower receives no communication over a period of time called the election
    timeout, then it ... begins an election ... increments its current term ... votes for
    itself ... issues RequestVote RPCs". Thesis §9.6: a pre-vote round comes first, and it
    changes nobody's term."""
    n, disk = node(1, election_tick=10)
    for _ in range(19):
        n.tick()
    if n.role is Role.FOLLOWER:
        n.tick()
    assert n.role is Role.PRE_CANDIDATE and n.term == 0
    pre = of_type(drain(n, disk), RequestVote)
    assert sorted(m.dst for m in pre) == [2, 3]
    assert all(m.pre_vote and m.term == 1 for m in pre)
    n.step(RequestVoteResponse(2, 1, 1, True, True))
    assert n.status().role is Role.CANDIDATE and n.term == 1
    rd = take_ready(n, disk)
    # The vote for itself is in the hard state persisted before the RequestVotes go out.
    assert rd.hard_state == HardState(1, 1, -1)
    votes = of_type(rd.messages, RequestVote)
    assert sorted(m.dst for m in votes) == [2, 3] and not any(m.pre_vote for m in votes)


@pytest.mark.parametrize(
    ("voters", "granted", "rejected", "role"),
    [
        (1, [], [], Role.LEADER),
        (3, [2], [], Role.LEADER),
        (3, [], [2, 3], Role.FOLLOWER),
        (3, [], [2], Role.CANDIDATE),
        (5, [2, 3], [], Role.LEADER),
        (5, [2], [3], Role.CANDIDATE),
        (5, [2], [3, 4, 5], Role.FOLLOWER),
    ],
)
def test_election_outcome(voters: int, granted: list[int], rejected: list[int], role: Role) -> None:
    """§5.2: "A candidate wins an election if it receives votes from a majority of the servers in
    the full cluster for the same term." A majority of refusals ends the campaign."""
    ids = tuple(range(1, voters + 1))
    n, _ = node(1, ids)
    n.campaign()
    for v in ids[1:]:
        n.step(RequestVoteResponse(v, 1, 1, True, True))
    if voters > 1:
        assert n.role is Role.CANDIDATE
    for v in granted:
        n.step(RequestVoteResponse(v, 1, 1, True))
    for v in rejected:
        n.step(RequestVoteResponse(v, 1, 1, False))
    assert n.role is role


def test_vote_once_per_term_first_come_first_served() -> None:
    """§5.2: "Each server will vote for at most one candidate in a given term, on a
    first-come-first-served basis." """
    n, disk = node(1)
    n.step(RequestVote(2, 1, 1, -1, 0))
    n.step(RequestVote(3, 1, 1, -1, 0))
    n.step(RequestVote(2, 1, 1, -1, 0))  # a retry from the same candidate is granted again
    answers = [(m.dst, m.granted) for m in of_type(drain(n, disk), RequestVoteResponse)]
    assert answers == [(2, True), (3, False), (2, True)]
    assert disk.hard_state.vote == 2


def test_candidate_steps_down_for_a_leader_of_its_term() -> None:
    """§5.2: "If the leader's term ... is at least as large as the candidate's current term, then
    the candidate recognizes the leader as legitimate and returns to follower state." """
    n, _ = node(1)
    n.campaign()
    n.step(RequestVoteResponse(2, 1, 1, True, True))
    assert n.role is Role.CANDIDATE
    n.step(Heartbeat(3, 1, 1, -1))
    assert (n.role, n.term, n.leader) == (Role.FOLLOWER, 1, 3)


def test_election_timeouts_are_randomized() -> None:
    """§5.2: "Raft uses randomized election timeouts ... chosen randomly from a fixed interval"
    (here [election_tick, 2 * election_tick))."""
    seen = set()
    for seed in range(60):
        n, _ = node(1, seed=seed, election_tick=10)
        ticks = 0
        while n.role is Role.FOLLOWER:
            n.tick()
            ticks += 1
        seen.add(ticks)
    assert min(seen) >= 10 and max(seen) < 20 and len(seen) >= 6


# -- §5.4.1 ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cand_index", "cand_term", "granted"),
    [
        (2, 2, True),  # same last term, same length
        (3, 2, True),  # same last term, longer
        (1, 2, False),  # same last term, shorter
        (0, 3, True),  # higher last term wins even if shorter
        (9, 1, False),  # lower last term loses even if longer
    ],
)
def test_vote_only_for_up_to_date_logs(cand_index: int, cand_term: int, granted: bool) -> None:
    """§5.4.1: "If the logs have last entries with different terms, then the log with the later
    term is more up-to-date. If the logs end with the same term, then whichever log is longer is
    more up-to-date." The voter's log ends at offset 2, term 2."""
    disk = storage_with((1, 2, 3), [entry(1, 0), entry(2, 1, 2)], HardState(2, None, 1))
    n, _ = node(1, disk=disk)
    n.step(RequestVote(2, 1, 3, cand_index, cand_term))
    (resp,) = of_type(drain(n, disk), RequestVoteResponse)
    assert resp.granted is granted


# -- §5.3 -----------------------------------------------------------------------------------------


def test_leader_replicates_then_commits_on_majority() -> None:
    """§5.3: "The leader appends the command to its log ... issues AppendEntries RPCs in parallel
    ... When the entry has been safely replicated ... the leader applies the entry"; "the leader
    ... includes [the commit index] in future AppendEntries RPCs (including heartbeats)"."""
    net = Net()
    leader = net.elect(1)
    index = leader.propose(b"hello", 3)
    assert index == 3  # the leader's no-op took offset 0, the batch takes [1, 3]
    net.stabilize()
    assert leader.commit == 3
    net.tick(1)  # the followers learn the commit from the leader's next heartbeat
    for n in net.nodes.values():
        assert n.commit == 3
        assert n.log.entries_between(1, 3)[0].data == b"hello"


def test_commit_needs_a_majority_of_acks() -> None:
    """§5.3: "A log entry is committed once the leader that created the entry has replicated it
    on a majority of the servers." Entries are persisted by the leader before it counts itself."""
    for voters, acks, committed in [
        (3, [], False),
        (3, [2], True),
        (5, [2], False),
        (5, [2, 3], True),
    ]:
        ids = tuple(range(1, voters + 1))
        net = Net(ids)
        leader = net.elect(1)
        noop_commit = leader.commit
        for i in ids[1:]:
            if i not in acks:
                net.isolate(i)
        net.propose(1, b"x")
        assert (leader.commit > noop_commit) is committed, (voters, acks)


def test_follower_rejects_when_previous_entry_does_not_match() -> None:
    """§5.3: "If the follower does not find an entry in its log with the same index and term,
    then it refuses the new entries." The refusal hints at where to retry."""
    disk = storage_with((1, 2, 3), [entry(1, 0), entry(2, 1), entry(2, 2)], HardState(2, None, 0))
    n, _ = node(2, disk=disk)
    n.step(AppendEntries(1, 2, 3, 2, 3, 0, (entry(3, 3),)))  # our offset 2 has term 2, not 3
    n.step(AppendEntries(1, 2, 3, 7, 3, 0, (entry(3, 8),)))  # beyond our log
    r1, r2 = of_type(drain(n, disk), AppendEntriesResponse)
    assert (r1.success, r1.index, r1.conflict_term, r1.conflict_index) == (False, 2, 2, 1)
    assert (r2.success, r2.index, r2.conflict_term, r2.conflict_index) == (False, 7, None, 3)
    assert n.log.last_index() == 2


def test_follower_replaces_a_conflicting_suffix() -> None:
    """§5.3: "If an existing entry conflicts with a new one (same index but different terms),
    delete the existing entry and all that follow it." The Ready says where to truncate."""
    disk = storage_with(
        (1, 2, 3), [entry(1, 0), entry(2, 1), entry(2, 2, 4)], HardState(2, None, 0)
    )
    n, _ = node(2, disk=disk)
    n.step(AppendEntries(1, 2, 3, 1, 2, 0, (entry(3, 2, 3, b"new"), entry(3, 4))))
    rd = take_ready(n, disk)
    assert rd.truncate_from == 2 and [e.first for e in rd.entries] == [2, 4]
    assert [(e.first, e.last, e.term) for e in disk.all_entries()] == [
        (0, 0, 1),
        (1, 1, 2),
        (2, 3, 3),
        (4, 4, 3),
    ]
    (ack,) = of_type(rd.messages, AppendEntriesResponse)
    assert ack.success and ack.index == 4


def test_truncating_a_committed_entry_is_fail_stop() -> None:
    """Leader Completeness makes it impossible for a legitimate leader to contradict a committed
    entry. A stale AppendEntries reaching below the commit is answered with the commit and never
    touches the log; a truncation below the commit anyway stops the node (etcd panics too)."""
    disk = storage_with((1, 2, 3), [entry(1, 0), entry(1, 1)], HardState(1, None, 1))
    n, _ = node(2, disk=disk)
    n.step(AppendEntries(1, 2, 2, 0, 1, 1, (entry(2, 1),)))
    (ack,) = of_type(drain(n, disk), AppendEntriesResponse)
    assert ack.success and ack.index == 1 and n.log.term_at(1) == 1
    with pytest.raises(RaftInvariantError, match="committed"):
        RaftLog(disk, commit=1, applied=None).truncate_and_append([entry(2, 1)])


@pytest.mark.parametrize(
    "follower_log",
    [
        # Figure 7 (offsets = paper index - 1), leader log terms 1 1 1 4 4 5 5 6 6 6 (+ no-op 8)
        [1, 1, 1, 4, 4, 5, 5, 6, 6],  # (a) missing entries
        [1, 1, 1, 4],  # (b) missing more
        [1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 6],  # (c) an extra uncommitted entry
        [1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 7, 7],  # (d) extra entries of a term the leader lacks
        [1, 1, 1, 4, 4, 4, 4],  # (e) a different term in the middle
        [1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3],  # (f) a whole divergent history
    ],
)
def test_leader_brings_every_figure7_follower_in_line(follower_log: list[int]) -> None:
    """§5.3, Figure 7: "the leader handles inconsistencies by forcing the followers' logs to
    duplicate its own." """
    leader_terms = [1, 1, 1, 4, 4, 5, 5, 6, 6, 6]

    def disk(terms: list[int]) -> MemoryStorage:
        entries = [entry(t, i) for i, t in enumerate(terms)]
        return storage_with((1, 2, 3), entries, HardState(7, None, -1))

    # Node 3 holds the leader's log and gives it the vote that (c) and (d) rightly refuse.
    net = Net(disks={1: disk(leader_terms), 2: disk(follower_log), 3: disk(leader_terms)})
    net.elect(1)
    assert [(e.term, e.last) for e in net.disks[2].all_entries()] == [
        (e.term, e.last) for e in net.disks[1].all_entries()
    ]
    net.tick(1)  # the commit reaches the follower with the next heartbeat (§5.3)
    assert net.nodes[2].commit == net.nodes[1].commit == len(leader_terms)


def test_backtracking_skips_a_whole_conflicting_term_per_round_trip() -> None:
    """§5.3: "the follower can include the term of the conflicting entry and the first index it
    stores for that term. With this information, the leader can decrement nextIndex to bypass
    all of the conflicting entries in that term." """
    leader_disk = storage_with(
        (1, 2, 3), [entry(1, 0)] + [entry(3, i) for i in range(1, 101)], HardState(4, None, -1)
    )
    follower_disk = storage_with(
        (1, 2, 3), [entry(1, 0)] + [entry(2, i) for i in range(1, 201)], HardState(4, None, -1)
    )
    net = Net(disks={1: leader_disk, 2: follower_disk})
    net.isolate(3)
    net.elect(1)
    rejects = [m for m in of_type(net.sent, AppendEntriesResponse) if m.src == 2 and not m.success]
    assert len(rejects) <= 2, rejects
    assert net.disks[2].last_index() == net.disks[1].last_index() == 101


# -- §5.4.2 ---------------------------------------------------------------------------------------


def _figure8_leader(bugs: frozenset[str]) -> tuple[RaftNode, object]:
    """Leader of term 4 whose log holds an uncommitted term-2 entry at offset 1 (Figure 8 (c))."""
    disk = storage_with((1, 2, 3, 4, 5), [entry(1, 0), entry(2, 1)], HardState(3, None, 0))
    n = RaftNode(RaftConfig(1, testing_bugs=bugs), disk, random.Random(0))
    n.campaign()
    for v in (2, 3):
        n.step(RequestVoteResponse(v, 1, 4, True, True))
    for v in (2, 3):
        n.step(RequestVoteResponse(v, 1, 4, True))
    assert n.role is Role.LEADER
    drain(n, disk)
    return n, disk


@pytest.mark.parametrize("bugs", [frozenset(), frozenset({BUG_COMMIT_OLD_TERM})])
def test_leader_counts_replicas_only_for_its_own_term(bugs: frozenset[str]) -> None:
    """§5.4.2: "Raft never commits log entries from previous terms by counting replicas. Only log
    entries from the leader's current term are committed by counting replicas." With the planted
    bug the leader commits the term-2 entry as soon as a majority holds it (Figure 8 (c))."""
    n, _ = _figure8_leader(bugs)
    for v in (2, 3):  # a majority (with the leader) now holds offset 1, not the no-op at 2
        n.step(AppendEntriesResponse(v, 1, 4, True, 1))
    if bugs:
        assert n.commit == 1
        return
    assert n.commit == 0
    for v in (2, 3):  # once the current term's no-op is on a majority, both commit together
        n.step(AppendEntriesResponse(v, 1, 4, True, 2))
    assert n.commit == 2


def test_new_leader_appends_a_noop() -> None:
    """§8: "each leader [commits] a blank no-op entry into the log at the start of its term"."""
    net = Net()
    net.elect(2)
    (noop,) = net.disks[1].all_entries()
    assert noop.kind is EntryKind.NOOP and noop.term == 1 and (noop.first, noop.last) == (0, 0)
    net.tick(2)  # followers learn the commit with the next heartbeat
    assert all(n.commit == 0 for n in net.nodes.values())


# -- §5.5 / Figure 2: persistence before answering ---------------------------------------------


@pytest.mark.parametrize("bugs", [frozenset(), frozenset({BUG_FORGET_VOTE})])
def test_vote_is_in_the_hard_state_persisted_before_the_answer(bugs: frozenset[str]) -> None:
    """Figure 2: "Persistent state on all servers (Updated on stable storage before responding to
    RPCs): currentTerm, votedFor, log[]". The planted bug leaves the vote out."""
    disk = storage_with((1, 2, 3))
    n = RaftNode(RaftConfig(1, testing_bugs=bugs), disk, random.Random(0))
    n.step(RequestVote(2, 1, 1, -1, 0))
    rd = take_ready(n, disk)
    assert of_type(rd.messages, RequestVoteResponse)[0].granted
    assert rd.hard_state == HardState(1, None if bugs else 2, -1)


def test_follower_persists_entries_in_the_ready_that_acknowledges_them() -> None:
    """Figure 2, AppendEntries receiver: entries are durable before the success answer (the
    Ready carries both; the driver sends only after persisting)."""
    n, _ = node(2)
    n.step(AppendEntries(1, 2, 1, -1, 0, -1, (entry(1, 0, 4),)))
    rd = n.ready()
    assert rd.entries == (entry(1, 0, 4),)
    assert of_type(rd.messages, AppendEntriesResponse)[0].index == 4


def test_proposal_at_a_follower_names_the_leader() -> None:
    """§8: "If the client's first choice is not the leader, that server will reject the client's
    request and supply information about the most recent leader it has heard from." """
    net = Net()
    net.elect(3)
    with pytest.raises(NotLeader) as err:
        net.nodes[1].propose(b"x")
    assert err.value.leader == 3


def test_heartbeat_commit_never_exceeds_the_followers_match() -> None:
    """A follower must not commit what it may not hold: heartbeats carry min(commit, match)."""
    net = Net()
    leader = net.elect(1)
    net.isolate(3)
    net.propose(1, b"x")
    net.heal()
    leader.read_index(b"r")  # a read waits for a round: every follower gets a heartbeat
    beats = {m.dst: m.commit for m in of_type(leader.ready().messages, Heartbeat)}
    assert beats[2] == leader.commit and beats[3] == 0
