"""``bench._kafka_cluster.KafkaCluster`` (the Apache Kafka that ``bench.kafka`` measures beside
us): 3 KRaft servers start, a client sees them, an RF 3 topic with ``min.insync.replicas=2``
takes and returns records with ``acks=all``, and leaving the block kills every JVM."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench._kafka_cluster import KafkaCluster
from bench._kafka_dist import kafka_available

confluent_kafka = pytest.importorskip("confluent_kafka")

pytestmark = [
    pytest.mark.peers,
    pytest.mark.skipif(not kafka_available(), reason="Kafka's jars are missing: bin/fetch-peers"),
]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_kafka_cluster_serves_an_rf3_topic_and_stops_every_jvm(tmp_path: Path) -> None:
    with KafkaCluster(tmp_path, 3, heap="512m") as kafka:
        pids = kafka.pids
        assert len(pids) == 3 and all(_alive(pid) for pid in pids)
        kafka.create_topic("kc", 3)
        admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": kafka.bootstrap})
        topic = admin.list_topics("kc", timeout=10).topics["kc"]
        assert sorted(len(p.replicas) for p in topic.partitions.values()) == [3, 3, 3]
        producer = confluent_kafka.Producer({"bootstrap.servers": kafka.bootstrap, "acks": "all"})
        for i in range(30):
            producer.produce("kc", f"v{i}".encode(), key=f"k{i}".encode())
        assert producer.flush(30) == 0
        consumer = confluent_kafka.Consumer(
            {
                "bootstrap.servers": kafka.bootstrap,
                "group.id": "kc-g",
                "auto.offset.reset": "earliest",
            }
        )
        consumer.subscribe(["kc"])
        values: set[str] = set()
        for _ in range(300):  # bounded: 300 polls of at most 0.2 s
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                values.add(message.value().decode())
            if len(values) == 30:
                break
        consumer.close()
        assert values == {f"v{i}" for i in range(30)}
        properties = (tmp_path / "node-1" / "server.properties").read_text()
        assert "min.insync.replicas=2" in properties
    assert not any(_alive(pid) for pid in pids)
