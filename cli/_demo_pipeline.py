"""The live part of ``kafkaesque demo``: devices, the controller, a fault, and a status line.

Everything here runs in one trio nursery that ``run_pipeline`` owns: the simulated devices (a
``kafkaesque devices`` subprocess), the controller (a consumer-group reader of ``readings`` that
sends commands back), a probe that times writes to the partition whose leader is killed (the
failover gap), the fault itself, and the status line. Blocking calls on the cluster (starting a
broker process) cross to a worker thread with ``trio.to_thread``.
"""

from __future__ import annotations

import itertools
import json
import math
import sys
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

import trio

from kafkaesque.client import (
    AsyncClient,
    AsyncGroupConsumer,
    ClientConfig,
    KafkaesqueError,
    open_producer,
)
from kafkaesque.local_cluster import LocalCluster

READINGS = "readings"
COMMANDS = "commands"
CONTROLLER_GROUP = "controller"


@dataclass(frozen=True)
class DemoPlan:
    """How big and how long: ``devices`` publishing every ``interval_s`` for ``duration_s``."""

    devices: int
    interval_s: float
    duration_s: float
    fault_at_s: float  # kill -9 the leader of readings/0 this long after the devices start
    restart_after_s: float  # and start it again this long after
    slow_until_s: float  # the controller reads at half the devices' rate until then
    command_every: int  # a command for every n-th serial a device sends

    @property
    def device_rate(self) -> float:
        return self.devices / self.interval_s


@dataclass
class Fault:
    broker: int = -1
    partition: int = 0
    killed_at: float = math.nan  # wall-clock seconds
    restarted_at: float = math.nan


@dataclass
class PipelineResult:
    """What the live part saw; the report adds what the log and Spark say afterwards."""

    started_at: float
    devices_report: dict[str, Any]
    consumed: int = 0
    commands_sent: int = 0
    fault: Fault = field(default_factory=Fault)
    probe_acks: list[tuple[float, float]] = field(default_factory=list)  # (sent, acked) wall s
    probe_failures: int = 0

    @property
    def failover_gap_s(self) -> float:
        """The longest time without an acknowledged probe write, around the fault."""
        acked = sorted(ack for _, ack in self.probe_acks)
        gaps = [b - a for a, b in itertools.pairwise(acked)]
        return max(gaps, default=math.nan)


