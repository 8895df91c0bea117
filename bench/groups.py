"""Consumer-group benchmark: rebalance time, paused members, and the cost of idempotence.

    python -m bench.groups [--quick]

On 3 brokers (loopback, replication factor 3):

* rebalance: a group of 10 members (each its own connection and thread, reading with CONS)
  shares a 100-partition topic; an 11th member joins (time until its SUBS is answered and its
  first CONS holds its share) and then crashes (its socket is reset; time until no partition
  is owned by it any more, as GROUPS shows). ``rebalance_p50_ms`` / ``_p99_ms`` over every join
  and crash of the run.
* ``paused_members``: members whose partitions did not move but whose reading stopped during a
  rebalance (an error, or no answer for more than 1 s). The target is 0.
* ``idempotent_overhead_ratio``: records/s of pipelined batch publishes (PUBB, 100 records of 100
  bytes) with a producer id and sequences, over the same without, in the same run.

The baseline printed beside the rebalance figures is the same run's PING round trip.
Ends with ``RESULT rebalance_p50_ms=… rebalance_p99_ms=… paused_members=…
idempotent_overhead_ratio=…``.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import statistics
import tempfile
import threading
import time

from kafkaesque.client import Client, ListResponse, SyncConnection
from kafkaesque.local_cluster import LocalCluster
from kafkaesque.protocol import Cons, OkReply, Subs
from kafkaesque.storage import Record, build_batch

MEMBERS = 10
PARTITIONS = 100
PAUSE_S = 1.0
TIMEOUT_S = 30.0


def _subscribe(connection: SyncConnection) -> str:
    """``SUBS load crew`` on ``connection`` (a subscription lives on its connection): its id."""
    reply = connection.request(Subs("load", "crew"), TIMEOUT_S)
    assert isinstance(reply, OkReply), f"SUBS answered {reply!r}"
    return reply.text


class _Member(threading.Thread):
    """One group member reading in a loop; records its partitions and any pause."""

    def __init__(self, address: tuple[str, int], stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.connection = SyncConnection(address, connect_timeout_s=TIMEOUT_S)
        self.id = _subscribe(self.connection)
        self.owned: frozenset[int] = frozenset()
        self.stop = stop
        self.errors = 0
        self.longest_gap = 0.0
        self.history: list[tuple[float, frozenset[int]]] = []

    def run(self) -> None:
        last = time.monotonic()
        while not self.stop.is_set():
            reply = self.connection.request(Cons("load", self.id, 0, 1, 100), TIMEOUT_S)
            now = time.monotonic()
            if isinstance(reply, ListResponse):
                self.owned = frozenset(p for p, _ in reply.end.next_offsets)
                self.history.append((now, self.owned))
                self.longest_gap = max(self.longest_gap, now - last)
                last = now
            else:
                self.errors += 1
        self.connection.close()


def _owners(admin: Client) -> dict[int, str | None]:
    return {r.partition: r.owner for r in admin.describe_group("crew", "load")}


def _rebalances(cluster: LocalCluster, rounds: int) -> tuple[list[float], int]:
    stop = threading.Event()
    members = [_Member(cluster.client_address(i % 3), stop) for i in range(MEMBERS)]
    for m in members:
        m.start()
    samples: list[float] = []
    paused = 0
    with Client.pinned(cluster.client_address(0)) as admin:
        time.sleep(1.0)
        for _ in range(rounds):
            before = {m.id: m.owned for m in members}
            for m in members:
                m.longest_gap, m.errors = 0.0, 0
            started = time.monotonic()
            newcomer = SyncConnection(cluster.client_address(1), connect_timeout_s=TIMEOUT_S)
            nid = _subscribe(newcomer)
            rows = newcomer.request(Cons("load", nid, 0, 1), TIMEOUT_S)
            assert isinstance(rows, ListResponse), f"CONS answered {rows!r}"
            assert rows.end.next_offsets, "the newcomer got no share"
            samples.append(time.monotonic() - started)
            time.sleep(0.3)
            # A crash, on purpose below the client (which closes politely): the socket is reset.
            sock = newcomer.detach()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
            started = time.monotonic()
            sock.close()  # a crash: the connection is reset
            while nid in _owners(admin).values() and time.monotonic() - started < 30:
                time.sleep(0.005)
            samples.append(time.monotonic() - started)
            time.sleep(0.3)
            after = {m.id: m.owned for m in members}
            for m in members:
                unaffected = before[m.id] <= after[m.id]
                if unaffected and (m.errors or m.longest_gap > PAUSE_S):
                    paused += 1
    stop.set()
    for m in members:
        m.join(10)
    return samples, paused


def _publish_rate(address: tuple[str, int], seconds: float, producer_id: int | None) -> float:
    """Records/s of pipelined PUBB batches (100 x 100 B) to partition 0 of ``speed``; with a
    ``producer_id``, idempotent (its sequences start at 0). A raw socket on purpose: what is
    measured is the broker's cost of idempotence, without a client's batching in the way."""
    records = [Record(value=b"x" * 100) for _ in range(100)]
    window = 16
    sock = socket.create_connection(address)
    sent = acked = seq = 0
    buf = b""
    deadline = time.monotonic() + seconds
    started = time.monotonic()
    while time.monotonic() < deadline:
        out = []
        for _ in range(window - (sent - acked)):
            if producer_id is None:
                batch = build_batch(records)
            else:
                batch = build_batch(
                    records, producer_id=producer_id, producer_epoch=0, base_sequence=seq
                )
            seq += len(records)
            out.append(b"PUBB speed 0 %d\r\n%s\r\n" % (len(batch), batch))
            sent += 1
        sock.sendall(b"".join(out))
        data = sock.recv(65536)
        if not data:
            break
        buf += data
        lines = buf.split(b"\r\n")
        buf = lines.pop()
        for line in lines:
            if not line.startswith(b"+OK"):
                raise RuntimeError(f"publish failed: {line!r}")
            acked += 1
    elapsed = time.monotonic() - started
    sock.close()
    return acked * len(records) / elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.groups")
    parser.add_argument("--quick", action="store_true", help="a short run (under 60 s)")
    args = parser.parse_args(argv)
    rounds = 4 if args.quick else 15
    seconds = 4.0 if args.quick else 15.0
    root = tempfile.mkdtemp(prefix="kq-bench-groups-")
    try:
        with LocalCluster(root, 3) as cluster:
            with Client.pinned(cluster.client_address(0)) as admin:
                admin.create_topic("load", PARTITIONS, 3)
                admin.create_topic("speed", 1, 3)
                pings = []
                for _ in range(200):
                    t = time.perf_counter()
                    admin.ping()
                    pings.append(time.perf_counter() - t)
            samples, paused = _rebalances(cluster, rounds)
            address = cluster.client_address(_leader(cluster))
            # Interleaved halves, so that drift (a growing log, a busy machine) hits both alike.
            plain = idem = 0.0
            for producer_id in (1, 2):
                plain += _publish_rate(address, seconds / 2, None) / 2
                idem += _publish_rate(address, seconds / 2, producer_id) / 2
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ms = sorted(s * 1000 for s in samples)
    p50 = statistics.median(ms)
    p99 = ms[min(len(ms) - 1, int(0.99 * len(ms)))]
    ping_ms = statistics.median(pings) * 1000
    print(f"rebalance ({MEMBERS} members, {PARTITIONS} partitions, {len(ms)} joins and crashes):")
    print(f"  p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {ms[-1]:.1f} ms  (target p99 < 1000 ms)")
    print(f"  baseline: PING round trip {ping_ms:.2f} ms")
    print(f"  unaffected members that paused: {paused}  (target 0)")
    print("publishing 100-record batches, pipelined:")
    print(f"  plain {plain:,.0f} records/s, idempotent {idem:,.0f} records/s")
    ratio = idem / plain if plain else 0.0
    print(f"  idempotent / plain = {ratio:.2f}  (target >= 0.9)")
    print(
        f"RESULT rebalance_p50_ms={p50:.1f} rebalance_p99_ms={p99:.1f} paused_members={paused} "
        f"idempotent_overhead_ratio={ratio:.2f}"
    )
    return 0


def _leader(cluster: LocalCluster) -> int:
    with Client.pinned(cluster.client_address(0)) as c:
        leader = c.refresh_metadata(["speed"]).partitions["speed"][0].leader
    return 0 if leader is None else leader


if __name__ == "__main__":
    raise SystemExit(main())
