"""The v5 properties (§2.2.2.2): one table drives decoding, encoding and validation.

``read_properties`` reads a property block for the decoder and ``encode_properties`` writes one
for the encoder. Both refuse, each in its own terms (the peer's ``MqttProtocolError``, our
``MqttLocalProtocolError``), a property the packet may not carry, a repeated single-valued one,
and a value out of range. The Will Properties of CONNECT are a "packet kind" of their own in
the table: ``WILL_PROPERTIES``.
"""

from __future__ import annotations

from typing import Final

from ._packets import NO_PROPERTIES, PROPERTY_FIELDS, MqttPacketType, MqttProperties
from ._wire import (
    Reader,
    encode_binary,
    encode_string,
    encode_u8,
    encode_u16,
    encode_u32,
    encode_vbi,
    encode_vbi_checked,
    local_error,
    malformed,
    protocol_error,
    truncated,
)

_object_new = object.__new__
_object_setattr = object.__setattr__

_BYTE, _TWO, _FOUR, _VBI, _UTF8, _BINARY, _PAIR = range(7)
# The Will Properties of CONNECT, a "packet kind" of their own in the table.
WILL_PROPERTIES: Final = 0

_T = MqttPacketType
_ACKS: Final = frozenset({_T.PUBACK, _T.PUBREC, _T.PUBREL, _T.PUBCOMP})
_EVERY_PACKET_WITH_PROPERTIES: Final = frozenset(
    {
        WILL_PROPERTIES,
        _T.CONNECT,
        _T.CONNACK,
        _T.PUBLISH,
        *_ACKS,
        _T.SUBSCRIBE,
        _T.SUBACK,
        _T.UNSUBSCRIBE,
        _T.UNSUBACK,
        _T.DISCONNECT,
        _T.AUTH,
    }
)
_MESSAGE: Final = frozenset({_T.PUBLISH, WILL_PROPERTIES})


class _PropertySpec:
    """One row of the property table: identifier, field name, wire type, where it may appear."""

    __slots__ = ("flag", "ident", "name", "nonzero", "packets", "repeat", "wire")

    def __init__(
        self,
        ident: int,
        name: str,
        wire: int,
        packets: frozenset[int],
        *,
        repeat: bool = False,
        flag: bool = False,
        nonzero: bool = False,
    ) -> None:
        self.ident = ident
        self.name = name
        self.wire = wire
        self.packets = packets
        self.repeat = repeat  # may appear more than once (User Property, Subscription Identifier)
        self.flag = flag  # a byte that must be 0 or 1 ("It is a Protocol Error ... other than")
        self.nonzero = nonzero  # 0 is a Protocol Error


