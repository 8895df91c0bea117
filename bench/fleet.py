"""Live fleets: simulated devices publishing over MQTT to 3 brokers, beside mosquitto, then a
reconnect storm (issue 38, points 1 and 2).

    python -m bench.fleet [--quick]

The devices are ``kafkaesque devices``' own (``kafkaesque.cli.devices_fleet``: worker processes
of raw non-blocking sockets). Each device keeps a persistent session (clean session 0),
subscribes to ``phones/<device>/commands`` at QoS 1, and publishes a small QoS 1 reading with a
serial number every ``interval`` seconds (10 s) from a random phase. A controller (one MQTT
connection, in this process) publishes a command to 1% of the devices a second, at QoS 1, to
``phones/<device>/commands``.

1. **mosquitto** (one process, anonymous, no persistence) holds the same fleet at the same rates
   for ``mosquitto_s`` seconds: its PUBACK p50/p99, command delivery p99, KiB of RSS per
   connection (RSS with the fleet connected and publishing, minus before, over the connections)
   and CPU per message.
2. **The cluster**: 3 ``kafkaesque broker`` processes (``LocalCluster`` with MQTT listeners, the
   rules ``phones/+/spectrum -> readings key=1`` and ``phones/+/commands -> commands key=1``;
   ``readings`` 6 partitions and ``commands`` 3, replication factor 3), devices spread
   round-robin over the listeners, the controller on broker 0. After a warm-up, ``steady_s``
   seconds are measured: PUBACK p50/p99 (a PUBACK means the quorum committed the reading),
   command delivery p99, the brokers' RSS growth per connection and their CPU per message
   (readings and commands).
3. **The reconnect storm**: broker 2 is killed with SIGKILL under the fleet. Every device it held
   reconnects (exponential back-off with full jitter, to another address at random, as a
   device picks from its list of brokers; the generator does not pace these) to a survivor,
   which resumes its session. Measured from the kill: the time until 99% of those devices
   are back (CONNACK with session present, SUBACK) and until 99% have a
   reading acknowledged on the new connection (``storm_99pct_back_s``: back *and* publishing;
   a device with nothing due publishes at its next reading, up to ``interval`` later); the
   CONNECT rate the survivors sustained (peak per second, and the mean until 99% were back);
   reconnections that found their session gone (``sessions_lost``, must be 0); commands
   delivered (the controller goes on through the storm; a device's persistent session keeps
   those published while it was away).
4. **The log**: every reading read back from ``readings`` through the line protocol: an
   acknowledged reading absent from it is ``lost`` (must be 0), a serial found twice
   ``duplicated`` (must be 0: a resend after the storm is recognised, issue 38 point 7).

The bench process raises its open-file limit as an operator would (``RLIMIT_NOFILE`` up to what
the run needs: past the hard limit where it is allowed to, else to the hard limit), and the
brokers and mosquitto inherit it; it says so in the output.

Ends with ``RESULT devices=… lost=… duplicated=… puback_p99_ms=… puback_p99_vs_mosquitto=…
kib_per_conn=… kib_per_conn_vs_mosquitto=… command_p99_ms=… storm_devices=…
storm_99pct_back_s=…`` then ``puback_p50_ms``, mosquitto's figures, ``cpu_us_per_msg`` (broker CPU
microseconds per message, readings and commands, all three brokers), ``storm_99pct_connected_s``,
``storm_connects_peak_per_s``, ``storm_connects_mean_per_s``, ``sessions_lost``,
``commands_sent``/``commands_received``, ``fsync_p50_ms``/``fsync_p99_ms`` (a plain fsync of a
small append on the brokers' filesystem, probed during the steady window: the part of our PUBACK
that is the quorum's fsync, which mosquitto's does not wait for), ``puback_p99_interval_ms`` and
``puback_p99_interval_vs_mosquitto`` (with ``--fsync-interval``: the steady window again on
brokers with ``--fsync interval``, whose PUBACK waits for the quorum but no fsync; nan without)
and ``steal_pct`` (CPU time the hypervisor gave to other
guests during the run, in percent). Targets (issue 38): nothing lost, PUBACK p99 <= 3x
mosquitto's, KiB per connection <= 2x mosquitto's, 99% back in <= 30 s for 8,000+ devices.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import secrets
import select
import shutil
import signal
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from kafkaesque.cli.devices_core import VERSION, DeviceConfig, commands_topic, device_id
from kafkaesque.cli.devices_fleet import Fleet, FleetSpec, WorkerResult
from kafkaesque.cli.devices_report import (
    check_log,
    end_offsets,
    fence_ends,
    percentile,
    read_run,
)

from kafkaesque.client import Client
from kafkaesque.local_cluster import LocalCluster
from kafkaesque.protocol import partition_for_key
from kafkaesque.protocol.mqtt import Connect, Publish, encode_mqtt

from ._broker_procs import StealWindow, make_scratch, process_cpu_s
from ._mqtt_procs import Mosquitto, rss_kib, total_rss_kib

BROKERS = 3
KILLED = 2  # the broker killed for the storm; the controller talks to broker 0
RULES = "phones/+/spectrum -> readings key=1\nphones/+/commands -> commands key=1\n"
READINGS_PARTITIONS = 6
COMMANDS_PARTITIONS = 3
SPARE_FILES = 1000  # for segments, peers and clients beside the device sockets
TARGETS = {"puback_vs": 3.0, "kib_vs": 2.0, "storm_s": 30.0}
FSYNC_PROBE_BYTES = 200  # a reading's record, about
FSYNC_PROBE_EVERY_S = 0.05


@dataclass(frozen=True)
class Plan:
    """Sizes and seconds of a run."""

    devices: int
    processes: int  # load generator processes
    warmup: float  # seconds after go before measuring (every device has published once)
    steady_s: float  # the measured window on the cluster
    storm_s: float  # seconds after the kill before the devices stop
    mosquitto_s: float  # the measured window on mosquitto
    interval: float = 10.0  # seconds between readings of a device
    command_share: float = 0.01  # of the devices, commanded each second
    persistent: bool = True  # persistent sessions (False: clean, to compare the storm's cost)
    # Also the steady window on brokers with ``--fsync interval`` (a PUBACK without the fsync).
    fsync_interval: bool = False


# The storm window is longer than its 30 s target so that a slower storm is measured, not cut.
QUICK = Plan(devices=5_000, processes=2, warmup=10.0, steady_s=60.0, storm_s=50.0, mosquitto_s=30.0)
FULL = Plan(
    devices=25_000, processes=3, warmup=10.0, steady_s=300.0, storm_s=90.0, mosquitto_s=60.0
)


def _f(value: float | None, fmt: str = ".2f") -> str:
    return "nan" if value is None or math.isnan(value) else format(value, fmt)


def _ratio(ours: float | None, theirs: float | None) -> float | None:
    if ours is None or theirs is None or not theirs:
        return None
    return ours / theirs


def _verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def raise_open_files(needed: int) -> str:
    """Raise this process's RLIMIT_NOFILE (inherited by the brokers, mosquitto and the
    generators started later) to ``needed`` if allowed, else to the hard limit; what happened."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if needed > hard:
        try:  # as an operator's LimitNOFILE / limits.conf would; needs CAP_SYS_RESOURCE
            resource.setrlimit(resource.RLIMIT_NOFILE, (needed, needed))
            return f"open-file limit raised from {soft} (hard {hard}) to {needed}"
        except (ValueError, OSError):
            pass
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    now = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return f"open-file limit raised from {soft} to {now} (the hard limit; {needed} wanted)"


