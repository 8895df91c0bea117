"""Topic mapping between MQTT topics and log topics: which log topic and key a PUBLISH goes to,
and which MQTT topic a log record is delivered on.

A mapping is a list of rules, one a line, first match wins::

    # MQTT topic filter   -> log topic  [key]
    phones/+/spectrum     -> readings   key=1      # key = level 1, the device id
    phones/+/commands     -> commands   key=1
    sensors/#             -> sensors    key=topic  # key = the whole MQTT topic

``key=N`` takes the N-th level (0-based) of the MQTT topic as the record key, so one device's
messages stay in one partition, in order; ``key=topic`` takes the whole topic; with no key, the
partition follows the publisher's client id (each device's messages in one partition, in order,
and the devices spread over the partitions). Comments start with ``#`` (a line of its own, or
after the log topic); ``# -> everything`` is the rule for the filter ``#``. A topic that no rule
matches goes to the fallback log topic (``mqtt``, keyed by the whole topic; ``default -> <log
topic>`` renames it), so nothing is dropped, ``$``-topics included. Records written from MQTT
carry the full MQTT topic in the header ``mqtt.topic``: MQTT topics may hold any UTF-8, log topic
names stay within ``[A-Za-z0-9._-]``.

Egress runs the other way: a record with an ``mqtt.topic`` header is delivered on that topic; a
record without one (a controller's command appended with PUBS or the client library) is delivered
on the topic of the first rule for its log topic whose key level is a ``+``, with the key put in
its place: key ``phone-7`` of log topic ``commands`` becomes ``phones/phone-7/commands``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from kafkaesque.protocol import topic_name_error

from ._topics import (
    InvalidMqttTopicError,
    is_valid_mqtt_topic_name,
    mqtt_topic_matches,
    parse_shared_subscription,
    validate_mqtt_topic_filter,
)

MQTT_TOPIC_HEADER: Final = "mqtt.topic"
MQTT_QOS_HEADER: Final = "mqtt.qos"
# A QoS 1 record's publisher and packet id: a resend (DUP) of it is found by these, not appended
# twice (see ``kafkaesque.broker._resends``).
MQTT_CLIENT_HEADER: Final = "mqtt.client"
MQTT_PACKET_ID_HEADER: Final = "mqtt.pid"
# Set (to b"1") on a record published with RETAIN: a v5 subscription with Retain As Published
# receives it with RETAIN set.
MQTT_RETAIN_HEADER: Final = "mqtt.retain"
DEFAULT_LOG_TOPIC: Final = "mqtt"

_KEY_TOPIC: Final = -1  # key_level value meaning "the whole MQTT topic"
# A line starting with '#' is a comment, except the rule for the filter '#' itself ("# -> all").
_COMMENT: Final = re.compile(r"\s*#(?!\s*->)")


class InvalidMappingError(ValueError):
    """A mapping rule is malformed; the message names the line and what is wrong with it."""


@dataclass(frozen=True, slots=True)
class Route:
    """Where one MQTT PUBLISH is appended: ``log_topic``, with ``key`` (None: no key)."""

    log_topic: str
    key: bytes | None


@dataclass(frozen=True, slots=True)
class MappingRule:
    """``topic_filter -> log_topic``; ``key_level`` is a level index, -1 for the whole topic,
    or None for no key."""

    topic_filter: str
    log_topic: str
    key_level: int | None

    def key_for(self, mqtt_topic: str) -> bytes | None:
        if self.key_level is None:
            return None
        if self.key_level == _KEY_TOPIC:
            return mqtt_topic.encode()
        levels = mqtt_topic.split("/")
        # A rule's key level lies before any '#', so a matching topic always has that level.
        return levels[self.key_level].encode()

    def topic_for_key(self, key: bytes) -> str | None:
        """The MQTT topic that ``key`` of this rule's log topic is delivered on, or None."""
        try:
            text = key.decode()
        except UnicodeDecodeError:
            return None
        if self.key_level == _KEY_TOPIC:
            if is_valid_mqtt_topic_name(text) and mqtt_topic_matches(self.topic_filter, text):
                return text
            return None
        if self.key_level is None or not text or any(c in text for c in "/+#\0"):
            return None
        levels = self.topic_filter.split("/")
        if levels[self.key_level] != "+" or sum(lv in ("+", "#") for lv in levels) != 1:
            return None
        levels[self.key_level] = text
        return "/".join(levels)


