"""Write-path benchmark: Python calls per write in each broker, and CPU per write against an echo.

    python -m bench.write_path [--quick]

Three real brokers on loopback (``LocalCluster``), replication factor 3, each broker started by
``bench._profiled_broker`` so that its event loop can be cProfiled on a signal.

* **Calls per write (deterministic).** A one-partition topic; one client on a raw socket sends
  ``WRITES`` sequential unbatched ``PUBS`` lines to the partition's leader, each after the
  previous ``+OK``. cProfile runs in every broker's event loop from just before the first line to
  just after the last reply; every call it records (Python functions and builtins) is divided by
  the writes. The same for MQTT: one device on the leader's MQTT listener sends ``WRITES``
  sequential QoS 1 PUBLISHes, each after the previous PUBACK, mapped into a one-partition topic.
  Idle work in the window (ticks, heartbeats) counts too, as it would in any real window.
* **CPU per write.** A three-partition topic; ``PUB topic partition=N -- value`` lines paced at
  ``RATE`` writes/s, round-robin over the partitions, each on a connection to its partition's
  leader (no forwarding, no batching by the client). The brokers' CPU (``/proc``, all threads) per
  acknowledged write is printed as a ratio to the CPU a ``FdStream`` echo server spends per small
  message (``bench.device_io``'s ``fd`` server), measured in the same run.
* **The floor of that ratio.** What no design that fsyncs every write on each of three replicas and
  reads each network message in a pass of the event loop can go below: the CPU of one
  durable write of a small record on the brokers' file system as the log makes it (into a
  preallocated file, then ``fdatasync``: plain file I/O, measured in the same run) three times,
  plus ``MIN_PASSES`` echoes (the leader reads the request, its fsync's end and two
  acknowledgements; each follower the append and its fsync's end), over the echo.

Ends with ``RESULT calls_per_write_leader=… calls_per_write_follower=…
mqtt_calls_per_write_leader=… mqtt_calls_per_write_follower=… cpu_per_write_vs_echo=…
cpu_us_per_write=… echo_us=… fsync_cpu_us=… append_fsync_cpu_us=… cpu_floor_vs_echo=… …`` (the
follower figure is the larger of the two followers'; ``append_fsync_cpu_us`` is an append and
``fsync`` to a growing file, what the log paid before its segments were preallocated).
"""

from __future__ import annotations

import argparse
import os
import pstats
import shutil
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from kafkaesque.client import Client
from kafkaesque.local_cluster import LocalCluster

from ._broker_procs import StealWindow, make_scratch, process_cpu_s
from .device_io import echo_cpu_us

BROKERS = 3
RATE = 1_000
MQTT_RULES = "wp/+ -> wp-mqtt\n"
TARGETS = {"leader": 500, "follower": 250, "cpu_vs_echo": 9.0}
MIN_PASSES = 4 + 2 + 2  # passes of the event loops per write in a design of no waste (docstring)
FSYNC_SAMPLES = 2_000


@dataclass(frozen=True)
class Plan:
    writes: int  # sequential writes counted per profile
    paced_s: float  # seconds of paced writes for the CPU figure
    echo_s: float  # seconds of each echo round


QUICK = Plan(writes=2_000, paced_s=5.0, echo_s=3.0)
FULL = Plan(writes=5_000, paced_s=15.0, echo_s=10.0)


class ProfiledCluster(LocalCluster):
    """A ``LocalCluster`` whose brokers run under ``bench._profiled_broker``."""

    def __init__(self, data_dir: str, stats_dir: Path) -> None:
        super().__init__(data_dir, BROKERS, mqtt=True, mqtt_rules=MQTT_RULES)
        self.stats_dir = stats_dir
        self.window_s = 0.0  # how long the last profiled run took

    def program(self, broker: int) -> list[str]:
        stats = str(self.stats_dir / f"broker-{broker}.prof")
        return [sys.executable, "-m", "bench._profiled_broker", stats]

    def profile_calls(self, run: Callable[[], None]) -> list[int]:
        """Calls each broker's event loop makes while ``run()`` runs."""
        for f in self.stats_dir.glob("*.prof"):
            f.unlink()
        for i in range(self.n):
            self.procs[i].send_signal(signal.SIGUSR1)
        time.sleep(0.2)  # every handler ran before the first write
        began = time.monotonic()
        run()
        self.window_s = time.monotonic() - began
        for i in range(self.n):
            self.procs[i].send_signal(signal.SIGUSR2)
        calls = []
        for i in range(self.n):
            path = self.stats_dir / f"broker-{i}.prof"
            deadline = time.monotonic() + 30
            while not path.exists():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"broker {i} wrote no profile")
                time.sleep(0.05)
            calls.append(int(pstats.Stats(str(path)).total_calls))  # type: ignore[attr-defined]
        return calls


