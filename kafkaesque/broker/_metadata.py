"""The controller quorum: cluster metadata replicated by pysyncobj on every controller.

What lives here changes rarely: the broker registry, and topics with their configuration and
partition→replicas assignment. Partition leadership does not: each partition's own Raft group
elects it and reports it for routing. Consumer groups are not here either: their membership and
committed offsets live in the ``__consumer_offsets`` topic (see :mod:`._groups`).

Layout. :class:`MetadataState` is the state machine, pure and deterministic: every replica applies
the same commands in the same order and uses nothing else (no clock, no randomness, no
``hash()``, which is salted per process). ``_ReplicatedState`` is
pysyncobj's handle on it: one ``@replicated`` method per command. :class:`ClusterMetadata` is the
trio side.

Threads. Each :class:`ClusterMetadata` runs its ``SyncObj`` in one thread of its own
(:class:`._bridge.TickingThread`, ``autoTick=False``): the SyncObj is built, ticked, applies
its log and is destroyed on that thread, and :class:`MetadataState` is only ever touched there.
The trio thread only enqueues commands (pysyncobj's queue is thread-safe) and receives answers and
immutable :class:`MetadataView` snapshots through ``TrioToken.run_sync_soon``
(:mod:`._bridge`).

Errors. An apply function never raises (the exception would leave pysyncobj's apply loop with the
entry half-applied but not counted as applied; here it would stop the controller): a refusal is
returned as a :class:`MetadataError` value and raised on the caller's side.
:class:`MetadataUnavailable` is the retriable failure; its ``maybe_applied`` tells "certainly not
applied" from "outcome unknown".

Durability (pysyncobj 0.3.17, read from its source). The journal is written through ``mmap`` and
never fsynced, term and vote are saved by write-and-rename without fsync, and the commit index is
saved about once a second: metadata survives a crash of the process (the kernel holds the pages),
not a power loss of a majority. A restarted replica may replay less than it had applied and
catches up from the leader.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import queue
import re
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol, TypeVar, cast

import trio
from pysyncobj import SyncObj, SyncObjConf, SyncObjConsumer, SyncObjException
from pysyncobj import replicated as _pysyncobj_replicated

from kafkaesque.protocol import (
    ANY_PRINCIPAL,
    CLUSTER_RESOURCE_NAME,
    AclOperation,
    AclPattern,
    AclPermission,
    AclResource,
    AclRow,
)

from . import _bridge

__all__ = [
    "BrokerInfo",
    "TopicConfig",
    "TopicInfo",
    "MetadataView",
    "MetadataError",
    "TopicExistsError",
    "UnknownTopicError",
    "InvalidConfigError",
    "FSYNC_POLICIES",
    "ALTERABLE",
    "MetadataUnavailable",
    "ControllerSettings",
    "MetadataState",
    "assign_replicas",
    "acl_problem",
    "describe_config",
    "ClusterMetadata",
]

log = logging.getLogger("kafkaesque.broker.metadata")

_T = TypeVar("_T")
_F = TypeVar("_F", bound=Callable[..., object])

# Kafka's rule for topic names: they become directory names, so no "/", no "..".
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
_RETRY_DELAY = 0.05  # seconds between two sends of a command pysyncobj certainly refused
_DUMP_FORMAT = 1  # version of MetadataState.to_primitive's layout


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
    """A topic and its assignment: ``replicas[p]`` lists partition p's brokers, preferred first."""

    name: str
    config: TopicConfig
    replicas: tuple[tuple[int, ...], ...]


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


@dataclass(frozen=True)
class ControllerSettings:
    """pysyncobj tuning. The defaults suit a LAN or loopback cluster.

    Elections start after ``raft_min_timeout``..``raft_max_timeout`` without a leader; a leader
    that heard from no majority for ``leader_fallback_timeout`` steps down (pysyncobj's default of
    30 s keeps a cut-off leader in office that long); ``connection_retry_time`` is the reconnection
    period (pysyncobj's default is 5 s; a restarted controller is not heard before a member
    reconnects to it, and a broker is not ready before that: 0.2 s, issue 23). ``tick_period``
    bounds how long the controller thread sleeps in ``poll`` between two ticks: a command
    appended by one tick is replicated by the next, so it is also a command's delay (a stop
    request and a call queued from trio wake the poll at once). The log is compacted into the
    full dump after ``log_compaction_min_entries`` entries or ``log_compaction_min_time``
    seconds.
    """

    raft_min_timeout: float = 0.4
    raft_max_timeout: float = 1.4
    append_entries_period: float = 0.1
    connection_timeout: float = 3.5
    connection_retry_time: float = 0.2
    leader_fallback_timeout: float = 3.0
    tick_period: float = 0.05
    log_compaction_min_entries: int = 5000
    log_compaction_min_time: float = 300.0


# --- The state machine ----------------------------------------------------------------------


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


def _config_problem(name: str, config: TopicConfig) -> str | None:
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


