"""The launcher of local clusters: broker processes on this machine, for ``kafkaesque cluster``,
the demo, the tests, the benchmarks and the fault injector (``kafkaesque.jepsen_like``).

``LocalCluster`` is ``n`` brokers on loopback: start, kill -9, stop gracefully, restart (one
broker, or all in turn with ``restart_rolling``) and always stop every process it started.
``BrokerProcesses`` is what it is made of, and what a cluster placed some other way (network
namespaces, proxies: the fault injector's) is made of too: the processes, their logs, their
signals. ``replicas_behind`` and ``parse_samples`` read the brokers' ``/metrics`` for
``wait_in_sync``'s rule (a restarted broker's replicas have caught up with their leaders).
"""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Self, TextIO

from kafkaesque.client import (
    Client,
    ClientConfig,
    KafkaesqueConnectionError,
    KafkaesqueError,
    RetryPolicy,
    Security,
)
from kafkaesque.security import import_plaintext, save_users

_PORTS_PER_BROKER = 10  # client +0, peer +1, controller +2, admin +3, mqtt +4, kafka +5, http +6
_STOP_TIMEOUT_S = 10.0  # a graceful stop hands leaderships over within 5 s (the default)
_IN_SYNC_POLL_S = 0.1  # how often restart_rolling looks at the replicas of a restarted broker
_SCRAPE_TIMEOUT_S = 2.0
# One sample of the Prometheus text format: name{labels} value (labels in our metrics are
# plain words: topic names allow no quote nor backslash).
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"')


class ClusterError(Exception):
    """The cluster could not start or answer; the message says why."""


@dataclass(frozen=True)
class RollingStep:
    """One broker's turn in ``LocalCluster.restart_rolling``, in seconds: from its SIGTERM until
    it exited (``stopped_s``: the hand-over of its leaderships, then the stop), from its start
    until it was registered and answering (``ready_s``), and until its replicas had caught up
    with their leaders (``in_sync_s``, from its start too). ``exit_code`` is its stop's (0: a
    graceful stop; it was killed if the stop took longer than the stop timeout)."""

    broker: int
    stopped_s: float
    ready_s: float
    in_sync_s: float
    exit_code: int

    def describe(self) -> str:
        how = "stopped" if self.exit_code == 0 else describe_exit(self.exit_code)
        return (
            f"broker {self.broker}: {how} in {self.stopped_s:.2f} s, ready {self.ready_s:.2f} s "
            f"and in sync {self.in_sync_s:.2f} s after its start"
        )


