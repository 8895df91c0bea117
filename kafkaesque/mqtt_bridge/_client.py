"""Trio driver of ``MqttClientCore``: one live connection to an upstream MQTT broker.

    async with open_mqtt_client(options) as client:
        await client.subscribe([MqttSubscription("$share/g/phones/+/spectrum", qos=1)])
        async for publish in client.messages:
            ...                                  # process it, then
            await client.ack(publish)            # PUBACK (in arrival order, see the core)
        await client.publish("phones/p7/commands", b"{...}")   # returns after the PUBACK

The connection's reader and keep-alive tasks run in a nursery the ``async with`` owns: when the
connection fails (``MqttConnectionError``, or an ``OSError`` from the socket) the error leaves the
``async with``; reconnecting, with backoff, is the caller's loop (``connect_with_backoff`` helps),
so every retry starts from a fresh core and a fresh session view. A clean exit sends DISCONNECT;
QoS 1 messages not acknowledged by then stay unacknowledged upstream and are redelivered on the
next connection of the (persistent) session.
"""

from __future__ import annotations

import math
import ssl
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager

import trio

from kafkaesque.protocol.mqtt import (
    NO_PROPERTIES,
    Connected,
    MessageReceived,
    MqttClientCore,
    MqttClientEvent,
    MqttClientOptions,
    MqttConnectionError,
    MqttProperties,
    MqttSubscription,
    Publish,
    PublishAcked,
    SubscribeAcked,
)

_READ_SIZE = 65536


class Ticket:
    """One SUBSCRIBE or QoS 1 PUBLISH waiting for its answer (or for the connection to end)."""

    __slots__ = ("event", "result")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.result: tuple[int, ...] | None = None


class MqttClient:
    """A connected client; made by ``open_mqtt_client``, valid inside its ``async with``."""

    def __init__(self, core: MqttClientCore, stream: trio.abc.Stream, connected: Connected):
        self._core = core
        self._stream = stream
        self.connected_event = connected
        self._send_lock = trio.Lock()
        self._waiters: dict[int, Ticket] = {}
        self._room = trio.Event()  # set when a QoS 1 publish slot frees up
        # Inbound messages wait here for the consumer. When it is full the reader waits, and TCP
        # flow control holds the server back: some servers (mosquitto 2.0) send more than the
        # receive maximum we announce, so that alone cannot bound the buffer.
        size = core.options.receive_maximum
        self._inbox_send, self._inbox = trio.open_memory_channel[Publish](size)
        self._closed_reason: BaseException | None = None
        self._closing = False  # we sent DISCONNECT: the server's EOF is expected

    @property
    def session_present(self) -> bool:
        """The server still had our session (subscriptions and queued messages)."""
        return self.connected_event.session_present

    @property
    def unacked_inbound(self) -> int:
        return self._core.unacked_inbound

    async def subscribe(self, subscriptions: Iterable[MqttSubscription]) -> tuple[int, ...]:
        """SUBSCRIBE and wait for the SUBACK; returns its reason codes (>= 0x80: refused)."""
        async with self._send_lock:
            packet_id, data = self._core.subscribe(subscriptions)
            waiter = self._waiters[packet_id] = Ticket()
            await self._send(data)
        return await self._wait(waiter)

    async def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> int:
        """PUBLISH QoS 1 and wait for the PUBACK; returns its reason code (>= 0x80: refused).

        Several tasks may publish at once (up to the server's receive maximum in flight); each
        call's PUBLISH is sent in call order. Raises ``MqttConnectionError`` if the connection
        ends first (the message may or may not have reached the server).
        """
        waiter = await self.start_publish(topic, payload, retain=retain)
        return await self.wait_published(waiter)

    async def start_publish(
        self,
        topic: str,
        payload: bytes,
        *,
        retain: bool = False,
        properties: MqttProperties = NO_PROPERTIES,
    ) -> Ticket:
        """Send a QoS 1 PUBLISH now (``properties`` under v5 only); ``wait_published`` the
        returned ticket for its PUBACK."""
        while not self._core.can_publish():
            self._check_open()
            await self._room.wait()
        async with self._send_lock:
            packet_id, data = self._core.publish(
                topic, payload, qos=1, retain=retain, properties=properties
            )
            waiter = self._waiters[packet_id] = Ticket()
            await self._send(data)
        return waiter

    async def wait_published(self, ticket: Ticket) -> int:
        """The PUBACK reason code of a ``start_publish`` ticket."""
        return (await self._wait(ticket))[0]

    async def ack(self, *publishes: Publish) -> None:
        """Acknowledge inbound messages (no-op for QoS 0); PUBACKs leave in arrival order,
        those of one call in one write."""
        async with self._send_lock:
            data = b"".join(self._core.ack(p.packet_id) for p in publishes if p.qos)
            if data:
                await self._send(data)

    @property
    def messages(self) -> trio.MemoryReceiveChannel[Publish]:
        """Inbound PUBLISHes in arrival order; the channel ends when the connection does (then
        ``raise_if_closed`` raises why)."""
        return self._inbox

    def raise_if_closed(self) -> None:
        """Raise ``MqttConnectionError`` if the connection has ended."""
        self._check_open()

    async def _send(self, data: bytes) -> None:
        # Callers hold _send_lock: bytes of one packet are never interleaved with another's.
        await self._stream.send_all(data)
        self._core.note_sent(trio.current_time())

    async def _wait(self, waiter: Ticket) -> tuple[int, ...]:
        await waiter.event.wait()
        if waiter.result is None:
            self._check_open()
            raise MqttConnectionError("the connection ended before the answer")
        return waiter.result

    def _check_open(self) -> None:
        if self._closed_reason is not None:
            raise MqttConnectionError(
                f"the connection ended: {self._closed_reason}"
            ) from self._closed_reason

    async def _dispatch(self, event: MqttClientEvent) -> None:
        if isinstance(event, MessageReceived):
            try:  # no checkpoint per message while the inbox has room (bench.bridge)
                self._inbox_send.send_nowait(event.publish)
            except trio.WouldBlock:
                await self._inbox_send.send(event.publish)
        elif isinstance(event, PublishAcked | SubscribeAcked):
            waiter = self._waiters.pop(event.packet_id, None)
            if waiter is not None:
                if isinstance(event, PublishAcked):
                    waiter.result = (event.reason_code,)
                else:
                    waiter.result = event.reason_codes
                waiter.event.set()
            self._room.set()  # wakes every publisher waiting for room; they check again
            self._room = trio.Event()

    async def _reader(self, early: list[MqttClientEvent]) -> None:
        try:
            for event in early:  # what came in the CONNACK's read
                await self._dispatch(event)
            while True:
                data = await self._stream.receive_some(_READ_SIZE)
                if not data:
                    if self._closing:
                        return
                    raise MqttConnectionError("the server closed the connection")
                for event in self._core.receive_data(data):
                    await self._dispatch(event)
        except trio.ClosedResourceError:
            # The keep-alive task closed the inbox while we waited to fill it: its error ends
            # the connection.
            if self._closed_reason is None:
                raise
        except (MqttConnectionError, trio.BrokenResourceError, OSError) as exc:
            self._close(exc)
            if self._closing:
                return
            raise

    async def _keep_alive(self) -> None:
        while True:
            due = self._core.next_tick_at()
            await trio.sleep_until(math.inf if due is None else due)
            async with self._send_lock:
                try:
                    data = self._core.tick(trio.current_time())
                except MqttConnectionError as exc:
                    self._close(exc)
                    raise
                if data:
                    await self._send(data)

    def _close(self, reason: BaseException) -> None:
        if self._closed_reason is None:
            self._closed_reason = reason
        self._inbox_send.close()
        for waiter in self._waiters.values():
            waiter.event.set()
        self._waiters.clear()
        self._room.set()


