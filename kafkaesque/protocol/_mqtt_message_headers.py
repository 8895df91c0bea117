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
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from ._mqtt_packets import MqttProperties
from ._mqtt_topics import is_valid_mqtt_topic_name

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
