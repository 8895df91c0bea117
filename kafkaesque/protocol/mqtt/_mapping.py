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

Payload-aware options (as Kafka Connect's KCQL), after the log topic, in any order::

    sensors/+/data  -> readings  key=$.device.id  fields=t,device.id  format=json
    events/#        -> events-{$.kind}  format=avro  schema=event.avsc
    plants/+/+      -> plant-{1}  key=2
    dead-letter     -> mqtt-dead-letter

``key=$.path`` takes the key from a string or number field of the JSON payload (``_payload``:
dotted members and ``[N]`` indexes). The log topic may be a template: ``{N}`` is level N of the
MQTT topic, ``{$.path}`` a payload field. ``fields=a,b.c`` keeps only those members (the value is
re-serialised as compact JSON; ``format=json`` is implied). ``format=`` picks the converter:
``raw`` (the bytes as they came), ``json`` (validated; stored unchanged unless fields are kept) or
``avro`` (with ``schema=FILE``, a path relative to the rules file: the JSON payload stored as
schemaless Avro binary). Without ``format=`` the host's converter applies (raw on the brokers'
listeners, ``--converter`` in the bridge). A payload that does not parse, lacks the key field, or
yields no valid log topic name is *unmappable*: it goes to the dead-letter topic (the
``dead-letter`` line; the brokers' listeners default to ``mqtt-dead-letter``) with the reason.
A rule with a template feeds the log only: the brokers deliver its records to MQTT subscribers
only through other rules' log topics.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from fastavro.types import Schema

from kafkaesque.protocol import topic_name_error

from ._converters import (
    CONVERTER_NAMES,
    ConversionError,
    Converter,
    avro_encode,
    dump_json,
    load_avro_schema,
    parse_json,
)
from ._payload import (
    JsonPath,
    TemplatePart,
    field_path,
    keep_fields,
    parse_template,
    scalar_text,
)
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
DEFAULT_DEAD_LETTER_TOPIC: Final = "mqtt-dead-letter"
# The headers of a dead letter: why it was refused, and the log topic it was meant for.
ERROR_HEADER: Final = "error"
TARGET_TOPIC_HEADER: Final = "target.topic"

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
class Mapped:
    """What one PUBLISH is appended as: ``log_topic``, ``key`` (None: no key) and ``value``."""

    log_topic: str
    key: bytes | None
    value: bytes


@dataclass(frozen=True, slots=True)
class Unmappable:
    """A PUBLISH its rule cannot map: ``reason``, and ``target`` (the log topic, or template,
    it was meant for). It goes to the dead-letter topic with its payload unchanged."""

    reason: str
    target: str


_UNPARSED: Final[Any] = object()


@dataclass(frozen=True, slots=True)
class MappingRule:
    """``topic_filter -> log_topic``; ``key_level`` is a level index, -1 for the whole topic,
    or None for no key (or a key from the payload: ``key_path``). The payload-aware options are
    described in the module docstring; ``log_topic`` holds the template text when the log topic
    is one (``template``)."""

    topic_filter: str
    log_topic: str
    key_level: int | None
    key_path: JsonPath | None = None
    fields: tuple[JsonPath, ...] = ()
    format: str | None = None
    schema_path: str | None = None
    template: tuple[TemplatePart, ...] | None = field(default=None, compare=False, repr=False)
    avro_schema: Schema | None = field(default=None, compare=False, repr=False)

    @property
    def reads_payload(self) -> bool:
        """Whether what a PUBLISH becomes depends on its payload (else on its topic only)."""
        return (
            self.key_path is not None
            or self.format in ("json", "avro")
            or any(isinstance(p, JsonPath) for p in self.template or ())
        )

    def key_for(self, mqtt_topic: str) -> bytes | None:
        if self.key_level is None:
            return None
        if self.key_level == _KEY_TOPIC:
            return mqtt_topic.encode()
        levels = mqtt_topic.split("/")
        # A rule's key level lies before any '#', so a matching topic always has that level.
        return levels[self.key_level].encode()

    def apply(
        self, mqtt_topic: str, payload: bytes, converter: Converter | None = None
    ) -> Mapped | Unmappable:
        """What a PUBLISH of ``payload`` to ``mqtt_topic`` (a topic this rule matches) becomes;
        ``converter`` is the host's, for a rule without ``format=``. Never raises for any
        payload: what cannot be mapped is ``Unmappable``."""
        document = _UNPARSED
        target = self.log_topic
        key: bytes | None
        try:
            if self.template is not None:
                parts: list[str] = []
                for part in self.template:
                    if isinstance(part, str):
                        parts.append(part)
                    elif isinstance(part, int):
                        parts.append(mqtt_topic.split("/")[part])
                    else:
                        if document is _UNPARSED:
                            document = parse_json(payload)
                        parts.append(scalar_text(part.get(document), f"field {part.text}"))
                target = "".join(parts)
                problem = topic_name_error(target)
                if problem is not None:
                    raise ConversionError(f"log topic {target!r}: {problem}")
            if self.key_path is not None:
                if document is _UNPARSED:
                    document = parse_json(payload)
                what = f"key field {self.key_path.text}"
                key = scalar_text(self.key_path.get(document), what).encode()
            else:
                key = self.key_for(mqtt_topic)
            if self.format is None:
                value = payload if converter is None else converter(payload)
            elif self.format == "raw":
                value = payload
            else:
                if document is _UNPARSED:
                    document = parse_json(payload)
                if self.fields:
                    document = keep_fields(document, self.fields)
                if self.format == "avro":
                    assert self.avro_schema is not None  # parse loads it
                    value = avro_encode(self.avro_schema, document)
                else:
                    value = dump_json(document) if self.fields else payload
        except ConversionError as exc:
            return Unmappable(str(exc), target)
        return Mapped(target, key, value)

    def topic_for_key(self, key: bytes) -> str | None:
        """The MQTT topic that ``key`` of this rule's log topic is delivered on, or None."""
        if self.template is not None or self.key_path is not None:
            return None
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
    """An immutable, parsed mapping. ``apply`` (or ``route``, for a topic whose rule does not
    read the payload) for ingress, ``mqtt_topic_for`` for egress. ``dead_letter_topic`` is the
    ``dead-letter`` line's topic, None without one."""

    def __init__(
        self,
        rules: Iterable[MappingRule],
        default_log_topic: str = DEFAULT_LOG_TOPIC,
        dead_letter_topic: str | None = None,
    ):
        self.rules: tuple[MappingRule, ...] = tuple(rules)
        self.default_log_topic = default_log_topic
        self.dead_letter_topic = dead_letter_topic
        self._fallback = MappingRule("#", default_log_topic, _KEY_TOPIC)

    @classmethod
    def default(cls) -> TopicMapping:
        """No rules: every MQTT topic goes to log topic ``mqtt``, keyed by the topic."""
        return cls(())

    @classmethod
    def parse(cls, text: str, base_dir: str | Path | None = None) -> TopicMapping:
        """Parse rule lines; raises ``InvalidMappingError`` naming the first bad line. An Avro
        rule's ``schema=`` file is read here, relative to ``base_dir`` (the rules file's folder;
        default: the working directory)."""
        rules: list[MappingRule] = []
        default = DEFAULT_LOG_TOPIC
        dead_letter: str | None = None
        for number, raw in enumerate(text.splitlines(), start=1):
            if _COMMENT.match(raw):
                continue
            line = _strip_comment(raw)
            if not line.strip():
                continue
            try:
                rule = _parse_rule(line, Path(base_dir or "."))
            except InvalidMappingError as exc:
                raise InvalidMappingError(f"line {number}: {exc}: {raw.strip()!r}") from None
            if rule.topic_filter == "default":
                default = rule.log_topic
            elif rule.topic_filter == "dead-letter":
                dead_letter = rule.log_topic
            else:
                rules.append(rule)
        return cls(rules, default, dead_letter)

    def route(self, mqtt_topic: str) -> Route:
        """The log topic and key of a PUBLISH to the valid topic name ``mqtt_topic``, whose rule
        does not read the payload; ``ValueError`` if it does, or if its topic template makes no
        valid log topic name of this topic (``apply`` answers for every PUBLISH)."""
        answer = self.static_route(mqtt_topic)
        if answer is None:
            raise ValueError(f"the rule for {mqtt_topic!r} reads the payload: use apply")
        if isinstance(answer, Unmappable):
            raise ValueError(f"{mqtt_topic!r} cannot be mapped: {answer.reason}")
        return answer

    def static_route(self, mqtt_topic: str) -> Route | Unmappable | None:
        """What every PUBLISH to ``mqtt_topic`` is routed as when its rule does not read the
        payload (the value stored is then the payload): a ``Route``, or ``Unmappable`` (a topic
        level that makes no valid log topic name); None when the rule reads the payload."""
        rule = self.rule_for(mqtt_topic)
        if rule.reads_payload:
            return None
        if rule.template is None:
            return Route(rule.log_topic, rule.key_for(mqtt_topic))
        mapped = rule.apply(mqtt_topic, b"")
        if isinstance(mapped, Unmappable):
            return mapped
        return Route(mapped.log_topic, mapped.key)

    def apply(
        self, mqtt_topic: str, payload: bytes, converter: Converter | None = None
    ) -> Mapped | Unmappable:
        """What a PUBLISH of ``payload`` to the valid topic name ``mqtt_topic`` becomes, by the
        first rule that matches; ``converter`` serves the rules without ``format=`` (None: the
        payload as is). Never raises: see ``MappingRule.apply``."""
        return self.rule_for(mqtt_topic).apply(mqtt_topic, payload, converter)

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
        """Every fixed log topic the mapping can write to, the fallback included (not those
        its templates make)."""
        return frozenset(
            rule.log_topic for rule in (*self.rules, self._fallback) if rule.template is None
        )

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, TopicMapping)
            and self.rules == other.rules
            and self.default_log_topic == other.default_log_topic
            and self.dead_letter_topic == other.dead_letter_topic
        )

    def __hash__(self) -> int:
        return hash((self.rules, self.default_log_topic, self.dead_letter_topic))

    def __repr__(self) -> str:
        return (
            f"TopicMapping({list(self.rules)!r}, default_log_topic={self.default_log_topic!r}, "
            f"dead_letter_topic={self.dead_letter_topic!r})"
        )


