"""Whole jepsen_like runs against real broker processes: the harness must tell a correct broker
from a broken one.

* The short run (3 nodes, kill-leader and partition, under a minute of load, TLS and SCRAM on
  every port) must be valid: it runs in CI (mark ``jepsen``, not ``slow``).
* The same harness against a broker in its deliberately broken mode (acknowledging writes before
  they commit) must come out invalid with lost writes: otherwise the harness proves nothing.
* The long runs (every nemesis, 3 and 5 nodes, minutes) are ``slow``: ``bin/test --slow``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kafkaesque.jepsen_like._nemesis import NEMESES
from kafkaesque.jepsen_like._workload import WorkloadOptions
from kafkaesque.jepsen_like.history import ReplicaRead, read_history
from kafkaesque.jepsen_like.runner import RunOptions, RunOutcome, run

pytestmark = pytest.mark.jepsen


def _run(tmp_path: Path, **options: object) -> RunOutcome:
    outcome = run(RunOptions(base_dir=str(tmp_path), **options))
    print(outcome.result.summary())
    print(f"report: {outcome.report}")
    return outcome


def _assert_reported(outcome: RunOutcome) -> None:
    run_dir = Path(outcome.run_dir)
    assert Path(outcome.report).is_file()
    for png in ("throughput.png", "latency.png", "unavailability.png"):
        assert (run_dir / png).stat().st_size > 0
    assert outcome.result.summary().splitlines()[-1].startswith("RESULT valid=")


def test_a_broker_that_acks_before_commit_is_caught_losing_writes(tmp_path: Path) -> None:
    # Killing leaders alone rarely catches this bug: the leader has sent the entry to its
    # followers before the client reads the ack, so the window is microseconds (measured: no
    # loss in 7 kills). An isolated leader that keeps acknowledging is what loses writes, so
    # the run uses the CI run's two nemeses; seed 11 makes the first fault an isolated leader.
    outcome = _run(
        tmp_path,
        nodes=3,
        time_s=16.0,
        nemeses=("kill-leader", "partition"),
        interval_s=4.0,
        seed=11,
        unsafe_ack_before_commit=True,
        workload=WorkloadOptions(producers=6, consumers=1),
    )
    _assert_reported(outcome)
    assert not outcome.result.valid
    assert outcome.result.lost > 0, outcome.result.summary()


@pytest.mark.slow
@pytest.mark.parametrize("nodes", [3, 5])
def test_ten_minutes_of_every_nemesis_is_valid(tmp_path: Path, nodes: int) -> None:
    outcome = _run(
        tmp_path,
        nodes=nodes,
        time_s=600.0,
        nemeses=NEMESES,
        interval_s=10.0,
        workload=WorkloadOptions(group_members=3),
    )
    _assert_reported(outcome)
    assert outcome.result.valid, outcome.result.summary()


def test_a_short_run_with_kill_leader_and_partitions_is_valid(tmp_path: Path) -> None:
    # --secure: brokers speak TLS on every port (peers mutual TLS), clients authenticate with
    # SCRAM, and the cluster secret is random. The suite's one short valid run: a plaintext
    # twin checked the same history under the same faults, a minute for nothing this run does
    # not check too (plaintext brokers meet these faults in the broker tests, and the slow
    # ten-minute runs are plaintext).
    outcome = _run(
        tmp_path,
        nodes=3,
        time_s=45.0,
        nemeses=("kill-leader", "partition"),
        interval_s=6.0,
        seed=7,
        secure=True,
        workload=WorkloadOptions(producers=4, consumers=1, group_members=2),
    )
    result = outcome.result
    _assert_reported(outcome)
    assert result.faults >= 2, "the nemesis must have struck"
    assert result.acked > 100, "the clients must have written through the faults"
    assert result.lost == 0 and result.duplicate == 0, result.summary()
    assert result.valid, result.summary()
    assert not result.unchecked_partitions, "the final read must be complete"
    # Every broker's own replicas were read whole (FETCH replica=local) and compared.
    replica_reads = [ev for ev in read_history(outcome.history) if isinstance(ev.op, ReplicaRead)]
    done = {ev.node: ev.op for ev in replica_reads if ev.type == "ok"}
    assert set(done) == {"n0", "n1", "n2"}, replica_reads
    for op in done.values():
        assert isinstance(op, ReplicaRead)
        assert {(t, p) for t, p, _ in op.ends} == {("jepsen", p) for p in range(4)}
        assert op.reads, "each replica holds records"
    run_dir = Path(outcome.run_dir)
    assert (run_dir / "pki" / "ca.pem").is_file() and (run_dir / "users").is_file()
    assert "secure=True" in Path(outcome.report).read_text()
