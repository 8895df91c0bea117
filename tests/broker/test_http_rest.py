"""The REST API against a real 3-broker cluster (issue 34): what REST writes the line protocol
reads and the other way round, bad input refused with nothing written, and TopHat's flow.

One cluster for the module; each test uses topics of its own.
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, settings

from kafkaesque.broker.http import openapi_document
from kafkaesque.local_cluster import LocalCluster
from kafkaesque.protocol import (
    NEED_DATA,
    BrokerRow,
    DataReply,
    EndReply,
    ErrorReply,
    MessageRow,
    OkReply,
    PartitionRow,
    Reply,
    ReplyDecoder,
)

BINARY = "application/vnd.kafka.binary.v2+json"
JSON = "application/vnd.kafka.json.v2+json"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(str(tmp_path_factory.mktemp("rest")), 3) as running:
        yield running


def line(cluster: LocalCluster, command: bytes, broker: int = 0) -> list[Reply]:
    """One line-protocol command's replies (a list reply's rows and its ``+END``)."""
    with socket.create_connection(("127.0.0.1", cluster.ports[broker].client), timeout=10) as s:
        s.sendall(command + b"\r\n")
        decoder = ReplyDecoder()
        replies: list[Reply] = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            data = s.recv(65536)
            assert data, f"the broker closed the connection after {replies!r}"
            decoder.feed(data)
            while (event := decoder.next_event()) is not NEED_DATA:
                replies.append(event)
                if isinstance(event, OkReply | ErrorReply | DataReply | EndReply):
                    return replies
        raise AssertionError(f"no whole reply to {command!r}: {replies!r}")


def create(cluster: LocalCluster, topic: str, partitions: int, *options: str) -> None:
    words = " ".join(options)
    (reply,) = line(cluster, f"CREATE {topic} {partitions} 3 {words}".encode())
    assert isinstance(reply, OkReply), reply


def rest(
    cluster: LocalCluster,
    method: str,
    path: str,
    body: Any = None,
    *,
    content_type: str = BINARY,
    accept: str | None = None,
    broker: int = 0,
    raw: bytes | None = None,
) -> tuple[int, Any, dict[str, str]]:
    """``(status, decoded JSON body, headers)`` of one request to broker ``broker``."""
    host, port = cluster.http_address(broker)
    conn = http.client.HTTPConnection(host, port, timeout=15)
    try:
        headers = {}
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        if data is not None:
            headers["Content-Type"] = content_type
        if accept is not None:
            headers["Accept"] = accept
        conn.request(method, path, body=data, headers=headers)
        response = conn.getresponse()
        payload = response.read()
        return response.status, json.loads(payload) if payload else None, dict(response.headers)
    finally:
        conn.close()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def end_offsets(cluster: LocalCluster, topic: str) -> list[int | None]:
    rows = line(cluster, f"DESCRIBE {topic}".encode())
    return [r.end_offset for r in rows if isinstance(r, PartitionRow)]


def test_records_produced_over_rest_are_read_over_the_line_protocol_and_rest(
    cluster: LocalCluster,
) -> None:
    create(cluster, "rest-a", 2)
    records = [
        {"key": b64(b"k1"), "value": b64(b"v1"), "headers": [{"name": "h", "value": b64(b"x")}]},
        {"value": b64(b"v2"), "partition": 1},
        {"key": b64(b"k1"), "value": b64(b"v3")},
    ]
    status, body, _ = rest(cluster, "POST", "/topics/rest-a", {"records": records}, broker=1)
    assert status == 200, body
    offsets = body["offsets"]
    assert len(offsets) == 3 and all(o["offset"] is not None for o in offsets)
    assert offsets[0]["partition"] == offsets[2]["partition"]  # one key, one partition
    assert offsets[2]["offset"] > offsets[0]["offset"]
    assert offsets[1]["partition"] == 1
    keyed = offsets[0]["partition"]
    # The line protocol sees the same records at the same offsets.
    rows = line(cluster, f"FETCH rest-a {keyed} 0 format=text".encode(), broker=2)
    messages = [(r.offset, r.key, r.value) for r in rows if isinstance(r, MessageRow)]
    assert (offsets[0]["offset"], b"k1", b"v1") in messages
    assert (offsets[2]["offset"], b"k1", b"v3") in messages
    # REST reads them back with headers and timestamps, from any broker.
    status, read, headers = rest(
        cluster, "GET", f"/topics/rest-a/partitions/{keyed}/records?offset=0", broker=2
    )
    assert status == 200, read
    by_offset = {r["offset"]: r for r in read}
    first = by_offset[offsets[0]["offset"]]
    assert (first["key"], first["value"]) == (b64(b"k1"), b64(b"v1"))
    assert first["headers"] == [{"name": "h", "value": b64(b"x")}]
    assert abs(first["timestamp"] / 1000 - time.time()) < 60
    assert int(headers["Kafkaesque-Next-Offset"]) > offsets[2]["offset"]
    # A read from a later offset starts there (the batch may begin before it).
    later = offsets[2]["offset"]
    status, read, _ = rest(
        cluster, "GET", f"/topics/rest-a/partitions/{keyed}/records?offset={later}"
    )
    assert [r["offset"] for r in read] == [later]


def test_a_pubs_record_is_read_over_rest_with_its_header_and_timestamp(
    cluster: LocalCluster,
) -> None:
    create(cluster, "rest-pubs", 1)
    seed = json.dumps({"Header": "sensor-7", "Key": "", "Body": "reading 42"})
    (reply,) = line(cluster, f"PUBS rest-pubs {seed}".encode())
    assert isinstance(reply, OkReply), reply
    status, read, _ = rest(
        cluster, "GET", "/topics/rest-pubs/partitions/0/records?offset=0&timeout=2000"
    )
    assert status == 200, read
    (record,) = read
    assert base64.b64decode(record["value"]) == b"reading 42"
    assert record["headers"] == [{"name": "Header", "value": b64(b"sensor-7")}]
    assert abs(record["timestamp"] / 1000 - time.time()) < 60


def test_json_records_round_trip_as_compact_json(cluster: LocalCluster) -> None:
    create(cluster, "rest-json", 1)
    value = {"temp": 21.5, "tags": ["a", "b"], "ok": True}
    status, body, _ = rest(
        cluster,
        "POST",
        "/topics/rest-json/partitions/0",
        {"records": [{"key": "dev-1", "value": value}, {"value": [1, 2]}]},
        content_type=JSON,
    )
    assert status == 200, body
    rows = line(cluster, b"FETCH rest-json 0 0 format=text")
    stored = [r.value for r in rows if isinstance(r, MessageRow)]
    assert stored[-2:] == [b'{"temp":21.5,"tags":["a","b"],"ok":true}', b"[1,2]"]
    status, read, headers = rest(
        cluster, "GET", "/topics/rest-json/partitions/0/records?offset=0", accept=JSON
    )
    assert status == 200 and headers["Content-Type"] == JSON
    assert [(r["key"], r["value"]) for r in read][-2:] == [("dev-1", value), (None, [1, 2])]


@pytest.mark.parametrize(
    ("raw", "content_type", "status"),
    [
        (b'{"records": [{"value": "djE="}, ', BINARY, 422),  # malformed JSON
        (b'{"records": [{"value": "djE="}, {"value": "not base64!"}]}', BINARY, 422),
        (b'{"records": [{"value": "djE="}, {"value": "djI=", "partition": 9}]}', BINARY, 404),
        (b'{"records": [{"value": "djE="}, {"value": "djI=", "colour": 1}]}', BINARY, 422),
        (b'{"records": {"value": "djE="}}', BINARY, 422),
        (b'{"records": []}', BINARY, 422),
        (b'{"records": [{"value": "djE="}]}', "text/plain", 415),
        (b'{"records": [{"value": "' + b"A" * (2 * 1024 * 1024) + b'"}]}', BINARY, 413),
    ],
)
def test_bad_input_is_refused_and_nothing_is_written(
    cluster: LocalCluster, raw: bytes, content_type: str, status: int
) -> None:
    topic = "rest-bad"
    if end_offsets(cluster, topic) == []:
        create(cluster, topic, 2)
    got, body, _ = rest(cluster, "POST", f"/topics/{topic}", raw=raw, content_type=content_type)
    assert got == status, body
    assert set(body) >= {"error_code", "message", "retriable", "maybe_applied"}
    assert body["error_code"] // 100 == status
    # Records, not end offsets: a new partition's end moves by its first leader's no-op entry
    # whenever that commits (a flake of this test, seen once in a full run).
    for partition in range(2):
        got, records, _ = rest(
            cluster, "GET", f"/topics/{topic}/partitions/{partition}/records?offset=0"
        )
        assert (got, records) == (200, [])


def test_unknown_topics_partitions_and_paths_are_404(cluster: LocalCluster) -> None:
    create(cluster, "rest-known", 1)
    for method, path, body in [
        ("POST", "/topics/rest-nope", {"records": [{"value": None}]}),
        ("GET", "/topics/rest-nope", None),
        ("GET", "/topics/rest-nope/partitions/0/records?offset=0", None),
        ("GET", "/topics/rest-known/partitions/5/records?offset=0", None),
        ("POST", "/topics/rest-known/partitions/3", {"records": [{"value": None}]}),
        ("GET", "/nowhere", None),
    ]:
        status, answer, _ = rest(cluster, method, path, body)
        assert status == 404, (path, answer)
    status, answer, _ = rest(cluster, "GET", "/topics/rest-known/partitions/0/records")
    assert status == 422, answer  # offset= is required
    status, answer, headers = rest(cluster, "PUT", "/topics/rest-known")
    assert status == 405 and headers["Allow"] == "GET, POST, PATCH, DELETE"


def test_topics_describe_and_brokers_say_what_the_line_protocol_says(
    cluster: LocalCluster,
) -> None:
    create(cluster, "rest-meta", 3)
    rest(cluster, "POST", "/topics/rest-meta/partitions/2", {"records": [{"value": b64(b"x")}]})
    status, names, _ = rest(cluster, "GET", "/topics")
    assert status == 200 and "rest-meta" in names
    status, topic, _ = rest(cluster, "GET", "/topics/rest-meta", broker=1)
    assert status == 200
    assert topic["name"] == "rest-meta" and topic["configs"]["partitions"] == 3
    rows = [r for r in line(cluster, b"DESCRIBE rest-meta") if isinstance(r, PartitionRow)]
    assert [(p["partition"], p["replicas"], p["end_offset"]) for p in topic["partitions"]] == [
        (r.partition, list(r.replicas), r.end_offset) for r in rows
    ]
    status, brokers, _ = rest(cluster, "GET", "/brokers")
    assert status == 200 and brokers["brokers"] == [0, 1, 2]
    assert brokers["details"][0]["port"] == cluster.ports[0].client
    # METADATA names each broker's Kafka and REST ports (so does /brokers).
    listed = [r for r in line(cluster, b"METADATA rest-meta", 1) if isinstance(r, BrokerRow)]
    assert [(r.kafka_port, r.http_port) for r in listed] == [
        (cluster.ports[b].kafka, cluster.http_address(b)[1]) for b in range(3)
    ]
    assert [(d["kafka_port"], d["http_port"]) for d in brokers["details"]] == [
        (r.kafka_port, r.http_port) for r in listed
    ]


def test_tophat_phones_post_heartbeats_and_a_dashboard_gets_each_latest(
    cluster: LocalCluster,
) -> None:
    create(cluster, "rest-heartbeats", 3, "compact=yes")
    phones = [f"phone-{i}" for i in range(6)]
    for beat in range(3):  # each phone beats three times, through any broker
        for i, phone in enumerate(phones):
            status, body, _ = rest(
                cluster,
                "POST",
                "/topics/rest-heartbeats",
                {"records": [{"key": phone, "value": {"phone": phone, "beat": beat}}]},
                content_type=JSON,
                broker=i % 3,
            )
            assert status == 200, body
    for i, phone in enumerate(phones):
        deadline = time.monotonic() + 10
        while True:
            status, latest, _ = rest(
                cluster,
                "GET",
                f"/topics/rest-heartbeats/latest/{phone}",
                accept=JSON,
                broker=(i + 1) % 3,
            )
            if status == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.1)  # the key index may trail the commit by a moment
        assert status == 200, latest
        assert latest["key"] == phone and latest["value"] == {"phone": phone, "beat": 2}
    status, body, _ = rest(cluster, "GET", "/topics/rest-heartbeats/latest/phone-99")
    assert status == 404 and body["code"] == "NO_VALUE"
    status, body, _ = rest(cluster, "GET", "/topics/rest-meta/latest/k")
    assert status == 409 and body["code"] == "NOT_COMPACTED"


def test_keep_alive_serves_many_requests_on_one_connection(cluster: LocalCluster) -> None:
    host, port = cluster.http_address(0)
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        for _ in range(5):
            conn.request("GET", "/topics")
            response = conn.getresponse()
            assert response.status == 200
            response.read()
        assert conn.sock is not None  # never closed in between
    finally:
        conn.close()


def test_the_openapi_document_names_every_endpoint(cluster: LocalCluster) -> None:
    status, document, _ = rest(cluster, "GET", "/openapi.json")
    assert status == 200 and document["openapi"].startswith("3.0")
    assert set(document["paths"]) >= {  # (other modules' paths: their tests)
        "/topics",
        "/topics/{topic}",
        "/topics/{topic}/partitions/{partition}",
        "/topics/{topic}/partitions/{partition}/records",
        "/topics/{topic}/latest/{key}",
        "/brokers",
    }


# -- the OpenAPI document, checked by schemathesis against the running brokers ----------------

# Not the admin writes: random topics, deletions and ACLs would change the cluster under the
# other tests (test_http_rest_admin.py checks those, and their statuses, one by one).
schema = (
    schemathesis.openapi.from_dict(openapi_document())
    .exclude(method=["PATCH", "DELETE"], path_regex="^/(topics|consumer-groups|acls)")
    .exclude(
        method="POST",
        path_regex=r"^/(topics|acls|topics/\{topic\}/configs|consumer-groups/\{group\}/reset)$",
    )
)


@pytest.fixture(scope="module")
def example_topic(cluster: LocalCluster) -> str:
    """The topic the document's examples name, with a record of the example key."""
    create(cluster, "phone-beats", 3, "compact=yes")
    body = {"records": [{"key": "phone-1", "value": {"battery": 81}}]}
    status, answer, _ = rest(cluster, "POST", "/topics/phone-beats", body, content_type=JSON)
    assert status == 200, answer
    return "phone-beats"


