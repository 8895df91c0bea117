"""The load generators of ``bench.broker``, each run as its own process.

    python -m bench._broker_load KIND [options]

Kinds: ``producer`` (the client library's batching ``Producer``, as fast as it goes), ``pubs``
(pipelined ``PUBS`` lines on raw sockets), ``publish`` (the ``Producer`` at a fixed rate, each
message stamped with the time it was due), ``consume`` (a ``GroupConsumer`` measuring each
message's latency at delivery) and ``loopback`` (a TCP sink and echo server, the baseline).

The peer, NATS JetStream, through its Python client ``nats-py`` (asyncio): ``nats-producer``
(async publishes with a window of acknowledgements in flight, as fast as it goes),
``nats-publish`` (the same at a fixed rate, stamped like ``publish``; ``--window=0`` publishes
synchronously, one acknowledgement at a time) and ``nats-consume`` (a push consumer on the
stream, no acknowledgements, as ``consume`` commits none). ``nats`` is imported only by these.

The same over the Kafka protocol, with librdkafka, are ``bench._kafka_load``'s.

``producer`` and ``pubs`` take ``--tls-ca CA --user NAME`` (the password in
``$KAFKAESQUE_PASSWORD``): TLS to the brokers and SCRAM-SHA-256 authentication, the client
library's ``Security`` for the one, ``AUTH`` on each raw connection for the other.

A process prints JSON lines on stdout: ``{"event": "ready"}`` once it can be measured (the
consumer: subscribed), ``{"event": "measuring"}`` when its measured window opens (after the
warm-up), and last ``{"event": "result", ...}``. Every loop is bounded in time and count.
Timestamps are ``time.monotonic_ns()``, one clock for every process of the machine (Linux's
CLOCK_MONOTONIC).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import functools
import json
import os
import select
import selectors
import socket
import ssl
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from kafkaesque.client import (
    Client,
    ClientConfig,
    DeliveryHandle,
    GroupConsumer,
    Producer,
    ProducerConfig,
    Security,
    SyncConnection,
)

MESSAGE_BYTES = 100
_STAMP = b"%020d %010d "  # due time (monotonic ns) and sequence number, then padding
_STAMP_BYTES = 32
_MAX_WINDOW = 4000  # PUBS lines in flight per connection: below the broker's 4,096 per session


def emit(event: str, **fields: Any) -> None:
    """One JSON line for the orchestrator."""
    print(json.dumps({"event": event, **fields}), flush=True)


def stamped(due_ns: int, seq: int) -> bytes:
    """A message of ``MESSAGE_BYTES`` carrying when it was due and its number."""
    head = _STAMP % (due_ns, seq)
    return head + b"x" * (MESSAGE_BYTES - len(head))


def read_stamp(value: bytes) -> tuple[int, int]:
    """``(due_ns, seq)`` of a ``stamped`` message."""
    return int(value[:20]), int(value[21:31])


def _secure(args: argparse.Namespace) -> bool:
    return getattr(args, "tls_ca", None) is not None


def client_config(args: argparse.Namespace) -> ClientConfig:
    """The client's settings: SASL_SSL as ``--user`` when ``--tls-ca`` is given."""
    if not _secure(args):
        return ClientConfig()
    from kafkaesque.client import Security

    security = Security(
        protocol="SASL_SSL",
        username=args.user,
        password=os.environ["KAFKAESQUE_PASSWORD"],
        ssl_cafile=args.tls_ca,
    )
    return ClientConfig(security=security)


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` quantile (0..1) of ``values`` (sorted or not); nan if empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


# -- (a) the batching producer, flat out ------------------------------------------------------


def run_producer(args: argparse.Namespace) -> None:
    config = ProducerConfig(
        linger_ms=args.linger_ms,
        batch_size=args.batch_size,
        max_buffered_bytes=args.buffer_bytes,
    )
    value = bytes(i % 251 for i in range(MESSAGE_BYTES))
    max_records = int(2_000_000 * (args.warmup + args.seconds))  # far above any real rate
    with (
        Client(args.bootstrap, config=client_config(args)) as client,
        Producer(client, config) as producer,
    ):
        client.partitions_for(args.topic)
        emit("ready")
        send, topic = producer.send, args.topic
        start = time.monotonic()
        measure_at, end_at = start + args.warmup, start + args.warmup + args.seconds
        first: tuple[float, int] | None = None
        sent = 0
        while sent < max_records:
            for _ in range(1000):
                send(topic, value)
            sent += 1000
            now = time.monotonic()
            if first is None and now >= measure_at:
                first = (now, producer.delivered)
                emit("measuring")
            if now >= end_at:
                break
        last = (time.monotonic(), producer.delivered)
        producer.flush(timeout=60)
        if first is None:
            first = (start, 0)
        emit(
            "result",
            msgs_per_s=(last[1] - first[1]) / (last[0] - first[0]),
            window_s=last[0] - first[0],
            sent=sent,
            delivered=producer.delivered,
            failed=producer.failed,
        )


# -- (b) pipelined PUBS lines --------------------------------------------------------------------


class _PubsConnection:
    """One connection keeping ``window`` PUBS lines in flight."""

    def __init__(
        self, address: tuple[str, int], line: bytes, window: int, args: argparse.Namespace
    ) -> None:
        # A raw socket on purpose: the load is lines pipelined by hand, not the client's.
        if _secure(args):  # the client connects it: TLS, then SCRAM, then hands it over
            security = Security(
                "SASL_SSL",
                username=args.user,
                password=os.environ["KAFKAESQUE_PASSWORD"],
                ssl_cafile=args.tls_ca,
            )
            self.sock = SyncConnection(address, connect_timeout_s=10, security=security).detach()
            self.sock.settimeout(10)
        else:
            self.sock = socket.create_connection(address, timeout=10)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.line = line
        self.window = window
        self.outstanding = 0
        self.replies = 0
        self.errors = 0
        self.first_error = b""
        self._tail = b""

    def top_up(self) -> None:
        """Send lines until ``window`` are in flight (in one write)."""
        missing = self.window - self.outstanding
        if missing > 0:
            self.sock.sendall(self.line * missing)
            self.outstanding += missing

    def on_readable(self) -> bool:
        """Read what arrived and count the replies; False once the broker closed."""
        data = self.sock.recv(1 << 18)
        if not data:
            return False
        if isinstance(self.sock, ssl.SSLSocket):
            # TLS hands over one record at a time: what is decrypted and waiting does not
            # make the socket readable again, so take it now.
            while self.sock.pending():
                data += self.sock.recv(1 << 18)
        data = self._tail + data
        end = data.rfind(b"\n") + 1
        done, self._tail = data[:end], data[end:]
        lines = done.count(b"\n")
        errors = done.count(b"-ERR")
        if errors and not self.first_error:
            at = done.index(b"-ERR")
            self.first_error = done[at : done.index(b"\n", at)]
        self.replies += lines
        self.errors += errors
        self.outstanding -= lines
        return True


def run_pubs(args: argparse.Namespace) -> None:
    value = b"m" * MESSAGE_BYTES
    line = b"PUBS %s %s\r\n" % (args.topic.encode(), value)
    addresses = [(h, int(p)) for h, _, p in (a.rpartition(":") for a in args.addresses)]
    window = min(args.window, _MAX_WINDOW)
    conns = [_PubsConnection(a, line, window, args) for a in addresses]
    emit("ready")
    selector = selectors.DefaultSelector()
    for conn in conns:
        selector.register(conn.sock, selectors.EVENT_READ, conn)
        conn.top_up()
    start = time.monotonic()
    measure_at, end_at = start + args.warmup, start + args.warmup + args.seconds
    first: tuple[float, int] | None = None
    last: tuple[float, int] | None = None
    while True:
        now = time.monotonic()
        ok = sum(c.replies - c.errors for c in conns)
        if first is None and now >= measure_at:
            first = (now, ok)
            emit("measuring")
        if last is None and now >= end_at:
            last = (now, ok)  # the window closes; what is in flight is drained, not counted
        if last is not None and (now >= end_at + 10.0 or not any(c.outstanding for c in conns)):
            break
        for key, _ in selector.select(0.05):
            conn = key.data
            if not conn.on_readable():
                selector.unregister(conn.sock)
                conn.outstanding = 0
            elif last is None and conn.outstanding <= conn.window // 2:
                conn.top_up()
    for conn in conns:
        conn.sock.close()
    first = first or (start, 0)
    emit(
        "result",
        msgs_per_s=(last[1] - first[1]) / (last[0] - first[0]),
        window_s=last[0] - first[0],
        ok=sum(c.replies - c.errors for c in conns),
        errors=sum(c.errors for c in conns),
        unanswered=sum(c.outstanding for c in conns),
        first_error=next((c.first_error.decode() for c in conns if c.first_error), ""),
    )


# -- (c) end to end: a paced publisher and a group consumer ------------------------------------


class Pacer:
    """Message ``seq`` is due at ``start + seq / rate``: waits for it, then sends it; keeps how
    late the sends were and each message's due-to-acknowledged latency (the commit half of end
    to end; the first ``skip`` messages are warm-up)."""

    def __init__(self, rate: float, seconds: float, skip: int) -> None:
        self.count = int(rate * seconds)
        self.interval_ns = 1e9 / rate
        self.skip = skip
        self.late = 0  # messages sent more than 1 ms after they were due
        self.lateness_max_ms = 0.0
        self.acks: list[float] = []

    def run(self, send: Callable[[int, int], None], wait: Callable[[float], None]) -> None:
        start_ns = time.monotonic_ns() + 20_000_000
        for seq in range(self.count):
            due_ns = start_ns + int(seq * self.interval_ns)
            while (wait_ns := due_ns - time.monotonic_ns()) > 0:
                wait(wait_ns / 1e9)
            self._sending(due_ns)
            send(due_ns, seq)

    async def run_async(self, send: Callable[[int, int], Awaitable[None]]) -> None:
        """``run`` on an asyncio loop: the loop reads replies while the pacer sleeps."""
        start_ns = time.monotonic_ns() + 20_000_000
        for seq in range(self.count):
            due_ns = start_ns + int(seq * self.interval_ns)
            while (wait_ns := due_ns - time.monotonic_ns()) > 0:
                await asyncio.sleep(wait_ns / 1e9)
            self._sending(due_ns)
            await send(due_ns, seq)

    def _sending(self, due_ns: int) -> None:
        behind_ms = (time.monotonic_ns() - due_ns) / 1e6
        self.lateness_max_ms = max(self.lateness_max_ms, behind_ms)
        self.late += behind_ms > 1.0

    def acked(self, due_ns: int, seq: int) -> None:
        if seq >= self.skip:
            self.acks.append((time.monotonic_ns() - due_ns) / 1e6)

    def result(self, **fields: Any) -> None:
        emit(
            "result",
            sent=self.count,
            late_over_1ms=self.late,
            lateness_max_ms=self.lateness_max_ms,
            ack_p50_ms=percentile(self.acks, 0.50),
            ack_p99_ms=percentile(self.acks, 0.99),
            **fields,
        )


def run_publish(args: argparse.Namespace) -> None:
    """The library's ``Producer`` at a fixed rate."""
    config = ProducerConfig(
        linger_ms=args.linger_ms, ordered=not args.unordered, idempotent=not args.unordered
    )
    pacer = Pacer(args.rate, args.seconds, args.skip)

    def on_ack(due_ns: int, seq: int, handle: DeliveryHandle) -> None:
        if handle.exception() is None:
            pacer.acked(due_ns, seq)

    with Client(args.bootstrap) as client, Producer(client, config) as producer:

        def send(due_ns: int, seq: int) -> None:
            future = producer.send(args.topic, stamped(due_ns, seq))
            future.handle.add_done_callback(functools.partial(on_ack, due_ns, seq))

        def wait(seconds: float) -> None:
            if producer.pending:
                producer.poll(seconds)  # reads replies while it waits
            else:
                time.sleep(seconds)

        client.partitions_for(args.topic)
        emit("ready")
        emit("measuring")
        pacer.run(send, wait)
        producer.flush(timeout=60)
        pacer.result(delivered=producer.delivered, failed=producer.failed)


def run_publish_pubs(args: argparse.Namespace) -> None:
    """One ``PUBS`` line per message at a fixed rate, on one raw connection (a telnet user)."""
    pacer = Pacer(args.rate, args.seconds, args.skip)
    host, _, port = args.address.rpartition(":")
    prefix = b"PUBS %s " % args.topic.encode()
    in_flight: collections.deque[tuple[int, int]] = collections.deque()
    errors = 0
    tail = b""
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def send(due_ns: int, seq: int) -> None:
            sock.sendall(prefix + stamped(due_ns, seq) + b"\r\n")
            in_flight.append((due_ns, seq))

        def wait(seconds: float) -> None:
            nonlocal tail, errors
            ready, _, _ = select.select([sock], [], [], seconds)
            if not ready:
                return
            data = sock.recv(1 << 16)
            if not data:
                raise ConnectionError("the broker closed the connection")
            *lines, tail = (tail + data).split(b"\n")
            for line in lines:
                due_ns, seq = in_flight.popleft()
                if line.startswith(b"+OK"):
                    pacer.acked(due_ns, seq)
                else:
                    errors += 1

        emit("ready")
        emit("measuring")
        pacer.run(send, wait)
        deadline = time.monotonic() + 30
        while in_flight and time.monotonic() < deadline:
            wait(0.1)
    pacer.result(delivered=pacer.count - errors - len(in_flight), failed=errors + len(in_flight))


class Receipts:
    """What a consumer received of ``expect`` stamped messages: each one's due-to-delivery
    latency (the first ``skip`` are warm-up), duplicates, and values that are not stamps."""

    def __init__(self, expect: int, skip: int) -> None:
        self.expect = expect
        self.skip = skip
        self.seen = bytearray(expect)
        self.latencies: list[float] = []
        self.received = self.duplicates = self.foreign = 0

    def add(self, value: bytes, now_ns: int) -> None:
        try:
            due_ns, seq = read_stamp(value)
        except ValueError:
            self.foreign += 1
            return
        if not 0 <= seq < self.expect or self.seen[seq]:
            self.duplicates += 1
            return
        self.seen[seq] = 1
        self.received += 1
        if seq >= self.skip:
            self.latencies.append((now_ns - due_ns) / 1e6)

    @property
    def complete(self) -> bool:
        return self.received >= self.expect

    def result(self) -> None:
        latencies = self.latencies
        emit(
            "result",
            received=self.received,
            missing=self.expect - self.received,
            duplicates=self.duplicates,
            foreign=self.foreign,
            samples=len(latencies),
            p50_ms=percentile(latencies, 0.50),
            p99_ms=percentile(latencies, 0.99),
            p999_ms=percentile(latencies, 0.999),
            max_ms=max(latencies, default=float("nan")),
        )


def run_consume(args: argparse.Namespace) -> None:
    receipts = Receipts(args.expect, args.skip)
    with GroupConsumer(args.bootstrap, args.topic, args.group) as consumer:
        consumer.poll(0)  # subscribes, and learns where each partition ends
        emit("ready")
        deadline = time.monotonic() + args.timeout
        while not receipts.complete and time.monotonic() < deadline:
            records = consumer.poll(args.poll_ms / 1000)
            now_ns = time.monotonic_ns()
            for record in records:
                receipts.add(record.value or b"", now_ns)
    receipts.result()


# -- the peer: NATS JetStream through nats-py -----------------------------------------------------


def _servers(args: argparse.Namespace) -> list[str]:
    return [s for s in args.servers.split(",") if s]


async def _within(seconds: float, awaitable: Awaitable[object]) -> bool:
    """Awaits ``awaitable`` for at most ``seconds``: whether it finished in time."""
    try:
        await asyncio.wait_for(awaitable, seconds)
    except TimeoutError:
        return False
    return True


async def _nats_producer(args: argparse.Namespace) -> None:
    """Async publishes to a stream's subject as fast as they go, ``window`` unacknowledged at
    most; counts the acknowledgements that arrive in the measured window."""
    import nats

    value = bytes(i % 251 for i in range(MESSAGE_BYTES))
    max_records = int(2_000_000 * (args.warmup + args.seconds))  # far above any real rate
    acked = failed = 0

    def done(future: asyncio.Future[Any]) -> None:
        nonlocal acked, failed
        if future.cancelled() or future.exception() is not None:
            failed += 1
        else:
            acked += 1

    nc = await nats.connect(servers=_servers(args), connect_timeout=10)
    try:
        js = nc.jetstream(publish_async_max_pending=args.window)
        emit("ready")
        start = time.monotonic()
        measure_at, end_at = start + args.warmup, start + args.warmup + args.seconds
        first: tuple[float, int] | None = None
        sent = 0
        while sent < max_records:
            for _ in range(1000):
                future = await js.publish_async(args.subject, value)
                future.add_done_callback(done)
            sent += 1000
            now = time.monotonic()
            if first is None and now >= measure_at:
                first = (now, acked)
                emit("measuring")
            if now >= end_at:
                break
        last = (time.monotonic(), acked)
        await _within(60, js.publish_async_completed())  # what is still pending has failed
        first = first or (start, 0)
        emit(
            "result",
            msgs_per_s=(last[1] - first[1]) / (last[0] - first[0]),
            window_s=last[0] - first[0],
            sent=sent,
            delivered=acked,
            failed=failed + js.publish_async_pending(),
        )
    finally:
        await nc.close()


async def _nats_publish(args: argparse.Namespace) -> None:
    """Publishes at a fixed rate, stamped; async with a window, or one at a time (window 0)."""
    import nats

    pacer = Pacer(args.rate, args.seconds, args.skip)
    failed = 0
    calls: list[float] = []  # synchronous: send to acknowledgement, without the queueing

    def on_ack(due_ns: int, seq: int, future: asyncio.Future[Any]) -> None:
        nonlocal failed
        if future.cancelled() or future.exception() is not None:
            failed += 1
        else:
            pacer.acked(due_ns, seq)

    nc = await nats.connect(servers=_servers(args), connect_timeout=10)
    try:
        js = nc.jetstream(publish_async_max_pending=max(args.window, 1))

        async def send_async(due_ns: int, seq: int) -> None:
            future = await js.publish_async(args.subject, stamped(due_ns, seq))
            future.add_done_callback(functools.partial(on_ack, due_ns, seq))

        async def send_sync(due_ns: int, seq: int) -> None:
            nonlocal failed
            began = time.perf_counter()
            try:
                await js.publish(args.subject, stamped(due_ns, seq), timeout=10)
            except (nats.errors.Error, TimeoutError):
                failed += 1
            else:
                pacer.acked(due_ns, seq)
                if seq >= pacer.skip:
                    calls.append((time.perf_counter() - began) * 1000)

        emit("ready")
        emit("measuring")
        await pacer.run_async(send_async if args.window else send_sync)
        await _within(60, js.publish_async_completed())  # what is still pending has failed
        pending = js.publish_async_pending()
        pacer.result(
            delivered=pacer.count - failed - pending,
            failed=failed + pending,
            window=args.window,
            call_p50_ms=percentile(calls, 0.50),
            call_p99_ms=percentile(calls, 0.99),
        )
    finally:
        await nc.close()


async def _nats_consume(args: argparse.Namespace) -> None:
    """A push consumer on the stream from its first message, without acknowledgements (the
    group consumer of ``consume`` commits no offsets either): due-to-delivery latency."""
    import nats
    from nats.aio.msg import Msg
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    receipts = Receipts(args.expect, args.skip)
    complete = asyncio.Event()

    async def on_message(msg: Msg) -> None:
        receipts.add(msg.data, time.monotonic_ns())
        if receipts.complete:
            complete.set()

    nc = await nats.connect(servers=_servers(args), connect_timeout=10)
    try:
        config = ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL)
        js = nc.jetstream()
        await js.subscribe(args.subject, stream=args.stream, cb=on_message, config=config)
        emit("ready")
        await _within(args.timeout, complete.wait())  # what is missing is counted
    finally:
        await nc.close()
    receipts.result()


def run_nats_producer(args: argparse.Namespace) -> None:
    asyncio.run(_nats_producer(args))


def run_nats_publish(args: argparse.Namespace) -> None:
    asyncio.run(_nats_publish(args))


def run_nats_consume(args: argparse.Namespace) -> None:
    asyncio.run(_nats_consume(args))


# -- the baseline: raw loopback TCP -------------------------------------------------------------


def run_loopback(args: argparse.Namespace) -> None:
    """Sink one connection (count its bytes until EOF), then echo a second one byte by byte."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(30)
        emit("ready", port=server.getsockname()[1])
        conn, _ = server.accept()
        with conn:
            conn.settimeout(30)
            total, first_at = 0, 0.0
            while data := conn.recv(1 << 20):
                if not total:
                    first_at = time.monotonic()
                total += len(data)
            seconds = time.monotonic() - first_at
        conn, _ = server.accept()
        with conn:
            conn.settimeout(30)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while data := conn.recv(64):
                conn.sendall(data)
    emit("result", bytes=total, seconds=seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench._broker_load", description=__doc__)
    kinds = parser.add_subparsers(dest="kind", required=True)
    timed = argparse.ArgumentParser(add_help=False)  # flat out, measured after a warm-up
    timed.add_argument("--seconds", type=float, required=True)
    timed.add_argument("--warmup", type=float, default=1.0)
    paced = argparse.ArgumentParser(add_help=False)  # at a fixed rate
    paced.add_argument("--rate", type=float, required=True)
    paced.add_argument("--seconds", type=float, required=True)
    paced.add_argument("--skip", type=int, default=0, help="messages left out of the latencies")
    secure = argparse.ArgumentParser(add_help=False)  # TLS + SCRAM (password from the env)
    secure.add_argument("--tls-ca", help="the brokers' CA: TLS and SCRAM as --user")
    secure.add_argument("--user", help="the SCRAM user (password: $KAFKAESQUE_PASSWORD)")
    p = kinds.add_parser("producer", parents=[timed, secure])
    p.add_argument("bootstrap")
    p.add_argument("topic")
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--linger-ms", type=float, required=True)
    p.add_argument("--buffer-bytes", type=int, required=True)
    p.set_defaults(run=run_producer)
    p = kinds.add_parser("pubs", parents=[timed, secure])
    p.add_argument("topic")
    p.add_argument("addresses", nargs="+")
    p.add_argument("--window", type=int, required=True)
    p.set_defaults(run=run_pubs)
    p = kinds.add_parser("publish", parents=[paced])
    p.add_argument("bootstrap")
    p.add_argument("topic")
    p.add_argument("--linger-ms", type=float, required=True)
    p.add_argument("--unordered", action="store_true", help="ProducerConfig(ordered=False)")
    p.set_defaults(run=run_publish)
    p = kinds.add_parser("publish-pubs", parents=[paced])
    p.add_argument("address")
    p.add_argument("topic")
    p.set_defaults(run=run_publish_pubs)
    p = kinds.add_parser("consume")
    p.add_argument("bootstrap")
    p.add_argument("topic")
    p.add_argument("group")
    p.add_argument("--expect", type=int, required=True)
    p.add_argument("--skip", type=int, default=0, help="messages left out of the latencies")
    p.add_argument("--timeout", type=float, required=True)
    p.add_argument("--poll-ms", type=int, default=500, help="CONS wait_ms (long poll)")
    p.set_defaults(run=run_consume)
    p = kinds.add_parser("nats-producer", parents=[timed])
    p.add_argument("servers", help="nats://host:port,...")
    p.add_argument("subject")
    p.add_argument("--window", type=int, required=True, help="async publishes unacknowledged")
    p.set_defaults(run=run_nats_producer)
    p = kinds.add_parser("nats-publish", parents=[paced])
    p.add_argument("servers", help="nats://host:port,...")
    p.add_argument("subject")
    p.add_argument("--window", type=int, required=True, help="0: synchronous publishes")
    p.set_defaults(run=run_nats_publish)
    p = kinds.add_parser("nats-consume")
    p.add_argument("servers", help="nats://host:port,...")
    p.add_argument("stream")
    p.add_argument("subject")
    p.add_argument("--expect", type=int, required=True)
    p.add_argument("--skip", type=int, default=0, help="messages left out of the latencies")
    p.add_argument("--timeout", type=float, required=True)
    p.set_defaults(run=run_nats_consume)
    p = kinds.add_parser("loopback")
    p.set_defaults(run=run_loopback)
    args = parser.parse_args(argv)
    args.run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
