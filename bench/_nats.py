"""NATS JetStream, the peer the benchmarks measure beside Kafkaesque in the same run.

``NatsCluster`` starts ``n`` ``nats-server`` processes on free loopback ports in a scratch
directory: a cluster (full mesh of routes) with JetStream on file storage and, if asked, an MQTT
listener on every node (``stream_replicas`` = ``n``, so an MQTT session's QoS 1 messages are
replicated like the log's). It is a context manager: on entry it waits, bounded, until every
node reports itself healthy (JetStream in contact with its meta leader); on exit it kills every
process and waits for it, whatever happened (no process outlives the block).

``create_stream`` makes a stream of ``n`` replicas on file storage and waits until it has a leader
and every replica is current, so the first publish of a measurement is not an election.

What a JetStream publish acknowledgement means (server 2.9): the stream's leader has the message
and a quorum of its replicas has stored it, **written but not fsynced** (the file store syncs
every two minutes; 2.9 has no setting to sync each write). Kafkaesque's brokers fsync before
they acknowledge. Both are printed beside each other; the difference is stated with them.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from kafkaesque.local_cluster import free_ports

NATS_SERVER = "/usr/sbin/nats-server"
ACK_DURABILITY = "a quorum of replicas has written it, not fsynced (nats-server 2.9's file store)"


class NatsError(RuntimeError):
    """The NATS cluster did not start, or did not become ready in time."""


def nats_server() -> str | None:
    """The ``nats-server`` executable (Debian's, else on PATH), or None if it is not installed."""
    return NATS_SERVER if Path(NATS_SERVER).exists() else shutil.which("nats-server")


def nats_version() -> str:
    """``nats-server --version``'s version (``v2.9.10``), or ``?`` if it cannot say."""
    exe = nats_server()
    if exe is None:
        return "?"
    try:
        out = subprocess.run(
            [exe, "--version"], check=False, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    return out.stdout.strip().rpartition(" ")[2] or "?"


def nats_missing() -> str | None:
    """Why NATS cannot be measured here (no server, or no ``nats-py`` client), or None."""
    if nats_server() is None:
        return "nats-server is not installed (Debian package nats-server)"
    try:
        import nats  # noqa: F401  (only whether it imports)
    except ImportError:
        return "the Python client nats-py is not installed"
    return None


@dataclass(frozen=True)
class NatsNode:
    """One server's name and loopback ports (``mqtt_port`` 0: no MQTT listener)."""

    name: str
    client_port: int
    cluster_port: int
    http_port: int
    mqtt_port: int

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.client_port}"


class NatsCluster:
    """``n`` JetStream servers on loopback in ``directory``; a context manager that always kills
    them. ``NatsError`` from ``__enter__`` if a server exits or the cluster is not healthy within
    ``ready_timeout`` seconds (the processes are stopped first)."""

    def __init__(
        self,
        directory: Path,
        n: int = 3,
        *,
        mqtt: bool = False,
        ready_timeout: float = 30.0,
    ) -> None:
        exe = nats_server()
        if exe is None:
            raise NatsError("nats-server is not installed")
        if n < 1:
            raise ValueError("a cluster has at least one server")
        self.directory = directory
        self.ready_timeout = ready_timeout
        ports = free_ports(4 * n)
        self.nodes = [
            NatsNode(
                name=f"n{i}",
                client_port=ports[4 * i],
                cluster_port=ports[4 * i + 1],
                http_port=ports[4 * i + 2],
                mqtt_port=ports[4 * i + 3] if mqtt else 0,
            )
            for i in range(n)
        ]
        self.executable = exe
        self.procs: list[subprocess.Popen[bytes]] = []  # started by __enter__

    def _config(self, node: NatsNode) -> str:
        routes = ", ".join(
            f"nats-route://127.0.0.1:{other.cluster_port}"
            for other in self.nodes
            if other is not node
        )
        store = self.directory / f"{node.name}-store"
        lines = [
            f"server_name: {node.name}",
            f"listen: 127.0.0.1:{node.client_port}",
            f"http: 127.0.0.1:{node.http_port}",
            f'log_file: "{self.directory / (node.name + ".log")}"',
            # The generator's window of async publishes sits in the server's buffers.
            "max_pending: 64MB",
            "jetstream {",
            f'  store_dir: "{store}"',
            "  max_memory_store: 256MB",
            "  max_file_store: 4GB",
            "}",
        ]
        if len(self.nodes) > 1:
            lines += [
                "cluster {",
                "  name: bench",
                f"  listen: 127.0.0.1:{node.cluster_port}",
                f"  routes: [{routes}]",
                "}",
            ]
        if node.mqtt_port:
            lines += [
                "mqtt {",
                f"  listen: 127.0.0.1:{node.mqtt_port}",
                f"  stream_replicas: {len(self.nodes)}",
                "}",
            ]
        return "\n".join(lines) + "\n"

    # -- what the benchmarks use ------------------------------------------------------------

    @property
    def servers(self) -> list[str]:
        """Every node's client URL (``nats://127.0.0.1:port``)."""
        return [node.url for node in self.nodes]

    @property
    def pids(self) -> list[int]:
        return [proc.pid for proc in self.procs]

    @property
    def mqtt_addresses(self) -> tuple[tuple[str, int], ...]:
        """The MQTT listeners, one per node (empty without ``mqtt=True``)."""
        return tuple(("127.0.0.1", node.mqtt_port) for node in self.nodes if node.mqtt_port)

    def create_stream(self, name: str, subject: str, timeout: float = 30.0) -> None:
        """A stream ``name`` on ``subject``, one replica per node, file storage; returns once it
        has a leader and every replica is current. ``NatsError`` after ``timeout`` seconds."""
        asyncio.run(self._create_stream(name, subject, timeout))

    def stream_last_seq(self, name: str, timeout: float = 10.0) -> int:
        """The sequence number of the last message stored in stream ``name`` (0: none yet).
        Messages an interest-based stream removed at once still advanced it."""
        return asyncio.run(self._stream_last_seq(name, timeout))

    def log_tail(self, lines: int = 10) -> str:
        """The last lines of every server's log, for an error message."""
        out = []
        for node in self.nodes:
            path = self.directory / f"{node.name}.log"
            if path.exists():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- {node.name}\n" + "\n".join(tail))
        return "\n".join(out)

    async def _create_stream(self, name: str, subject: str, timeout: float) -> None:
        import nats
        from nats.js.api import StorageType, StreamConfig

        deadline = time.monotonic() + timeout
        nc = await nats.connect(servers=self.servers, connect_timeout=5)
        try:
            js = nc.jetstream(timeout=10)
            config = StreamConfig(
                name=name,
                subjects=[subject],
                storage=StorageType.FILE,
                num_replicas=len(self.nodes),
            )
            while True:  # the meta leader may still be settling: retry until the deadline
                try:
                    await js.add_stream(config)
                    break
                except nats.errors.Error as error:
                    if time.monotonic() > deadline:
                        raise NatsError(f"stream {name} not created: {error!r}") from error
                    await asyncio.sleep(0.2)
            while True:
                info = await js.stream_info(name)
                cluster = info.cluster
                replicas = (cluster.replicas or []) if cluster is not None else []
                ready = (
                    cluster is not None
                    and bool(cluster.leader)
                    and len(replicas) == len(self.nodes) - 1
                    and all(r.current for r in replicas)
                )
                if ready or (len(self.nodes) == 1 and cluster is None):
                    return
                if time.monotonic() > deadline:
                    raise NatsError(f"stream {name} has no leader or a lagging replica: {cluster}")
                await asyncio.sleep(0.1)
        finally:
            await nc.close()

    async def _stream_last_seq(self, name: str, timeout: float) -> int:
        import nats

        nc = await nats.connect(servers=self.servers, connect_timeout=5)
        try:
            info = await nc.jetstream(timeout=timeout).stream_info(name)
            return int(info.state.last_seq)
        finally:
            await nc.close()

    # -- start and stop ---------------------------------------------------------------------

    def _healthy(self, node: NatsNode) -> bool:
        """``/healthz``: the server is up and its JetStream is in contact with a meta leader."""
        url = f"http://127.0.0.1:{node.http_port}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                return bool(json.loads(reply.read()).get("status") == "ok")
        except (OSError, urllib.error.URLError, ValueError):
            return False

    def __enter__(self) -> NatsCluster:
        deadline = time.monotonic() + self.ready_timeout
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            for node in self.nodes:
                conf = self.directory / f"{node.name}.conf"
                conf.write_text(self._config(node))
                self.procs.append(
                    subprocess.Popen(
                        [self.executable, "-c", str(conf)],
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                )
            waiting = list(self.nodes)
            while waiting:
                for proc, node in zip(self.procs, self.nodes, strict=True):
                    if proc.poll() is not None:
                        raise NatsError(
                            f"nats-server {node.name} exited ({proc.returncode}):\n"
                            + self.log_tail()
                        )
                waiting = [node for node in waiting if not self._healthy(node)]
                if waiting and time.monotonic() > deadline:
                    names = ", ".join(node.name for node in waiting)
                    raise NatsError(
                        f"nats-server {names} not healthy within {self.ready_timeout:.0f} s:\n"
                        + self.log_tail()
                    )
                if waiting:
                    time.sleep(0.1)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs:
            proc.wait()