class FsyncProbe:
    """Appends ``FSYNC_PROBE_BYTES`` to a file in ``directory`` and fsyncs it, every
    ``FSYNC_PROBE_EVERY_S``, in a thread, from ``start()`` to ``stop()`` (which returns the
    fsyncs' durations in ms): what a plain fsync costs on the brokers' filesystem while they
    run. Our PUBACK waits for the quorum's fsync of the reading (mosquitto acks from memory):
    this is the part of its latency that is the promise, whatever the broker's code does."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "fsync-probe"
        self.ms: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fsync-probe", daemon=True)

    def start(self) -> FsyncProbe:
        self._thread.start()
        return self

    def stop(self) -> list[float]:
        self._stop.set()
        self._thread.join(30)
        return self.ms

    def _run(self) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            data = b"x" * FSYNC_PROBE_BYTES
            while not self._stop.wait(FSYNC_PROBE_EVERY_S):
                began = time.perf_counter()
                os.write(fd, data)
                os.fsync(fd)
                self.ms.append(1000 * (time.perf_counter() - began))
        finally:
            os.close(fd)
            self.path.unlink(missing_ok=True)


class Controller:
    """Publishes commands to devices at a steady rate over one MQTT connection (QoS 1), in a
    thread: ``start()``, then ``stop()`` returns how many it sent. The PUBACKs are read and
    dropped (a command counts once written; delivery is what the devices measure)."""

    def __init__(self, address: tuple[str, int], devices: Sequence[int], rate: float) -> None:
        self.address, self.devices, self.rate = address, list(devices), rate
        self.sent = 0
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="controller", daemon=True)

    def start(self) -> Controller:
        self._thread.start()
        return self

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(30)
        return self.sent

    def _run(self) -> None:
        try:
            with socket.create_connection(self.address, timeout=10) as sock:
                sock.sendall(encode_mqtt(Connect(f"controller-{secrets.token_hex(3)}"), VERSION))
                if sock.recv(4)[:1] != b"\x20":
                    raise ConnectionError("no CONNACK")
                started = time.monotonic()
                while not self._stop.is_set():
                    device = device_id(self.devices[self.sent % len(self.devices)])
                    payload = json.dumps({"command": "ping", "ts_ms": int(time.time() * 1000)})
                    packet_id = self.sent % 0xFFFF + 1
                    publish = Publish(
                        commands_topic(device), payload.encode(), qos=1, packet_id=packet_id
                    )
                    sock.sendall(encode_mqtt(publish, VERSION))
                    self.sent += 1
                    # The PUBACKs: read (without waiting) so the socket never fills.
                    while select.select([sock], [], [], 0)[0]:
                        if not sock.recv(65536):
                            raise ConnectionError("the broker closed the connection")
                    # Paced by the clock: a slow broker shows as latency, not as fewer commands.
                    self._stop.wait(max(0.0, started + self.sent / self.rate - time.monotonic()))
        except OSError as exc:
            self.error = f"controller: {exc!r}"


def _spec(addresses: tuple[tuple[str, int], ...], plan: Plan, duration: float) -> FleetSpec:
    return FleetSpec(
        addresses=addresses,
        devices=plan.devices,
        config=DeviceConfig(run=secrets.token_hex(4), clean=not plan.persistent, keep_alive=60),
        interval=plan.interval,
        duration=duration,
        warmup=plan.warmup,
        window=duration - plan.warmup,
        drain=10.0,
        connect_timeout=60.0,
        max_connecting=100,  # the fleet's first connections, in a ramp
        max_reconnecting=5000,  # the storm: every dropped device on its own back-off
    )


def _common(r: WorkerResult, spec: FleetSpec) -> dict[str, Any]:
    return {
        "run": spec.config.run,
        "connected": r.connected,
        "failed": r.failed,
        "p50": percentile(r.puback_ms, 0.5),
        "p99": percentile(r.puback_ms, 0.99),
        "command_p99": percentile(r.command_ms, 0.99),
        "commands_received": r.commands,
        "acknowledged_in_window": r.acknowledged_in_window,
        "msgs_per_s": r.acknowledged_in_window / max(r.window_s, 1e-9),
        "errors": r.errors,
    }


def mosquitto_phase(root: Path, plan: Plan) -> dict[str, Any]:
    """The same fleet on one mosquitto, measured for ``plan.mosquitto_s`` seconds."""
    with Mosquitto(root / "mosquitto") as mosquitto:
        pid = mosquitto.proc.pid
        before = rss_kib(pid)
        spec = _spec((mosquitto.address,), plan, plan.warmup + plan.mosquitto_s)
        with Fleet(spec, plan.processes) as fleet:
            fleet.wait_ready()
            fleet.go()
            time.sleep(plan.warmup)
            controller = Controller(
                mosquitto.address, range(plan.devices), plan.devices * plan.command_share
            ).start()
            cpu = process_cpu_s(pid)
            time.sleep(plan.mosquitto_s)
            cpu = process_cpu_s(pid) - cpu
            after = rss_kib(pid)
            sent = controller.stop()
            r = fleet.result()
    out = _common(r, spec)
    out.update(
        kib=(after - before) / r.connected if r.connected else None,
        rss_mib=(before / 1024, after / 1024),
        cpu_us=1e6 * cpu / max(r.acknowledged_in_window + sent, 1),
        commands_sent=sent,
        controller_error=controller.error,
    )
    return out


def _nth(values: list[float], share: float) -> float:
    """The value by which ``share`` of ``values`` are in (inf if they are not all there)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


