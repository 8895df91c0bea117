"""The REST API's cost: REST produce and reads against the line protocol's PUBS and FETCH, on
the same cluster, in the same run (issue 34).

    python -m bench.http [--quick]

3 brokers on loopback (``LocalCluster``), replication factor 3, 3 partitions a topic, 100-byte
values. Both sides of each comparison run in this process, one thread and one kept-alive
connection per broker, with the same number of records in flight per connection:

* (a) produce: each connection POSTs ``{"records": [...]}`` of 100 binary records (base64) to
  ``/topics/{t}`` and waits for the answer, again and again; against 100 pipelined ``PUBS``
  lines on a raw socket, sent in one write, whose 100 replies are awaited before the next 100.
  Records acknowledged per second after a warm-up. Target: ``rest_produce_vs_pubs >= 0.5``.
* (b) reads: one reader walks a partition of N records from offset 0 to its end with ``GET
  /topics/{t}/partitions/0/records?offset=..&max_bytes=..``, against the client library's
  ``FETCH`` (``Client.fetch``, records decoded) with the same ``max_bytes``, both through the
  same broker. Records read per second. Target: ``rest_read_vs_cons >= 0.5``.

Ends with ``RESULT rest_produce_msgs_per_s=… pubs_msgs_per_s=… rest_produce_vs_pubs=…
rest_read_msgs_per_s=… cons_read_msgs_per_s=… rest_read_vs_cons=…``.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kafkaesque.client import Client, Producer, ProducerConfig
from kafkaesque.local_cluster import LocalCluster

BROKERS = 3
PARTITIONS = 3
VALUE = b"v" * 100
PER_REQUEST = 100  # records per POST, and PUBS lines in flight per connection
MAX_BYTES = 256 * 1024
TARGET = 0.5
_BINARY = "application/vnd.kafka.binary.v2+json"


@dataclass(frozen=True)
class Durations:
    warmup_s: float
    produce_s: float
    read_records: int


QUICK = Durations(warmup_s=0.5, produce_s=3.0, read_records=30_000)
FULL = Durations(warmup_s=2.0, produce_s=10.0, read_records=200_000)


class _Counter:
    """Records acknowledged by all threads, and the first error seen."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ok = 0
        self.errors = 0
        self.first_error = ""

    def add(self, ok: int, errors: int, error: str = "") -> None:
        with self.lock:
            self.ok += ok
            self.errors += errors
            if error and not self.first_error:
                self.first_error = error


def _rest_producer(address: tuple[str, int], topic: str) -> Callable[[_Counter, float], None]:
    record = {"value": base64.b64encode(VALUE).decode()}
    body = json.dumps({"records": [record] * PER_REQUEST}).encode()
    headers = {"Content-Type": _BINARY, "Content-Length": str(len(body))}

    def run(counter: _Counter, until: float) -> None:
        conn = http.client.HTTPConnection(*address, timeout=30)
        try:
            while time.monotonic() < until:
                conn.request("POST", f"/topics/{topic}", body, headers)
                response = conn.getresponse()
                data = response.read()
                if response.status != 200:
                    counter.add(0, PER_REQUEST, f"{response.status} {data[:200]!r}")
                    continue
                offsets = json.loads(data)["offsets"]
                ok = sum(1 for o in offsets if o.get("offset") is not None)
                counter.add(ok, len(offsets) - ok)
        finally:
            conn.close()

    return run


def _pubs_producer(address: tuple[str, int], topic: str) -> Callable[[_Counter, float], None]:
    lines = (b"PUBS %s %s\r\n" % (topic.encode(), VALUE)) * PER_REQUEST

    def run(counter: _Counter, until: float) -> None:
        # A raw socket on purpose: PUBS lines pipelined by hand, 100 in flight, as a POST's.
        with socket.create_connection(address, timeout=30) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            tail = b""
            while time.monotonic() < until:
                sock.sendall(lines)
                replies = 0
                data = tail
                while replies < PER_REQUEST:
                    chunk = sock.recv(1 << 16)
                    if not chunk:
                        raise ConnectionError("the broker closed the connection")
                    data += chunk
                    replies = data.count(b"\n")
                end = data.rfind(b"\n") + 1
                done, tail = data[:end], data[end:]
                errors = done.count(b"-ERR")
                error = ""
                if errors:
                    at = done.index(b"-ERR")
                    error = done[at : done.index(b"\n", at)].decode()
                counter.add(replies - errors, errors, error)

    return run


def _flat_out(
    name: str, runners: list[Callable[[_Counter, float], None]], durations: Durations
) -> float:
    """Records acknowledged per second by ``runners`` (one thread each), after the warm-up."""
    counter = _Counter()
    start = time.monotonic()
    until = start + durations.warmup_s + durations.produce_s
    failures: list[Exception] = []

    def guarded(run: Callable[[_Counter, float], None]) -> None:
        try:
            run(counter, until)
        except (OSError, ValueError, KeyError, http.client.HTTPException) as exc:
            # reported below, not lost in the thread
            failures.append(exc)

    threads = [threading.Thread(target=guarded, args=(r,), daemon=True) for r in runners]
    for thread in threads:
        thread.start()
    time.sleep(durations.warmup_s)
    first = (time.monotonic(), counter.ok)
    time.sleep(durations.produce_s)
    last = (time.monotonic(), counter.ok)
    for thread in threads:
        thread.join(60)
    if failures:
        raise RuntimeError(f"{name}: {failures[0]!r}")
    if counter.errors:
        print(f"      {name}: {counter.errors} records refused, first: {counter.first_error}")
    return (last[1] - first[1]) / (last[0] - first[0])


