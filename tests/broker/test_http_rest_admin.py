"""The REST API's admin calls against a real 3-broker cluster (issue 34): each call's effect read
back through the line protocol (DESCRIBE, GROUPS, OFFSETS, ACL LIST), never only through REST;
a dry-run reset changes nothing; bad input is refused with nothing changed.

One cluster for the module; each test uses topics and groups of its own.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator

import pytest

from kafkaesque.local_cluster import LocalCluster
from kafkaesque.protocol import (
    NEED_DATA,
    AclRow,
    ErrorReply,
    GroupRow,
    GroupStateRow,
    OffsetRow,
    OkReply,
    PartitionRow,
    ReplyDecoder,
    TopicRow,
)

from .test_http_rest import b64, line, rest


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(str(tmp_path_factory.mktemp("rest-admin")), 3) as running:
        yield running


def topic_row(cluster: LocalCluster, topic: str) -> TopicRow | ErrorReply:
    replies = line(cluster, f"DESCRIBE {topic}".encode())
    first = replies[0]
    assert isinstance(first, TopicRow | ErrorReply), replies
    return first


def committed(cluster: LocalCluster, group: str, topic: str) -> dict[int, int | None]:
    rows = line(cluster, f"OFFSETS {group} {topic}".encode())
    return {r.partition: r.offset for r in rows if isinstance(r, OffsetRow)}


def test_topics_are_created_altered_and_deleted_as_describe_shows(cluster: LocalCluster) -> None:
    create = {
        "topic_name": "adm-t",
        "partitions_count": 2,
        "replication_factor": 3,
        "configs": {"retention.ms": "60000", "cleanup.policy": "compact", "fsync": "always"},
    }
    status, body, _ = rest(cluster, "POST", "/topics", create, broker=1)
    assert status == 201, body
    row = topic_row(cluster, "adm-t")
    assert isinstance(row, TopicRow), row
    assert (row.partitions, row.replication_factor, row.retention_ms, row.compact) == (
        2,
        3,
        60000,
        True,
    )
    assert row.fsync == "always"

    status, body, _ = rest(cluster, "POST", "/topics", create)
    assert status == 201, body  # the same settings again: CREATE is idempotent
    other = {**create, "partitions_count": 4}
    status, body, _ = rest(cluster, "POST", "/topics", other)
    assert status == 409 and body["code"] == "TOPIC_EXISTS", body
    for bad, code in (
        ({**create, "topic_name": "adm-u", "configs": {"retention.ms": "soon"}}, 422),
        ({**create, "topic_name": "adm-u", "configs": {"max.message.bytes": "1"}}, 422),
        ({**create, "topic_name": "adm-u", "configs": {"cleanup.policy": "shred"}}, 422),
        ({**create, "topic_name": "adm u"}, 422),
        ({**create, "topic_name": "adm-u", "partitions_count": 0}, 422),
        ({"topic_name": "adm-u", "partitions_count": 1}, 422),
        ({**create, "topic_name": "adm-u", "colour": "red"}, 422),
    ):
        status, body, _ = rest(cluster, "POST", "/topics", bad)
        assert status == code, (bad, body)
    status, body, _ = rest(cluster, "POST", "/topics", raw=b"{nope")
    assert status == 422, body
    assert isinstance(topic_row(cluster, "adm-u"), ErrorReply)  # none of them created it
    row = topic_row(cluster, "adm-t")
    assert isinstance(row, TopicRow) and row.partitions == 2  # nor changed the first

    alter = {"partitions_count": 3, "configs": [{"name": "retention.ms", "value": "120000"}]}
    status, body, _ = rest(cluster, "PATCH", "/topics/adm-t", alter, broker=2)
    assert status == 200, body
    row = topic_row(cluster, "adm-t")
    assert isinstance(row, TopicRow), row
    assert (row.partitions, row.retention_ms, row.compact) == (3, 120000, True)
    configs = {"configs": {"cleanup.policy": "delete"}}
    status, body, _ = rest(cluster, "POST", "/topics/adm-t/configs", configs)
    assert status == 200, body
    row = topic_row(cluster, "adm-t")
    assert isinstance(row, TopicRow) and not row.compact, row
    for path, bad_alter, code in (
        ("/topics/adm-t", {"partitions_count": 2}, 422),  # partitions only grow
        ("/topics/adm-t", {}, 422),
        ("/topics/adm-t", {"configs": {"fsync": "always"}}, 422),  # CREATE only
        ("/topics/adm-nope", {"partitions_count": 5}, 404),
    ):
        status, body, _ = rest(cluster, "PATCH", path, bad_alter)
        assert status == code, (bad_alter, body)
    row = topic_row(cluster, "adm-t")
    assert isinstance(row, TopicRow) and row.partitions == 3, row

    status, body, _ = rest(cluster, "DELETE", "/topics/adm-t")
    assert status == 204, body
    assert isinstance(topic_row(cluster, "adm-t"), ErrorReply)
    status, body, _ = rest(cluster, "DELETE", "/topics/adm-t")
    assert status == 404 and body["code"] == "UNKNOWN_TOPIC", body
    status, _, headers = rest(cluster, "PUT", "/topics/adm-t")
    assert status == 405 and "DELETE" in headers["Allow"]


def test_groups_are_described_reset_with_a_preview_and_deleted(cluster: LocalCluster) -> None:
    (reply,) = line(cluster, b"CREATE adm-g 2 3")
    assert isinstance(reply, OkReply), reply
    records = [{"value": b64(b"v"), "partition": p} for p in (0, 0, 0, 1, 1)]
    status, body, _ = rest(cluster, "POST", "/topics/adm-g", {"records": records})
    assert status == 200, body
    for partition, offset in ((0, 1), (1, 2)):
        (reply,) = line(cluster, f"COMMIT dash adm-g {partition} {offset}".encode())
        assert isinstance(reply, OkReply), reply
    bounds = [
        (r.start_offset, r.end_offset)
        for r in line(cluster, b"DESCRIBE adm-g")
        if isinstance(r, PartitionRow)
    ]
    (s0, e0), (s1, e1) = bounds  # (a leader's first entry may take an offset: not 0..3)
    assert s0 is not None and s1 is not None and e0 is not None and e1 is not None
    assert e0 - s0 >= 3 and e1 - s1 >= 2

    status, body, _ = rest(cluster, "GET", "/consumer-groups", broker=2)
    assert status == 200, body
    listed = {g["group_id"]: g for g in body}
    states = [r for r in line(cluster, b"GROUPS") if isinstance(r, GroupStateRow)]
    assert {s.group for s in states} == set(listed)
    assert listed["dash"]["topics"] == [{"topic": "adm-g", "state": "Empty", "members": 0}]

    status, body, _ = rest(cluster, "GET", "/consumer-groups/dash")
    assert status == 200, body
    (described,) = body["topics"]
    rows = [r for r in line(cluster, b"GROUPS dash adm-g") if isinstance(r, GroupRow)]
    shown = [
        (p["partition"], p["committed_offset"], p["end_offset"]) for p in described["partitions"]
    ]
    assert shown == [(r.partition, r.committed, r.end) for r in rows] == [(0, 1, e0), (1, 2, e1)]
    status, body, _ = rest(cluster, "GET", "/consumer-groups/dash/lags?topic=adm-g")
    assert status == 200, body
    assert [(lag["partition"], lag["lag"]) for lag in body["lags"]] == [(0, e0 - 1), (1, e1 - 2)]

    reset = "/consumer-groups/dash/reset"
    preview = {"topic": "adm-g", "to": "earliest", "dry_run": True}
    status, body, _ = rest(cluster, "POST", reset, preview)
    assert status == 200 and body["dry_run"] is True, body
    assert body["offsets"] == [{"partition": 0, "offset": s0}, {"partition": 1, "offset": s1}]
    assert committed(cluster, "dash", "adm-g") == {0: 1, 1: 2}  # the preview changed nothing
    for bad, code in (
        ({"topic": "adm-g", "to": "sideways"}, 422),
        ({"topic": "adm-g", "to": "offset"}, 422),
        ({"topic": "adm-g", "to": "datetime", "datetime": "yesterday"}, 422),
        ({"topic": "adm-g", "to": "earliest", "dry_run": "no"}, 422),
        ({"topic": "adm-nope", "to": "earliest"}, 404),
    ):
        status, body, _ = rest(cluster, "POST", reset, bad)
        assert status == code, (bad, body)
    assert committed(cluster, "dash", "adm-g") == {0: 1, 1: 2}

    status, body, _ = rest(cluster, "POST", reset, {"topic": "adm-g", "to": "latest"})
    assert status == 200 and body["dry_run"] is False, body
    assert committed(cluster, "dash", "adm-g") == {0: e0, 1: e1}
    shift = {"topic": "adm-g", "to": "shift", "shift": -2}
    status, body, _ = rest(cluster, "POST", reset, {**shift, "dry_run": True})
    assert status == 200, body
    assert body["offsets"] == [
        {"partition": 0, "offset": e0 - 2},
        {"partition": 1, "offset": e1 - 2},
    ]
    assert committed(cluster, "dash", "adm-g") == {0: e0, 1: e1}
    status, body, _ = rest(cluster, "POST", reset, {"topic": "adm-g", "to": "shift", "shift": 1})
    assert status == 200, body
    assert committed(cluster, "dash", "adm-g") == {0: e0, 1: e1}  # none moves past its end
    status, body, _ = rest(cluster, "POST", reset, shift)
    assert status == 200, body
    assert committed(cluster, "dash", "adm-g") == {0: e0 - 2, 1: e1 - 2}
    later = {"topic": "adm-g", "to": "datetime", "datetime": "2999-01-01T00:00:00Z"}
    status, body, _ = rest(cluster, "POST", reset, later)
    assert status == 200, body
    assert committed(cluster, "dash", "adm-g") == {0: e0, 1: e1}  # no record that late: the end

    with socket.create_connection(("127.0.0.1", cluster.ports[0].client), timeout=10) as member:
        member.sendall(b"SUBS adm-g dash\r\n")  # a member: the group is no longer Empty
        decoder = ReplyDecoder()
        joined: object = NEED_DATA
        while joined is NEED_DATA:
            data = member.recv(4096)
            assert data, "the broker closed the member's connection"
            decoder.feed(data)
            joined = decoder.next_event()
        assert isinstance(joined, OkReply), joined
        for method, path, body in (
            ("POST", reset, {"topic": "adm-g", "to": "earliest"}),
            ("DELETE", "/consumer-groups/dash", None),
        ):
            status, answer, _ = rest(cluster, method, path, body)
            assert status == 409 and answer["code"] == "GROUP_NOT_EMPTY", answer
        status, answer, _ = rest(cluster, "GET", "/consumer-groups/dash")
        assert answer["state"] == "Stable" and answer["topics"][0]["members"], answer
        assert committed(cluster, "dash", "adm-g") == {0: e0, 1: e1}
        member.sendall(b"LEAVE " + joined.text.encode() + b"\r\n")
        left = decoder.next_event()
        while left is NEED_DATA:
            decoder.feed(member.recv(4096))
            left = decoder.next_event()
        assert isinstance(left, OkReply), left

    status, body, _ = rest(cluster, "DELETE", "/consumer-groups/dash")
    assert status == 204, body
    (gone,) = line(cluster, b"GROUPS dash")
    assert isinstance(gone, ErrorReply) and gone.code.name == "UNKNOWN_GROUP", gone
    for method in ("GET", "DELETE"):
        status, body, _ = rest(cluster, method, "/consumer-groups/dash")
        assert status == 404 and body["code"] == "UNKNOWN_GROUP", body


def acl_rows(
    cluster: LocalCluster, until: Callable[[list[AclRow]], bool] | None = None
) -> list[AclRow]:
    """ACL LIST's rows on broker 0; with ``until``, the first answer it accepts (ACLs reach
    each broker with the metadata; 10 s at most)."""
    deadline = time.monotonic() + 10
    while True:
        rows = [r for r in line(cluster, b"ACL LIST") if isinstance(r, AclRow)]
        if until is None or until(rows) or time.monotonic() > deadline:
            return rows
        time.sleep(0.05)


def test_acls_are_added_listed_and_removed_as_acl_list_shows(cluster: LocalCluster) -> None:
    # The first ACL turns the ACLs on, for the anonymous callers of this cluster too: first one
    # that lets them manage the ACLs (removed at the end, which turns them off again).
    admin = {
        "principal": "User:ANONYMOUS",
        "operation": "all",
        "resource_type": "cluster",
        "resource_name": "kafka-cluster",
    }
    assert acl_rows(cluster) == []
    status, body, _ = rest(cluster, "POST", "/acls", admin)
    assert status == 201, body
    before = acl_rows(cluster, lambda rows: len(rows) == 1)
    assert [(r.principal, r.operation, r.resource) for r in before] == [
        ("User:ANONYMOUS", "all", "cluster")
    ]
    acl = {
        "principal": "User:alice",
        "operation": "read",
        "resource_type": "topic",
        "resource_name": "adm-acl",
    }
    status, body, _ = rest(cluster, "POST", "/acls", acl)
    assert status == 201, body
    full = {**acl, "permission": "allow", "pattern_type": "literal"}
    assert body == full
    added = [r for r in acl_rows(cluster, lambda rows: len(rows) > len(before)) if r not in before]
    assert [
        (r.principal, r.permission, r.operation, r.resource, r.pattern, r.name) for r in added
    ] == [("User:alice", "allow", "read", "topic", "literal", "adm-acl")]
    status, body, _ = rest(cluster, "GET", "/acls?principal=User:alice&operation=read")
    assert status == 200 and body == [full], body
    status, body, _ = rest(cluster, "GET", "/acls?operation=write")
    assert status == 200 and full not in body, body
    for bad in (
        {**acl, "operation": "fly"},
        {**acl, "principal": "alice"},
        {**acl, "resource_type": "cluster"},  # named kafka-cluster only
        {**acl, "principal": "User:al ice"},
        {key: value for key, value in acl.items() if key != "resource_name"},
    ):
        status, body, _ = rest(cluster, "POST", "/acls", bad)
        assert status == 422, (bad, body)
    status, body, _ = rest(cluster, "GET", "/acls?colour=red")
    assert status == 422, body
    assert [r for r in acl_rows(cluster) if r not in before] == added  # nothing else added

    # DELETE takes a filter (a field not given matches any), as Kafka's DeleteAcls does.
    write = {**full, "operation": "write", "resource_name": "adm-acl-2"}
    status, body, _ = rest(cluster, "POST", "/acls", write)
    assert status == 201, body
    acl_rows(cluster, lambda rows: len(rows) == len(before) + 2)
    status, body, _ = rest(cluster, "DELETE", "/acls")  # no filter: refused, not "all"
    assert status == 422, body
    query = "&".join(f"{k}={v}" for k, v in acl.items())
    status, body, _ = rest(cluster, "DELETE", f"/acls?{query}")
    assert status == 200 and body == {"removed": 1, "acls": [full]}, body
    status, body, _ = rest(cluster, "DELETE", "/acls", acl)  # the body says it too
    assert status == 200 and body == {"removed": 0, "acls": []}, body
    status, body, _ = rest(cluster, "DELETE", "/acls", {"principal": "User:alice"})
    assert status == 200 and body == {"removed": 1, "acls": [write]}, body
    assert acl_rows(cluster, lambda rows: rows == before) == before
    status, body, _ = rest(cluster, "DELETE", "/acls", admin)
    assert status == 200 and body["removed"] == 1, body
    assert acl_rows(cluster, lambda rows: rows == []) == []


def test_the_openapi_document_names_the_admin_operations(cluster: LocalCluster) -> None:
    status, document, _ = rest(cluster, "GET", "/openapi.json")
    assert status == 200, document
    operations = {
        (method.upper(), path)
        for path, item in document["paths"].items()
        for method in item
        if method in ("get", "post", "patch", "delete")
    }
    assert operations >= {
        ("GET", "/topics"),  # the first slice's, beside ours
        ("POST", "/topics"),
        ("PATCH", "/topics/{topic}"),
        ("DELETE", "/topics/{topic}"),
        ("POST", "/topics/{topic}/configs"),
        ("GET", "/consumer-groups"),
        ("GET", "/consumer-groups/{group}"),
        ("DELETE", "/consumer-groups/{group}"),
        ("GET", "/consumer-groups/{group}/lags"),
        ("POST", "/consumer-groups/{group}/reset"),
        ("GET", "/acls"),
        ("POST", "/acls"),
        ("DELETE", "/acls"),
    }