def storm_figures(r: WorkerResult, killed_at: float, killed: int = KILLED) -> dict[str, Any]:
    """What the devices the killed broker held did next, from the fleet's per-device times
    (wall clock, ``killed_at`` the kill): how many, when 99% were back and publishing, the
    CONNECT rate. Device ``i`` connected first to broker ``i % BROKERS``; the devices of the
    killed broker are those of its share not dropped before the kill. ``collateral``: devices
    of the survivors whose connection dropped after the kill (healthy devices refused)."""

    def index(device: str) -> int:
        return int(device.rsplit("-", 1)[1])

    before = {d for d, t in r.dropped_at.items() if t < killed_at - 1.0}
    after = {d for d, t in r.dropped_at.items() if t >= killed_at - 1.0}
    dropped = [d for d in after if index(d) % BROKERS == killed]
    back = [r.back_at.get(d, math.inf) - killed_at for d in dropped]
    publishing = [r.publishing_at.get(d, math.inf) - killed_at for d in dropped]
    per_second = Counter(int(t) for t in back if t != math.inf)
    back_99 = _nth(back, 0.99)
    in_99 = sum(1 for t in back if t <= back_99)
    return {
        "dropped_before": len(before),
        "collateral": len(after) - len(dropped),
        "devices": len(dropped),
        "back": sum(1 for t in back if t != math.inf),
        "publishing": sum(1 for t in publishing if t != math.inf),
        "back_99_s": back_99,
        "publishing_99_s": _nth(publishing, 0.99),
        "connects_peak": max(per_second.values(), default=0),
        "connects_mean": in_99 / back_99 if back_99 and math.isfinite(back_99) else math.nan,
    }


