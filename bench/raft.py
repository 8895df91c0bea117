"""Raft benchmark: 3 node processes on loopback, against pysyncobj measured in the same run.

    python -m bench.raft [--quick]

* throughput: committed batches/s and MB/s (record payload) for 1 and 12 partitions, 100-byte
  records in batches of 100 and 1,000. Each leader keeps a window of proposals in flight;
  committed means replicated to a majority and fsynced there (the default fsync policy).
* the same batches through pysyncobj (3 processes, one command per batch) as the peer baseline;
  ``ratio_vs_pysyncobj`` is the smaller of the two per-batch-size ratios (1 partition). Records
  are random bytes on both sides: pysyncobj zlib-compresses what it sends, so repeated bytes
  (``b"x" * 100``) would measure its compressor, not its replication.
* idle CPU: 3 brokers hosting 1,000 partitions (replication factor 3), no traffic, once
  elections settled: percent of one core per broker (quiescence and coalescing at work).
* failover: SIGKILL the leader of a partition, then time until the next write commits through a
  survivor (a client retrying every 10 ms); the victim is restarted between trials.
* pause failover: the same with SIGSTOP (issue 23): the paused leader's connections stay open and
  nothing closes, so the survivors only see its pings stop; SIGCONT between trials.

Ends with ``RESULT mb_per_s_1p=… mb_per_s_12p=… ratio_vs_pysyncobj=… idle_cpu_pct_1000=…
failover_p50_s=… failover_p99_s=… pause_failover_p50_s=… pause_failover_p99_s=…`` (MB/s
figures are for batches of 1,000 records).
"""

from __future__ import annotations

import argparse
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from ._raft_cluster import RaftCluster

RECORD_BYTES = 100
MB = 1_000_000
# Batches in flight, spread over the partitions under load: a batching producer keeps many.
WINDOW = 256


