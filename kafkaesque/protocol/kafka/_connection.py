"""One Kafka client connection as a pure state machine: bytes in, requests out, responses in
order.

Framing (https://kafka.apache.org/protocol#protocol_common): every request and response is an
int32 size and that many bytes. A request header is api_key, api_version, correlation_id and a
client_id in the classic nullable-string form (header v1); a flexible version adds a tagged-field
section (header v2). A response header is the correlation id (v0), plus tagged fields for a
flexible version (v1), except ApiVersions, whose response header is always v0 (KIP-511).

An ApiVersions request of a version not served gets a v0 answer with error 35 and the list of
what is served (KIP-511), so a newer client can pick a version. Any other API key or version not
served, or a frame larger than ``max_request_bytes``, or a request that does not parse, is a
protocol violation: ``KafkaProtocolError``, and the driver closes the connection (as Kafka does:
it cannot answer what it cannot parse).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Final

from ._apis import API_VERSIONS, APIS
from ._schema import Api, Message, check_fully_read, decode, encode
from ._wire import KafkaProtocolError, Reader, Writer

_SIZE: Final = struct.Struct(">i")
_HEADER: Final = struct.Struct(">hhi")
MAX_REQUEST_BYTES: Final = 100 * 1024 * 1024
"""Kafka's ``socket.request.max.bytes`` default."""


class KafkaError(IntEnum):
    """Kafka's error codes (org.apache.kafka.common.protocol.Errors) that the broker answers."""

    UNKNOWN_SERVER_ERROR = -1
    NONE = 0
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2
    UNKNOWN_TOPIC_OR_PARTITION = 3
    LEADER_NOT_AVAILABLE = 5
    NOT_LEADER_OR_FOLLOWER = 6
    REQUEST_TIMED_OUT = 7
    MESSAGE_TOO_LARGE = 10
    OFFSET_METADATA_TOO_LARGE = 12
    COORDINATOR_LOAD_IN_PROGRESS = 14
    COORDINATOR_NOT_AVAILABLE = 15
    NOT_COORDINATOR = 16
    INVALID_TOPIC_EXCEPTION = 17
    NOT_ENOUGH_REPLICAS = 19
    INVALID_REQUIRED_ACKS = 21
    ILLEGAL_GENERATION = 22
    INCONSISTENT_GROUP_PROTOCOL = 23
    INVALID_GROUP_ID = 24
    UNKNOWN_MEMBER_ID = 25
    INVALID_SESSION_TIMEOUT = 26
    REBALANCE_IN_PROGRESS = 27
    TOPIC_AUTHORIZATION_FAILED = 29
    GROUP_AUTHORIZATION_FAILED = 30
    CLUSTER_AUTHORIZATION_FAILED = 31
    UNSUPPORTED_SASL_MECHANISM = 33
    ILLEGAL_SASL_STATE = 34
    UNSUPPORTED_VERSION = 35
    TOPIC_ALREADY_EXISTS = 36
    INVALID_PARTITIONS = 37
    INVALID_REPLICATION_FACTOR = 38
    INVALID_REPLICA_ASSIGNMENT = 39
    INVALID_CONFIG = 40
    INVALID_REQUEST = 42
    UNSUPPORTED_FOR_MESSAGE_FORMAT = 43
    POLICY_VIOLATION = 44
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    INVALID_PRODUCER_EPOCH = 47
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
    KAFKA_STORAGE_ERROR = 56
    SASL_AUTHENTICATION_FAILED = 58
    NON_EMPTY_GROUP = 68
    GROUP_ID_NOT_FOUND = 69
    MEMBER_ID_REQUIRED = 79
    FENCED_INSTANCE_ID = 82
    FENCED_LEADER_EPOCH = 74
    UNKNOWN_LEADER_EPOCH = 75
    UNSUPPORTED_COMPRESSION_TYPE = 76


@dataclass(frozen=True, slots=True)
class KafkaRequest:
    """A request read off the connection: its API, version, correlation id, client id and body."""

    api: Api
    version: int
    correlation_id: int
    client_id: str | None
    body: Message


@dataclass(frozen=True, slots=True)
class UnsupportedApiVersions:
    """An ApiVersions request of a version not served: answer ``response`` (KIP-511)."""

    correlation_id: int
    response: bytes


