"""A group member that dies with no LEAVE does not outlive its session on a new coordinator.

Found by an outside fault run: after a cluster restart, a member whose connection had died with
its broker still owned every partition of its topic long after the session timeout (10 s), so a
new member that asked for them all got one. The rule (Kafka's GroupCoordinator, as it loads a
group): a coordinator that loads a group, at its start or when it takes over, gives every member
one session from then, and expires those it has not heard from by its end, on its own timer.

The first tests run the coordinator's logic on trio's mock clock over a stand-in broker whose
offsets partitions are real ``PartitionLog``s; the last runs real brokers.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import msgpack
import pytest
import trio
import trio.testing

from kafkaesque.broker._errors import RequestError
from kafkaesque.broker._groups import OFFSETS_PARTITIONS, OFFSETS_TOPIC, GroupCoordinator
from kafkaesque.broker._metadata_view import TopicConfig, TopicInfo
from kafkaesque.local_cluster import LocalCluster
from kafkaesque.protocol import (
    Commit,
    EndReply,
    ErrorCode,
    OkReply,
    ReplyDecoder,
    Subs,
    Touch,
    partition_for_key,
)
from kafkaesque.raft import Role
from kafkaesque.storage import (
    BatchType,
    PartitionLog,
    Record,
    build_batch,
    decode_records,
    iter_batches,
)

from .line_client import LineClient
from .test_groups import assignment_timeline, owners

if TYPE_CHECKING:
    from kafkaesque.broker._metadata import ClusterMetadata
    from kafkaesque.broker._read_path import ReadPath
    from kafkaesque.broker._writes import WritePath

SESSION_S = 10.0
TOPIC = "three"


# -- a stand-in broker: what the coordinator uses of one ------------------------------------------


@dataclass
class _Node:
    term: int = 0


class _Replica:
    """This broker's replica of one ``__consumer_offsets`` partition: a real log, a term, a role.

    Every append commits at once (a healthy quorum); ``refuse`` makes the next writes fail as a
    lost quorum does (``TIMEOUT``), ``stall_s`` makes each write hang that long first.
    """

    def __init__(self, directory: Path) -> None:
        self.log = PartitionLog.open(str(directory))
        self.node = _Node()
        self.role = Role.FOLLOWER
        self.commit_index = -1
        self.refuse = 0
        self.stall_s = 0.0

    @property
    def committed_in_term(self) -> bool:
        return self.log.term_at(self.commit_index) == self.node.term

    def append(self, records: list[Record], batch_type: BatchType = BatchType.DATA) -> int:
        result = self.log.append(build_batch(records, batch_type=batch_type), term=self.node.term)
        self.commit_index = result.last_offset
        return result.last_offset

    def take_over(self) -> None:
        """Win an election: a new term, whose no-op commits (the table can be read)."""
        self.node.term += 1
        self.role = Role.LEADER
        self.append([Record(value=b"")], BatchType.NOOP)

    def records(self) -> Iterator[tuple[list[Any], Any]]:
        """Every data record of the log, decoded: (key, value)."""
        data = self.log.read(0, 1 << 24).data
        pos = 0
        for header in iter_batches(data):
            batch = data[pos : pos + header.size]
            pos += header.size
            if header.batch_type is BatchType.DATA:
                for r in decode_records(batch, header):
                    assert r.key is not None
                    yield (
                        msgpack.unpackb(r.key),
                        None if r.value is None else msgpack.unpackb(r.value),
                    )


@dataclass
class _Config:
    id: int = 0
    write_timeout_s: float = 10.0


class _Writes:
    def __init__(self, replicas: dict[int, _Replica], timeout: float) -> None:
        self._replicas = replicas
        self.timeout = timeout

    def _replica(self, log_id: str) -> _Replica:
        topic, _, partition = log_id.rpartition("/")
        assert topic == OFFSETS_TOPIC
        return self._replicas[int(partition)]

    def leader_of(self, log_id: str) -> int | None:
        return 0 if self._replica(log_id).role is Role.LEADER else None

    async def write_as_leader(self, log_id: str, batch: bytes, count: int) -> tuple[int, int]:
        replica = self._replica(log_id)
        if replica.role is not Role.LEADER:
            raise RequestError(ErrorCode.NOT_LEADER, "not the leader")
        if replica.stall_s:
            await trio.sleep(replica.stall_s)
            raise RequestError(ErrorCode.TIMEOUT, "not committed in time")
        if replica.refuse:
            replica.refuse -= 1
            raise RequestError(ErrorCode.TIMEOUT, "not committed in time")
        result = replica.log.append(batch, term=replica.node.term)
        replica.commit_index = result.last_offset
        return result


@dataclass
class _View:
    topics: dict[str, TopicInfo] = field(default_factory=dict)


@dataclass
class _Metadata:
    view: _View


class _Reads:
    def __init__(self, replicas: dict[int, _Replica]) -> None:
        self._replicas = replicas

    def local_replica(self, topic: str, partition: int) -> _Replica | None:
        return self._replicas.get(partition) if topic == OFFSETS_TOPIC else None


class _Broker:
    def __init__(self, directory: Path) -> None:
        self.replicas = {p: _Replica(directory / str(p)) for p in range(OFFSETS_PARTITIONS)}
        self.config = _Config()
        self.writes = _Writes(self.replicas, self.config.write_timeout_s)
        self.reads = _Reads(self.replicas)
        offsets = TopicConfig(OFFSETS_PARTITIONS, 1, compact=True)
        self.metadata = _Metadata(
            _View(
                {
                    TOPIC: TopicInfo(TOPIC, TopicConfig(3, 1), ((0,),) * 3),
                    OFFSETS_TOPIC: TopicInfo(OFFSETS_TOPIC, offsets, ((0,),) * OFFSETS_PARTITIONS),
                }
            )
        )

    def close(self) -> None:
        for replica in self.replicas.values():
            replica.log.close()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[_Broker]:
    b = _Broker(tmp_path)
    yield b
    b.close()


async def _no_read_index(log_id: str) -> int:
    raise AssertionError(f"no read barrier expected on {log_id}")


async def _no_forward(broker: int, command: Any, wait_s: float) -> bytes:
    raise AssertionError(f"no command is forwarded here: {command!r}")


def _coordinator(broker: _Broker) -> GroupCoordinator:
    return GroupCoordinator(
        broker.config.id,
        SESSION_S,
        metadata=cast("ClusterMetadata", broker.metadata),
        writes=cast("WritePath", broker.writes),
        reads=cast("ReadPath", broker.reads),
        read_index=_no_read_index,
        forward_to=_no_forward,
        nursery=lambda: None,
    )


def _joined_earlier(replica: _Replica, group: str, member: str, partitions: list[int]) -> None:
    """``member`` joined ``group`` under an earlier coordinator and got ``partitions``."""
    replica.node.term += 1
    replica.append(
        [
            Record(key=msgpack.packb(["m", group, TOPIC, member]), value=msgpack.packb(3)),
            Record(
                key=msgpack.packb(["a", group, TOPIC]), value=msgpack.packb({member: partitions})
            ),
        ]
    )


def _members(replica: _Replica, group: str) -> set[str]:
    """The members of ``group`` as its partition's log has them now."""
    members: set[str] = set()
    for key, value in replica.records():
        if key[:3] == ["m", group, TOPIC] and value is None:
            members.discard(key[3])  # it left
        elif key[:3] == ["m", group, TOPIC]:
            members.add(key[3])
    return members


