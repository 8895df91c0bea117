"""Sans-I/O MQTT 3.1.1 / 5.0 codec: ``MqttDecoder`` (bytes in, packets out) and ``encode_mqtt``.

Like h11, nothing here touches a socket or a clock. The connection owner feeds what it read::

    decoder = MqttDecoder(max_packet_size=256 * 1024)       # server side
    decoder.feed(await stream.receive_some(65536))
    for packet in decoder.decode_many():                    # or next_packet() until MQTT_NEED_DATA
        ...
    await stream.send_all(encode_mqtt(Puback(packet.packet_id), decoder.version))

Errors, sorted by who must act (the project's taxonomy):

* ``MqttProtocolError``: the peer sent something MQTT forbids. Its ``reason_code`` is the v5
  reason code for the DISCONNECT (or the CONNACK while the CONNECT is being read) and its message
  starts with the normative statement. The decoder is then broken: every later call raises the
  same error, because the byte stream can no longer be trusted; close the connection.
  ``MqttUnsupportedProtocolError`` (a subclass) is a CONNECT with an unknown protocol name or
  level: answer CONNACK 0x01 in the 3.1.1 format, then close (MQTT-3.1.2-2).
* ``MqttLocalProtocolError`` (a ``ValueError``): ``encode_mqtt`` was asked for a packet that is not
  valid for that protocol version. Nothing is sent; it is our bug, not the peer's.

Memory: a packet's remaining length is checked against ``max_packet_size`` as soon as its fixed
header is complete, so a peer cannot make the decoder wait for (or buffer) a larger packet. Once
``next_packet`` has returned ``MQTT_NEED_DATA`` the decoder holds fewer than
``max(max_packet_size, 5)`` bytes (one partial packet; 5 covers a partial fixed header); data
fed before that is held until it is decoded, so feed one read at a time and drain in between.

What is deliberately left to the session layer above: topic aliases, receive-maximum and
packet-identifier bookkeeping, keep-alive, authorisation, and the validity of subscription
*filters* (answered per filter in SUBACK, see ``_topics.validate_mqtt_topic_filter``).
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable
from typing import Any, Final

from ._packets import (
    AUTH_REASON_CODES,
    CONNACK_REASON_CODES,
    DISCONNECT_REASON_CODES,
    MQTT_NEED_DATA,
    NO_PROPERTIES,
    PROPERTY_FIELDS,
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
    MqttLocalProtocolError,
    MqttNeedData,
    MqttPacket,
    MqttPacketType,
    MqttProperties,
    MqttProtocolError,
    MqttReasonCode,
    MqttSubscription,
    MqttUnsupportedProtocolError,
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
    Will,
)
from ._topics import InvalidMqttTopicError, validate_mqtt_topic_filter

MQTT_DEFAULT_MAX_PACKET_SIZE: Final = 1024 * 1024
MAX_REMAINING_LENGTH: Final = 268_435_455  # FF FF FF 7F, the largest 4-byte VBI
MAX_PACKET_SIZE_LIMIT: Final = MAX_REMAINING_LENGTH + 5  # fixed header byte + 4 length bytes

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_PUBACK = struct.Struct(">BBH")

_object_new = object.__new__
_object_setattr = object.__setattr__

_MALFORMED: Final = MqttReasonCode.MALFORMED_PACKET
_PROTOCOL: Final = MqttReasonCode.PROTOCOL_ERROR
_TOPIC_INVALID: Final = MqttReasonCode.TOPIC_NAME_INVALID

_V31: Final = MqttVersion.V31
_V311: Final = MqttVersion.V311
_V5: Final = MqttVersion.V5
_VERSIONS: Final = frozenset(MqttVersion)

# The (protocol name, level) pairs a CONNECT may carry (MQTT-3.1.2-1, -2).
_PROTOCOLS: Final = {("MQIsdp", 3): _V31, ("MQTT", 4): _V311, ("MQTT", 5): _V5}

# ---------------------------------------------------------------------------------------------
# Errors


def _malformed(statement: str, detail: str) -> MqttProtocolError:
    return MqttProtocolError(_MALFORMED, statement, detail)


def _protocol(statement: str, detail: str) -> MqttProtocolError:
    return MqttProtocolError(_PROTOCOL, statement, detail)


def _truncated(what: str) -> MqttProtocolError:
    return _malformed("§2.2.3", f"{what} runs past the end of the packet (remaining length)")


def _local(detail: str) -> MqttLocalProtocolError:
    return MqttLocalProtocolError(detail)


def _bad_utf8(what: str) -> MqttProtocolError:
    return _malformed("MQTT-1.5.3-1", f"{what} is not well-formed UTF-8 (v5 MQTT-1.5.4-1)")


def _nul(what: str) -> MqttProtocolError:
    return _malformed("MQTT-1.5.3-2", f"{what} contains U+0000 (v5 MQTT-1.5.4-2)")


# ---------------------------------------------------------------------------------------------
# Properties: one table drives decoding, encoding and validation (v5 §2.2.2.2).

_BYTE, _TWO, _FOUR, _VBI, _UTF8, _BINARY, _PAIR = range(7)
_WILL: Final = 0  # the Will Properties of CONNECT, a "packet kind" of their own in the table

_T = MqttPacketType
_ACKS: Final = frozenset({_T.PUBACK, _T.PUBREC, _T.PUBREL, _T.PUBCOMP})
_EVERY_PACKET_WITH_PROPERTIES: Final = frozenset(
    {
        _WILL,
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
_MESSAGE: Final = frozenset({_T.PUBLISH, _WILL})


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
    _PropertySpec(0x18, "will_delay_interval", _FOUR, frozenset({_WILL})),
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


# ---------------------------------------------------------------------------------------------
# Decoding


class _Reader:
    """A bounds-checked cursor over ``buf[pos:end]``: every read past ``end`` is malformed.

    The slow-path packets (everything but PUBLISH and PUBACK) are parsed through it; it is what
    guarantees that no IndexError or struct.error can escape for a truncated field.
    """

    __slots__ = ("buf", "end", "pos")

    def __init__(self, buf: bytes, pos: int, end: int) -> None:
        self.buf = buf
        self.pos = pos
        self.end = end

    def remaining(self) -> int:
        return self.end - self.pos

    def u8(self, what: str) -> int:
        pos = self.pos
        if pos >= self.end:
            raise _truncated(what)
        self.pos = pos + 1
        return self.buf[pos]

    def u16(self, what: str) -> int:
        pos = self.pos
        if pos + 2 > self.end:
            raise _truncated(what)
        self.pos = pos + 2
        return (self.buf[pos] << 8) | self.buf[pos + 1]

    def u32(self, what: str) -> int:
        pos = self.pos
        if pos + 4 > self.end:
            raise _truncated(what)
        self.pos = pos + 4
        value: int = _U32.unpack_from(self.buf, pos)[0]
        return value

    def vbi(self, what: str) -> int:
        value = 0
        shift = 0
        for count in range(4):
            byte = self.u8(what)
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                if count and not byte:
                    raise _malformed("v5 MQTT-1.5.5-1", f"{what} is not minimally encoded")
                return value
            shift += 7
        raise _malformed("v5 §1.5.5", f"{what} is longer than 4 bytes")

    def binary(self, what: str) -> bytes:
        size = self.u16(what)
        pos = self.pos
        end = pos + size
        if end > self.end:
            raise _truncated(what)
        self.pos = end
        return self.buf[pos:end]

    def utf8(self, what: str) -> str:
        raw = self.binary(what)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise _bad_utf8(what) from None
        if "\x00" in text:
            raise _nul(what)
        return text

    def rest(self) -> bytes:
        data = self.buf[self.pos : self.end]
        self.pos = self.end
        return data

    def finish(self, what: str) -> None:
        if self.pos != self.end:
            raise _malformed("§2.2.3", f"{self.end - self.pos} unexpected bytes after the {what}")


def _read_properties(reader: _Reader, kind: int) -> MqttProperties:
    """Read a v5 property block (VBI length + properties) for a packet of ``kind``.

    Unknown identifiers and identifiers not allowed in ``kind`` are malformed (v5 §2.2.2.2);
    a repeated single-valued property or an out-of-range value is a protocol error.
    """
    length = reader.vbi("property length")
    if not length:
        return NO_PROPERTIES
    end = reader.pos + length
    if end > reader.end:
        raise _truncated("property block")
    outer_end = reader.end
    reader.end = end  # no property may read past its block
    found: dict[str, object] = {}
    while reader.pos < end:
        ident = reader.u8("property identifier")
        spec = _PROPERTY_BY_ID.get(ident)
        if spec is None:
            raise _malformed("v5 §2.2.2.2", f"unknown property identifier 0x{ident:02X}")
        if kind not in spec.packets:
            raise _malformed("v5 §2.2.2.2", f"property {spec.name} is not allowed in {_kind(kind)}")
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
            raise _protocol("v5 §2.2.2.2", problem)
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
            raise _protocol("v5 §2.2.2.2", f"property {name} appears more than once")
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
    return "Will Properties" if kind == _WILL else MqttPacketType(kind).name


# Fixed-header flags each type must carry (MQTT-2.2.2-1); PUBLISH's are checked on their own.
_REQUIRED_FLAGS: Final = (-1, 0, 0, -1, 0, 0, 2, 0, 2, 0, 2, 0, 0, 0, 0, 0)
_FLAG_STATEMENTS: Final[dict[int, str]] = {
    MqttPacketType.PUBREL: "MQTT-3.6.1-1",
    MqttPacketType.SUBSCRIBE: "MQTT-3.8.1-1",
    MqttPacketType.UNSUBSCRIBE: "MQTT-3.10.1-1",
    MqttPacketType.DISCONNECT: "MQTT-3.14.1-1",
    MqttPacketType.AUTH: "v5 MQTT-3.15.1-1",
}

_FROM_CLIENT: Final = frozenset(  # after the CONNECT
    {
        MqttPacketType.PUBLISH,
        MqttPacketType.PUBACK,
        MqttPacketType.PUBREC,
        MqttPacketType.PUBREL,
        MqttPacketType.PUBCOMP,
        MqttPacketType.SUBSCRIBE,
        MqttPacketType.UNSUBSCRIBE,
        MqttPacketType.PINGREQ,
        MqttPacketType.DISCONNECT,
    }
)
_FROM_SERVER: Final = frozenset(
    {
        MqttPacketType.CONNACK,
        MqttPacketType.PUBLISH,
        MqttPacketType.PUBACK,
        MqttPacketType.PUBREC,
        MqttPacketType.PUBREL,
        MqttPacketType.PUBCOMP,
        MqttPacketType.SUBACK,
        MqttPacketType.UNSUBACK,
        MqttPacketType.PINGRESP,
    }
)
_V5_ONLY_FROM_SERVER: Final = frozenset({MqttPacketType.DISCONNECT, MqttPacketType.AUTH})


def _allowed_types(server_side: bool, version: MqttVersion | None) -> frozenset[int]:
    """The packet types this side may receive: only CONNECT until the version is known."""
    if version is None:
        return frozenset({MqttPacketType.CONNECT})
    if server_side:
        return _FROM_CLIENT | ({MqttPacketType.AUTH} if version == _V5 else set())
    return _FROM_SERVER | (_V5_ONLY_FROM_SERVER if version == _V5 else set())


@functools.cache
def _bad_first_bytes(server_side: bool, version: MqttVersion | None) -> bytes:
    """For each possible first byte of a packet, 1 if this side must refuse it, else 0.

    One table lookup per packet replaces the type, direction and fixed-header flag checks on
    the hot path; ``MqttDecoder._refuse_first_byte`` explains a refusal. There are six tables
    in all, each built once: building one takes about 180 us, which was paid on every CONNECT.
    """
    allowed = _allowed_types(server_side, version)
    return bytes(_first_byte_error(first, allowed) is not None for first in range(256))


def _first_byte_error(first: int, allowed: frozenset[int]) -> tuple[str, str] | None:
    """(statement, detail) if ``first`` is not a valid first byte of a packet type in
    ``allowed`` (the direction check is reported by the decoder, which knows the state)."""
    ptype = first >> 4
    flags = first & 0x0F
    if ptype not in allowed:
        return ("", "")
    if ptype == MqttPacketType.PUBLISH:
        if flags & 0x06 == 0x06:
            return ("MQTT-3.3.1-4", "PUBLISH with QoS 3")
        if flags & 0x0E == 0x08:
            return ("MQTT-3.3.1-2", "PUBLISH with QoS 0 and DUP set")
    elif flags != _REQUIRED_FLAGS[ptype]:
        return (
            _FLAG_STATEMENTS.get(ptype, "MQTT-2.2.2-2"),
            f"reserved flags 0x{flags:X} in {MqttPacketType(ptype).name} (v5 MQTT-2.1.3-1)",
        )
    return None


class MqttDecoder:
    """Bytes in, packets out, for one connection (h11 style: ``feed`` then ``next_packet``).

    ``server_side=True`` decodes what a client sends: the first packet must be CONNECT
    (MQTT-3.1.0-1), which fixes ``version``; a second CONNECT is a protocol error (MQTT-3.1.0-2).
    ``server_side=False`` decodes what a server sends, under the ``version`` the client put in its
    CONNECT. Passing ``version`` on the server side means "the CONNECT was already read".

    Packets a side never receives (a CONNACK at a server, a SUBSCRIBE at a client, AUTH before
    v5) are protocol errors. Not thread-safe; one decoder per connection.
    """

    __slots__ = (
        "_bad_first",
        "_buf",
        "_error",
        "_max",
        "_pending",
        "_pending_len",
        "_pos",
        "_server_side",
        "_version",
    )

    def __init__(
        self,
        *,
        max_packet_size: int = MQTT_DEFAULT_MAX_PACKET_SIZE,
        server_side: bool = True,
        version: MqttVersion | None = None,
    ) -> None:
        """Raise ``ValueError`` if ``max_packet_size`` is outside 2..268435460 bytes, or if a
        client-side decoder is given no ``version``."""
        if not 2 <= max_packet_size <= MAX_PACKET_SIZE_LIMIT:
            raise ValueError(f"max_packet_size must be 2..{MAX_PACKET_SIZE_LIMIT}")
        if version is not None and version not in _VERSIONS:
            raise ValueError(f"unknown protocol version {version!r}")
        if not server_side and version is None:
            raise ValueError("a client-side decoder needs the version sent in CONNECT")
        self._max = max_packet_size
        self._server_side = server_side
        self._version: MqttVersion | None = None if version is None else MqttVersion(version)
        self._set_version(self._version)
        # Unconsumed input is self._buf[self._pos:] followed by the chunks in self._pending.
        # Chunks are joined only once they complete the packet in progress, so feeding a large
        # packet in many small pieces costs one copy, not one per piece.
        self._buf = b""
        self._pos = 0
        self._pending: list[bytes] = []
        self._pending_len = 0
        self._error: MqttProtocolError | None = None

    @property
    def version(self) -> MqttVersion | None:
        """The protocol version: set from the CONNECT on the server side (None before it).

        It is set as soon as the CONNECT's protocol level is read, so it is known even when the
        rest of that CONNECT turns out malformed and the server answers with a CONNACK.
        """
        return self._version

    @property
    def max_packet_size(self) -> int:
        """The largest packet (fixed header included) accepted; larger ones raise 0x95."""
        return self._max

    @property
    def buffered(self) -> int:
        """Bytes fed but not yet returned as packets."""
        return len(self._buf) - self._pos + self._pending_len

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Append received bytes. Cheap: parsing happens in ``next_packet``/``decode_many``.

        Raises the stored ``MqttProtocolError`` if the decoder already failed.
        """
        if self._error is not None:
            raise self._error
        if data:
            chunk = data if type(data) is bytes else bytes(data)
            if self._pos == len(self._buf) and not self._pending:
                # Nothing buffered (the common case between reads): parse the chunk in place.
                self._buf = chunk
                self._pos = 0
            else:
                self._pending.append(chunk)
                self._pending_len += len(chunk)

    def next_packet(self) -> MqttPacket | MqttNeedData:
        """The next complete packet, or ``MQTT_NEED_DATA`` if the buffer does not hold one yet.

        Raises ``MqttProtocolError`` for any violation, as soon as the bytes that show it have
        been fed (an oversized remaining length raises before the body arrives).
        """
        out: list[MqttPacket] = []
        self._decode_into(out, 1)
        return out[0] if out else MQTT_NEED_DATA

    def decode_many(self) -> list[MqttPacket]:
        """All complete packets in the buffer, in order (empty if none).

        Equivalent to calling ``next_packet`` until ``MQTT_NEED_DATA``, with the per-call work
        done once: the same packets, then the same error. When a violation follows good packets,
        the good ones are returned and the next call raises (so a DISCONNECT that precedes
        garbage is still seen, and its Will suppression honoured).
        """
        out: list[MqttPacket] = []
        self._decode_into(out, -1)
        return out

    def _take(self, buf: bytes, pos: int, need: int) -> bytes | None:
        """Join pending chunks after ``buf[pos:]`` if that yields ``need`` bytes; else None."""
        have = len(buf) - pos
        if have + self._pending_len < need:
            return None
        pending = self._pending
        if have == 0 and len(pending) == 1:
            joined = pending[0]
        else:
            joined = b"".join([memoryview(buf)[pos:], *pending])
        self._pending = []
        self._pending_len = 0
        return joined

    def _decode_into(self, out: list[MqttPacket], limit: int) -> None:
        if self._error is not None:
            raise self._error
        buf = self._buf
        pos = self._pos
        try:
            bad_first = self._bad_first
            v5 = self._version == _V5
            server_side = self._server_side
            max_size = self._max
            topic_cache = _TOPIC_CACHE
            while limit:
                size = len(buf)
                if size - pos < 2:
                    joined = self._take(buf, pos, 2)
                    if joined is None:
                        break
                    buf = joined
                    pos = 0
                    size = len(buf)
                first = buf[pos]
                if bad_first[first]:
                    raise self._refuse_first_byte(first)
                ptype = first >> 4
                flags = first & 0x0F
                length = buf[pos + 1]
                header = 2
                if length >= 0x80:
                    # Inline the 2-byte length (128 B .. 16 KiB packets, most PUBLISHes).
                    if pos + 2 < size and 0 < buf[pos + 2] < 0x80:
                        length = (length & 0x7F) | buf[pos + 2] << 7
                        header = 3
                    else:
                        parsed = _long_length(buf, pos)
                        if parsed is None:  # the length's last byte has not arrived yet
                            joined = self._take(buf, pos, size - pos + 1)
                            if joined is None:
                                break
                            buf = joined
                            pos = 0
                            continue
                        length, header = parsed
                total = header + length
                if total > max_size:
                    raise MqttProtocolError(
                        MqttReasonCode.PACKET_TOO_LARGE,
                        "v5 MQTT-3.2.2-15",
                        f"packet of {total} bytes exceeds the maximum packet size {max_size}",
                    )
                end = pos + total
                if end > size:
                    joined = self._take(buf, pos, total)
                    if joined is None:
                        break
                    buf = joined
                    pos = 0
                    end = total
                start = pos + header
                packet: MqttPacket
                if ptype == 3:
                    # Fast path: PUBLISH, the packet that dominates ingress and egress.
                    if start + 2 > end:
                        raise _truncated("topic name")
                    cursor = start + 2 + ((buf[start] << 8) | buf[start + 1])
                    if cursor > end:
                        raise _truncated("topic name")
                    raw_topic = buf[start + 2 : cursor]
                    topic = topic_cache.get(raw_topic)
                    if topic is None:
                        topic = _publish_topic(raw_topic)
                    qos = flags >> 1 & 3
                    if qos:
                        if cursor + 2 > end:
                            raise _truncated("packet identifier")
                        packet_id = (buf[cursor] << 8) | buf[cursor + 1]
                        if not packet_id:
                            raise _malformed("MQTT-2.3.1-1", "PUBLISH with packet identifier 0")
                        cursor += 2
                    else:
                        packet_id = 0
                    properties = NO_PROPERTIES
                    if v5:
                        if cursor < end and not buf[cursor]:
                            cursor += 1
                        else:
                            reader = _Reader(buf, cursor, end)
                            properties = _read_properties(reader, MqttPacketType.PUBLISH)
                            cursor = reader.pos
                            if server_side and properties.subscription_identifiers:
                                raise _protocol(
                                    "v5 MQTT-3.3.4-6",
                                    "a client PUBLISH must not carry a subscription identifier",
                                )
                    if not topic and properties.topic_alias is None:
                        raise MqttProtocolError(
                            _TOPIC_INVALID,
                            "MQTT-4.7.3-1",
                            "empty topic name (allowed only with a v5 topic alias)",
                        )
                    packet = _object_new(Publish)
                    _object_setattr(
                        packet,
                        "__dict__",
                        {
                            "topic": topic,
                            "payload": buf[cursor:end],
                            "qos": qos,
                            "retain": (flags & 1) == 1,
                            "dup": (flags & 8) == 8,
                            "packet_id": packet_id,
                            "properties": properties,
                        },
                    )
                elif ptype == 4 and length == 2:
                    # Fast path: PUBACK without reason code or properties (every 3.1.1 PUBACK,
                    # and the v5 short form for Success).
                    packet_id = (buf[start] << 8) | buf[start + 1]
                    if not packet_id:
                        raise _malformed("MQTT-2.3.1-1", "PUBACK with packet identifier 0")
                    packet = _object_new(Puback)
                    _object_setattr(
                        packet,
                        "__dict__",
                        {"packet_id": packet_id, "reason_code": 0, "properties": NO_PROPERTIES},
                    )
                else:
                    packet = self._decode_other(ptype, _Reader(buf, start, end))
                    if ptype == 1:
                        v5 = self._version == _V5
                        bad_first = self._bad_first
                out.append(packet)
                pos = end
                limit -= 1
        except MqttProtocolError as error:
            self._error = error
            self._buf = b""
            self._pos = 0
            self._pending = []
            self._pending_len = 0
            if not out:
                raise
            return  # hand over the good packets first; the next call raises
        if pos >= len(buf):
            buf = b""
            pos = 0
        elif pos and limit:
            # Stopped for want of data: keep only the partial packet, not the whole chunk it
            # came in, so that what stays buffered is bounded by the maximum packet size.
            buf = buf[pos:]
            pos = 0
        self._buf = buf
        self._pos = pos

    def _set_version(self, version: MqttVersion | None) -> None:
        self._version = version
        self._bad_first = _bad_first_bytes(self._server_side, version)

    def _refuse_first_byte(self, first: int) -> MqttProtocolError:
        ptype = first >> 4
        allowed = _allowed_types(self._server_side, self._version)
        if ptype not in allowed:
            return self._unexpected_type(ptype)
        problem = _first_byte_error(first, allowed)
        assert problem is not None, "a refused first byte has a reason"
        return _malformed(*problem)

    def _unexpected_type(self, ptype: int) -> MqttProtocolError:
        if ptype == 0 or (ptype == MqttPacketType.AUTH and self._version != _V5):
            return _malformed("MQTT-2.2.1", f"reserved packet type {ptype}")
        name = MqttPacketType(ptype).name
        if self._version is None:
            return _protocol("MQTT-3.1.0-1", f"the first packet must be CONNECT, not {name}")
        if ptype == MqttPacketType.CONNECT and self._server_side:
            return _protocol("MQTT-3.1.0-2", "a second CONNECT")
        side = "client" if self._server_side else "server"
        return _protocol("§2.1.2", f"{name} is never sent by a {side} in MQTT {self._version}")

    def _decode_other(self, ptype: int, reader: _Reader) -> MqttPacket:
        """Decode any packet but the fast-path PUBLISH/PUBACK."""
        if ptype == MqttPacketType.CONNECT:
            return self._decode_connect(reader)
        version = self._version
        assert version is not None
        decoder = _DECODERS[ptype]
        return decoder(reader, version == _V5, self._server_side)

    def _decode_connect(self, reader: _Reader) -> Connect:
        name = reader.utf8("protocol name")
        level = reader.u8("protocol level")
        version = _PROTOCOLS.get((name, level))
        if version is None:
            raise MqttUnsupportedProtocolError(
                name, level, f"unsupported protocol name {name!r} and level {level}"
            )
        self._set_version(version)
        v5 = version == _V5
        flags = reader.u8("connect flags")
        if flags & 0x01:
            raise _malformed("MQTT-3.1.2-3", "CONNECT reserved flag is set")
        will_flag = flags & 0x04
        will_qos = flags >> 3 & 3
        will_retain = flags & 0x20
        if not will_flag and will_qos:
            raise _malformed("MQTT-3.1.2-13", "Will QoS set without the Will flag")
        if not will_flag and will_retain:
            raise _malformed("MQTT-3.1.2-15", "Will Retain set without the Will flag")
        if will_qos == 3:
            raise _malformed("MQTT-3.1.2-14", "Will QoS 3 (v5 MQTT-3.1.2-12)")
        has_username = flags & 0x80
        has_password = flags & 0x40
        if has_password and not has_username and not v5:
            raise _malformed("MQTT-3.1.2-22", "password flag set without the user name flag")
        keep_alive = reader.u16("keep alive")
        properties = _read_properties(reader, MqttPacketType.CONNECT) if v5 else NO_PROPERTIES
        if properties.authentication_data is not None and properties.authentication_method is None:
            raise _protocol("v5 §3.1.2.11.10", "authentication data without a method")
        client_id = reader.utf8("client identifier")
        will = None
        if will_flag:
            will_properties = _read_properties(reader, _WILL) if v5 else NO_PROPERTIES
            will_topic = reader.utf8("will topic")
            if not will_topic or "+" in will_topic or "#" in will_topic:
                raise MqttProtocolError(
                    _TOPIC_INVALID, "MQTT-3.1.3-10", "the will topic must be a valid topic name"
                )
            will = Will(
                will_topic,
                reader.binary("will payload"),
                will_qos,
                bool(will_retain),
                will_properties,
            )
        username = reader.utf8("user name") if has_username else None
        password = reader.binary("password") if has_password else None
        reader.finish("CONNECT payload")
        return Connect(
            client_id,
            bool(flags & 0x02),
            keep_alive,
            username,
            password,
            will,
            properties,
        )


