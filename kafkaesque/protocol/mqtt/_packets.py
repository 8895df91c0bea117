"""MQTT 3.1.1 and 5.0 control packets as values: frozen dataclasses, reason codes, properties.

This module only describes packets; the codec (``_decoder``, ``_encoder``) turns them into bytes
and back. One set of classes serves both protocol versions: a field that a version cannot carry
keeps its default (``NO_PROPERTIES``, reason code 0, no subscribe options) and the encoder refuses
to drop a value it cannot express (``MqttLocalProtocolError``) instead of losing it silently.

Conventions shared by every packet:

* ``packet_id`` is 1..65535; ``Publish.packet_id`` is 0 exactly when QoS is 0 (the packet has no
  identifier then, MQTT-2.3.1-5, and 0 is never a valid identifier, MQTT-2.3.1-1).
* ``reason_code`` is an ``int``; the names are in ``MqttReasonCode``. Under 3.1.1 the CONNACK
  field is the 3.1.1 *return code* (0..5) and SUBACK carries granted QoS or 0x80;
  ``v311_connack_code`` maps a v5 reason code to the 3.1.1 return code.
* The protocol level is not a field of ``Connect``: it is the ``version`` argument of
  ``encode_mqtt`` and ``MqttDecoder.version`` once the CONNECT is read.

The packet classes are frozen but not slotted, on purpose: the decoder's hot path builds
``Publish``/``Puback``/``MqttProperties`` by installing their ``__dict__`` in one step, which costs
less than half of a frozen dataclass ``__init__`` (one ``object.__setattr__`` per field).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields
from enum import IntEnum
from typing import Final


class MqttVersion(IntEnum):
    """The protocol level byte of CONNECT: 3 = MQTT 3.1 (``MQIsdp``), 4 = 3.1.1, 5 = 5.0."""

    V31 = 3
    V311 = 4
    V5 = 5


class MqttPacketType(IntEnum):
    """Control packet types: the high nibble of the fixed header's first byte."""

    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14
    AUTH = 15


class MqttReasonCode(IntEnum):
    """MQTT 5.0 reason codes (v5 §2.4). Codes below 0x80 succeed; 0x80 and above fail.

    Several names share a value (0x00 is Success, Normal disconnection and Granted QoS 0); the
    enum keeps the first name and the others are aliases.
    """

    SUCCESS = 0x00
    NORMAL_DISCONNECTION = 0x00
    GRANTED_QOS_0 = 0x00
    GRANTED_QOS_1 = 0x01
    GRANTED_QOS_2 = 0x02
    DISCONNECT_WITH_WILL_MESSAGE = 0x04
    NO_MATCHING_SUBSCRIBERS = 0x10
    NO_SUBSCRIPTION_EXISTED = 0x11
    CONTINUE_AUTHENTICATION = 0x18
    RE_AUTHENTICATE = 0x19
    UNSPECIFIED_ERROR = 0x80
    MALFORMED_PACKET = 0x81
    PROTOCOL_ERROR = 0x82
    IMPLEMENTATION_SPECIFIC_ERROR = 0x83
    UNSUPPORTED_PROTOCOL_VERSION = 0x84
    CLIENT_IDENTIFIER_NOT_VALID = 0x85
    BAD_USER_NAME_OR_PASSWORD = 0x86
    NOT_AUTHORIZED = 0x87
    SERVER_UNAVAILABLE = 0x88
    SERVER_BUSY = 0x89
    BANNED = 0x8A
    SERVER_SHUTTING_DOWN = 0x8B
    BAD_AUTHENTICATION_METHOD = 0x8C
    KEEP_ALIVE_TIMEOUT = 0x8D
    SESSION_TAKEN_OVER = 0x8E
    TOPIC_FILTER_INVALID = 0x8F
    TOPIC_NAME_INVALID = 0x90
    PACKET_IDENTIFIER_IN_USE = 0x91
    PACKET_IDENTIFIER_NOT_FOUND = 0x92
    RECEIVE_MAXIMUM_EXCEEDED = 0x93
    TOPIC_ALIAS_INVALID = 0x94
    PACKET_TOO_LARGE = 0x95
    MESSAGE_RATE_TOO_HIGH = 0x96
    QUOTA_EXCEEDED = 0x97
    ADMINISTRATIVE_ACTION = 0x98
    PAYLOAD_FORMAT_INVALID = 0x99
    RETAIN_NOT_SUPPORTED = 0x9A
    QOS_NOT_SUPPORTED = 0x9B
    USE_ANOTHER_SERVER = 0x9C
    SERVER_MOVED = 0x9D
    SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
    CONNECTION_RATE_EXCEEDED = 0x9F
    MAXIMUM_CONNECT_TIME = 0xA0
    SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1
    WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2


