"""Device I/O benchmark: the broker's ``FdStream`` against ``trio.SocketStream``, same run.

    python -m bench.device_io [--quick]

What a device that sends one reading at a time costs the broker's stream layer: an echo server
(trio, one task per connection, as the MQTT listener) reads each 18-byte QoS 1 PUBLISH
and answers 4 bytes (a PUBACK's size). 300 connections on loopback, 5,000 messages a second in
all, paced by a client process on raw non-blocking sockets. The figure is the server's CPU time
(user + system) per message, for:

* ``socket``: ``trio.SocketStream`` (the baseline);
* ``socket+timeout``: the same, each read inside its own ``trio.move_on_at`` (how the MQTT reader
  enforced keep-alive before ``kafkaesque.broker.mqtt._deadlines``);
* ``fd``: ``FdStream`` (what MQTT devices, line-protocol clients and Raft peers use);
* ``fd+timeout``: ``FdStream`` with the per-read timeout.

The four servers alternate over ``ROUNDS`` rounds and the best round of each is kept (the
machine is shared). Ends with
``RESULT socket_us=… socket_timeout_us=… fd_us=… fd_timeout_us=… fd_saving_pct=…``, where the
saving compares ``fd`` with ``socket+timeout`` (the MQTT device path before and after).
"""

from __future__ import annotations

import argparse
import select
import socket
import subprocess
import sys
import time
from contextlib import AbstractContextManager, nullcontext

import trio

from kafkaesque.fd_stream import FdListener

from ._broker_procs import process_cpu_s

CONNECTIONS = 300
RATE = 5_000
PUBLISH = b"\x32\x10\x00\x05a/b/c\x00\x01hello"  # 18 bytes: a QoS 1 PUBLISH
PUBACK = b"\x40\x02\x00\x01"
KINDS = ("socket", "socket+timeout", "fd", "fd+timeout")
ROUNDS = 3


# -- the server (a child process) ------------------------------------------------------------------


def _serve(kind: str) -> None:
    timeout = kind.endswith("+timeout")

    def scope() -> AbstractContextManager[object]:
        return trio.move_on_at(trio.current_time() + 60) if timeout else nullcontext()

    async def handle(stream: trio.abc.Stream) -> None:
        try:
            while True:
                with scope():
                    data = await stream.receive_some(16384)
                if not data:
                    return
                await stream.send_all(PUBACK * (len(data) // len(PUBLISH) or 1))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return

    async def main() -> None:
        sockets = await trio.open_tcp_listeners(0, host="127.0.0.1")
        print(sockets[0].socket.getsockname()[1], flush=True)
        listeners: list[trio.abc.Listener[trio.abc.Stream]] = (
            [FdListener(s) for s in sockets] if kind.startswith("fd") else list(sockets)
        )
        await trio.serve_listeners(handle, listeners)

    trio.run(main)


# -- the client -----------------------------------------------------------------------------------


def _round(kind: str, seconds: float) -> float:
    """One server of ``kind`` under the paced load: its CPU microseconds per message."""
    server = subprocess.Popen(
        [sys.executable, "-m", "bench.device_io", "--serve", kind],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    socks: list[socket.socket] = []
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        for _ in range(CONNECTIONS):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.setblocking(False)
            socks.append(s)
        by_fd = {s.fileno(): s for s in socks}
        poller = select.epoll()
        for s in socks:
            poller.register(s.fileno(), select.EPOLLIN)
        time.sleep(0.3)  # the server accepted them all
        cpu0, start = process_cpu_s(server.pid), time.monotonic()
        sent = answered = 0
        while (now := time.monotonic()) - start < seconds:
            due = int((now - start) * RATE)
            while sent < due:
                socks[sent % CONNECTIONS].send(PUBLISH)
                sent += 1
            for fd, _ in poller.poll(0.001):
                answered += len(by_fd[fd].recv(65536)) // len(PUBACK)
        cpu = process_cpu_s(server.pid) - cpu0
        if answered < sent * 0.9:
            raise RuntimeError(f"{kind}: only {answered} of {sent} messages answered")
        return 1e6 * cpu / sent
    finally:
        for s in socks:
            s.close()
        server.kill()
        server.wait()


def echo_cpu_us(seconds: float, rounds: int = ROUNDS) -> float:
    """The ``fd`` echo server's CPU microseconds per message: the best of ``rounds`` rounds."""
    return min(_round("fd", seconds) for _ in range(rounds))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.device_io", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="3 s rounds (about 40 s in all)")
    parser.add_argument("--serve", choices=KINDS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        _serve(args.serve)
        return 0
    seconds = 3.0 if args.quick else 10.0
    best = dict.fromkeys(KINDS, float("inf"))
    print(
        f"echo server, {CONNECTIONS} connections on loopback, {RATE:,} messages/s of "
        f"{len(PUBLISH)} bytes, each answered with {len(PUBACK)}; "
        f"{ROUNDS} rounds of {seconds:.0f} s"
    )
    for r in range(ROUNDS):
        for kind in KINDS:
            us = _round(kind, seconds)
            best[kind] = min(best[kind], us)
            print(f"  round {r + 1}  {kind:15s} {us:6.1f} us of server CPU per message")
    saving = 100 * (1 - best["fd"] / best["socket+timeout"])
    print("best of each (the least disturbed by other processes):")
    for kind in KINDS:
        print(f"  {kind:15s} {best[kind]:6.1f} us per message")
    print(f"FdStream without per-read timeouts vs trio.SocketStream with them: {saving:.0f}% less")
    print(
        f"RESULT socket_us={best['socket']:.1f} socket_timeout_us={best['socket+timeout']:.1f} "
        f"fd_us={best['fd']:.1f} fd_timeout_us={best['fd+timeout']:.1f} "
        f"fd_saving_pct={saving:.0f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
