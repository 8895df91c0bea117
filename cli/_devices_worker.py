"""One worker process of the device simulator: many device connections on raw non-blocking
sockets (``selectors``, epoll), driven by the sans-I/O ``devices_core.Device``.

Why not trio here: a load generator's cost is per message, and a plain selector loop that reads
everything a socket has, answers all of it with one ``send``, and never creates a task or a
cancel scope per message goes several times faster than an async stream per connection. The
MQTT logic is in ``Device``; this module only moves bytes and time.

A worker (``worker_main``, started by ``devices_fleet.Fleet``):

1. raises its open-file limit to the hard limit, then connects its devices round-robin over the
   MQTT addresses (device ``i`` to ``addresses[i % len]``, like a load balancer), at most
   ``max_connecting`` handshakes at a time, each bounded by ``connect_timeout``;
2. says ``ready`` (connected / failed) and waits for ``go`` (or ``stop``);
3. publishes for ``duration`` seconds: paced (each device every ``interval`` seconds, from a
   random phase) or, with ``interval == 0``, flat out (windows kept full); ``None`` publishes
   nothing (idle connections, commands only);
4. stops publishing, waits up to ``drain`` seconds for the acknowledgements still due, sends
   DISCONNECT, closes, and sends its ``WorkerResult``.

With ``FleetSpec.tls`` every connection speaks TLS (``ssl.SSLObject`` over memory BIOs, so the
selector loop still moves raw bytes): the handshake follows the TCP connect, the CONNECT goes
once it is done, and the server's certificate is checked against ``FleetSpec.cafile`` (None:
the system's CAs) for the address's host.

A device whose connection the server closes after it was ready connects again and resends its
unacknowledged readings, so a broker that drops connections shows up as ``dropped`` /
``reconnected`` / ``resent`` (and maybe duplicates), not as a load that fades. Every phase has
a deadline, and a ``stop`` from the parent ends the publishing early.
"""

from __future__ import annotations

import errno
import heapq
import random
import resource
import selectors
import socket
import ssl
import time
import traceback
from array import array
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from .devices_core import DISCONNECT, PINGREQ, Device, DeviceConfig, DeviceState, Tally

_READ_BYTES = 256 * 1024
# Reconnecting as real devices do (and as AWS's "exponential backoff and jitter" advises): the
# n-th try in a row waits a uniformly random time in [0, min(cap, base * 2**n)), so the devices of
# a dead broker do not all knock on the survivors in the same instant, and a broker that refuses
# them is asked less and less often.
_RECONNECT_BASE = 0.5  # seconds: the first try after a drop comes within half a second
_RECONNECT_CAP = 8.0  # seconds: the longest wait between two tries
_RECONNECT_ATTEMPTS = 30  # tries in a row before a device gives up (minutes at the cap)


def reconnect_delay(tries: int, rng: random.Random) -> float:
    """Seconds to wait before try number ``tries + 1`` in a row (full jitter)."""
    return rng.uniform(0.0, min(_RECONNECT_CAP, _RECONNECT_BASE * 2 ** min(tries, 16)))


@dataclass(frozen=True)
class FleetSpec:
    """A run of simulated devices (see the module docstring for the phases)."""

    addresses: tuple[tuple[str, int], ...]
    devices: int
    config: DeviceConfig
    interval: float | None = 1.0  # seconds between readings of one device; 0 flat out; None none
    duration: float = 10.0
    warmup: float = 0.0  # seconds after go before the measured window starts
    window: float | None = None  # seconds measured after the warm-up (None: until the end)
    drain: float = 5.0
    connect_timeout: float = 20.0
    max_connecting: int = 200  # handshakes in progress per process
    # ... of which reconnections after a drop may be (None: ``max_connecting``). Real devices do
    # not queue behind each other: a storm bench sets it high so that the generator does not
    # pace the storm it measures.
    max_reconnecting: int | None = None
    first_device: int = 0
    tls: bool = False  # the connections speak TLS (see the module docstring)
    cafile: str | None = None  # the CA of the servers' certificates (None: the system's)