def leader_of(client: Client, topic: str, partition: int, timeout: float = 30.0) -> int:
    """The broker id leading ``topic``/``partition``, once one is known."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = client.refresh_metadata([topic]).leader(topic, partition)
        if row is not None:
            return row.broker_id
        time.sleep(0.1)
    raise RuntimeError(f"{topic}/{partition} has no leader after {timeout:.0f} s")


class LineSocket:
    """A blocking line-protocol connection that reads replies a line at a time."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.sock = socket.create_connection(address, timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = b""

    def readline(self) -> bytes:
        while b"\n" not in self.buffer:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise RuntimeError("the broker closed the connection")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.rstrip(b"\r")

    def request(self, line: bytes) -> bytes:
        self.sock.sendall(line)
        reply = self.readline()
        if not reply.startswith(b"+OK"):
            raise RuntimeError(f"{line!r} answered {reply!r}")
        return reply

    def close(self) -> None:
        self.sock.close()


class MqttDevice:
    """One MQTT 3.1.1 device on a raw socket: CONNECT, then QoS 1 PUBLISHes one at a time."""

    def __init__(self, address: tuple[str, int], client_id: str) -> None:
        self.sock = socket.create_connection(address, timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        cid = client_id.encode()
        variable = b"\x00\x04MQTT\x04\x02\x00\x3c" + struct.pack("!H", len(cid)) + cid
        self.sock.sendall(bytes([0x10, len(variable)]) + variable)
        connack = self._read(4)
        if connack[0] != 0x20 or connack[3] != 0:
            raise RuntimeError(f"CONNECT refused: {connack!r}")
        self.packet_id = 0

    def _read(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise RuntimeError("the broker closed the MQTT connection")
            data += chunk
        return data

    def publish(self, topic: str, payload: bytes) -> None:
        self.packet_id = self.packet_id % 65535 + 1
        name = topic.encode()
        body = struct.pack("!H", len(name)) + name + struct.pack("!H", self.packet_id) + payload
        assert len(body) < 128
        self.sock.sendall(bytes([0x32, len(body)]) + body)
        puback = self._read(4)
        if puback[0] != 0x40 or struct.unpack("!H", puback[2:4])[0] != self.packet_id:
            raise RuntimeError(f"expected PUBACK {self.packet_id}, got {puback!r}")

    def close(self) -> None:
        self.sock.sendall(b"\xe0\x00")  # DISCONNECT
        self.sock.close()


def per_write(calls: list[int], leader: int, writes: int) -> tuple[float, float]:
    """(calls per write at the leader, the most at any follower)."""
    followers = [c for i, c in enumerate(calls) if i != leader]
    return calls[leader] / writes, max(followers) / writes


def line_calls(cluster: ProfiledCluster, client: Client, writes: int) -> tuple[float, float]:
    topic = "wp-line"
    client.create_topic(topic, 1, BROKERS)
    leader = leader_of(client, topic, 0)
    conn = LineSocket(cluster.client_address(leader))
    try:
        for i in range(200):  # warm-up: connections, caches, the appender
            conn.request(b"PUBS %s warm-%d\r\n" % (topic.encode(), i))

        def run() -> None:
            for i in range(writes):
                conn.request(b"PUBS %s message-%06d\r\n" % (topic.encode(), i))

        calls = cluster.profile_calls(run)
    finally:
        conn.close()
    print(
        f"  PUBS, sequential, to the leader (broker {leader}), {cluster.window_s:.1f} s under "
        f"the profiler: calls per broker {calls}"
    )
    return per_write(calls, leader, writes)


def mqtt_calls(cluster: ProfiledCluster, client: Client, writes: int) -> tuple[float, float]:
    client.create_topic("wp-mqtt", 1, BROKERS)
    leader = leader_of(client, "wp-mqtt", 0)
    device = MqttDevice(cluster.mqtt_address(leader), "wp-device")
    try:
        for i in range(200):
            device.publish("wp/device", b"warm-%d" % i)

        def run() -> None:
            for i in range(writes):
                device.publish("wp/device", b"reading-%06d" % i)

        calls = cluster.profile_calls(run)
    finally:
        device.close()
    print(
        f"  MQTT QoS 1, sequential, to the leader (broker {leader}), {cluster.window_s:.1f} s "
        f"under the profiler: calls per broker {calls}"
    )
    return per_write(calls, leader, writes)


def paced_cpu_us(cluster: LocalCluster, client: Client, seconds: float) -> float:
    """Brokers' CPU microseconds per acknowledged write at ``RATE`` paced writes/s."""
    topic, partitions = "wp-paced", 3
    client.create_topic(topic, partitions, BROKERS)
    conns = [LineSocket(cluster.client_address(leader_of(client, topic, p))) for p in range(3)]
    pids = [cluster.procs[i].pid for i in range(cluster.n)]
    try:
        for p, conn in enumerate(conns):  # warm-up
            for i in range(50):
                conn.request(b"PUB %s partition=%d -- warm-%d\r\n" % (topic.encode(), p, i))
        for conn in conns:
            conn.sock.setblocking(False)
        cpu0, start = sum(process_cpu_s(p) for p in pids), time.monotonic()
        sent = acked = 0
        while (now := time.monotonic()) - start < seconds:
            while sent < int((now - start) * RATE):
                p = sent % partitions
                line = b"PUB %s partition=%d -- paced-%07d\r\n" % (topic.encode(), p, sent)
                conns[p].sock.sendall(line)
                sent += 1
            acked += _drain(conns)
            time.sleep(0.0005)
        deadline = time.monotonic() + 30
        while acked < sent and time.monotonic() < deadline:
            acked += _drain(conns)
            time.sleep(0.001)
        cpu = sum(process_cpu_s(p) for p in pids) - cpu0
    finally:
        for conn in conns:
            conn.close()
    if acked < sent:
        raise RuntimeError(f"only {acked} of {sent} paced writes answered")
    return 1e6 * cpu / acked


def fsync_cpu_us(directory: Path, samples: int = FSYNC_SAMPLES, *, preallocate: bool) -> float:
    """CPU microseconds (user + system, this thread) of writing 100 bytes to a file in
    ``directory`` and making them durable, per write: what each replica's log pays per
    unbatched write. ``preallocate``: as the log does it (a file extended ahead of the writes,
    ``fdatasync``: see kafkaesque/storage/_segment.py); else appends and ``fsync``."""
    path = directory / "fsync-probe"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    record = b"r" * 100
    try:
        if preallocate:
            os.posix_fallocate(fd, 0, samples * len(record))
            os.fsync(fd)
        sync = os.fdatasync if preallocate else os.fsync
        began = time.thread_time()
        for i in range(samples):
            os.pwrite(fd, record, i * len(record))
            sync(fd)
        return 1e6 * (time.thread_time() - began) / samples
    finally:
        os.close(fd)
        path.unlink()


def _drain(conns: list[LineSocket]) -> int:
    """Replies read from every connection without blocking; raises on an -ERR."""
    got = 0
    for conn in conns:
        try:
            chunk = conn.sock.recv(65536)
        except BlockingIOError:
            continue
        if not chunk:
            raise RuntimeError("the broker closed the connection")
        conn.buffer += chunk
        *lines, conn.buffer = conn.buffer.split(b"\n")
        for line in lines:
            if not line.startswith(b"+OK"):
                raise RuntimeError(f"paced write answered {line!r}")
            got += 1
    return got


def run(root: Path, plan: Plan) -> int:
    steal = StealWindow()
    stats_dir = root / "stats"
    stats_dir.mkdir()
    with (
        ProfiledCluster(str(root / "cluster"), stats_dir) as cluster,
        Client(cluster.bootstrap) as client,
    ):
        print(f"cluster: {BROKERS} brokers, replication factor {BROKERS}, one-partition topics")
        print(f"calls per write, {plan.writes:,} sequential writes, cProfile in each broker:")
        line_leader, line_follower = line_calls(cluster, client, plan.writes)
        print(f"    per write: leader {line_leader:.0f}, follower (max) {line_follower:.0f}")
        mqtt_leader, mqtt_follower = mqtt_calls(cluster, client, plan.writes)
        print(f"    per write: leader {mqtt_leader:.0f}, follower (max) {mqtt_follower:.0f}")
        cpu_us = paced_cpu_us(cluster, client, plan.paced_s)
    echo_us = echo_cpu_us(plan.echo_s)
    fsync_us = fsync_cpu_us(root, preallocate=True)
    append_fsync_us = fsync_cpu_us(root, preallocate=False)
    ratio = cpu_us / echo_us
    floor = (BROKERS * fsync_us + MIN_PASSES * echo_us) / echo_us
    print(
        f"CPU per write at {RATE:,} paced PUB/s to the leaders: {cpu_us:,.0f} us (3 brokers); "
        f"FdStream echo: {echo_us:.1f} us per message; ratio {ratio:.1f} "
        f"(target <= {TARGETS['cpu_vs_echo']:g})"
    )
    print(
        f"floor: durable write of a record {fsync_us:.1f} us of CPU (preallocated, fdatasync; "
        f"an append + fsync: {append_fsync_us:.1f} us); {BROKERS} of them and "
        f"{MIN_PASSES} echoes = {floor:.1f} echoes per write"
    )
    print(steal)
    print(
        f"RESULT calls_per_write_leader={line_leader:.0f} "
        f"calls_per_write_follower={line_follower:.0f} "
        f"mqtt_calls_per_write_leader={mqtt_leader:.0f} "
        f"mqtt_calls_per_write_follower={mqtt_follower:.0f} "
        f"cpu_per_write_vs_echo={ratio:.1f} cpu_us_per_write={cpu_us:.0f} echo_us={echo_us:.1f} "
        f"fsync_cpu_us={fsync_us:.1f} append_fsync_cpu_us={append_fsync_us:.1f} "
        f"cpu_floor_vs_echo={floor:.1f} "
        f"steal_pct={steal.percent():.1f}"
    )
    return 0


def _stop(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds: the brokers are stopped, the scratch dir removed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.write_path",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="a shorter run (under 60 s)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _stop)
    root = make_scratch()
    try:
        return run(root, QUICK if args.quick else FULL)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
