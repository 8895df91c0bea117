"""The Kafka protocol front of a broker (docs/kafka.md): a thin adapter over the services every
front shares."""

from ._service import KafkaService
from ._translate import ProducedBatch, kafka_record_set, produced_batches
from ._wiring import KafkaWiring

__all__ = [
    "KafkaService",
    "KafkaWiring",
    "ProducedBatch",
    "kafka_record_set",
    "produced_batches",
]
