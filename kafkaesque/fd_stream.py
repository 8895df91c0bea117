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

import contextlib
import functools
import os
import socket
import ssl
from collections.abc import Callable
from typing import Final, TypeVar

import trio

_RECEIVE_BYTES: Final = 64 * 1024  # when the caller names no size
_YIELD_BYTES: Final = 256 * 1024
_T = TypeVar("_T")


class _DescriptorStream(trio.abc.Stream):
    """What ``FdStream`` and ``SslFdStream`` share: the cached descriptor and its closed mark,
    and the bytes ``send_now`` could not write, which ``send_kept`` sends."""

    def __init__(self, fileno: int) -> None:
        # The descriptor is read once: ``socket.fileno()`` costs two calls, and every read and
        # write needs it (several per message). The number stays ours until ``aclose``, which
        # sets ``_closed`` before it closes the socket.
        self._fileno = fileno
        self._closed = fileno < 0
        self._unyielded = 0  # bytes written since send_all last yielded
        self._kept: list[bytes] = []  # what ``send_now`` could not write yet
        #: Whether ``send_now`` kept bytes that ``send_kept`` has not sent yet (``_kept`` is
        #: not empty). An attribute, not a property: every flush of a connection asks.
        self.kept = False

    def _fd(self) -> int:
        if self._closed:
            raise trio.ClosedResourceError("the stream is closed")
        return self._fileno

    async def send_kept(self) -> None:
        """Send, waiting as ``send_all`` does, what ``send_now`` kept."""
        while self._kept:
            data = self._kept.pop(0)
            self.kept = bool(self._kept)
            await self.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.wait_writable(self._fd())


class FdStream(_DescriptorStream):
    """``stream``'s bytes, read and written on its file descriptor (see the module docstring).

    The stream owns ``stream``: close it through ``aclose`` only, never ``stream`` itself.
    Closing marks this object closed, then closes ``stream``, which tells the tasks waiting on
    the descriptor (``trio.ClosedResourceError``); every call checks the mark, so a number the
    kernel gave to a newer socket is never touched.
    """

    def __init__(self, stream: trio.SocketStream) -> None:
        super().__init__(stream.socket.fileno())
        self._stream = stream
        self._socket = stream.socket

    @property
    def socket(self) -> trio.socket.SocketType:
        """The connection's socket (for ``getpeername`` and the like): do not read, write or
        close it."""
        return self._socket

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


