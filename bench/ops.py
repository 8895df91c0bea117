"""Operations benchmark: how soon a restarted broker is of use again (issue 23).

    python -m bench.ops [--quick] [--keep-logs DIR]

Real broker processes on loopback (``LocalCluster``), clients speaking the line protocol over
plain sockets, as a person at a telnet prompt would.

* restart to first ack: 3 brokers, a topic of 3 partitions with 3 replicas that took writes;
  SIGKILL two brokers, leave them down 3 s (the survivor alone has no quorum: nothing commits),
  start both again, and time from the restart until the first ``PUBS`` acknowledged through a
  restarted broker. The probe connects as soon as the port accepts and keeps one ``PUBS`` in
  flight (a new one as soon as the last was refused; a connection refused or silent for 2 s is
  opened again 20 ms later). Repeated: p50 and max.
* restart to ready: one broker SIGKILLed while the two others serve, started again; time from its
  start until it answers ``METADATA`` with broker rows (not ``NOT_READY``, not a refused
  connection). Repeated: p50 and max.
* every answer the probes got is checked: ``unknown_topic`` counts ``UNKNOWN_TOPIC`` answers for
  the topic, which exists all along (issue 23: a restarted broker answered it); it must be 0.

Ends with one line::

    RESULT restart_first_ack_s=<p50> restart_first_ack_max_s=<max> restart_ready_s=<p50>
    restart_ready_max_s=<max> unknown_topic=<count> trials=<n>

(on one line). Times are seconds, from the ``Popen`` of the restarted broker(s).
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import socket
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from kafkaesque.cli.cluster import LocalCluster

TOPIC = "ops-bench"
DOWN_S = 3.0  # how long the two brokers stay down (the scenario)
_PROBE_PAUSE_S = 0.02  # between a refused attempt and the next
_REPLY_TIMEOUT_S = 2.0  # a request unanswered this long: the connection is opened again
_GIVE_UP_S = 60.0


@dataclass
class Probe:
    """What one probe saw: the answers' codes (``OK``, ``NOT_READY``, ``CONN``...)."""

    answers: Counter[str] = field(default_factory=Counter)

    def note(self, line: bytes) -> None:
        if line.startswith(b"+"):
            self.answers["OK"] += 1
        else:
            self.answers[line[5:].split(b" ", 1)[0].decode("ascii", "replace") or "?"] += 1


def _read_answer(sock: socket.socket, buf: bytearray) -> bytes:
    """The first line of the next answer; the rest of a list answer (up to ``+END``) is read
    and dropped."""
    while True:
        end = buf.find(b"\r\n")
        if end >= 0:
            line = bytes(buf[:end])
            if not line.startswith(b"+BROKER") and not line.startswith(b"+PARTITION"):
                del buf[: end + 2]
                return line
            # A METADATA answer: its first row is the answer; skip to its end.
            close = buf.find(b"+END\r\n")
            if close >= 0:
                del buf[: close + 6]
                return line
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk


def probe_until_ok(
    address: tuple[str, int], line: bytes, started: float, probe: Probe, good: bytes = b"+"
) -> float:
    """Send ``line`` to ``address`` until an answer starts with ``good``; seconds since
    ``started`` (a ``time.monotonic()``). Every answer is noted in ``probe``."""
    deadline = started + _GIVE_UP_S
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(address, timeout=_REPLY_TIMEOUT_S) as sock:
                buf = bytearray()
                while time.monotonic() < deadline:
                    sock.sendall(line + b"\r\n")
                    answer = _read_answer(sock, buf)
                    probe.note(answer)
                    if answer.startswith(good):
                        return time.monotonic() - started
                    time.sleep(_PROBE_PAUSE_S)
        except OSError:
            probe.answers["CONN"] += 1
            time.sleep(_PROBE_PAUSE_S)
    raise TimeoutError(f"{line!r} to {address} got no {good!r} in {_GIVE_UP_S:.0f} s")


def _ask(address: tuple[str, int], line: str) -> bytes:
    with socket.create_connection(address, timeout=30) as sock:
        sock.sendall(line.encode() + b"\r\n")
        return _read_answer(sock, bytearray())


def stamp(what: str) -> None:
    """A wall-clock line to line the brokers' logs up with (``--keep-logs``)."""
    now = time.time()
    print(f"{time.strftime('%H:%M:%S', time.localtime(now))},{int(now % 1 * 1000):03d} {what}")


def _silent(what: str) -> None:
    pass


def restart_first_ack(
    cluster: LocalCluster, probe: Probe, stamp: Callable[[str], None] = _silent
) -> float:
    """Kill brokers 1 and 2 for ``DOWN_S``, restart them; seconds to the first ack via 1."""
    for broker in (1, 2):
        cluster.kill(broker)
    time.sleep(DOWN_S)
    started = time.monotonic()
    stamp("starting brokers 1 and 2")
    for broker in (1, 2):
        cluster.start(broker)
    took = probe_until_ok(cluster.client_address(1), f"PUBS {TOPIC} m".encode(), started, probe)
    cluster.wait_ready()  # all three back before the next trial
    return took


def restart_ready(
    cluster: LocalCluster, broker: int, probe: Probe, stamp: Callable[[str], None] = _silent
) -> float:
    """Kill ``broker``, restart it at once; seconds until METADATA answers broker rows."""
    cluster.kill(broker)
    started = time.monotonic()
    stamp(f"starting broker {broker}")
    cluster.start(broker)
    took = probe_until_ok(
        cluster.client_address(broker), b"METADATA", started, probe, good=b"+BROKER"
    )
    cluster.wait_ready()
    return took


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ops", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer trials (about a minute)")
    parser.add_argument("--keep-logs", metavar="DIR", help="copy the brokers' logs there")
    parser.add_argument("--log-level", default="WARNING", help="the brokers' (WARNING)")
    args = parser.parse_args(argv)
    timeline = stamp if args.keep_logs else _silent
    trials = 3 if args.quick else 10
    root = tempfile.mkdtemp(prefix="kq-bench-ops-")
    probe = Probe()
    try:
        with contextlib.ExitStack() as stack:
            cluster = stack.enter_context(LocalCluster(root, 3, log_level=args.log_level))
            if args.keep_logs:  # also when a trial fails: that is when they are wanted
                stack.callback(shutil.copytree, cluster.log_dir, args.keep_logs, dirs_exist_ok=True)
            created = _ask(cluster.client_address(0), f"CREATE {TOPIC} 3 3")
            if not created.startswith(b"+OK"):
                raise RuntimeError(f"CREATE answered {created!r}")
            _ask(cluster.client_address(0), f"PUBS {TOPIC} first")
            acks = []
            for trial in range(trials):
                acks.append(restart_first_ack(cluster, probe, timeline))
                print(f"restart to first ack, trial {trial + 1}: {acks[-1]:.2f} s", flush=True)
            ready = []
            for trial in range(trials):
                ready.append(restart_ready(cluster, 1 + trial % 2, probe, timeline))
                print(f"restart to ready, trial {trial + 1}: {ready[-1]:.2f} s", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("answers seen by the probes:", dict(sorted(probe.answers.items())))
    print(
        f"RESULT restart_first_ack_s={statistics.median(acks):.2f} "
        f"restart_first_ack_max_s={max(acks):.2f} "
        f"restart_ready_s={statistics.median(ready):.2f} restart_ready_max_s={max(ready):.2f} "
        f"unknown_topic={probe.answers['UNKNOWN_TOPIC']} trials={trials}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
