"""An MQTT 5 application message's properties, kept as record headers from the PUBLISH that
brought the message to the PUBLISHes that deliver it.

A server passes these on unaltered: Payload Format Indicator (MQTT-3.3.2-4), Message Expiry
Interval (what remains of it, MQTT-3.3.2-6), Response Topic (MQTT-3.3.2-15), Correlation Data
(MQTT-3.3.2-16), User Properties in their order (MQTT-3.3.2-17/-18) and Content Type
(MQTT-3.3.2-20). In the log they are plain headers, readable by any consumer::

    mqtt.expiry          the Message Expiry Interval, seconds in ASCII, from the record's timestamp
    mqtt.format          b"0" or b"1" (1: the payload is UTF-8)
    mqtt.content-type    the Content Type (UTF-8)
    mqtt.response-topic  the Response Topic (UTF-8)
    mqtt.correlation     the Correlation Data, as is
    mqtt.user.NAME       one header per User Property, in order; NAME may repeat

A record appended by anything else (``PUBS``, the client library) may carry the same headers: a
controller's command then reaches a v5 device with a Response Topic and Correlation Data, which
is MQTT 5's request/response. A header MQTT cannot carry (not UTF-8, U+0000, longer than 65,535
bytes, a Response Topic with wildcards) is left out of the PUBLISH instead of failing delivery.
A 3.1.1 device receives none of them.

``origin_of`` reads, in one pass over a record's headers, how it was published over MQTT
(``Origin``: its QoS, publisher, RETAIN, expiry and the headers above), for every reader that
delivers records to MQTT clients (the broker's egress, retained messages, the bridge).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, NamedTuple

from ._mapping import MQTT_CLIENT_HEADER, MQTT_QOS_HEADER, MQTT_RETAIN_HEADER
from ._packets import MqttProperties, MqttSubscription
from ._topics import is_valid_mqtt_topic_name

MQTT_EXPIRY_HEADER: Final = "mqtt.expiry"
MQTT_FORMAT_HEADER: Final = "mqtt.format"
MQTT_CONTENT_TYPE_HEADER: Final = "mqtt.content-type"
MQTT_RESPONSE_TOPIC_HEADER: Final = "mqtt.response-topic"
MQTT_CORRELATION_HEADER: Final = "mqtt.correlation"
MQTT_USER_HEADER_PREFIX: Final = "mqtt.user."

# The headers delivered as properties, besides the expiry (whose remainder is computed).
_FORWARDED: Final = frozenset(
    (
        MQTT_FORMAT_HEADER,
        MQTT_CONTENT_TYPE_HEADER,
        MQTT_RESPONSE_TOPIC_HEADER,
        MQTT_CORRELATION_HEADER,
    )
)
_MAX_STRING: Final = 0xFFFF  # an MQTT string or binary field holds at most this many bytes

Headers = tuple[tuple[str, bytes], ...]


def message_headers(properties: MqttProperties) -> Headers:
    """The headers that keep ``properties``' message properties (empty without any)."""
    p = properties
    headers: list[tuple[str, bytes]] = []
    if p.message_expiry_interval is not None:
        headers.append((MQTT_EXPIRY_HEADER, b"%d" % p.message_expiry_interval))
    if p.payload_format_indicator is not None:
        headers.append((MQTT_FORMAT_HEADER, b"%d" % p.payload_format_indicator))
    if p.content_type is not None:
        headers.append((MQTT_CONTENT_TYPE_HEADER, p.content_type.encode()))
    if p.response_topic is not None:
        headers.append((MQTT_RESPONSE_TOPIC_HEADER, p.response_topic.encode()))
    if p.correlation_data is not None:
        headers.append((MQTT_CORRELATION_HEADER, p.correlation_data))
    for name, value in p.user_properties:
        headers.append((MQTT_USER_HEADER_PREFIX + name, value.encode()))
    return tuple(headers)


def is_forwarded_header(name: str) -> bool:
    """Whether a header named ``name`` is delivered as it is (all of the above but the expiry,
    which goes out as what remains of it)."""
    return name in _FORWARDED or name.startswith(MQTT_USER_HEADER_PREFIX)