_PROPERTY_SPECS: Final = (
    _PropertySpec(0x01, "payload_format_indicator", _BYTE, _MESSAGE, flag=True),
    _PropertySpec(0x02, "message_expiry_interval", _FOUR, _MESSAGE),
    _PropertySpec(0x03, "content_type", _UTF8, _MESSAGE),
    _PropertySpec(0x08, "response_topic", _UTF8, _MESSAGE),
    _PropertySpec(0x09, "correlation_data", _BINARY, _MESSAGE),
    _PropertySpec(
        0x0B,
        "subscription_identifiers",
        _VBI,
        frozenset({_T.PUBLISH, _T.SUBSCRIBE}),
        repeat=True,
        nonzero=True,
    ),
    _PropertySpec(
        0x11, "session_expiry_interval", _FOUR, frozenset({_T.CONNECT, _T.CONNACK, _T.DISCONNECT})
    ),
    _PropertySpec(0x12, "assigned_client_identifier", _UTF8, frozenset({_T.CONNACK})),
    _PropertySpec(0x13, "server_keep_alive", _TWO, frozenset({_T.CONNACK})),
    _PropertySpec(
        0x15, "authentication_method", _UTF8, frozenset({_T.CONNECT, _T.CONNACK, _T.AUTH})
    ),
    _PropertySpec(
        0x16, "authentication_data", _BINARY, frozenset({_T.CONNECT, _T.CONNACK, _T.AUTH})
    ),
    _PropertySpec(0x17, "request_problem_information", _BYTE, frozenset({_T.CONNECT}), flag=True),
    _PropertySpec(0x18, "will_delay_interval", _FOUR, frozenset({WILL_PROPERTIES})),
    _PropertySpec(0x19, "request_response_information", _BYTE, frozenset({_T.CONNECT}), flag=True),
    _PropertySpec(0x1A, "response_information", _UTF8, frozenset({_T.CONNACK})),
    _PropertySpec(0x1C, "server_reference", _UTF8, frozenset({_T.CONNACK, _T.DISCONNECT})),
    _PropertySpec(
        0x1F,
        "reason_string",
        _UTF8,
        frozenset(
            {_T.CONNACK, *_ACKS, _T.SUBACK, _T.UNSUBACK, _T.DISCONNECT, _T.AUTH},
        ),
    ),
    _PropertySpec(0x21, "receive_maximum", _TWO, frozenset({_T.CONNECT, _T.CONNACK}), nonzero=True),
    _PropertySpec(0x22, "topic_alias_maximum", _TWO, frozenset({_T.CONNECT, _T.CONNACK})),
    _PropertySpec(0x23, "topic_alias", _TWO, frozenset({_T.PUBLISH}), nonzero=True),
    _PropertySpec(0x24, "maximum_qos", _BYTE, frozenset({_T.CONNACK}), flag=True),
    _PropertySpec(0x25, "retain_available", _BYTE, frozenset({_T.CONNACK}), flag=True),
    _PropertySpec(
        0x26, "user_properties", _PAIR, frozenset(_EVERY_PACKET_WITH_PROPERTIES), repeat=True
    ),
    _PropertySpec(
        0x27, "maximum_packet_size", _FOUR, frozenset({_T.CONNECT, _T.CONNACK}), nonzero=True
    ),
    _PropertySpec(
        0x28, "wildcard_subscription_available", _BYTE, frozenset({_T.CONNACK}), flag=True
    ),
    _PropertySpec(
        0x29, "subscription_identifier_available", _BYTE, frozenset({_T.CONNACK}), flag=True
    ),
    _PropertySpec(0x2A, "shared_subscription_available", _BYTE, frozenset({_T.CONNACK}), flag=True),
)
del _T
_PROPERTY_BY_ID: Final = {spec.ident: spec for spec in _PROPERTY_SPECS}
_PROPERTY_BY_NAME: Final = {spec.name: spec for spec in _PROPERTY_SPECS}
assert set(_PROPERTY_BY_NAME) == set(PROPERTY_FIELDS), "property table and dataclass disagree"
_PROPERTY_DEFAULTS: Final[dict[str, object]] = {
    name: getattr(NO_PROPERTIES, name) for name in PROPERTY_FIELDS
}


def _property_value_problem(spec: _PropertySpec, value: object, kind: int) -> str | None:
    """Why ``value`` may not be sent as ``spec`` in a packet of ``kind``, or None if it may.

    Shared by the decoder (which turns a problem into a Protocol Error) and the encoder (which
    turns it into a local error); type and range checks come from the wire readers/writers.
    """
    if spec.flag and value not in (0, 1):
        return f"{spec.name} must be 0 or 1, not {value!r}"
    if spec.nonzero and value == 0:
        return f"{spec.name} must not be 0"
    if spec.name == "response_topic":
        assert isinstance(value, str)
        if not value or "+" in value or "#" in value:
            return "response_topic must be a topic name without wildcards (v5 MQTT-3.3.2-14)"
    return None