class ConnackReturnCode(IntEnum):
    """MQTT 3.1.1 CONNACK return codes (§3.2.2.3); 6..255 are reserved."""

    ACCEPTED = 0x00
    UNACCEPTABLE_PROTOCOL_VERSION = 0x01
    IDENTIFIER_REJECTED = 0x02
    SERVER_UNAVAILABLE = 0x03
    BAD_USER_NAME_OR_PASSWORD = 0x04
    NOT_AUTHORIZED = 0x05


SUBACK_FAILURE_V311: Final = 0x80
"""The 3.1.1 SUBACK return code for a refused subscription (MQTT-3.9.3-2)."""

# Which v5 reason codes each packet may carry (the tables of v5 §3.x.2). Receiving another one is
# a malformed packet; sending one is a local error.
_C = MqttReasonCode
CONNACK_REASON_CODES: Final = frozenset(
    {
        _C.SUCCESS,
        *range(0x80, 0x8B),  # 0x80..0x8A
        _C.BAD_AUTHENTICATION_METHOD,
        _C.TOPIC_NAME_INVALID,
        _C.PACKET_TOO_LARGE,
        _C.QUOTA_EXCEEDED,
        _C.PAYLOAD_FORMAT_INVALID,
        _C.RETAIN_NOT_SUPPORTED,
        _C.QOS_NOT_SUPPORTED,
        _C.USE_ANOTHER_SERVER,
        _C.SERVER_MOVED,
        _C.CONNECTION_RATE_EXCEEDED,
    }
)
PUBACK_REASON_CODES: Final = frozenset(
    {
        _C.SUCCESS,
        _C.NO_MATCHING_SUBSCRIBERS,
        _C.UNSPECIFIED_ERROR,
        _C.IMPLEMENTATION_SPECIFIC_ERROR,
        _C.NOT_AUTHORIZED,
        _C.TOPIC_NAME_INVALID,
        _C.PACKET_IDENTIFIER_IN_USE,
        _C.QUOTA_EXCEEDED,
        _C.PAYLOAD_FORMAT_INVALID,
    }
)
PUBREC_REASON_CODES: Final = PUBACK_REASON_CODES
PUBREL_REASON_CODES: Final = frozenset({_C.SUCCESS, _C.PACKET_IDENTIFIER_NOT_FOUND})
PUBCOMP_REASON_CODES: Final = PUBREL_REASON_CODES
SUBACK_REASON_CODES: Final = frozenset(
    {
        _C.GRANTED_QOS_0,
        _C.GRANTED_QOS_1,
        _C.GRANTED_QOS_2,
        _C.UNSPECIFIED_ERROR,
        _C.IMPLEMENTATION_SPECIFIC_ERROR,
        _C.NOT_AUTHORIZED,
        _C.TOPIC_FILTER_INVALID,
        _C.PACKET_IDENTIFIER_IN_USE,
        _C.QUOTA_EXCEEDED,
        _C.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED,
        _C.SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED,
        _C.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED,
    }
)
UNSUBACK_REASON_CODES: Final = frozenset(
    {
        _C.SUCCESS,
        _C.NO_SUBSCRIPTION_EXISTED,
        _C.UNSPECIFIED_ERROR,
        _C.IMPLEMENTATION_SPECIFIC_ERROR,
        _C.NOT_AUTHORIZED,
        _C.TOPIC_FILTER_INVALID,
        _C.PACKET_IDENTIFIER_IN_USE,
    }
)
DISCONNECT_REASON_CODES: Final = frozenset(
    {
        _C.NORMAL_DISCONNECTION,
        _C.DISCONNECT_WITH_WILL_MESSAGE,
        *range(0x80, 0x84),  # 0x80..0x83
        _C.NOT_AUTHORIZED,
        _C.SERVER_BUSY,
        *range(0x8B, 0xA3),  # 0x8B..0xA2
    }
)
AUTH_REASON_CODES: Final = frozenset({_C.SUCCESS, _C.CONTINUE_AUTHENTICATION, _C.RE_AUTHENTICATE})
SUBACK_RETURN_CODES_V311: Final = frozenset({0x00, 0x01, 0x02, SUBACK_FAILURE_V311})
del _C

