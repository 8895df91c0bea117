"""The controller quorum's state machine: :class:`MetadataState`, the replicated metadata, what
each replicated command does to it, and its dump format.

Pure and deterministic: every replica applies the same commands in the same order and uses
nothing else (no clock, no randomness, no ``hash()``, which is salted per process). Nothing here
knows pysyncobj or trio: ``_ReplicatedState`` in :mod:`._metadata` is pysyncobj's handle on it,
one ``@replicated`` method per command. The values it holds and the rules it applies are in
:mod:`._metadata_view`.

Errors. An apply function never raises (the exception would leave pysyncobj's apply loop with the
entry half-applied but not counted as applied; here it would stop the controller): a refusal is
returned as a :class:`MetadataError` value and raised on the caller's side.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

from kafkaesque.protocol import AclRow

from ._metadata_view import (
    ALTERABLE,
    BrokerInfo,
    InvalidConfigError,
    MetadataError,
    MetadataView,
    TopicConfig,
    TopicExistsError,
    TopicInfo,
    UnknownTopicError,
    acl_problem,
    acl_row,
    assign_replicas,
    config_problem,
    describe_config,
)

__all__ = ["MetadataState"]

_DUMP_FORMAT = 1  # version of MetadataState.to_primitive's layout


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
        problem = config_problem(name, config)
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
        problem = config_problem(name, config)
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
        info = TopicInfo(name, config, replicas, info.reassigned)
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
        info = dataclasses.replace(
            info, replicas=tuple(assignment), reassigned=info.reassigned | {partition}
        )
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
                (t.name, dataclasses.astuple(t.config), t.replicas, sorted(t.reassigned))
                for t in self.topics.values()
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
        for name, config, replicas, *rest in data["topics"]:
            # Dumps written before ``reassigned`` existed: none counted as reassigned.
            reassigned = frozenset(rest[0]) if rest else frozenset()
            state.topics[name] = TopicInfo(name, TopicConfig(*config), replicas, reassigned)
        # Dumps written before ACLs existed have none: no ACLs.
        state.acls = {tuple(acl) for acl in data.get("acls", ())}
        # Older dumps also hold a "subscriptions" list (consumer groups, since moved to
        # __consumer_offsets): ignored.
        return state