# Validated PUBLISH topics by their wire bytes. Devices publish to few topics over and over, so
# this skips the UTF-8 decode and the three character scans for almost every PUBLISH. Bounded in
# entries and key length, and cleared when full, so a peer cycling topics costs memory once.
_TOPIC_CACHE: Final[dict[bytes, str]] = {}
_TOPIC_CACHE_ENTRIES: Final = 4096
_TOPIC_CACHE_KEY_BYTES: Final = 256


def _publish_topic(raw: bytes) -> str:
    """Decode and check a PUBLISH topic name; "" is returned (the caller checks for an alias)."""
    try:
        topic = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _bad_utf8("topic name") from None
    if "+" in topic or "#" in topic:
        raise MqttProtocolError(_TOPIC_INVALID, "MQTT-3.3.2-2", "wildcard in a PUBLISH topic name")
    if "\x00" in topic:
        raise _nul("topic name")
    if topic and len(raw) <= _TOPIC_CACHE_KEY_BYTES:
        if len(_TOPIC_CACHE) >= _TOPIC_CACHE_ENTRIES:
            _TOPIC_CACHE.clear()
        _TOPIC_CACHE[raw] = topic
    return topic


def _long_length(buf: bytes, pos: int) -> tuple[int, int] | None:
    """Decode a remaining length of 2..4 bytes at ``buf[pos + 1:]``: (value, header size).

    None if the buffer ends before the last length byte. A fifth byte or a non-minimal encoding
    is malformed (v5 MQTT-1.5.5-1; rejecting it in 3.1.1 too is safe, no client sends one).
    """
    value = 0
    shift = 0
    index = pos + 1
    size = len(buf)
    for count in range(4):
        if index >= size:
            return None
        byte = buf[index]
        index += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            if count and not byte:
                raise _malformed("v5 MQTT-1.5.5-1", "remaining length is not minimally encoded")
            return value, index - pos
        shift += 7
    raise _malformed("§2.2.3", "remaining length is longer than 4 bytes")


