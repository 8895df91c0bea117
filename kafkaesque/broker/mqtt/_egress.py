"""Egress: records of mapped log topics delivered to this broker's subscribed devices.

Each broker keeps the subscriptions of its own connected devices in one
``MqttSubscriptionTrie`` and reads each log topic they may receive from (``log_topics_for``)
once, whatever the number of devices: one reader task per partition, started at the
partition's end when the first interested subscription arrives (a new subscription receives new
records only), long-polling the partition's leader for committed records (a record reaches its
subscribers as soon as it commits; no uncommitted record is ever delivered). Each record's MQTT
topic is its ``mqtt.topic`` header, or the reverse of its log topic's rule (a controller's
command appended with ``PUBS commands`` and key ``phone-7`` goes to ``phones/phone-7/commands``);
it is delivered once to every matching device, at the highest QoS of its matching
subscriptions, capped by the QoS it was published with (records without an ``mqtt.qos`` header,
from other clients, count as QoS 1: they are in the log already).

Shared subscriptions (``$share/group/filter``): each message goes to one member of the group in
the whole cluster. Every broker tells its peers which groups have members on it (``SHARES``, on
change and every second); each partition of a log topic is then served, for a group, by one of
the brokers with members, chosen by rendezvous hashing (so a broker joining or leaving a group
moves only its share of the partitions), and that broker hands each message to its members in
turn. While a change of members travels between brokers (a few milliseconds), a message may go
to a member on each of two brokers, or, when the last member of a broker just left, to none.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Final

import trio

from kafkaesque.protocol import ErrorCode
from kafkaesque.protocol.mqtt import (
    MqttSubscription,
    MqttSubscriptionTrie,
    Origin,
    TopicMapping,
    log_topics_for,
    origin_of,
    parse_shared_subscription,
)
from kafkaesque.storage import data_records, end_offset

from .._errors import RequestError
from .._metadata import ClusterMetadata
from .._metadata_view import TopicInfo
from .._read_path import ReadPath
from ._recipient import Recipient

log = logging.getLogger("kafkaesque.broker.mqtt.egress")

_FETCH_BYTES: Final = 1 << 20
_LONG_POLL_S: Final = 1.0
_RETRY_S: Final = 0.2
_READY_TIMEOUT_S: Final = 10.0

_SharedKey = tuple[str, str, str]  # ("$share", group, inner filter)
Share = tuple[str, str]  # (group, inner filter): what brokers tell each other they have members of


class _ShareGroup:
    __slots__ = ("members", "turn")

    def __init__(self) -> None:
        self.members: dict[Recipient, MqttSubscription] = {}  # device -> its subscription
        self.turn = 0

    def pick(self) -> tuple[Recipient, MqttSubscription] | None:
        if not self.members:
            return None
        self.turn += 1
        devices = list(self.members.items())
        return devices[self.turn % len(devices)]


class Egress:
    """The subscriptions of this broker's devices and the readers that feed them."""

    def __init__(
        self,
        broker_id: int,
        reads: ReadPath,
        metadata: ClusterMetadata,
        mapping: TopicMapping,
        ensure_topic: Callable[[str], Awaitable[TopicInfo]],
    ) -> None:
        self._broker_id = broker_id
        self._reads = reads
        self._metadata = metadata
        self._mapping = mapping
        self._ensure_topic = ensure_topic
        # A device's own subscription carries its options (QoS, No Local); a group's, none.
        self._trie: MqttSubscriptionTrie[Recipient | _SharedKey, MqttSubscription | None] = (
            MqttSubscriptionTrie()
        )
        self._groups: dict[_SharedKey, _ShareGroup] = {}
        self.shares_changed = trio.Event()  # set when local_shares() changes; replaced by readers
        self._reading: dict[str, trio.Event] = {}  # log topic -> set once positioned
        # (log topic, partition) -> the next offset its reader delivers: every record before
        # it has been handed to the matching devices.
        self.positions: dict[tuple[str, int], int] = {}
        self._nursery: trio.Nursery | None = None
        self.delivered = 0
        # The groups with members on each peer broker (its last SHARES), and which broker
        # serves a (group, log topic, partition), worked out once per change of those sets.
        self._peer_shares: dict[int, frozenset[Share]] = {}
        self._servers: dict[tuple[Share, str, int], int] = {}

    @property
    def subscriptions(self) -> int:
        return len(self._trie)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Host the readers until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    # -- subscriptions --------------------------------------------------------------------------

    async def subscribe(self, device: Recipient, subscriptions: Iterable[MqttSubscription]) -> None:
        """Add the subscriptions; return once the log topics they read from are being read
        (so a record committed after the SUBACK is delivered), or after a timeout."""
        topics: set[str] = set()
        for sub in subscriptions:
            if sub.topic_filter in device.subscriptions:
                self._remove(device, sub.topic_filter)
            shared = parse_shared_subscription(sub.topic_filter)
            if shared is None:
                self._trie.add(sub.topic_filter, device, sub)
            else:
                key = ("$share", shared.share_name, shared.topic_filter)
                group = self._groups.get(key)
                if group is None:
                    group = self._groups[key] = _ShareGroup()
                    self.shares_changed.set()
                    self._trie.add(shared.topic_filter, key, None)
                group.members[device] = sub
            device.subscriptions[sub.topic_filter] = sub
            topics |= log_topics_for(self._mapping, sub.topic_filter)
        with trio.move_on_after(_READY_TIMEOUT_S):
            for log_topic in topics:
                await self._start_reading(log_topic).wait()

    def unsubscribe(self, device: Recipient, topic_filters: Iterable[str]) -> None:
        for topic_filter in topic_filters:
            if topic_filter in device.subscriptions:
                self._remove(device, topic_filter)

    def drop(self, device: Recipient) -> None:
        """The device's session ended: forget all its subscriptions."""
        for topic_filter in list(device.subscriptions):
            self._remove(device, topic_filter)

    def _remove(self, device: Recipient, topic_filter: str) -> None:
        del device.subscriptions[topic_filter]
        shared = parse_shared_subscription(topic_filter)
        if shared is None:
            self._trie.remove(topic_filter, device)
            return
        key = ("$share", shared.share_name, shared.topic_filter)
        group = self._groups.get(key)
        if group is not None:
            group.members.pop(device, None)
            if not group.members:
                del self._groups[key]
                self.shares_changed.set()
                self._trie.remove(shared.topic_filter, key)

    # -- shared subscriptions across brokers -----------------------------------------------------

    def local_shares(self) -> frozenset[Share]:
        """The shared-subscription groups with members on this broker (for ``SHARES``)."""
        return frozenset((key[1], key[2]) for key in self._groups)

    def peer_shares(self, peer: int, shares: Iterable[Iterable[str]]) -> None:
        """Peer ``peer`` has members of ``shares`` (an empty list: none, or it is gone)."""
        known = frozenset((str(name), str(inner)) for name, inner in shares)
        if self._peer_shares.get(peer, frozenset()) != known:
            self._peer_shares[peer] = known
            self._servers.clear()

    def _serves(self, key: _SharedKey, log_topic: str, partition: int) -> bool:
        """Whether this broker hands ``key``'s messages of that partition to its members."""
        share = (key[1], key[2])
        where = (share, log_topic, partition)
        server = self._servers.get(where)
        if server is None:
            me = self._broker_id
            brokers = [me, *(p for p, s in self._peer_shares.items() if share in s)]
            # Rendezvous hashing: the broker with the highest score for this partition. Not
            # CRC-32: being linear, it would rank the brokers alike for every partition.
            name = f"{share[0]}\0{share[1]}\0{log_topic}\0{partition}"
            server = max(brokers, key=lambda b: (_score(f"{name}\0{b}"), b))
            self._servers[where] = server
        return server == self._broker_id

    # -- delivery -------------------------------------------------------------------------------

    def deliver(
        self,
        topic: str,
        payload: bytes,
        origin: Origin,
        where: tuple[str, int, int] | None = None,
        timestamp_ms: int = 0,
    ) -> int:
        """Deliver one message to every matching local device (``deliver_to``); how many got it.

        ``where`` is the record's place in the log (log topic, partition, offset): a shared
        subscription's message goes to a local member only if this broker serves that partition
        for the group. ``timestamp_ms`` is the record's, from which its expiry counts.
        """
        matched: dict[Recipient, list[MqttSubscription]] = {}
        for subscriber, found in self._trie.match(topic):
            if isinstance(subscriber, tuple):
                if where is not None and not self._serves(subscriber, where[0], where[1]):
                    continue
                group = self._groups.get(subscriber)
                picked = group.pick() if group is not None else None
                if picked is None:
                    continue
                subscriber, sub = picked
            else:
                assert found is not None
                sub = found
                if not origin.wanted_by(sub, subscriber.client_id_bytes):
                    continue
                catching_up = subscriber.catching_up
                if catching_up and where is not None and (where[0], where[1]) in catching_up:
                    continue  # its catch-up delivers it, in order
            matched.setdefault(subscriber, []).append(sub)
        for device, subs in matched.items():
            deliver_to(device, topic, payload, origin, subs, where, timestamp_ms)
        self.delivered += len(matched)
        return len(matched)

    # -- readers --------------------------------------------------------------------------------

    def _start_reading(self, log_topic: str) -> trio.Event:
        ready = self._reading.get(log_topic)
        if ready is None:
            ready = self._reading[log_topic] = trio.Event()
            assert self._nursery is not None, "Egress.run is not running"
            self._nursery.start_soon(self._read_topic, log_topic, ready)
        return ready

    async def _read_topic(self, log_topic: str, ready: trio.Event) -> None:
        """Read every partition of ``log_topic`` (created if missing) from its end, for ever."""
        while True:
            try:
                info = await self._ensure_topic(log_topic)
                break
            except RequestError as exc:
                log.info("mqtt egress: %s is not available yet: %s", log_topic, exc)
                await trio.sleep(_RETRY_S)
        positioned = [0]

        def one_positioned() -> None:
            positioned[0] += 1
            if positioned[0] == info.config.partitions:
                ready.set()

        async with trio.open_nursery() as nursery:
            for partition in range(info.config.partitions):
                nursery.start_soon(self._read_partition, log_topic, partition, one_positioned)
            await self._read_new_partitions(log_topic, info.config.partitions, nursery)

    async def _read_new_partitions(self, log_topic: str, known: int, nursery: trio.Nursery) -> None:
        """Read the partitions added to ``log_topic`` later (``ALTER``) as well, each from its
        start: everything in it was written after this reader began. Runs for ever."""
        metadata = self._metadata
        while True:
            # The view now first: a change applied since ``known`` was read is not waited for.
            view = metadata.view
            info = view.topics.get(log_topic)
            if info is not None and info.config.partitions > known:
                for partition in range(known, info.config.partitions):
                    log.info("mqtt egress: %s gained partition %d", log_topic, partition)
                    nursery.start_soon(self._read_partition, log_topic, partition, None, 0)
                known = info.config.partitions
            await metadata.wait_changed(view.version)

    async def _read_partition(
        self,
        log_topic: str,
        partition: int,
        positioned: Callable[[], None] | None,
        start: int | None = None,
    ) -> None:
        """Deliver the partition's records from ``start`` (None: its end), for ever."""
        reads = self._reads
        offset: int | None = start
        while True:
            try:
                if offset is None:
                    offset = await self._end_of(log_topic, partition)
                    self.positions[log_topic, partition] = offset
                    if positioned is not None:
                        positioned()
                        positioned = None
                fetched = await reads.fetch(
                    log_topic, partition, offset, _FETCH_BYTES, _LONG_POLL_S
                )
            except RequestError as exc:
                if exc.code is ErrorCode.OFFSET_OUT_OF_RANGE:
                    offset = None  # retention passed us (or a new log): go to the end
                log.debug("mqtt egress %s/%d: %s; retrying", log_topic, partition, exc)
                await trio.sleep(_RETRY_S)
                continue
            offset = self._deliver_batches(log_topic, partition, fetched.data, offset)
            self.positions[log_topic, partition] = offset
            if not fetched.data:
                await trio.lowlevel.checkpoint()

    async def _end_of(self, log_topic: str, partition: int) -> int:
        """The partition's high watermark (where a new subscription starts)."""
        # Offset 0 is never past the end: out of range only below the log start.
        fetched, start = await self._reads.follow(log_topic, partition, 0, 1, 0)
        return max(fetched.high_watermark, start)

    def _deliver_batches(
        self, log_topic: str, partition: int, data: bytes | memoryview, offset: int
    ) -> int:
        """Deliver the records of ``data`` at or after ``offset``; the next offset to read."""
        mapping = self._mapping
        for record in data_records(data, offset, verify=False):  # the log verified them on read
            topic = mapping.mqtt_topic_for(log_topic, record.key, record.headers)
            if topic is None:
                continue
            where = (log_topic, partition, record.offset)
            origin = origin_of(record.headers)
            self.deliver(topic, record.value or b"", origin, where, record.timestamp)
        end = end_offset(data)  # past control batches too
        return offset if end is None else max(offset, end)


def _score(text: str) -> bytes:
    return hashlib.blake2b(text.encode(), digest_size=8).digest()


def deliver_to(
    device: Recipient,
    topic: str,
    payload: bytes,
    origin: Origin,
    subs: Sequence[MqttSubscription],
    where: tuple[str, int, int] | None,
    timestamp_ms: int,
) -> None:
    """Queue one message for ``device``, which it matched through ``subs`` (at least one): at the
    highest QoS they grant, capped by the message's; with RETAIN if it was published so and one
    of them has Retain As Published (live messages otherwise go out with RETAIN 0,
    MQTT-3.3.1-12); with their Subscription Identifiers, until its expiry and with its other
    properties (v5, all four)."""
    device.deliver(
        topic,
        payload,
        max(min(s.qos, origin.qos) for s in subs),
        origin.retained and any(s.retain_as_published for s in subs),
        where,
        origin.expires_ms(timestamp_ms),
        tuple(s.identifier for s in subs if s.identifier),
        origin.forwarded,
    )
