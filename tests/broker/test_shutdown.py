"""Graceful shutdown (issue 26): a broker asked to stop hands its leaderships over first.

In one process: ``hand_over_groups`` moves every group a driver leads to another voter through
TimeoutNow, within a few ticks (no election timeout), and loses nothing committed. With real
processes: a SIGTERMed broker's partitions have other leaders by the time it has exited, and
it says what it handed over.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import trio

from kafkaesque.broker._shutdown import HandOver, hand_over_groups, successor
from kafkaesque.local_cluster import LocalCluster, free_ports
from kafkaesque.protocol import MessageRow, PartitionRow
from kafkaesque.raft import Configuration, ProgressInfo, ProgressState, Role, Status
from kafkaesque.raft.driver import MultiRaft
from kafkaesque.storage import Record, build_batch

from ..raft.test_driver import GROUPS, Broker, _propose_until_committed
from .line_client import LineClient

ELECTION_TICK = 10  # RaftConfig's default: the shortest election timeout, in ticks


def _status(me: int, progress: dict[int, tuple[int, bool]], voters: set[int]) -> Status:
    infos = {
        node: ProgressInfo(match, match + 1, ProgressState.REPLICATE, active, False, 0)
        for node, (match, active) in progress.items()
    }
    return Status(
        me, 3, me, Role.LEADER, me, 10, 10, 0, 10, Configuration(frozenset(voters)), None, infos
    )


def test_the_successor_is_the_reachable_active_voter_with_the_longest_log() -> None:
    status = _status(0, {0: (10, True), 1: (7, True), 2: (10, True), 3: (10, True)}, {0, 1, 2})
    assert successor(status, {1, 2, 3}) == 2  # 3 is not a voter (a learner's progress)
    assert successor(status, {1}) == 1  # 2 unreachable: 1 is caught up first
    quiet = _status(0, {0: (10, True), 1: (10, False), 2: (9, True)}, {0, 1, 2})
    assert successor(quiet, {1, 2}) == 2  # 1 was not heard from lately
    tie = _status(0, {0: (10, True), 1: (10, True), 2: (10, True)}, {0, 1, 2})
    assert successor(tie, {1, 2}) == 1  # reproducible: the lowest id
    assert successor(tie, set()) is None
    assert successor(_status(0, {0: (10, True)}, {0}), {1, 2}) is None


def test_a_hand_over_says_what_moved_and_what_was_left() -> None:
    report = HandOver(led=3, left=("t/1",), controller=True, seconds=0.0412)
    assert report.moved == 2
    assert report.describe() == (
        "handed over 2 of 3 partition leaderships (1 left to an election: t/1); "
        "controller leadership handed over in 0.04 s"
    )
    assert (
        HandOver(0, (), None, 0.0).describe()
        == "handed over 0 of 0 partition leaderships in 0.00 s"
    )


async def test_a_leader_hands_every_group_over_within_a_few_ticks(tmp_path: Path) -> None:
    ports = free_ports(3)
    peers = {i: ("127.0.0.1", ports[i]) for i in range(3)}
    brokers = [Broker(i, tmp_path, peers) for i in range(3)]
    alive = {0, 1, 2}
    async with trio.open_nursery() as nursery:
        for b in brokers:
            nursery.start_soon(b.run)
        for g in GROUPS:
            for i in range(3):
                await _propose_until_committed(brokers, g, alive, b"%s-%d" % (g.encode(), i))

        # The broker that leads the most groups hands them over.
        def led(b: Broker) -> list[str]:
            return [g for g in GROUPS if b.raft.replicas[g].role is Role.LEADER]

        victim = max(brokers, key=lambda b: len(led(b)))
        had = led(victim)
        assert had
        ticks = victim.raft.ticks
        with trio.fail_after(10):
            count, left = await hand_over_groups(
                victim.raft, victim.transport.connected_peers, trio.current_time() + 8
            )
        elapsed = victim.raft.ticks - ticks
        print(f"handed over {count} groups in {elapsed} ticks")
        assert (count, left) == (len(had), ())
        # TimeoutNow: the successor stands at once, nobody waits for an election timeout.
        assert elapsed < ELECTION_TICK, f"the hand-over took {elapsed} ticks"
        others = [b for b in brokers if b is not victim]
        for g in had:
            assert victim.raft.replicas[g].role is not Role.LEADER
            assert victim.raft.replicas[g].leader in {b.id for b in others}
        # Nothing committed was lost, and the new leaders take writes.
        for g in had:
            await _propose_until_committed(brokers, g, alive, b"after")
        want = {g: [b"%s-%d" % (g.encode(), i) for i in range(3)] + [b"after"] for g in had}
        with trio.fail_after(5):
            while any(b.committed_values(g) != want[g] for b in brokers for g in had):
                await trio.sleep(0.02)
        nursery.cancel_scope.cancel()
    for b in brokers:
        b.raft.close()


async def test_a_group_without_another_voter_is_left_at_once(tmp_path: Path) -> None:
    raft = MultiRaft(0, lambda peer, item: True, state_dir=str(tmp_path / "state"))
    raft.add_replica("solo/0", str(tmp_path / "solo-0"), [0])
    async with trio.open_nursery() as nursery:
        await nursery.start(raft.run)
        with trio.fail_after(5):
            while raft.replicas["solo/0"].role is not Role.LEADER:
                await trio.sleep(0.01)
            await raft.propose("solo/0", build_batch([Record(value=b"x")]), 1)
            # Not waited for until the deadline: nobody could take it.
            count, left = await hand_over_groups(raft, set, trio.current_time() + 60)
        assert (count, left) == (1, ("solo/0",))
        nursery.cancel_scope.cancel()
    raft.close()


# -- real processes -----------------------------------------------------------------------------


def _leaders(cluster: LocalCluster, via: int, topic: str) -> dict[int, int | None]:
    with LineClient(cluster.client_address(via)) as c:
        rows = c.rows(f"METADATA {topic}")
    return {r.partition: r.leader for r in rows if isinstance(r, PartitionRow)}


def test_a_sigtermed_broker_hands_its_partitions_over_before_it_exits(tmp_path: Path) -> None:
    with LocalCluster(str(tmp_path), 3) as cluster:
        with LineClient(cluster.client_address(0)) as c:
            c.ok("CREATE handed 6 3")
            for p in range(6):
                c.ok(f"PUB handed partition={p} before-{p}")
        deadline = time.monotonic() + 30
        while None in (leaders := _leaders(cluster, 0, "handed")).values():
            assert time.monotonic() < deadline, f"no leader for every partition: {leaders}"
            time.sleep(0.05)
        counts = {b: sum(1 for v in leaders.values() if v == b) for b in range(3)}
        victim = max(counts, key=lambda b: counts[b])
        witness = (victim + 1) % 3
        proc = cluster.procs[victim]
        stopping = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        moved_after = None
        while proc.poll() is None and time.monotonic() - stopping < 15:
            now = _leaders(cluster, witness, "handed")
            if moved_after is None and all(v not in (None, victim) for v in now.values()):
                moved_after = time.monotonic() - stopping
            time.sleep(0.01)
        assert proc.wait(15) == 0  # a graceful stop
        # Right after it exited, every partition already has a leader among the survivors (a
        # killed leader would still be named by them until an election timeout has passed).
        after = _leaders(cluster, witness, "handed")
        assert all(v not in (None, victim) for v in after.values()), after
        print(f"broker {victim} led {counts[victim]}: all moved {moved_after} s after SIGTERM")
        with open(cluster.log_path(victim)) as f:
            log = f.read()
        # It counts every group it led (the internal topics' too): all were handed over.
        said = re.search(rf"broker {victim}: handed over (\d+) of (\d+) partition", log)
        assert said is not None, log[-2000:]
        moved, led = map(int, said.groups())
        assert moved == led >= counts[victim], said.group(0)
        # Nothing acknowledged was lost, and the partitions take writes.
        with LineClient(cluster.client_address(witness)) as c:
            for p in range(6):
                c.ok(f"PUB handed partition={p} after-{p}")
                rows = c.rows(f"FETCH handed {p} 0 format=text")
                values = [r.value for r in rows if isinstance(r, MessageRow)]
                assert b"before-%d" % p in values and b"after-%d" % p in values


def _most_leaders(cluster: LocalCluster, via: int, topic: str) -> int:
    """The broker leading the most partitions of ``topic`` once each has a leader."""
    deadline = time.monotonic() + 30
    while None in (leaders := _leaders(cluster, via, topic)).values():
        assert time.monotonic() < deadline, f"no leader for every partition: {leaders}"
        time.sleep(0.05)
    return max(range(cluster.n), key=lambda b: sum(1 for v in leaders.values() if v == b))


def test_a_hand_over_nobody_can_take_ends_by_itself_or_at_a_second_signal(
    tmp_path: Path,
) -> None:
    with LocalCluster(str(tmp_path), 3, extra_args=["--shutdown-timeout", "60"]) as cluster:
        with LineClient(cluster.client_address(0)) as c:
            c.ok("CREATE held 3 3")
            for p in range(3):
                c.ok(f"PUB held partition={p} x")
        # Nobody can take the victim's leaderships while the others are paused: its hand-over
        # waits a second for them, then gives up; SIGINT during it stops it at once.
        victim = _most_leaders(cluster, 0, "held")
        others = [b for b in range(3) if b != victim]
        for b in others:
            cluster.pause(b)
        try:
            proc = cluster.procs[victim]
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.2)
            assert proc.poll() is None  # still handing over
            proc.send_signal(signal.SIGINT)
            assert proc.wait(10) == 0
        finally:
            for b in others:
                cluster.resume(b)
        with open(cluster.log_path(victim)) as f:
            assert "stopping at once (a second signal)" in f.read()

        # Without a second signal, it gives up on its own, long before its 60 s timeout.
        cluster.start(victim)
        cluster.wait_ready()
        victim = _most_leaders(cluster, others[0], "held")
        others = [b for b in range(3) if b != victim]
        for b in others:
            cluster.pause(b)
        try:
            proc = cluster.procs[victim]
            stopping = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
            print(f"gave up after {time.monotonic() - stopping:.2f} s")
        finally:
            for b in others:
                cluster.resume(b)
        with open(cluster.log_path(victim)) as f:
            said = re.findall(
                r"handed over (\d+) of (\d+) partition leaderships \((\d+) left", f.read()
            )
        assert said and int(said[-1][1]) >= 1 and said[-1][0] == "0", said


def test_a_broker_with_nobody_to_hand_over_to_stops_at_once(tmp_path: Path) -> None:
    # One broker: its groups have no other voter and its controller no other member. Its
    # hand-over ends at once instead of waiting for its --shutdown-timeout (60 s here).
    with LocalCluster(str(tmp_path), 1, extra_args=["--shutdown-timeout", "60"]) as cluster:
        with LineClient(cluster.client_address(0)) as c:
            c.ok("CREATE solo 2 1")
            c.ok("PUB solo partition=0 x")
        proc = cluster.procs[0]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        with open(cluster.log_path(0)) as f:
            said = re.search(r"handed over 0 of (\d+) partition leaderships \((\d+) left", f.read())
        assert said is not None and said.group(1) == said.group(2) and int(said.group(1)) >= 2


def _kafkaesque(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kafkaesque.cli", *args],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def test_broker_stop_finds_the_broker_by_its_pid_file_and_stops_it_gracefully(
    tmp_path: Path,
) -> None:
    with LocalCluster(str(tmp_path), 1) as cluster:
        pid_file = tmp_path / "0" / "broker.pid"
        pid = cluster.procs[0].pid
        assert pid_file.read_text().strip() == str(pid)
        stopped = _kafkaesque("broker", "stop", "--data-dir", str(tmp_path), "--id", "0")
        assert stopped.returncode == 0, stopped.stderr
        assert stopped.stdout.startswith(f"broker 0 (pid {pid}) stopped in ")
        assert cluster.procs[0].wait(5) == 0
        assert not pid_file.exists()
        with open(cluster.log_path(0)) as f:
            assert "broker 0: SIGTERM: handing leaderships over" in f.read()
        again = _kafkaesque("broker", "stop", "--data-dir", str(tmp_path), "--id", "0")
        assert again.returncode == 1
        assert again.stderr.strip() == (
            f"kafkaesque broker: no broker 0 runs on {tmp_path} (no {pid_file})"
        )
        # A pid file left behind by a killed broker may name another process since: it is
        # not signalled.
        other = subprocess.Popen(["sleep", "30"])
        try:
            pid_file.write_text(f"{other.pid}\n")
            stale = _kafkaesque("broker", "stop", "--data-dir", str(tmp_path), "--id", "0")
            assert stale.returncode == 1
            assert f"broker 0 (pid {other.pid}, from {pid_file}) is not running" in stale.stderr
            assert other.poll() is None
        finally:
            other.kill()
            other.wait()
        bare = _kafkaesque("broker", "stop")
        assert bare.returncode == 1
        assert "broker stop needs --data-dir and --id (or --config)" in bare.stderr