def _check_reason(code: int, allowed: frozenset[int], statement: str, what: str) -> int:
    if code not in allowed:
        raise _malformed(statement, f"reason code 0x{code:02X} is not valid in {what}")
    return code


def _packet_id(reader: _Reader, what: str) -> int:
    packet_id = reader.u16("packet identifier")
    if not packet_id:
        raise _malformed("MQTT-2.3.1-1", f"{what} with packet identifier 0")
    return packet_id


def _decode_connack(reader: _Reader, v5: bool, server_side: bool) -> Connack:
    ack_flags = reader.u8("connect acknowledge flags")
    if ack_flags & 0xFE:
        raise _malformed("§3.2.2.1", "CONNACK reserved flags are set (v5 MQTT-3.2.2-1)")
    code = reader.u8("connect reason code")
    if v5:
        _check_reason(code, CONNACK_REASON_CODES, "v5 MQTT-3.2.2-8", "CONNACK")
        # A 3.1.1-only server answers a v5 CONNECT in the 3.1.1 format (return code 0x01, no
        # property length); accept that so the client can read the refusal.
        properties = (
            _read_properties(reader, MqttPacketType.CONNACK)
            if reader.remaining()
            else NO_PROPERTIES
        )
    else:
        if code > 5:
            raise _malformed("§3.2.2.3", f"reserved CONNACK return code {code}")
        properties = NO_PROPERTIES
    if ack_flags and code:
        raise _protocol("MQTT-3.2.2-4", "session present with a refusal (v5 MQTT-3.2.2-6)")
    reader.finish("CONNACK")
    return Connack(bool(ack_flags), code, properties)