# v5 reason code -> 3.1.1 CONNACK return code, for the refusals 3.1.1 can express (§3.2.2.3).
_V311_CONNACK: Final[dict[int, ConnackReturnCode]] = {
    MqttReasonCode.SUCCESS: ConnackReturnCode.ACCEPTED,
    MqttReasonCode.UNSUPPORTED_PROTOCOL_VERSION: ConnackReturnCode.UNACCEPTABLE_PROTOCOL_VERSION,
    MqttReasonCode.CLIENT_IDENTIFIER_NOT_VALID: ConnackReturnCode.IDENTIFIER_REJECTED,
    MqttReasonCode.SERVER_UNAVAILABLE: ConnackReturnCode.SERVER_UNAVAILABLE,
    MqttReasonCode.SERVER_BUSY: ConnackReturnCode.SERVER_UNAVAILABLE,
    MqttReasonCode.BAD_USER_NAME_OR_PASSWORD: ConnackReturnCode.BAD_USER_NAME_OR_PASSWORD,
    MqttReasonCode.NOT_AUTHORIZED: ConnackReturnCode.NOT_AUTHORIZED,
    MqttReasonCode.BANNED: ConnackReturnCode.NOT_AUTHORIZED,
    MqttReasonCode.BAD_AUTHENTICATION_METHOD: ConnackReturnCode.NOT_AUTHORIZED,
}


def v311_connack_code(reason_code: int) -> ConnackReturnCode | None:
    """The 3.1.1 CONNACK return code for a v5 ``reason_code``, or None if 3.1.1 has none.

    None means "close without a CONNACK", which is what 3.1.1 asks for a malformed CONNECT
    (MQTT-3.1.4-1) and for a refusal none of its return codes describes (MQTT-3.2.2-6).
    """
    return _V311_CONNACK.get(reason_code)


@dataclass(frozen=True, repr=False)
class MqttProperties:
    """The MQTT 5.0 properties of one packet (v5 §2.2.2.2); all absent by default.

    ``None`` (or an empty tuple) means "absent", which is not the same as the property's default
    value: the broker applies the spec's defaults. Only User Property and Subscription Identifier
    may repeat; their order is kept (MQTT-3.3.2-18). Which packet may carry which property is
    checked by the codec, not here. Use ``NO_PROPERTIES`` rather than ``MqttProperties()``: the
    codec recognises that instance without looking at its fields.
    """

    payload_format_indicator: int | None = None  # 0x01 byte: 0 bytes, 1 UTF-8
    message_expiry_interval: int | None = None  # 0x02 four-byte, seconds
    content_type: str | None = None  # 0x03
    response_topic: str | None = None  # 0x08
    correlation_data: bytes | None = None  # 0x09
    subscription_identifiers: tuple[int, ...] = ()  # 0x0B VBI; one in SUBSCRIBE, several in PUBLISH
    session_expiry_interval: int | None = None  # 0x11 four-byte, seconds
    assigned_client_identifier: str | None = None  # 0x12
    server_keep_alive: int | None = None  # 0x13 two-byte, seconds
    authentication_method: str | None = None  # 0x15
    authentication_data: bytes | None = None  # 0x16
    request_problem_information: int | None = None  # 0x17 byte 0/1
    will_delay_interval: int | None = None  # 0x18 four-byte, seconds
    request_response_information: int | None = None  # 0x19 byte 0/1
    response_information: str | None = None  # 0x1A
    server_reference: str | None = None  # 0x1C
    reason_string: str | None = None  # 0x1F
    receive_maximum: int | None = None  # 0x21 two-byte, not 0
    topic_alias_maximum: int | None = None  # 0x22 two-byte
    topic_alias: int | None = None  # 0x23 two-byte, not 0
    maximum_qos: int | None = None  # 0x24 byte 0/1
    retain_available: int | None = None  # 0x25 byte 0/1
    user_properties: tuple[tuple[str, str], ...] = ()  # 0x26 string pairs, may repeat
    maximum_packet_size: int | None = None  # 0x27 four-byte, not 0
    wildcard_subscription_available: int | None = None  # 0x28 byte 0/1
    subscription_identifier_available: int | None = None  # 0x29 byte 0/1
    shared_subscription_available: int | None = None  # 0x2A byte 0/1

    def __repr__(self) -> str:
        present = ", ".join(
            f"{name}={value!r}" for name, value in vars(self).items() if value not in (None, ())
        )
        return f"MqttProperties({present})"

    def is_empty(self) -> bool:
        """True when no property is present (the packet encodes a property length of 0)."""
        return self is NO_PROPERTIES or all(v is None or v == () for v in vars(self).values())


