"""Peer baseline for the Raft benchmark: committed throughput of pysyncobj on our workload.

    python -m bench._pysyncobj_baseline [--quick] [--payload repeated|random]

What is measured
    Three pysyncobj Raft nodes on 127.0.0.1, each in its own OS process (multiprocessing, spawn
    start method, free ports picked at start), replicate batches of 100-byte records: one
    replicated command is one batch, the concatenated bytes of N records (N = 100 and N = 1000).
    The state machine is a ``SyncObj`` subclass whose ``@replicated append(batch)`` only counts
    commands and bytes, so the figures are replication cost, not application cost. Reported:
    committed batches/s and committed MB/s of record payload (10**6 bytes, framing excluded).

    Records are ``b"x" * 100`` by default, the records ``bench.raft`` commits. pysyncobj
    zlib-compresses every wire message (level 3), so such records cost it almost nothing on the
    wire; ``--payload random`` measures incompressible records, on which zlib dominates its CPU
    time and throughput drops by about 10x.

How
    Each configuration gets a fresh cluster in a fresh temp dir. The parent waits until exactly
    one node is leader with a quorum; the leader's process then keeps a window of commands in
    flight: it issues ``window`` calls with ``callback=`` (never ``sync=True``) and every callback
    issues the next call, so proposals come from pysyncobj's own tick thread with no extra
    thread. After ``WARMUP_S`` of warm-up the count of callbacks reporting
    ``FAIL_REASON.SUCCESS`` is sampled at the start and at the end of a fixed interval; the rates
    come from the difference. Other outcomes are counted and shown, and so are pysyncobj's
    WARNING+ log records (kept off the terminal) and the batches each node applied.

Configuration
    The research note's recommended conf: ``journalFile`` + ``fullDumpFile`` in the temp dir (so
    the nodes do disk work like ours; **pysyncobj never fsyncs**, so these figures carry no fsync
    cost), ``useFork=False``, ``dynamicMembershipChange=False``, ``password`` (a cluster secret;
    it needs the ``cryptography`` package, and when that is missing the run goes on unencrypted
    and says so), ``leaderFallbackTimeout=3.0``, election timeouts 0.4-1.4 s. Tuned for
    throughput, each choice measured on this machine class:

    * ``appendEntriesUseBatch``: both values are probed briefly per N and the better one is
      measured (reported). With batching on, the leader sends once per ``appendEntriesPeriod``
      (0.1 s), so it needs a deep window; off, it sends on every command and a deep window hurts.
    * window: ``window_for(N, use_batch, payload)``: with batching on 2000 commands for N=100 and
      200 for N=1000; with it off 500 and 200; 200 throughout for random records.
    * ``appendEntriesBatchSizeBytes``: the 64 KiB default for N=100; above the pickled entry for
      N=1000, because pysyncobj's chunked path for entries of >= that size is broken for binary
      data (see ``append_entries_batch_bytes``).

Everything is bounded: start, election and per-request timeouts, and every node process is
stopped at the end, on error and on Ctrl-C (stop message, then terminate, then kill).

Ends with ``RESULT pysyncobj_batches_per_s_100=… pysyncobj_mb_per_s_100=…
pysyncobj_batches_per_s_1000=… pysyncobj_mb_per_s_1000=…``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import multiprocessing as mp
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from importlib.metadata import version
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, Literal, cast, get_args

import pysyncobj
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated

from kafkaesque.local_cluster import free_ports

RECORD_BYTES = 100
Payload = Literal["repeated", "random"]
DEFAULT_PAYLOAD: Payload = "repeated"  # the records bench.raft commits: b"x" * 100
MB = 1_000_000
NODES = 3
WARMUP_S = 1.0
CLUSTER_SECRET = "kafkaesque-bench-cluster-secret"
HAS_CRYPTO: bool = bool(getattr(pysyncobj, "HAS_CRYPTO", False))
START_TIMEOUT_S = 20.0  # spawn + import + bind, per node
ELECTION_TIMEOUT_S = 15.0
REPLY_GRACE_S = 15.0  # added to a load's own duration before the parent gives up on the leader
DRAIN_TIMEOUT_S = 1.0  # the leader waits up to this long for in-flight commands after a load
_FAIL_NAMES = {
    value: name
    for name, value in vars(FAIL_REASON).items()
    if name.isupper() and isinstance(value, int)
}


class _BatchCounter(SyncObj):  # type: ignore[misc]  # SyncObj is untyped (Any)
    """The replicated state machine: it only counts, so the benchmark measures replication."""

    def __init__(self, self_address: str, partners: list[str], conf: SyncObjConf) -> None:
        super().__init__(self_address, partners, conf)
        # After super().__init__: attributes present when SyncObj.__init__ runs are treated as its
        # own and left out of snapshots (fullDumpFile). With a fresh journal nothing can be
        # applied this early (no leader yet).
        self.batches = 0
        self.payload_bytes = 0

    # `replicated` must decorate directly: it injects `append_v0` into the class namespace through
    # sys._getframe, so a typed wrapper around it would break registration (KeyError 'append').
    @replicated  # type: ignore[untyped-decorator]
    def append(self, batch: bytes) -> None:
        """Apply one committed batch (runs on the tick thread of every node)."""
        self.batches += 1
        self.payload_bytes += len(batch)


# -- node process -------------------------------------------------------------------------------


def window_for(records_per_batch: int, use_batch: bool, payload: Payload = DEFAULT_PAYLOAD) -> int:
    """Commands the leader keeps in flight, tuned on this machine class for the best throughput.

    With ``appendEntriesUseBatch`` the leader sends only once per ``appendEntriesPeriod``
    (0.1 s), so it needs about 20 MB of payload in flight (N=100: 2000, N=1000: 200). Without
    it, it sends on every command, and deeper windows make it slower: after each success reply
    the leader moves ``nextIndex`` back to the acknowledged index and re-sends entries that are
    already in flight (the followers then truncate and re-append them, logging CRITICAL), so
    about 5 MB, at least 200 commands (N=100: 500, N=1000: 200). On random records zlib takes
    ~20x longer per batch than on ``b"x"`` records and deep windows stall the leader past the
    election timeout, so they get 200 commands in every case (the best of 20, 50 and 200 tried).
    """
    if payload == "random":
        return 200
    batch_bytes = records_per_batch * RECORD_BYTES
    if use_batch:
        return max(50, min(5000, 20 * MB // batch_bytes))
    return max(200, min(1000, 5 * MB // batch_bytes))


def append_entries_batch_bytes(records_per_batch: int) -> int:
    """``appendEntriesBatchSizeBytes`` for batches of ``records_per_batch`` records.

    pysyncobj sends an entry whose command is >= this size in chunks ("transmission"), and that
    path is broken in 0.3.17: the last chunk is picked by comparing with the command's length
    instead of the pickled entry's, and pysyncobj pickles with protocol 2, which stores bytes as
    latin-1 text (so binary data grows by up to 2x per pickling). With random records followers
    then unpickle a truncated entry on every tick and 100 KB batches commit at ~3/s. So keep the
    64 KiB default when the command fits, else use a power of two above twice the batch.
    """
    return max(1 << 16, 1 << (2 * records_per_batch * RECORD_BYTES).bit_length())


def _conf(
    directory: str, index: int, use_batch: bool, records_per_batch: int, overrides: dict[str, Any]
) -> SyncObjConf:
    options: dict[str, Any] = {
        "appendEntriesUseBatch": use_batch,
        "appendEntriesBatchSizeBytes": append_entries_batch_bytes(records_per_batch),
        "journalFile": os.path.join(directory, f"node{index}.journal"),
        "fullDumpFile": os.path.join(directory, f"node{index}.dump"),
        "useFork": False,
        "dynamicMembershipChange": False,
        "password": CLUSTER_SECRET if HAS_CRYPTO else None,
        "leaderFallbackTimeout": 3.0,
        "raftMinTimeout": 0.4,
        "raftMaxTimeout": 1.4,
    }
    options.update(overrides)
    return SyncObjConf(**options)


class _LogCounter(logging.Handler):
    """Counts pysyncobj's log records instead of printing them: it logs a CRITICAL line each time
    a follower truncates entries the leader re-sent, and a traceback for every failed tick."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.counts: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        message = str(record.msg)
        if message.startswith("truncating already-applied"):
            self.counts["truncations"] += 1
        elif message.startswith("failed _onTick"):
            error = record.exc_info[0].__name__ if record.exc_info and record.exc_info[0] else "?"
            self.counts[f"tick_error:{error}"] += 1
        else:  # e.g. "raftCommitIndex (%d) exceeds journal end" after a follower loads a snapshot
            self.counts[f"{record.levelname.lower()}:{message.split(' ', 1)[0]}"] += 1