def _make_ack_decoder(
    cls: type[Puback | Pubrec | Pubrel | Pubcomp],
    kind: MqttPacketType,
    allowed: frozenset[int],
    statement: str,
) -> Callable[[_Reader, bool, bool], MqttPacket]:
    def decode(reader: _Reader, v5: bool, server_side: bool) -> MqttPacket:
        packet_id = _packet_id(reader, kind.name)
        code = 0
        properties = NO_PROPERTIES
        if v5 and reader.remaining():
            # v5 §3.4.2.1: the reason code (and then the properties) may be omitted.
            code = _check_reason(reader.u8("reason code"), allowed, statement, kind.name)
            if reader.remaining():
                properties = _read_properties(reader, kind)
        reader.finish(kind.name)
        return cls(packet_id, code, properties)

    return decode


def _decode_subscribe(reader: _Reader, v5: bool, server_side: bool) -> Subscribe:
    packet_id = _packet_id(reader, "SUBSCRIBE")
    properties = _read_properties(reader, MqttPacketType.SUBSCRIBE) if v5 else NO_PROPERTIES
    subscriptions = []
    while reader.remaining():
        topic_filter = reader.utf8("topic filter")
        options = reader.u8("subscription options")
        qos = options & 0x03
        if v5:
            if options & 0xC0:
                raise _malformed("v5 MQTT-3.8.3-5", "reserved subscription option bits are set")
            if qos == 3:
                raise _malformed("v5 §3.8.3.1", "subscription with QoS 3")
            retain_handling = options >> 4 & 0x03
            if retain_handling == 3:
                raise _protocol("v5 §3.8.3.1", "retain handling 3")
            no_local = bool(options & 0x04)
            if no_local and topic_filter.startswith("$share/"):
                raise _protocol("v5 MQTT-3.8.3-4", "No Local on a shared subscription")
            subscriptions.append(
                MqttSubscription(topic_filter, qos, no_local, bool(options & 0x08), retain_handling)
            )
        else:
            if options & 0xFC or qos == 3:
                raise _malformed(
                    "MQTT-3-8.3-4", f"requested QoS byte 0x{options:02X} (reserved bits or QoS 3)"
                )
            subscriptions.append(MqttSubscription(topic_filter, qos))
    if not subscriptions:
        raise _protocol("MQTT-3.8.3-3", "SUBSCRIBE without a topic filter (v5 MQTT-3.8.3-2)")
    return Subscribe(packet_id, tuple(subscriptions), properties)


