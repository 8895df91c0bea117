"""Operations benchmark: how soon a restarted broker is of use again (issue 23), and how long a
partition is unavailable during a graceful rolling restart against a kill (issue 26).

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
* rolling restart: a topic of ``ROLLING_PARTITIONS`` partitions with 3 replicas; one probe per
  partition writes to it without pause, one record at a time, through the client library's
  ``Producer`` (idempotent, default retries), and notes when each acknowledgement came. The
  partition's unavailability is the longest gap between two acknowledgements (or the phase's
  start or end) while every broker is restarted in turn with SIGTERM
  (``LocalCluster.restart_rolling``: each hands its leaderships over before it stops);
  ``rolling_unavailable_p99_s`` is the p99 over partitions (target < 0.3 s). Then, in the same
  run with the same probes, the broker leading the most partitions is killed with SIGKILL and
  started again: ``kill_unavailable_p99_s`` is the same figure for the election that causes.
  ``client_errors`` counts the sends that failed for the client (retries exhausted); ``lost``
  the acknowledged records not read back at their offset, ``duplicates`` those read twice;
  all three must be 0.
* leader balancing: a topic of ``BALANCE_PARTITIONS`` partitions (1,000; 300 with ``--quick``)
  with 3 replicas. Every partition's replicas are reordered (``REASSIGN``, same brokers) so that
  broker 0 is the preferred replica of all, and the balancers gather every leadership on broker
  0; once the balancer's hold has passed, the original order is put back (``REASSIGN`` again,
  all pipelined on one connection) and the clock runs until every partition is led by its
  preferred replica again: ``transfers_per_s`` is the leaderships broker 0 gave away divided by
  that time (the metadata changes included; target >= 33/s, Redpanda's balancer manages 3-4/s).
  It is bounded by broker 0's ``--leader-balance-rate`` (50 a second by default).

Ends with one line::

    RESULT restart_first_ack_s=<p50> restart_first_ack_max_s=<max> restart_ready_s=<p50>
    restart_ready_max_s=<max> unknown_topic=<count> trials=<n>
    rolling_unavailable_p99_s=<p99> kill_unavailable_p99_s=<p99> client_errors=<n> lost=<n>
    duplicates=<n> transfers_per_s=<rate> balanced_partitions=<n>

(on one line). Times are seconds, from the ``Popen`` of the restarted broker(s).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import shutil
import socket
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from kafkaesque.broker import DEFAULT_HOLD_S
from kafkaesque.client import Client, Consumer, KafkaesqueError, Producer, ProducerConfig
from kafkaesque.local_cluster import LocalCluster

TOPIC = "ops-bench"
DOWN_S = 3.0  # how long the two brokers stay down (the scenario)
_PROBE_PAUSE_S = 0.02  # between a refused attempt and the next
_REPLY_TIMEOUT_S = 2.0  # a request unanswered this long: the connection is opened again
_GIVE_UP_S = 60.0
ROLLING_TOPIC = "ops-rolling"
ROLLING_PARTITIONS = 6
_SETTLE_S = 1.0  # probes write this long before and after a phase: gaps at its edges count
_STOP_PROBES_S = 60.0  # a probe's last send ends within the producer's delivery timeout
BALANCE_TOPIC = "ops-balance"
BALANCE_PARTITIONS = 1000
_BALANCE_POLL_S = 0.1
_BALANCE_GIVE_UP_S = 180.0
_REASSIGN_CONNECTIONS = 32


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


def ask(address: tuple[str, int], line: str) -> bytes:
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


class PartitionProbes:
    """One thread per partition of ``topic``, each with a client library ``Producer`` of its
    own (idempotent, default retries, no linger) that sends one record at a time to its
    partition and, once it is acknowledged, the next (after ``pause_s``). Each thread notes when
    every acknowledgement came and where the record went; a send that fails for the client
    (after the producer's own retries) is noted in ``errors``.

    A context manager: the threads run from ``__enter__`` to ``stop`` (or ``__exit__``).
    """

    def __init__(
        self, bootstrap: str, topic: str, partitions: int, *, pause_s: float = 0.0
    ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.partitions = partitions
        self.pause_s = pause_s
        # Each list and dict is written by its partition's thread only (read after stop()).
        self.acks: dict[int, list[float]] = {p: [] for p in range(partitions)}
        self.acked: dict[int, dict[int, bytes]] = {p: {} for p in range(partitions)}
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(p,), name=f"probe-{p}", daemon=True)
            for p in range(partitions)
        ]

    def __enter__(self) -> PartitionProbes:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop sending and wait for every thread's last send to end."""
        self._stop.set()
        for thread in self._threads:
            thread.join(_STOP_PROBES_S)

    def _run(self, partition: int) -> None:
        config = ProducerConfig(linger_ms=0)
        try:
            with Client(self.bootstrap) as client, Producer(client, config) as producer:
                n = 0
                while not self._stop.is_set():
                    value = f"{partition}-{n}".encode()
                    n += 1
                    try:
                        where = producer.send(self.topic, value, partition=partition).get()
                    except KafkaesqueError as exc:
                        self.errors.append(f"partition {partition}: {exc}")
                        continue
                    self.acks[partition].append(time.monotonic())
                    self.acked[partition][where.offset] = value
                    if self.pause_s:
                        time.sleep(self.pause_s)
        except Exception as exc:  # noqa: BLE001 - a probe that dies is an error to report
            self.errors.append(f"partition {partition}: the probe stopped: {exc!r}")

    def longest_gaps(self, start: float, end: float) -> list[float]:
        """Each partition's longest time without an acknowledgement within [start, end]
        (``time.monotonic()``), the edges counting as acknowledgements."""
        gaps = []
        for p in range(self.partitions):
            times = [start, *(t for t in self.acks[p] if start < t < end), end]
            gaps.append(max(b - a for a, b in itertools.pairwise(times)))
        return gaps

    def verify(self) -> tuple[int, int]:
        """Read the topic back: (acknowledged records not at their offset, records read more
        than once). Call after ``stop``."""
        seen: Counter[bytes] = Counter()
        stored: dict[tuple[int, int], bytes | None] = {}
        with Consumer(self.bootstrap) as consumer:
            consumer.assign_topic(self.topic)
            for record in consumer.records(follow=False):
                stored[record.partition, record.offset] = record.value
                if record.value is not None:
                    seen[record.value] += 1
        lost = sum(
            1
            for p, acked in self.acked.items()
            for offset, value in acked.items()
            if stored.get((p, offset)) != value
        )
        return lost, sum(1 for count in seen.values() if count > 1)


def p99(values: Sequence[float]) -> float:
    """The 99th percentile (nearest rank) of ``values``."""
    ordered = sorted(values)
    return ordered[max(0, -(-99 * len(ordered) // 100) - 1)]


def unavailability(
    cluster: LocalCluster, partitions: int, stamp: Callable[[str], None] = _silent
) -> tuple[list[float], list[float], int, int, int]:
    """The rolling-restart phase and the kill phase (see the module docstring), one after the
    other with the same probes: (rolling gaps, kill gaps, client errors, lost, duplicates)."""
    created = ask(cluster.client_address(0), f"CREATE {ROLLING_TOPIC} {partitions} 3")
    if not created.startswith(b"+OK"):
        raise RuntimeError(f"CREATE answered {created!r}")
    with PartitionProbes(cluster.bootstrap, ROLLING_TOPIC, partitions) as probes:
        time.sleep(_SETTLE_S)
        stamp("rolling restart")
        start = time.monotonic()
        for step in cluster.restart_rolling():
            print(f"rolling restart: {step.describe()}", flush=True)
        time.sleep(_SETTLE_S)
        rolling = probes.longest_gaps(start, time.monotonic())
        victim = _most_leaders(cluster, ROLLING_TOPIC)
        stamp(f"kill -9 broker {victim}")
        start = time.monotonic()
        cluster.kill(victim)
        time.sleep(2.0)  # longer than an election: the gap is the election's
        cluster.start(victim)
        cluster.wait_ready()
        cluster.wait_in_sync(victim)
        time.sleep(_SETTLE_S)
        killed = probes.longest_gaps(start, time.monotonic())
    lost, duplicates = probes.verify()
    return rolling, killed, len(probes.errors), lost, duplicates


def _leaders_and_replicas(
    client: Client, topic: str
) -> tuple[dict[int, int | None], dict[int, tuple[int, ...]]]:
    rows = client.refresh_metadata([topic]).partitions.get(topic, ())
    return {r.partition: r.leader for r in rows}, {r.partition: tuple(r.replicas) for r in rows}


def _reassign_all(address: tuple[str, int], assignment: dict[int, tuple[int, ...]]) -> None:
    """``REASSIGN`` every partition of ``BALANCE_TOPIC`` to ``assignment``, pipelined on
    ``_REASSIGN_CONNECTIONS`` connections at once (one connection's commands are answered one
    after the other: the metadata, not the balancer, would set the pace); raises if one is
    refused."""
    items = sorted(assignment.items())
    chunks = [items[i::_REASSIGN_CONNECTIONS] for i in range(_REASSIGN_CONNECTIONS)]
    with ThreadPoolExecutor(_REASSIGN_CONNECTIONS) as pool:
        for done in [pool.submit(_reassign_some, address, chunk) for chunk in chunks if chunk]:
            done.result()


def _reassign_some(address: tuple[str, int], items: list[tuple[int, tuple[int, ...]]]) -> None:
    lines = b"".join(
        b"REASSIGN %s %d %s\r\n" % (BALANCE_TOPIC.encode(), p, ",".join(map(str, r)).encode())
        for p, r in items
    )
    with socket.create_connection(address, timeout=60) as sock:
        sock.sendall(lines)
        buf = bytearray()
        for p, _ in items:
            answer = _read_answer(sock, buf)
            if not answer.startswith(b"+OK"):
                raise RuntimeError(f"REASSIGN {BALANCE_TOPIC} {p} answered {answer!r}")


def _wait_led(client: Client, want: dict[int, int], what: str) -> None:
    """Until each partition ``p`` of ``BALANCE_TOPIC`` is led by ``want[p]``."""
    deadline = time.monotonic() + _BALANCE_GIVE_UP_S
    while True:
        leaders, _ = _leaders_and_replicas(client, BALANCE_TOPIC)
        if leaders == want:
            return
        if time.monotonic() > deadline:
            wrong = sum(1 for p, b in want.items() if leaders.get(p) != b)
            raise TimeoutError(f"{what}: {wrong} partitions still led elsewhere")
        time.sleep(_BALANCE_POLL_S)


def balancing(
    cluster: LocalCluster, partitions: int, stamp: Callable[[str], None] = _silent
) -> tuple[float, int]:
    """The leader balancing phase (see the module docstring): (transfers a second, how many
    leaderships broker 0 gave away)."""
    address = cluster.client_address(0)
    created = ask(address, f"CREATE {BALANCE_TOPIC} {partitions} 3")
    if not created.startswith(b"+OK"):
        raise RuntimeError(f"CREATE answered {created!r}")
    with Client(cluster.bootstrap) as client:
        _, original = _leaders_and_replicas(client, BALANCE_TOPIC)
        preferred = {p: r[0] for p, r in original.items()}
        _wait_led(client, preferred, "after CREATE")
        stamp("gathering every leadership on broker 0")
        gathered = {p: (0, *(b for b in r if b != 0)) for p, r in original.items()}
        _reassign_all(address, gathered)
        _wait_led(client, {p: 0 for p in original}, "gathering on broker 0")
        # The balancer keeps a leadership won less than its hold ago: let the last one pass.
        time.sleep(DEFAULT_HOLD_S + 0.5)
        moves = sum(1 for b in preferred.values() if b != 0)
        stamp(f"spreading {moves} leaderships again")
        started = time.monotonic()
        _reassign_all(address, original)
        reassigned = time.monotonic() - started
        _wait_led(client, preferred, "spreading again")
        took = time.monotonic() - started
    print(
        f"leader balancing: broker 0 gave {moves} leaderships away in {took:.2f} s "
        f"(the REASSIGNs were all answered after {reassigned:.2f} s)",
        flush=True,
    )
    return moves / took, moves


def _most_leaders(cluster: LocalCluster, topic: str) -> int:
    """The broker leading the most partitions of ``topic`` (as broker 0 reports it)."""
    with Client(cluster.bootstrap) as client:
        metadata = client.refresh_metadata([topic])
    leaders = Counter(
        row.leader for row in metadata.partitions.get(topic, ()) if row.leader is not None
    )
    return leaders.most_common(1)[0][0] if leaders else 0


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
            created = ask(cluster.client_address(0), f"CREATE {TOPIC} 3 3")
            if not created.startswith(b"+OK"):
                raise RuntimeError(f"CREATE answered {created!r}")
            ask(cluster.client_address(0), f"PUBS {TOPIC} first")
            acks = []
            for trial in range(trials):
                acks.append(restart_first_ack(cluster, probe, timeline))
                print(f"restart to first ack, trial {trial + 1}: {acks[-1]:.2f} s", flush=True)
            ready = []
            for trial in range(trials):
                ready.append(restart_ready(cluster, 1 + trial % 2, probe, timeline))
                print(f"restart to ready, trial {trial + 1}: {ready[-1]:.2f} s", flush=True)
            partitions = ROLLING_PARTITIONS if args.quick else 2 * ROLLING_PARTITIONS
            rolling, killed, errors, lost, duplicates = unavailability(
                cluster, partitions, timeline
            )
            print("unavailability per partition, rolling restart:", _seconds(rolling))
            print("unavailability per partition, leader killed:", _seconds(killed))
            balance_partitions = 300 if args.quick else BALANCE_PARTITIONS
            transfers_per_s, moves = balancing(cluster, balance_partitions, timeline)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("answers seen by the probes:", dict(sorted(probe.answers.items())))
    print(
        f"RESULT restart_first_ack_s={statistics.median(acks):.2f} "
        f"restart_first_ack_max_s={max(acks):.2f} "
        f"restart_ready_s={statistics.median(ready):.2f} restart_ready_max_s={max(ready):.2f} "
        f"unknown_topic={probe.answers['UNKNOWN_TOPIC']} trials={trials} "
        f"rolling_unavailable_p99_s={p99(rolling):.3f} kill_unavailable_p99_s={p99(killed):.3f} "
        f"client_errors={errors} lost={lost} duplicates={duplicates} "
        f"transfers_per_s={transfers_per_s:.1f} balanced_partitions={moves}"
    )
    return 0


def _seconds(values: Sequence[float]) -> str:
    return " ".join(f"{v:.3f}" for v in values)


if __name__ == "__main__":
    raise SystemExit(main())
