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
import itertools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

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
    BrokerRow,
    Command,
    Commit,
    Cons,
    CreateTopic,
    DataReply,
    DeleteGroup,
    DeleteTopic,
    DescribeGroup,
    DescribeTopic,
    EndReply,
    ErrorCode,
    ErrorReply,
    Fetch,
    FetchFormat,
    FetchOffsets,
    FetchReplica,
    Fsync,
    Help,
    Idempotence,
    Latest,
    Leave,
    ListGroups,
    ListTopics,
    MessageRow,
    Metadata,
    OkReply,
    PartitionRow,
    Ping,
    PublishBatch,
    PublishRecord,
    Pubs,
    Quit,
    ReadRequest,
    Reassign,
    RemoveBroker,
    Reply,
    ResetOffsets,
    Subs,
    TopicRow,
    encode_reply,
    help_replies,
    is_internal_topic,
    parse_seed_message,
    partition_for_key,
    published_reply,
)
from kafkaesque.raft import NotLeader, Role
from kafkaesque.raft.driver import CommitTimeout, RaftGroup
from kafkaesque.storage import BatchType, InvalidBatchError, Record, build_batch, decode_header

from ._appender import Flight
from ._config import MAX_PARTITIONS
from ._decommission import decommission, delegate_decommission
from ._errors import RequestError
from ._metadata import (
    InvalidConfigError,
    MetadataError,
    MetadataUnavailable,
    TopicConfig,
    TopicExistsError,
    TopicInfo,
    UnknownTopicError,
)
from ._metrics import command_word
from ._reads import (
    DEFAULT_CONS_MESSAGES,
    DEFAULT_FETCH_BYTES,
    Fetched,
    beyond_follower,
    committed_offset_for_time,
    fetch_committed,
    message_rows,
)
from ._session import ReadySlot, Session, Slot, TaskSlot

if TYPE_CHECKING:
    from ._broker import Broker

log = logging.getLogger("kafkaesque.broker.commands")

_T = TypeVar("_T")

REASSIGN_TIMEOUT_S = 120.0
_LOG_START_TRIES = 3
_REASSIGN_POLL_S = 0.05
# An auto-creation waits this long at most for the brokers it would place replicas on to register
# (a cluster just started may have registered only some), then creates with those there are.
AUTO_CREATE_BROKERS_WAIT_S = 5.0
_BROKERS_POLL_S = 0.05


def encode_replies(replies: Sequence[Reply]) -> bytes:
    return b"".join(encode_reply(r) for r in replies)


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


@dataclass(eq=False)
class _Creation:
    """A topic this broker is auto-creating, and the publishes waiting for it, in arrival order.

    Invariant: while a ``_Creation`` is in ``CommandHandler._creating``, every publish to its
    topic joins ``waiting`` (even once the metadata shows the topic), so that records of one
    connection reach the appender in the order they were sent.
    """

    topic: str
    done: trio.Event = field(default_factory=trio.Event)
    error: RequestError | None = None
    waiting: deque[_Waiting] = field(default_factory=deque)


