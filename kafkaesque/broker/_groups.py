"""Consumer groups: membership, server-side assignment and committed offsets, by a coordinator.

Everything about a group lives in one partition of the internal compacted topic
``__consumer_offsets`` (``partition_for_key(group)``), replicated by our own Raft as Kafka and
Redpanda keep it, and the leader of that partition is the group's **coordinator**. Its records,
keyed by msgpack lists so the latest record of a key wins (and compaction may drop the rest):

* ``["m", group, topic, member]`` → ``cap`` (-1: none): a member joined; no value: it left;
* ``["s", group, topic, member]`` → ``ms``: the member's own session timeout (SUBS
  ``session_timeout_ms=``), written with its join; no value: it left (readers that do not know
  this kind skip it, so a coordinator of before it reads the log as before);
* ``["a", group, topic]`` → ``{member: [partitions]}``: the assignment in force;
* ``["o", group, topic, partition]`` → ``offset``: the committed offset (next to read);
* ``["k", group, topic, partition]`` → ``[offset, leader epoch, metadata]``: a **Kafka** group's
  committed offset (OffsetCommit, see ``kafkaesque/broker/kafka/_groups.py``). Kafka groups have
  their own key, so a Kafka group and a line-protocol group of the same name never see or change
  each other's offsets;
* ``["g", group]`` → the Kafka group's membership as its coordinator last saved it (its
  generation, members and assignments, encoded by the Kafka front), so that a new coordinator
  takes the group over as it was (Kafka's group metadata records).

A ``o``, ``a``, ``k`` or ``g`` key with no value (a tombstone) is a deleted group's (DELGROUP,
DeleteGroups).

Any broker takes any group command (SUBS, CONS, COMMIT, OFFSETS, LEAVE, GROUPS, RESETOFFSETS,
DELGROUP) and forwards it to the coordinator, which answers from a table it builds by reading
its partition's committed log (from where it stopped). A join or leave writes one batch (the
member record and the new assignment, atomically) and is answered once it is committed; the
assignment comes from ``_assignor.assign`` (balanced, sticky). A subscription id is
``<offsets partition>.<random>``, so any broker knows where its coordinator is.

Liveness: a member is gone when its connection closes (the broker that served its SUBS sends a
LEAVE) or when the coordinator has not heard from it for its session timeout. Hearing from a
member is a SUBS, CONS or COMMIT member= of it, or a ``Touch`` naming it: the connection is the
liveness (a person at a telnet prompt sends no heartbeats), so every broker keeps the members that
its open connections joined (``hold``) and, every third of its session timeout, sends each offsets
partition's coordinator one ``Touch(partition, members)`` naming those of that partition
(``run_keep_alive``). A broker that dies or is cut off from the coordinator stops touching, so its
members expire one session after its last touch; a closed connection leaves at once. A member
whose SUBS asked for its own timeout (``session_timeout_ms=``: a client that heartbeats and wants a
hung process noticed) is not held, a ``Touch`` naming it is ignored, and its deadline is its own
timeout (an ``s`` record, so that a new coordinator knows it too), not the broker's. Why a touch
per partition and period, not per member or CONS: the keep-alive costs each broker one small
message per coordinator every few seconds, however many idle connections it has, and a
coordinator need not know which broker serves which member. Each member's deadline is the
coordinator's memory, never a record: a coordinator that
loads a table (at its start, or when it takes the partition over) gives every member in it one
session from then, as Kafka's GroupCoordinator does when it loads a group, so a failover causes
no rebalance, and a member that died with its connection (no LEAVE: its broker died too) is
expired one session after the takeover at the latest. The coordinator loads a partition it leads
on its own timer, without waiting for a request, and evicts on that timer: a partition's
evictions never wait for a request, nor for another partition's stalled writes, and an eviction
whose write fails is retried at the next tick (the member stays expired: it gets no new session).

Admin (as Kafka's ``kafka-consumer-groups.sh``): ``GROUPS`` without a group asks every offsets
partition's coordinator for its groups (a ``ListGroups(partition)`` each) and joins the rows.
A reset is a commit of new offsets, written as one batch, that may go backwards; a delete writes
tombstones (no value) for the group's ``o`` and ``a`` keys, so its table entry goes and compaction,
which keeps a tombstone as its key's latest record, keeps the log saying the same. Both are
refused while the group has members (``GROUP_NOT_EMPTY``), checked and written under the
partition's membership lock, so no member can join between the check and the write.

Fencing: the assignment is checked when CONS or COMMIT names a partition, and again when CONS's
answer is built (after its reads, with no await in between), so a partition is never served to
two members at once; a member that lost a partition gets ``NOT_ASSIGNED``. Only the coordinator
answers; it must have committed an entry of its own term first, so it knows every commit.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgpack
import trio

from kafkaesque.protocol import (
    GROUP_OFFSETS_TOPIC,
    Commit,
    Cons,
    DeleteGroup,
    DescribeGroup,
    EndReply,
    ErrorCode,
    FetchOffsets,
    GroupCommand,
    GroupRow,
    GroupStateRow,
    Leave,
    ListGroups,
    MemberRow,
    MessageRow,
    OffsetRow,
    OkReply,
    Reply,
    ResetKind,
    ResetOffsets,
    Subs,
    Touch,
    encode_reply,
    partition_for_key,
)
from kafkaesque.raft import NotLeader, Role
from kafkaesque.raft.driver import CommitTimeout
from kafkaesque.storage import (
    Record,
    build_batch,
    data_records,
)

from ._assignor import MemberSpec, assign
from ._errors import RequestError, known_topic
from ._log_ids import log_id_of
from ._metadata import ClusterMetadata
from ._metadata_view import TopicConfig, TopicExistsError, TopicInfo
from ._read_path import ReadPath
from ._reads import DEFAULT_CONS_MESSAGES, read_committed
from ._writes import WritePath

log = logging.getLogger("kafkaesque.broker.groups")

OFFSETS_TOPIC = GROUP_OFFSETS_TOPIC
OFFSETS_PARTITIONS = 8
_READ_BYTES = 1 << 20
_LEADER_READY_POLL_S = 0.01
_EXPIRY_EVERY_S = 0.25
_TOUCH_MEMBERS = 1000  # ids per Touch: a peer message stays far below the transport's frame


@dataclass(frozen=True, slots=True)
class KafkaOffset:
    """A Kafka group's committed position in one partition, as OffsetCommit gives it: the next
    offset to read, the leader epoch of the record before it (-1: unknown) and the client's
    metadata string."""

    offset: int
    leader_epoch: int = -1
    metadata: str | None = None


@dataclass
class _Group:
    members: dict[str, MemberSpec] = field(default_factory=dict)  # in join order
    assignment: dict[str, frozenset[int]] = field(default_factory=dict)


@dataclass
class _Table:
    """One offsets partition's groups and offsets, read from its log up to ``next_offset``.

    ``deadlines`` is not read from the log: it is when the coordinator must next hear from each
    member (``trio.current_time()`` clock). Invariant: its keys are exactly ``member_of``'s. A
    member read from the log gets the time it was read plus its session timeout; a table is
    built afresh in each term this broker leads, so a takeover gives every member one session.
    ``sessions`` holds the members that asked for their own session timeout (seconds), read from
    their ``s`` records. Invariant: its keys are a subset of ``member_of``'s.
    """

    term: int
    next_offset: int = 0
    offsets: dict[tuple[str, str, int], int] = field(default_factory=dict)
    groups: dict[tuple[str, str], _Group] = field(default_factory=dict)
    member_of: dict[str, tuple[str, str]] = field(default_factory=dict)
    deadlines: dict[str, float] = field(default_factory=dict)
    sessions: dict[str, float] = field(default_factory=dict)
    # Kafka groups' committed offsets: group -> (topic, partition) -> offset (``k`` records).
    kafka_offsets: dict[str, dict[tuple[str, int], KafkaOffset]] = field(default_factory=dict)
    # Kafka groups' last saved membership (``g`` records), as the Kafka front encoded it.
    kafka_groups: dict[str, Any] = field(default_factory=dict)

    def expired(self, now: float) -> list[str]:
        """The members whose deadline is at or before ``now``, the most overdue first."""
        late = [(deadline, m) for m, deadline in self.deadlines.items() if deadline <= now]
        return [m for _, m in sorted(late)]


class GroupCoordinator:
    """The group commands of one broker (see the module docstring).

    Built by the broker with what a coordinator works through: the replicated metadata (the
    topics, and the offsets topic's creation), the write path (the offsets partitions' leaders,
    their writes), the read path (CONS's reads, the partitions' bounds, this broker's replicas of
    the offsets partitions), and, as callables, what is the broker's own business: a Raft read
    barrier on a group led here (``read_index``), relaying a command to its coordinator
    (``forward_to``) and the broker's nursery (None while it is not running), in which the
    leaves of a closed connection run.
    """

    def __init__(
        self,
        broker_id: int,
        session_timeout_s: float,
        *,
        metadata: ClusterMetadata,
        writes: WritePath,
        reads: ReadPath,
        read_index: Callable[[str], Awaitable[int]],
        forward_to: Callable[[int, GroupCommand, float], Awaitable[bytes]],
        nursery: Callable[[], trio.Nursery | None],
    ) -> None:
        self._broker_id = broker_id
        self.session_timeout_s = session_timeout_s
        self._metadata = metadata
        self._writes = writes
        self._reads = reads
        self._read_index = read_index
        self._forward_to = forward_to
        self._nursery = nursery
        self._tables: dict[int, _Table] = {}
        # Told of each change of a group's members, in words (the console's timeline).
        self.on_rebalance: Callable[[str], None] = lambda text: None
        self._locks: dict[int, trio.Lock] = {}
        # One lock per committed key (group, topic, partition): as many as keys ever committed.
        self._commit_locks: dict[tuple[str, str, int], trio.Lock] = {}
        # Partitions whose owner is changing (written, not yet applied): owned by no one.
        self._moving: dict[tuple[str, str], frozenset[int]] = {}
        # The members joined through this broker's open connections that their connection keeps
        # alive (``hold``), whichever broker coordinates them.
        self._held: set[str] = set()

    # -- entry point ----------------------------------------------------------------------------

    async def execute(self, command: GroupCommand, forwarded: bool) -> bytes:
        """Run ``command`` here if this broker coordinates its group, else forward it there."""
        if isinstance(command, ListGroups | DescribeGroup | DeleteGroup) and (
            OFFSETS_TOPIC not in self._metadata.view.topics
        ):
            # Nothing was ever committed or joined: answer so rather than create the topic.
            if isinstance(command, ListGroups):
                return encode_reply(EndReply())
            raise _unknown_group(command.group)
        if isinstance(command, ListGroups) and command.partition is None:
            return await self._list_all()
        partition = await self._coordinator_partition(command)
        leader = self._writes.leader_of(_group_id(partition))
        if leader != self._broker_id:
            if forwarded or leader is None:
                raise RequestError(
                    ErrorCode.NOT_LEADER, f"{OFFSETS_TOPIC}/{partition} has no leader here; retry"
                )
            return await self._forward_to(leader, command, _wait_s(command))
        match command:
            case Subs():
                return await self._join(partition, command)
            case Cons():
                return await self._cons(partition, command)
            case Commit():
                return await self._commit(partition, command)
            case FetchOffsets():
                return await self._offsets(partition, command)
            case Leave():
                await self.leave(partition, command.subscription_id)
                return encode_reply(OkReply())
            case DescribeGroup():
                return await self._describe(partition, command)
            case ListGroups():
                return await self._list(partition)
            case ResetOffsets():
                return await self._reset(partition, command)
            case DeleteGroup():
                return await self._delete(partition, command.group)
            case Touch():
                return await self._touch(partition, command.members)

    async def _coordinator_partition(self, command: GroupCommand) -> int:
        if isinstance(command, Cons | Leave):
            return _partition_of_member(command.subscription_id)
        if isinstance(command, ListGroups):
            if command.partition is None or command.partition >= OFFSETS_PARTITIONS:
                raise RequestError(ErrorCode.BAD_ARGS, f"no {OFFSETS_TOPIC} partition to list")
            return command.partition
        if isinstance(command, Touch):
            if command.partition >= OFFSETS_PARTITIONS:
                raise RequestError(ErrorCode.BAD_ARGS, f"no {OFFSETS_TOPIC} partition to touch")
            return command.partition
        internal = await self._internal_topic()
        return partition_for_key(command.group.encode(), internal.config.partitions)

    # -- commands -------------------------------------------------------------------------------

    async def _join(self, partition: int, command: Subs) -> bytes:
        known_topic(self._metadata.view.topics, command.topic)
        member = f"{partition}.{secrets.token_hex(8)}"
        # Its deadline is set as its join record is applied (one session from then).
        await self._change(
            partition,
            command.group,
            command.topic,
            member,
            command.partitions,
            session_ms=command.session_timeout_ms,
        )
        return encode_reply(OkReply(_subscribed(self._tables.get(partition), command, member)))

    async def leave(self, partition: int, member: str) -> None:
        table = await self._table(partition)
        where = table.member_of.get(member)
        if where is not None:
            await self._change(partition, where[0], where[1], member, None, leaving=True)

    async def _cons(self, partition: int, command: Cons) -> bytes:
        table = await self._table(partition)
        group, owned = self._owned(table, command.subscription_id, command.topic)
        if self._grown(table, group, command.topic):
            # The topic has partitions the group was never given (an ALTER added them): the
            # first member to read after that rebalances, so the group picks them up.
            await self._change(partition, group, command.topic, None, None)
            table = self._tables[partition]
            group, owned = self._owned(table, command.subscription_id, command.topic)
        wanted = self._positions(table, group, command, owned)
        limit = command.max_messages or DEFAULT_CONS_MESSAGES
        deadline = trio.current_time() + (command.wait_ms or 0) / 1000
        rows, next_offsets = await self._reads.cons_pass(command.topic, wanted, limit, deadline)
        # No await from here on: the answer holds only what the member owns now.
        table = self._tables[partition]
        _, now_owned = self._owned(table, command.subscription_id, command.topic)
        rows = [r for r in rows if isinstance(r, MessageRow) and r.partition in now_owned]
        ends = {p: o for p, o in next_offsets.items() if p in now_owned}
        for p in now_owned - ends.keys():  # gained during the read: start where committed
            ends[p] = table.offsets.get((group, command.topic, p), 0)
        return b"".join(encode_reply(r) for r in [*rows, EndReply(tuple(sorted(ends.items())))])

    async def _commit(self, partition: int, command: Commit) -> bytes:
        info = known_topic(self._metadata.view.topics, command.topic)
        if command.partition >= info.config.partitions:
            raise RequestError(
                ErrorCode.UNKNOWN_PARTITION,
                f"{command.topic} has partitions 0..{info.config.partitions - 1}",
            )
        key = (command.group, command.topic, command.partition)
        # Check and write as one step per key: two commits of one key that both passed the
        # check before either was written could otherwise land in the wrong order.
        async with self._commit_locks.setdefault(key, trio.Lock()):
            table = await self._table(partition)
            if command.member is not None:
                _, owned = self._owned(table, command.member, command.topic)
                if command.partition not in owned:
                    raise _not_assigned(command.topic, {command.partition})
            current = table.offsets.get(key)
            if current is not None and command.offset < current:
                raise RequestError(
                    ErrorCode.OFFSET_OUT_OF_RANGE,
                    f"committed offsets never go backwards: {command.group} has {current} for "
                    f"{command.topic}/{command.partition}",
                )
            record = Record(key=msgpack.packb(["o", *key]), value=msgpack.packb(command.offset))
            await self._write(partition, [record])
        return encode_reply(OkReply())

    async def _offsets(self, partition: int, command: FetchOffsets) -> bytes:
        info = known_topic(self._metadata.view.topics, command.topic)
        table = await self._read_table(partition)
        rows: list[Reply] = [
            OffsetRow(command.topic, p, table.offsets.get((command.group, command.topic, p)))
            for p in range(info.config.partitions)
        ]
        return b"".join(encode_reply(r) for r in [*rows, EndReply()])

    async def _describe(self, partition: int, command: DescribeGroup) -> bytes:
        """Per topic of the group (only ``command.topic`` if given): its state, its members
        (those without partitions too) and each partition's owner, committed offset and end."""
        if command.topic is not None:
            known_topic(self._metadata.view.topics, command.topic)
        table = await self._read_table(partition)
        topics = _topics_of(table, command.group)
        if not topics:
            raise _unknown_group(command.group)
        if command.topic is not None:
            topics = [command.topic]
        rows: list[Reply] = []
        for topic in topics:
            info = self._metadata.view.topics.get(topic)
            if info is None:
                continue  # the topic was deleted: its offsets stay until the group is deleted
            # One bounds request per leader for all partitions, instead of one read each.
            bounds = await self._reads.leader_bounds(
                log_id_of(topic, p) for p in range(info.config.partitions)
            )
            group = table.groups.get((command.group, topic), _Group())
            rows.append(_state_row(command.group, topic, group))
            rows.extend(
                MemberRow(command.group, topic, m, tuple(sorted(group.assignment.get(m, ()))))
                for m in group.members
            )
            owners = {p: m for m, ps in group.assignment.items() for p in ps}
            for p in range(info.config.partitions):
                found = bounds.get(log_id_of(topic, p))
                end = None if found is None else found[1]  # unreachable now: unknown
                committed = table.offsets.get((command.group, topic, p))
                rows.append(GroupRow(command.group, topic, p, owners.get(p), committed, end))
        return b"".join(encode_reply(r) for r in [*rows, EndReply()])

    async def _list_all(self) -> bytes:
        """``GROUPS``: the groups of every offsets partition, each asked of its coordinator (all
        at once); the first error any of them answers is the answer (a retriable one, mostly)."""
        internal = await self._internal_topic()
        answers: dict[int, bytes] = {}

        async def ask(p: int) -> None:
            try:
                answers[p] = await self.execute(ListGroups(p), forwarded=False)
            except RequestError as exc:
                answers[p] = encode_reply(exc.reply())

        async with trio.open_nursery() as nursery:
            for p in range(internal.config.partitions):
                nursery.start_soon(ask, p)
        end = encode_reply(EndReply())
        parts = [answers[p] for p in sorted(answers)]
        for answer in parts:
            if not answer.endswith(end):  # an -ERR: a coordinator could not answer now
                return answer
        return b"".join(a[: -len(end)] for a in parts) + end

    async def _list(self, partition: int) -> bytes:
        """The ``+GROUPSTATE`` rows of the groups this partition coordinates, then ``+END``."""
        table = await self._read_table(partition)
        pairs = set(table.groups) | {(g, t) for g, t, _ in table.offsets}
        rows: list[Reply] = [
            _state_row(g, t, table.groups.get((g, t), _Group())) for g, t in sorted(pairs)
        ]
        return b"".join(encode_reply(r) for r in [*rows, EndReply()])

    async def _reset(self, partition: int, command: ResetOffsets) -> bytes:
        """Commit new offsets for every partition of the topic, backwards too, if the group
        has no member on it (checked and written under the membership lock: none can join in
        between). Each partition's bounds come from its leader, as DESCRIBE's do. A dry run
        checks and answers the same, and writes nothing."""
        info = known_topic(self._metadata.view.topics, command.topic)
        group, topic = command.group, command.topic
        async with self._locks.setdefault(partition, trio.Lock()):
            table = await self._table(partition)
            _refuse_members(table, group, [topic])
            ids = {p: log_id_of(topic, p) for p in range(info.config.partitions)}
            time_ms = command.value if command.kind is ResetKind.TIME else None
            bounds = await self._reads.leader_bounds(ids.values(), time_ms=time_ms)
            missing = sorted(p for p, g in ids.items() if g not in bounds)
            if missing:
                raise RequestError(
                    ErrorCode.NOT_LEADER,
                    f"{topic} partitions {missing} have no leader that answered; nothing was "
                    "reset: retry",
                )
            offsets = {p: _reset_to(command, bounds[g]) for p, g in ids.items()}
            if command.dry_run:
                return _offset_rows(topic, offsets)
            keys = [(group, topic, p) for p in sorted(offsets)]
            async with _all_locked([self._commit_locks.setdefault(k, trio.Lock()) for k in keys]):
                records = [
                    Record(key=msgpack.packb(["o", *k]), value=msgpack.packb(offsets[k[2]]))
                    for k in keys
                ]
                await self._write(partition, records)
        log.info("group %s/%s: offsets reset to %s", group, topic, offsets)
        return _offset_rows(topic, offsets)

    async def _delete(self, partition: int, group: str) -> bytes:
        """Tombstone every ``o`` and ``a`` key of ``group`` (all its topics) in one batch, if it
        has no member; ``UNKNOWN_GROUP`` if the coordinator knows nothing of it."""
        async with self._locks.setdefault(partition, trio.Lock()):
            table = await self._table(partition)
            topics = _topics_of(table, group)
            if not topics:
                raise _unknown_group(group)
            _refuse_members(table, group, topics)
            keys: list[list[object]] = [["a", g, t] for g, t in table.groups if g == group]
            keys += [["o", *k] for k in table.offsets if k[0] == group]
            await self._write(partition, [Record(key=msgpack.packb(k), value=None) for k in keys])
        log.info("group %s deleted (topics %s)", group, topics)
        return encode_reply(OkReply())

    # -- membership -----------------------------------------------------------------------------

    def _grown(self, table: _Table, group: str, topic: str) -> bool:
        """Whether ``group`` leaves some of ``topic``'s partitions unowned although a member
        could take them: the topic grew since the assignment was made. Cheap when nothing is
        unowned, the usual case (a CONS asks it every time)."""
        current = table.groups.get((group, topic))
        info = self._metadata.view.topics.get(topic)
        if current is None or not current.members or info is None:
            return False
        owned = sum(len(ps) for ps in current.assignment.values())
        if owned >= info.config.partitions:
            return False
        partitions = range(info.config.partitions)
        return assign(partitions, list(current.members.values()), current.assignment) != (
            current.assignment
        )

    async def _change(
        self,
        partition: int,
        group: str,
        topic: str,
        member: str | None,
        cap: int | None,
        *,
        leaving: bool = False,
        session_ms: int | None = None,
    ) -> None:
        """Add (or, ``leaving``, remove) ``member`` and write the new assignment, atomically;
        ``session_ms``: the joining member's own session timeout (its ``s`` record).

        ``member`` None: nobody joins or leaves, the assignment is made again over the topic's
        partitions now (more of them after an ALTER); nothing is written if it stays the same.
        """
        info = known_topic(self._metadata.view.topics, topic)
        async with self._locks.setdefault(partition, trio.Lock()):
            table = await self._table(partition)
            current = table.groups.get((group, topic), _Group())
            members = dict(current.members)
            if member is None:
                pass
            elif leaving:
                if members.pop(member, None) is None:
                    return
            else:
                members[member] = MemberSpec(member, cap)
            assignment = assign(
                range(info.config.partitions), list(members.values()), current.assignment
            )
            if member is None and assignment == current.assignment:
                return  # another reader rebalanced it first
            # Fence first: from now until the new assignment is applied, a partition that
            # changes owner has none (its old owner's next CONS or COMMIT is refused).
            moving = frozenset(
                p
                for m, ps in current.assignment.items()
                for p in ps
                if p not in assignment.get(m, frozenset())
            )
            self._moving[(group, topic)] = moving
            stamp = int(time.time() * 1000)  # when the old owners were fenced (for histories)
            records = [
                Record(
                    key=msgpack.packb(["a", group, topic]),
                    value=msgpack.packb({m: sorted(ps) for m, ps in assignment.items()}),
                    timestamp=stamp,
                ),
            ]
            if member is not None:  # before the assignment, as it always was
                membership = Record(
                    key=msgpack.packb(["m", group, topic, member]),
                    value=None if leaving else msgpack.packb(-1 if cap is None else cap),
                    timestamp=stamp,
                )
                records.insert(0, membership)
                if session_ms is not None or (leaving and member in table.sessions):
                    own = Record(
                        key=msgpack.packb(["s", group, topic, member]),
                        value=None if leaving else msgpack.packb(session_ms),
                        timestamp=stamp,
                    )
                    records.insert(1, own)
            try:
                await self._write(partition, records)
            finally:
                self._moving.pop((group, topic), None)
            log.info("group %s/%s: %s %s; now %s", group, topic,
                     "rebalanced" if member is None else "left" if leaving else "joined",
                     member or "over its new partitions",
                     {m: sorted(ps) for m, ps in assignment.items()})  # fmt: skip
            self.on_rebalance(
                f"group {group} on {topic}: "
                + ("rebalanced" if member is None else f"{member} left" if leaving
                   else f"{member} joined")
                + f"; {len(assignment)} members"
            )  # fmt: skip

    def connection_closed(self, members: set[str]) -> None:
        """The connection that joined ``members`` closed: they leave (wherever coordinated)."""
        self._held -= members
        nursery = self._nursery()
        if nursery is None:
            return
        for member in members:
            nursery.start_soon(self._leave_quietly, member)

    def hold(self, member: str) -> None:
        """An open connection of this broker joined ``member`` (with no session timeout of its
        own): keep it alive (``run_keep_alive``) until ``release`` or ``connection_closed``."""
        self._held.add(member)

    def release(self, member: str) -> None:
        """``member`` left (LEAVE on its connection): no longer kept alive from here."""
        self._held.discard(member)

    async def run_keep_alive(self) -> None:
        """Every third of the session timeout, touch the members held here; forever.

        One ``Touch`` per offsets partition that has some (at most ``_TOUCH_MEMBERS`` ids each),
        to its coordinator (this broker too), each partition's in a task of its own and at most
        one at a time: a coordinator that does not answer (it moved, its broker is away) delays
        no other partition's touches. A touch that fails is logged and sent again next period;
        two in a row may fail before a held member is at risk. A coordinator too old to read a
        Touch answers ``BAD_ARGS`` (one of before peer calls were refused drops it, and the touch
        times out): its members then live by their requests, as before (a rolling upgrade).
        """
        busy: set[int] = set()
        async with trio.open_nursery() as nursery:
            while True:
                await trio.sleep(self.session_timeout_s / 3)
                by_partition: dict[int, list[str]] = {}
                for member in self._held:
                    head = member.partition(".")[0]
                    if head.isdigit():  # always: ids come from the coordinators' +OK
                        by_partition.setdefault(int(head), []).append(member)
                for partition, members in by_partition.items():
                    if partition not in busy:
                        busy.add(partition)
                        nursery.start_soon(self._touch_alone, partition, sorted(members), busy)

    async def _touch_alone(self, partition: int, members: list[str], busy: set[int]) -> None:
        try:
            for i in range(0, len(members), _TOUCH_MEMBERS):
                touch = Touch(partition, tuple(members[i : i + _TOUCH_MEMBERS]))
                try:
                    answer = await self.execute(touch, forwarded=False)
                except RequestError as exc:
                    answer = encode_reply(exc.reply())
                if not answer.startswith(b"+OK"):
                    log.info("keeping the members of %s alive failed: %r; retrying",
                             _group_id(partition), answer[:200])  # fmt: skip
                    return
        finally:
            busy.discard(partition)

    async def touched(self, command: Touch) -> bytes:
        """A peer's ``Touch`` (see ``run_keep_alive``), run as the coordinator: its reply."""
        try:
            return await self.execute(command, forwarded=True)
        except RequestError as exc:
            return encode_reply(exc.reply())

    async def _touch(self, partition: int, members: tuple[str, ...]) -> bytes:
        """Hear from each of ``members`` that this partition's table knows and that has no
        session timeout of its own; the others are skipped (they left, timed out, or live by
        their own requests)."""
        table = await self._table(partition)
        deadline = trio.current_time() + self.session_timeout_s
        for member in members:
            if member in table.deadlines and member not in table.sessions:
                table.deadlines[member] = deadline
        return encode_reply(OkReply())

    def _session_s(self, table: _Table, member: str) -> float:
        """``member``'s session timeout: its own if it asked for one, else the broker's."""
        return table.sessions.get(member, self.session_timeout_s)

    async def _leave_quietly(self, member: str) -> None:
        try:
            await self.execute(Leave(member), forwarded=False)
        except RequestError as exc:  # the session timeout will do it instead
            log.info("leave of %s failed (%s); it will time out", member, exc.message)

    async def run_expiry(self) -> None:
        """Evict the members of the groups coordinated here once past their deadline; forever.

        One timer for every offsets partition (an idle broker wakes ``1 / _EXPIRY_EVERY_S``
        times a second, not that many per partition): each tick looks, without awaiting, which
        partitions have work (:meth:`_expiry_due`) and runs each one's in a task of its own, one
        at a time per partition, so that one partition's stalled writes (its followers are away)
        delay no other partition's evictions, nor the timer. ``_EXPIRY_EVERY_S`` is the
        guarantee: a member is evicted at most that long after its deadline (plus the write),
        and a partition taken over is loaded at most that long after its first commit.
        """
        busy: set[int] = set()
        async with trio.open_nursery() as nursery:
            while True:
                await trio.sleep(_EXPIRY_EVERY_S)
                now = trio.current_time()
                for partition in range(OFFSETS_PARTITIONS):
                    if partition not in busy and self._expiry_due(partition, now):
                        busy.add(partition)
                        nursery.start_soon(self._expire_alone, partition, busy)

    def _expiry_due(self, partition: int, now: float) -> bool:
        """Whether ``partition``'s tick has work: this broker leads it with an entry of its term
        committed, and its table is not loaded in this term, lags the commit index, or has a
        member past its deadline at ``now``."""
        replica = self._reads.local_replica(OFFSETS_TOPIC, partition)
        if replica is None or replica.role is not Role.LEADER:
            return False
        if not replica.committed_in_term:
            return False  # no entry of its term committed yet: ``_table`` would wait
        table = self._tables.get(partition)
        if table is None or table.term != replica.node.term:
            return True
        if table.next_offset <= replica.commit_index:
            return True
        return any(deadline <= now for deadline in table.deadlines.values())

    async def _expire_alone(self, partition: int, busy: set[int]) -> None:
        """``_expire(partition)``, then ``partition`` may be ticked again."""
        try:
            await self._expire(partition)
        finally:
            busy.discard(partition)

    async def _expire(self, partition: int) -> None:
        """One tick of ``partition``'s timer: if this broker coordinates it, load its table
        (a takeover's load starts every member's session: see the module docstring), then
        evict every member past its deadline.

        Never raises ``RequestError``: a failed eviction is logged and retried at the next
        tick, and the member keeps its passed deadline meanwhile.
        """
        replica = self._reads.local_replica(OFFSETS_TOPIC, partition)
        if replica is None or replica.role is not Role.LEADER:
            return
        if not replica.committed_in_term:
            return  # no entry of its term committed yet: ``_table`` would wait; look next tick
        try:
            table = await self._table(partition)
        except RequestError:
            return  # it stopped leading meanwhile
        for member in table.expired(trio.current_time()):
            # Earlier evictions awaited: the member may have been heard from, or have left.
            current = self._tables.get(partition)
            deadline = None if current is None else current.deadlines.get(member)
            if deadline is None or deadline > trio.current_time():
                continue
            log.info("member %s timed out", member)
            try:
                await self.leave(partition, member)
            except RequestError as exc:
                log.info("evicting %s failed (%s); retrying", member, exc.message)

    # -- the table ------------------------------------------------------------------------------

    def _owned(self, table: _Table, member: str, topic: str) -> tuple[str, frozenset[int]]:
        """The member's group and the partitions it owns now (none that is being moved)."""
        where = table.member_of.get(member)
        if where is None:
            raise RequestError(
                ErrorCode.UNKNOWN_SUBSCRIPTION,
                f"no subscription {member} to {topic} (it left or timed out): SUBS again",
            )
        if where[1] != topic:  # a live member, named with another topic: it did not leave
            raise RequestError(
                ErrorCode.UNKNOWN_SUBSCRIPTION,
                f"subscription {member} is for topic {where[1]}, not {topic}: name its topic, "
                f"or SUBS {topic} for a subscription to {topic}",
            )
        table.deadlines[member] = trio.current_time() + self._session_s(table, member)  # heard
        owned = table.groups[where].assignment.get(member, frozenset())
        return where[0], owned - self._moving.get(where, frozenset())

    def _positions(
        self, table: _Table, group: str, command: Cons, owned: frozenset[int]
    ) -> dict[int, int]:
        """Where CONS reads each owned partition from (see docs/protocol.md)."""
        if isinstance(command.offsets, int):  # the seed's one offset: for every partition
            return dict.fromkeys(owned, command.offsets)
        pairs = dict(command.offsets)
        foreign = set(pairs) - owned
        info = self._metadata.view.topics.get(command.topic)
        missing = sorted(p for p in foreign if info is None or p >= info.config.partitions)
        if missing and info is not None:
            raise RequestError(
                ErrorCode.UNKNOWN_PARTITION,
                f"{command.topic} has no partition {', '.join(map(str, missing))}: it has "
                f"partitions 0..{info.config.partitions - 1} (see DESCRIBE)",
            )
        if foreign:
            raise _not_assigned(command.topic, foreign)
        committed = {p: table.offsets.get((group, command.topic, p), 0) for p in owned}
        return {**committed, **pairs}

    async def _table(self, partition: int) -> _Table:
        """The partition's table, caught up with everything committed (this broker leads it)."""
        replica = self._reads.local_replica(OFFSETS_TOPIC, partition)
        if replica is None or replica.role is not Role.LEADER:
            raise RequestError(ErrorCode.NOT_LEADER, "the group's coordinator moved; retry")
        deadline = trio.current_time() + self._writes.timeout
        # A new leader knows everything committed only once an entry of its term commits.
        while not replica.committed_in_term:
            if replica.role is not Role.LEADER or trio.current_time() > deadline:
                raise RequestError(ErrorCode.NOT_LEADER, "the group's coordinator moved; retry")
            await trio.sleep(_LEADER_READY_POLL_S)
        table = self._tables.get(partition)
        if table is None or table.term != replica.node.term:
            table = self._tables[partition] = _Table(
                replica.node.term, replica.log.log_start_offset
            )
        deadline = trio.current_time() + self.session_timeout_s  # of the members read now
        while table.next_offset <= replica.commit_index:
            fetched = read_committed(replica, table.next_offset, _READ_BYTES)
            if not fetched.data:
                break
            _apply(table, fetched.data, deadline, self.session_timeout_s)
            table.next_offset = fetched.next_offset
        return table

    async def _read_table(self, partition: int) -> _Table:
        """``_table``, confirmed current: a leader cut off from the others may not know that
        another one took over and accepted commits (found by jepsen_like: a deposed coordinator
        answered OFFSETS with an offset older than one committed through its successor). A
        read-index round (a heartbeat a majority answers) proves it still leads."""
        try:
            await self._read_index(_group_id(partition))
        except (NotLeader, CommitTimeout) as exc:
            raise RequestError(
                ErrorCode.NOT_LEADER,
                f"the group's coordinator cannot confirm it leads: {exc}; retry",
            ) from exc
        return await self._table(partition)

    async def _write(self, partition: int, records: list[Record]) -> None:
        """Append ``records`` as one batch to the offsets partition; return once committed."""
        batch = build_batch(records)
        # As the leader that checked, or not at all (see WritePath.write_as_leader).
        await self._writes.write_as_leader(_group_id(partition), batch, len(records))
        await self._table(partition)

    async def _internal_topic(self) -> TopicInfo:
        view = self._metadata.view
        info = view.topics.get(OFFSETS_TOPIC)
        if info is not None:
            return info
        config = TopicConfig(
            partitions=OFFSETS_PARTITIONS,
            replication_factor=min(3, max(1, len(view.brokers))),
            retention_ms=None,
            compact=True,
        )
        try:
            info = await self._metadata.create_topic(OFFSETS_TOPIC, config)
        except TopicExistsError:  # another broker created it with its own view of the brokers
            info = self._metadata.view.topics[OFFSETS_TOPIC]
        await self._writes.wait_for_leaders(info)
        return info

    # -- Kafka groups' offsets (the Kafka front's coordinator keeps their membership) ------------

    async def offsets_partition(self, group: str) -> int:
        """The offsets partition that holds ``group`` (created with the topic if need be)."""
        internal = await self._internal_topic()
        return partition_for_key(group.encode(), internal.config.partitions)

    def coordinator_of(self, partition: int) -> int | None:
        """The broker that leads offsets partition ``partition`` (None: no leader known)."""
        return self._writes.leader_of(_group_id(partition))

    def leading_term(self, partition: int) -> int | None:
        """This broker's Raft term as the leader of offsets partition ``partition``, None when
        it does not lead it: Kafka groups' state is this broker's only while the term lasts."""
        replica = self._reads.local_replica(OFFSETS_TOPIC, partition)
        if replica is None or replica.role is not Role.LEADER:
            return None
        return replica.node.term

    async def kafka_offsets(self, partition: int, group: str) -> dict[tuple[str, int], KafkaOffset]:
        """``group``'s committed offsets, confirmed current (see ``_read_table``)."""
        table = await self._read_table(partition)
        return dict(table.kafka_offsets.get(group, {}))

    async def kafka_groups(self, partition: int) -> set[str]:
        """The Kafka groups with committed offsets or a saved membership in ``partition``
        (this broker leads it)."""
        table = await self._table(partition)
        return set(table.kafka_offsets) | set(table.kafka_groups)

    async def kafka_group(self, partition: int, group: str) -> Any:
        """The membership of ``group`` last saved by ``save_kafka_group`` (None: none)."""
        table = await self._table(partition)
        return table.kafka_groups.get(group)

    async def save_kafka_group(self, partition: int, group: str, saved: Any) -> None:
        """Write the membership of Kafka group ``group`` (msgpack-able); return once
        committed."""
        record = Record(key=msgpack.packb(["g", group]), value=msgpack.packb(saved))
        await self._write(partition, [record])

    async def commit_kafka_offsets(
        self, partition: int, group: str, offsets: Mapping[tuple[str, int], KafkaOffset]
    ) -> None:
        """Write ``offsets`` of ``group`` as one batch; return once committed. Kafka lets a
        group commit any offset, backwards too (a consumer that seeks), so nothing is checked."""
        records = [
            Record(
                key=msgpack.packb(["k", group, topic, p]),
                value=msgpack.packb([o.offset, o.leader_epoch, o.metadata]),
            )
            for (topic, p), o in offsets.items()
        ]
        if records:
            await self._write(partition, records)

    async def delete_kafka_group(self, partition: int, group: str) -> bool:
        """Tombstone every committed offset and the saved membership of Kafka group
        ``group``, in one batch; False if it had neither."""
        table = await self._table(partition)
        keys: list[list[object]] = [
            ["k", group, t, p] for t, p in sorted(table.kafka_offsets.get(group, {}))
        ]
        if group in table.kafka_groups:
            keys.append(["g", group])
        if not keys:
            return False
        await self._write(partition, [Record(key=msgpack.packb(k), value=None) for k in keys])
        return True

    def committed_offsets(self) -> list[tuple[str, str, int, int]]:
        """(group, topic, partition, committed offset) of every group coordinated here, as the
        tables loaded in this broker's current term hold them (the expiry timer keeps them up
        with the commit index): what the lag metrics read at scrape time, with no await.
        Kafka groups' offsets are there too; where a line-protocol group and a Kafka group of
        the same name committed the same partition, the line-protocol group's is given (one
        row a key: a metric's labels must not repeat)."""
        rows = []
        for partition, table in list(self._tables.items()):
            replica = self._reads.local_replica(OFFSETS_TOPIC, partition)
            if (
                replica is None
                or replica.role is not Role.LEADER
                or table.term != replica.node.term
            ):
                continue  # no longer (or not yet) the coordinator of this partition's groups
            rows += [(g, t, p, offset) for (g, t, p), offset in table.offsets.items()]
            rows += [
                (g, t, p, committed.offset)
                for g, offsets in table.kafka_offsets.items()
                for (t, p), committed in offsets.items()
                if (g, t, p) not in table.offsets
            ]
        return rows


