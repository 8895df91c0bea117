"""The readers of the packets ``MqttDecoder`` does not decode inline: all but CONNECT (it fixes
the decoder's version), PUBLISH and the short PUBACK (the hot path). ``PACKET_DECODERS`` maps a
packet type to its reader; each checks the packet against the spec and raises the
``MqttProtocolError`` that names the statement it breaks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

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
    Disconnect,
    MqttPacket,
    MqttPacketType,
    MqttSubscription,
    Pingreq,
    Pingresp,
    Puback,
    Pubcomp,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
)
from ._properties import read_properties
from ._wire import Reader, malformed, protocol_error


def _check_reason(code: int, allowed: frozenset[int], statement: str, what: str) -> int:
    if code not in allowed:
        raise malformed(statement, f"reason code 0x{code:02X} is not valid in {what}")
    return code


def _packet_id(reader: Reader, what: str) -> int:
    packet_id = reader.u16("packet identifier")
    if not packet_id:
        raise malformed("MQTT-2.3.1-1", f"{what} with packet identifier 0")
    return packet_id


def _decode_connack(reader: Reader, v5: bool, server_side: bool) -> Connack:
    ack_flags = reader.u8("connect acknowledge flags")
    if ack_flags & 0xFE:
        raise malformed("§3.2.2.1", "CONNACK reserved flags are set (v5 MQTT-3.2.2-1)")
    code = reader.u8("connect reason code")
    if v5:
        _check_reason(code, CONNACK_REASON_CODES, "v5 MQTT-3.2.2-8", "CONNACK")
        # A 3.1.1-only server answers a v5 CONNECT in the 3.1.1 format (return code 0x01, no
        # property length); accept that so the client can read the refusal.
        properties = (
            read_properties(reader, MqttPacketType.CONNACK) if reader.remaining() else NO_PROPERTIES
        )
    else:
        if code > 5:
            raise malformed("§3.2.2.3", f"reserved CONNACK return code {code}")
        properties = NO_PROPERTIES
    if ack_flags and code:
        raise protocol_error("MQTT-3.2.2-4", "session present with a refusal (v5 MQTT-3.2.2-6)")
    reader.finish("CONNACK")
    return Connack(bool(ack_flags), code, properties)


def _make_ack_decoder(
    cls: type[Puback | Pubrec | Pubrel | Pubcomp],
    kind: MqttPacketType,
    allowed: frozenset[int],
    statement: str,
) -> Callable[[Reader, bool, bool], MqttPacket]:
    def decode(reader: Reader, v5: bool, server_side: bool) -> MqttPacket:
        packet_id = _packet_id(reader, kind.name)
        code = 0
        properties = NO_PROPERTIES
        if v5 and reader.remaining():
            # v5 §3.4.2.1: the reason code (and then the properties) may be omitted.
            code = _check_reason(reader.u8("reason code"), allowed, statement, kind.name)
            if reader.remaining():
                properties = read_properties(reader, kind)
        reader.finish(kind.name)
        return cls(packet_id, code, properties)

    return decode


def _decode_subscribe(reader: Reader, v5: bool, server_side: bool) -> Subscribe:
    packet_id = _packet_id(reader, "SUBSCRIBE")
    properties = read_properties(reader, MqttPacketType.SUBSCRIBE) if v5 else NO_PROPERTIES
    subscriptions = []
    while reader.remaining():
        topic_filter = reader.utf8("topic filter")
        options = reader.u8("subscription options")
        qos = options & 0x03
        if v5:
            if options & 0xC0:
                raise malformed("v5 MQTT-3.8.3-5", "reserved subscription option bits are set")
            if qos == 3:
                raise malformed("v5 §3.8.3.1", "subscription with QoS 3")
            retain_handling = options >> 4 & 0x03
            if retain_handling == 3:
                raise protocol_error("v5 §3.8.3.1", "retain handling 3")
            no_local = bool(options & 0x04)
            if no_local and topic_filter.startswith("$share/"):
                raise protocol_error("v5 MQTT-3.8.3-4", "No Local on a shared subscription")
            subscriptions.append(
                MqttSubscription(topic_filter, qos, no_local, bool(options & 0x08), retain_handling)
            )
        else:
            if options & 0xFC or qos == 3:
                raise malformed(
                    "MQTT-3-8.3-4", f"requested QoS byte 0x{options:02X} (reserved bits or QoS 3)"
                )
            subscriptions.append(MqttSubscription(topic_filter, qos))
    if not subscriptions:
        raise protocol_error("MQTT-3.8.3-3", "SUBSCRIBE without a topic filter (v5 MQTT-3.8.3-2)")
    return Subscribe(packet_id, tuple(subscriptions), properties)


def _decode_suback(reader: Reader, v5: bool, server_side: bool) -> Suback:
    packet_id = _packet_id(reader, "SUBACK")
    properties = read_properties(reader, MqttPacketType.SUBACK) if v5 else NO_PROPERTIES
    codes = tuple(reader.rest())
    if not codes:
        raise malformed("MQTT-3.8.4-5", "SUBACK without a return code")
    allowed = SUBACK_REASON_CODES if v5 else SUBACK_RETURN_CODES_V311
    for code in codes:
        _check_reason(code, allowed, "MQTT-3.9.3-2", "SUBACK")
    return Suback(packet_id, codes, properties)


def _decode_unsubscribe(reader: Reader, v5: bool, server_side: bool) -> Unsubscribe:
    packet_id = _packet_id(reader, "UNSUBSCRIBE")
    properties = read_properties(reader, MqttPacketType.UNSUBSCRIBE) if v5 else NO_PROPERTIES
    filters = []
    while reader.remaining():
        filters.append(reader.utf8("topic filter"))
    if not filters:
        raise protocol_error("MQTT-3.10.3-2", "UNSUBSCRIBE without a topic filter")
    return Unsubscribe(packet_id, tuple(filters), properties)


def _decode_unsuback(reader: Reader, v5: bool, server_side: bool) -> Unsuback:
    packet_id = _packet_id(reader, "UNSUBACK")
    if not v5:
        reader.finish("UNSUBACK")
        return Unsuback(packet_id)
    properties = read_properties(reader, MqttPacketType.UNSUBACK)
    codes = tuple(reader.rest())
    if not codes:
        raise malformed("v5 MQTT-3.11.3-1", "UNSUBACK without a reason code")
    for code in codes:
        _check_reason(code, UNSUBACK_REASON_CODES, "v5 MQTT-3.11.3-2", "UNSUBACK")
    return Unsuback(packet_id, codes, properties)


def _decode_pingreq(reader: Reader, v5: bool, server_side: bool) -> Pingreq:
    reader.finish("PINGREQ")
    return _PINGREQ


def _decode_pingresp(reader: Reader, v5: bool, server_side: bool) -> Pingresp:
    reader.finish("PINGRESP")
    return _PINGRESP


def _decode_disconnect(reader: Reader, v5: bool, server_side: bool) -> Disconnect:
    code = 0
    properties = NO_PROPERTIES
    if v5 and reader.remaining():
        code = _check_reason(
            reader.u8("reason code"), DISCONNECT_REASON_CODES, "v5 MQTT-3.14.2-1", "DISCONNECT"
        )
        if reader.remaining():
            properties = read_properties(reader, MqttPacketType.DISCONNECT)
    reader.finish("DISCONNECT")
    return Disconnect(code, properties)


def _decode_auth(reader: Reader, v5: bool, server_side: bool) -> Auth:
    code = 0
    properties = NO_PROPERTIES
    if reader.remaining():
        code = _check_reason(
            reader.u8("reason code"), AUTH_REASON_CODES, "v5 MQTT-3.15.2-1", "AUTH"
        )
        if reader.remaining():
            properties = read_properties(reader, MqttPacketType.AUTH)
    reader.finish("AUTH")
    return Auth(code, properties)


_PINGREQ: Final = Pingreq()
_PINGRESP: Final = Pingresp()

PACKET_DECODERS: Final[dict[int, Callable[[Reader, bool, bool], MqttPacket]]] = {
    MqttPacketType.CONNACK: _decode_connack,
    MqttPacketType.PUBACK: _make_ack_decoder(
        Puback, MqttPacketType.PUBACK, PUBACK_REASON_CODES, "v5 MQTT-3.4.2-1"
    ),
    MqttPacketType.PUBREC: _make_ack_decoder(
        Pubrec, MqttPacketType.PUBREC, PUBREC_REASON_CODES, "v5 MQTT-3.5.2-1"
    ),
    MqttPacketType.PUBREL: _make_ack_decoder(
        Pubrel, MqttPacketType.PUBREL, PUBREL_REASON_CODES, "v5 MQTT-3.6.2-1"
    ),
    MqttPacketType.PUBCOMP: _make_ack_decoder(
        Pubcomp, MqttPacketType.PUBCOMP, PUBCOMP_REASON_CODES, "v5 MQTT-3.7.2-1"
    ),
    MqttPacketType.SUBSCRIBE: _decode_subscribe,
    MqttPacketType.SUBACK: _decode_suback,
    MqttPacketType.UNSUBSCRIBE: _decode_unsubscribe,
    MqttPacketType.UNSUBACK: _decode_unsuback,
    MqttPacketType.PINGREQ: _decode_pingreq,
    MqttPacketType.PINGRESP: _decode_pingresp,
    MqttPacketType.DISCONNECT: _decode_disconnect,
    MqttPacketType.AUTH: _decode_auth,
}
