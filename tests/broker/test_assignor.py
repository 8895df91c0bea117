"""The group assignment under random joins, leaves, crashes and timeouts (hypothesis).

After every step: one owner per partition, shares balanced within one (among uncapped members),
caps honoured, and sticky: a member that stays loses partitions only when its share shrank, and
only as many as it must.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from kafkaesque.broker._assignor import MemberSpec, assign


def test_three_members_share_six_partitions_two_each() -> None:
    members = [MemberSpec("a"), MemberSpec("b"), MemberSpec("c")]
    result = assign(range(6), members, {})
    assert sorted(len(p) for p in result.values()) == [2, 2, 2]
    # c leaves: a and b keep theirs and split c's.
    after = assign(range(6), members[:2], result)
    assert result["a"] <= after["a"] and result["b"] <= after["b"]
    assert after["a"] | after["b"] == frozenset(range(6))


def test_a_capped_member_takes_at_most_its_cap() -> None:
    result = assign(range(10), [MemberSpec("a", 1), MemberSpec("b")], {})
    assert len(result["a"]) == 1 and len(result["b"]) == 9


class GroupMachine(RuleBasedStateMachine):
    """A group whose members come and go; the coordinator reassigns after every change."""

    @initialize(partitions=st.integers(1, 40))
    def start(self, partitions: int) -> None:
        self.partitions = range(partitions)
        self.members: list[MemberSpec] = []
        self.assignment: dict[str, frozenset[int]] = {}
        self.counter = 0

    def _rebalance(self) -> None:
        before = self.assignment
        self.assignment = assign(self.partitions, self.members, before)
        share = len(self.partitions) // max(1, len(self.members))
        for m in self.members:
            kept = before.get(m.id, frozenset())
            now = self.assignment[m.id]
            lost = kept - now
            # Sticky: a member loses partitions only to shrink to at least its fair share.
            assert not lost or len(now) >= min(share, m.max_partitions or share), (kept, now)

    @rule(cap=st.none() | st.integers(1, 5))
    def join(self, cap: int | None) -> None:
        self.counter += 1
        self.members.append(MemberSpec(f"m{self.counter}", cap))
        self._rebalance()

    @rule(data=st.data())
    def leave_crash_or_time_out(self, data: st.DataObject) -> None:
        if self.members:
            gone = data.draw(st.sampled_from(self.members))
            self.members.remove(gone)
            self._rebalance()

    @invariant()
    def one_owner_per_partition_and_balanced(self) -> None:
        if not hasattr(self, "partitions"):
            return
        owners: dict[int, str] = {}
        for member, owned in self.assignment.items():
            for p in owned:
                assert p not in owners, f"partition {p} has two owners"
                owners[p] = member
        capped = {m.id: m.max_partitions for m in self.members if m.max_partitions is not None}
        for m in self.members:
            if m.max_partitions is not None:
                assert len(self.assignment[m.id]) <= m.max_partitions
        free = [m for m in self.members if m.id not in capped]
        sizes = [len(self.assignment[m.id]) for m in free]
        if sizes:
            assert max(sizes) - min(sizes) <= 1, sizes
        room = sum(min(c or 0, len(self.partitions)) for c in capped.values())
        if free or room >= len(self.partitions):
            assert len(owners) == len(self.partitions), "a partition has no owner"


TestGroupMachine = GroupMachine.TestCase
