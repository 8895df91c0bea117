"""The Ready / advance contract (etcd's ordering duties) and API misuse."""

from __future__ import annotations

import pytest

from kafkaesque.raft import (
    AppendEntries,
    AppendEntriesResponse,
    HardState,
    RaftUsageError,
    Role,
    SoftState,
)

from .harness import Net, entry, node, of_type, storage_with, take_ready


def test_ready_twice_without_advance_is_misuse() -> None:
    n, disk = node(1)
    n.campaign()
    rd = n.ready()
    assert not n.has_ready()
    with pytest.raises(RaftUsageError):
        n.ready()
    other, _ = node(2)
    with pytest.raises(RaftUsageError):
        n.advance(other.ready())
    disk.persist(rd)
    n.advance(rd)


def test_messages_to_or_from_the_wrong_node_are_misuse() -> None:
    n, _ = node(1)
    with pytest.raises(RaftUsageError):
        n.step(AppendEntries(2, 3, 1, -1, 0, -1))


def test_soft_state_reports_role_and_leader_changes() -> None:
    net = Net(ids=(1,))
    n = net.nodes[1]
    n.campaign()
    rd = n.ready()
    assert rd.soft_state == SoftState(Role.LEADER, 1)
    net.disks[1].persist(rd)
    n.advance(rd)
    assert n.has_ready()  # the no-op is durable now: its commit is the next Ready's work
    rd = take_ready(n, net.disks[1])
    assert rd.soft_state is None and rd.committed == (0, 0)


def test_steps_between_ready_and_advance_go_to_the_next_ready() -> None:
    """A follower receives entries, hands them out, then (before they are durable) learns from a
    new leader that they conflict: the next Ready truncates what the previous one wrote."""
    n, disk = node(2, disk=storage_with((1, 2, 3), [entry(1, 0)], HardState(1, None, 0)))
    n.step(AppendEntries(1, 2, 1, 0, 1, 0, (entry(1, 1), entry(1, 2))))
    first = n.ready()
    assert [e.first for e in first.entries] == [1, 2] and first.truncate_from is None
    n.step(AppendEntries(3, 2, 2, 1, 1, 0, (entry(2, 2, 3),)))  # keeps 1, replaces 2
    disk.persist(first)
    n.advance(first)
    second = n.ready()
    assert second.truncate_from == 2 and second.entries == (entry(2, 2, 3),)
    disk.persist(second)
    n.advance(second)
    assert [(e.first, e.term) for e in disk.all_entries()] == [(0, 1), (1, 1), (2, 2)]
    assert n.log.stable_last() == 3
    acks = [m.index for m in of_type(first.messages + second.messages, AppendEntriesResponse)]
    assert acks == [2, 3]


def test_leader_counts_itself_only_once_its_entries_are_durable() -> None:
    net = Net(ids=(1,))
    leader = net.elect(1)
    index = leader.propose(b"x")
    rd = leader.ready()
    assert rd.entries and leader.commit < index
    net.disks[1].persist(rd)
    leader.advance(rd)
    assert leader.commit == index


def test_a_restarted_node_keeps_term_vote_log_and_commit() -> None:
    net = Net()
    net.elect(2)
    net.propose(2, b"x")
    disk = net.disks[1]
    again, _ = node(1, disk=disk)
    assert (again.term, again.status().vote, again.commit) == (1, 2, disk.hard_state.commit)
    assert again.log.last_index() == disk.last_index() and again.role is Role.FOLLOWER
