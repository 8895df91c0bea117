"""Memory per MQTT connection, where it goes and on which broker (issue 38, point 1).

    python -m bench.conn_memory [--quick] [--devices N]

``N`` idle devices (``kafkaesque devices``' own: persistent session, one QoS 1 subscription to
``phones/<device>/commands``, as ``bench.fleet``'s, but publishing nothing) connect, all to broker
0 of a 3-broker cluster (RF 3, ``bench.fleet``'s rules and topics). Broker 0 holds the
connections; brokers 1 and 2 hold only their copy of the session table (``__mqtt_sessions``,
which every broker follows) and of its log. Measured, in the same run:

1. **Floors**: a bare trio server (``bench._bare_trio_server``) holding ``N`` idle TCP
   connections, with one task per connection (``task``), with a reader, a writer, a nursery
   and an event per connection (``pair``, the shape of an ``MqttDevice``), and with no task per
   connection at all, every socket parked in one ``epoll`` set (``parked``): the RSS growth over
   ``N``: what the current design costs before any MQTT state, and what one that parks idle
   devices would.
2. **mosquitto** holding the same ``N`` devices: its RSS growth over ``N``.
3. **The cluster**: each broker's RSS growth over ``N``; then, with the brokers tracing their
   allocations (they run under ``bench._traced_broker``; tracemalloc slows a broker down ten
   times, too much to trace the whole fleet's connecting), ``M`` more devices connect, and the
   traced allocations still alive are shown per connection, grouped by the line of the broker's
   own code that made them (the innermost ``kafkaesque`` frame of the traceback) and by the line
   that allocated; with the objects the garbage collector tracks, by type, per connection.

Ends with ``RESULT devices=… kib_per_conn=… owner_kib_per_conn=… other_kib_per_conn=…
traced_owner_kib_per_conn=… traced_other_kib_per_conn=… bare_task_kib_per_conn=…
bare_pair_kib_per_conn=… bare_parked_kib_per_conn=… mosquitto_kib_per_conn=…
kib_per_conn_vs_mosquitto=…``:
``kib_per_conn`` is all three brokers' RSS growth over ``N``, as ``bench.fleet`` counts it (but
idle: ``bench.fleet`` measures it after its minute of traffic).
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import socket
import subprocess
import sys
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kafkaesque.cli.devices_core import DeviceConfig
from kafkaesque.cli.devices_fleet import Fleet, FleetSpec

from kafkaesque.client import Client
from kafkaesque.local_cluster import LocalCluster

from ._broker_procs import make_scratch
from ._mqtt_procs import Mosquitto, open_files, rss_kib
from .fleet import BROKERS, COMMANDS_PARTITIONS, READINGS_PARTITIONS, RULES, raise_open_files

SETTLE_S = 3.0  # after the last device connected: session writes replicated and applied
TOP = 12  # rows of each breakdown


@dataclass(frozen=True)
class Plan:
    devices: int
    processes: int  # load generator processes
    traced: int  # devices connected while the brokers trace their allocations


QUICK = Plan(devices=1_000, processes=1, traced=50)
FULL = Plan(devices=10_000, processes=2, traced=300)


class TracedCluster(LocalCluster):
    """A ``LocalCluster`` whose brokers run under ``bench._traced_broker``."""

    def __init__(self, data_dir: str, snapshots: Path) -> None:
        super().__init__(data_dir, BROKERS, mqtt=True, mqtt_rules=RULES)
        self.snapshots = snapshots

    def program(self, broker: int) -> list[str]:
        return [sys.executable, "-m", "bench._traced_broker", str(self.snapshot_file(broker))]

    def snapshot_file(self, broker: int) -> Path:
        return self.snapshots / f"broker-{broker}.snapshot"

    def start_tracing(self) -> None:
        for i in range(self.n):
            self.procs[i].send_signal(signal.SIGUSR1)
        for i in range(self.n):  # the handler ran: its type counts are written
            _wait_for(Path(f"{self.snapshot_file(i)}.types0"))

    def snapshots_now(self) -> list[tuple[tracemalloc.Snapshot, int, dict[str, list[int]]]]:
        """Each broker's snapshot, tracemalloc's own bytes and the type counts before/after."""
        for i in range(self.n):
            self.procs[i].send_signal(signal.SIGUSR2)
        out = []
        for i in range(self.n):
            path = self.snapshot_file(i)
            _wait_for(path)
            before = json.loads(Path(f"{path}.types0").read_text())
            after = json.loads(Path(f"{path}.types1").read_text())
            types = {
                kind: [row[0] - before.get(kind, [0, 0])[0], row[1] - before.get(kind, [0, 0])[1]]
                for kind, row in after.items()
            }
            overhead = int(Path(f"{path}.overhead").read_text())
            out.append((tracemalloc.Snapshot.load(str(path)), overhead, types))
        return out


def _wait_for(path: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path} was not written within {timeout:.0f} s")
        time.sleep(0.05)


def _spec(address: tuple[str, int], devices: int, first: int) -> FleetSpec:
    return FleetSpec(
        addresses=(address,),
        devices=devices,
        first_device=first,
        config=DeviceConfig(run="connmem", clean=False, keep_alive=300),
        interval=None,
        duration=1.0,
        connect_timeout=60.0,
        max_connecting=100,
    )


def floor_kib(mode: str, devices: int) -> float:
    """RSS growth per idle connection of ``bench._bare_trio_server MODE``."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench._bare_trio_server", mode],
        stdout=subprocess.PIPE,
        text=True,
    )
    socks: list[socket.socket] = []
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        time.sleep(0.2)
        files, before = open_files(proc.pid), rss_kib(proc.pid)
        for _ in range(devices):
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        deadline = time.monotonic() + 30
        while open_files(proc.pid) < files + devices and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # every handler task started and is waiting
        return (rss_kib(proc.pid) - before) / devices
    finally:
        for s in socks:
            s.close()
        proc.kill()
        proc.wait()