SUSPECTS_FILE = "fleet-suspects.json"


def suspects(
    devices: dict[str, tuple[int, list[int]]], pairs: Sequence[tuple[str, int]]
) -> dict[str, list[dict[str, Any]]]:
    """Every lost reading (acknowledged, not in the log) and every duplicated one (in the log
    more than once), with what is needed to find it in the brokers' logs and data: the
    device, its serial, the broker it first connected to and its ``readings`` partition."""
    seen = Counter(pairs)
    found: dict[str, set[int]] = {}
    for device, serial in seen:
        found.setdefault(device, set()).add(serial)

    def where(device: str, serial: int, **more: Any) -> dict[str, Any]:
        return {
            "device": device,
            "serial": serial,
            "first_broker": int(device.rsplit("-", 1)[1]) % BROKERS,
            "partition": partition_for_key(device.encode(), READINGS_PARTITIONS),
            **more,
        }

    lost = [
        where(device, serial)
        for device, (sent, unacked) in sorted(devices.items())
        for serial in sorted(set(range(sent)) - found.get(device, set()) - set(unacked))
    ]
    duplicated = [where(d, s, copies=n) for (d, s), n in sorted(seen.items()) if n > 1]
    return {"lost": lost, "duplicated": duplicated}


def write_suspects(
    path: Path, r: WorkerResult, pairs: Sequence[tuple[str, int]], killed_at: float
) -> None:
    """Write ``suspects`` to ``path`` (JSON) with the kill's wall-clock time and, per suspect
    device, when it dropped and came back: kept with ``--keep`` for a post-mortem (issue 38)."""
    found = suspects(r.devices, pairs)
    for entry in found["lost"] + found["duplicated"]:
        device = entry["device"]
        entry["dropped_at"] = r.dropped_at.get(device)
        entry["back_at"] = r.back_at.get(device)
    path.write_text(json.dumps({"killed_at": killed_at, **found}, indent=1))


