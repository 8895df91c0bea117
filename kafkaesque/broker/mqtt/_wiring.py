"""What the MQTT wing uses of the broker that runs it, handed over once, when it is built.

The broker (``Broker``, the composition root) builds ``MqttService(MqttWiring(...))``: the wing
holds no reference to the broker, only these parts, and hands each of its services (egress, the
tables' tails, the devices) the few it uses.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass

from kafkaesque.protocol import Acks, Shares

from .._appender import PartitionAppender
from .._config import BrokerConfig
from .._metadata import ClusterMetadata
from .._metadata_view import TopicInfo
from .._read_path import ReadPath
from .._shutdown import Draining
from .._writes import WritePath


@dataclass(frozen=True, slots=True)
class MqttWiring:
    """The parts of a broker its MQTT wing works with.

    ``config``: the broker's settings (its id, the MQTT listeners, rules, users, ACLs, and the
    partitions and replication of the topics MQTT creates). ``metadata``: the cluster's topics
    and brokers, and the creation of a topic. ``reads``: every read of the log (``follow``,
    ``fetch``). ``writes``: the leaders' lookups of QoS 1 resends (``find_resend``) and the write
    timeout. ``appender``: the appender of a partition (for an acks level and a patience, see
    ``PartitionAppender``). ``register_stats`` exposes the
    wing's counters, read at scrape time; ``authorization_failed`` counts an action the MQTT
    ACL refused. ``draining``: the broker's graceful shutdown of client connections.
    ``ready``: whether the broker knows its cluster (``Broker.ready``). ``tell_peers`` sends a
    message to every peer broker; ``connected_peers``: the peers connected now.
    ``wait_for_leaders``: wait (bounded) until every partition of a topic has a leader.
    ``login_refused``: tell of a CONNECT refused for its credentials (the console's timeline).
    """

    config: BrokerConfig
    metadata: ClusterMetadata
    reads: ReadPath
    writes: WritePath
    appender: Callable[[str, int, Acks, float], PartitionAppender]
    register_stats: Callable[[Callable[[], Mapping[str, int]]], None]
    authorization_failed: Callable[[str], None]
    draining: Draining
    ready: Callable[[], bool]
    tell_peers: Callable[[Shares], None]
    connected_peers: Callable[[], Collection[int]]
    wait_for_leaders: Callable[[TopicInfo], Awaitable[None]]
    login_refused: Callable[[str], None]