def _strip_comment(line: str) -> str:
    # '#' is also the multi-level wildcard: only a '#' after whitespace, after the arrow, starts
    # a comment ("sensors/# -> sensors  # all sensors").
    head, arrow, tail = line.partition("->")
    if not arrow:
        return line
    comment = tail.find(" #")
    return head + arrow + (tail if comment < 0 else tail[:comment])


_USAGE: Final = (
    "expected '<MQTT topic filter> -> <log topic> [key=N|topic|$.path] [fields=a,b.c] "
    "[format=raw|json|avro] [schema=FILE]'"
)
_OPTIONS: Final = ("key", "fields", "format", "schema")


def _parse_rule(line: str, base_dir: Path) -> MappingRule:
    head, arrow, tail = line.partition("->")
    if not arrow:
        raise InvalidMappingError(_USAGE)
    topic_filter = head.strip()
    words = tail.split()
    if not topic_filter or not words:
        raise InvalidMappingError(_USAGE)
    log_topic = words[0]
    options: dict[str, str] = {}
    for word in words[1:]:
        name, eq, value = word.partition("=")
        if name not in _OPTIONS or not eq:
            raise InvalidMappingError(
                f"unknown option {word!r} (expected key=, fields=, format= or schema=)"
            )
        if name in options:
            raise InvalidMappingError(f"option {name}= given twice")
        options[name] = value
    if topic_filter in ("default", "dead-letter"):
        problem = topic_name_error(log_topic)
        if problem is not None:
            raise InvalidMappingError(f"log topic {log_topic!r}: {problem}")
        if options:
            raise InvalidMappingError(f"the {topic_filter} rule takes no options")
        return MappingRule(topic_filter, log_topic, _KEY_TOPIC)
    try:
        if parse_shared_subscription(topic_filter) is not None:
            raise InvalidMappingError("a rule's filter cannot be a shared subscription")
        validate_mqtt_topic_filter(topic_filter)
    except InvalidMqttTopicError as exc:
        raise InvalidMappingError(f"MQTT topic filter {topic_filter!r}: {exc}") from None
    levels = topic_filter.split("/")

    def check_level(level: int, what: str) -> None:
        if level >= len(levels) or "#" in levels[: level + 1]:
            raise InvalidMappingError(
                f"{what} level {level} is not a level of {topic_filter!r} before any '#'"
            )

    template: tuple[TemplatePart, ...] | None = None
    if "{" in log_topic or "}" in log_topic:
        try:
            template = parse_template(log_topic)
        except ValueError as exc:
            raise InvalidMappingError(f"log topic {log_topic!r}: {exc}") from None
        for part in template:
            if isinstance(part, int):
                check_level(part, "log topic")
        sample = "".join(p if isinstance(p, str) else "x" for p in template)
        problem = topic_name_error(sample)
    else:
        problem = topic_name_error(log_topic)
    if problem is not None:
        raise InvalidMappingError(f"log topic {log_topic!r}: {problem}")
    key_level: int | None = None
    key_path: JsonPath | None = None
    key = options.get("key")
    if key is None:
        pass
    elif key == "topic":
        key_level = _KEY_TOPIC
    elif key.isdigit():
        key_level = int(key)
        check_level(key_level, "key")
    elif key.startswith("$"):
        try:
            key_path = JsonPath.parse(key)
        except ValueError as exc:
            raise InvalidMappingError(f"key: {exc}") from None
    else:
        raise InvalidMappingError(
            f"key must be a level index, 'topic' or a JSON path ($.a.b), not {key!r}"
        )
    fields: tuple[JsonPath, ...] = ()
    if "fields" in options:
        try:
            fields = tuple(field_path(f) for f in options["fields"].split(","))
        except ValueError as exc:
            raise InvalidMappingError(f"fields: {exc}") from None
    format_ = options.get("format")
    if format_ is not None and format_ not in CONVERTER_NAMES:
        raise InvalidMappingError(
            f"format must be one of {', '.join(CONVERTER_NAMES)}, not {format_!r}"
        )
    if fields:
        if format_ == "raw":
            raise InvalidMappingError("fields= re-serialises the payload: not with format=raw")
        format_ = format_ or "json"
    schema_path = options.get("schema")
    avro_schema: Schema | None = None
    if format_ == "avro":
        if schema_path is None:
            raise InvalidMappingError("format=avro needs schema=FILE")
        try:
            avro_schema = load_avro_schema(base_dir / schema_path)
        except ValueError as exc:
            raise InvalidMappingError(str(exc)) from None
    elif schema_path is not None:
        raise InvalidMappingError("schema= goes with format=avro")
    return MappingRule(
        topic_filter,
        log_topic,
        key_level,
        key_path,
        fields,
        format_,
        schema_path,
        template,
        avro_schema,
    )
