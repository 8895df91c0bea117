"""Kafka 4.3.1's command-line tools and its Java client (with Kafka 4.x's defaults: idempotence
on, acks=all) against a real 3-broker cluster through the Kafka protocol, each run as a Kafka user
types it: kafka-configs, kafka-topics (alter), the console producer and consumer, kafka-consumer-
groups, the two perf tests, and Kafka's system-test clients (VerifiableProducer and
VerifiableConsumer) in a group with a rebalance.

One cluster for the file, and few JVM starts: related checks share a program run.
"""

from __future__ import annotations

import datetime
import json
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from bench._kafka_dist import (
    CONFIGS,
    CONSOLE_CONSUMER,
    CONSOLE_PRODUCER,
    CONSUMER_GROUPS,
    CONSUMER_PERF_TEST,
    PRODUCER_PERF_TEST,
    TOPICS,
    VERIFIABLE_CONSUMER,
    VERIFIABLE_PRODUCER,
    kafka_available,
    kafka_command,
    run_kafka_tool,
)
from kafkaesque.local_cluster import LocalCluster

pytestmark = [
    pytest.mark.peers,
    pytest.mark.skipif(not kafka_available(), reason="Kafka's jars are missing: bin/fetch-peers"),
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(str(tmp_path_factory.mktemp("kafka-java-tools")), 3) as c:
        c.wait_ready()
        yield c


def tool(cluster: LocalCluster, main_class: str, *args: str, stdin: str | None = None) -> str:
    """Run one of Kafka's tools against the cluster; it must succeed. Its stdout."""
    done = run_kafka_tool(
        main_class, ["--bootstrap-server", cluster.kafka_bootstrap, *args], stdin=stdin
    )
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    return done.stdout


def create_topic(cluster: LocalCluster, name: str, partitions: int) -> None:
    tool(
        cluster,
        TOPICS,
        "--create",
        "--topic",
        name,
        "--partitions",
        str(partitions),
        "--replication-factor",
        "3",
    )


def table(text: str, first_column: str) -> list[dict[str, str]]:
    """The rows of a kafka-consumer-groups table (a header line starting with ``first_column``),
    each as a dict by column name."""
    rows: list[dict[str, str]] = []
    header: list[str] | None = None
    for line in text.splitlines():
        words = line.split()
        if words[:1] == [first_column]:
            header = words
        elif header and len(words) >= len(header):
            rows.append(dict(zip(header, words, strict=False)))
    return rows


def offsets(text: str, column: str) -> dict[int, int]:
    """Partition -> the offset in ``column`` of a kafka-consumer-groups table."""
    return {int(r["PARTITION"]): int(r[column]) for r in table(text, "GROUP")}


def consume_console(cluster: LocalCluster, topic: str, group: str, *extra: str) -> str:
    """kafka-console-consumer in ``group``: 12 records of ``topic`` from the beginning, each
    printed with its partition and offset (and what ``extra`` asks)."""
    return tool(
        cluster,
        CONSOLE_CONSUMER,
        "--topic",
        topic,
        "--group",
        group,
        "--from-beginning",
        "--max-messages",
        "12",
        "--timeout-ms",
        "30000",
        "--formatter-property",
        "print.partition=true",
        "--formatter-property",
        "print.offset=true",
        *extra,
    )


def test_kafka_configs_and_topics_alter(cluster: LocalCluster) -> None:
    create_topic(cluster, "jt-configs", 2)

    def configs(*args: str) -> str:
        return tool(
            cluster, CONFIGS, "--entity-type", "topics", "--entity-name", "jt-configs", *args
        )

    before = configs("--describe")
    assert "retention.ms=604800000" in before and "cleanup.policy=delete" in before
    configs("--alter", "--add-config", "retention.ms=3600000,cleanup.policy=compact")
    after = configs("--describe")
    assert "retention.ms=3600000" in after and "cleanup.policy=compact" in after
    configs("--alter", "--delete-config", "retention.ms")
    reverted = configs("--describe")
    assert "retention.ms=604800000" in reverted and "cleanup.policy=compact" in reverted

    tool(cluster, TOPICS, "--alter", "--topic", "jt-configs", "--partitions", "4")
    described = tool(cluster, TOPICS, "--describe", "--topic", "jt-configs")
    assert "PartitionCount: 4" in described
    assert "cleanup.policy=compact" in described
    assert len([line for line in described.splitlines() if "Partition: " in line]) == 4
    # Every replica of a Raft group is in sync in Kafka's sense (the ISR lists them all).
    assert "jt-configs" not in tool(cluster, TOPICS, "--describe", "--under-replicated-partitions")


def test_console_producer_and_consumer_with_keys_headers_and_a_group(
    cluster: LocalCluster,
) -> None:
    create_topic(cluster, "jt-console", 3)
    lines = [f"source:jt,n:{i}\tkey-{i}\tvalue {i}" for i in range(12)]
    tool(
        cluster,
        CONSOLE_PRODUCER,
        "--topic",
        "jt-console",
        "--reader-property",
        "parse.key=true",
        "--reader-property",
        "parse.headers=true",
        stdin="\n".join(lines) + "\n",
    )
    out = consume_console(
        cluster,
        "jt-console",
        "jt-console-readers",
        "--formatter-property",
        "print.key=true",
        "--formatter-property",
        "print.headers=true",
    )
    read = re.findall(r"^Partition:(\d+)\tOffset:(\d+)\t(.*)$", out, re.M)
    assert sorted(line for _, _, line in read) == sorted(lines), out
    last: dict[int, int] = {}
    for p, o, _ in read:
        last[int(p)] = max(last.get(int(p), -1), int(o))
    # The group committed what it read (the tool closes its consumer, committing).
    described = tool(cluster, CONSUMER_GROUPS, "--describe", "--group", "jt-console-readers")
    committed = offsets(described, "CURRENT-OFFSET")
    assert all(committed[p] > o for p, o in last.items()), (committed, last)


def produce_console(cluster: LocalCluster, topic: str, values: list[str]) -> None:
    lines = [f"k{v}\t{v}" for v in values]
    tool(
        cluster,
        CONSOLE_PRODUCER,
        "--topic",
        topic,
        "--reader-property",
        "parse.key=true",
        stdin="\n".join(lines) + "\n",
    )


def test_kafka_consumer_groups_list_describe_reset_and_delete(cluster: LocalCluster) -> None:
    topic, group = "jt-groups", "jt-resetters"
    create_topic(cluster, topic, 2)
    produce_console(cluster, topic, [f"a{i}" for i in range(6)])
    time.sleep(1.0)
    between = datetime.datetime.now(datetime.UTC)
    time.sleep(1.0)
    produce_console(cluster, topic, [f"b{i}" for i in range(6)])
    out = consume_console(cluster, topic, group)
    read = re.findall(r"Partition:(\d+)\s+Offset:(\d+)\s+(\S+)", out)
    assert sorted(v for _, _, v in read) == sorted(
        [f"a{i}" for i in range(6)] + [f"b{i}" for i in range(6)]
    )
    first_b: dict[int, int] = {}
    last: dict[int, int] = {}
    for p, o, v in read:
        part, off = int(p), int(o)
        last[part] = max(last.get(part, -1), off)
        if v.startswith("b"):
            first_b[part] = min(first_b.get(part, off), off)

    assert group in tool(cluster, CONSUMER_GROUPS, "--list").split()

    def describe() -> str:
        return tool(cluster, CONSUMER_GROUPS, "--describe", "--group", group)

    def reset(*how: str) -> dict[int, int]:
        return offsets(
            tool(
                cluster,
                CONSUMER_GROUPS,
                "--group",
                group,
                "--reset-offsets",
                "--topic",
                topic,
                *how,
            ),
            "NEW-OFFSET",
        )

    rows = table(describe(), "GROUP")
    assert {int(r["PARTITION"]) for r in rows} == {0, 1}
    for r in rows:
        current, end, lag = int(r["CURRENT-OFFSET"]), int(r["LOG-END-OFFSET"]), int(r["LAG"])
        assert current > last[int(r["PARTITION"])] and lag == end - current

    latest = reset("--to-latest", "--execute")
    rows = table(describe(), "GROUP")
    assert {int(r["PARTITION"]): int(r["CURRENT-OFFSET"]) for r in rows} == latest
    # The lag is the log end's distance; the log end may have moved on by a Raft entry of its
    # own (a new leader's no-op), which a client skips, so the lag is not asserted to be 0.
    for r in rows:
        assert int(r["LAG"]) == int(r["LOG-END-OFFSET"]) - int(r["CURRENT-OFFSET"]), rows
        assert int(r["CURRENT-OFFSET"]) > last[int(r["PARTITION"])], rows

    shifted = reset("--shift-by", "-2", "--execute")
    assert shifted == {p: o - 2 for p, o in latest.items()}
    assert offsets(describe(), "CURRENT-OFFSET") == shifted

    # A dry run shows the earliest offsets and changes nothing.
    assert reset("--to-earliest", "--dry-run") == {0: 0, 1: 0}
    assert offsets(describe(), "CURRENT-OFFSET") == shifted
    assert reset("--to-earliest", "--execute") == {0: 0, 1: 0}
    assert offsets(describe(), "CURRENT-OFFSET") == {0: 0, 1: 0}

    # A datetime between the two batches: each partition's first record of the second one (or
    # its end, where it has none of them, as Kafka answers).
    stamp = between.strftime("%Y-%m-%dT%H:%M:%S.") + f"{between.microsecond // 1000:03d}Z"
    at_time = reset("--to-datetime", stamp, "--execute")
    expected = {p: first_b.get(p, latest[p]) for p in (0, 1)}
    assert at_time == expected
    assert offsets(describe(), "CURRENT-OFFSET") == expected

    state = tool(cluster, CONSUMER_GROUPS, "--describe", "--group", group, "--state")
    assert table(state, "GROUP")[0]["STATE"] == "Empty", state
    tool(cluster, CONSUMER_GROUPS, "--delete", "--group", group)
    assert group not in tool(cluster, CONSUMER_GROUPS, "--list").split()


def test_producer_and_consumer_perf_tests(cluster: LocalCluster) -> None:
    create_topic(cluster, "jt-perf", 3)
    produced = tool(
        cluster,
        PRODUCER_PERF_TEST,
        "--topic",
        "jt-perf",
        "--num-records",
        "5000",
        "--record-size",
        "100",
        "--throughput",
        "-1",
        "--command-property",
        f"bootstrap.servers={cluster.kafka_bootstrap}",
    )
    assert re.search(r"^5000 records sent", produced, re.M), produced
    consumed = tool(
        cluster,
        CONSUMER_PERF_TEST,
        "--topic",
        "jt-perf",
        "--num-records",
        "5000",
        "--timeout",
        "30000",
    )
    header, values = consumed.strip().splitlines()[-2:]
    report = dict(zip([h.strip() for h in header.split(",")], values.split(","), strict=True))
    assert int(report["data.consumed.in.nMsg"]) == 5000, consumed


class JsonEvents:
    """A running Kafka program that prints one JSON event per line, its events collected on a
    thread, as Kafka's system tests read VerifiableProducer and VerifiableConsumer."""

    def __init__(self, main_class: str, args: list[str]) -> None:
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self.process = subprocess.Popen(
            kafka_command(main_class, args),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("{"):
                with self._lock:
                    self.events.append(json.loads(line))

    def named(self, name: str) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self.events if e["name"] == name]

    def wait(self, condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert self.process.poll() is None or condition(), f"exited before {what}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.2)

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (the program's shutdown hook closes its client cleanly), then wait."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait(10)
            self._reader.join(10)


def verifiable_produce(cluster: LocalCluster, topic: str, count: int, prefix: int) -> set[str]:
    """Kafka's VerifiableProducer with the client's defaults (idempotent, acks=all): the values
    it reports acknowledged (each as ``partition:offset:value``)."""
    producer = JsonEvents(
        VERIFIABLE_PRODUCER,
        [
            "--bootstrap-server",
            cluster.kafka_bootstrap,
            "--topic",
            topic,
            "--max-messages",
            str(count),
            "--repeating-keys",
            "16",
            "--value-prefix",
            str(prefix),
        ],
    )
    producer.process.wait(90)
    producer.stop()
    assert producer.process.returncode == 0
    acked = producer.named("producer_send_success")
    assert not producer.named("producer_send_error")
    assert len(acked) == count
    (data,) = producer.named("tool_data")
    assert data["acked"] == count
    return {f"{e['partition']}:{e['offset']}:{e['value']}" for e in acked}


def test_verifiable_producer_and_two_verifiable_consumers_in_a_group(
    cluster: LocalCluster,
) -> None:
    topic, group = "jt-verifiable", "jt-verifiers"
    create_topic(cluster, topic, 4)
    acked = verifiable_produce(cluster, topic, 400, prefix=1)
    consumer_args = [
        "--bootstrap-server",
        cluster.kafka_bootstrap,
        "--topic",
        topic,
        "--group-id",
        group,
        "--verbose",
        "--reset-policy",
        "earliest",
    ]
    first = JsonEvents(VERIFIABLE_CONSUMER, consumer_args)
    second = JsonEvents(VERIFIABLE_CONSUMER, consumer_args)
    consumers = [first, second]

    def records() -> list[str]:
        return [
            f"{e['partition']}:{e['offset']}:{e['value']}"
            for c in consumers
            for e in c.named("record_data")
        ]

    def assigned(c: JsonEvents) -> int:
        last = c.named("partitions_assigned")
        return len(last[-1]["partitions"]) if last else 0

    try:
        first.wait(lambda: len(records()) >= 400, "the first 400 records")
        first.wait(lambda: assigned(first) + assigned(second) == 4, "both members assigned")
        first.wait(lambda: assigned(first) > 0 and assigned(second) > 0, "two members sharing")
        live = tool(cluster, CONSUMER_GROUPS, "--describe", "--group", group, "--members")
        members = table(live, "GROUP")
        assert len(members) == 2 and sum(int(m["#PARTITIONS"]) for m in members) == 4, live
        state = table(
            tool(cluster, CONSUMER_GROUPS, "--describe", "--group", group, "--state"), "GROUP"
        )
        assert state[0]["STATE"] == "Stable" and state[0]["#MEMBERS"] == "2", state

        # The second member leaves (a clean close: its commits, then LeaveGroup); the first takes
        # all four partitions from the commits and reads on, nothing read twice.
        second.stop()
        # 143: the JVM's exit on SIGTERM, after its shutdown hook closed the consumer.
        assert second.process.returncode == 143
        assert second.named("shutdown_complete")
        assert second.named("partitions_revoked")
        first.wait(lambda: assigned(first) == 4, "the rebalance after a member left")
        acked |= verifiable_produce(cluster, topic, 400, prefix=2)
        first.wait(lambda: len(records()) >= 800, "the second 400 records")
    finally:
        for c in consumers:
            c.stop()

    read = records()
    assert len(read) == len(set(read)), "a record read twice"
    assert set(read) == acked
    commits = [e for c in consumers for e in c.named("offsets_committed")]
    assert commits and all(e["success"] for e in commits)
    # The last commit of each partition is where the group resumes: past every acked record.
    ends: dict[int, int] = {}
    for value in acked:
        p, o, _ = value.split(":", 2)
        ends[int(p)] = max(ends.get(int(p), -1), int(o) + 1)
    committed = offsets(
        tool(cluster, CONSUMER_GROUPS, "--describe", "--group", group), "CURRENT-OFFSET"
    )
    assert all(committed[p] >= end for p, end in ends.items()), (committed, ends)


def test_the_new_consumer_protocol_is_refused_with_kafkas_clear_error(
    cluster: LocalCluster,
) -> None:
    """KIP-848 (``group.protocol=consumer``) needs ConsumerGroupHeartbeat, which ApiVersions does
    not list: the Java client stops with its own error telling the user to use the classic
    protocol, instead of hanging or misbehaving."""
    done = run_kafka_tool(
        CONSOLE_CONSUMER,
        [
            "--bootstrap-server",
            cluster.kafka_bootstrap,
            "--topic",
            "jt-kip848",
            "--group",
            "jt-kip848",
            "--command-property",
            "group.protocol=consumer",
            "--timeout-ms",
            "20000",
        ],
    )
    output = done.stdout + done.stderr  # the client logs to stdout, the tool to stderr
    assert "The cluster does not support the new CONSUMER group protocol" in output, output[-3000:]
    assert "Set group.protocol=classic" in output
    assert "Processed a total of 0 messages" in output
