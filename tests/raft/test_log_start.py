"""Catching up a follower that fell behind the leader's log start (retention).

The log is the state, so there is no snapshot to send: the leader says where its log starts
(InstallLogStart: start offset, term at start - 1, configuration there) and the follower resets
its log to start there, then receives entries as usual (Raft §7, reduced to the log itself).
"""

from __future__ import annotations

from kafkaesque.raft import (
    AppendEntries,
    AppendEntriesResponse,
    Configuration,
    HardState,
    InstallLogStart,
    LogReset,
)

from .harness import Net, drain, entry, node, of_type, storage_with, take_ready


def test_follower_behind_the_log_start_is_reset_then_caught_up() -> None:
    net = Net()
    leader = net.elect(1)
    net.isolate(3)
    for i in range(10):
        net.propose(1, b"%d" % i)
    net.disks[1].compact(leader.applied + 1)  # retention deleted everything applied
    start = net.disks[1].start_offset()
    net.heal()
    net.tick(1)
    installs = of_type(net.sent, InstallLogStart)
    assert [(m.dst, m.start) for m in installs] == [(3, start)]
    assert net.disks[3].start_offset() == start
    assert net.disks[3].all_entries() == net.disks[1].all_entries()
    assert net.nodes[3].commit == leader.commit
    assert net.nodes[3].configuration == Configuration.of([1, 2, 3])


def test_reset_is_a_ready_field_applied_before_entries() -> None:
    n, disk = node(3, disk=storage_with((1, 2, 3), [entry(1, 0), entry(2, 1)], HardState(2)))
    n.step(InstallLogStart(1, 3, 3, 50, 3, Configuration.of([1, 2, 3])))
    rd = take_ready(n, disk)
    assert rd.log_reset == LogReset(50, 3, Configuration.of([1, 2, 3]))
    assert rd.hard_state is not None and rd.hard_state.commit == 49
    (ack,) = of_type(rd.messages, AppendEntriesResponse)
    assert ack.success and ack.index == 49
    assert (disk.start_offset(), disk.last_index(), disk.term_at(49)) == (50, 49, 3)


def test_a_follower_whose_log_matches_only_fast_forwards() -> None:
    """Like etcd's restore: if the log already holds start - 1 with that term, keep it."""
    entries = [entry(1, 0), entry(1, 1, 5), entry(2, 6, 9)]
    n, disk = node(3, disk=storage_with((1, 2, 3), entries, HardState(2, None, 0)))
    n.step(InstallLogStart(1, 3, 2, 6, 1, Configuration.of([1, 2, 3])))
    rd = take_ready(n, disk)
    assert rd.log_reset is None and n.commit == 5 and disk.last_index() == 9


def test_an_install_below_the_commit_is_only_acknowledged() -> None:
    entries = [entry(1, 0), entry(1, 1, 5)]
    n, disk = node(3, disk=storage_with((1, 2, 3), entries, HardState(1, None, 5)))
    n.step(InstallLogStart(1, 3, 1, 3, 1, Configuration.of([1, 2, 3])))
    (ack,) = of_type(drain(n, disk), AppendEntriesResponse)
    assert ack.success and ack.index == 5 and disk.start_offset() == 0


def test_a_follower_whose_whole_window_was_lost_behind_the_log_start_is_reset() -> None:
    """Found by the soak: every append of a full window was lost, then retention deleted where
    the window ends. There is nothing left to probe with there, so the leader probes from the
    follower's match, which brings InstallLogStart."""
    net = Net(max_inflight=2)
    leader = net.elect(1)
    net.propose(1, b"a")
    net.drops.append(lambda m: m.dst == 3 and isinstance(m, AppendEntries))
    for i in range(4):  # the first two fill node 3's window and are lost; the rest wait
        net.propose(1, b"%d" % i)
    net.disks[1].compact(leader.applied + 1)
    net.heal()
    net.tick(1, times=5)
    assert [m.dst for m in of_type(net.sent, InstallLogStart)] == [3]
    assert net.nodes[3].commit == leader.commit
    assert net.disks[3].all_entries() == net.disks[1].all_entries()