class CommandHandler:
    """Executes commands against one broker (see the module docstring)."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self._access = broker.access
        self._round_robin: dict[str, itertools.count[int]] = {}
        self._creating: dict[str, _Creation] = {}  # topics being auto-created, by name
        # A publish's late failure is counted under its command's word: one callback per word,
        # made here once (a publish allocates none).
        self._publish_failed: dict[str, Callable[[ErrorCode], None]] = {
            word: functools.partial(self._broker.metrics.error, word) for word in ("PUBS", "PUB")
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
        self._broker.metrics.request(name)
        try:
            return self._dispatch(command, nursery, forwarded, session)
        except RequestError as exc:
            self._broker.metrics.error(name, exc.code)
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
        if not self._broker.ready and not isinstance(command, _WITHOUT_METADATA):
            raise RequestError(ErrorCode.NOT_READY, NOT_READY_MESSAGE)
        if checked:
            assert session is not None
            self._access.check(command, session)
        if isinstance(command, _PUBLISH_TYPES):
            topic = command.topic
            if topic in self._creating or (
                topic not in self._broker.metadata.view.topics and self.auto_creates(topic)
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
                topics = self._broker.metadata.view.topics
                names = self._access.visible(session, AclResource.TOPIC, sorted(topics))
                return _ready(*(_topic_row(topics[n]) for n in names), EndReply())
            case Metadata(topics=names):
                return _ready(*self._metadata(names, session))
            case Authenticate():
                if session is None:  # a peer's: never (peers authenticate otherwise)
                    raise RequestError(ErrorCode.BAD_ARGS, "AUTH is for client connections")
                auth = TaskSlot()
                nursery.start_soon(self._authenticate, command, auth, session)
                return auth
            case Subs(topic=topic) if checked and topic not in self._broker.metadata.view.topics:
                if self.auto_creates(topic):  # the subscription creates it: create topic too
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
                _remember_members(session, command, data)
                if isinstance(command, ListGroups) and self._access.enforcing:
                    data = self._visible_groups(session, data)
            slot.set(data)
        except RequestError as exc:
            self._broker.metrics.error(name, exc.code)
            slot.set(encode_reply(exc.reply()))
        except Exception:  # a bug: answer it, log it, keep serving everyone else
            log.exception("command %s failed", name)
            self._broker.metrics.error(name, ErrorCode.INTERNAL)
            slot.set(encode_reply(ErrorReply(ErrorCode.INTERNAL, "internal error (logged)")))

    async def _execute(self, command: Command, forwarded: bool) -> bytes:
        match command:
            case Fetch():
                return await self._fetch(command)
            case Latest(topic=topic, key=key):
                return await self.latest(topic, key, forwarded=forwarded)
            case Subs(topic=topic):
                # The coordinator creates it too when a forwarded SUBS gets there before the
                # metadata does: an auto-creation of an existing topic is a no-op.
                if topic not in self._broker.metadata.view.topics and self.auto_creates(topic):
                    await self.ensure_topic(topic)
                return await self._broker.groups.execute(command, forwarded)
            case Cons() | Commit() | FetchOffsets() | Leave() | DescribeGroup():
                return await self._broker.groups.execute(command, forwarded)
            case ListGroups() | ResetOffsets() | DeleteGroup():
                return await self._broker.groups.execute(command, forwarded)
            case DescribeTopic(topic=topic, time_ms=time_ms):
                return await self._describe(topic, time_ms)
            case CreateTopic():
                return await self._create(command)
            case AlterTopic():
                return await self._alter(command)
            case DeleteTopic(topic=topic):
                await self._metadata_call(self._broker.metadata.delete_topic(topic))
                return encode_reply(OkReply())
            case Reassign():
                return await self._reassign(command)
            case AddBroker(broker_id=broker_id, peer=peer, controller=controller):
                host, _, port = controller.rpartition(":")
                await self._metadata_call(
                    self._broker.metadata.add_controller(broker_id, (host, int(port)))
                )
                peer_host, _, peer_port = peer.rpartition(":")
                self._broker.admit_peer(broker_id, peer_host, int(peer_port))
                return encode_reply(OkReply())
            case RemoveBroker(broker_id=broker_id):
                moved = await self.remove_broker(broker_id)
                return encode_reply(OkReply(f"moved={moved}"))
            case AclAdd(acl=acl):
                await self._metadata_call(self._broker.metadata.add_acl(acl))
                return encode_reply(OkReply())
            case AclRemove(acl=acl):
                removed = await self._metadata_call(self._broker.metadata.remove_acl(acl))
                return encode_reply(OkReply(f"removed={removed}"))
            case AclList(principal=principal):
                acls = self._broker.metadata.view.acls
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
            self._broker.metrics.error("AUTH", ErrorCode.INTERNAL)
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

    def auto_creates(self, topic: str) -> bool:
        """Whether a publish or a subscription naming ``topic``, if missing, creates it: when
        the broker's ``auto_create_topics`` is on and the name is not an internal one."""
        return self._broker.config.auto_create_topics and not is_internal_topic(topic)

    async def ensure_topic(self, topic: str) -> TopicInfo:
        """``topic``, auto-created first if it is missing (see ``_create_on_first_use``).

        Raises ``RequestError``: ``NOT_LEADER`` (retriable) when its partitions have no leader
        in time, ``NO_QUORUM`` when the controller quorum does not answer, ``INVALID_CONFIG``.
        """
        creation = self._creating.get(topic)
        if creation is None:
            info = self._broker.metadata.view.topics.get(topic)
            if info is not None:
                return info
            creation = self._start_creation(topic, None)
        await creation.done.wait()
        if creation.error is not None:
            raise creation.error
        return self._topic(topic)

    def _after_creation(self, command: PublishCommand, nursery: trio.Nursery) -> Slot:
        """A publish to a topic being auto-created: its slot, filled once the topic is there
        and the publish was dispatched (in the order the publishes arrived)."""
        creation = self._creating.get(command.topic)
        if creation is None:
            creation = self._start_creation(command.topic, nursery)
        waiting = _Waiting(command, nursery)
        creation.waiting.append(waiting)
        slot = TaskSlot()
        nursery.start_soon(self._reply_after_creation, creation, waiting, slot)
        return slot

    async def _reply_after_creation(
        self, creation: _Creation, waiting: _Waiting, slot: TaskSlot
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
            if waiting in creation.waiting:
                creation.waiting.remove(waiting)

    def _start_creation(self, topic: str, nursery: trio.Nursery | None) -> _Creation:
        """Begin auto-creating ``topic`` in a task of the broker (it outlives the connection
        that asked: others may be waiting for it too)."""
        creation = self._creating[topic] = _Creation(topic)
        where = self._broker.nursery or nursery
        if where is None:  # not serving yet: no task can run, nothing waits
            del self._creating[topic]
            raise RequestError(ErrorCode.NOT_LEADER, "the broker is starting; retry")
        where.start_soon(self._create_on_first_use, creation)
        return creation

    async def _create_on_first_use(self, creation: _Creation) -> None:
        """Create ``creation.topic`` with the broker's defaults, wait until its partitions have
        leaders (up to the write timeout), then dispatch the waiting publishes in order.

        The creation is the metadata's own (``create_topic(auto=True)``): applied on the
        controller quorum, it answers the existing topic if another broker created it first, so
        brokers that auto-create one topic at once all end with that one topic.
        """
        topic = creation.topic
        try:
            info = await self._create_topic_auto(topic)
            await self._broker.wait_for_leaders(info)
            leaderless = [
                p
                for p in range(info.config.partitions)
                if self._broker.writes.leader_of(group_name(topic, p)) is None
            ]
            if leaderless:
                raise RequestError(
                    ErrorCode.NOT_LEADER,
                    f"topic {topic} was created, but partitions {_numbers(leaderless)} have no "
                    f"leader after {self._broker.config.write_timeout_s:g} s; retry",
                )
        except RequestError as exc:
            creation.error = exc
        except Exception:  # a bug: answer it, log it, keep the broker serving
            log.exception("auto-creating topic %s failed", topic)
            creation.error = RequestError(ErrorCode.INTERNAL, "internal error (logged)")
        except BaseException:  # cancelled: the broker is stopping
            creation.error = RequestError(
                ErrorCode.NOT_LEADER, f"creating topic {topic} was cut short; retry"
            )
            raise
        finally:
            # No await from here on: the waiting publishes reach their appenders in order
            # before any publish that comes after them.
            del self._creating[topic]
            while creation.waiting:
                self._dispatch_waiting(creation, creation.waiting.popleft())
            creation.done.set()

    def _dispatch_waiting(self, creation: _Creation, waiting: _Waiting) -> None:
        name = command_word(waiting.command)
        try:
            if creation.error is not None:
                raise creation.error
            waiting.slot = self._dispatch_publish(waiting.command, waiting.nursery)
        except RequestError as exc:
            self._broker.metrics.error(name, exc.code)
            waiting.error = encode_reply(exc.reply())
        except Exception:  # a bug: answer it, log it, keep serving everyone else
            log.exception("publish %s failed", name)
            self._broker.metrics.error(name, ErrorCode.INTERNAL)
            waiting.error = encode_reply(ErrorReply(ErrorCode.INTERNAL, "internal error (logged)"))

    async def _create_topic_auto(self, topic: str) -> TopicInfo:
        """The metadata's auto-creation of ``topic`` with this broker's defaults."""
        broker = self._broker
        config = broker.config
        # A broker that starts first waits a little for the others to register, or the topic
        # would get fewer replicas than the cluster has (the metadata caps them at those there).
        await self._wait_registered(min(config.default_replication_factor, len(config.peers)))
        topic_config = TopicConfig(
            partitions=config.default_partitions,
            replication_factor=config.default_replication_factor,
            retention_ms=config.default_retention_ms,
            retention_bytes=config.default_retention_bytes,
        )
        try:
            info = await self._metadata_call(
                broker.metadata.create_topic(topic, topic_config, auto=True)
            )
        except RequestError as exc:
            if exc.code is ErrorCode.TIMEOUT:  # nothing of the publish was written
                raise RequestError(
                    ErrorCode.NO_QUORUM, f"creating topic {topic}: {exc.message}"
                ) from exc
            raise
        log.info("broker %d: auto-created topic %s", config.id, topic)
        return info

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
        info = self._topic(topic)
        count = info.config.partitions
        if partition is None:
            if key is not None:
                partition = partition_for_key(key, count)
            else:
                counter = self._round_robin.setdefault(topic, itertools.count())
                partition = next(counter) % count
        elif partition >= count:
            raise _unknown_partition(topic, partition, count)
        record = Record(value=value, key=key, headers=headers, timestamp=int(time.time() * 1000))
        flight, index = self._broker.appender(topic, partition, acks).add(record)
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
        info = self._topic(topic)
        if partition >= info.config.partitions:
            raise _unknown_partition(topic, partition, info.config.partitions)
        group_id = group_name(topic, partition)
        writes = self._broker.writes
        deadline = trio.current_time() + writes.timeout
        attempt = writes.start(group_id, batch, count, acks, deadline)
        slot = TaskSlot()

        async def complete() -> None:
            try:
                first, _ = await writes.write(
                    group_id, batch, count, acks, first=attempt, deadline=deadline
                )
            except RequestError as exc:
                self._broker.metrics.error(word, exc.code)
                slot.set(encode_reply(exc.reply()))
                return
            slot.set(encode_reply(published_reply(partition, first)))

        nursery.start_soon(complete)
        return slot

    # -- reading --------------------------------------------------------------------------------

    async def _fetch(self, command: Fetch) -> bytes:
        info = self._topic(command.topic)
        if command.partition >= info.config.partitions:
            raise _unknown_partition(command.topic, command.partition, info.config.partitions)
        max_bytes = command.max_bytes or DEFAULT_FETCH_BYTES
        wait_s = (command.wait_ms or 0) / 1000
        if command.replica is FetchReplica.LOCAL:
            # This replica's own log, whatever its role: how checkers and operators compare
            # replicas (a read served by the leader shows only the leader's).
            group = self._broker.local_group(command.topic, command.partition)
            if group is None:
                raise RequestError(
                    ErrorCode.NO_REPLICA,
                    f"broker {self._broker.config.id} holds no replica of "
                    f"{command.topic}/{command.partition}",
                )
            fetched = await fetch_committed(group, command.offset, max_bytes, wait_s)
        else:
            fetched = await self.fetch_batches(
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
        info = self._topic(topic)
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
            raise _unknown_partition(topic, partition, count)
        group = self._broker.local_group(topic, partition)
        if group is not None and group.role is Role.LEADER:
            record = await self._broker.latest.lookup(group, key)
            rows: list[Reply] = []
            if record is not None:
                rows.append(MessageRow(partition, record.offset, record.key, record.value))
            return encode_replies([*rows, EndReply()])
        group_id = group_name(topic, partition)
        leader = self._broker.writes.leader_of(group_id)
        if forwarded or leader is None or leader == self._broker.config.id:
            raise RequestError(
                ErrorCode.NOT_LEADER,
                f"{group_id}: broker {self._broker.config.id} does not lead it and "
                f"{'was asked by a peer' if forwarded else 'knows no leader'}; retry",
            )
        return await self._broker.forward_latest(leader, topic, partition, key)

    async def fetch_batches(
        self, topic: str, partition: int, offset: int, max_bytes: int, wait_s: float
    ) -> Fetched:
        """Committed batches, from the leader when it can be reached, else from any replica.

        The leader learns of a commit first: reading there, a consumer sees a record as soon as
        it is acknowledged, and a client reads its own acknowledged writes. A follower is a
        heartbeat behind, so it serves reads only while the leader is out of reach (including a
        leader that let a read go unanswered in the last seconds: ``forward_to_replica``).
        """
        group = self._broker.local_group(topic, partition)
        if group is not None and group.role is Role.LEADER:
            return await self._read_local(group, offset, max_bytes, wait_s)
        info = self._topic(topic)
        read = ReadRequest(topic, partition, offset, max_bytes, int(wait_s * 1000))
        local = group is not None and not beyond_follower(group, offset)
        try:
            answer = await self._broker.forward_to_replica(
                info, partition, read, local_replica=local
            )
        except RequestError:
            if group is None or beyond_follower(group, offset):
                raise
            return await self._read_local(group, offset, max_bytes, wait_s)
        if isinstance(answer, RequestError):  # the replica's own answer: no fallback
            raise answer
        return answer

    async def read_replica(
        self, topic: str, partition: int, offset: int, max_bytes: int, wait_s: float
    ) -> Fetched:
        """A read a peer chose this replica for (``ReadRequest``): served from it, never
        forwarded again. Raises ``RequestError``; ``NOT_LEADER`` when this broker holds no
        replica, or its log ends before ``offset`` (behind the leader: not out of range).
        """
        info = self._topic(topic)
        if partition >= info.config.partitions:
            raise _unknown_partition(topic, partition, info.config.partitions)
        group = self._broker.local_group(topic, partition)
        if group is None:
            raise RequestError(ErrorCode.NOT_LEADER, "this broker holds no replica")
        if beyond_follower(group, offset):
            # Behind, not out of range: a consumer told OFFSET_OUT_OF_RANGE resets its
            # position (to the log start), and would read again what it had read.
            raise RequestError(
                ErrorCode.NOT_LEADER,
                f"this replica's log ends at {group.log.log_end_offset}, before offset "
                f"{offset}: it is behind the leader; retry",
            )
        return await self._read_local(group, offset, max_bytes, wait_s)

    async def _read_local(
        self, group: RaftGroup, offset: int, max_bytes: int, wait_s: float
    ) -> Fetched:
        """``fetch_committed`` on this replica, where "past the end of the log" is answered
        OFFSET_OUT_OF_RANGE only by a leader that confirms it still leads.

        A consumer told OFFSET_OUT_OF_RANGE resets its position to the log start. A deposed
        leader that has not heard of its successor yet (it was paused, or cut off) has a shorter
        log than what was committed since; its "out of range" sent consumers back to offset 0
        (found by jepsen_like). It answers NOT_LEADER instead, and the consumer retries.
        """
        try:
            return await fetch_committed(group, offset, max_bytes, wait_s)
        except RequestError as exc:
            if exc.code is not ErrorCode.OFFSET_OUT_OF_RANGE or offset <= group.log.log_end_offset:
                raise
            try:
                await self._broker.raft.read_index(group.id, timeout=self._broker.writes.timeout)
            except (NotLeader, CommitTimeout) as lost:
                raise RequestError(
                    ErrorCode.NOT_LEADER,
                    f"{group.id}: offset {offset} is past this replica's log, which may be "
                    f"behind the leader's ({lost}); retry",
                ) from exc
            return await fetch_committed(group, offset, max_bytes, wait_s)

    async def cons_pass(
        self, topic: str, wanted: dict[int, int], limit: int, deadline: float
    ) -> tuple[list[Reply], dict[int, int]]:
        """Read the partitions of ``wanted`` (partition -> offset), waiting until ``deadline``
        for records if there are none. Returns the rows (at most ``limit``) and every
        partition's next offset.

        First every partition is read at once without waiting (so a CONS gets everything there
        is); only if that finds nothing, every partition is long-polled at once, and the first
        to deliver records is the answer (a record reaches its consumer as soon as it commits).

        A long poll (``deadline`` ahead) reads the replicas on this broker, followers too
        (``_long_poll_replica``): no request to the leader's broker and back, and a follower
        learns each commit one message after the leader. A CONS that does not wait reads at the
        leader, so a client reads its own acknowledged writes.
        """
        local = deadline > trio.current_time()
        results = await self._read_all(topic, wanted, wait_until=None, local=local)
        found = any(fetched.data for fetched, _ in results.values())
        if not found and deadline > trio.current_time():
            results = await self._read_all(topic, wanted, wait_until=deadline, local=local)
        rows: list[Reply] = []
        next_offsets = dict(wanted)
        for partition, (fetched, offset) in sorted(results.items()):
            if len(rows) >= limit:
                break
            got, next_offsets[partition] = message_rows(
                partition, fetched, offset, limit - len(rows)
            )
            rows.extend(got)
        return rows, next_offsets

    async def _read_all(
        self, topic: str, wanted: dict[int, int], wait_until: float | None, *, local: bool
    ) -> dict[int, tuple[Fetched, int]]:
        """Read every partition concurrently; with ``wait_until``, long-poll and stop at the
        first that has records; with ``local``, from this broker's replicas where they may
        serve (``_long_poll_replica``). Returns what each read found (and from which offset)."""
        results: dict[int, tuple[Fetched, int]] = {}
        errors: list[RequestError] = []
        async with trio.open_nursery() as nursery:

            async def read(partition: int, offset: int) -> None:
                wait_s = 0.0 if wait_until is None else max(0.0, wait_until - trio.current_time())
                group = self._long_poll_replica(topic, partition, offset) if local else None
                try:
                    if group is not None:
                        fetched = await self._read_local(group, offset, DEFAULT_FETCH_BYTES, wait_s)
                    else:
                        fetched = await self.fetch_batches(
                            topic, partition, offset, DEFAULT_FETCH_BYTES, wait_s
                        )
                except RequestError as exc:
                    failed: RequestError | None = exc
                    if exc.code is ErrorCode.OFFSET_OUT_OF_RANGE:
                        failed = await self._past_the_end(topic, partition, offset, exc)
                    if failed is not None:
                        errors.append(failed)
                        nursery.cancel_scope.cancel()
                        return
                    fetched, offset = await self._from_log_start(topic, partition, offset)
                results[partition] = (fetched, offset)
                if fetched.data and wait_until is not None:
                    nursery.cancel_scope.cancel()

            for partition, offset in wanted.items():
                nursery.start_soon(read, partition, offset)
        if errors:
            raise errors[0]
        return results

    def _long_poll_replica(self, topic: str, partition: int, offset: int) -> RaftGroup | None:
        """This broker's replica of the partition, if a long poll may read it: the leader, or
        a follower whose log reaches ``offset`` and that hears from its leader (a follower cut
        off would keep its consumers waiting while the leader has records)."""
        group = self._broker.local_group(topic, partition)
        if group is None or group.role is Role.LEADER:
            return group
        leader = group.leader
        if leader is None or not self._broker.raft.hears(leader) or beyond_follower(group, offset):
            return None
        return group

    async def _past_the_end(
        self, topic: str, partition: int, offset: int, out_of_range: RequestError
    ) -> RequestError | None:
        """What a CONS answers for an ``offset`` the partition's leader found out of range.

        None below the log start: CONS reads from the start instead (the seed's rule, see
        ``_from_log_start``). Past the end, the error FETCH answers, naming the partition: an
        empty read would tell the consumer "nothing yet" and it would wait for ever at an offset
        the log may never reach (the topic was deleted and created again, say). When the start
        is unknown now (no leader known), None too: ``_from_log_start`` answers nothing for the
        partition this time, and the consumer's next CONS asks again.
        """
        start = await self._leader_log_start(topic, partition)
        if start is None or offset < start:
            return None
        return RequestError(out_of_range.code, f"{topic}/{partition}: {out_of_range.message}")

    async def _from_log_start(self, topic: str, partition: int, offset: int) -> tuple[Fetched, int]:
        """The seed's CONS takes any offset: below the log start it reads from the start.

        The start is the leader's (retention runs on each replica at its own pace); it may move
        again before the read, hence a few tries.
        """
        for _ in range(_LOG_START_TRIES):
            start = await self._leader_log_start(topic, partition)
            if start is None or offset >= start:
                return Fetched(b"", offset, offset), offset  # past the end: nothing yet
            try:
                fetched = await self.fetch_batches(topic, partition, start, DEFAULT_FETCH_BYTES, 0)
            except RequestError as exc:
                if exc.code is not ErrorCode.OFFSET_OUT_OF_RANGE:
                    raise
                continue
            return fetched, start
        raise RequestError(
            ErrorCode.OFFSET_OUT_OF_RANGE, f"{topic}/{partition}: the log start keeps moving"
        )

    async def _leader_log_start(self, topic: str, partition: int) -> int | None:
        """The partition's log start as its leader has it (None: unknown now)."""
        group_id = group_name(topic, partition)
        bounds = await self._broker.leader_bounds([group_id])
        if group_id in bounds:
            return bounds[group_id][0]
        if self._broker.writes.leader_of(group_id) is None:
            group = self._broker.local_group(topic, partition)
            return None if group is None else group.log.log_start_offset
        return None

    # -- administration -------------------------------------------------------------------------

    async def _wait_registered(self, wanted: int) -> int:
        """Wait up to ``AUTO_CREATE_BROKERS_WAIT_S`` until ``wanted`` brokers are registered (a
        cluster just started may have registered only some); how many are registered then."""
        metadata = self._broker.metadata
        with trio.move_on_after(AUTO_CREATE_BROKERS_WAIT_S):
            while len(metadata.view.brokers) < wanted:
                await trio.sleep(_BROKERS_POLL_S)
        return len(metadata.view.brokers)

    async def _create(self, command: CreateTopic) -> bytes:
        """CREATE. A replication factor above the brokers registered is a transient state
        while the cluster starts, as long as the cluster was configured with that many brokers
        (``--peers``): it waits for them to register, then answers the retriable ``NOT_READY``.
        Above the configured size too, the metadata refuses it (``INVALID_CONFIG``)."""
        config = self._broker.config
        if not 1 <= command.partitions <= MAX_PARTITIONS:
            raise RequestError(
                ErrorCode.INVALID_CONFIG, f"partitions must be between 1 and {MAX_PARTITIONS}"
            )
        wanted = command.replication_factor
        configured = len(config.peers)
        view = self._broker.metadata.view
        if command.topic not in view.topics and len(view.brokers) < wanted <= configured:
            registered = await self._wait_registered(wanted)
            if registered < wanted:
                raise RequestError(
                    ErrorCode.NOT_READY,
                    f"replication_factor {wanted} needs {wanted} brokers; {registered} of the "
                    f"{configured} configured have registered so far; retry",
                )
        topic_config = TopicConfig(
            partitions=command.partitions,
            replication_factor=command.replication_factor,
            retention_ms=_retention(command.retention_ms, config.default_retention_ms),
            retention_bytes=_retention(command.retention_bytes, config.default_retention_bytes),
            compact=command.compact,
            fsync=None if command.fsync is None else command.fsync.value,
        )
        existed = command.topic in self._broker.metadata.view.topics
        info = await self._metadata_call(
            self._broker.metadata.create_topic(command.topic, topic_config)
        )
        await self._broker.wait_for_leaders(info)
        return encode_reply(OkReply("exists" if existed else "created"))

    async def _alter(self, command: AlterTopic) -> bytes:
        """ALTER: change a live topic through the metadata, so every broker applies the same
        (each broker's reconciliation hosts the new partitions it is given and hands the open
        logs their new retention). Answers once every partition has a leader; ``+OK altered``,
        or ``+OK unchanged`` when the topic had these settings already."""
        info = self._topic(command.topic)
        changes: dict[str, int | bool | None] = {}
        if command.partitions is not None:
            if command.partitions > MAX_PARTITIONS:
                raise RequestError(
                    ErrorCode.INVALID_CONFIG, f"partitions must be at most {MAX_PARTITIONS}"
                )
            changes["partitions"] = command.partitions
        if command.retention_ms is not None:
            changes["retention_ms"] = _retention(command.retention_ms, None)
        if command.retention_bytes is not None:
            changes["retention_bytes"] = _retention(command.retention_bytes, None)
        if command.compact is not None:
            changes["compact"] = command.compact
        altered = await self._metadata_call(
            self._broker.metadata.alter_topic(command.topic, changes)
        )
        if altered.config.partitions > info.config.partitions:
            log.info(
                "broker %d: topic %s grew from %d to %d partitions",
                self._broker.config.id,
                command.topic,
                info.config.partitions,
                altered.config.partitions,
            )
        await self._broker.wait_for_leaders(altered)
        return encode_reply(OkReply("unchanged" if altered == info else "altered"))

    async def _reassign(self, command: Reassign) -> bytes:
        info = self._topic(command.topic)
        if command.partition >= info.config.partitions:
            raise _unknown_partition(command.topic, command.partition, info.config.partitions)
        unknown = set(command.replicas) - set(self._broker.metadata.view.brokers)
        if unknown:
            raise RequestError(
                ErrorCode.INVALID_CONFIG, f"brokers {sorted(unknown)} are not in the cluster"
            )
        await self._metadata_call(
            self._broker.metadata.set_replicas(command.topic, command.partition, command.replicas)
        )
        group_id = group_name(command.topic, command.partition)
        target = frozenset(command.replicas)
        with trio.move_on_after(REASSIGN_TIMEOUT_S):
            while True:
                claim = self._broker.membership(group_id)
                done = claim is not None and claim.committed and not claim.learners
                if done and claim is not None and claim.voters == target:
                    return encode_reply(OkReply())
                await trio.sleep(_REASSIGN_POLL_S)
        raise RequestError(
            ErrorCode.TIMEOUT,
            f"{group_id} is still moving to {sorted(target)} after {REASSIGN_TIMEOUT_S:.0f} s "
            "(it goes on; DESCRIBE follows it)",
        )

    async def remove_broker(self, broker_id: int, *, forwarded: bool = False) -> int:
        """``REMOVEBROKER``: decommission ``broker_id`` (see ``_decommission``); how many
        partitions were reassigned. Sent to that broker itself, and not ``forwarded``, another
        broker carries it out (``delegate_decommission``); a forwarded one is never delegated
        again. Raises ``RequestError``."""
        b = self._broker
        if broker_id == b.config.id and not forwarded:
            connected = b.transport.connected_peers()
            return await delegate_decommission(b.metadata, b.forwarder, b.config.id, connected)
        return await self._metadata_call(
            decommission(b.metadata, b.membership, b.forwarder, b.config.id, broker_id)
        )

    async def _metadata_call(self, call: Awaitable[_T]) -> _T:
        try:
            return await call
        except UnknownTopicError as exc:
            raise RequestError(ErrorCode.UNKNOWN_TOPIC, str(exc)) from exc
        except TopicExistsError as exc:
            raise RequestError(ErrorCode.TOPIC_EXISTS, str(exc)) from exc
        except InvalidConfigError as exc:
            raise RequestError(ErrorCode.INVALID_CONFIG, str(exc)) from exc
        except MetadataUnavailable as exc:
            raise RequestError(
                ErrorCode.TIMEOUT, f"the controller quorum did not answer in time: {exc}"
            ) from exc
        except MetadataError as exc:
            raise RequestError(ErrorCode.INTERNAL, str(exc)) from exc

    def _metadata(self, names: tuple[str, ...], session: Session | None = None) -> list[Reply]:
        """METADATA's rows: every broker, then the partitions of ``names`` (all topics if
        empty) that ``session`` may describe (the others are left out, as if absent)."""
        view = self._broker.metadata.view
        rows: list[Reply] = [
            BrokerRow(b.id, b.host, b.client_port, b.mqtt_port, b.mqtt_tls_port, b.mqtt_ws_port)
            for _, b in sorted(view.brokers.items())
        ]
        wanted = names or tuple(sorted(view.topics))
        for name in self._access.visible(session, AclResource.TOPIC, wanted):
            rows.extend(self._partition_rows(self._topic(name)))
        rows.append(EndReply())
        return rows

    async def _describe(self, topic: str, time_ms: int | None = None) -> bytes:
        """The topic and its partitions, with the log start and high watermark of each as its
        leader has them: what a consumer reading it finds. A replica's may lag by a round trip
        (a follower learns the commit index with the next append) or by a retention pass.
        With ``time_ms``, each row's offset for that time too, from the same source."""
        info = self._topic(topic)
        groups = [group_name(info.name, p) for p in range(len(info.replicas))]
        bounds = await self._broker.leader_bounds(groups, time_ms=time_ms)
        rows = self._partition_rows(info, bounds, time_ms)
        return encode_replies([_topic_row(info), *rows, EndReply()])

    def _partition_rows(
        self,
        info: TopicInfo,
        leaders: dict[str, tuple[int, ...]] | None = None,
        time_ms: int | None = None,
    ) -> list[PartitionRow]:
        """A row a partition, with start and end (and the offset for ``time_ms``, if given)
        from ``leaders`` (a group's leader bounds), else from this broker's replica if it has
        one."""
        rows = []
        for partition, replicas in enumerate(info.replicas):
            group = self._broker.local_group(info.name, partition)
            start = end = at_time = None
            bounds = (leaders or {}).get(group_name(info.name, partition))
            if bounds is not None:
                start, end = bounds[0], bounds[1]
                at_time = bounds[2] if time_ms is not None else None
            elif group is not None:
                start, end = group.log.log_start_offset, group.commit_index + 1
                if time_ms is not None:
                    at_time = committed_offset_for_time(group, time_ms)
            rows.append(
                PartitionRow(
                    info.name,
                    partition,
                    self._broker.writes.leader_of(group_name(info.name, partition)),
                    tuple(replicas),
                    start,
                    end,
                    at_time,
                )
            )
        return rows

    def _topic(self, topic: str) -> TopicInfo:
        info = self._broker.metadata.view.topics.get(topic)
        if info is None:
            raise RequestError(ErrorCode.UNKNOWN_TOPIC, f"no topic {topic!r}")
        return info


def _remember_members(session: Session, command: Command, reply: bytes) -> None:
    """Track the group members a connection joined, so that its closing makes them leave."""
    if isinstance(command, Subs) and reply.startswith(b"+OK "):
        # The id is the first word (a note on the partitions granted may follow it).
        session.members.add(reply[4:].split(None, 1)[0].decode("ascii"))
    elif isinstance(command, Leave):
        session.members.discard(command.subscription_id)


def _acl_order(acl: AclRow) -> tuple[str, ...]:
    return (acl.principal, acl.resource, acl.name, acl.pattern, acl.operation, acl.permission)


def group_name(topic: str, partition: int) -> str:
    """The Raft group id of a partition: ``topic/partition`` (a topic name has no ``/``)."""
    return f"{topic}/{partition}"


def _ready(*replies: Reply) -> ReadySlot:
    return ReadySlot(encode_replies(replies))


def _topic_row(info: TopicInfo) -> TopicRow:
    c = info.config
    return TopicRow(
        info.name,
        c.partitions,
        c.replication_factor,
        c.retention_ms,
        c.retention_bytes,
        c.compact,
        None if c.fsync is None else Fsync(c.fsync),
    )


def _numbers(values: Sequence[int]) -> str:
    return ",".join(map(str, values))


def _unknown_partition(topic: str, partition: int, count: int) -> RequestError:
    return RequestError(
        ErrorCode.UNKNOWN_PARTITION,
        f"{topic} has partitions 0..{count - 1}, not {partition}",
    )


def _retention(asked: int | None, default: int | None) -> int | None:
    if asked is None:
        return default
    return None if asked < 0 else asked
