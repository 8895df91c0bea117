"""Kafka Connect 4.3.1 in distributed mode against a real 3-broker cluster, through the Kafka
protocol: the FileStream source connector reads an input file's lines into a topic, the FileStream
sink connector writes that topic into an output file, and the output equals the input.

Everything Connect keeps lives in our topics: its connector configs, source offsets and statuses in
the three compacted topics it creates itself (CreateTopics with ``cleanup.policy=compact``, then
checked with DescribeConfigs), its workers in a group of protocol type ``connect`` (JoinGroup and
SyncGroup carry Connect's own metadata as opaque bytes), and the sink's position in its consumer
group's committed offsets. A second worker over the same topics proves it: it finds both connectors
without being told, and the source resumes from its committed offset, so only the lines appended
since reach the output (and the topic, which the source connector created with one partition).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from bench._kafka_dist import (
    CONNECT_DISTRIBUTED,
    GROUPS,
    kafka_available,
    kafka_command,
    run_kafka_tool,
)
from kafkaesque.local_cluster import LocalCluster, free_ports

confluent_kafka = pytest.importorskip("confluent_kafka")

pytestmark = [
    pytest.mark.peers,
    pytest.mark.skipif(not kafka_available(), reason="Kafka's jars are missing: bin/fetch-peers"),
]

GROUP = "kq-connect"
CONFIGS, OFFSETS, STATUS = "kq-connect-configs", "kq-connect-offsets", "kq-connect-status"
LINES_TOPIC = "kq-connect-lines"
# Bounds, not expectations: on an idle machine a worker is ready in ~10 s and the lines move in
# a few, but the machine's cores are shared with the whole suite.
START_TIMEOUT = 120.0  # a worker's JVM start, its topics, its group
MOVE_TIMEOUT = 90.0  # the lines through source, topic and sink


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(str(tmp_path_factory.mktemp("kafka-connect")), 3) as c:
        c.wait_ready()
        yield c


class Worker:
    """One ConnectDistributed worker process, its REST API on 127.0.0.1 at a free port."""

    def __init__(self, cluster: LocalCluster, workdir: str, name: str) -> None:
        (self.port,) = free_ports(1)
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_file = os.path.join(workdir, f"{name}.log")
        properties = os.path.join(workdir, f"{name}.properties")
        settings = {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "group.id": GROUP,
            "key.converter": "org.apache.kafka.connect.storage.StringConverter",
            "value.converter": "org.apache.kafka.connect.storage.StringConverter",
            "config.storage.topic": CONFIGS,
            "offset.storage.topic": OFFSETS,
            "status.storage.topic": STATUS,
            "config.storage.replication.factor": "3",
            "offset.storage.replication.factor": "3",
            "status.storage.replication.factor": "3",
            "offset.storage.partitions": "1",
            "status.storage.partitions": "1",
            # Commit source offsets every second (default 60 s): the test waits on them.
            "offset.flush.interval.ms": "1000",
            # Plugins found through their ServiceLoader manifests (Connect's own all have one),
            # not by scanning every class of the class path: seconds less at each start.
            "plugin.discovery": "service_load",
            "listeners": self.url,
            "rest.advertised.host.name": "127.0.0.1",
            "rest.advertised.port": str(self.port),
        }
        with open(properties, "w", encoding="utf-8") as f:
            f.writelines(f"{k}={v}\n" for k, v in settings.items())
        command = kafka_command(
            CONNECT_DISTRIBUTED, [properties], heap="384m", log_file=self.log_file
        )
        self.process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, cwd=workdir
        )

    def log_tail(self) -> str:
        try:
            with open(self.log_file, encoding="utf-8", errors="replace") as f:
                lines = f.readlines()
        except FileNotFoundError:
            return "(no log)"
        problems = [line for line in lines if " ERROR " in line or " WARN " in line]
        return "".join(problems[-15:] + lines[-10:])[-6000:]

    def call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read() or b"null")

    def wait_ready(self) -> None:
        """Until the worker has joined its group and read its config topic (its REST API then
        answers /connectors), bounded by START_TIMEOUT."""
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"worker exited:\n{self.log_tail()}"
            try:
                self.call("GET", "/connectors")
                return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.5)
        raise AssertionError(f"worker not ready in {START_TIMEOUT} s:\n{self.log_tail()}")

    def stop(self) -> None:
        """SIGTERM by PID (Connect's orderly shutdown commits the source offsets), then wait."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def wait_for_output(path: str, expected: str, worker: Worker) -> None:
    deadline = time.monotonic() + MOVE_TIMEOUT
    got = ""
    while time.monotonic() < deadline:
        assert worker.process.poll() is None, f"worker exited:\n{worker.log_tail()}"
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                got = f.read()
            if got == expected:
                return
            # Lines only ever add up: more than expected is a duplicate, never fixed by waiting.
            assert len(got) <= len(expected), f"more than the input:\n{got[-500:]}"
        time.sleep(0.5)
    status = worker.call("GET", "/connectors?expand=status")
    raise AssertionError(
        f"output {len(got.splitlines())} lines, input {len(expected.splitlines())};"
        f" status {status}\n{worker.log_tail()}"
    )


def read_topic(cluster: LocalCluster, topic: str) -> list[tuple[bytes | None, bytes | None]]:
    """Every record of ``topic`` (key, value), partition by partition, each in order."""
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "group.id": "kq-connect-test-reader",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        partitions = sorted(consumer.list_topics(topic, timeout=20).topics[topic].partitions)
        consumer.assign(
            [
                confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING)
                for p in partitions
            ]
        )
        got: list[tuple[bytes | None, bytes | None]] = []
        at_end: set[int] = set()
        deadline = time.monotonic() + 30
        while len(at_end) < len(partitions) and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None:
                continue
            if message.error() is not None:
                assert message.error().code() == confluent_kafka.KafkaError._PARTITION_EOF
                at_end.add(message.partition())
                continue
            got.append((message.key(), message.value()))
        assert len(at_end) == len(partitions), f"{topic}: not read to its end"
        return got
    finally:
        consumer.close()


