"""Live topic changes and fsync policies on real broker processes (issue 26).

Partitions added while a producer writes and a consumer group reads (no acknowledged record lost,
the group reads the new partitions; MQTT subscribers get their records too), a retention change
that deletes old segments on every replica without a restart, ALTERs that are refused with a
clear ``-ERR``, and a broker started with ``--fsync interval`` whose topics fsync by the broker's
policy or by their own.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from kafkaesque.local_cluster import LocalCluster
from kafkaesque.protocol import (
    ErrorCode,
    ErrorReply,
    Fsync,
    MessageRow,
    OkReply,
    PartitionRow,
    TopicRow,
)

from .line_client import LineClient
from .mqtt_helpers import RULES, PahoDevice, wait_for

_ROOT = Path(__file__).resolve().parents[2]
_FSYNC_COUNT = "kafkaesque_fsync_latency_seconds_count"


def _group_commits(cluster: LocalCluster) -> float:
    """Group commits (the fsync rounds of the Raft driver) of every broker so far."""
    return float(
        sum(
            value
            for broker in range(cluster.n)
            for name, _, value in cluster.scrape(broker)
            if name == _FSYNC_COUNT
        )
    )


def test_a_topics_fsync_policy_overrides_the_brokers(tmp_path: Path) -> None:
    args = ["--fsync", "interval", "--fsync-interval-ms", "60000"]
    with (
        LocalCluster(str(tmp_path), 3, extra_args=args) as cluster,
        LineClient(cluster.client_address(0)) as c,
    ):
        c.ok("CREATE lazy 1 3")
        c.ok("CREATE strict 1 3 fsync=always")
        [lazy] = [r for r in c.rows("DESCRIBE lazy") if isinstance(r, TopicRow)]
        [strict] = [r for r in c.rows("DESCRIBE strict") if isinstance(r, TopicRow)]
        assert (lazy.fsync, strict.fsync) == (None, Fsync.ALWAYS)
        c.ok("PUB lazy partition=0 warm-up")  # elections done: their votes were fsynced
        c.ok("PUB strict partition=0 warm-up")
        before = _group_commits(cluster)
        for i in range(30):
            c.ok(f"PUB lazy partition=0 lazy-{i}")
        lazy_commits = _group_commits(cluster) - before
        before = _group_commits(cluster)
        for i in range(30):
            c.ok(f"PUB strict partition=0 strict-{i}")
        strict_commits = _group_commits(cluster) - before
    # Under the broker's "interval" nothing waits for an fsync (the next is a minute away); the
    # topic's "always" fsyncs each write on its leader and followers before acknowledging it.
    assert lazy_commits <= 3, lazy_commits
    assert strict_commits >= 30, strict_commits


def test_partitions_added_under_load_lose_nothing_and_the_group_reads_them(
    tmp_path: Path,
) -> None:
    with LocalCluster(str(tmp_path), 3) as cluster:
        with LineClient(cluster.client_address(0)) as admin:
            admin.ok("CREATE grow 2 3")
        histories = [tmp_path / f"member-{i}.jsonl" for i in range(2)]
        consumer_args = ["--brokers", cluster.bootstrap, "--topic", "grow", "--group", "readers"]
        consumers = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.broker.group_consumer",
                    *consumer_args,
                    "--history",
                    str(history),
                    "--seconds",
                    "25",
                ],
                cwd=_ROOT,
            )
            for history in histories
        ]
        acked: dict[str, tuple[int, int]] = {}  # value -> (partition, offset)
        errors: list[str] = []
        stop = threading.Event()

        def produce() -> None:
            with LineClient(cluster.client_address(1), timeout=30) as c:
                for i in range(100_000):
                    if stop.is_set():
                        return
                    value = f"v{i}"
                    reply = c.call(f"PUB grow key=k{i} {value}")
                    if not isinstance(reply, OkReply):
                        errors.append(f"{value}: {reply!r}")
                        continue
                    partition, offset = map(int, reply.text.split())
                    acked[value] = (partition, offset)
                    time.sleep(0.005)

        producer = threading.Thread(target=produce)
        try:
            producer.start()
            time.sleep(4)
            written_before = len(acked)
            with LineClient(cluster.client_address(2)) as admin:
                assert admin.ok("ALTER grow partitions=4") == "altered"
                rows = admin.rows("DESCRIBE grow")
            partitions = [r for r in rows if isinstance(r, PartitionRow)]
            assert [p.partition for p in partitions] == [0, 1, 2, 3]
            assert all(p.leader is not None for p in partitions)  # it answered once they had one
            time.sleep(6)
        finally:
            stop.set()
            producer.join(timeout=60)
        for consumer in consumers:
            consumer.wait(timeout=90)
        assert [consumer.returncode for consumer in consumers] == [0, 0]
        with LineClient(cluster.client_address(0)) as c:
            ends = {
                r.partition: r.end_offset
                for r in c.rows("DESCRIBE grow")
                if isinstance(r, PartitionRow)
            }
    assert not errors, errors[:5]
    assert written_before > 50 and len(acked) > written_before + 50
    # Keys map by the new count: records written after the change went to the new partitions.
    assert {p for p, _ in acked.values()} == {0, 1, 2, 3}
    consumed: dict[str, tuple[int, int]] = {}
    for history in histories:
        for line in history.read_text().splitlines():
            record = json.loads(line)
            consumed[record["value"]] = (record["partition"], record["offset"])
    assert {p for p, _ in consumed.values()} >= {2, 3}, "the group never read the new partitions"
    missing = sorted(set(acked) - set(consumed), key=lambda v: int(v[1:]))
    assert not missing, f"{len(missing)} acknowledged records never consumed: {missing[:10]}"
    assert all(consumed[v] == where for v, where in acked.items())
    assert all(ends[p] is not None for p in range(4))


def _segments(cluster: LocalCluster, broker: int, topic: str) -> int:
    directory = Path(cluster.data_dir) / str(broker) / topic / "0"
    return len(list(directory.glob("*.log")))


def test_a_retention_change_deletes_old_segments_on_every_replica(tmp_path: Path) -> None:
    args = ["--segment-bytes", "4096", "--retention-check-interval", "0.3"]
    with (
        LocalCluster(str(tmp_path), 3, extra_args=args) as cluster,
        LineClient(cluster.client_address(0)) as c,
    ):
        c.ok("CREATE kept 1 3 retention_ms=-1")
        last = 0
        for i in range(120):
            last = int(c.ok(f"PUB kept partition=0 {i:04d}-" + "x" * 400).split()[1])
        time.sleep(1.5)  # several retention passes: unlimited keeps everything
        starts = [r.start_offset for r in c.rows("DESCRIBE kept") if isinstance(r, PartitionRow)]
        assert starts == [0]
        before = [_segments(cluster, b, "kept") for b in range(3)]
        assert min(before) > 5, before

        assert c.ok("ALTER kept retention_bytes=8000") == "altered"
        [row] = [r for r in c.rows("DESCRIBE kept") if isinstance(r, TopicRow)]
        assert (row.retention_ms, row.retention_bytes) == (None, 8000)
        deadline = time.monotonic() + 30
        after = before
        while time.monotonic() < deadline:
            after = [_segments(cluster, b, "kept") for b in range(3)]
            if max(after) <= 4:
                break
            time.sleep(0.2)
        assert max(after) <= 4, (before, after)  # ~8 KB of 4 KiB segments, and the active one
        # Each replica's own log start moved: every broker's open log took the new limit.
        for broker in range(3):
            with LineClient(cluster.client_address(broker)) as b:
                gone = b.call("FETCH kept 0 0 replica=local")
                assert isinstance(gone, ErrorReply), (broker, gone)
                assert gone.code is ErrorCode.OFFSET_OUT_OF_RANGE
        rows = c.rows(f"FETCH kept 0 {last} format=text")
        assert any(isinstance(r, MessageRow) and r.offset == last for r in rows)  # still there


def test_bad_alters_get_a_clear_error(tmp_path: Path) -> None:
    with (
        LocalCluster(str(tmp_path), 1) as cluster,
        LineClient(cluster.client_address(0)) as c,
    ):
        c.ok("CREATE t 2 1")
        refusals = {
            "ALTER nope partitions=3": (ErrorCode.UNKNOWN_TOPIC, "no topic 'nope'"),
            "ALTER t partitions=1": (
                ErrorCode.INVALID_CONFIG,
                "has 2 partitions: they can be added, not removed (1 asked)",
            ),
            "ALTER t partitions=20000": (ErrorCode.INVALID_CONFIG, "at most 10000"),
            "ALTER t": (ErrorCode.BAD_ARGS, "nothing to change"),
            "ALTER t partitions=zero": (ErrorCode.BAD_ARGS, "partitions must be an integer"),
            "ALTER t fsync=never": (ErrorCode.BAD_ARGS, "unexpected argument 'fsync=never'"),
            "ALTER t retention_ms=-5": (ErrorCode.BAD_ARGS, "retention_ms must be"),
            "ALTER __consumer_offsets partitions=99": (ErrorCode.INVALID_TOPIC, "is internal"),
            "CREATE u 1 1 fsync=sometimes": (ErrorCode.BAD_ARGS, "always|interval|never"),
        }
        for line, (code, message) in refusals.items():
            reply = c.call(line)
            assert isinstance(reply, ErrorReply), (line, reply)
            assert reply.code is code and message in reply.message, (line, reply)
        # Nothing changed, and an ALTER to what is in force changes nothing either.
        assert c.ok("ALTER t partitions=2 compact=no") == "unchanged"
        [row] = [r for r in c.rows("DESCRIBE t") if isinstance(r, TopicRow)]
        assert (row.partitions, row.compact) == (2, False)


def test_mqtt_subscribers_get_the_records_of_partitions_added_later(tmp_path: Path) -> None:
    with LocalCluster(str(tmp_path), 1, mqtt=True, mqtt_rules=RULES) as cluster:
        phone = PahoDevice(cluster.mqtt_address(0), "watcher")
        try:
            phone.wait_connected()
            phone.subscribe("phones/+/commands", qos=1)  # reads the log topic "commands"
            with LineClient(cluster.client_address(0)) as c:
                [before] = [r for r in c.rows("DESCRIBE commands") if isinstance(r, TopicRow)]
                c.ok(f"ALTER commands partitions={before.partitions * 2}")
                partitions = {
                    int(c.ok(f"PUB commands key=phone-{i} cmd-{i}").split()[0]) for i in range(40)
                }
            assert max(partitions) >= before.partitions  # some went to the new partitions
            expected = sorted(f"cmd-{i}".encode() for i in range(40))
            wait_for(lambda: sorted(phone.payloads()) == expected, 30, "every command")
        finally:
            phone.close()
