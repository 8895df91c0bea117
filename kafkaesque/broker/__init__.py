"""The broker: sessions, routing, metadata and consumer groups over the partition Raft groups.

``Broker(config).run`` is one broker (see ``_broker``); ``BrokerConfig`` its settings.
"""

from ._broker import Broker
from ._config import Address, BrokerConfig, ConfigError, config_from_mapping, load_config

__all__ = ["Address", "Broker", "BrokerConfig", "ConfigError", "config_from_mapping", "load_config"]