def _apply(table: _Table, data: bytes | memoryview, deadline: float, session_s: float) -> None:
    """Apply the committed batches ``data`` to ``table``; members that join get ``deadline``
    (one ``session_s`` from now), those with a session timeout of their own one of theirs."""
    for record in data_records(data, table.next_offset, verify=False):
        if record.key is not None:
            _apply_record(table, msgpack.unpackb(record.key), record.value, deadline, session_s)


def _apply_record(
    table: _Table, key: list[Any], value: bytes | None, deadline: float, session_s: float = 0.0
) -> None:
    kind = key[0]
    if kind == "o":
        _, group, topic, partition = key
        if value is None:  # DELGROUP's tombstone
            table.offsets.pop((group, topic, partition), None)
        else:
            table.offsets[(group, topic, partition)] = msgpack.unpackb(value)
    elif kind == "m":
        _, group, topic, member = key
        g = table.groups.setdefault((group, topic), _Group())
        if value is None:
            g.members.pop(member, None)
            table.member_of.pop(member, None)
            table.deadlines.pop(member, None)
            table.sessions.pop(member, None)
        else:
            cap = msgpack.unpackb(value)
            g.members[member] = MemberSpec(member, None if cap < 0 else cap)
            table.member_of[member] = (group, topic)
            table.deadlines.setdefault(member, deadline)
    elif kind == "s":
        member = key[3]
        if value is None:
            table.sessions.pop(member, None)
        elif member in table.member_of:  # written with its join, just after its ``m`` record
            own = msgpack.unpackb(value) / 1000
            table.sessions[member] = own
            table.deadlines[member] = deadline - session_s + own
    elif kind == "k":
        _, group, topic, partition = key
        if value is None:  # DeleteGroups' tombstone
            offsets = table.kafka_offsets.get(group, {})
            offsets.pop((topic, partition), None)
            if not offsets:
                table.kafka_offsets.pop(group, None)
        else:
            offset, epoch, metadata = msgpack.unpackb(value)
            table.kafka_offsets.setdefault(group, {})[topic, partition] = KafkaOffset(
                offset, epoch, metadata
            )
    elif kind == "g":
        _, group = key
        if value is None:  # DeleteGroups' tombstone
            table.kafka_groups.pop(group, None)
        else:
            table.kafka_groups[group] = msgpack.unpackb(value)
    elif kind == "a":
        _, group, topic = key
        if value is None:  # DELGROUP's tombstone: it had no members left
            table.groups.pop((group, topic), None)
            return
        g = table.groups.setdefault((group, topic), _Group())
        raw: Mapping[str, list[int]] = msgpack.unpackb(value)
        g.assignment = {m: frozenset(ps) for m, ps in raw.items()}


