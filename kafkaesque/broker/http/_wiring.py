"""What the HTTP front uses of the broker that runs it, handed over once, when it is built.

As the Kafka front's ``KafkaWiring``: no reference to the broker, only what the REST calls need.
Every call becomes a line-protocol command given to ``dispatch`` (the broker's
``CommandHandler.dispatch``), so ACLs, forwarding, metrics and error codes are those of a line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from kafkaesque.protocol import Command
from kafkaesque.protocol.http import HttpLimits
from kafkaesque.security import ReloadingContext

from .._access import AccessControl
from .._config import BrokerConfig
from .._metadata import ClusterMetadata
from .._partitioner import Partitioner
from .._session import Session, Slot
from .._shutdown import Draining
from .._tls import TlsRefusals


@dataclass(frozen=True, slots=True)
class HttpWiring:
    """The parts of a broker its HTTP front works with.

    ``config``: the broker's settings (its id, ``http_listener``). ``dispatch``: the command
    handler. ``metadata``: the topics' partition counts, and ``partitioner`` the broker's rule,
    to pick a record's partition as the line protocol's publishes do. ``access``: sessions and
    HTTP Basic (PLAIN's check). ``draining``: the broker's graceful shutdown of client
    connections. ``tls``: the port's TLS context (None:
    plain HTTP) and ``tls_refusals`` the counter of its failed handshakes. ``limits``: what
    one connection may cost.
    """

    config: BrokerConfig
    dispatch: Callable[[Command, trio.Nursery, Session | None], Slot]
    metadata: ClusterMetadata
    partitioner: Partitioner
    access: AccessControl
    draining: Draining
    tls: ReloadingContext | None = None
    tls_refusals: TlsRefusals | None = None
    limits: HttpLimits = field(default_factory=HttpLimits)
