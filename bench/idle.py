"""Idle benchmark: the CPU a broker of an idle cluster spends, split by thread.

    python -m bench.idle [--quick] [--profile]

Three real brokers on loopback (``LocalCluster`` with MQTT on, each broker run by
``bench._profiled_broker`` as ``bench.write_path`` starts them), a few topics (``PARTITIONS``
partitions over ``TOPICS`` topics, replication factor 3, so every broker leads some groups and
follows others), one MQTT device connected and silent, and nothing else: no writes, no reads.
Once every partition has a leader the run waits ``settle_s`` for elections, registrations and
first catch-ups to quiesce, then reads each broker's CPU per thread (``/proc/PID/task/TID/stat``)
at the start and the end of a ``measure_s`` window.

The event loop is the broker's main thread (its TID is the PID: trio runs there); every other
thread (the pysyncobj controller, trio's worker threads for fsync and file I/O) is "threads".
Each thread is printed with its OS name (``/proc/PID/task/TID/comm``).

With ``--profile``, a further window cProfiles each broker's event loop (SIGUSR1/SIGUSR2 of
``bench._profiled_broker``) and prints the functions that cost the most there, by own time
and by cumulative time, summed over the three brokers: what periodic work an idle broker does.
The profiler slows the loop down, so its window is never the measured one.

Ends with ``RESULT idle_cpu_pct_per_broker=… idle_loop_pct=… idle_threads_pct=…`` (percent of
one core, mean over the brokers) and the machine's steal during the run.
"""

from __future__ import annotations

import argparse
import os
import pstats
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from kafkaesque.client import Client

from ._broker_procs import StealWindow, make_scratch, process_cpu_s
from .write_path import MqttDevice, ProfiledCluster, leader_of

TOPICS = 3
PARTITIONS = 30  # over all topics
_TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Plan:
    settle_s: float  # after every partition has a leader, before measuring
    measure_s: float  # the measured window
    profile_s: float  # the cProfile window (with --profile)


QUICK = Plan(settle_s=6.0, measure_s=15.0, profile_s=6.0)
FULL = Plan(settle_s=15.0, measure_s=60.0, profile_s=20.0)