def _topics_of(table: _Table, group: str) -> list[str]:
    """The topics ``group`` has a membership record or a committed offset for, sorted."""
    topics = {t for g, t in table.groups if g == group}
    topics.update(t for g, t, _ in table.offsets if g == group)
    return sorted(topics)


def _state_row(group: str, topic: str, g: _Group) -> GroupStateRow:
    """Kafka's names: ``Stable`` with members (we rebalance atomically: nothing in between),
    ``Empty`` with only committed offsets."""
    return GroupStateRow(group, topic, "Stable" if g.members else "Empty", len(g.members))


def _refuse_members(table: _Table, group: str, topics: list[str]) -> None:
    """``GROUP_NOT_EMPTY`` if ``group`` has a live member on any of ``topics``."""
    for topic in topics:
        g = table.groups.get((group, topic))
        if g is not None and g.members:
            raise RequestError(
                ErrorCode.GROUP_NOT_EMPTY,
                f"group {group} has {len(g.members)} live member(s) on {topic}: stop its "
                "consumers (or wait for their session timeout) first",
            )


def _reset_to(command: ResetOffsets, bounds: tuple[int, ...]) -> int:
    """The new committed offset of one partition whose leader has ``bounds`` (start, end[,
    offset for the time])."""
    start, end = bounds[0], bounds[1]
    match command.kind:
        case ResetKind.EARLIEST:
            return start
        case ResetKind.LATEST:
            return end
        case ResetKind.OFFSET:
            assert command.value is not None  # the codecs give offset= a value
            return min(max(command.value, start), end)  # as Kafka's --to-offset clamps
        case ResetKind.TIME:
            return bounds[2]


