"""Rolling restarts (issue 26): every broker restarted in turn, gracefully, under load, with no
client error and no acknowledged record lost; ``kafkaesque cluster restart --rolling`` asks the
running ``cluster up`` for one."""

from __future__ import annotations

import re
import time
from pathlib import Path

from kafkaesque.cli.cluster import STATE_FILE

from bench.ops import PartitionProbes, p99
from kafkaesque.client import Client
from kafkaesque.local_cluster import LocalCluster, parse_samples, replicas_behind

from .test_cluster import ClusterUp, _kafkaesque

_HANDED = re.compile(r"broker (\d+): handed over (\d+) of (\d+) partition leaderships")


def test_a_rolling_restart_under_acknowledged_publishes_errs_and_loses_nothing(
    tmp_path: Path,
) -> None:
    with LocalCluster(str(tmp_path), 3) as cluster:
        with Client(cluster.bootstrap) as client:
            client.create_topic("rolling", 3, 3)
        with PartitionProbes(cluster.bootstrap, "rolling", 3, pause_s=0.005) as probes:
            time.sleep(1.0)
            started = time.monotonic()
            steps = cluster.restart_rolling(timeout=60)
            time.sleep(1.0)
            gaps = probes.longest_gaps(started, time.monotonic())
        print("steps:", *(step.describe() for step in steps), sep="\n  ")
        print("longest gap per partition:", [f"{g:.3f}" for g in gaps], f"p99 {p99(gaps):.3f}")
        assert [step.broker for step in steps] == [0, 1, 2]
        assert all(step.exit_code == 0 for step in steps)  # each stopped by itself, in time
        assert probes.errors == []
        assert all(len(acked) > 20 for acked in probes.acked.values()), "a probe barely wrote"
        assert probes.verify() == (0, 0)  # (lost, read twice)
        # Each broker handed every leadership it held over before it stopped.
        for broker in range(3):
            with open(cluster.log_path(broker)) as f:
                said = _HANDED.findall(f.read())
            assert said, f"broker {broker} did not say what it handed over"
            for _, moved, led in said:
                assert moved == led, said
        # Leader balancing gives each partition back to its preferred replica (listed first),
        # the last broker restarted's too (docs/operations.md, issue 37 point 12).
        deadline = time.monotonic() + 60
        with Client(cluster.bootstrap) as client:
            while True:
                rows = client.describe_topic("rolling").partitions
                astray = [(r.partition, r.leader, r.replicas[0]) for r in rows
                          if r.leader != r.replicas[0]]  # fmt: skip
                if not astray:
                    break
                assert time.monotonic() < deadline, f"not led by their preferred replica: {astray}"
                time.sleep(0.5)


def _rows(broker: int, partition: str, **values: float) -> list[tuple[str, dict[str, str], float]]:
    labels = {"broker": str(broker), "topic": "t", "partition": partition}
    rows = []
    for name, value in values.items():
        if name.startswith("lag_"):
            follower = name.removeprefix("lag_")
            rows.append(
                ("kafkaesque_partition_follower_lag", {**labels, "follower": follower}, value)
            )
        else:
            rows.append((f"kafkaesque_partition_{name}", labels, value))
    return rows


def test_a_replica_is_in_sync_once_it_has_what_its_leader_had_when_first_seen() -> None:
    targets: dict[tuple[str, str], int] = {}
    leader = _rows(0, "0", is_leader=1, term=4, log_end_offset=10, lag_2=5)
    behind = _rows(2, "0", is_leader=0, term=4, log_end_offset=5)
    assert replicas_behind(2, {0: leader, 2: behind}, targets) == "t/0 on broker 2 is at 5 of 10"
    # The leader took more writes meanwhile: the target stays where it was first seen.
    leader = _rows(0, "0", is_leader=1, term=4, log_end_offset=30, lag_2=18)
    caught_up = _rows(2, "0", is_leader=0, term=4, log_end_offset=12)
    assert replicas_behind(2, {0: leader, 2: caught_up}, targets) is None
    # A partition only its leader lists (not open on the restarted broker yet), one without a
    # leader, and a deposed leader that still claims an older term.
    assert replicas_behind(
        2, {0: _rows(0, "1", is_leader=1, term=1, log_end_offset=3, lag_2=3)}, {}
    ) == ("t/1 is not open on broker 2 yet")
    assert replicas_behind(2, {2: _rows(2, "0", is_leader=0, term=4, log_end_offset=3)}, {}) == (
        "t/0 has no leader"
    )
    old = _rows(1, "0", is_leader=1, term=3, log_end_offset=2)
    assert replicas_behind(2, {0: leader, 1: old, 2: behind}, {}) == "t/0 on broker 2 is at 5 of 30"


def test_metrics_text_is_read_as_samples() -> None:
    text = (
        "# HELP kafkaesque_partition_term Raft term.\n"
        "# TYPE kafkaesque_partition_term gauge\n"
        'kafkaesque_partition_term{broker="0",topic="a.b-c",partition="1"} 3.0\n'
        "kafkaesque_up 1\n"
        "not a sample\n"
    )
    assert parse_samples(text) == [
        ("kafkaesque_partition_term", {"broker": "0", "topic": "a.b-c", "partition": "1"}, 3.0),
        ("kafkaesque_up", {}, 1.0),
    ]


def test_cluster_restart_rolling_restarts_every_broker_of_cluster_up(tmp_path: Path) -> None:
    up = ClusterUp(tmp_path)
    try:
        up.ready()
        before = [up.pid(i) for i in range(3)]
        result = _kafkaesque("cluster", "restart", "--rolling", "--data-dir", str(tmp_path))
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        assert [line.split(":")[0] for line in lines[:3]] == ["broker 0", "broker 1", "broker 2"]
        assert all(" stopped in " in line and " in sync " in line for line in lines[:3]), lines
        assert lines[3] == "rolling restart done"
        after = [up.pid(i) for i in range(3)]
        assert all(a != b for a, b in zip(before, after, strict=True))
        up.wait_for("rolling restart: broker 2: stopped in ", 5)
        assert not any(" died: " in line for line in up.lines), up.output
        assert up.stop() == 0
    finally:
        up.kill_all()


def test_cluster_restart_without_rolling_or_without_a_cluster_is_one_clear_line(
    tmp_path: Path,
) -> None:
    bare = _kafkaesque("cluster", "restart", "--data-dir", str(tmp_path))
    assert bare.returncode == 2
    assert "the following arguments are required: --rolling" in bare.stderr
    result = _kafkaesque("cluster", "restart", "--rolling", "--data-dir", str(tmp_path))
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"kafkaesque cluster: no `kafkaesque cluster up` runs on {tmp_path} "
        f"(no {STATE_FILE}); start one, or give the --data-dir it runs on"
    )
