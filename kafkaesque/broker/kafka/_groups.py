"""Kafka's consumer groups (classic protocol), served by the broker that leads the group's
offsets partition.

A Kafka group lives where our line-protocol groups live: ``partition_for_key(group)`` of
``__consumer_offsets``, whose Raft leader is the group's coordinator (FindCoordinator names it;
any other broker answers NOT_COORDINATOR and the client asks again). Its committed offsets are
records of their own kind in that partition (``GroupCoordinator``'s ``k`` keys, written through
the same Raft log), so they survive the coordinator and a group of the same name in the line
protocol never touches them. Its membership (``ClassicGroup``: generations, the members'
subscriptions and assignments) is the coordinator's memory while it leads the partition, and
is saved to the same partition (``g`` keys) each time a generation is handed out or the group
empties: a broker that takes the partition over restores a group from its saved membership
when a member first asks, with the same generation and assignments and a new session for each
member, so a failover costs the members a FindCoordinator, not a rebalance (as Kafka loads its
groups). A generation still forming at the failover is lost; its members rejoin.

Access, as Kafka's: read on the group to join, sync, heartbeat, leave, commit and fetch offsets,
read on each topic committed (describe on each topic fetched), describe on the group to find
its coordinator and describe it, delete to delete it; ListGroups lists the groups the session
may describe.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import trio

from kafkaesque.protocol import AclOperation, AclResource
from kafkaesque.protocol.kafka import KafkaError, KafkaRequest, Message

from .._access import AccessControl
from .._errors import RequestError
from .._groups import OFFSETS_TOPIC, GroupCoordinator, KafkaOffset
from .._metadata import ClusterMetadata
from .._session import Session
from ._classic_group import ClassicGroup, GroupState, JoinRequest, Pending, join_error

log = logging.getLogger("kafkaesque.broker.kafka")

_TICK_S: Final = 0.1
_SAVE_WAIT_S: Final = 10.0  # DeleteGroups waits this long for a membership write in flight
_MAX_METADATA: Final = 4096  # Kafka's offset.metadata.max.bytes
_TRANSACTION: Final = 1  # FindCoordinator's key type of a transactional id
_CLASSIC: Final = "classic"  # ListGroups v5's group type of every group served (KIP-848's are not)


@dataclass
class _Held:
    """A group held by this broker while it leads ``partition`` in ``term``; ``saved``: the
    ``saved_key`` of the membership last written to the log; ``saving``: set when the save in
    flight (if any) ends."""

    partition: int
    term: int
    group: ClassicGroup
    saved: tuple[int, tuple[str, ...]] | None = None
    saving: trio.Event | None = None


class KafkaGroups:
    """The consumer-group APIs of one broker's Kafka front (see the module docstring)."""

    def __init__(
        self,
        offsets: GroupCoordinator,
        metadata: ClusterMetadata,
        access: AccessControl,
        initial_delay_s: float,
    ) -> None:
        self._offsets = offsets
        self._metadata = metadata
        self._access_control = access
        self._initial_delay_s = initial_delay_s
        self._held: dict[str, _Held] = {}

    async def run(self) -> None:
        """Time the groups held here (sessions, rebalance deadlines), save what changed, and
        give up those whose partition this broker no longer leads; until cancelled. A save
        runs beside the timer, so a slow write (a partition without a quorum) delays no
        group's sessions."""
        async with trio.open_nursery() as nursery:
            while True:
                await trio.sleep(_TICK_S)
                now = trio.current_time()
                for group_id, held in list(self._held.items()):
                    if self._offsets.leading_term(held.partition) != held.term:
                        self._give_up(group_id, held)
                        continue
                    held.group.tick(now)
                    key = held.group.saved_key()
                    if key is not None and key != held.saved and held.saving is None:
                        held.saving = trio.Event()
                        saved = held.group.saved()  # now: as of ``key``, not as of the write
                        nursery.start_soon(self._save, group_id, held, key, saved)
                    empty = held.group.state is GroupState.EMPTY and not held.group.pending_ids
                    if empty and held.saved == key and held.saving is None:
                        self._forget(group_id, held)  # the log has all of it

    async def _save(
        self, group_id: str, held: _Held, key: tuple[int, tuple[str, ...]], saved: object
    ) -> None:
        """Write ``saved``, the group's membership as of ``key``, to the log; a failed write
        is tried again at a next tick."""
        try:
            await self._offsets.save_kafka_group(held.partition, group_id, saved)
        except RequestError as exc:
            log.info("kafka group %s: saving its membership failed: %s", group_id, exc.message)
        else:
            held.saved = key
        finally:
            ended, held.saving = held.saving, None
            if ended is not None:
                ended.set()

    def _forget(self, group_id: str, held: _Held) -> None:
        if self._held.get(group_id) is held:
            del self._held[group_id]

    def _give_up(self, group_id: str, held: _Held) -> None:
        self._forget(group_id, held)
        held.group.close(KafkaError.NOT_COORDINATOR)
        log.info("kafka group %s: no longer coordinated here", group_id)

    async def _locate(self, group_id: str) -> tuple[int, int] | KafkaError:
        """The group's offsets partition and this broker's term as its leader, or the error
        to answer (NOT_COORDINATOR when another broker coordinates it)."""
        if not group_id:
            return KafkaError.INVALID_GROUP_ID
        try:
            partition = await self._offsets.offsets_partition(group_id)
        except RequestError:
            return KafkaError.COORDINATOR_NOT_AVAILABLE
        term = self._offsets.leading_term(partition)
        if term is None:
            return KafkaError.NOT_COORDINATOR
        return partition, term

    async def _group(self, group_id: str, *, create: bool) -> ClassicGroup | KafkaError | None:
        """The group held here: restored from its saved membership if this broker does not
        hold it yet, else a new empty one if ``create``; None if there is none, or the error
        to answer."""
        where = await self._locate(group_id)
        if isinstance(where, KafkaError):
            return where
        partition, term = where
        held = self._held.get(group_id)
        if held is not None and held.term != term:
            self._give_up(group_id, held)
            held = None
        if held is None:
            try:
                saved = await self._offsets.kafka_group(partition, group_id)
            except RequestError:
                return KafkaError.NOT_COORDINATOR
            held = self._held.get(group_id)  # another request may have restored it meanwhile
            if held is not None and held.term == term:
                return held.group
            if saved is None and not create:
                return None
            now = trio.current_time()
            if saved is None:
                group = ClassicGroup(group_id, self._initial_delay_s)
            else:
                group = ClassicGroup.restored(group_id, saved, now, self._initial_delay_s)
            held = self._held[group_id] = _Held(partition, term, group, group.saved_key())
            if saved is not None:
                log.info(
                    "kafka group %s: taken over at generation %d with %d members",
                    group_id,
                    group.generation,
                    len(group.members),
                )
        return held.group

    # -- FindCoordinator ------------------------------------------------------------------------

    async def find_coordinator(self, request: KafkaRequest, session: Session) -> Message:
        body = request.body
        key = body["key"]
        if body.get("key_type", 0) == _TRANSACTION:
            return _coordinator_error(
                KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "transactions are not served"
            )
        if not self._access_control.allows(session, AclOperation.DESCRIBE, AclResource.GROUP, key):
            return _coordinator_error(KafkaError.GROUP_AUTHORIZATION_FAILED, None)
        if not key:
            return _coordinator_error(KafkaError.INVALID_GROUP_ID, "a group id is needed")
        try:
            partition = await self._offsets.offsets_partition(key)
        except RequestError as exc:
            return _coordinator_error(KafkaError.COORDINATOR_NOT_AVAILABLE, exc.message)
        leader = self._offsets.coordinator_of(partition)
        broker = None if leader is None else self._metadata.view.brokers.get(leader)
        if broker is None or broker.kafka_port is None:
            return _coordinator_error(
                KafkaError.COORDINATOR_NOT_AVAILABLE, "the group's partition has no leader yet"
            )
        return {
            "error_code": KafkaError.NONE,
            "error_message": None,
            "node_id": broker.id,
            "host": broker.host,
            "port": broker.kafka_port,
        }

    # -- membership -----------------------------------------------------------------------------

    async def join_group(self, request: KafkaRequest, session: Session) -> Message:
        body = request.body
        member_id = body["member_id"]
        if not self._access_control.allows(
            session, AclOperation.READ, AclResource.GROUP, body["group_id"]
        ):
            return join_error(KafkaError.GROUP_AUTHORIZATION_FAILED, member_id)
        group = await self._group(body["group_id"], create=True)
        if not isinstance(group, ClassicGroup):
            return join_error(group or KafkaError.NOT_COORDINATOR, member_id)
        session_s = body["session_timeout_ms"] / 1000
        rebalance_ms = body.get("rebalance_timeout_ms", -1)
        join = JoinRequest(
            member_id=member_id,
            instance_id=body.get("group_instance_id"),
            client_id=request.client_id or "",
            client_host=session.address,
            session_timeout_s=session_s,
            # v0 has no rebalance timeout: Kafka takes the session timeout for it.
            rebalance_timeout_s=session_s if rebalance_ms < 0 else rebalance_ms / 1000,
            protocol_type=body["protocol_type"],
            protocols=[(p["name"], p["metadata"]) for p in body["protocols"]],
            version=request.version,
        )
        return await _answered(group.join(join, trio.current_time()))

    async def sync_group(self, request: KafkaRequest, session: Session) -> Message:
        body = request.body
        if not self._access_control.allows(
            session, AclOperation.READ, AclResource.GROUP, body["group_id"]
        ):
            return {"error_code": KafkaError.GROUP_AUTHORIZATION_FAILED}
        group = await self._group(body["group_id"], create=False)
        if not isinstance(group, ClassicGroup):
            return {"error_code": group or KafkaError.UNKNOWN_MEMBER_ID}
        assignments = {a["member_id"]: a["assignment"] for a in body["assignments"]}
        pending = group.sync(
            body["member_id"],
            body.get("group_instance_id"),
            body["generation_id"],
            assignments,
            trio.current_time(),
        )
        return await _answered(pending)

    async def heartbeat(self, request: KafkaRequest, session: Session) -> Message:
        body = request.body
        if not self._access_control.allows(
            session, AclOperation.READ, AclResource.GROUP, body["group_id"]
        ):
            return {"error_code": KafkaError.GROUP_AUTHORIZATION_FAILED}
        group = await self._group(body["group_id"], create=False)
        if not isinstance(group, ClassicGroup):
            return {"error_code": group or KafkaError.UNKNOWN_MEMBER_ID}
        error = group.heartbeat(
            body["member_id"],
            body.get("group_instance_id"),
            body["generation_id"],
            trio.current_time(),
        )
        return {"error_code": error}

    async def leave_group(self, request: KafkaRequest, session: Session) -> Message:
        body = request.body
        if request.version >= 3:
            leaving = [(m["member_id"], m.get("group_instance_id")) for m in body["members"]]
        else:
            leaving = [(body["member_id"], None)]
        if not self._access_control.allows(
            session, AclOperation.READ, AclResource.GROUP, body["group_id"]
        ):
            return {"error_code": KafkaError.GROUP_AUTHORIZATION_FAILED}
        group = await self._group(body["group_id"], create=False)
        if not isinstance(group, ClassicGroup):
            error = group or KafkaError.UNKNOWN_MEMBER_ID
            return {"error_code": error, "members": _left(leaving, lambda m, i: error)}
        now = trio.current_time()
        results = {(m, i): group.leave(m, i, now) for m, i in leaving}
        if request.version < 3:
            return {"error_code": results[leaving[0]]}
        return {
            "error_code": KafkaError.NONE,
            "members": _left(leaving, lambda m, i: results[m, i]),
        }

    # -- offsets --------------------------------------------------------------------------------

    async def offset_commit(self, request: KafkaRequest, session: Session) -> Message:
        body = request.body
        group_id = body["group_id"]
        topics = body["topics"]

        def every(error: KafkaError) -> Message:
            return _commit_answer(topics, lambda t, p: error)

        if not self._access_control.allows(session, AclOperation.READ, AclResource.GROUP, group_id):
            return every(KafkaError.GROUP_AUTHORIZATION_FAILED)
        where = await self._locate(group_id)
        if isinstance(where, KafkaError):
            return every(where)
        group = await self._group(group_id, create=False)
        if isinstance(group, KafkaError):
            return every(group)
        now = trio.current_time()
        generation, member_id = body["generation_id"], body["member_id"]
        if group is not None:
            error = group.commit_error(member_id, body.get("group_instance_id"), generation, now)
        else:  # no members held here: only a commit from outside group management
            unmanaged = generation < 0 and not member_id
            error = KafkaError.NONE if unmanaged else KafkaError.ILLEGAL_GENERATION
        if error is not KafkaError.NONE:
            return every(error)
        errors: dict[tuple[str, int], KafkaError] = {}
        offsets: dict[tuple[str, int], KafkaOffset] = {}
        view = self._metadata.view
        for t in topics:
            name = t["name"]
            info = view.topics.get(name)
            allowed = self._access_control.allows(
                session, AclOperation.READ, AclResource.TOPIC, name
            )
            for p in t["partitions"]:
                index, metadata = p["partition_index"], p.get("committed_metadata")
                if not allowed:
                    errors[name, index] = KafkaError.TOPIC_AUTHORIZATION_FAILED
                elif info is None or not 0 <= index < info.config.partitions:
                    errors[name, index] = KafkaError.UNKNOWN_TOPIC_OR_PARTITION
                elif metadata is not None and len(metadata.encode()) > _MAX_METADATA:
                    errors[name, index] = KafkaError.OFFSET_METADATA_TOO_LARGE
                else:
                    offsets[name, index] = KafkaOffset(
                        p["committed_offset"], p.get("committed_leader_epoch", -1), metadata
                    )
        try:
            await self._offsets.commit_kafka_offsets(where[0], group_id, offsets)
        except RequestError as exc:
            # Not written, or written and the answer is unknown: the client retries (a
            # commit is idempotent) or rejoins, as with Kafka's coordinator moving.
            log.info("kafka group %s: commit failed: %s", group_id, exc.message)
            failed = KafkaError.NOT_COORDINATOR
            errors.update(dict.fromkeys(offsets, failed))
        return _commit_answer(topics, lambda t, p: errors.get((t, p), KafkaError.NONE))

    async def offset_fetch(self, request: KafkaRequest, session: Session) -> Message:
        body = request.body
        group_id = body["group_id"]
        asked = body.get("topics")

        def failed(error: KafkaError) -> Message:
            topics = [
                {
                    "name": t["name"],
                    "partitions": [
                        {"partition_index": p, "committed_offset": -1, "error_code": error}
                        for p in t["partition_indexes"]
                    ],
                }
                for t in asked or ()
            ]
            return {"topics": topics, "error_code": error}

        if not self._access_control.allows(
            session, AclOperation.DESCRIBE, AclResource.GROUP, group_id
        ):
            return failed(KafkaError.GROUP_AUTHORIZATION_FAILED)
        where = await self._locate(group_id)
        if isinstance(where, KafkaError):
            return failed(where)
        try:
            committed = await self._offsets.kafka_offsets(where[0], group_id)
        except RequestError:
            return failed(KafkaError.NOT_COORDINATOR)
        if asked is None:  # v2+: every partition the group committed
            wanted: dict[str, list[int]] = {}
            for topic, p in sorted(committed):
                wanted.setdefault(topic, []).append(p)
        else:
            wanted = {t["name"]: list(t["partition_indexes"]) for t in asked}
        topics = []
        for name, partitions in wanted.items():
            visible = self._access_control.allows(
                session, AclOperation.DESCRIBE, AclResource.TOPIC, name
            )
            rows = []
            for p in partitions:
                found = committed.get((name, p)) if visible else None
                rows.append(
                    {
                        "partition_index": p,
                        "committed_offset": -1 if found is None else found.offset,
                        "committed_leader_epoch": -1 if found is None else found.leader_epoch,
                        "metadata": "" if found is None else found.metadata,
                        "error_code": KafkaError.NONE
                        if visible
                        else KafkaError.TOPIC_AUTHORIZATION_FAILED,
                    }
                )
            topics.append({"name": name, "partitions": rows})
        return {"topics": topics, "error_code": KafkaError.NONE}

    # -- admin ----------------------------------------------------------------------------------

    async def list_groups(self, request: KafkaRequest, session: Session) -> Message:
        """The groups this broker coordinates (a client asks every broker and joins the
        lists): those with members held here and those with committed offsets (Empty). Each
        with its state (v4+) and type (v5+: always ``classic``, the only kind served); a
        request's states and types filters (compared without case, as Kafka) keep those
        listed, an empty filter keeps all."""
        listed: dict[str, tuple[str, GroupState]] = {}  # group -> protocol type, state
        for group_id, held in self._held.items():
            if self._offsets.leading_term(held.partition) == held.term:
                listed[group_id] = (held.group.protocol_type or "consumer", held.group.state)
        for partition in self._led_partitions():
            try:
                for group_id in await self._offsets.kafka_groups(partition):
                    if group_id in listed:
                        continue
                    # An empty group is forgotten once saved: its saved membership keeps the
                    # protocol type of its last members (a stopped Connect cluster's "connect").
                    saved = await self._offsets.kafka_group(partition, group_id)
                    kind = None if saved is None else ClassicGroup.saved_protocol_type(saved)
                    listed[group_id] = (kind or "consumer", GroupState.EMPTY)
            except RequestError:
                continue  # it stopped leading meanwhile
        states = {s.lower() for s in request.body.get("states_filter") or ()}
        types = {t.lower() for t in request.body.get("types_filter") or ()}
        if types and _CLASSIC not in types:
            listed = {}
        if states:
            listed = {g: row for g, row in listed.items() if row[1].lower() in states}
        visible = self._access_control.visible(session, AclResource.GROUP, sorted(listed))
        return {
            "error_code": KafkaError.NONE,
            "groups": [
                {
                    "group_id": g,
                    "protocol_type": listed[g][0],
                    "group_state": str(listed[g][1]),
                    "group_type": _CLASSIC,
                }
                for g in visible
            ],
        }

    def _led_partitions(self) -> list[int]:
        info = self._metadata.view.topics.get(OFFSETS_TOPIC)
        if info is None:
            return []
        partitions = range(info.config.partitions)
        return [p for p in partitions if self._offsets.leading_term(p) is not None]

    async def describe_groups(self, request: KafkaRequest, session: Session) -> Message:
        answers = []
        for group_id in request.body["groups"]:
            answers.append(await self._describe(group_id, session))
        return {"groups": answers}

    async def _describe(self, group_id: str, session: Session) -> Message:
        def error(code: KafkaError) -> Message:
            return {"error_code": code, "group_id": group_id, "members": []}

        if not self._access_control.allows(
            session, AclOperation.DESCRIBE, AclResource.GROUP, group_id
        ):
            return error(KafkaError.GROUP_AUTHORIZATION_FAILED)
        group = await self._group(group_id, create=False)
        if isinstance(group, KafkaError):
            return error(group)
        if group is not None:
            return group.describe()
        where = await self._locate(group_id)
        if isinstance(where, KafkaError):
            return error(where)
        try:
            known = group_id in await self._offsets.kafka_groups(where[0])
        except RequestError:
            return error(KafkaError.NOT_COORDINATOR)
        # As Kafka: a group with only committed offsets is Empty, an unknown one Dead.
        state = GroupState.EMPTY if known else GroupState.DEAD
        return {
            "error_code": KafkaError.NONE,
            "group_id": group_id,
            "group_state": str(state),
            "protocol_type": "consumer" if known else "",
            "members": [],
        }

    async def delete_groups(self, request: KafkaRequest, session: Session) -> Message:
        results = []
        for group_id in request.body["groups_names"]:
            results.append(
                {"group_id": group_id, "error_code": await self._delete(group_id, session)}
            )
        return {"results": results}

    async def _delete(self, group_id: str, session: Session) -> KafkaError:
        if not self._access_control.allows(
            session, AclOperation.DELETE, AclResource.GROUP, group_id
        ):
            return KafkaError.GROUP_AUTHORIZATION_FAILED
        group = await self._group(group_id, create=False)
        if isinstance(group, KafkaError):
            return group
        if group is not None and group.members:
            return KafkaError.NON_EMPTY_GROUP
        where = await self._locate(group_id)
        if isinstance(where, KafkaError):
            return where
        held = self._held.get(group_id)
        if held is not None:
            # Its membership must not be written after the deletion, or the group would come
            # back (Empty, listed) once deleted: a write in flight (its last member's leave)
            # lands first, and the timer saves it no more once it is not held.
            if held.saving is not None:
                with trio.move_on_after(_SAVE_WAIT_S):
                    await held.saving.wait()
            if held.saving is not None:
                return KafkaError.COORDINATOR_LOAD_IN_PROGRESS  # retriable: the client retries
            if held.group.members:  # one joined while it waited
                return KafkaError.NON_EMPTY_GROUP
            self._forget(group_id, held)
        try:
            deleted = await self._offsets.delete_kafka_group(where[0], group_id)
        except RequestError:
            return KafkaError.NOT_COORDINATOR
        return KafkaError.NONE if deleted or group is not None else KafkaError.GROUP_ID_NOT_FOUND


async def _answered(answer: Message | Pending) -> Message:
    if isinstance(answer, Pending):
        await answer.done.wait()
        return answer.answer
    return answer


def _coordinator_error(error: KafkaError, message: str | None) -> Message:
    return {"error_code": error, "error_message": message, "node_id": -1, "host": "", "port": -1}


def _left(
    leaving: list[tuple[str, str | None]], error: Callable[[str, str | None], KafkaError]
) -> list[Message]:
    return [{"member_id": m, "group_instance_id": i, "error_code": error(m, i)} for m, i in leaving]


def _commit_answer(topics: list[Message], error: Callable[[str, int], KafkaError]) -> Message:
    """The OffsetCommit response: every partition of the request with its error."""
    return {
        "topics": [
            {
                "name": t["name"],
                "partitions": [
                    {
                        "partition_index": p["partition_index"],
                        "error_code": error(t["name"], p["partition_index"]),
                    }
                    for p in t["partitions"]
                ],
            }
            for t in topics
        ]
    }