async def run_pipeline(
    cluster: LocalCluster,
    plan: DemoPlan,
    out: TextIO,
    devices_command: list[str],
    client_config: ClientConfig | None = None,
    devices_env: dict[str, str] | None = None,
) -> PipelineResult:
    """Run devices, controller, probe, fault and status until the devices are done and the
    controller has read everything; returns what happened. ``client_config``: how the
    controller, probe and status connect (their security); ``devices_env``: the devices
    process's environment (None: this one's)."""
    result = PipelineResult(started_at=time.time(), devices_report={})
    devices_done = trio.Event()
    config = client_config or ClientConfig()
    async with (
        AsyncClient(cluster.bootstrap, config=config) as client,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(_devices, devices_command, result, devices_done, devices_env)
        nursery.start_soon(_controller, client, plan, result, devices_done)
        nursery.start_soon(_fault, cluster, client, plan, result)
        nursery.start_soon(_probe, client, result, devices_done)
        nursery.start_soon(_status, client, plan, result, devices_done, out, nursery)
    return result


async def _devices(
    command: list[str], result: PipelineResult, done: trio.Event, env: dict[str, str] | None
) -> None:
    try:
        proc = await trio.run_process(
            command, capture_stdout=True, capture_stderr=True, check=False, env=env
        )
    finally:
        done.set()
    lines = proc.stdout.decode(errors="replace").strip().splitlines()
    # Status 1 with a report means readings were lost: the summary says so, and the demo fails.
    if proc.returncode not in (0, 1) or not lines:
        raise DemoRunError(
            f"the devices exited with status {proc.returncode}: "
            f"{proc.stderr.decode(errors='replace').strip()[-2000:]}"
        )
    result.devices_report = json.loads(lines[-1])


class DemoRunError(Exception):
    """A part of the demo failed; the message says which and why."""


async def _controller(
    client: AsyncClient, plan: DemoPlan, result: PipelineResult, devices_done: trio.Event
) -> None:
    """Consume readings through a group at its own pace; command every n-th serial's device.

    Slower than the devices until ``slow_until_s`` (the log absorbs the burst), then as fast as
    it can; it stops once the devices are done and it has read up to the log's end.
    """
    consumer = AsyncGroupConsumer(client, READINGS, CONTROLLER_GROUP, auto_offset_reset="earliest")
    slow_rate = plan.device_rate / 2
    last_commit = trio.current_time()
    async with open_producer(client) as producer:
        while True:
            batch = await consumer.poll(timeout=0.5, max_records=200)
            for record in batch:
                result.consumed += 1
                reading = _reading(record.value)
                if reading is not None and reading[1] % plan.command_every == 0:
                    command = {"command": "set-gain", "serial": reading[1], "ts_ms": _now_ms()}
                    await producer.send(COMMANDS, json.dumps(command).encode(), reading[0])
                    result.commands_sent += 1
            now = trio.current_time()
            if now - last_commit >= 1.0:
                await _commit(consumer)
                last_commit = now
            if time.time() - result.started_at < plan.slow_until_s and batch:
                await trio.sleep(len(batch) / slow_rate)
            if not batch and devices_done.is_set() and await _caught_up(client, consumer):
                await _commit(consumer)
                return


async def _commit(consumer: AsyncGroupConsumer) -> None:
    """Commit what was read. A subscription that expired meanwhile (``UNKNOWN_SUBSCRIPTION``: its
    broker was the one killed, and the session timed out before the controller got back) is not
    an error here, as Kafka's CommitFailedException after a rebalance: the next poll subscribes
    again and the next commit goes through the new subscription."""
    try:
        await consumer.commit()
    except KafkaesqueError as exc:
        if exc.code_name != "UNKNOWN_SUBSCRIPTION":
            raise


async def _caught_up(client: AsyncClient, consumer: AsyncGroupConsumer) -> bool:
    description = await client.describe_topic(READINGS)
    await _commit(consumer)
    committed = await client.committed_offsets(CONTROLLER_GROUP, READINGS)
    return all(
        (committed.get(row.partition) or 0) >= (row.end_offset or 0)
        for row in description.partitions
    )


def _reading(value: bytes | None) -> tuple[bytes, int] | None:
    """(device id, serial) of a reading's JSON, or None for anything else."""
    try:
        data = json.loads(value or b"")
        return str(data["device"]).encode(), int(data["serial"])
    except (ValueError, KeyError, TypeError):
        return None


async def _fault(
    cluster: LocalCluster, client: AsyncClient, plan: DemoPlan, result: PipelineResult
) -> None:
    """kill -9 the leader of readings/0 at ``fault_at_s``; start it again later."""
    fault = result.fault
    await trio.sleep(plan.fault_at_s)
    description = await client.describe_topic(READINGS)
    leader = description.partitions[fault.partition].leader
    fault.broker = leader if leader is not None else 0
    cluster.kill(fault.broker)
    fault.killed_at = time.time()
    await trio.sleep(plan.restart_after_s)
    await trio.to_thread.run_sync(cluster.start, fault.broker)
    fault.restarted_at = time.time()


async def _probe(client: AsyncClient, result: PipelineResult, devices_done: trio.Event) -> None:
    """Write to readings/0 every 50 ms and keep (sent, acknowledged) times: the longest pause
    between acknowledgements is the failover gap a writer saw."""
    n = 0
    async with open_producer(client) as producer:
        while not devices_done.is_set():
            sent = time.time()
            value = json.dumps({"probe": n, "ts_ms": int(sent * 1000)}).encode()
            try:
                future = await producer.send(READINGS, value, partition=result.fault.partition)
                await future.get()
                result.probe_acks.append((sent, time.time()))
            except KafkaesqueError:
                result.probe_failures += 1
            n += 1
            await trio.sleep(0.05)


async def _status(
    client: AsyncClient,
    plan: DemoPlan,
    result: PipelineResult,
    devices_done: trio.Event,
    out: TextIO,
    nursery: trio.Nursery,
) -> None:
    """A status line every second (rewritten in place on a terminal, a line every 5 s if not)."""
    tty = out.isatty()
    last_line = -math.inf
    while True:
        elapsed = time.time() - result.started_at
        line = await _status_line(client, plan, result, elapsed)
        if tty:
            out.write("\r\x1b[2K" + line)
            out.flush()
        elif elapsed - last_line >= 5:
            print(line, file=out, flush=True)
            last_line = elapsed
        if devices_done.is_set() and len(nursery.child_tasks) <= 1:
            break
        await trio.sleep(1.0)
    if tty:
        out.write("\n")


async def _status_line(
    client: AsyncClient, plan: DemoPlan, result: PipelineResult, elapsed: float
) -> str:
    try:
        description = await client.describe_topic(READINGS)
    except KafkaesqueError as exc:
        return f"t={elapsed:5.1f}s  (metadata unavailable: {exc})"
    in_log = sum(row.end_offset or 0 for row in description.partitions)
    leaders = " ".join(
        f"{row.partition}:{'-' if row.leader is None else row.leader}"
        for row in description.partitions
    )
    fault = result.fault
    if math.isnan(fault.killed_at):
        state = f"fault at t={plan.fault_at_s:.0f}s"
    elif math.isnan(fault.restarted_at):
        state = f"broker {fault.broker} KILLED"
    else:
        state = f"broker {fault.broker} back"
    return (
        f"t={elapsed:5.1f}s  devices={plan.devices}  log end={in_log:,}  "
        f"controller read={result.consumed:,} lag={max(0, in_log - result.consumed):,}  "
        f"commands={result.commands_sent:,}  leaders {leaders}  {state}"
    )


def _now_ms() -> int:
    return int(time.time() * 1000)


def devices_command(
    cluster: LocalCluster,
    plan: DemoPlan,
    mqtt_addresses: list[str],
    extra: list[str] | None = None,
) -> list[str]:
    """The ``kafkaesque devices`` command line the demo runs (``extra``: more flags)."""
    return [
        sys.executable, "-m", "kafkaesque.cli", "devices",
        "--mqtt", ",".join(mqtt_addresses),
        "--devices", str(plan.devices),
        "--interval", str(plan.interval_s),
        "--duration", str(plan.duration_s),
        "--qos", "1",
        "--bootstrap", cluster.bootstrap,
        "--json",
        *(extra or []),
    ]  # fmt: skip


__all__ = [
    "COMMANDS",
    "READINGS",
    "DemoPlan",
    "DemoRunError",
    "PipelineResult",
    "devices_command",
    "run_pipeline",
]
