"""The ACL authorizer (Kafka's semantics: deny wins, prefixed names, User:*, implied describe,
super users, open without ACLs) and what every line-protocol command needs."""

from __future__ import annotations

import dataclasses
import typing

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafkaesque import protocol
from kafkaesque.protocol import AclOperation, AclPattern, AclPermission, AclResource, AclRow
from kafkaesque.security import (
    ANONYMOUS,
    CLUSTER_NAME,
    Authorizer,
    is_principal,
    principal_name,
    required,
    required_for_leave,
    user_principal,
)

OP, RES = AclOperation, AclResource
ALICE, BOB = "User:alice", "User:bob"


def acl(
    principal: str,
    operation: AclOperation,
    name: str,
    *,
    resource: AclResource = RES.TOPIC,
    deny: bool = False,
    prefixed: bool = False,
) -> AclRow:
    return AclRow(
        principal,
        AclPermission.DENY if deny else AclPermission.ALLOW,
        operation,
        resource,
        AclPattern.PREFIXED if prefixed else AclPattern.LITERAL,
        name,
    )


def may(
    acls: set[AclRow], principal: str, operation: AclOperation, name: str, **kw: object
) -> bool:
    resource = kw.get("resource", RES.TOPIC)
    assert isinstance(resource, AclResource)
    authorizer = Authorizer(["User:admin"])
    answer = authorizer.authorize(principal, acls, operation, resource, name)
    # The cached path (a frozenset, as the metadata gives) answers the same, twice.
    frozen = frozenset(acls)
    assert authorizer.authorize(principal, frozen, operation, resource, name) is answer
    assert authorizer.authorize(principal, frozen, operation, resource, name) is answer
    return answer


def test_no_acls_at_all_is_open() -> None:
    assert may(set(), ANONYMOUS, OP.DELETE, "orders")
    assert may(set(), ALICE, OP.ADMIN, CLUSTER_NAME, resource=RES.CLUSTER)


def test_once_acls_exist_what_is_not_allowed_is_denied() -> None:
    acls = {acl(ALICE, OP.WRITE, "orders")}
    assert may(acls, ALICE, OP.WRITE, "orders")
    assert not may(acls, ALICE, OP.READ, "orders")
    assert not may(acls, ALICE, OP.WRITE, "orders2")
    assert not may(acls, BOB, OP.WRITE, "orders")
    assert not may(acls, ALICE, OP.WRITE, "orders", resource=RES.GROUP)


def test_deny_wins_over_allow() -> None:
    acls = {acl(ALICE, OP.ALL, "*"), acl(ALICE, OP.WRITE, "orders", deny=True)}
    assert may(acls, ALICE, OP.READ, "orders")
    assert not may(acls, ALICE, OP.WRITE, "orders")
    assert may(acls, ALICE, OP.WRITE, "other")
    # A deny for everyone applies to alice too; a deny of all refuses every operation.
    acls = {acl(ALICE, OP.READ, "logs", prefixed=True), acl("User:*", OP.ALL, "logs.secret")}
    acls.add(
        dataclasses.replace(acl("User:*", OP.ALL, "logs.secret"), permission=AclPermission.DENY)
    )
    assert may(acls, ALICE, OP.READ, "logs.public")
    assert not may(acls, ALICE, OP.READ, "logs.secret")
    assert not may(acls, ALICE, OP.DESCRIBE, "logs.secret")


def test_prefixed_names() -> None:
    acls = {acl(ALICE, OP.WRITE, "phones.", prefixed=True)}
    assert may(acls, ALICE, OP.WRITE, "phones.1")
    assert may(acls, ALICE, OP.WRITE, "phones.")
    assert not may(acls, ALICE, OP.WRITE, "phones")
    assert not may(acls, ALICE, OP.WRITE, "xphones.1")
    # A literal "*" is every name; a prefixed "*" is names starting with "*".
    assert may({acl(ALICE, OP.WRITE, "*")}, ALICE, OP.WRITE, "anything")
    assert not may({acl(ALICE, OP.WRITE, "*", prefixed=True)}, ALICE, OP.WRITE, "anything")
    # A literal name is not a prefix.
    assert not may({acl(ALICE, OP.WRITE, "phones.")}, ALICE, OP.WRITE, "phones.1")


def test_wildcard_principal() -> None:
    acls = {acl("User:*", OP.READ, "public")}
    assert may(acls, ALICE, OP.READ, "public")
    assert may(acls, ANONYMOUS, OP.READ, "public")
    assert not may(acls, ALICE, OP.WRITE, "public")


@pytest.mark.parametrize(
    "granted", [OP.READ, OP.WRITE, OP.CREATE, OP.DELETE, OP.ALTER, OP.COMMIT, OP.ALL]
)
def test_describe_is_implied(granted: AclOperation) -> None:
    acls = {acl(ALICE, granted, "orders")}
    assert may(acls, ALICE, OP.DESCRIBE, "orders")
    assert not may(acls, ALICE, OP.DESCRIBE, "other")


