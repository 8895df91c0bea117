"""Sans-I/O MQTT client session: one connection to an upstream broker, as a state machine.

The core holds what the protocol asks a *client* to remember on one connection, and nothing
else: no socket, no clock (``now`` is passed in, in seconds), no task. The driver
(``mqtt_bridge._client``) feeds what it reads with ``receive_data`` and sends the bytes the methods
return::

    core = MqttClientCore(options, now=clock())
    send(core.connect_bytes())
    for event in core.receive_data(read(), now=clock()):   # Connected, MessageReceived, ...
        ...
    send(core.ack(message.packet_id))                       # PUBACKs, in order, maybe b""

Contracts:

* Inbound QoS 1 PUBLISHes are acknowledged *only when told* (``ack``), and the PUBACKs leave in
  the order the PUBLISHes arrived (v5 §4.6, ordered topics): acknowledging message 7 before 6
  returns nothing until 6 is acknowledged too, then both. A PUBLISH that is never acknowledged
  stays unacknowledged on the server, which redelivers it on the next connection of a persistent
  session; that is how the bridge loses nothing.
* Outbound PUBLISH QoS 1 and SUBSCRIBE take packet identifiers from one pool (1..65535, never two
  in use at once, MQTT-2.3.1-2); ``PublishAcked``/``SubscribeAcked`` free them.
* Keep-alive: ``tick(now)`` returns a PINGREQ once ``keep_alive_s`` passed since the last packet
  sent, and raises ``MqttConnectionError`` when a PINGRESP (or any packet) did not come within
  another ``keep_alive_s`` (the server would have dropped us by then anyway, MQTT-3.1.2-24).
* Errors: ``MqttConnectionError`` means this connection is over (refused, protocol violation by
  the server, keep-alive timeout, server DISCONNECT): make a new core on a new connection.
"""

from __future__ import annotations

import enum
import ssl
import struct
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from ._decoder import MqttDecoder
from ._encoder import encode_mqtt
from ._packets import (
    NO_PROPERTIES,
    Connack,
    Connect,
    Disconnect,
    MqttProperties,
    MqttProtocolError,
    MqttSubscription,
    MqttVersion,
    Pingreq,
    Pingresp,
    Puback,
    Publish,
    Suback,
    Subscribe,
)

MAX_PACKET_ID: Final = 65535
# A PUBACK with reason code 0 and no properties: the same 4 bytes in 3.1.1 and 5 (v5 §3.4.2.1
# omits both then). Packed directly: the encoder's general path, one per inbound message, was a
# visible share of the bridge's CPU (bench.bridge, py-spy).
_PUBACK_OK: Final = struct.Struct(">BBH")
_PUBACK_FIRST_BYTE: Final = 0x40
_MQTT_MAX_PACKET: Final = 268_435_460  # the largest remaining length (256 MiB) + fixed header
DEFAULT_SESSION_EXPIRY_S: Final = 7 * 24 * 3600
"""How long the upstream broker keeps our session (and queued QoS 1 messages) while we are away."""


class MqttConnectionError(Exception):
    """This MQTT connection is over; ``reason_code`` is the server's code when it gave one."""

    def __init__(self, message: str, reason_code: int | None = None) -> None:
        super().__init__(message)
        self.reason_code = reason_code


@dataclass(frozen=True)
class MqttClientOptions:
    """How to connect to the upstream broker.

    ``clean_start`` False plus ``session_expiry_s`` (v5; 3.1.1 sessions never expire) makes the
    server keep our subscriptions and queue QoS 1 messages while we are disconnected.
    ``receive_maximum`` (v5) bounds the QoS 1 PUBLISHes the server sends before we acknowledge.
    ``tls``: speak TLS with this client context (``kafkaesque.security.client_context``: the
    server's certificate is verified against its CA and, unless turned off, for ``host``).
    """

    host: str
    port: int
    client_id: str
    version: MqttVersion = MqttVersion.V5
    username: str | None = None
    password: bytes | None = None
    keep_alive_s: int = 30
    clean_start: bool = False
    session_expiry_s: int = DEFAULT_SESSION_EXPIRY_S
    receive_maximum: int = 1000
    connect_timeout_s: float = 10.0
    # Announced in v5 CONNECT: the server discards larger messages instead of sending them (a
    # message we could not append must not come back forever). Below the producer's 8 MiB.
    max_packet_size: int = 4 * 1024 * 1024
    tls: ssl.SSLContext | None = None

    def __post_init__(self) -> None:
        if self.version not in (MqttVersion.V311, MqttVersion.V5):
            raise ValueError("the bridge speaks MQTT 3.1.1 or 5.0")
        if not 0 <= self.keep_alive_s <= 65535 or not 1 <= self.receive_maximum <= 65535:
            raise ValueError("keep_alive_s must be 0..65535 and receive_maximum 1..65535")


