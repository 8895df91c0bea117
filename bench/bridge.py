"""Bridge benchmark: mosquitto -> ``kafkaesque mqtt-bridge`` -> a 9-partition RF 3 log topic,
beside mosquitto's own delivery rate to one plain subscriber, in the same run (issue 38, point 4).

    python -m bench.bridge [--quick]

Everything runs on this machine: mosquitto (a free loopback port, a scratch directory, killed by
its PID), 3 ``kafkaesque broker`` processes (``LocalCluster``), the topic ``readings`` created
beforehand with 9 partitions and replication factor 3, and the publishers: ``kafkaesque
devices``' load generator (``kafkaesque.cli.devices_fleet``) in their own processes, flat out,
QoS 1, a window of unacknowledged PUBLISHes per device, each reading a small JSON payload with
the run and a serial number (``phones/<device>/spectrum``).

* baseline: one plain QoS 1 subscriber (``mosquitto_sub -q 1``, C, printing 2 bytes a
  message) on ``phones/+/spectrum`` while the publishers run: messages it received per second
  in the measured window (mosquitto's own delivery rate).
* bridge: one ``kafkaesque mqtt-bridge`` process (MQTT 5, persistent session, rules
  ``phones/+/spectrum -> readings key=1``) instead of the subscriber: records appended to
  ``readings`` per second in the same window (the high watermarks' sum; a record is there only
  once its partition's quorum committed it, and only then is the message acknowledged upstream).
  ``bridge_vs_mosquitto`` is the ratio (target >= 0.5), beside the seed's laptop figure of
  30,000 msg/s (the Kafka Connect MQTT source).
* shared: 2 and 3 bridge processes with ``--share-group`` (``$share/bench/...``) splitting the
  subscription: records appended per second, with the CPU of the brokers and of the bridges,
  to tell whether the bridges or the brokers are the limit.
* lost: after each bridge phase the publishers stop, the bridges drain what mosquitto queued
  for them, and the log is read back: every reading mosquitto acknowledged to a publisher must be
  in ``readings`` (by run and serial number; duplicates are counted too, at least once allows a
  few only if a bridge reconnected).

Each phase prints the publishers' offered rate (mosquitto's PUBACKs per second): a bridge rate
close to it means the publishers, not the bridge, were the limit; and the CPU each part used, as
a share of a core and per message moved. On a machine shared with other work every process gets
a slice of the CPU and the rates are bounded by it: ``cpu_bound_msgs_per_s`` is what this
machine's cores would move at the CPU per message of bridge + brokers (the publishers and
mosquitto left out), had they nothing else to run. The publishers run flat out in every phase
(``Plan.bridge_offered`` would pace those of the bridge phases; a paced rate also caps
``bridge_vs_mosquitto``); the loss check then waits for mosquitto's backlog to drain.

Ends with ``RESULT bridge_msgs_per_s=… bridge_vs_mosquitto=… lost=… shared_bridges=…
shared_msgs_per_s=…`` (the largest shared run), then ``mosquitto_msgs_per_s=…
shared2_msgs_per_s=… shared3_msgs_per_s=… duplicated=… bridge_us_per_msg=…
brokers_us_per_msg=… cpu_bound_msgs_per_s=… load_avg=… payload_bytes=… steal_pct=…``.
``--receive-maximum N`` runs the bridges with that window (default: the bridge's default);
``--connections N`` the one bridge with that many upstream connections in a share group
(default ``CONNECTIONS``: mosquitto reads one packet of a connection per pass of its loop, so
one connection's PUBACKs bound one bridge's rate), printed as ``bridge_connections=…``.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO, Any

from kafkaesque.cli.devices_core import DeviceConfig, device_id, reading_payload, spectrum_for
from kafkaesque.cli.devices_fleet import Fleet, FleetSpec, Readiness, WorkerResult
from kafkaesque.cli.devices_report import check_log, end_offsets, read_run

from kafkaesque.client import Client
from kafkaesque.local_cluster import LocalCluster

from ._broker_procs import StealWindow, make_scratch, process_cpu_s
from ._mqtt_procs import Mosquitto, run_fleet

MOSQUITTO_SUB = "mosquitto_sub"
BROKERS = 3
TOPIC = "readings"
PARTITIONS = 9
FILTER = "phones/+/spectrum"
RULES = f"{FILTER} -> {TOPIC} key=1\n"
SHARE_GROUP = "bench"
CONNECTIONS = 3  # the one bridge's upstream connections (see the docstring)
STALL_S = 30.0  # no record appended this long: the bridges are stuck
SEED_MSGS_PER_S = 30_000  # the Kafka Connect MQTT source on a laptop (shared/SEEDS.md)
TARGET_RATIO = 0.5
SUB_BYTES_PER_MESSAGE = 2  # mosquitto_sub -F '.' prints ".\n" per message


@dataclass(frozen=True)
class Plan:
    """Sizes and seconds of each phase."""

    devices: int
    window: int  # unacknowledged QoS 1 readings per device
    processes: int  # publisher processes
    warmup: float
    measure: float
    shared: tuple[int, ...]  # bridge processes of the --share-group phases
    # msg/s the publishers offer in the bridge phases (None: flat out). Flat out they outrun a
    # bridge many times over, and the check for loss then waits for mosquitto's backlog to drain.
    bridge_offered: int | None = None


QUICK = Plan(
    devices=40,
    window=100,
    processes=2,
    warmup=1.5,
    measure=3.0,
    shared=(2, 3),
)
FULL = Plan(devices=100, window=200, processes=2, warmup=4.0, measure=15.0, shared=(2, 3))


class Clock:
    """Seconds since the run started, for the progress marks."""

    def __init__(self) -> None:
        self.started = time.monotonic()

    def __str__(self) -> str:
        return f"[{time.monotonic() - self.started:.0f} s]"


def _stop_process(proc: subprocess.Popen[Any], grace: float = 15.0) -> None:
    """SIGTERM ``proc`` (by its PID), SIGKILL after ``grace`` seconds; reaps it."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
    proc.wait()


