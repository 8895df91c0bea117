"""``GET /openapi.json``: our own OpenAPI 3.0 document of the REST API (docs/http.md).

Written here, not copied: the paths and field names follow Confluent REST Proxy v2's (interface
facts that Redpanda's and Strimzi's proxies share); the text and structure are ours.
"""

from __future__ import annotations

from typing import Any

from ._rest_admin import add_admin_paths
from ._rest_consumers import consumer_paths

_BINARY = "application/vnd.kafka.binary.v2+json"
_JSON = "application/vnd.kafka.json.v2+json"
_V2 = "application/vnd.kafka.v2+json"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _errors(*statuses: int) -> dict[str, Any]:
    described = {
        "401": "Authentication required or failed (HTTP Basic over HTTPS)",
        "403": "Not allowed by the ACLs",
        "404": "Unknown topic, partition or resource",
        "405": "Method not allowed",
        "406": "The Accept header names no format served",
        "409": "Conflict (for instance LATEST on a topic that is not compacted)",
        "413": "The request body is too large",
        "415": "The Content-Type is not a format served",
        "416": "The offset is outside the log",
        "422": "The payload or a parameter is malformed",
        "500": "Internal error",
        "503": "Retriable: retry after the Retry-After seconds",
        "504": "Timed out: a write may or may not have been applied (maybe_applied)",
    }
    return {
        str(s): {
            "description": described[str(s)],
            "content": {"application/json": {"schema": _ref("Error")}},
        }
        for s in statuses
    }


_COMMON = (401, 403, 500, 503)


def _path_param(name: str, schema: dict[str, Any], what: str, example: object) -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "schema": schema,
        "description": what,
        "example": example,
    }


_TOPIC = _path_param(
    "topic",
    {"type": "string", "pattern": "^[A-Za-z0-9._-]+$", "maxLength": 249},
    "a topic",
    "phone-beats",
)
_PARTITION = _path_param(
    "partition", {"type": "integer", "minimum": 0, "maximum": 999999999}, "a partition", 0
)


_ACKS = {
    "name": "acks",
    "in": "query",
    "required": False,
    "schema": {"type": "string", "enum": ["all", "-1", "1", "leader"], "default": "all"},
    "description": "all (-1): answered once a Raft majority has the records on disk; "
    "1 (leader): once the leader appended them. acks=0 is not offered.",
}


def _produce(with_partition: bool) -> dict[str, Any]:
    params = [_TOPIC, _PARTITION, _ACKS] if with_partition else [_TOPIC, _ACKS]
    return {
        "summary": "Produce records"
        + (" to one partition" if with_partition else " (partition by key, else round-robin)"),
        "description": "One PUBB command per partition; nothing is written if any record is "
        "malformed. One report per record, in order. To one partition, producer_id, "
        "producer_epoch and sequence (all three) make it idempotent: a retried request is "
        "answered with the first one's offsets, not written again.",
        "parameters": params,
        "requestBody": {
            "required": True,
            "content": {
                _BINARY: {
                    "schema": _ref("ProduceBinary"),
                    "example": {"records": [{"key": "cGhvbmUtMQ==", "value": "aGVsbG8="}]},
                },
                _JSON: {
                    "schema": _ref("ProduceJson"),
                    "example": {"records": [{"key": "phone-1", "value": {"battery": 81}}]},
                },
            },
        },
        "responses": {
            "200": {
                "description": "One report per record",
                "content": {_V2: {"schema": _ref("ProduceResponse")}},
            },
            **_errors(404, 409, 413, 415, 422, 504, *_COMMON),
        },
    }


def _records_response() -> dict[str, Any]:
    return {
        _BINARY: {"schema": {"type": "array", "items": _ref("RecordBinary")}},
        _JSON: {"schema": {"type": "array", "items": _ref("RecordJson")}},
    }


