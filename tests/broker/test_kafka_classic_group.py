"""The classic consumer-group state machine (Kafka's rules), driven directly with a fake clock:
joins that form generations, the leader's assignment handed to each member, heartbeats during a
rebalance, sessions that expire, KIP-394 member ids, static members (KIP-345), commit rules."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
import trio

from kafkaesque.broker.kafka._classic_group import (
    ClassicGroup,
    GroupState,
    JoinRequest,
    Pending,
)
from kafkaesque.protocol.kafka import KafkaError

E = KafkaError


def request(
    member_id: str = "",
    *,
    instance: str | None = None,
    protocols: list[tuple[str, bytes]] | None = None,
    session_s: float = 10.0,
    rebalance_s: float = 30.0,
    version: int = 5,
    protocol_type: str = "consumer",
) -> JoinRequest:
    return JoinRequest(
        member_id=member_id,
        instance_id=instance,
        client_id="c",
        client_host="127.0.0.1",
        session_timeout_s=session_s,
        rebalance_timeout_s=rebalance_s,
        protocol_type=protocol_type,
        protocols=protocols or [("range", b"meta-" + member_id.encode())],
        version=version,
    )


def done(answer: dict[str, Any] | Pending) -> dict[str, Any]:
    """The answer of a request that must have been answered by now."""
    if isinstance(answer, Pending):
        assert answer.done.is_set(), "still waiting"
        return answer.answer
    return answer


def new_member(group: ClassicGroup, now: float, **kw: Any) -> str:
    """A v4+ join without an id: MEMBER_ID_REQUIRED with the id to join with."""
    answer = done(group.join(request(**kw), now))
    assert answer["error_code"] == E.MEMBER_ID_REQUIRED
    member_id: str = answer["member_id"]
    return member_id


def form(group: ClassicGroup, now: float, count: int) -> list[str]:
    """``count`` members join an empty group at ``now`` and sync once its initial delay is
    over: a Stable group of generation 1."""
    ids = [new_member(group, now) for _ in range(count)]
    joins = [group.join(request(m), now) for m in ids]
    now += group.initial_delay_s
    group.tick(now)
    answers = [done(j) for j in joins]
    assert {a["error_code"] for a in answers} == {E.NONE}
    leader = answers[0]["leader"]
    generation = answers[0]["generation_id"]
    assignments = {m: f"part-{m}".encode() for m in ids}
    syncs = {
        m: group.sync(m, None, generation, assignments if m == leader else {}, now)
        for m in [m for m in ids if m != leader] + [leader]
    }
    for m, s in syncs.items():
        assert done(s) == {"error_code": E.NONE, "assignment": f"part-{m}".encode()}
    assert group.state is GroupState.STABLE
    return ids


def test_a_single_member_forms_generation_one_and_leads_it() -> None:
    group = ClassicGroup("g")
    member = new_member(group, 0.0)
    answer = done(group.join(request(member), 0.0))
    assert answer["generation_id"] == 1 and answer["leader"] == member
    assert answer["protocol_name"] == "range"
    assert answer["members"] == [
        {"member_id": member, "group_instance_id": None, "metadata": b"meta-" + member.encode()}
    ]
    assert group.state is GroupState.COMPLETING_REBALANCE
    assert done(group.sync(member, None, 1, {member: b"all"}, 0.0))["assignment"] == b"all"
    assert group.describe()["group_state"] == "Stable"


def test_the_initial_delay_gathers_members_that_start_together() -> None:
    group = ClassicGroup("g", initial_delay_s=3.0)
    a, b = new_member(group, 0.0), new_member(group, 0.0)
    join_a = group.join(request(a), 0.0)
    join_b = group.join(request(b), 1.0)
    assert isinstance(join_a, Pending) and not join_a.done.is_set()
    group.tick(2.9)
    assert not join_a.done.is_set()
    group.tick(3.0)
    answers = [done(join_a), done(join_b)]
    assert {x["generation_id"] for x in answers} == {1}
    assert [len(x["members"]) for x in answers] == [2, 0]  # only the leader sees the members


def test_a_new_member_rebalances_the_group_heartbeats_say_so_and_the_rejoin_completes_it() -> None:
    group = ClassicGroup("g")
    [a] = form(group, 0.0, 1)
    b = new_member(group, 1.0)
    join_b = group.join(request(b), 1.0)
    assert group.state is GroupState.PREPARING_REBALANCE
    assert isinstance(join_b, Pending) and not join_b.done.is_set()
    assert group.heartbeat(a, None, 1, 2.0) == E.REBALANCE_IN_PROGRESS
    join_a = group.join(request(a), 3.0)
    answers = done(join_a), done(join_b)
    assert {x["generation_id"] for x in answers} == {2}
    assert group.heartbeat(a, None, 1, 3.0) == E.ILLEGAL_GENERATION
    assert group.heartbeat(a, None, 2, 3.0) == E.NONE  # completing: members may heartbeat


def test_a_member_that_does_not_rejoin_is_dropped_at_the_rebalance_deadline() -> None:
    group = ClassicGroup("g", initial_delay_s=0.5)
    a, b = form(group, 0.0, 2)
    group.leave(b, None, 1.0)
    assert group.state is GroupState.PREPARING_REBALANCE
    c = new_member(group, 1.0)
    join_c = group.join(request(c), 1.0)
    for t in (9.0, 18.0, 27.0):  # a heartbeats (in the background) but never rejoins
        assert group.heartbeat(a, None, 1, t) == E.REBALANCE_IN_PROGRESS
        group.tick(t)
    group.tick(30.0)
    assert isinstance(join_c, Pending) and not join_c.done.is_set()  # a has 30 s to rejoin
    group.tick(31.5)
    answer = done(join_c)
    assert answer["generation_id"] == 2 and answer["leader"] == c
    assert list(group.members) == [c]
    assert group.heartbeat(a, None, 1, 32.0) == E.UNKNOWN_MEMBER_ID


def test_a_silent_member_expires_after_its_session_and_the_group_rebalances() -> None:
    group = ClassicGroup("g", initial_delay_s=0.5)
    a, b = form(group, 0.0, 2)
    for t in (3.0, 6.0, 9.0, 12.0):
        assert group.heartbeat(a, None, 1, t) == E.NONE
        group.tick(t)
    assert b not in group.members  # silent since 0.0, session 10 s
    assert group.heartbeat(a, None, 1, 12.5) == E.REBALANCE_IN_PROGRESS
    assert done(group.join(request(a), 13.0))["generation_id"] == 2


def test_a_member_waiting_in_join_or_sync_does_not_expire() -> None:
    group = ClassicGroup("g")
    [a] = form(group, 0.0, 1)
    b = new_member(group, 0.0)
    join_b = group.join(request(b, rebalance_s=100.0), 0.0)
    group.tick(50.0)  # a missed its session: dropped; b waits, alive
    answer = done(join_b)
    assert answer["leader"] == b and a not in group.members


def test_the_last_member_leaving_empties_the_group() -> None:
    group = ClassicGroup("g")
    [a] = form(group, 0.0, 1)
    assert group.leave(a, None, 1.0) == E.NONE
    assert group.state is GroupState.EMPTY and not group.members
    assert group.leave(a, None, 1.0) == E.UNKNOWN_MEMBER_ID


def test_an_empty_group_keeps_its_protocol_type_until_a_member_of_another_type_joins() -> None:
    # Kafka Connect's workers form a group of type "connect"; once they all stop, the group is
    # Empty and ListGroups and DescribeGroups still say "connect" (not a consumer group), as in
    # Kafka. A member of another type may then take the empty group over, and sets its type.
    group = ClassicGroup("g")
    worker = new_member(group, 0.0, protocol_type="connect")
    done(group.join(request(worker, protocol_type="connect"), 0.0))
    done(group.sync(worker, None, 1, {worker: b"all"}, 0.0))
    assert group.leave(worker, None, 1.0) == E.NONE
    assert group.state is GroupState.EMPTY
    assert group.describe()["protocol_type"] == "connect"
    assert ClassicGroup.saved_protocol_type(group.saved()) == "connect"
    restored = ClassicGroup.restored("g", group.saved(), 2.0)
    assert restored.describe()["protocol_type"] == "connect"
    consumer = new_member(group, 3.0)
    assert done(group.join(request(consumer), 3.0))["error_code"] == E.NONE
    assert group.describe()["protocol_type"] == "consumer"


def test_sync_waits_for_the_leader_and_a_rebalance_answers_waiting_syncs() -> None:
    group = ClassicGroup("g", initial_delay_s=0.5)
    a, b = new_member(group, 0.0), new_member(group, 0.0)
    joins = [group.join(request(a), 0.0), group.join(request(b), 0.0)]
    group.tick(0.5)
    leader = done(joins[0])["leader"]
    follower = b if leader == a else a
    waiting = group.sync(follower, None, 1, {}, 0.0)
    assert isinstance(waiting, Pending) and not waiting.done.is_set()
    c = new_member(group, 1.0)
    group.join(request(c), 1.0)  # a rebalance before the leader synced
    assert done(waiting)["error_code"] == E.REBALANCE_IN_PROGRESS
    assert done(group.sync(follower, None, 1, {}, 1.0))["error_code"] == E.REBALANCE_IN_PROGRESS


def test_errors_for_unknown_members_wrong_generations_and_bad_requests() -> None:
    group = ClassicGroup("g")
    [a] = form(group, 0.0, 1)
    assert done(group.join(request("nobody"), 1.0))["error_code"] == E.UNKNOWN_MEMBER_ID
    assert done(group.sync("nobody", None, 1, {}, 1.0))["error_code"] == E.UNKNOWN_MEMBER_ID
    assert done(group.sync(a, None, 7, {}, 1.0))["error_code"] == E.ILLEGAL_GENERATION
    assert group.heartbeat("nobody", None, 1, 1.0) == E.UNKNOWN_MEMBER_ID
    short = request(session_s=1.0)
    assert done(group.join(short, 1.0))["error_code"] == E.INVALID_SESSION_TIMEOUT
    other = request(protocols=[("sticky", b"")])
    assert done(group.join(other, 1.0))["error_code"] == E.INCONSISTENT_GROUP_PROTOCOL
    connect = request(protocol_type="connect")
    assert done(group.join(connect, 1.0))["error_code"] == E.INCONSISTENT_GROUP_PROTOCOL


def test_old_clients_join_without_a_member_id_round() -> None:
    group = ClassicGroup("g")
    answer = done(group.join(request(version=3), 0.0))
    assert answer["error_code"] == E.NONE and answer["member_id"] in group.members


def test_an_unused_kip394_member_id_is_forgotten_after_a_session() -> None:
    group = ClassicGroup("g")
    member = new_member(group, 0.0)
    group.tick(11.0)
    assert done(group.join(request(member), 11.0))["error_code"] == E.UNKNOWN_MEMBER_ID


def test_the_protocol_most_members_prefer_among_the_common_ones_is_chosen() -> None:
    group = ClassicGroup("g", initial_delay_s=0.5)
    both = [("cooperative-sticky", b"x"), ("range", b"y")]
    ids = [new_member(group, 0.0) for _ in range(3)]
    prefs = [both, both, [("range", b"z"), ("cooperative-sticky", b"w")]]
    joins = [group.join(request(m, protocols=p), 0.0) for m, p in zip(ids, prefs, strict=True)]
    group.tick(0.5)
    answers = [done(j) for j in joins]
    assert {a["protocol_name"] for a in answers} == {"cooperative-sticky"}
    leader_view = next(a for a in answers if a["members"])
    assert [m["metadata"] for m in leader_view["members"]] == [b"x", b"x", b"w"]


def test_a_restarted_static_member_takes_its_place_without_a_rebalance() -> None:
    group = ClassicGroup("g", initial_delay_s=0.5)
    joins = [group.join(request(instance=f"host-{x}"), 0.0) for x in "ab"]
    group.tick(0.5)
    a, b = (done(j)["member_id"] for j in joins)
    assert done(group.sync(a, "host-a", 1, {a: b"A", b: b"B"}, 0.0))["assignment"] == b"A"
    assert done(group.sync(b, "host-b", 1, {}, 0.0))["assignment"] == b"B"
    # host-b restarts: a new member id, the same generation and assignment, no rebalance.
    rejoined = done(group.join(request(instance="host-b"), 1.0))
    new_b = rejoined["member_id"]
    assert new_b != b and rejoined["generation_id"] == 1
    assert group.state is GroupState.STABLE
    assert done(group.sync(new_b, "host-b", 1, {}, 1.0))["assignment"] == b"B"
    # The old incarnation is fenced.
    assert group.heartbeat(b, "host-b", 1, 1.0) == E.FENCED_INSTANCE_ID
    assert group.heartbeat(a, "host-a", 1, 1.0) == E.NONE


def test_commits_follow_kafkas_rules() -> None:
    group = ClassicGroup("g")
    assert group.commit_error("", None, -1, 0.0) == E.NONE  # no members: a manual commit
    [a] = form(group, 0.0, 1)
    assert group.commit_error("", None, -1, 0.0) == E.UNKNOWN_MEMBER_ID
    assert group.commit_error(a, None, 1, 0.0) == E.NONE
    assert group.commit_error(a, None, 0, 0.0) == E.ILLEGAL_GENERATION
    b = new_member(group, 1.0)
    group.join(request(b), 1.0)
    assert group.commit_error(a, None, 1, 1.0) == E.NONE  # preparing: the old generation may
    group.join(request(a), 1.0)
    assert group.state is GroupState.COMPLETING_REBALANCE
    assert group.commit_error(a, None, 2, 1.0) == E.REBALANCE_IN_PROGRESS


def test_a_coordinator_that_gives_the_group_up_answers_every_waiting_request() -> None:
    group = ClassicGroup("g")
    form(group, 0.0, 1)
    b = new_member(group, 0.0)
    join_b = group.join(request(b), 0.0)
    group.close(E.NOT_COORDINATOR)
    assert done(join_b)["error_code"] == E.NOT_COORDINATOR
    assert group.state is GroupState.DEAD


@pytest.mark.parametrize("count", [1, 2, 5])
def test_pending_answers_wake_a_waiting_trio_task(count: int) -> None:
    async def main() -> None:
        group = ClassicGroup("g", initial_delay_s=0.05)
        ids = [new_member(group, trio.current_time()) for _ in range(count)]
        answers: list[dict[str, Any]] = []

        async def join(m: str) -> None:
            pending = group.join(request(m), trio.current_time())
            if isinstance(pending, Pending):
                await pending.done.wait()
                answers.append(pending.answer)
            else:
                answers.append(pending)

        async def clock() -> None:  # the coordinator's timer
            while True:
                await trio.sleep(0.01)
                group.tick(trio.current_time())

        with trio.fail_after(5):
            async with trio.open_nursery() as outer:
                outer.start_soon(clock)
                async with trio.open_nursery() as nursery:
                    for m in ids:
                        nursery.start_soon(join, m)
                outer.cancel_scope.cancel()
        assert len(answers) == count and {a["generation_id"] for a in answers} == {1}

    trio.run(main)


def test_a_group_restored_from_its_saved_membership_goes_on_in_the_same_generation() -> None:
    """A new coordinator restores what the old one saved (through msgpack, as the log keeps
    it): same generation, leader and assignments, each member one session from the takeover."""
    group = ClassicGroup("g", initial_delay_s=0.5)
    a, b = form(group, 0.0, 2)
    assert group.saved_key() == (1, (a, b))
    saved = msgpack.unpackb(msgpack.packb(group.saved()))
    taken_over = ClassicGroup.restored("g", saved, 100.0)
    assert taken_over.describe() == group.describe()
    assert taken_over.saved_key() == group.saved_key()
    assert taken_over.heartbeat(a, None, 1, 105.0) == E.NONE
    assert done(taken_over.sync(b, None, 1, {}, 105.0))["assignment"] == f"part-{b}".encode()
    assert taken_over.commit_error(a, None, 1, 105.0) == E.NONE
    taken_over.tick(111.0)  # b was last heard from at 105: alive; a too
    assert set(taken_over.members) == {a, b}
    taken_over.tick(116.0)
    assert not taken_over.members  # neither was heard from for a session since


def test_only_a_formed_generation_or_an_empty_group_is_saved() -> None:
    group = ClassicGroup("g")
    assert group.saved_key() == (0, ())
    [a] = form(group, 0.0, 1)
    b = new_member(group, 1.0)
    group.join(request(b), 1.0)
    assert group.saved_key() is None  # forming: nothing to save
    group.leave(a, None, 2.0)
    group.leave(b, None, 2.0)
    assert group.saved_key() == (3, ())
