"""Sans-I/O core of the device simulator: one simulated device's MQTT connection as bytes in,
bytes out (no sockets, no clock: the driver passes the time in).

A device is an MQTT 3.1.1 client that connects, subscribes to its commands topic (QoS 1),
publishes serial-numbered, timestamped readings with a window of unacknowledged QoS 1 packets,
and acknowledges the commands it receives. The packets are encoded once with the project's codec
(``encode_mqtt``) and then reused: a reading is a fixed-length ``%``-template per device (the
serial and the timestamp are padded with JSON whitespace to a fixed width), so a reading costs
one bytes ``%`` formatting instead of an encoder call. The server's packets are read by a small
parser with a fast path for PUBACK (four bytes), the packet a load generator mostly receives.

Counters and latency samples go into a ``Tally`` that all devices of one process share.

Conventions (docs/devices.md): devices ``phone-00000``...; readings on
``phones/<device>/spectrum`` with payload ``{"run": ..., "device": ..., "serial": ..., "ts_ms":
..., "spectrum": [8 floats]}``; commands on ``phones/<device>/commands`` with ``ts_ms`` in the
payload.
"""

from __future__ import annotations

import enum
import json
import math
import random
import sys
from array import array
from dataclasses import dataclass, field
from itertools import repeat
from typing import Final

from kafkaesque.protocol.mqtt import (
    Connect,
    MqttSubscription,
    MqttVersion,
    Publish,
    Subscribe,
    encode_mqtt,
)

VERSION: Final = MqttVersion.V311
SERIAL_WIDTH: Final = 10  # digits of a serial, padded with spaces (valid JSON whitespace)
TS_WIDTH: Final = 13  # digits of a ms timestamp until the year 2286
SPECTRUM_BINS: Final = 8
_SERIAL_MARK: Final = b"\x01" * SERIAL_WIDTH
_TS_MARK: Final = b"\x02" * TS_WIDTH
_SUBSCRIBE_PACKET_ID: Final = 1
PINGREQ: Final = b"\xc0\x00"
DISCONNECT: Final = b"\xe0\x00"
_PUBACK_HEAD: Final = b"\x40\x02"
_LITTLE_ENDIAN: Final = sys.byteorder == "little"


def device_id(index: int) -> str:
    """The id of device ``index``: ``phone-00007``."""
    return f"phone-{index:05d}"


def readings_topic(device: str) -> str:
    return f"phones/{device}/spectrum"


def commands_topic(device: str) -> str:
    return f"phones/{device}/commands"


def spectrum_for(device: str) -> list[float]:
    """A device's spectrum: eight plausible power values, fixed per device (seeded by its id)."""
    rng = random.Random(device)
    return [round(rng.uniform(-90.0, -30.0), 2) for _ in range(SPECTRUM_BINS)]


def reading_payload(run: str, device: str, serial: int, ts_ms: int, spectrum: list[float]) -> bytes:
    """The JSON of one reading, exactly as the device sends it (fixed width, padded)."""
    return (
        f'{{"run": "{run}", "device": "{device}", "serial": {serial:<{SERIAL_WIDTH}d}, '
        f'"ts_ms": {ts_ms:{TS_WIDTH}d}, "spectrum": {json.dumps(spectrum)}}}'
    ).encode()


def _escape(raw: bytes) -> bytes:
    return raw.replace(b"%", b"%%")


class ReadingTemplate:
    """Every reading PUBLISH of one device, encoded once with ``encode_mqtt``.

    ``packet(serial, ts_ms, packet_id)`` equals ``encode_mqtt(Publish(readings_topic(device),
    reading_payload(...), qos, packet_id=packet_id), VERSION)`` for any serial below 10**10 and
    any 13-digit timestamp (the tests check it).
    """

    def __init__(self, run: str, device: str, qos: int) -> None:
        self.qos = qos
        payload = (
            f'{{"run": "{run}", "device": "{device}", "serial": {_SERIAL_MARK.decode()}, '
            f'"ts_ms": {_TS_MARK.decode()}, "spectrum": {json.dumps(spectrum_for(device))}}}'
        ).encode()
        frame = encode_mqtt(
            Publish(readings_topic(device), payload, qos=qos, packet_id=1 if qos else 0), VERSION
        )
        head_end = len(frame) - len(payload) - (2 if qos else 0)
        body = _escape(frame[head_end + (2 if qos else 0) :])
        body = body.replace(_SERIAL_MARK, b"%-10d").replace(_TS_MARK, b"%13d")
        self._template = _escape(frame[:head_end]) + (b"%c%c" if qos else b"") + body

    def packet(self, serial: int, ts_ms: int, packet_id: int = 0) -> bytes:
        if self.qos:
            return self._template % (packet_id >> 8, packet_id & 0xFF, serial, ts_ms)
        return self._template % (serial, ts_ms)


