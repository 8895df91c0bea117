"""The broker: sessions, routing, metadata and consumer groups over the partition Raft groups.

``Broker(config).run`` is one broker (see ``_broker``); ``BrokerConfig`` its settings.
"""

from ._balancer import DEFAULT_HOLD_S
from ._broker import Broker
from ._config import (
    Address,
    BrokerConfig,
    ConfigError,
    config_from_mapping,
    load_config,
    open_warning,
)
from ._decommission import DECOMMISSION_TIMEOUT_S
from ._metadata import ClusterMetadata, ControllerSettings
from ._metadata_view import BrokerInfo, TopicConfig
from ._shutdown import DEFAULT_SHUTDOWN_TIMEOUT_S
from .kafka import (  # pure: what a Kafka Produce and Fetch cost (bench.kafka_codec)
    kafka_record_set,
    produced_batches,
)

__all__ = [
    "DECOMMISSION_TIMEOUT_S",
    "DEFAULT_HOLD_S",
    "DEFAULT_SHUTDOWN_TIMEOUT_S",
    "Address",
    "Broker",
    "BrokerConfig",
    "BrokerInfo",
    "ClusterMetadata",
    "ControllerSettings",
    "ConfigError",
    "TopicConfig",
    "config_from_mapping",
    "load_config",
    "open_warning",
    "kafka_record_set",
    "produced_batches",
]