class TopicMapping:
    """An immutable, parsed mapping. ``route`` for ingress, ``mqtt_topic_for`` for egress."""

    def __init__(self, rules: Iterable[MappingRule], default_log_topic: str = DEFAULT_LOG_TOPIC):
        self.rules: tuple[MappingRule, ...] = tuple(rules)
        self.default_log_topic = default_log_topic
        self._fallback = MappingRule("#", default_log_topic, _KEY_TOPIC)

    @classmethod
    def default(cls) -> TopicMapping:
        """No rules: every MQTT topic goes to log topic ``mqtt``, keyed by the topic."""
        return cls(())

    @classmethod
    def parse(cls, text: str) -> TopicMapping:
        """Parse rule lines; raises ``InvalidMappingError`` naming the first bad line."""
        rules: list[MappingRule] = []
        default = DEFAULT_LOG_TOPIC
        for number, raw in enumerate(text.splitlines(), start=1):
            if _COMMENT.match(raw):
                continue
            line = _strip_comment(raw)
            if not line.strip():
                continue
            try:
                rule = _parse_rule(line)
            except InvalidMappingError as exc:
                raise InvalidMappingError(f"line {number}: {exc}: {raw.strip()!r}") from None
            if rule.topic_filter == "default":
                default = rule.log_topic
            else:
                rules.append(rule)
        return cls(rules, default)

    def route(self, mqtt_topic: str) -> Route:
        """The log topic and key of a PUBLISH to the valid topic name ``mqtt_topic``."""
        rule = self.rule_for(mqtt_topic)
        return Route(rule.log_topic, rule.key_for(mqtt_topic))

    def rule_for(self, mqtt_topic: str) -> MappingRule:
        for rule in self.rules:
            if mqtt_topic_matches(rule.topic_filter, mqtt_topic):
                return rule
        return self._fallback

    def mqtt_topic_for(
        self, log_topic: str, key: bytes | None, headers: Iterable[tuple[str, bytes]] = ()
    ) -> str | None:
        """The MQTT topic a record of ``log_topic`` is delivered on, or None when it has none."""
        for name, value in headers:
            if name == MQTT_TOPIC_HEADER:
                try:
                    topic = value.decode()
                except UnicodeDecodeError:
                    return None
                return topic if is_valid_mqtt_topic_name(topic) else None
        if key is None:
            return None
        for rule in (*self.rules, self._fallback):
            if rule.log_topic == log_topic:
                mapped = rule.topic_for_key(key)
                if mapped is not None:
                    return mapped
        return None

    def log_topics(self) -> frozenset[str]:
        """Every log topic the mapping can write to, the fallback included."""
        return frozenset(rule.log_topic for rule in (*self.rules, self._fallback))

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, TopicMapping)
            and self.rules == other.rules
            and self.default_log_topic == other.default_log_topic
        )

    def __hash__(self) -> int:
        return hash((self.rules, self.default_log_topic))

    def __repr__(self) -> str:
        return f"TopicMapping({list(self.rules)!r}, default_log_topic={self.default_log_topic!r})"


def _strip_comment(line: str) -> str:
    # '#' is also the multi-level wildcard: only a '#' after whitespace, after the arrow, starts
    # a comment ("sensors/# -> sensors  # all sensors").
    head, arrow, tail = line.partition("->")
    if not arrow:
        return line
    comment = tail.find(" #")
    return head + arrow + (tail if comment < 0 else tail[:comment])


def _parse_rule(line: str) -> MappingRule:
    head, arrow, tail = line.partition("->")
    if not arrow:
        raise InvalidMappingError("expected '<MQTT topic filter> -> <log topic> [key=N|topic]'")
    topic_filter = head.strip()
    words = tail.split()
    if not topic_filter or not words or len(words) > 2:
        raise InvalidMappingError("expected '<MQTT topic filter> -> <log topic> [key=N|topic]'")
    log_topic = words[0]
    problem = topic_name_error(log_topic)
    if problem is not None:
        raise InvalidMappingError(f"log topic {log_topic!r}: {problem}")
    if topic_filter == "default":
        if len(words) > 1:
            raise InvalidMappingError("the default rule takes no key: it is keyed by the topic")
        return MappingRule("default", log_topic, _KEY_TOPIC)
    try:
        if parse_shared_subscription(topic_filter) is not None:
            raise InvalidMappingError("a rule's filter cannot be a shared subscription")
        validate_mqtt_topic_filter(topic_filter)
    except InvalidMqttTopicError as exc:
        raise InvalidMappingError(f"MQTT topic filter {topic_filter!r}: {exc}") from None
    key_level: int | None = None
    if len(words) == 2:
        name, eq, value = words[1].partition("=")
        if name != "key" or not eq:
            raise InvalidMappingError(f"unknown option {words[1]!r} (expected key=N or key=topic)")
        if value == "topic":
            key_level = _KEY_TOPIC
        elif value.isdigit():
            key_level = int(value)
            levels = topic_filter.split("/")
            if key_level >= len(levels) or "#" in levels[: key_level + 1]:
                raise InvalidMappingError(
                    f"key level {key_level} is not a level of {topic_filter!r} before any '#'"
                )
        else:
            raise InvalidMappingError(f"key must be a level index or 'topic', not {value!r}")
    return MappingRule(topic_filter, log_topic, key_level)
