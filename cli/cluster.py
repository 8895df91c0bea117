"""``kafkaesque cluster up -n 3``: a local cluster of broker processes on loopback.

Each broker is its own ``kafkaesque broker`` process with its own ports, all under one data
directory (``.kafkaesque-data/cluster`` by default). The command prints where each broker
listens, waits until the cluster answers (every broker registered, a controller leader), prints
``ready``, and stops every broker on Ctrl-C or SIGTERM.

While it runs it watches its brokers: a broker that dies is one line (``broker 1 died: killed by
SIGKILL (signal 9)``) and the others go on serving. With ``--restart`` a dead broker is started
again after a short back-off, unless it keeps dying (see ``RestartPolicy``);
``kafkaesque cluster restart-broker N`` asks the running ``cluster up`` (through a request file
in its data directory) to start broker N again, so that every broker stays its child and stops
with it.

``kafkaesque cluster restart --rolling`` asks the running ``cluster up`` to restart every broker
in turn without a blip: each is stopped with SIGTERM (it hands its partition leaderships to
up-to-date replicas first, see ``kafkaesque broker``), started again, and waited for until it
is registered and its replicas have caught up with their leaders; then the next.

``LocalCluster`` is the same thing as a library, for the tests, the benchmarks and the fault
injector: start, kill -9, stop gracefully, restart (one broker, or all in turn with
``restart_rolling``) and always stop every process it started.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import FrameType, TracebackType
from typing import Any, TextIO

from kafkaesque.security import import_plaintext, save_users

DEFAULT_DATA_DIR = os.path.join(".kafkaesque-data", "cluster")
DEFAULT_BASE_PORT = 9092
_PORTS_PER_BROKER = 10  # client +0, peer +1, controller +2, admin +3, mqtt +4
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
        ``user: password`` pairs ``mqtt_users`` (written salted; None: anonymous devices).
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
        previous = self._logs.pop(broker, None)
        if previous is not None:  # the log of the process that died, kept open until now
            previous.close()
        log = open(self.log_path(broker), "a")  # noqa: SIM115
        self._logs[broker] = log
        self.procs[broker] = subprocess.Popen(
            self.command(broker), stdout=subprocess.DEVNULL, stderr=log, stdin=subprocess.DEVNULL
        )

    def log_path(self, broker: int) -> str:
        """Where broker ``broker`` writes its log (appended to across restarts)."""
        return os.path.join(self.log_dir, f"broker-{broker}.log")

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
        log = self._logs.pop(broker, None)
        if log is not None:
            log.close()

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
            except OSError as exc:
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
            behind = _behind(broker, samples, targets)
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

    def _registered(self, broker: int) -> int:
        """How many brokers ``broker``'s METADATA lists."""
        data = _ask(self.client_address(broker), "METADATA", 2)
        return sum(1 for line in data.split(b"\r\n") if line.startswith(b"+BROKER "))


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


def _behind(
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


# -- watching the brokers of `cluster up` ---------------------------------------------------------

STATE_FILE = "cluster-up.json"
"""In the data directory while ``cluster up`` runs: its pid and each broker's pid, address, log
and command line (JSON). ``restart-broker`` reads it; ``cluster up`` removes it as it stops."""
CONTROL_DIR = "control"
"""In the data directory: ``<token>.restart`` requests (a broker id), ``<token>.rolling``
requests (a rolling restart of every broker; the text is ignored) and their ``<token>.reply``
answers (JSON ``{"ok": bool, "message": str}``), all written whole by a rename."""
_POLL_S = 0.25  # how often `cluster up` looks at its brokers and its requests
_PING_TIMEOUT_S = 0.5  # a restarted broker is back once it answers PING this fast
_REQUEST_TIMEOUT_S = 10.0  # how long restart-broker waits for `cluster up` to take its request


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


@dataclass(frozen=True)
class RestartPolicy:
    """When ``cluster up --restart`` starts a broker that died again.

    After ``backoff_s``, doubled for each earlier death within the last ``window_s`` seconds, up
    to ``max_backoff_s``; and not at all once it died more than ``max_restarts`` times within
    ``window_s``: a broker that crashes as it starts (a bad flag, a full disk) would otherwise
    be started forever. It then stays down until ``restart-broker`` starts it, which also
    forgets its deaths.
    """

    backoff_s: float = 1.0
    max_backoff_s: float = 8.0
    max_restarts: int = 5
    window_s: float = 60.0

    def delay(self, deaths: Sequence[float], now: float) -> float | None:
        """Seconds to wait before starting the broker again, or None: leave it down.

        ``deaths`` are the times (on the clock of ``now``) the broker died, the last one
        included; those older than ``window_s`` do not count.
        """
        recent = sum(1 for t in deaths if now - t < self.window_s)
        if recent > self.max_restarts:
            return None
        return float(min(self.backoff_s * 2 ** max(recent - 1, 0), self.max_backoff_s))


def state_path(data_dir: str) -> str:
    return os.path.join(data_dir, STATE_FILE)


def _control_dir(data_dir: str) -> str:
    return os.path.join(data_dir, CONTROL_DIR)


def _write_json(path: str, value: object) -> None:
    """Write ``value`` to ``path`` whole: a reader sees the old file or the new one."""
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=1)
    os.replace(temporary, path)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive, and not ours to judge
    return True


