"""MQTT over WebSocket (MQTT 5.0 and 3.1.1, chapter 6), for browsers and apps that can only open
WebSockets: a ``trio.abc.Stream`` of the MQTT bytes carried by one WebSocket connection.

The HTTP upgrade is read on the first ``receive_some`` (as ``trio.SSLStream`` does its
handshake), so the device's CONNECT timeout bounds it too. The client must offer the ``mqtt``
subprotocol, which the answer selects (MQTT-6.0.0-3, -4); MQTT bytes travel in binary messages,
split or joined as the sender likes (MQTT-6.0.0-2); a text message closes the connection
(MQTT-6.0.0-1). Any path is accepted, as mosquitto does. The WebSocket state machine is
wsproto's (sans-I/O, like h11).
"""

from __future__ import annotations

from typing import Final

import trio
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Event,
    Ping,
    RejectConnection,
    Request,
    TextMessage,
)
from wsproto.utilities import LocalProtocolError, RemoteProtocolError

SUBPROTOCOL: Final = "mqtt"
_RECEIVE_BYTES: Final = 64 * 1024
_UNSUPPORTED_DATA: Final = 1003  # RFC 6455 close code: a text frame where binary is required


class WebSocketStream(trio.abc.Stream):
    """The MQTT bytes of the WebSocket connection on ``transport`` (the server side).

    One task may receive while another sends, as with any trio stream. A peer that breaks the
    WebSocket protocol, offers no ``mqtt`` subprotocol or sends text ends the stream with
    ``trio.BrokenResourceError``.
    """

    def __init__(self, transport: trio.abc.Stream) -> None:
        self._transport = transport
        #: The stream under the WebSocket (for ``peer_address``): do not read or write it.
        self.transport = transport
        self._ws = WSConnection(ConnectionType.SERVER)
        self._send_lock = trio.Lock()  # the reader answers pings while the writer sends
        self._open = False  # the upgrade was accepted
        self._ended = False  # a close frame or the end of the TCP stream was seen
        self._pending = bytearray()  # MQTT bytes received, not returned yet

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        while not self._pending:
            if self._ended:
                return b""
            data = await self._transport.receive_some(_RECEIVE_BYTES)
            if not data:
                self._ended = True
                return b""
            self._ws.receive_data(bytes(data))
            try:
                for event in self._ws.events():
                    await self._handle(event)
            except (RemoteProtocolError, LocalProtocolError) as exc:
                raise trio.BrokenResourceError(f"WebSocket: {exc}") from exc
        size = len(self._pending) if max_bytes is None else min(max_bytes, len(self._pending))
        out = bytes(self._pending[:size])
        del self._pending[:size]
        return out

    async def _handle(self, event: Event) -> None:
        match event:
            case Request(subprotocols=offered):
                if SUBPROTOCOL not in offered:
                    await self._send(RejectConnection(status_code=400))
                    raise trio.BrokenResourceError("WebSocket: no 'mqtt' subprotocol offered")
                await self._send(AcceptConnection(subprotocol=SUBPROTOCOL))
                self._open = True
            case BytesMessage(data=data):
                self._pending += data
            case TextMessage():
                self._ended = True
                await self._send(CloseConnection(_UNSUPPORTED_DATA, "MQTT travels in binary"))
                raise trio.BrokenResourceError("WebSocket: a text message (MQTT-6.0.0-1)")
            case Ping():
                await self._send(event.response())
            case CloseConnection():
                self._ended = True
                await self._send(event.response())

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if not self._open:
            raise trio.BrokenResourceError("WebSocket: not open")
        await self._send(BytesMessage(data=bytes(data)))

    async def _send(self, event: Event) -> None:
        try:
            wire = self._ws.send(event)
        except LocalProtocolError as exc:  # e.g. sending after the close
            raise trio.BrokenResourceError(f"WebSocket: {exc}") from exc
        async with self._send_lock:
            await self._transport.send_all(wire)

    async def wait_send_all_might_not_block(self) -> None:
        await self._transport.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        """Send a close frame (if the connection is open and not closing), then close TCP."""
        try:
            if self._open and not self._ended:
                self._ended = True
                await self._send(CloseConnection(1000))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the peer is gone already: nothing to say goodbye to
        finally:
            await self._transport.aclose()


class WebSocketListener(trio.abc.Listener[trio.abc.Stream]):
    """Wraps each connection ``listener`` accepts in a ``WebSocketStream`` (as
    ``trio.SSLListener`` does with TLS)."""

    def __init__(self, listener: trio.abc.Listener[trio.abc.Stream]) -> None:
        self.transport_listener = listener

    async def accept(self) -> WebSocketStream:
        return WebSocketStream(await self.transport_listener.accept())

    async def aclose(self) -> None:
        await self.transport_listener.aclose()
