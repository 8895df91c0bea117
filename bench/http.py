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

* (c) the web console's idle cost: a cluster of its own with 1,000 partitions, idle; the three
  brokers' CPU seconds over windows with one console tab on broker 0's overview (a real
  headless chromium driven by Playwright, where installed; else a reader of the tab's
  server-sent-events stream, said so) against windows with the same browser on a blank page,
  alternated so that drift counts on both sides: ``console_idle_cpu_ratio``, target <= 1.1.
  The browser's own rendering shares the machine's 2 cores with the brokers and slows every
  process on them (the brokers that serve no tab measurably too), which is the browser's cost,
  not the console's: hence the blank page as the baseline. Windows with no browser at all are
  measured too, and the ratio against them printed (``..._vs_no_browser``), and so is the
  least noisy figure on a shared machine: broker 0 (the tab's) against brokers 1 and 2 (which
  the overview asks nothing) in the same windows, tab against blank page
  (``console_tab_broker_vs_peers``).

Ends with ``RESULT rest_produce_msgs_per_s=… pubs_msgs_per_s=… rest_produce_vs_pubs=…
rest_read_msgs_per_s=… cons_read_msgs_per_s=… rest_read_vs_cons=… console_idle_cpu_ratio=…``
(``--console-only``: the last figure alone, with its two CPU figures).
"""

from __future__ import annotations

import argparse
import base64
import http.client
import importlib.util
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
from typing import Any

from kafkaesque.client import Client, ClientConfig, Producer, ProducerConfig
from kafkaesque.local_cluster import LocalCluster

from ._broker_procs import process_cpu_s

BROKERS = 3
PARTITIONS = 3
VALUE = b"v" * 100
PER_REQUEST = 100  # records per POST, and PUBS lines in flight per connection
MAX_BYTES = 256 * 1024
TARGET = 0.5
_BINARY = "application/vnd.kafka.binary.v2+json"


CONSOLE_TARGET = 1.1
CONSOLE_TOPICS = 10
CHROMIUM = "/usr/bin/chromium"
# The flags known to work on these machines (the env notes): without the networking ones
# chromium tries Google's hosts at every start. The console's browser tests use them too.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@dataclass(frozen=True)
class Durations:
    warmup_s: float
    produce_s: float
    read_records: int
    console_partitions: int
    console_settle_s: float
    console_window_s: float  # each window, with the tab and without
    console_rounds: int  # windows of each kind, alternated


QUICK = Durations(
    warmup_s=0.5,
    produce_s=3.0,
    read_records=30_000,
    console_partitions=1000,
    console_settle_s=10.0,
    console_window_s=5.0,
    console_rounds=4,
)
FULL = Durations(
    warmup_s=2.0,
    produce_s=10.0,
    read_records=200_000,
    console_partitions=1000,
    console_settle_s=20.0,
    console_window_s=10.0,
    console_rounds=8,
)


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


class _Browser:
    """A headless chromium with one page (Playwright), or, where chromium or Playwright is
    missing, a thread that reads the console's event stream as a tab would (``kind`` says
    which). ``show_console()`` points the page at the console's overview, ``show_blank()`` at
    ``about:blank`` (the reader thread: starts and stops)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.real = importlib.util.find_spec("playwright") is not None and bool(
            shutil.which(CHROMIUM)
        )
        self.kind = (
            "a headless chromium tab"
            if self.real
            else "an event-stream reader (no chromium or Playwright here)"
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._manager: Any = None
        self._browser: Any = None
        self._page: Any = None

    def __enter__(self) -> _Browser:
        if self.real:
            from playwright.sync_api import sync_playwright  # optional: the dev extra's

            self._manager = sync_playwright()
            playwright = self._manager.start()
            self._browser = playwright.chromium.launch(
                executable_path=CHROMIUM, args=CHROMIUM_FLAGS
            )
            self._page = self._browser.new_page()
            self._page.goto("about:blank")
        return self

    def show_console(self) -> None:
        if self.real:
            self._page.goto(self.url + "/")
            self._page.wait_for_selector("text=brokers up", timeout=30_000)
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._read_stream, daemon=True)
        self._thread.start()

    def show_blank(self) -> None:
        if self.real:
            self._page.goto("about:blank")
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)

    def _read_stream(self) -> None:
        host, port = self.url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        try:
            conn.request("GET", "/api/events")
            response = conn.getresponse()
            while not self._stop.is_set() and response.readline():
                pass
        finally:
            conn.close()

    def __exit__(self, *exc: object) -> None:
        self.show_blank()
        if self._browser is not None:
            self._browser.close()
            self._manager.__exit__(None, None, None)


def _brokers_cpu_s(cluster: LocalCluster) -> list[float]:
    return [process_cpu_s(cluster.procs[i].pid) for i in range(BROKERS)]


def _spent(cluster: LocalCluster, seconds: float) -> list[float]:
    before = _brokers_cpu_s(cluster)
    time.sleep(seconds)
    return [b - a for a, b in zip(before, _brokers_cpu_s(cluster), strict=True)]