def _decode_suback(reader: _Reader, v5: bool, server_side: bool) -> Suback:
    packet_id = _packet_id(reader, "SUBACK")
    properties = _read_properties(reader, MqttPacketType.SUBACK) if v5 else NO_PROPERTIES
    codes = tuple(reader.rest())
    if not codes:
        raise _malformed("MQTT-3.8.4-5", "SUBACK without a return code")
    allowed = SUBACK_REASON_CODES if v5 else SUBACK_RETURN_CODES_V311
    for code in codes:
        _check_reason(code, allowed, "MQTT-3.9.3-2", "SUBACK")
    return Suback(packet_id, codes, properties)


def _decode_unsubscribe(reader: _Reader, v5: bool, server_side: bool) -> Unsubscribe:
    packet_id = _packet_id(reader, "UNSUBSCRIBE")
    properties = _read_properties(reader, MqttPacketType.UNSUBSCRIBE) if v5 else NO_PROPERTIES
    filters = []
    while reader.remaining():
        filters.append(reader.utf8("topic filter"))
    if not filters:
        raise _protocol("MQTT-3.10.3-2", "UNSUBSCRIBE without a topic filter")
    return Unsubscribe(packet_id, tuple(filters), properties)


def _decode_unsuback(reader: _Reader, v5: bool, server_side: bool) -> Unsuback:
    packet_id = _packet_id(reader, "UNSUBACK")
    if not v5:
        reader.finish("UNSUBACK")
        return Unsuback(packet_id)
    properties = _read_properties(reader, MqttPacketType.UNSUBACK)
    codes = tuple(reader.rest())
    if not codes:
        raise _malformed("v5 MQTT-3.11.3-1", "UNSUBACK without a reason code")
    for code in codes:
        _check_reason(code, UNSUBACK_REASON_CODES, "v5 MQTT-3.11.3-2", "UNSUBACK")
    return Unsuback(packet_id, codes, properties)


