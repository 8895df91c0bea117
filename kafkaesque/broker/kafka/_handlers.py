"""The Kafka APIs served, each as a thin adapter over the broker's shared services.

Rules clients depend on (shared/research/kafka-protocol.md): a Produce goes to the partition's
leader, and any other broker answers NOT_LEADER_OR_FOLLOWER (6) so the client refreshes its
metadata, rather than forwarding; acks=-1 waits for a Raft majority to have the batch on disk
(our fsync-before-ack), acks=1 for the leader's own log, acks=0 gets no response. Metadata's
leader epoch is the leader's Raft term. Fetch answers from offset ``fetch_offset`` the committed
batches, as Kafka batches of the same offsets (``_translate``), long-polling up to ``max_wait_ms``
until ``min_bytes`` are there; no fetch sessions (id 0: clients send full fetches), the last
stable offset is the high watermark (no transactions). Access: the same ACLs as every other
front (describe hides a topic from Metadata; write, read are checked per partition).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import trio

from kafkaesque.protocol import (
    INTERNAL_TOPIC_PREFIX,
    Acks,
    AclOperation,
    AclResource,
    CreateTopic,
    ErrorCode,
)
from kafkaesque.protocol.kafka import (
    API_VERSIONS,
    CREATE_TOPICS,
    DELETE_GROUPS,
    DELETE_TOPICS,
    DESCRIBE_GROUPS,
    FETCH,
    FIND_COORDINATOR,
    HEARTBEAT,
    INIT_PRODUCER_ID,
    JOIN_GROUP,
    LEAVE_GROUP,
    LIST_GROUPS,
    LIST_OFFSETS,
    METADATA,
    OFFSET_COMMIT,
    OFFSET_FETCH,
    OFFSET_FOR_LEADER_EPOCH,
    PRODUCE,
    SYNC_GROUP,
    KafkaError,
    KafkaProtocolError,
    KafkaRequest,
    Message,
    UnsupportedCompression,
    supported_versions,
)
from kafkaesque.raft import Role
from kafkaesque.storage import data_records

from .._appender import new_producer_id
from .._errors import RequestError
from .._log_ids import log_id_of
from .._metadata_view import TopicInfo
from .._session import Session
from .._topic_admin import CreateRefusal
from .._writes import LeaderWrite
from ._cleanup_policy import parse_cleanup_policy
from ._groups import KafkaGroups
from ._translate import kafka_record_set, produced_batches
from ._wiring import KafkaWiring

log = logging.getLogger("kafkaesque.broker.kafka")

CLUSTER_ID: Final = "kafkaesque"
_EARLIEST: Final = -2
_LATEST: Final = -1
_LEADER_WAIT_S: Final = 5.0  # a topic auto-created by Metadata: how long its leaders may take

_ERRORS: Final = {
    ErrorCode.UNKNOWN_TOPIC: KafkaError.UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.UNKNOWN_PARTITION: KafkaError.UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.INVALID_TOPIC: KafkaError.INVALID_TOPIC_EXCEPTION,
    ErrorCode.NOT_LEADER: KafkaError.NOT_LEADER_OR_FOLLOWER,
    ErrorCode.NOT_READY: KafkaError.LEADER_NOT_AVAILABLE,
    ErrorCode.NO_REPLICA: KafkaError.NOT_LEADER_OR_FOLLOWER,
    ErrorCode.TIMEOUT: KafkaError.REQUEST_TIMED_OUT,
    ErrorCode.NO_QUORUM: KafkaError.NOT_ENOUGH_REPLICAS,
    ErrorCode.OFFSET_OUT_OF_RANGE: KafkaError.OFFSET_OUT_OF_RANGE,
    ErrorCode.TOO_LARGE: KafkaError.MESSAGE_TOO_LARGE,
    ErrorCode.INVALID_BATCH: KafkaError.CORRUPT_MESSAGE,
    ErrorCode.NOT_AUTHORIZED: KafkaError.TOPIC_AUTHORIZATION_FAILED,
    ErrorCode.AUTH_FAILED: KafkaError.TOPIC_AUTHORIZATION_FAILED,
    ErrorCode.INVALID_CONFIG: KafkaError.INVALID_CONFIG,
    ErrorCode.TOPIC_EXISTS: KafkaError.TOPIC_ALREADY_EXISTS,
    ErrorCode.OUT_OF_ORDER_SEQUENCE: KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER,
    ErrorCode.FENCED: KafkaError.INVALID_PRODUCER_EPOCH,
}


def kafka_error(exc: RequestError) -> KafkaError:
    """Kafka's code for one of our errors (retriable ones stay retriable)."""
    return _ERRORS.get(exc.code, KafkaError.UNKNOWN_SERVER_ERROR)


