"""One-server-at-a-time membership changes (thesis §4.1-§4.3)."""

from __future__ import annotations

import pytest

from kafkaesque.raft import (
    AppendEntries,
    Configuration,
    Entry,
    EntryKind,
    HardState,
    InvalidConfigChange,
    MemoryStorage,
    ProposalDropped,
    RequestVoteResponse,
    Role,
)

from .harness import Net, drain, entry, node, storage_with


def _net_with_spare() -> Net:
    """Voters 1-3 and node 4, which knows no configuration yet (a new broker)."""
    return Net(ids=(1, 2, 3, 4), voters=(1, 2, 3), disks={4: MemoryStorage()})


def test_learner_receives_the_log_but_neither_counts_nor_campaigns() -> None:
    """Thesis §4.2.1: new servers join as non-voting members until caught up."""
    net = _net_with_spare()
    leader = net.elect(1)
    net.propose(1, b"a")
    leader.add_learner(4)
    net.stabilize()
    assert net.nodes[4].configuration == Configuration.of([1, 2, 3], [4])
    assert net.disks[4].last_index() == net.disks[1].last_index()
    net.isolate(2)
    net.isolate(3)
    before = leader.commit
    leader.propose(b"needs a voter")
    net.stabilize()
    assert leader.commit == before  # the learner's copy does not count
    for _ in range(40):
        net.nodes[4].tick()
    assert net.nodes[4].role is Role.FOLLOWER


def test_promote_only_a_caught_up_learner() -> None:
    """Thesis §4.2.1: promote once the learner has caught up; promoting a lagging one would make
    the cluster wait for it."""
    net = _net_with_spare()
    leader = net.elect(1)
    net.isolate(4)
    leader.add_learner(4)
    net.stabilize()
    with pytest.raises(ProposalDropped, match="caught up"):
        leader.promote(4)
    net.heal()
    net.tick(1)
    leader.promote(4)
    net.stabilize()
    assert all(n.configuration.voters == {1, 2, 3, 4} for n in net.nodes.values())


def test_a_configuration_takes_effect_when_appended_and_is_undone_by_truncation() -> None:
    """Thesis §4.1: "a server always uses the latest configuration in its log, regardless of
    whether the entry is committed." Truncating that entry restores the previous one."""
    n, disk = node(2, disk=storage_with((1, 2, 3), [entry(1, 0)], HardState(1, None, 0)))
    new = Configuration.of([1, 2, 3], [4])
    n.step(AppendEntries(1, 2, 1, 0, 1, 0, (Entry(1, 1, 1, EntryKind.CONFIG, new.encode()),)))
    assert n.configuration == new and n.commit == 0
    drain(n, disk)
    n.step(AppendEntries(3, 2, 2, 0, 1, 0, (entry(2, 1),)))  # a new leader overwrites it
    assert n.configuration == Configuration.of([1, 2, 3])


def test_one_change_at_a_time_and_only_after_committing_in_term() -> None:
    """Thesis §4.1: "the leader [does not] begin another membership change until the previous
    ... has been committed"; and (raft-dev, 2015) not before an entry of its own term commits."""
    net = _net_with_spare()
    leader = net.elect(1)
    net.isolate(2)
    net.isolate(3)
    leader.add_learner(4)
    with pytest.raises(ProposalDropped, match="in flight"):
        leader.remove(3)
    net.heal()
    net.stabilize()
    net.tick(1)
    assert leader.remove(3) > 0

    fresh, _ = node(1)
    fresh.campaign()
    fresh.step(RequestVoteResponse(2, 1, 1, True, True))
    fresh.step(RequestVoteResponse(2, 1, 1, True))
    assert fresh.role is Role.LEADER
    with pytest.raises(ProposalDropped, match="committed"):
        fresh.remove(3)  # its no-op is not committed yet


def test_removing_a_follower_shrinks_the_quorum() -> None:
    net = Net()
    leader = net.elect(1)
    leader.remove(3)
    net.stabilize()
    net.isolate(3)
    net.isolate(2)
    before = leader.commit
    net.propose(1, b"x")
    assert leader.commit == before  # 2 voters: needs node 2
    net.heal()
    net.isolate(3)
    net.tick(1)
    assert leader.commit > before


def test_removed_leader_steps_down_after_committing_its_removal() -> None:
    """Thesis §4.2.2: "the leader steps down ... once the Cnew entry is committed"; until then it
    manages a cluster that does not include itself (it does not count its own vote)."""
    net = Net()
    leader = net.elect(1)
    net.isolate(2)
    net.isolate(3)
    leader.remove(1)
    net.stabilize()
    assert leader.role is Role.LEADER  # not committed: it cannot count itself
    net.heal()
    net.tick(1)
    assert leader.status().role is Role.FOLLOWER
    net.isolate(1)
    for _ in range(60):
        net.tick_all()
    new_leaders = [n for n in net.nodes.values() if n.role is Role.LEADER]
    assert [n.id for n in new_leaders] in ([2], [3])
    for _ in range(60):
        leader.tick()
    assert leader.status().role is Role.FOLLOWER  # a removed node never campaigns


def test_removed_leader_with_the_only_copy_of_its_removal_still_gets_elected() -> None:
    """Regression (found by the simulator): a leader appends its own removal, then loses
    leadership before committing it. Its log is the most up-to-date, so the remaining voter
    (still under the old configuration) refuses everybody else; the removed node must campaign
    under the new configuration, commit its removal, and then step down."""
    net = Net(ids=(1, 3), voters=(1, 3))
    leader = net.elect(1)
    net.isolate(3)
    removal = leader.remove(1)  # {1, 3} -> {3}
    net.stabilize()
    for _ in range(30):
        leader.tick()  # check-quorum: it steps down with the change uncommitted
    assert leader.role is Role.FOLLOWER and leader.configuration == Configuration.of([3])
    net.heal()
    for _ in range(100):
        net.tick_all()
        if net.nodes[3].commit >= removal and net.nodes[3].role is Role.LEADER:
            break
    assert net.nodes[3].configuration == Configuration.of([3])
    assert net.nodes[3].commit >= removal and net.nodes[3].role is Role.LEADER
    assert net.nodes[1].role is Role.FOLLOWER


def test_invalid_changes_raise() -> None:
    net = Net()
    leader = net.elect(1)
    with pytest.raises(InvalidConfigChange):
        leader.add_learner(2)
    with pytest.raises(InvalidConfigChange):
        leader.promote(2)
    with pytest.raises(InvalidConfigChange):
        leader.remove(9)
    solo = Net(ids=(1,))
    with pytest.raises(InvalidConfigChange, match="last voter"):
        solo.elect(1).remove(1)