def thread_cpu_s(pid: int) -> dict[int, tuple[str, float]]:
    """``{tid: (OS thread name, user + system CPU seconds so far)}`` of every thread of ``pid``
    alive now (a thread that ended meanwhile is left out; its time stays in the process's)."""
    threads: dict[int, tuple[str, float]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return threads
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        threads[int(tid)] = (name, (int(fields[11]) + int(fields[12])) / _TICK)
    return threads


@dataclass(frozen=True)
class BrokerIdle:
    """Percent of one core a broker used in the window: all of it, its event loop, the rest."""

    total: float
    loop: float
    threads: dict[str, float]  # "name (tid)" -> percent, for every other thread that ran

    @property
    def others(self) -> float:
        return self.total - self.loop


def measure(pids: list[int], seconds: float) -> list[BrokerIdle]:
    """Each broker's CPU over ``seconds``, split by thread. A thread that ended within the
    window counts in the total (the process's own figure) and in ``others``."""
    before = [(process_cpu_s(p), thread_cpu_s(p)) for p in pids]
    began = time.monotonic()
    time.sleep(seconds)
    after = [(process_cpu_s(p), thread_cpu_s(p)) for p in pids]
    span = time.monotonic() - began
    out = []
    for pid, (total0, threads0), (total1, threads1) in zip(pids, before, after, strict=True):
        loop = 0.0
        others: dict[str, float] = {}
        for tid, (name, cpu1) in threads1.items():
            cpu0 = threads0.get(tid, (name, 0.0))[1]
            pct = 100 * (cpu1 - cpu0) / span
            if tid == pid:
                loop = pct
            elif pct > 0:
                others[f"{name} ({tid})"] = pct
        out.append(BrokerIdle(100 * (total1 - total0) / span, loop, others))
    return out


def profile(cluster: ProfiledCluster, seconds: float, top: int = 25) -> list[str]:
    """The costliest functions of the brokers' event loops over ``seconds`` of idleness."""
    stats_files = [cluster.stats_dir / f"broker-{i}.prof" for i in range(cluster.n)]
    cluster.profile_calls(lambda: time.sleep(seconds))
    stats = pstats.Stats(*(str(p) for p in stats_files))
    lines = [
        f"cProfile of the 3 event loops over {cluster.window_s:.1f} s idle "
        f"({int(stats.total_calls):,} calls, {int(stats.total_calls) / cluster.window_s / 3:,.0f}"  # type: ignore[attr-defined]
        " a second per broker):"
    ]
    rows = stats.stats  # type: ignore[attr-defined]  # {(file, line, name): (cc, nc, tt, ct, callers)}
    views = (
        ("own time", 2, ""),
        ("cumulative time", 3, ""),
        ("cumulative time, Kafkaesque's own functions", 3, "kafkaesque"),
    )
    for title, key, within in views:
        lines.append(f"  by {title} (calls/s per broker, ms/s per broker):")
        mine = [kv for kv in rows.items() if within in kv[0][0]]
        ranked = sorted(mine, key=lambda kv: kv[1][key], reverse=True)[:top]
        for (path, line, name), row in ranked:
            where = "/".join(Path(path).parts[-2:]) if path != "~" else ""
            per_s = cluster.window_s * cluster.n
            lines.append(
                f"    {row[1] / per_s:8.0f} {1000 * row[key] / per_s:7.2f}  {name} {where}:{line}"
            )
    return lines


def run(root: Path, plan: Plan, with_profile: bool) -> int:
    steal = StealWindow()
    stats_dir = root / "stats"
    stats_dir.mkdir()
    with (
        ProfiledCluster(str(root / "cluster"), stats_dir) as cluster,
        Client(cluster.bootstrap) as client,
    ):
        per_topic = PARTITIONS // TOPICS
        for t in range(TOPICS):
            client.create_topic(f"idle-{t}", per_topic, cluster.n)
        client.create_topic("wp-mqtt", 1, cluster.n)  # the MQTT rules' target
        for t in range(TOPICS):
            for p in range(per_topic):
                leader_of(client, f"idle-{t}", p)
        device = MqttDevice(cluster.mqtt_address(0), "idle-device")
        try:
            print(
                f"cluster: {cluster.n} brokers with MQTT, {PARTITIONS + 1} partitions "
                f"(RF {cluster.n}), one silent MQTT device; settling {plan.settle_s:g} s"
            )
            time.sleep(plan.settle_s)
            pids = [cluster.procs[i].pid for i in range(cluster.n)]
            brokers = measure(pids, plan.measure_s)
            print(f"idle CPU over {plan.measure_s:g} s, percent of one core:")
            for i, b in enumerate(brokers):
                rest = ", ".join(f"{k} {v:.2f}" for k, v in sorted(b.threads.items()))
                print(
                    f"  broker {i}: {b.total:.2f} (event loop {b.loop:.2f}, "
                    f"other threads {b.others:.2f}: {rest or 'none ran'})"
                )
            if with_profile:
                for line in profile(cluster, plan.profile_s):
                    print(line)
        finally:
            device.close()
    n = len(brokers)
    total = sum(b.total for b in brokers) / n
    loop = sum(b.loop for b in brokers) / n
    print(steal)
    print(
        f"RESULT idle_cpu_pct_per_broker={total:.2f} idle_loop_pct={loop:.2f} "
        f"idle_threads_pct={total - loop:.2f} steal_pct={steal.percent():.1f}"
    )
    return 0


def _stop(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds: the brokers are stopped, the scratch dir removed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.idle",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="a shorter run (under 60 s)")
    parser.add_argument(
        "--profile", action="store_true", help="also cProfile the idle event loops afterwards"
    )
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _stop)
    root = make_scratch()
    try:
        return run(root, QUICK if args.quick else FULL, args.profile)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