def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.0 document of the REST API, as a JSON-ready dict."""
    nullable_b64 = {"type": "string", "format": "byte", "nullable": True}
    header = {
        "type": "object",
        "required": ["name"],
        "additionalProperties": False,
        "properties": {"name": {"type": "string"}, "value": nullable_b64},
    }
    headers = {"type": "array", "items": _ref("Header"), "nullable": True}
    partition = {"type": "integer", "minimum": 0, "maximum": 999999999, "nullable": True}
    producer = {
        "producer_id": {"type": "integer", "minimum": 0, "maximum": (1 << 63) - 1},
        "producer_epoch": {"type": "integer", "minimum": 0, "maximum": (1 << 15) - 1},
        "sequence": {
            "type": "integer",
            "minimum": 0,
            "maximum": (1 << 31) - 1,
            "description": "the producer's sequence of the first record on this partition",
        },
    }
    record_common = {
        "topic": {"type": "string"},
        "partition": {"type": "integer"},
        "offset": {"type": "integer"},
        "timestamp": {"type": "integer", "description": "milliseconds since the epoch"},
        "headers": {"type": "array", "items": _ref("Header")},
    }
    schemas: dict[str, Any] = {
        "Error": {
            "type": "object",
            "required": ["error_code", "message"],
            "properties": {
                "error_code": {"type": "integer", "description": "HTTP status * 100 + detail"},
                "code": {"type": "string", "description": "our error code (docs/protocol.md)"},
                "message": {"type": "string"},
                "retriable": {"type": "boolean"},
                "maybe_applied": {"type": "boolean"},
            },
        },
        "Header": header,
        "ProduceBinary": {
            "type": "object",
            "required": ["records"],
            "additionalProperties": False,
            "properties": {
                "records": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "key": nullable_b64,
                            "value": nullable_b64,
                            "partition": partition,
                            "headers": headers,
                        },
                    },
                },
                **producer,
            },
        },
        "ProduceJson": {
            "type": "object",
            "required": ["records"],
            "additionalProperties": False,
            "properties": {
                "records": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "key": {"description": "a string is stored as its UTF-8 text"},
                            "value": {"description": "stored as compact JSON"},
                            "partition": partition,
                            "headers": headers,
                        },
                    },
                },
                **producer,
            },
        },
        "ProduceResponse": {
            "type": "object",
            "required": ["offsets"],
            "properties": {
                "offsets": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "partition": {"type": "integer"},
                            "offset": {"type": "integer", "nullable": True},
                            "error_code": {"type": "integer"},
                            "error": {"type": "string"},
                            "retriable": {"type": "boolean"},
                            "maybe_applied": {"type": "boolean"},
                        },
                    },
                }
            },
        },
        "RecordBinary": {
            "type": "object",
            "properties": {**record_common, "key": nullable_b64, "value": nullable_b64},
        },
        "RecordJson": {
            "type": "object",
            "properties": {
                **record_common,
                "key": {"type": "string", "nullable": True},
                "value": {"nullable": True},
            },
        },
        "Latest": {
            "type": "object",
            "properties": {
                "topic": {"type": "string"},
                "partition": {"type": "integer"},
                "offset": {"type": "integer"},
                "key": {"nullable": True},
                "value": {"nullable": True},
            },
        },
        "Topic": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "configs": {"type": "object"},
                "partitions": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "partition": {"type": "integer"},
                            "leader": {"type": "integer", "nullable": True},
                            "replicas": {"type": "array", "items": {"type": "integer"}},
                            "start_offset": {"type": "integer", "nullable": True},
                            "end_offset": {"type": "integer", "nullable": True},
                        },
                    },
                },
            },
        },
        "Brokers": {
            "type": "object",
            "properties": {
                "brokers": {"type": "array", "items": {"type": "integer"}},
                "details": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "id": {"type": "integer"},
                            "host": {"type": "string"},
                            "port": {"type": "integer", "description": "the line protocol's"},
                            **{
                                f"{name}_port": {"type": "integer", "nullable": True}
                                for name in ("mqtt", "mqtt_tls", "mqtt_ws", "kafka", "http")
                            },
                        },
                    },
                },
            },
        },
    }
    paths: dict[str, Any] = {
        "/topics": {
            "get": {
                "summary": "List the topics (TOPICS)",
                "responses": {
                    "200": {
                        "description": "Topic names",
                        "content": {
                            _V2: {"schema": {"type": "array", "items": {"type": "string"}}}
                        },
                    },
                    **_errors(*_COMMON),
                },
            }
        },
        "/topics/{topic}": {
            "get": {
                "summary": "Describe a topic (DESCRIBE)",
                "parameters": [_TOPIC],
                "responses": {
                    "200": {
                        "description": "The topic, its configuration and partitions",
                        "content": {_V2: {"schema": _ref("Topic")}},
                    },
                    **_errors(404, *_COMMON),
                },
            },
            "post": _produce(False),
        },
        "/topics/{topic}/partitions/{partition}": {"post": _produce(True)},
        "/topics/{topic}/partitions/{partition}/records": {
            "get": {
                "summary": "Read records by offset (FETCH)",
                "parameters": [
                    _TOPIC,
                    _PARTITION,
                    {
                        "name": "offset",
                        "in": "query",
                        "required": True,
                        "schema": {"type": "integer", "minimum": 0},
                        "example": 0,
                    },
                    {
                        "name": "max_bytes",
                        "in": "query",
                        "schema": {"type": "integer", "minimum": 1, "maximum": 8388608},
                    },
                    {
                        "name": "timeout",
                        "in": "query",
                        "description": "milliseconds to wait for a record (long poll)",
                        "schema": {"type": "integer", "minimum": 0, "maximum": 30000},
                    },
                ],
                "responses": {
                    "200": {"description": "Committed records", "content": _records_response()},
                    **_errors(404, 406, 416, 422, *_COMMON),
                },
            }
        },
        "/topics/{topic}/latest/{key}": {
            "get": {
                "summary": "The latest value of a key in a compacted topic (LATEST)",
                "parameters": [
                    _TOPIC,
                    _path_param(
                        "key", {"type": "string", "minLength": 1}, "the key (UTF-8)", "phone-1"
                    ),
                ],
                "responses": {
                    "200": {
                        "description": "The key's latest record",
                        "content": {
                            _BINARY: {"schema": _ref("Latest")},
                            _JSON: {"schema": _ref("Latest")},
                        },
                    },
                    **_errors(404, 406, 409, *_COMMON),
                },
            }
        },
        "/brokers": {
            "get": {
                "summary": "The brokers (METADATA)",
                "responses": {
                    "200": {
                        "description": "Broker ids and addresses",
                        "content": {_V2: {"schema": _ref("Brokers")}},
                    },
                    **_errors(*_COMMON),
                },
            }
        },
    }
    paths.update(consumer_paths())
    add_admin_paths(paths)
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "Kafkaesque REST API",
            "version": "1",
            "description": "Confluent REST Proxy v2 shapes, served by every broker; each call "
            "is the line-protocol command named in its summary (docs/http.md).",
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"basic": {"type": "http", "scheme": "basic"}},
        },
    }