def mosquitto_kib(root: Path, plan: Plan) -> float:
    with Mosquitto(root / "mosquitto") as mosquitto:
        pid = mosquitto.proc.pid
        before = rss_kib(pid)
        with Fleet(_spec(mosquitto.address, plan.devices, 0), plan.processes) as fleet:
            ready = fleet.wait_ready()
            time.sleep(1.0)
            after = rss_kib(pid)
    return float((after - before) / max(ready.connected, 1))


def _own_frame(trace: tracemalloc.Traceback) -> str:
    """The innermost frame of the broker's own code (else the outermost frame) as file:line."""
    for frame in reversed(trace):  # tracemalloc orders them oldest first
        if "/kafkaesque/" in frame.filename:
            return f"{frame.filename.split('/kafkaesque/', 1)[1]}:{frame.lineno}"
    frame = trace[0]
    return f"{Path(frame.filename).name}:{frame.lineno}"


def _allocator(trace: tracemalloc.Traceback) -> str:
    frame = trace[-1]
    name = frame.filename
    for marker in ("/kafkaesque/", "/site-packages/", "/lib/python3"):
        if marker in name:
            name = name.split(marker, 1)[1]
            break
    return f"{name}:{frame.lineno}"


def breakdown(snapshot: tracemalloc.Snapshot, devices: int) -> tuple[float, list[str]]:
    """Traced KiB per connection, and the top rows by own line and by allocating line."""
    by_own: Counter[str] = Counter()
    by_alloc: Counter[str] = Counter()
    total = 0
    for stat in snapshot.statistics("traceback"):
        by_own[_own_frame(stat.traceback)] += stat.size
        by_alloc[_allocator(stat.traceback)] += stat.size
        total += stat.size
    rows = ["  by the broker's line that allocated (innermost kafkaesque frame):"]
    rows += [
        f"    {size / 1024 / devices:6.2f} KiB  {key}" for key, size in by_own.most_common(TOP)
    ]
    rows.append("  by the allocating line:")
    rows += [
        f"    {size / 1024 / devices:6.2f} KiB  {key}" for key, size in by_alloc.most_common(TOP)
    ]
    return total / 1024 / devices, rows


def type_rows(types: dict[str, list[int]], devices: int) -> list[str]:
    rows = sorted(types.items(), key=lambda item: -item[1][1])[:TOP]
    return ["  gc-tracked objects per connection (count, getsizeof KiB):"] + [
        f"    {count / devices:6.2f}  {size / 1024 / devices:6.2f} KiB  {kind}"
        for kind, (count, size) in rows
    ]