def _make_batches(records_per_batch: int, payload: Payload) -> list[bytes]:
    """Batches of ``records_per_batch`` 100-byte records, issued round robin."""
    if payload == "repeated":
        return [b"x" * RECORD_BYTES * records_per_batch]
    rng = random.Random(records_per_batch)
    return [rng.randbytes(RECORD_BYTES * records_per_batch) for _ in range(8)]


def _drive(
    node: _BatchCounter,
    records_per_batch: int,
    warmup: float,
    seconds: float,
    window: int,
    payload: Payload,
) -> dict[str, Any]:
    """Keep ``window`` commands in flight for ``warmup + seconds``; count committed ones."""
    batches = _make_batches(records_per_batch, payload)
    lock = threading.Lock()
    ok = 0
    in_flight = 0
    issued = 0
    stop = False
    failures: Counter[str] = Counter()

    def issue() -> None:
        nonlocal in_flight, issued
        with lock:
            in_flight += 1
            issued += 1
            batch = batches[issued % len(batches)]
        node.append(batch, callback=on_done)

    def on_done(_result: object, error: int) -> None:
        nonlocal ok, in_flight
        with lock:
            in_flight -= 1
            if error == FAIL_REASON.SUCCESS:
                ok += 1
            else:
                failures[_FAIL_NAMES.get(error, str(error))] += 1
            again = not stop
        if again:
            issue()

    for _ in range(window):
        issue()
    time.sleep(warmup)
    with lock:
        ok_start, failures_start, t_start = ok, failures.copy(), time.perf_counter()
    time.sleep(seconds)
    with lock:
        ok_end, failures_end, t_end = ok, failures.copy(), time.perf_counter()
        stop = True
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while time.monotonic() < deadline:
        with lock:
            if in_flight == 0:
                break
        time.sleep(0.02)
    return {
        "committed": ok_end - ok_start,
        "elapsed": t_end - t_start,
        "failures": dict(failures_end - failures_start),
    }


