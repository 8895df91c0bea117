"""MQTT's data representations (§1.5) as the codec reads and writes them, and its errors.

``Reader`` is the bounds-checked cursor every slow-path packet is parsed through; the
``encode_*`` writers and ``frame`` build integers, strings, binary data and the fixed header,
checking each value's range. Errors, sorted by who must act: ``malformed``,
``protocol_error``, ``truncated``, ``bad_utf8`` and ``nul_error`` build the
``MqttProtocolError`` of a peer that broke the protocol (the statement it breaks first);
``local_error`` the ``MqttLocalProtocolError`` of a packet we were asked to encode that is not
valid (nothing is sent).
"""

from __future__ import annotations

import struct
from typing import Final

from ._packets import MqttLocalProtocolError, MqttProtocolError, MqttReasonCode, MqttVersion

MAX_REMAINING_LENGTH: Final = 268_435_455  # FF FF FF 7F, the largest 4-byte VBI

# Validated PUBLISH topics are cached by the decoder (by their wire bytes) and the encoder (by
# the topic): bounded in entries and key length, and cleared when full.
TOPIC_CACHE_ENTRIES: Final = 4096
TOPIC_CACHE_KEY_BYTES: Final = 256

U16 = struct.Struct(">H")
U32 = struct.Struct(">I")

_MALFORMED: Final = MqttReasonCode.MALFORMED_PACKET
_PROTOCOL: Final = MqttReasonCode.PROTOCOL_ERROR

VERSIONS: Final = frozenset(MqttVersion)

# ---------------------------------------------------------------------------------------------
# Errors


def malformed(statement: str, detail: str) -> MqttProtocolError:
    return MqttProtocolError(_MALFORMED, statement, detail)


def protocol_error(statement: str, detail: str) -> MqttProtocolError:
    return MqttProtocolError(_PROTOCOL, statement, detail)


def truncated(what: str) -> MqttProtocolError:
    return malformed("§2.2.3", f"{what} runs past the end of the packet (remaining length)")


def local_error(detail: str) -> MqttLocalProtocolError:
    return MqttLocalProtocolError(detail)


def bad_utf8(what: str) -> MqttProtocolError:
    return malformed("MQTT-1.5.3-1", f"{what} is not well-formed UTF-8 (v5 MQTT-1.5.4-1)")


def nul_error(what: str) -> MqttProtocolError:
    return malformed("MQTT-1.5.3-2", f"{what} contains U+0000 (v5 MQTT-1.5.4-2)")


# ---------------------------------------------------------------------------------------------
# Reading


class Reader:
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
            raise truncated(what)
        self.pos = pos + 1
        return self.buf[pos]

    def u16(self, what: str) -> int:
        pos = self.pos
        if pos + 2 > self.end:
            raise truncated(what)
        self.pos = pos + 2
        return (self.buf[pos] << 8) | self.buf[pos + 1]

    def u32(self, what: str) -> int:
        pos = self.pos
        if pos + 4 > self.end:
            raise truncated(what)
        self.pos = pos + 4
        value: int = U32.unpack_from(self.buf, pos)[0]
        return value

    def vbi(self, what: str) -> int:
        value = 0
        shift = 0
        for count in range(4):
            byte = self.u8(what)
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                if count and not byte:
                    raise malformed("v5 MQTT-1.5.5-1", f"{what} is not minimally encoded")
                return value
            shift += 7
        raise malformed("v5 §1.5.5", f"{what} is longer than 4 bytes")

    def binary(self, what: str) -> bytes:
        size = self.u16(what)
        pos = self.pos
        end = pos + size
        if end > self.end:
            raise truncated(what)
        self.pos = end
        return self.buf[pos:end]

    def utf8(self, what: str) -> str:
        raw = self.binary(what)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise bad_utf8(what) from None
        if "\x00" in text:
            raise nul_error(what)
        return text

    def rest(self) -> bytes:
        data = self.buf[self.pos : self.end]
        self.pos = self.end
        return data

    def finish(self, what: str) -> None:
        if self.pos != self.end:
            raise malformed("§2.2.3", f"{self.end - self.pos} unexpected bytes after the {what}")


# ---------------------------------------------------------------------------------------------
# Writing: every writer checks its value's type and range (a bad one is a local error)


def encode_vbi(value: int) -> bytes:
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


def frame(first: int, body: bytes) -> bytes:
    size = len(body)
    if size < 0x80:
        return bytes((first, size)) + body
    if size > MAX_REMAINING_LENGTH:
        raise local_error(
            f"packet body of {size} bytes exceeds the MQTT maximum {MAX_REMAINING_LENGTH}"
        )
    return bytes((first,)) + encode_vbi(size) + body


def encode_u8(value: int, what: str) -> bytes:
    if not isinstance(value, int) or not 0 <= value <= 0xFF:
        raise local_error(f"{what} {value!r} is outside 0..255")
    return bytes((value,))


def encode_u16(value: int, what: str) -> bytes:
    if not isinstance(value, int) or not 0 <= value <= 0xFFFF:
        raise local_error(f"{what} {value!r} is outside 0..65535")
    return U16.pack(value)


def encode_u32(value: int, what: str) -> bytes:
    if not isinstance(value, int) or not 0 <= value <= 0xFFFF_FFFF:
        raise local_error(f"{what} {value!r} is outside 0..4294967295")
    return U32.pack(value)


def encode_vbi_checked(value: int, what: str) -> bytes:
    if not isinstance(value, int) or not 0 <= value <= MAX_REMAINING_LENGTH:
        raise local_error(f"{what} {value!r} is outside 0..{MAX_REMAINING_LENGTH}")
    return encode_vbi(value)


def encode_binary(value: bytes, what: str) -> bytes:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise local_error(f"{what} must be bytes, not {type(value).__name__}")
    if len(value) > 0xFFFF:
        raise local_error(f"{what} is longer than 65535 bytes")
    return U16.pack(len(value)) + bytes(value)


def encode_string(value: str, what: str) -> bytes:
    if not isinstance(value, str):
        raise local_error(f"{what} must be a str, not {type(value).__name__}")
    if "\x00" in value:
        raise local_error(f"{what} contains U+0000 (MQTT-1.5.3-2)")
    try:
        raw = value.encode("utf-8")
    except UnicodeEncodeError:
        raise local_error(f"{what} contains a surrogate (MQTT-1.5.3-1)") from None
    return encode_binary(raw, what)


def packet_id_bytes(packet_id: int, what: str) -> bytes:
    if not isinstance(packet_id, int) or not 0 < packet_id <= 0xFFFF:
        raise local_error(
            f"{what} packet identifier {packet_id!r} is outside 1..65535 (MQTT-2.3.1-1)"
        )
    return U16.pack(packet_id)
