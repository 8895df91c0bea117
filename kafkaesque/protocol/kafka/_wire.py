"""Kafka's primitive types on the wire: a reader over received bytes and a writer of bytes.

Big-endian fixed-width integers, unsigned and zig-zag varints, strings and byte arrays in their
classic (int16/int32 length, -1 for null) and compact (unsigned varint length + 1, 0 for null)
forms, UUIDs and tagged-field sections (https://kafka.apache.org/protocol#protocol_types).
Pure: a malformed input raises ``KafkaProtocolError``, never anything else.
"""

from __future__ import annotations

import struct
from typing import Final

_I8: Final = struct.Struct(">b")
_I16: Final = struct.Struct(">h")
_U16: Final = struct.Struct(">H")
_I32: Final = struct.Struct(">i")
_U32: Final = struct.Struct(">I")
_I64: Final = struct.Struct(">q")
_F64: Final = struct.Struct(">d")


class KafkaProtocolError(Exception):
    """The peer sent bytes that are not a valid Kafka message (a protocol violation)."""


class Reader:
    """Reads primitives from ``data`` from position ``pos`` on."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes | memoryview, pos: int = 0) -> None:
        self.data = memoryview(data)
        self.pos = pos

    def remaining(self) -> int:
        return len(self.data) - self.pos

    def _fixed(self, st: struct.Struct) -> int:
        end = self.pos + st.size
        if end > len(self.data):
            raise KafkaProtocolError(f"truncated: {st.size} bytes wanted at {self.pos}")
        (value,) = st.unpack_from(self.data, self.pos)
        self.pos = end
        return int(value)

    def int8(self) -> int:
        return self._fixed(_I8)

    def int16(self) -> int:
        return self._fixed(_I16)

    def uint16(self) -> int:
        return self._fixed(_U16)

    def int32(self) -> int:
        return self._fixed(_I32)

    def uint32(self) -> int:
        return self._fixed(_U32)

    def int64(self) -> int:
        return self._fixed(_I64)

    def float64(self) -> float:
        end = self.pos + 8
        if end > len(self.data):
            raise KafkaProtocolError("truncated float64")
        (value,) = _F64.unpack_from(self.data, self.pos)
        self.pos = end
        return float(value)

    def boolean(self) -> bool:
        return self.int8() != 0

    def uvarint(self) -> int:
        result = 0
        shift = 0
        data = self.data
        while True:
            if self.pos >= len(data):
                raise KafkaProtocolError("truncated varint")
            byte = data[self.pos]
            self.pos += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7
            if shift > 63:
                raise KafkaProtocolError("varint longer than 10 bytes")

    def varint(self) -> int:
        """A zig-zag signed varint (varint and varlong alike)."""
        raw = self.uvarint()
        return (raw >> 1) ^ -(raw & 1)

    def raw(self, size: int) -> memoryview:
        if size < 0 or self.pos + size > len(self.data):
            raise KafkaProtocolError(f"length {size} runs past the end ({self.remaining()} left)")
        view = self.data[self.pos : self.pos + size]
        self.pos += size
        return view

    def _text(self, size: int) -> str:
        try:
            return str(self.raw(size), "utf-8")
        except UnicodeDecodeError as exc:
            raise KafkaProtocolError(f"a string is not UTF-8: {exc}") from None

    def string(self, *, compact: bool, nullable: bool) -> str | None:
        size = self.uvarint() - 1 if compact else self.int16()
        if size < 0:
            if size == -1 and nullable:
                return None
            raise KafkaProtocolError(f"invalid string length {size}")
        return self._text(size)

    def bytes_(self, *, compact: bool, nullable: bool) -> memoryview | None:
        size = self.uvarint() - 1 if compact else self.int32()
        if size < 0:
            if size == -1 and nullable:
                return None
            raise KafkaProtocolError(f"invalid bytes length {size}")
        return self.raw(size)

    def array_length(self, *, compact: bool, nullable: bool) -> int | None:
        size = self.uvarint() - 1 if compact else self.int32()
        if size < 0:
            if size == -1 and nullable:
                return None
            raise KafkaProtocolError(f"invalid array length {size}")
        if size > self.remaining():  # every element takes a byte at least
            raise KafkaProtocolError(f"array of {size} elements in {self.remaining()} bytes")
        return size

    def uuid(self) -> bytes:
        return bytes(self.raw(16))

    def tagged_fields(self) -> dict[int, bytes]:
        """A tagged-field section: tag -> raw value (unknown tags are kept, not interpreted)."""
        count = self.uvarint()
        if count > self.remaining():
            raise KafkaProtocolError(f"{count} tagged fields in {self.remaining()} bytes")
        fields: dict[int, bytes] = {}
        last = -1
        for _ in range(count):
            tag = self.uvarint()
            if tag <= last:
                raise KafkaProtocolError("tagged fields out of order")
            last = tag
            fields[tag] = bytes(self.raw(self.uvarint()))
        return fields


class Writer:
    """Appends primitives to a bytearray."""

    __slots__ = ("buf",)

    def __init__(self) -> None:
        self.buf = bytearray()

    def int8(self, value: int) -> None:
        self.buf += _I8.pack(value)

    def int16(self, value: int) -> None:
        self.buf += _I16.pack(value)

    def uint16(self, value: int) -> None:
        self.buf += _U16.pack(value)

    def int32(self, value: int) -> None:
        self.buf += _I32.pack(value)

    def uint32(self, value: int) -> None:
        self.buf += _U32.pack(value)

    def int64(self, value: int) -> None:
        self.buf += _I64.pack(value)

    def float64(self, value: float) -> None:
        self.buf += _F64.pack(value)

    def boolean(self, value: bool) -> None:
        self.buf.append(1 if value else 0)

    def uvarint(self, value: int) -> None:
        self.buf += encode_uvarint(value)

    def varint(self, value: int) -> None:
        self.buf += encode_varint(value)

    def raw(self, data: bytes | bytearray | memoryview) -> None:
        self.buf += data

    def string(self, value: str | None, *, compact: bool) -> None:
        if value is None:
            self._length(-1, compact=compact, wide=False)
            return
        data = value.encode()
        self._length(len(data), compact=compact, wide=False)
        self.buf += data

    def bytes_(self, value: bytes | bytearray | memoryview | None, *, compact: bool) -> None:
        if value is None:
            self._length(-1, compact=compact, wide=True)
            return
        self._length(len(value), compact=compact, wide=True)
        self.buf += value

    def array_length(self, size: int | None, *, compact: bool) -> None:
        self._length(-1 if size is None else size, compact=compact, wide=True)

    def _length(self, size: int, *, compact: bool, wide: bool) -> None:
        if compact:
            self.uvarint(size + 1)
        elif wide:
            self.int32(size)
        else:
            self.int16(size)

    def uuid(self, value: bytes) -> None:
        if len(value) != 16:
            raise ValueError("a UUID is 16 bytes")
        self.buf += value

    def tagged_fields(self, fields: dict[int, bytes] | None = None) -> None:
        fields = fields or {}
        self.uvarint(len(fields))
        for tag in sorted(fields):
            self.uvarint(tag)
            self.uvarint(len(fields[tag]))
            self.buf += fields[tag]


def _uvarint(value: int) -> bytes:
    if value < 0:
        raise ValueError("an unsigned varint cannot be negative")
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


# Every varint of one or two bytes, made once: a record's lengths, deltas and counts are
# mostly that small, and a fetch encodes several of them for each record it returns.
_SMALL_LIMIT: Final = 1 << 14
_SMALL: Final = tuple(_uvarint(v) for v in range(_SMALL_LIMIT))


def encode_uvarint(value: int) -> bytes:
    if 0 <= value < _SMALL_LIMIT:
        return _SMALL[value]
    return _uvarint(value)


def encode_varint(value: int) -> bytes:
    """A zig-zag signed varint (64-bit)."""
    zigzag = (value << 1) ^ (value >> 63)
    if zigzag < _SMALL_LIMIT:
        return _SMALL[zigzag]
    return _uvarint(zigzag)
