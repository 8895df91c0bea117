"""One blocking-socket connection to a broker, over the sans-I/O ``ConnectionCore``.

Pipelining: ``send`` writes a command and returns a ticket at once; ``wait(ticket)`` reads until
that command's response arrives (responses to earlier commands that arrive first are kept for
their own ``wait``). ``request`` is both. Not thread-safe: one thread uses a connection.

Failure is final: a socket error, an end of stream, a broken reply or a deadline passing closes
the connection, and every command still waiting then fails with ``KafkaesqueConnectionError``
(``outcome_unknown`` True: each was sent). A later ``send`` raises at once (nothing sent).

Security: with a ``Security`` that says so, the constructor does the TLS handshake and then the
SASL exchange (``AUTH`` lines) before it returns, so the first command goes on an authenticated
connection; a refusal is ``KafkaesqueError`` ``AUTH_FAILED``.
"""

from __future__ import annotations

import socket
import ssl
import time

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


def _connect_error(address: Address, exc: OSError) -> KafkaesqueConnectionError:
    return KafkaesqueConnectionError(
        f"cannot connect to {address[0]}:{address[1]}: {exc.strerror or exc}", sent=False
    )


class SyncConnection:
    """A blocking connection; see the module docstring for the pipelining and failure rules."""

    def __init__(
        self,
        address: Address,
        *,
        connect_timeout_s: float = 5.0,
        security: Security = PLAINTEXT,
    ) -> None:
        """Connect to ``address``, then (as ``security`` says) do the TLS handshake and the
        SASL exchange, each within ``connect_timeout_s``. ``KafkaesqueConnectionError``
        (retriable) if the broker cannot be reached or drops the connection meanwhile;
        ``KafkaesqueError`` ``AUTH_FAILED`` (not retriable) if TLS or SASL refuses (an
        untrusted certificate, a wrong password, a broker that cannot prove it knows it)."""
        self.address = address
        self.authenticated_as: str | None = None
        """The user the broker authenticated (None without SASL)."""
        self._core: ConnectionCore[int] = ConnectionCore()
        self._done: dict[int, Response] = {}
        self._next_ticket = 0
        self._failure: KafkaesqueError | None = None
        try:
            sock = socket.create_connection(address, timeout=connect_timeout_s)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError as exc:
            raise _connect_error(address, exc) from exc
        self._sock: socket.socket = sock
        if security.uses_tls:
            self._sock = self._wrap(sock, security, connect_timeout_s)
        if security.uses_sasl:
            self._authenticate(security, connect_timeout_s)

    def _wrap(self, sock: socket.socket, security: Security, timeout_s: float) -> ssl.SSLSocket:
        try:
            context = security.ssl_context
            assert context is not None  # uses_tls
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            sock.close()
            raise auth_failed(self._where, f"cannot load the TLS files: {exc}") from exc
        try:
            sock.settimeout(timeout_s)
            return context.wrap_socket(sock, server_hostname=self.address[0])
        except OSError as exc:
            sock.close()
            raise tls_failed(self._where, exc) from exc

    def _authenticate(self, security: Security, timeout_s: float) -> None:
        handshake = SaslHandshake(security, self._where)
        try:
            command: Authenticate | None = handshake.start()
            while command is not None:
                command = handshake.step(self.request(command, timeout_s))
        except KafkaesqueError as exc:
            self._fail(exc)
            raise
        self.authenticated_as = handshake.username

    def __enter__(self) -> SyncConnection:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        """Whether the connection is closed (by ``close`` or by a failure)."""
        return self._failure is not None

    @property
    def in_flight(self) -> int:
        """Commands sent whose responses were not read yet."""
        return self._core.in_flight

    def fileno(self) -> int:
        """The socket's descriptor (for ``selectors``)."""
        return self._sock.fileno()

    def close(self) -> None:
        """Close the socket; commands still waiting fail. Idempotent."""
        self._fail(KafkaesqueConnectionError("connection closed by the client", sent=True))

    def abort(self, error: KafkaesqueError) -> None:
        """Close the socket now with ``error`` as the reason (if it is still open): commands
        still waiting fail with it, and a late reply is never read."""
        self._fail(error)

    def detach(self) -> socket.socket:
        """Hand the open socket (TLS done, authenticated) over to the caller, for a tool that
        speaks the line protocol itself (a benchmark that pipelines raw lines); nothing may be
        in flight. The connection is closed for the client from then on, the socket is not:
        closing it is the caller's. ``RuntimeError`` if commands are in flight or it failed."""
        if self._failure is not None or self._core.in_flight or self._done:
            raise RuntimeError(f"cannot detach the connection to {self._where}: in use or closed")
        self._failure = KafkaesqueConnectionError("the socket was detached", sent=False)
        return self._sock

    def send(self, command: Command, *, timeout_s: float = 10.0) -> int:
        """Write ``command``; return its ticket for ``wait``. ``LocalProtocolError`` for a
        command that cannot be encoded; ``KafkaesqueConnectionError`` if the connection failed."""
        if self._failure is not None:
            raise connection_closed(self._where, self._failure)
        ticket = self._next_ticket
        self._next_ticket += 1
        data = self._core.send(command, ticket)
        try:
            self._sock.settimeout(timeout_s)
            self._sock.sendall(data)
        except OSError as exc:
            raise self._fail(
                connection_lost(self._where, f"sending failed: {os_reason(exc)}")
            ) from exc
        return ticket

    def wait(self, ticket: int, deadline: float) -> Response:
        """The response to ``ticket``, reading until it comes or ``time.monotonic()`` passes
        ``deadline`` (then the connection is closed and ``KafkaesqueConnectionError`` raised)."""
        while ticket not in self._done:
            if self._failure is not None:
                raise self._failure
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._fail(client_timeout(f"request to {self._where}", sent=True))
            self.read_some(remaining)
        return self._done.pop(ticket)

    def request(self, command: Command, timeout_s: float) -> Response:
        """Send ``command`` and wait for its response, ``timeout_s`` seconds at most."""
        deadline = time.monotonic() + timeout_s
        return self.wait(self.send(command, timeout_s=timeout_s), deadline)

    def read_some(self, timeout_s: float) -> bool:
        """Read what arrives within ``timeout_s`` (0: only what is there); False if nothing did.

        Responses read are kept for ``wait`` / ``take_done``. A failure closes the connection and
        raises ``KafkaesqueConnectionError``.
        """
        if self._failure is not None:
            raise self._failure
        try:
            self._sock.settimeout(max(timeout_s, 0.0))
            data = self._sock.recv(RECEIVE_SIZE)
            # TLS: one recv returns at most one record; take the rest of what TLS holds, which
            # a selector cannot see (it watches the socket, not the TLS buffer).
            while data and isinstance(self._sock, ssl.SSLSocket) and self._sock.pending():
                data += self._sock.recv(RECEIVE_SIZE)
        except (TimeoutError, BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return False  # nothing (or only part of a TLS record) arrived in time
        except OSError as exc:
            raise self._fail(
                connection_lost(self._where, f"receiving failed: {os_reason(exc)}")
            ) from exc
        if not data:
            raise self._fail(connection_lost(self._where, "the broker closed the connection"))
        try:
            self._done.update(self._core.receive_data(data))
        except RemoteProtocolError as exc:
            raise self._fail(reply_broken(self._where, exc)) from exc
        return True

    def take_done(self) -> dict[int, Response]:
        """Every response read and not taken yet, by ticket."""
        done, self._done = self._done, {}
        return done

    def pending_tickets(self) -> list[int]:
        """Tickets sent whose responses have not been read."""
        return self._core.pending_tokens()

    @property
    def failure(self) -> KafkaesqueError | None:
        """Why the connection closed, or None while it is open."""
        return self._failure

    @property
    def _where(self) -> str:
        return f"{self.address[0]}:{self.address[1]}"

    def _fail(self, error: KafkaesqueError) -> KafkaesqueError:
        if self._failure is None:
            self._failure = error
            self._sock.close()
        return self._failure