def cluster_phase(root: Path, plan: Plan, log: Callable[[str], None]) -> dict[str, object]:
    """RSS growth per broker with ``plan.devices`` devices, then (tracing) with ``plan.traced``
    more: tracemalloc slows a broker down too much to trace the whole fleet's connecting."""
    snapshots_dir = root / "snapshots"
    snapshots_dir.mkdir(parents=True)
    with TracedCluster(str(root / "cluster"), snapshots_dir) as cluster:
        with Client(cluster.bootstrap) as client:
            client.create_topic("readings", READINGS_PARTITIONS, BROKERS)
            client.create_topic("commands", COMMANDS_PARTITIONS, BROKERS)
        pids = [cluster.procs[i].pid for i in range(BROKERS)]
        address = cluster.mqtt_addresses[0]
        time.sleep(2.0)  # the topics' groups elected and idle
        before = [rss_kib(p) for p in pids]
        with Fleet(_spec(address, plan.devices, 0), plan.processes) as fleet:
            ready = fleet.wait_ready()
            log(f"{ready.connected:,} devices connected to broker 0 in {ready.seconds:.0f} s")
            time.sleep(SETTLE_S)
            after = [rss_kib(p) for p in pids]
            cluster.start_tracing()
            with Fleet(_spec(address, plan.traced, plan.devices), 1) as traced_fleet:
                traced_ready = traced_fleet.wait_ready()
                log(f"{traced_ready.connected} more, traced, in {traced_ready.seconds:.0f} s")
                time.sleep(SETTLE_S)
                taken = cluster.snapshots_now()
    n = max(ready.connected, 1)
    m = max(traced_ready.connected, 1)
    rss = [(a - b) / n for a, b in zip(after, before, strict=True)]
    traced, rows = [], []
    for i, (snapshot, _, types) in enumerate(taken):
        kib, lines = breakdown(snapshot, m)
        traced.append(kib)
        role = "holds the connections" if i == 0 else "holds the session table only"
        rows.append(
            f"broker {i} ({role}): RSS {rss[i]:.2f} KiB per connection; traced {kib:.2f} KiB "
            f"per connection ({m} more devices)"
        )
        rows += lines + type_rows(types, m)
    return {
        "connected": ready.connected,
        "failed": ready.failed + traced_ready.failed,
        "rss": rss,
        "traced": traced,
        "rows": rows,
    }


def run(root: Path, plan: Plan) -> int:
    started = time.monotonic()

    def log(line: str) -> None:
        print(f"{line} [{time.monotonic() - started:.0f} s]", flush=True)

    log(raise_open_files(2 * plan.devices + 1000))
    task = floor_kib("task", plan.devices)
    pair = floor_kib("pair", plan.devices)
    parked = floor_kib("parked", plan.devices)
    log(
        f"bare trio server, {plan.devices:,} idle connections: {task:.2f} KiB each with one "
        f"task, {pair:.2f} KiB with a reader, a writer and a nursery, {parked:.2f} KiB parked "
        "in one epoll set"
    )
    mosquitto = mosquitto_kib(root, plan)
    log(f"mosquitto: {mosquitto:.2f} KiB per connection")
    c = cluster_phase(root, plan, log)
    for row in c["rows"]:  # type: ignore[attr-defined]
        print(row)
    rss: list[float] = c["rss"]  # type: ignore[assignment]
    traced: list[float] = c["traced"]  # type: ignore[assignment]
    total = sum(rss)
    log(
        f"cluster: {c['connected']:,} devices on broker 0 ({c['failed']} failed): "
        f"{total:.2f} KiB per connection over the 3 brokers = {total / mosquitto:.1f} x mosquitto"
    )
    other = (rss[1] + rss[2]) / 2
    print(
        f"RESULT devices={c['connected']} kib_per_conn={total:.2f} "
        f"owner_kib_per_conn={rss[0]:.2f} other_kib_per_conn={other:.2f} "
        f"traced_owner_kib_per_conn={traced[0]:.2f} "
        f"traced_other_kib_per_conn={(traced[1] + traced[2]) / 2:.2f} "
        f"bare_task_kib_per_conn={task:.2f} bare_pair_kib_per_conn={pair:.2f} "
        f"bare_parked_kib_per_conn={parked:.2f} "
        f"mosquitto_kib_per_conn={mosquitto:.2f} "
        f"kib_per_conn_vs_mosquitto={total / mosquitto:.2f}"
    )
    return 0 if not c["failed"] else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.conn_memory",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="1,000 devices")
    parser.add_argument("--devices", type=int, help="override the number of devices")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    if args.devices:
        plan = Plan(args.devices, plan.processes, plan.traced)
    root = make_scratch()
    try:
        return run(root, plan)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
