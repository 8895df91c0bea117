"""``kafkaesque cluster up -n 3``: a local cluster of broker processes on loopback.

Each broker is its own ``kafkaesque broker`` process with its own ports, all under one data
directory (``.kafkaesque-data/cluster`` by default). The command prints where each broker
listens, waits until the cluster answers (every broker registered, a controller leader), prints
``ready``, and stops every broker on Ctrl-C or SIGTERM.

``LocalCluster`` is the same thing as a library, for the tests, the benchmarks and the fault
injector: start, kill -9, restart and stop single brokers, and always stop every process it
started.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import FrameType, TracebackType
from typing import Any, TextIO

DEFAULT_DATA_DIR = os.path.join(".kafkaesque-data", "cluster")
DEFAULT_BASE_PORT = 9092
_PORTS_PER_BROKER = 10  # client +0, peer +1, controller +2, admin +3, mqtt +4
_STOP_TIMEOUT_S = 10.0


class ClusterError(Exception):
    """The cluster could not start or answer; the message says why."""


@dataclass(frozen=True)
class BrokerPorts:
    client: int
    peer: int
    controller: int
    admin: int
    mqtt: int


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports the kernel says are free now (bound, read, released)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class LocalCluster:
    """``n`` broker processes on 127.0.0.1; a context manager that always stops them."""

    def __init__(
        self,
        data_dir: str,
        n: int = 3,
        *,
        base_port: int = 0,
        log_level: str = "WARNING",
        extra_args: list[str] | None = None,
        log_dir: str | None = None,
        spare: int = 0,
        mqtt: bool = False,
        mqtt_rules: str | None = None,
        mqtt_users: Mapping[str, str] | None = None,
    ) -> None:
        """``spare`` reserves ports for brokers added later with ``add_broker``.

        ``mqtt``: every broker also listens for MQTT devices (``mqtt_address(i)``), with the
        topic mapping rules ``mqtt_rules`` (their text; None: the default mapping) and the
        ``user: password`` pairs ``mqtt_users`` (None: anonymous devices).
        """
        if n < 1:
            raise ClusterError("a cluster needs at least one broker")
        self.data_dir = os.path.abspath(data_dir)
        self.n = n
        total = n + spare
        if base_port:
            self.ports = [
                BrokerPorts(*(base_port + _PORTS_PER_BROKER * i + k for k in range(5)))
                for i in range(total)
            ]
        else:
            flat = free_ports(5 * total)
            self.ports = [BrokerPorts(*flat[5 * i : 5 * i + 5]) for i in range(total)]
        self.log_level = log_level
        self.extra_args = extra_args or []
        self.log_dir = log_dir or os.path.join(self.data_dir, "logs")
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self._logs: dict[int, TextIO] = {}
        self.mqtt = mqtt
        self._mqtt_args: list[str] = []
        if mqtt_rules is not None:
            self._mqtt_args += ["--mqtt-rules", self._write_file("mqtt-rules.txt", mqtt_rules)]
        if mqtt_users is not None:
            text = "".join(f"{user}:{password}\n" for user, password in mqtt_users.items())
            self._mqtt_args += ["--mqtt-users", self._write_file("mqtt-users.txt", text)]

    def _write_file(self, name: str, text: str) -> str:
        os.makedirs(self.data_dir, exist_ok=True)
        path = os.path.join(self.data_dir, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return path

    @property
    def bootstrap(self) -> str:
        """``host:port,...`` of every member's client listener."""
        return ",".join(f"127.0.0.1:{p.client}" for p in self.ports[: self.n])

    def client_address(self, broker: int) -> tuple[str, int]:
        return "127.0.0.1", self.ports[broker].client

    def mqtt_address(self, broker: int) -> tuple[str, int]:
        """Where broker ``broker`` listens for MQTT devices (a cluster made with ``mqtt=True``)."""
        if not self.mqtt:
            raise ClusterError("the cluster was started without MQTT (mqtt=True)")
        return "127.0.0.1", self.ports[broker].mqtt

    @property
    def mqtt_addresses(self) -> list[tuple[str, int]]:
        """``mqtt_address(i)`` of every member."""
        return [self.mqtt_address(i) for i in range(self.n)]

    def command(self, broker: int) -> list[str]:
        p = self.ports[broker]
        members = list(enumerate(self.ports[: max(self.n, broker + 1)]))
        peers = ",".join(f"{i}@127.0.0.1:{q.peer}" for i, q in members)
        controllers = ",".join(f"{i}@127.0.0.1:{q.controller}" for i, q in members)
        join = ["--join"] if broker >= self.n else []
        return [
            sys.executable, "-m", "kafkaesque.cli", "broker",
            "--id", str(broker),
            "--data-dir", self.data_dir,
            "--client", f"127.0.0.1:{p.client}",
            "--peers", peers,
            "--controllers", controllers,
            "--admin", f"127.0.0.1:{p.admin}",
            "--log-level", self.log_level,
            "--exit-with-parent",
            *(["--mqtt-listen", f"127.0.0.1:{p.mqtt}", *self._mqtt_args] if self.mqtt else []),
            *join,
            *self.extra_args,
        ]  # fmt: skip

    def add_broker(self, timeout: float = 60.0) -> int:
        """Start the next spare broker with ``--join``, admit it (``ADDBROKER``), wait for it.

        Returns its id; from then on it is a member like the others.
        """
        broker = self.n
        if broker >= len(self.ports):
            raise ClusterError("no spare ports: create the cluster with spare=")
        self.start(broker)
        p = self.ports[broker]
        reply = _ask(
            self.client_address(0),
            f"ADDBROKER {broker} 127.0.0.1:{p.peer} 127.0.0.1:{p.controller}",
            timeout,
        )
        if not reply.startswith(b"+OK"):
            raise ClusterError(f"ADDBROKER {broker} answered {reply!r}")
        self.n += 1
        self.wait_ready(timeout)
        return broker

    # -- lifetime -------------------------------------------------------------------------------

    def __enter__(self) -> LocalCluster:
        try:
            self.start_all()
            self.wait_ready()
        except BaseException:
            self.stop_all()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop_all()

    def start_all(self) -> None:
        for i in range(self.n):  # all at once: the controller quorum needs a majority up
            self.start(i)

    def start(self, broker: int) -> None:
        if broker in self.procs and self.procs[broker].poll() is None:
            raise ClusterError(f"broker {broker} is already running")
        os.makedirs(self.log_dir, exist_ok=True)
        log = open(os.path.join(self.log_dir, f"broker-{broker}.log"), "a")  # noqa: SIM115
        self._logs[broker] = log
        self.procs[broker] = subprocess.Popen(
            self.command(broker), stdout=subprocess.DEVNULL, stderr=log, stdin=subprocess.DEVNULL
        )

    def kill(self, broker: int) -> None:
        """SIGKILL ``broker`` (no goodbye: what a crash looks like to the others)."""
        proc = self.procs.get(broker)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def pause(self, broker: int) -> None:
        self.procs[broker].send_signal(signal.SIGSTOP)

    def resume(self, broker: int) -> None:
        self.procs[broker].send_signal(signal.SIGCONT)

    def stop(self, broker: int) -> None:
        proc = self.procs.get(broker)
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.terminate()
            try:
                proc.wait(_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log = self._logs.pop(broker, None)
        if log is not None:
            log.close()

    def stop_all(self) -> None:
        for i in list(self.procs):
            proc = self.procs[i]
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.terminate()
        for i in list(self.procs):
            self.stop(i)

    def alive(self) -> list[int]:
        return [i for i, p in self.procs.items() if p.poll() is None]

    # -- readiness ------------------------------------------------------------------------------

    def wait_ready(self, timeout: float = 60.0, brokers: list[int] | None = None) -> None:
        """Until every broker in ``brokers`` (default: all running) lists them all registered."""
        deadline = time.monotonic() + timeout
        wanted = brokers if brokers is not None else self.alive()
        last = "no answer yet"
        while time.monotonic() < deadline:
            for i, proc in self.procs.items():
                if proc.poll() is not None and i in wanted:
                    raise ClusterError(
                        f"broker {i} exited with status {proc.returncode}; see "
                        f"{os.path.join(self.log_dir, f'broker-{i}.log')}"
                    )
            try:
                if all(self._registered(i) >= len(wanted) for i in wanted):
                    return
            except OSError as exc:
                last = str(exc)
            time.sleep(0.2)
        raise ClusterError(f"the cluster did not become ready in {timeout:.0f} s ({last})")

    def _registered(self, broker: int) -> int:
        """How many brokers ``broker``'s METADATA lists."""
        data = _ask(self.client_address(broker), "METADATA", 2)
        return sum(1 for line in data.split(b"\r\n") if line.startswith(b"+BROKER "))


def _ask(address: tuple[str, int], line: str, timeout: float) -> bytes:
    """One command's whole answer, raw (up to ``+END`` for a list)."""
    with socket.create_connection(address, timeout=timeout) as sock:
        sock.sendall(line.encode() + b"\r\n")
        data = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return data
            data += chunk
            first = data.split(b"\r\n", 1)[0]
            if data.endswith(b"\r\n") and (
                data.endswith(b"+END\r\n")
                or (b"\r\n" in data and first.startswith((b"+OK", b"-ERR")))
            ):
                return data


# -- the command ----------------------------------------------------------------------------------


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "cluster",
        help="run a local cluster of brokers",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    up = actions.add_parser("up", help="start a local cluster and keep it running until Ctrl-C")
    up.add_argument("-n", "--brokers", type=int, default=3, help="how many brokers (3)")
    up.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help=f"data ({DEFAULT_DATA_DIR})")
    up.add_argument(
        "--base-port",
        type=int,
        default=DEFAULT_BASE_PORT,
        help="broker i listens for clients on base+10*i (9092); 0 picks free ports",
    )
    up.add_argument("--log-level", default="WARNING", help="brokers' logging level")
    up.add_argument("--mqtt", action="store_true", help="brokers also listen for MQTT devices")
    up.add_argument("--mqtt-rules", help="a file of MQTT topic mapping rules (with --mqtt)")
    up.set_defaults(run=run_up)