def _assignment(replica: _Replica, group: str) -> dict[str, list[int]]:
    latest: dict[str, list[int]] = {}
    for key, value in replica.records():
        if key == ["a", group, TOPIC]:
            latest = value
    return latest


async def _until_gone(replica: _Replica, group: str, member: str, bound_s: float) -> float:
    """When ``member``'s leaving record is in the log (fails after ``bound_s``)."""
    with trio.fail_after(bound_s):
        while member in _members(replica, group):
            await trio.sleep(0.05)
    return trio.current_time()


def _group_on(partition: int) -> str:
    """A group name whose coordinator is ``partition`` of the offsets topic."""
    return next(
        g
        for i in range(1000)
        if partition_for_key((g := f"g{i}").encode(), OFFSETS_PARTITIONS) == partition
    )


async def _execute(coordinator: GroupCoordinator, command: Subs | Commit | Touch) -> Any:
    decoder = ReplyDecoder()
    decoder.feed(await coordinator.execute(command, forwarded=False))
    return decoder.next_event()


# -- the coordinator, on the mock clock ------------------------------------------------------------


async def test_a_member_loaded_at_a_takeover_expires_one_session_after_it(
    broker: _Broker, autojump_clock: trio.testing.MockClock
) -> None:
    group = _group_on(3)
    replica = broker.replicas[3]
    dead = "3.dead"
    _joined_earlier(replica, group, dead, [0, 1, 2])
    coordinator = _coordinator(broker)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(coordinator.run_expiry)
        await trio.sleep(3 * SESSION_S)  # a follower's replica: not its to expire
        assert _members(replica, group) == {dead}
        replica.take_over()  # and no request ever comes
        took_over = trio.current_time()
        gone = await _until_gone(replica, group, dead, 5 * SESSION_S)
        assert took_over + SESSION_S <= gone <= took_over + SESSION_S + 1
        assert _assignment(replica, group) == {}
        # The next subscriber that asks for every partition gets every partition.
        reply = await _execute(coordinator, Subs(TOPIC, group, 3))
        assert isinstance(reply, OkReply)
        assert _assignment(replica, group) == {reply.text: [0, 1, 2]}
        nursery.cancel_scope.cancel()