def _node_main(
    index: int,
    ports: Sequence[int],
    directory: str,
    use_batch: bool,
    records_per_batch: int,
    overrides: dict[str, Any],
    conn: Connection,
) -> None:
    """Body of one node process: run a SyncObj and answer the parent's requests until told to stop
    (or until the parent goes away)."""
    node: _BatchCounter | None = None
    log_counter = _LogCounter()
    pysyncobj_logger = logging.getLogger("pysyncobj")
    pysyncobj_logger.addHandler(log_counter)
    pysyncobj_logger.propagate = False
    try:
        addresses = [f"127.0.0.1:{port}" for port in ports]
        partners = [a for i, a in enumerate(addresses) if i != index]
        node = _BatchCounter(
            addresses[index],
            partners,
            _conf(directory, index, use_batch, records_per_batch, overrides),
        )
        conn.send(("ready", index))
        while True:
            request = conn.recv()
            kind = request[0]
            if kind == "status":
                conn.send(
                    (
                        "status",
                        bool(node._isLeader()),
                        bool(node.hasQuorum),
                        int(node.raftCommitIndex),
                        node.batches,
                        node.payload_bytes,
                        dict(log_counter.counts),
                    )
                )
            elif kind == "load":
                conn.send(("load", _drive(node, *request[1:])))
            else:  # "stop"
                break
    except (EOFError, KeyboardInterrupt, BrokenPipeError):
        pass  # parent gone or Ctrl-C: just shut down
    except Exception as exc:  # report anything else to the parent, then shut down
        with contextlib.suppress(OSError):
            conn.send(("error", f"node {index}: {exc!r}"))
        raise
    finally:
        if node is not None:
            node.destroy()
        conn.close()


# -- cluster control (parent) -------------------------------------------------------------------


def _recv(conn: Connection, timeout: float, what: str) -> tuple[Any, ...]:
    if not conn.poll(timeout):
        raise TimeoutError(f"no {what} reply within {timeout:.0f} s")
    reply = conn.recv()
    if reply[0] == "error":
        raise RuntimeError(reply[1])
    return cast(tuple[Any, ...], reply)


