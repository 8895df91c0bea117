"""The MQTT bridge: an MQTT client of an existing broker (mosquitto, HiveMQ, EMQX) that appends
what it receives to log topics, and optionally publishes log records back.

Ingress, per upstream connection::

    upstream PUBLISH (QoS 1) --route/convert--> producer.send --future--> [in arrival order]
        await future (committed by the partition's quorum) --> PUBACK upstream

* Delivery is at least once and nothing is lost: a message is acknowledged upstream only after
  its record is committed, in arrival order (v5 §4.6), and the session is persistent
  (clean start off, long session expiry), so whatever was not acknowledged when the bridge died
  or the connection broke is redelivered by the upstream broker. Duplicates are possible only for
  the messages in flight at that moment (appended, not yet acknowledged).
* Many messages are in flight at once (the ack queue holds ``receive_maximum`` of them); the
  producer batches them, idempotently, keyed by the route's key, with headers
  ``mqtt.topic``/``mqtt.qos``; the PUBACKs of all committed messages leave in one write.
* A record the log refuses for good (``TOO_LARGE``) is dropped, counted and logged, so that it
  does not come back with every redelivery.
* A poison message (the converter refuses it) never blocks the stream: it is appended to the
  dead-letter topic if one is configured, else logged, counted and dropped; then acknowledged.
* If a record cannot be committed (the cluster is unreachable past the producer's delivery
  timeout), the connection is dropped without acknowledging it or anything after it, and the
  bridge reconnects with backoff: upstream redelivers.
* Log topics are created on first use when missing (``partitions``, ``replication_factor``).

Egress (``to_mqtt``): a consumer of those log topics publishes each record QoS 1 on
``TopicMapping.mqtt_topic_for`` and commits the group's offset (``egress_group``) only after
every PUBACK of a poll, so the position survives restarts (at least once; a record without an
MQTT topic is skipped and counted). One bridge instance per egress group reads every partition.

Stopping (``stop``): no new message is taken, those in flight are committed and acknowledged;
egress polls no more, and the records it was publishing are acknowledged upstream and their
offsets committed (else the next bridge of the group would publish them again); then
DISCONNECT. The caller bounds how long that may take and cancels after (what is then left
unacknowledged is redelivered).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import trio

from kafkaesque.client import (
    AsyncClient,
    AsyncConsumer,
    AsyncProducer,
    AsyncRecordFuture,
    ClientConfig,
    ErrorCode,
    KafkaesqueError,
    OffsetReset,
    ProducerConfig,
    TopicPartition,
    open_producer,
)
from kafkaesque.protocol.mqtt import (
    Converter,
    MqttClientOptions,
    MqttConnectionError,
    MqttProperties,
    MqttSubscription,
    MqttVersion,
    Publish,
    TopicMapping,
    delivery_properties,
    origin_of,
    raw_converter,
    seconds_left,
)

from ._client import MqttClient, open_mqtt_client
from ._records import (
    LogRecord,
    RecordRouter,
    Refused,
    default_filters,
    shared_filter,
)

log = logging.getLogger("kafkaesque.mqtt_bridge")

_RECOVERABLE = (MqttConnectionError, OSError, trio.BrokenResourceError, KafkaesqueError)

BATCH_SIZE = 1 << 20
"""Bytes of one producer batch (the client's default is 64 KiB). A PUBACK waits for the quorum
commit and a partition has one batch in flight at a time, so with a large window one bridge
moves at most a batch per partition per commit: 64 KiB (about 250 readings) capped it at a few
thousand msg/s; 1 MiB moved 1.5 to 2x more in bench.bridge's drain (window 10,000)."""


INGEST_RUN = 256
"""Messages ingest takes in a row without a checkpoint. Taking what waits without one saves a
trio reschedule a message, but a run as long as the window (10,000 once the acker frees its
queue at once) kept the producer's sender, the reader and the acker from running for a second
or more on a loaded machine: full batches waited to be sent, answers to be read (bench.bridge,
a probe of the queues: 1.5 to 2 s without any batch answered)."""


class BridgeError(Exception):
    """The bridge cannot run as configured (a subscription refused, a topic that cannot be
    created): retrying would not help."""


@dataclass(frozen=True)
class BridgeConfig:
    """What the bridge connects to and how it maps. ``subscriptions`` empty: the rules'
    filters (see ``default_filters``)."""

    mqtt: MqttClientOptions
    bootstrap: str
    mapping: TopicMapping = field(default_factory=TopicMapping.default)
    subscriptions: tuple[str, ...] = ()
    share_group: str | None = None
    converter: Converter = raw_converter
    dead_letter_topic: str | None = None
    to_mqtt: tuple[str, ...] = ()
    egress_group: str = "mqtt-bridge"
    partitions: int = 3
    replication_factor: int = 3
    backoff_min_s: float = 0.2
    backoff_max_s: float = 10.0
    producer: ProducerConfig = field(default_factory=lambda: ProducerConfig(batch_size=BATCH_SIZE))
    # How the bridge's client reaches the Kafkaesque cluster (its TLS and credentials).
    client: ClientConfig = field(default_factory=ClientConfig)
    # Upstream connections, each a member of the share group (see ``connection_options``).
    connections: int = 1

    def __post_init__(self) -> None:
        if self.connections < 1:
            raise ValueError("connections must be at least 1")
        if self.connections > 1 and not all(f.startswith("$share/") for f in self.filters()):
            raise ValueError(
                "several connections need shared subscriptions: each would receive every message"
            )

    def connection_options(self, index: int) -> MqttClientOptions:
        """The options of upstream connection ``index``: the first keeps the client id (and
        so the session), the others take ``<client id>-<index>``. Several connections exist
        because an upstream broker reads each client's packets in turn with its other clients'
        (mosquitto 2: one packet per connection per pass of its loop): one connection's
        PUBACKs then bound the rate at which it may be sent more."""
        if index == 0:
            return self.mqtt
        return replace(self.mqtt, client_id=f"{self.mqtt.client_id}-{index}")

    def filters(self) -> tuple[str, ...]:
        """The topic filters actually subscribed (with the ``$share`` prefix if any)."""
        chosen = self.subscriptions or default_filters(self.mapping, frozenset(self.to_mqtt))
        return tuple(shared_filter(f, self.share_group) for f in chosen)


@dataclass
class BridgeStats:
    """Counters, for logs, tests and the bench."""

    received: int = 0
    appended: int = 0
    acked: int = 0
    dead_lettered: int = 0
    dropped: int = 0
    connections: int = 0
    subscribed: int = 0  # connections whose SUBSCRIBE was granted
    published: int = 0
    publish_refused: int = 0
    egress_skipped: int = 0


class MqttBridge:
    """One bridge instance; ``await bridge.run()`` until ``stop()`` (or cancellation)."""

    def __init__(self, config: BridgeConfig) -> None:
        self.config = config
        self.stats = BridgeStats()
        self._stopping = trio.Event()
        self._ready = trio.Event()  # subscribed (and egress positioned) once
        self._ingest_scopes: set[trio.CancelScope] = set()
        self._egress_poll_scope: trio.CancelScope | None = None  # while egress polls the log
        self._known_topics: set[str] = set()
        self._topic_lock = trio.Lock()
        self._sleep_scopes: set[trio.CancelScope] = set()

    @property
    def stopping(self) -> bool:
        """``stop()`` was called."""
        return self._stopping.is_set()

    def stop(self) -> None:
        """Finish what is in flight, disconnect, and make ``run`` return."""
        self._stopping.set()
        for scope in self._ingest_scopes:
            scope.cancel()
        if self._egress_poll_scope is not None:
            self._egress_poll_scope.cancel()
        for scope in self._sleep_scopes:
            scope.cancel()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run until ``stop()``; ``task_status.started()`` once the first connection is
        subscribed (and egress positioned), or when stopped before that.

        Raises ``BridgeError`` for a fatal misconfiguration (a subscription refused, a log topic
        that cannot be created); connection failures of either side are retried with backoff,
        forever."""
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._run)
                await self._ready.wait()  # also set when _run ends before it was ready
                task_status.started()
        except BaseExceptionGroup as group:
            fatal = _first(group, BridgeError)
            if fatal is not None:
                raise fatal from group
            raise

    async def _run(self) -> None:
        try:
            await self._serve()
        finally:
            self._ready.set()

    async def _serve(self) -> None:
        config = self.config
        async with (
            AsyncClient(config.bootstrap, config=config.client) as client,
            open_producer(client, config.producer) as producer,
        ):
            for topic in config.to_mqtt:
                await self._ensure_topic(client, topic)
            async with trio.open_nursery() as nursery:
                for index in range(config.connections):
                    nursery.start_soon(self._upstream, client, producer, index)

    async def _upstream(self, client: AsyncClient, producer: AsyncProducer, index: int) -> None:
        """Upstream connection ``index``, reconnected with backoff until ``stop()``; egress
        (``to_mqtt``) runs on the first only."""
        options = self.config.connection_options(index)
        failures = 0
        while not self._stopping.is_set():
            try:
                async with open_mqtt_client(options) as mqtt:
                    self.stats.connections += 1
                    failures = 0
                    log.info(
                        "connected to %s:%d as %s (session present: %s)",
                        options.host,
                        options.port,
                        options.client_id,
                        mqtt.session_present,
                    )
                    await self._connection(client, producer, mqtt, egress=index == 0)
            except* _RECOVERABLE as group:
                failures += 1
                log.warning("bridge connection %d failed: %s", index, _describe(group))
            if not self._stopping.is_set():
                await self._backoff(failures)

    async def _connection(
        self, client: AsyncClient, producer: AsyncProducer, mqtt: MqttClient, *, egress: bool
    ) -> None:
        # Acks wait here in arrival order; a full channel holds ingest back (and with it the
        # upstream broker, by TCP flow control), so memory stays bounded.
        acks_send, acks = trio.open_memory_channel[tuple[Publish, AsyncRecordFuture | None]](
            self.config.mqtt.receive_maximum
        )
        acks_drained = trio.Event()
        publishing = _Egress() if egress else None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._acker, mqtt, acks, acks_drained)
            # Ingest runs while we subscribe: a kept session's queued messages arrive before the
            # SUBACK, and the SUBACK is read only once they are taken.
            nursery.start_soon(self._subscribe, client, mqtt, nursery, publishing)
            with trio.CancelScope() as scope:
                self._ingest_scopes.add(scope)
                if self._stopping.is_set():
                    scope.cancel()
                try:
                    async with acks_send:
                        await self._ingest(client, producer, mqtt, acks_send)
                finally:
                    self._ingest_scopes.discard(scope)
            # Only stop() ends ingest without an error: the acker finishes what is in flight
            # (the channel is closed), egress finishes the publishes it started (stop() ended
            # its poll), then DISCONNECT is sent. Egress not begun yet is simply cancelled.
            await acks_drained.wait()
            if publishing is not None and publishing.begun:
                await publishing.done.wait()
            nursery.cancel_scope.cancel()

    async def _subscribe(
        self, client: AsyncClient, mqtt: MqttClient, nursery: trio.Nursery, egress: _Egress | None
    ) -> None:
        filters = self.config.filters()
        if filters:
            codes = await mqtt.subscribe(subscriptions_for(filters, self.config.mqtt.version))
            refused = [f for f, code in zip(filters, codes, strict=True) if code >= 0x80]
            if refused:
                raise BridgeError(f"the upstream broker refused the subscriptions {refused}")
        self.stats.subscribed += 1
        if self.config.to_mqtt and egress is not None:
            await nursery.start(self._egress, client, mqtt, egress)
        self._ready.set()

    async def _ingest(
        self,
        client: AsyncClient,
        producer: AsyncProducer,
        mqtt: MqttClient,
        acks: trio.MemorySendChannel[tuple[Publish, AsyncRecordFuture | None]],
    ) -> None:
        config = self.config
        router = RecordRouter(config.mapping, config.converter, config.dead_letter_topic)
        messages = mqtt.messages
        in_a_row = 0
        while not self._stopping.is_set():
            # A message already waiting is taken without a checkpoint: one trio reschedule per
            # message was a large share of the bridge's CPU (bench.bridge, py-spy). The loop
            # still waits (and yields) whenever the inbox is empty or the ack queue full, and
            # every INGEST_RUN messages; as it may not reach a checkpoint for a while, it
            # looks at stop() itself.
            if in_a_row == INGEST_RUN:
                in_a_row = 0
                await trio.lowlevel.checkpoint()
            in_a_row += 1
            try:
                publish = messages.receive_nowait()
            except trio.WouldBlock:
                in_a_row = 1  # the wait below yields: this message starts a run
                try:
                    publish = await messages.receive()
                except trio.EndOfChannel:
                    break
            except trio.EndOfChannel:
                break
            self.stats.received += 1
            outcome = router.route(publish)
            record: LogRecord | None
            if isinstance(outcome, Refused):
                log.warning("refused a message on %r: %s", publish.topic, outcome.reason)
                record = outcome.dead_letter
                if record is None:
                    self.stats.dropped += 1
                else:
                    self.stats.dead_lettered += 1
            else:
                record = outcome
            future = None
            if record is not None:
                if record.topic not in self._known_topics:
                    await self._ensure_topic(client, record.topic)
                try:
                    future = await producer.send(
                        record.topic, record.value, record.key, headers=record.headers
                    )
                except KafkaesqueError as exc:
                    if not _refused_for_good(exc):
                        raise
                    self._refused_by_log(publish, exc)
            try:
                acks.send_nowait((publish, future))
            except trio.WouldBlock:
                await acks.send((publish, future))
        mqtt.raise_if_closed()  # the channel ends only with the connection

    def _refused_by_log(self, publish: Publish, exc: KafkaesqueError) -> None:
        # A record the cluster refuses for good (TOO_LARGE...) would come back with every
        # redelivery and block the stream: it is dropped, counted and logged, like poison.
        self.stats.dropped += 1
        log.error("dropped a message on %r that the log refuses: %s", publish.topic, exc)

    async def _acker(
        self,
        mqtt: MqttClient,
        acks: trio.MemoryReceiveChannel[tuple[Publish, AsyncRecordFuture | None]],
        drained: trio.Event,
    ) -> None:
        # Messages whose records are committed, in arrival order, not yet acknowledged: their
        # PUBACKs leave together (one write) when the next record is not committed yet.
        ready: list[Publish] = []
        while True:
            try:
                publish, future = acks.receive_nowait()
            except trio.WouldBlock:
                await self._ack(mqtt, ready)
                try:
                    publish, future = await acks.receive()
                except trio.EndOfChannel:
                    break
            except trio.EndOfChannel:
                break
            if future is not None:
                try:
                    if future.done():
                        # Settled already (most are, a batch at a time): its outcome is read
                        # without the wait's cancel scope and checkpoint (nor the metadata
                        # result() would build).
                        error = future.handle.exception()
                        if error is not None:
                            raise error
                    else:
                        await self._ack(mqtt, ready)
                        await future.get()
                    self.stats.appended += 1
                except KafkaesqueError as exc:
                    # Not committed, maybe later: the connection is dropped with this message
                    # and every later one unacknowledged, so that upstream redelivers them.
                    if not _refused_for_good(exc):
                        raise
                    self._refused_by_log(publish, exc)
            ready.append(publish)
        await self._ack(mqtt, ready)
        drained.set()

    async def _ack(self, mqtt: MqttClient, ready: list[Publish]) -> None:
        if ready:
            await mqtt.ack(*ready)
            self.stats.acked += len(ready)
            ready.clear()

    async def _egress(
        self,
        client: AsyncClient,
        mqtt: MqttClient,
        egress: _Egress,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Publish the records of ``to_mqtt`` upstream, then commit them, a poll at a time,
        until ``stop()``: that ends a poll at once, never a publish (``_Egress``)."""
        egress.begun = True
        try:
            await self._publish_records(client, mqtt, task_status)
        finally:
            egress.done.set()

    async def _publish_records(
        self, client: AsyncClient, mqtt: MqttClient, task_status: trio.TaskStatus[None]
    ) -> None:
        config = self.config
        group = config.egress_group
        consumer = AsyncConsumer(client, auto_offset_reset=OffsetReset.LATEST)
        partitions: list[TopicPartition] = []
        for topic in config.to_mqtt:
            count = await client.partitions_for(topic)
            partitions.extend(TopicPartition(topic, p) for p in range(count))
        consumer.assign(partitions)
        await consumer.seek_to_end()
        for topic in config.to_mqtt:
            committed = await client.committed_offsets(group, topic)
            for partition, offset in committed.items():
                tp = TopicPartition(topic, partition)
                if offset is not None:
                    consumer.seek(tp, offset)
                else:
                    # A new group starts at the end, and says so at once: records appended
                    # while the bridge is away later are then still delivered.
                    position = consumer.position(tp)
                    if position is not None:
                        await client.commit(group, topic, partition, position)
        task_status.started()
        while not self._stopping.is_set():
            with trio.CancelScope() as polling:
                self._egress_poll_scope = polling  # stop() cancels it from now on
                records = await consumer.poll(1.0)
            self._egress_poll_scope = None
            if polling.cancelled_caught:
                return  # stop(): what the poll had read is not published, nor committed
            tickets = []
            for record in records:
                mqtt_topic = config.mapping.mqtt_topic_for(record.topic, record.key, record.headers)
                if mqtt_topic is None or record.value is None:
                    self.stats.egress_skipped += 1
                    continue
                properties = _publish_properties(record.headers, record.timestamp)
                if properties is None:
                    self.stats.egress_skipped += 1  # expired (MQTT-3.3.2-5)
                    continue
                tickets.append(
                    await mqtt.start_publish(mqtt_topic, record.value, properties=properties)
                )
            for ticket in tickets:
                code = await mqtt.wait_published(ticket)
                if code >= 0x80:
                    self.stats.publish_refused += 1
                    log.warning("upstream refused a publish (reason 0x%02X)", code)
                else:
                    self.stats.published += 1
            reached: dict[tuple[str, int], int] = {}
            for record in records:
                reached[(record.topic, record.partition)] = record.offset + 1
            for (topic, partition), offset in reached.items():
                await client.commit(group, topic, partition, offset)

    async def _ensure_topic(self, client: AsyncClient, topic: str) -> None:
        if topic in self._known_topics:
            return
        async with self._topic_lock:
            if topic in self._known_topics:
                return
            try:
                await client.partitions_for(topic)
            except KafkaesqueError as exc:
                if exc.code is not ErrorCode.UNKNOWN_TOPIC:
                    raise
                await self._create_topic(client, topic)
            self._known_topics.add(topic)

    async def _create_topic(self, client: AsyncClient, topic: str) -> None:
        config = self.config
        try:
            await client.create_topic(topic, config.partitions, config.replication_factor)
            log.info("created log topic %r", topic)
        except KafkaesqueError as exc:
            if exc.code is ErrorCode.TOPIC_EXISTS:
                pass  # another bridge instance was first
            elif exc.code in (ErrorCode.INVALID_TOPIC, ErrorCode.INVALID_CONFIG):
                raise BridgeError(f"cannot create log topic {topic!r}: {exc}") from exc
            else:
                raise
        # The topic's metadata reaches every broker a moment later (UNKNOWN_TOPIC is retriable).
        with trio.fail_after(30):
            while True:
                try:
                    await client.partitions_for(topic)
                    return
                except KafkaesqueError as exc:
                    if exc.code is not ErrorCode.UNKNOWN_TOPIC:
                        raise
                await trio.sleep(0.1)

    async def _backoff(self, failures: int) -> None:
        config = self.config
        delay = min(config.backoff_max_s, config.backoff_min_s * 2 ** min(failures, 16))
        with trio.CancelScope() as scope:
            self._sleep_scopes.add(scope)
            if self._stopping.is_set():
                scope.cancel()
            try:
                await trio.sleep(delay * random.uniform(0.5, 1.0))
            finally:
                self._sleep_scopes.discard(scope)


@dataclass
class _Egress:
    """One connection's egress, as its stop sees it: ``begun`` once it runs; ``done`` once it
    returned (stopped, failed or cancelled). A stop waits for ``done`` when egress had begun:
    a cancelled egress would leave records published upstream but not committed, which the
    group's next bridge publishes again (found under load: the test's subscriber had both
    records, the stop cancelled the wait for the second one's PUBACK)."""

    begun: bool = False
    done: trio.Event = field(default_factory=trio.Event)


def _refused_for_good(exc: KafkaesqueError) -> bool:
    """The cluster definitely did not append the record, and would not on a retry."""
    return not exc.retriable and not exc.outcome_unknown


def _first(group: BaseExceptionGroup, kind: type[BridgeError]) -> BridgeError | None:
    for exc in group.exceptions:
        if isinstance(exc, kind):
            return exc
        if isinstance(exc, BaseExceptionGroup):
            found = _first(exc, kind)
            if found is not None:
                return found
    return None


def _describe(group: BaseExceptionGroup) -> str:
    leaves: list[str] = []

    def walk(exc: BaseException) -> None:
        if isinstance(exc, BaseExceptionGroup):
            for inner in exc.exceptions:
                walk(inner)
        else:
            leaves.append(f"{type(exc).__name__}: {exc}")

    walk(group)
    return "; ".join(leaves)


def subscriptions_for(filters: Sequence[str], version: MqttVersion) -> list[MqttSubscription]:
    """The SUBSCRIBE entries for ``filters``: QoS 1; in v5 also No Local on non-shared filters
    (our own egress publishes must not come back) and retain handling 1 (retained messages
    only when the subscription is new, not again on every reconnect's SUBSCRIBE). A 3.1.1
    server re-sends retained messages on every SUBSCRIBE (MQTT-3.8.4-3)."""
    if version != MqttVersion.V5:
        return [MqttSubscription(f, qos=1) for f in filters]
    return [
        MqttSubscription(f, qos=1, no_local=not f.startswith("$share/"), retain_handling=1)
        for f in filters
    ]


def _publish_properties(
    headers: tuple[tuple[str, bytes], ...], timestamp_ms: int
) -> MqttProperties | None:
    """The v5 properties a record goes upstream with (``delivery_properties``, what remains of
    its expiry included); None once it has expired."""
    origin = origin_of(headers)
    expires_ms = origin.expires_ms(timestamp_ms)
    remaining = None
    if expires_ms is not None:
        remaining = seconds_left(expires_ms, int(time.time() * 1000))
        if remaining is None:
            return None
    return delivery_properties(origin.forwarded, remaining)
