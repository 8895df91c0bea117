"""The Kafkaesque client: blocking and trio flavours of one library.

Blocking::

    with Client("127.0.0.1:9092") as client:
        client.create_topic("orders", partitions=3, replication_factor=3)
        with Producer(client) as producer:
            future = producer.send("orders", b"hello", key=b"customer-7")
        print(future.get())                      # RecordMetadata(partition, offset, ...)
        with Consumer(client) as consumer:
            consumer.assign_topic("orders")
            for record in consumer.records(follow=False):
                print(record.partition, record.offset, record.value)

Trio::

    async with AsyncClient(bootstrap) as client, open_producer(client) as producer:
        future = await producer.send("orders", b"hello")
        metadata = await future.get()

Security (docs/security.md): ``ClientConfig(security=Security("SASL_SSL", username="alice",
password=..., ssl_cafile="ca.pem"))`` makes every connection do TLS, then SCRAM-SHA-256, before its
first command (``Security.from_options`` reads Kafka's ``security.protocol``, ``sasl.*`` and
``ssl.*`` keys); ACLs are managed with ``Client.add_acl``, ``remove_acl`` and ``list_acls``.

Errors are ``KafkaesqueError`` (``code``, ``retriable``, ``outcome_unknown``); connection failures
are its subclass ``KafkaesqueConnectionError``; a refused TLS handshake or SASL exchange is
``AUTH_FAILED`` (not retriable). Delivery is at least once: see ``ProducerCore``.
The sans-I/O cores (``ProducerCore``, ``ConsumerCore``, ``ConnectionCore``, ``_steps``) hold every
decision; the drivers only move bytes and time.
"""

from kafkaesque.protocol import ErrorCode  # the type of ``KafkaesqueError.code``

from ._calls import Call, ConsBatch, GroupDescription, Pinned
from ._consumer_core import (
    ConsumerCore,
    ConsumerRecord,
    FetchResult,
    OffsetReset,
    TopicPartition,
    decode_fetch,
)
from ._errors import KafkaesqueConnectionError, KafkaesqueError
from ._fetched import (
    BatchSpan,
    CorruptBatchError,
    FetchedBatch,
    batch_records,
    data_batches,
    kafka_records,
)
from ._metadata import ClusterMetadata, TopicDescription, parse_bootstrap
from ._partitioner import Partitioning, RoundRobinPartitioner, StickyPartitioner
from ._producer_core import (
    DeliveryHandle,
    ProducerConfig,
    ProducerCore,
    RecordMetadata,
    SendRequest,
)
from ._retry import RetryDecision, RetryPolicy, retry_decision
from ._security import SaslHandshake, Security
from ._steps import ClientConfig, ClusterState, PinnedState
from ._sync import DEFAULT_BOOTSTRAP, Client, Consumer, GroupConsumer, Producer, RecordFuture
from ._sync_connection import SyncConnection
from ._trio import (
    AsyncClient,
    AsyncConsumer,
    AsyncGroupConsumer,
    AsyncProducer,
    AsyncRecordFuture,
    open_producer,
)
from ._trio_connection import TrioConnection
from ._wire import ConnectionCore, ListResponse, Response

__all__ = [
    "DEFAULT_BOOTSTRAP",
    "AsyncClient",
    "AsyncConsumer",
    "AsyncGroupConsumer",
    "AsyncProducer",
    "AsyncRecordFuture",
    "BatchSpan",
    "Call",
    "Client",
    "ClientConfig",
    "ClusterMetadata",
    "ClusterState",
    "ConnectionCore",
    "ConsBatch",
    "Consumer",
    "ConsumerCore",
    "ConsumerRecord",
    "CorruptBatchError",
    "DeliveryHandle",
    "ErrorCode",
    "FetchResult",
    "FetchedBatch",
    "GroupConsumer",
    "GroupDescription",
    "KafkaesqueConnectionError",
    "KafkaesqueError",
    "ListResponse",
    "OffsetReset",
    "Partitioning",
    "Pinned",
    "PinnedState",
    "Producer",
    "ProducerConfig",
    "ProducerCore",
    "RecordFuture",
    "RecordMetadata",
    "Response",
    "RetryDecision",
    "RetryPolicy",
    "RoundRobinPartitioner",
    "SaslHandshake",
    "Security",
    "SendRequest",
    "StickyPartitioner",
    "SyncConnection",
    "TopicDescription",
    "TopicPartition",
    "TrioConnection",
    "batch_records",
    "data_batches",
    "kafka_records",
    "decode_fetch",
    "open_producer",
    "parse_bootstrap",
    "retry_decision",
]