@dataclass
class _Cluster:
    processes: list[BaseProcess]
    conns: list[Connection]

    def status(self) -> list[tuple[Any, ...]]:
        for conn in self.conns:
            conn.send(("status",))
        return [_recv(conn, 5.0, "status") for conn in self.conns]

    def wait_for_leader(self) -> int:
        deadline = time.monotonic() + ELECTION_TIMEOUT_S
        while time.monotonic() < deadline:
            statuses = self.status()
            leaders = [i for i, s in enumerate(statuses) if s[1] and s[2]]
            if len(leaders) == 1:
                return leaders[0]
            time.sleep(0.1)
        raise TimeoutError(f"no single leader with a quorum within {ELECTION_TIMEOUT_S:.0f} s")


@contextlib.contextmanager
def _cluster(
    use_batch: bool, records_per_batch: int, overrides: dict[str, Any]
) -> Iterator[_Cluster]:
    """Start 3 node processes (spawn) in a fresh temp dir; always stop and reap them."""
    ctx = mp.get_context("spawn")
    directory = tempfile.mkdtemp(prefix="kafkaesque-pysyncobj-")
    processes: list[BaseProcess] = []
    conns: list[Connection] = []
    try:
        ports = free_ports(NODES)
        for index in range(NODES):
            parent_end, child_end = ctx.Pipe()
            process = ctx.Process(
                target=_node_main,
                args=(index, ports, directory, use_batch, records_per_batch, overrides, child_end),
                name=f"pysyncobj-node-{index}",
                daemon=True,
            )
            process.start()
            child_end.close()
            processes.append(process)
            conns.append(parent_end)
        for conn in conns:
            _recv(conn, START_TIMEOUT_S, "start")
        yield _Cluster(processes, conns)
    finally:
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.send(("stop",))
        for proc in processes:
            proc.join(timeout=3.0)
        for proc in processes:
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=2.0)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=2.0)
        for conn in conns:
            conn.close()
        shutil.rmtree(directory, ignore_errors=True)


# -- measurement --------------------------------------------------------------------------------


@dataclass
class Result:
    """One measured configuration."""

    records_per_batch: int
    use_batch: bool
    window: int
    seconds: float
    committed: int
    failures: dict[str, int] = field(default_factory=dict)
    applied_batches: list[int] = field(default_factory=list)  # per node, at the end
    log_counts: dict[str, int] = field(default_factory=dict)  # pysyncobj WARNING+ records

    @property
    def batches_per_s(self) -> float:
        return self.committed / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.batches_per_s * self.records_per_batch * RECORD_BYTES / MB


def _log_total(statuses: Sequence[tuple[Any, ...]]) -> Counter[str]:
    total: Counter[str] = Counter()
    for status in statuses:
        total.update(status[6])
    return total


def measure_config(
    records_per_batch: int,
    seconds: float,
    *,
    use_batch: bool,
    window: int | None = None,
    payload: Payload = DEFAULT_PAYLOAD,
    overrides: dict[str, Any] | None = None,
) -> Result:
    """Measure one configuration on a fresh 3-process cluster, after ``WARMUP_S`` of warm-up.

    ``window`` defaults to ``window_for(records_per_batch, use_batch, payload)``; ``overrides``
    are extra ``SyncObjConf`` keyword arguments (for exploring other settings).
    """
    if window is None:
        window = window_for(records_per_batch, use_batch, payload)
    with _cluster(use_batch, records_per_batch, overrides or {}) as cluster:
        leader = cluster.wait_for_leader()
        logs_before = _log_total(cluster.status())
        conn = cluster.conns[leader]
        conn.send(("load", records_per_batch, WARMUP_S, seconds, window, payload))
        load = _recv(conn, WARMUP_S + seconds + DRAIN_TIMEOUT_S + REPLY_GRACE_S, "load")[1]
        statuses = cluster.status()
    return Result(
        records_per_batch=records_per_batch,
        use_batch=use_batch,
        window=window,
        seconds=load["elapsed"],
        committed=load["committed"],
        failures=load["failures"],
        applied_batches=[s[4] for s in statuses],
        log_counts=dict(_log_total(statuses) - logs_before),
    )


def probe_seconds(seconds: float) -> float:
    """Length of each ``appendEntriesUseBatch`` probe before a measurement of ``seconds``."""
    return max(1.0, min(3.0, seconds / 4))


