"""``LeaderTable``: the highest term wins; a broker's report replaces its earlier one."""

from __future__ import annotations

import pytest

from kafkaesque.broker._leaders import Claim, LeaderTable
from kafkaesque.protocol import LeaderClaims, MalformedPeerMessage, peer_from_wire, peer_to_wire


def claim(term: int, voters: tuple[int, ...] = (0, 1, 2), committed: bool = True) -> Claim:
    return Claim(term, frozenset(voters), frozenset(), committed)


def test_the_claim_of_the_highest_term_wins() -> None:
    table = LeaderTable()
    table.report(0, {"t/0": claim(3)})
    table.report(1, {"t/0": claim(5)})
    table.report(2, {"t/0": claim(4)})  # a stale leader still reporting
    assert table.leader("t/0") == 1


def test_a_new_report_replaces_the_old_one_and_forget_drops_a_broker() -> None:
    table = LeaderTable()
    table.report(0, {"t/0": claim(3), "t/1": claim(3)})
    table.report(0, {"t/0": claim(3)})  # broker 0 lost t/1
    assert table.leader("t/1") is None
    table.report(1, {"t/1": claim(4)})  # the next leader of t/1
    assert table.leader("t/1") == 1
    table.forget(1)
    assert table.leader("t/1") is None
    assert table.leader("t/0") == 0


def test_a_withdrawn_leader_does_not_hand_its_group_to_a_lower_term() -> None:
    """The G1a of issue 36's seed 119: n0 led term 5 and lost power; n2, paused, still claimed
    term 4. Believing n2 sent a retry to a deposed leader, which refused it as definite."""
    table = LeaderTable()
    table.report(2, {"t/0": claim(4)})
    table.report(0, {"t/0": claim(5)})
    assert table.leader("t/0") == 0
    table.forget(0)
    assert table.leader("t/0") is None  # not n2: term 5 existed
    table.report(2, {"t/0": claim(4)})  # n2 resumes, still reporting its old term
    assert table.leader("t/0") is None
    table.report(1, {"t/0": claim(6)})  # the election's winner
    assert table.leader("t/0") == 1
    table.report(1, {})  # n1 steps down (check-quorum): again no lower term
    assert table.leader("t/0") is None
    table.report(0, {"t/0": claim(6)})  # (a claim of the same term is not below it)
    assert table.leader("t/0") == 0


def test_a_group_no_broker_claims_may_start_again_at_term_one() -> None:
    """A deleted topic's groups go from every report; one made again with the same name starts
    its terms from the beginning and must be believed."""
    table = LeaderTable()
    table.report(0, {"t/0": claim(7)})
    table.report(1, {"t/0": claim(3)})
    table.forget(0)
    assert table.leader("t/0") is None
    table.report(1, {})  # the topic is deleted: nobody claims t/0
    table.report(2, {"t/0": claim(1)})  # the new t/0
    assert table.leader("t/0") == 2
    table.report(2, {"u/0": claim(1)})
    table.report(2, {"u/0": claim(1), "t/0": claim(1)})
    assert table.leader("t/0") == 2


def test_claims_survive_the_wire_and_garbage_is_refused() -> None:
    led = {"t/0": Claim(7, frozenset({1, 3}), frozenset({4}), False)}
    assert peer_from_wire(peer_to_wire(LeaderClaims(led))) == LeaderClaims(led)
    with pytest.raises(MalformedPeerMessage):
        peer_from_wire([*peer_to_wire(LeaderClaims({}))[:1], {"t/0": [1, [0]]}])
