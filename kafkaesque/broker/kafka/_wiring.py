"""What the Kafka front uses of the broker that runs it, handed over once, when it is built.

The broker (``Broker``, the composition root) builds ``KafkaService(KafkaWiring(...))``: the
front holds no reference to the broker, only the services every protocol front shares, so a
Kafka request is served by the same writes, reads, topic creation and access rules as a line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kafkaesque.security import ReloadingContext

from .._access import AccessControl
from .._config import BrokerConfig
from .._groups import GroupCoordinator
from .._metadata import ClusterMetadata
from .._read_path import ReadPath
from .._shutdown import Draining
from .._tls import TlsRefusals
from .._topic_admin import TopicAdmin
from .._writes import WritePath


@dataclass(frozen=True, slots=True)
class KafkaWiring:
    """The parts of a broker its Kafka front works with.

    ``config``: the broker's settings (its id, the Kafka listener, the advertised host).
    ``metadata``: the cluster's brokers and topics. ``writes``: the partitions' leaders and
    their writes. ``reads``: fetches and the partitions' bounds. ``admin``: auto-creation of a
    topic a client asks for. ``access``: sessions and ACL checks. ``leader_epoch``: the Raft
    term of a partition's leader (-1: unknown). ``draining``: the broker's graceful shutdown
    of client connections. ``tls``: the Kafka port's TLS context (None: plaintext), and
    ``tls_refusals`` the counter of its failed handshakes.
    """

    config: BrokerConfig
    metadata: ClusterMetadata
    writes: WritePath
    reads: ReadPath
    admin: TopicAdmin
    groups: GroupCoordinator
    access: AccessControl
    leader_epoch: Callable[[str], int]
    draining: Draining
    tls: ReloadingContext | None = None
    tls_refusals: TlsRefusals | None = None