class MetadataState:
    """The replicated metadata and its commands; pure, deterministic, not thread-safe.

    Each command returns its answer, a :class:`MetadataError` when it refuses (nothing changed
    then), and never raises on well-typed arguments. ``version`` is incremented once by every
    command that changed something. Invariants, kept by every command: each topic has one replica
    tuple per partition, of distinct broker ids that were registered when assigned.
    """

    def __init__(self) -> None:
        self.version = 0
        self.brokers: dict[int, BrokerInfo] = {}
        self.topics: dict[str, TopicInfo] = {}
        # The ACLs as plain 6-tuples of str (principal, permission, operation, resource,
        # pattern, name): what the journal and the dump hold, never our classes.
        self.acls: set[tuple[str, ...]] = set()
        self._acl_rows: frozenset[AclRow] | None = None  # acls as rows, made once per change

    def register_broker(self, info: BrokerInfo) -> None:
        """Insert or replace a broker's registration (idempotent)."""
        if self.brokers.get(info.id) != info:
            self.brokers[info.id] = info
            self.version += 1

    def create_topic(
        self, name: str, config: TopicConfig, *, auto: bool = False
    ) -> TopicInfo | MetadataError:
        """Create a topic, assigned over the registered brokers by :func:`assign_replicas`.

        Idempotent: the same config gives back the existing topic; a different one is a
        :class:`TopicExistsError`. :class:`InvalidConfigError` for a bad name or numbers, or a
        replication factor above the number of registered brokers.

        ``auto`` is a creation on first use (a publish or a subscription named the topic): any
        existing topic is the answer, whatever its config (two brokers that auto-create one topic
        at once, each with its own defaults, end with the one applied first), and the replication
        factor is capped at the brokers registered now. Deciding here, as the command is applied,
        is what makes it one topic: a check on one broker before sending could not.
        """
        existing = self.topics.get(name)
        if existing is not None:
            if auto or existing.config == config:
                return existing
            return TopicExistsError(
                f"topic {name!r} exists with {describe_config(existing.config)}, "
                f"not {describe_config(config)}"
            )
        problem = _config_problem(name, config)
        if problem is not None:
            return InvalidConfigError(problem)
        if auto and self.brokers:
            replication = min(config.replication_factor, len(self.brokers))
            config = dataclasses.replace(config, replication_factor=replication)
        if config.replication_factor > len(self.brokers):
            return InvalidConfigError(
                f"replication_factor {config.replication_factor} > "
                f"{len(self.brokers)} registered brokers"
            )
        replicas = assign_replicas(name, config.partitions, config.replication_factor, self.brokers)
        info = TopicInfo(name, config, replicas)
        self.topics[name] = info
        self.version += 1
        return info

    def alter_topic(self, name: str, changes: Mapping[str, object]) -> TopicInfo | MetadataError:
        """Change a live topic's settings: ``changes`` maps names of :data:`ALTERABLE` to their
        new values (those absent stay as they are; a retention of None is unlimited).

        Partitions only grow: the new ones are assigned as if the topic had been created with
        the new count (:func:`assign_replicas` over the brokers registered now, its first
        partitions' windows left as they are). Idempotent: values already in force change
        nothing (the same info, no new version). :class:`UnknownTopicError`;
        :class:`InvalidConfigError` for an unknown setting, fewer partitions, a bad value, or a
        replication factor above the brokers registered when partitions must be added.
        """
        info = self.topics.get(name)
        if info is None:
            return UnknownTopicError(f"no topic {name!r}")
        unknown = sorted(set(changes) - ALTERABLE)
        if unknown:
            return InvalidConfigError(f"cannot alter {', '.join(unknown)} of a topic")
        try:
            config = dataclasses.replace(info.config, **changes)  # type: ignore[arg-type]
        except TypeError as exc:  # not reachable through alter_topic's typed arguments
            return InvalidConfigError(str(exc))
        if config.partitions < info.config.partitions:
            return InvalidConfigError(
                f"topic {name!r} has {info.config.partitions} partitions: they can be added, "
                f"not removed ({config.partitions} asked)"
            )
        problem = _config_problem(name, config)
        if problem is not None:
            return InvalidConfigError(problem)
        if config == info.config:
            return info
        replicas = info.replicas
        if config.partitions > len(replicas):
            if config.replication_factor > len(self.brokers):
                return InvalidConfigError(
                    f"replication_factor {config.replication_factor} > "
                    f"{len(self.brokers)} registered brokers: cannot place new partitions"
                )
            grown = assign_replicas(
                name, config.partitions, config.replication_factor, self.brokers
            )
            replicas = replicas + grown[len(replicas) :]
        info = TopicInfo(name, config, replicas)
        self.topics[name] = info
        self.version += 1
        return info

    def delete_topic(self, name: str) -> UnknownTopicError | None:
        """Delete a topic; :class:`UnknownTopicError` if there is none."""
        if name not in self.topics:
            return UnknownTopicError(f"no topic {name!r}")
        del self.topics[name]
        self.version += 1
        return None

    def set_replicas(
        self, topic: str, partition: int, replicas: tuple[int, ...]
    ) -> TopicInfo | MetadataError:
        """Replace one partition's replicas (preferred leader first).

        The count may differ from the topic's replication factor, so that a reassignment can go
        one membership change at a time. :class:`UnknownTopicError`; :class:`InvalidConfigError`
        for a partition out of range, or replicas empty, repeated or not registered.
        """
        info = self.topics.get(topic)
        if info is None:
            return UnknownTopicError(f"no topic {topic!r}")
        if not 0 <= partition < len(info.replicas):
            return InvalidConfigError(f"topic {topic!r} has no partition {partition}")
        if not replicas or len(set(replicas)) != len(replicas):
            shown = ",".join(map(str, replicas)) or "none"
            return InvalidConfigError(f"replicas must be distinct and not empty, not {shown}")
        unknown = sorted(set(replicas) - set(self.brokers))
        if unknown:
            return InvalidConfigError(f"unregistered brokers {','.join(map(str, unknown))}")
        if info.replicas[partition] == replicas:
            return info
        assignment = list(info.replicas)
        assignment[partition] = replicas
        info = dataclasses.replace(info, replicas=tuple(assignment))
        self.topics[topic] = info
        self.version += 1
        return info

    def remove_broker(self, broker_id: int) -> InvalidConfigError | None:
        """Take a broker out of the registry (decommission, once its replicas have moved).

        Idempotent: an unregistered broker is no error. :class:`InvalidConfigError` while a
        partition is still assigned to it (nothing changed then): its replicas go first.
        """
        if broker_id not in self.brokers:
            return None
        holding = sorted(
            f"{info.name}/{p}"
            for info in self.topics.values()
            for p, replicas in enumerate(info.replicas)
            if broker_id in replicas
        )
        if holding:
            shown = ", ".join(holding[:5]) + (", ..." if len(holding) > 5 else "")
            return InvalidConfigError(
                f"broker {broker_id} still holds replicas of {len(holding)} partitions ({shown})"
            )
        del self.brokers[broker_id]
        self.version += 1
        return None

    def write_acls(
        self, add: Iterable[tuple[str, ...]], remove: Iterable[tuple[str, ...]]
    ) -> tuple[int, int] | MetadataError:
        """Add the ACLs of ``add`` and remove those of ``remove`` (6-tuples of str, see
        :func:`acl_problem`), all or nothing: :class:`InvalidConfigError` if one is not a
        valid ACL (nothing changed then). Idempotent: an ACL added twice is there once, one
        removed that is absent is no error. Returns how many were (added, removed)."""
        adding = [tuple(acl) for acl in add]
        removing = [tuple(acl) for acl in remove]
        for acl in adding + removing:
            problem = acl_problem(acl)
            if problem is not None:
                return InvalidConfigError(problem)
        added = removed = 0
        for acl in removing:
            if acl in self.acls:
                self.acls.discard(acl)
                removed += 1
        for acl in adding:
            if acl not in self.acls:
                self.acls.add(acl)
                added += 1
        if added or removed:
            self._acl_rows = None
            self.version += 1
        return added, removed

    def acl_rows(self) -> frozenset[AclRow]:
        """The ACLs as rows: one object while they do not change (see ``MetadataView.acls``)."""
        if self._acl_rows is None:
            self._acl_rows = frozenset(acl_row(acl) for acl in self.acls)
        return self._acl_rows

    def snapshot(self, controller_leader: int | None) -> MetadataView:
        """An immutable view of the state now (shallow copies: the values are frozen)."""
        return MetadataView(
            version=self.version,
            brokers=MappingProxyType(dict(self.brokers)),
            topics=MappingProxyType(dict(self.topics)),
            controller_leader=controller_leader,
            acls=self.acl_rows(),
        )

    def to_primitive(self) -> dict[str, Any]:
        """The state as plain tuples and dicts, for pysyncobj's full dump.

        No class of ours goes into the dump, so renaming or moving a class cannot make an old dump
        unreadable.
        """
        return {
            "format": _DUMP_FORMAT,
            "version": self.version,
            "brokers": [dataclasses.astuple(b) for b in self.brokers.values()],
            "topics": [
                (t.name, dataclasses.astuple(t.config), t.replicas) for t in self.topics.values()
            ],
            "acls": sorted(self.acls),
        }

    @classmethod
    def from_primitive(cls, data: Mapping[str, Any]) -> MetadataState:
        """Inverse of :meth:`to_primitive`."""
        if data.get("format") != _DUMP_FORMAT:
            raise ValueError(f"unknown metadata dump format {data.get('format')!r}")
        state = cls()
        state.version = data["version"]
        for fields in data["brokers"]:
            broker = BrokerInfo(*fields)
            state.brokers[broker.id] = broker
        for name, config, replicas in data["topics"]:
            state.topics[name] = TopicInfo(name, TopicConfig(*config), replicas)
        # Dumps written before ACLs existed have none: no ACLs.
        state.acls = {tuple(acl) for acl in data.get("acls", ())}
        # Older dumps also hold a "subscriptions" list (consumer groups, since moved to
        # __consumer_offsets): ignored.
        return state


