"""Where an acknowledged write's time goes at 1,000 msg/s: a per-stage trace across three brokers.

    python -m bench.write_trace [--quick] [--writes N] [--partitions P] [--keep DIR]

Three real brokers on loopback (``LocalCluster``), replication factor 3, each started by
``bench._stage_traced_broker`` (its driver records when each stage of a write happens, on the
machine's one monotonic clock). A topic of ``P`` partitions (1 by default); ``PUB topic
partition=0 -- …`` lines paced at ``RATE / P`` writes/s on one pipelined connection (a thread
sends on time, another reads the ``+OK`` replies), each other partition written as fast by its
leader's client meanwhile (``RATE`` writes/s in all, as a producer spreads them), in two
scenarios of ``writes`` each:

* ``direct``: the connection is to the partition's leader;
* ``forwarded``: to a follower, which forwards each write to the leader (what a client or device
  whose broker is not the leader pays, two times in three with three brokers);

and in both, two consumers long-poll ``FETCH … replica=local format=text wait_ms=…``, one on the
leader's broker and one on a follower's (a long-polling CONS reads the replica of its own broker:
on a follower, a committed record is served once that follower has learnt of the commit).

Each write (by its offset) is matched to the first event of each stage that covers it (see
``bench._stage_traced_broker``): sent by the client, appended at the leader, AppendEntries sent,
received by each follower, durable there, answered, the answer received by the leader, durable
at the leader, committed at the leader, ``+OK`` read by the client; learnt committed at the
follower; read by each consumer. Printed: the median and p90 of each stage's delta per scenario.
Deltas are robust to a machine shared with other work, absolute times are not; on a machine
whose load average is far above its cores, neither is (every step waits for a core).

Ends with ``RESULT direct_ok_p50_ms=… direct_to_propose_ms=… direct_propose_to_commit_ms=…
direct_commit_to_ok_ms=… direct_leader_fsync_ms=… direct_follower_round_ms=…
direct_follower_fsync_ms=… direct_commit_to_follower_commit_ms=… direct_read_leader_ms=…
direct_read_follower_ms=… forwarded_ok_p50_ms=… forwarded_to_propose_ms=…
forwarded_propose_to_commit_ms=… forwarded_commit_to_ok_ms=… forwarded_leader_fsync_ms=…
forwarded_follower_round_ms=… forwarded_follower_fsync_ms=…
forwarded_commit_to_follower_commit_ms=… forwarded_read_leader_ms=… forwarded_read_follower_ms=…``:
per scenario, the medians in ms of: sent to ``+OK`` (``ok_p50``), sent to appended at the leader
(``to_propose``), appended to committed at the leader, committed to ``+OK`` read, appended to
durable at the leader (``leader_fsync``), AppendEntries sent to the first answer received
(``follower_round``), received to durable at that follower, the commit at the leader to the
follower learning it, and sent to read by the consumer on the leader's and on a follower's broker.
"""

from __future__ import annotations

import argparse
import bisect
import json
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from kafkaesque.client import Client
from kafkaesque.local_cluster import LocalCluster

from ._broker_procs import make_scratch
from .write_path import BROKERS, LineSocket, leader_of

RATE = 1_000
TOPIC = "trace"
LOG_ID = f"{TOPIC}/0"
WAIT_MS = 2_000


class TracedCluster(LocalCluster):
    """A ``LocalCluster`` whose brokers run under ``bench._stage_traced_broker``."""

    def __init__(self, data_dir: str, trace_dir: Path, fsync: str = "always") -> None:
        super().__init__(data_dir, BROKERS, extra_args=["--fsync", fsync])
        self.trace_dir = trace_dir

    def program(self, broker: int) -> list[str]:
        return [sys.executable, "-m", "bench._stage_traced_broker", str(self.trace_path(broker))]

    def trace_path(self, broker: int) -> Path:
        return self.trace_dir / f"broker-{broker}.jsonl"

    def record(self) -> None:
        for i in range(self.n):
            self.trace_path(i).unlink(missing_ok=True)
            self.procs[i].send_signal(signal.SIGUSR1)
        time.sleep(0.2)  # every handler ran before the first write

    def collect(self) -> list[list[tuple[int, str, str, int, int]]]:
        for i in range(self.n):
            self.procs[i].send_signal(signal.SIGUSR2)
        out = []
        for i in range(self.n):
            path = self.trace_path(i)
            deadline = time.monotonic() + 30
            while not path.exists():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"broker {i} wrote no trace")
                time.sleep(0.05)
            rows = [json.loads(line) for line in path.read_text().splitlines()]
            out.append([tuple(r) for r in rows])
        return out


