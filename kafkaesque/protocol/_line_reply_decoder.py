"""``ReplyDecoder``, the client side's reader: the bytes a server sent in, replies out.

Unlike ``LineDecoder`` it raises ``RemoteProtocolError`` for bytes that break the grammar: a
client matches replies to its requests by their order, and cannot once a reply is malformed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from enum import Enum, StrEnum
from typing import Final, TypeVar

from ._line_bytes import (
    DEFAULT_REPLY_LIMITS,
    INT16_MAX,
    INT32_MAX,
    INT64_MAX,
    NEED_DATA,
    LineLimits,
    NeedData,
    parse_int,
    show,
    unescape,
)
from ._line_commands import (
    AclOperation,
    AclPattern,
    AclPermission,
    AclResource,
    AclRow,
    Fsync,
    acl_row_error,
    name_error,
    topic_name_error,
)
from ._line_errors import ErrorCode, ErrorReply, LocalProtocolError, RemoteProtocolError
from ._line_replies import (
    BrokerRow,
    DataReply,
    EndReply,
    GroupRow,
    GroupStateRow,
    InfoRow,
    MemberRow,
    MessageRow,
    OffsetRow,
    OkReply,
    PartitionRow,
    Reply,
    TopicRow,
)

_E = TypeVar("_E", bound=StrEnum)


# ---------------------------------------------------------------------------------------------
# The client side: ReplyDecoder.


def _broken(what: str, raw: bytes) -> RemoteProtocolError:
    return RemoteProtocolError(f"malformed reply: {what} in {show(raw)}")


def _reply_int(raw: bytes, line: bytes, what: str, lo: int, hi: int) -> int:
    value = parse_int(raw, lo, hi)
    if value is None:
        raise _broken(f"{what} is not an integer from {lo} to {hi}", line)
    return value


def _reply_topic(raw: bytes, line: bytes) -> str:
    name = raw.decode("ascii", "replace")
    if topic_name_error(name, allow_internal=True) is not None:
        raise _broken("invalid topic name", line)
    return name


def _reply_options(
    tokens: list[bytes], line: bytes, allowed: frozenset[bytes] | None
) -> dict[bytes, bytes]:
    """The ``name=value`` fields of a row; a field twice, or one not in ``allowed`` (None:
    any name) breaks the stream."""
    options: dict[bytes, bytes] = {}
    for token in tokens:
        name, eq, value = token.partition(b"=")
        if not eq or not name or (allowed is not None and name not in allowed) or name in options:
            raise _broken(f"unexpected field {show(token)}", line)
        options[name] = value
    return options


def _reply_pairs(raw: bytes, line: bytes) -> tuple[tuple[int, int], ...]:
    pairs: list[tuple[int, int]] = []
    for item in raw.split(b","):
        partition, colon, offset = item.partition(b":")
        if not colon:
            raise _broken("next offsets are not <partition>:<offset>,...", line)
        pairs.append(
            (
                _reply_int(partition, line, "partition", 0, INT32_MAX),
                _reply_int(offset, line, "offset", 0, INT64_MAX),
            )
        )
    if len({partition for partition, _ in pairs}) != len(pairs):
        raise _broken("a partition appears twice", line)
    return tuple(pairs)


def _reply_text(raw: bytes) -> str:
    # Text is for people: a stray invalid byte from a server is shown, not fatal.
    return raw.decode("utf-8", "replace")


def _parse_ok(rest: bytes, line: bytes) -> Reply:
    return OkReply(_reply_text(rest))


def _parse_err(rest: bytes, line: bytes) -> Reply:
    raw_code, _, message = rest.partition(b" ")
    if not raw_code:
        raise _broken("no error code", line)
    code = ErrorCode.__members__.get(raw_code.decode("ascii", "replace"))
    if code is None:
        # A newer server's code: keep the text, act as on INTERNAL (not retriable, outcome unknown).
        return ErrorReply(ErrorCode.INTERNAL, _reply_text(rest))
    return ErrorReply(code, _reply_text(message))


def _parse_msg(rest: bytes, line: bytes) -> Reply:
    fields = rest.split(b" ", 3)
    if len(fields) < 3:
        raise _broken("+MSG needs partition, offset and key", line)
    raw_key = fields[2]
    return MessageRow(
        _reply_int(fields[0], line, "partition", 0, INT32_MAX),
        _reply_int(fields[1], line, "offset", 0, INT64_MAX),
        None if raw_key == b"-" else unescape(raw_key),
        unescape(fields[3]) if len(fields) == 4 else None,
    )


def _parse_topic_row(rest: bytes, line: bytes) -> Reply:
    fields = rest.split(b" ")
    if len(fields) < 3:
        raise _broken("+TOPIC needs name, partitions and replication factor", line)
    options = _reply_options(
        fields[3:], line, frozenset({b"retention_ms", b"retention_bytes", b"compact", b"fsync"})
    )
    retention_ms, retention_bytes = options.get(b"retention_ms"), options.get(b"retention_bytes")
    compact = options.get(b"compact", b"no")
    if compact not in (b"yes", b"no"):
        raise _broken("compact is not yes or no", line)
    fsync_raw = options.get(b"fsync")
    fsync = None
    if fsync_raw is not None:
        try:
            fsync = Fsync(fsync_raw.decode("ascii"))
        except ValueError:  # UnicodeDecodeError is a ValueError too
            raise _broken(f"fsync {show(fsync_raw)} is not a policy", line) from None
    return TopicRow(
        _reply_topic(fields[0], line),
        _reply_int(fields[1], line, "partitions", 1, INT32_MAX),
        _reply_int(fields[2], line, "replication factor", 1, INT16_MAX),
        None
        if retention_ms is None
        else _reply_int(retention_ms, line, "retention_ms", -1, INT64_MAX),
        None
        if retention_bytes is None
        else _reply_int(retention_bytes, line, "retention_bytes", -1, INT64_MAX),
        compact == b"yes",
        fsync,
    )


def _parse_partition_row(rest: bytes, line: bytes) -> Reply:
    fields = rest.split(b" ")
    if len(fields) < 4:
        raise _broken("+PARTITION needs topic, partition, leader= and replicas=", line)
    options = _reply_options(
        fields[2:], line, frozenset({b"leader", b"replicas", b"start", b"end", b"time_offset"})
    )
    leader, replicas = options.get(b"leader"), options.get(b"replicas")
    if leader is None or replicas is None:
        raise _broken("+PARTITION needs leader= and replicas=", line)
    start, end = options.get(b"start"), options.get(b"end")
    at_time = options.get(b"time_offset")
    return PartitionRow(
        _reply_topic(fields[0], line),
        _reply_int(fields[1], line, "partition", 0, INT32_MAX),
        None if leader == b"-" else _reply_int(leader, line, "leader", 0, INT32_MAX),
        tuple(_reply_int(r, line, "replica", 0, INT32_MAX) for r in replicas.split(b",")),
        None if start is None else _reply_int(start, line, "start", 0, INT64_MAX),
        None if end is None else _reply_int(end, line, "end", 0, INT64_MAX),
        None if at_time is None else _reply_int(at_time, line, "time_offset", 0, INT64_MAX),
    )


def _parse_broker_row(rest: bytes, line: bytes) -> Reply:
    fields = rest.split(b" ")
    if len(fields) < 3:
        raise _broken("+BROKER needs id, host and port", line)
    host = fields[1].decode("ascii", "replace")
    if name_error(host) is not None:
        raise _broken("invalid host", line)
    # Fields a later broker adds are skipped (the row's own port fields are all optional).
    options = _reply_options(fields[3:], line, None)
    ports = (options.get(key) for key in _PORT_KEYS)
    return BrokerRow(
        _reply_int(fields[0], line, "broker id", 0, INT32_MAX),
        host,
        _reply_int(fields[2], line, "port", 0, 65535),
        *(None if p is None else _reply_int(p, line, "port", 0, 65535) for p in ports),
    )


# +BROKER's optional fields, in BrokerRow's order.
_PORT_KEYS = (b"mqtt", b"mqtt_tls", b"mqtt_ws", b"kafka", b"http")


def _parse_offset_row(rest: bytes, line: bytes) -> Reply:
    fields = rest.split(b" ")
    if len(fields) != 3:
        raise _broken("+OFFSET needs topic, partition and offset", line)
    return OffsetRow(
        _reply_topic(fields[0], line),
        _reply_int(fields[1], line, "partition", 0, INT32_MAX),
        None if fields[2] == b"-" else _reply_int(fields[2], line, "offset", 0, INT64_MAX),
    )


def _parse_group_row(rest: bytes, line: bytes) -> Reply:
    fields = rest.split(b" ")
    if len(fields) != 6:
        raise _broken("+GROUP needs group, topic, partition, owner, committed and end", line)
    group, topic, partition, owner, committed, end = fields
    if name_error(group.decode("ascii", "replace")) is not None or not owner:
        raise _broken("+GROUP group or owner", line)
    return GroupRow(
        group.decode(),
        _reply_topic(topic, line),
        _reply_int(partition, line, "partition", 0, INT32_MAX),
        None if owner == b"-" else owner.decode("ascii", "replace"),
        None if committed == b"-" else _reply_int(committed, line, "committed", 0, INT64_MAX),
        None if end == b"-" else _reply_int(end, line, "end", 0, INT64_MAX),
    )


def _reply_name(raw: bytes, line: bytes, what: str) -> str:
    name = raw.decode("ascii", "replace")
    if name_error(name) is not None:
        raise _broken(f"invalid {what}", line)
    return name


def _parse_group_state_row(rest: bytes, line: bytes) -> Reply:
    fields = rest.split(b" ")
    if len(fields) != 4:
        raise _broken("+GROUPSTATE needs group, topic, state and members", line)
    return GroupStateRow(
        _reply_name(fields[0], line, "group"),
        _reply_topic(fields[1], line),
        _reply_name(fields[2], line, "state"),
        _reply_int(fields[3], line, "members", 0, INT32_MAX),
    )


def _parse_member_row(rest: bytes, line: bytes) -> Reply:
    fields = rest.split(b" ")
    if len(fields) != 4:
        raise _broken("+MEMBER needs group, topic, member and partitions", line)
    partitions = () if fields[3] == b"-" else fields[3].split(b",")
    return MemberRow(
        _reply_name(fields[0], line, "group"),
        _reply_topic(fields[1], line),
        _reply_name(fields[2], line, "member"),
        tuple(_reply_int(p, line, "partition", 0, INT32_MAX) for p in partitions),
    )


def _reply_enum(raw: bytes, enum: type[_E], line: bytes) -> _E:
    try:
        return enum(raw.decode("ascii"))
    except ValueError:  # UnicodeDecodeError is a ValueError too
        raise _broken(f"{show(raw)} is not a {enum.__name__}", line) from None


def _parse_acl_row(rest: bytes, line: bytes) -> Reply:
    fields = rest.split(b" ")
    if len(fields) != 6:
        raise _broken("+ACL needs principal, permission, operation, resource, pattern, name", line)
    try:
        principal = fields[0].decode("utf-8")
    except UnicodeDecodeError:
        raise _broken("the principal is not UTF-8", line) from None
    acl = AclRow(
        principal,
        _reply_enum(fields[1], AclPermission, line),
        _reply_enum(fields[2], AclOperation, line),
        _reply_enum(fields[3], AclResource, line),
        _reply_enum(fields[4], AclPattern, line),
        fields[5].decode("ascii", "replace"),
    )
    reason = acl_row_error(acl)
    if reason is not None:
        raise _broken(reason, line)
    return acl


def _parse_info_row(rest: bytes, line: bytes) -> Reply:
    return InfoRow(_reply_text(rest))


def _parse_end(rest: bytes, line: bytes) -> Reply:
    return EndReply(_reply_pairs(rest, line) if rest else ())


_REPLY_PARSERS: Final[dict[bytes, Callable[[bytes, bytes], Reply]]] = {
    b"+OK": _parse_ok,
    b"-ERR": _parse_err,
    b"+MSG": _parse_msg,
    b"+TOPIC": _parse_topic_row,
    b"+PARTITION": _parse_partition_row,
    b"+BROKER": _parse_broker_row,
    b"+OFFSET": _parse_offset_row,
    b"+GROUP": _parse_group_row,
    b"+GROUPSTATE": _parse_group_state_row,
    b"+MEMBER": _parse_member_row,
    b"+ACL": _parse_acl_row,
    b"+INFO": _parse_info_row,
    b"+END": _parse_end,
}


class _ReplyState(Enum):
    LINE = "line"
    PAYLOAD = "payload"  # collecting a +DATA payload and the CRLF after it
    BROKEN = "broken"  # a RemoteProtocolError was raised; nothing more is decoded


class ReplyDecoder:
    """Turns the bytes a server sends into ``Reply`` events (client side).

    Usage as ``LineDecoder``: ``feed`` then ``next_event`` until ``NEED_DATA``. Replies come in the
    order of the commands sent; a list reply is its rows then an ``EndReply``. Accepts CRLF or LF.

    Raises ``RemoteProtocolError`` for bytes that break the reply grammar, a line longer than
    ``limits.max_line_length`` or a payload longer than ``limits.max_payload``; from then on every
    call raises it again, because the client can no longer match replies to requests and must
    close the connection. An error code this version does not know becomes
    ``ErrorReply(INTERNAL, "<CODE> <message>")`` instead, so a newer server does not break it.
    """

    __slots__ = ("_buf", "_data", "_limits", "_pos", "_scan", "_state")

    def __init__(self, limits: LineLimits = DEFAULT_REPLY_LIMITS) -> None:
        self._limits = limits
        self._buf = bytearray()
        self._pos = 0  # Invariant: _pos <= _scan <= len(_buf), no LF in _buf[_pos:_scan].
        self._scan = 0
        self._state = _ReplyState.LINE
        self._data: tuple[int, int, int | None] = (0, 0, None)  # next_offset, length, hw

    @property
    def limits(self) -> LineLimits:
        """The limits this decoder enforces."""
        return self._limits

    @property
    def buffered_bytes(self) -> int:
        """How many received bytes are held, not yet turned into replies."""
        return len(self._buf) - self._pos

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Add bytes received from the server. Raises ``LocalProtocolError`` for non-bytes."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise LocalProtocolError(f"feed() takes bytes, not {type(data).__name__}")
        if self._state is not _ReplyState.BROKEN:
            self._buf += data

    def next_event(self) -> Reply | NeedData:
        """The next reply, or ``NEED_DATA``. Raises ``RemoteProtocolError`` (see the class)."""
        if self._state is _ReplyState.BROKEN:
            raise RemoteProtocolError("the reply stream broke earlier; close the connection")
        try:
            return self._next_event()
        except RemoteProtocolError:
            self._state = _ReplyState.BROKEN
            self._buf.clear()
            self._pos = self._scan = 0
            raise

    def events(self) -> Iterator[Reply]:
        """Every reply the bytes fed so far complete (``next_event`` until ``NEED_DATA``)."""
        while True:
            event = self.next_event()
            if event is NEED_DATA:
                return
            yield event

    def _next_event(self) -> Reply | NeedData:
        buf = self._buf
        pos = self._pos
        if self._state is _ReplyState.PAYLOAD:
            next_offset, length, hw = self._data
            end = pos + length
            if len(buf) < end + 2 and not (len(buf) == end + 1 and buf[end] != 13):
                return self._need_data()
            if buf[end] == 10:
                after = end + 1
            elif buf[end] == 13 and buf[end + 1] == 10:
                after = end + 2
            else:
                raise _broken("+DATA payload not followed by CRLF", bytes(buf[end : end + 2]))
            payload = bytes(buf[pos:end])
            self._pos = self._scan = after
            self._state = _ReplyState.LINE
            return DataReply(next_offset, payload, hw)
        newline = buf.find(b"\n", self._scan)
        limit = self._limits.max_line_length
        if newline < 0:
            if len(buf) - pos > limit + 1:
                raise _broken(f"line longer than {limit} bytes", bytes(buf[pos : pos + 60]))
            return self._need_data()
        line = bytes(buf[pos:newline])
        self._pos = self._scan = newline + 1
        if line[-1:] == b"\r":
            line = line[:-1]
        if len(line) > limit:
            raise _broken(f"line longer than {limit} bytes", line)
        head, _, rest = line.partition(b" ")
        parser = _REPLY_PARSERS.get(head)
        if parser is not None:
            return parser(rest, line)
        if head != b"+DATA":
            raise _broken("unknown reply", line)
        fields = rest.split(b" ")
        if not 2 <= len(fields) <= 3:
            raise _broken("+DATA needs next_offset and nbytes", line)
        raw_hw = _reply_options(fields[2:], line, frozenset({b"hw"})).get(b"hw")
        length = _reply_int(fields[1], line, "nbytes", 0, INT64_MAX)
        if length > self._limits.max_payload:
            raise _broken(f"payload larger than {self._limits.max_payload} bytes", line)
        self._data = (
            _reply_int(fields[0], line, "next_offset", 0, INT64_MAX),
            length,
            None if raw_hw is None else _reply_int(raw_hw, line, "hw", 0, INT64_MAX),
        )
        self._state = _ReplyState.PAYLOAD
        return self._next_event()

    def _need_data(self) -> NeedData:
        if self._pos:
            del self._buf[: self._pos]
            self._scan -= self._pos
            self._pos = 0
        if self._state is _ReplyState.LINE:
            self._scan = len(self._buf)
        return NEED_DATA