@schema.parametrize()
@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.explicit, Phase.generate],
)
def test_every_answer_conforms_to_the_openapi_document(
    case: schemathesis.Case[Any], cluster: LocalCluster, example_topic: str
) -> None:
    host, port = cluster.http_address(0)
    case.call_and_validate(
        base_url=f"http://{host}:{port}",
        timeout=15,
        checks=[
            schemathesis.checks.not_a_server_error,
            schemathesis.checks.status_code_conformance,
            schemathesis.checks.content_type_conformance,
            schemathesis.checks.response_schema_conformance,
        ],
    )


def test_an_idempotent_produce_retried_is_written_once(cluster: LocalCluster) -> None:
    create(cluster, "rest-idem", 2)
    path = "/topics/rest-idem/partitions/1"
    producer = {"producer_id": 7_000_123, "producer_epoch": 0}
    first = {"records": [{"value": b64(b"i0")}, {"value": b64(b"i1")}], **producer, "sequence": 0}
    status, body, _ = rest(cluster, "POST", path, first)
    assert status == 200, body
    offsets = [r["offset"] for r in body["offsets"]]
    # The same request again (a client that never saw the answer): the first offsets, no copy.
    status, body, _ = rest(cluster, "POST", path, first, broker=2)
    assert status == 200 and [r["offset"] for r in body["offsets"]] == offsets, body
    ends = end_offsets(cluster, "rest-idem")
    assert ends[1] == offsets[-1] + 1
    # The next sequence is written; a gap in the sequence is refused and writes nothing.
    nxt = {"records": [{"value": b64(b"i2")}], **producer, "sequence": 2}
    status, body, _ = rest(cluster, "POST", path, nxt, broker=1)
    assert status == 200 and body["offsets"][0]["offset"] == offsets[-1] + 1, body
    gap = {"records": [{"value": b64(b"i9")}], **producer, "sequence": 9}
    status, body, _ = rest(cluster, "POST", path, gap)
    assert status >= 400 and body["code"] == "OUT_OF_ORDER_SEQUENCE", body
    assert end_offsets(cluster, "rest-idem")[1] == offsets[-1] + 2
    # Sequences are per partition: the topic's path refuses them; so do partial identities.
    for where, body_ in [
        ("/topics/rest-idem", first),
        (path, {"records": [{"value": b64(b"x")}], "producer_id": 1}),
        (path, {"records": [{"value": b64(b"x")}], **producer, "sequence": -1}),
        (path, {"records": [{"value": b64(b"x")}], "producerId": 1}),
    ]:
        status, body, _ = rest(cluster, "POST", where, body_)
        assert status == 422, (where, body_, body)
    assert end_offsets(cluster, "rest-idem") == [ends[0], offsets[-1] + 2]


def test_produce_acks_leader_and_all_are_answered_and_zero_is_refused(
    cluster: LocalCluster,
) -> None:
    create(cluster, "rest-acks", 1)
    records = {"records": [{"value": b64(b"a")}]}
    offsets = []
    for acks in ["1", "leader", "all", "-1"]:
        status, body, _ = rest(cluster, "POST", f"/topics/rest-acks?acks={acks}", records)
        assert status == 200, (acks, body)
        offsets.append(body["offsets"][0]["offset"])
    assert offsets == list(range(offsets[0], offsets[0] + 4))
    status, body, _ = rest(cluster, "POST", "/topics/rest-acks?acks=0", records)
    assert status == 422 and "acks=0" in body["message"], body
    assert end_offsets(cluster, "rest-acks") == [offsets[-1] + 1]