def supported_versions() -> list[Message]:
    """The ApiVersions list: every API served, with its version range."""
    return [
        {"api_key": api.key, "min_version": api.min_version, "max_version": api.max_version}
        for api in sorted(APIS.values(), key=lambda a: a.key)
    ]


class KafkaServerConnection:
    """Frames and parses requests; encodes responses (see the module docstring)."""

    def __init__(self, max_request_bytes: int = MAX_REQUEST_BYTES) -> None:
        self._buffer = bytearray()
        self._max = max_request_bytes

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        self._buffer += data

    def next_request(self) -> KafkaRequest | UnsupportedApiVersions | None:
        """The next whole request, or None until more bytes come. Raises
        ``KafkaProtocolError`` for a frame that is too large or does not parse."""
        frame = self.next_frame(_HEADER.size + 2)
        return None if frame is None else parse_request(frame)

    def next_frame(self, min_size: int = 0) -> bytes | None:
        """The next whole frame's bytes (without its size), unparsed, or None until more bytes
        come: what a SaslHandshake v0 exchange sends, its SASL tokens as bare frames. Raises
        ``KafkaProtocolError`` for a size below ``min_size`` or above the maximum."""
        buf = self._buffer
        if len(buf) < 4:
            return None
        (size,) = _SIZE.unpack_from(buf, 0)
        if size < min_size or size > self._max:
            raise KafkaProtocolError(f"request size {size} out of bounds (max {self._max})")
        if len(buf) < 4 + size:
            return None
        frame = bytes(buf[4 : 4 + size])
        del buf[: 4 + size]
        return frame

    @property
    def buffered(self) -> int:
        return len(self._buffer)


def parse_request(frame: bytes) -> KafkaRequest | UnsupportedApiVersions:
    """One request frame (without its size)."""
    reader = Reader(frame)
    api_key, version, correlation_id = reader.int16(), reader.int16(), reader.int32()
    client_id = reader.string(compact=False, nullable=True)
    api = APIS.get(api_key)
    if api is None:
        raise KafkaProtocolError(f"unknown API key {api_key}")
    if not api.serves(version):
        if api is API_VERSIONS:
            body: Message = {
                "error_code": KafkaError.UNSUPPORTED_VERSION,
                "api_keys": supported_versions(),
            }
            return UnsupportedApiVersions(correlation_id, _frame(correlation_id, api, 0, body))
        raise KafkaProtocolError(f"{api.name} v{version} is not served")
    if api.request.flexible(version):
        reader.tagged_fields()  # the request header's (v2)
    body = decode(api.request, version, reader)
    check_fully_read(reader, f"{api.name} v{version} request")
    return KafkaRequest(api, version, correlation_id, client_id, body)


def encode_response(request: KafkaRequest, body: Message) -> bytes:
    """The framed response to ``request``."""
    return _frame(request.correlation_id, request.api, request.version, body)


def _frame(correlation_id: int, api: Api, version: int, body: Message) -> bytes:
    w = Writer()
    w.int32(0)  # the size, filled in below
    w.int32(correlation_id)
    if api.response.flexible(version) and api is not API_VERSIONS:
        w.tagged_fields()  # response header v1
    encode(api.response, version, body, w)
    _SIZE.pack_into(w.buf, 0, len(w.buf) - 4)
    return bytes(w.buf)


def frame_bytes(data: bytes) -> bytes:
    """``data`` as one frame: its int32 size, then itself (a bare SASL token's frame)."""
    return _SIZE.pack(len(data)) + data


def encode_request(
    api: Api, version: int, correlation_id: int, client_id: str | None, body: Message
) -> bytes:
    """A framed request (for tests and tools: the broker only answers)."""
    w = Writer()
    w.int32(0)
    w.buf += _HEADER.pack(api.key, version, correlation_id)
    w.string(client_id, compact=False)
    if api.request.flexible(version):
        w.tagged_fields()
    encode(api.request, version, body, w)
    _SIZE.pack_into(w.buf, 0, len(w.buf) - 4)
    return bytes(w.buf)


def decode_response(api: Api, version: int, frame: bytes) -> tuple[int, Message]:
    """(correlation id, body) of a response frame without its size (for tests and tools)."""
    reader = Reader(frame)
    correlation_id = reader.int32()
    if api.response.flexible(version) and api is not API_VERSIONS:
        reader.tagged_fields()
    body = decode(api.response, version, reader)
    check_fully_read(reader, f"{api.name} v{version} response")
    return correlation_id, body
