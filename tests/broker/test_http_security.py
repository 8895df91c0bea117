"""HTTP Basic on the REST port of a broker with a users file, over HTTPS (--http-tls): checked
as PLAIN is, then the same ACLs as the line protocol (issue 34)."""

from __future__ import annotations

import base64
import http.client
import json
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from kafkaesque.client import Client
from kafkaesque.local_cluster import DevSecurity, SecureCluster, write_users
from kafkaesque.protocol import AclOperation, AclPattern, AclPermission, AclResource, AclRow

BOB, BOB_PASSWORD = "bob", "bob-secret-1"
BINARY = "application/vnd.kafka.binary.v2+json"


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SecureCluster, DevSecurity]]:
    """One broker, users file (its super user and bob), REST over HTTPS only."""
    root = tmp_path_factory.mktemp("http-secure")
    security = DevSecurity.make(str(root))
    users = os.path.join(str(root), "users-http")
    write_users(users, {security.username: security.password, BOB: BOB_PASSWORD})
    extra = ["--users-file", users, "--auth-failure-limit", "0", "--http-tls"]
    with SecureCluster(str(root / "c"), 1, security=security, extra_args=extra) as cluster:
        cluster.wait_ready()
        yield cluster, security


def call(
    secure: tuple[SecureCluster, DevSecurity],
    method: str,
    path: str,
    *,
    user: str | None = None,
    password: str = "",
    body: Any = None,
    content_type: str = BINARY,
) -> tuple[int, Any, dict[str, str]]:
    cluster, security = secure
    host, port = cluster.http_address(0)
    conn = http.client.HTTPSConnection(host, port, timeout=15, context=security.ssl_context())
    try:
        headers = {}
        if user is not None:
            token = base64.b64encode(f"{user}:{password}".encode()).decode()
            headers["Authorization"] = f"Basic {token}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        conn.request(method, path, body=data, headers=headers)
        response = conn.getresponse()
        payload = response.read()
        return response.status, json.loads(payload) if payload else None, dict(response.headers)
    finally:
        conn.close()


def test_basic_authentication_is_required_and_checked(
    secure: tuple[SecureCluster, DevSecurity],
) -> None:
    _, security = secure
    status, body, headers = call(secure, "GET", "/topics")
    assert status == 401 and headers["WWW-Authenticate"].startswith("Basic ")
    assert body["code"] == "AUTH_FAILED"
    status, body, _ = call(secure, "GET", "/topics", user=BOB, password="wrong")
    assert status == 401, body
    status, body, _ = call(
        secure, "GET", "/topics", user=security.username, password=security.password
    )
    assert status == 200, body


def test_the_line_protocols_acls_decide_what_a_rest_caller_may_do(
    secure: tuple[SecureCluster, DevSecurity],
) -> None:
    cluster, security = secure
    with Client(cluster.bootstrap, config=security.client_config()) as admin:
        admin.create_topic("secure-t", 1, 1)
        admin.add_acl(
            AclRow(
                f"User:{BOB}",
                AclPermission.ALLOW,
                AclOperation.DESCRIBE,
                AclResource.TOPIC,
                AclPattern.LITERAL,
                "secure-t",
            )
        )
    record = {"records": [{"value": base64.b64encode(b"v").decode()}]}
    deadline = time.monotonic() + 10
    while True:  # the ACL reaches the broker with the metadata
        status, body, _ = call(secure, "GET", "/topics/secure-t", user=BOB, password=BOB_PASSWORD)
        if status == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert status == 200, body
    status, body, _ = call(
        secure, "POST", "/topics/secure-t", user=BOB, password=BOB_PASSWORD, body=record
    )
    assert status == 403 and body["code"] == "NOT_AUTHORIZED", body
    status, body, _ = call(  # a topic that does not exist: the same answer, no existence leak
        secure, "POST", "/topics/secure-nope", user=BOB, password=BOB_PASSWORD, body=record
    )
    assert status == 403 and body["code"] == "NOT_AUTHORIZED", body
    status, body, _ = call(
        secure,
        "POST",
        "/topics/secure-t",
        user=security.username,
        password=security.password,
        body=record,
    )
    assert status == 200 and body["offsets"][0]["offset"] is not None, body