# --- pysyncobj's handle on the state machine ------------------------------------------------


class _Decorator(Protocol):
    def __call__(self, func: _F, /) -> _F: ...


# pysyncobj has no type hints. This is the very same function object, only typed: `replicated`
# finds the class body it decorates by frame depth, so it must not be wrapped in another function.
_replicated = cast(_Decorator, _pysyncobj_replicated)


@dataclass(frozen=True)
class _Applied:
    """What a command returns to its caller: its answer, and the state version just after it."""

    version: int
    value: object


class _ReplicatedState(SyncObjConsumer):  # type: ignore[misc]  # pysyncobj is untyped
    """The commands of :class:`MetadataState` as pysyncobj replicated methods.

    Called on the trio thread, a method only enqueues its command (``_bridge.call_replicated``);
    pysyncobj then runs its body on its own thread on every replica, in log order. Arguments and
    the dump are plain tuples, never our classes (see :meth:`MetadataState.to_primitive`).
    """

    def __init__(self) -> None:
        super().__init__()
        self.state = MetadataState()
        # A dump this code cannot read. pysyncobj logs and swallows any error of loading a dump
        # and then stops applying (its journal starts after the dump): kept here so that the
        # controller stops loudly instead (see ClusterMetadata._post_status).
        self.load_error: Exception | None = None

    def _applied(self, value: object) -> _Applied:
        return _Applied(self.state.version, value)

    @_replicated
    def register_broker(self, fields: tuple[Any, ...]) -> _Applied:
        self.state.register_broker(BrokerInfo(*fields))
        return self._applied(None)

    # ``auto`` was added after journals existed: an old entry has two arguments, and a new
    # argument (rather than a new replicated method, which would renumber pysyncobj's methods,
    # numbered in name order) keeps them readable.
    @_replicated
    def create_topic(self, name: str, config: tuple[Any, ...], auto: bool = False) -> _Applied:
        return self._applied(self.state.create_topic(name, TopicConfig(*config), auto=auto))

    @_replicated
    def delete_topic(self, name: str) -> _Applied:
        return self._applied(self.state.delete_topic(name))

    @_replicated
    def set_replicas(self, topic: str, partition: int, replicas: tuple[int, ...]) -> _Applied:
        return self._applied(self.state.set_replicas(topic, partition, replicas))

    # pysyncobj numbers replicated methods in name order, and a journal holds the numbers: a
    # new method whose name sorts after every older one (hence "update_", not "alter_") leaves
    # the older ones' numbers, so journals written before it still read.
    @_replicated
    def update_topic(self, name: str, changes: tuple[tuple[str, Any], ...]) -> _Applied:
        return self._applied(self.state.alter_topic(name, dict(changes)))

    # Sorts after "update_topic" (see above): "remove_broker" would renumber it.
    @_replicated
    def withdraw_broker(self, broker_id: int) -> _Applied:
        return self._applied(self.state.remove_broker(broker_id))

    # Sorts after "withdraw_broker" (see above). Adds and removes ACLs (6-tuples of str).
    @_replicated
    def write_acls(self, add: tuple[Any, ...], remove: tuple[Any, ...]) -> _Applied:
        return self._applied(self.state.write_acls(add, remove))

    def _serialize(self) -> dict[str, Any]:
        return self.state.to_primitive()

    def _deserialize(self, data: Mapping[str, Any]) -> None:
        try:
            self.state = MetadataState.from_primitive(data)
        except (ValueError, TypeError, KeyError) as exc:
            self.load_error = exc


