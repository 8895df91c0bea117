"""Sans-I/O MQTT 3.1.1 / 5.0 encoder: ``encode_mqtt`` (a packet and a protocol version in, bytes
out) and ``encode_mqtt_puback``, the hot-path acknowledgement; ``_decoder`` is the other half of
the codec.

A packet that is not valid MQTT for the version raises ``MqttLocalProtocolError`` (a
``ValueError``): nothing is sent; it is our bug, not the peer's.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, Final

from ._packets import (
    AUTH_REASON_CODES,
    CONNACK_REASON_CODES,
    DISCONNECT_REASON_CODES,
    NO_PROPERTIES,
    PUBACK_REASON_CODES,
    PUBCOMP_REASON_CODES,
    PUBREC_REASON_CODES,
    PUBREL_REASON_CODES,
    SUBACK_REASON_CODES,
    SUBACK_RETURN_CODES_V311,
    UNSUBACK_REASON_CODES,
    Auth,
    Connack,
    Connect,
    Disconnect,
    MqttPacket,
    MqttPacketType,
    MqttProperties,
    MqttVersion,
    Pingreq,
    Pingresp,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
)
from ._properties import WILL_PROPERTIES, encode_properties
from ._topics import InvalidMqttTopicError, validate_mqtt_topic_filter
from ._wire import (
    MAX_REMAINING_LENGTH,
    TOPIC_CACHE_ENTRIES,
    TOPIC_CACHE_KEY_BYTES,
    U16,
    VERSIONS,
    encode_binary,
    encode_string,
    encode_u16,
    encode_vbi,
    frame,
    local_error,
    packet_id_bytes,
)

_PUBACK = struct.Struct(">BBH")

_V31: Final = MqttVersion.V31
_V5: Final = MqttVersion.V5


def _v5_properties(properties: MqttProperties, kind: MqttPacketType, v5: bool) -> bytes:
    """The property block under v5; under 3.1.1 nothing, and properties are refused."""
    if v5:
        return encode_properties(properties, kind)
    _no_v5_fields(properties, kind.name)
    return b""


def _no_v5_fields(properties: MqttProperties, what: str) -> None:
    if properties is not NO_PROPERTIES and not properties.is_empty():
        raise local_error(f"{what} properties need MQTT 5")


def _check_version(version: MqttVersion) -> bool:
    """True for v5; raise for an unknown version."""
    if version not in VERSIONS:
        raise local_error(f"unknown protocol version {version!r}")
    return version == _V5


def _qos(value: int, what: str) -> int:
    if value not in (0, 1, 2) or not isinstance(value, int):
        raise local_error(f"{what} QoS must be 0, 1 or 2, not {value!r}")
    return value


def _encode_connect(packet: Connect, version: MqttVersion) -> bytes:
    v5 = _check_version(version)
    flags = 0x02 if packet.clean_start else 0
    will = packet.will
    if will is not None:
        flags |= 0x04 | _qos(will.qos, "Will") << 3 | (0x20 if will.retain else 0)
    if packet.username is not None:
        flags |= 0x80
    if packet.password is not None:
        if packet.username is None and not v5:
            raise local_error(
                "a 3.1.1 CONNECT cannot carry a password without a user name (MQTT-3.1.2-22)"
            )
        flags |= 0x40
    parts = [
        b"\x00\x06MQIsdp\x03" if version == _V31 else b"\x00\x04MQTT" + bytes((version,)),
        bytes((flags,)),
        encode_u16(packet.keep_alive, "keep_alive"),
    ]
    if v5:
        properties = packet.properties
        if properties.authentication_data is not None and properties.authentication_method is None:
            raise local_error("authentication data without a method (v5 §3.1.2.11.10)")
        parts.append(encode_properties(properties, MqttPacketType.CONNECT))
    else:
        _no_v5_fields(packet.properties, "CONNECT")
    parts.append(encode_string(packet.client_id, "client_id"))
    if will is not None:
        if v5:
            parts.append(encode_properties(will.properties, WILL_PROPERTIES))
        else:
            _no_v5_fields(will.properties, "Will")
        if not will.topic or "+" in will.topic or "#" in will.topic:
            raise local_error("the will topic must be a topic name without wildcards")
        parts.append(encode_string(will.topic, "will topic"))
        parts.append(encode_binary(will.payload, "will payload"))
    if packet.username is not None:
        parts.append(encode_string(packet.username, "username"))
    if packet.password is not None:
        parts.append(encode_binary(packet.password, "password"))
    return frame(0x10, b"".join(parts))


def _encode_connack(packet: Connack, version: MqttVersion) -> bytes:
    v5 = _check_version(version)
    code = packet.reason_code
    if v5:
        if code not in CONNACK_REASON_CODES:
            raise local_error(f"0x{code:02X} is not a CONNACK reason code (v5 MQTT-3.2.2-8)")
    elif code not in range(6):
        raise local_error(f"3.1.1 CONNACK return codes are 0..5, not {code}")
    if packet.session_present and code:
        raise local_error("session_present must be 0 with a refusal (MQTT-3.2.2-4)")
    head = bytes((1 if packet.session_present else 0, code))
    if v5:
        return frame(0x20, head + encode_properties(packet.properties, MqttPacketType.CONNACK))
    _no_v5_fields(packet.properties, "CONNACK")
    return b"\x20\x02" + head


# Length-prefixed wire form of topics already validated for PUBLISH: egress sends the same
# topics over and over. Bounded like the decoder's cache.
_ENCODED_TOPICS: Final[dict[str, bytes]] = {}


def _encoded_topic(topic: str) -> bytes:
    """The length-prefixed UTF-8 of a PUBLISH topic name, checked (empty allowed)."""
    if not isinstance(topic, str):
        raise local_error("the PUBLISH topic must be a str")
    if "+" in topic or "#" in topic:
        raise local_error(f"wildcard in PUBLISH topic {topic!r} (MQTT-3.3.2-2)")
    if "\x00" in topic:
        raise local_error("U+0000 in the PUBLISH topic (MQTT-1.5.3-2)")
    try:
        raw = topic.encode("utf-8")
    except UnicodeEncodeError:
        raise local_error("surrogate in the PUBLISH topic (MQTT-1.5.3-1)") from None
    if len(raw) > 0xFFFF:
        raise local_error("the PUBLISH topic is longer than 65535 bytes")
    encoded = U16.pack(len(raw)) + raw
    if len(raw) <= TOPIC_CACHE_KEY_BYTES:
        if len(_ENCODED_TOPICS) >= TOPIC_CACHE_ENTRIES:
            _ENCODED_TOPICS.clear()
        _ENCODED_TOPICS[topic] = encoded
    return encoded


def _encode_publish(packet: Publish, version: MqttVersion) -> bytes:
    if version not in VERSIONS:
        raise local_error(f"unknown protocol version {version!r}")
    topic = packet.topic
    encoded_topic = _ENCODED_TOPICS.get(topic) if type(topic) is str else None
    if encoded_topic is None:
        encoded_topic = _encoded_topic(topic)
    properties = packet.properties
    if len(encoded_topic) == 2 and not (version == _V5 and properties.topic_alias):
        raise local_error("empty PUBLISH topic without a v5 topic alias (MQTT-4.7.3-1)")
    qos = packet.qos
    packet_id = packet.packet_id
    if qos in (1, 2):
        if type(packet_id) is not int or not 0 < packet_id <= 0xFFFF:
            raise local_error(f"PUBLISH packet identifier {packet_id!r} is outside 1..65535")
        flags = 0x38 | qos << 1 if packet.dup else 0x30 | qos << 1
        id_bytes = U16.pack(packet_id)
    elif qos == 0:
        if packet_id:
            raise local_error("a QoS 0 PUBLISH has no packet identifier (MQTT-2.3.1-5)")
        if packet.dup:
            raise local_error("a QoS 0 PUBLISH must not set DUP (MQTT-3.3.1-2)")
        flags = 0x30
        id_bytes = b""
    else:
        raise local_error(f"PUBLISH QoS must be 0, 1 or 2, not {qos!r}")
    if packet.retain:
        flags |= 0x01
    if version == _V5:
        props = (
            b"\x00"
            if properties is NO_PROPERTIES
            else encode_properties(properties, MqttPacketType.PUBLISH)
        )
    else:
        _no_v5_fields(properties, "PUBLISH")
        props = b""
    payload = packet.payload
    size = len(encoded_topic) + len(id_bytes) + len(props) + len(payload)
    if size < 0x80:
        header = bytes((flags, size))
    elif size < 0x4000:
        header = bytes((flags, size & 0x7F | 0x80, size >> 7))
    elif size > MAX_REMAINING_LENGTH:
        raise local_error(f"PUBLISH of {size} bytes exceeds the MQTT maximum")
    else:
        header = bytes((flags,)) + encode_vbi(size)
    return b"".join((header, encoded_topic, id_bytes, props, payload))


def _make_ack_encoder(
    kind: MqttPacketType, first: int, allowed: frozenset[int]
) -> Callable[[Puback | Pubrec | Pubrel | Pubcomp, MqttVersion], bytes]:
    name = kind.name

    def encode_ack(packet: Puback | Pubrec | Pubrel | Pubcomp, version: MqttVersion) -> bytes:
        packet_id = packet.packet_id
        if not isinstance(packet_id, int) or not 0 < packet_id <= 0xFFFF:
            raise local_error(f"{name} packet identifier {packet_id!r} is outside 1..65535")
        code = packet.reason_code
        properties = packet.properties
        if code == 0 and (properties is NO_PROPERTIES or properties.is_empty()):
            if version not in VERSIONS:
                raise local_error(f"unknown protocol version {version!r}")
            return _PUBACK.pack(first, 2, packet_id)
        if not _check_version(version):
            if code:
                raise local_error(f"a 3.1.1 {name} has no reason code")
            _no_v5_fields(properties, name)
            return _PUBACK.pack(first, 2, packet_id)
        if code not in allowed:
            raise local_error(f"0x{code:02X} is not a {name} reason code")
        body = U16.pack(packet_id) + bytes((code,))
        if not properties.is_empty():
            body += encode_properties(properties, kind)
        return frame(first, body)

    return encode_ack


def encode_mqtt_puback(packet_id: int) -> bytes:
    """A PUBACK with Success and no properties (valid in 3.1.1 and v5): the hot-path ack.

    Same bytes as ``encode_mqtt(Puback(packet_id), version)`` without building the packet object.
    Raises ``MqttLocalProtocolError`` if ``packet_id`` is not 1..65535.
    """
    if not 0 < packet_id <= 0xFFFF:
        raise local_error(f"PUBACK packet identifier {packet_id!r} is outside 1..65535")
    return _PUBACK.pack(0x40, 2, packet_id)


def _encode_subscribe(packet: Subscribe, version: MqttVersion) -> bytes:
    v5 = _check_version(version)
    if not packet.subscriptions:
        raise local_error("a SUBSCRIBE needs at least one subscription (MQTT-3.8.3-3)")
    parts = [packet_id_bytes(packet.packet_id, "SUBSCRIBE")]
    parts.append(_v5_properties(packet.properties, MqttPacketType.SUBSCRIBE, v5))
    for sub in packet.subscriptions:
        try:
            validate_mqtt_topic_filter(sub.topic_filter)
        except InvalidMqttTopicError as error:
            raise local_error(str(error)) from None
        options = _qos(sub.qos, "subscription")
        if sub.no_local:
            options |= 0x04
        if sub.retain_as_published:
            options |= 0x08
        if sub.retain_handling not in (0, 1, 2):
            raise local_error(f"retain_handling must be 0, 1 or 2, not {sub.retain_handling!r}")
        options |= sub.retain_handling << 4
        if not v5 and options > 3:
            raise local_error("3.1.1 subscriptions carry only a QoS")
        if sub.no_local and sub.topic_filter.startswith("$share/"):
            raise local_error("No Local on a shared subscription (v5 MQTT-3.8.3-4)")
        parts.append(encode_string(sub.topic_filter, "topic filter"))
        parts.append(bytes((options,)))
    return frame(0x82, b"".join(parts))


def _encode_suback(packet: Suback, version: MqttVersion) -> bytes:
    v5 = _check_version(version)
    codes = packet.reason_codes
    if not codes:
        raise local_error("a SUBACK needs at least one code")
    allowed = SUBACK_REASON_CODES if v5 else SUBACK_RETURN_CODES_V311
    for code in codes:
        if code not in allowed:
            raise local_error(f"0x{code:02X} is not a SUBACK code (MQTT-3.9.3-2)")
    head = packet_id_bytes(packet.packet_id, "SUBACK")
    head += _v5_properties(packet.properties, MqttPacketType.SUBACK, v5)
    return frame(0x90, head + bytes(codes))


def _encode_unsubscribe(packet: Unsubscribe, version: MqttVersion) -> bytes:
    v5 = _check_version(version)
    if not packet.topic_filters:
        raise local_error("an UNSUBSCRIBE needs at least one topic filter (MQTT-3.10.3-2)")
    parts = [packet_id_bytes(packet.packet_id, "UNSUBSCRIBE")]
    parts.append(_v5_properties(packet.properties, MqttPacketType.UNSUBSCRIBE, v5))
    for topic_filter in packet.topic_filters:
        try:
            validate_mqtt_topic_filter(topic_filter)
        except InvalidMqttTopicError as error:
            raise local_error(str(error)) from None
        parts.append(encode_string(topic_filter, "topic filter"))
    return frame(0xA2, b"".join(parts))


def _encode_unsuback(packet: Unsuback, version: MqttVersion) -> bytes:
    v5 = _check_version(version)
    head = packet_id_bytes(packet.packet_id, "UNSUBACK")
    if not v5:
        if packet.reason_codes:
            raise local_error("a 3.1.1 UNSUBACK carries no reason codes")
        _no_v5_fields(packet.properties, "UNSUBACK")
        return b"\xb0\x02" + head
    if not packet.reason_codes:
        raise local_error("a v5 UNSUBACK needs one reason code per topic filter")
    for code in packet.reason_codes:
        if code not in UNSUBACK_REASON_CODES:
            raise local_error(f"0x{code:02X} is not an UNSUBACK reason code")
    props = encode_properties(packet.properties, MqttPacketType.UNSUBACK)
    return frame(0xB0, head + props + bytes(packet.reason_codes))


def _encode_pingreq(packet: Pingreq, version: MqttVersion) -> bytes:
    _check_version(version)
    return b"\xc0\x00"


def _encode_pingresp(packet: Pingresp, version: MqttVersion) -> bytes:
    _check_version(version)
    return b"\xd0\x00"


def _encode_tail(
    first: int,
    kind: MqttPacketType,
    code: int,
    properties: MqttProperties,
    allowed: frozenset[int],
) -> bytes:
    """DISCONNECT and AUTH in v5: reason code and properties, each omitted when it can be."""
    if code not in allowed:
        raise local_error(f"0x{code:02X} is not a {kind.name} reason code")
    if properties.is_empty():
        return bytes((first, 0)) if code == 0 else bytes((first, 1, code))
    return frame(first, bytes((code,)) + encode_properties(properties, kind))


def _encode_disconnect(packet: Disconnect, version: MqttVersion) -> bytes:
    if not _check_version(version):
        if packet.reason_code:
            raise local_error("a 3.1.1 DISCONNECT has no reason code")
        _no_v5_fields(packet.properties, "DISCONNECT")
        return b"\xe0\x00"
    return _encode_tail(
        0xE0,
        MqttPacketType.DISCONNECT,
        packet.reason_code,
        packet.properties,
        DISCONNECT_REASON_CODES,
    )


def _encode_auth(packet: Auth, version: MqttVersion) -> bytes:
    if not _check_version(version):
        raise local_error("AUTH exists only in MQTT 5")
    return _encode_tail(
        0xF0, MqttPacketType.AUTH, packet.reason_code, packet.properties, AUTH_REASON_CODES
    )


# Any: each encoder takes its own packet class; the dict lookup by type() guarantees the match.
_ENCODERS: Final[dict[type, Callable[[Any, MqttVersion], bytes]]] = {
    Connect: _encode_connect,
    Connack: _encode_connack,
    Publish: _encode_publish,
    Puback: _make_ack_encoder(MqttPacketType.PUBACK, 0x40, PUBACK_REASON_CODES),
    Pubrec: _make_ack_encoder(MqttPacketType.PUBREC, 0x50, PUBREC_REASON_CODES),
    Pubrel: _make_ack_encoder(MqttPacketType.PUBREL, 0x62, PUBREL_REASON_CODES),
    Pubcomp: _make_ack_encoder(MqttPacketType.PUBCOMP, 0x70, PUBCOMP_REASON_CODES),
    Subscribe: _encode_subscribe,
    Suback: _encode_suback,
    Unsubscribe: _encode_unsubscribe,
    Unsuback: _encode_unsuback,
    Pingreq: _encode_pingreq,
    Pingresp: _encode_pingresp,
    Disconnect: _encode_disconnect,
    Auth: _encode_auth,
}


def encode_mqtt(packet: MqttPacket, version: MqttVersion) -> bytes:
    """The wire bytes of ``packet`` under protocol ``version``.

    Raises ``MqttLocalProtocolError`` when the packet is not valid MQTT for that version: a
    field out of range, a v5-only field set under 3.1.1, a property the packet type may not carry,
    a wildcard in a PUBLISH topic, an invalid subscription filter. The encoder never checks the
    peer's Maximum Packet Size: compare ``len()`` of the result with it (v5 MQTT-3.1.2-24).
    """
    encoder = _ENCODERS.get(type(packet))
    if encoder is None:
        raise local_error(f"not an MQTT packet: {packet!r}")
    return encoder(packet, version)