def test_admin_does_not_imply_describe_nor_anything_else() -> None:
    acls = {acl(ALICE, OP.ADMIN, CLUSTER_NAME, resource=RES.CLUSTER)}
    assert may(acls, ALICE, OP.ADMIN, CLUSTER_NAME, resource=RES.CLUSTER)
    assert not may(acls, ALICE, OP.ALTER, CLUSTER_NAME, resource=RES.CLUSTER)
    # describe granted implies nothing but describe
    acls = {acl(ALICE, OP.DESCRIBE, "orders")}
    assert not may(acls, ALICE, OP.READ, "orders")


def test_a_deny_of_read_does_not_deny_an_implied_describe() -> None:
    # As Kafka: deny read, allow write -> describe still allowed (implied by write).
    acls = {acl(ALICE, OP.READ, "orders", deny=True), acl(ALICE, OP.WRITE, "orders")}
    assert may(acls, ALICE, OP.DESCRIBE, "orders")
    assert not may(acls, ALICE, OP.READ, "orders")


def test_super_users_may_do_everything() -> None:
    acls = {acl("User:admin", OP.ALL, "*", deny=True)}
    for operation in OP:
        assert may(acls, "User:admin", operation, "orders")
    assert not may(acls, ALICE, OP.READ, "orders")


def test_allowed_names_filters_in_order() -> None:
    acls = frozenset({acl(ALICE, OP.READ, "b"), acl(ALICE, OP.WRITE, "c", prefixed=True)})
    names = ["a", "b", "c1", "d", "c2"]
    allowed = Authorizer().allowed_names(ALICE, acls, OP.DESCRIBE, RES.TOPIC, names)
    assert allowed == ["b", "c1", "c2"]


def test_cache_follows_the_acls() -> None:
    authorizer = Authorizer()
    before = frozenset({acl(ALICE, OP.READ, "x")})
    after = before | {acl(ALICE, OP.READ, "x", deny=True)}
    assert authorizer.authorize(ALICE, before, OP.READ, RES.TOPIC, "x")
    assert not authorizer.authorize(ALICE, after, OP.READ, RES.TOPIC, "x")
    for n in range(5000):  # more than the cache holds: it stays bounded and right
        assert not authorizer.authorize(ALICE, before, OP.READ, RES.TOPIC, f"t{n}")
    assert authorizer.authorize(ALICE, before, OP.READ, RES.TOPIC, "x")


acl_rows = st.builds(
    AclRow,
    st.sampled_from([ALICE, BOB, "User:*"]),
    st.sampled_from(list(AclPermission)),
    st.sampled_from(list(OP)),
    st.sampled_from(list(RES)),
    st.sampled_from(list(AclPattern)),
    st.sampled_from(["a", "ab", "b", "*", ""]),
)


@given(
    acls=st.frozensets(acl_rows, max_size=8),
    principal=st.sampled_from([ALICE, BOB]),
    operation=st.sampled_from(list(OP)),
    resource=st.sampled_from(list(RES)),
    name=st.sampled_from(["a", "ab", "b", "abc"]),
)
def test_properties(
    acls: frozenset[AclRow],
    principal: str,
    operation: AclOperation,
    resource: AclResource,
    name: str,
) -> None:
    authorizer = Authorizer()
    answer = authorizer.authorize(principal, acls, operation, resource, name)
    assert authorizer.authorize(principal, set(acls), operation, resource, name) is answer
    # Adding a deny of the very operation refuses it; adding an allow never refuses, and
    # allows when no deny is there.
    deny = AclRow(principal, AclPermission.DENY, operation, resource, AclPattern.LITERAL, name)
    assert not authorizer.authorize(principal, acls | {deny}, operation, resource, name)
    allow = dataclasses.replace(deny, permission=AclPermission.ALLOW)
    grown = authorizer.authorize(principal, acls | {allow}, operation, resource, name)
    assert grown or not answer
    if all(row.permission is AclPermission.ALLOW for row in acls):
        assert grown
    # Another principal's rows change nothing.
    others = frozenset(dataclasses.replace(row, principal="User:carol") for row in acls)
    if others:
        assert not authorizer.authorize(principal, others, operation, resource, name)


def test_principals() -> None:
    assert user_principal("alice") == ALICE
    assert principal_name(ALICE) == "alice"
    assert is_principal("User:*") and is_principal(ANONYMOUS)
    for bad in ("alice", "User:", "Group:x", "User:a b", "user:alice"):
        assert not is_principal(bad)
        with pytest.raises(ValueError):
            principal_name(bad)