@dataclass
class ConsoleCpu:
    """The three brokers' CPU, percent of one core, each broker's and in all: with no browser
    at all, with the browser on a blank page, with the browser on the console's overview."""

    none: list[float]
    blank: list[float]
    tab: list[float]
    kind: str

    @property
    def ratio(self) -> float:
        """The console's cost: the tab against the same browser showing nothing."""
        return sum(self.tab) / max(sum(self.blank), 1e-9)

    @property
    def ratio_vs_no_browser(self) -> float:
        return sum(self.tab) / max(sum(self.none), 1e-9)

    @property
    def tab_broker_vs_peers(self) -> float:
        """The tab's broker (0) against the two others, the tab against the blank page: the
        overview asks the other brokers nothing, so they are a control that feels the same
        machine load in the same windows (far less noisy on a shared machine)."""
        peers_tab = (self.tab[1] + self.tab[2]) / 2
        peers_blank = (self.blank[1] + self.blank[2]) / 2
        return (self.tab[0] / max(peers_tab, 1e-9)) / max(
            self.blank[0] / max(peers_blank, 1e-9), 1e-9
        )


def console_idle(root: Path, durations: Durations) -> ConsoleCpu:
    """(c): see the module docstring. The windows: ``console_rounds`` with no browser, then,
    with the browser started, ``console_rounds`` pairs of a blank page and the console."""
    started = time.monotonic()
    count = durations.console_partitions
    with LocalCluster(str(root / "console-cluster"), BROKERS) as cluster:
        # A long timeout: 100 partitions a CREATE take seconds on a loaded machine.
        with Client(cluster.bootstrap, config=ClientConfig(request_timeout_ms=120_000)) as client:
            for t in range(CONSOLE_TOPICS):
                client.create_topic(f"idle-{t}", count // CONSOLE_TOPICS, BROKERS)
        print(
            f"(c) cluster: {BROKERS} brokers, {count} partitions (replication factor {BROKERS}) "
            f"[{time.monotonic() - started:.0f} s]; settling {durations.console_settle_s:g} s"
        )
        time.sleep(durations.console_settle_s)
        window = durations.console_window_s
        rounds = durations.console_rounds
        none = [0.0] * BROKERS
        blank = [0.0] * BROKERS
        tab = [0.0] * BROKERS

        def add(into: list[float]) -> None:
            for i, spent in enumerate(_spent(cluster, window)):
                into[i] += spent

        for _ in range(rounds):
            add(none)
        with _Browser(f"http://127.0.0.1:{cluster.ports[0].admin}") as browser:
            for _ in range(rounds):
                browser.show_blank()
                time.sleep(1.0)
                add(blank)
                browser.show_console()
                time.sleep(2.0)  # the page's load and first snapshots are not idle
                add(tab)
    span = rounds * window
    return ConsoleCpu(
        [100 * x / span for x in none],
        [100 * x / span for x in blank],
        [100 * x / span for x in tab],
        browser.kind,
    )


def _print_console(root: Path, durations: Durations) -> ConsoleCpu:
    cpu = console_idle(root, durations)
    print(
        "(c) per broker, percent of one core, no browser / blank page / console: "
        + ", ".join(
            f"broker {i} {a:.2f} / {b:.2f} / {c:.2f}"
            for i, (a, b, c) in enumerate(zip(cpu.none, cpu.blank, cpu.tab, strict=True))
        )
    )
    verdict = "target met" if cpu.ratio <= CONSOLE_TARGET else "TARGET MISSED"
    print(
        f"(c) idle CPU of the 3 brokers, percent of one core: {kind_blank(cpu)} "
        f"{sum(cpu.blank):.2f}, with {cpu.kind} on broker 0's overview {sum(cpu.tab):.2f}: "
        f"{cpu.ratio:.2f} ({verdict}: <= {CONSOLE_TARGET}); against no browser at all "
        f"({sum(cpu.none):.2f}): {cpu.ratio_vs_no_browser:.2f} (the browser's own load on the "
        f"2 cores counts there too); broker 0 against brokers 1 and 2 in the same windows, tab "
        f"against blank page: {cpu.tab_broker_vs_peers:.2f}"
    )
    return cpu


def kind_blank(cpu: ConsoleCpu) -> str:
    return "the browser on a blank page" if cpu.kind.startswith("a headless") else "no tab"


def run_console(root: Path, durations: Durations) -> None:
    cpu = _print_console(root, durations)
    print(
        f"RESULT console_idle_cpu_pct_blank={sum(cpu.blank):.2f} "
        f"console_idle_cpu_pct_tab={sum(cpu.tab):.2f} console_idle_cpu_ratio={cpu.ratio:.2f} "
        f"console_idle_cpu_ratio_vs_no_browser={cpu.ratio_vs_no_browser:.2f} "
        f"console_tab_broker_vs_peers={cpu.tab_broker_vs_peers:.2f}"
    )


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
    console = _print_console(root, durations)
    print(
        f"RESULT rest_produce_msgs_per_s={rest:.0f} pubs_msgs_per_s={pubs:.0f} "
        f"rest_produce_vs_pubs={produce_ratio:.2f} rest_read_msgs_per_s={rest_read:.0f} "
        f"cons_read_msgs_per_s={cons:.0f} rest_read_vs_cons={read_ratio:.2f} "
        f"console_idle_cpu_ratio={console.ratio:.2f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.http", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short phases (about a minute)")
    parser.add_argument(
        "--console-only", action="store_true", help="only (c), the console's idle CPU"
    )
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="kafkaesque-bench-http-"))
    try:
        (run_console if args.console_only else run)(root, QUICK if args.quick else FULL)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
