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

Shared subscriptions (``$share/group/filter``): each message goes to one member of the group
among this broker's devices, in turn. Members of a group connected to different brokers each
receive it on their broker (documented in docs/mqtt.md).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Final

import trio

from kafkaesque.protocol import (
    MQTT_QOS_HEADER,
    ErrorCode,
    MqttSubscription,
    MqttSubscriptionTrie,
    TopicMapping,
    parse_shared_subscription,
)
from kafkaesque.storage import BatchType, decode_records, iter_batches

from ._errors import RequestError
from ._metadata import TopicInfo
from ._mqtt_filters import log_topics_for

if TYPE_CHECKING:
    from ._broker import Broker
    from ._mqtt_device import MqttDevice

log = logging.getLogger("kafkaesque.broker.mqtt.egress")

_FETCH_BYTES: Final = 1 << 20
_LONG_POLL_S: Final = 1.0
_RETRY_S: Final = 0.2
_READY_TIMEOUT_S: Final = 10.0

_SharedKey = tuple[str, str, str]  # ("$share", group, inner filter)


class _ShareGroup:
    __slots__ = ("members", "turn")

    def __init__(self) -> None:
        self.members: dict[MqttDevice, int] = {}  # device -> granted QoS
        self.turn = 0

    def pick(self) -> tuple[MqttDevice, int] | None:
        if not self.members:
            return None
        self.turn += 1
        devices = list(self.members.items())
        return devices[self.turn % len(devices)]


class Egress:
    """The subscriptions of this broker's devices and the readers that feed them."""

    def __init__(
        self,
        broker: Broker,
        mapping: TopicMapping,
        ensure_topic: Callable[[str], Awaitable[TopicInfo]],
    ) -> None:
        self._broker = broker
        self._mapping = mapping
        self._ensure_topic = ensure_topic
        self._trie: MqttSubscriptionTrie[MqttDevice | _SharedKey, int] = MqttSubscriptionTrie()
        self._groups: dict[_SharedKey, _ShareGroup] = {}
        self._reading: dict[str, trio.Event] = {}  # log topic -> set once positioned
        # (log topic, partition) -> the next offset its reader delivers: every record before
        # it has been handed to the matching devices.
        self.positions: dict[tuple[str, int], int] = {}
        self._nursery: trio.Nursery | None = None
        self.delivered = 0

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

    async def subscribe(
        self, device: MqttDevice, subscriptions: Iterable[MqttSubscription]
    ) -> None:
        """Add the subscriptions; return once the log topics they read from are being read
        (so a record committed after the SUBACK is delivered), or after a timeout."""
        topics: set[str] = set()
        for sub in subscriptions:
            if sub.topic_filter in device.subscriptions:
                self._remove(device, sub.topic_filter)
            shared = parse_shared_subscription(sub.topic_filter)
            if shared is None:
                self._trie.add(sub.topic_filter, device, sub.qos)
            else:
                key = ("$share", shared.share_name, shared.topic_filter)
                group = self._groups.get(key)
                if group is None:
                    group = self._groups[key] = _ShareGroup()
                    self._trie.add(shared.topic_filter, key, 0)
                group.members[device] = sub.qos
            device.subscriptions[sub.topic_filter] = sub
            topics |= log_topics_for(self._mapping, sub.topic_filter)
        with trio.move_on_after(_READY_TIMEOUT_S):
            for log_topic in topics:
                await self._start_reading(log_topic).wait()

    def unsubscribe(self, device: MqttDevice, topic_filters: Iterable[str]) -> None:
        for topic_filter in topic_filters:
            if topic_filter in device.subscriptions:
                self._remove(device, topic_filter)

    def drop(self, device: MqttDevice) -> None:
        """The device's session ended: forget all its subscriptions."""
        for topic_filter in list(device.subscriptions):
            self._remove(device, topic_filter)

    def _remove(self, device: MqttDevice, topic_filter: str) -> None:
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
                self._trie.remove(shared.topic_filter, key)

    # -- delivery -------------------------------------------------------------------------------

    def deliver(
        self, topic: str, payload: bytes, qos: int, where: tuple[str, int, int] | None = None
    ) -> int:
        """Deliver one message to every matching local device; how many got it."""
        best: dict[MqttDevice, int] = {}
        for subscriber, granted in self._trie.match(topic):
            if isinstance(subscriber, tuple):
                group = self._groups.get(subscriber)
                picked = group.pick() if group is not None else None
                if picked is None:
                    continue
                subscriber, granted = picked
            level = min(granted, qos)
            if best.get(subscriber, -1) < level:
                best[subscriber] = level
        for device, level in best.items():
            device.deliver(topic, payload, level, where=where)
        self.delivered += len(best)
        return len(best)

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

    async def _read_partition(
        self, log_topic: str, partition: int, positioned: Callable[[], None] | None
    ) -> None:
        commands = self._broker.commands
        offset: int | None = None
        while True:
            try:
                if offset is None:
                    offset = await self._end_of(log_topic, partition)
                    self.positions[log_topic, partition] = offset
                    if positioned is not None:
                        positioned()
                        positioned = None
                fetched = await commands.fetch_batches(
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
        commands = self._broker.commands
        try:
            fetched = await commands.fetch_batches(log_topic, partition, 0, 1, 0)
        except RequestError as exc:
            if exc.code is not ErrorCode.OFFSET_OUT_OF_RANGE:
                raise
            fetched, start = await commands._from_log_start(log_topic, partition, 0)
            return max(fetched.high_watermark, start)
        return fetched.high_watermark

    def _deliver_batches(
        self, log_topic: str, partition: int, data: bytes | memoryview, offset: int
    ) -> int:
        """Deliver the records of ``data`` at or after ``offset``; the next offset to read."""
        mapping = self._mapping
        pos = 0
        next_offset = offset
        for header in iter_batches(data, verify=False):  # the log verified them on read
            batch = data[pos : pos + header.size]
            pos += header.size
            next_offset = max(next_offset, header.next_offset)
            if header.batch_type is not BatchType.DATA or header.next_offset <= offset:
                continue
            for record in decode_records(batch, header):
                if record.offset < offset:
                    continue
                topic = mapping.mqtt_topic_for(log_topic, record.key, record.headers)
                if topic is None:
                    continue
                where = (log_topic, partition, record.offset)
                self.deliver(topic, record.value or b"", qos_of(record.headers), where)
        return next_offset


def qos_of(headers: tuple[tuple[str, bytes], ...]) -> int:
    for name, value in headers:
        if name == MQTT_QOS_HEADER:
            return {b"0": 0, b"1": 1, b"2": 2}.get(value, 1)
    return 1
