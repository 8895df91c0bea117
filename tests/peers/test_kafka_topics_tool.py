"""Kafka's own ``kafka-topics`` (Kafka 4.3's tools, the Java admin client) against a real
3-broker cluster through the Kafka protocol: create, list, describe and delete, as a Kafka user
types them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bench._kafka_dist import TOPICS, kafka_available, run_kafka_tool
from kafkaesque.local_cluster import LocalCluster

pytestmark = [
    pytest.mark.peers,
    pytest.mark.skipif(not kafka_available(), reason="Kafka's jars are missing: bin/fetch-peers"),
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(str(tmp_path_factory.mktemp("kafka-tools")), 3) as c:
        c.wait_ready()
        yield c


def topics(cluster: LocalCluster, *args: str) -> str:
    done = run_kafka_tool(TOPICS, ["--bootstrap-server", cluster.kafka_bootstrap, *args])
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_kafka_topics_creates_lists_describes_and_deletes(cluster: LocalCluster) -> None:
    topics(
        cluster,
        "--create",
        "--topic",
        "kt-orders",
        "--partitions",
        "3",
        "--replication-factor",
        "3",
    )
    assert "kt-orders" in topics(cluster, "--list").split()
    described = topics(cluster, "--describe", "--topic", "kt-orders")
    assert "PartitionCount: 3" in described and "ReplicationFactor: 3" in described
    rows = [line for line in described.splitlines() if "Partition: " in line]
    assert len(rows) == 3
    topics(cluster, "--delete", "--topic", "kt-orders")
    assert "kt-orders" not in topics(cluster, "--list").split()