async def _handshake(
    core: MqttClientCore, stream: trio.abc.Stream
) -> tuple[Connected, list[MqttClientEvent]]:
    """Send CONNECT, read until CONNACK; returns it and the events that came in the same reads
    (a kept session's queued messages follow the CONNACK at once)."""
    await stream.send_all(core.connect_bytes())
    core.note_sent(trio.current_time())
    while True:
        data = await stream.receive_some(_READ_SIZE)
        if not data:
            raise MqttConnectionError("the server closed the connection before CONNACK")
        events = core.receive_data(data)
        if events:
            first = events[0]
            if not isinstance(first, Connected):  # the core refuses anything before CONNACK
                raise MqttConnectionError("the server did not answer CONNECT with CONNACK")
            return first, events[1:]


async def _tls_handshake(
    tcp: trio.abc.Stream, context: ssl.SSLContext, host: str
) -> trio.SSLStream[trio.abc.Stream]:
    """``tcp`` wrapped in TLS, the handshake done (closed on failure)."""
    stream = trio.SSLStream(tcp, context, server_hostname=host)
    try:
        await stream.do_handshake()
    except trio.BrokenResourceError as exc:
        await trio.aclose_forcefully(tcp)
        cause = exc.__cause__
        raise MqttConnectionError(f"TLS handshake with {host} failed: {cause or exc}") from exc
    except BaseException:
        await trio.aclose_forcefully(tcp)
        raise
    return stream


@asynccontextmanager
async def open_mqtt_client(options: MqttClientOptions) -> AsyncIterator[MqttClient]:
    """Connect, send CONNECT, wait for CONNACK (within ``options.connect_timeout_s``).

    With ``options.tls`` the connection is TLS (the handshake within the connect timeout too).
    Raises ``MqttConnectionError`` when the server refuses or breaks the protocol or its TLS
    certificate does not verify, ``OSError`` when it cannot be reached. Once connected, a
    failing connection (``MqttConnectionError``, ``OSError``, ``trio.BrokenResourceError``)
    cancels the body and leaves the ``async with`` inside an ``ExceptionGroup`` (the
    connection's tasks run in a nursery): catch with ``except*``. A normal exit sends
    DISCONNECT (waiting at most a second for the send).
    """
    core = MqttClientCore(options, now=trio.current_time())
    try:
        with trio.fail_after(options.connect_timeout_s):
            stream: trio.abc.Stream = await trio.open_tcp_stream(options.host, options.port)
            if options.tls is not None:
                stream = await _tls_handshake(stream, options.tls, options.host)
    except trio.TooSlowError:
        raise MqttConnectionError("connecting timed out") from None
    async with stream:
        try:
            with trio.fail_after(options.connect_timeout_s):
                connected, early = await _handshake(core, stream)
        except trio.TooSlowError:
            raise MqttConnectionError("no CONNACK in time") from None
        client = MqttClient(core, stream, connected)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client._reader, early)
            nursery.start_soon(client._keep_alive)
            yield client
            if core.connected:
                client._closing = True
                async with client._send_lock:
                    with trio.move_on_after(1):
                        await stream.send_all(core.disconnect_bytes())
            nursery.cancel_scope.cancel()