class _all_locked:
    """Hold every lock of ``locks`` (taken in the order given), release them all on exit."""

    def __init__(self, locks: list[trio.Lock]) -> None:
        self._locks = locks
        self._held: list[trio.Lock] = []

    async def __aenter__(self) -> None:
        try:
            for lock in self._locks:
                await lock.acquire()
                self._held.append(lock)
        except BaseException:
            self._release()
            raise

    async def __aexit__(self, *exc: object) -> None:
        self._release()

    def _release(self) -> None:
        while self._held:
            self._held.pop().release()


def _offset_rows(topic: str, offsets: dict[int, int]) -> bytes:
    """RESETOFFSETS's answer: an ``+OFFSET`` row a partition, in order, then ``+END``."""
    rows: list[Reply] = [OffsetRow(topic, p, o) for p, o in sorted(offsets.items())]
    return b"".join(encode_reply(r) for r in [*rows, EndReply()])


def _unknown_group(group: str) -> RequestError:
    return RequestError(
        ErrorCode.UNKNOWN_GROUP,
        f"no group {group!r}: it has no members and no committed offsets (GROUPS lists groups)",
    )


def _partition_of_member(member: str) -> int:
    head, sep, _ = member.partition(".")
    if not sep or not head.isdigit() or int(head) >= OFFSETS_PARTITIONS:
        raise RequestError(ErrorCode.UNKNOWN_SUBSCRIPTION, f"no subscription {member}: SUBS again")
    return int(head)


def _subscribed(table: _Table | None, command: Subs, member: str) -> str:
    """The text of SUBS's ``+OK``: the subscription id, then, when the member got fewer
    partitions than the ``<partitions>`` it asked for, ``partitions=<got> asked=<n>`` (the id
    stays the first word, so readers of ``+OK <id>`` that take the first word read on)."""
    if command.partitions is None:
        return member
    group = None if table is None else table.groups.get((command.group, command.topic))
    got = 0 if group is None else len(group.assignment.get(member, ()))
    if got >= command.partitions:
        return member
    return f"{member} partitions={got} asked={command.partitions}"


def _not_assigned(topic: str, partitions: set[int]) -> RequestError:
    return RequestError(
        ErrorCode.NOT_ASSIGNED,
        f"{topic} partitions {sorted(partitions)} are not assigned to this member (a rebalance "
        "moved them): read on with the partitions of your last +END",
    )


def _group_id(partition: int) -> str:
    return f"{OFFSETS_TOPIC}/{partition}"


def _wait_s(command: GroupCommand) -> float:
    return (command.wait_ms or 0) / 1000 if isinstance(command, Cons) else 0.0
