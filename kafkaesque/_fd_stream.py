"""A trio stream over a connected TCP socket's file descriptor: the broker's MQTT devices, its
line-protocol clients and its Raft peers all talk through one.

``trio.SocketStream`` pays on every call for a conflict detector, a context manager that
translates exceptions, and a trip through the scheduler after each successful ``recv`` or
``send``, and each wait for data starts with a ``recv`` that fails with EAGAIN. The broker's
traffic is mostly small messages answered one by one (a reading and its PUBACK, a Raft append
and its answer), so it paid all of that per message. ``python -m bench.device_io`` measures an
echo of small messages: 52 us of CPU per message on ``trio.SocketStream``, 33 us on this stream.

``FdStream`` waits for the socket to be readable and then reads; it writes at once while the
socket has room and waits only when it has none. It yields to the scheduler when it waits, and
after ``_YIELD_BYTES`` written without waiting, so that a long burst does not hold the event
loop. So ``send_all`` is not always a checkpoint, as trio's own streams are: callers that loop
on it must reach one elsewhere (their wait for more to send is).

The other difference from ``trio.SocketStream``'s contract: two tasks receiving (or two
sending) at once are not detected. No caller does that: a connection has one reader and one
writer task, and ``trio.SSLStream`` and ``WebSocketStream`` serialize their own calls to their
transport.
"""

from __future__ import annotations

import os
import socket
from typing import Final

import trio

_RECEIVE_BYTES: Final = 64 * 1024  # when the caller names no size
_YIELD_BYTES: Final = 256 * 1024


class FdStream(trio.abc.Stream):
    """``stream``'s bytes, read and written on its file descriptor (see the module docstring).

    The stream owns ``stream``: close it through ``aclose`` only, never ``stream`` itself.
    Closing marks this object closed, then closes ``stream``, which tells the tasks waiting on
    the descriptor (``trio.ClosedResourceError``); every call checks the mark, so a number the
    kernel gave to a newer socket is never touched.
    """

    def __init__(self, stream: trio.SocketStream) -> None:
        self._stream = stream
        self._socket = stream.socket
        # The descriptor is read once: ``socket.fileno()`` costs two calls, and every read and
        # write needs it (several per message). The number stays ours until ``aclose``, which
        # sets ``_closed`` before it closes the socket.
        self._fileno = stream.socket.fileno()
        self._closed = self._fileno < 0
        self._unyielded = 0  # bytes written since send_all last yielded
        self._kept: list[bytes] = []  # what ``send_now`` could not write yet
        #: Whether ``send_now`` kept bytes that ``send_kept`` has not sent yet (``_kept`` is
        #: not empty). An attribute, not a property: every flush of a connection asks.
        self.kept = False

    def _fd(self) -> int:
        if self._closed:
            raise trio.ClosedResourceError("the stream is closed")
        return self._fileno

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        size = _RECEIVE_BYTES if max_bytes is None else max_bytes
        if size < 1:
            raise ValueError("max_bytes must be >= 1")
        # ``_closed`` is tested inline, not through ``_fd``: a call less per read.
        while True:
            if self._closed:
                raise trio.ClosedResourceError("the stream is closed")
            await trio.lowlevel.wait_readable(self._fileno)
            if self._closed:  # closed while this task was woken but not yet run
                raise trio.ClosedResourceError("the stream is closed")
            try:
                return os.read(self._fileno, size)
            except BlockingIOError:
                continue  # a spurious wake-up: wait again
            except OSError as exc:
                raise trio.BrokenResourceError(f"receive failed: {exc}") from exc

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        with memoryview(data).cast("B") as view:
            total = len(view)
            sent = 0
            while sent < total:
                fd = self._fd()
                try:
                    sent += os.write(fd, view[sent:])
                except BlockingIOError:
                    await trio.lowlevel.wait_writable(fd)
                    self._unyielded = 0
                except OSError as exc:
                    raise trio.BrokenResourceError(f"send failed: {exc}") from exc
        self._unyielded += total
        if self._unyielded >= _YIELD_BYTES:
            self._unyielded = 0
            await trio.lowlevel.cancel_shielded_checkpoint()

    def send_now(self, buffers: list[bytes | memoryview]) -> bool:
        """Write ``buffers`` now, in order, as far as the socket takes them; keep the rest for
        ``send_kept``. True when all was written.

        Never waits. Bytes kept earlier go first, so nothing is written while some are kept.
        Not to be mixed with a ``send_all`` in progress. Raises ``trio.BrokenResourceError``
        if the connection is broken.
        """
        if not self._kept:
            if self._closed:
                raise trio.BrokenResourceError("send failed: the stream is closed")
            try:
                sent = os.writev(self._fileno, buffers)
            except BlockingIOError:
                sent = 0
            except OSError as exc:
                raise trio.BrokenResourceError(f"send failed: {exc}") from exc
            if sent == sum(map(len, buffers)):
                return True
            self._kept.append(b"".join(buffers)[sent:])
        else:
            self._kept.append(b"".join(buffers))
        self.kept = True
        return False

    async def send_kept(self) -> None:
        """Send, waiting as ``send_all`` does, what ``send_now`` kept."""
        while self._kept:
            data = self._kept.pop(0)
            self.kept = bool(self._kept)
            await self.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.wait_writable(self._fd())

    async def send_eof(self) -> None:
        """Half-close: the peer reads the end of the stream after what was sent; receiving
        goes on (``trio.abc.HalfCloseableStream.send_eof``). Raises ``trio.ClosedResourceError``
        once closed, ``trio.BrokenResourceError`` if the connection is broken."""
        self._fd()
        await trio.lowlevel.checkpoint()
        try:
            self._socket.shutdown(socket.SHUT_WR)
        except OSError as exc:
            raise trio.BrokenResourceError(f"send_eof failed: {exc}") from exc

    async def aclose(self) -> None:
        self._closed = True  # first: the descriptor's number may be reused once it is closed
        await self._stream.aclose()


class FdListener(trio.abc.Listener[trio.abc.Stream]):
    """Wraps each connection ``listener`` accepts in an ``FdStream``."""

    def __init__(self, listener: trio.SocketListener) -> None:
        self.listener = listener

    async def accept(self) -> FdStream:
        return FdStream(await self.listener.accept())

    async def aclose(self) -> None:
        await self.listener.aclose()
