"""Retained messages: a compacted, replicated internal topic that every broker tails.

A PUBLISH with RETAIN set is appended, besides its mapped log topic, to ``__mqtt_retained``
(one partition, compacted, replicated like ``__consumer_offsets``), keyed by its MQTT topic; an
empty payload appends a tombstone (None value), which deletes the topic's retained message
(MQTT-3.3.1-10/-11). Its PUBACK waits for both appends. Compaction keeps the latest record of
each topic, so the topic stays the size of the retained set.

Every broker reads the topic from its start into an ``MqttTopicTrie`` and then follows it
(long-polling for committed records), so any broker serves the retained messages after a
failover or a restart. A new subscription gets the matching ones with RETAIN=1, right after its
SUBACK (MQTT-3.3.1-6), at the lower of the two QoS. A broker serves what it has read: a retained
message published through another broker a moment before may not be there yet (the gap is one
commit notification; documented).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Final, NamedTuple

from kafkaesque.protocol import INTERNAL_TOPIC_PREFIX
from kafkaesque.protocol.mqtt import (
    MqttSubscription,
    MqttTopicTrie,
    origin_of,
    parse_shared_subscription,
)
from kafkaesque.storage import Record

from .._metadata_view import TopicInfo
from .._read_path import ReadPath
from ._recipient import Recipient
from ._tail import TopicTail

log = logging.getLogger("kafkaesque.broker.mqtt.retained")

RETAINED_TOPIC: Final = INTERNAL_TOPIC_PREFIX + "mqtt_retained"


class _Retained(NamedTuple):
    payload: bytes
    qos: int
    expires_ms: int | None  # wall-clock ms; None: never
    forwarded: tuple[tuple[str, bytes], ...]  # the headers of its other v5 properties
    at_ms: int = 0  # when it was published (its record's timestamp; the console shows it)


class RetainedStore:
    """This broker's copy of the retained messages, by MQTT topic."""

    def __init__(
        self, reads: ReadPath, ensure_topic: Callable[[str], Awaitable[TopicInfo]]
    ) -> None:
        self.messages: MqttTopicTrie[_Retained] = MqttTopicTrie()
        self.tail = TopicTail(reads, RETAINED_TOPIC, ensure_topic, self._apply)

    async def run(self) -> None:
        """Read the retained topic from its start and follow it, until cancelled."""
        await self.tail.run()

    def _apply(self, record: Record) -> None:
        if record.key is None:
            return
        try:
            topic = record.key.decode()
        except UnicodeDecodeError:
            return
        if record.value:
            origin = origin_of(record.headers)
            expires_ms = origin.expires_ms(record.timestamp)
            # Every retained copy carries its QoS (``mqtt.qos``): ``origin_of`` reads it with
            # the rest, in one pass over the headers.
            retained = _Retained(
                record.value, origin.qos, expires_ms, origin.forwarded, record.timestamp
            )
            self.messages.set(topic, retained)
        else:
            self.messages.delete(topic)

    def send_to(self, device: Recipient, subscriptions: tuple[MqttSubscription, ...]) -> None:
        """Deliver the retained messages matching ``subscriptions``: not for shared ones (v5
        §4.8.2: retained messages are not sent to a shared subscription), nor when the
        subscription's Retain Handling is 2 (Retain Handling 1, "only if the subscription is
        new", is the caller's to apply: it knows what existed)."""
        for sub in subscriptions:
            if sub.retain_handling == 2 or parse_shared_subscription(sub.topic_filter):
                continue
            for topic, m in self.messages.match(sub.topic_filter):
                # An expired one is not sent (MQTT-3.3.2-5); it stays until replaced.
                ids = (sub.identifier,) if sub.identifier else ()
                qos = min(m.qos, sub.qos)
                device.deliver(topic, m.payload, qos, True, None, m.expires_ms, ids, m.forwarded)