@dataclass(frozen=True, slots=True)
class Connected:
    """CONNACK accepted. ``session_present``: the server kept our session from before."""

    session_present: bool
    receive_maximum: int


@dataclass(frozen=True, slots=True)
class MessageReceived:
    """An inbound PUBLISH. For QoS 1, acknowledge it with ``ack(publish.packet_id)``."""

    publish: Publish


@dataclass(frozen=True, slots=True)
class SubscribeAcked:
    """SUBACK for ``packet_id``: one reason code per filter (>= 0x80: refused)."""

    packet_id: int
    reason_codes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PublishAcked:
    """PUBACK for our QoS 1 PUBLISH ``packet_id`` (``reason_code`` >= 0x80: refused)."""

    packet_id: int
    reason_code: int


MqttClientEvent = Connected | MessageReceived | SubscribeAcked | PublishAcked


class _State(enum.Enum):
    NEW = enum.auto()
    CONNECTING = enum.auto()
    CONNECTED = enum.auto()
    CLOSED = enum.auto()


class MqttClientCore:
    """One client connection's protocol state (see the module docstring for the contracts).

    Invariants: every identifier in ``_inbound`` belongs to a QoS 1 PUBLISH received and not
    yet acknowledged, in arrival order; ``_inbound_set`` holds the same identifiers;
    ``_acked_early`` is a subset of them;
    ``_outbound`` holds exactly the identifiers we sent and the server has not yet answered.
    """

    def __init__(self, options: MqttClientOptions, *, now: float) -> None:
        self.options = options
        # 3.1.1 cannot tell the server our limit, so there we read whatever comes, and a message
        # too large for the log is dropped after reading instead of breaking the connection
        # (and coming back with every redelivery).
        limit = options.max_packet_size if options.version == MqttVersion.V5 else _MQTT_MAX_PACKET
        self._decoder = MqttDecoder(
            server_side=False, version=options.version, max_packet_size=limit
        )
        self._state = _State.NEW
        self._inbound: deque[int] = deque()
        self._inbound_set: set[int] = set()  # the same identifiers, for O(1) membership
        self._acked_early: set[int] = set()
        self._outbound: dict[int, str] = {}  # packet id -> "publish" | "subscribe"
        self._next_id = 1
        self._last_sent = now
        self._ping_sent_at: float | None = None
        self.server_receive_maximum = MAX_PACKET_ID

    @property
    def connected(self) -> bool:
        return self._state is _State.CONNECTED

    @property
    def unacked_inbound(self) -> int:
        """QoS 1 messages received and not yet acknowledged upstream."""
        return len(self._inbound)

    @property
    def outbound_in_flight(self) -> int:
        """Our QoS 1 PUBLISHes (and SUBSCRIBEs) the server has not answered yet."""
        return len(self._outbound)

    # -- what we send -------------------------------------------------------------------------

    def connect_bytes(self) -> bytes:
        """The CONNECT packet; call once, first."""
        if self._state is not _State.NEW:
            raise RuntimeError("CONNECT is sent once, first")
        self._state = _State.CONNECTING
        o = self.options
        properties = NO_PROPERTIES
        if o.version == MqttVersion.V5:
            properties = MqttProperties(
                session_expiry_interval=o.session_expiry_s,
                receive_maximum=o.receive_maximum,
                maximum_packet_size=o.max_packet_size,
            )
        packet = Connect(
            client_id=o.client_id,
            clean_start=o.clean_start,
            keep_alive=o.keep_alive_s,
            username=o.username,
            password=o.password,
            properties=properties,
        )
        return encode_mqtt(packet, o.version)

    def subscribe(self, subscriptions: Iterable[MqttSubscription]) -> tuple[int, bytes]:
        """A SUBSCRIBE for ``subscriptions``: (its packet id, its bytes). Answered by
        ``SubscribeAcked``."""
        self._require_connected()
        packet_id = self._take_packet_id("subscribe")
        packet = Subscribe(packet_id, tuple(subscriptions))
        return packet_id, encode_mqtt(packet, self.options.version)

    def can_publish(self) -> bool:
        """Whether a QoS 1 PUBLISH may be sent now without exceeding the server's receive
        maximum (v5 §4.9) or running out of packet identifiers."""
        return self.outbound_in_flight < min(self.server_receive_maximum, MAX_PACKET_ID)

    def publish(
        self,
        topic: str,
        payload: bytes,
        *,
        qos: int = 1,
        retain: bool = False,
        properties: MqttProperties = NO_PROPERTIES,
    ) -> tuple[int, bytes]:
        """A PUBLISH: (packet id, bytes); the id is 0 for QoS 0. QoS 1 is answered by
        ``PublishAcked``. Raises ``RuntimeError`` when ``can_publish()`` is False (QoS 1).
        ``properties`` go out under v5 only (a 3.1.1 PUBLISH has none)."""
        self._require_connected()
        if qos not in (0, 1):
            raise ValueError("the bridge publishes QoS 0 or 1")
        packet_id = 0
        if qos == 1:
            if not self.can_publish():
                raise RuntimeError("the server's receive maximum is reached")
            packet_id = self._take_packet_id("publish")
        if self.options.version is not MqttVersion.V5:
            properties = NO_PROPERTIES
        packet = Publish(topic, payload, qos, retain, packet_id=packet_id, properties=properties)
        return packet_id, encode_mqtt(packet, self.options.version)

    def ack(self, packet_id: int) -> bytes:
        """Mark the inbound QoS 1 PUBLISH ``packet_id`` as processed; returns the PUBACKs that may
        leave now (those of the longest processed prefix, in arrival order), maybe ``b""``.

        Acknowledging an identifier not pending (QoS 0, already acknowledged, or from an earlier
        connection) returns ``b""``: after a reconnect the server redelivers it anyway.
        """
        if packet_id not in self._inbound_set or packet_id in self._acked_early:
            return b""
        if not self.connected:
            return b""
        self._acked_early.add(packet_id)
        out: list[bytes] = []
        while self._inbound and self._inbound[0] in self._acked_early:
            done = self._inbound.popleft()
            self._inbound_set.discard(done)
            self._acked_early.discard(done)
            out.append(_PUBACK_OK.pack(_PUBACK_FIRST_BYTE, 2, done))
        return b"".join(out)

    def disconnect_bytes(self) -> bytes:
        """A normal DISCONNECT (v5: the session is kept for its expiry interval); the core is
        closed afterwards."""
        self._state = _State.CLOSED
        return encode_mqtt(Disconnect(), self.options.version)

    def tick(self, now: float) -> bytes:
        """The PINGREQ due at ``now`` (or ``b""``); raises ``MqttConnectionError`` when the
        server has been silent for a keep-alive period after our PINGREQ."""
        keep_alive = self.options.keep_alive_s
        if keep_alive == 0 or not self.connected:
            return b""
        if self._ping_sent_at is not None:
            if now - self._ping_sent_at >= keep_alive:
                self._state = _State.CLOSED
                raise MqttConnectionError(f"no PINGRESP within {keep_alive} s")
            return b""
        if now - self._last_sent >= keep_alive:
            self._ping_sent_at = now
            return encode_mqtt(Pingreq(), self.options.version)
        return b""

    def next_tick_at(self) -> float | None:
        """When ``tick`` has something to do next (None: keep-alive is off)."""
        keep_alive = self.options.keep_alive_s
        if keep_alive == 0:
            return None
        if self._ping_sent_at is not None:
            return self._ping_sent_at + keep_alive
        return self._last_sent + keep_alive

    def note_sent(self, now: float) -> None:
        """The driver sent bytes at ``now`` (resets the keep-alive timer, MQTT-3.1.2-23)."""
        self._last_sent = now

    # -- what we receive ----------------------------------------------------------------------

    def receive_data(self, data: bytes | bytearray) -> list[MqttClientEvent]:
        """Feed bytes read from the server; returns the events they complete, in order.

        Raises ``MqttConnectionError`` when the connection is over: CONNECT refused, a server
        DISCONNECT, or a protocol violation by the server.
        """
        if self._state is _State.CLOSED:
            raise MqttConnectionError("the connection is closed")
        try:
            self._decoder.feed(data)
            packets = self._decoder.decode_many()
        except MqttProtocolError as exc:
            self._state = _State.CLOSED
            raise MqttConnectionError(f"the server broke the protocol: {exc}") from exc
        events: list[MqttClientEvent] = []
        for packet in packets:
            event = self._on_packet(packet)
            if event is not None:
                events.append(event)
        return events

    def _on_packet(self, packet: object) -> MqttClientEvent | None:
        self._ping_sent_at = None  # any packet shows the server is alive
        if self._state is _State.CONNECTING:
            if not isinstance(packet, Connack):
                raise self._violation(f"expected CONNACK, got {type(packet).__name__}")
            return self._on_connack(packet)
        if isinstance(packet, Publish):
            return self._on_publish(packet)
        if isinstance(packet, Puback):
            if self._outbound.get(packet.packet_id) != "publish":
                raise self._violation(f"PUBACK for unknown packet id {packet.packet_id}")
            del self._outbound[packet.packet_id]
            return PublishAcked(packet.packet_id, packet.reason_code)
        if isinstance(packet, Suback):
            if self._outbound.get(packet.packet_id) != "subscribe":
                raise self._violation(f"SUBACK for unknown packet id {packet.packet_id}")
            del self._outbound[packet.packet_id]
            return SubscribeAcked(packet.packet_id, packet.reason_codes)
        if isinstance(packet, Pingresp):
            return None
        if isinstance(packet, Disconnect):
            self._state = _State.CLOSED
            raise MqttConnectionError(
                f"the server disconnected (reason 0x{packet.reason_code:02X})", packet.reason_code
            )
        raise self._violation(f"unexpected {type(packet).__name__}")

    def _on_connack(self, packet: Connack) -> Connected:
        if packet.reason_code != 0:
            self._state = _State.CLOSED
            raise MqttConnectionError(
                f"CONNECT refused (code 0x{packet.reason_code:02X})", packet.reason_code
            )
        self._state = _State.CONNECTED
        maximum = packet.properties.receive_maximum
        self.server_receive_maximum = MAX_PACKET_ID if maximum is None else maximum
        return Connected(packet.session_present, self.server_receive_maximum)

    def _on_publish(self, packet: Publish) -> MessageReceived | None:
        if packet.qos == 2:
            # We subscribe with QoS 1 only, so the server never sends QoS 2 (MQTT-3.8.4-8).
            raise self._violation("QoS 2 PUBLISH on a QoS 1 subscription")
        if packet.qos == 1:
            if packet.packet_id in self._inbound_set:
                # A resend of a message still being processed (v5 forbids it within one
                # connection, 3.1.1 servers may do it): it will be acknowledged once.
                return None
            self._inbound.append(packet.packet_id)
            self._inbound_set.add(packet.packet_id)
        return MessageReceived(packet)

    def _violation(self, detail: str) -> MqttConnectionError:
        self._state = _State.CLOSED
        return MqttConnectionError(f"the server broke the protocol: {detail}")

    # -- helpers --------------------------------------------------------------------------------

    def _require_connected(self) -> None:
        if not self.connected:
            raise RuntimeError("not connected")

    def _take_packet_id(self, kind: str) -> int:
        if len(self._outbound) >= MAX_PACKET_ID:
            raise RuntimeError("every packet identifier is in use")
        packet_id = self._next_id
        while packet_id in self._outbound:
            packet_id = packet_id % MAX_PACKET_ID + 1
        self._next_id = packet_id % MAX_PACKET_ID + 1
        self._outbound[packet_id] = kind
        return packet_id