NO_PROPERTIES: Final = MqttProperties()
"""The shared "no properties" value; every decoded packet without properties carries it."""

PROPERTY_FIELDS: Final = tuple(f.name for f in fields(MqttProperties))


@dataclass(frozen=True)
class Will:
    """The Will Message of a CONNECT (published when the connection ends abnormally)."""

    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: MqttProperties = NO_PROPERTIES  # v5 Will Properties


@dataclass(frozen=True)
class MqttSubscription:
    """One topic filter of a SUBSCRIBE with its options (v5 §3.8.3.1; 3.1.1 has only ``qos``).

    ``retain_handling``: 0 send retained messages on subscribe, 1 only if the subscription is
    new, 2 never. ``identifier``: the v5 Subscription Identifier of the SUBSCRIBE that made it
    (0: none), which the server returns with every message the subscription matches; it is a
    property of the whole packet, so the codec leaves it 0 and the server sets it.
    """

    topic_filter: str
    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0
    identifier: int = 0


@dataclass(frozen=True)
class Connect:
    """CONNECT (client to server, the first packet of a connection, MQTT-3.1.0-1).

    ``clean_start`` is 3.1.1's CleanSession. ``password`` without ``username`` is valid only in
    v5 (MQTT-3.1.2-22).
    """

    client_id: str
    clean_start: bool = True
    keep_alive: int = 0
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    properties: MqttProperties = NO_PROPERTIES


@dataclass(frozen=True)
class Connack:
    """CONNACK: ``reason_code`` is a v5 reason code, or a 3.1.1 ``ConnackReturnCode``."""

    session_present: bool = False
    reason_code: int = 0
    properties: MqttProperties = NO_PROPERTIES


@dataclass(frozen=True)
class Publish:
    """PUBLISH (both directions). ``packet_id`` is 0 for QoS 0 and 1..65535 otherwise.

    ``topic`` may be empty only in v5 with a ``properties.topic_alias`` (v5 §3.3.2.3.4).
    """

    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int = 0
    properties: MqttProperties = NO_PROPERTIES


@dataclass(frozen=True)
class Puback:
    """PUBACK: acknowledges a QoS 1 PUBLISH. Reason codes and properties exist in v5 only."""

    packet_id: int
    reason_code: int = 0
    properties: MqttProperties = NO_PROPERTIES


@dataclass(frozen=True)
class Pubrec:
    """PUBREC: first answer to a QoS 2 PUBLISH."""

    packet_id: int
    reason_code: int = 0
    properties: MqttProperties = NO_PROPERTIES


@dataclass(frozen=True)
class Pubrel:
    """PUBREL: releases a QoS 2 packet identifier (fixed-header flags 0010, MQTT-3.6.1-1)."""

    packet_id: int
    reason_code: int = 0
    properties: MqttProperties = NO_PROPERTIES


@dataclass(frozen=True)
class Pubcomp:
    """PUBCOMP: completes a QoS 2 exchange."""

    packet_id: int
    reason_code: int = 0
    properties: MqttProperties = NO_PROPERTIES


@dataclass(frozen=True)
class Subscribe:
    """SUBSCRIBE (client to server): at least one subscription (MQTT-3.8.3-3).

    Filters are *not* validated by the decoder: the server answers an invalid one per filter
    (SUBACK 0x80 in 3.1.1, 0x8F in v5) with ``_topics.validate_mqtt_topic_filter``.
    """

    packet_id: int
    subscriptions: tuple[MqttSubscription, ...]
    properties: MqttProperties = NO_PROPERTIES


@dataclass(frozen=True)
class Suback:
    """SUBACK: one code per subscription, in order (MQTT-3.9.3-1)."""

    packet_id: int
    reason_codes: tuple[int, ...]
    properties: MqttProperties = NO_PROPERTIES


@dataclass(frozen=True)
class Unsubscribe:
    """UNSUBSCRIBE (client to server): at least one topic filter (MQTT-3.10.3-2)."""

    packet_id: int
    topic_filters: tuple[str, ...]
    properties: MqttProperties = NO_PROPERTIES


