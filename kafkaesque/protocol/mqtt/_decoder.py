"""Sans-I/O MQTT 3.1.1 / 5.0 decoder: ``MqttDecoder`` (bytes in, packets out); ``_encoder`` is the
other half of the codec (``encode_mqtt``).

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

Here: the first-byte checks, the framing, the inline PUBLISH and short PUBACK (the hot path)
and CONNECT (which fixes the version); every other packet is read by ``_packet_decoders``.
"""

from __future__ import annotations

import functools
from typing import Final

from ._packet_decoders import PACKET_DECODERS
from ._packets import (
    MQTT_NEED_DATA,
    NO_PROPERTIES,
    Connect,
    MqttNeedData,
    MqttPacket,
    MqttPacketType,
    MqttProtocolError,
    MqttReasonCode,
    MqttUnsupportedProtocolError,
    MqttVersion,
    Puback,
    Publish,
    Will,
)
from ._properties import WILL_PROPERTIES, read_properties
from ._wire import (
    MAX_REMAINING_LENGTH,
    TOPIC_CACHE_ENTRIES,
    TOPIC_CACHE_KEY_BYTES,
    VERSIONS,
    Reader,
    bad_utf8,
    malformed,
    nul_error,
    protocol_error,
    truncated,
)

MQTT_DEFAULT_MAX_PACKET_SIZE: Final = 1024 * 1024
MAX_PACKET_SIZE_LIMIT: Final = MAX_REMAINING_LENGTH + 5  # fixed header byte + 4 length bytes

_object_new = object.__new__
_object_setattr = object.__setattr__

_V31: Final = MqttVersion.V31
_V311: Final = MqttVersion.V311
_V5: Final = MqttVersion.V5

_TOPIC_INVALID: Final = MqttReasonCode.TOPIC_NAME_INVALID

# The (protocol name, level) pairs a CONNECT may carry (MQTT-3.1.2-1, -2).
_PROTOCOLS: Final = {("MQIsdp", 3): _V31, ("MQTT", 4): _V311, ("MQTT", 5): _V5}

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
        if version is not None and version not in VERSIONS:
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
                        raise truncated("topic name")
                    cursor = start + 2 + ((buf[start] << 8) | buf[start + 1])
                    if cursor > end:
                        raise truncated("topic name")
                    raw_topic = buf[start + 2 : cursor]
                    topic = topic_cache.get(raw_topic)
                    if topic is None:
                        topic = _publish_topic(raw_topic)
                    qos = flags >> 1 & 3
                    if qos:
                        if cursor + 2 > end:
                            raise truncated("packet identifier")
                        packet_id = (buf[cursor] << 8) | buf[cursor + 1]
                        if not packet_id:
                            raise malformed("MQTT-2.3.1-1", "PUBLISH with packet identifier 0")
                        cursor += 2
                    else:
                        packet_id = 0
                    properties = NO_PROPERTIES
                    if v5:
                        if cursor < end and not buf[cursor]:
                            cursor += 1
                        else:
                            reader = Reader(buf, cursor, end)
                            properties = read_properties(reader, MqttPacketType.PUBLISH)
                            cursor = reader.pos
                            if server_side and properties.subscription_identifiers:
                                raise protocol_error(
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
                        raise malformed("MQTT-2.3.1-1", "PUBACK with packet identifier 0")
                    packet = _object_new(Puback)
                    _object_setattr(
                        packet,
                        "__dict__",
                        {"packet_id": packet_id, "reason_code": 0, "properties": NO_PROPERTIES},
                    )
                else:
                    packet = self._decode_other(ptype, Reader(buf, start, end))
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
        return malformed(*problem)

    def _unexpected_type(self, ptype: int) -> MqttProtocolError:
        if ptype == 0 or (ptype == MqttPacketType.AUTH and self._version != _V5):
            return malformed("MQTT-2.2.1", f"reserved packet type {ptype}")
        name = MqttPacketType(ptype).name
        if self._version is None:
            return protocol_error("MQTT-3.1.0-1", f"the first packet must be CONNECT, not {name}")
        if ptype == MqttPacketType.CONNECT and self._server_side:
            return protocol_error("MQTT-3.1.0-2", "a second CONNECT")
        side = "client" if self._server_side else "server"
        return protocol_error("§2.1.2", f"{name} is never sent by a {side} in MQTT {self._version}")

    def _decode_other(self, ptype: int, reader: Reader) -> MqttPacket:
        """Decode any packet but the fast-path PUBLISH/PUBACK."""
        if ptype == MqttPacketType.CONNECT:
            return self._decode_connect(reader)
        version = self._version
        assert version is not None
        decoder = PACKET_DECODERS[ptype]
        return decoder(reader, version == _V5, self._server_side)

    def _decode_connect(self, reader: Reader) -> Connect:
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
            raise malformed("MQTT-3.1.2-3", "CONNECT reserved flag is set")
        will_flag = flags & 0x04
        will_qos = flags >> 3 & 3
        will_retain = flags & 0x20
        if not will_flag and will_qos:
            raise malformed("MQTT-3.1.2-13", "Will QoS set without the Will flag")
        if not will_flag and will_retain:
            raise malformed("MQTT-3.1.2-15", "Will Retain set without the Will flag")
        if will_qos == 3:
            raise malformed("MQTT-3.1.2-14", "Will QoS 3 (v5 MQTT-3.1.2-12)")
        has_username = flags & 0x80
        has_password = flags & 0x40
        if has_password and not has_username and not v5:
            raise malformed("MQTT-3.1.2-22", "password flag set without the user name flag")
        keep_alive = reader.u16("keep alive")
        properties = read_properties(reader, MqttPacketType.CONNECT) if v5 else NO_PROPERTIES
        if properties.authentication_data is not None and properties.authentication_method is None:
            raise protocol_error("v5 §3.1.2.11.10", "authentication data without a method")
        client_id = reader.utf8("client identifier")
        will = None
        if will_flag:
            will_properties = read_properties(reader, WILL_PROPERTIES) if v5 else NO_PROPERTIES
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


def _publish_topic(raw: bytes) -> str:
    """Decode and check a PUBLISH topic name; "" is returned (the caller checks for an alias)."""
    try:
        topic = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise bad_utf8("topic name") from None
    if "+" in topic or "#" in topic:
        raise MqttProtocolError(_TOPIC_INVALID, "MQTT-3.3.2-2", "wildcard in a PUBLISH topic name")
    if "\x00" in topic:
        raise nul_error("topic name")
    if topic and len(raw) <= TOPIC_CACHE_KEY_BYTES:
        if len(_TOPIC_CACHE) >= TOPIC_CACHE_ENTRIES:
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
                raise malformed("v5 MQTT-1.5.5-1", "remaining length is not minimally encoded")
            return value, index - pos
        shift += 7
    raise malformed("§2.2.3", "remaining length is longer than 4 bytes")