@dataclass(frozen=True)
class BrokerPorts:
    client: int
    peer: int
    controller: int
    admin: int
    mqtt: int
    kafka: int
    http: int


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports free on 127.0.0.1 now (each bound, then released), from below the
    kernel's ephemeral range.

    A port from ``bind(port 0)`` lies in the ephemeral range, and once released the kernel may
    hand it out at once again as the local port of an outgoing connection (any test's client):
    a broker that binds it a moment later then fails ("cannot bind the controller port"), which
    a clean-clone CI run met. The kernel never hands out ports below that range on its own.
    A port is not handed out twice by one process (until half the pool was), as the kernel's
    choice rarely was: a caller may ask again before it binds what it got. Without a readable
    range, the kernel's ``bind(0)`` choice, as before.
    """
    low = _ephemeral_start()
    if low is None or low - _PORT_POOL < 1024:
        return _kernel_ports(n)
    if len(_handed_out) > _PORT_POOL // 2:
        _handed_out.clear()
    chosen: list[int] = []
    for port in random.sample(range(low - _PORT_POOL, low), _PORT_POOL):
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue  # in use: the next
        chosen.append(port)
        if len(chosen) == n:
            _handed_out.update(chosen)
            return chosen
    raise OSError(f"no {n} free ports below {low} on 127.0.0.1")


# How many ports below the ephemeral range ``free_ports`` draws from, and those it gave.
_PORT_POOL = 8192
_handed_out: set[int] = set()


def _ephemeral_start() -> int | None:
    """The first port of the kernel's ephemeral range (Linux), None if it cannot be read."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _kernel_ports(n: int) -> list[int]:
    """``n`` distinct ports the kernel says are free now (bound, read, released)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class BrokerProcesses:
    """The broker processes of one cluster on this machine, by broker id: each started with its
    stderr appended to ``log_path(broker)`` (kept across restarts), signalled, killed. What a
    cluster adds is where its brokers listen and so their command lines (``LocalCluster``:
    loopback ports; the fault injector's: namespaces and proxies).

    ``procs`` holds every process ever started, the dead ones too (their exit status is read
    from them); a log stays open until its broker is started again or ``close_log``.
    """

    def __init__(self, log_dir: str) -> None:
        self.log_dir = log_dir
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self._logs: dict[int, TextIO] = {}

    def log_path(self, broker: int) -> str:
        """Where broker ``broker`` writes its log (appended to across restarts)."""
        return os.path.join(self.log_dir, f"broker-{broker}.log")

    def spawn(self, broker: int, command: list[str], env: dict[str, str] | None = None) -> None:
        """Start ``command`` as broker ``broker`` (``env``: its whole environment; None: this
        process's). ``ClusterError`` if that broker is running."""
        if self.running(broker):
            raise ClusterError(f"broker {broker} is already running")
        os.makedirs(self.log_dir, exist_ok=True)
        previous = self._logs.pop(broker, None)
        if previous is not None:  # the log of the process that died, kept open until now
            previous.close()
        log = open(self.log_path(broker), "a")  # noqa: SIM115
        self._logs[broker] = log
        self.procs[broker] = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=log, stdin=subprocess.DEVNULL, env=env
        )

    def running(self, broker: int) -> bool:
        """Whether broker ``broker``'s process runs (a paused one does)."""
        proc = self.procs.get(broker)
        return proc is not None and proc.poll() is None

    def kill(self, broker: int) -> None:
        """SIGKILL ``broker`` (no goodbye: what a crash looks like to the others)."""
        proc = self.procs.get(broker)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def close_log(self, broker: int) -> None:
        """Close broker ``broker``'s log (its process has stopped). Idempotent."""
        log = self._logs.pop(broker, None)
        if log is not None:
            log.close()

    def kill_all(self) -> None:
        """Kill every process started (SIGCONT first, so a paused one can die); close the logs."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
        for proc in self.procs.values():
            proc.wait()
        for broker in list(self._logs):
            self.close_log(broker)


def broker_program() -> list[str]:
    """The command that runs ``kafkaesque`` with this interpreter (a broker's command line is
    this, ``broker`` and its flags)."""
    return [sys.executable, "-m", "kafkaesque.cli"]


class LocalCluster(BrokerProcesses):
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
        ``user: password`` pairs ``mqtt_users`` (written salted; None: anonymous devices).
        """
        if n < 1:
            raise ClusterError("a cluster needs at least one broker")
        self.data_dir = os.path.abspath(data_dir)
        self.n = n
        total = n + spare
        if base_port:
            self.ports = [
                BrokerPorts(*(base_port + _PORTS_PER_BROKER * i + k for k in range(7)))
                for i in range(total)
            ]
        else:
            flat = free_ports(7 * total)
            self.ports = [BrokerPorts(*flat[7 * i : 7 * i + 7]) for i in range(total)]
        super().__init__(log_dir or os.path.join(self.data_dir, "logs"))
        self.log_level = log_level
        self.extra_args = extra_args or []
        self.mqtt = mqtt
        self._mqtt_args: list[str] = []
        if mqtt_rules is not None:
            self._mqtt_args += ["--mqtt-rules", self._write_file("mqtt-rules.txt", mqtt_rules)]
        if mqtt_users is not None:  # salted, as a broker takes them (kafkaesque user add)
            path = self._write_file("mqtt-users.txt", "")
            save_users(path, import_plaintext(f"{u}:{p}" for u, p in mqtt_users.items()))
            self._mqtt_args += ["--mqtt-users", path]

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

    def kafka_address(self, broker: int) -> tuple[str, int]:
        """Where broker ``broker`` speaks the Kafka protocol (docs/kafka.md)."""
        return "127.0.0.1", self.ports[broker].kafka

    def http_address(self, broker: int) -> tuple[str, int]:
        """Where broker ``broker`` serves the REST API (docs/http.md)."""
        return "127.0.0.1", self.ports[broker].http

    @property
    def kafka_bootstrap(self) -> str:
        """``host:port,...`` of every member's Kafka listener (``bootstrap.servers``)."""
        return ",".join(f"127.0.0.1:{p.kafka}" for p in self.ports[: self.n])

    def mqtt_address(self, broker: int) -> tuple[str, int]:
        """Where broker ``broker`` listens for MQTT devices (a cluster made with ``mqtt=True``)."""
        if not self.mqtt:
            raise ClusterError("the cluster was started without MQTT (mqtt=True)")
        return "127.0.0.1", self.ports[broker].mqtt

    @property
    def mqtt_addresses(self) -> list[tuple[str, int]]:
        """``mqtt_address(i)`` of every member."""
        return [self.mqtt_address(i) for i in range(self.n)]

    def program(self, broker: int) -> list[str]:
        """What runs ``kafkaesque`` for broker ``broker`` (``broker_program()``; a subclass may
        run it under a profiler)."""
        return broker_program()

    def command(self, broker: int) -> list[str]:
        p = self.ports[broker]
        members = list(enumerate(self.ports[: max(self.n, broker + 1)]))
        peers = ",".join(f"{i}@127.0.0.1:{q.peer}" for i, q in members)
        controllers = ",".join(f"{i}@127.0.0.1:{q.controller}" for i, q in members)
        join = ["--join"] if broker >= self.n else []
        return [
            *self.program(broker), "broker",
            "--id", str(broker),
            "--data-dir", self.data_dir,
            "--client", f"127.0.0.1:{p.client}",
            "--peers", peers,
            "--controllers", controllers,
            "--admin", f"127.0.0.1:{p.admin}",
            "--kafka-listen", f"127.0.0.1:{p.kafka}",
            "--http-listen", f"127.0.0.1:{p.http}",
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
        try:
            with Client.pinned(self.client_address(0), config=self.client_config(timeout)) as c:
                c.add_broker(broker, f"127.0.0.1:{p.peer}", f"127.0.0.1:{p.controller}")
        except KafkaesqueError as exc:
            raise ClusterError(f"ADDBROKER {broker} answered {exc}") from exc
        self.n += 1
        self.wait_ready(timeout)
        return broker

    # -- lifetime -------------------------------------------------------------------------------

    def __enter__(self) -> Self:
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
        self.spawn(broker, self.command(broker))

    def pause(self, broker: int) -> None:
        self.procs[broker].send_signal(signal.SIGSTOP)

    def resume(self, broker: int) -> None:
        self.procs[broker].send_signal(signal.SIGCONT)

    def stop(self, broker: int, *, graceful: bool = True) -> None:
        """Stop ``broker`` and wait for it (killed after ``_STOP_TIMEOUT_S``).

        ``graceful``: SIGTERM, so it first hands its leaderships over to other brokers (a few
        milliseconds when they are reachable, at most its ``--shutdown-timeout``); else SIGINT,
        which stops it at once (its partitions then elect new leaders, as after a crash).
        """
        proc = self.procs.get(broker)
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.send_signal(signal.SIGTERM if graceful else signal.SIGINT)
            try:
                proc.wait(_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.close_log(broker)

    def stop_all(self) -> None:
        """Stop every broker at once (SIGINT): with all of them going, handing leaderships over
        would only pass them around until each broker's shutdown timeout."""
        for i in list(self.procs):
            proc = self.procs[i]
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGINT)
        for i in list(self.procs):
            self.stop(i, graceful=False)

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
                        f"broker {i} {describe_exit(proc.returncode)}; see {self.log_path(i)}"
                    )
            try:
                if all(self._registered(i) >= len(wanted) for i in wanted):
                    return
            # Not listening yet, or not answering: the client's error, or a raw socket's (a
            # subclass may ask in its own way, as tests of authentication do).
            except (KafkaesqueConnectionError, OSError) as exc:
                last = str(exc)
            time.sleep(0.2)
        raise ClusterError(f"the cluster did not become ready in {timeout:.0f} s ({last})")

    def restart_rolling(
        self,
        brokers: Sequence[int] | None = None,
        *,
        timeout: float = 60.0,
        on_step: Callable[[RollingStep], None] | None = None,
    ) -> list[RollingStep]:
        """Restart ``brokers`` (default: every running one, by id) one at a time, gracefully.

        Each is stopped with SIGTERM (it hands its leaderships over, then exits), started again,
        and waited for until it answers with every broker registered (``wait_ready``) and its
        replicas have caught up (``wait_in_sync``); only then is the next one stopped, so that
        no partition ever has two replicas down. ``on_step`` is told each broker's figures as
        soon as it is back. Raises ``ClusterError`` if a broker does not come back within
        ``timeout`` seconds (the rest are not restarted then).
        """
        order = sorted(self.alive()) if brokers is None else list(brokers)
        steps = []
        for broker in order:
            if broker not in self.procs:
                raise ClusterError(f"no broker {broker} in this cluster")
            stopping = time.monotonic()
            self.stop(broker)
            stopped = time.monotonic()
            code = self.procs[broker].returncode
            self.start(broker)
            self.wait_ready(timeout)
            ready = time.monotonic()
            self.wait_in_sync(broker, timeout)
            step = RollingStep(
                broker, stopped - stopping, ready - stopped, time.monotonic() - stopped, code
            )
            if on_step is not None:
                on_step(step)
            steps.append(step)
        return steps

    def wait_in_sync(self, broker: int, timeout: float = 60.0) -> None:
        """Until every partition with a replica on ``broker`` has a leader, and ``broker``'s copy
        of its log reaches where the leader's log ended when this wait first saw that leader.

        Read from every running broker's ``/metrics`` (each leader's ``follower_lag`` rows name
        its followers; each replica's ``log_end_offset`` tells how far it is): a replica that
        keeps up under load passes as soon as it has what the leader had, not only once idle.
        ``ClusterError`` after ``timeout`` seconds, saying which partition is behind.
        """
        deadline = time.monotonic() + timeout
        targets: dict[tuple[str, str], int] = {}
        waiting = "no answer yet"
        while time.monotonic() < deadline:
            try:
                samples = {b: self.scrape(b) for b in self.alive()}
            except OSError as exc:
                waiting = f"metrics unreadable: {exc}"
                time.sleep(_IN_SYNC_POLL_S)
                continue
            behind = replicas_behind(broker, samples, targets)
            if behind is None:
                return
            waiting = behind
            time.sleep(_IN_SYNC_POLL_S)
        raise ClusterError(
            f"broker {broker}'s replicas did not catch up in {timeout:.0f} s ({waiting})"
        )

    def scrape(self, broker: int) -> list[tuple[str, dict[str, str], float]]:
        """Broker ``broker``'s ``/metrics``, as (name, labels, value) samples. ``OSError`` if it
        does not answer within ``_SCRAPE_TIMEOUT_S``."""
        url = f"http://127.0.0.1:{self.ports[broker].admin}/metrics"
        with urllib.request.urlopen(url, timeout=_SCRAPE_TIMEOUT_S) as reply:
            return parse_samples(reply.read().decode("utf-8", "replace"))

    def client_config(self, timeout: float) -> ClientConfig:
        """The settings of the launcher's own questions: one attempt within ``timeout`` (its
        waits retry), plaintext (``SecureCluster``: TLS and SCRAM)."""
        return one_attempt(timeout)

    def _registered(self, broker: int) -> int:
        """How many brokers ``broker``'s METADATA lists (0 while it refuses: ``NOT_READY``).
        ``KafkaesqueConnectionError`` (or ``OSError``, from an override's own socket) if it
        does not answer."""
        with Client.pinned(self.client_address(broker), config=self.client_config(2)) as client:
            try:
                return len(client.refresh_metadata().brokers)
            except KafkaesqueConnectionError:
                raise
            except KafkaesqueError:
                return 0


def parse_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """The samples of a Prometheus text exposition: (name, labels, value); comments and lines
    that do not parse are skipped."""
    out = []
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name, labels, value = match.groups()
        try:
            number = float(value)
        except ValueError:
            continue
        out.append((name, dict(_LABEL.findall(labels or "")), number))
    return out


def replicas_behind(
    broker: int,
    samples: Mapping[int, list[tuple[str, dict[str, str], float]]],
    targets: dict[tuple[str, str], int],
) -> str | None:
    """None if every partition with a replica on ``broker`` has a leader and ``broker``'s log
    end has reached its target; else which partition is not there yet. ``targets`` (partition
    -> the leader's log end when first seen) is filled as leaders are seen, across calls."""
    me = str(broker)
    leaders: dict[tuple[str, str], tuple[float, float]] = {}  # partition -> (term, log end)
    terms: dict[tuple[int, tuple[str, str]], float] = {}
    ends: dict[tuple[int, tuple[str, str]], float] = {}
    leading: set[tuple[int, tuple[str, str]]] = set()
    hosted: set[tuple[str, str]] = set()  # partitions with a replica on ``broker``
    for source, rows in samples.items():
        for name, labels, value in rows:
            key = (labels.get("topic", ""), labels.get("partition", ""))
            if name == "kafkaesque_partition_term":
                terms[source, key] = value
            elif name == "kafkaesque_partition_log_end_offset":
                ends[source, key] = value
                if source == broker:
                    hosted.add(key)
            elif name == "kafkaesque_partition_is_leader" and value == 1:
                leading.add((source, key))
            elif name == "kafkaesque_partition_follower_lag" and labels.get("follower") == me:
                hosted.add(key)
    for source, key in leading:
        term, end = terms.get((source, key), -1.0), ends.get((source, key), -1.0)
        if key not in leaders or term > leaders[key][0]:
            leaders[key] = (term, end)
    for key in sorted(hosted):
        shown = f"{key[0]}/{key[1]}"
        if key not in leaders:
            return f"{shown} has no leader"
        target = targets.setdefault(key, int(leaders[key][1]))
        have = ends.get((broker, key))
        if have is None:
            return f"{shown} is not open on broker {broker} yet"
        if have < target:
            return f"{shown} on broker {broker} is at {int(have)} of {target}"
    return None


def one_attempt(timeout: float, security: Security | None = None) -> ClientConfig:
    """A client configuration for one question to one broker: a single attempt, ``timeout``
    seconds for the connection and the request; ``security`` None: plaintext."""
    return ClientConfig(
        request_timeout_ms=timeout * 1000.0,
        connect_timeout_ms=timeout * 1000.0,
        retry=RetryPolicy(max_attempts=1, backoff_ms=0, backoff_max_ms=0, unknown_topic_attempts=1),
        **({} if security is None else {"security": security}),
    )


def answers_ping(
    address: tuple[str, int], timeout: float, config: ClientConfig | None = None
) -> bool:
    """Whether the broker at ``address`` answers ``PING`` with ``+OK`` within ``timeout``
    seconds (one attempt; ``config``: its security). False if it cannot be reached (not
    listening yet) and if it refuses (``NOT_READY``: it is still starting)."""
    try:
        with Client.pinned(address, config=config or one_attempt(timeout)) as client:
            client.ping()
    except KafkaesqueError:
        return False
    return True


def describe_exit(returncode: int) -> str:
    """How a process ended, from ``Popen.returncode``: ``killed by SIGKILL (signal 9)`` for a
    signal (a negative code), else ``exited with status N``."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "an unknown signal"
        return f"killed by {name} (signal {-returncode})"
    return f"exited with status {returncode}"
