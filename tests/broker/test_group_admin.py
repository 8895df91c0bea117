"""Consumer group admin against real brokers (issue 26): ``GROUPS`` lists and describes groups,
``RESETOFFSETS`` moves an inactive group's offsets (earliest, latest, an offset, a time) and a new
member starts there, ``DELGROUP`` forgets an inactive group; both refuse a group with members.

Every request goes to a broker chosen so that it is, in turn, the coordinator and not: a command
that reaches another broker is forwarded to the coordinator, as the other group commands are."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import msgpack
import pytest
import trio

from kafkaesque.broker._groups import OFFSETS_TOPIC, _apply_record, _reset_to, _Table
from kafkaesque.client import AsyncClient, Client, GroupConsumer, KafkaesqueError
from kafkaesque.local_cluster import LocalCluster
from kafkaesque.protocol import (
    ErrorCode,
    ErrorReply,
    GroupRow,
    GroupStateRow,
    MemberRow,
    OffsetRow,
    ResetKind,
    ResetOffsets,
)

from .line_client import LineClient

PARTITIONS = 3


@pytest.fixture(scope="module")
def client(broker_cluster: LocalCluster) -> Iterator[Client]:
    with Client(broker_cluster.bootstrap) as c:
        yield c


def _wait(what: str, done: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _publish(client: Client, topic: str, count: int, tag: str) -> dict[int, list[int]]:
    """``count`` records spread over every partition; partition → their offsets."""
    written: dict[int, list[int]] = {}
    for i in range(count):
        p, offset = client.publish(topic, f"{tag}{i}".encode(), partition=i % PARTITIONS)
        written.setdefault(p, []).append(offset)
    return written


def _read_all(
    client: Client, bootstrap: str, topic: str, group: str, expected: int
) -> list[tuple[int, int]]:
    """What a new member of ``group`` reads (from the committed offsets), as (partition, offset);
    it polls until it has ``expected`` records and one more poll finds nothing new, then leaves
    (and this waits until the group is empty again). It commits nothing."""
    seen: list[tuple[int, int]] = []
    with GroupConsumer(bootstrap, topic, group, auto_offset_reset="earliest") as member:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            records = member.poll(0.3)
            seen.extend((r.partition, r.offset) for r in records)
            if len(seen) >= expected and not records:
                break
    _wait("the reader's leaving", _empty(client, group, topic))
    return sorted(seen)


def _empty(client: Client, group: str, topic: str) -> Callable[[], bool]:
    def check() -> bool:
        [description] = client.describe_consumer_group(group, topic)
        return description.state.state == "Empty"

    return check


def test_list_and_describe_a_live_group(broker_cluster: LocalCluster, client: Client) -> None:
    client.create_topic("admin1", PARTITIONS, 3)
    written = _publish(client, "admin1", 12, "a")
    members = [LineClient(broker_cluster.client_address(i % 3)) for i in range(4)]
    try:
        ids = [m.ok("SUBS admin1 watchers").split()[0] for m in members]
        # 4 members, 3 partitions: one member owns none, and is shown all the same.
        members[0].ok("COMMIT watchers admin1 0 2")
        listed = client.list_groups()
        assert GroupStateRow("watchers", "admin1", "Stable", 4) in listed
        with LineClient(broker_cluster.client_address(2)) as admin:
            answer = admin.rows("GROUPS watchers")
        assert answer[0] == GroupStateRow("watchers", "admin1", "Stable", 4)
        member_rows = [r for r in answer if isinstance(r, MemberRow)]
        assert {r.member for r in member_rows} == set(ids)
        owned = sorted(p for r in member_rows for p in r.partitions)
        assert owned == list(range(PARTITIONS))
        assert sum(1 for r in member_rows if not r.partitions) == 1

        [description] = client.describe_consumer_group("watchers")
        assert description.topic == "admin1" and description.state.members == 4
        by_partition = {r.partition: r for r in description.partitions}
        assert sorted(by_partition) == list(range(PARTITIONS))
        row = by_partition[0]
        assert row.committed == 2 and row.end == written[0][-1] + 1
        assert row.end - row.committed > 0  # the lag a CLI table shows
        assert by_partition[1].committed is None and by_partition[1].owner in ids
        # The topic named: the same group, that topic only.
        assert client.describe_consumer_group("watchers", "admin1") == [description]
    finally:
        for m in members:
            m.close()


def test_reset_is_refused_while_active_and_moves_an_inactive_groups_offsets(
    broker_cluster: LocalCluster, client: Client
) -> None:
    client.create_topic("admin2", PARTITIONS, 3)
    first = _publish(client, "admin2", 9, "old")
    bootstrap = broker_cluster.bootstrap
    with LineClient(broker_cluster.client_address(1)) as live:
        live.ok("SUBS admin2 rewinders")
        for i in range(3):
            with LineClient(broker_cluster.client_address(i)) as admin:
                for dry in ("", " dry_run=yes"):  # a dry run makes the same check
                    refused = admin.call(f"RESETOFFSETS rewinders admin2 earliest{dry}")
                    assert isinstance(refused, ErrorReply), refused
                    assert refused.code is ErrorCode.GROUP_NOT_EMPTY
        with pytest.raises(KafkaesqueError) as caught:
            client.reset_offsets("rewinders", "admin2", "latest")
        assert caught.value.code is ErrorCode.GROUP_NOT_EMPTY
    _wait("the member's leaving", _empty(client, "rewinders", "admin2"))

    # A dry run answers the offsets a reset would set and changes nothing.
    before = client.committed_offsets("rewinders", "admin2")
    planned = client.reset_offsets("rewinders", "admin2", "earliest", dry_run=True)
    assert planned == dict.fromkeys(range(PARTITIONS), 0)
    assert client.committed_offsets("rewinders", "admin2") == before

    # latest: a new member reads only what comes after the reset.
    ends = {p: offsets[-1] + 1 for p, offsets in first.items()}
    assert client.reset_offsets("rewinders", "admin2", "latest") == ends
    assert _read_all(client, bootstrap, "admin2", "rewinders", 0) == []

    # earliest: back to the log start, backwards past what was committed.
    assert client.reset_offsets("rewinders", "admin2", "earliest") == dict.fromkeys(ends, 0)
    everything = sorted((p, o) for p, offsets in first.items() for o in offsets)
    assert _read_all(client, bootstrap, "admin2", "rewinders", len(everything)) == everything

    # An offset: each partition's own records from there; past the end is kept at the end.
    target = first[0][1]
    with LineClient(broker_cluster.client_address(0)) as admin:
        rows = admin.rows(f"RESETOFFSETS rewinders admin2 offset={target}")
    new = {r.partition: r.offset for r in rows if isinstance(r, OffsetRow)}
    assert new == {p: min(target, ends[p]) for p in ends}
    from_target = sorted((p, o) for p, offsets in first.items() for o in offsets if o >= target)
    assert _read_all(client, bootstrap, "admin2", "rewinders", len(from_target)) == from_target
    far = client.reset_offsets("rewinders", "admin2", "offset", 10**12)
    assert far == ends

    # A time: the first records at or after it, as DESCRIBE time= finds them.
    time.sleep(0.05)  # the next records' timestamps are past `since`
    since = int(time.time() * 1000)
    time.sleep(0.05)
    second = _publish(client, "admin2", 6, "new")
    at_time = client.reset_offsets("rewinders", "admin2", "time", since)
    assert at_time == {p: offsets[0] for p, offsets in second.items()}
    by_time = client.offsets_for_times({("admin2", p): since for p in ends})
    assert at_time == {tp.partition: o for tp, o in by_time.items()}
    fresh = sorted((p, o) for p, offsets in second.items() for o in offsets)
    assert _read_all(client, bootstrap, "admin2", "rewinders", len(fresh)) == fresh


def test_delete_is_refused_while_active_then_the_group_is_gone(
    broker_cluster: LocalCluster, client: Client
) -> None:
    client.create_topic("admin3", PARTITIONS, 3)
    _publish(client, "admin3", 6, "d")
    with LineClient(broker_cluster.client_address(2)) as live:
        member = live.ok("SUBS admin3 leavers").split()[0]
        live.ok(f"COMMIT leavers admin3 0 1 member={member}")
        for i in range(3):
            with LineClient(broker_cluster.client_address(i)) as admin:
                refused = admin.call("DELGROUP leavers")
                assert isinstance(refused, ErrorReply) and refused.code is ErrorCode.GROUP_NOT_EMPTY
    _wait("the member's leaving", _empty(client, "leavers", "admin3"))
    assert GroupStateRow("leavers", "admin3", "Empty", 0) in client.list_groups()

    client.delete_group("leavers")
    assert all(g.group != "leavers" for g in client.list_groups())
    for i in range(3):
        with LineClient(broker_cluster.client_address(i)) as admin:
            for line in ("GROUPS leavers", "GROUPS leavers admin3", "DELGROUP leavers"):
                gone = admin.call(line)
                assert isinstance(gone, ErrorReply) and gone.code is ErrorCode.UNKNOWN_GROUP, line
    assert client.committed_offsets("leavers", "admin3") == dict.fromkeys(range(PARTITIONS))
    # The name is free again: a new member starts afresh (nothing committed).
    with LineClient(broker_cluster.client_address(0)) as again:
        again.ok("SUBS admin3 leavers")
        rows = again.rows("GROUPS leavers admin3")
        assert rows[0] == GroupStateRow("leavers", "admin3", "Stable", 1)
        assert all(r.committed is None for r in rows if isinstance(r, GroupRow))


async def test_the_trio_client_lists_describes_resets_and_deletes(
    broker_cluster: LocalCluster,
) -> None:
    async with AsyncClient(broker_cluster.bootstrap) as client:
        await client.create_topic("admin4", PARTITIONS, 3)
        for i in range(PARTITIONS):
            await client.publish("admin4", b"x%d" % i, partition=i)
        with LineClient(broker_cluster.client_address(0)) as live:
            member = live.ok("SUBS admin4 trio-readers").split()[0]
            [described] = await client.describe_consumer_group("trio-readers")
            assert described.state == GroupStateRow("trio-readers", "admin4", "Stable", 1)
            assert [m.member for m in described.members] == [member]
            assert GroupStateRow("trio-readers", "admin4", "Stable", 1) in (
                await client.list_groups()
            )
            with pytest.raises(KafkaesqueError) as refused:
                await client.delete_group("trio-readers")
            assert refused.value.code is ErrorCode.GROUP_NOT_EMPTY
        deadline = time.monotonic() + 20
        while (await client.describe_consumer_group("trio-readers"))[0].state.members:
            assert time.monotonic() < deadline, "the member never left"
            await trio.sleep(0.05)
        ends = await client.reset_offsets("trio-readers", "admin4", ResetKind.LATEST)
        assert sorted(ends) == list(range(PARTITIONS)) and all(o >= 1 for o in ends.values())
        assert await client.committed_offsets("trio-readers", "admin4") == ends
        await client.delete_group("trio-readers")
        with pytest.raises(KafkaesqueError) as gone:
            await client.describe_consumer_group("trio-readers")
        assert gone.value.code is ErrorCode.UNKNOWN_GROUP


def test_a_cluster_without_groups_answers_so_and_creates_no_offsets_topic(
    tmp_path: Path,
) -> None:
    with LocalCluster(str(tmp_path), 1) as cluster, Client(cluster.bootstrap) as fresh:
        assert fresh.list_groups() == []
        for ask in (lambda: fresh.describe_consumer_group("g"), lambda: fresh.delete_group("g")):
            with pytest.raises(KafkaesqueError) as unknown:
                ask()
            assert unknown.value.code is ErrorCode.UNKNOWN_GROUP
        assert OFFSETS_TOPIC not in {t.topic for t in fresh.list_topics()}
        fresh.create_topic("solo", 1, 1)  # a reset may place a group before it ever reads
        assert fresh.reset_offsets("g", "solo", "latest") == {0: 1}  # after the leader's no-op
        [placed] = fresh.describe_consumer_group("g")
        assert placed.state == GroupStateRow("g", "solo", "Empty", 0)


# -- units ----------------------------------------------------------------------------------------


def test_a_reset_target_is_each_partitions_bounds_and_an_offset_is_clamped() -> None:
    bounds = (10, 20)  # log start, end
    assert _reset_to(ResetOffsets("g", "t", ResetKind.EARLIEST), bounds) == 10
    assert _reset_to(ResetOffsets("g", "t", ResetKind.LATEST), bounds) == 20
    assert _reset_to(ResetOffsets("g", "t", ResetKind.OFFSET, 15), bounds) == 15
    assert _reset_to(ResetOffsets("g", "t", ResetKind.OFFSET, 3), bounds) == 10  # below start
    assert _reset_to(ResetOffsets("g", "t", ResetKind.OFFSET, 99), bounds) == 20  # past the end
    assert _reset_to(ResetOffsets("g", "t", ResetKind.TIME, 1), (10, 20, 17)) == 17


def test_tombstones_remove_a_groups_offsets_and_assignment_from_the_table() -> None:
    table = _Table(term=1)

    def apply(key: list[object], value: object) -> None:
        packed = None if value is None else msgpack.packb(value)
        _apply_record(table, key, packed, deadline=0.0)

    apply(["o", "g", "t", 0], 5)
    apply(["o", "g", "t", 1], 7)
    apply(["o", "other", "t", 0], 3)
    apply(["m", "g", "t", "0.a"], -1)
    apply(["a", "g", "t"], {"0.a": [0, 1]})
    apply(["m", "g", "t", "0.a"], None)  # it left
    apply(["a", "g", "t"], {})
    assert ("g", "t") in table.groups and not table.groups[("g", "t")].members
    tombstoned: list[list[object]] = [["a", "g", "t"], ["o", "g", "t", 0], ["o", "g", "t", 1]]
    for key in tombstoned:
        apply(key, None)  # DELGROUP's batch
    assert table.groups == {}
    assert table.offsets == {("other", "t", 0): 3}
    assert table.member_of == {} and table.deadlines == {}
