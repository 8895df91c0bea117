"""The cluster metadata's values and rules: what the broker sees of the controller quorum.

What lives in the metadata changes rarely: the broker registry, and topics with their
configuration and partition→replicas assignment. Partition leadership does not: each partition's
own Raft group elects it and reports it for routing. Consumer groups are not here either: their
membership and committed offsets live in the ``__consumer_offsets`` topic (see :mod:`._groups`).

Here are the frozen value types (:class:`BrokerInfo`, :class:`TopicConfig`, :class:`TopicInfo`
and the :class:`MetadataView` snapshot), the :class:`MetadataError` family, and the rules that
the state machine (:mod:`._metadata_state`) and the trio side (:mod:`._metadata`) share: which
names and configurations can be a topic, how replicas are assigned, what an ACL is and how the
journal holds one. Pure: no pysyncobj, no trio, no I/O.

Errors. A refusal of the state machine is one of the :class:`MetadataError` values, raised on the
caller's side. :class:`MetadataUnavailable` is the retriable failure; its ``maybe_applied`` tells
"certainly not applied" from "outcome unknown".
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kafkaesque.protocol import (
    ANY_PRINCIPAL,
    CLUSTER_RESOURCE_NAME,
    AclOperation,
    AclPattern,
    AclPermission,
    AclResource,
    AclRow,
)

__all__ = [
    "BrokerInfo",
    "TopicConfig",
    "TopicInfo",
    "MetadataView",
    "MetadataError",
    "TopicExistsError",
    "UnknownTopicError",
    "InvalidConfigError",
    "MetadataUnavailable",
    "FSYNC_POLICIES",
    "ALTERABLE",
    "assign_replicas",
    "describe_config",
    "config_problem",
    "acl_tuple",
    "acl_row",
    "acl_problem",
]

# Kafka's rule for topic names: they become directory names, so no "/", no "..".
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")


# --- What the broker sees -------------------------------------------------------------------


# BrokerInfo and TopicConfig travel in the journal as tuples of their fields, read back with
# cls(*fields): add new fields at the end, with defaults, and old journals still read.


@dataclass(frozen=True)
class BrokerInfo:
    """What a broker registers: its id and where each of its listeners is."""

    id: int
    host: str
    client_port: int
    peer_port: int
    controller_port: int
    admin_port: int | None = None
    mqtt_port: int | None = None
    mqtt_tls_port: int | None = None
    mqtt_ws_port: int | None = None
    kafka_port: int | None = None
    http_port: int | None = None


@dataclass(frozen=True)
class TopicConfig:
    """A topic's configuration: set at creation (a CREATE with another one is refused), then
    changed only by :meth:`ClusterMetadata.alter_topic` (more partitions, retention, compaction).

    ``fsync`` is the topic's fsync policy (``always``, ``interval`` or ``never``: the words of
    ``kafkaesque.storage.FsyncPolicy``, kept as a plain str in the journal); None: each broker's
    own ``--fsync``.
    """

    partitions: int
    replication_factor: int
    retention_ms: int | None = None
    retention_bytes: int | None = None
    compact: bool = False
    fsync: str | None = None


FSYNC_POLICIES = ("always", "interval", "never")
"""The values of :attr:`TopicConfig.fsync` (besides None)."""

# What ALTER may change, as the keyword arguments of MetadataState.alter_topic.
ALTERABLE = frozenset({"partitions", "retention_ms", "retention_bytes", "compact"})


@dataclass(frozen=True)
class TopicInfo:
    """A topic and its assignment: ``replicas[p]`` lists partition p's brokers, preferred first.

    ``reassigned`` holds the partitions whose replicas changed since they were created. Until
    then a partition's replicas are its Raft group's first configuration (``bootstrap``); after,
    a broker that starts a replica of it joins as a spare that knows no configuration and learns
    it from the leader. Bootstrapping it with the new replicas instead would let it elect itself
    with an empty log (moving a partition whose only replica is down, or onto brokers that form
    a majority of the new replicas): two leaders in one term, and acknowledged records lost.
    """

    name: str
    config: TopicConfig
    replicas: tuple[tuple[int, ...], ...]
    reassigned: frozenset[int] = frozenset()

    def bootstrap(self, partition: int) -> tuple[int, ...] | None:
        """The first configuration's voters of ``partition``'s group; None once reassigned."""
        return None if partition in self.reassigned else self.replicas[partition]


@dataclass(frozen=True)
class MetadataView:
    """An immutable snapshot of the metadata, as this replica has applied it.

    ``version`` counts the changes applied (the same number on every replica at the same point of
    the log); it never decreases. A leader change alone gives a new view with the same version.
    ``controller_leader`` is the broker id of the pysyncobj leader, if known and mapped to an id.
    """

    version: int
    brokers: Mapping[int, BrokerInfo]
    topics: Mapping[str, TopicInfo]
    controller_leader: int | None
    # The access rules every broker enforces (docs/security.md); the same object from one view
    # to the next while they do not change, so a cache of decisions can tell by identity.
    acls: frozenset[AclRow] = frozenset()


class MetadataError(Exception):
    """Base of the metadata errors."""


class TopicExistsError(MetadataError):
    """The topic exists with a different configuration."""


class UnknownTopicError(MetadataError):
    """No such topic."""


class InvalidConfigError(MetadataError):
    """A request the metadata cannot satisfy as asked: bad name, bad numbers, unknown brokers."""


class MetadataUnavailable(MetadataError):
    """Retriable: no controller leader, or the command was not known committed in time.

    ``maybe_applied`` is True when the outcome is unknown (the command may still commit later, so
    retry only idempotent requests blindly), False when it certainly was not applied.
    """

    def __init__(self, message: str, *, maybe_applied: bool = True) -> None:
        super().__init__(message)
        self.maybe_applied = maybe_applied


# --- The rules -------------------------------------------------------------------------------


def assign_replicas(
    name: str, partitions: int, replication_factor: int, broker_ids: Iterable[int]
) -> tuple[tuple[int, ...], ...]:
    """Deterministic replica assignment: replicas and preferred leaders spread evenly.

    With the broker ids sorted (n of them) and ``start`` a stable function of the name (CRC-32,
    the same in every process, so that topics start at different brokers), the partitions take
    consecutive windows of ``replication_factor`` brokers around the ring: partition p gets the
    brokers at ``start + p * rf + i`` (mod n) for ``i < rf``. The replica slots thus follow each
    other round the ring, so no broker holds more than one replica more than another. Each
    partition's preferred leader is the first broker of its window that leads the fewest
    partitions so far, followed by the rest of the window in ring order; this keeps leader counts
    within one of each other too (the simple "partition p starts at broker start + p" keeps
    leaders even but not replicas: 2 partitions of 2 replicas on 4 brokers load them 1, 2, 1, 0).

    Requires ``1 <= replication_factor <= n`` and ``partitions >= 0``.
    """
    ids = sorted(broker_ids)
    n = len(ids)
    if not 1 <= replication_factor <= n:
        raise ValueError(f"replication factor {replication_factor} with {n} brokers")
    start = zlib.crc32(name.encode()) % n
    led = [0] * n  # partitions led so far, by position in `ids`
    assignment = []
    for p in range(partitions):
        window = [(start + p * replication_factor + i) % n for i in range(replication_factor)]
        leader = min(window, key=lambda b: led[b])  # the first of the least loaded
        led[leader] += 1
        k = window.index(leader)
        assignment.append(tuple(ids[b] for b in window[k:] + window[:k]))
    return tuple(assignment)


def describe_config(config: TopicConfig) -> str:
    """``config`` as people read it in an error line: ``partitions=3 replication_factor=3
    retention_ms=604800000 retention_bytes=unlimited compact=no``."""

    def limit(value: int | None) -> str:
        return "unlimited" if value is None else str(value)

    return (
        f"partitions={config.partitions} replication_factor={config.replication_factor} "
        f"retention_ms={limit(config.retention_ms)} "
        f"retention_bytes={limit(config.retention_bytes)} "
        f"compact={'yes' if config.compact else 'no'}"
        + ("" if config.fsync is None else f" fsync={config.fsync}")
    )


def config_problem(name: str, config: TopicConfig) -> str | None:
    """Why ``name``/``config`` cannot be a topic, whatever the cluster holds; None if they can."""
    if not _TOPIC_NAME.fullmatch(name) or name in {".", ".."}:
        return f"invalid topic name {name!r}: up to 249 of [A-Za-z0-9._-], not . or .."
    if config.partitions < 1:
        return f"partitions must be >= 1, not {config.partitions}"
    if config.replication_factor < 1:
        return f"replication_factor must be >= 1, not {config.replication_factor}"
    if config.retention_ms is not None and config.retention_ms < 1:
        return f"retention_ms must be >= 1 or None, not {config.retention_ms}"
    if config.retention_bytes is not None and config.retention_bytes < 1:
        return f"retention_bytes must be >= 1 or None, not {config.retention_bytes}"
    if config.fsync is not None and config.fsync not in FSYNC_POLICIES:
        return f"fsync must be one of {', '.join(FSYNC_POLICIES)} or None, not {config.fsync!r}"
    return None


_ACL_PRINCIPAL = re.compile(r"User:[^\s]+")
_ACL_NAME = re.compile(r"[^\s]{1,249}")


def acl_tuple(acl: AclRow) -> tuple[str, ...]:
    """``acl`` as the journal holds it: a 6-tuple of str."""
    return (
        acl.principal,
        str(acl.permission),
        str(acl.operation),
        str(acl.resource),
        str(acl.pattern),
        acl.name,
    )


def acl_row(acl: tuple[str, ...]) -> AclRow:
    """Inverse of :func:`acl_tuple` (for a tuple :func:`acl_problem` accepts)."""
    principal, permission, operation, resource, pattern, name = acl
    return AclRow(
        principal,
        AclPermission(permission),
        AclOperation(operation),
        AclResource(resource),
        AclPattern(pattern),
        name,
    )


def acl_problem(acl: tuple[Any, ...]) -> str | None:
    """Why the 6-tuple ``acl`` (principal, permission, operation, resource, pattern, name) is
    not an ACL; None if it is. The principal is ``User:<name>`` or ``User:*``; the cluster
    resource is named ``kafka-cluster`` (literal); a name has no white space."""
    if len(acl) != 6 or not all(isinstance(field, str) for field in acl):
        return f"an ACL is six words, not {acl!r}"
    principal, permission, operation, resource, pattern, name = acl
    if principal != ANY_PRINCIPAL and not _ACL_PRINCIPAL.fullmatch(principal):
        return f"an ACL's principal is User:<name> or {ANY_PRINCIPAL}, not {principal!r}"
    for kind, value in (
        (AclPermission, permission),
        (AclOperation, operation),
        (AclResource, resource),
        (AclPattern, pattern),
    ):
        if value not in kind.__members__.values():
            words = "|".join(str(m) for m in kind)
            return f"{value!r} is not one of {words}"
    if not _ACL_NAME.fullmatch(name):
        return f"an ACL's name is 1 to 249 characters without spaces, not {name!r}"
    if resource == AclResource.CLUSTER and (
        name != CLUSTER_RESOURCE_NAME or pattern != AclPattern.LITERAL
    ):
        return f"the cluster resource is named {CLUSTER_RESOURCE_NAME} (literal), not {name!r}"
    return None
