"""One trio connection to a broker, over the sans-I/O ``ConnectionCore``.

Many tasks may use one connection at once: ``send`` writes a command under a lock and returns a
ticket, so the broker sees commands in ticket order and answers in that order (pipelining);
``wait(ticket)`` returns that command's response. There is no background reader task: whoever
waits reads, under a receive lock, and files every response it reads for its owner (trio's lock
is fair, so each waiter gets its turn to read or to find its response filed).

Failure is final, as for ``SyncConnection``: after a stream error, end of stream, a broken reply,
a deadline passing or a cancelled ``send`` the connection is unusable, and every waiter fails with
``KafkaesqueConnectionError`` (``outcome_unknown``: the command was sent); ``aclose`` then
releases the stream (``AsyncClient`` does so when it replaces a failed connection). Cancelling a
``wait`` is harmless: the response, when it comes, is read and dropped.

Security: ``connect`` with a ``Security`` that says so wraps the TCP stream in a
``trio.SSLStream`` (handshake done) and does the SASL exchange (``AUTH`` lines) before it
returns; a refusal is ``KafkaesqueError`` ``AUTH_FAILED``.
"""

from __future__ import annotations

import math

import trio

from kafkaesque.protocol import Authenticate, Command, RemoteProtocolError

from ._errors import (
    KafkaesqueConnectionError,
    KafkaesqueError,
    client_timeout,
    connection_closed,
    connection_lost,
    os_reason,
    reply_broken,
)
from ._metadata import Address
from ._security import PLAINTEXT, SaslHandshake, Security, auth_failed, tls_failed
from ._wire import ConnectionCore, Response

RECEIVE_SIZE = 256 * 1024


