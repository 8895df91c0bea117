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
    table.report(1, {"t/1": claim(2)})
    table.report(0, {"t/0": claim(3)})  # broker 0 lost t/1
    assert table.leader("t/1") == 1
    table.forget(1)
    assert table.leader("t/1") is None
    assert table.leader("t/0") == 0


def test_claims_survive_the_wire_and_garbage_is_refused() -> None:
    led = {"t/0": Claim(7, frozenset({1, 3}), frozenset({4}), False)}
    assert peer_from_wire(peer_to_wire(LeaderClaims(led))) == LeaderClaims(led)
    with pytest.raises(MalformedPeerMessage):
        peer_from_wire([*peer_to_wire(LeaderClaims({}))[:1], {"t/0": [1, [0]]}])