# One instance of every command class of the line protocol: a class added to the union without
# an example here fails test_every_command_has_a_rule.
ROW = acl(ALICE, OP.READ, "t")
EXAMPLES: dict[type, object] = {
    protocol.Pubs: protocol.Pubs("t", b"m"),
    protocol.PublishRecord: protocol.PublishRecord("t", b"v"),
    protocol.PublishBatch: protocol.PublishBatch("t", 0, b""),
    protocol.Subs: protocol.Subs("t", "g"),
    protocol.Cons: protocol.Cons("t", "0.ab", 0),
    protocol.Fetch: protocol.Fetch("t", 0, 0),
    protocol.Latest: protocol.Latest("t", b"k"),
    protocol.Commit: protocol.Commit("g", "t", 0, 5),
    protocol.FetchOffsets: protocol.FetchOffsets("g", "t"),
    protocol.DescribeGroup: protocol.DescribeGroup("g"),
    protocol.Leave: protocol.Leave("0.ab"),
    protocol.ListGroups: protocol.ListGroups(),
    protocol.ResetOffsets: protocol.ResetOffsets("g", "t", protocol.ResetKind.EARLIEST),
    protocol.DeleteGroup: protocol.DeleteGroup("g"),
    protocol.CreateTopic: protocol.CreateTopic("t", 1, 1),
    protocol.AlterTopic: protocol.AlterTopic("t", partitions=2),
    protocol.DeleteTopic: protocol.DeleteTopic("t"),
    protocol.DescribeTopic: protocol.DescribeTopic("t"),
    protocol.ListTopics: protocol.ListTopics(),
    protocol.Metadata: protocol.Metadata(),
    protocol.Reassign: protocol.Reassign("t", 0, (1, 2)),
    protocol.ElectLeaders: protocol.ElectLeaders("t", 0),
    protocol.AddBroker: protocol.AddBroker(4, "127.0.0.1:1", "127.0.0.1:2"),
    protocol.RemoveBroker: protocol.RemoveBroker(4),
    protocol.AclAdd: protocol.AclAdd(ROW),
    protocol.AclRemove: protocol.AclRemove(ROW),
    protocol.AclList: protocol.AclList(),
    protocol.Authenticate: protocol.Authenticate("PLAIN", b"\0a\0b"),
    protocol.Help: protocol.Help(),
    protocol.Ping: protocol.Ping(),
    protocol.Quit: protocol.Quit(),
}

T, G, C = RES.TOPIC, RES.GROUP, RES.CLUSTER
EXPECTED: dict[type, tuple[tuple[AclOperation, AclResource, str], ...]] = {
    protocol.Pubs: ((OP.WRITE, T, "t"),),
    protocol.PublishRecord: ((OP.WRITE, T, "t"),),
    protocol.PublishBatch: ((OP.WRITE, T, "t"),),
    protocol.Subs: ((OP.READ, T, "t"), (OP.READ, G, "g")),
    protocol.Cons: ((OP.READ, T, "t"),),
    protocol.Fetch: ((OP.READ, T, "t"),),
    protocol.Latest: ((OP.READ, T, "t"),),
    protocol.Commit: ((OP.COMMIT, G, "g"), (OP.READ, T, "t")),
    protocol.FetchOffsets: ((OP.DESCRIBE, G, "g"),),
    protocol.DescribeGroup: ((OP.DESCRIBE, G, "g"),),
    protocol.Leave: (),
    protocol.ListGroups: (),
    protocol.ResetOffsets: ((OP.ALTER, G, "g"),),
    protocol.DeleteGroup: ((OP.DELETE, G, "g"),),
    protocol.CreateTopic: ((OP.CREATE, T, "t"),),
    protocol.AlterTopic: ((OP.ALTER, T, "t"),),
    protocol.DeleteTopic: ((OP.DELETE, T, "t"),),
    protocol.DescribeTopic: ((OP.DESCRIBE, T, "t"),),
    protocol.ListTopics: (),
    protocol.Metadata: (),
    protocol.Reassign: ((OP.ADMIN, C, CLUSTER_NAME),),
    protocol.ElectLeaders: ((OP.ADMIN, C, CLUSTER_NAME),),
    protocol.AddBroker: ((OP.ADMIN, C, CLUSTER_NAME),),
    protocol.RemoveBroker: ((OP.ADMIN, C, CLUSTER_NAME),),
    protocol.AclAdd: ((OP.ALTER, C, CLUSTER_NAME),),
    protocol.AclRemove: ((OP.ALTER, C, CLUSTER_NAME),),
    protocol.AclList: ((OP.DESCRIBE, C, CLUSTER_NAME),),
    protocol.Authenticate: (),
    protocol.Help: (),
    protocol.Ping: (),
    protocol.Quit: (),
}


@pytest.mark.parametrize(
    "command_class", typing.get_args(protocol.Command), ids=lambda c: c.__name__
)
def test_every_command_has_a_rule(command_class: type) -> None:
    assert command_class in EXAMPLES, f"add an example and a rule for {command_class.__name__}"
    command = EXAMPLES[command_class]
    assert type(command) is command_class
    assert required(command) == EXPECTED[command_class]  # type: ignore[arg-type]


def test_unknown_command_class_has_no_rule() -> None:
    with pytest.raises(KeyError):
        required(protocol.BadCommand(protocol.ErrorCode.BAD_ARGS, "x"))  # type: ignore[arg-type]


def test_leave_needs_read_on_its_group() -> None:
    assert required_for_leave("g") == ((OP.READ, G, "g"),)


def test_cluster_name_is_kafkas() -> None:
    assert CLUSTER_NAME == "kafka-cluster" == protocol.CLUSTER_RESOURCE_NAME