async def test_a_failed_eviction_is_retried_at_the_next_tick_not_after_a_new_session(
    broker: _Broker, autojump_clock: trio.testing.MockClock
) -> None:
    group = _group_on(5)
    replica = broker.replicas[5]
    _joined_earlier(replica, group, "5.dead", [0, 1, 2])
    coordinator = _coordinator(broker)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(coordinator.run_expiry)
        replica.take_over()
        took_over = trio.current_time()
        assert isinstance(await _execute(coordinator, Commit(group, TOPIC, 0, 7)), OkReply)
        replica.refuse = 2  # the first two evictions' writes fail (outcome unknown)
        gone = await _until_gone(replica, group, "5.dead", 5 * SESSION_S)
        assert replica.refuse == 0
        assert took_over + SESSION_S <= gone <= took_over + SESSION_S + 1
        nursery.cancel_scope.cancel()


async def test_a_partition_whose_writes_stall_delays_no_other_partitions_evictions(
    broker: _Broker, autojump_clock: trio.testing.MockClock
) -> None:
    stalled, healthy = broker.replicas[1], broker.replicas[6]
    _joined_earlier(stalled, _group_on(1), "1.dead", [0, 1, 2])
    _joined_earlier(healthy, _group_on(6), "6.dead", [0, 1, 2])
    coordinator = _coordinator(broker)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(coordinator.run_expiry)
        stalled.take_over()
        healthy.take_over()
        took_over = trio.current_time()
        for group in (_group_on(1), _group_on(6)):  # requests load both tables
            assert isinstance(await _execute(coordinator, Commit(group, TOPIC, 0, 7)), OkReply)
        stalled.stall_s = broker.config.write_timeout_s
        gone = await _until_gone(healthy, _group_on(6), "6.dead", 5 * SESSION_S)
        assert took_over + SESSION_S <= gone <= took_over + SESSION_S + 1
        assert _members(stalled, _group_on(1)) == {"1.dead"}
        nursery.cancel_scope.cancel()


async def test_a_member_heard_from_stays_and_expires_one_session_after_its_last_word(
    broker: _Broker, autojump_clock: trio.testing.MockClock
) -> None:
    group = _group_on(2)
    replica = broker.replicas[2]
    member = "2.alive"
    _joined_earlier(replica, group, member, [0, 1, 2])
    coordinator = _coordinator(broker)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(coordinator.run_expiry)
        replica.take_over()
        for offset in range(1, 7):  # a COMMIT member= every half session, for three sessions
            await trio.sleep(SESSION_S / 2)
            reply = await _execute(coordinator, Commit(group, TOPIC, 0, offset, member))
            assert isinstance(reply, OkReply), reply
        last_word = trio.current_time()
        assert _assignment(replica, group) == {member: [0, 1, 2]}
        gone = await _until_gone(replica, group, member, 5 * SESSION_S)
        assert last_word + SESSION_S <= gone <= last_word + SESSION_S + 1
        nursery.cancel_scope.cancel()