class SslFdStream(_DescriptorStream):
    """TLS over a connected TCP socket, through the ``ssl`` module's own ``SSLSocket`` in
    non-blocking mode: each read and write is one call into OpenSSL, where ``trio.SSLStream``
    drives an ``SSLObject`` and its memory BIOs from Python (measured: ``bench.broker``'s
    ``tls_pubs_ratio``). Waits and yields as ``FdStream`` does, and offers the same
    ``send_now`` / ``kept`` / ``send_kept`` fast path, so a session writes its replies the same
    way over either.

    ``open`` takes the connection's socket over (its descriptor moves into the ``SSLSocket``)
    and does the handshake. One reader and one writer task at a time, as ``FdStream``: OpenSSL
    is called from the trio thread only, so the two never run at once. No half-close: TLS has
    none short of closing (``trio.SSLStream`` has none either). ``aclose`` sends a ``close_notify``
    when the socket takes it at once, and does not wait for the peer's.
    """

    def __init__(self, sock: ssl.SSLSocket) -> None:
        super().__init__(sock.fileno())
        self._ssl = sock

    @classmethod
    async def open(
        cls,
        stream: trio.SocketStream,
        context: ssl.SSLContext,
        *,
        server_side: bool,
        server_hostname: str | None = None,
    ) -> SslFdStream:
        """``stream`` (which this takes over: do not use it again) under TLS, handshaken.
        ``trio.BrokenResourceError`` (the ``ssl.SSLError`` as its cause) if the handshake
        fails; the socket is closed then. Bound it with a cancel scope."""
        raw = socket.socket(fileno=stream.socket.detach())
        try:
            raw.setblocking(False)
            sock = context.wrap_socket(
                raw,
                server_side=server_side,
                server_hostname=server_hostname,
                do_handshake_on_connect=False,
            )
        except BaseException:
            raw.close()
            raise
        tls = cls(sock)
        try:
            await tls._retry(sock.do_handshake)
        except BaseException:
            tls._close()
            raise
        return tls

    @property
    def socket(self) -> ssl.SSLSocket:
        """The TLS socket (for ``getpeername``, ``getpeercert``, ``version``...): do not read,
        write or close it."""
        return self._ssl

    async def _retry(self, call: Callable[[], _T]) -> _T:
        """``call()`` once OpenSSL can make progress: waits on the descriptor for what it
        wants (reading or writing) and calls again."""
        while True:
            if self._closed:
                raise trio.ClosedResourceError("the stream is closed")
            try:
                return call()
            except ssl.SSLWantReadError:
                await trio.lowlevel.wait_readable(self._fileno)
            except ssl.SSLWantWriteError:
                await trio.lowlevel.wait_writable(self._fileno)
            except (ssl.SSLError, OSError) as exc:
                raise trio.BrokenResourceError(f"TLS failed: {exc}") from exc

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        size = _RECEIVE_BYTES if max_bytes is None else max_bytes
        if size < 1:
            raise ValueError("max_bytes must be >= 1")
        sock = self._ssl
        while True:
            if self._closed:
                raise trio.ClosedResourceError("the stream is closed")
            # Wait first unless OpenSSL holds decrypted bytes already: a read that would only
            # fail with "want read" costs a system call and an exception.
            if not sock.pending():
                await trio.lowlevel.wait_readable(self._fileno)
                if self._closed:
                    raise trio.ClosedResourceError("the stream is closed")
            try:
                data = sock.recv(size)  # b"" at the end (a missing close_notify included)
            except ssl.SSLWantReadError:
                continue  # part of a record: wait for the rest
            except ssl.SSLWantWriteError:
                await trio.lowlevel.wait_writable(self._fileno)
                continue
            except (ssl.SSLError, OSError) as exc:
                raise trio.BrokenResourceError(f"receive failed: {exc}") from exc
            if not data or len(data) >= size:
                return data
            return self._read_on(data, size)

    def _read_on(self, first: bytes, size: int) -> bytes:
        """``first`` and what more OpenSSL gives at once, up to ``size`` bytes in all.

        A read returns one TLS record at most, where ``FdStream``'s returns all the socket
        holds: the records queued behind it (the frames of a busy peer connection, a client's
        pipelined requests) are read now and handed on as one chunk. Measured: a pass of the
        caller's loop for each record, a pass of trio's scheduler each, was most of what TLS
        cost the brokers in ``bench.broker``'s (d). When nothing more is queued this costs one
        read that fails ("want read")."""
        parts = [first]
        got = len(first)
        sock = self._ssl
        while got < size:
            try:
                chunk = sock.recv(size - got)
            except (ssl.SSLError, OSError):
                break  # nothing more now ("want read"), or a failure the next read reports
            if not chunk:
                break  # the end: the next read says so
            parts.append(chunk)
            got += len(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        with memoryview(data).cast("B") as view:
            total = len(view)
            sent = 0
            while sent < total:
                sent += await self._retry(functools.partial(self._ssl.send, view[sent:]))
        self._unyielded += total
        if self._unyielded >= _YIELD_BYTES:
            self._unyielded = 0
            await trio.lowlevel.cancel_shielded_checkpoint()

    def send_now(self, buffers: list[bytes | memoryview]) -> bool:
        """As ``FdStream.send_now``. A write OpenSSL could not finish is kept whole: it must be
        offered again with the same bytes (OpenSSL may have sent part of it already)."""
        data = buffers[0] if len(buffers) == 1 else b"".join(buffers)
        if not self._kept:
            if self._closed:
                raise trio.BrokenResourceError("send failed: the stream is closed")
            try:
                sent = self._ssl.send(data)
            except (ssl.SSLWantWriteError, ssl.SSLWantReadError):
                sent = 0
            except (ssl.SSLError, OSError) as exc:
                raise trio.BrokenResourceError(f"send failed: {exc}") from exc
            if sent == len(data):
                return True
            data = data[sent:]
        self._kept.append(bytes(data))
        self.kept = True
        return False

    def _close(self, *, notify: bool = False) -> None:
        if self._closed:
            return
        if notify:
            # One try at telling the peer (close_notify), without waiting for its own: a peer
            # that sees the end of the stream without it may report a truncation (openssl
            # s_client does). Sent once the socket has room, which it has unless the peer
            # stopped reading; then it is skipped.
            with contextlib.suppress(ssl.SSLError, OSError, ValueError):
                self._ssl.unwrap()
        self._closed = True  # first: the descriptor's number may be reused once it is closed
        trio.lowlevel.notify_closing(self._fileno)
        self._ssl.close()

    async def aclose(self) -> None:
        self._close(notify=True)
        await trio.lowlevel.checkpoint()


def peer_address(stream: trio.abc.Stream) -> tuple[str, int] | None:
    """``(host, port)`` at the other end of ``stream``: a ``trio.SocketStream``, an
    ``FdStream`` or ``SslFdStream``, or a stream layered over one of them (``trio.SSLStream``'s
    ``transport_stream``, a WebSocket's ``transport``), a few layers deep; None when it cannot
    be told (a test's memory stream, a connection already reset)."""
    for _ in range(4):
        inner = getattr(stream, "transport_stream", None) or getattr(stream, "transport", None)
        if not isinstance(inner, trio.abc.Stream):
            break
        stream = inner
    sock = getattr(stream, "socket", None)
    try:
        name = sock.getpeername() if sock is not None else None
    except OSError:
        return None
    if isinstance(name, tuple) and len(name) >= 2 and isinstance(name[0], str):
        return name[0], int(name[1])
    return None


def peer_host(stream: trio.abc.Stream) -> str:
    """The host (IP address) at the other end of ``stream`` (``peer_address``), ``""`` when it
    cannot be told."""
    address = peer_address(stream)
    return "" if address is None else address[0]


def peer_name(stream: trio.abc.Stream) -> str:
    """``host:port`` at the other end of ``stream``, for logs; ``?`` when it cannot be told."""
    address = peer_address(stream)
    return "?" if address is None else f"{address[0]}:{address[1]}"