def _decode_pingreq(reader: _Reader, v5: bool, server_side: bool) -> Pingreq:
    reader.finish("PINGREQ")
    return _PINGREQ


def _decode_pingresp(reader: _Reader, v5: bool, server_side: bool) -> Pingresp:
    reader.finish("PINGRESP")
    return _PINGRESP


def _decode_disconnect(reader: _Reader, v5: bool, server_side: bool) -> Disconnect:
    code = 0
    properties = NO_PROPERTIES
    if v5 and reader.remaining():
        code = _check_reason(
            reader.u8("reason code"), DISCONNECT_REASON_CODES, "v5 MQTT-3.14.2-1", "DISCONNECT"
        )
        if reader.remaining():
            properties = _read_properties(reader, MqttPacketType.DISCONNECT)
    reader.finish("DISCONNECT")
    return Disconnect(code, properties)


def _decode_auth(reader: _Reader, v5: bool, server_side: bool) -> Auth:
    code = 0
    properties = NO_PROPERTIES
    if reader.remaining():
        code = _check_reason(
            reader.u8("reason code"), AUTH_REASON_CODES, "v5 MQTT-3.15.2-1", "AUTH"
        )
        if reader.remaining():
            properties = _read_properties(reader, MqttPacketType.AUTH)
    reader.finish("AUTH")
    return Auth(code, properties)


_PINGREQ: Final = Pingreq()
_PINGRESP: Final = Pingresp()