def _tasks_under(nursery: trio.Nursery) -> int:
    """Every task that runs inside ``nursery``, at any depth."""
    return sum(
        1 + sum(_tasks_under(child) for child in task.child_nurseries)
        for task in nursery.child_tasks
    )


async def test_an_idle_expiry_is_one_timer_and_work_runs_only_where_there_is_some(
    broker: _Broker, autojump_clock: trio.testing.MockClock
) -> None:
    """Not a task per offsets partition (an idle broker woke eight timers four times a second):
    one timer, and a partition's eviction in a task of its own only while it has one to do."""
    group = _group_on(4)
    replica = broker.replicas[4]
    _joined_earlier(replica, group, "4.dead", [0, 1, 2])
    coordinator = _coordinator(broker)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(coordinator.run_expiry)
        await trio.sleep(SESSION_S)  # a follower everywhere: nothing to do
        assert _tasks_under(nursery) == 1
        replica.take_over()
        took_over = trio.current_time()
        gone = await _until_gone(replica, group, "4.dead", 5 * SESSION_S)
        assert took_over + SESSION_S <= gone <= took_over + SESSION_S + 1
        await trio.sleep(SESSION_S)  # the table loaded, nobody left: nothing to do again
        assert _tasks_under(nursery) == 1
        nursery.cancel_scope.cancel()


# -- liveness by connection (issue 37): touches, and a member's own session timeout -------------


async def test_touches_keep_a_member_alive_and_it_expires_one_session_after_the_last(
    broker: _Broker, autojump_clock: trio.testing.MockClock
) -> None:
    group = _group_on(2)
    replica = broker.replicas[2]
    coordinator = _coordinator(broker)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(coordinator.run_expiry)
        replica.take_over()
        member = (await _execute(coordinator, Subs(TOPIC, group))).text
        for _ in range(9):  # what its broker sends while its connection is open: 3 sessions
            await trio.sleep(SESSION_S / 3)
            assert isinstance(await _execute(coordinator, Touch(2, ("2.other", member))), OkReply)
        last_touch = trio.current_time()
        assert _members(replica, group) == {member}
        gone = await _until_gone(replica, group, member, 5 * SESSION_S)
        assert last_touch + SESSION_S <= gone <= last_touch + SESSION_S + 1
        nursery.cancel_scope.cancel()


async def test_a_held_member_is_touched_by_its_broker_until_its_connection_closes(
    broker: _Broker, autojump_clock: trio.testing.MockClock
) -> None:
    """``hold`` and ``run_keep_alive``: the broker's side (here coordinating too)."""
    group = _group_on(4)
    replica = broker.replicas[4]
    coordinator = _coordinator(broker)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(coordinator.run_expiry)
        nursery.start_soon(coordinator.run_keep_alive)
        replica.take_over()
        member = (await _execute(coordinator, Subs(TOPIC, group))).text
        coordinator.hold(member)
        await trio.sleep(5 * SESSION_S)  # nothing but the keep-alive is heard from it
        assert _members(replica, group) == {member}
        coordinator.connection_closed({member})  # no nursery here: no LEAVE, only no touches
        closed = trio.current_time()
        gone = await _until_gone(replica, group, member, 5 * SESSION_S)
        assert closed <= gone <= closed + SESSION_S + 1
        nursery.cancel_scope.cancel()