def read_properties(reader: Reader, kind: int) -> MqttProperties:
    """Read a v5 property block (VBI length + properties) for a packet of ``kind``.

    Unknown identifiers and identifiers not allowed in ``kind`` are malformed (v5 §2.2.2.2);
    a repeated single-valued property or an out-of-range value is a protocol error.
    """
    length = reader.vbi("property length")
    if not length:
        return NO_PROPERTIES
    end = reader.pos + length
    if end > reader.end:
        raise truncated("property block")
    outer_end = reader.end
    reader.end = end  # no property may read past its block
    found: dict[str, object] = {}
    while reader.pos < end:
        ident = reader.u8("property identifier")
        spec = _PROPERTY_BY_ID.get(ident)
        if spec is None:
            raise malformed("v5 §2.2.2.2", f"unknown property identifier 0x{ident:02X}")
        if kind not in spec.packets:
            raise malformed("v5 §2.2.2.2", f"property {spec.name} is not allowed in {_kind(kind)}")
        wire = spec.wire
        value: object
        if wire == _BYTE:
            value = reader.u8(spec.name)
        elif wire == _TWO:
            value = reader.u16(spec.name)
        elif wire == _FOUR:
            value = reader.u32(spec.name)
        elif wire == _VBI:
            value = reader.vbi(spec.name)
        elif wire == _UTF8:
            value = reader.utf8(spec.name)
        elif wire == _BINARY:
            value = reader.binary(spec.name)
        else:
            value = (reader.utf8("user property name"), reader.utf8("user property value"))
        problem = _property_value_problem(spec, value, kind)
        if problem is not None:
            raise protocol_error("v5 §2.2.2.2", problem)
        name = spec.name
        # Subscription Identifier repeats in PUBLISH only (v5 §3.8.2.1.2: once in SUBSCRIBE).
        once_here = kind == MqttPacketType.SUBSCRIBE and name == "subscription_identifiers"
        if spec.repeat and not (once_here and name in found):
            values = found.get(name)
            if values is None:
                found[name] = [value]
            else:
                assert isinstance(values, list)
                values.append(value)
        elif name in found:
            raise protocol_error("v5 §2.2.2.2", f"property {name} appears more than once")
        else:
            found[name] = value
    reader.end = outer_end
    for name in ("user_properties", "subscription_identifiers"):
        values = found.get(name)
        if values is not None:
            assert isinstance(values, list)
            found[name] = tuple(values)
    properties: MqttProperties = _object_new(MqttProperties)
    _object_setattr(properties, "__dict__", {**_PROPERTY_DEFAULTS, **found})
    return properties


def _kind(kind: int) -> str:
    return "Will Properties" if kind == WILL_PROPERTIES else MqttPacketType(kind).name


def encode_properties(properties: MqttProperties, kind: int) -> bytes:
    """The v5 property block (VBI length + properties) for a packet of ``kind``."""
    if properties is NO_PROPERTIES:
        return b"\x00"
    if not isinstance(properties, MqttProperties):
        raise local_error(f"properties must be an MqttProperties, not {type(properties).__name__}")
    parts: list[bytes] = []
    for name, value in vars(properties).items():
        if value is None or value == ():
            continue
        spec = _PROPERTY_BY_NAME[name]
        if kind not in spec.packets:
            raise local_error(f"property {name} is not allowed in {_kind(kind)} (v5 §2.2.2.2)")
        values = value if spec.repeat else (value,)
        if spec.repeat and not isinstance(values, tuple):
            raise local_error(f"{name} must be a tuple")
        if (
            kind == MqttPacketType.SUBSCRIBE
            and name == "subscription_identifiers"
            and len(values) > 1
        ):
            raise local_error("a SUBSCRIBE carries at most one subscription identifier")
        ident = bytes((spec.ident,))
        for item in values:
            wire = spec.wire
            if wire == _BYTE:
                data = encode_u8(item, name)
            elif wire == _TWO:
                data = encode_u16(item, name)
            elif wire == _FOUR:
                data = encode_u32(item, name)
            elif wire == _VBI:
                data = encode_vbi_checked(item, name)
            elif wire == _UTF8:
                data = encode_string(item, name)
            elif wire == _BINARY:
                data = encode_binary(item, name)
            else:
                if not (isinstance(item, tuple) and len(item) == 2):
                    raise local_error(f"{name} entries must be (name, value) pairs")
                data = encode_string(item[0], name) + encode_string(item[1], name)
            problem = _property_value_problem(spec, item, kind)
            if problem is not None:
                raise local_error(problem)
            parts.append(ident)
            parts.append(data)
    body = b"".join(parts)
    return encode_vbi(len(body)) + body
