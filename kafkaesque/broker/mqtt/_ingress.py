"""Ingress of the MQTT wing: a device's PUBLISH (or a Will) becomes a record of the log.

A PUBLISH is mapped by the topic mapping (``--mqtt-rules``; default ``# -> mqtt key=topic``) to a
log topic, partition (by the rule's key) and value (the payload, or what a payload-aware rule
makes of it: ``TopicMapping.apply``), and appended through one ``PartitionAppender`` per
partition, shared by every connection of the broker: the records of thousands of devices become
a few batches, each appended exactly once even when retried across a leader failover. Records
carry the headers ``mqtt.topic`` and ``mqtt.qos``, and a v5 message's properties
(``message_headers``). A log topic the mapping names is created on first use when missing
(``--mqtt-partitions``, ``--mqtt-replication-factor`` capped at the registered brokers), as
Kafka's ``auto.create.topics.enable`` does; so are the wing's internal topics (retained
messages, sessions). A PUBLISH that its rule cannot map (a payload-aware rule's payload that does
not parse, lacks the key field, ...) is appended to the dead-letter topic (the rules'
``dead-letter`` line, default ``mqtt-dead-letter``) with its payload unchanged and the headers
``error`` (why) and ``target.topic``, and acknowledged as any other: counted as
``dead_letters``.
"""

from __future__ import annotations

import itertools
import logging
import time
from typing import Final, NamedTuple

import trio

from kafkaesque.protocol import Acks, ErrorCode, partition_for_key
from kafkaesque.protocol.mqtt import (
    DEFAULT_DEAD_LETTER_TOPIC,
    ERROR_HEADER,
    MQTT_CLIENT_HEADER,
    MQTT_PACKET_ID_HEADER,
    MQTT_QOS_HEADER,
    MQTT_RETAIN_HEADER,
    MQTT_TOPIC_HEADER,
    TARGET_TOPIC_HEADER,
    Route,
    TopicMapping,
    Unmappable,
)
from kafkaesque.storage import Record

from .._appender import Flight, PartitionAppender
from .._errors import RequestError
from .._log_ids import log_id_of
from .._metadata_view import MetadataError, TopicConfig, TopicExistsError, TopicInfo
from .._resends import resend_key, value_digest
from ._retained import RETAINED_TOPIC
from ._sessions import SESSIONS_TOPIC
from ._wiring import MqttWiring

log = logging.getLogger("kafkaesque.broker.mqtt")

_QOS_HEADERS: Final = {q: (MQTT_QOS_HEADER, str(q).encode()) for q in (0, 1, 2)}
_ROUTE_CACHE: Final = 65536
_BROKERS_WAIT_S: Final = 15.0
WRITE_PATIENCE_S: Final = 20.0
"""How long past its write timeout an MQTT write is retried through a failover (``appender``):
several elections' worth, even on a loaded machine."""
# What the console's device view remembers of where each device's PUBLISHes went: so many
# client ids (the oldest forgotten first), so many MQTT topics each.
PUBLISHED_CLIENTS: Final = 10_000
PUBLISHED_TOPICS: Final = 16


class PublishedTo(NamedTuple):
    """Where a device's PUBLISHes to one MQTT topic went last: log topic, partition, key."""

    log_topic: str
    partition: int
    key: bytes | None


class _Placed(NamedTuple):
    """Where a PUBLISH goes: log topic, partition, key, value, and the dead letter's headers
    (empty unless it is one)."""

    log_topic: str
    partition: int
    key: bytes | None
    value: bytes
    letter_headers: tuple[tuple[str, bytes], ...]


