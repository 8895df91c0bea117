"""The trio driver of one MQTT connection: one reader task, and a writer task while there is
something to send.

The reader feeds what the socket delivers to the connection's state machine
(``MqttServerConnection``) and performs its actions; the writer sends the outgoing queue in
order, coalescing what is ready into one write. The writer task is started when something is
queued and ends once it has been idle for ``_WRITER_LINGER_S``: an idle device costs one task
(its reader), not two (``python -m bench.conn_memory`` measures a trio task and its stack at
about 3.5 KiB), and a busy one keeps its writer. A PUBACK whose record was committed is written
at once by the task that finished the flight (``wake_writer``) when no writer is sending.

An entry of the queue may wait for a batch of the log (``Flight``): a PUBACK or PUBREC is sent
only once its record is committed by the partition's quorum, and everything queued behind it
waits too, so acknowledgements leave in the order the PUBLISHes came (MQTT-4.6.0-2/-3).

Bounds, so that one device can hurt no one else:

* at most ``MAX_PENDING_ACKS`` acknowledgements wait for the log: the reader then stops reading
  (TCP backpressure) until the writer has sent some;
* at most ``MAX_INFLIGHT`` QoS 1/2 deliveries (or the v5 client's Receive Maximum) wait for the
  device's acknowledgement; later ones wait in the device's own delivery queue;
* above ``MAX_QUEUED_BYTES`` queued the device is behind: QoS 0 deliveries are dropped (and
  counted); if it is still behind ``SLOW_GRACE_S`` later, or its queue reaches
  ``HARD_QUEUED_BYTES``, it is disconnected (its QoS 1/2 messages stay in the log; a persistent
  session gets them again). A burst (a reader hands a whole fetch to the devices at once) puts
  a fast device behind for a moment only.

A write that fails for good (no quorum for the whole write timeout) closes the connection: the
device then resends what was not acknowledged, with DUP set.

A graceful shutdown of the broker (``shut_down``) ends the connection as the server's own
disconnect: nothing more is read, the acknowledgements owed for the PUBLISHes already read go
out as their records commit (a QoS 1 message read before is acknowledged once in the log, or
not at all: never acknowledged and then lost), then an MQTT 5 device gets DISCONNECT 0x8B
"Server shutting down" (v5 §3.14.2.1; MQTT 3.1.1 has no server DISCONNECT: the connection just
closes), and the connection closes. The session, if persistent, lives on as after any end.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Final, NamedTuple, Protocol

import trio

from kafkaesque.fd_stream import FdStream
from kafkaesque.protocol.mqtt import (
    Accepted,
    Acked,
    Action,
    Append,
    Close,
    MqttReasonCode,
    MqttServerConnection,
    MqttSubscription,
    Received,
    Refused,
    Released,
    Send,
    Subscribed,
    Unsubscribed,
    Will,
    seconds_left,
)

from .._appender import Flight
from .._errors import RequestError
from .._metadata_view import TopicInfo

if TYPE_CHECKING:
    from ._resume import CatchUp, Position
    from ._sessions import StoredSession

log = logging.getLogger("kafkaesque.broker.mqtt")

MAX_PENDING_ACKS: Final = 1024
MAX_QUEUED_BYTES: Final = 1 << 20  # beyond it a device is behind (QoS 0 is dropped)
HARD_QUEUED_BYTES: Final = 8 << 20  # beyond it a device is cut off at once
SLOW_GRACE_S: Final = 2.0  # behind for this long: cut off
MAX_INFLIGHT: Final = 1000
_ENTRY_OVERHEAD: Final = 64
_RECEIVE_BYTES: Final = 16 * 1024
_SEND_COALESCE_BYTES: Final = 64 * 1024
_DRAIN_S: Final = 2.0
_CLOSE_S: Final = 1.0  # for a TLS connection's close_notify to go out
_WRITER_LINGER_S: Final = 1.0  # an idle writer task waits this long for more, then ends
# Kinds of entries of the ``out`` queue.
_PLAIN: Final = 0
_ANSWER: Final = 1  # a PUBACK or PUBCOMP: once sent, the client may send one more (conn.answered)
_CLOSE: Final = 2
_HELD: Final = 3  # deliveries that wait for the session to store their packet ids (``holding``)


class _Delivery(NamedTuple):
    """A PUBLISH queued for the device (see ``MqttDevice.deliver``)."""

    topic: str
    payload: bytes
    qos: int
    retain: bool
    where: tuple[str, int, int] | None
    size: int  # what it counts in ``queued_bytes``
    expires_ms: int | None
    identifiers: tuple[int, ...]
    forwarded: tuple[tuple[str, bytes], ...]
    packet_id: int  # a resend of the previous connection's delivery under this id; else 0


class DeviceHost(Protocol):
    """What a device asks of the MQTT service that runs it (``MqttService`` is the one): its
    admission and session, its subscriptions, the appends of its PUBLISHes, and the counters."""

    async def admit(self, device: MqttDevice, accepted: Accepted) -> list[Action] | None: ...
    async def accept(self, device: MqttDevice) -> bool: ...
    async def restore(self, device: MqttDevice) -> None: ...
    def save_session_nowait(self, device: MqttDevice) -> Flight | None: ...
    def closing(self, device: MqttDevice) -> None: ...
    async def device_gone(self, device: MqttDevice) -> None: ...
    async def subscribe(
        self, device: MqttDevice, subscriptions: Iterable[MqttSubscription]
    ) -> None: ...
    def send_retained(
        self, device: MqttDevice, subscriptions: tuple[MqttSubscription, ...]
    ) -> None: ...
    async def unsubscribe(self, device: MqttDevice, topic_filters: Iterable[str]) -> None: ...
    def refused(self, device: MqttDevice, action: str, topic: str) -> None: ...
    async def append_resend(
        self,
        topic: str,
        payload: bytes,
        retain: bool,
        client_id: str,
        packet_id: int,
        property_headers: tuple[tuple[str, bytes], ...] = (),
    ) -> list[Flight] | None: ...
    def append_nowait(
        self,
        topic: str,
        payload: bytes,
        qos: int,
        retain: bool,
        client_id: str = "",
        packet_id: int = 0,
        property_headers: tuple[tuple[str, bytes], ...] = (),
    ) -> list[Flight] | None: ...
    async def ensure_route(self, topic: str, payload: bytes) -> TopicInfo: ...
    def metrics_in(self, nbytes: int) -> None: ...
    def metrics_out(self) -> None: ...
    def dropped(self, count: int) -> None: ...
    def slow_consumer(self) -> None: ...
    def protocol_error(self, code: int) -> None: ...


class MqttDevice:
    """One connected device (see the module docstring). Trio thread only."""

    __slots__ = (
        "accepted",
        "address",
        "behind_since",
        "catching_up",
        "client_id",
        "client_id_bytes",
        "conn",
        "connacked",
        "deliveries",
        "dirty",
        "dropped",
        "frozen",
        "holding",
        "in_order_from",
        "known_epoch",
        "nursery",
        "out",
        "owner_lost",
        "pending",
        "publish_will",
        "queued_bytes",
        "restored",
        "room",
        "saved_subscriptions",
        "scope",
        "service",
        "session_epoch",
        "stream",
        "subscriptions",
        "unacked",
        "username",
        "wake",
        "will",
        "writer_running",
        "writing",
    )

    def __init__(
        self, service: DeviceHost, stream: trio.abc.Stream, conn: MqttServerConnection
    ) -> None:
        self.service = service
        self.stream = stream
        self.conn = conn
        # (flight to wait for, bytes to send then, kind of entry)
        # The queues exist while they hold something: an idle device keeps no deque (each
        # allocates a 64-entry block at once, 0.7 KiB).
        self.out: deque[tuple[Flight | None, bytes, int]] | None = None
        # The writer task: whether it runs, whether it is sending (nobody else may then), and
        # while it lingers idle, the event that wakes it (None: it is not waiting).
        self.writer_running = False
        self.writing = False
        self.wake: trio.Event | None = None
        self.room: trio.Event | None = None  # the reader waits for it (``MAX_PENDING_ACKS``)
        self.pending = 0  # entries waiting for a flight
        self.deliveries: deque[_Delivery] | None = None  # not sent yet
        self.queued_bytes = 0
        self.behind_since: float | None = None  # when the queue went above MAX_QUEUED_BYTES
        self.dropped = 0  # QoS 0 deliveries dropped (slow device)
        self.accepted: Accepted | None = None
        self.address = ""  # the peer's host, for the authentication-failure limiter
        self.username: str | None = None  # the CONNECT's, once its credentials passed
        self.connacked = False  # the CONNACK of ``accepted`` is queued
        self.client_id: str | None = None
        self.client_id_bytes: bytes | None = None  # as records carry it (No Local)
        self.will: Will | None = None
        self.publish_will = False
        self.subscriptions: dict[str, MqttSubscription] = {}
        # A persistent session (see ``_sessions``): its epoch, None for a clean one.
        self.session_epoch: int | None = None
        self.restored: StoredSession | None = None  # the session found at CONNECT
        self.unacked: dict[Position, set[int]] = {}  # offsets delivered, not yet acknowledged
        # The partitions whose deliveries a resumed session catches up on (``_resume``): live
        # deliveries from them wait until it reaches the live readers.
        self.catching_up: dict[Position, CatchUp] = {}
        # Per partition of a resumed session, from where its deliveries go in offset order.
        self.in_order_from: dict[Position, int] = {}
        self.dirty = False  # acknowledgements since the session was last saved
        # The subscriptions of the session's last record known committed (None: unknown).
        self.saved_subscriptions: frozenset[MqttSubscription] | None = None
        self.owner_lost = False  # another broker took the session over
        self.known_epoch = 0  # the session epoch this connection owns or has superseded
        self.frozen: StoredSession | None = None  # the session's state when the connection ended
        # New QoS 2 deliveries of a persistent session wait in ``out`` for the session to store
        # their packet ids, and no delivery is sent meanwhile (``_ready_bytes``).
        self.holding = False
        self.scope: trio.CancelScope | None = None  # the reader's and writer's, once started
        self.nursery: trio.Nursery | None = None  # where the writer starts, while it may

    # -- the connection's life ------------------------------------------------------------------

    async def serve(self) -> None:
        """Run the connection to its end; afterwards: unregister, publish the Will if due."""
        try:
            async with trio.open_nursery() as nursery:
                self.scope = nursery.cancel_scope
                self.nursery = nursery
                try:
                    await self._read_loop()
                    with trio.move_on_after(_DRAIN_S):
                        while self.out:  # let the writer send what was queued before the end
                            await trio.sleep(0.01)
                finally:
                    self.nursery = None  # nothing is sent any more
                    nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                # A TLS close sends close_notify, which a device that stopped reading would
                # hold up: it gets a moment, then the socket is closed anyway.
                with trio.move_on_after(_CLOSE_S):
                    await self.stream.aclose()
                await trio.aclose_forcefully(self.stream)
                await self.service.device_gone(self)

    async def _read_loop(self) -> None:
        conn = self.conn
        stream = self.stream
        while not conn.closed:
            if self.pending >= MAX_PENDING_ACKS:
                self.room = trio.Event()
                await self.room.wait()
                self.room = None
            try:
                data = await stream.receive_some(_RECEIVE_BYTES)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if not data:
                actions = conn.connection_lost()
            else:
                actions = conn.receive(data, trio.current_time())
                self.service.metrics_in(len(data))
                if self.deliveries:  # acknowledgements may have opened the window
                    self.kick()
            await self._perform(actions)

    async def _perform(self, actions: list[Action]) -> None:
        for at, action in enumerate(actions):
            if type(action) is Append:
                await self._append(action)
            elif type(action) is Send:
                self.send(action.data)
            elif type(action) is Acked:
                assert isinstance(action.tag, tuple)
                self._settled(action.tag)
            elif type(action) is Accepted:
                self.accepted = action
                refusal = await self.service.admit(self, action)
                if refusal is not None or self.conn.closed:
                    # Refused (or the broker stops, or what followed the CONNECT in the same
                    # read broke the protocol): nothing the client sent after its CONNECT is
                    # performed; a protocol violation among it is still counted.
                    self.perform_nowait(refusal or [])
                    for later in actions[at + 1 :]:
                        if type(later) is Close and later.error is not None:
                            self.service.protocol_error(later.error)
                    return
                self.username = action.username
                self.client_id = action.client_id
                self.client_id_bytes = action.client_id.encode()
                self.will = action.will
                present = await self.service.accept(self)
                self.send(self.conn.connack(present))
                self.connacked = True
                await self.service.restore(self)
            elif type(action) is Subscribed:
                # v5 Retain Handling 1: retained messages only for a subscription that is new.
                fresh = tuple(
                    s
                    for s in action.subscriptions
                    if s.retain_handling != 1 or s.topic_filter not in self.subscriptions
                )
                await self.service.subscribe(self, action.subscriptions)
                self.send(action.suback)
                self.service.send_retained(self, fresh)
            elif type(action) is Released:
                # A persistent session stores the id as free before the PUBCOMP goes.
                saved = self.service.save_session_nowait(self)
                self._queue().append((saved, action.pubcomp, _ANSWER))
                self.pending += saved is not None
                self.kick()
            elif type(action) is Received:
                # A persistent session stores that the PUBREC came before the PUBREL goes: a
                # reconnect, even after this broker crashed, then continues with PUBREL and
                # never sends the message again (which the device would take as a new one).
                saved = self.service.save_session_nowait(self)
                self._queue().append((saved, action.pubrel, _PLAIN))
                self.pending += saved is not None
                self.kick()
            elif type(action) is Unsubscribed:
                await self.service.unsubscribe(self, action.topic_filters)
            elif type(action) is Close:
                self._close(action)
            elif type(action) is Refused:
                self.service.refused(self, action.action, action.topic)

    def shut_down(self) -> None:
        """The broker is stopping (``Draining.begin``): end the connection as the module
        docstring says. Never waits, never raises. The reader, if it waits for bytes, sees the
        stream closed once the writer has sent the rest; a PUBLISH that arrives meanwhile is
        dropped unacknowledged (the state machine takes nothing after its ``Close``).

        A CONNECT accepted but not answered yet (its session is being looked up) is refused
        with CONNACK "Server unavailable" instead: a DISCONNECT may not come before the
        CONNACK, and the CONNACK queued behind the close is never sent."""
        if self.accepted is not None and not self.connacked:
            self.perform_nowait(self.conn.unavailable())
            return
        self.perform_nowait(
            self.conn.server_disconnect(
                MqttReasonCode.SERVER_SHUTTING_DOWN, "the server is shutting down"
            )
        )

    def expire(self, now: float) -> bool:
        """Nothing arrived before the connection's deadline (``MqttService`` watches them all):
        close it as the state machine says, then cut it ``_DRAIN_S`` later if the writer is still
        stuck on a device that does not read. Whether it was closed now (not before)."""
        actions = self.conn.expired(now)
        self.perform_nowait(actions)
        if self.scope is not None:
            self.scope.deadline = min(self.scope.deadline, now + _DRAIN_S)
        return bool(actions)

    def perform_nowait(self, actions: list[Action]) -> None:
        """Perform ``Send``, ``Close`` and ``Refused`` actions (those of a server-side
        disconnect or a refused CONNECT)."""
        for action in actions:
            if type(action) is Send:
                self.send(action.data)
            elif type(action) is Close:
                self._close(action)
            elif type(action) is Refused:
                self.service.refused(self, action.action, action.topic)

    def _close(self, action: Close) -> None:
        log.debug("mqtt %s: closing: %s", self.client_id, action.reason)
        if action.error is not None:
            self.service.protocol_error(action.error)
        self.publish_will = action.will
        self.service.closing(self)
        self._queue().append((None, b"", _CLOSE))
        self.kick()

    async def _append(self, action: Append) -> None:
        service = self.service
        client = self.client_id or ""
        try:
            for attempt in range(2):  # once more after creating a missing log topic
                if action.resend and client:
                    flights = await service.append_resend(
                        action.topic,
                        action.payload,
                        action.retain,
                        client,
                        action.packet_id,
                        action.property_headers,
                    )
                else:
                    flights = service.append_nowait(
                        action.topic,
                        action.payload,
                        action.qos,
                        action.retain,
                        client,
                        action.packet_id,
                        action.property_headers,
                    )
                if flights is not None or attempt:
                    break
                await service.ensure_route(action.topic, action.payload)
        except RequestError as exc:
            log.info("mqtt %s: a PUBLISH could not be appended: %s", self.client_id, exc)
            flights = None
        if flights is None:
            self.perform_nowait(
                self.conn.server_disconnect(
                    MqttReasonCode.SERVER_UNAVAILABLE, "the log topic is not available"
                )
            )
            return
        if action.qos == 0:
            return
        if action.qos == 2:
            # A persistent session stores the id as awaiting its PUBREL before the PUBREC goes:
            # a retransmission through another broker is then not appended again.
            saved = self.service.save_session_nowait(self)
            if saved is not None:
                flights = [saved, *flights]
        idle = not self.out
        for flight in flights[:-1]:
            self._queue().append((flight, b"", _PLAIN))
        self._queue().append((flights[-1], action.ack, _ANSWER if action.qos == 1 else _PLAIN))
        self.pending += len(flights)
        if idle:  # else the writer is busy, or waits for the flight of an entry ahead
            flights[0].notify(self.wake_writer)

    # -- output ---------------------------------------------------------------------------------

    def _queue(self) -> deque[tuple[Flight | None, bytes, int]]:
        """The ``out`` queue, created if there is none."""
        out = self.out
        if out is None:
            out = self.out = deque()
        return out

    def has_room(self) -> bool:
        """Whether a redelivery may queue more without making the device look slow."""
        return self.queued_bytes < MAX_QUEUED_BYTES // 2

    def send(self, data: bytes) -> None:
        self._queue().append((None, data, _PLAIN))
        self.kick()

    def deliver(
        self,
        topic: str,
        payload: bytes,
        qos: int,
        retain: bool = False,
        where: tuple[str, int, int] | None = None,
        expires_ms: int | None = None,
        identifiers: tuple[int, ...] = (),
        forwarded: tuple[tuple[str, bytes], ...] = (),
        packet_id: int = 0,
    ) -> None:
        """Queue a PUBLISH to the device, or drop it / disconnect a slow device.

        ``where`` (log topic, partition, offset) is the record's place in the log: a persistent
        session remembers QoS 1/2 deliveries until acknowledged, to resume from there.
        ``expires_ms`` (wall-clock milliseconds) ends a v5 Message Expiry Interval: an expired
        message is not sent (MQTT-3.3.2-5), and the rest of the interval goes with it.
        ``identifiers``: the v5 Subscription Identifiers of the subscriptions it matched;
        ``forwarded``: the record's headers that carry its v5 properties (Response Topic...).
        ``packet_id``: a resend under the id the session's previous connection sent it with
        (``MqttServerConnection.resume`` reserved it).
        """
        if self.conn.closed or (expires_ms is not None and expires_ms <= now_ms()):
            return
        acl = self.conn.acl
        if acl is not None and not acl.can_receive(topic):
            # (A granted subscription matches only topics its client may receive; a session's
            # subscriptions restored for another user, or a shared group's, may not.)
            self.service.refused(self, "receive", topic)
            return
        size = len(payload) + len(topic) + _ENTRY_OVERHEAD
        for name, value in forwarded:
            size += len(name) + len(value)
        queued = self.queued_bytes + size
        if queued > MAX_QUEUED_BYTES:
            if qos == 0:
                self.dropped += 1
                self.service.dropped(1)
                return
            if queued > HARD_QUEUED_BYTES:
                self.cut_off()
                return
            if self.behind_since is None:
                self.behind_since = trio.current_time()
        if qos > 0 and where is not None and self.session_epoch is not None:
            self.unacked.setdefault((where[0], where[1]), set()).add(where[2])
        else:
            where = None
        if self.deliveries is None:
            self.deliveries = deque()
        self.deliveries.append(
            _Delivery(
                topic,
                payload,
                qos,
                retain,
                where,
                size,
                expires_ms,
                identifiers,
                forwarded,
                packet_id,
            )
        )
        self.queued_bytes += size
        self.kick()

    def cut_off(self) -> None:
        """Disconnect the device: it does not keep up with its messages."""
        if self.conn.closed:
            return
        self.service.slow_consumer()
        self.perform_nowait(
            self.conn.server_disconnect(MqttReasonCode.QUOTA_EXCEEDED, "slow consumer")
        )

    def kick(self) -> None:
        """Something was queued: the writer sends it (woken if it lingers, started if it does
        not run; one that is sending takes it in its next pass). Nothing once the connection's
        tasks ended."""
        if self.writer_running:
            if self.wake is not None:
                self.wake.set()
            return
        if self.nursery is None:
            return
        self.writer_running = True
        self.nursery.start_soon(self._write_loop)

    def wake_writer(self) -> None:
        """A flight this connection waits for is done: send what it freed (its PUBACK, mostly).

        Written from here, by the task that finished the flight, when the writer task is idle
        and the socket takes it all: under load the writer's pass of the scheduler, which runs
        every ready connection's task, is what a PUBACK waited for. Else the writer's job.
        """
        stream = self.stream
        if self.writing or type(stream) is not FdStream or stream.kept:
            self.kick()
            return
        buf = self._ready_bytes()
        if buf is None:  # the connection ends here: the writer closes it
            self._queue().appendleft((None, b"", _CLOSE))
            self.kick()
            return
        if not buf:
            return
        try:
            if not stream.send_now([buf]):
                self.kick()  # the socket is full: the writer sends the rest
        except trio.BrokenResourceError:
            if self.scope is not None:
                self.scope.cancel()  # the peer is gone: the reader stops too
            return
        self.service.metrics_out()

    async def _write_loop(self) -> None:
        """Send what is ready, until nothing more came for ``_WRITER_LINGER_S`` (see ``kick``).

        Between the pass that found nothing ready and the wait for more there is no checkpoint:
        whatever is queued from then on wakes the wait (``kick``), and a flight that gates the
        rest calls ``wake_writer`` when it is done."""
        stream = self.stream
        try:
            while True:
                self.writing = True
                if isinstance(stream, FdStream):
                    await stream.send_kept()
                while True:
                    buf = self._ready_bytes()
                    if buf is None:  # the connection ends here
                        await stream.aclose()
                        return
                    if not buf:
                        break
                    await stream.send_all(buf)
                    self.service.metrics_out()
                self.writing = False
                self.wake = wake = trio.Event()
                with trio.move_on_after(_WRITER_LINGER_S):
                    await wake.wait()
                self.wake = None
                if not wake.is_set():
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            if self.scope is not None:
                self.scope.cancel()  # the peer is gone: the reader stops too
        finally:
            self.writing = False
            self.writer_running = False
            self.wake = None
            if self.room is not None:
                self.room.set()

    def _ready_bytes(self) -> bytes | None:
        """What can be sent now (b"" if nothing), or None to close after sending nothing more.

        Acknowledgements go in the order of the PUBLISHes, each once its record is committed;
        deliveries go in their order too, while the device's in-flight window has room.
        """
        buf: list[bytes] = []
        size = 0
        out = self.out
        while out and size < _SEND_COALESCE_BYTES:
            flight, data, kind = out[0]
            if flight is not None and not flight.done.is_set():
                flight.notify(self.wake_writer)
                break
            out.popleft()
            if flight is not None:
                self.pending -= 1
                if self.pending < MAX_PENDING_ACKS // 2 and self.room is not None:
                    self.room.set()
                if flight.error is not None:
                    self._write_failed(flight.error)
                    continue
            if kind == _ANSWER:
                self.conn.answered()
            elif kind == _HELD:
                self.holding = False
            elif kind == _CLOSE:
                if buf:  # send these first; the close entry is handled on the next call
                    out.appendleft((None, b"", _CLOSE))
                    break
                return None
            if data:
                buf.append(data)
                size += len(data)
        conn = self.conn
        window = min(MAX_INFLIGHT, conn.receive_maximum)
        deliveries = self.deliveries
        held: list[bytes] = []  # from the first new QoS 2 delivery of a persistent session on
        while deliveries and size < _SEND_COALESCE_BYTES and not conn.closed and not self.holding:
            d = deliveries[0]
            if d.qos > 0 and not d.packet_id and len(conn.inflight) >= window:
                break  # the device's acknowledgements wake the writer (a resend has its id)
            deliveries.popleft()
            self.queued_bytes -= d.size
            if d.packet_id and not conn.reserved(d.packet_id, d.where):
                continue  # acknowledged before it was resent
            expiry_s = None
            if d.expires_ms is not None:
                expiry_s = seconds_left(d.expires_ms, now_ms())
                if expiry_s is None:  # expired while queued: not sent (MQTT-3.3.2-5)
                    if d.packet_id:
                        conn.forget(d.packet_id)
                    if d.where is not None:
                        self._settled(d.where)
                    continue
            publish = conn.deliver(
                d.topic,
                d.payload,
                d.qos,
                d.retain,
                d.where,
                expiry_s,
                d.identifiers,
                d.forwarded,
                d.packet_id,
            )
            if publish:
                if d.qos == 2 and d.where is not None and not d.packet_id:
                    held.append(publish)  # (``where``: only a persistent session's has it)
                elif held:
                    held.append(publish)  # behind it, in order
                else:
                    buf.append(publish)
                size += len(publish)
            elif publish is not None:  # too large for the device: dropped, as if delivered
                self.dropped += 1
                self.service.dropped(1)
                if d.where is not None:
                    self._settled(d.where)
        if held:
            self._hold(held, buf)
        if self.queued_bytes <= MAX_QUEUED_BYTES:
            self.behind_since = None
        if not self.deliveries:
            self.deliveries = None
        if not self.out:
            self.out = None
        return b"".join(buf)

    def _hold(self, held: list[bytes], buf: list[bytes]) -> None:
        """New QoS 2 deliveries (and what follows them) go once the session has stored their
        packet ids: a reconnect, even after this broker crashed, then resends each under its
        id, which a device that has it already answers without taking it twice (MQTT-4.3.3)."""
        saved = self.service.save_session_nowait(self)
        if saved is None:
            buf.extend(held)
            return
        self.holding = True
        self._queue().append((saved, b"".join(held), _HELD))
        self.pending += 1
        if len(self._queue()) == 1:  # else an entry ahead of it waits for its own flight
            saved.notify(self.wake_writer)

    def _settled(self, where: tuple[str, int, int]) -> None:
        """The delivery of the record at ``where`` needs no acknowledgement any more (it was
        acknowledged, expired, or was too large to send): the session stops waiting for it."""
        offsets = self.unacked.get(where[:2])
        if offsets is not None:
            offsets.discard(where[2])
        self.dirty = True

    def _write_failed(self, error: RequestError) -> None:
        log.info("mqtt %s: a write failed (%s): disconnecting", self.client_id, error.message)
        self.perform_nowait(
            self.conn.server_disconnect(MqttReasonCode.UNSPECIFIED_ERROR, "a write failed")
        )


def now_ms() -> int:
    """Wall-clock milliseconds: records' timestamps, and so message expiry, are in these."""
    return int(time.time() * 1000)
