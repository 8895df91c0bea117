"""Topic administration: creating, altering, deleting and moving topics, and describing them.

``TopicAdmin`` carries out the line protocol's topic commands (CREATE, ALTER, DELETE, REASSIGN,
DESCRIBE, METADATA) and REMOVEBROKER (which moves every partition off a broker) through the
replicated metadata, and auto-creates the topics that a publish or a subscription names first
(``ensure_topic``, ``start_creation``). The metadata's errors become the client's
(``metadata_call``).
"""

from __future__ import annotations

import enum
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import trio

from kafkaesque.protocol import (
    AclResource,
    AlterTopic,
    BrokerRow,
    CreateTopic,
    EndReply,
    ErrorCode,
    Fsync,
    OkReply,
    PartitionRow,
    Reassign,
    Reply,
    TopicRow,
    encode_reply,
    is_internal_topic,
)

from ._access import AccessControl
from ._config import MAX_PARTITIONS, BrokerConfig
from ._decommission import decommission, delegate_decommission
from ._errors import RequestError, known_topic, unknown_partition
from ._forwarding import Forwarder
from ._leaders import Claim
from ._log_ids import log_id_of
from ._metadata import ClusterMetadata
from ._metadata_view import (
    InvalidConfigError,
    MetadataError,
    MetadataUnavailable,
    TopicConfig,
    TopicExistsError,
    TopicInfo,
    UnknownTopicError,
)
from ._read_path import ReadPath
from ._reads import committed_offset_for_time
from ._session import Session, encode_replies
from ._writes import WritePath

log = logging.getLogger("kafkaesque.broker.commands")

_T = TypeVar("_T")

REASSIGN_TIMEOUT_S = 120.0
_REASSIGN_POLL_S = 0.05
# An auto-creation waits this long at most for the brokers it would place replicas on to register
# (a cluster just started may have registered only some), then creates with those there are.
AUTO_CREATE_BROKERS_WAIT_S = 5.0
_BROKERS_POLL_S = 0.05


@dataclass(eq=False)
class Creation:
    """A topic this broker is auto-creating, and the publishes waiting for it, in arrival order.

    Invariant: while a ``Creation`` is in ``TopicAdmin.creating``, every publish to its topic
    joins ``waiting`` (even once the metadata shows the topic), so that records of one
    connection reach the appender in the order they were sent. Each waiting publish is a
    callback that dispatches it, called in order with the creation's error (None: created)
    once the creation ends, with no await in between.
    """

    topic: str
    done: trio.Event = field(default_factory=trio.Event)
    error: RequestError | None = None
    waiting: deque[Callable[[RequestError | None], None]] = field(default_factory=deque)


class CreateRefusal(enum.Enum):
    """Why a topic cannot be created as asked, known before anything is written (the Kafka
    front answers each with its own code; the line protocol with INVALID_CONFIG)."""

    PARTITIONS = enum.auto()
    REPLICATION_FACTOR = enum.auto()


