"""The sans-I/O core of one client connection: commands in, bytes out; bytes in, responses out.

``ConnectionCore`` owns no socket (as h11, and as ``ReplyDecoder`` beneath it): the sync and trio
connections write what ``send`` returns and feed what they read to ``receive_data``. It pairs each
reply with the request that caused it by order (the protocol answers pipelined commands in the
order they were sent) and gathers list replies (rows then ``+END``) into one ``ListResponse``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Generic, TypeAlias, TypeVar

from kafkaesque.protocol import (
    AclList,
    Command,
    Cons,
    DataReply,
    DescribeGroup,
    DescribeTopic,
    EndReply,
    ErrorReply,
    Fetch,
    FetchFormat,
    FetchOffsets,
    Help,
    Latest,
    ListGroups,
    ListTopics,
    LocalProtocolError,
    Metadata,
    OkReply,
    RemoteProtocolError,
    Reply,
    ReplyDecoder,
    ResetOffsets,
    Row,
    encode_command,
    encode_reply,
)

from ._errors import KafkaesqueError

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ListResponse:
    """A list reply: its rows in order, then the closing ``+END``."""

    rows: tuple[Row, ...]
    end: EndReply


Response: TypeAlias = OkReply | ErrorReply | DataReply | ListResponse
"""The whole answer to one command."""

_LIST_COMMANDS = (
    Cons,
    ListTopics,
    DescribeTopic,
    FetchOffsets,
    DescribeGroup,
    ListGroups,
    ResetOffsets,
    Metadata,
    Help,
    Latest,
    AclList,
)


def shown(answer: Response | Reply | tuple[Reply, ...], limit: int = 160) -> str:
    """``answer`` as the protocol lines the broker sent (``+OK 0 1``, rows joined by `` | ``),
    cut at ``limit`` characters: what error messages quote, instead of a dataclass's repr.

    ``+DATA`` shows its line, not its payload; a reply the encoder refuses shows its kind."""
    if isinstance(answer, ListResponse):
        replies: list[Reply] = [*answer.rows, answer.end]
    elif isinstance(answer, tuple):
        replies = list(answer)
    else:
        replies = [answer]
    lines = []
    for reply in replies:
        try:
            raw = encode_reply(reply).split(b"\r\n", 1)[0]
            lines.append(raw.decode("utf-8", "replace"))
        except LocalProtocolError:
            lines.append(f"(a malformed {type(reply).__name__})")
    text = " | ".join(lines) or "nothing"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def expects_list(command: Command) -> bool:
    """Whether ``command`` is answered by rows and ``+END`` (else by one line, or ``+DATA``)."""
    if isinstance(command, Fetch):
        return command.format is FetchFormat.TEXT
    return isinstance(command, _LIST_COMMANDS)


class ConnectionCore(Generic[T]):
    """Request/reply matching for one connection, with pipelining. No I/O, no clock.

    ``send(command, token)`` returns the bytes to write and remembers ``token``;
    ``receive_data(data)`` returns ``(token, response)`` for every response the bytes complete, in
    the order the commands were sent. ``in_flight`` counts commands not yet answered.

    Raises ``RemoteProtocolError`` when the server breaks the grammar or answers out of shape (a
    row to a command that takes one line, a reply nobody asked for): replies can no longer be
    matched to requests, so the caller must close the connection. After that, every call raises.
    """

    def __init__(self) -> None:
        self._decoder = ReplyDecoder()
        # Invariant: one entry per command sent and not yet answered, oldest first.
        self._pending: deque[tuple[T, bool]] = deque()
        self._rows: list[Row] = []  # rows of the list reply being gathered (for _pending[0])
        self._broken: RemoteProtocolError | None = None

    @property
    def in_flight(self) -> int:
        """How many commands were sent and are not answered yet."""
        return len(self._pending)

    def pending_tokens(self) -> list[T]:
        """The tokens of the commands not answered yet, oldest first."""
        return [token for token, _ in self._pending]

    def send(self, command: Command, token: T) -> bytes:
        """Register ``command`` (answered later with ``token``); return the bytes to write.

        Raises ``LocalProtocolError`` for a command that cannot be encoded (nothing is registered).
        """
        if self._broken is not None:
            raise self._broken
        data = encode_command(command)
        self._pending.append((token, expects_list(command)))
        return data

    def receive_data(self, data: bytes | bytearray) -> list[tuple[T, Response]]:
        """Feed bytes from the server; return the responses they complete, oldest first."""
        if self._broken is not None:
            raise self._broken
        try:
            self._decoder.feed(data)
            done: list[tuple[T, Response]] = []
            for reply in self._decoder.events():
                response = self._collect(reply)
                if response is not None:
                    token, _ = self._pending.popleft()
                    done.append((token, response))
            return done
        except RemoteProtocolError as exc:
            self._broken = exc
            raise

    def _collect(self, reply: Reply) -> Response | None:
        if not self._pending:
            raise RemoteProtocolError(f"a reply nobody asked for: {shown(reply)}")
        wants_list = self._pending[0][1]
        if isinstance(reply, ErrorReply):
            if self._rows:
                raise RemoteProtocolError("-ERR inside a list reply")
            return reply
        if not wants_list:
            if isinstance(reply, OkReply | DataReply):
                return reply
            raise RemoteProtocolError(f"expected one line, got {shown(reply)}")
        if isinstance(reply, EndReply):
            rows, self._rows = tuple(self._rows), []
            return ListResponse(rows, reply)
        if isinstance(reply, OkReply | DataReply):
            raise RemoteProtocolError(f"expected rows and +END, got {shown(reply)}")
        self._rows.append(reply)
        return None


def raise_for_error(response: Response) -> None:
    """Raise the ``KafkaesqueError`` a ``-ERR`` response stands for; do nothing otherwise."""
    if isinstance(response, ErrorReply):
        raise KafkaesqueError.from_reply(response)


def expect_ok(response: Response) -> OkReply:
    """The ``+OK`` of ``response``; ``KafkaesqueError`` for ``-ERR``, protocol error otherwise."""
    raise_for_error(response)
    if not isinstance(response, OkReply):
        raise RemoteProtocolError(f"expected +OK, got {shown(response)}")
    return response


def expect_list(response: Response) -> ListResponse:
    """The rows of ``response``; ``KafkaesqueError`` for ``-ERR``, protocol error otherwise."""
    raise_for_error(response)
    if not isinstance(response, ListResponse):
        raise RemoteProtocolError(f"expected rows and +END, got {shown(response)}")
    return response


def expect_data(response: Response) -> DataReply:
    """The ``+DATA`` of ``response``; ``KafkaesqueError`` for ``-ERR``, protocol error otherwise."""
    raise_for_error(response)
    if not isinstance(response, DataReply):
        raise RemoteProtocolError(f"expected +DATA, got {shown(response)}")
    return response