def _wait_for_leaders(cluster: RaftCluster, groups: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        led: set[str] = set()
        for i in cluster.alive():
            roles = cluster.request(i, {"op": "status"}, timeout=10)["role"]
            led |= {g for g, r in roles.items() if r == "leader"}
        if len(led) == groups:
            return
        time.sleep(0.1)
    raise TimeoutError("not every group elected a leader")


def _load(cluster: RaftCluster, seconds: float, records: int, only_g0: bool) -> tuple[float, float]:
    """Run the load on every node at once; return committed (batches/s, MB/s)."""
    results: list[dict[str, Any]] = []
    req = {
        "op": "load",
        "seconds": seconds,
        "records": records,
        "size": RECORD_BYTES,
        "window": max(8, WINDOW // (1 if only_g0 else cluster.groups)),
    }
    if only_g0:
        leader = cluster.leader("g0")
        req["only"] = "g0"
        targets = [leader]
    else:
        targets = cluster.alive()

    def run(i: int) -> None:
        results.append(cluster.request(i, req, timeout=seconds + 30))

    threads = [threading.Thread(target=run, args=(i,)) for i in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    batches = sum(r["batches"] for r in results)
    payload = sum(r["bytes"] for r in results)
    return batches / seconds, payload / seconds / MB


def _throughput(root: Path, seconds: float) -> dict[tuple[int, int], tuple[float, float]]:
    out = {}
    with RaftCluster(root / "tput", nodes=3, groups=12) as cluster:
        _wait_for_leaders(cluster, 12)
        for partitions in (1, 12):
            for records in (100, 1000):
                out[partitions, records] = _load(cluster, seconds, records, partitions == 1)
                bps, mbps = out[partitions, records]
                print(
                    f"  {partitions:2d} partition(s), batches of {records:4d}: "
                    f"{bps:9,.0f} batches/s  {mbps:7.1f} MB/s"
                )
    return out


def _idle_cpu(root: Path, partitions: int, seconds: float) -> float:
    with RaftCluster(root / "idle", nodes=3, groups=partitions) as cluster:
        _wait_for_leaders(cluster, partitions, timeout=120)
        deadline = time.monotonic() + 60  # settled: every group on every broker quiesced
        while time.monotonic() < deadline and any(
            cluster.request(i, {"op": "status"}, timeout=30)["quiesced"] < partitions
            for i in cluster.alive()
        ):
            time.sleep(0.2)
        before = {i: cluster.cpu_seconds(i) for i in cluster.alive()}
        time.sleep(seconds)
        used = {i: cluster.cpu_seconds(i) - before[i] for i in cluster.alive()}
    pct = [100 * u / seconds for u in used.values()]
    print(
        f"  {partitions} partitions, 3 brokers, idle: "
        + ", ".join(f"{p:.1f}%" for p in pct)
        + " of one core per broker"
    )
    return max(pct)


def _failover(root: Path, trials: int) -> list[float]:
    times = []
    with RaftCluster(root / "failover", nodes=3, groups=1) as cluster:
        for trial in range(trials):
            cluster.propose("g0", f"warm-{trial}", timeout=30)
            victim = cluster.leader("g0")
            time.sleep(0.3)  # idle, so the group is quiesced: the harder case
            cluster.kill(victim)
            killed = time.monotonic()
            cluster.propose("g0", f"after-{trial}", timeout=30)
            times.append(time.monotonic() - killed)
            cluster.start(victim)
            time.sleep(0.5)
    print(
        f"  kill -9 of the leader to the next commit, {trials} trials: "
        + ", ".join(f"{t:.2f}" for t in times)
        + " s"
    )
    return times


def _propose_avoiding(cluster: RaftCluster, paused: int, group: str, value: str) -> None:
    """``RaftCluster.propose``, asking only the nodes that run: a paused node accepts the
    control connection (its kernel does) and never answers, which would stall every round."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for i in cluster.alive():
            if i == paused:
                continue
            try:
                reply = cluster.request(i, {"op": "propose", "group": group, "value": value}, 5)
            except OSError:
                continue
            if reply.get("ok"):
                return
        time.sleep(0.01)
    raise TimeoutError(f"could not commit {value!r} to {group} while node {paused} was paused")


def _pause_failover(root: Path, trials: int) -> list[float]:
    times = []
    with RaftCluster(root / "pause", nodes=3, groups=1) as cluster:
        for trial in range(trials):
            cluster.propose("g0", f"warm-{trial}", timeout=30)
            victim = cluster.leader("g0")
            time.sleep(0.3)  # idle, so the group is quiesced: the case of issue 23
            proc = cluster.procs[victim]
            proc.send_signal(signal.SIGSTOP)
            paused = time.monotonic()
            try:
                _propose_avoiding(cluster, victim, "g0", f"after-{trial}")
                times.append(time.monotonic() - paused)
            finally:
                proc.send_signal(signal.SIGCONT)
            time.sleep(1.0)  # resumed: it steps down and catches up before the next trial
    print(
        f"  SIGSTOP of the leader to the next commit, {trials} trials: "
        + ", ".join(f"{t:.2f}" for t in times)
        + " s"
    )
    return times


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.raft", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a shorter run (under 60 s)")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="kq-bench-raft-"))
    try:
        seconds = 1.5 if args.quick else 10.0
        started = time.monotonic()
        print("throughput (3 nodes, replication factor 3, fsync group commit):")
        ours = _throughput(root, seconds)
        from ._pysyncobj_baseline import measure as pysyncobj_measure

        print(f"  [{time.monotonic() - started:.0f} s]")
        print("pysyncobj (3 processes, one command per batch; it never fsyncs):")
        theirs = {}
        for records in (100, 1000):
            theirs[records] = pysyncobj_measure(
                records, seconds * 1.5, payload="random", use_batch=True if args.quick else None
            )
            print(
                f"   1 partition,    batches of {records:4d}: "
                f"{theirs[records][0]:9,.0f} batches/s  {theirs[records][1]:7.1f} MB/s"
            )
        ratios = {r: ours[1, r][1] / theirs[r][1] for r in (100, 1000) if theirs[r][1] > 0}
        ratio = min(ratios.values()) if ratios else float("nan")
        print(
            "  ratio (ours / pysyncobj, 1 partition): "
            + ", ".join(f"batches of {r}: {x:.1f}x" for r, x in ratios.items())
            + "  (target >= 10x)"
        )
        print(f"  [{time.monotonic() - started:.0f} s]")
        print("idle CPU:")
        idle = _idle_cpu(root, 1000, 3.0 if args.quick else 15.0)
        print(f"  [{time.monotonic() - started:.0f} s]")
        print("failover:")
        times = _failover(root, 4 if args.quick else 30)
        p50, p99 = _pct(times, 0.5), _pct(times, 0.99)
        print(f"  p50 {p50:.2f} s, p99 {p99:.2f} s (targets: < 1 s, < 1.5 s)")
        print("pause failover:")
        paused = _pause_failover(root, 4 if args.quick else 20)
        pause_p50, pause_p99 = _pct(paused, 0.5), _pct(paused, 0.99)
        print(f"  p50 {pause_p50:.2f} s, p99 {pause_p99:.2f} s (two election timeouts: 1 s)")
        print(
            f"RESULT mb_per_s_1p={ours[1, 1000][1]:.1f} mb_per_s_12p={ours[12, 1000][1]:.1f} "
            f"ratio_vs_pysyncobj={ratio:.1f} idle_cpu_pct_1000={idle:.1f} "
            f"failover_p50_s={p50:.2f} failover_p99_s={p99:.2f} "
            f"pause_failover_p50_s={pause_p50:.2f} pause_failover_p99_s={pause_p99:.2f} "
            f"batches_per_s_1p_100={ours[1, 100][0]:.0f} "
            f"batches_per_s_12p_100={ours[12, 100][0]:.0f}"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
