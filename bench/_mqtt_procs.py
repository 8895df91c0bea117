"""Process plumbing of ``bench.mqtt``: a throwaway mosquitto (the baseline), resident memory of
processes, and the load generator's runs (``kafkaesque.cli.devices_fleet``) as one call each.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kafkaesque.cli.devices_fleet import Fleet, FleetSpec, Readiness, WorkerResult

from kafkaesque.local_cluster import free_ports

MOSQUITTO = "/usr/sbin/mosquitto"


class Mosquitto:
    """mosquitto on a free loopback port (anonymous, no persistence, no inflight limit); a context
    manager that always kills it. ``max_queued`` bounds the QoS 1 messages kept for a subscriber
    that is behind (0: unlimited, so that none is dropped and counted as lost); ``extra`` adds
    configuration lines."""

    def __init__(
        self, directory: Path, *, max_queued: int = 100_000, extra: tuple[str, ...] = ()
    ) -> None:
        (self.port,) = free_ports(1)
        directory.mkdir(parents=True, exist_ok=True)
        conf = directory / "mosquitto.conf"
        conf.write_text(
            f"listener {self.port} 127.0.0.1\n"
            "allow_anonymous true\n"
            "persistence false\n"
            "max_inflight_messages 0\n"  # no cap on QoS 1 messages in flight to a subscriber
            f"max_queued_messages {max_queued}\n"
            "log_dest none\n" + "".join(f"{line}\n" for line in extra)
        )
        self.proc = subprocess.Popen(
            [MOSQUITTO, "-c", str(conf)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    @property
    def address(self) -> tuple[str, int]:
        return "127.0.0.1", self.port

    def __enter__(self) -> Mosquitto:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(self.address, timeout=1).close()
                return self
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.__exit__()
                    raise
                time.sleep(0.05)

    def __exit__(self, *exc_info: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def rss_kib(pid: int) -> int:
    """Resident memory of ``pid`` in KiB (VmRSS), 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return 0
    return 0


@dataclass
class FleetRun:
    """A fleet's readiness and result, and whatever ``during`` returned while it ran."""

    ready: Readiness
    result: WorkerResult
    during: object = None


def run_fleet(
    spec: FleetSpec,
    processes: int,
    *,
    during: Callable[[Fleet, Readiness], object] | None = None,
    stop_after_during: bool = False,
) -> FleetRun:
    """Connect, ``go``, call ``during(fleet, readiness)`` (once publishing started), then wait
    for the result (``stop`` first when ``stop_after_during``)."""
    with Fleet(spec, processes) as fleet:
        ready = fleet.wait_ready()
        fleet.go()
        extra = during(fleet, ready) if during is not None else None
        if stop_after_during:
            fleet.stop()
        return FleetRun(ready, fleet.result(), extra)


def open_files_room(pid: int) -> int:
    """How many more files ``pid`` may open: its soft RLIMIT_NOFILE minus the files it has."""
    with open(f"/proc/{pid}/limits") as f:
        for line in f:
            if line.startswith("Max open files"):
                limit = int(line.split()[3])
                break
        else:
            raise RuntimeError(f"no open-files limit in /proc/{pid}/limits")
    return limit - open_files(pid)


def open_files(pid: int) -> int:
    """How many files ``pid`` has open now."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def settle_open_files(pid: int, at_most: int, timeout: float = 60.0) -> None:
    """Until ``pid`` has at most ``at_most`` files open (it closes the sockets of connections
    that ended in bursts, seconds later), or ``timeout`` seconds passed."""
    deadline = time.monotonic() + timeout
    while open_files(pid) > at_most and time.monotonic() < deadline:
        time.sleep(0.5)


def total_rss_kib(pids: Sequence[int]) -> int:
    return sum(rss_kib(pid) for pid in pids)