def packet_id_for(serial: int) -> int:
    """Reading ``serial``'s packet identifier: 1..65535, cycling (a window stays below 65535)."""
    return serial % 0xFFFF + 1


@dataclass
class Tally:
    """What the devices of one process measured. ``window`` bounds the measured interval
    (monotonic seconds): acknowledgements and latencies count only inside it."""

    window_start: float = math.inf
    window_end: float = math.inf
    sent: int = 0
    acknowledged: int = 0
    acknowledged_in_window: int = 0
    sent_in_window: int = 0
    puback_ms: array[float] = field(default_factory=lambda: array("d"))
    commands: int = 0
    command_ms: array[float] = field(default_factory=lambda: array("d"))
    unexpected_packets: int = 0
    resent: int = 0  # readings sent again (DUP) after a reconnect
    # Persistent sessions (``DeviceConfig.clean`` False): reconnections whose CONNACK said the
    # session was there (session present = 1), and those that found it gone.
    sessions_resumed: int = 0
    sessions_lost: int = 0
    errors: list[str] = field(default_factory=list)

    def error(self, message: str) -> None:
        if len(self.errors) < 20:
            self.errors.append(message)


class DeviceState(enum.Enum):
    CONNECTING = "connecting"  # CONNECT sent, waiting for CONNACK
    SUBSCRIBING = "subscribing"  # SUBSCRIBE sent, waiting for SUBACK
    READY = "ready"
    FAILED = "failed"  # refused, the server broke the protocol, or the connection was lost


@dataclass(frozen=True)
class DeviceConfig:
    """How every device of a run behaves."""

    run: str
    qos: int = 1
    window: int = 100  # unacknowledged QoS 1 readings per connection
    keep_alive: int = 60
    subscribe: bool = True  # to its commands topic, QoS 1
    clean: bool = True  # clean session; False: the broker keeps it (subscription, queued commands)
    username: str | None = None
    password: str | None = None

    def __post_init__(self) -> None:
        if self.qos not in (0, 1):
            raise ValueError("the devices publish at QoS 0 or 1")
        if not 1 <= self.window < 0xFFFF:
            raise ValueError("the window must be 1..65534")


