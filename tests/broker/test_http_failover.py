"""A partition leader killed with kill -9 under a REST producer and a REST consumer instance
(issue 34): every record a POST acknowledged with an offset is in the log once, at that offset,
and the consumer instance (its state in the cluster, not in one broker) reads every one of them
and commits past them.

The producer and the consumer talk to the two brokers that survive; the victim leads a partition
that both use, so the kill costs an election under load. A POST that fails, or a record reported
with an error, is not acknowledged: it may or may not be in the log, as Kafka's REST proxies say
(``maybe_applied``).
"""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from kafkaesque.local_cluster import LocalCluster
from kafkaesque.protocol import PartitionRow

from .test_http_consumers import V2, committed, new_instance
from .test_http_rest import BINARY, create, line, rest

TOPIC = "rest-kill"
PARTITIONS = 3
ROUNDS = 60  # POSTs of RECORDS records each, bounded in count
RECORDS = 10


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(str(tmp_path_factory.mktemp("rest-failover")), 3) as running:
        yield running


def leaders(cluster: LocalCluster, broker: int) -> dict[int, int | None]:
    rows = line(cluster, f"DESCRIBE {TOPIC}".encode(), broker)
    return {r.partition: r.leader for r in rows if isinstance(r, PartitionRow)}


class Producer(threading.Thread):
    """POSTs ``ROUNDS`` batches to one broker; keeps every acknowledged ``value -> (p, offset)``."""

    def __init__(self, cluster: LocalCluster, broker: int, killed: threading.Event) -> None:
        super().__init__(daemon=True)
        self.cluster, self.broker, self.killed = cluster, broker, killed
        self.acked: dict[bytes, tuple[int, int]] = {}
        self.failed_posts = 0
        self.failed_records = 0

    def run(self) -> None:
        serial = 0
        for round_ in range(ROUNDS):
            if round_ == ROUNDS // 3:
                self.killed.wait(30)  # the kill falls in the middle of the load
            values = [f"s{serial + i:05d}".encode() for i in range(RECORDS)]
            serial += RECORDS
            records = [{"value": base64.b64encode(v).decode()} for v in values]
            try:
                status, body, _ = rest(
                    self.cluster,
                    "POST",
                    f"/topics/{TOPIC}",
                    {"records": records},
                    broker=self.broker,
                )
            except OSError:
                self.failed_posts += 1
                continue
            if status != 200:
                self.failed_posts += 1
                continue
            for value, report in zip(values, body["offsets"], strict=True):
                if report.get("offset") is None:
                    self.failed_records += 1
                else:
                    self.acked[value] = (report["partition"], report["offset"])


def log_contents(cluster: LocalCluster, broker: int) -> list[tuple[bytes, int, int]]:
    """Every record of the topic as ``(value, partition, offset)``, read over REST by offset."""
    found: list[tuple[bytes, int, int]] = []
    for p in range(PARTITIONS):
        offset = 0
        for _ in range(200):  # bounded: a few records a page at least
            status, body, _ = rest(
                cluster,
                "GET",
                f"/topics/{TOPIC}/partitions/{p}/records?offset={offset}&timeout=0",
                accept=BINARY,
                broker=broker,
            )
            assert status == 200, body
            if not body:
                break
            for r in body:
                found.append((base64.b64decode(r["value"]), p, r["offset"]))
            offset = body[-1]["offset"] + 1
    return found


def test_a_leader_killed_under_a_rest_producer_and_consumer_loses_nothing_acknowledged(
    cluster: LocalCluster,
) -> None:
    create(cluster, TOPIC, PARTITIONS)
    deadline = time.monotonic() + 20
    while None in (led := leaders(cluster, 0)).values() and time.monotonic() < deadline:
        time.sleep(0.2)
    victim = led[0]
    assert victim is not None, led
    producing, consuming = (b for b in range(3) if b != victim)

    config = {"name": "c", "auto.offset.reset": "earliest", "auto.commit.enable": "false"}
    base = new_instance(cluster, "g-kill", config, broker=consuming)
    status, body, _ = rest(
        cluster,
        "POST",
        f"{base}/subscription",
        {"topics": [TOPIC]},
        content_type=V2,
        broker=consuming,
    )
    assert status == 204, body

    killed = threading.Event()
    acked_at_kill = 0
    producer = Producer(cluster, producing, killed)
    producer.start()
    consumed: dict[bytes, int] = {}
    commit_failures = 0

    def consume_round() -> None:
        nonlocal commit_failures
        status, body, _ = rest(
            cluster, "GET", f"{base}/records?timeout=300", accept=BINARY, broker=consuming
        )
        if status != 200:  # the coordinator or a leader moved: asked again next round
            return
        for r in body:
            value = base64.b64decode(r["value"])
            consumed[value] = consumed.get(value, 0) + 1
        status, _, _ = rest(cluster, "POST", f"{base}/offsets", broker=consuming)
        commit_failures += status != 204

    # Consume while producing; kill the victim once a third of the load is in.
    stop_at = time.monotonic() + 90
    while producer.is_alive() and time.monotonic() < stop_at:
        if not killed.is_set() and len(producer.acked) >= ROUNDS // 3 * RECORDS - RECORDS:
            cluster.kill(victim)
            acked_at_kill = len(producer.acked)
            killed.set()
        consume_round()
    killed.set()
    producer.join(30)
    assert not producer.is_alive(), "the producer did not finish in time"
    assert len(producer.acked) - acked_at_kill >= ROUNDS * RECORDS // 2, (
        f"only {len(producer.acked) - acked_at_kill} records acknowledged after the kill "
        f"({producer.failed_posts} POSTs and {producer.failed_records} records failed)"
    )
    cluster.start(victim)
    cluster.wait_ready()

    # The consumer instance reads on, through the restarted cluster, until it has every ack.
    deadline = time.monotonic() + 30
    while set(producer.acked) - set(consumed) and time.monotonic() < deadline:
        consume_round()
    missing = sorted(set(producer.acked) - set(consumed))
    assert not missing, f"{len(missing)} acknowledged records never consumed: {missing[:5]}"

    # Every acknowledged record is in the log once, where its POST said.
    log = log_contents(cluster, victim)
    where: dict[bytes, list[tuple[int, int]]] = {}
    for value, p, offset in log:
        where.setdefault(value, []).append((p, offset))
    lost = [v for v in producer.acked if v not in where]
    assert not lost, f"{len(lost)} acknowledged records lost: {lost[:5]}"
    twice = {v: w for v, w in where.items() if len(w) > 1}
    assert not twice, f"records in the log twice: {list(twice.items())[:5]}"
    moved = {v: (where[v][0], at) for v, at in producer.acked.items() if where[v][0] != at}
    assert not moved, f"records not where their POST said: {list(moved.items())[:5]}"

    # The group's commits reach the end of what it read, seen through the line protocol.
    consume_round()
    ends: dict[int, int] = {}
    for value in consumed:
        if value in where:
            p, offset = where[value][0]
            ends[p] = max(ends.get(p, 0), offset + 1)
    commits: dict[int, Any] = committed(cluster, "g-kill", TOPIC)
    assert all((commits.get(p) or 0) >= end for p, end in ends.items()), (commits, ends)
