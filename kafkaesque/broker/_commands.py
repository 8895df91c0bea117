"""What the broker does for each line-protocol command.

``CommandHandler.dispatch`` turns a decoded command into a ``Slot`` (its reply's place in the
session's pipeline) without awaiting: publishes join their partition's open batch at once, in
the order they were sent; everything that must wait (a fetch, a metadata change) runs as a task
of the session. Every failure becomes a ``-ERR CODE message`` reply; an unexpected exception is
logged with its traceback and answered ``INTERNAL`` (a bug), and the session goes on.

Commands this broker cannot serve itself are forwarded (see ``_forwarding``): writes to the
partition's leader (inside ``WritePath``), reads to a broker holding a replica. A forwarded
command is never forwarded again, so two brokers with stale views cannot bounce it forever.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio

from kafkaesque.protocol import (
    Acks,
    AclAdd,
    AclList,
    AclOperation,
    AclRemove,
    AclResource,
    AclRow,
    AddBroker,
    AlterTopic,
    Authenticate,
    Command,
    Commit,
    Cons,
    CreateTopic,
    DataReply,
    DeleteGroup,
    DeleteTopic,
    DescribeGroup,
    DescribeTopic,
    ElectLeaders,
    EndReply,
    ErrorCode,
    ErrorReply,
    Fetch,
    FetchFormat,
    FetchOffsets,
    FetchReplica,
    Help,
    Idempotence,
    Latest,
    Leave,
    ListGroups,
    ListTopics,
    MessageRow,
    Metadata,
    OkReply,
    Ping,
    PublishBatch,
    PublishRecord,
    Pubs,
    Quit,
    Reassign,
    RemoveBroker,
    Reply,
    ResetOffsets,
    Subs,
    encode_reply,
    help_replies,
    parse_seed_message,
    partition_for_key,
    published_reply,
)
from kafkaesque.raft import Role
from kafkaesque.storage import BatchType, InvalidBatchError, Record, build_batch, decode_header

from ._access import AccessControl
from ._appender import Flight, PartitionAppender
from ._errors import RequestError, known_topic, unknown_partition
from ._groups import GroupCoordinator
from ._latest import LatestIndexes
from ._log_ids import log_id_of
from ._metadata import ClusterMetadata
from ._metrics import BrokerMetrics, command_word
from ._partitioner import Partitioner
from ._read_path import ReadPath
from ._reads import (
    DEFAULT_CONS_MESSAGES,
    DEFAULT_FETCH_BYTES,
    fetch_committed,
    message_rows,
)
from ._session import ReadySlot, Session, Slot, TaskSlot, encode_replies
from ._topic_admin import Creation, TopicAdmin, metadata_call
from ._writes import WritePath

log = logging.getLogger("kafkaesque.broker.commands")


class PublishSlot:
    """The reply to one record of a coalesced batch: its offset once the batch is written."""

    __slots__ = ("_flight", "_index", "_on_error")

    def __init__(self, flight: Flight, index: int, on_error: Callable[[ErrorCode], None]) -> None:
        self._flight = flight
        self._index = index
        self._on_error = on_error

    def ready(self) -> bool:
        return self._flight.done.is_set()

    async def wait(self) -> None:
        await self._flight.done.wait()

    def notify(self, waiter: Callable[[], None]) -> None:
        self._flight.notify(waiter)

    def encode(self) -> bytes:
        flight = self._flight
        if flight.error is not None:
            self._on_error(flight.error.code)
            return encode_reply(flight.error.reply())
        # published_reply's bytes, formatted directly: this runs once per PUBS line.
        return b"+OK %d %d\r\n" % (flight.partition, flight.base + self._index)


PublishCommand = Pubs | PublishRecord | PublishBatch
_PUBLISH_TYPES = (Pubs, PublishRecord, PublishBatch)  # a tuple: isinstance's fastest form
# What a broker that does not know the cluster yet still answers (see ``Broker.ready``).
_WITHOUT_METADATA = (Ping, Help, Quit, Authenticate)
NOT_READY_MESSAGE = "the broker is still loading the cluster's metadata; retry"


@dataclass(eq=False)
class _Waiting:
    """A publish that named a topic being auto-created: dispatched once the topic is there."""

    command: PublishCommand
    nursery: trio.Nursery
    slot: Slot | None = None  # its reply's slot, once dispatched
    error: bytes | None = None  # its encoded error, if it could not be dispatched


class CommandHandler:
    """Executes commands against one broker (see the module docstring).

    Built by the broker with the services each command goes to: the write path and the
    appenders (publishes), the read path (reads), the consumer-group coordinator, the topic
    admin (topic commands, auto-creation), LATEST's key indexes, the replicated metadata, the
    access control and the metrics; and with what is the broker's own business, as callables:
    whether it is ready (see ``Broker.ready``), relaying LATEST to a partition's leader, and
    admitting a new peer broker (ADDBROKER), preferred-leader election of the groups it leads
    (ELECTLEADERS: given which log ids, it answers how many moved and how many were skipped).
    """

    def __init__(
        self,
        broker_id: int,
        *,
        metadata: ClusterMetadata,
        writes: WritePath,
        reads: ReadPath,
        appender: Callable[[str, int, Acks], PartitionAppender],
        partitioner: Partitioner,
        groups: GroupCoordinator,
        admin: TopicAdmin,
        latest: LatestIndexes,
        access: AccessControl,
        metrics: BrokerMetrics,
        ready: Callable[[], bool],
        forward_latest: Callable[[int, str, int, bytes], Awaitable[bytes]],
        admit_peer: Callable[[int, str, int], None],
        elect_leaders: Callable[[Callable[[str], bool]], tuple[int, int]],
    ) -> None:
        self._broker_id = broker_id
        self._metadata = metadata
        self._writes = writes
        self._reads = reads
        self._appender = appender
        self._groups = groups
        self._admin = admin
        self._latest = latest
        self._access = access
        self._metrics = metrics
        self._ready = ready
        self._forward_latest = forward_latest
        self._admit_peer = admit_peer
        self._elect_leaders = elect_leaders
        self._partitioner = partitioner
        # The admin's topics being auto-created, by name: the same dict, read here by every
        # publish (see ``Creation``'s invariant).
        self._creating = admin.creating
        # A publish's late failure is counted under its command's word: one callback per word,
        # made here once (a publish allocates none).
        self._publish_failed: dict[str, Callable[[ErrorCode], None]] = {
            word: functools.partial(metrics.error, word) for word in ("PUBS", "PUB")
        }

    # -- dispatch -------------------------------------------------------------------------------

    def dispatch(
        self,
        command: Command,
        nursery: trio.Nursery,
        session: Session | None = None,
        *,
        forwarded: bool = False,
    ) -> Slot:
        """The reply's slot for ``command``; ``session`` is the client connection's, if any.

        A client's command is checked (``AccessControl``: authenticated, and allowed by the
        ACLs) when the broker enforces anything; a peer's (``forwarded``) was checked by the
        broker it arrived at."""
        name = command_word(command)
        self._metrics.request(name)
        try:
            return self._dispatch(command, nursery, forwarded, session)
        except RequestError as exc:
            self._metrics.error(name, exc.code)
            return ReadySlot(encode_reply(exc.reply()))

    def _dispatch(
        self, command: Command, nursery: trio.Nursery, forwarded: bool, session: Session | None
    ) -> Slot:
        # The one test on the hot path of a broker without users file and ACLs.
        checked = self._access.enforcing and session is not None and not forwarded
        if checked:
            assert session is not None
            if session.principal is None:  # before the ready test: it needs no metadata
                self._access.check(command, session)
        # Before anything reads the metadata (a publish's auto-creation included): a broker that
        # has not caught up with the controller quorum would answer from a view that may lack
        # topics that exist (issue 23). See ``Broker.ready``.
        if not self._ready() and not isinstance(command, _WITHOUT_METADATA):
            raise RequestError(ErrorCode.NOT_READY, NOT_READY_MESSAGE)
        if checked:
            assert session is not None
            self._access.check(command, session)
        if isinstance(command, _PUBLISH_TYPES):
            topic = command.topic
            if topic in self._creating or (
                topic not in self._metadata.view.topics and self._admin.auto_creates(topic)
            ):
                if checked and topic not in self._creating:
                    assert session is not None
                    self._access.check_operation(
                        session, AclOperation.CREATE, AclResource.TOPIC, topic
                    )
                return self._after_creation(command, nursery)
            return self._dispatch_publish(command, nursery)
        match command:
            case Ping():
                return _ready(OkReply("PONG"))
            case Quit():
                return _ready(OkReply("bye"))
            case Help(command=word):
                return _ready(*help_replies(word))
            case ListTopics():
                return _ready(*self._admin.list_topics(session))
            case Metadata(topics=names):
                return _ready(*self._admin.metadata_rows(names, session))
            case Authenticate():
                if session is None:  # a peer's: never (peers authenticate otherwise)
                    raise RequestError(ErrorCode.BAD_ARGS, "AUTH is for client connections")
                auth = TaskSlot()
                nursery.start_soon(self._authenticate, command, auth, session)
                return auth
            case Subs(topic=topic) if checked and topic not in self._metadata.view.topics:
                if self._admin.auto_creates(topic):  # the subscription creates it: create topic too
                    assert session is not None
                    self._access.check_operation(
                        session, AclOperation.CREATE, AclResource.TOPIC, topic
                    )
        slot = TaskSlot()
        nursery.start_soon(self._run, command, slot, forwarded, session)
        return slot

    def _dispatch_publish(self, command: PublishCommand, nursery: trio.Nursery) -> Slot:
        """The slot of a publish to a topic that exists (else ``UNKNOWN_TOPIC`` is raised)."""
        match command:
            case Pubs(topic=topic, message=message):
                seed = parse_seed_message(message)
                headers = () if seed.header is None else (("Header", seed.header),)
                return self._publish(
                    topic, seed.value, seed.key, headers, None, Acks.QUORUM, word="PUBS"
                )
            case PublishRecord(idempotence=Idempotence() as ids, partition=int(p)):
                # Its own batch, stamped with the producer's identity: never coalesced.
                record = Record(command.value, command.key, timestamp=int(time.time() * 1000))
                batch = build_batch(
                    [record],
                    producer_id=ids.producer_id,
                    producer_epoch=ids.epoch,
                    base_sequence=ids.sequence,
                )
                return self._write_batch(
                    command.topic, p, batch, 1, command.acks, nursery, word="PUB"
                )
            case PublishRecord(topic=t, value=v, key=k, partition=p, acks=acks):
                return self._publish(t, v, k, (), p, acks, word="PUB")
            case PublishBatch():
                return self._publish_batch(command, nursery)
        raise AssertionError(f"not a publish: {command!r}")

    async def _run(
        self, command: Command, slot: TaskSlot, forwarded: bool, session: Session | None
    ) -> None:
        name = command_word(command)
        try:
            data = await self._execute(command, forwarded)
            if session is not None:
                _remember_members(session, command, data, self._groups)
                if isinstance(command, ListGroups) and self._access.enforcing:
                    data = self._visible_groups(session, data)
            slot.set(data)
        except RequestError as exc:
            self._metrics.error(name, exc.code)
            slot.set(encode_reply(exc.reply()))
        except Exception:  # a bug: answer it, log it, keep serving everyone else
            log.exception("command %s failed", name)
            self._metrics.error(name, ErrorCode.INTERNAL)
            slot.set(encode_reply(ErrorReply(ErrorCode.INTERNAL, "internal error (logged)")))

    def _election_filter(self, topic: str | None, partition: int | None) -> Callable[[str], bool]:
        """Which log ids an ``ELECTLEADERS`` names: all, a topic's, or one partition's;
        ``RequestError`` for a topic or partition that does not exist."""
        if topic is None:
            return lambda log_id: True
        info = self._metadata.view.topics.get(topic)
        if info is None:
            raise RequestError(ErrorCode.UNKNOWN_TOPIC, f"topic {topic} does not exist")
        if partition is None:
            logs = {log_id_of(topic, p) for p in range(len(info.replicas))}
            return logs.__contains__
        if partition >= len(info.replicas):
            raise RequestError(
                ErrorCode.UNKNOWN_PARTITION,
                f"topic {topic} has no partition {partition} (it has {len(info.replicas)})",
            )
        one = log_id_of(topic, partition)
        return lambda log_id: log_id == one

    async def _execute(self, command: Command, forwarded: bool) -> bytes:
        match command:
            case Fetch():
                return await self._fetch(command)
            case Latest(topic=topic, key=key):
                return await self.latest(topic, key, forwarded=forwarded)
            case Subs(topic=topic):
                # The coordinator creates it too when a forwarded SUBS gets there before the
                # metadata does: an auto-creation of an existing topic is a no-op.
                if topic not in self._metadata.view.topics and self._admin.auto_creates(topic):
                    await self._admin.ensure_topic(topic)
                return await self._groups.execute(command, forwarded)
            case Cons() | Commit() | FetchOffsets() | Leave() | DescribeGroup():
                return await self._groups.execute(command, forwarded)
            case ListGroups() | ResetOffsets() | DeleteGroup():
                return await self._groups.execute(command, forwarded)
            case DescribeTopic(topic=topic, time_ms=time_ms):
                return await self._admin.describe(topic, time_ms)
            case CreateTopic():
                return await self._admin.create(command)
            case AlterTopic():
                return await self._admin.alter(command)
            case DeleteTopic(topic=topic):
                return await self._admin.delete(topic)
            case Reassign():
                return await self._admin.reassign(command)
            case ElectLeaders(topic=topic, partition=partition):
                moved, skipped = self._elect_leaders(self._election_filter(topic, partition))
                return encode_reply(OkReply(f"moved={moved} skipped={skipped}"))
            case AddBroker(broker_id=broker_id, peer=peer, controller=controller):
                host, _, port = controller.rpartition(":")
                await metadata_call(self._metadata.add_controller(broker_id, (host, int(port))))
                peer_host, _, peer_port = peer.rpartition(":")
                self._admit_peer(broker_id, peer_host, int(peer_port))
                return encode_reply(OkReply())
            case RemoveBroker(broker_id=broker_id):
                moved = await self._admin.remove_broker(broker_id)
                return encode_reply(OkReply(f"moved={moved}"))
            case AclAdd(acl=acl):
                await metadata_call(self._metadata.add_acl(acl))
                return encode_reply(OkReply())
            case AclRemove(acl=acl):
                removed = await metadata_call(self._metadata.remove_acl(acl))
                return encode_reply(OkReply(f"removed={removed}"))
            case AclList(principal=principal):
                acls = self._metadata.view.acls
                rows = sorted(
                    (a for a in acls if principal is None or a.principal == principal),
                    key=_acl_order,
                )
                return encode_replies([*rows, EndReply()])
        raise RequestError(ErrorCode.UNKNOWN_COMMAND, f"{type(command).__name__} is not served")

    async def _authenticate(self, command: Authenticate, slot: TaskSlot, session: Session) -> None:
        """One AUTH step (``AccessControl.authenticate``); a bug is answered INTERNAL, and the
        exchange is dropped."""
        try:
            slot.set(await self._access.authenticate(session, command))
        except Exception:  # a bug: answer it, log it, keep serving
            log.exception("AUTH failed")
            session.sasl = None
            self._metrics.error("AUTH", ErrorCode.INTERNAL)
            slot.set(encode_reply(ErrorReply(ErrorCode.INTERNAL, "internal error (logged)")))

    def _visible_groups(self, session: Session, data: bytes) -> bytes:
        """GROUPS' reply with only the ``+GROUPSTATE`` rows of groups ``session`` may
        describe (group names have no spaces: a row's second word is its group)."""
        lines = data.split(b"\r\n")
        groups = {
            line.split(b" ", 2)[1].decode("utf-8", "replace")
            for line in lines
            if line.startswith(b"+GROUPSTATE ") and line.count(b" ") >= 2
        }
        visible = set(self._access.visible(session, AclResource.GROUP, sorted(groups)))
        kept = [
            line
            for line in lines
            if not line.startswith(b"+GROUPSTATE ")
            or line.split(b" ", 2)[1].decode("utf-8", "replace") in visible
        ]
        return b"\r\n".join(kept)

    # -- auto-creation --------------------------------------------------------------------------

    def _after_creation(self, command: PublishCommand, nursery: trio.Nursery) -> Slot:
        """A publish to a topic being auto-created: its slot, filled once the topic is there
        and the publish was dispatched (in the order the publishes arrived)."""
        creation = self._creating.get(command.topic)
        if creation is None:
            creation = self._admin.start_creation(command.topic, nursery)
        waiting = _Waiting(command, nursery)
        dispatch = functools.partial(self._dispatch_waiting, waiting)
        creation.waiting.append(dispatch)
        slot = TaskSlot()
        nursery.start_soon(self._reply_after_creation, creation, waiting, dispatch, slot)
        return slot

    async def _reply_after_creation(
        self,
        creation: Creation,
        waiting: _Waiting,
        dispatch: Callable[[RequestError | None], None],
        slot: TaskSlot,
    ) -> None:
        try:
            await creation.done.wait()
            if waiting.slot is not None:
                await waiting.slot.wait()
                slot.set(waiting.slot.encode())
            else:
                assert waiting.error is not None  # invariant: one of them is set when done
                slot.set(waiting.error)
        finally:
            # Cancelled before its turn (its connection closed): never dispatched.
            if dispatch in creation.waiting:
                creation.waiting.remove(dispatch)

    def _dispatch_waiting(self, waiting: _Waiting, error: RequestError | None) -> None:
        """Dispatch a publish that waited for its topic's creation, which ended with ``error``
        (None: created); its slot or its encoded error is left in ``waiting``."""
        name = command_word(waiting.command)
        try:
            if error is not None:
                raise error
            waiting.slot = self._dispatch_publish(waiting.command, waiting.nursery)
        except RequestError as exc:
            self._metrics.error(name, exc.code)
            waiting.error = encode_reply(exc.reply())
        except Exception:  # a bug: answer it, log it, keep serving everyone else
            log.exception("publish %s failed", name)
            self._metrics.error(name, ErrorCode.INTERNAL)
            waiting.error = encode_reply(ErrorReply(ErrorCode.INTERNAL, "internal error (logged)"))

    # -- publishing -----------------------------------------------------------------------------

    def _publish(
        self,
        topic: str,
        value: bytes,
        key: bytes | None,
        headers: tuple[tuple[str, bytes], ...],
        partition: int | None,
        acks: Acks,
        *,
        word: str,
    ) -> Slot:
        """Append one record through the partition's appender; ``word`` (PUBS or PUB) labels
        a failure in the metrics."""
        info = known_topic(self._metadata.view.topics, topic)
        partition = self._partitioner.choose(topic, info.config.partitions, key, partition)
        record = Record(value=value, key=key, headers=headers, timestamp=int(time.time() * 1000))
        flight, index = self._appender(topic, partition, acks).add(record)
        return PublishSlot(flight, index, self._publish_failed[word])

    def _publish_batch(self, command: PublishBatch, nursery: trio.Nursery) -> Slot:
        batch = command.batch
        try:
            header = decode_header(batch, header_crc=False)
        except InvalidBatchError as exc:
            raise RequestError(ErrorCode.INVALID_BATCH, str(exc)) from exc
        if header.size != len(batch):
            raise RequestError(
                ErrorCode.INVALID_BATCH, f"the payload holds {len(batch)} bytes, not one batch"
            )
        if header.batch_type is not BatchType.DATA or header.record_count < 1:
            raise RequestError(ErrorCode.INVALID_BATCH, "a batch of data records is required")
        if header.last_offset_delta != header.record_count - 1:
            raise RequestError(ErrorCode.INVALID_BATCH, "record offsets must be contiguous")
        # Everything else about the batch (CRCs, size limit) is checked as it is proposed.
        return self._write_batch(
            command.topic,
            command.partition,
            batch,
            header.record_count,
            command.acks,
            nursery,
            word="PUBB",
        )

    def _write_batch(
        self,
        topic: str,
        partition: int,
        batch: bytes,
        count: int,
        acks: Acks,
        nursery: trio.Nursery,
        *,
        word: str,
    ) -> Slot:
        """Start writing ``batch`` now (keeping the session's order); its reply when written.
        ``word`` (PUB or PUBB) labels a failure in the metrics."""
        info = known_topic(self._metadata.view.topics, topic)
        if partition >= info.config.partitions:
            raise unknown_partition(topic, partition, info.config.partitions)
        log_id = log_id_of(topic, partition)
        writes = self._writes
        deadline = trio.current_time() + writes.timeout
        attempt = writes.start(log_id, batch, count, acks, deadline)
        slot = TaskSlot()

        async def complete() -> None:
            try:
                first, _ = await writes.write(
                    log_id, batch, count, acks, first=attempt, deadline=deadline
                )
            except RequestError as exc:
                self._metrics.error(word, exc.code)
                slot.set(encode_reply(exc.reply()))
                return
            slot.set(encode_reply(published_reply(partition, first)))

        nursery.start_soon(complete)
        return slot

    # -- reading --------------------------------------------------------------------------------

    async def _fetch(self, command: Fetch) -> bytes:
        info = known_topic(self._metadata.view.topics, command.topic)
        if command.partition >= info.config.partitions:
            raise unknown_partition(command.topic, command.partition, info.config.partitions)
        max_bytes = command.max_bytes or DEFAULT_FETCH_BYTES
        wait_s = (command.wait_ms or 0) / 1000
        if command.replica is FetchReplica.LOCAL:
            # This replica's own log, whatever its role: how checkers and operators compare
            # replicas (a read served by the leader shows only the leader's).
            replica = self._reads.local_replica(command.topic, command.partition)
            if replica is None:
                raise RequestError(
                    ErrorCode.NO_REPLICA,
                    f"broker {self._broker_id} holds no replica of "
                    f"{command.topic}/{command.partition}",
                )
            fetched = await fetch_committed(replica, command.offset, max_bytes, wait_s)
        else:
            fetched = await self._reads.fetch(
                command.topic, command.partition, command.offset, max_bytes, wait_s
            )
        if command.format is FetchFormat.TEXT:
            rows, next_offset = message_rows(
                command.partition, fetched, command.offset, DEFAULT_CONS_MESSAGES
            )
            return encode_replies([*rows, EndReply(((command.partition, next_offset),))])
        return encode_reply(
            DataReply(fetched.next_offset, bytes(fetched.data), fetched.high_watermark)
        )

    async def latest(
        self, topic: str, key: bytes, partition: int | None = None, *, forwarded: bool = False
    ) -> bytes:
        """``LATEST``'s encoded reply: the newest committed value of ``key`` (a ``+MSG`` row and
        ``+END``; ``+END`` alone when it has none), from the leader of the key's partition
        (``partition``, when a peer forwarded it, else by the producers' partitioner).

        Served here when this broker leads the partition, else forwarded to the leader once
        (a forwarded one is never forwarded again: ``NOT_LEADER``, the client retries). Raises
        ``RequestError``: ``NOT_COMPACTED`` for a topic that is not compacted, ``NOT_LEADER``
        and ``NOT_READY`` (retriable), ``UNKNOWN_TOPIC``, ``UNKNOWN_PARTITION``.
        """
        info = known_topic(self._metadata.view.topics, topic)
        if not info.config.compact:
            raise RequestError(
                ErrorCode.NOT_COMPACTED,
                f"topic {topic} is not compacted: LATEST serves compacted topics only "
                "(CREATE or ALTER it with compact=yes)",
            )
        count = info.config.partitions
        if partition is None:
            partition = partition_for_key(key, count)
        elif partition >= count:
            raise unknown_partition(topic, partition, count)
        replica = self._reads.local_replica(topic, partition)
        if replica is not None and replica.role is Role.LEADER:
            record = await self._latest.lookup(replica, key)
            rows: list[Reply] = []
            if record is not None:
                rows.append(MessageRow(partition, record.offset, record.key, record.value))
            return encode_replies([*rows, EndReply()])
        log_id = log_id_of(topic, partition)
        leader = self._writes.leader_of(log_id)
        if forwarded or leader is None or leader == self._broker_id:
            raise RequestError(
                ErrorCode.NOT_LEADER,
                f"{log_id}: broker {self._broker_id} does not lead it and "
                f"{'was asked by a peer' if forwarded else 'knows no leader'}; retry",
            )
        return await self._forward_latest(leader, topic, partition, key)

    # -- administration -------------------------------------------------------------------------


def _remember_members(
    session: Session, command: Command, reply: bytes, groups: GroupCoordinator
) -> None:
    """Track the group members a connection joined, so that its closing makes them leave, and
    so that its being open keeps them alive (those without a session timeout of their own)."""
    if isinstance(command, Subs) and reply.startswith(b"+OK "):
        # The id is the first word (a note on the partitions granted may follow it).
        member = reply[4:].split(None, 1)[0].decode("ascii")
        session.members.add(member)
        if command.session_timeout_ms is None:
            groups.hold(member)
    elif isinstance(command, Leave) and command.subscription_id in session.members:
        session.members.discard(command.subscription_id)
        groups.release(command.subscription_id)


def _acl_order(acl: AclRow) -> tuple[str, ...]:
    return (acl.principal, acl.resource, acl.name, acl.pattern, acl.operation, acl.permission)


def _ready(*replies: Reply) -> ReadySlot:
    return ReadySlot(encode_replies(replies))