def read_state(data_dir: str) -> dict[str, Any]:
    """The state of the ``cluster up`` running on ``data_dir``; ``ClusterError`` if none runs."""
    path = state_path(data_dir)
    try:
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
        pid = int(state["pid"])
        brokers = state["brokers"]
        if not isinstance(brokers, dict):
            raise TypeError("brokers is not an object")
    except FileNotFoundError:
        raise ClusterError(
            f"no `kafkaesque cluster up` runs on {data_dir} (no {STATE_FILE}); "
            "start one, or give the --data-dir it runs on"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ClusterError(f"cannot read {path}: {exc}") from exc
    if not _pid_alive(pid):
        raise ClusterError(
            f"the `kafkaesque cluster up` of {data_dir} (pid {pid}) is not running any more"
        )
    return dict(state)


def _running_state(data_dir: str) -> dict[str, Any] | None:
    """The state of the ``cluster up`` running on ``data_dir``, or None if none runs there."""
    try:
        return read_state(data_dir)
    except ClusterError:
        return None  # no state file, an unreadable one, or one its owner left when killed


class Supervisor:
    """What ``cluster up`` does while its cluster runs: notice a broker that died and say so in
    one line, start it again (``policy``, or on a ``restart-broker`` request), say when it
    answers again, and keep ``STATE_FILE`` up to date. The other brokers are never touched.

    ``step`` does one round; it is called from one thread, every ``_POLL_S``. ``open`` claims
    the data directory (the state file, an empty request directory), ``close`` gives it back.
    """

    def __init__(self, cluster: LocalCluster, out: TextIO, policy: RestartPolicy | None) -> None:
        self.cluster = cluster
        self.out = out
        self.policy = policy
        self._deaths: dict[int, list[float]] = {}
        # Brokers that died and were not started again: when --restart starts them (None: not
        # by itself; restart-broker will).
        self._down: dict[int, float | None] = {}
        self._returning: set[int] = set()  # started again, not answering yet
        self._state = state_path(cluster.data_dir)
        self._control = _control_dir(cluster.data_dir)

    def open(self) -> None:
        """Write the state file and an empty request directory (old requests are stale)."""
        shutil.rmtree(self._control, ignore_errors=True)
        os.makedirs(self._control)
        self._write_state()

    def close(self) -> None:
        """Remove the state file and the request directory. Idempotent."""
        with contextlib.suppress(FileNotFoundError):
            os.remove(self._state)
        shutil.rmtree(self._control, ignore_errors=True)

    def step(self, now: float) -> None:
        """One round: deaths, restarts that are due, requests, brokers that answer again."""
        self._notice_deaths(now)
        for broker, due in list(self._down.items()):
            if due is not None and now >= due:
                self._start(broker)
        self._answer_requests()
        self._notice_returns()

    def _say(self, line: str) -> None:
        print(line, file=self.out, flush=True)

    def _restart_hint(self, broker: int) -> str:
        return f"kafkaesque cluster restart-broker {broker} --data-dir {self.cluster.data_dir}"

    def _notice_deaths(self, now: float) -> None:
        for broker, proc in sorted(self.cluster.procs.items()):
            code = proc.poll()
            if code is None or broker in self._down:
                continue
            self._returning.discard(broker)
            died = f"broker {broker} died: {describe_exit(code)}"
            if code > 0:  # it chose to stop: its log says why
                died += f" (see {self.cluster.log_path(broker)})"
            delay = None
            if self.policy is not None:
                deaths = self._deaths.setdefault(broker, [])
                deaths.append(now)
                deaths[:] = [t for t in deaths if now - t < self.policy.window_s]
                delay = self.policy.delay(deaths, now)
                if delay is None:
                    died += (
                        f"; it died {len(deaths)} times in {self.policy.window_s:g} s, so it "
                        f"stays down (see {self.cluster.log_path(broker)}; then "
                        f"`{self._restart_hint(broker)}`)"
                    )
                else:
                    died += f"; restarting it in {delay:g} s"
            else:
                died += f"; the others go on; `{self._restart_hint(broker)}` starts it again"
            self._down[broker] = None if delay is None else now + delay
            self._say(died)
            self._write_state()

    def _start(self, broker: int) -> str | None:
        """Start ``broker`` again; None, or why it could not be (said in a line too)."""
        try:
            self.cluster.start(broker)
        except (OSError, ClusterError) as exc:
            self._down[broker] = None
            self._say(f"broker {broker} could not be started again: {exc}")
            return str(exc)
        self._down.pop(broker, None)
        self._returning.add(broker)
        self._say(f"broker {broker} restarted (pid {self.cluster.procs[broker].pid})")
        self._write_state()
        return None

    def _answer_requests(self) -> None:
        try:
            names = sorted(os.listdir(self._control))
        except FileNotFoundError:
            os.makedirs(self._control, exist_ok=True)
            return
        for name in names:
            kind = os.path.splitext(name)[1]
            if kind not in (".restart", ".rolling"):
                continue
            path = os.path.join(self._control, name)
            try:
                with open(path, encoding="utf-8") as f:
                    text = f.read().strip()
                os.remove(path)
            except OSError:
                continue  # taken away meanwhile: its sender gave up
            if kind == ".restart":
                ok, message = self._restart_request(text)
            else:
                ok, message = self._rolling_request()
            _write_json(path.removesuffix(kind) + ".reply", {"ok": ok, "message": message})

    def _rolling_request(self) -> tuple[bool, str]:
        """Restart every broker in turn, gracefully (``LocalCluster.restart_rolling``); each
        broker's figures are said as it is back. Runs within this round: the supervisor looks
        at nothing else meanwhile (a broker that dies then is noticed at the next round)."""
        self._notice_deaths(time.monotonic())
        down = sorted(b for b, p in self.cluster.procs.items() if p.poll() is not None)
        if down:
            listed = ", ".join(map(str, down))
            return False, f"broker(s) {listed} down: start them first (restart-broker)"
        lines: list[str] = []

        def told(step: RollingStep) -> None:
            lines.append(step.describe())
            self._say(f"rolling restart: {lines[-1]}")
            self._write_state()

        self._say("rolling restart: one broker at a time (SIGTERM: it hands its leaderships over)")
        try:
            self.cluster.restart_rolling(on_step=told)
        except ClusterError as exc:
            self._write_state()
            self._say(f"rolling restart stopped: {exc}")
            return False, "\n".join([*lines, f"stopped: {exc}"])
        self._say("rolling restart done")
        return True, "\n".join([*lines, "rolling restart done"])

    def _restart_request(self, text: str) -> tuple[bool, str]:
        members = sorted(self.cluster.procs)
        if not text.isdigit() or int(text) not in self.cluster.procs:
            return False, f"no broker {text} in this cluster (brokers {members[0]}..{members[-1]})"
        broker = int(text)
        proc = self.cluster.procs[broker]
        if proc.poll() is None:
            return False, f"broker {broker} is running (pid {proc.pid}): nothing to restart"
        self._notice_deaths(time.monotonic())  # said before it is started again
        self._deaths.pop(broker, None)  # a restart asked for by hand starts a fresh count
        error = self._start(broker)
        if error is not None:
            return False, f"broker {broker} could not be started again: {error}"
        return True, f"broker {broker} restarted (pid {self.cluster.procs[broker].pid})"

    def _notice_returns(self) -> None:
        for broker in sorted(self._returning):
            if self.cluster.procs[broker].poll() is not None:
                continue  # died again: _notice_deaths says so next round
            try:
                answer = _ask(self.cluster.client_address(broker), "PING", _PING_TIMEOUT_S)
            except OSError:
                continue  # not listening yet
            if answer.startswith(b"+OK"):
                self._returning.discard(broker)
                host, port = self.cluster.client_address(broker)
                self._say(f"broker {broker} is back: it answers on {host}:{port}")

    def _write_state(self) -> None:
        brokers = {}
        for broker, proc in sorted(self.cluster.procs.items()):
            host, port = self.cluster.client_address(broker)
            brokers[str(broker)] = {
                "pid": proc.pid,
                "running": proc.poll() is None,
                "client": f"{host}:{port}",
                "log": self.cluster.log_path(broker),
                "command": self.cluster.command(broker),
            }
        _write_json(self._state, {"pid": os.getpid(), "brokers": brokers})


def request_restart(data_dir: str, broker: int, timeout: float = _REQUEST_TIMEOUT_S) -> str:
    """Ask the ``cluster up`` running on ``data_dir`` to start ``broker`` again; its answer.

    ``ClusterError`` if none runs, if it refuses (no such broker, the broker runs) or if it
    does not answer within ``timeout`` seconds.
    """
    state = read_state(data_dir)
    if str(broker) not in state["brokers"]:
        members = ", ".join(sorted(state["brokers"], key=int))
        raise ClusterError(f"no broker {broker} in the cluster of {data_dir} (brokers {members})")
    return _request(data_dir, state, ".restart", f"{broker}\n", timeout)


def request_rolling_restart(data_dir: str, timeout: float) -> str:
    """Ask the ``cluster up`` running on ``data_dir`` to restart every broker in turn,
    gracefully; its answer (a line per broker) once done. ``ClusterError`` if none runs, if a
    broker is down or does not come back, or if no answer came within ``timeout`` seconds."""
    return _request(data_dir, read_state(data_dir), ".rolling", "all\n", timeout)


def _request(data_dir: str, state: dict[str, Any], kind: str, text: str, timeout: float) -> str:
    """Put a ``kind`` request holding ``text`` for the ``cluster up`` of ``state``; its answer.
    ``ClusterError`` if it refuses, or does not answer within ``timeout`` seconds."""
    control = _control_dir(data_dir)
    token = f"{os.getpid()}-{time.time_ns()}"
    request = os.path.join(control, f"{token}{kind}")
    reply_path = os.path.join(control, f"{token}.reply")
    temporary = os.path.join(control, f"{token}.tmp")
    try:
        with open(temporary, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(temporary, request)
    except OSError as exc:
        raise ClusterError(f"cannot write a request in {control}: {exc}") from exc
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not os.path.exists(reply_path):
            time.sleep(0.1)
            continue
        try:
            with open(reply_path, encoding="utf-8") as f:
                reply = json.load(f)
            os.remove(reply_path)
        except (OSError, ValueError) as exc:
            raise ClusterError(f"cannot read the answer {reply_path}: {exc}") from exc
        if not reply.get("ok"):
            raise ClusterError(str(reply.get("message")))
        return str(reply.get("message"))
    with contextlib.suppress(FileNotFoundError):
        os.remove(request)
    raise ClusterError(
        f"the `kafkaesque cluster up` of {data_dir} (pid {state['pid']}) did not answer the "
        f"request in {timeout:g} s"
    )


def wait_answering(data_dir: str, broker: int, timeout: float) -> str:
    """Until ``broker`` of the ``cluster up`` on ``data_dir`` answers ``PING``; its address.

    ``ClusterError`` if it dies again meanwhile or does not answer within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        info = read_state(data_dir)["brokers"][str(broker)]
        if not info["running"]:
            raise ClusterError(f"broker {broker} died again as it started; see {info['log']}")
        host, _, port = str(info["client"]).rpartition(":")
        with contextlib.suppress(OSError):
            if _ask((host, int(port)), "PING", _PING_TIMEOUT_S).startswith(b"+OK"):
                return str(info["client"])
        if time.monotonic() >= deadline:
            raise ClusterError(
                f"broker {broker} (pid {info['pid']}) runs but does not answer on "
                f"{info['client']} after {timeout:g} s; see {info['log']}"
            )
        time.sleep(0.2)


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
    policy = RestartPolicy()
    up.add_argument(
        "--restart",
        action="store_true",
        help=f"start a broker that dies again, after {policy.backoff_s:g} s (doubling up to "
        f"{policy.max_backoff_s:g} s); one that dies more than {policy.max_restarts} times in "
        f"{policy.window_s:g} s stays down",
    )
    up.set_defaults(run=run_up)
    restart = actions.add_parser(
        "restart-broker",
        help="start a broker of the running `cluster up` again (one that died or was killed)",
    )
    restart.add_argument("broker", type=int, help="the broker's id")
    restart.add_argument(
        "--data-dir", default=DEFAULT_DATA_DIR, help=f"the cluster's ({DEFAULT_DATA_DIR})"
    )
    restart.add_argument(
        "--timeout", type=float, default=60.0, help="seconds to wait until it answers (60)"
    )
    restart.set_defaults(run=run_restart_broker)
    rolling = actions.add_parser(
        "restart",
        help="restart every broker of the running `cluster up` in turn (--rolling), gracefully",
        description="Restart each broker of the running `kafkaesque cluster up` in turn: SIGTERM "
        "(it hands its partition leaderships to up-to-date replicas, then stops), start it "
        "again, wait until it is registered and its replicas have caught up, then the next. "
        "Clients see latency, not errors.",
    )
    rolling.add_argument(
        "--rolling",
        action="store_true",
        required=True,
        help="one broker at a time (the only mode: restart-broker N starts one broker)",
    )
    rolling.add_argument(
        "--data-dir", default=DEFAULT_DATA_DIR, help=f"the cluster's ({DEFAULT_DATA_DIR})"
    )
    rolling.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        help="seconds to wait for the whole restart (300)",
    )
    rolling.set_defaults(run=run_restart_rolling)


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
    other = _running_state(cluster.data_dir)
    if other is not None:
        raise ClusterError(
            f"another `kafkaesque cluster up` (pid {other['pid']}) runs on {cluster.data_dir}"
        )
    busy = [p for p in _all_ports(cluster) if not _port_free(p)]
    if busy:
        raise ClusterError(
            f"ports {busy[:5]} are in use (another cluster?); pick --base-port or use 0"
        )

    def stop(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    supervisor = Supervisor(cluster, sys.stdout, RestartPolicy() if args.restart else None)
    with cluster:
        # Everything from the first line printed on is inside the try: a Ctrl-C that comes as
        # soon as `ready` is read (while print returns) is a clean stop, not "interrupted".
        try:
            for i, p in enumerate(cluster.ports):
                print(
                    f"broker {i} client=127.0.0.1:{p.client} peer=127.0.0.1:{p.peer} "
                    f"controller=127.0.0.1:{p.controller} admin=http://127.0.0.1:{p.admin}/metrics"
                    + (f" mqtt=127.0.0.1:{p.mqtt}" if cluster.mqtt else "")
                    + f" pid={cluster.procs[i].pid}",
                    flush=True,
                )
            print(f"data in {cluster.data_dir}; logs in {cluster.log_dir}", flush=True)
            print(f"bootstrap {cluster.bootstrap}", flush=True)
            if cluster.mqtt:
                mqtt = ",".join(f"{h}:{port}" for h, port in cluster.mqtt_addresses)
                print(f"mqtt {mqtt}", flush=True)
            supervisor.open()
            print("ready", flush=True)
            while True:
                supervisor.step(time.monotonic())
                time.sleep(_POLL_S)
        except KeyboardInterrupt:
            print("stopping", flush=True)
        finally:
            supervisor.close()
    return 0


def run_restart_broker(args: argparse.Namespace) -> int:
    data_dir = os.path.abspath(args.data_dir)
    print(request_restart(data_dir, args.broker), flush=True)
    address = wait_answering(data_dir, args.broker, args.timeout)
    print(f"broker {args.broker} is back: it answers on {address}", flush=True)
    return 0


def run_restart_rolling(args: argparse.Namespace) -> int:
    data_dir = os.path.abspath(args.data_dir)
    print(request_rolling_restart(data_dir, args.timeout), flush=True)
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
