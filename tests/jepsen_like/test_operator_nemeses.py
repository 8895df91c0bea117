"""The operator's nemeses against real broker processes (issue 26): ``rolling-restart`` (every
broker stopped gracefully, started again and waited for, one at a time) and ``decommission`` (a
spare admitted, an old broker removed and stopped), each under a few seconds of load.

Each test asserts both that the history is clean (nothing lost, nothing duplicated: the
idempotent producers and the plain ones alike) and that the nemesis really did its work, from
what it recorded: new pids for every broker; a broker gone from the registry and the replicas
and a new one serving in its place. A three-minute run of both on five nodes, among crashes,
partitions and reassignments, is also here.

All three are fault runs of the harness's own nemeses, so they sit in the slow tier
(``bin/test --slow``): what they hold the brokers to is tested once at the broker's level in
every ``bin/test`` (tests/cli/test_cluster_rolling.py and tests/broker/test_balancer.py restart
every broker under acknowledged writes; tests/broker/test_decommission.py removes brokers under
load), and these two runs cost more than a minute of it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from kafkaesque.jepsen_like._workload import WorkloadOptions
from kafkaesque.jepsen_like.history import Nemesis, ReplicaRead, read_history
from kafkaesque.jepsen_like.runner import RunOptions, RunOutcome, run

pytestmark = pytest.mark.jepsen

_RESTARTED = re.compile(r"rolling-restart n(\d+): pid (\d+) -> (\d+): SIGTERM, exit 0 after")
_ADDED = re.compile(r"decommission: n(\d+) added \(ADDBROKER\)")
_REMOVED = re.compile(
    r"decommission: n(\d+) removed \(\+OK moved=\d+\), gone from every broker's METADATA, "
    r"stopped; members (\S+)$"
)


def _run(
    tmp_path: Path,
    nemesis: str,
    *,
    nodes: int = 3,
    more: tuple[str, ...] = (),
    interval_s: float = 2.0,  # the first fault comes 1-3 s in
    **options: object,
) -> RunOutcome:
    outcome = run(
        RunOptions(
            base_dir=str(tmp_path),
            nodes=nodes,
            nemeses=(nemesis, *more),
            interval_s=interval_s,
            recovery_s=3.0,
            workload=WorkloadOptions(producers=4, consumers=1, group_members=2),
            **options,
        )
    )
    print(outcome.result.summary())
    print("\n".join(outcome.nemesis_log))
    return outcome


def _clean(outcome: RunOutcome) -> None:
    result = outcome.result
    assert result.valid, result.summary()
    assert result.lost == 0 and result.duplicate == 0, result.summary()
    assert not result.unchecked_partitions, "the final read must be complete"
    assert result.acked > 50, "the clients must have written through the nemesis"


def _applied(outcome: RunOutcome, fault: str) -> list[tuple[str, ...]]:
    """The targets of every start of ``fault`` that completed ok."""
    return [
        ev.op.targets
        for ev in read_history(outcome.history)
        if isinstance(ev.op, Nemesis)
        and ev.op.fault == fault
        and ev.op.phase == "start"
        and ev.type == "ok"
    ]


@pytest.mark.slow
def test_a_rolling_restart_under_load_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    outcome = _run(tmp_path, "rolling-restart", time_s=20.0, seed=5)
    _clean(outcome)
    starts = _applied(outcome, "rolling-restart")
    assert starts and starts[0] == ("n0", "n1", "n2"), starts
    # Every broker was SIGTERMed, exited by itself (status 0: a graceful stop, not a kill) and
    # runs again as a new process.
    restarted: dict[int, list[tuple[int, int]]] = {}
    for line in outcome.nemesis_log:
        if m := _RESTARTED.match(line):
            restarted.setdefault(int(m[1]), []).append((int(m[2]), int(m[3])))
    assert set(restarted) == {0, 1, 2}, outcome.nemesis_log
    for node, pids in restarted.items():
        assert all(old != new for old, new in pids), (node, pids)
    # Each broker handed its leaderships over when told to stop (its log says so).
    for node in range(3):
        log = (Path(outcome.run_dir) / "logs" / f"broker-{node}.log").read_text()
        assert "SIGTERM: handing leaderships over" in log, f"broker {node}'s log: {log[-2000:]}"


@pytest.mark.slow
def test_brokers_decommissioned_under_load_leave_and_new_ones_serve(tmp_path: Path) -> None:
    outcome = _run(tmp_path, "decommission", time_s=25.0, seed=3)
    _clean(outcome)
    starts = _applied(outcome, "decommission")
    assert starts, outcome.nemesis_log
    added = [int(m[1]) for ln in outcome.nemesis_log if (m := _ADDED.match(ln))]
    removed = [(int(m[1]), m[2]) for ln in outcome.nemesis_log if (m := _REMOVED.match(ln))]
    # Each decommission brought a new broker (a spare: ids from 3 on) in and took one of the
    # members before it out; the members stay three.
    assert len(added) == len(removed) == len(starts), outcome.nemesis_log
    members = {0, 1, 2}
    for new, (gone, after) in zip(added, removed, strict=True):
        assert new not in members and gone in members, (new, gone, members)
        members = members - {gone} | {new}
        assert {int(n[1:]) for n in after.split(",")} == members, (after, members)
    # The reads of every member's own replicas at the end: the new brokers serve replicas they
    # caught up on; the removed ones are gone (stopped, holding nothing).
    replica_reads = [ev for ev in read_history(outcome.history) if isinstance(ev.op, ReplicaRead)]
    done = {ev.node for ev in replica_reads if ev.type == "ok"}
    assert done == {f"n{m}" for m in members}, (sorted(done), members)


@pytest.mark.slow
def test_operator_nemeses_among_crashes_and_partitions_on_five_nodes(tmp_path: Path) -> None:
    # Three minutes: rolling restarts and decommissions interleaved with the faults they must
    # live with (a restarted broker gets the members as they are after a decommission; a
    # partition cuts a broker that was brought in).
    outcome = _run(
        tmp_path,
        "rolling-restart",
        nodes=5,
        time_s=180.0,
        seed=17,
        interval_s=5.0,
        more=("decommission", "kill-leader", "partition", "membership"),
    )
    _clean(outcome)
    assert _applied(outcome, "rolling-restart") and _applied(outcome, "decommission"), (
        outcome.nemesis_log
    )