def delivery_properties(
    forwarded: Iterable[tuple[str, bytes]],
    expiry_s: int | None = None,
    identifiers: tuple[int, ...] = (),
) -> MqttProperties:
    """The properties of a PUBLISH delivering a message: the ones its ``forwarded`` headers
    stand for (a header MQTT cannot carry is left out, see the module docstring), what remains
    of its expiry interval, and the Subscription Identifiers it matched."""
    payload_format: int | None = None
    content_type = response_topic = None
    correlation: bytes | None = None
    users: list[tuple[str, str]] = []
    for name, value in forwarded:
        if name == MQTT_CORRELATION_HEADER:
            if len(value) <= _MAX_STRING:
                correlation = value
            continue
        text = _mqtt_string(value)
        if text is None:
            continue
        if name.startswith(MQTT_USER_HEADER_PREFIX):
            key = name[len(MQTT_USER_HEADER_PREFIX) :]
            if len(key.encode()) <= _MAX_STRING and "\x00" not in key:
                users.append((key, text))
        elif name == MQTT_FORMAT_HEADER:
            if text in ("0", "1"):
                payload_format = int(text)
        elif name == MQTT_CONTENT_TYPE_HEADER:
            content_type = text
        elif name == MQTT_RESPONSE_TOPIC_HEADER and is_valid_mqtt_topic_name(text):
            response_topic = text
    return MqttProperties(
        payload_format_indicator=payload_format,
        message_expiry_interval=expiry_s,
        content_type=content_type,
        response_topic=response_topic,
        correlation_data=correlation,
        subscription_identifiers=identifiers,
        user_properties=tuple(users),
    )


def _mqtt_string(value: bytes) -> str | None:
    """``value`` as an MQTT UTF-8 string, or None if it cannot be one."""
    if len(value) > _MAX_STRING:
        return None
    try:
        text = value.decode()
    except UnicodeDecodeError:
        return None
    return None if "\x00" in text else text


class Origin(NamedTuple):
    """How a record was published over MQTT, from its headers (``origin_of``)."""

    qos: int
    publisher: bytes | None
    retained: bool
    expiry_s: int | None
    forwarded: tuple[tuple[str, bytes], ...]  # the headers that carry its other v5 properties

    def expires_ms(self, timestamp_ms: int) -> int | None:
        """When the message expires (wall-clock ms), for a record stamped ``timestamp_ms``."""
        return None if self.expiry_s is None else timestamp_ms + 1000 * self.expiry_s

    def wanted_by(self, sub: MqttSubscription, client_id: bytes | None) -> bool:
        """Whether the subscription ``sub`` of the client ``client_id`` takes the message: not
        with No Local (v5) when that client published it itself."""
        return not (sub.no_local and self.publisher is not None and self.publisher == client_id)


def origin_of(headers: tuple[tuple[str, bytes], ...]) -> Origin:
    """A record's QoS (its ``mqtt.qos``; 1 without: a record from another client is in the log
    already), its MQTT publisher's client id (``mqtt.client``), if it has one, whether it was
    published with RETAIN (``mqtt.retain``), its Message Expiry Interval (``mqtt.expiry``) and
    the headers of its other v5 properties (``is_forwarded_header``)."""
    qos, publisher, retained, expiry = 1, None, False, None
    forwarded: list[tuple[str, bytes]] = []
    for name, value in headers:
        if name == MQTT_QOS_HEADER:
            qos = {b"0": 0, b"1": 1, b"2": 2}.get(value, 1)
        elif name == MQTT_CLIENT_HEADER:
            publisher = value
        elif name == MQTT_RETAIN_HEADER:
            retained = value == b"1"
        elif name == MQTT_EXPIRY_HEADER and value.isdigit():
            expiry = int(value)
        elif is_forwarded_header(name):
            forwarded.append((name, value))
    return Origin(qos, publisher, retained, expiry, tuple(forwarded))


def seconds_left(expires_ms: int, now_ms: int) -> int | None:
    """What remains at ``now_ms`` (wall-clock ms) of a message's expiry interval, in whole
    seconds rounded up (the Message Expiry Interval it goes out with, MQTT-3.3.2-6); None once
    it has expired."""
    left_ms = expires_ms - now_ms
    return -(-left_ms // 1000) if left_ms > 0 else None