@dataclass(frozen=True)
class Unsuback:
    """UNSUBACK: v5 carries one reason code per filter; 3.1.1 carries none (empty tuple)."""

    packet_id: int
    reason_codes: tuple[int, ...] = ()
    properties: MqttProperties = NO_PROPERTIES


@dataclass(frozen=True)
class Pingreq:
    """PINGREQ (client to server)."""


@dataclass(frozen=True)
class Pingresp:
    """PINGRESP (server to client)."""


@dataclass(frozen=True)
class Disconnect:
    """DISCONNECT: client to server in 3.1.1; both ways in v5, with a reason code."""

    reason_code: int = 0
    properties: MqttProperties = NO_PROPERTIES


@dataclass(frozen=True)
class Auth:
    """AUTH (v5 only): enhanced authentication exchange."""

    reason_code: int = 0
    properties: MqttProperties = NO_PROPERTIES


MqttPacket = (
    Connect
    | Connack
    | Publish
    | Puback
    | Pubrec
    | Pubrel
    | Pubcomp
    | Subscribe
    | Suback
    | Unsubscribe
    | Unsuback
    | Pingreq
    | Pingresp
    | Disconnect
    | Auth
)
"""Any MQTT control packet."""

PACKET_TYPES: Final[dict[type[MqttPacket], MqttPacketType]] = {
    Connect: MqttPacketType.CONNECT,
    Connack: MqttPacketType.CONNACK,
    Publish: MqttPacketType.PUBLISH,
    Puback: MqttPacketType.PUBACK,
    Pubrec: MqttPacketType.PUBREC,
    Pubrel: MqttPacketType.PUBREL,
    Pubcomp: MqttPacketType.PUBCOMP,
    Subscribe: MqttPacketType.SUBSCRIBE,
    Suback: MqttPacketType.SUBACK,
    Unsubscribe: MqttPacketType.UNSUBSCRIBE,
    Unsuback: MqttPacketType.UNSUBACK,
    Pingreq: MqttPacketType.PINGREQ,
    Pingresp: MqttPacketType.PINGRESP,
    Disconnect: MqttPacketType.DISCONNECT,
    Auth: MqttPacketType.AUTH,
}
"""Packet class -> its control packet type."""


class MqttNeedData(enum.Enum):
    """The type of ``MQTT_NEED_DATA``: the decoder holds no complete packet yet."""

    MQTT_NEED_DATA = enum.auto()


MQTT_NEED_DATA: Final = MqttNeedData.MQTT_NEED_DATA
"""Returned by ``MqttDecoder.next_packet`` until a whole packet has been fed (as in h11)."""


class MqttError(Exception):
    """Base of the MQTT codec's errors."""


class MqttProtocolError(MqttError):
    """The peer broke the protocol: close the connection (after a DISCONNECT in v5).

    ``reason_code`` is the v5 reason code to send (in DISCONNECT, or in CONNACK while the
    CONNECT is being read): 0x81 Malformed Packet, 0x82 Protocol Error, 0x95 Packet Too Large,
    0x84 Unsupported Protocol Version... ``statement`` names the normative statement
    (``MQTT-x.y.z-n``, 3.1.1 numbering unless marked v5) or spec section that was broken; the
    message starts with it.
    """

    def __init__(self, reason_code: int, statement: str, detail: str) -> None:
        super().__init__(f"{statement} {detail}")
        self.reason_code = MqttReasonCode(reason_code)
        self.statement = statement
        self.detail = detail


class MqttUnsupportedProtocolError(MqttProtocolError):
    """CONNECT named a protocol name or level this codec does not speak (MQTT-3.1.2-1/-2).

    The server answers a level it does not support with CONNACK return code 0x01 in the 3.1.1
    format (``encode_mqtt(Connack(reason_code=ConnackReturnCode.UNACCEPTABLE_PROTOCOL_VERSION),
    MqttVersion.V311)``) and closes; a wrong protocol name may simply be closed.
    """

    def __init__(self, protocol_name: str, protocol_level: int, detail: str) -> None:
        statement = "MQTT-3.1.2-2" if protocol_name in {"MQTT", "MQIsdp"} else "MQTT-3.1.2-1"
        super().__init__(MqttReasonCode.UNSUPPORTED_PROTOCOL_VERSION, statement, detail)
        self.protocol_name = protocol_name
        self.protocol_level = protocol_level


class MqttLocalProtocolError(MqttError, ValueError):
    """We (the caller) asked to encode a packet that is not valid MQTT for that version."""