def measure(
    records_per_batch: int,
    seconds: float,
    *,
    use_batch: bool | None = None,
    payload: Payload = DEFAULT_PAYLOAD,
) -> tuple[float, float]:
    """Committed (batches/s, MB/s of record payload) of a 3-process pysyncobj cluster.

    Each batch is ``records_per_batch`` 100-byte records in one replicated command; the rate is
    taken over ``seconds`` after 1 s of warm-up. With ``use_batch=None`` both
    ``appendEntriesUseBatch`` values are first probed for ``probe_seconds(seconds)`` each and the
    better one is measured: the call takes about ``seconds + 2 * probe_seconds(seconds) + 8`` s
    (3 cluster starts and warm-ups); pass ``use_batch`` to skip the probes.
    """
    if use_batch is None:
        probe = probe_seconds(seconds)
        with_batch = measure_config(records_per_batch, probe, use_batch=True, payload=payload)
        without = measure_config(records_per_batch, probe, use_batch=False, payload=payload)
        use_batch = with_batch.batches_per_s >= without.batches_per_s
    result = measure_config(records_per_batch, seconds, use_batch=use_batch, payload=payload)
    return result.batches_per_s, result.mb_per_s


# -- command line -------------------------------------------------------------------------------


def _row(kind: str, r: Result) -> str:
    failures = ",".join(f"{k}={v}" for k, v in sorted(r.failures.items())) or "-"
    applied = "/".join(str(a) for a in r.applied_batches)
    logs = ",".join(f"{k}={v}" for k, v in sorted(r.log_counts.items())) or "-"
    return (
        f"{kind:<8} {r.records_per_batch:>5} {r.use_batch!s:>9} {r.window:>6} {r.seconds:>5.1f} "
        f"{r.batches_per_s:>10,.0f} {r.mb_per_s:>7.2f}  {failures:<12} {applied:<20} {logs}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Probe both ``appendEntriesUseBatch`` values per N, measure the better, print RESULT."""
    parser = argparse.ArgumentParser(
        prog="python -m bench._pysyncobj_baseline", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="8 s per measurement (else 30 s)")
    parser.add_argument("--seconds", type=float, help="override the measured duration")
    parser.add_argument(
        "--payload",
        choices=get_args(Payload),
        default=DEFAULT_PAYLOAD,
        help="record contents: b'x' * 100 as in bench.raft (default), or random bytes",
    )
    args = parser.parse_args(argv)
    seconds: float = args.seconds or (8.0 if args.quick else 30.0)
    payload: Payload = args.payload
    probe = probe_seconds(seconds)
    sizes = (100, 1000)
    started = time.perf_counter()

    print(
        f"pysyncobj {version('pysyncobj')}: {NODES} nodes, one process each, loopback; "
        f"{RECORD_BYTES}-byte records ({payload}); warm-up {WARMUP_S:.0f} s, "
        f"probes {probe:.0f} s, measurements {seconds:.0f} s"
    )
    print(
        "journalFile + fullDumpFile in a temp dir; pysyncobj never fsyncs (no fsync cost in "
        "these figures); "
        + ("password set" if HAS_CRYPTO else "password NOT set (`cryptography` not installed)")
    )
    print(
        f"{'phase':<8} {'N':>5} {'useBatch':>9} {'window':>6} {'secs':>5} {'batches/s':>10} "
        f"{'MB/s':>7}  {'failures':<12} {'applied/node':<20} pysyncobj log"
    )
    final: dict[int, Result] = {}
    for n in sizes:
        probes = {}
        for use_batch in (True, False):
            probes[use_batch] = measure_config(n, probe, use_batch=use_batch, payload=payload)
            print(_row("probe", probes[use_batch]), flush=True)
        best = probes[True].batches_per_s >= probes[False].batches_per_s
        final[n] = measure_config(n, seconds, use_batch=best, payload=payload)
        print(_row("measure", final[n]), flush=True)
    print(
        "chosen: "
        + ", ".join(f"N={n} appendEntriesUseBatch={final[n].use_batch}" for n in sizes)
        + f"; total runtime {time.perf_counter() - started:.1f} s"
    )
    print(
        "RESULT "
        + " ".join(
            f"pysyncobj_batches_per_s_{n}={final[n].batches_per_s:.0f} "
            f"pysyncobj_mb_per_s_{n}={final[n].mb_per_s:.2f}"
            for n in sizes
        )
    )
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
