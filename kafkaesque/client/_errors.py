"""The client's one error type: what went wrong, whether to retry, whether a write may have landed.

Every failure the broker reports (``-ERR CODE message``), and every failure to reach a broker,
surfaces as a ``KafkaesqueError``. Misuse of the library (a negative partition, a closed producer)
raises ``ValueError`` or ``RuntimeError`` instead: that is a bug to fix, not a condition to handle.
"""

from __future__ import annotations

from kafkaesque.protocol import ErrorCode, ErrorReply


class KafkaesqueError(Exception):
    """A request failed. ``code`` is the broker's ``ErrorCode``, or None when no broker answered.

    ``retriable``: the same request may succeed if sent again after a backoff. ``outcome_unknown``:
    a write may or may not have been applied, so only an idempotent retry is safe ("failed" and
    "maybe" are never conflated). Both default to the code's own flags (see docs/protocol.md) and
    are given explicitly only for failures of the client side (``code`` None, or a request that
    timed out in the client).
    """

    def __init__(
        self,
        code: ErrorCode | None,
        message: str,
        *,
        retriable: bool | None = None,
        outcome_unknown: bool | None = None,
    ) -> None:
        if code is not None:
            retriable = code.retriable if retriable is None else retriable
            outcome_unknown = code.outcome_unknown if outcome_unknown is None else outcome_unknown
        if retriable is None or outcome_unknown is None:
            raise ValueError("an error without a code must say whether it is retriable")
        self.code = code
        self.message = message
        self.retriable = retriable
        self.outcome_unknown = outcome_unknown
        super().__init__(str(self))

    @classmethod
    def from_reply(cls, reply: ErrorReply) -> KafkaesqueError:
        """The error a ``-ERR`` reply stands for."""
        return cls(reply.code, reply.message)

    @property
    def code_name(self) -> str:
        """The wire spelling of the code, or ``CONNECTION`` when no broker answered."""
        return "CONNECTION" if self.code is None else self.code.name

    def __str__(self) -> str:
        return f"{self.code_name}: {self.message}" if self.message else self.code_name

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.code_name}, {self.message!r}, "
            f"retriable={self.retriable}, outcome_unknown={self.outcome_unknown})"
        )


class KafkaesqueConnectionError(KafkaesqueError):
    """No usable answer came from a broker: it could not be reached, the connection dropped, the
    client's own deadline passed, or the broker broke the reply grammar.

    ``code`` is None. Retriable (another connection, maybe to another broker, may work) except
    after a protocol violation. ``outcome_unknown`` is True when the request had been sent, at
    least in part, before the failure: a write may then have been applied.
    """

    def __init__(self, message: str, *, sent: bool, retriable: bool = True) -> None:
        super().__init__(None, message, retriable=retriable, outcome_unknown=sent)


def client_timeout(what: str, *, sent: bool) -> KafkaesqueConnectionError:
    """The error of a request whose deadline passed in the client before a reply came."""
    return KafkaesqueConnectionError(f"no reply in time: {what}", sent=sent)


def connection_closed(where: str, failure: KafkaesqueError) -> KafkaesqueConnectionError:
    """A request refused before sending anything: the connection failed earlier."""
    return KafkaesqueConnectionError(
        f"connection to {where} is closed: {failure.message}", sent=False
    )


def os_reason(exc: BaseException) -> str:
    """A socket error in plain words: ``Broken pipe``, not ``[Errno 32] Broken pipe``; the
    exception's kind when it has no text (trio's ``BrokenResourceError()``)."""
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


def connection_lost(where: str, what: str) -> KafkaesqueConnectionError:
    """The connection broke with requests in flight (``what`` says how)."""
    return KafkaesqueConnectionError(f"{where}: {what}", sent=True)


def leader_moved(where: str, waited_ms: float) -> KafkaesqueConnectionError:
    """A broker left a request unanswered for ``waited_ms`` while the metadata, read from another
    broker, names another leader of the request's partition: the client gives up on that
    connection as if it had been lost (retriable; outcome unknown, the request was sent)."""
    return KafkaesqueConnectionError(
        f"{where}: no reply within {waited_ms:g} ms and the partition has another leader now",
        sent=True,
    )


def reply_broken(where: str, exc: Exception) -> KafkaesqueConnectionError:
    """The broker broke the reply grammar: not retriable, the connection is unusable."""
    return KafkaesqueConnectionError(
        f"{where} broke the protocol: {exc}", sent=True, retriable=False
    )
