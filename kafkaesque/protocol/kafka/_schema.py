"""A message schema of Kafka's kind, and the one encoder and decoder that every API uses.

Kafka describes each request and response in JSON: fields with a type and the versions they
exist in, arrays of structs, nullable versions, and from some version on "flexible" encoding
(compact strings, bytes and arrays, and a tagged-field section after every struct). The schemas
of ``_apis`` are written the same way, from Kafka's message definitions, as ``Field`` lists;
``decode`` and ``encode`` walk them for one version, so a flexible version is an ordinary case
rather than a special one. Messages are plain dicts keyed by the fields' snake_case names (a
field absent in a version is absent from the dict; ``encode`` takes a missing one as its
default: zero, false, null or empty).

Pure; a malformed message raises ``KafkaProtocolError``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from ._wire import KafkaProtocolError, Reader, Writer

Message = dict[str, Any]

_NEVER: Final = 1 << 15
INT32_MIN: Final = -(1 << 31)
"""Kafka's "not given" for an int32 bit set (authorized operations)."""


@dataclass(frozen=True, slots=True)
class Array:
    """An array of ``of``: a primitive type name, or the fields of a struct."""

    of: str | tuple[Field, ...]


@dataclass(frozen=True, slots=True)
class Field:
    """One field: ``kind`` is a primitive (int8, int16, int32, int64, uint16, bool, float64,
    string, bytes, records, uuid) or an ``Array``; it exists in versions ``since``..``until``
    and may be null from version ``nullable_since`` on. ``default`` is what ``encode`` writes
    when the message has no value for it."""

    name: str
    kind: str | Array
    since: int = 0
    until: int = _NEVER
    nullable_since: int = _NEVER
    default: Any = None

    def present(self, version: int) -> bool:
        return self.since <= version <= self.until

    def nullable(self, version: int) -> bool:
        return version >= self.nullable_since


def array(name: str, of: str | Sequence[Field], **kw: Any) -> Field:
    """A field holding an array of a primitive or of structs of ``of``'s fields."""
    return Field(name, Array(of if isinstance(of, str) else tuple(of)), **kw)


@dataclass(frozen=True, slots=True)
class Schema:
    """A request or response: its fields, and the first flexible version."""

    fields: tuple[Field, ...]
    flexible_since: int = _NEVER

    def flexible(self, version: int) -> bool:
        return version >= self.flexible_since


_Reads = Callable[[Reader], Any]
_FIXED_READS: dict[str, _Reads] = {
    "int8": Reader.int8,
    "int16": Reader.int16,
    "uint16": Reader.uint16,
    "int32": Reader.int32,
    "int64": Reader.int64,
    "float64": Reader.float64,
    "bool": Reader.boolean,
    "uuid": Reader.uuid,
}
_FIXED_DEFAULTS: dict[str, Any] = {
    "int8": 0,
    "int16": 0,
    "uint16": 0,
    "int32": 0,
    "int64": 0,
    "float64": 0.0,
    "bool": False,
    "uuid": bytes(16),
}


def decode(schema: Schema, version: int, reader: Reader) -> Message:
    """Read one message of ``schema`` at ``version``."""
    return _read_struct(schema.fields, version, schema.flexible(version), reader)


def _read_struct(fields: Sequence[Field], version: int, flexible: bool, r: Reader) -> Message:
    message: Message = {}
    for f in fields:
        if f.present(version):
            message[f.name] = _read_value(f, f.kind, version, flexible, r)
    if flexible:
        message["_tagged"] = r.tagged_fields()
    return message


def _read_value(f: Field, kind: str | Array, version: int, flexible: bool, r: Reader) -> Any:
    nullable = f.nullable(version)
    if isinstance(kind, Array):
        size = r.array_length(compact=flexible, nullable=nullable)
        if size is None:
            return None
        if isinstance(kind.of, str):
            element = Field(f.name, kind.of)
            return [_read_value(element, kind.of, version, flexible, r) for _ in range(size)]
        return [_read_struct(kind.of, version, flexible, r) for _ in range(size)]
    read = _FIXED_READS.get(kind)
    if read is not None:
        return read(r)
    if kind == "string":
        return r.string(compact=flexible, nullable=nullable)
    if kind in ("bytes", "records"):
        data = r.bytes_(compact=flexible, nullable=nullable or kind == "records")
        return None if data is None else bytes(data)
    raise AssertionError(f"unknown field type {kind!r}")  # a schema bug, not the peer's


def encode(schema: Schema, version: int, message: Message, writer: Writer) -> None:
    """Write ``message`` as ``schema`` at ``version``."""
    _write_struct(schema.fields, version, schema.flexible(version), message, writer)


def _write_struct(
    fields: Sequence[Field], version: int, flexible: bool, message: Message, w: Writer
) -> None:
    for f in fields:
        if f.present(version):
            _write_value(f, f.kind, version, flexible, message.get(f.name, f.default), w)
    if flexible:
        w.tagged_fields(message.get("_tagged"))


def _write_value(
    f: Field, kind: str | Array, version: int, flexible: bool, value: Any, w: Writer
) -> None:
    if isinstance(kind, Array):
        if value is None and not f.nullable(version):
            value = []
        w.array_length(None if value is None else len(value), compact=flexible)
        for item in value or ():
            if isinstance(kind.of, str):
                _write_value(Field(f.name, kind.of), kind.of, version, flexible, item, w)
            else:
                _write_struct(kind.of, version, flexible, item, w)
        return
    if kind in _FIXED_DEFAULTS:
        if value is None:
            value = _FIXED_DEFAULTS[kind]
        getattr(w, "boolean" if kind == "bool" else kind)(value)
    elif kind == "string":
        if value is None and not f.nullable(version):
            value = ""
        w.string(value, compact=flexible)
    elif kind in ("bytes", "records"):
        if value is None and not f.nullable(version) and kind == "bytes":
            value = b""
        w.bytes_(value, compact=flexible)
    else:
        raise AssertionError(f"unknown field type {kind!r}")


@dataclass(frozen=True, slots=True)
class Api:
    """One API: its key, the versions served, and its request and response schemas."""

    key: int
    name: str
    min_version: int
    max_version: int
    request: Schema
    response: Schema
    # Versions a request may be decoded in although they are not listed (none today).
    extra: frozenset[int] = field(default_factory=frozenset)

    def serves(self, version: int) -> bool:
        return self.min_version <= version <= self.max_version


def check_fully_read(reader: Reader, what: str) -> None:
    """A request must end where its schema does: bytes left over mean a bad encoding."""
    if reader.remaining():
        raise KafkaProtocolError(f"{reader.remaining()} bytes left after the {what}")
