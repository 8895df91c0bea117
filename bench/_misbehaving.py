"""Misbehaving MQTT connections for ``bench.mqtt --misbehaving N`` (issue 38 point 6).

``Misbehaving(addresses, n)`` runs, in a process of its own (so that its work does not slow the
healthy devices' generator), ``n`` connections spread round-robin over ``addresses`` that keep
misbehaving for as long as it runs: half of them never send CONNECT (the broker closes them after
its 10 s CONNECT timeout), a quarter CONNECT with keep-alive 1 and then fall silent (half-open:
closed 1.5 s later), a quarter send a fixed header announcing a packet over the 1 MiB maximum
(closed at once). Each connection the broker closes is opened again, of the same kind, a second
later (so the oversized ones come back about once a second each, not in a tight loop). Stops on
``stop()``, or after ``max_s`` seconds whatever happens.
"""

from __future__ import annotations

import heapq
import multiprocessing
import multiprocessing.synchronize
import selectors
import socket
import time
from typing import Final

from kafkaesque.protocol.mqtt import Connect, MqttVersion, encode_mqtt

KINDS: Final = ("silent", "silent", "half-open", "oversized")
_REOPEN_S: Final = 1.0
_OVERSIZED = bytes([0x30, 0x80, 0x80, 0x80, 0x01])  # a PUBLISH of 2 MiB announced


def _open(address: tuple[str, int], kind: str, slot: int) -> socket.socket | None:
    # Each slot its own client id: a shared one would make every CONNECT take the last over.
    connect = encode_mqtt(Connect(f"misbehaving-{slot}", keep_alive=1), MqttVersion.V311)
    try:
        sock = socket.create_connection(address, timeout=5)
        if kind == "half-open":
            sock.sendall(connect)  # its CONNACK is read (and dropped) by the loop
        elif kind == "oversized":
            sock.sendall(connect + _OVERSIZED)
        sock.setblocking(False)
        return sock
    except OSError:
        return None


def _run(
    addresses: list[tuple[str, int]],
    n: int,
    max_s: float,
    stop: multiprocessing.synchronize.Event,
    opened: multiprocessing.sharedctypes.Synchronized[int],
) -> None:
    deadline = time.monotonic() + max_s
    selector = selectors.DefaultSelector()
    reopen: list[tuple[float, int]] = [(0.0, i) for i in range(n)]  # (when, slot)
    while not stop.is_set() and time.monotonic() < deadline:
        now = time.monotonic()
        while reopen and reopen[0][0] <= now:
            _, slot = heapq.heappop(reopen)
            kind = KINDS[slot % len(KINDS)]
            sock = _open(addresses[slot % len(addresses)], kind, slot)
            if sock is None:
                heapq.heappush(reopen, (now + _REOPEN_S, slot))
                continue
            selector.register(sock, selectors.EVENT_READ, slot)
            with opened.get_lock():
                opened.value += 1
        for key, _ in selector.select(timeout=0.1):
            conn = key.fileobj
            assert isinstance(conn, socket.socket)
            try:
                data = conn.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:  # closed by the broker: the same kind again, a second later
                selector.unregister(conn)
                conn.close()
                heapq.heappush(reopen, (time.monotonic() + _REOPEN_S, key.data))
    for key in list(selector.get_map().values()):
        key.fileobj.close()  # type: ignore[union-attr]
    selector.close()


class Misbehaving:
    """The misbehaving connections' process (see the module docstring); a context manager."""

    def __init__(self, addresses: list[tuple[str, int]], n: int, max_s: float = 900.0) -> None:
        self._stop = multiprocessing.Event()
        self._opened = multiprocessing.Value("q", 0)
        self._proc = multiprocessing.Process(
            target=_run, args=(addresses, n, max_s, self._stop, self._opened), daemon=True
        )

    @property
    def opened(self) -> int:
        """Connections opened so far (reopened ones included)."""
        return int(self._opened.value)

    def __enter__(self) -> Misbehaving:
        self._proc.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._proc.join(10)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)