@dataclass
class WorkerResult:
    """What one worker measured; ``devices`` maps a device id to (readings sent, unacknowledged
    serials)."""

    connected: int = 0
    failed: int = 0
    dropped: int = 0  # connections the server closed while the run went on
    reconnected: int = 0  # devices connected again after a drop
    resent: int = 0  # readings sent again (DUP) after a reconnect
    sessions_resumed: int = 0  # reconnections that found their persistent session
    sessions_lost: int = 0  # reconnections that did not
    window_s: float = 0.0
    sent: int = 0
    sent_in_window: int = 0
    acknowledged: int = 0
    acknowledged_in_window: int = 0
    puback_ms: array[float] = field(default_factory=lambda: array("d"))
    commands: int = 0
    command_ms: array[float] = field(default_factory=lambda: array("d"))
    unexpected_packets: int = 0
    errors: list[str] = field(default_factory=list)
    devices: dict[str, tuple[int, list[int]]] = field(default_factory=dict)
    # Reconnections, by device id, in wall-clock seconds (time.time(), comparable across
    # processes): when its connection first dropped, when it was last ready again (CONNACK and
    # SUBACK) after a drop, and when the first PUBACK on that new connection came.
    dropped_at: dict[str, float] = field(default_factory=dict)
    back_at: dict[str, float] = field(default_factory=dict)
    publishing_at: dict[str, float] = field(default_factory=dict)

    def merge(self, other: WorkerResult) -> None:
        for name in (
            "connected",
            "failed",
            "dropped",
            "reconnected",
            "resent",
            "sessions_resumed",
            "sessions_lost",
            "sent",
            "sent_in_window",
            "acknowledged",
            "acknowledged_in_window",
            "commands",
            "unexpected_packets",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.window_s = max(self.window_s, other.window_s)
        self.puback_ms.extend(other.puback_ms)
        self.command_ms.extend(other.command_ms)
        self.errors.extend(other.errors[: max(0, 20 - len(self.errors))])
        self.devices.update(other.devices)
        self.dropped_at.update(other.dropped_at)
        self.back_at.update(other.back_at)
        self.publishing_at.update(other.publishing_at)


# -- one worker process ---------------------------------------------------------------------------


class _Tls:
    """The TLS layer of one connection: ciphertext in and out through memory BIOs."""

    __slots__ = ("incoming", "obj", "outgoing", "ready")

    def __init__(self, context: ssl.SSLContext, host: str) -> None:
        self.incoming = ssl.MemoryBIO()
        self.outgoing = ssl.MemoryBIO()
        self.obj = context.wrap_bio(self.incoming, self.outgoing, server_hostname=host)
        self.ready = False  # handshake done

    def handshake(self) -> tuple[bytes, bool]:
        """Advance the handshake: the ciphertext to send, and whether it is done
        (``ssl.SSLError`` if it failed)."""
        try:
            self.obj.do_handshake()
            self.ready = True
        except ssl.SSLWantReadError:
            pass
        return self.outgoing.read(), self.ready

    def encrypt(self, data: bytes) -> bytes:
        self.obj.write(data)
        return self.outgoing.read()

    def decrypt(self, data: bytes) -> tuple[bytes, bool]:
        """The plaintext in ``data`` (with what came before it) and whether the server closed
        the TLS session. ``ssl.SSLError`` on a broken record."""
        self.incoming.write(data)
        plain = bytearray()
        while True:
            try:
                chunk = self.obj.read(_READ_BYTES)
            except ssl.SSLWantReadError:
                return bytes(plain), False
            except ssl.SSLZeroReturnError:
                return bytes(plain), True
            if not chunk:
                return bytes(plain), True
            plain += chunk


class _Slot:
    """One connection of a device and what is waiting to be written to it."""

    __slots__ = ("connected", "device", "out", "sent_at", "sock", "started", "tls", "writing")

    def __init__(
        self, device: Device, sock: socket.socket, started: float, tls: _Tls | None = None
    ) -> None:
        self.device = device
        self.sock = sock
        self.out = bytearray()
        self.connected = False  # TCP handshake done
        self.writing = False  # registered for EVENT_WRITE
        self.started = started
        self.sent_at = started  # monotonic time of the last write, for the keep-alive
        self.tls = tls


class _Worker:
    """The devices of one process and their sockets.

    A device the server disconnects after it was ready is connected again (after a random
    ``reconnect_delay``, exponential back-off with full jitter, up to ``_RECONNECT_ATTEMPTS``
    failed tries in a row) and resends its unacknowledged readings, as a real device would;
    ``dropped`` counts those disconnections.
    """

    def __init__(self, spec: FleetSpec, first: int, count: int, pipe: Any) -> None:
        self.spec = spec
        self.pipe = pipe
        self.tally = Tally()
        self.sel = selectors.DefaultSelector()
        self.sel.register(pipe.fileno(), selectors.EVENT_READ, None)
        self.count = count
        self.todo = deque(Device(i, spec.config, self.tally) for i in range(first, first + count))
        self.all_devices = list(self.todo)
        self.slots: dict[int, _Slot] = {}  # open connections by fd
        self.slot_of: dict[str, _Slot] = {}  # each device's latest connection
        self.handshaking: set[int] = set()  # fds of connections not READY yet
        self.ready: list[Device] = []  # in the order they were first ready
        self.ever_ready: set[str] = set()
        self.retries: list[tuple[float, int, Device]] = []  # (when, tie-break, device): a heap
        self.attempts: dict[str, int] = {}
        self.address_of: dict[str, int] = {}  # the address each device's last attempt went to
        self.finishing = False
        self.result = WorkerResult()
        self.rng = random.Random()
        self.awaiting_publish: set[str] = set()  # back after a drop, no PUBACK on it yet
        self.commands: deque[str] = deque()
        self.next_ping = time.monotonic() + spec.config.keep_alive / 2
        self.tls: ssl.SSLContext | None = None
        if spec.tls:
            self.tls = ssl.create_default_context(cafile=spec.cafile)
            self.tls.minimum_version = ssl.TLSVersion.TLSv1_2

    # -- the loop ---------------------------------------------------------------------------

    def step(self, timeout: float) -> None:
        """One round: wait up to ``timeout`` for sockets or the parent, handle what is ready,
        then the timers (handshake timeouts, reconnects, keep-alive)."""
        for key, mask in self.sel.select(max(0.0, timeout)):
            slot = key.data
            if slot is None:
                self._parent()
                continue
            if slot.sock.fileno() not in self.slots:
                continue  # closed by an earlier event of this round
            if mask & selectors.EVENT_WRITE:
                self._writable(slot)
            if mask & selectors.EVENT_READ and slot.sock.fileno() in self.slots:
                self._readable(slot)
        self._timers(time.monotonic())

    def _parent(self) -> None:
        try:
            message = self.pipe.recv()
        except EOFError:
            message = "stop"  # the parent is gone: wind down
        self.commands.append(message)

    def _readable(self, slot: _Slot) -> None:
        try:
            data = slot.sock.recv(_READ_BYTES)
        except BlockingIOError:
            return
        except OSError as exc:
            self._close(slot, f"{slot.device.id}: {exc}")
            return
        if not data:
            self._close(slot, f"{slot.device.id}: the server closed the connection")
            return
        tls = slot.tls
        if tls is not None:
            try:
                data = self._decrypt(slot, tls, data)
            except ssl.SSLError as exc:
                self._close(slot, f"{slot.device.id}: TLS: {exc}")
                return
            if not data:
                return
        device = slot.device
        before = device.state
        acknowledged = self.tally.acknowledged
        answer = device.receive(data, time.monotonic(), int(time.time() * 1000))
        if answer:
            self._send(slot, answer)
        if self.tally.acknowledged > acknowledged and device.id in self.awaiting_publish:
            self.awaiting_publish.discard(device.id)
            self.result.publishing_at[device.id] = time.time()
        if device.state is not before:
            if device.state is DeviceState.READY:
                self.handshaking.discard(slot.sock.fileno())
                self.attempts.pop(device.id, None)
                if device.id in self.ever_ready:
                    self.result.reconnected += 1
                    self.result.back_at[device.id] = time.time()
                    self.result.publishing_at.pop(device.id, None)
                    self.awaiting_publish.add(device.id)
                else:
                    self.ever_ready.add(device.id)
                    self.ready.append(device)
            elif device.state is DeviceState.FAILED:
                self._close(slot, None)

    def _writable(self, slot: _Slot) -> None:
        if not slot.connected:
            err = slot.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                self._close(slot, f"{slot.device.id}: connect: {errno.errorcode.get(err, err)}")
                return
            slot.connected = True
            self._set_writing(slot, False)
            if slot.tls is not None:
                try:
                    self._send_raw(slot, slot.tls.handshake()[0])  # the ClientHello
                except ssl.SSLError as exc:
                    self._close(slot, f"{slot.device.id}: TLS: {exc}")
                return
            self._send(slot, slot.device.connect())
            return
        if slot.out:
            self._flush(slot)

    def _decrypt(self, slot: _Slot, tls: _Tls, data: bytes) -> bytes:
        """The plaintext of ciphertext ``data``; finishes the handshake (then sends the
        CONNECT) on the way. b"" when there is none yet."""
        if not tls.ready:
            tls.incoming.write(data)
            out, done = tls.handshake()
            self._send_raw(slot, out)
            if not done:
                return b""
            self._send(slot, slot.device.connect())
            data = b""
        plain, closed = tls.decrypt(data)
        if closed and not plain:
            raise ssl.SSLError("the server closed the TLS session")
        return plain

    def _send(self, slot: _Slot, data: bytes) -> None:
        if slot.tls is not None and data:
            data = slot.tls.encrypt(data)
        self._send_raw(slot, data)

    def _send_raw(self, slot: _Slot, data: bytes) -> None:
        if not data:
            return
        slot.sent_at = time.monotonic()
        if slot.out:
            slot.out += data
            return
        try:
            n = slot.sock.send(data)
        except BlockingIOError:
            n = 0
        except OSError as exc:
            self._close(slot, f"{slot.device.id}: {exc}")
            return
        if n < len(data):
            slot.out += data[n:]
            self._set_writing(slot, True)

    def _send_to(self, device: Device, data: bytes) -> None:
        slot = self.slot_of.get(device.id)
        if data and slot is not None and slot.sock.fileno() in self.slots:
            self._send(slot, data)

    def _flush(self, slot: _Slot) -> None:
        try:
            n = slot.sock.send(slot.out)
        except BlockingIOError:
            return
        except OSError as exc:
            self._close(slot, f"{slot.device.id}: {exc}")
            return
        del slot.out[:n]
        if not slot.out:
            self._set_writing(slot, False)

    def _set_writing(self, slot: _Slot, on: bool) -> None:
        if slot.writing != on:
            slot.writing = on
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if on else 0)
            self.sel.modify(slot.sock, events, slot)

    # -- connections ------------------------------------------------------------------------

    def _open(self, device: Device, now: float) -> None:
        """Start connecting ``device`` (TCP first; CONNECT once the socket is writable)."""
        addresses = self.spec.addresses
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # Device i connects first to address i (modulo their number), like clients behind a
        # round-robin balancer; each attempt after a drop goes to another address, at random
        # (as a device picks from its list of brokers, or a balancer stops sending to a dead
        # one): the devices of a dead broker spread over all the survivors, not onto one.
        last = self.address_of.get(device.id)
        if last is None:
            index = int(device.id.rsplit("-", 1)[1]) % len(addresses)
        elif len(addresses) > 1:
            index = (last + self.rng.randrange(1, len(addresses))) % len(addresses)
        else:
            index = last
        self.address_of[device.id] = index
        code = sock.connect_ex(addresses[index % len(addresses)])
        if code not in (0, errno.EINPROGRESS):
            sock.close()
            self._lost(device, f"{device.id}: connect: {errno.errorcode.get(code, code)}")
            return
        host = addresses[index % len(addresses)][0]
        slot = _Slot(device, sock, now, None if self.tls is None else _Tls(self.tls, host))
        self.slots[sock.fileno()] = slot
        self.slot_of[device.id] = slot
        self.handshaking.add(sock.fileno())
        slot.writing = True
        self.sel.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, slot)

    def _close(self, slot: _Slot, why: str | None) -> None:
        """Close ``slot``; ``why`` is set when the server or the network ended it, not us."""
        fd = slot.sock.fileno()
        if fd in self.slots:
            del self.slots[fd]
            self.sel.unregister(slot.sock)
        self.handshaking.discard(fd)
        slot.sock.close()
        if why is not None:
            if slot.device.state is DeviceState.READY:
                self.result.dropped += 1
                self.result.dropped_at.setdefault(slot.device.id, time.time())
            self._lost(slot.device, why)

    def _lost(self, device: Device, why: str) -> None:
        """``device`` has no connection any more: connect it again if it had been ready."""
        self.tally.error(why)
        device.state = DeviceState.FAILED
        tries = self.attempts.get(device.id, 0)
        if device.id in self.ever_ready and not self.finishing and tries < _RECONNECT_ATTEMPTS:
            self.attempts[device.id] = tries + 1
            when = time.monotonic() + reconnect_delay(tries, self.rng)
            heapq.heappush(self.retries, (when, id(device), device))

    def _timers(self, now: float) -> None:
        spec = self.spec
        for fd in [
            fd for fd in self.handshaking if now - self.slots[fd].started > spec.connect_timeout
        ]:
            slot = self.slots[fd]
            self._close(slot, f"{slot.device.id}: no CONNACK/SUBACK in {spec.connect_timeout} s")
        cap = spec.max_connecting if spec.max_reconnecting is None else spec.max_reconnecting
        while self.retries and self.retries[0][0] <= now and len(self.handshaking) < cap:
            device = heapq.heappop(self.retries)[2]
            device.reconnect()
            self._open(device, now)
        keep_alive = spec.config.keep_alive
        if keep_alive and now >= self.next_ping:
            # A PINGREQ on each connection that has sent nothing for half its keep-alive, as a
            # client library does: a device that publishes more often never pings, and the pings
            # of idle devices spread over time instead of coming all at once.
            half = keep_alive / 2
            self.next_ping = now + min(half, 5.0)
            for device in self.ready:
                held = self.slot_of.get(device.id)
                if held is not None and now - held.sent_at >= half:
                    self._send_to(device, PINGREQ)

    # -- phases -----------------------------------------------------------------------------

    def connect_all(self) -> None:
        spec = self.spec
        while self.todo or self.handshaking:
            now = time.monotonic()
            while self.todo and len(self.handshaking) < spec.max_connecting:
                self._open(self.todo.popleft(), now)
            if self._stopped():
                return
            self.step(0.05)

    def wait_go(self, deadline: float) -> bool:
        """Serve the connections until the parent says ``go`` (True) or ``stop`` (False)."""
        while time.monotonic() < deadline:
            if self.commands:
                return self.commands.popleft() == "go"
            self.step(min(0.2, deadline - time.monotonic()))
        return False

    def run(self) -> None:
        spec = self.spec
        start = time.monotonic()
        end = start + spec.duration
        tally = self.tally
        tally.window_start = start + spec.warmup
        tally.window_end = end
        if spec.window is not None:  # measure only the first ``window`` seconds
            tally.window_end = min(end, tally.window_start + spec.window)
        heap: list[tuple[float, int]] = []
        flat_qos0 = spec.interval == 0 and spec.config.qos == 0
        ready = list(self.ready)
        if spec.interval == 0:
            now_ms = int(time.time() * 1000)
            for device in ready:
                self._send_to(device, device.flat_out(start, now_ms))
        elif spec.interval is not None:
            rng = random.Random()
            heap = [(start + rng.uniform(0, spec.interval), k) for k in range(len(ready))]
            heapq.heapify(heap)
        interval = spec.interval or 0.0
        while not self._stopped():
            now = time.monotonic()
            if now >= end:
                break
            if heap and heap[0][0] <= now:
                now_ms = int(time.time() * 1000)
                while heap and heap[0][0] <= now:
                    due, k = heap[0]
                    heapq.heapreplace(heap, (due + interval, k))
                    device = ready[k]
                    self._send_to(device, device.due(1, now, now_ms))
            if flat_qos0:  # no PUBACK paces QoS 0: top up whatever the socket has taken
                now_ms = int(time.time() * 1000)
                for device in ready:
                    slot = self.slot_of[device.id]
                    if not slot.out:
                        self._send_to(device, device.flat_out(now, now_ms))
            wait = min(end - now, (heap[0][0] - now) if heap else 0.2)
            self.step(0.0 if flat_qos0 else wait)
        tally.window_end = min(tally.window_end, time.monotonic())
        self.result.window_s = max(0.0, tally.window_end - tally.window_start)

    def drain(self) -> None:
        """Stop publishing; wait up to ``spec.drain`` for the acknowledgements still due."""
        for device in self.all_devices:
            device.stop()
        deadline = time.monotonic() + self.spec.drain
        while time.monotonic() < deadline:
            waiting = any(d.inflight and (d.state is DeviceState.READY) for d in self.ready)
            if not waiting and not self.retries and not self.handshaking:
                break
            self.step(0.05)

    def finish(self) -> WorkerResult:
        self.finishing = True
        for slot in list(self.slots.values()):
            if slot.connected and not slot.out and (slot.tls is None or slot.tls.ready):
                try:
                    slot.sock.send(DISCONNECT if slot.tls is None else slot.tls.encrypt(DISCONNECT))
                except OSError as exc:  # going away anyway; its unacknowledged serials count
                    self.tally.error(f"{slot.device.id}: DISCONNECT: {exc}")
            self._close(slot, None)
        result, tally = self.result, self.tally
        result.connected = len(self.ever_ready)
        result.failed = self.count - len(self.ever_ready)
        result.sent = tally.sent
        result.sent_in_window = tally.sent_in_window
        result.acknowledged = tally.acknowledged
        result.acknowledged_in_window = tally.acknowledged_in_window
        result.resent = tally.resent
        result.sessions_resumed = tally.sessions_resumed
        result.sessions_lost = tally.sessions_lost
        result.puback_ms = tally.puback_ms
        result.commands = tally.commands
        result.command_ms = tally.command_ms
        result.unexpected_packets = tally.unexpected_packets
        result.errors = tally.errors
        result.devices = {
            d.id: (d.next_serial, d.unacknowledged()) for d in self.all_devices if d.next_serial
        }
        return result

    def _stopped(self) -> bool:
        return "stop" in self.commands


def _raise_open_files_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def worker_main(spec: FleetSpec, first: int, count: int, pipe: Any) -> None:
    """The body of one worker process (see the module docstring)."""
    try:
        _raise_open_files_limit()
        worker = _Worker(spec, first, count, pipe)
        started = time.monotonic()
        worker.connect_all()
        ready = len(worker.ever_ready)
        pipe.send(
            (
                "ready",
                {
                    "connected": ready,
                    "failed": count - ready,
                    "seconds": time.monotonic() - started,
                    "errors": worker.tally.errors[:5],
                },
            )
        )
        if worker.wait_go(time.monotonic() + 600.0):
            worker.run()
        worker.drain()
        pipe.send(("result", worker.finish()))
    except Exception:
        pipe.send(("error", traceback.format_exc()))
        raise
