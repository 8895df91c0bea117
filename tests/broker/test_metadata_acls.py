"""The ACLs in the controller quorum's metadata (issue 25, docs/security.md): the state machine's
``write_acls``, the view's ``acls``, dumps, and real controllers replicating them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import trio

from kafkaesque.broker._metadata import _ReplicatedState
from kafkaesque.broker._metadata_state import MetadataState
from kafkaesque.broker._metadata_view import (
    InvalidConfigError,
    MetadataView,
    acl_problem,
    acl_row,
    acl_tuple,
)
from kafkaesque.protocol import AclOperation, AclPattern, AclPermission, AclResource, AclRow

from .test_metadata import FAST, WAIT, open_cluster

WRITE_ORDERS = AclRow(
    "User:alice",
    AclPermission.ALLOW,
    AclOperation.WRITE,
    AclResource.TOPIC,
    AclPattern.LITERAL,
    "orders",
)
DENY_BOB = AclRow(
    "User:bob", AclPermission.DENY, AclOperation.ALL, AclResource.GROUP, AclPattern.PREFIXED, "g-"
)


def test_write_acls_adds_and_removes_idempotently_and_counts_versions() -> None:
    state = MetadataState()
    assert state.write_acls([acl_tuple(WRITE_ORDERS)], []) == (1, 0)
    assert state.version == 1
    assert state.write_acls([acl_tuple(WRITE_ORDERS)], []) == (0, 0)  # there already
    assert state.version == 1
    assert state.snapshot(None).acls == frozenset({WRITE_ORDERS})
    assert state.write_acls([acl_tuple(DENY_BOB)], [acl_tuple(WRITE_ORDERS)]) == (1, 1)
    assert state.snapshot(None).acls == frozenset({DENY_BOB})
    assert state.write_acls([], [acl_tuple(WRITE_ORDERS)]) == (0, 0)  # absent: no error
    assert state.version == 2


def test_the_views_acls_are_one_object_while_they_do_not_change() -> None:
    state = MetadataState()
    state.write_acls([acl_tuple(WRITE_ORDERS)], [])
    first = state.snapshot(None).acls
    state.write_acls([acl_tuple(WRITE_ORDERS)], [])
    assert state.snapshot(1).acls is first
    state.write_acls([], [acl_tuple(WRITE_ORDERS)])
    assert state.snapshot(1).acls == frozenset()


@pytest.mark.parametrize(
    "acl",
    [
        ("alice", "allow", "write", "topic", "literal", "orders"),  # no User: prefix
        ("User:", "allow", "write", "topic", "literal", "orders"),
        ("User:a b", "allow", "write", "topic", "literal", "orders"),
        ("User:alice", "maybe", "write", "topic", "literal", "orders"),
        ("User:alice", "allow", "scribble", "topic", "literal", "orders"),
        ("User:alice", "allow", "write", "table", "literal", "orders"),
        ("User:alice", "allow", "write", "topic", "regex", "orders"),
        ("User:alice", "allow", "write", "topic", "literal", ""),
        ("User:alice", "allow", "write", "topic", "literal", "a b"),
        ("User:alice", "allow", "admin", "cluster", "literal", "other"),
        ("User:alice", "allow", "admin", "cluster", "prefixed", "kafka-cluster"),
        ("User:alice", "allow", "write", "topic", "literal"),
        ("User:alice", "allow", "write", "topic", "literal", 7),
    ],
)
def test_an_invalid_acl_is_refused_and_changes_nothing(acl: tuple[object, ...]) -> None:
    state = MetadataState()
    assert acl_problem(acl) is not None
    refused = state.write_acls([acl_tuple(WRITE_ORDERS), acl], [])  # type: ignore[list-item]
    assert isinstance(refused, InvalidConfigError)
    assert state.acls == set() and state.version == 0


def test_valid_acls_and_their_tuples_round_trip() -> None:
    cluster = AclRow(
        "User:*",
        AclPermission.ALLOW,
        AclOperation.ADMIN,
        AclResource.CLUSTER,
        AclPattern.LITERAL,
        "kafka-cluster",
    )
    for acl in (WRITE_ORDERS, DENY_BOB, cluster):
        assert acl_problem(acl_tuple(acl)) is None
        assert acl_row(acl_tuple(acl)) == acl
        assert all(type(field) is str for field in acl_tuple(acl))


def test_dumps_carry_the_acls_and_older_dumps_have_none() -> None:
    state = MetadataState()
    state.write_acls([acl_tuple(WRITE_ORDERS), acl_tuple(DENY_BOB)], [])
    dump = state.to_primitive()
    assert all(type(field) is str for acl in dump["acls"] for field in acl)
    again = MetadataState.from_primitive(dump)
    assert again.snapshot(None) == state.snapshot(None)
    old = {k: v for k, v in dump.items() if k != "acls"}
    assert MetadataState.from_primitive(old).snapshot(None).acls == frozenset()


def test_write_acls_is_the_last_replicated_method_by_name() -> None:
    # pysyncobj numbers replicated methods in name order, and journals hold the numbers: a new
    # method must sort after every older one (see _ReplicatedState.update_topic).
    names = sorted(
        name
        for name, value in vars(_ReplicatedState).items()
        if callable(value) and not name.startswith("_") and not name.endswith("_v0")
    )
    assert names[-1] == "write_acls"
    assert names[-2] == "withdraw_broker"


async def test_acls_replicate_to_every_controller_and_survive_a_restart(tmp_path: Path) -> None:
    settings = dataclasses.replace(FAST, log_compaction_min_entries=3)
    seen: list[MetadataView] = []
    async with open_cluster(tmp_path, 3, settings=settings) as cluster:
        await cluster.ready()
        one, three = cluster.running[1], cluster.running[3]
        one.add_view_listener(seen.append)
        assert await one.add_acl(WRITE_ORDERS) is True
        assert WRITE_ORDERS in one.view.acls  # the caller reads its own write
        assert seen[-1] is one.view  # the listener saw it before add_acl returned
        assert await three.add_acl(WRITE_ORDERS) is False  # there already
        await three.add_acl(DENY_BOB)
        for n in range(4):  # enough entries to compact the log into the dump
            await three.add_acl(dataclasses.replace(WRITE_ORDERS, name=f"t{n}"))
        assert await one.remove_acl(dataclasses.replace(WRITE_ORDERS, name="t0")) == 1
        assert await one.remove_acl(dataclasses.replace(WRITE_ORDERS, name="t0")) == 0
        with pytest.raises(InvalidConfigError):
            await one.add_acl(dataclasses.replace(WRITE_ORDERS, principal="alice"))
        before = await cluster.converged()
        expected = {
            WRITE_ORDERS,
            DENY_BOB,
            *(dataclasses.replace(WRITE_ORDERS, name=f"t{n}") for n in range(1, 4)),
        }
        with trio.fail_after(WAIT):
            while any(md.view.acls != expected for md in cluster.running.values()):
                await trio.sleep(0.01)
        for broker_id in [1, 2, 3]:
            await cluster.stop(broker_id)
        for broker_id in [1, 2, 3]:
            await cluster.start(broker_id, settings=settings)
        await cluster.ready()
        with trio.fail_after(WAIT):
            while any(md.view.acls != expected for md in cluster.running.values()):
                await trio.sleep(0.01)
        assert (await cluster.converged()).version >= before.version