async def test_a_member_with_its_own_session_timeout_is_not_kept_alive_by_touches(
    broker: _Broker, autojump_clock: trio.testing.MockClock
) -> None:
    group = _group_on(6)
    replica = broker.replicas[6]
    coordinator = _coordinator(broker)
    own_s = 2.0
    async with trio.open_nursery() as nursery:
        nursery.start_soon(coordinator.run_expiry)
        nursery.start_soon(coordinator.run_keep_alive)
        replica.take_over()
        member = (await _execute(coordinator, Subs(TOPIC, group, None, int(own_s * 1000)))).text
        joined = trio.current_time()
        coordinator.hold(member)  # held anyway (its broker never does): touches are ignored

        async def touch() -> None:
            while True:
                await _execute(coordinator, Touch(6, (member,)))
                await trio.sleep(own_s / 4)

        nursery.start_soon(touch)
        gone = await _until_gone(replica, group, member, 5 * SESSION_S)
        assert joined + own_s <= gone <= joined + own_s + 1
        assert [k for k, v in replica.records() if k[0] == "s"] == [
            ["s", group, TOPIC, member],  # its own timeout, written with its join
            ["s", group, TOPIC, member],  # and its tombstone, written with its leaving
        ]
        nursery.cancel_scope.cancel()


async def test_a_new_coordinator_gives_a_member_its_own_session_timeout_from_the_log(
    broker: _Broker, autojump_clock: trio.testing.MockClock
) -> None:
    group = _group_on(3)
    replica = broker.replicas[3]
    _joined_earlier(replica, group, "3.own", [0, 1, 2])
    replica.append(
        [Record(key=msgpack.packb(["s", group, TOPIC, "3.own"]), value=msgpack.packb(1500))]
    )
    coordinator = _coordinator(broker)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(coordinator.run_expiry)
        replica.take_over()
        took_over = trio.current_time()
        gone = await _until_gone(replica, group, "3.own", 5 * SESSION_S)
        assert took_over + 1.5 <= gone <= took_over + 1.5 + 1  # not the broker's 10 s
        nursery.cancel_scope.cancel()


# -- real brokers ----------------------------------------------------------------------------------

PROCESS_SESSION_S = 2.0
# Beyond the session: leader elections after the restart, the expiry's tick and the eviction's
# write, on a loaded 2-core machine. Not a speed: without the rule, the member never goes.
MARGIN_S = 20.0


def test_a_member_lost_in_a_cluster_restart_is_expired_with_no_request_and_its_partitions_freed(
    tmp_path: Path,
) -> None:
    """A member owns all 3 partitions; every broker dies (its connection with them: no LEAVE);
    the cluster comes back and nobody asks about the group: one session after the coordinator
    took over, the member is gone, and a new member that asks for 3 partitions owns all 3."""
    args = ["--session-timeout", str(PROCESS_SESSION_S)]
    coordinator_partition = partition_for_key(b"crew", OFFSETS_PARTITIONS)
    with LocalCluster(str(tmp_path), 3, extra_args=args) as cluster:
        with LineClient(cluster.client_address(0)) as admin:
            admin.ok(f"CREATE {TOPIC} 3 3")
            admin.rows(f"OFFSETS crew {TOPIC}")  # creates __consumer_offsets
            old = LineClient(cluster.client_address(1))
            gone = old.ok(f"SUBS {TOPIC} crew 3")
            assert owners(admin, "crew", TOPIC) == {0: gone, 1: gone, 2: gone}
        for b in range(3):
            cluster.kill(b)
        old.close()
        cluster.start_all()
        cluster.wait_ready()
        ready = time.monotonic()
        with LineClient(cluster.client_address(0)) as c:
            # Only the log is read (FETCH): no group command that would load the group.
            timeline = None
            while time.monotonic() < ready + PROCESS_SESSION_S + MARGIN_S:
                timeline = assignment_timeline(c, coordinator_partition, "crew", TOPIC)
                if timeline and timeline[-1][1] == {}:
                    break
                time.sleep(0.2)
            assert timeline and timeline[-1][1] == {}, f"{gone} was never expired: {timeline}"
        with LineClient(cluster.client_address(2)) as c:
            new = c.ok(f"SUBS {TOPIC} crew 3")
            end = c.rows(f"CONS {TOPIC} {new} 0")[-1]
            assert isinstance(end, EndReply)
            assert {p for p, _ in end.next_offsets} == {0, 1, 2}
            assert owners(c, "crew", TOPIC) == {0: new, 1: new, 2: new}
