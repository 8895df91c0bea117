"""One MQTT device connection as a pure state machine: bytes and events in, actions out.

``MqttServerConnection`` owns the decoder and every rule of the MQTT server side that does not
need I/O: the CONNECT handshake (client id, clean session / clean start, keep-alive, user name
and password), the order of packets, QoS 1 and QoS 2 acknowledgements, SUBSCRIBE/UNSUBSCRIBE
answers, PINGREQ, DISCONNECT and its Will suppression, packet identifiers of deliveries, and how
a protocol violation ends the connection (MQTT 3.1.1 closes the network connection, MQTT 5.0
first sends a DISCONNECT or CONNACK with the reason code where the spec asks for one).

The trio driver (``broker.mqtt``) feeds it what the socket delivered (``receive``), asks it
when the connection must be closed for silence (``deadline``, the 1.5x keep-alive rule of
MQTT-3.1.2-24 / v5 §3.1.2.10), tells it about deliveries (``deliver``) and about the end
(``connection_lost``), and performs the actions it returns, in order:

* ``Send``: write these bytes now (they do not depend on any write to the log);
* ``Append``: append this message to the log; ``ack`` (PUBACK or PUBREC bytes, or empty for
  QoS 0) is sent only once the record is committed by the partition's quorum, in the order the
  appends were asked for;
* ``Accepted``: the CONNECT passed the checks that need no I/O: the driver checks its
  credentials (``credentials_required``: ``bad_credentials`` / ``not_authorized`` refuse it),
  registers the session, then sends ``connack()``;
* ``Acked``: the device acknowledged a tagged delivery;
* ``Received``: the device received a tagged QoS 2 delivery (PUBREC): send its PUBREL (after
  saving a persistent session, so that a reconnect continues with PUBREL, never the PUBLISH);
* ``Released``: a QoS 2 message is complete (PUBREL): send its PUBCOMP;

The driver calls ``answered`` as it sends the PUBACK of an ``Append`` or the PUBCOMP of a
``Released``: the client may then send one more QoS 1/2 PUBLISH (v5 Receive Maximum).
* ``Subscribed``: add subscriptions, then send its SUBACK (then the retained messages): the
  driver may first make sure the subscription is live, so that whatever is published after the
  SUBACK reaches the device;
* ``Unsubscribed``: remove subscriptions (the UNSUBACK ``Send`` comes first);
* ``Close``: close the network connection (after sending what came before it); its ``will``
  says whether the Will message must be published;
* ``Refused``: the ACL refused a PUBLISH, a SUBSCRIBE's filter or a CONNECT's Will; its
  answer is already among the actions (log and count it).

With an ACL, a refused PUBLISH is acknowledged as mosquitto does: MQTT 5 with reason 0x87 Not
authorized (PUBACK at QoS 1, PUBREC at QoS 2, which ends that exchange), MQTT 3.1.1 as usual
(MQTT-3.3.5-2: it is dropped); at QoS 0 it is just dropped. A refused filter of a SUBSCRIBE
gets 0x80 (3.1.1) or 0x87 (5) in the SUBACK. A CONNECT whose Will the client may not publish
is refused (CONNACK 3.1.1 return code 5, v5 0x87). The client's ACL is made at its CONNECT, from
the user name it gives (checked by the driver before anything else is performed), so that even
the PUBLISHes sent right behind the CONNECT are checked.

Invariant: after a ``Close`` action the machine returns no more actions.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Final, Protocol

from ._decoder import MqttDecoder
from ._encoder import encode_mqtt, encode_mqtt_puback
from ._headers import delivery_properties, message_headers
from ._packets import (
    CONNACK_REASON_CODES,
    DISCONNECT_REASON_CODES,
    NO_PROPERTIES,
    Connack,
    ConnackReturnCode,
    Connect,
    Disconnect,
    MqttPacket,
    MqttProperties,
    MqttProtocolError,
    MqttReasonCode,
    MqttSubscription,
    MqttUnsupportedProtocolError,
    MqttVersion,
    Pingreq,
    Pingresp,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
    Will,
)
from ._topics import InvalidMqttTopicError, is_valid_mqtt_topic_filter, parse_shared_subscription

CONNECT_TIMEOUT_S: Final = 10.0
"""A socket must send its CONNECT within this long (MQTT-3.1.4: "a reasonable amount of time")."""

MAX_QOS: Final = 2
TOPIC_ALIAS_MAXIMUM: Final = 100
"""Topic aliases a v5 client may set up on one connection (announced in the CONNACK)."""
RECEIVE_MAXIMUM: Final = 1000
"""QoS 1 and 2 PUBLISHes a v5 client may have unanswered (no PUBACK / PUBCOMP sent yet) on one
connection: announced in the CONNACK (v5 §3.2.2.3.3), and one more is a DISCONNECT 0x93
(v5 §4.9). Below the driver's bound of acknowledgements waiting for the log (1024), so a client
within it is seldom made to wait by TCP backpressure."""


@dataclass(frozen=True, slots=True)
class Send:
    data: bytes


@dataclass(frozen=True, slots=True)
class Append:
    """Append ``topic``/``payload`` to the log; send ``ack`` once the record is committed.

    ``packet_id`` is the PUBLISH's (0 for QoS 0); ``resend`` marks a QoS 1 PUBLISH with DUP set,
    which is looked up in the log before it is appended (``kafkaesque.broker._resends``).
    ``property_headers`` keep its v5 message properties (``message_headers``: expiry, Response
    Topic, User Properties...), which go with the message to its subscribers.
    """

    topic: str
    payload: bytes
    qos: int
    retain: bool
    ack: bytes
    packet_id: int = 0
    resend: bool = False
    property_headers: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True, slots=True)
class Accepted:
    """The CONNECT passed; the driver restores or creates the session, then sends
    ``connack(session_present)``. ``persistent``: the session outlives the connection (3.1.1:
    clean session 0; 5.0: a session expiry interval above 0), for the connection's
    ``session_expiry_s`` once it ends."""

    client_id: str
    clean_start: bool
    will: Will | None
    version: MqttVersion
    persistent: bool
    username: str | None = None
    password: bytes | None = None  # for the driver to check (``credentials_required``)


@dataclass(frozen=True, slots=True)
class Acked:
    """The device acknowledged the delivery that was tagged ``tag`` (PUBACK or PUBCOMP)."""

    tag: object


@dataclass(frozen=True, slots=True)
class Subscribed:
    """Add the granted subscriptions (qos = the granted QoS), then send ``suback``."""

    subscriptions: tuple[MqttSubscription, ...]
    suback: bytes


@dataclass(frozen=True, slots=True)
class Unsubscribed:
    topic_filters: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Close:
    reason: str
    will: bool  # publish the Will (an abnormal end), if the session has one
    # A protocol violation's reason code (``MqttReasonCode``: 0x95 a packet too large, ...), for
    # the broker's counters; None for any other end.
    error: int | None = None


@dataclass(frozen=True, slots=True)
class Received:
    """The device sent PUBREC for the QoS 2 delivery tagged ``tag``: send ``pubrel``."""

    tag: object
    pubrel: bytes


@dataclass(frozen=True, slots=True)
class Released:
    """A QoS 2 message's PUBREL came: its packet id is free again. Send ``pubcomp`` (after
    saving a persistent session, so that a reconnect does not take a new message with that id
    for a retransmission)."""

    packet_id: int
    pubcomp: bytes


@dataclass(frozen=True, slots=True)
class Refused:
    """The ACL refused ``action`` ("publish" or "subscribe") on ``topic`` (a filter for a
    subscription); what the client is told is in the actions already."""

    action: str
    topic: str


Action = (
    Send
    | Append
    | Accepted
    | Acked
    | Received
    | Released
    | Subscribed
    | Unsubscribed
    | Close
    | Refused
)


class ConnectionAcl(Protocol):
    """What the state machine asks of one client's ACL (``kafkaesque.security.ClientAcl``)."""

    def can_publish(self, topic: str) -> bool: ...

    def can_subscribe(self, topic_filter: str) -> bool: ...

    def can_receive(self, topic: str) -> bool: ...