_DECODERS: Final[dict[int, Callable[[_Reader, bool, bool], MqttPacket]]] = {
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


# ---------------------------------------------------------------------------------------------
# Encoding


def _vbi(value: int) -> bytes:
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _frame(first: int, body: bytes) -> bytes:
    size = len(body)
    if size < 0x80:
        return bytes((first, size)) + body
    if size > MAX_REMAINING_LENGTH:
        raise _local(f"packet body of {size} bytes exceeds the MQTT maximum {MAX_REMAINING_LENGTH}")
    return bytes((first,)) + _vbi(size) + body


def _u8(value: int, what: str) -> bytes:
    if not isinstance(value, int) or not 0 <= value <= 0xFF:
        raise _local(f"{what} {value!r} is outside 0..255")
    return bytes((value,))


def _u16(value: int, what: str) -> bytes:
    if not isinstance(value, int) or not 0 <= value <= 0xFFFF:
        raise _local(f"{what} {value!r} is outside 0..65535")
    return _U16.pack(value)


def _u32(value: int, what: str) -> bytes:
    if not isinstance(value, int) or not 0 <= value <= 0xFFFF_FFFF:
        raise _local(f"{what} {value!r} is outside 0..4294967295")
    return _U32.pack(value)


def _vbi_checked(value: int, what: str) -> bytes:
    if not isinstance(value, int) or not 0 <= value <= MAX_REMAINING_LENGTH:
        raise _local(f"{what} {value!r} is outside 0..{MAX_REMAINING_LENGTH}")
    return _vbi(value)


def _binary(value: bytes, what: str) -> bytes:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise _local(f"{what} must be bytes, not {type(value).__name__}")
    if len(value) > 0xFFFF:
        raise _local(f"{what} is longer than 65535 bytes")
    return _U16.pack(len(value)) + bytes(value)


def _string(value: str, what: str) -> bytes:
    if not isinstance(value, str):
        raise _local(f"{what} must be a str, not {type(value).__name__}")
    if "\x00" in value:
        raise _local(f"{what} contains U+0000 (MQTT-1.5.3-2)")
    try:
        raw = value.encode("utf-8")
    except UnicodeEncodeError:
        raise _local(f"{what} contains a surrogate (MQTT-1.5.3-1)") from None
    return _binary(raw, what)


def _packet_id_bytes(packet_id: int, what: str) -> bytes:
    if not isinstance(packet_id, int) or not 0 < packet_id <= 0xFFFF:
        raise _local(f"{what} packet identifier {packet_id!r} is outside 1..65535 (MQTT-2.3.1-1)")
    return _U16.pack(packet_id)


def _encode_properties(properties: MqttProperties, kind: int) -> bytes:
    """The v5 property block (VBI length + properties) for a packet of ``kind``."""
    if properties is NO_PROPERTIES:
        return b"\x00"
    if not isinstance(properties, MqttProperties):
        raise _local(f"properties must be an MqttProperties, not {type(properties).__name__}")
    parts: list[bytes] = []
    for name, value in vars(properties).items():
        if value is None or value == ():
            continue
        spec = _PROPERTY_BY_NAME[name]
        if kind not in spec.packets:
            raise _local(f"property {name} is not allowed in {_kind(kind)} (v5 §2.2.2.2)")
        values = value if spec.repeat else (value,)
        if spec.repeat and not isinstance(values, tuple):
            raise _local(f"{name} must be a tuple")
        if (
            kind == MqttPacketType.SUBSCRIBE
            and name == "subscription_identifiers"
            and len(values) > 1
        ):
            raise _local("a SUBSCRIBE carries at most one subscription identifier")
        ident = bytes((spec.ident,))
        for item in values:
            wire = spec.wire
            if wire == _BYTE:
                data = _u8(item, name)
            elif wire == _TWO:
                data = _u16(item, name)
            elif wire == _FOUR:
                data = _u32(item, name)
            elif wire == _VBI:
                data = _vbi_checked(item, name)
            elif wire == _UTF8:
                data = _string(item, name)
            elif wire == _BINARY:
                data = _binary(item, name)
            else:
                if not (isinstance(item, tuple) and len(item) == 2):
                    raise _local(f"{name} entries must be (name, value) pairs")
                data = _string(item[0], name) + _string(item[1], name)
            problem = _property_value_problem(spec, item, kind)
            if problem is not None:
                raise _local(problem)
            parts.append(ident)
            parts.append(data)
    body = b"".join(parts)
    return _vbi(len(body)) + body


def _v5_properties(properties: MqttProperties, kind: MqttPacketType, v5: bool) -> bytes:
    """The property block under v5; under 3.1.1 nothing, and properties are refused."""
    if v5:
        return _encode_properties(properties, kind)
    _no_v5_fields(properties, kind.name)
    return b""


def _no_v5_fields(properties: MqttProperties, what: str) -> None:
    if properties is not NO_PROPERTIES and not properties.is_empty():
        raise _local(f"{what} properties need MQTT 5")


def _check_version(version: MqttVersion) -> bool:
    """True for v5; raise for an unknown version."""
    if version not in _VERSIONS:
        raise _local(f"unknown protocol version {version!r}")
    return version == _V5


def _qos(value: int, what: str) -> int:
    if value not in (0, 1, 2) or not isinstance(value, int):
        raise _local(f"{what} QoS must be 0, 1 or 2, not {value!r}")
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
            raise _local(
                "a 3.1.1 CONNECT cannot carry a password without a user name (MQTT-3.1.2-22)"
            )
        flags |= 0x40
    parts = [
        b"\x00\x06MQIsdp\x03" if version == _V31 else b"\x00\x04MQTT" + bytes((version,)),
        bytes((flags,)),
        _u16(packet.keep_alive, "keep_alive"),
    ]
    if v5:
        properties = packet.properties
        if properties.authentication_data is not None and properties.authentication_method is None:
            raise _local("authentication data without a method (v5 §3.1.2.11.10)")
        parts.append(_encode_properties(properties, MqttPacketType.CONNECT))
    else:
        _no_v5_fields(packet.properties, "CONNECT")
    parts.append(_string(packet.client_id, "client_id"))
    if will is not None:
        if v5:
            parts.append(_encode_properties(will.properties, _WILL))
        else:
            _no_v5_fields(will.properties, "Will")
        if not will.topic or "+" in will.topic or "#" in will.topic:
            raise _local("the will topic must be a topic name without wildcards")
        parts.append(_string(will.topic, "will topic"))
        parts.append(_binary(will.payload, "will payload"))
    if packet.username is not None:
        parts.append(_string(packet.username, "username"))
    if packet.password is not None:
        parts.append(_binary(packet.password, "password"))
    return _frame(0x10, b"".join(parts))


def _encode_connack(packet: Connack, version: MqttVersion) -> bytes:
    v5 = _check_version(version)
    code = packet.reason_code
    if v5:
        if code not in CONNACK_REASON_CODES:
            raise _local(f"0x{code:02X} is not a CONNACK reason code (v5 MQTT-3.2.2-8)")
    elif code not in range(6):
        raise _local(f"3.1.1 CONNACK return codes are 0..5, not {code}")
    if packet.session_present and code:
        raise _local("session_present must be 0 with a refusal (MQTT-3.2.2-4)")
    head = bytes((1 if packet.session_present else 0, code))
    if v5:
        return _frame(0x20, head + _encode_properties(packet.properties, MqttPacketType.CONNACK))
    _no_v5_fields(packet.properties, "CONNACK")
    return b"\x20\x02" + head


# Length-prefixed wire form of topics already validated for PUBLISH: egress sends the same
# topics over and over. Bounded like the decoder's cache.
_ENCODED_TOPICS: Final[dict[str, bytes]] = {}


def _encoded_topic(topic: str) -> bytes:
    """The length-prefixed UTF-8 of a PUBLISH topic name, checked (empty allowed)."""
    if not isinstance(topic, str):
        raise _local("the PUBLISH topic must be a str")
    if "+" in topic or "#" in topic:
        raise _local(f"wildcard in PUBLISH topic {topic!r} (MQTT-3.3.2-2)")
    if "\x00" in topic:
        raise _local("U+0000 in the PUBLISH topic (MQTT-1.5.3-2)")
    try:
        raw = topic.encode("utf-8")
    except UnicodeEncodeError:
        raise _local("surrogate in the PUBLISH topic (MQTT-1.5.3-1)") from None
    if len(raw) > 0xFFFF:
        raise _local("the PUBLISH topic is longer than 65535 bytes")
    encoded = _U16.pack(len(raw)) + raw
    if len(raw) <= _TOPIC_CACHE_KEY_BYTES:
        if len(_ENCODED_TOPICS) >= _TOPIC_CACHE_ENTRIES:
            _ENCODED_TOPICS.clear()
        _ENCODED_TOPICS[topic] = encoded
    return encoded


def _encode_publish(packet: Publish, version: MqttVersion) -> bytes:
    if version not in _VERSIONS:
        raise _local(f"unknown protocol version {version!r}")
    topic = packet.topic
    encoded_topic = _ENCODED_TOPICS.get(topic) if type(topic) is str else None
    if encoded_topic is None:
        encoded_topic = _encoded_topic(topic)
    properties = packet.properties
    if len(encoded_topic) == 2 and not (version == _V5 and properties.topic_alias):
        raise _local("empty PUBLISH topic without a v5 topic alias (MQTT-4.7.3-1)")
    qos = packet.qos
    packet_id = packet.packet_id
    if qos in (1, 2):
        if type(packet_id) is not int or not 0 < packet_id <= 0xFFFF:
            raise _local(f"PUBLISH packet identifier {packet_id!r} is outside 1..65535")
        flags = 0x38 | qos << 1 if packet.dup else 0x30 | qos << 1
        id_bytes = _U16.pack(packet_id)
    elif qos == 0:
        if packet_id:
            raise _local("a QoS 0 PUBLISH has no packet identifier (MQTT-2.3.1-5)")
        if packet.dup:
            raise _local("a QoS 0 PUBLISH must not set DUP (MQTT-3.3.1-2)")
        flags = 0x30
        id_bytes = b""
    else:
        raise _local(f"PUBLISH QoS must be 0, 1 or 2, not {qos!r}")
    if packet.retain:
        flags |= 0x01
    if version == _V5:
        props = (
            b"\x00"
            if properties is NO_PROPERTIES
            else _encode_properties(properties, MqttPacketType.PUBLISH)
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
        raise _local(f"PUBLISH of {size} bytes exceeds the MQTT maximum")
    else:
        header = bytes((flags,)) + _vbi(size)
    return b"".join((header, encoded_topic, id_bytes, props, payload))


def _make_ack_encoder(
    kind: MqttPacketType, first: int, allowed: frozenset[int]
) -> Callable[[Puback | Pubrec | Pubrel | Pubcomp, MqttVersion], bytes]:
    name = kind.name

    def encode_ack(packet: Puback | Pubrec | Pubrel | Pubcomp, version: MqttVersion) -> bytes:
        packet_id = packet.packet_id
        if not isinstance(packet_id, int) or not 0 < packet_id <= 0xFFFF:
            raise _local(f"{name} packet identifier {packet_id!r} is outside 1..65535")
        code = packet.reason_code
        properties = packet.properties
        if code == 0 and (properties is NO_PROPERTIES or properties.is_empty()):
            if version not in _VERSIONS:
                raise _local(f"unknown protocol version {version!r}")
            return _PUBACK.pack(first, 2, packet_id)
        if not _check_version(version):
            if code:
                raise _local(f"a 3.1.1 {name} has no reason code")
            _no_v5_fields(properties, name)
            return _PUBACK.pack(first, 2, packet_id)
        if code not in allowed:
            raise _local(f"0x{code:02X} is not a {name} reason code")
        body = _U16.pack(packet_id) + bytes((code,))
        if not properties.is_empty():
            body += _encode_properties(properties, kind)
        return _frame(first, body)

    return encode_ack


def encode_mqtt_puback(packet_id: int) -> bytes:
    """A PUBACK with Success and no properties (valid in 3.1.1 and v5): the hot-path ack.

    Same bytes as ``encode_mqtt(Puback(packet_id), version)`` without building the packet object.
    Raises ``MqttLocalProtocolError`` if ``packet_id`` is not 1..65535.
    """
    if not 0 < packet_id <= 0xFFFF:
        raise _local(f"PUBACK packet identifier {packet_id!r} is outside 1..65535")
    return _PUBACK.pack(0x40, 2, packet_id)


def _encode_subscribe(packet: Subscribe, version: MqttVersion) -> bytes:
    v5 = _check_version(version)
    if not packet.subscriptions:
        raise _local("a SUBSCRIBE needs at least one subscription (MQTT-3.8.3-3)")
    parts = [_packet_id_bytes(packet.packet_id, "SUBSCRIBE")]
    parts.append(_v5_properties(packet.properties, MqttPacketType.SUBSCRIBE, v5))
    for sub in packet.subscriptions:
        try:
            validate_mqtt_topic_filter(sub.topic_filter)
        except InvalidMqttTopicError as error:
            raise _local(str(error)) from None
        options = _qos(sub.qos, "subscription")
        if sub.no_local:
            options |= 0x04
        if sub.retain_as_published:
            options |= 0x08
        if sub.retain_handling not in (0, 1, 2):
            raise _local(f"retain_handling must be 0, 1 or 2, not {sub.retain_handling!r}")
        options |= sub.retain_handling << 4
        if not v5 and options > 3:
            raise _local("3.1.1 subscriptions carry only a QoS")
        if sub.no_local and sub.topic_filter.startswith("$share/"):
            raise _local("No Local on a shared subscription (v5 MQTT-3.8.3-4)")
        parts.append(_string(sub.topic_filter, "topic filter"))
        parts.append(bytes((options,)))
    return _frame(0x82, b"".join(parts))


def _encode_suback(packet: Suback, version: MqttVersion) -> bytes:
    v5 = _check_version(version)
    codes = packet.reason_codes
    if not codes:
        raise _local("a SUBACK needs at least one code")
    allowed = SUBACK_REASON_CODES if v5 else SUBACK_RETURN_CODES_V311
    for code in codes:
        if code not in allowed:
            raise _local(f"0x{code:02X} is not a SUBACK code (MQTT-3.9.3-2)")
    head = _packet_id_bytes(packet.packet_id, "SUBACK")
    head += _v5_properties(packet.properties, MqttPacketType.SUBACK, v5)
    return _frame(0x90, head + bytes(codes))


def _encode_unsubscribe(packet: Unsubscribe, version: MqttVersion) -> bytes:
    v5 = _check_version(version)
    if not packet.topic_filters:
        raise _local("an UNSUBSCRIBE needs at least one topic filter (MQTT-3.10.3-2)")
    parts = [_packet_id_bytes(packet.packet_id, "UNSUBSCRIBE")]
    parts.append(_v5_properties(packet.properties, MqttPacketType.UNSUBSCRIBE, v5))
    for topic_filter in packet.topic_filters:
        try:
            validate_mqtt_topic_filter(topic_filter)
        except InvalidMqttTopicError as error:
            raise _local(str(error)) from None
        parts.append(_string(topic_filter, "topic filter"))
    return _frame(0xA2, b"".join(parts))


def _encode_unsuback(packet: Unsuback, version: MqttVersion) -> bytes:
    v5 = _check_version(version)
    head = _packet_id_bytes(packet.packet_id, "UNSUBACK")
    if not v5:
        if packet.reason_codes:
            raise _local("a 3.1.1 UNSUBACK carries no reason codes")
        _no_v5_fields(packet.properties, "UNSUBACK")
        return b"\xb0\x02" + head
    if not packet.reason_codes:
        raise _local("a v5 UNSUBACK needs one reason code per topic filter")
    for code in packet.reason_codes:
        if code not in UNSUBACK_REASON_CODES:
            raise _local(f"0x{code:02X} is not an UNSUBACK reason code")
    props = _encode_properties(packet.properties, MqttPacketType.UNSUBACK)
    return _frame(0xB0, head + props + bytes(packet.reason_codes))


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
        raise _local(f"0x{code:02X} is not a {kind.name} reason code")
    if properties.is_empty():
        return bytes((first, 0)) if code == 0 else bytes((first, 1, code))
    return _frame(first, bytes((code,)) + _encode_properties(properties, kind))


def _encode_disconnect(packet: Disconnect, version: MqttVersion) -> bytes:
    if not _check_version(version):
        if packet.reason_code:
            raise _local("a 3.1.1 DISCONNECT has no reason code")
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
        raise _local("AUTH exists only in MQTT 5")
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
        raise _local(f"not an MQTT packet: {packet!r}")
    return encoder(packet, version)
