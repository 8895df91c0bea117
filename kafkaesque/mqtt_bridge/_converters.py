"""Payload converters of the MQTT bridge: what an upstream PUBLISH's payload becomes in the log.

A converter is a pure function ``bytes -> bytes`` that raises ``ConversionError`` for a payload it
refuses (a *poison* message). The bridge never lets a poison message block the stream: it goes to
the dead-letter topic when one is configured, otherwise it is counted, logged and dropped; either
way it is acknowledged upstream (Kafka Connect's ``errors.tolerance=all`` with an optional DLQ).

* ``raw``: the payload as is.
* ``json``: the payload must be UTF-8 JSON (RFC 8259, one value); it is stored unchanged.
* ``avro``: the payload must be a UTF-8 JSON document that the Avro schema (``--avro-schema``)
  accepts; it is stored as Avro binary, schemaless (``fastavro.schemaless_writer``: no container
  header, no schema id), so a reader decodes it with the same schema file
  (``fastavro.schemaless_reader``). Devices speak JSON, the log holds compact typed records.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fastavro
import fastavro.validation
from fastavro.types import Schema

Converter = Callable[[bytes], bytes]
CONVERTER_NAMES = ("raw", "json", "avro")


class ConversionError(ValueError):
    """The payload is refused; the message says why (it goes into the dead-letter header)."""


def raw_converter(payload: bytes) -> bytes:
    """The payload unchanged."""
    return payload


def _parse_json(payload: bytes) -> Any:
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConversionError(f"not UTF-8: {exc}") from None
    try:
        return json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise ConversionError(f"not JSON: {exc}") from None


def _no_constant(name: str) -> Any:
    # Python's json reads NaN and Infinity; RFC 8259 has no such values.
    raise ConversionError(f"not JSON: {name} is not a JSON value")


def json_converter(payload: bytes) -> bytes:
    """The payload unchanged, once it is known to be one UTF-8 JSON value."""
    _parse_json(payload)
    return payload


def load_avro_schema(path: str | Path) -> Schema:
    """Parse an Avro schema file (JSON); raises ``ValueError`` naming what is wrong."""
    try:
        text = Path(path).read_text(encoding="utf-8")
        return fastavro.parse_schema(json.loads(text))
    except (OSError, json.JSONDecodeError, fastavro.schema.SchemaParseException) as exc:
        raise ValueError(f"Avro schema {path}: {exc}") from None


def avro_converter(schema: Schema) -> Converter:
    """JSON payload -> Avro binary (schemaless) under ``schema``."""

    def convert(payload: bytes) -> bytes:
        document = _parse_json(payload)
        try:
            fastavro.validation.validate(document, schema, raise_errors=True)
        except fastavro.validation.ValidationError as exc:
            raise ConversionError(f"does not match the Avro schema: {exc}") from None
        out = io.BytesIO()
        fastavro.schemaless_writer(out, schema, document)
        return out.getvalue()

    return convert


def make_converter(name: str, avro_schema: str | Path | None = None) -> Converter:
    """The converter called ``name`` (``raw``, ``json`` or ``avro``; ``avro`` needs a schema
    file). Raises ``ValueError`` for an unknown name or a missing or bad schema."""
    if name == "raw":
        return raw_converter
    if name == "json":
        return json_converter
    if name == "avro":
        if avro_schema is None:
            raise ValueError("the avro converter needs --avro-schema FILE")
        return avro_converter(load_avro_schema(avro_schema))
    raise ValueError(f"unknown converter {name!r} (expected one of {', '.join(CONVERTER_NAMES)})")
