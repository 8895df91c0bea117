"""Three Raft node processes on loopback: kill -9 the leader, and a new one commits quickly.

Each node is its own OS process (``bench._raft_node``); the victim gets SIGKILL, so nothing is
flushed or closed on its way out.
"""

from __future__ import annotations

import time
from pathlib import Path

from bench._raft_cluster import RaftCluster

ELECTION_TIMEOUT_TICKS = 20  # the upper end of the randomized election timeout


def test_kill_9_of_the_leader_process_and_a_new_leader_commits(tmp_path: Path) -> None:
    with RaftCluster(tmp_path, nodes=3, groups=3) as cluster:
        committed = [cluster.propose("g0", f"v{i}") for i in range(20)]
        assert committed == sorted(committed)
        victim = cluster.leader("g0")
        time.sleep(0.3)  # idle long enough to quiesce: detection must not depend on heartbeats
        cluster.kill(victim)
        survivors = cluster.alive()
        # Counted in a survivor's Raft ticks, not seconds (a shared machine delays ticks);
        # seconds are for bench.raft.
        before = cluster.request(survivors[0], {"op": "status"})["ticks"]
        cluster.propose("g0", "after-kill")
        elapsed = cluster.request(survivors[0], {"op": "status"})["ticks"] - before
        assert elapsed <= 2 * ELECTION_TIMEOUT_TICKS, f"failover took {elapsed} ticks"
        deadline = time.monotonic() + 5
        want = [f"v{i}" for i in range(20)] + ["after-kill"]
        while time.monotonic() < deadline:
            if all(
                cluster.request(i, {"op": "read", "group": "g0"})["values"] == want
                for i in survivors
            ):
                break
            time.sleep(0.05)
        for i in survivors:
            assert cluster.request(i, {"op": "read", "group": "g0"})["values"] == want
        # The killed node comes back, recovers its log and catches up.
        cluster.start(victim)
        deadline = time.monotonic() + 10
        while cluster.request(victim, {"op": "read", "group": "g0"})["values"] != want:
            assert time.monotonic() < deadline, "the restarted node did not catch up"
            time.sleep(0.05)