class Device:
    """One device's MQTT session. Every method returns the bytes to send (maybe empty).

    Readings are numbered from 0 by ``serial``; ``due(n)`` makes ``n`` more readings due, and
    ``flat_out()`` makes readings always due (as many as the window allows). Due readings beyond
    the window wait (``backlog``) and go out, stamped with the time they are sent, as PUBACKs
    free the window. After ``stop()`` nothing new is sent; acknowledgements still count.

    Invariant: ``len(inflight) <= config.window``; ``inflight`` maps packet id to (serial, send
    time, ``ts_ms`` of the payload) for readings sent and not yet acknowledged. A resend carries
    the first send's ``ts_ms``: it is the same message, byte for byte but the DUP bit, or the
    brokers could not tell it from a new reading and would log it twice (issue 38).
    """

    def __init__(self, index: int, config: DeviceConfig, tally: Tally) -> None:
        self.id = device_id(index)
        self.config = config
        self.tally = tally
        self.state = DeviceState.CONNECTING
        self.next_serial = 0
        self.inflight: dict[int, tuple[int, float, int]] = {}
        self.backlog = 0
        self.flat = False
        self.stopped = False
        self._template = ReadingTemplate(config.run, self.id, config.qos)
        self._inbuf = b""
        self._had_session = False  # a CONNACK accepted a persistent session before

    # -- what the driver calls --------------------------------------------------------------

    def connect(self) -> bytes:
        c = self.config
        return encode_mqtt(
            Connect(
                self.id,
                clean_start=c.clean,
                keep_alive=c.keep_alive,
                username=c.username,
                password=None if c.password is None else c.password.encode(),
            ),
            VERSION,
        )

    def due(self, n: int, now: float, now_ms: int) -> bytes:
        """``n`` more readings are due now."""
        if self.stopped:
            return b""
        self.backlog += n
        return self._fill(now, now_ms)

    def flat_out(self, now: float, now_ms: int) -> bytes:
        """From now on, a reading is always due: keep the window full."""
        self.flat = True
        return self._fill(now, now_ms)

    def stop(self) -> None:
        """Send no more readings (the backlog is dropped: those readings were never sent)."""
        self.stopped = True
        self.flat = False
        self.backlog = 0

    def reconnect(self) -> None:
        """A new connection is being opened (the last one was lost): handshake again, then
        resend the unacknowledged readings with DUP set (MQTT-4.4.0-1 asks it of a client that
        resumes a session; with a clean session it is what a device does not to lose them)."""
        self.state = DeviceState.CONNECTING
        self._inbuf = b""

    def unacknowledged(self) -> list[int]:
        """Serials sent and not acknowledged (in flight, or the connection went away)."""
        return sorted(sent[0] for sent in self.inflight.values())

    def receive(self, data: bytes, now: float, now_ms: int) -> bytes:
        """Bytes from the server; returns the answer (SUBSCRIBE, PUBACKs, more readings)."""
        buf = self._inbuf + data if self._inbuf else data
        out: list[bytes] = []
        i, n = 0, len(buf)
        inflight, tally = self.inflight, self.tally
        start, end = tally.window_start, tally.window_end
        acked = 0
        pids = _only_pubacks(buf)
        if pids is not None:  # the usual read under load: nothing but PUBACKs, handled in bulk
            i = n
            pop = inflight.pop
            sent_at = [sent[1] for sent in map(pop, pids, repeat(None)) if sent is not None]
            acked = len(sent_at)
            tally.unexpected_packets += len(pids) - acked
            if acked and start <= now <= end:
                tally.acknowledged_in_window += acked
                tally.puback_ms.extend([(now - t) * 1000.0 for t in sent_at])
        while i + 1 < n:
            first = buf[i]
            if first == 0x40 and buf[i + 1] == 2:  # PUBACK, the hot path
                if i + 4 > n:
                    break
                sent = inflight.pop(buf[i + 2] << 8 | buf[i + 3], None)
                i += 4
                if sent is None:
                    tally.unexpected_packets += 1
                    continue
                acked += 1
                if start <= now <= end:
                    tally.acknowledged_in_window += 1
                    tally.puback_ms.append((now - sent[1]) * 1000.0)
                continue
            length, size = _remaining_length(buf, i + 1)
            if length == -1:
                break
            if length < 0:
                self._fail(f"{self.id}: malformed remaining length from the server")
                self._inbuf = b""
                return b""
            body_at = i + 1 + size
            if body_at + length > n:
                break
            self._packet(first, buf[body_at : body_at + length], now, now_ms, out)
            i = body_at + length
        self._inbuf = buf[i:]
        if acked:
            tally.acknowledged += acked
        if acked and (self.backlog or self.flat):
            out.append(self._fill(now, now_ms))
        return b"".join(out)

    # -- inside -------------------------------------------------------------------------------

    def _fill(self, now: float, now_ms: int) -> bytes:
        if self.state is not DeviceState.READY or self.stopped:
            return b""
        qos = self.config.qos
        room = self.config.window - len(self.inflight) if qos else self.config.window
        count = room if self.flat else min(room, self.backlog)
        if count <= 0:
            return b""
        if not self.flat:
            self.backlog -= count
        serial = self.next_serial
        self.next_serial = serial + count
        packet = self._template.packet
        tally = self.tally
        tally.sent += count
        if tally.window_start <= now <= tally.window_end:
            tally.sent_in_window += count
        if not qos:
            return b"".join([packet(s, now_ms) for s in range(serial, serial + count)])
        inflight = self.inflight
        parts = []
        for s in range(serial, serial + count):
            pid = s % 0xFFFF + 1
            inflight[pid] = (s, now, now_ms)
            parts.append(packet(s, now_ms, pid))
        return b"".join(parts)

    def _packet(self, first: int, body: bytes, now: float, now_ms: int, out: list[bytes]) -> None:
        kind = first >> 4
        if kind == 3:  # PUBLISH: a command
            self._command(first, body, now, now_ms, out)
        elif kind == 2 and self.state is DeviceState.CONNECTING:  # CONNACK
            code = body[1] if len(body) >= 2 else -1
            if code != 0:
                self._fail(f"{self.id}: CONNACK refused with code {code}")
                return
            if not self.config.clean:
                if self._had_session:  # the session it left on the brokers must be there
                    if body[0] & 1:
                        self.tally.sessions_resumed += 1
                    else:
                        self.tally.sessions_lost += 1
                        self.tally.error(f"{self.id}: reconnected, and its session was gone")
                self._had_session = True
            if self.config.subscribe:
                self.state = DeviceState.SUBSCRIBING
                out.append(_subscribe(self.id))
            else:
                self._ready(now, now_ms, out)
        elif kind == 9 and self.state is DeviceState.SUBSCRIBING:  # SUBACK
            if len(body) < 3 or body[2] >= 0x80:
                self._fail(f"{self.id}: SUBSCRIBE to its commands topic refused")
            else:
                self._ready(now, now_ms, out)
        elif kind != 13:  # PINGRESP needs nothing
            self.tally.unexpected_packets += 1

    def _ready(self, now: float, now_ms: int, out: list[bytes]) -> None:
        """Connected (and subscribed). Readings start when the driver says (``due``,
        ``flat_out``); after a reconnect, the unacknowledged ones go again first."""
        self.state = DeviceState.READY
        if self.inflight:
            packet = self._template.packet
            for pid, (serial, _, ts_ms) in sorted(
                self.inflight.items(), key=lambda item: item[1][0]
            ):
                # The same message again (its first timestamp): a resend the brokers recognise.
                # PUBACK latency counts from now, as the first send's was.
                self.inflight[pid] = (serial, now, ts_ms)
                first = packet(serial, ts_ms, pid)
                out.append(bytes((first[0] | 0x08,)) + first[1:])  # DUP
            self.tally.resent += len(self.inflight)
        out.append(self._fill(now, now_ms))

    def _command(self, first: int, body: bytes, now: float, now_ms: int, out: list[bytes]) -> None:
        qos = (first >> 1) & 3
        topic_len = body[0] << 8 | body[1]
        at = 2 + topic_len
        if qos:
            out.append(_PUBACK_HEAD + body[at : at + 2])
            at += 2
        tally = self.tally
        tally.commands += 1
        try:
            ts_ms = json.loads(body[at:])["ts_ms"]
        except (ValueError, KeyError, TypeError):
            tally.error(f"{self.id}: a command without ts_ms: {body[at : at + 80]!r}")
            return
        # Timed until the measured window ends (a command that waited out a broker's failure
        # in a persistent session is counted, not timed).
        if isinstance(ts_ms, int | float) and now <= tally.window_end:
            tally.command_ms.append(float(now_ms - ts_ms))

    def _fail(self, message: str) -> None:
        self.state = DeviceState.FAILED
        self.tally.error(message)


def _only_pubacks(buf: bytes) -> array[int] | None:
    """The packet ids if ``buf`` is nothing but whole PUBACKs (``40 02 id id`` each), else None.

    One C-level pass over the buffer instead of a Python loop per 4-byte packet."""
    if len(buf) % 4 or not buf or buf[0] != 0x40:
        return None
    words = array("H", buf)
    if _LITTLE_ENDIAN:
        words.byteswap()
    heads = words[0::2]
    if heads.count(0x4002) != len(heads):
        return None
    return words[1::2]


def _remaining_length(buf: bytes, at: int) -> tuple[int, int]:
    """(remaining length, bytes it took) of the fixed header at ``at``; (-1, 0) if incomplete,
    (-2, 0) if malformed (a fifth length byte)."""
    value = 0
    for k in range(4):
        if at + k >= len(buf):
            return -1, 0
        byte = buf[at + k]
        value |= (byte & 0x7F) << (7 * k)
        if byte < 0x80:
            return value, k + 1
    return -2, 0


def _subscribe(device: str) -> bytes:
    return encode_mqtt(
        Subscribe(_SUBSCRIBE_PACKET_ID, (MqttSubscription(commands_topic(device), qos=1),)),
        VERSION,
    )