def cluster_phase(
    root: Path,
    plan: Plan,
    log: Any = print,
    log_level: str = "WARNING",
    fsync: str = "always",
    storm: bool = True,
    broker_args: Sequence[str] = (),
) -> dict[str, Any]:
    """The fleet on a 3-broker cluster whose brokers run with ``--fsync fsync``: the steady
    window, then (``storm``) broker ``KILLED`` killed with SIGKILL and ``plan.storm_s`` seconds
    of storm, then the log read back. ``broker_args``: more arguments for every broker
    (``--write-timeout 2``, say)."""
    with LocalCluster(
        str(root / f"cluster-{fsync}"),
        BROKERS,
        mqtt=True,
        mqtt_rules=RULES,
        log_level=log_level,
        extra_args=["--fsync", fsync, *broker_args],
    ) as cluster:
        with Client(cluster.bootstrap) as client:
            client.create_topic("readings", READINGS_PARTITIONS, BROKERS)
            client.create_topic("commands", COMMANDS_PARTITIONS, BROKERS)
            start = end_offsets(client, "readings")
        addresses: tuple[tuple[str, int], ...] = tuple(cluster.mqtt_addresses)
        brokers = [cluster.procs[i].pid for i in range(BROKERS)]
        before = total_rss_kib(brokers)
        spec = _spec(addresses, plan, plan.warmup + plan.steady_s + plan.storm_s)
        spec = FleetSpec(**{**spec.__dict__, "window": plan.steady_s})
        with Fleet(spec, plan.processes) as fleet:
            ready = fleet.wait_ready()
            log(f"    {ready.connected:,} devices connected in {ready.seconds:.0f} s")
            fleet.go()
            time.sleep(plan.warmup)
            controller = Controller(
                addresses[0], range(plan.devices), plan.devices * plan.command_share
            ).start()
            cpu = [process_cpu_s(p) for p in brokers]
            probe = FsyncProbe(root).start()
            time.sleep(plan.steady_s)
            fsync_ms = probe.stop()
            cpu_s = sum(process_cpu_s(p) - c for p, c in zip(brokers, cpu, strict=True))
            after = total_rss_kib(brokers)
            sent_steady = controller.sent
            killed_at = time.time()
            if storm:
                cluster.kill(KILLED)
                log(f"    broker {KILLED} killed (SIGKILL) under the fleet")
                time.sleep(plan.storm_s)
            else:
                fleet.stop()
            sent = controller.stop()
            r = fleet.result()
        survivors = ",".join(
            f"{h}:{p}" for h, p in (cluster.client_address(i) for i in cluster.alive())
        )
        with Client(survivors) as client:
            # Up to a marker each partition's current leader committed, not up to the high
            # watermarks: a replica's can lie below what the killed leader acknowledged last.
            ends, unfenced = fence_ends(client, "readings", READINGS_PARTITIONS, spec.config.run)
            pairs, _ = read_run(client, "readings", spec.config.run, start, ends=ends)
    check = check_log(r.devices, pairs)
    write_suspects(root / SUSPECTS_FILE, r, pairs, killed_at)
    out = _common(r, spec)
    out.update(
        kib=(after - before) / r.connected if r.connected else None,
        rss_mib=(before / 1024, after / 1024),
        cpu_us=1e6 * cpu_s / max(r.acknowledged_in_window + sent_steady, 1),
        commands_sent=sent,
        controller_error=controller.error,
        storm=storm_figures(r, killed_at),
        fsync_p50=percentile(fsync_ms, 0.5),
        fsync_p99=percentile(fsync_ms, 0.99),
        sessions_resumed=r.sessions_resumed,
        sessions_lost=r.sessions_lost,
        dropped=r.dropped,
        reconnected=r.reconnected,
        resent=r.resent,
        sent=r.sent,
        acknowledged=r.acknowledged,
        lost=check.lost,
        lost_examples=check.lost_examples,
        duplicated=check.duplicated,
        consumed=check.consumed,
        unfenced=unfenced,
    )
    return out