# --- The trio side --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Controller:
    """The objects that live on the controller thread (see :class:`ClusterMetadata`)."""

    sync: Any  # pysyncobj.SyncObj
    replicated: _ReplicatedState


@dataclass(frozen=True)
class _Status:
    """What the controller thread tells the trio side after a tick."""

    view: MetadataView
    ready: bool  # a leader is known and this replica caught up with it
    members: frozenset[str]  # controller addresses in this replica's configuration


def _ask_transfer(sync: Any) -> None:
    """On the controller thread: ask pysyncobj to hand its leadership to the most caught-up
    connected follower. A failure is logged, never raised: it would stop the controller."""
    try:
        sync.transferLeadership(None, None)
    except Exception:
        log.exception("pysyncobj's transferLeadership failed")


def _address(host: str, port: int) -> str:
    return f"{host}:{port}"


def _expect(kind: type[_T], value: object) -> _T:
    if not isinstance(value, kind):
        raise AssertionError(f"expected a {kind.__name__}, got {value!r}")
    return value


class ClusterMetadata:
    """One controller of the metadata quorum, used from trio.

    ``controllers`` maps broker ids to controller addresses and must include ``self_id``; with
    ``join=True`` it holds the running members plus this one, and this replica waits for a member
    to :meth:`add_controller` it (pysyncobj needs no other setting for that: the members refuse
    its connections until then, so it cannot vote or disturb them; ``join`` states the intent).
    State goes to ``data_dir`` (journal and full dump). ``secret`` is the cluster password:
    pysyncobj sends pickles, so anyone who can reach the port without it could run code here.
    ``timeout`` bounds every command.

    ``on_change`` is called on the trio thread, from :meth:`run`'s task, with the new view after
    changes (consecutive changes may be coalesced into one call); an exception from it ends
    :meth:`run`.

    Every command but :meth:`delete_topic` is idempotent, and is sent again within ``timeout``
    whenever an attempt failed (a leader change, a follower whose leader vanished); after the
    timeout it raises :class:`MetadataUnavailable`. When a command returns, :attr:`view` already
    shows its effect.
    """

    def __init__(
        self,
        self_id: int,
        controllers: Mapping[int, tuple[str, int]],
        data_dir: str,
        secret: bytes,
        *,
        timeout: float = 5.0,
        on_change: Callable[[MetadataView], None] | None = None,
        join: bool = False,
        settings: ControllerSettings | None = None,
    ) -> None:
        if self_id not in controllers:
            raise ValueError(f"controllers must include this broker ({self_id})")
        if not secret:
            raise ValueError("the cluster secret must not be empty")
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0, not {timeout}")
        self._self_id = self_id
        self._ids_by_address = {_address(*addr): bid for bid, addr in controllers.items()}
        self._self_address = _address(*controllers[self_id])
        self._data_dir = data_dir
        self._secret = secret
        self._timeout = timeout
        self._on_change = on_change
        self._join = join
        self._settings = settings or ControllerSettings()
        # Trio thread only:
        self._view = MetadataState().snapshot(None)
        self._ready = False
        self._members: frozenset[str] = frozenset()
        self._changed = trio.Event()  # set and replaced whenever a status arrives
        self._view_changed = trio.Event()  # set when on_change has a view to see
        self._controller: _Controller | None = None
        self._started = False
        self._stopped = False
        self._token: trio.lowlevel.TrioToken | None = None
        self._view_listeners: list[Callable[[MetadataView], None]] = []
        # Controller thread only: the last status posted.
        self._posted: _Status | None = None
        # Calls for the controller thread, given the SyncObj (pysyncobj is not thread-safe
        # beyond its command queue): put by the trio thread, run at the start of a tick.
        self._on_thread: queue.SimpleQueue[Callable[[Any], object]] = queue.SimpleQueue()

    # -- reading --

    @property
    def view(self) -> MetadataView:
        """The latest view applied by this replica; replaced (never mutated) on the trio thread."""
        return self._view

    @property
    def members(self) -> frozenset[str]:
        """Controller addresses (``host:port``) in this replica's configuration, itself included.

        Empty until :meth:`run` has started; updated on the trio thread after every change.
        """
        return self._members

    def add_view_listener(self, listener: Callable[[MetadataView], None]) -> None:
        """Call ``listener`` with each new view, on the trio thread, the moment it arrives
        (before any task sees it through :attr:`view`, and before a command that changed it
        returns): what must never lag the view (the access checks' ACLs). It must be quick and
        must not raise."""
        self._view_listeners.append(listener)

    async def wait_changed(self, after_version: int) -> MetadataView:
        """Return the view as soon as its version is above ``after_version``. Unbounded."""
        while self._view.version <= after_version:
            await self._changed.wait()
        return self._view

    async def wait_ready(self) -> None:
        """Return once a leader is known and this replica has applied what it had committed.

        "Caught up" is pysyncobj's ``isReady``: it is reached once and never lost, whereas a
        leader must be known at the time of the call. Unbounded: wrap it in ``trio.fail_after``.
        """
        while not self._ready:
            await self._changed.wait()

    # -- running --

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run this controller until cancelled; report started once its port is bound.

        Starts the SyncObj (journal and full dump in ``data_dir``) on a thread of its own, keeps
        :attr:`view` current, and calls ``on_change``. On exit the SyncObj is destroyed and its
        thread has ended. May be called once.

        Raises ``OSError`` if the controller port cannot be bound (before reporting started).
        Later failures (of the controller thread, or of ``on_change``) come out of its nursery in
        an ``ExceptionGroup``.
        """
        if self._started:
            raise RuntimeError("ClusterMetadata.run() may be called once")
        self._started = True
        self._token = trio.lowlevel.current_trio_token()
        try:
            thread = await _bridge.TickingThread.open(
                f"kafkaesque-controller-{self._self_id}", self._open, self._tick, self._close
            )
        except BaseException:
            self._stopped = True
            raise
        if self._join:
            log.info("controller %d waits to be added to the quorum", self._self_id)
        try:
            self._controller = thread.value
            async with trio.open_nursery() as nursery:
                nursery.start_soon(thread.wait)
                if self._on_change is not None:
                    nursery.start_soon(self._call_on_change, self._on_change)
                task_status.started()
        finally:
            self._controller = None
            self._stopped = True
            # Out of the tick's poll at once; aclose() sets the thread's stop flag first.
            self._wake(thread.value)
            await thread.aclose()

    async def _call_on_change(self, on_change: Callable[[MetadataView], None]) -> None:
        while True:
            await self._view_changed.wait()
            self._view_changed = trio.Event()
            on_change(self._view)

    def _open(self) -> _Controller:
        """Build the SyncObj; on the controller thread (binding and key derivation block)."""
        os.makedirs(self._data_dir, exist_ok=True)
        s = self._settings
        conf = SyncObjConf(
            password=self._secret,  # it sends pickles: never without a password
            autoTick=False,  # ticked by our own thread, so its lifetime is ours
            appendEntriesUseBatch=False,  # batching costs ~100 ms a commit
            useFork=False,  # never fork a threaded process
            journalFile=os.path.join(self._data_dir, "controller.journal"),
            # Without it, a replica restarted after a compaction stops applying.
            fullDumpFile=os.path.join(self._data_dir, "controller.dump"),
            dynamicMembershipChange=True,
            # Without a leader, refuse at once (MISSING_LEADER: certainly not applied; we retry)
            # rather than queue: a queued command would apply whenever a leader shows up, maybe
            # long after its caller gave up.
            commandsWaitLeader=False,
            # One bind attempt: pysyncobj's constructor busy-loops between attempts.
            maxBindRetries=1,
            raftMinTimeout=s.raft_min_timeout,
            raftMaxTimeout=s.raft_max_timeout,
            appendEntriesPeriod=s.append_entries_period,
            connectionTimeout=s.connection_timeout,
            connectionRetryTime=s.connection_retry_time,
            leaderFallbackTimeout=s.leader_fallback_timeout,
            logCompactionMinEntries=s.log_compaction_min_entries,
            logCompactionMinTime=s.log_compaction_min_time,
        )
        others = [a for a in self._ids_by_address if a != self._self_address]
        handle = _ReplicatedState()
        try:
            sync = SyncObj(self._self_address, others, conf=conf, consumers=[handle])
        except SyncObjException as exc:
            if exc.errorCode == "BindError":
                raise OSError(f"cannot bind the controller port {self._self_address}") from exc
            raise
        controller = _Controller(sync, handle)
        # Called in every tick after the log is applied and before the tick sleeps in poll: a
        # status posted after doTick() returned would lag the answers by up to a poll timeout.
        sync.addOnTickCallback(lambda: self._post_status(controller))
        return controller

    def _tick(self, controller: _Controller) -> None:
        """Run the calls queued by the trio side (``hand_over_leadership``), then one pysyncobj
        tick (it posts the status, see _open); on the controller thread.

        Not a longer sleep when idle: a command the tick appends is replicated only by the next
        tick (pysyncobj's leader sends it with its next AppendEntries), so a longer poll delays
        every metadata change (measured: a follower broker's view then lagged a CREATE that the
        leader's broker had answered; tests/broker/test_line_session.py's DESCRIBE test failed
        3 times in 23).
        """
        sync = controller.sync
        while not self._on_thread.empty():
            self._on_thread.get_nowait()(sync)
        sync.doTick(self._settings.tick_period)

    def _wake(self, controller: _Controller) -> None:
        """Wake the controller thread from its poll, from any thread (a stop request)."""
        notifier = getattr(controller.sync, "_SyncObj__pipeNotifier", None)
        if notifier is not None:
            with contextlib.suppress(OSError):  # closed already: the thread has ended
                notifier.notify()

    def _close(self, controller: _Controller) -> None:
        controller.sync.destroy()  # with autoTick=False: closes sockets and journal right here

    def _post_status(self, controller: _Controller) -> None:
        """Post a status to trio if the view, readiness or membership changed (controller thread).

        Command answers are posted while the tick applies the log and this later in the same
        tick, in that order: the view showing a command's effect reaches trio right after its
        answer.
        """
        if controller.replicated.load_error is not None:
            error = controller.replicated.load_error
            raise RuntimeError("cannot read the metadata dump") from error
        sync = controller.sync
        state = controller.replicated.state
        leader_node = sync._getLeader()
        leader = None if leader_node is None else self._broker_id(leader_node.id, state)
        members = frozenset([sync.selfNode.id, *(node.id for node in sync.otherNodes)])
        ready = leader_node is not None and bool(sync.isReady())
        last = self._posted
        if last is None or last.view.version != state.version:
            view = state.snapshot(leader)
        elif last.view.controller_leader != leader:
            view = dataclasses.replace(last.view, controller_leader=leader)
        elif (last.ready, last.members) == (ready, members):
            return
        else:
            view = last.view
        self._posted = _Status(view, ready, members)
        assert self._token is not None  # set by run() before the thread starts
        _bridge.post(self._token, self._receive, self._posted)

    def _broker_id(self, address: str, state: MetadataState) -> int | None:
        found = self._ids_by_address.get(address)
        if found is not None:
            return found
        # A controller added at run time is known by its broker's registration.
        for broker in state.brokers.values():
            if _address(broker.host, broker.controller_port) == address:
                return broker.id
        return None

    def _receive(self, status: _Status) -> None:
        """Take a status from the controller thread; runs in trio's loop, must not raise."""
        if status.view is not self._view:
            self._view = status.view
            for listener in self._view_listeners:
                listener(status.view)
            self._view_changed.set()
        self._ready = status.ready
        self._members = status.members
        self._changed.set()
        self._changed = trio.Event()

    def _running(self) -> _Controller:
        if self._controller is not None:
            return self._controller
        if self._stopped:
            raise MetadataUnavailable("the controller has stopped", maybe_applied=False)
        raise RuntimeError("ClusterMetadata.run() has not started")

    # -- commands --

    async def _command(self, command: str, *args: object, idempotent: bool = True) -> object:
        """Replicate ``command`` (a method of ``_ReplicatedState``); return its answer or raise."""

        def select(controller: _Controller) -> Callable[..., object]:
            method: Callable[..., object] = getattr(controller.replicated, command)
            return method

        deadline = trio.current_time() + self._timeout
        answer = await self._replicate(select, *args, deadline=deadline, idempotent=idempotent)
        applied = _expect(_Applied, answer)
        if isinstance(applied.value, MetadataError):
            raise applied.value
        # Its view is posted right after its answer (see _post_status): wait for it, so that the
        # caller's next read of `view` shows its own write.
        with trio.move_on_after(self._timeout):
            await self.wait_changed(applied.version - 1)
        return applied.value

    async def _replicate(
        self,
        select: Callable[[_Controller], Callable[..., object]],
        *args: object,
        deadline: float,
        idempotent: bool,
        done: Callable[[], bool] = lambda: False,
    ) -> object:
        """Send a command until it is answered, ``done()`` is true, or the deadline passes.

        ``select`` picks the pysyncobj method from the running controller, afresh for every
        attempt (the controller may have stopped meanwhile). A command pysyncobj certainly
        refused (no leader at the moment, say) is sent again; so is one of unknown outcome when
        ``idempotent`` (applying it twice is harmless). Returns its answer, or None if ``done()``
        came true first. Raises :class:`MetadataUnavailable`, with ``maybe_applied`` if any
        attempt may have been applied.
        """
        maybe_applied = False
        while not done():
            method = select(self._running())
            remaining = max(0.0, deadline - trio.current_time())
            try:
                return await _bridge.call_replicated(method, *args, timeout=remaining)
            except _bridge.ReplicationError as exc:
                maybe_applied = maybe_applied or exc.maybe_applied
                hopeless = exc.maybe_applied and not idempotent
                if hopeless or deadline - trio.current_time() <= _RETRY_DELAY:
                    raise MetadataUnavailable(
                        f"controller quorum unavailable ({exc})", maybe_applied=maybe_applied
                    ) from exc
                log.debug("controller %d: %s; sending it again", self._self_id, exc)
            await trio.sleep(_RETRY_DELAY)
        return None

    async def hand_over_leadership(self, deadline: float) -> bool | None:
        """If this replica leads the controller quorum, hand the leadership to another
        controller before this broker stops (graceful shutdown); ``deadline`` in trio time.

        Uses pysyncobj's ``transferLeadership`` (Raft TimeoutNow to the most caught-up connected
        follower; pysyncobj refuses while none matches the leader's last index, so it is asked
        again every ``_RETRY_DELAY``). Returns None if this replica did not lead (nothing to
        do), True once the view names another leader, False if none does by ``deadline`` (the
        quorum then elects one after this broker stops, as after a crash). None too for a quorum
        of one controller: there is nobody to hand it to. Never raises.
        """
        me = self._self_id
        controller = self._controller
        if controller is None or self._view.controller_leader != me or len(self._members) < 2:
            return None  # not the leader, or a quorum of one: nobody to hand it to
        if not callable(getattr(controller.sync, "transferLeadership", None)):
            log.warning("controller %d: this pysyncobj cannot transfer leadership", me)
            return False
        while True:
            leader = self._view.controller_leader
            if leader is not None and leader != me:
                log.info("controller %d handed its leadership to controller %d", me, leader)
                return True
            now = trio.current_time()
            if now >= deadline or self._controller is None:
                return False
            if leader == me:  # stepped down already (None): the successor is being elected
                self._on_thread.put(_ask_transfer)
                self._wake(controller)
            with trio.move_on_at(min(deadline, now + _RETRY_DELAY)):
                await self._changed.wait()

    async def register_broker(self, info: BrokerInfo) -> None:
        """Register or update a broker (idempotent)."""
        await self._command("register_broker", dataclasses.astuple(info))

    async def create_topic(
        self, name: str, config: TopicConfig, *, auto: bool = False
    ) -> TopicInfo:
        """Create a topic, assigned over the registered brokers when the command is applied.

        Idempotent: the same config returns the existing topic. Raises :class:`TopicExistsError`
        for a different config, :class:`InvalidConfigError` (see
        :meth:`MetadataState.create_topic`), :class:`MetadataUnavailable`. With ``auto`` (a
        creation on first use), any existing topic is returned, and the replication factor is
        capped at the registered brokers, both decided as the command is applied.
        """
        problem = _config_problem(name, config)
        if problem is not None:  # fail fast; apply checks it again
            raise InvalidConfigError(problem)
        fields = dataclasses.astuple(config)
        # A plain CREATE keeps the two-argument entry that older brokers apply too.
        args = (name, fields, True) if auto else (name, fields)
        answer = await self._command("create_topic", *args)
        return _expect(TopicInfo, answer)

    async def alter_topic(self, name: str, changes: Mapping[str, int | bool | None]) -> TopicInfo:
        """Change a live topic (see :meth:`MetadataState.alter_topic`); returns the topic as
        changed. Idempotent (the values are absolute). Raises :class:`UnknownTopicError`,
        :class:`InvalidConfigError`, :class:`MetadataUnavailable`.
        """
        unknown = sorted(set(changes) - ALTERABLE)
        if unknown:  # fail fast; apply checks it again
            raise InvalidConfigError(f"cannot alter {', '.join(unknown)} of a topic")
        # Sorted pairs: plain values in the journal, the same bytes for the same request.
        answer = await self._command("update_topic", name, tuple(sorted(changes.items())))
        return _expect(TopicInfo, answer)

    async def delete_topic(self, name: str) -> None:
        """Delete a topic. Raises :class:`UnknownTopicError`.

        Not idempotent: after a :class:`MetadataUnavailable` with ``maybe_applied``, a retry may
        find the topic already gone.
        """
        await self._command("delete_topic", name, idempotent=False)

    async def set_replicas(
        self, topic: str, partition: int, replicas: tuple[int, ...]
    ) -> TopicInfo:
        """Replace one partition's replicas (see :meth:`MetadataState.set_replicas`)."""
        answer = await self._command("set_replicas", topic, partition, tuple(replicas))
        return _expect(TopicInfo, answer)

    async def remove_broker(self, broker_id: int) -> None:
        """Take a broker out of the registry (see :meth:`MetadataState.remove_broker`).
        Idempotent. Raises :class:`InvalidConfigError`, :class:`MetadataUnavailable`."""
        await self._command("withdraw_broker", broker_id)

    async def add_acl(self, acl: AclRow) -> bool:
        """Add an ACL (idempotent); whether it was new. Raises :class:`InvalidConfigError`
        for an ACL that cannot be (see :func:`acl_problem`), :class:`MetadataUnavailable`."""
        row = acl_tuple(acl)
        problem = acl_problem(row)
        if problem is not None:  # fail fast; apply checks it again
            raise InvalidConfigError(problem)
        added, _ = _expect(tuple, await self._command("write_acls", (row,), ()))
        return bool(added)

    async def remove_acl(self, acl: AclRow) -> int:
        """Remove an ACL; how many were removed (0: it was not there). Idempotent (a retry
        after an unknown outcome may answer 0). Raises :class:`InvalidConfigError`,
        :class:`MetadataUnavailable`."""
        row = acl_tuple(acl)
        problem = acl_problem(row)
        if problem is not None:
            raise InvalidConfigError(problem)
        _, removed = _expect(tuple, await self._command("write_acls", (), (row,)))
        return int(removed)

    def controller_address(self, broker_id: int) -> str | None:
        """The ``host:port`` of broker ``broker_id``'s controller in this replica's quorum
        configuration (by the configured controllers, else the registration), or None."""
        for address in self._members:
            found = self._ids_by_address.get(address)
            if found is None:
                found = next(
                    (
                        b.id
                        for b in self._view.brokers.values()
                        if _address(b.host, b.controller_port) == address
                    ),
                    None,
                )
            if found == broker_id:
                return address
        return None

    async def remove_controller(self, broker_id: int) -> None:
        """Remove broker ``broker_id``'s controller from the running quorum.

        Idempotent: returns at once if it is not a member (``controller_address``).
        pysyncobj's leader cannot remove itself (it ignores the change): the caller makes sure
        ``broker_id`` does not lead (it hands the lead over when it stops gracefully); this
        replica must not be the one removed. Raises :class:`MetadataUnavailable`, and
        ``MetadataError`` if asked to remove this replica itself.
        """
        if broker_id == self._self_id:
            raise MetadataError("a controller cannot remove itself from the quorum")
        address = self.controller_address(broker_id)
        if address is None:
            return

        await self._change_quorum(
            lambda controller: controller.sync.removeNodeFromCluster,
            address,
            done=lambda: address not in self._members,
        )
        log.info("controller of broker %d at %s left the quorum", broker_id, address)

    async def add_controller(self, broker_id: int, addr: tuple[str, int]) -> None:
        """Add broker ``broker_id``'s controller at ``addr`` to the running quorum.

        Idempotent: returns at once if it is a member already. Add one controller at a time
        (pysyncobj refuses a change while another is uncommitted; that refusal is retried until
        the timeout). The new controller should run with ``join=True``; it then catches up from
        the leader. Raises :class:`MetadataUnavailable`.
        """
        address = _address(*addr)
        if address in self._members:
            return
        await self._change_quorum(
            lambda controller: controller.sync.addNodeToCluster,
            address,
            done=lambda: address in self._members,
        )
        log.info("controller of broker %d at %s is in the quorum", broker_id, address)

    async def _change_quorum(
        self,
        method: Callable[[_Controller], Callable[..., Any]],
        address: str,
        *,
        done: Callable[[], bool],
    ) -> None:
        """Add or remove the controller at ``address`` (pysyncobj's ``method``), then wait,
        within the timeout, until this replica's view of the membership shows it (``done``).

        pysyncobj refuses (REQUEST_DENIED) a change while another is uncommitted, and adding
        a member already there: retried until ``done`` or the deadline. The change is applied
        where the command answers; the status listing it is posted right after."""
        deadline = trio.current_time() + self._timeout
        await self._replicate(method, address, deadline=deadline, idempotent=True, done=done)
        with trio.move_on_after(self._timeout):
            while not done():
                await self._changed.wait()