Handler = Callable[[KafkaRequest, Session], Awaitable[Message | None]]


class KafkaHandlers:
    """The handler of each API served (see the module docstring)."""

    def __init__(self, wiring: KafkaWiring, kafka_port: Callable[[], int | None]) -> None:
        self._w = wiring
        self._kafka_port = kafka_port
        self.groups = groups = KafkaGroups(
            wiring.groups,
            wiring.metadata,
            wiring.access,
            wiring.config.group_initial_rebalance_delay_s,
        )
        self.by_key: dict[int, Handler] = {
            FIND_COORDINATOR.key: groups.find_coordinator,
            JOIN_GROUP.key: groups.join_group,
            SYNC_GROUP.key: groups.sync_group,
            HEARTBEAT.key: groups.heartbeat,
            LEAVE_GROUP.key: groups.leave_group,
            OFFSET_COMMIT.key: groups.offset_commit,
            OFFSET_FETCH.key: groups.offset_fetch,
            LIST_GROUPS.key: groups.list_groups,
            DESCRIBE_GROUPS.key: groups.describe_groups,
            DELETE_GROUPS.key: groups.delete_groups,
            API_VERSIONS.key: self.api_versions,
            METADATA.key: self.metadata,
            PRODUCE.key: self.produce,
            FETCH.key: self.fetch,
            LIST_OFFSETS.key: self.list_offsets,
            OFFSET_FOR_LEADER_EPOCH.key: self.offset_for_leader_epoch,
            INIT_PRODUCER_ID.key: self.init_producer_id,
            CREATE_TOPICS.key: self.create_topics,
            DELETE_TOPICS.key: self.delete_topics,
        }

    async def api_versions(self, request: KafkaRequest, session: Session) -> Message:
        return {"error_code": KafkaError.NONE, "api_keys": supported_versions()}

    # -- Metadata -------------------------------------------------------------------------------

    async def metadata(self, request: KafkaRequest, session: Session) -> Message:
        w = self._w
        body = request.body
        asked = body.get("topics")
        view = w.metadata.view
        if asked is None or (request.version == 0 and not asked):
            names = w.access.visible(session, AclResource.TOPIC, sorted(view.topics))
        else:
            names = [t["name"] for t in asked]
            if body.get("allow_auto_topic_creation", True):
                await self._auto_create([n for n in names if n not in view.topics], session)
            view = w.metadata.view
        # Checked on the names asked, not on the topics that exist: a topic the client may
        # describe but that does not exist is UNKNOWN_TOPIC_OR_PARTITION (Kafka Connect's
        # admin asks so before it creates a topic), one it may not describe is 29 either way.
        visible = set(w.access.visible(session, AclResource.TOPIC, names))
        topics = []
        for name in names:
            info = view.topics.get(name)
            if name not in visible:
                # As Kafka: not allowed to describe it, whether it exists or not (which stays
                # hidden); counted with the other refusals.
                with contextlib.suppress(RequestError):
                    w.access.check_operation(
                        session, AclOperation.DESCRIBE, AclResource.TOPIC, name
                    )
                error = KafkaError.TOPIC_AUTHORIZATION_FAILED
                topics.append({"error_code": error, "name": name})
            elif info is None:
                topics.append({"error_code": KafkaError.UNKNOWN_TOPIC_OR_PARTITION, "name": name})
            else:
                topics.append(self._topic(info))
        brokers = [
            {"node_id": b.id, "host": b.host, "port": b.kafka_port}
            for b in sorted(view.brokers.values(), key=lambda b: b.id)
            if b.kafka_port is not None
        ]
        if not brokers:  # registering: never zero brokers (librdkafka#5301)
            here = w.config.kafka_listener
            port = self._kafka_port()
            if here is not None and port is not None:
                brokers = [{"node_id": w.config.id, "host": w.config.client_host, "port": port}]
        controller = view.controller_leader
        return {
            "brokers": brokers,
            "cluster_id": CLUSTER_ID,
            "controller_id": -1 if controller is None else controller,
            "topics": topics,
        }

    def _topic(self, info: TopicInfo) -> Message:
        w = self._w
        partitions = []
        for p, replicas in enumerate(info.replicas):
            log_id = log_id_of(info.name, p)
            leader = w.writes.leader_of(log_id)
            partitions.append(
                {
                    "error_code": KafkaError.NONE
                    if leader is not None
                    else KafkaError.LEADER_NOT_AVAILABLE,
                    "partition_index": p,
                    "leader_id": -1 if leader is None else leader,
                    "leader_epoch": w.leader_epoch(log_id),
                    "replica_nodes": list(replicas),
                    # No ISR is kept: a Raft majority commits, whichever replicas it is.
                    "isr_nodes": list(replicas),
                    "offline_replicas": [],
                }
            )
        return {
            "error_code": KafkaError.NONE,
            "name": info.name,
            "is_internal": info.name.startswith(INTERNAL_TOPIC_PREFIX),
            "partitions": partitions,
        }

    async def _auto_create(self, names: list[str], session: Session) -> None:
        """Create the topics a Metadata request names that do not exist, as a first publish
        would (the broker's ``auto_create_topics``); an error leaves the topic unknown."""
        w = self._w
        for name in names:
            if not w.admin.auto_creates(name):
                continue
            try:
                w.access.check_operation(session, AclOperation.CREATE, AclResource.TOPIC, name)
                with trio.move_on_after(_LEADER_WAIT_S):
                    await w.admin.ensure_topic(name)
            except RequestError as exc:
                log.info("kafka: auto-creating %s: %s", name, exc.message)

    def _refusal(
        self, topic: str, partition: int, operation: AclOperation, session: Session
    ) -> KafkaError | None:
        """The error a request about one partition gets before anything else: an unknown
        topic or partition, or no right to ``operation`` the topic (counted); None: go on."""
        w = self._w
        info = w.metadata.view.topics.get(topic)
        if info is None or not 0 <= partition < info.config.partitions:
            return KafkaError.UNKNOWN_TOPIC_OR_PARTITION
        if not w.access.allows(session, operation, AclResource.TOPIC, topic):
            return KafkaError.TOPIC_AUTHORIZATION_FAILED
        return None

    # -- Produce --------------------------------------------------------------------------------

    def begin_produce(self, request: KafkaRequest, session: Session) -> ProduceInFlight:
        """A Produce in two steps: every batch is appended now, synchronously, in the order of
        the request (so the Produce requests a connection pipelines are appended in the order
        sent, and a Raft flush can take several of them at once); the returned
        ``ProduceInFlight`` gives the response (None with acks=0) once they are acknowledged."""
        body = request.body
        acks = body["acks"]
        keys = [(t["name"], p["index"]) for t in body["topic_data"] for p in t["partition_data"]]
        deadline = trio.current_time() + self._w.writes.timeout
        if acks not in (0, 1, -1):
            refused = _PartitionWrites(KafkaError.INVALID_REQUIRED_ACKS)
            return ProduceInFlight(body, acks, dict.fromkeys(keys, refused), deadline)
        if body.get("transactional_id") is not None:
            refused = _PartitionWrites(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
            return ProduceInFlight(body, acks, dict.fromkeys(keys, refused), deadline)
        begun = {
            (t["name"], p["index"]): self._begin_partition(
                t["name"], p["index"], p["records"], session
            )
            for t in body["topic_data"]
            for p in t["partition_data"]
        }
        return ProduceInFlight(body, acks, begun, deadline)

    async def produce(self, request: KafkaRequest, session: Session) -> Message | None:
        return await self.begin_produce(request, session).answer()

    def _begin_partition(
        self, topic: str, partition: int, record_set: bytes | None, session: Session
    ) -> _PartitionWrites:
        w = self._w
        refused = self._refusal(topic, partition, AclOperation.WRITE, session)
        if refused is not None:
            return _PartitionWrites(refused)
        log_id = log_id_of(topic, partition)
        if w.writes.leader_of(log_id) != w.config.id:
            return _PartitionWrites(KafkaError.NOT_LEADER_OR_FOLLOWER)
        try:
            batches = produced_batches(record_set or b"")
        except UnsupportedCompression as exc:
            log.info("kafka: produce to %s/%d: %s", topic, partition, exc)
            return _PartitionWrites(KafkaError.UNSUPPORTED_COMPRESSION_TYPE)
        except KafkaProtocolError as exc:
            log.info("kafka: produce to %s/%d: corrupt records: %s", topic, partition, exc)
            return _PartitionWrites(KafkaError.CORRUPT_MESSAGE)
        if not batches:
            return _PartitionWrites(KafkaError.CORRUPT_MESSAGE)
        writes = _PartitionWrites()
        for batch in batches:  # in order: an idempotent producer's sequences follow each other
            try:
                writes.begun.append(
                    w.writes.begin_as_leader(log_id, batch.data, batch.record_count)
                )
            except RequestError as exc:
                writes.error = kafka_error(exc)  # the earlier ones are appended: wait for them
                break
        return writes

    # -- Fetch ----------------------------------------------------------------------------------

    async def fetch(self, request: KafkaRequest, session: Session) -> Message:
        body = request.body
        wanted = [
            (t["topic"], p["partition"], p["fetch_offset"], max(0, p["partition_max_bytes"]))
            for t in body["topics"]
            for p in t["partitions"]
        ]
        answers: dict[tuple[str, int], Message] = {}
        budget = max(1, body.get("max_bytes", 0x7FFFFFFF))
        size = 0
        for topic, partition, offset, limit in wanted:
            answer = await self._fetch_partition(topic, partition, offset, limit, 0.0, session)
            answers[topic, partition] = answer
            size += len(answer.get("records") or b"")
        max_wait = max(0, body["max_wait_ms"]) / 1000
        if size < max(1, body["min_bytes"]) and max_wait > 0:
            # Nothing (enough) yet: wait on every partition at once; the first that gets
            # records ends the wait for all.
            async with trio.open_nursery() as nursery:

                async def wait(topic: str, partition: int, offset: int, limit: int) -> None:
                    answer = await self._fetch_partition(
                        topic, partition, offset, limit, max_wait, session
                    )
                    answers[topic, partition] = answer
                    if answer.get("records"):
                        nursery.cancel_scope.cancel()

                for topic, partition, offset, limit in wanted:
                    if answers[topic, partition]["error_code"] == KafkaError.NONE:
                        nursery.start_soon(wait, topic, partition, offset, limit)
        responses: dict[str, list[Message]] = {}
        for topic, partition, _offset, _limit in wanted:
            answer = answers[topic, partition]
            records = answer.get("records")
            if records and budget <= 0:
                answer = {**answer, "records": b""}  # over the response's max_bytes
            budget -= len(records or b"")
            responses.setdefault(topic, []).append(answer)
        return {
            "error_code": KafkaError.NONE,
            "session_id": 0,
            "responses": [{"topic": t, "partitions": ps} for t, ps in responses.items()],
        }

    async def _fetch_partition(
        self, topic: str, partition: int, offset: int, limit: int, wait_s: float, session: Session
    ) -> Message:
        w = self._w
        answer: dict[str, Any] = {"partition_index": partition, "records": b""}
        refused = self._refusal(topic, partition, AclOperation.READ, session)
        if refused is not None:
            return {**answer, "error_code": refused}
        try:
            fetched = await w.reads.fetch(topic, partition, offset, max(limit, 1), wait_s)
        except RequestError as exc:
            return {**answer, "error_code": kafka_error(exc)}
        return {
            **answer,
            "error_code": KafkaError.NONE,
            "high_watermark": fetched.high_watermark,
            "last_stable_offset": fetched.high_watermark,
            "records": kafka_record_set(fetched.data) if fetched.data else b"",
        }

    # -- OffsetForLeaderEpoch ------------------------------------------------------------------

    async def offset_for_leader_epoch(self, request: KafkaRequest, session: Session) -> Message:
        """Where each asked leader epoch ends in the partition's log (``epoch_end_offset``):
        a consumer whose partition changed leader checks its position with it (KIP-320), and
        resets if its position is past the end (the log was truncated under it). Answered by
        the partition's leader, as Kafka does; a client's stale or future current epoch gets
        FENCED_LEADER_EPOCH (74) or UNKNOWN_LEADER_EPOCH (75), so it refreshes its metadata."""
        topics = []
        for t in request.body["topics"]:
            name = t["topic"]
            partitions = [self._epoch_end(name, p, session) for p in t["partitions"]]
            topics.append({"topic": name, "partitions": partitions})
        return {"topics": topics}

    def _epoch_end(self, topic: str, asked: Message, session: Session) -> Message:
        w = self._w
        partition = asked["partition"]
        answer: dict[str, Any] = {"partition": partition}
        refused = self._refusal(topic, partition, AclOperation.DESCRIBE, session)
        if refused is not None:
            return {**answer, "error_code": refused}
        replica = w.reads.local_replica(topic, partition)
        if replica is None or replica.role is not Role.LEADER:
            return {**answer, "error_code": KafkaError.NOT_LEADER_OR_FOLLOWER}
        term = replica.node.term
        current = asked.get("current_leader_epoch", -1)
        if 0 <= current < term:
            return {**answer, "error_code": KafkaError.FENCED_LEADER_EPOCH}
        if current > term:
            return {**answer, "error_code": KafkaError.UNKNOWN_LEADER_EPOCH}
        log = replica.node.log
        epoch, end = epoch_end_offset(log, term, log.last_index() + 1, asked["leader_epoch"])
        return {**answer, "error_code": KafkaError.NONE, "leader_epoch": epoch, "end_offset": end}

    # -- InitProducerId, CreateTopics, DeleteTopics ---------------------------------------------

    async def init_producer_id(self, request: KafkaRequest, session: Session) -> Message:
        """A new idempotent producer: a random 62-bit id (as our own producers', collisions are
        negligible; no quorum round) at epoch 0. Transactions are not served."""
        if request.body.get("transactional_id") is not None:
            return {"error_code": KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED}
        return {
            "error_code": KafkaError.NONE,
            "producer_id": new_producer_id(),
            "producer_epoch": 0,
        }

    async def create_topics(self, request: KafkaRequest, session: Session) -> Message:
        body = request.body
        results = []
        for t in body["topics"]:
            error, message = await self._create(t, bool(body.get("validate_only")), session)
            results.append({"name": t["name"], "error_code": error, "error_message": message})
        return {"topics": results}

    async def _create(
        self, t: Message, validate_only: bool, session: Session
    ) -> tuple[KafkaError, str | None]:
        """One topic of CreateTopics, through the topic admin CREATE uses (its checks, its
        wait for leaders). Kafka's configs map to ours: retention.ms, retention.bytes,
        cleanup.policy (``compact`` alone is unlimited retention unless one is given, as Kafka
        applies none: ``_cleanup_policy``); any other is INVALID_CONFIG; explicit assignments
        are refused."""
        w = self._w
        name = t["name"]
        if name in w.metadata.view.topics:
            return KafkaError.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists"
        if t.get("assignments"):
            return KafkaError.INVALID_REPLICA_ASSIGNMENT, "replicas are assigned by the cluster"
        settings: dict[str, Any] = {}
        compact_only = False
        for c in t.get("configs") or ():
            key, value = c["name"], c["value"]
            try:
                if key == "retention.ms":
                    settings["retention_ms"] = _config_number(key, value)
                elif key == "retention.bytes":
                    settings["retention_bytes"] = _config_number(key, value)
                elif key == "cleanup.policy":
                    compact, delete = parse_cleanup_policy(value)
                    settings["compact"] = compact
                    if compact and not delete:
                        compact_only = True
                else:
                    return KafkaError.INVALID_CONFIG, f"unsupported topic config {key}={value}"
            except ValueError as exc:
                return KafkaError.INVALID_CONFIG, str(exc)
        if compact_only:  # Kafka never cuts a compact-only topic by age or size
            settings.setdefault("retention_ms", -1)
            settings.setdefault("retention_bytes", -1)
        partitions, factor = t["num_partitions"], t["replication_factor"]
        command = CreateTopic(
            name,
            w.config.default_partitions if partitions == -1 else partitions,
            w.config.default_replication_factor if factor == -1 else factor,
            **settings,
        )
        try:
            w.access.check_operation(session, AclOperation.CREATE, AclResource.TOPIC, name)
        except RequestError as exc:
            return kafka_error(exc), exc.message
        # Asked here too: validate_only must refuse what creating would, and with Kafka's own
        # codes (the admin's INVALID_CONFIG is 40 over Kafka).
        refusal = w.admin.create_refusal(command)
        if refusal is not None:
            why, message = refusal
            if why is CreateRefusal.PARTITIONS:
                return KafkaError.INVALID_PARTITIONS, message
            return KafkaError.INVALID_REPLICATION_FACTOR, message
        if validate_only:
            return KafkaError.NONE, None
        try:
            await w.admin.create(command)
        except RequestError as exc:
            return kafka_error(exc), exc.message
        return KafkaError.NONE, None

    async def delete_topics(self, request: KafkaRequest, session: Session) -> Message:
        w = self._w
        results = []
        for name in request.body["topic_names"]:
            error = KafkaError.NONE
            try:
                w.access.check_operation(session, AclOperation.DELETE, AclResource.TOPIC, name)
                await w.admin.delete(name)
            except RequestError as exc:
                error = kafka_error(exc)
            results.append({"name": name, "error_code": error})
        return {"responses": results}

    # -- ListOffsets ----------------------------------------------------------------------------

    async def list_offsets(self, request: KafkaRequest, session: Session) -> Message:
        topics = []
        for t in request.body["topics"]:
            name = t["name"]
            partitions = []
            for p in t["partitions"]:
                index, timestamp = p["partition_index"], p["timestamp"]
                partitions.append(await self._offset_for(name, index, timestamp, session))
            topics.append({"name": name, "partitions": partitions})
        return {"topics": topics}

    async def _offset_for(
        self, topic: str, partition: int, timestamp: int, session: Session
    ) -> Message:
        w = self._w
        answer: dict[str, Any] = {"partition_index": partition}
        refused = self._refusal(topic, partition, AclOperation.DESCRIBE, session)
        if refused is not None:
            return {**answer, "error_code": refused}
        log_id = log_id_of(topic, partition)
        by_time = timestamp not in (_EARLIEST, _LATEST)
        bounds = await w.reads.leader_bounds([log_id], time_ms=timestamp if by_time else None)
        found = bounds.get(log_id)
        if found is None:
            return {**answer, "error_code": KafkaError.NOT_LEADER_OR_FOLLOWER}
        start, end = found[0], found[1]
        if timestamp == _EARLIEST:
            offset = start
        elif timestamp == _LATEST:
            offset = end
        else:
            offset = found[2]
        stamp = -1
        if by_time and offset < end:
            stamp = await self._timestamp_at(topic, partition, offset, timestamp)
        return {
            **answer,
            "error_code": KafkaError.NONE,
            "timestamp": stamp,
            "offset": offset if not by_time or offset < end else -1,
            "leader_epoch": w.leader_epoch(log_id),
        }

    async def _timestamp_at(self, topic: str, partition: int, offset: int, asked: int) -> int:
        """The timestamp of the record at ``offset``, which a ListOffsets by time answers
        (Kafka's: the found record's own, which clients such as aiokafka's offsets_for_times
        hand to the user), not the time asked for. One committed batch is read. If it cannot be
        read now (the leader moved since), ``asked``: a lower bound of the true one, since the
        record was found as the first whose timestamp reaches it."""
        try:
            fetched = await self._w.reads.fetch(topic, partition, offset, 1, 0.0)
            for record in data_records(fetched.data, offset):
                return record.timestamp
        except RequestError:
            pass
        return asked


class ProduceInFlight:
    """A Produce whose batches are appended (``KafkaHandlers.begin_produce``): its response
    (None with acks=0) comes either to a callback, with no task waiting (``tell``: the
    pipelined path, as our own protocol's appender is told), or by awaiting ``answer``.

    Each partition answers its first failure's error, else the first batch's base offset.
    """

    def __init__(
        self,
        body: Message,
        acks: int,
        partitions: dict[tuple[str, int], _PartitionWrites],
        deadline: float,
    ) -> None:
        self.deadline = deadline  # trio time: a write still untold then has an unknown outcome
        self._body = body
        self._acks = acks
        self._mode = Acks.QUORUM if acks == -1 else Acks.LEADER
        self._partitions = partitions
        self._outcomes: dict[tuple[str, int], list[tuple[int, int] | RequestError | None]] = {
            key: [None] * len(writes.begun) for key, writes in partitions.items()
        }
        self._untold = sum(len(writes.begun) for writes in partitions.values())
        self._callback: Callable[[Message | None], None] | None = None
        self.done = False  # the response was given to the callback

    def tell(self, callback: Callable[[Message | None], None]) -> bool:
        """Have ``callback`` called once with the response when every write's outcome is
        known: at once if it is now, else from the task that commits (or cuts) the last of
        them; it must be quick and must not raise. Returns False, registering nothing, when the
        outcomes cannot be told (acks=1, known only by polling the log): await ``answer``.
        A write neither committed nor cut by ``deadline`` is never told: call ``expire`` then.
        """
        writes = [write for p in self._partitions.values() for write in p.begun]
        if not all(write.tells(self._mode) for write in writes):
            return False
        self._callback = callback
        for key, p in self._partitions.items():
            for i, write in enumerate(p.begun):
                write.when_written(functools.partial(self._told, key, i))
        if self._untold == 0 and not self.done:
            self._give()
        return True

    def expire(self) -> None:
        """At ``deadline``: every write still untold has an unknown outcome (``TIMEOUT``, as
        ``LeaderWrite.written`` answers at its deadline); the response goes now. Nothing once
        the response was given."""
        if self.done:
            return
        for key, outcomes in self._outcomes.items():
            for i, outcome in enumerate(outcomes):
                if outcome is None:
                    outcomes[i] = RequestError(
                        ErrorCode.TIMEOUT, f"{key[0]}/{key[1]}: not committed in time; retry"
                    )
        self._untold = 0
        self._give()

    async def answer(self) -> Message | None:
        """The response, once every write's outcome is known (awaited, for ``acks`` 1 and any
        Produce not ``tell``ing)."""
        results: dict[tuple[str, int], tuple[KafkaError, int]] = {}

        async def one(key: tuple[str, int], writes: _PartitionWrites) -> None:
            results[key] = await writes.outcome(self._mode)

        async with trio.open_nursery() as nursery:
            for key, writes in self._partitions.items():
                nursery.start_soon(one, key, writes)
        if self._acks == 0:
            return None
        return _produce_answer(self._body, lambda t, p: results[t, p])

    def _told(self, key: tuple[str, int], i: int, outcome: tuple[int, int] | RequestError) -> None:
        if self.done:
            return  # expired first
        outcomes = self._outcomes[key]
        outcomes[i] = outcome
        self._untold -= 1
        if self._untold == 0:
            self._give()

    def _give(self) -> None:
        self.done = True
        callback, self._callback = self._callback, None
        response = None
        if self._acks != 0:
            partitions, outcomes = self._partitions, self._outcomes
            response = _produce_answer(
                self._body, lambda t, p: partitions[t, p].result(outcomes[t, p])
            )
        self._partitions, self._outcomes = {}, {}  # the batches' bytes are not kept
        if callback is not None:
            callback(response)


@dataclass
class _PartitionWrites:
    """One partition's part of a Produce: the writes begun, and the error that stopped it."""

    error: KafkaError | None = None
    begun: list[LeaderWrite] = field(default_factory=list)

    async def outcome(self, acks: Acks) -> tuple[KafkaError, int]:
        """(error, base offset) once every begun write has its outcome (the first failure's
        error; the first batch's base offset when all are written)."""
        outcomes: list[tuple[int, int] | RequestError | None] = []
        for write in self.begun:
            try:
                outcomes.append(await write.written(acks))
            except RequestError as exc:
                outcomes.append(exc)
        return self.result(outcomes)

    def result(
        self, outcomes: list[tuple[int, int] | RequestError | None]
    ) -> tuple[KafkaError, int]:
        """(error, base offset) of the partition from its writes' ``outcomes``, in order."""
        base, error = -1, self.error
        for outcome in outcomes:
            if isinstance(outcome, RequestError):
                error = error or kafka_error(outcome)
            elif outcome is not None:
                base = outcome[0] if base < 0 else base
        if error is not None:
            return error, -1
        return KafkaError.NONE, base


def epoch_end_offset(log: EpochLog, current_term: int, end: int, epoch: int) -> tuple[int, int]:
    """Kafka's answer to "where does leader epoch ``epoch`` end" (``LeaderEpochFileCache.
    endOffsetFor``), from a Raft log whose terms are the epochs: ``(the largest epoch <=
    epoch in the log, the first offset after it)``; the current term ends at ``end`` (the log
    end); an epoch above every term is (-1, -1); one below every term in the log is itself,
    ending where the log's first term starts."""
    if epoch < 0:
        return -1, -1
    if epoch == current_term:
        return epoch, end
    higher = log.term_start_offset(epoch + 1)  # the first offset of a later term
    if higher > log.last_index():
        return -1, -1
    if higher <= log.start_offset():
        return epoch, higher
    return min(log.term_at(higher - 1), epoch), higher


class EpochLog(Protocol):
    """What ``epoch_end_offset`` reads of a Raft log."""

    def term_start_offset(self, term: int) -> int: ...
    def term_at(self, index: int) -> int: ...
    def start_offset(self) -> int: ...
    def last_index(self) -> int: ...


def _produce_answer(body: Message, result: Callable[[str, int], tuple[KafkaError, int]]) -> Message:
    """The Produce response: every partition of the request with its (error, base offset)."""
    responses = []
    for t in body["topic_data"]:
        partitions = []
        for p in t["partition_data"]:
            error, base = result(t["name"], p["index"])
            partitions.append({"index": p["index"], "error_code": error, "base_offset": base})
        responses.append({"name": t["name"], "partition_responses": partitions})
    return {"responses": responses}


def _config_number(key: str, value: str | None) -> int:
    try:
        return int(value or "")
    except ValueError:
        raise ValueError(f"{key}={value} is not a number") from None
