"""The pure half of the MQTT bridge: what one upstream PUBLISH becomes in the log.

``to_log_record`` maps a PUBLISH with the ``TopicMapping`` (``TopicMapping.apply``: the same rules,
payload-aware ones included, as the brokers' own MQTT listeners; the bridge's converter serves
the rules without ``format=``), and returns the record to append, or the dead-letter record, or
nothing (dropped); no I/O, so the decision is tested without a broker. Both records carry the
headers ``mqtt.topic`` (the full MQTT topic, UTF-8) and ``mqtt.qos``, and those of a v5
message's properties (``message_headers``); a dead letter also carries ``error`` (why it was
refused) and ``target.topic`` (the log topic it was meant for), and keeps the original payload.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from kafkaesque.protocol.mqtt import (
    ERROR_HEADER,
    MQTT_QOS_HEADER,
    MQTT_TOPIC_HEADER,
    NO_PROPERTIES,
    TARGET_TOPIC_HEADER,
    Converter,
    Publish,
    TopicMapping,
    Unmappable,
    message_headers,
    raw_converter,
)

Headers = tuple[tuple[str, bytes], ...]


class LogRecord(NamedTuple):
    """A record to append: log topic, value, key and headers. (A tuple: one is built per
    message, and a frozen dataclass cost several times more to build.)"""

    topic: str
    value: bytes
    key: bytes | None
    headers: Headers


@dataclass(frozen=True, slots=True)
class Refused:
    """A poison message: the converter's reason, and its dead letter (None: drop it)."""

    reason: str
    dead_letter: LogRecord | None


def to_log_record(
    publish: Publish,
    mapping: TopicMapping,
    converter: Converter,
    dead_letter_topic: str | None = None,
) -> LogRecord | Refused:
    """The record ``publish`` is appended as, or why it is refused and where it goes instead
    (``dead_letter_topic``, else the mapping's ``dead-letter`` line, else nowhere)."""
    mapped = mapping.apply(publish.topic, publish.payload, converter)
    headers = (
        (MQTT_TOPIC_HEADER, publish.topic.encode()),
        (MQTT_QOS_HEADER, str(publish.qos).encode()),
        *message_headers(publish.properties),
    )
    if isinstance(mapped, Unmappable):
        reason = mapped.reason
        dead_letter_topic = dead_letter_topic or mapping.dead_letter_topic
        if dead_letter_topic is None:
            return Refused(reason, None)
        letter_headers = (
            *headers,
            (ERROR_HEADER, reason.encode()),
            (TARGET_TOPIC_HEADER, mapped.target.encode()),
        )
        key = mapping.rule_for(publish.topic).key_for(publish.topic)
        return Refused(reason, LogRecord(dead_letter_topic, publish.payload, key, letter_headers))
    return LogRecord(mapped.log_topic, mapped.value, mapped.key, headers)


class RecordRouter:
    """``to_log_record(publish, mapping, converter, dead_letter_topic)`` for every PUBLISH of a
    stream, with the same answers. A topic whose rule takes neither payload fields, nor a
    converter that may refuse (``format=raw``, or no ``format=`` with ``raw_converter``), has
    its log topic, key and ``mqtt.topic``/``mqtt.qos`` headers kept per (topic, QoS): at most
    ``cache_size`` of them, all dropped at once when full (a fleet's topics are many, each
    published often). Every other PUBLISH takes ``to_log_record``."""

    def __init__(
        self,
        mapping: TopicMapping,
        converter: Converter,
        dead_letter_topic: str | None = None,
        *,
        cache_size: int = 16384,
    ) -> None:
        if cache_size < 1:
            raise ValueError("cache_size must be at least 1")
        self.mapping = mapping
        self.converter = converter
        self.dead_letter_topic = dead_letter_topic
        self.cache_size = cache_size
        # (topic, qos) -> (log topic, key, headers), or None: that topic takes to_log_record.
        self._static: dict[tuple[str, int], tuple[str, bytes | None, Headers] | None] = {}

    def route(self, publish: Publish) -> LogRecord | Refused:
        """What ``to_log_record`` answers for ``publish``."""
        place = (publish.topic, publish.qos)
        try:
            static = self._static[place]
        except KeyError:
            static = self._learn(place)
        if static is None:
            return to_log_record(publish, self.mapping, self.converter, self.dead_letter_topic)
        log_topic, key, headers = static
        if publish.properties is not NO_PROPERTIES:
            headers = (*headers, *message_headers(publish.properties))
        return LogRecord(log_topic, publish.payload, key, headers)

    def _learn(self, place: tuple[str, int]) -> tuple[str, bytes | None, Headers] | None:
        topic, qos = place
        rule = self.mapping.rule_for(topic)
        static: tuple[str, bytes | None, Headers] | None = None
        raw = rule.format == "raw" or (rule.format is None and self.converter is raw_converter)
        if raw and not rule.reads_payload and rule.template is None:
            headers = ((MQTT_TOPIC_HEADER, topic.encode()), (MQTT_QOS_HEADER, str(qos).encode()))
            static = (rule.log_topic, rule.key_for(topic), headers)
        if len(self._static) >= self.cache_size:
            self._static.clear()
        self._static[place] = static
        return static


def default_filters(mapping: TopicMapping, egress_topics: frozenset[str]) -> tuple[str, ...]:
    """What the bridge subscribes to when ``--subscribe`` is not given: the rules' filters,
    except those whose log topic is published back to MQTT (subscribing to them would feed the
    bridge's own egress back into the log, forever), or ``#`` when there are no rules."""
    if not mapping.rules:
        return () if mapping.default_log_topic in egress_topics else ("#",)
    return tuple(rule.topic_filter for rule in mapping.rules if rule.log_topic not in egress_topics)


def shared_filter(topic_filter: str, share_group: str | None) -> str:
    """``$share/<group>/<filter>`` when a share group is given, else the filter."""
    return topic_filter if share_group is None else f"$share/{share_group}/{topic_filter}"