class TopicAdmin:
    """The topic commands of one broker (see the module docstring).

    Built by the broker with the broker's settings, the replicated metadata it changes, the write
    and read paths (leaders, bounds, this broker's replicas), who may see which topic
    (``access``), each group's membership as its leader has it, the forwarder and connected peers
    (REMOVEBROKER's delegation and controller hand-over), and the broker's nursery (None while it
    is not running), in which auto-creations run: they outlive the connection that asked.
    """

    def __init__(
        self,
        config: BrokerConfig,
        metadata: ClusterMetadata,
        writes: WritePath,
        reads: ReadPath,
        access: AccessControl,
        membership: Callable[[str], Claim | None],
        forwarder: Forwarder,
        connected_peers: Callable[[], Collection[int]],
        nursery: Callable[[], trio.Nursery | None],
    ) -> None:
        self._config = config
        self._metadata = metadata
        self._writes = writes
        self._reads = reads
        self._access = access
        self._membership = membership
        self._forwarder = forwarder
        self._connected_peers = connected_peers
        self._nursery = nursery
        self.creating: dict[str, Creation] = {}  # topics being auto-created, by name

    def auto_creates(self, topic: str) -> bool:
        """Whether a publish or a subscription naming ``topic``, if missing, creates it: when
        the broker's ``auto_create_topics`` is on and the name is not an internal one."""
        return self._config.auto_create_topics and not is_internal_topic(topic)

    async def ensure_topic(self, topic: str) -> TopicInfo:
        """``topic``, auto-created first if it is missing (see ``_create_on_first_use``).

        Raises ``RequestError``: ``NOT_LEADER`` (retriable) when its partitions have no leader
        in time, ``NO_QUORUM`` when the controller quorum does not answer, ``INVALID_CONFIG``.
        """
        creation = self.creating.get(topic)
        if creation is None:
            info = self._metadata.view.topics.get(topic)
            if info is not None:
                return info
            creation = self.start_creation(topic, None)
        await creation.done.wait()
        if creation.error is not None:
            raise creation.error
        return known_topic(self._metadata.view.topics, topic)

    def start_creation(self, topic: str, nursery: trio.Nursery | None) -> Creation:
        """Begin auto-creating ``topic`` in a task of the broker (it outlives the connection
        that asked: others may be waiting for it too)."""
        creation = self.creating[topic] = Creation(topic)
        where = self._nursery() or nursery
        if where is None:  # not serving yet: no task can run, nothing waits
            del self.creating[topic]
            raise RequestError(ErrorCode.NOT_LEADER, "the broker is starting; retry")
        where.start_soon(self._create_on_first_use, creation)
        return creation

    async def _create_on_first_use(self, creation: Creation) -> None:
        """Create ``creation.topic`` with the broker's defaults, wait until its partitions have
        leaders (up to the write timeout), then dispatch the waiting publishes in order.

        The creation is the metadata's own (``create_topic(auto=True)``): applied on the
        controller quorum, it answers the existing topic if another broker created it first, so
        brokers that auto-create one topic at once all end with that one topic.
        """
        topic = creation.topic
        try:
            info = await self._create_topic_auto(topic)
            await self._writes.wait_for_leaders(info)
            leaderless = [
                p
                for p in range(info.config.partitions)
                if self._writes.leader_of(log_id_of(topic, p)) is None
            ]
            if leaderless:
                raise RequestError(
                    ErrorCode.NOT_LEADER,
                    f"topic {topic} was created, but partitions {_numbers(leaderless)} have no "
                    f"leader after {self._config.write_timeout_s:g} s; retry",
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
            del self.creating[topic]
            while creation.waiting:
                creation.waiting.popleft()(creation.error)
            creation.done.set()

    async def _create_topic_auto(self, topic: str) -> TopicInfo:
        """The metadata's auto-creation of ``topic`` with this broker's defaults."""
        config = self._config
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
            info = await metadata_call(self._metadata.create_topic(topic, topic_config, auto=True))
        except RequestError as exc:
            if exc.code is ErrorCode.TIMEOUT:  # nothing of the publish was written
                raise RequestError(
                    ErrorCode.NO_QUORUM, f"creating topic {topic}: {exc.message}"
                ) from exc
            raise
        log.info("broker %d: auto-created topic %s", config.id, topic)
        return info

    async def _wait_registered(self, wanted: int) -> int:
        """Wait up to ``AUTO_CREATE_BROKERS_WAIT_S`` until ``wanted`` brokers are registered (a
        cluster just started may have registered only some); how many are registered then."""
        metadata = self._metadata
        with trio.move_on_after(AUTO_CREATE_BROKERS_WAIT_S):
            while len(metadata.view.brokers) < wanted:
                await trio.sleep(_BROKERS_POLL_S)
        return len(metadata.view.brokers)

    def create_refusal(self, command: CreateTopic) -> tuple[CreateRefusal, str] | None:
        """Why ``create`` would refuse ``command`` at once, or None: a partition count out of
        range, or more replicas than the cluster's brokers (configured or registered, whichever
        is more: fewer registered than configured is a wait in ``create``, not a refusal)."""
        if not 1 <= command.partitions <= MAX_PARTITIONS:
            message = f"partitions {command.partitions}: must be between 1 and {MAX_PARTITIONS}"
            return CreateRefusal.PARTITIONS, message
        brokers = max(len(self._config.peers), len(self._metadata.view.brokers))
        if not 1 <= command.replication_factor <= brokers:
            message = (
                f"replication factor {command.replication_factor}: must be between 1 and "
                f"{brokers} (the brokers)"
            )
            return CreateRefusal.REPLICATION_FACTOR, message
        return None

    async def create(self, command: CreateTopic) -> bytes:
        """CREATE. A replication factor above the brokers registered is a transient state
        while the cluster starts, as long as the cluster was configured with that many brokers
        (``--peers``): it waits for them to register, then answers the retriable ``NOT_READY``.
        Above the configured size too, the metadata refuses it (``INVALID_CONFIG``)."""
        config = self._config
        refusal = self.create_refusal(command)
        if refusal is not None:
            raise RequestError(ErrorCode.INVALID_CONFIG, refusal[1])
        wanted = command.replication_factor
        configured = len(config.peers)
        view = self._metadata.view
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
        existed = command.topic in self._metadata.view.topics
        info = await metadata_call(self._metadata.create_topic(command.topic, topic_config))
        await self._writes.wait_for_leaders(info)
        return encode_reply(OkReply("exists" if existed else "created"))

    async def alter(self, command: AlterTopic) -> bytes:
        """ALTER: change a live topic through the metadata, so every broker applies the same
        (each broker's reconciliation hosts the new partitions it is given and hands the open
        logs their new retention). Answers once every partition has a leader; ``+OK altered``,
        or ``+OK unchanged`` when the topic had these settings already."""
        info = known_topic(self._metadata.view.topics, command.topic)
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
        altered = await metadata_call(self._metadata.alter_topic(command.topic, changes))
        if altered.config.partitions > info.config.partitions:
            log.info(
                "broker %d: topic %s grew from %d to %d partitions",
                self._config.id,
                command.topic,
                info.config.partitions,
                altered.config.partitions,
            )
        await self._writes.wait_for_leaders(altered)
        return encode_reply(OkReply("unchanged" if altered == info else "altered"))

    async def delete(self, topic: str) -> bytes:
        """DELETE: the topic goes from the metadata (each broker's reconciliation drops it)."""
        await metadata_call(self._metadata.delete_topic(topic))
        return encode_reply(OkReply())

    async def reassign(self, command: Reassign) -> bytes:
        info = known_topic(self._metadata.view.topics, command.topic)
        if command.partition >= info.config.partitions:
            raise unknown_partition(command.topic, command.partition, info.config.partitions)
        unknown = set(command.replicas) - set(self._metadata.view.brokers)
        if unknown:
            raise RequestError(
                ErrorCode.INVALID_CONFIG, f"brokers {sorted(unknown)} are not in the cluster"
            )
        await metadata_call(
            self._metadata.set_replicas(command.topic, command.partition, command.replicas)
        )
        log_id = log_id_of(command.topic, command.partition)
        target = frozenset(command.replicas)
        with trio.move_on_after(REASSIGN_TIMEOUT_S):
            while True:
                claim = self._membership(log_id)
                done = claim is not None and claim.committed and not claim.learners
                if done and claim is not None and claim.voters == target:
                    return encode_reply(OkReply())
                await trio.sleep(_REASSIGN_POLL_S)
        raise RequestError(
            ErrorCode.TIMEOUT,
            f"{log_id} is still moving to {sorted(target)} after {REASSIGN_TIMEOUT_S:.0f} s "
            "(it goes on; DESCRIBE follows it)",
        )

    async def remove_broker(self, broker_id: int, *, forwarded: bool = False) -> int:
        """``REMOVEBROKER``: decommission ``broker_id`` (see ``_decommission``); how many
        partitions were reassigned. Sent to that broker itself, and not ``forwarded``, another
        broker carries it out (``delegate_decommission``); a forwarded one is never delegated
        again. Raises ``RequestError``."""
        me = self._config.id
        if broker_id == me and not forwarded:
            connected = self._connected_peers()
            return await delegate_decommission(self._metadata, self._forwarder, me, connected)
        return await metadata_call(
            decommission(self._metadata, self._membership, self._forwarder, me, broker_id)
        )

    def list_topics(self, session: Session | None = None) -> list[Reply]:
        """TOPICS' rows: every topic ``session`` may describe, by name, then ``+END``."""
        topics = self._metadata.view.topics
        names = self._access.visible(session, AclResource.TOPIC, sorted(topics))
        return [*(_topic_row(topics[n]) for n in names), EndReply()]

    def metadata_rows(self, names: tuple[str, ...], session: Session | None = None) -> list[Reply]:
        """METADATA's rows: every broker, then the partitions of ``names`` (all topics if
        empty) that ``session`` may describe (the others are left out, as if absent)."""
        view = self._metadata.view
        rows: list[Reply] = [
            BrokerRow(
                b.id,
                b.host,
                b.client_port,
                b.mqtt_port,
                b.mqtt_tls_port,
                b.mqtt_ws_port,
                b.kafka_port,
                b.http_port,
            )
            for _, b in sorted(view.brokers.items())
        ]
        wanted = names or tuple(sorted(view.topics))
        for name in self._access.visible(session, AclResource.TOPIC, wanted):
            rows.extend(self._partition_rows(known_topic(self._metadata.view.topics, name)))
        rows.append(EndReply())
        return rows

    async def describe(self, topic: str, time_ms: int | None = None) -> bytes:
        """The topic and its partitions, with the log start and high watermark of each as its
        leader has them: what a consumer reading it finds. A replica's may lag by a round trip
        (a follower learns the commit index with the next append) or by a retention pass.
        With ``time_ms``, each row's offset for that time too, from the same source."""
        info = known_topic(self._metadata.view.topics, topic)
        log_ids = [log_id_of(info.name, p) for p in range(len(info.replicas))]
        bounds = await self._reads.leader_bounds(log_ids, time_ms=time_ms)
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
            replica = self._reads.local_replica(info.name, partition)
            start = end = at_time = None
            bounds = (leaders or {}).get(log_id_of(info.name, partition))
            if bounds is not None:
                start, end = bounds[0], bounds[1]
                at_time = bounds[2] if time_ms is not None else None
            elif replica is not None:
                start, end = replica.log.log_start_offset, replica.commit_index + 1
                if time_ms is not None:
                    at_time = committed_offset_for_time(replica, time_ms)
            rows.append(
                PartitionRow(
                    info.name,
                    partition,
                    self._writes.leader_of(log_id_of(info.name, partition)),
                    tuple(replicas),
                    start,
                    end,
                    at_time,
                )
            )
        return rows


async def metadata_call(call: Awaitable[_T]) -> _T:
    """``call``'s result; the metadata's errors raised as the ``RequestError`` a client gets."""
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


def _retention(asked: int | None, default: int | None) -> int | None:
    if asked is None:
        return default
    return None if asked < 0 else asked
