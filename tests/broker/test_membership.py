"""``next_change``: the one-server-at-a-time path from a membership to an assignment."""

from __future__ import annotations

from collections.abc import Set

from hypothesis import given
from hypothesis import strategies as st

from kafkaesque.broker._membership import Change, next_change
from kafkaesque.raft import Configuration


def conf(voters: set[int], learners: Set[int] = frozenset()) -> Configuration:
    return Configuration(frozenset(voters), frozenset(learners))


def test_new_brokers_come_in_as_learners_before_anyone_leaves() -> None:
    assert next_change(conf({0, 1, 2}), frozenset({1, 2, 3}), 0) == Change("add_learner", 3)
    assert next_change(conf({0, 1, 2}, {3}), frozenset({1, 2, 3}), 0) == Change("promote", 3)


def test_a_follower_leaves_before_the_leader_hands_over() -> None:
    assert next_change(conf({0, 1, 2, 3}), frozenset({2, 3}), 0) == Change("remove", 1)
    assert next_change(conf({0, 2, 3}), frozenset({2, 3}), 0) == Change("transfer", 2)


def test_done_when_the_voters_are_the_assignment() -> None:
    assert next_change(conf({1, 2, 3}), frozenset({1, 2, 3}), 1) is None
    assert next_change(conf({1, 2}, {5}), frozenset({1, 2}), 1) == Change("remove", 5)


members = st.frozensets(st.integers(0, 6), min_size=1, max_size=5)


@given(members, members, st.data())
def test_following_the_steps_reaches_the_assignment_never_below_a_quorum(
    start: frozenset[int], target: frozenset[int], data: st.DataObject
) -> None:
    current = Configuration(start)
    leader = data.draw(st.sampled_from(sorted(start)))
    floor = min(len(start), len(target))
    for _ in range(4 * (len(start) + len(target)) + 2):
        change = next_change(current, target, leader)
        if change is None:
            break
        if change.action == "add_learner":
            current = current.add_learner(change.node)
        elif change.action == "promote":
            current = current.promote(change.node)
        elif change.action == "remove":
            assert change.node != leader
            current = current.remove(change.node)
        else:
            assert change.node in current.voters & target
            leader = change.node
        assert len(current.voters) >= floor  # never fewer voters than either side has
    assert current.voters == target and not current.learners