def test_a_user_without_the_acls_can_neither_create_a_topic_nor_grant_himself_over_rest(
    secure: tuple[SecureCluster, DevSecurity],
) -> None:
    cluster, security = secure
    create = {"topic_name": "secure-made", "partitions_count": 1, "replication_factor": 1}
    status, body, _ = call(secure, "POST", "/topics", user=BOB, password=BOB_PASSWORD, body=create)
    assert status == 403 and body["code"] == "NOT_AUTHORIZED", body
    acl = {
        "principal": f"User:{BOB}",
        "operation": "all",
        "resource_type": "cluster",
        "resource_name": "kafka-cluster",
    }
    status, body, _ = call(secure, "POST", "/acls", user=BOB, password=BOB_PASSWORD, body=acl)
    assert status == 403, body  # nor give himself the right
    with Client(cluster.bootstrap, config=security.client_config()) as admin:
        assert "secure-made" not in [t.topic for t in admin.list_topics()]
        assert all(
            a.principal != f"User:{BOB}" or a.resource != "cluster" for a in admin.list_acls()
        )
    status, body, _ = call(
        secure,
        "POST",
        "/topics",
        user=security.username,
        password=security.password,
        body=create,
    )
    assert status == 201, body
    with Client(cluster.bootstrap, config=security.client_config()) as admin:
        assert "secure-made" in [t.topic for t in admin.list_topics()]


def test_a_rest_consumer_needs_the_group_and_topic_acls_and_nothing_on_internal_topics(
    secure: tuple[SecureCluster, DevSecurity],
) -> None:
    """Bob may read topic secure-c in group g-bob, and holds no right on ``__rest_consumers``
    (where the broker keeps instances' state, as its own data): he creates, subscribes, reads
    and commits. Another group's instance is refused him, as are the instances of his group to
    a user without the group's right."""
    cluster, security = secure
    bob = f"User:{BOB}"
    with Client(cluster.bootstrap, config=security.client_config()) as admin:
        admin.create_topic("secure-c", 1, 1)
        for operation, resource, name in [
            (AclOperation.READ, AclResource.TOPIC, "secure-c"),
            (AclOperation.DESCRIBE, AclResource.TOPIC, "secure-c"),
            (AclOperation.READ, AclResource.GROUP, "g-bob"),
            (AclOperation.COMMIT, AclResource.GROUP, "g-bob"),
        ]:
            admin.add_acl(
                AclRow(bob, AclPermission.ALLOW, operation, resource, AclPattern.LITERAL, name)
            )
    values = [base64.b64encode(f"c{i}".encode()).decode() for i in range(3)]
    records = {"records": [{"value": v} for v in values]}
    status, body, _ = call(
        secure,
        "POST",
        "/topics/secure-c",
        user=security.username,
        password=security.password,
        body=records,
    )
    assert status == 200, body
    v2 = "application/vnd.kafka.v2+json"
    config = {"name": "b1", "auto.offset.reset": "earliest", "auto.commit.enable": "false"}
    deadline = time.monotonic() + 10
    while True:  # the ACLs reach the broker with the metadata
        status, body, _ = call(
            secure,
            "POST",
            "/consumers/g-bob",
            user=BOB,
            password=BOB_PASSWORD,
            body=config,
            content_type=v2,
        )
        if status == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert status == 200, body
    base = f"/consumers/g-bob/instances/{body['instance_id']}"
    status, body, _ = call(
        secure,
        "POST",
        f"{base}/subscription",
        user=BOB,
        password=BOB_PASSWORD,
        body={"topics": ["secure-c"]},
        content_type=v2,
    )
    assert status == 204, body
    got: list[bytes] = []
    deadline = time.monotonic() + 15
    while len(got) < 3 and time.monotonic() < deadline:
        status, body, _ = call(
            secure, "GET", f"{base}/records?timeout=500", user=BOB, password=BOB_PASSWORD
        )
        assert status == 200, body
        got += [base64.b64decode(r["value"]) for r in body]
    assert got == [b"c0", b"c1", b"c2"]
    status, body, _ = call(secure, "POST", f"{base}/offsets", user=BOB, password=BOB_PASSWORD)
    assert status == 204, body

    # Not his group: refused at creation, nothing written.
    status, body, _ = call(
        secure,
        "POST",
        "/consumers/g-other",
        user=BOB,
        password=BOB_PASSWORD,
        body={"name": "b2"},
        content_type=v2,
    )
    assert status == 403 and body["code"] == "NOT_AUTHORIZED", body
    # Nor may he reach instances of a group he may not read (whether they exist or not).
    instance = base.rsplit("/", 1)[1]
    for method in ("GET", "DELETE"):
        path = f"/consumers/g-other/instances/{instance}" + ("/records" if method == "GET" else "")
        status, body, _ = call(secure, method, path, user=BOB, password=BOB_PASSWORD)
        assert status == 403 and body["code"] == "NOT_AUTHORIZED", (method, body)
