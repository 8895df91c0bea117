"""``kafkaesque topic|produce|consume|status`` as a user runs them, against real brokers."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from kafkaesque.cli.client_commands import partition_state

from kafkaesque.local_cluster import LocalCluster
from kafkaesque.protocol import PartitionRow


def _kafkaesque() -> list[str]:
    exe = shutil.which("kafkaesque", path=str(Path(sys.executable).parent))
    return [exe] if exe else [sys.executable, "-m", "kafkaesque.cli"]


def run(
    cluster: LocalCluster, *args: str, stdin: bytes = b""
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [*_kafkaesque(), *args, "--bootstrap", cluster.bootstrap],
        input=stdin,
        capture_output=True,
        timeout=60,
        check=False,
    )


def ok(cluster: LocalCluster, *args: str, stdin: bytes = b"") -> str:
    result = run(cluster, *args, stdin=stdin)
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout.decode()


def test_topic_produce_consume_status_round_trip(broker_cluster: LocalCluster) -> None:
    out = ok(
        broker_cluster, "topic", "create", "cli-t", "--partitions", "2", "--replication-factor", "3"
    )
    assert out.startswith("created topic cli-t")
    assert "cli-t" in ok(broker_cluster, "topic", "list")
    described = ok(broker_cluster, "topic", "describe", "cli-t").splitlines()
    assert described[0].startswith("topic cli-t: partitions=2 replication_factor=3")
    assert described[1].split() == ["PARTITION", "LEADER", "REPLICAS", "START", "END"]
    assert len(described) == 4

    lines = b"".join(b"line %d\n" % i for i in range(500)) + b"no newline at the end"
    summary = ok(broker_cluster, "produce", "cli-t", "--key", "k1", stdin=lines)
    assert summary.startswith("produced 501 of 501 records to cli-t")
    ok(broker_cluster, "produce", "cli-t", "--partition", "0", stdin=b"p0 only\n")

    everything = ok(broker_cluster, "consume", "cli-t", "-e", "--from-beginning")
    values = everything.splitlines()
    assert sorted(values) == sorted(
        [f"line {i}" for i in range(500)] + ["no newline at the end", "p0 only"]
    )
    keyed = [v for v in values if v != "p0 only"]
    assert keyed[:2] == ["line 0", "line 1"] and keyed[-1] == "no newline at the end"

    formatted = ok(
        broker_cluster,
        "consume",
        "cli-t",
        "--partition",
        "0",
        "--offset",
        "0",
        "--max",
        "1",
        "--format",
        "{partition}/{offset} {key}={value}",
    )
    assert formatted.endswith("p0 only\n") or "=line" in formatted
    assert formatted.count("\n") == 1 and formatted.startswith("0/")

    status = ok(broker_cluster, "status").splitlines()
    assert status[0] == "brokers (3)"
    header = ["ID", "HOST", "PORT", "MQTT", "MQTT_TLS", "MQTT_WS", "LEADERS", "STATE"]
    assert status[1].split() == header
    assert status[2].split()[3:6] == ["-", "-", "-"]  # this cluster has no MQTT listeners
    assert status[2].split()[7] == "up"
    # LEADERS counts the partitions each broker leads: together, every partition with a leader.
    led = sum(int(line.split()[6]) for line in status[2:5])
    table = status[status.index(next(x for x in status if x.startswith("partitions"))) + 2 :]
    assert led == sum(line.split()[2] != "-" for line in table if line.strip())
    rows = [line.split() for line in status if line.startswith("cli-t ")]
    assert len(rows) == 2 and all(len(r) == 8 and r[6:] == [r[3], "ok"] for r in rows)
    assert sum(int(r[5]) for r in rows) >= 502  # end offsets count every record (and no-ops)

    assert ok(broker_cluster, "topic", "delete", "cli-t") == "deleted topic cli-t\n"


def test_unkeyed_lines_go_round_robin_and_consume_says_where_records_are(
    broker_cluster: LocalCluster,
) -> None:
    ok(
        broker_cluster,
        "topic",
        "create",
        "cli-rr",
        "--partitions",
        "3",
        "--replication-factor",
        "3",
    )
    described = ok(broker_cluster, "topic", "describe", "cli-rr").splitlines()[0]
    assert described.endswith(" compact=no fsync=broker"), described  # words, not Python's False
    lines = b"".join(b"%d\n" % i for i in range(1, 31))
    summary = ok(broker_cluster, "produce", "cli-rr", stdin=lines)
    assert summary.rstrip().endswith("partition:records 0:10, 1:10, 2:10"), summary

    result = run(broker_cluster, "consume", "cli-rr", "-e", "--from-beginning", "--long")
    assert result.returncode == 0, result.stderr.decode()
    rows = [line.split(" ") for line in result.stdout.decode().splitlines()]
    assert all(len(row) == 4 and row[2] == "-" for row in rows)  # partition offset key value
    for partition in range(3):
        mine = [row for row in rows if row[0] == str(partition)]
        # Line i went to partition (i - 1) % 3, and each partition's records are in order.
        assert [int(row[3]) for row in mine] == list(range(partition + 1, 31, 3))
        offsets = [int(row[1]) for row in mine]
        assert offsets == sorted(offsets)
    err = result.stderr.decode()
    assert "consumed 30 records: 10 from partition 0, 10 from partition 1" in err, err
    assert "not across them" in err and "--long prints" not in err  # it is --long already

    hinted = run(broker_cluster, "consume", "cli-rr", "--from-beginning", "--max", "12")
    assert len(hinted.stdout.splitlines()) == 12
    assert "--long prints each record's partition and offset" in hinted.stderr.decode()
    one = run(
        broker_cluster, "consume", "cli-rr", "--partition", "1", "--offset", "0", "--max", "1"
    )
    assert one.stdout == b"2\n"
    assert "consumed 1 record from partition 1, offset " in one.stderr.decode()


def test_group_consume_commits_and_resumes(broker_cluster: LocalCluster) -> None:
    ok(broker_cluster, "topic", "create", "cli-g", "--partitions", "1", "--replication-factor", "3")
    ok(broker_cluster, "produce", "cli-g", stdin=b"a\nb\nc\n")
    first = ok(
        broker_cluster, "consume", "cli-g", "--group", "gg", "--from-beginning", "--max", "2"
    )
    assert first == "a\nb\n"
    rest = ok(broker_cluster, "consume", "cli-g", "--group", "gg", "-e")
    assert rest == "c\n"


def test_errors_are_one_line_and_a_non_zero_exit(broker_cluster: LocalCluster) -> None:
    for args in (
        ("topic", "describe", "no-such-topic"),
        ("consume", "no-such-topic"),
        ("topic", "create", "bad name!", "--partitions", "1", "--replication-factor", "1"),
    ):
        result = run(broker_cluster, *args)
        err = result.stderr.decode()
        assert result.returncode != 0, args
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert err.startswith(f"kafkaesque {args[0]}: "), err


def test_topic_alter_changes_a_live_topic_and_refuses_clearly(
    broker_cluster: LocalCluster,
) -> None:
    ok(broker_cluster, "topic", "create", "cli-alter", "--partitions", "1",
       "--replication-factor", "3", "--fsync", "never")  # fmt: skip
    change = ("--partitions", "3", "--retention-ms", "-1", "--cleanup-policy", "compact")
    settings = (
        "partitions=3 replication_factor=3 retention_ms=- retention_bytes=- compact=yes fsync=never"
    )
    assert ok(broker_cluster, "topic", "alter", "cli-alter", *change) == (
        f"altered topic cli-alter: {settings}\n"
    )
    assert ok(broker_cluster, "topic", "alter", "cli-alter", *change) == (
        f"unchanged topic cli-alter: {settings}\n"
    )
    described = ok(broker_cluster, "topic", "describe", "cli-alter").splitlines()
    assert described[0] == f"topic cli-alter: {settings}"
    assert [line.split()[0] for line in described[2:]] == ["0", "1", "2"]
    for args, message in (
        ((), "nothing to change"),
        (("--partitions", "2"), "INVALID_CONFIG"),
        (("--partitions", "0"), "--partitions must be at least 1"),
        (("--retention-bytes", "-7"), "--retention-bytes must be -1 (unlimited) or more"),
    ):
        result = run(broker_cluster, "topic", "alter", "cli-alter", *args)
        err = result.stderr.decode()
        assert result.returncode != 0, args
        assert len(err.strip().splitlines()) == 1 and message in err, err
    # A bad policy is argparse's error, naming the choices.
    result = run(broker_cluster, "topic", "alter", "cli-alter", "--cleanup-policy", "keep")
    assert result.returncode != 0 and "invalid choice: 'keep'" in result.stderr.decode()


def test_an_unreachable_cluster_is_one_clear_error() -> None:
    result = subprocess.run(
        [*_kafkaesque(), "topic", "list", "--bootstrap", "127.0.0.1:1"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    err = result.stderr.decode()
    assert result.returncode == 1 and "cannot connect to 127.0.0.1:1" in err
    assert len(err.strip().splitlines()) == 1


def test_a_partition_with_a_replica_down_is_under_replicated() -> None:
    row = PartitionRow("t", 0, 1, (1, 2, 0), 0, 5)
    assert partition_state(row, set()) == "ok"
    assert partition_state(row, {0}) == "under-replicated"
    assert partition_state(row, {1}) == "no-leader,under-replicated"
    assert partition_state(PartitionRow("t", 0, None, (1, 2, 0)), set()) == "no-leader"
    assert partition_state(row, {7}) == "ok"  # a broker that holds no replica of it