def run(root: Path, plan: Plan, log_level: str = "WARNING", broker_args: Sequence[str] = ()) -> int:
    started = time.monotonic()

    def log(line: str) -> None:
        print(f"{line} [{time.monotonic() - started:.0f} s]", flush=True)

    steal = StealWindow()
    log(raise_open_files(plan.devices + SPARE_FILES))
    rate = plan.devices * plan.command_share
    log(
        f"fleet: {plan.devices:,} devices ({'persistent' if plan.persistent else 'clean'} "
        f"sessions, a QoS 1 reading each "
        f"{plan.interval:g} s, {plan.devices / plan.interval:,.0f} msg/s in all), commands to "
        f"{plan.command_share:.0%} of them a second ({rate:,.0f}/s), {plan.processes} "
        "generator processes"
    )
    m = mosquitto_phase(root, plan)
    log(
        f"mosquitto (one process), {m['connected']:,} devices, {plan.mosquitto_s:g} s: PUBACK "
        f"p50 {_f(m['p50'])} ms, p99 {_f(m['p99'])} ms; commands {m['commands_received']:,} "
        f"of {m['commands_sent']:,}, p99 {_f(m['command_p99'])} ms; RSS "
        f"{m['rss_mib'][0]:.0f} -> {m['rss_mib'][1]:.0f} MiB = {_f(m['kib'], '.1f')} KiB per "
        f"connection; {_f(m['cpu_us'], '.0f')} us CPU per message"
    )
    c = cluster_phase(root, plan, log, log_level, broker_args=broker_args)
    s = c["storm"]
    puback_vs = _ratio(c["p99"], m["p99"])
    kib_vs = _ratio(c["kib"], m["kib"])
    log(
        f"cluster ({BROKERS} brokers), {c['connected']:,} devices, {plan.steady_s:g} s: "
        f"{c['msgs_per_s']:,.0f} readings/s acknowledged; PUBACK p50 {_f(c['p50'])} ms, p99 "
        f"{_f(c['p99'])} ms = {_f(puback_vs)} x mosquitto (target <= {TARGETS['puback_vs']:g}: "
        f"{_verdict(puback_vs is not None and puback_vs <= TARGETS['puback_vs'])})"
    )
    log(
        f"    brokers' RSS {c['rss_mib'][0]:.0f} -> {c['rss_mib'][1]:.0f} MiB = "
        f"{_f(c['kib'], '.1f')} KiB per connection = {_f(kib_vs)} x mosquitto (target <= "
        f"{TARGETS['kib_vs']:g}: {_verdict(kib_vs is not None and kib_vs <= TARGETS['kib_vs'])});"
        f" {_f(c['cpu_us'], '.0f')} us of broker CPU per message; command delivery p99 "
        f"{_f(c['command_p99'])} ms"
    )
    storm_ok = s["devices"] and s["publishing_99_s"] <= TARGETS["storm_s"]
    log(
        f"storm: {s['devices']:,} devices dropped by the kill; back {s['back']:,} (99% in "
        f"{_f(s['back_99_s'], '.1f')} s), publishing again {s['publishing']:,} (99% in "
        f"{_f(s['publishing_99_s'], '.1f')} s; target <= {TARGETS['storm_s']:g} s: "
        f"{_verdict(bool(storm_ok))}); CONNECTs accepted by the survivors: peak "
        f"{s['connects_peak']:,}/s, mean {_f(s['connects_mean'], '.0f')}/s until 99% were back"
    )
    log(
        f"    a plain fsync of a {FSYNC_PROBE_BYTES}-byte append on the brokers' filesystem "
        f"meanwhile: p50 {_f(c['fsync_p50'])} ms, p99 {_f(c['fsync_p99'])} ms (the promise our "
        "PUBACK keeps and mosquitto's does not: a quorum's fsync)"
    )
    interval_p99 = None
    if plan.fsync_interval:
        ci = cluster_phase(
            root, plan, log, log_level, fsync="interval", storm=False, broker_args=broker_args
        )
        interval_p99 = ci["p99"]
        log(
            f"cluster with --fsync interval, {ci['connected']:,} devices, {plan.steady_s:g} s: "
            f"PUBACK p50 {_f(ci['p50'])} ms, p99 {_f(interval_p99)} ms = "
            f"{_f(_ratio(interval_p99, m['p99']))} x mosquitto; lost {ci['lost']}"
        )
    if s["collateral"]:
        log(
            f"    WARNING: {s['collateral']} devices of the surviving brokers lost their "
            "connection during the storm"
        )
    if s["dropped_before"]:
        log(f"    WARNING: {s['dropped_before']} devices were dropped before the kill")
    if c["errors"]:
        log(f"    device errors (first of them): {c['errors'][:3]}")
    log(
        f"    sessions resumed {c['sessions_resumed']:,}, lost {c['sessions_lost']}; readings "
        f"resent {c['resent']:,}; commands delivered {c['commands_received']:,} of "
        f"{c['commands_sent']:,} published"
    )
    log(
        f"log: {c['consumed']:,} readings read back of {c['acknowledged']:,} acknowledged "
        f"({c['sent']:,} sent): lost {c['lost']} {list(c['lost_examples'][:3])}, duplicated "
        f"{c['duplicated']}"
    )
    problems = [e for e in (m["controller_error"], c["controller_error"]) if e is not None] + [
        f"{m['failed']} devices failed on mosquitto"
    ] * bool(m["failed"])
    if c["failed"]:
        problems.append(f"{c['failed']} devices failed on the cluster: {c['errors'][:2]}")
    if c["sessions_lost"]:
        problems.append(f"{c['sessions_lost']} sessions lost")
    problems += c["unfenced"]
    for problem in problems:
        print(f"WARNING: {problem}")
    print(steal)
    print(
        f"RESULT devices={c['connected']} lost={c['lost']} duplicated={c['duplicated']} "
        f"puback_p99_ms={_f(c['p99'])} puback_p99_vs_mosquitto={_f(puback_vs)} "
        f"kib_per_conn={_f(c['kib'], '.1f')} kib_per_conn_vs_mosquitto={_f(kib_vs)} "
        f"command_p99_ms={_f(c['command_p99'])} storm_devices={s['devices']} "
        f"storm_99pct_back_s={_f(s['publishing_99_s'], '.1f')} "
        f"puback_p50_ms={_f(c['p50'])} mosquitto_puback_p99_ms={_f(m['p99'])} "
        f"mosquitto_kib_per_conn={_f(m['kib'], '.1f')} "
        f"mosquitto_command_p99_ms={_f(m['command_p99'])} cpu_us_per_msg={_f(c['cpu_us'], '.0f')} "
        f"mosquitto_cpu_us_per_msg={_f(m['cpu_us'], '.0f')} "
        f"storm_99pct_connected_s={_f(s['back_99_s'], '.1f')} "
        f"storm_connects_peak_per_s={s['connects_peak']} "
        f"storm_connects_mean_per_s={_f(s['connects_mean'], '.0f')} "
        f"storm_collateral_drops={s['collateral']} dropped_before_storm={s['dropped_before']} "
        f"sessions_lost={c['sessions_lost']} commands_sent={c['commands_sent']} "
        f"commands_received={c['commands_received']} "
        f"fsync_p50_ms={_f(c['fsync_p50'])} fsync_p99_ms={_f(c['fsync_p99'])} "
        f"puback_p99_interval_ms={_f(interval_p99)} "
        f"puback_p99_interval_vs_mosquitto={_f(_ratio(interval_p99, m['p99']))} "
        f"steal_pct={steal.percent():.1f}"
    )
    return 1 if problems or c["lost"] or c["duplicated"] else 0