def _fill(bootstrap: str, topic: str, count: int) -> None:
    config = ProducerConfig(linger_ms=5)
    with Producer(bootstrap, config) as producer:
        for _ in range(count):
            producer.send(topic, VALUE, partition=0)
        producer.flush()


def _rest_walk(address: tuple[str, int], topic: str, end: int) -> int:
    """Records read walking partition 0 of ``topic`` from 0 to ``end`` over REST."""
    conn = http.client.HTTPConnection(*address, timeout=30)
    offset, records = 0, 0
    try:
        while offset < end:
            conn.request(
                "GET", f"/topics/{topic}/partitions/0/records?offset={offset}&max_bytes={MAX_BYTES}"
            )
            response = conn.getresponse()
            data = response.read()
            if response.status != 200:
                raise RuntimeError(f"REST read: {response.status} {data[:200]!r}")
            records += len(json.loads(data))
            offset = int(response.getheader("Kafkaesque-Next-Offset") or offset)
    finally:
        conn.close()
    return records


def _cons_walk(address: tuple[str, int], topic: str, end: int) -> int:
    """The same walk with the client library's FETCH, through the same broker."""
    offset, records = 0, 0
    with Client(f"{address[0]}:{address[1]}") as client:
        while offset < end:
            result = client.fetch(topic, 0, offset, max_bytes=MAX_BYTES)
            records += len(result.records)
            offset = result.next_offset
    return records


def _timed_walk(
    walk: Callable[[tuple[str, int], str, int], int], address: tuple[str, int], topic: str, end: int
) -> float:
    started = time.monotonic()
    records = walk(address, topic, end)
    return records / (time.monotonic() - started)


def _ratio(ours: float, theirs: float) -> float:
    return ours / theirs if theirs > 0 else float("nan")


def _verdict(ratio: float) -> str:
    return "target met" if ratio >= TARGET else "TARGET MISSED"


def run(root: Path, durations: Durations) -> None:
    started = time.monotonic()
    with LocalCluster(str(root / "cluster"), BROKERS) as cluster:
        with Client(cluster.bootstrap) as client:
            for topic in ("rest-produce", "pubs-produce"):
                client.create_topic(topic, PARTITIONS, BROKERS)
            client.create_topic("walk", 1, BROKERS)
        print(
            f"cluster: {BROKERS} brokers, replication factor {BROKERS}, {PARTITIONS} partitions "
            f"a topic, 100-byte values [{time.monotonic() - started:.0f} s]"
        )
        # PUBS first, then REST: the second runs on a cluster as warm as the first.
        pubs = _flat_out(
            "PUBS",
            [_pubs_producer(cluster.client_address(i), "pubs-produce") for i in range(BROKERS)],
            durations,
        )
        rest = _flat_out(
            "REST",
            [_rest_producer(cluster.http_address(i), "rest-produce") for i in range(BROKERS)],
            durations,
        )
        produce_ratio = _ratio(rest, pubs)
        print(
            f"(a) produce, {BROKERS} connections, {PER_REQUEST} records in flight each: REST "
            f"{rest:,.0f} msg/s, PUBS {pubs:,.0f} msg/s: {produce_ratio:.2f} "
            f"({_verdict(produce_ratio)}: >= {TARGET})"
        )
        _fill(cluster.bootstrap, "walk", durations.read_records)
        with Client(cluster.bootstrap) as client:
            end = client.partition_offsets("walk")[0][1]
        address = cluster.client_address(0)
        cons = _timed_walk(_cons_walk, address, "walk", end)
        rest_read = _timed_walk(_rest_walk, cluster.http_address(0), "walk", end)
        read_ratio = _ratio(rest_read, cons)
        print(
            f"(b) reads of {durations.read_records:,} records, max_bytes {MAX_BYTES // 1024} KiB "
            f"through broker 0: REST {rest_read:,.0f} msg/s, FETCH {cons:,.0f} msg/s: "
            f"{read_ratio:.2f} ({_verdict(read_ratio)}: >= {TARGET})"
        )
    print(
        f"RESULT rest_produce_msgs_per_s={rest:.0f} pubs_msgs_per_s={pubs:.0f} "
        f"rest_produce_vs_pubs={produce_ratio:.2f} rest_read_msgs_per_s={rest_read:.0f} "
        f"cons_read_msgs_per_s={cons:.0f} rest_read_vs_cons={read_ratio:.2f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.http", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short phases (about a minute)")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="kafkaesque-bench-http-"))
    try:
        run(root, QUICK if args.quick else FULL)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
