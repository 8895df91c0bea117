"""The Kafka security and admin APIs: SASL, ACLs, topic configs, partition growth (issue 33).

Each is a thin adapter over the services the line protocol uses, so a rule lives in one place:

- **SASL** (SaslHandshake, SaslAuthenticate): the exchange is ``AccessControl.sasl_step``, as
  ``AUTH``'s: SCRAM-SHA-256 on any connection, PLAIN only over TLS, the same users file, the same
  failure limit per address, failures counted in the same ``/metrics`` counter. A wrong password
  answers SASL_AUTHENTICATION_FAILED (58), and the connection is then closed, as Kafka closes it.
  After a v0 handshake the tokens travel as bare frames (``sasl_token``), Kafka's original way.
- **ACLs** (DescribeAcls, CreateAcls, DeleteAcls): the cluster's ACLs in the replicated metadata,
  as ``ACL LIST/ADD/REMOVE``, with Kafka's codes mapped onto ours (``_RESOURCES``,
  ``_OPERATIONS``); changing them needs ALTER on the cluster, listing them DESCRIBE, as Kafka.
  Our ACLs have no host: only ``*`` is accepted, and every ACL is described with host ``*``.
- **Configs** (DescribeConfigs, IncrementalAlterConfigs): a topic's ``retention.ms``,
  ``retention.bytes`` and ``cleanup.policy`` through the topic admin's ``alter`` (``ALTER``'s);
  a few read-only ones clients expect (``min.insync.replicas``...) are described, not altered.
- **CreatePartitions**: the partition growth of ``ALTER topic partitions=N``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Final

from kafkaesque.protocol import (
    CLUSTER_RESOURCE_NAME,
    AclOperation,
    AclPattern,
    AclPermission,
    AclResource,
    AclRow,
    AlterTopic,
    ErrorCode,
)
from kafkaesque.protocol.kafka import (
    CREATE_ACLS,
    CREATE_PARTITIONS,
    DELETE_ACLS,
    DESCRIBE_ACLS,
    DESCRIBE_CONFIGS,
    INCREMENTAL_ALTER_CONFIGS,
    SASL_AUTHENTICATE,
    SASL_HANDSHAKE,
    AclOperationCode,
    ConfigOperation,
    ConfigResourceType,
    ConfigSource,
    ConfigType,
    KafkaError,
    KafkaRequest,
    Message,
    PatternType,
    PermissionType,
    ResourceType,
)
from kafkaesque.security import MECHANISM, PLAIN_MECHANISM

from .._errors import RequestError
from .._metadata_view import TopicConfig, TopicInfo
from .._session import Session
from .._topic_admin import metadata_call
from ._cleanup_policy import describe_cleanup_policy, parse_cleanup_policy
from ._wiring import KafkaWiring

log = logging.getLogger("kafkaesque.broker.kafka")

Handler = Callable[[KafkaRequest, Session], Awaitable[Message | None]]


class KafkaSession(Session):
    """A Kafka connection's session: besides who it is, where its SASL exchange stands.

    ``mechanism``: the one SaslHandshake chose, until the exchange ends (None: no handshake, or
    the exchange ended). ``raw_tokens``: the handshake was v0, so the SASL tokens come as bare
    frames. ``close``: the connection is to be closed once the answer in hand is sent (a failed
    authentication, as Kafka does).
    """

    __slots__ = ("close", "mechanism", "raw_tokens")

    def __init__(self, address: str, *, tls: bool, principal: str | None) -> None:
        super().__init__(address, tls=tls, principal=principal)
        self.mechanism: str | None = None
        self.raw_tokens = False
        self.close = False


# Kafka's codes and ours, both ways: a code with no equivalent is refused when an ACL is
# created, and an ACL of ours with no Kafka equivalent (COMMIT) is not described over Kafka.
_RESOURCES: Final = {
    ResourceType.TOPIC: AclResource.TOPIC,
    ResourceType.GROUP: AclResource.GROUP,
    ResourceType.CLUSTER: AclResource.CLUSTER,
}
_OPERATIONS: Final = {
    AclOperationCode.ALL: AclOperation.ALL,
    AclOperationCode.READ: AclOperation.READ,
    AclOperationCode.WRITE: AclOperation.WRITE,
    AclOperationCode.CREATE: AclOperation.CREATE,
    AclOperationCode.DELETE: AclOperation.DELETE,
    AclOperationCode.ALTER: AclOperation.ALTER,
    AclOperationCode.DESCRIBE: AclOperation.DESCRIBE,
    AclOperationCode.CLUSTER_ACTION: AclOperation.ADMIN,
}
_PERMISSIONS: Final = {
    PermissionType.ALLOW: AclPermission.ALLOW,
    PermissionType.DENY: AclPermission.DENY,
}
_PATTERNS: Final = {
    PatternType.LITERAL: AclPattern.LITERAL,
    PatternType.PREFIXED: AclPattern.PREFIXED,
}
_KAFKA_RESOURCE: Final = {v: k for k, v in _RESOURCES.items()}
_KAFKA_OPERATION: Final = {v: k for k, v in _OPERATIONS.items()}
_KAFKA_PERMISSION: Final = {v: k for k, v in _PERMISSIONS.items()}
_KAFKA_PATTERN: Final = {v: k for k, v in _PATTERNS.items()}
_ANY_HOST: Final = "*"

# The topic configs served: name -> (read-only, type). The alterable ones map to ALTER's
# settings; the read-only ones are what this cluster does, said in Kafka's words.
_RETENTION_MS: Final = "retention.ms"
_RETENTION_BYTES: Final = "retention.bytes"
_CLEANUP_POLICY: Final = "cleanup.policy"
_ALTERABLE: Final = (_RETENTION_MS, _RETENTION_BYTES, _CLEANUP_POLICY)


class KafkaAdminHandlers:
    """The handlers of the SASL, ACL, config and partition APIs (see the module docstring)."""

    def __init__(self, wiring: KafkaWiring) -> None:
        self._w = wiring
        self.by_key: dict[int, Handler] = {
            SASL_HANDSHAKE.key: self.sasl_handshake,
            SASL_AUTHENTICATE.key: self.sasl_authenticate,
            DESCRIBE_ACLS.key: self.describe_acls,
            CREATE_ACLS.key: self.create_acls,
            DELETE_ACLS.key: self.delete_acls,
            DESCRIBE_CONFIGS.key: self.describe_configs,
            INCREMENTAL_ALTER_CONFIGS.key: self.incremental_alter_configs,
            CREATE_PARTITIONS.key: self.create_partitions,
        }

    # -- SASL -----------------------------------------------------------------------------------

    def offered(self, session: Session) -> list[str]:
        """The mechanisms ``session`` may use: SCRAM-SHA-256, and PLAIN over TLS; none on a
        broker without a users file."""
        if self._w.access.users is None:
            return []
        return [MECHANISM, PLAIN_MECHANISM] if session.tls else [MECHANISM]

    async def sasl_handshake(self, request: KafkaRequest, session: Session) -> Message:
        """Choose the mechanism: UNSUPPORTED_SASL_MECHANISM (33) with the list offered for one
        that is not; ILLEGAL_SASL_STATE (34) once authenticated, or without a users file."""
        assert isinstance(session, KafkaSession)
        offered = self.offered(session)
        if not offered or session.principal is not None:
            return {"error_code": KafkaError.ILLEGAL_SASL_STATE, "mechanisms": offered}
        mechanism = request.body["mechanism"].upper()
        if mechanism not in offered:
            return {"error_code": KafkaError.UNSUPPORTED_SASL_MECHANISM, "mechanisms": offered}
        session.mechanism = mechanism
        session.raw_tokens = request.version == 0
        return {"error_code": KafkaError.NONE, "mechanisms": offered}

    async def sasl_authenticate(self, request: KafkaRequest, session: Session) -> Message:
        """One step of the exchange SaslHandshake began (ILLEGAL_SASL_STATE without one, and
        the connection is closed); a failure answers SASL_AUTHENTICATION_FAILED (58), and the
        connection is closed."""
        assert isinstance(session, KafkaSession)
        if session.mechanism is None or session.raw_tokens:
            session.close = True
            return {
                "error_code": KafkaError.ILLEGAL_SASL_STATE,
                "error_message": "SaslAuthenticate needs a SaslHandshake v1 first",
            }
        data, failure = await self.sasl_token(session, request.body["auth_bytes"])
        if failure is not None:
            return {
                "error_code": KafkaError.SASL_AUTHENTICATION_FAILED,
                "error_message": f"Authentication failed: {failure}",
            }
        return {"error_code": KafkaError.NONE, "auth_bytes": data}

    async def sasl_token(self, session: KafkaSession, token: bytes) -> tuple[bytes, str | None]:
        """One SASL token of ``session``'s exchange: (the answer, None), or (b"", why it
        failed: the connection is then to be closed). The exchange ends at a success or a
        failure."""
        mechanism = session.mechanism
        if mechanism is None:
            session.close = True
            return b"", "no SASL exchange in progress"
        step = await self._w.access.sasl_step(session, mechanism, token)
        if step.failure is not None:
            session.mechanism = None
            session.close = True
            return b"", step.failure
        if step.user is not None:
            session.mechanism = None
            session.raw_tokens = False
        return step.data, None

    # -- ACLs -----------------------------------------------------------------------------------

    async def describe_acls(self, request: KafkaRequest, session: Session) -> Message:
        """The ACLs that match the filter (DESCRIBE on the cluster, as Kafka)."""
        if not self._w.access.allows(
            session, AclOperation.DESCRIBE, AclResource.CLUSTER, CLUSTER_RESOURCE_NAME
        ):
            return {
                "error_code": KafkaError.CLUSTER_AUTHORIZATION_FAILED,
                "error_message": "describing ACLs needs describe on the cluster",
            }
        try:
            matches = _acl_filter(request.body)
        except ValueError as exc:
            return {"error_code": KafkaError.INVALID_REQUEST, "error_message": str(exc)}
        grouped: dict[tuple[int, str, int], list[Message]] = {}
        for row in _sorted(self._w.metadata.view.acls):
            if matches(row) and row.operation in _KAFKA_OPERATION:
                key = (
                    _KAFKA_RESOURCE[row.resource],
                    row.name,
                    _KAFKA_PATTERN[row.pattern],
                )
                grouped.setdefault(key, []).append(
                    {
                        "principal": row.principal,
                        "host": _ANY_HOST,
                        "operation": _KAFKA_OPERATION[row.operation],
                        "permission_type": _KAFKA_PERMISSION[row.permission],
                    }
                )
        resources = [
            {"resource_type": t, "resource_name": n, "pattern_type": p, "acls": acls}
            for (t, n, p), acls in grouped.items()
        ]
        return {"error_code": KafkaError.NONE, "resources": resources}

    async def create_acls(self, request: KafkaRequest, session: Session) -> Message:
        """Add each ACL (ALTER on the cluster, as Kafka); one result per creation."""
        allowed = self._w.access.allows(
            session, AclOperation.ALTER, AclResource.CLUSTER, CLUSTER_RESOURCE_NAME
        )
        results = []
        for creation in request.body["creations"]:
            if not allowed:
                results.append(_refused_on_cluster("creating ACLs"))
                continue
            try:
                row = _acl_row(creation)
                await metadata_call(self._w.metadata.add_acl(row))
            except ValueError as exc:
                results.append(
                    {"error_code": KafkaError.INVALID_REQUEST, "error_message": str(exc)}
                )
            except RequestError as exc:
                results.append({"error_code": _acl_error(exc), "error_message": exc.message})
            else:
                results.append({"error_code": KafkaError.NONE})
        return {"results": results}

    async def delete_acls(self, request: KafkaRequest, session: Session) -> Message:
        """Remove the ACLs each filter matches (ALTER on the cluster); each filter's result
        lists them."""
        allowed = self._w.access.allows(
            session, AclOperation.ALTER, AclResource.CLUSTER, CLUSTER_RESOURCE_NAME
        )
        results = []
        for f in request.body["filters"]:
            if not allowed:
                results.append(_refused_on_cluster("deleting ACLs"))
                continue
            try:
                matches = _acl_filter(f)
            except ValueError as exc:
                results.append(
                    {"error_code": KafkaError.INVALID_REQUEST, "error_message": str(exc)}
                )
                continue
            matching = []
            for row in _sorted(self._w.metadata.view.acls):
                if not matches(row) or row.operation not in _KAFKA_OPERATION:
                    continue
                error, message = KafkaError.NONE, None
                try:
                    await metadata_call(self._w.metadata.remove_acl(row))
                except RequestError as exc:
                    error, message = _acl_error(exc), exc.message
                matching.append(
                    {
                        "error_code": error,
                        "error_message": message,
                        "resource_type": _KAFKA_RESOURCE[row.resource],
                        "resource_name": row.name,
                        "pattern_type": _KAFKA_PATTERN[row.pattern],
                        "principal": row.principal,
                        "host": _ANY_HOST,
                        "operation": _KAFKA_OPERATION[row.operation],
                        "permission_type": _KAFKA_PERMISSION[row.permission],
                    }
                )
            results.append({"error_code": KafkaError.NONE, "matching_acls": matching})
        return {"filter_results": results}

    # -- Configs --------------------------------------------------------------------------------

    async def describe_configs(self, request: KafkaRequest, session: Session) -> Message:
        """Each topic's configs (DESCRIBE on the topic); a broker's: none (DESCRIBE on the
        cluster). ``configuration_keys`` narrows the list; unknown names are left out."""
        results = []
        for r in request.body["resources"]:
            kind, name = r["resource_type"], r["resource_name"]
            answer: Message = {"resource_type": kind, "resource_name": name}
            keys = r.get("configuration_keys")
            if kind == ConfigResourceType.TOPIC:
                info = self._w.metadata.view.topics.get(name)
                if not self._w.access.allows(
                    session, AclOperation.DESCRIBE, AclResource.TOPIC, name
                ):
                    answer |= _error(KafkaError.TOPIC_AUTHORIZATION_FAILED, f"topic {name}")
                elif info is None:
                    answer |= _error(KafkaError.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {name}")
                else:
                    configs = self._topic_configs(info, request.version)
                    if keys is not None:
                        configs = [c for c in configs if c["name"] in keys]
                    answer |= {"error_code": KafkaError.NONE, "configs": configs}
            elif kind == ConfigResourceType.BROKER:
                if self._w.access.allows(
                    session, AclOperation.DESCRIBE, AclResource.CLUSTER, CLUSTER_RESOURCE_NAME
                ):
                    answer |= {"error_code": KafkaError.NONE, "configs": []}
                else:
                    answer |= _error(KafkaError.CLUSTER_AUTHORIZATION_FAILED, "the cluster")
            else:
                answer |= _error(KafkaError.INVALID_REQUEST, f"resource type {kind} is not served")
            results.append(answer)
        return {"results": results}

    def _topic_configs(self, info: TopicInfo, version: int) -> list[Message]:
        c: TopicConfig = info.config
        values: list[tuple[str, str, bool, ConfigType]] = [
            (
                _CLEANUP_POLICY,
                describe_cleanup_policy(c.compact, c.retention_ms, c.retention_bytes),
                False,
                ConfigType.LIST,
            ),
            (_RETENTION_BYTES, _number(c.retention_bytes), False, ConfigType.LONG),
            (_RETENTION_MS, _number(c.retention_ms), False, ConfigType.LONG),
            # What the cluster does, said in Kafka's words (read-only): a Raft majority
            # commits, so that many replicas hold every acknowledged record.
            ("min.insync.replicas", str(c.replication_factor // 2 + 1), True, ConfigType.INT),
            ("replication.factor", str(c.replication_factor), True, ConfigType.SHORT),
            ("segment.bytes", str(self._w.config.segment_bytes), True, ConfigType.INT),
            ("message.timestamp.type", "CreateTime", True, ConfigType.STRING),
            ("compression.type", "producer", True, ConfigType.STRING),
            ("unclean.leader.election.enable", "false", True, ConfigType.BOOLEAN),
        ]
        configs = []
        for name, value, read_only, kind in values:
            source = ConfigSource.DEFAULT_CONFIG if read_only else ConfigSource.DYNAMIC_TOPIC_CONFIG
            configs.append(
                {
                    "name": name,
                    "value": value,
                    "read_only": read_only,
                    "config_source": source,
                    "is_sensitive": False,
                    "synonyms": [],
                    "config_type": kind,
                }
            )
        return sorted(configs, key=lambda m: m["name"])

    async def incremental_alter_configs(self, request: KafkaRequest, session: Session) -> Message:
        """SET or DELETE (back to the broker's default) a topic's retention.ms,
        retention.bytes, cleanup.policy, through ALTER's topic admin (ALTER on the topic);
        anything else is INVALID_CONFIG. ``validate_only`` checks without changing."""
        responses = []
        validate_only = bool(request.body.get("validate_only"))
        for r in request.body["resources"]:
            kind, name = r["resource_type"], r["resource_name"]
            answer: Message = {"resource_type": kind, "resource_name": name}
            if kind != ConfigResourceType.TOPIC:
                answer |= _error(KafkaError.INVALID_REQUEST, "only topic configs can be altered")
            elif not self._w.access.allows(session, AclOperation.ALTER, AclResource.TOPIC, name):
                answer |= _error(KafkaError.TOPIC_AUTHORIZATION_FAILED, f"topic {name}")
            elif name not in self._w.metadata.view.topics:
                answer |= _error(KafkaError.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {name}")
            else:
                try:
                    command = self._alter_command(name, r["configs"])
                    if not validate_only:
                        await self._w.admin.alter(command)
                    answer |= {"error_code": KafkaError.NONE}
                except ValueError as exc:
                    answer |= _error(KafkaError.INVALID_CONFIG, str(exc))
                except RequestError as exc:
                    answer |= _error(_admin_error(exc), exc.message)
            responses.append(answer)
        return {"responses": responses}

    def _alter_command(self, topic: str, configs: Iterable[Message]) -> AlterTopic:
        """ALTER's command for the configs asked; ValueError (what is wrong) for a config or
        an operation that is not served, or a bad value."""
        defaults = self._w.config
        settings: dict[str, Any] = {}
        for c in configs:
            key, operation, value = c["name"], c["config_operation"], c["value"]
            if key not in _ALTERABLE:
                raise ValueError(f"{key} cannot be altered here: only {', '.join(_ALTERABLE)}")
            if operation == ConfigOperation.DELETE:
                if key == _RETENTION_MS:
                    settings["retention_ms"] = _unset(defaults.default_retention_ms)
                elif key == _RETENTION_BYTES:
                    settings["retention_bytes"] = _unset(defaults.default_retention_bytes)
                else:
                    settings["compact"] = False
                continue
            if operation != ConfigOperation.SET:
                raise ValueError(f"{key}: only SET and DELETE are served")
            if key == _CLEANUP_POLICY:
                # The retention limits stay as they are: a compacted topic that keeps one is
                # described as compact,delete (``_cleanup_policy``).
                settings["compact"], _ = parse_cleanup_policy(value)
                continue
            try:
                number = int(value or "")
            except ValueError:
                raise ValueError(f"{key}={value} is not a number") from None
            settings["retention_ms" if key == _RETENTION_MS else "retention_bytes"] = number
        if not settings:
            raise ValueError("no config to alter")
        return AlterTopic(topic, **settings)

    # -- CreatePartitions -----------------------------------------------------------------------

    async def create_partitions(self, request: KafkaRequest, session: Session) -> Message:
        """Grow each topic to ``count`` partitions as ``ALTER topic partitions=N`` does (ALTER
        on the topic); fewer or as many is INVALID_PARTITIONS, explicit assignments are
        refused (the cluster places replicas)."""
        body = request.body
        results = []
        for t in body["topics"]:
            name, count = t["name"], t["count"]
            error, message = await self._grow(
                name, count, t.get("assignments"), bool(body.get("validate_only")), session
            )
            results.append({"name": name, "error_code": error, "error_message": message})
        return {"results": results}

    async def _grow(
        self,
        name: str,
        count: int,
        assignments: list[Message] | None,
        validate_only: bool,
        session: Session,
    ) -> tuple[KafkaError, str | None]:
        if not self._w.access.allows(session, AclOperation.ALTER, AclResource.TOPIC, name):
            return KafkaError.TOPIC_AUTHORIZATION_FAILED, f"may not alter topic {name}"
        info = self._w.metadata.view.topics.get(name)
        if info is None:
            return KafkaError.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {name}"
        if assignments:
            return KafkaError.INVALID_REPLICA_ASSIGNMENT, "replicas are assigned by the cluster"
        current = info.config.partitions
        if count <= current:
            return (
                KafkaError.INVALID_PARTITIONS,
                f"topic {name} has {current} partitions: {count} would not be an increase",
            )
        if validate_only:
            return KafkaError.NONE, None
        try:
            await self._w.admin.alter(AlterTopic(name, partitions=count))
        except RequestError as exc:
            if exc.code is ErrorCode.INVALID_CONFIG:  # more than the cluster's maximum
                return KafkaError.INVALID_PARTITIONS, exc.message
            return _admin_error(exc), exc.message
        return KafkaError.NONE, None


def _error(code: KafkaError, message: str) -> Message:
    return {"error_code": code, "error_message": message}


def _refused_on_cluster(what: str) -> Message:
    return _error(KafkaError.CLUSTER_AUTHORIZATION_FAILED, f"{what} needs alter on the cluster")


def _number(value: int | None) -> str:
    return "-1" if value is None else str(value)


def _unset(default: int | None) -> int:
    """ALTER's value for "back to the broker's default" (-1: unlimited)."""
    return -1 if default is None else default


def _admin_error(exc: RequestError) -> KafkaError:
    if exc.code is ErrorCode.INVALID_CONFIG:
        return KafkaError.INVALID_CONFIG
    if exc.code is ErrorCode.UNKNOWN_TOPIC:
        return KafkaError.UNKNOWN_TOPIC_OR_PARTITION
    if exc.code in (ErrorCode.TIMEOUT, ErrorCode.NO_QUORUM):
        return KafkaError.REQUEST_TIMED_OUT
    if exc.code in (ErrorCode.NOT_LEADER, ErrorCode.NOT_READY):
        return KafkaError.LEADER_NOT_AVAILABLE
    return KafkaError.UNKNOWN_SERVER_ERROR


def _acl_error(exc: RequestError) -> KafkaError:
    if exc.code is ErrorCode.INVALID_CONFIG:
        return KafkaError.INVALID_REQUEST
    return _admin_error(exc)


def _sorted(acls: Iterable[AclRow]) -> list[AclRow]:
    return sorted(acls, key=lambda a: (a.resource, a.name, a.pattern, a.principal, a.operation))


def _acl_row(creation: Message) -> AclRow:
    """Our ACL for a CreateAcls creation; ValueError (why) for what has no equivalent."""
    resource = _RESOURCES.get(creation["resource_type"])
    if resource is None:
        raise ValueError(f"resource type {creation['resource_type']}: topic, group or cluster")
    pattern = _PATTERNS.get(creation.get("resource_pattern_type", PatternType.LITERAL))
    if pattern is None:
        raise ValueError("a pattern type is literal or prefixed")
    operation = _OPERATIONS.get(creation["operation"])
    if operation is None:
        raise ValueError(
            f"operation {creation['operation']} has no equivalent here: all, read, write, "
            "create, delete, alter, describe or cluster_action"
        )
    permission = _PERMISSIONS.get(creation["permission_type"])
    if permission is None:
        raise ValueError("a permission is allow or deny")
    if creation["host"] != _ANY_HOST:
        raise ValueError("ACLs here hold for every host: the host must be *")
    return AclRow(
        creation["principal"], permission, operation, resource, pattern, creation["resource_name"]
    )


def _acl_filter(f: Message) -> Callable[[AclRow], bool]:
    """Which of our ACLs a DescribeAcls or DeleteAcls filter selects (ANY matches all; a
    MATCH pattern selects the ACLs that apply to the name: itself, ``*``, and the prefixes
    it starts with); ValueError for a filter that names a code that is not Kafka's."""
    kind = f["resource_type_filter"]
    name: str | None = f.get("resource_name_filter")
    pattern = f.get("pattern_type_filter", PatternType.LITERAL)
    principal = f.get("principal_filter")
    host = f.get("host_filter")
    operation = f["operation"]
    permission = f["permission_type"]
    if kind not in tuple(ResourceType) or kind == ResourceType.UNKNOWN:
        raise ValueError(f"resource type filter {kind} is not valid")
    if pattern not in tuple(PatternType) or pattern == PatternType.UNKNOWN:
        raise ValueError(f"pattern type filter {pattern} is not valid")
    if operation not in tuple(AclOperationCode) or operation == AclOperationCode.UNKNOWN:
        raise ValueError(f"operation filter {operation} is not valid")
    if permission not in tuple(PermissionType) or permission == PermissionType.UNKNOWN:
        raise ValueError(f"permission filter {permission} is not valid")

    def matches(row: AclRow) -> bool:
        if kind != ResourceType.ANY and _RESOURCES.get(kind) is not row.resource:
            return False
        if operation != AclOperationCode.ANY and _OPERATIONS.get(operation) is not row.operation:
            return False
        if permission != PermissionType.ANY and _PERMISSIONS.get(permission) is not row.permission:
            return False
        if principal is not None and principal != row.principal:
            return False
        if host is not None and host != _ANY_HOST:
            return False
        if pattern == PatternType.MATCH:
            if name is None:
                return True
            if row.pattern is AclPattern.LITERAL:
                return row.name in (name, "*")
            return name.startswith(row.name)
        if pattern != PatternType.ANY and _PATTERNS.get(pattern) is not row.pattern:
            return False
        return name is None or name == row.name

    return matches