def run_up(args: argparse.Namespace) -> int:
    rules = None
    if args.mqtt_rules:
        with open(args.mqtt_rules, encoding="utf-8") as f:
            rules = f.read()
    cluster = LocalCluster(
        args.data_dir,
        args.brokers,
        base_port=args.base_port,
        log_level=args.log_level,
        mqtt=args.mqtt,
        mqtt_rules=rules,
    )
    busy = [p for p in _all_ports(cluster) if not _port_free(p)]
    if busy:
        raise ClusterError(
            f"ports {busy[:5]} are in use (another cluster?); pick --base-port or use 0"
        )

    def stop(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    with cluster:
        # Everything from the first line printed on is inside the try: a Ctrl-C that comes as
        # soon as `ready` is read (while print returns) is a clean stop, not "interrupted".
        try:
            for i, p in enumerate(cluster.ports):
                print(
                    f"broker {i} client=127.0.0.1:{p.client} peer=127.0.0.1:{p.peer} "
                    f"controller=127.0.0.1:{p.controller} admin=http://127.0.0.1:{p.admin}/metrics"
                    + (f" mqtt=127.0.0.1:{p.mqtt}" if cluster.mqtt else ""),
                    flush=True,
                )
            print(f"data in {cluster.data_dir}; logs in {cluster.log_dir}", flush=True)
            print(f"bootstrap {cluster.bootstrap}", flush=True)
            if cluster.mqtt:
                mqtt = ",".join(f"{h}:{port}" for h, port in cluster.mqtt_addresses)
                print(f"mqtt {mqtt}", flush=True)
            print("ready", flush=True)
            while True:
                for i, proc in cluster.procs.items():
                    if proc.poll() is not None:
                        print(f"broker {i} exited with status {proc.returncode}", file=sys.stderr)
                        return 1
                time.sleep(0.5)
        except KeyboardInterrupt:
            print("stopping", flush=True)
    return 0


def _all_ports(cluster: LocalCluster) -> list[int]:
    return [
        port
        for p in cluster.ports
        for port in (p.client, p.peer, p.controller, p.admin, *([p.mqtt] if cluster.mqtt else []))
    ]


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        # As the brokers' listeners do: a port whose old connections linger in TIME_WAIT is free.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