class TrioConnection:
    """A trio connection; see the module docstring for the pipelining and failure rules."""

    def __init__(self, address: Address, stream: trio.abc.Stream) -> None:
        """Wrap a connected stream (``connect`` opens a TCP one; tests pass memory streams)."""
        self.address = address
        self.authenticated_as: str | None = None
        """The user the broker authenticated (None without SASL)."""
        self._stream = stream
        self._core: ConnectionCore[int] = ConnectionCore()
        self._done: dict[int, Response] = {}
        self._abandoned: set[int] = set()
        self._next_ticket = 0
        self._send_lock = trio.Lock()
        self._receive_lock = trio.Lock()
        self._failure: KafkaesqueError | None = None
        self._reader = (
            trio.CancelScope()
        )  # the current receive; cancelled when the connection fails

    @classmethod
    async def connect(
        cls, address: Address, *, timeout_s: float = 5.0, security: Security = PLAINTEXT
    ) -> TrioConnection:
        """Connect to ``address``, then (as ``security`` says) do the TLS handshake and the SASL
        exchange, each within ``timeout_s``. ``KafkaesqueConnectionError`` (retriable) if the
        broker cannot be reached or drops the connection meanwhile; ``KafkaesqueError``
        ``AUTH_FAILED`` (not retriable) if TLS or SASL refuses."""
        where = f"{address[0]}:{address[1]}"
        try:
            with trio.fail_after(timeout_s):
                stream: trio.abc.Stream = await trio.open_tcp_stream(*address)
        except (OSError, trio.TooSlowError) as exc:
            reason = "timed out" if isinstance(exc, trio.TooSlowError) else exc.strerror or exc
            raise KafkaesqueConnectionError(
                f"cannot connect to {where}: {reason}", sent=False
            ) from exc
        if security.uses_tls:
            stream = await _start_tls(stream, address, security, timeout_s)
        connection = cls(address, stream)
        if security.uses_sasl:
            try:
                await connection._authenticate(security, timeout_s)
            except BaseException:
                await connection.aclose()
                raise
        return connection

    async def _authenticate(self, security: Security, timeout_s: float) -> None:
        handshake = SaslHandshake(security, self._where)
        command: Authenticate | None = handshake.start()
        while command is not None:
            response = await self.request(command, timeout_s)
            # SCRAM's PBKDF2 may take a while (the broker picks the iteration count): a thread.
            command = await trio.to_thread.run_sync(handshake.step, response)
        self.authenticated_as = handshake.username

    @property
    def closed(self) -> bool:
        """Whether the connection is closed (by ``aclose`` or by a failure)."""
        return self._failure is not None

    @property
    def failure(self) -> KafkaesqueError | None:
        """Why the connection closed, or None while it is open."""
        return self._failure

    @property
    def in_flight(self) -> int:
        """Commands sent whose responses were not read yet."""
        return self._core.in_flight

    async def aclose(self) -> None:
        """Close the stream; waiters fail. Idempotent."""
        self._fail(KafkaesqueConnectionError("connection closed by the client", sent=True))
        await trio.aclose_forcefully(self._stream)

    def abort(self, error: KafkaesqueError) -> None:
        """Fail the connection now with ``error`` (if it is still open): every waiter raises it,
        later sends are refused, and nothing more is read from the stream (``aclose`` releases
        it). For a broker that stopped answering: its late replies must not be taken."""
        self._fail(error)

    async def send(self, command: Command) -> int:
        """Write ``command``; return its ticket for ``wait``. ``LocalProtocolError`` for a
        command that cannot be encoded; ``KafkaesqueConnectionError`` if the connection failed."""
        async with self._send_lock:
            if self._failure is not None:
                raise connection_closed(self._where, self._failure)
            ticket = self._next_ticket
            self._next_ticket += 1
            data = self._core.send(command, ticket)
            try:
                await self._stream.send_all(data)
            except trio.Cancelled:
                # Part of the command may be on the wire: the stream cannot be trusted any more.
                self._fail(KafkaesqueConnectionError("send cancelled", sent=True))
                raise
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                raise self._fail(
                    connection_lost(self._where, f"sending failed: {os_reason(exc)}")
                ) from exc
            return ticket

    async def wait(self, ticket: int, deadline: float = math.inf) -> Response:
        """The response to ``ticket``, by ``trio.current_time()`` ``deadline`` at the latest
        (then the connection is closed and ``KafkaesqueConnectionError`` raised)."""
        try:
            while ticket not in self._done:
                if self._failure is not None:
                    raise self._failure
                with trio.move_on_at(deadline):
                    async with self._receive_lock:
                        if ticket not in self._done and self._failure is None:
                            await self._read_some()
                    continue
                raise self._fail(client_timeout(f"request to {self._where}", sent=True))
            return self._done.pop(ticket)
        except trio.Cancelled:
            if self._done.pop(ticket, None) is None:
                self._abandoned.add(ticket)  # its response is dropped when it arrives
            raise

    async def request(self, command: Command, timeout_s: float) -> Response:
        """Send ``command`` and wait for its response, ``timeout_s`` seconds at most."""
        deadline = trio.current_time() + timeout_s
        return await self.wait(await self.send(command), deadline)

    async def _read_some(self) -> None:
        try:
            with trio.CancelScope() as self._reader:
                data = await self._stream.receive_some(RECEIVE_SIZE)
            if self._reader.cancelled_caught:
                assert self._failure is not None  # only _fail cancels the reader
                raise self._failure
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise self._fail(
                connection_lost(self._where, f"receiving failed: {os_reason(exc)}")
            ) from exc
        if not data:
            raise self._fail(connection_lost(self._where, "the broker closed the connection"))
        try:
            for ticket, response in self._core.receive_data(data):
                if ticket in self._abandoned:
                    self._abandoned.discard(ticket)
                else:
                    self._done[ticket] = response
        except RemoteProtocolError as exc:
            raise self._fail(reply_broken(self._where, exc)) from exc

    @property
    def _where(self) -> str:
        return f"{self.address[0]}:{self.address[1]}"

    def _fail(self, error: KafkaesqueError) -> KafkaesqueError:
        if self._failure is None:
            self._failure = error
            self._reader.cancel()  # wake the task reading, if any: it raises the failure
        return self._failure


async def _start_tls(
    stream: trio.abc.Stream, address: Address, security: Security, timeout_s: float
) -> trio.SSLStream[trio.abc.Stream]:
    """``stream`` wrapped in TLS, the handshake done (the broker's certificate checked); the
    stream is closed if it fails (see ``SyncConnection`` for the errors)."""
    where = f"{address[0]}:{address[1]}"
    try:
        context = security.ssl_context
        assert context is not None  # uses_tls
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        await trio.aclose_forcefully(stream)
        raise auth_failed(where, f"cannot load the TLS files: {exc}") from exc
    tls = trio.SSLStream(stream, context, server_hostname=address[0])
    try:
        with trio.fail_after(timeout_s):
            await tls.do_handshake()
    except trio.BrokenResourceError as exc:
        await trio.aclose_forcefully(stream)
        raise tls_failed(where, exc.__cause__ or exc) from exc
    except trio.TooSlowError as exc:
        await trio.aclose_forcefully(stream)
        raise KafkaesqueConnectionError(f"{where}: TLS handshake timed out", sent=False) from exc
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise
    return tls
