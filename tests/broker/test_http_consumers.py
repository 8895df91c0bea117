"""REST consumer instances (issue 34) against a real 3-broker cluster: an instance made on one
broker is served by the others, outlives the HTTP connections that used it, splits a topic's
partitions with another instance of its group, and commits what the line protocol then sees.

One cluster for the module; each test uses a topic and group of its own. Every request goes on a
new HTTP connection, closed after it: the instances must not depend on one.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from typing import Any

import pytest

from kafkaesque.local_cluster import LocalCluster
from kafkaesque.protocol import OffsetRow, OkReply

from .test_http_rest import BINARY, JSON, create, line, rest

V2 = "application/vnd.kafka.v2+json"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(str(tmp_path_factory.mktemp("rest-consumers")), 3) as running:
        yield running


def produce(cluster: LocalCluster, topic: str, values: list[bytes], partition: int) -> None:
    records = [{"value": base64.b64encode(v).decode()} for v in values]
    status, body, _ = rest(
        cluster, "POST", f"/topics/{topic}/partitions/{partition}", {"records": records}
    )
    assert status == 200, body


def new_instance(cluster: LocalCluster, group: str, config: dict[str, Any], broker: int = 0) -> str:
    status, body, _ = rest(
        cluster, "POST", f"/consumers/{group}", config, content_type=V2, broker=broker
    )
    assert status == 200, body
    host, port = cluster.http_address(broker)
    assert (
        body["base_uri"]
        == f"http://{host}:{port}/consumers/{group}/instances/{body['instance_id']}"
    )
    return f"/consumers/{group}/instances/{body['instance_id']}"


def read_all(
    cluster: LocalCluster, base: str, want: int, broker: int, accept: str = BINARY
) -> list[dict[str, Any]]:
    """GET records through ``broker`` until ``want`` came (or 15 s passed)."""
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + 15
    while len(got) < want and time.monotonic() < deadline:
        status, body, _ = rest(
            cluster, "GET", f"{base}/records?timeout=500", accept=accept, broker=broker
        )
        assert status == 200, body
        got += body
    return got


def committed(cluster: LocalCluster, group: str, topic: str) -> dict[int, int | None]:
    rows = line(cluster, f"OFFSETS {group} {topic}".encode())
    return {r.partition: r.offset for r in rows if isinstance(r, OffsetRow)}


def test_an_instance_made_on_one_broker_is_served_by_every_broker(cluster: LocalCluster) -> None:
    create(cluster, "rc-a", 2)
    produce(cluster, "rc-a", [b"a0", b"a1"], 0)
    produce(cluster, "rc-a", [b"b0"], 1)
    config = {"name": "one", "auto.offset.reset": "earliest", "auto.commit.enable": "false"}
    base = new_instance(cluster, "g-a", config)
    status, body, _ = rest(
        cluster, "POST", f"{base}/subscription", {"topics": ["rc-a"]}, content_type=V2, broker=0
    )
    assert status == 204, body
    status, body, _ = rest(cluster, "GET", f"{base}/subscription", broker=2)
    assert (status, body) == (200, {"topics": ["rc-a"]})
    status, body, _ = rest(cluster, "GET", f"{base}/assignments", broker=1)
    assert status == 200 and sorted(p["partition"] for p in body["partitions"]) == [0, 1]

    first = read_all(cluster, base, 3, broker=1)
    assert sorted(base64.b64decode(r["value"]) for r in first) == [b"a0", b"a1", b"b0"]
    assert {(r["topic"], r["partition"]) for r in first} == {("rc-a", 0), ("rc-a", 1)}
    # The position is the instance's, wherever it is asked: broker 2 reads on from there.
    produce(cluster, "rc-a", [b"a2"], 0)
    second = read_all(cluster, base, 1, broker=2)
    assert [base64.b64decode(r["value"]) for r in second] == [b"a2"]
    assert committed(cluster, "g-a", "rc-a") == {0: None, 1: None}  # auto commit is off

    # A commit without a body commits the positions; the line protocol sees them.
    status, body, _ = rest(cluster, "POST", f"{base}/offsets", broker=1)
    assert status == 204, body
    ends = {r["partition"]: r["offset"] + 1 for r in first + second}
    assert committed(cluster, "g-a", "rc-a") == ends
    status, body, _ = rest(
        cluster,
        "GET",
        f"{base}/offsets",
        {"partitions": [{"topic": "rc-a", "partition": 0}]},
        content_type=V2,
        broker=2,
    )
    assert status == 200 and body["offsets"] == [
        {"topic": "rc-a", "partition": 0, "offset": ends[0], "metadata": ""}
    ]
    # Seek back to the beginning of partition 0 and read it again.
    status, body, _ = rest(
        cluster,
        "POST",
        f"{base}/positions/beginning",
        {"partitions": [{"topic": "rc-a", "partition": 0}]},
        content_type=V2,
        broker=0,
    )
    assert status == 204, body
    again = read_all(cluster, base, 3, broker=0)
    assert [base64.b64decode(r["value"]) for r in again] == [b"a0", b"a1", b"a2"]

    status, body, _ = rest(cluster, "DELETE", base, broker=2)
    assert status == 204, body
    status, body, _ = rest(cluster, "GET", f"{base}/records", broker=0)
    assert status == 404 and body["error_code"] == 40403, body
    # The group's member left with it: the group holds only its committed offsets.
    rows = line(cluster, b"GROUPS g-a rc-a")
    assert "Empty" in repr(rows), rows


def test_two_instances_of_a_group_split_the_partitions(cluster: LocalCluster) -> None:
    create(cluster, "rc-b", 4)
    for p in range(4):
        produce(cluster, "rc-b", [f"p{p}".encode()], p)
    bases = [
        new_instance(cluster, "g-b", {"auto.offset.reset": "earliest"}, broker=i) for i in range(2)
    ]
    for i, base in enumerate(bases):
        status, body, _ = rest(
            cluster, "POST", f"{base}/subscription", {"topics": ["rc-b"]}, content_type=V2, broker=i
        )
        assert status == 204, body
    owned = []
    for i, base in enumerate(bases):
        status, body, _ = rest(cluster, "GET", f"{base}/assignments", broker=2 - i)
        assert status == 200, body
        owned.append({p["partition"] for p in body["partitions"]})
    assert owned[0] | owned[1] == {0, 1, 2, 3} and not owned[0] & owned[1]
    assert len(owned[0]) == len(owned[1]) == 2
    for i, base in enumerate(bases):
        got = read_all(cluster, base, 2, broker=i + 1)
        assert {r["partition"] for r in got} == owned[i]
    # auto commit (the default) committed what each read.
    assert committed(cluster, "g-b", "rc-b") == {p: 2 for p in range(4)}
    for base in bases:
        assert rest(cluster, "DELETE", base)[0] == 204


def test_json_instances_and_what_is_refused(cluster: LocalCluster) -> None:
    create(cluster, "rc-c", 1)
    status, body, _ = rest(
        cluster,
        "POST",
        "/topics/rc-c",
        {"records": [{"key": "k", "value": {"n": 1}}]},
        content_type=JSON,
    )
    assert status == 200, body
    base = new_instance(cluster, "g-c", {"format": "json", "auto.offset.reset": "earliest"})
    assert rest(cluster, "POST", f"{base}/subscription", {"topics": ["rc-c"]})[0] == 204
    got = read_all(cluster, base, 1, broker=1, accept=JSON)
    assert [(r["key"], r["value"]) for r in got] == [("k", {"n": 1})]

    unknown = "/consumers/g-c/instances/nobody"
    for method, path in [
        ("GET", f"{unknown}/records"),
        ("POST", f"{unknown}/subscription"),
        ("GET", f"{unknown}/assignments"),
        ("DELETE", unknown),
    ]:
        status, body, _ = rest(cluster, method, path, broker=2)
        assert status == 404 and body["error_code"] == 40403, (method, path, body)
    name = base.rsplit("/", 1)[1]
    status, body, _ = rest(cluster, "POST", "/consumers/g-c", {"name": name}, content_type=V2)
    assert status == 409 and body["error_code"] == 40902, body
    status, body, _ = rest(cluster, "POST", "/consumers/g-c", {"format": "avro"}, content_type=V2)
    assert status == 422, body
    status, body, _ = rest(cluster, "POST", f"{base}/subscription", raw=b"{nope")
    assert status == 422, body
    status, body, _ = rest(cluster, "POST", f"{base}/subscription", {"topics": ["bad name"]})
    assert status == 422, body
    status, body, _ = rest(cluster, "POST", f"{base}/subscription", {"topics": []})
    assert status == 422, body
    # A refused subscription leaves the instance subscribed to nothing, not broken.
    status, body, _ = rest(cluster, "GET", f"{base}/subscription", broker=1)
    assert (status, body) == (200, {"topics": []})
    status, body, _ = rest(cluster, "GET", f"{base}/records", broker=1)
    assert (status, body) == (200, [])
    status, body, _ = rest(cluster, "GET", f"{base}/records?timeout=x")
    assert status == 422, body
    assert rest(cluster, "DELETE", base)[0] == 204


def test_a_pattern_subscription_follows_the_topics_it_matches(cluster: LocalCluster) -> None:
    for topic in ("pat-a", "pat-b", "xpat-a"):
        create(cluster, topic, 1)
        produce(cluster, topic, [topic.encode()], 0)
    base = new_instance(cluster, "g-pat", {"auto.offset.reset": "earliest"})
    for bad in (
        {"topic_pattern": "pat-("},
        {"topic_pattern": ""},
        {"topics": ["pat-a"], "topic_pattern": "pat-.*"},
    ):
        status, body, _ = rest(cluster, "POST", f"{base}/subscription", bad, content_type=V2)
        assert status == 422, (bad, body)
    status, body, _ = rest(
        cluster, "POST", f"{base}/subscription", {"topic_pattern": "pat-.*"}, content_type=V2
    )
    assert status == 204, body
    status, body, _ = rest(cluster, "GET", f"{base}/subscription", broker=1)
    # Matched whole (xpat-a is not), internal topics never.
    assert (status, body) == (200, {"topics": ["pat-a", "pat-b"], "topic_pattern": "pat-.*"})
    got = read_all(cluster, base, 2, broker=1)
    assert sorted(base64.b64decode(r["value"]) for r in got) == [b"pat-a", b"pat-b"]

    # A topic created later that matches is read too; a deleted one is left.
    create(cluster, "pat-c", 1)
    produce(cluster, "pat-c", [b"pat-c"], 0)
    (reply,) = line(cluster, b"DELETE pat-b")
    assert isinstance(reply, OkReply), reply
    got = []
    deadline = time.monotonic() + 15
    while not got and time.monotonic() < deadline:
        got = read_all(cluster, base, 1, broker=2)
    assert [base64.b64decode(r["value"]) for r in got] == [b"pat-c"]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        status, body, _ = rest(cluster, "GET", f"{base}/subscription")
        if body["topics"] == ["pat-a", "pat-c"]:
            break
        rest(cluster, "GET", f"{base}/records?timeout=100")
        time.sleep(0.2)
    assert body == {"topics": ["pat-a", "pat-c"], "topic_pattern": "pat-.*"}, body
    assert rest(cluster, "DELETE", base)[0] == 204


def test_an_idle_instance_expires_after_its_timeout(cluster: LocalCluster) -> None:
    create(cluster, "rc-d", 1)
    config = {"auto.offset.reset": "earliest", "consumer.instance.timeout.ms": 1500}
    idle, busy = new_instance(cluster, "g-d", config), new_instance(cluster, "g-d2", config)
    for base in (idle, busy):
        assert rest(cluster, "POST", f"{base}/subscription", {"topics": ["rc-d"]})[0] == 204
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:  # reads keep one alive, on any broker
        status, body, _ = rest(cluster, "GET", f"{busy}/records", broker=2)
        assert status == 200, body
        time.sleep(0.3)
    status, body, _ = rest(cluster, "GET", f"{busy}/assignments", broker=1)
    assert status == 200 and body["partitions"] == [{"topic": "rc-d", "partition": 0}], body
    status, body, _ = rest(cluster, "GET", f"{idle}/records", broker=1)
    assert status == 404 and body["error_code"] == 40403, body
    status, body, _ = rest(cluster, "GET", f"{idle}/subscription", broker=0)
    assert status == 404 and body["error_code"] == 40403, body  # and forgotten
    assert rest(cluster, "DELETE", busy)[0] == 204


def test_the_openapi_document_names_every_consumer_endpoint(cluster: LocalCluster) -> None:
    status, document, _ = rest(cluster, "GET", "/openapi.json", broker=1)
    assert status == 200
    base = "/consumers/{group}/instances/{instance}"
    named = {p: set(ops) for p, ops in document["paths"].items() if p.startswith("/consumers")}
    assert named == {
        "/consumers/{group}": {"post"},
        base: {"delete"},
        f"{base}/subscription": {"get", "post", "delete"},
        f"{base}/records": {"get"},
        f"{base}/offsets": {"get", "post"},
        f"{base}/positions": {"post"},
        f"{base}/positions/beginning": {"post"},
        f"{base}/positions/end": {"post"},
        f"{base}/assignments": {"get"},
    }


def test_a_refusal_of_one_topics_read_is_answered_as_itself(cluster: LocalCluster) -> None:
    """Two topics are read at once; one's refusal is its own answer, not a 500."""
    create(cluster, "rc-e1", 1)
    create(cluster, "rc-e2", 1)
    base = new_instance(cluster, "g-e", {"auto.offset.reset": "earliest"})
    status, body, _ = rest(cluster, "POST", f"{base}/subscription", {"topics": ["rc-e1", "rc-e2"]})
    assert status == 204, body
    assert rest(cluster, "GET", f"{base}/records")[0] == 200
    line(cluster, b"DELETE rc-e2")
    status, body, _ = rest(cluster, "GET", f"{base}/records", broker=1)
    assert status == 404 and body["code"] in ("UNKNOWN_TOPIC", "INSTANCE_NOT_FOUND"), body
