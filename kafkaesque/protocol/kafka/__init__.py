"""Kafka's wire protocol, sans I/O: framing and headers, the schemas of the APIs served, and
RecordBatch v2 (docs/kafka.md)."""

from ._apis import (
    API_VERSIONS,
    APIS,
    CREATE_TOPICS,
    DELETE_TOPICS,
    FETCH,
    LIST_OFFSETS,
    METADATA,
    PRODUCE,
)
from ._connection import (
    MAX_REQUEST_BYTES,
    KafkaError,
    KafkaRequest,
    KafkaServerConnection,
    UnsupportedApiVersions,
    decode_response,
    encode_request,
    encode_response,
    parse_request,
    supported_versions,
)
from ._records import (
    CONTROL,
    RAFT_CONTROL_TYPE,
    KafkaBatch,
    KafkaRecord,
    UnsupportedCompression,
    control_batch,
    decode_batch,
    encode_batch,
    iter_batches,
)
from ._schema import Api, Message, Schema
from ._wire import KafkaProtocolError, Reader, Writer

__all__ = [
    "API_VERSIONS",
    "APIS",
    "CONTROL",
    "CREATE_TOPICS",
    "DELETE_TOPICS",
    "FETCH",
    "LIST_OFFSETS",
    "MAX_REQUEST_BYTES",
    "METADATA",
    "PRODUCE",
    "RAFT_CONTROL_TYPE",
    "Api",
    "KafkaBatch",
    "KafkaError",
    "KafkaProtocolError",
    "KafkaRecord",
    "KafkaRequest",
    "KafkaServerConnection",
    "Message",
    "Reader",
    "Schema",
    "UnsupportedApiVersions",
    "UnsupportedCompression",
    "Writer",
    "control_batch",
    "decode_batch",
    "decode_response",
    "encode_batch",
    "encode_request",
    "encode_response",
    "iter_batches",
    "parse_request",
    "supported_versions",
]
