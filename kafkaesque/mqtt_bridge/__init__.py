"""The MQTT bridge: a client of an existing MQTT broker and of the cluster, both ways.

``MqttBridge(BridgeConfig(...)).run`` appends what it receives upstream to log topics, and
publishes the records of ``to_mqtt`` log topics upstream (see ``_bridge``). It uses only the
public client (``kafkaesque.client``) and the sans-I/O MQTT package (``kafkaesque.protocol.mqtt``),
whose client connection options (``MqttClientOptions``) and payload converters it takes and
re-exports for its callers.
"""

from kafkaesque.protocol.mqtt import (
    CONVERTER_NAMES,
    DEFAULT_SESSION_EXPIRY_S,
    ERROR_HEADER,
    TARGET_TOPIC_HEADER,
    ConversionError,
    Converter,
    MqttClientOptions,
    avro_converter,
    json_converter,
    load_avro_schema,
    make_converter,
    raw_converter,
)

from ._bridge import (
    INGEST_RUN,
    BridgeConfig,
    BridgeError,
    BridgeStats,
    MqttBridge,
    subscriptions_for,
)
from ._client import MqttClient, Ticket, open_mqtt_client
from ._records import (
    LogRecord,
    RecordRouter,
    Refused,
    default_filters,
    shared_filter,
    to_log_record,
)

__all__ = [
    "CONVERTER_NAMES",
    "DEFAULT_SESSION_EXPIRY_S",
    "INGEST_RUN",
    "ERROR_HEADER",
    "TARGET_TOPIC_HEADER",
    "BridgeConfig",
    "BridgeError",
    "BridgeStats",
    "ConversionError",
    "Converter",
    "LogRecord",
    "MqttBridge",
    "MqttClient",
    "MqttClientOptions",
    "RecordRouter",
    "Refused",
    "Ticket",
    "avro_converter",
    "default_filters",
    "json_converter",
    "load_avro_schema",
    "make_converter",
    "open_mqtt_client",
    "raw_converter",
    "shared_filter",
    "subscriptions_for",
    "to_log_record",
]