def _stop(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds: brokers, mosquitto, generators stopped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.fleet",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="5,000 devices for 60 s")
    parser.add_argument("--devices", type=int, help="override the fleet's size (development)")
    for name in ("steady_s", "storm_s", "mosquitto_s", "warmup", "interval"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=float, help="(development)")
    parser.add_argument(
        "--keep", action="store_true", help="keep the scratch directory (the brokers' logs)"
    )
    parser.add_argument("--log-level", default="WARNING", help="the brokers' (with --keep)")
    parser.add_argument(
        "--fsync-interval",
        action="store_true",
        help="also the steady window on brokers with --fsync interval (about 2 more minutes)",
    )
    parser.add_argument(
        "--write-timeout", type=float, help="the brokers' write timeout in seconds (development)"
    )
    parser.add_argument(
        "--clean-sessions", action="store_true", help="clean sessions (the storm without takeovers)"
    )
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    overrides = {
        name: getattr(args, name)
        for name in ("devices", "steady_s", "storm_s", "mosquitto_s", "warmup", "interval")
        if getattr(args, name)
    }
    if args.clean_sessions:
        overrides["persistent"] = False
    if args.fsync_interval:
        overrides["fsync_interval"] = True
    plan = Plan(**{**plan.__dict__, **overrides})
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGHUP, _stop)
    broker_args = [] if args.write_timeout is None else ["--write-timeout", str(args.write_timeout)]
    root = make_scratch()
    try:
        return run(root, plan, args.log_level, broker_args)
    finally:
        if args.keep:
            # Renamed out of the scratch prefix: the next bench run of anyone (make_scratch)
            # removes every scratch directory whose process is gone.
            kept = root.with_name(f"kq-kept-fleet-{root.name.rsplit('-', 1)[-1]}")
            root.rename(kept)
            print(f"scratch directory kept: {kept}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