class Ingress:
    """Routes and appends the PUBLISHes of one broker's devices. Trio thread only.

    ``stats`` is the service's counters, of which this counts ``messages_in``,
    ``resends_found`` and ``dead_letters``.
    """

    def __init__(self, wiring: MqttWiring, mapping: TopicMapping, stats: dict[str, int]) -> None:
        self._wiring = wiring
        self._config = wiring.config
        self.mapping = mapping
        self._stats = stats
        # Per MQTT topic whose rule does not read the payload: its route (or why it has none).
        self._routes: dict[str, Route | Unmappable | None] = {}
        self.dead_letter_topic = mapping.dead_letter_topic or DEFAULT_DEAD_LETTER_TOPIC
        self._round_robin: dict[str, itertools.count[int]] = {}
        self._creating: dict[str, trio.Event] = {}
        # client id -> MQTT topic -> where its last PUBLISH there went (``published``).
        # (Plain tuples: this is on every PUBLISH's path.)
        self._published: dict[str, dict[str, tuple[str, int, bytes | None]]] = {}

    def map(
        self, topic: str, payload: bytes
    ) -> tuple[str, bytes | None, bytes, tuple[tuple[str, bytes], ...]]:
        """Log topic, key, value and dead-letter headers of a PUBLISH of ``payload`` to MQTT
        topic ``topic`` (routes that do not read the payload are cached by topic)."""
        try:
            route = self._routes[topic]
        except KeyError:
            if len(self._routes) >= _ROUTE_CACHE:
                self._routes.clear()
            route = self._routes[topic] = self.mapping.static_route(topic)
        if type(route) is Route:
            return route.log_topic, route.key, payload, ()
        if route is None:
            mapped = self.mapping.apply(topic, payload)
            if not isinstance(mapped, Unmappable):
                return mapped.log_topic, mapped.key, mapped.value, ()
            route = mapped
        assert isinstance(route, Unmappable)
        letter = (
            (ERROR_HEADER, route.reason.encode()),
            (TARGET_TOPIC_HEADER, route.target.encode()),
        )
        return self.dead_letter_topic, None, payload, letter

    def append_nowait(
        self,
        topic: str,
        payload: bytes,
        qos: int,
        retain: bool,
        client_id: str = "",
        packet_id: int = 0,
        property_headers: tuple[tuple[str, bytes], ...] = (),
    ) -> list[Flight] | None:
        """Append one PUBLISH of ``client_id`` (``property_headers``: the headers that keep its
        v5 message properties, ``message_headers``); the flights its acknowledgement waits for
        (the last is the record's own). None when its log topic must be created first
        (``ensure_route``). Raises ``RequestError`` when the broker cannot take it (shutting
        down, topic deleted).
        """
        placed = self._place(topic, payload, client_id, retain)
        if placed is None:
            return None
        headers = [(MQTT_TOPIC_HEADER, topic.encode()), _QOS_HEADERS[qos]]
        if client_id:  # who published it: for No Local, and with the packet id for resends
            client, packet = resend_key(client_id, packet_id)
            headers.append((MQTT_CLIENT_HEADER, client))
            if qos == 1 and packet_id:
                headers.append((MQTT_PACKET_ID_HEADER, packet))
        if retain:
            headers.append((MQTT_RETAIN_HEADER, b"1"))
        headers += property_headers
        if placed.letter_headers:
            headers += placed.letter_headers
        record = Record(
            value=placed.value,
            key=placed.key,
            headers=tuple(headers),
            timestamp=int(time.time() * 1000),
        )
        flight, _ = self.appender(placed.log_topic, placed.partition).add(record)
        self._stats["messages_in"] += 1
        if placed.letter_headers:
            self._stats["dead_letters"] += 1
        if not retain:
            return [flight]
        # The retained copy: keyed by the MQTT topic; an empty payload is a tombstone.
        retained = Record(
            value=payload or None,
            key=topic.encode(),
            headers=(_QOS_HEADERS[qos], *property_headers),
            timestamp=record.timestamp,
        )
        retained_flight, _ = self.appender(RETAINED_TOPIC, 0).add(retained)
        return [flight, retained_flight]

    async def append_resend(
        self,
        topic: str,
        payload: bytes,
        retain: bool,
        client_id: str,
        packet_id: int,
        property_headers: tuple[tuple[str, bytes], ...] = (),
    ) -> list[Flight] | None:
        """A QoS 1 PUBLISH sent again (DUP set): as ``append_nowait``, but when the partition's
        log holds the first copy already, nothing is appended and the flight returned is done,
        at that copy's offset (see ``_resends``). When the log does not hold it, the resend is
        appended (at least once, as MQTT promises).

        Raises ``RequestError`` when no leader answered the lookup in time (a failover that
        outlasts the write timeout): the resend is then not appended, since its first copy may
        be in the log, and the device, whose connection is closed, sends it again."""
        placed = self._place(topic, payload, client_id, retain)
        if placed is None:
            return None
        partition = placed.partition
        # A first copy sent through this broker gets its outcome first (it may be in a batch).
        await self.appender(placed.log_topic, partition).settled()
        writes = self._wiring.writes
        try:
            offset = await writes.find_resend(
                log_id_of(placed.log_topic, partition),
                resend_key(client_id, packet_id),
                value_digest(placed.value),
                trio.current_time() + writes.timeout,
            )
        except RequestError as exc:
            # Not "absent": appended now, a copy that committed would be there twice (the
            # append, with its own fresh deadline, could land once a leader is back).
            raise RequestError(
                exc.code,
                f"the resend of packet {packet_id} was not appended: its first copy could not "
                f"be looked up ({exc.message})",
            ) from exc
        if offset is None:
            return self.append_nowait(
                topic, payload, 1, retain, client_id, packet_id, property_headers
            )
        self._stats["resends_found"] += 1
        flight = Flight(partition)
        flight.base = offset
        flight.finish()
        return [flight]

    def _place(self, topic: str, payload: bytes, client_id: str, retain: bool) -> _Placed | None:
        """Where a PUBLISH of ``payload`` to ``topic`` by ``client_id`` goes; None when a topic
        it needs does not exist yet. Without a key, the partition follows the client id: each
        device's messages stay in one partition, in order."""
        log_topic, key, value, letter = self.map(topic, payload)
        topics = self._wiring.metadata.view.topics
        info = topics.get(log_topic)
        if info is None or (retain and RETAINED_TOPIC not in topics):
            return None
        count = info.config.partitions
        if key is not None:
            partition = partition_for_key(key, count)
        elif client_id:
            partition = partition_for_key(client_id.encode(), count)
        else:
            counter = self._round_robin.setdefault(log_topic, itertools.count())
            partition = next(counter) % count
        if client_id:  # for the console's device view: two lookups unless the place is new
            sent = self._published.get(client_id)
            last = None if sent is None else sent.get(topic)
            if last is None or last[1] != partition or last[2] != key or last[0] != log_topic:
                self._remember(client_id, topic, (log_topic, partition, key))
        return _Placed(log_topic, partition, key, value, letter)

    def _remember(self, client_id: str, topic: str, to: tuple[str, int, bytes | None]) -> None:
        """Note that ``client_id``'s PUBLISH to ``topic`` went ``to`` (``published``): the
        oldest device, or the device's oldest topic, is forgotten beyond the bounds."""
        sent = self._published.get(client_id)
        if sent is None:
            if len(self._published) >= PUBLISHED_CLIENTS:
                del self._published[next(iter(self._published))]
            sent = self._published[client_id] = {}
        elif topic not in sent and len(sent) >= PUBLISHED_TOPICS:
            del sent[next(iter(sent))]
        sent[topic] = to

    def published(self, client_id: str) -> dict[str, PublishedTo]:
        """Where ``client_id``'s PUBLISHes through this broker went, by MQTT topic: as this
        broker's mapping and partitioning placed them (at most ``PUBLISHED_TOPICS`` topics, the
        most recent; nothing for a device this broker forgot or never served)."""
        sent = self._published.get(client_id, {})
        return {topic: PublishedTo(*to) for topic, to in sent.items()}

    def appender(self, topic: str, partition: int) -> PartitionAppender:
        """The partition's appender for MQTT: one open batch per partition on this broker,
        whoever of its devices the records come from. It is patient: a batch that fails as a
        failover makes writes fail (no leader with a quorum yet, or no answer in time while an
        election runs or the new leader is swamped by a reconnect storm) is sent again, under
        its producer id, for ``WRITE_PATIENCE_S`` past the write timeout before it fails.
        A failed write closes the device's connection (it resends what was not acknowledged),
        so a device must not pay for a failover with its connection: its PUBACK comes later,
        as MQTT allows, and the storm of reconnections is not fed by the brokers themselves."""
        return self._wiring.appender(topic, partition, Acks.QUORUM, WRITE_PATIENCE_S)

    async def ensure_route(self, topic: str, payload: bytes) -> TopicInfo:
        """The log topic of a PUBLISH of ``payload`` to MQTT topic ``topic`` (and the retained
        topic), created if missing; ``RequestError`` if that fails."""
        await self.ensure_topic(RETAINED_TOPIC)
        return await self.ensure_topic(self.map(topic, payload)[0])

    async def ensure_topic(self, name: str) -> TopicInfo:
        """Topic ``name``, created when missing: ``RETAINED_TOPIC`` compacted with one
        partition, a mapped log topic with ``--mqtt-partitions``. The replication factor is
        ``--mqtt-replication-factor`` capped at the cluster's size; a broker that starts first
        waits a little for the others to register before creating a topic with fewer."""
        wiring = self._wiring
        compact = name in (RETAINED_TOPIC, SESSIONS_TOPIC)
        while True:
            info = wiring.metadata.view.topics.get(name)
            if info is not None:
                return info
            creating = self._creating.get(name)
            if creating is None:
                break
            await creating.wait()
        self._creating[name] = done = trio.Event()
        try:
            config = self._config
            wanted = min(config.mqtt_replication_factor, len(config.peers))
            with trio.move_on_after(_BROKERS_WAIT_S):
                while len(wiring.metadata.view.brokers) < wanted:
                    await trio.sleep(0.1)
            brokers = max(1, len(wiring.metadata.view.brokers))
            topic_config = TopicConfig(
                partitions=1 if compact else config.mqtt_partitions,
                replication_factor=min(config.mqtt_replication_factor, brokers),
                retention_ms=None if compact else config.default_retention_ms,
                retention_bytes=None if compact else config.default_retention_bytes,
                compact=compact,
            )
            try:
                info = await wiring.metadata.create_topic(name, topic_config)
            except TopicExistsError:  # another broker created it with its own view
                info = wiring.metadata.view.topics[name]
            except MetadataError as exc:
                raise RequestError(ErrorCode.NO_QUORUM, f"creating {name}: {exc}") from exc
            log.info("broker %d: created log topic %s for MQTT", config.id, name)
            await wiring.wait_for_leaders(info)
            return info
        finally:
            del self._creating[name]
            done.set()
