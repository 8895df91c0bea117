"""Authorization: which ACLs let a principal do an operation on a resource, and what each
line-protocol command needs (docs/security.md). Pure: the ACLs come from the metadata."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from typing import Any, Final

from kafkaesque import protocol
from kafkaesque.protocol import AclOperation, AclPattern, AclPermission, AclResource, AclRow

CLUSTER_NAME: Final = protocol.CLUSTER_RESOURCE_NAME
ANY_PRINCIPAL: Final = protocol.ANY_PRINCIPAL
ANONYMOUS: Final = "User:ANONYMOUS"
_USER_PREFIX: Final = "User:"
_CACHE_SIZE: Final = 4096

# An allowed operation on a resource implies describing it (as Kafka).
_IMPLIES_DESCRIBE: Final = frozenset(
    {
        AclOperation.READ,
        AclOperation.WRITE,
        AclOperation.CREATE,
        AclOperation.DELETE,
        AclOperation.ALTER,
        AclOperation.COMMIT,
    }
)

Requirement = tuple[AclOperation, AclResource, str]


def user_principal(name: str) -> str:
    """``User:<name>``: the principal of an authenticated user."""
    return _USER_PREFIX + name


def principal_name(principal: str) -> str:
    """The user name of ``User:<name>``; ValueError for another form."""
    if not is_principal(principal):
        raise ValueError(f"a principal is User:<name> or User:*, not {principal!r}")
    return principal[len(_USER_PREFIX) :]


def is_principal(text: str) -> bool:
    """Whether ``text`` is ``User:<name>`` (``User:*`` included) with a name without spaces."""
    name = text[len(_USER_PREFIX) :]
    return (
        text.startswith(_USER_PREFIX)
        and bool(name)
        and not any(c.isspace() or not c.isprintable() for c in name)
    )


def _name_matches(acl: AclRow, name: str) -> bool:
    if acl.pattern is AclPattern.PREFIXED:
        return name.startswith(acl.name)
    return acl.name in ("*", name)


class Authorizer:
    """Decides with the cluster's ACLs (``authorize``); ``super_users`` (``User:name``) may do
    everything. Thread-compatible, no I/O; keeps a small cache of answers for the same frozenset
    of ACLs (the metadata's ``frozenset[AclRow]``), so the common path is a dict lookup."""

    def __init__(self, super_users: Iterable[str] = ()) -> None:
        self.super_users = frozenset(super_users)
        self._cache: dict[tuple[Any, ...], bool] = {}

    def authorize(
        self,
        principal: str,
        acls: Collection[AclRow],
        operation: AclOperation,
        resource: AclResource,
        name: str,
    ) -> bool:
        """Whether ``principal`` may do ``operation`` on the ``resource`` called ``name``.

        Super users: always. No ACLs at all: allowed (nothing configured, the cluster is open).
        Otherwise the ACLs that match (principal is ``principal`` or ``User:*``, same resource
        kind, name equal or ``*`` for literal, a prefix for prefixed; operation equal or
        ``all``) decide: any deny refuses, else any allow permits; an allowed read, write,
        create, delete, alter or commit implies describe. Nothing matches: refused.
        """
        if principal in self.super_users:
            return True
        if not acls:
            return True
        if not isinstance(acls, frozenset):
            return _decide(principal, acls, operation, resource, name)
        key = (principal, operation, resource, name, acls)
        answer = self._cache.get(key)
        if answer is None:
            if len(self._cache) >= _CACHE_SIZE:
                self._cache.clear()  # ACLs changed or many names: start over, bounded
            answer = self._cache[key] = _decide(principal, acls, operation, resource, name)
        return answer

    def allowed_names(
        self,
        principal: str,
        acls: Collection[AclRow],
        operation: AclOperation,
        resource: AclResource,
        names: Iterable[str],
    ) -> list[str]:
        """The ``names`` (in order) ``principal`` may do ``operation`` on: to filter TOPICS,
        METADATA and GROUPS rows."""
        return [n for n in names if self.authorize(principal, acls, operation, resource, n)]


def _decide(
    principal: str,
    acls: Collection[AclRow],
    operation: AclOperation,
    resource: AclResource,
    name: str,
) -> bool:
    allowed = False
    for acl in acls:
        if acl.resource is not resource or acl.principal not in (principal, ANY_PRINCIPAL):
            continue
        if not _name_matches(acl, name):
            continue
        exact = acl.operation is operation or acl.operation is AclOperation.ALL
        if acl.permission is AclPermission.DENY:
            if exact:
                return False  # deny wins: no need to look further
        elif exact or (operation is AclOperation.DESCRIBE and acl.operation in _IMPLIES_DESCRIBE):
            allowed = True
    return allowed


def _topic(op: AclOperation) -> Callable[[Any], tuple[Requirement, ...]]:
    return lambda c: ((op, AclResource.TOPIC, c.topic),)


def _group(op: AclOperation) -> Callable[[Any], tuple[Requirement, ...]]:
    return lambda c: ((op, AclResource.GROUP, c.group),)


def _cluster(op: AclOperation) -> Callable[[Any], tuple[Requirement, ...]]:
    return lambda c: ((op, AclResource.CLUSTER, CLUSTER_NAME),)


def _nothing(c: Any) -> tuple[Requirement, ...]:
    return ()


_R = AclOperation
# One rule per command class: a command without one makes `required` raise (and its test fail).
_RULES: Final[dict[type, Callable[[Any], tuple[Requirement, ...]]]] = {
    protocol.Pubs: _topic(_R.WRITE),
    protocol.PublishRecord: _topic(_R.WRITE),
    protocol.PublishBatch: _topic(_R.WRITE),
    protocol.Subs: lambda c: (
        (_R.READ, AclResource.TOPIC, c.topic),
        (_R.READ, AclResource.GROUP, c.group),
    ),
    protocol.Cons: _topic(_R.READ),
    protocol.Fetch: _topic(_R.READ),
    protocol.Latest: _topic(_R.READ),
    protocol.Commit: lambda c: (
        (_R.COMMIT, AclResource.GROUP, c.group),
        (_R.READ, AclResource.TOPIC, c.topic),
    ),
    protocol.FetchOffsets: _group(_R.DESCRIBE),
    protocol.DescribeGroup: _group(_R.DESCRIBE),
    # LEAVE names only a subscription id, which SUBS returned (it needed read on the group);
    # the broker that resolves the id to its group checks read group G (required_for_leave).
    protocol.Leave: _nothing,
    protocol.ListGroups: _nothing,  # rows filtered: describe group per row
    protocol.ResetOffsets: _group(_R.ALTER),
    protocol.DeleteGroup: _group(_R.DELETE),
    protocol.CreateTopic: _topic(_R.CREATE),
    protocol.AlterTopic: _topic(_R.ALTER),
    protocol.DeleteTopic: _topic(_R.DELETE),
    protocol.DescribeTopic: _topic(_R.DESCRIBE),
    protocol.ListTopics: _nothing,  # rows filtered: describe topic per row
    protocol.Metadata: _nothing,  # topic rows filtered; broker rows always
    protocol.Reassign: _cluster(_R.ADMIN),
    protocol.ElectLeaders: _cluster(_R.ADMIN),
    protocol.AddBroker: _cluster(_R.ADMIN),
    protocol.RemoveBroker: _cluster(_R.ADMIN),
    protocol.AclAdd: _cluster(_R.ALTER),
    protocol.AclRemove: _cluster(_R.ALTER),
    protocol.AclList: _cluster(_R.DESCRIBE),
    protocol.Authenticate: _nothing,
    protocol.Help: _nothing,
    protocol.Ping: _nothing,
    protocol.Quit: _nothing,
}


def required(command: protocol.Command) -> tuple[Requirement, ...]:
    """What a line-protocol command needs: (operation, resource, name) triples, all of which
    must be authorized (docs/security.md's table). Empty for commands anyone may send and for
    those whose rows are filtered instead (TOPICS, METADATA, GROUPS), and for LEAVE (see
    ``required_for_leave``). PUBS/PUB/PUBB need write; a broker that auto-creates the missing
    topic also checks ``(create, topic, T)``. KeyError for a command class without a rule."""
    return _RULES[type(command)](command)


def required_for_leave(group: str) -> tuple[Requirement, ...]:
    """What LEAVE needs once the broker knows the subscription's group: read group G."""
    return ((AclOperation.READ, AclResource.GROUP, group),)
