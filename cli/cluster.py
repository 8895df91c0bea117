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

The brokers are a ``kafkaesque.local_cluster.LocalCluster``: the same thing as a library, for the
tests, the benchmarks and the fault injector.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any, TextIO

from kafkaesque.local_cluster import (
    ClusterError,
    LocalCluster,
    RollingStep,
    answers_ping,
    describe_exit,
)

DEFAULT_DATA_DIR = os.path.join(".kafkaesque-data", "cluster")
DEFAULT_BASE_PORT = 9092

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
            # False while not listening yet, or while it says NOT_READY.
            if answers_ping(self.cluster.client_address(broker), _PING_TIMEOUT_S):
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
        if answers_ping((host, int(port)), _PING_TIMEOUT_S):
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
                    + f" kafka=127.0.0.1:{p.kafka} http=http://127.0.0.1:{p.http}"
                    + f" pid={cluster.procs[i].pid}",
                    flush=True,
                )
            print(f"data in {cluster.data_dir}; logs in {cluster.log_dir}", flush=True)
            print(f"bootstrap {cluster.bootstrap}", flush=True)
            print(f"kafka: kcat -b {cluster.kafka_bootstrap} -L", flush=True)
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