@dataclass
class Consumer:
    """Long-polls ``FETCH replica=local`` on one broker; records when each offset is read."""

    address: tuple[str, int]
    start: int
    read_at: dict[int, int] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)
    error: Exception | None = None

    def run(self, until: int) -> None:
        try:
            conn = LineSocket(self.address)
            offset = self.start
            deadline = time.monotonic() + 60
            while offset <= until and not self.stop.is_set() and time.monotonic() < deadline:
                conn.sock.sendall(
                    f"FETCH {TOPIC} 0 {offset} format=text replica=local "
                    f"wait_ms={WAIT_MS}\r\n".encode()
                )
                while True:
                    line = conn.readline()
                    now = time.monotonic_ns()
                    if line.startswith(b"+MSG"):
                        got = int(line.split()[2])
                        self.read_at.setdefault(got, now)
                    elif line.startswith(b"+END"):
                        offset = int(line.split()[1].split(b":")[1])
                        break
                    else:
                        raise RuntimeError(f"FETCH answered {line!r}")
            conn.close()
        except (OSError, RuntimeError, ValueError, IndexError) as exc:  # reported by the caller
            self.error = exc


def paced_writes(
    address: tuple[str, int], writes: int, rate: float = RATE, partition: int = 0
) -> list[tuple[int, int, int]]:
    """``writes`` PUB lines to ``partition`` at ``rate``/s on one connection: (offset, sent_ns,
    ok_ns) each."""
    conn = LineSocket(address)
    sent: list[int] = [0] * writes
    replies: list[tuple[int, int]] = []
    failure: list[Exception] = []

    def reader() -> None:
        try:
            for _ in range(writes):
                line = conn.readline()
                now = time.monotonic_ns()
                if not line.startswith(b"+OK"):
                    raise RuntimeError(f"PUB answered {line!r}")
                replies.append((int(line.split()[2]), now))
        except (OSError, RuntimeError, ValueError, IndexError) as exc:  # raised by the caller
            failure.append(exc)

    thread = threading.Thread(target=reader)
    thread.start()
    began = time.monotonic()
    for i in range(writes):
        due = began + i / rate
        pause = due - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        sent[i] = time.monotonic_ns()
        conn.sock.sendall(f"PUB {TOPIC} partition={partition} -- w{i:06d}\r\n".encode())
        if failure:
            break
    thread.join(timeout=60)
    conn.close()
    if failure:
        raise failure[0]
    return [(off, sent[i], ok) for i, (off, ok) in enumerate(replies)]


class Stage:
    """The events of one stage of one broker, as sorted (index, time) for "first covering"."""

    def __init__(self, events: list[tuple[int, str, str, int, int]], stage: str, peer: int = -2):
        rows = sorted(
            (t, i) for t, s, g, i, p in events if s == stage and g == LOG_ID and peer in (-2, p)
        )
        # The first time each index was covered: a running max of the index over time.
        self.times: list[int] = []
        self.indexes: list[int] = []
        top = -1
        for t, i in rows:
            if i > top:
                top = i
                self.times.append(t)
                self.indexes.append(i)

    def at(self, offset: int) -> int | None:
        k = bisect.bisect_left(self.indexes, offset)
        return self.times[k] if k < len(self.times) else None


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def analyse(
    scenario: str,
    writes: list[tuple[int, int, int]],
    traces: list[list[tuple[int, str, str, int, int]]],
    leader: int,
    follower: int,
    reads: dict[str, dict[int, int]],
) -> dict[str, float]:
    lt = traces[leader]
    others = [b for b in range(BROKERS) if b != leader]
    propose = Stage(lt, "propose")
    l_durable = Stage(lt, "durable")
    l_commit = Stage(lt, "commit")
    ae_sent = {b: Stage(lt, "ae_sent", b) for b in others}
    ack_recv = {b: Stage(lt, "ack_recv", b) for b in others}
    ae_recv = {b: Stage(traces[b], "ae_recv") for b in others}
    f_durable = {b: Stage(traces[b], "durable") for b in others}
    ack_sent = {b: Stage(traces[b], "ack_sent") for b in others}
    f_commit = Stage(traces[follower], "commit")
    deltas: dict[str, list[float]] = {}

    def put(name: str, a: int | None, b: int | None) -> None:
        if a is not None and b is not None:
            deltas.setdefault(name, []).append((b - a) / 1e6)

    for off, sent, ok in writes:
        p = propose.at(off)
        c = l_commit.at(off)
        put("ok", sent, ok)
        put("to_propose", sent, p)
        put("propose_to_commit", p, c)
        put("commit_to_ok", c, ok)
        put("leader_fsync", p, l_durable.at(off))
        # The follower whose answer came first is the one that made the commit.
        firsts = [(ack_recv[b].at(off), b) for b in others]
        got = [(t, b) for t, b in firsts if t is not None]
        if got:
            t_ack, b = min(got)
            put("propose_to_ae_sent", p, ae_sent[b].at(off))
            put("ae_sent_to_recv", ae_sent[b].at(off), ae_recv[b].at(off))
            put("follower_fsync", ae_recv[b].at(off), f_durable[b].at(off))
            put("durable_to_ack_sent", f_durable[b].at(off), ack_sent[b].at(off))
            put("ack_sent_to_recv", ack_sent[b].at(off), t_ack)
            put("follower_round", ae_sent[b].at(off), t_ack)
            put("first_ack_to_commit", t_ack, c)
        put("commit_to_follower_commit", c, f_commit.at(off))
        for name, at in reads.items():
            put(f"read_{name}", sent, at.get(off))
            put(f"commit_to_read_{name}", c, at.get(off))
        put("follower_commit_to_read_follower", f_commit.at(off), reads["follower"].get(off))
    print(f"  {scenario}: {len(writes)} writes, delta in ms: p50 / p90 (n)")
    out: dict[str, float] = {}
    for name, values in deltas.items():
        p50, p90 = percentile(values, 0.5), percentile(values, 0.9)
        print(f"    {name:34s} {p50:7.2f} / {p90:7.2f}  ({len(values)})")
        out[name] = p50
    return out