@contextmanager
def plain_subscriber(mosquitto: Mosquitto, out: Path) -> Iterator[Callable[[], int]]:
    """``mosquitto_sub -q 1`` on ``FILTER``, subscribed once this yields a function that counts
    the messages it received so far."""
    host, port = mosquitto.address
    with out.open("wb") as sink:
        proc = subprocess.Popen(
            [MOSQUITTO_SUB, "-h", host, "-p", str(port), "-q", "1", "-t", FILTER, "-F", "."],
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.DEVNULL,
        )

    def received() -> int:
        return out.stat().st_size // SUB_BYTES_PER_MESSAGE

    try:
        # Subscribed once a probe published after it started comes through.
        deadline = time.monotonic() + 20
        while received() == 0:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("mosquitto_sub did not subscribe")
            probe = ["-t", "phones/probe/spectrum", "-m", "probe"]
            subprocess.run(
                ["mosquitto_pub", "-h", host, "-p", str(port), "-q", "1", *probe],
                check=True,
                timeout=10,
            )
            time.sleep(0.2)
        yield received
    finally:
        _stop_process(proc)


class Bridges:
    """``count`` ``kafkaesque mqtt-bridge`` processes (a shared subscription when more than
    one), each started and ``ready``; a context manager that stops them by PID."""

    def __init__(
        self,
        root: Path,
        mosquitto: Mosquitto,
        bootstrap: str,
        count: int,
        receive_maximum: int | None = None,
        connections: int = 1,
    ) -> None:
        rules = root / "bridge-rules.txt"
        rules.write_text(RULES)
        host, port = mosquitto.address
        self.procs: list[subprocess.Popen[str]] = []
        self._logs: list[IO[str]] = []
        tag = secrets.token_hex(3)
        for k in range(count):
            command = [
                sys.executable,
                "-m",
                "kafkaesque.cli",
                "mqtt-bridge",
                "--upstream",
                f"{host}:{port}",
                "--bootstrap",
                bootstrap,
                "--rules",
                str(rules),
                "--client-id",
                f"bench-bridge-{tag}-{k}",
                # The session goes with the phase: no queue of a stopped bridge in mosquitto.
                "--session-expiry",
                "2",
                "--partitions",
                str(PARTITIONS),
                "--replication-factor",
                str(BROKERS),
                "--stats-interval",
                "0",
            ]
            if count > 1 or connections > 1:
                command += ["--share-group", SHARE_GROUP, "--connections", str(connections)]
            if receive_maximum is not None:
                command += ["--receive-maximum", str(receive_maximum)]
            log = (root / f"bridge-{tag}-{k}.log").open("w")
            self._logs.append(log)
            self.procs.append(
                subprocess.Popen(
                    command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, text=True
                )
            )

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def __enter__(self) -> Bridges:
        try:
            for proc in self.procs:
                self._wait_ready(proc)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _wait_ready(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(60)
        if not line or line[0].strip() != "ready":
            raise RuntimeError(f"a bridge did not get ready (log: {self._logs[0].name})")

    def __exit__(self, *exc_info: object) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            _stop_process(proc)
            if proc.stdout is not None:
                proc.stdout.close()
        for log in self._logs:
            log.close()


def _spec(mosquitto: Mosquitto, plan: Plan, rate: int | None = None) -> FleetSpec:
    """The publishers: flat out, or ``rate`` msg/s in all."""
    return FleetSpec(
        addresses=(mosquitto.address,),
        devices=plan.devices,
        config=DeviceConfig(run=secrets.token_hex(4), window=plan.window, subscribe=False),
        interval=0.0 if rate is None else plan.devices / rate,
        duration=plan.warmup + plan.measure,
        warmup=plan.warmup,
        drain=30.0,
    )


def _offered(result: WorkerResult) -> float:
    """The publishers' rate: mosquitto's PUBACKs per second in the measured window."""
    return float(result.acknowledged_in_window) / max(float(result.window_s), 1e-9)


def baseline(mosquitto: Mosquitto, plan: Plan, root: Path) -> dict[str, float]:
    """Mosquitto's delivery rate to one plain QoS 1 subscriber while the publishers run."""
    with plain_subscriber(mosquitto, root / "sub.out") as received:
        rate: list[float] = []

        def measure(fleet: Fleet, ready: Readiness) -> None:
            time.sleep(plan.warmup)
            n0, t0 = received(), time.monotonic()
            time.sleep(plan.measure)
            rate.append((received() - n0) / (time.monotonic() - t0))

        run = run_fleet(_spec(mosquitto, plan), plan.processes, during=measure)
    return {"msgs_per_s": rate[0], "offered": _offered(run.result)}


def _log_total(client: Client) -> int:
    offsets = end_offsets(client, TOPIC) or {}
    return sum(offsets.values())


def bridged(
    mosquitto: Mosquitto,
    cluster: LocalCluster,
    client: Client,
    plan: Plan,
    root: Path,
    count: int,
    receive_maximum: int | None,
    connections: int = 1,
) -> dict[str, Any]:
    """``count`` bridges (of ``connections`` upstream connections each) while the publishers
    run: records appended per second in the window, CPU of brokers and bridges, then nothing
    lost once they drained."""
    brokers = [cluster.procs[i].pid for i in range(BROKERS)]
    start = end_offsets(client, TOPIC)
    spec = _spec(mosquitto, plan, plan.bridge_offered)
    with Bridges(
        root, mosquitto, cluster.bootstrap, count, receive_maximum, connections
    ) as bridges:
        window: dict[str, Any] = {}

        def measure(fleet: Fleet, ready: Readiness) -> None:
            time.sleep(plan.warmup)
            n0, t0 = _log_total(client), time.monotonic()
            cpu0 = [process_cpu_s(p) for p in brokers + bridges.pids + [mosquitto.proc.pid]]
            time.sleep(plan.measure)
            n1, t1 = _log_total(client), time.monotonic()
            cpu1 = [process_cpu_s(p) for p in brokers + bridges.pids + [mosquitto.proc.pid]]
            span = t1 - t0
            cpu = [100 * (b - a) / span for a, b in zip(cpu0, cpu1, strict=True)]
            moved = max(n1 - n0, 1)
            used = [b - a for a, b in zip(cpu0, cpu1, strict=True)]
            window.update(
                msgs_per_s=(n1 - n0) / span,
                brokers_cpu=cpu[:BROKERS],
                bridges_cpu=cpu[BROKERS:-1],
                mosquitto_cpu=cpu[-1],
                bridge_us_per_msg=1e6 * sum(used[BROKERS:-1]) / moved,
                brokers_us_per_msg=1e6 * sum(used[:BROKERS]) / moved,
                mosquitto_us_per_msg=1e6 * used[-1] / moved,
            )

        run = run_fleet(spec, plan.processes, during=measure)
        sent = run.result.acknowledged
        # Drain: mosquitto still holds what the bridges had not taken yet (flat out, minutes'
        # worth). Waits as long as the log grows; 30 s without progress ends the wait, and
        # what is missing then counts as lost.
        target = sum((start or {}).values()) + sent
        have, deadline = _log_total(client), time.monotonic() + STALL_S
        while have < target and time.monotonic() < deadline:
            time.sleep(0.5)
            now = _log_total(client)
            if now > have:
                have, deadline = now, time.monotonic() + STALL_S
    pairs, _ = read_run(client, TOPIC, spec.config.run, start)
    check = check_log(run.result.devices, pairs)
    return {
        **window,
        "offered": _offered(run.result),
        "sent": sent,
        "lost": check.lost,
        "duplicated": check.duplicated,
        "in_log": len(pairs),
    }


def _cpu(values: list[float]) -> str:
    return "/".join(f"{v:.0f}" for v in values)


def run(root: Path, plan: Plan, receive_maximum: int | None, connections: int) -> int:
    clock = Clock()
    steal = StealWindow()
    payload_bytes = len(reading_payload("0" * 8, device_id(0), 0, 0, spectrum_for(device_id(0))))
    print(
        f"publishers: {plan.devices} devices in {plan.processes} processes, QoS 1 flat out "
        f"({'also' if plan.bridge_offered is None else f'{plan.bridge_offered:,} msg/s'} in the "
        f"bridge phases), "
        f"window {plan.window}, {payload_bytes}-byte payloads; {plan.warmup:g} s warm-up, "
        f"{plan.measure:g} s measured; bridges with --receive-maximum "
        f"{receive_maximum or 'default'}; the one bridge with --connections {connections}"
    )
    # Every QoS 1 message kept for a subscriber that is behind (a limit would drop acknowledged
    # messages and count as lost); the subscriber's window governs (mosquitto 2.0 does not keep
    # to a v5 receive maximum; the bridge stops reading when its queues are full).
    with Mosquitto(root / "mosquitto", max_queued=0, extra=("set_tcp_nodelay true",)) as mosquitto:
        base = baseline(mosquitto, plan, root)
        print(
            f"baseline: mosquitto -> one plain QoS 1 subscriber (mosquitto_sub): "
            f"{base['msgs_per_s']:,.0f} msg/s (publishers offered {base['offered']:,.0f}) {clock}"
        )
        with (
            LocalCluster(str(root / "cluster"), BROKERS) as cluster,
            Client(cluster.bootstrap) as client,
        ):
            client.create_topic(TOPIC, PARTITIONS, BROKERS)
            print(
                f"cluster: {BROKERS} brokers, {TOPIC}: {PARTITIONS} partitions, replication "
                f"factor {BROKERS}, acknowledged upstream after quorum commit {clock}"
            )
            phases: dict[int, dict[str, Any]] = {}
            for count in (1, *plan.shared):
                r = phases[count] = bridged(
                    mosquitto,
                    cluster,
                    client,
                    plan,
                    root,
                    count,
                    receive_maximum,
                    connections if count == 1 else 1,
                )
                label = (
                    f"one bridge, {connections} connection(s)"
                    if count == 1
                    else f"{count} bridges, --share-group"
                )
                print(
                    f"{label}: {r['msgs_per_s']:,.0f} msg/s into the log (publishers "
                    f"offered {r['offered']:,.0f}); lost {r['lost']}, duplicated "
                    f"{r['duplicated']} of {r['sent']:,} {clock}"
                )
                print(
                    f"      cpu (% of one core): brokers {_cpu(r['brokers_cpu'])}, bridges "
                    f"{_cpu(r['bridges_cpu'])}, mosquitto {r['mosquitto_cpu']:.0f} (of "
                    f"{100 * (os.cpu_count() or 1)}); CPU a message: bridges "
                    f"{r['bridge_us_per_msg']:.0f} us, brokers {r['brokers_us_per_msg']:.0f} us, "
                    f"mosquitto {r['mosquitto_us_per_msg']:.0f} us; load average "
                    f"{os.getloadavg()[0]:.0f}"
                )
    one = phases[1]
    ratio = one["msgs_per_s"] / max(base["msgs_per_s"], 1e-9)
    top = max(plan.shared)
    lost = sum(r["lost"] for r in phases.values())
    duplicated = sum(r["duplicated"] for r in phases.values())
    print(
        f"bridge: {one['msgs_per_s']:,.0f} msg/s = {ratio:.2f} x mosquitto's delivery; target "
        f">= {TARGET_RATIO:g} x: {'met' if ratio >= TARGET_RATIO else 'NOT met'}; the seed's "
        f"laptop figure {SEED_MSGS_PER_S:,} msg/s: "
        f"{'met' if one['msgs_per_s'] >= SEED_MSGS_PER_S else 'NOT met'}; lost {lost}"
    )
    print(
        "shared: "
        + ", ".join(f"{n} bridges {phases[n]['msgs_per_s']:,.0f} msg/s" for n in plan.shared)
        + f" (x{phases[top]['msgs_per_s'] / max(one['msgs_per_s'], 1e-9):.2f} of one bridge)"
    )
    # What this machine's cores could move if the bridge, the brokers and mosquitto had them to
    # themselves (the publishers, the devices, left out): on a shared machine every process gets
    # a slice of the CPU, and the rates above are bounded by that slice, not by the pipeline.
    # (mosquitto left out too: its CPU here is mostly the publishers' flood, and the baseline
    # pays it as well).
    per_msg = one["bridge_us_per_msg"] + one["brokers_us_per_msg"]
    cores = os.cpu_count() or 1
    cpu_bound = 1e6 * cores / max(per_msg, 1e-9)
    print(
        f"CPU a message, bridge + brokers: {per_msg:.0f} us: {cores} cores of our own would "
        f"move at most {cpu_bound:,.0f} msg/s (load average now {os.getloadavg()[0]:.0f} on "
        f"{cores} cores)"
    )
    print(steal)
    shared_fields = " ".join(
        f"shared{n}_msgs_per_s={phases[n]['msgs_per_s']:.0f}" for n in plan.shared
    )
    print(
        f"RESULT bridge_msgs_per_s={one['msgs_per_s']:.0f} bridge_vs_mosquitto={ratio:.2f} "
        f"lost={lost} shared_bridges={top} shared_msgs_per_s={phases[top]['msgs_per_s']:.0f} "
        f"mosquitto_msgs_per_s={base['msgs_per_s']:.0f} {shared_fields} "
        f"duplicated={duplicated} bridge_us_per_msg={one['bridge_us_per_msg']:.0f} "
        f"brokers_us_per_msg={one['brokers_us_per_msg']:.0f} cpu_bound_msgs_per_s={cpu_bound:.0f} "
        f"load_avg={os.getloadavg()[0]:.1f} "
        f"payload_bytes={payload_bytes} steal_pct={steal.percent():.1f} "
        f"bridge_connections={connections}"
    )
    return 0 if lost == 0 else 1


def _stop(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds: bridges, brokers, mosquitto, publishers stopped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.bridge",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="a shorter run (about a minute)")
    parser.add_argument(
        "--receive-maximum",
        type=int,
        metavar="N",
        help="the bridges' --receive-maximum (default: the bridge's own default)",
    )
    parser.add_argument(
        "--connections",
        type=int,
        default=CONNECTIONS,
        metavar="N",
        help=f"the one bridge's --connections (default {CONNECTIONS}, in a share group)",
    )
    args = parser.parse_args(argv)
    if args.connections < 1:
        parser.error("--connections must be at least 1")
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGHUP, _stop)
    root = make_scratch()
    try:
        return run(root, QUICK if args.quick else FULL, args.receive_maximum, args.connections)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
