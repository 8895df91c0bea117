"""Payload converters: what an MQTT PUBLISH's payload becomes in the log, on the brokers' own
MQTT listeners (a rule's ``format=``) and in the MQTT bridge (``--converter``, or a rule's).

A converter is a pure function ``bytes -> bytes`` that raises ``ConversionError`` for a payload it
refuses (a *poison* message). A poison message never blocks the stream: it goes to the
dead-letter topic (the bridge, without one, counts, logs and drops it); either way it is
acknowledged (Kafka Connect's ``errors.tolerance=all`` with an optional DLQ).

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


def parse_json(payload: bytes) -> Any:
    """The one JSON value of ``payload`` (UTF-8, RFC 8259); ``ConversionError`` otherwise."""
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConversionError(f"not UTF-8: {exc}") from None
    try:
        return json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise ConversionError(f"not JSON: {exc}") from None
    except RecursionError:  # "[[[[..." deeper than the interpreter's stack
        raise ConversionError("not JSON: nested too deeply") from None
    except ValueError as exc:  # an integer of more digits than int() takes
        raise ConversionError(f"not JSON: {exc}") from None


def dump_json(document: Any) -> bytes:
    """``document`` as compact UTF-8 JSON (a document ``parse_json`` read)."""
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _no_constant(name: str) -> Any:
    # Python's json reads NaN and Infinity; RFC 8259 has no such values.
    raise ConversionError(f"not JSON: {name} is not a JSON value")


def json_converter(payload: bytes) -> bytes:
    """The payload unchanged, once it is known to be one UTF-8 JSON value."""
    parse_json(payload)
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
        return avro_encode(schema, parse_json(payload))

    return convert


def avro_encode(schema: Schema, document: Any) -> bytes:
    """The JSON ``document`` as Avro binary (schemaless) under ``schema``; ``ConversionError``
    when the schema does not accept it."""
    try:
        fastavro.validation.validate(document, schema, raise_errors=True)
        out = io.BytesIO()
        fastavro.schemaless_writer(out, schema, document)
    except (fastavro.validation.ValidationError, ValueError, TypeError, OverflowError) as exc:
        raise ConversionError(f"does not match the Avro schema: {exc}") from None
    except RecursionError:
        raise ConversionError("does not match the Avro schema: nested too deeply") from None
    return out.getvalue()


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