class AclFile(Protocol):
    """An ACL file (``kafkaesque.security.MqttAcl``): each client's checks."""

    def for_client(self, user: str | None, client_id: str) -> ConnectionAcl: ...


class MqttServerConnection:
    """The server side of one MQTT connection (see the module docstring).

    ``credentials_required``: a CONNECT must carry a user name and a password (the driver checks
    them, see ``Accepted``; without, it is refused 0x86 at once). ``acl``: what clients may
    publish and subscribe to (None: anything); the connected client's checks are ``self.acl``.
    ``max_packet_size`` bounds
    every packet the peer may send (a larger one is a protocol error, 0x95 in v5);
    ``receive_maximum``, the QoS 1/2 PUBLISHes a v5 client may have unanswered (one more is
    0x93). A v5 CONNACK announces both (v5 §3.2.2.3.3, §3.2.2.3.6), for a client that trusts
    the absent values (none, 65535) floods the connection.
    """

    def __init__(
        self,
        now: float,
        *,
        credentials_required: bool = False,
        acl: AclFile | None = None,
        max_packet_size: int = 1 << 20,
        receive_maximum: int = RECEIVE_MAXIMUM,
    ) -> None:
        if not 1 <= receive_maximum <= 0xFFFF:
            raise ValueError(f"receive_maximum must be 1..65535, not {receive_maximum}")
        self._decoder = MqttDecoder(max_packet_size=max_packet_size, server_side=True)
        self.inbound_maximum = receive_maximum
        # The client's QoS 1/2 PUBLISHes on this connection not answered yet (PUBACK or
        # PUBCOMP not sent). Invariant: 0 <= unanswered; at most inbound_maximum in v5.
        self.unanswered = 0
        self._credentials_required = credentials_required
        self._acl_file = acl
        self.acl: ConnectionAcl | None = None  # the client's, from its CONNECT
        self.version: MqttVersion | None = None
        self.client_id: str | None = None
        self.keep_alive = 0
        self.connected = False
        self._closed = False
        self._last_received = now
        self._connect_by = now + CONNECT_TIMEOUT_S
        self._clean_disconnect = False
        # QoS 2 packet ids whose PUBLISH was appended and whose PUBREL has not come (MQTT-4.3.3).
        self.awaiting_release: set[int] = set()
        # Deliveries to the device: packet id -> QoS, until its PUBACK / PUBCOMP.
        self.inflight: dict[int, int] = {}
        # The QoS 2 deliveries among them whose PUBREC came (PUBREL sent, PUBCOMP awaited).
        self.released: set[int] = set()
        self._tags: dict[int, object] = {}  # packet id -> the driver's tag of the delivery
        self._connack_properties = MqttProperties()
        self._next_packet_id = 1
        # v5 topic aliases the client set up on this connection (they do not outlive it).
        self._aliases: dict[int, str] = {}
        # How many QoS 1/2 deliveries the client takes unacknowledged (v5 Receive Maximum).
        self.receive_maximum = 0xFFFF
        # The largest packet the client takes (v5 Maximum Packet Size; None: MQTT's own bound).
        self.maximum_packet_size: int | None = None
        # How long the session outlives the connection, in seconds: 0 not at all, None for
        # ever (3.1.1 clean session 0; v5 0xFFFFFFFF). A v5 DISCONNECT may change it.
        self.session_expiry_s: int | None = 0

    @property
    def closed(self) -> bool:
        """Whether a ``Close`` was returned (then nothing more is)."""
        return self._closed

    # -- input ----------------------------------------------------------------------------------

    def receive(self, data: bytes | bytearray, now: float) -> list[Action]:
        """Bytes from the socket; what to do about them."""
        if self._closed:
            return []
        self._last_received = now
        actions: list[Action] = []
        try:
            self._decoder.feed(data)
            while True:
                packets = self._decoder.decode_many()
                if not packets:
                    break
                for packet in packets:
                    if self._handle(packet, actions):
                        return actions  # closed: ignore whatever followed
        except MqttProtocolError as exc:
            actions.extend(self._protocol_error(exc))
        return actions

    def deadline(self) -> float:
        """When the connection must be closed if nothing arrives (inf: never)."""
        if not self.connected:
            return self._connect_by
        if self.keep_alive == 0:
            return float("inf")
        return self._last_received + 1.5 * self.keep_alive

    def expired(self, now: float) -> list[Action]:
        """The deadline passed without a packet: close (with the Will)."""
        if self.closed or now < self.deadline():
            return []
        if not self.connected:
            return self._close("no CONNECT in time", will=False)
        actions: list[Action] = []
        if self.version is MqttVersion.V5:
            reason = MqttReasonCode.KEEP_ALIVE_TIMEOUT
            actions.append(Send(encode_mqtt(Disconnect(reason), self.version)))
        actions.extend(self._close(f"keep-alive of {self.keep_alive} s expired", will=True))
        return actions

    def connection_lost(self) -> list[Action]:
        """The network connection ended (EOF or error) before a DISCONNECT."""
        if self.closed:
            return []
        return self._close("the connection was lost", will=self.connected)

    def take_over(self) -> list[Action]:
        """Another connection with the same client id arrived: this one ends (MQTT-3.1.4-2)."""
        if self.closed:
            return []
        actions: list[Action] = []
        if self.version is MqttVersion.V5:
            reason = MqttReasonCode.SESSION_TAKEN_OVER
            actions.append(Send(encode_mqtt(Disconnect(reason), self.version)))
        actions.extend(self._close("session taken over by a new connection", will=True))
        return actions

    def server_disconnect(self, reason: MqttReasonCode, why: str) -> list[Action]:
        """The server ends the connection (a slow consumer, a failed write, shutdown)."""
        if self.closed:
            return []
        actions: list[Action] = []
        if self.version is MqttVersion.V5 and self.connected:
            actions.append(Send(encode_mqtt(Disconnect(reason), self.version)))
        actions.extend(self._close(why, will=self.connected))
        return actions

    def unavailable(self) -> list[Action]:
        """Refuse the CONNECT just ``Accepted``, before its CONNACK went: the server cannot
        serve yet (a broker that does not know its cluster). CONNACK "server unavailable"
        (3.1.1 return code 3, v5 0x88), then close; the connection never was, so no Will."""
        if self.closed:
            return []
        self.connected = False
        return self._refuse(ConnackReturnCode.SERVER_UNAVAILABLE, MqttReasonCode.SERVER_UNAVAILABLE)

    def bad_credentials(self) -> list[Action]:
        """Refuse the CONNECT just ``Accepted``: its user name or password is wrong (CONNACK
        3.1.1 return code 4, v5 0x86), then close; no Will."""
        if self.closed:
            return []
        self.connected = False
        return self._refuse(
            ConnackReturnCode.BAD_USER_NAME_OR_PASSWORD, MqttReasonCode.BAD_USER_NAME_OR_PASSWORD
        )

    def not_authorized(self) -> list[Action]:
        """Refuse the CONNECT just ``Accepted``: the client may not connect (its address failed
        too often) or may not publish its Will (CONNACK 3.1.1 return code 5, v5 0x87)."""
        if self.closed:
            return []
        self.connected = False
        return self._refuse(ConnackReturnCode.NOT_AUTHORIZED, MqttReasonCode.NOT_AUTHORIZED)

    def answered(self) -> None:
        """The driver sent the PUBACK of a QoS 1 ``Append`` or the PUBCOMP of a ``Released``."""
        # Never below 0: a PUBREL may complete a QoS 2 message of an earlier connection of the
        # session, which this one did not count (the quota restarts at each connection, v5 §4.9).
        self.unanswered = max(0, self.unanswered - 1)

    # -- output toward the device ---------------------------------------------------------------

    def connack(self, session_present: bool) -> bytes:
        """The CONNACK accepting the connection (after ``Accepted``)."""
        connack = Connack(session_present, 0, self._connack_properties)
        return encode_mqtt(connack, self._v())

    def deliver(
        self,
        topic: str,
        payload: bytes,
        qos: int,
        retain: bool = False,
        tag: object = None,
        expiry_s: int | None = None,
        identifiers: tuple[int, ...] = (),
        forwarded: tuple[tuple[str, bytes], ...] = (),
        packet_id: int = 0,
    ) -> bytes | None:
        """The PUBLISH bytes delivering a message at ``qos`` (None: closed, or ids exhausted;
        b"": discarded, as larger than the client's v5 Maximum Packet Size, MQTT-3.1.2-25).

        ``packet_id``: a retransmission of a delivery of the session's previous connection,
        with the id ``resume`` reserved for it; it goes with DUP set (MQTT-4.4.0-1, -3.3.1-1).

        A QoS 1/2 delivery with a ``tag`` is reported by an ``Acked(tag)`` action once the
        device has acknowledged it. To a v5 device only: ``expiry_s``, what remains of the
        message's expiry interval (MQTT-3.3.2-6); ``identifiers``, the Subscription Identifiers
        of the subscriptions it matched (MQTT-3.3.4-3); ``forwarded``, the message's headers
        that carry its other properties (``delivery_properties``).
        """
        if self.closed or not self.connected or self.version is None:
            return None
        dup = packet_id != 0
        if dup:
            if self.inflight.get(packet_id) != qos or packet_id in self.released:
                raise ValueError(f"packet id {packet_id} is not reserved for a QoS {qos} resend")
        elif qos > 0:
            found = self._allocate_packet_id()
            if found is None:
                return None
            packet_id = found
            self.inflight[packet_id] = qos
            if tag is not None:
                self._tags[packet_id] = tag
        properties = NO_PROPERTIES
        if (expiry_s is not None or identifiers or forwarded) and self.version is MqttVersion.V5:
            properties = delivery_properties(forwarded, expiry_s, identifiers)
        publish = Publish(
            topic, payload, qos, retain, dup, packet_id=packet_id, properties=properties
        )
        data = encode_mqtt(publish, self.version)
        if self.maximum_packet_size is not None and len(data) > self.maximum_packet_size:
            # Not sent, and handled as if it had been (MQTT-3.1.2-24/-25): no PUBACK to wait for.
            self.forget(packet_id)
            return b""
        return data

    def resume(self, packet_id: int, qos: int, released: bool, tag: object) -> bytes:
        """Take over a QoS 1/2 delivery that the session's previous connection left in flight,
        under its packet id (MQTT-4.4.0-1: a resumed session continues each exchange with the
        original ids). Returns its PUBREL if the device had sent PUBREC (``released``), to send
        now; else b"": its PUBLISH is to be resent with ``deliver(..., packet_id=packet_id)``.
        The delivery is tagged ``tag`` like any other. Call after the CONNACK, before any
        ``deliver``, so that no new delivery takes the id."""
        if not (1 <= packet_id <= 0xFFFF and qos in (1, 2)) or (released and qos != 2):
            raise ValueError(f"not a delivery in flight: id {packet_id}, QoS {qos}")
        if packet_id in self.inflight:
            raise ValueError(f"packet id {packet_id} is in flight already")
        self.inflight[packet_id] = qos
        self._tags[packet_id] = tag
        if not released:
            return b""
        self.released.add(packet_id)
        return encode_mqtt(Pubrel(packet_id), self._v())

    def reserved(self, packet_id: int, tag: object) -> bool:
        """Whether ``packet_id`` still waits for the resend of the delivery tagged ``tag`` (not
        acknowledged meanwhile, nor past PUBREC)."""
        return (
            packet_id in self.inflight
            and packet_id not in self.released
            and self._tags.get(packet_id) == tag
        )

    def forget(self, packet_id: int) -> None:
        """The delivery in flight under ``packet_id`` is given up (expired, or its message is
        gone): the id is free again, and no ``Acked`` will come for it."""
        self.inflight.pop(packet_id, None)
        self.released.discard(packet_id)
        self._tags.pop(packet_id, None)

    def in_flight(self) -> list[tuple[object, int, int, bool]]:
        """The tagged deliveries in flight: (tag, packet id, QoS, PUBREC received), in the
        order they were sent (what a persistent session stores to resume them)."""
        tags = self._tags
        return [
            (tags[pid], pid, qos, pid in self.released)
            for pid, qos in self.inflight.items()
            if pid in tags
        ]

    def _allocate_packet_id(self) -> int | None:
        for _ in range(0xFFFF):
            packet_id = self._next_packet_id
            self._next_packet_id = packet_id % 0xFFFF + 1
            if packet_id not in self.inflight:
                return packet_id
        return None

    # -- packets --------------------------------------------------------------------------------

    def _handle(self, packet: MqttPacket, actions: list[Action]) -> bool:
        """Add what ``packet`` calls for to ``actions``; whether the connection is now closed."""
        self._dispatch(packet, actions)
        return self._closed

    def _dispatch(self, packet: MqttPacket, actions: list[Action]) -> None:
        if isinstance(packet, Publish):
            self._publish(packet, actions)
        elif isinstance(packet, Puback):
            self._acknowledged(packet.packet_id, actions)
        elif isinstance(packet, Connect):
            self._connect(packet, actions)
        elif isinstance(packet, Pingreq):
            actions.append(Send(encode_mqtt(Pingresp(), self._v())))
        elif isinstance(packet, Subscribe):
            self._subscribe(packet, actions)
        elif isinstance(packet, Unsubscribe):
            self._unsubscribe(packet, actions)
        elif isinstance(packet, Pubrel):
            found = packet.packet_id in self.awaiting_release
            self.awaiting_release.discard(packet.packet_id)
            reason = 0 if found or self._v() is MqttVersion.V311 else 0x92
            pubcomp = encode_mqtt(Pubcomp(packet.packet_id, reason), self._v())
            actions.append(Released(packet.packet_id, pubcomp) if found else Send(pubcomp))
        elif isinstance(packet, Pubrec):  # our QoS 2 delivery reached the device
            packet_id = packet.packet_id
            known = self.inflight.get(packet_id) == 2
            reason = 0 if known or self._v() is MqttVersion.V311 else 0x92
            pubrel = encode_mqtt(Pubrel(packet_id, reason), self._v())
            tag = self._tags.get(packet_id)
            if known and packet_id not in self.released and tag is not None:
                self.released.add(packet_id)
                actions.append(Received(tag, pubrel))
            else:
                if known:
                    self.released.add(packet_id)
                actions.append(Send(pubrel))
        elif isinstance(packet, Pubcomp):
            self._acknowledged(packet.packet_id, actions)
        elif isinstance(packet, Disconnect):
            expiry = packet.properties.session_expiry_interval
            if expiry is not None and expiry and self.session_expiry_s == 0:
                # MQTT-3.14.2-2: a session that ends with its connection cannot be given a life.
                actions.extend(
                    self._violation(
                        MqttReasonCode.PROTOCOL_ERROR, "a session expiry at DISCONNECT after 0"
                    )
                )
                return
            if expiry is not None:
                self.session_expiry_s = _lifetime(expiry)
            # v5: reason 0x04 "Disconnect with Will Message" asks for the Will anyway.
            with_will = packet.reason_code == MqttReasonCode.DISCONNECT_WITH_WILL_MESSAGE
            self._clean_disconnect = not with_will
            actions.extend(self._close("the client disconnected", will=with_will))
        else:  # AUTH: enhanced authentication is not offered (v5 MQTT-3.15.1)
            actions.extend(
                self._violation(
                    MqttReasonCode.PROTOCOL_ERROR, f"unexpected {type(packet).__name__}"
                )
            )

    def _acknowledged(self, packet_id: int, actions: list[Action]) -> None:
        self.inflight.pop(packet_id, None)
        self.released.discard(packet_id)
        tag = self._tags.pop(packet_id, None)
        if tag is not None:
            actions.append(Acked(tag))

    def _connect(self, packet: Connect, actions: list[Action]) -> None:
        version = self._decoder.version
        assert version is not None  # the decoder sets it from the CONNECT it decoded
        self.version = version
        v5 = version is MqttVersion.V5
        client_id = packet.client_id
        assigned = None
        if not client_id:
            if not packet.clean_start and not v5:  # MQTT-3.1.3-8
                actions.extend(self._refuse(ConnackReturnCode.IDENTIFIER_REJECTED, 0x85))
                return
            client_id = "auto-" + secrets.token_hex(8)
            assigned = client_id
        properties = MqttProperties()
        if v5:
            properties = MqttProperties(
                receive_maximum=self.inbound_maximum,
                maximum_packet_size=self._decoder.max_packet_size,
                assigned_client_identifier=assigned,
                topic_alias_maximum=TOPIC_ALIAS_MAXIMUM,
            )
        if packet.properties.authentication_method is not None:
            actions.extend(self._refuse(ConnackReturnCode.NOT_AUTHORIZED, 0x8C))
            return
        if self._credentials_required and (packet.username is None or packet.password is None):
            actions.extend(self._refuse(ConnackReturnCode.BAD_USER_NAME_OR_PASSWORD, 0x86))
            return
        if self._acl_file is not None:
            self.acl = self._acl_file.for_client(packet.username, client_id)
            will = packet.will
            if will is not None and not self.acl.can_publish(will.topic):
                actions.append(Refused("will", will.topic))
                actions.extend(self._refuse(ConnackReturnCode.NOT_AUTHORIZED, 0x87))
                return
        self.client_id = client_id
        self.keep_alive = packet.keep_alive
        self.receive_maximum = packet.properties.receive_maximum or 0xFFFF
        self.maximum_packet_size = packet.properties.maximum_packet_size
        self.connected = True
        self._connack_properties = properties
        expiry = packet.properties.session_expiry_interval
        persistent = bool(expiry) if v5 else not packet.clean_start
        if persistent:
            self.session_expiry_s = _lifetime(expiry) if v5 else None
        password = packet.password if self._credentials_required else None
        actions.append(
            Accepted(
                client_id,
                packet.clean_start,
                packet.will,
                version,
                persistent,
                packet.username,
                password,
            )
        )

    def _publish(self, packet: Publish, actions: list[Action]) -> None:
        if packet.qos > MAX_QOS:  # the decoder refuses QoS 3 already; defensive
            actions.extend(self._violation(MqttReasonCode.MALFORMED_PACKET, "QoS 3"))
            return
        properties = packet.properties  # checked by the decoder (a wildcard Response Topic...)
        topic = packet.topic
        alias = properties.topic_alias
        if alias is not None:  # v5 3.3.2.3.4
            if not 0 < alias <= TOPIC_ALIAS_MAXIMUM:  # MQTT-3.3.2-9
                actions.extend(
                    self._violation(MqttReasonCode.TOPIC_ALIAS_INVALID, f"topic alias {alias}")
                )
                return
            if topic:
                self._aliases[alias] = topic  # set, or replaced
            else:
                found = self._aliases.get(alias)
                if found is None:
                    actions.extend(
                        self._violation(
                            MqttReasonCode.PROTOCOL_ERROR, f"topic alias {alias} is not set"
                        )
                    )
                    return
                topic = found
        retransmission = packet.qos == 2 and packet.packet_id in self.awaiting_release
        if not retransmission and self.acl is not None and not self.acl.can_publish(topic):
            self._refused_publish(packet, topic, actions)
            return
        if packet.qos and not retransmission:
            if self.unanswered >= self.inbound_maximum and self.version is MqttVersion.V5:
                actions.extend(
                    self._violation(
                        MqttReasonCode.RECEIVE_MAXIMUM_EXCEEDED,
                        f"more than {self.inbound_maximum} QoS 1/2 PUBLISHes unanswered",
                    )
                )
                return
            self.unanswered += 1
        if packet.qos == 2:
            ack = encode_mqtt(Pubrec(packet.packet_id), self._v())
            if retransmission:
                # A retransmission of a message already appended: only the PUBREC again
                # (MQTT-4.3.3-9: no second onward delivery).
                actions.append(Send(ack))
                return
            self.awaiting_release.add(packet.packet_id)
        else:
            ack = encode_mqtt_puback(packet.packet_id) if packet.qos == 1 else b""
        actions.append(
            Append(
                topic,
                packet.payload,
                packet.qos,
                packet.retain,
                ack,
                packet.packet_id,
                resend=packet.qos == 1 and packet.dup,
                property_headers=() if properties is NO_PROPERTIES else message_headers(properties),
            )
        )

    def _refused_publish(self, packet: Publish, topic: str, actions: list[Action]) -> None:
        """A PUBLISH the ACL refuses: not appended; acknowledged as the module docstring says.
        (Not counted against Receive Maximum: it is answered at once.)"""
        code = MqttReasonCode.NOT_AUTHORIZED if self._v() is MqttVersion.V5 else 0
        if packet.qos == 1:
            actions.append(Send(encode_mqtt(Puback(packet.packet_id, code), self._v())))
        elif packet.qos == 2:
            # v5: a PUBREC of 0x80 or more ends the exchange; 3.1.1: a PUBREL may follow,
            # answered PUBCOMP as for any id that awaits none.
            actions.append(Send(encode_mqtt(Pubrec(packet.packet_id, code), self._v())))
        actions.append(Refused("publish", topic))

    def _subscribe(self, packet: Subscribe, actions: list[Action]) -> None:
        v5 = self._v() is MqttVersion.V5
        codes: list[int] = []
        granted: list[MqttSubscription] = []
        refused: list[Refused] = []
        identifiers = packet.properties.subscription_identifiers
        identifier = identifiers[0] if identifiers else 0
        for sub in packet.subscriptions:
            try:
                shared = parse_shared_subscription(sub.topic_filter)
            except InvalidMqttTopicError:
                codes.append(MqttReasonCode.TOPIC_FILTER_INVALID if v5 else 0x80)
                continue
            inner = sub.topic_filter if shared is None else shared.topic_filter
            if not is_valid_mqtt_topic_filter(inner) or (shared is not None and sub.no_local):
                codes.append(MqttReasonCode.TOPIC_FILTER_INVALID if v5 else 0x80)
                continue
            if self.acl is not None and not self.acl.can_subscribe(sub.topic_filter):
                codes.append(MqttReasonCode.NOT_AUTHORIZED if v5 else 0x80)
                refused.append(Refused("subscribe", sub.topic_filter))
                continue
            qos = min(sub.qos, MAX_QOS)
            codes.append(qos)
            granted.append(
                MqttSubscription(
                    sub.topic_filter,
                    qos,
                    sub.no_local,
                    sub.retain_as_published,
                    sub.retain_handling,
                    identifier,
                )
            )
        suback = encode_mqtt(Suback(packet.packet_id, tuple(codes)), self._v())
        actions.extend(refused)
        actions.append(Subscribed(tuple(granted), suback) if granted else Send(suback))

    def _unsubscribe(self, packet: Unsubscribe, actions: list[Action]) -> None:
        codes = (0,) * len(packet.topic_filters) if self._v() is MqttVersion.V5 else ()
        actions.append(Send(encode_mqtt(Unsuback(packet.packet_id, codes), self._v())))
        actions.append(Unsubscribed(packet.topic_filters))

    # -- endings --------------------------------------------------------------------------------

    def _v(self) -> MqttVersion:
        assert self.version is not None
        return self.version

    def _refuse(self, v311: ConnackReturnCode, v5: int) -> list[Action]:
        version = self._v()
        code = v5 if version is MqttVersion.V5 else int(v311)
        send = Send(encode_mqtt(Connack(False, code), version))
        return [send, *self._close(f"CONNECT refused ({code:#x})", will=False)]

    def _violation(self, reason: MqttReasonCode, why: str) -> list[Action]:
        actions: list[Action] = []
        if self.version is MqttVersion.V5 and self.connected:
            actions.append(Send(encode_mqtt(Disconnect(reason), self.version)))
        actions.extend(self._close(f"protocol violation: {why}", will=self.connected, error=reason))
        return actions

    def _protocol_error(self, exc: MqttProtocolError) -> list[Action]:
        version = self._decoder.version
        actions: list[Action] = []
        if isinstance(exc, MqttUnsupportedProtocolError):
            # MQTT-3.1.2-2: CONNACK 0x01 in the 3.1.1 format, then close.
            actions.append(Send(encode_mqtt(Connack(False, 0x01), MqttVersion.V311)))
        elif version is MqttVersion.V5 and not self.connected:
            # A malformed CONNECT of a v5 client: CONNACK with the reason code (v5 §4.13.1).
            code = exc.reason_code if exc.reason_code in CONNACK_REASON_CODES else 0x80
            actions.append(Send(encode_mqtt(Connack(False, code), version)))
        elif version is MqttVersion.V5:
            code = exc.reason_code if exc.reason_code in DISCONNECT_REASON_CODES else 0x80
            actions.append(Send(encode_mqtt(Disconnect(code), version)))
        error = exc.reason_code
        actions.extend(self._close(f"protocol violation: {exc}", will=self.connected, error=error))
        return actions

    def _close(self, reason: str, *, will: bool, error: int | None = None) -> list[Action]:
        self._closed = True
        return [Close(reason, will and not self._clean_disconnect, error)]


_NEVER = 0xFFFFFFFF  # a v5 Session Expiry Interval that means "does not expire" (§3.1.2.11.2)


def _lifetime(interval: int | None) -> int | None:
    """A v5 Session Expiry Interval as a lifetime in seconds (None: for ever)."""
    return None if interval == _NEVER else (interval or 0)