def committed_position(cluster: LocalCluster, source_file: str) -> int:
    """The FileStream source's last committed position in ``source_file``, from the offsets
    topic (Connect's key: ``["<connector>", {"filename": ...}]``; the latest record wins)."""
    position = -1
    for key, value in read_topic(cluster, OFFSETS):
        assert key is not None
        connector, partition = json.loads(key)
        if connector == "file-source" and partition == {"filename": source_file}:
            position = -1 if value is None else json.loads(value)["position"]
    return position


def test_a_connect_worker_moves_a_file_through_our_topics_and_resumes_from_its_offsets(
    cluster: LocalCluster, tmp_path: Any
) -> None:
    workdir = str(tmp_path)
    source, sink = os.path.join(workdir, "in.txt"), os.path.join(workdir, "out.txt")
    first = "".join(f"line {i}: {'x' * (i % 7)}\n" for i in range(300))
    with open(source, "w", encoding="utf-8") as f:
        f.write(first)

    worker = Worker(cluster, workdir, "worker-1")
    try:
        worker.wait_ready()
        worker.call(
            "POST",
            "/connectors",
            {
                "name": "file-source",
                "config": {
                    "connector.class": "org.apache.kafka.connect.file.FileStreamSourceConnector",
                    "tasks.max": "1",
                    "file": source,
                    "topic": LINES_TOPIC,
                    # Connect creates the topic (KIP-158), with one partition: the sink then
                    # reads the lines in the order the source read them.
                    "topic.creation.default.partitions": "1",
                    "topic.creation.default.replication.factor": "3",
                },
            },
        )
        worker.call(
            "POST",
            "/connectors",
            {
                "name": "file-sink",
                "config": {
                    "connector.class": "org.apache.kafka.connect.file.FileStreamSinkConnector",
                    "tasks.max": "1",
                    "file": sink,
                    "topics": LINES_TOPIC,
                },
            },
        )
        wait_for_output(sink, first, worker)
        # The source commits its offset every second: wait (bounded) until it covers the file.
        deadline = time.monotonic() + MOVE_TIMEOUT
        while committed_position(cluster, source) < len(first.encode()):
            assert time.monotonic() < deadline, f"no offset committed:\n{worker.log_tail()}"
            time.sleep(0.5)
    finally:
        worker.stop()
    assert worker.process.returncode in (0, 143), worker.log_tail()  # 143: SIGTERM's own code

    # Connect created its three topics compact only (never cut by retention, as in Kafka), and
    # its workers formed a group of protocol type "connect", listed so once they are gone.
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    resources = [
        confluent_kafka.admin.ConfigResource(confluent_kafka.admin.ResourceType.TOPIC, topic)
        for topic in (CONFIGS, OFFSETS, STATUS)
    ]
    for future in admin.describe_configs(resources).values():
        configs = future.result(30)
        assert configs["cleanup.policy"].value == "compact"
        assert configs["retention.ms"].value == configs["retention.bytes"].value == "-1"
    groups = run_kafka_tool(GROUPS, ["--bootstrap-server", cluster.kafka_bootstrap, "--list"])
    assert groups.returncode == 0, groups.stderr[-2000:]
    protocols = {row.split()[0]: row.split()[-1] for row in groups.stdout.splitlines()[1:]}
    assert protocols[GROUP] == "connect" and protocols["connect-file-sink"] == "consumer"

    # A new worker over the same topics: the connectors come back from the config topic, the
    # source from its committed offset (only the appended lines are read), the sink from its
    # group's committed offsets (nothing is written twice).
    more = "".join(f"appended {i}\n" for i in range(50))
    with open(source, "a", encoding="utf-8") as f:
        f.write(more)
    worker = Worker(cluster, workdir, "worker-2")
    try:
        worker.wait_ready()
        assert sorted(worker.call("GET", "/connectors")) == ["file-sink", "file-source"]
        wait_for_output(sink, first + more, worker)
    finally:
        worker.stop()

    values = [v.decode() for _, v in read_topic(cluster, LINES_TOPIC) if v is not None]
    assert values == (first + more).splitlines(), "the topic holds each line once, in order"