def run_scenario(
    cluster: TracedCluster,
    scenario: str,
    writer: int,
    leader: int,
    follower: int,
    writes: int,
    partitions: int = 1,
) -> dict[str, float]:
    """Traces ``writes`` to partition 0 at ``RATE / partitions`` a second while each other
    partition of the topic takes as many, from its leader's clients (the same total rate)."""
    start = _log_end(cluster, leader)
    rate = RATE / partitions
    others = [
        threading.Thread(
            target=paced_writes,
            args=(cluster.client_address(_leader_broker(cluster, p)), writes, rate, p),
        )
        for p in range(1, partitions)
    ]
    consumers = {
        "leader": Consumer(cluster.client_address(leader), start),
        "follower": Consumer(cluster.client_address(follower), start),
    }
    cluster.record()
    threads = [
        threading.Thread(target=c.run, args=(start + writes + 10,)) for c in consumers.values()
    ]
    for t in [*threads, *others]:
        t.start()
    try:
        done = paced_writes(cluster.client_address(writer), writes, rate)
        time.sleep(0.3)  # the consumers read the last writes
    finally:
        for c in consumers.values():
            c.stop.set()
        for t in [*threads, *others]:
            t.join(timeout=WAIT_MS / 1000 + 5)
    traces = cluster.collect()
    for name, c in consumers.items():
        if c.error is not None:
            raise RuntimeError(f"consumer on the {name}'s broker: {c.error!r}")
    return analyse(
        scenario, done, traces, leader, follower, {k: c.read_at for k, c in consumers.items()}
    )


def _leader_broker(cluster: TracedCluster, partition: int) -> int:
    client = Client(cluster.bootstrap)
    try:
        return leader_of(client, TOPIC, partition)
    finally:
        client.close()


def _log_end(cluster: TracedCluster, broker: int) -> int:
    conn = LineSocket(cluster.client_address(broker))
    try:
        reply = conn.request(f"PUB {TOPIC} partition=0 -- probe\r\n".encode())
    finally:
        conn.close()
    return int(reply.split()[2]) + 1


def fields(prefix: str, stats: dict[str, float]) -> Iterator[str]:
    names = {
        "ok": "ok_p50",
        "to_propose": "to_propose",
        "propose_to_commit": "propose_to_commit",
        "commit_to_ok": "commit_to_ok",
        "leader_fsync": "leader_fsync",
        "follower_round": "follower_round",
        "follower_fsync": "follower_fsync",
        "commit_to_follower_commit": "commit_to_follower_commit",
        "read_leader": "read_leader",
        "read_follower": "read_follower",
    }
    for key, name in names.items():
        yield f"{prefix}{name}_ms={stats.get(key, float('nan')):.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="300 writes a scenario")
    parser.add_argument("--writes", type=int, default=0, help="writes a scenario")
    parser.add_argument("--keep", help="keep the data and traces in this directory")
    parser.add_argument(
        "--partitions",
        type=int,
        default=1,
        help="partitions of the topic, all written at once (the traced one is partition 0)",
    )
    parser.add_argument(
        "--fsync",
        choices=("always", "interval"),
        default="always",
        help="the brokers' --fsync (always: fsync before acknowledging, their default)",
    )
    args = parser.parse_args(argv)
    writes = args.writes or (300 if args.quick else 1_000)
    if writes <= 0:
        parser.error("--writes must be positive")
    scratch = Path(args.keep) if args.keep else make_scratch()
    scratch.mkdir(parents=True, exist_ok=True)
    trace_dir = scratch / "traces"
    trace_dir.mkdir(exist_ok=True)
    try:
        with TracedCluster(str(scratch / "data"), trace_dir, args.fsync) as cluster:
            client = Client(cluster.bootstrap)
            try:
                client.create_topic(TOPIC, args.partitions, BROKERS)
                leader = leader_of(client, TOPIC, 0)
            finally:
                client.close()
            follower = next(b for b in range(BROKERS) if b != leader)
            print(f"leader broker {leader}, follower broker {follower}")
            warm = LineSocket(cluster.client_address(leader))
            for i in range(200):  # connections, caches, the appender
                warm.request(f"PUB {TOPIC} partition=0 -- warm{i}\r\n".encode())
            warm.close()
            n = args.partitions
            direct = run_scenario(cluster, "direct", leader, leader, follower, writes, n)
            forwarded = run_scenario(cluster, "forwarded", follower, leader, follower, writes, n)
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    print("RESULT " + " ".join([*fields("direct_", direct), *fields("forwarded_", forwarded)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
