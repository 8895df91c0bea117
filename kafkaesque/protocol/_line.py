"""The telnet-friendly line protocol, sans I/O: bytes in, events out; events in, bytes out.

Server side: ``LineDecoder`` turns the bytes a client sent into commands (``feed`` then
``next_event`` until ``NEED_DATA``), and ``encode_reply`` turns replies into bytes. Client side:
``encode_command`` and ``ReplyDecoder``. No sockets, no clock, no threads: the broker owns those
(as h11 leaves them to its caller). The grammar is written down in ``docs/protocol.md``.

Framing. A command is one line ended by LF (a CR before it is dropped; CRLF and LF may mix). Two
commands carry a binary payload after their line, memcached style: ``PUBB ... nbytes`` and
``PUB ... bytes=N`` announce N bytes, which follow the line and are followed by CRLF (or LF). A
reply is one line ended by CRLF, except ``+DATA next nbytes`` which is followed the same way by its
payload. Replies come in the order of the commands; a list reply is rows ended by ``+END``.

Robustness (what a peer cannot do to the server). A decoder never grows its buffer past about
one line limit plus one ``feed`` (or one payload limit while collecting a payload). A malformed
or oversized command becomes a ``BadCommand`` event, answered like any other command, and the
decoder carries on with the next line; it never raises because of what the peer sent.

Performance. The hot path (a PUBS line) is a handful of C-level bytes operations: ``find`` for
the newline, one ``split``, a dict lookup for the command word and one for the topic (validated
topics are cached), and the event's construction: about 2 microseconds a line on one core of the
development machine (see docs/protocol.md), a small part of a 50k lines/s budget.
"""

from __future__ import annotations

import base64
import binascii
import functools
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum, StrEnum
from typing import Final, TypeAlias, TypeVar

from ._line_commands import (
    AUTH_MECHANISMS,
    DEFAULT_LIMITS,
    DEFAULT_REPLY_LIMITS,
    Acks,
    AclAdd,
    AclList,
    AclOperation,
    AclPattern,
    AclPermission,
    AclRemove,
    AclResource,
    AclRow,
    AddBroker,
    AlterTopic,
    Authenticate,
    BadCommand,
    BrokerRow,
    Command,
    Commit,
    Cons,
    ConsOffsets,
    CreateTopic,
    DataReply,
    DeleteGroup,
    DeleteTopic,
    DescribeGroup,
    DescribeTopic,
    EndReply,
    ErrorCode,
    ErrorReply,
    Fetch,
    FetchFormat,
    FetchOffsets,
    FetchReplica,
    Fsync,
    GroupRow,
    GroupStateRow,
    Help,
    Idempotence,
    InfoRow,
    Latest,
    Leave,
    LineEvent,
    LineLimits,
    ListGroups,
    ListTopics,
    LocalProtocolError,
    MemberRow,
    MessageRow,
    Metadata,
    OffsetRow,
    OkReply,
    PartitionRow,
    Ping,
    PublishBatch,
    PublishRecord,
    Pubs,
    Quit,
    Reassign,
    RemoteProtocolError,
    RemoveBroker,
    Reply,
    ResetKind,
    ResetOffsets,
    Subs,
    TopicRow,
    acl_name_error,
    acl_row_error,
    is_internal_topic,
    name_error,
    principal_error,
    topic_name_error,
)

INT16_MAX: Final = 2**15 - 1
INT32_MAX: Final = 2**31 - 1
INT64_MAX: Final = 2**63 - 1


class NeedData(Enum):
    """The type of ``NEED_DATA``: what ``next_event`` returns when it needs more bytes."""

    NEED_DATA = "NEED_DATA"


NEED_DATA: Final = NeedData.NEED_DATA
"""No complete event is buffered: ``feed`` more bytes, then call ``next_event`` again."""


# ---------------------------------------------------------------------------------------------
# Help: one usage line and one description per command word. The BAD_ARGS messages quote the
# usage, so a telnet user who gets a command wrong sees how to write it.

_HELP: Final[dict[str, tuple[str, str]]] = {
    "PUBS": (
        "PUBS <topic> <message>",
        'Publish the rest of the line (the seed\'s {"Header","Key","Body"} JSON is understood); '
        "a missing topic is created. Replies +OK <partition> <offset>.",
    ),
    "SUBS": (
        "SUBS <topic> <group> [<partitions>]",
        "Join a consumer group (a missing topic is created). Replies +OK <subscription_id>, "
        "then partitions=<got> asked=<partitions> if it got fewer partitions than asked.",
    ),
    "CONS": (
        "CONS <topic> <subscription_id> <offset>|<p>:<o>,... [max=<n>] [wait_ms=<ms>]",
        "Read through a subscription. Replies +MSG <partition> <offset> <key> <value> rows, "
        "then +END <p>:<next>,... to paste into the next CONS.",
    ),
    "PUB": (
        "PUB <topic> [key=<k>] [partition=<p>] [acks=quorum|leader] "
        "[pid=<id> epoch=<e> seq=<s>] [--] <message>   or   ... bytes=<n> then <n> bytes",
        "Publish one record with a key, partition or producer sequence. Replies +OK <partition> "
        "<offset>.",
    ),
    "PUBB": (
        "PUBB <topic> <partition> <nbytes> [acks=quorum|leader]",
        "Then <nbytes> bytes of an encoded record batch and CRLF. Replies +OK <partition> "
        "<base_offset>.",
    ),
    "FETCH": (
        "FETCH <topic> <partition> <offset> [max_bytes=<n>] [wait_ms=<ms>] [format=batch|text] "
        "[replica=any|local]",
        "Read committed data. Replies +DATA <next_offset> <nbytes> and the bytes, or with "
        "format=text +MSG rows and +END. replica=local reads this broker's own replica (up to "
        "its own commit index), never forwarded.",
    ),
    "LATEST": (
        "LATEST <topic> <key>",
        "The newest committed value of <key> (percent-escaped, as PUB key=) in a compacted "
        "topic, from its partition's leader: a +MSG row then +END, or +END alone if the key has "
        "no value (never written, or deleted by a tombstone or retention).",
    ),
    "CREATE": (
        "CREATE <topic> <partitions> <replication_factor> [retention_ms=<ms>] "
        "[retention_bytes=<n>] [compact=yes|no] [fsync=always|interval|never]",
        "Create a topic (-1 retention: unlimited; fsync: the brokers' --fsync if absent). "
        "Replies +OK.",
    ),
    "ALTER": (
        "ALTER <topic> [partitions=<n>] [retention_ms=<ms>] [retention_bytes=<n>] [compact=yes|no]",
        "Change a live topic: add partitions (never fewer; keys then map by the new count), "
        "retention (-1: unlimited), compaction. Replies +OK.",
    ),
    "LIST": ("LIST", "List the topics: +TOPIC rows, then +END."),
    "DESCRIBE": (
        "DESCRIBE <topic> [time=<ms>]",
        "Describe a topic: a +TOPIC row, +PARTITION rows, then +END. With time=, each row's "
        "time_offset= is the first offset whose record timestamp is >= <ms> (else the end).",
    ),
    "DELETE": ("DELETE <topic>", "Delete a topic. Replies +OK."),
    "COMMIT": (
        "COMMIT <group> <topic> <partition> <offset>",
        "Commit the next offset the group will read. Replies +OK.",
    ),
    "OFFSETS": (
        "OFFSETS <group> <topic>",
        "Read a group's committed offsets: +OFFSET rows, then +END.",
    ),
    "LEAVE": (
        "LEAVE <subscription_id>",
        "Leave the subscription's group now (closing the connection does it too). Replies +OK.",
    ),
    "GROUPS": (
        "GROUPS [<group> [<topic>]]",
        "No argument: the groups, a +GROUPSTATE <group> <topic> <state> <members> row each. With "
        "<group>: per topic it reads (or <topic>), +GROUPSTATE, +MEMBER <group> <topic> <member> "
        "<partitions> rows, +GROUP <group> <topic> <partition> <owner> <committed> <end> rows (- "
        "for none; lag = end - committed). Then +END.",
    ),
    "RESETOFFSETS": (
        "RESETOFFSETS <group> <topic> earliest|latest|offset=<n>|time=<ms> [dry_run=yes]",
        "Move an inactive group's committed offsets on <topic> (backwards too): to each "
        "partition's start, end, <n> (kept within start..end) or first offset at or after <ms>. "
        "+OFFSET rows with the new offsets, then +END. dry_run=yes: only show them.",
    ),
    "DELGROUP": (
        "DELGROUP <group>",
        "Delete an inactive group: its committed offsets on every topic. Replies +OK.",
    ),
    "METADATA": (
        "METADATA [<topic> ...]",
        "Brokers and partition leaders: +BROKER rows, +PARTITION rows, then +END.",
    ),
    "REASSIGN": (
        "REASSIGN <topic> <partition> <broker>,<broker>...",
        "Move a partition's replicas, one broker at a time. Replies +OK once they are these.",
    ),
    "ADDBROKER": (
        "ADDBROKER <id> <peer_host:port> <controller_host:port>",
        "Admit a broker started with --join to the cluster. Replies +OK.",
    ),
    "REMOVEBROKER": (
        "REMOVEBROKER <id>",
        "Decommission a broker: move its replicas away, take it out of the controller quorum "
        "and the registry. Replies +OK moved=<partitions>; refused if a partition would fall "
        "below its replication factor.",
    ),
    "AUTH": (
        "AUTH SCRAM-SHA-256|PLAIN <base64>",
        "One step of a SASL exchange (docs/security.md). Replies +OK continue <base64> (send "
        "the next step) or +OK authenticated <user> [<base64 server-final>]; a broker with a "
        "users file answers nothing but PING, HELP, QUIT and AUTH before it.",
    ),
    "ACL": (
        "ACL ADD|REMOVE <principal> allow|deny <operation> topic|group|cluster "
        "literal|prefixed <name>   or   ACL LIST [<principal>]",
        "Manage the access rules (principal User:<name> or User:*; operation read, write, "
        "create, delete, alter, describe, commit, admin or all; cluster's name kafka-cluster). "
        "ADD replies +OK, REMOVE +OK removed=<0|1>, LIST +ACL rows then +END.",
    ),
    "HELP": ("HELP [<command>]", "This help."),
    "PING": ("PING", "Replies +OK PONG."),
    "QUIT": ("QUIT", "Replies +OK bye and closes the connection."),
}

COMMAND_WORDS: Final = tuple(_HELP)
"""Every command word, in the order HELP lists them."""


def help_replies(command: str | None = None) -> tuple[InfoRow | EndReply, ...]:
    """The reply to ``HELP [command]``: ``+INFO`` rows then ``+END``.

    ``command`` is a word of ``COMMAND_WORDS`` (as ``LineDecoder`` produces it), or None for the
    summary of every command. Raises ``LocalProtocolError`` for an unknown word.
    """
    if command is None:
        rows = [InfoRow(usage) for usage, _ in _HELP.values()]
        rows.append(
            InfoRow("One command a line; HELP <command> explains one. See docs/protocol.md.")
        )
        return (*rows, EndReply())
    entry = _HELP.get(command)
    if entry is None:
        raise LocalProtocolError(f"no help for unknown command {command!r}")
    return InfoRow(entry[0]), InfoRow(entry[1]), EndReply()


def _usage(word: str) -> str:
    return f"usage: {_HELP[word][0]}"


# ---------------------------------------------------------------------------------------------
# Byte-level helpers.

_CRLF: Final = b"\r\n"
_OPTION_RE: Final = re.compile(rb"[A-Za-z_]+=")

# Lenient percent-escaping, for keys (request and reply) and for values shown in +MSG rows.
# Only the bytes that would break the line are escaped, plus '%' when (and only when) two hex
# digits follow it, so ordinary text, "100%" included, reads as typed; decoding replaces %XX only.
# A key is one token, so it also escapes the space; a value is the rest of a line and keeps
# spaces and tabs. 0xFF (telnet's IAC) is escaped so telnet clients do not eat it.
_KEY_ESCAPE_RE: Final = re.compile(rb"[\x00-\x20\x7f\xff]|%(?=[0-9A-Fa-f]{2})")
_VALUE_ESCAPE_RE: Final = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f\xff]|%(?=[0-9A-Fa-f]{2})")
_UNESCAPE_RE: Final = re.compile(rb"%([0-9A-Fa-f]{2})")


def _escape_one(match: re.Match[bytes]) -> bytes:
    return b"%%%02X" % match.group()[0]


def _unescape_one(match: re.Match[bytes]) -> bytes:
    return bytes((int(match.group(1), 16),))


def escape_key(key: bytes) -> bytes:
    """Percent-escape ``key`` into one token of printable ASCII (the inverse of ``unescape``)."""
    return _KEY_ESCAPE_RE.sub(_escape_one, key)


def escape_value(value: bytes) -> bytes:
    """Percent-escape ``value`` for the end of a ``+MSG`` line (the inverse of ``unescape``)."""
    return _VALUE_ESCAPE_RE.sub(_escape_one, value)


def unescape(raw: bytes) -> bytes:
    """Replace every ``%XX`` (two hex digits) by its byte; any other ``%`` stays as it is."""
    if b"%" not in raw:
        return raw
    return _UNESCAPE_RE.sub(_unescape_one, raw)


# Telnet (RFC 854). IAC (0xFF) starts a command: IAC IAC is a data byte 0xFF; IAC + WILL/WONT/
# DO/DONT (0xFB-0xFE) + an option byte is a 3-byte negotiation, IAC SB ... IAC SE (0xFA ... 0xFF
# 0xF0, with IAC IAC for a 0xFF inside) a subnegotiation, and IAC + any other command byte
# (0xF0-0xF9: SE, NOP, DM, BRK, IP, AO, AYT, EC, EL, GA) a 2-byte command. A broker that never
# negotiates drops the commands; a telnet client sends them when its user presses Ctrl-C ("IAC
# IP") and the like. Anything else after an IAC (a data byte, the end of the line) is not telnet:
# the last alternative matches the lone IAC, and the line is refused rather than guessed at.
_TELNET_RE: Final = re.compile(
    rb"\xff(?:\xff|[\xfb-\xfe].|\xfa(?:[^\xff]|\xff\xff)*\xff\xf0|[\xf0-\xf9]|)", re.DOTALL
)


def _telnet_one(match: re.Match[bytes]) -> bytes:
    """A telnet sequence's replacement: 0xFF for IAC IAC, nothing for a command; raises
    ``_Reject`` for a lone IAC (see ``_TELNET_RE``)."""
    sequence = match.group()
    if sequence == b"\xff\xff":
        return b"\xff"
    if len(sequence) > 1:
        return b""
    line, at = match.string, match.start()
    after = line[at + 1 : at + 2]
    if not after:
        what = "ends the line"
    elif after == b"\xfa":
        what = "starts a subnegotiation (SB) with no IAC SE on the line"
    elif after[0] >= 0xFB:
        what = "starts a negotiation with no option byte on the line"
    else:
        what = f"is followed by 0x{after[0]:02X}, which is no telnet command"
    raise _Reject(
        ErrorCode.BAD_ARGS,
        f"byte 0xFF (telnet IAC) at column {at + 1} {what}; a data byte 0xFF is sent doubled "
        "(IAC IAC): the line is refused, not guessed at",
    )


def _show(raw: bytes) -> str:
    """A peer's bytes, shortened and made printable ASCII, for an error message."""
    shown = repr(raw[:60])[1:]
    return shown + "..." if len(raw) > 60 else shown


def _parse_int(raw: bytes, lo: int, hi: int) -> int | None:
    """``raw`` as a decimal integer in [lo, hi], or None. Only ASCII digits and, if lo < 0, '-'.

    ``int()`` alone would also accept spaces, '+' and '_' separators, which no peer should send.
    """
    digits = raw[1:] if lo < 0 and raw[:1] == b"-" else raw
    if not digits.isdigit() or len(digits) > 19:
        return None
    value = int(raw)
    return value if lo <= value <= hi else None


_E = TypeVar("_E", bound=StrEnum)


# ---------------------------------------------------------------------------------------------
# The server side: LineDecoder.


class _Reject(Exception):
    """Raised inside a command parser; ``LineDecoder`` turns it into a ``BadCommand`` event."""

    def __init__(self, code: ErrorCode, message: str, *, framing_error: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.framing_error = framing_error

    def event(self) -> BadCommand:
        return BadCommand(self.code, self.message, self.framing_error)


@dataclass(slots=True)
class _Payload:
    """A parser's answer for a command line that announces a payload of ``length`` bytes.

    Exactly one of ``build`` (turns the payload into the command) and ``error`` (the command is
    rejected; its payload is skipped so the next command is found) is set.
    """

    length: int
    build: Callable[[bytes], Command] | None
    error: BadCommand | None


def _arg_int(raw: bytes, what: str, lo: int, hi: int) -> int:
    value = _parse_int(raw, lo, hi)
    if value is None:
        raise _Reject(
            ErrorCode.BAD_ARGS, f"{what} must be an integer from {lo} to {hi}, not {_show(raw)}"
        )
    return value


def _arg_name(raw: bytes, what: str) -> str:
    name = raw.decode("ascii", "replace")
    reason = name_error(name)
    if reason is not None:
        raise _Reject(ErrorCode.BAD_ARGS, f"invalid {what} {_show(raw)}: {reason}")
    return name


def _arg_enum(raw: bytes, enum: type[_E], what: str) -> _E:
    try:
        return enum(raw.decode("ascii").lower())
    except ValueError:  # UnicodeDecodeError is a ValueError too
        choices = "|".join(member.value for member in enum)
        raise _Reject(ErrorCode.BAD_ARGS, f"{what} must be {choices}, not {_show(raw)}") from None


_TRUE: Final = frozenset({b"yes", b"true", b"on", b"1"})
_FALSE: Final = frozenset({b"no", b"false", b"off", b"0"})


def _arg_bool(raw: bytes, what: str) -> bool:
    folded = raw.lower()
    if folded in _TRUE:
        return True
    if folded in _FALSE:
        return False
    raise _Reject(ErrorCode.BAD_ARGS, f"{what} must be yes or no, not {_show(raw)}")


def _arg_address(raw: bytes, what: str) -> str:
    host, sep, port = _arg_name(raw, what).rpartition(":")
    if not sep or not host or _parse_int(port.encode(), 0, 65535) is None:
        raise _Reject(ErrorCode.BAD_ARGS, f"{what} must be host:port, not {_show(raw)}")
    return f"{host}:{port}"


def _arg_options(tokens: list[bytes], allowed: frozenset[str], word: str) -> dict[str, bytes]:
    """``name=value`` tokens into a dict; an unknown, malformed or repeated option is rejected."""
    options: dict[str, bytes] = {}
    for token in tokens:
        name, eq, value = token.partition(b"=")
        key = name.decode("ascii", "replace").lower()
        if not eq or key not in allowed:
            hint = " (put -- before a message that starts with name=)" if word == "PUB" else ""
            raise _Reject(
                ErrorCode.BAD_ARGS, f"unexpected argument {_show(token)}{hint}; {_usage(word)}"
            )
        if key in options:
            raise _Reject(ErrorCode.BAD_ARGS, f"option {key}= given twice")
        options[key] = value
    return options


def _arg_tokens(line: bytes, word: str, positional: int, optional: int = 0) -> list[bytes]:
    """The tokens after the command word: ``positional`` required, up to ``optional`` more."""
    tokens = line.split()[1:]
    if not positional <= len(tokens) <= positional + optional:
        raise _Reject(ErrorCode.BAD_ARGS, _usage(word))
    return tokens


def _arg_cons_offsets(raw: bytes) -> ConsOffsets:
    if raw.isdigit():
        return _arg_int(raw, "offset", 0, INT64_MAX)
    pairs: list[tuple[int, int]] = []
    for item in raw.split(b","):
        partition, colon, offset = item.partition(b":")
        if not colon:
            raise _Reject(
                ErrorCode.BAD_ARGS,
                f"offset must be <offset> or <partition>:<offset>,..., not {_show(raw)}",
            )
        pair = (
            _arg_int(partition, "partition", 0, INT32_MAX),
            _arg_int(offset, "offset", 0, INT64_MAX),
        )
        if any(pair[0] == seen for seen, _ in pairs):
            raise _Reject(ErrorCode.BAD_ARGS, f"partition {pair[0]} given twice in {_show(raw)}")
        pairs.append(pair)
    return tuple(pairs)


def _arg_principal(raw: bytes) -> str:
    try:
        principal = raw.decode("utf-8")  # a user's name may be any printable text
    except UnicodeDecodeError:
        principal = ""  # refused below
    reason = principal_error(principal)
    if reason is not None:
        raise _Reject(
            ErrorCode.BAD_ARGS, f"invalid principal {_show(raw)}: {reason}; {_usage('ACL')}"
        )
    return principal


def _arg_acl(tokens: list[bytes]) -> AclRow:
    """The six words of ``ACL ADD|REMOVE`` (principal to name) as an ``AclRow``."""
    principal = _arg_principal(tokens[0])
    permission = _arg_enum(tokens[1], AclPermission, "permission")
    operation = _arg_enum(tokens[2], AclOperation, "operation")
    resource = _arg_enum(tokens[3], AclResource, "resource")
    pattern = _arg_enum(tokens[4], AclPattern, "pattern")
    name = tokens[5].decode("ascii", "replace")
    reason = acl_name_error(resource, pattern, name)
    if reason is not None:
        raise _Reject(ErrorCode.BAD_ARGS, f"invalid {resource} name {_show(tokens[5])}: {reason}")
    return AclRow(principal, permission, operation, resource, pattern, name)


_TOPIC_CACHE_SIZE: Final = 4096


class _State(Enum):
    """Where ``LineDecoder`` is in the byte stream. The transitions, all of them:

    ========  ===========================================================  ========
    from      on                                                           to
    ========  ===========================================================  ========
    LINE      a line announcing a payload of N <= max_payload bytes        PAYLOAD
    LINE      a line announcing N > max_payload bytes, or rejected         SKIP
    LINE      max_line_length + 2 bytes without a LF                       DISCARD
    PAYLOAD   N bytes then CRLF or LF                                      LINE
    PAYLOAD   N bytes then anything else (framing error)                   DISCARD
    SKIP      N bytes                                                      DISCARD
    DISCARD   a LF                                                         LINE
    ========  ===========================================================  ========
    """

    LINE = "line"  # looking for the end of the next command line
    PAYLOAD = "payload"  # collecting the payload announced by the last line, then its CRLF
    SKIP = "skip"  # dropping the payload of a rejected command, then DISCARD its CRLF
    DISCARD = "discard"  # dropping bytes up to and including the next LF (resynchronizing)


_Parser: TypeAlias = "Callable[[LineDecoder, list[bytes], bytes], LineEvent | _Payload]"


class LineDecoder:
    """Turns the bytes a client sends into ``Command`` and ``BadCommand`` events (server side).

    Usage: ``feed(data)`` whatever the socket gave, then call ``next_event()`` until it returns
    ``NEED_DATA``; answer each event, in order, with one reply. Empty lines yield nothing.

    Guarantees: events come out in the order the commands were sent, whatever the chunking of the
    bytes fed in; no method raises because of the peer's bytes (only ``LocalProtocolError`` for a
    caller's mistake); memory stays bounded by the limits plus one fed chunk:

    * A line longer than ``limits.max_line_length`` yields ``BadCommand(TOO_LARGE)`` as soon as
      that is certain; its bytes are dropped as they arrive, up to the next LF.
    * A payload longer than ``limits.max_payload`` yields ``BadCommand(TOO_LARGE)`` before any of
      it is buffered, and its N bytes are then skipped as they arrive (with the CRLF after them),
      so the connection stays usable; we chose skipping over closing, as memcached does, because
      the peer announced N and pipelined commands behind it should still be answered.
    * A payload not followed by CRLF, or whose length cannot be read, yields a ``BadCommand``
      with ``framing_error=True`` (see there): the decoder resynchronizes at the next LF.

    Not thread-safe; one decoder per connection.
    """

    __slots__ = (
        "_buf",
        "_build",
        "_limits",
        "_max_line",
        "_pos",
        "_remaining",
        "_scan",
        "_state",
        "_topics",
        "_writable",
    )

    def __init__(self, limits: LineLimits = DEFAULT_LIMITS) -> None:
        self._limits = limits
        self._max_line = limits.max_line_length
        self._buf = bytearray()
        # Invariant: _pos <= _scan <= len(_buf); _buf[_pos:_scan] holds no LF (in state LINE).
        self._pos = 0
        self._scan = 0
        self._state = _State.LINE
        self._remaining = 0  # bytes of payload still to collect (PAYLOAD) or to drop (SKIP)
        self._build: Callable[[bytes], Command] | None = None
        # Validated topic names by their bytes: most lines name one of a few hot topics.
        self._topics: dict[bytes, str] = {}
        self._writable: dict[bytes, str] = {}  # the non-internal ones among _topics

    @property
    def limits(self) -> LineLimits:
        """The limits this decoder enforces."""
        return self._limits

    @property
    def buffered_bytes(self) -> int:
        """How many received bytes are held, not yet turned into events."""
        return len(self._buf) - self._pos

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Add bytes received from the peer. Call ``next_event`` afterwards.

        Raises ``LocalProtocolError`` if ``data`` is not bytes-like.
        """
        if type(data) is not bytes:
            if not isinstance(data, (bytearray, memoryview)):
                raise LocalProtocolError(f"feed() takes bytes, not {type(data).__name__}")
            data = bytes(data)
        if not data:
            return
        if self._pos == len(self._buf):
            # Nothing is buffered, so bytes that are to be dropped need not be copied first: this
            # is what keeps an oversized line or payload from ever being held in memory.
            self._buf.clear()
            self._pos = self._scan = 0
            if self._state is _State.SKIP:
                if len(data) < self._remaining:
                    self._remaining -= len(data)
                    return
                data = data[self._remaining :]
                self._remaining = 0
                self._state = _State.DISCARD
            if self._state is _State.DISCARD:
                newline = data.find(b"\n")
                if newline < 0:
                    return
                data = data[newline + 1 :]
                self._state = _State.LINE
        self._buf += data

    def next_event(self) -> LineEvent | NeedData:
        """The next command (or ``BadCommand``) from the bytes fed so far, or ``NEED_DATA``."""
        buf = self._buf
        while True:
            state = self._state
            pos = self._pos
            if state is _State.LINE:
                newline = buf.find(b"\n", self._scan)
                if newline < 0:
                    if len(buf) - pos > self._max_line + 1:  # +1: room for a CR before the LF
                        buf.clear()
                        self._pos = self._scan = 0
                        self._state = _State.DISCARD
                        return BadCommand(
                            ErrorCode.TOO_LARGE,
                            f"line longer than {self._max_line} bytes; dropped up to its end",
                        )
                    return self._need_data()
                self._pos = self._scan = newline + 1
                length = newline - pos
                if length and buf[newline - 1] == 13:
                    length -= 1
                if length > self._max_line:
                    return BadCommand(
                        ErrorCode.TOO_LARGE,
                        f"line of {length} bytes exceeds the limit of {self._max_line}",
                    )
                event = self._parse_line(bytes(buf[pos:newline]))
                if event is None:
                    continue
                if isinstance(event, _Payload):
                    rejected = self._start_payload(event)
                    if rejected is None:
                        continue
                    return rejected
                return event
            if state is _State.PAYLOAD:
                end = pos + self._remaining
                if len(buf) <= end:
                    return self._need_data()
                if buf[end] == 10:
                    after = end + 1
                elif buf[end] == 13 and len(buf) > end + 1 and buf[end + 1] == 10:
                    after = end + 2
                elif buf[end] == 13 and len(buf) == end + 1:
                    return self._need_data()
                else:
                    self._pos = self._scan = end
                    self._state = _State.DISCARD
                    self._build = None
                    return BadCommand(
                        ErrorCode.BAD_ARGS,
                        f"the {self._remaining} bytes of payload are not followed by CRLF; the "
                        "command is dropped and the stream resumes after the next newline",
                        framing_error=True,
                    )
                build = self._build
                assert build is not None  # invariant: set whenever state is PAYLOAD
                payload = bytes(buf[pos:end])
                self._pos = self._scan = after
                self._state = _State.LINE
                self._build = None
                return build(payload)
            if state is _State.SKIP:
                available = len(buf) - pos
                if available < self._remaining:
                    self._remaining -= available
                    buf.clear()
                    self._pos = self._scan = 0
                    return NEED_DATA
                self._pos = self._scan = pos + self._remaining
                self._remaining = 0
                self._state = _State.DISCARD
                continue
            # _State.DISCARD
            newline = buf.find(b"\n", pos)
            if newline < 0:
                buf.clear()
                self._pos = self._scan = 0
                return NEED_DATA
            self._pos = self._scan = newline + 1
            self._state = _State.LINE

    def events(self) -> Iterator[LineEvent]:
        """Every event the bytes fed so far complete (``next_event`` until ``NEED_DATA``)."""
        while True:
            event = self.next_event()
            if event is NEED_DATA:
                return
            yield event

    def _need_data(self) -> NeedData:
        # Drop what was consumed so the buffer holds only the unfinished line or payload.
        if self._pos:
            del self._buf[: self._pos]
            self._scan -= self._pos
            self._pos = 0
        if self._state is _State.LINE:
            self._scan = len(self._buf)
        return NEED_DATA

    def _start_payload(self, announced: _Payload) -> BadCommand | None:
        limit = self._limits.max_payload
        if announced.error is None and announced.length <= limit:
            self._state = _State.PAYLOAD
            self._remaining = announced.length
            self._build = announced.build
            return None
        self._state = _State.SKIP
        self._remaining = announced.length
        if announced.error is not None:
            return announced.error
        return BadCommand(
            ErrorCode.TOO_LARGE,
            f"payload of {announced.length} bytes exceeds the limit of {limit}; skipping its bytes",
        )

    def _parse_line(self, line: bytes) -> LineEvent | _Payload | None:
        """One line (without its LF) into an event; None for a line with nothing on it."""
        if b"\xff" in line:
            try:
                line = _TELNET_RE.sub(_telnet_one, line)
            except _Reject as reject:
                # Refused; but if the line still reads as one announcing a payload, its bytes
                # must be skipped, or they would be taken for command lines.
                announced = self._parse_words(line)
                if isinstance(announced, _Payload):
                    return _Payload(announced.length, None, reject.event())
                return reject.event()
        return self._parse_words(line)

    def _parse_words(self, line: bytes) -> LineEvent | _Payload | None:
        """``_parse_line`` once telnet commands are out of the line."""
        line = line.rstrip(b"\r")
        parts = line.split(None, 2)
        if not parts:
            return None
        word = parts[0]
        parser = _PARSERS.get(word) or _PARSERS.get(word.upper())
        if parser is None:
            return BadCommand(ErrorCode.UNKNOWN_COMMAND, f"unknown command {_show(word)}; try HELP")
        try:
            return parser(self, parts, line)
        except _Reject as reject:
            return reject.event()

    def _topic(self, raw: bytes, internal_ok: bool) -> str:
        """``raw`` as a validated topic name; internal names only if ``internal_ok``."""
        name = self._topics.get(raw)
        if name is None:
            name = raw.decode("ascii", "replace")
            reason = topic_name_error(name, allow_internal=True)
            if reason is not None:
                raise _Reject(ErrorCode.INVALID_TOPIC, f"invalid topic name {_show(raw)}: {reason}")
            if len(self._topics) >= _TOPIC_CACHE_SIZE:
                self._topics.clear()
                self._writable.clear()
            self._topics[raw] = name
            if not is_internal_topic(name):
                self._writable[raw] = name
        if not internal_ok and is_internal_topic(name):
            raise _Reject(
                ErrorCode.INVALID_TOPIC, f"topic {name!r} is internal: it cannot be written here"
            )
        return name

    # One parser per command word. ``parts`` is ``line.split(None, 2)``; ``line`` is the whole line.

    def _parse_pubs(self, parts: list[bytes], line: bytes) -> LineEvent:
        if len(parts) < 3:
            raise _Reject(ErrorCode.BAD_ARGS, _usage("PUBS"))
        # The hot path: a dict lookup answers for a topic this connection has already named.
        return Pubs(self._writable.get(parts[1]) or self._topic(parts[1], False), parts[2])

    def _parse_subs(self, parts: list[bytes], line: bytes) -> LineEvent:
        tokens = _arg_tokens(line, "SUBS", 2, 1)
        return Subs(
            self._topic(tokens[0], True),
            _arg_name(tokens[1], "group"),
            _arg_int(tokens[2], "partitions", 1, INT32_MAX) if len(tokens) == 3 else None,
        )

    def _parse_cons(self, parts: list[bytes], line: bytes) -> LineEvent:
        tokens = _arg_tokens(line, "CONS", 3, 2)
        options = _arg_options(tokens[3:], frozenset({"max", "wait_ms"}), "CONS")
        max_messages, wait_ms = options.get("max"), options.get("wait_ms")
        return Cons(
            self._topic(tokens[0], True),
            _arg_name(tokens[1], "subscription id"),
            _arg_cons_offsets(tokens[2]),
            None if max_messages is None else _arg_int(max_messages, "max", 1, INT32_MAX),
            None if wait_ms is None else _arg_int(wait_ms, "wait_ms", 0, INT32_MAX),
        )

    def _parse_create(self, parts: list[bytes], line: bytes) -> LineEvent:
        tokens = _arg_tokens(line, "CREATE", 3, 4)
        options = _arg_options(
            tokens[3:],
            frozenset({"retention_ms", "retention_bytes", "compact", "fsync"}),
            "CREATE",
        )
        retention_ms, retention_bytes = options.get("retention_ms"), options.get("retention_bytes")
        compact, fsync = options.get("compact"), options.get("fsync")
        return CreateTopic(
            self._topic(tokens[0], False),
            _arg_int(tokens[1], "partitions", 1, INT32_MAX),
            _arg_int(tokens[2], "replication_factor", 1, INT16_MAX),
            None if retention_ms is None else _arg_int(retention_ms, "retention_ms", -1, INT64_MAX),
            None
            if retention_bytes is None
            else _arg_int(retention_bytes, "retention_bytes", -1, INT64_MAX),
            False if compact is None else _arg_bool(compact, "compact"),
            None if fsync is None else _arg_enum(fsync, Fsync, "fsync"),
        )

    def _parse_alter(self, parts: list[bytes], line: bytes) -> LineEvent:
        tokens = _arg_tokens(line, "ALTER", 1, 4)
        options = _arg_options(tokens[1:], _ALTER_OPTIONS, "ALTER")
        if not options:
            raise _Reject(ErrorCode.BAD_ARGS, f"nothing to change; {_usage('ALTER')}")
        partitions, compact = options.get("partitions"), options.get("compact")
        retention_ms, retention_bytes = options.get("retention_ms"), options.get("retention_bytes")
        return AlterTopic(
            self._topic(tokens[0], False),
            None if partitions is None else _arg_int(partitions, "partitions", 1, INT32_MAX),
            None if retention_ms is None else _arg_int(retention_ms, "retention_ms", -1, INT64_MAX),
            None
            if retention_bytes is None
            else _arg_int(retention_bytes, "retention_bytes", -1, INT64_MAX),
            None if compact is None else _arg_bool(compact, "compact"),
        )

    def _parse_list(self, parts: list[bytes], line: bytes) -> LineEvent:
        _arg_tokens(line, "LIST", 0)
        return ListTopics()

    def _parse_describe(self, parts: list[bytes], line: bytes) -> LineEvent:
        tokens = _arg_tokens(line, "DESCRIBE", 1, 1)
        options = _arg_options(tokens[1:], frozenset({"time"}), "DESCRIBE")
        time_ms = options.get("time")
        return DescribeTopic(
            self._topic(tokens[0], True),
            None if time_ms is None else _arg_int(time_ms, "time", 0, INT64_MAX),
        )

    def _parse_delete(self, parts: list[bytes], line: bytes) -> LineEvent:
        tokens = _arg_tokens(line, "DELETE", 1)
        return DeleteTopic(self._topic(tokens[0], False))

    def _parse_pub(self, parts: list[bytes], line: bytes) -> LineEvent | _Payload:
        if len(parts) < 2:
            raise _Reject(ErrorCode.BAD_ARGS, _usage("PUB"))
        # Lexing first, without judging: the options run up to "--" or to the first token that is
        # not name=value; the rest of the line is the message. A bytes= option must be found
        # before anything is rejected, or its payload would be read as command lines.
        rest = parts[2] if len(parts) == 3 else b""
        option_tokens: list[bytes] = []
        message: bytes | None = None
        while rest:
            split = rest.split(None, 1)
            token = split[0]
            tail = split[1] if len(split) == 2 else b""
            if token == b"--":
                message = tail
                break
            if _OPTION_RE.match(token) is None:
                message = rest
                break
            option_tokens.append(token)
            rest = tail
        length_raw = next((t[6:] for t in option_tokens if t[:6].lower() == b"bytes="), None)
        if length_raw is None:
            fields = self._pub_fields(parts[1], option_tokens)
            if not message:
                raise _Reject(
                    ErrorCode.BAD_ARGS,
                    f"missing message (an empty one needs bytes=0); {_usage('PUB')}",
                )
            return PublishRecord(fields[0], message, *fields[1:])
        length = _parse_int(length_raw, 0, INT64_MAX)
        if length is None:
            raise _Reject(
                ErrorCode.BAD_ARGS,
                f"bytes= must be a byte count, not {_show(length_raw)}; lost track of the commands",
                framing_error=True,
            )
        try:
            if message is not None:
                raise _Reject(ErrorCode.BAD_ARGS, "nothing may follow bytes=<n> on the line")
            topic, key, partition, acks, idempotence = self._pub_fields(parts[1], option_tokens)
        except _Reject as reject:
            return _Payload(length, None, reject.event())
        return _Payload(
            length,
            lambda value: PublishRecord(topic, value, key, partition, acks, idempotence),
            None,
        )

    def _pub_fields(
        self, topic_raw: bytes, option_tokens: list[bytes]
    ) -> tuple[str, bytes | None, int | None, Acks, Idempotence | None]:
        """A PUB line's topic and options, validated: ``PublishRecord``'s fields but the value."""
        topic = self._topic(topic_raw, False)
        options = _arg_options(option_tokens, _PUB_OPTIONS, "PUB")
        raw_key, raw_partition = options.get("key"), options.get("partition")
        key = None if raw_key is None else unescape(raw_key)
        partition = (
            None if raw_partition is None else _arg_int(raw_partition, "partition", 0, INT32_MAX)
        )
        raw_acks = options.get("acks")
        acks = Acks.QUORUM if raw_acks is None else _arg_enum(raw_acks, Acks, "acks")
        idempotence = None
        present = _IDEMPOTENCE_OPTIONS.intersection(options)
        if present:
            if present != _IDEMPOTENCE_OPTIONS:
                raise _Reject(ErrorCode.BAD_ARGS, "pid=, epoch= and seq= go together")
            if partition is None:
                raise _Reject(
                    ErrorCode.BAD_ARGS, "pid= needs partition= (sequences count per partition)"
                )
            idempotence = Idempotence(
                _arg_int(options["pid"], "pid", 0, INT64_MAX),
                _arg_int(options["epoch"], "epoch", 0, INT16_MAX),
                _arg_int(options["seq"], "seq", 0, INT32_MAX),
            )
        return topic, key, partition, acks, idempotence

    def _parse_pubb(self, parts: list[bytes], line: bytes) -> LineEvent | _Payload:
        tokens = line.split()[1:]
        if len(tokens) < 3:
            # No length on the line: assume none follows (a person typing), so no framing error.
            raise _Reject(ErrorCode.BAD_ARGS, _usage("PUBB"))
        length = _parse_int(tokens[2], 0, INT64_MAX)
        if length is None:
            raise _Reject(
                ErrorCode.BAD_ARGS,
                f"nbytes must be a byte count, not {_show(tokens[2])}; lost track of the commands",
                framing_error=True,
            )
        try:
            topic = self._topic(tokens[0], False)
            partition = _arg_int(tokens[1], "partition", 0, INT32_MAX)
            raw_acks = _arg_options(tokens[3:], frozenset({"acks"}), "PUBB").get("acks")
            acks = Acks.QUORUM if raw_acks is None else _arg_enum(raw_acks, Acks, "acks")
        except _Reject as reject:
            return _Payload(length, None, reject.event())
        return _Payload(length, lambda batch: PublishBatch(topic, partition, batch, acks), None)

    def _parse_fetch(self, parts: list[bytes], line: bytes) -> LineEvent:
        tokens = _arg_tokens(line, "FETCH", 3, 4)
        options = _arg_options(
            tokens[3:], frozenset({"max_bytes", "wait_ms", "format", "replica"}), "FETCH"
        )
        max_bytes, wait_ms, fmt, replica = (
            options.get("max_bytes"),
            options.get("wait_ms"),
            options.get("format"),
            options.get("replica"),
        )
        return Fetch(
            self._topic(tokens[0], True),
            _arg_int(tokens[1], "partition", 0, INT32_MAX),
            _arg_int(tokens[2], "offset", 0, INT64_MAX),
            None if max_bytes is None else _arg_int(max_bytes, "max_bytes", 1, INT32_MAX),
            None if wait_ms is None else _arg_int(wait_ms, "wait_ms", 0, INT32_MAX),
            FetchFormat.BATCH if fmt is None else _arg_enum(fmt, FetchFormat, "format"),
            FetchReplica.ANY if replica is None else _arg_enum(replica, FetchReplica, "replica"),
        )

    def _parse_latest(self, parts: list[bytes], line: bytes) -> LineEvent:
        tokens = _arg_tokens(line, "LATEST", 2)
        return Latest(self._topic(tokens[0], True), unescape(tokens[1]))

    def _parse_commit(self, parts: list[bytes], line: bytes) -> LineEvent:
        tokens = _arg_tokens(line, "COMMIT", 4, 1)
        options = _arg_options(tokens[4:], frozenset({"member"}), "COMMIT")
        member = options.get("member")
        return Commit(
            _arg_name(tokens[0], "group"),
            self._topic(tokens[1], True),
            _arg_int(tokens[2], "partition", 0, INT32_MAX),
            _arg_int(tokens[3], "offset", 0, INT64_MAX),
            None if member is None else _arg_name(member, "member"),
        )

    def _parse_leave(self, parts: list[bytes], line: bytes) -> LineEvent:
        tokens = _arg_tokens(line, "LEAVE", 1)
        return Leave(_arg_name(tokens[0], "subscription_id"))

    def _parse_groups(self, parts: list[bytes], line: bytes) -> LineEvent:
        tokens = _arg_tokens(line, "GROUPS", 0, 2)
        if not tokens:
            return ListGroups()
        topic = self._topic(tokens[1], True) if len(tokens) == 2 else None
        return DescribeGroup(_arg_name(tokens[0], "group"), topic)

    def _parse_resetoffsets(self, parts: list[bytes], line: bytes) -> LineEvent:
        tokens = _arg_tokens(line, "RESETOFFSETS", 3, 1)
        group, topic = _arg_name(tokens[0], "group"), self._topic(tokens[1], True)
        raw_dry = _arg_options(tokens[3:], frozenset({"dry_run"}), "RESETOFFSETS").get("dry_run")
        dry_run = raw_dry is not None and _arg_bool(raw_dry, "dry_run")
        name, eq, raw = tokens[2].partition(b"=")
        word = name.lower()
        if not eq and word in (b"earliest", b"latest"):
            return ResetOffsets(group, topic, ResetKind(word.decode()), None, dry_run)
        if eq and word in (b"offset", b"time"):
            what = "offset" if word == b"offset" else "time"
            value = _arg_int(raw, what, 0, INT64_MAX)
            return ResetOffsets(group, topic, ResetKind(what), value, dry_run)
        raise _Reject(
            ErrorCode.BAD_ARGS,
            f"reset to earliest, latest, offset=<n> or time=<ms>, not {_show(tokens[2])}",
        )

    def _parse_delgroup(self, parts: list[bytes], line: bytes) -> LineEvent:
        tokens = _arg_tokens(line, "DELGROUP", 1)
        return DeleteGroup(_arg_name(tokens[0], "group"))

    def _parse_offsets(self, parts: list[bytes], line: bytes) -> LineEvent:
        tokens = _arg_tokens(line, "OFFSETS", 2)
        return FetchOffsets(_arg_name(tokens[0], "group"), self._topic(tokens[1], True))

    def _parse_reassign(self, parts: list[bytes], line: bytes) -> LineEvent:
        tokens = _arg_tokens(line, "REASSIGN", 3)
        replicas = tuple(_arg_int(r, "broker", 0, INT32_MAX) for r in tokens[2].split(b","))
        if len(set(replicas)) != len(replicas):
            raise _Reject(ErrorCode.BAD_ARGS, "a broker is listed twice in the replicas")
        return Reassign(
            self._topic(tokens[0], True), _arg_int(tokens[1], "partition", 0, INT32_MAX), replicas
        )

    def _parse_addbroker(self, parts: list[bytes], line: bytes) -> LineEvent:
        tokens = _arg_tokens(line, "ADDBROKER", 3)
        return AddBroker(
            _arg_int(tokens[0], "id", 0, INT32_MAX),
            _arg_address(tokens[1], "peer"),
            _arg_address(tokens[2], "controller"),
        )

    def _parse_removebroker(self, parts: list[bytes], line: bytes) -> LineEvent:
        tokens = _arg_tokens(line, "REMOVEBROKER", 1)
        return RemoveBroker(_arg_int(tokens[0], "id", 0, INT32_MAX))

    def _parse_metadata(self, parts: list[bytes], line: bytes) -> LineEvent:
        tokens = line.split()[1:]
        return Metadata(tuple(self._topic(token, True) for token in tokens))

    def _parse_auth(self, parts: list[bytes], line: bytes) -> LineEvent:
        tokens = _arg_tokens(line, "AUTH", 2)
        mechanism = tokens[0].decode("ascii", "replace").upper()
        if mechanism not in AUTH_MECHANISMS:
            raise _Reject(
                ErrorCode.BAD_ARGS,
                f"mechanism must be {'|'.join(AUTH_MECHANISMS)}, not {_show(tokens[0])}; "
                f"{_usage('AUTH')}",
            )
        # The payload may carry a password (PLAIN): an error never echoes it.
        try:
            payload = base64.b64decode(tokens[1], validate=True)
        except (binascii.Error, ValueError):
            raise _Reject(
                ErrorCode.BAD_ARGS, f"the payload is not base64; {_usage('AUTH')}"
            ) from None
        if not payload:
            raise _Reject(ErrorCode.BAD_ARGS, f"the payload is empty; {_usage('AUTH')}")
        return Authenticate(mechanism, payload)

    def _parse_acl(self, parts: list[bytes], line: bytes) -> LineEvent:
        tokens = line.split()[1:]
        verb = tokens[0].upper() if tokens else b""
        if verb == b"LIST" and len(tokens) <= 2:
            return AclList(_arg_principal(tokens[1]) if len(tokens) == 2 else None)
        if verb in (b"ADD", b"REMOVE") and len(tokens) == 7:
            acl = _arg_acl(tokens[1:])
            return AclAdd(acl) if verb == b"ADD" else AclRemove(acl)
        raise _Reject(ErrorCode.BAD_ARGS, _usage("ACL"))

    def _parse_help(self, parts: list[bytes], line: bytes) -> LineEvent:
        tokens = _arg_tokens(line, "HELP", 0, 1)
        if not tokens:
            return Help()
        word = tokens[0].decode("ascii", "replace").upper()
        if word not in _HELP:
            raise _Reject(ErrorCode.BAD_ARGS, f"no command {_show(tokens[0])}; HELP lists them")
        return Help(word)

    def _parse_ping(self, parts: list[bytes], line: bytes) -> LineEvent:
        _arg_tokens(line, "PING", 0)
        return Ping()

    def _parse_quit(self, parts: list[bytes], line: bytes) -> LineEvent:
        _arg_tokens(line, "QUIT", 0)
        return Quit()


_ALTER_OPTIONS: Final = frozenset({"partitions", "retention_ms", "retention_bytes", "compact"})
_PUB_OPTIONS: Final = frozenset({"key", "partition", "acks", "pid", "epoch", "seq", "bytes"})
_IDEMPOTENCE_OPTIONS: Final = frozenset({"pid", "epoch", "seq"})

_PARSERS: Final[dict[bytes, _Parser]] = {
    b"PUBS": LineDecoder._parse_pubs,
    b"SUBS": LineDecoder._parse_subs,
    b"CONS": LineDecoder._parse_cons,
    b"PUB": LineDecoder._parse_pub,
    b"PUBB": LineDecoder._parse_pubb,
    b"FETCH": LineDecoder._parse_fetch,
    b"LATEST": LineDecoder._parse_latest,
    b"CREATE": LineDecoder._parse_create,
    b"ALTER": LineDecoder._parse_alter,
    b"LIST": LineDecoder._parse_list,
    b"DESCRIBE": LineDecoder._parse_describe,
    b"DELETE": LineDecoder._parse_delete,
    b"COMMIT": LineDecoder._parse_commit,
    b"OFFSETS": LineDecoder._parse_offsets,
    b"GROUPS": LineDecoder._parse_groups,
    b"RESETOFFSETS": LineDecoder._parse_resetoffsets,
    b"DELGROUP": LineDecoder._parse_delgroup,
    b"LEAVE": LineDecoder._parse_leave,
    b"METADATA": LineDecoder._parse_metadata,
    b"REASSIGN": LineDecoder._parse_reassign,
    b"ADDBROKER": LineDecoder._parse_addbroker,
    b"REMOVEBROKER": LineDecoder._parse_removebroker,
    b"AUTH": LineDecoder._parse_auth,
    b"ACL": LineDecoder._parse_acl,
    b"HELP": LineDecoder._parse_help,
    b"PING": LineDecoder._parse_ping,
    b"QUIT": LineDecoder._parse_quit,
}
assert set(_PARSERS) == {word.encode() for word in _HELP}, "every command has help and a parser"


# ---------------------------------------------------------------------------------------------
# The client side: encode_command.


def _bad(what: str, value: object, rule: str) -> LocalProtocolError:
    return LocalProtocolError(f"cannot encode {what}={value!r}: {rule}")


@functools.lru_cache(maxsize=1024)
def _topic_bytes(topic: str, internal_ok: bool) -> bytes:
    """A topic validated and encoded; cached because a client names the same few topics."""
    if type(topic) is not str:
        raise _bad("topic", topic, "a topic is a str")
    reason = topic_name_error(topic, allow_internal=internal_ok)
    if reason is not None:
        raise _bad("topic", topic, reason)
    return topic.encode("ascii")


def _int_bytes(value: object, what: str, lo: int, hi: int) -> bytes:
    # type() and not isinstance(): a bool is an int to Python, and True is no partition number.
    if type(value) is not int or not lo <= value <= hi:
        raise _bad(what, value, f"an int from {lo} to {hi}")
    return b"%d" % value


def _name_bytes(value: object, what: str) -> bytes:
    if type(value) is not str or name_error(value) is not None:
        raise _bad(what, value, "1 to 249 printable ASCII characters without spaces")
    return value.encode("ascii")


def _text_bytes(value: object, what: str) -> bytes:
    if type(value) is not str or "\r" in value or "\n" in value:
        raise _bad(what, value, "a str without CR or LF")
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates
        raise _bad(what, value, "valid Unicode (no lone surrogates)") from None


def _bytes(value: object, what: str) -> bytes:
    if type(value) is not bytes:
        raise _bad(what, value, "bytes")
    return value


def _inline_ok(value: bytes) -> bool:
    """Whether ``value`` survives as the rest of a command line, byte for byte.

    The decoder skips whitespace before the message, drops CRs at the end of the line and
    interprets 0xFF as telnet's IAC, and a line cannot hold LF.
    """
    return (
        bool(value)
        and b"\n" not in value
        and b"\xff" not in value
        and not value[:1].isspace()
        and value[-1:] != b"\r"
    )


def _pairs_bytes(pairs: object, what: str, *, allow_empty: bool) -> bytes:
    """``(partition, offset)`` pairs as ``P:O,P:O``, partitions distinct."""
    if type(pairs) is not tuple or (not pairs and not allow_empty):
        raise _bad(what, pairs, "a tuple of (partition, offset) pairs")
    items = []
    seen = set()
    for pair in pairs:
        if type(pair) is not tuple or len(pair) != 2 or pair[0] in seen:
            raise _bad(what, pairs, "(partition, offset) pairs with distinct partitions")
        seen.add(pair[0])
        partition = _int_bytes(pair[0], "partition", 0, INT32_MAX)
        items.append(partition + b":" + _int_bytes(pair[1], "offset", 0, INT64_MAX))
    return b",".join(items)


def _optional_int(name: bytes, value: object, lo: int, hi: int) -> list[bytes]:
    if value is None:
        return []
    return [name + b"=" + _int_bytes(value, name.decode(), lo, hi)]


def _acks_option(acks: object) -> list[bytes]:
    if not isinstance(acks, Acks):
        raise _bad("acks", acks, "an Acks")
    return [] if acks is Acks.QUORUM else [b"acks=" + acks.value.encode()]


def _topic_settings_line(
    word: bytes, spec: CreateTopic | TopicRow, *, allow_internal: bool
) -> bytes:
    """``word topic partitions rf [retention_ms=] [retention_bytes=] [compact=yes] [fsync=]`` CRLF.

    One encoder for what a CREATE asks and what a ``+TOPIC`` row reports, so they cannot drift.
    """
    words = [
        word,
        _topic_bytes(spec.topic, allow_internal),
        _int_bytes(spec.partitions, "partitions", 1, INT32_MAX),
        _int_bytes(spec.replication_factor, "replication_factor", 1, INT16_MAX),
    ]
    words += _optional_int(b"retention_ms", spec.retention_ms, -1, INT64_MAX)
    words += _optional_int(b"retention_bytes", spec.retention_bytes, -1, INT64_MAX)
    if type(spec.compact) is not bool:
        raise _bad("compact", spec.compact, "a bool")
    if spec.compact:
        words.append(b"compact=yes")
    if spec.fsync is not None:
        if not isinstance(spec.fsync, Fsync):
            raise _bad("fsync", spec.fsync, "an Fsync")
        words.append(b"fsync=" + spec.fsync.value.encode())
    return b" ".join(words) + _CRLF


def _acl_bytes(acl: AclRow) -> bytes:
    """An ACL's six words, as ``ACL ADD`` and a ``+ACL`` row write them."""
    reason = acl_row_error(acl)  # checks the types too: the caller's AclRow may be anything
    if reason is not None:
        raise _bad("acl", acl, reason)
    return " ".join(
        (acl.principal, acl.permission, acl.operation, acl.resource, acl.pattern, acl.name)
    ).encode("utf-8")


def encode_command(command: Command) -> bytes:
    """The bytes that send ``command``: a CRLF-ended line, then its payload and CRLF if it has one.

    ``LineDecoder`` decodes them back into an equal command. The encoding is canonical: options
    appear only when they differ from their default, in a fixed order. ``PublishRecord`` goes inline
    when its value survives as the rest of a line (``--`` is added if the value would read as an
    option) and with ``bytes=N`` otherwise. Raises ``LocalProtocolError`` for a command whose
    fields break their rules (see each class), so a bad command fails here, not at the server.
    """
    match command:
        case Pubs(topic=topic, message=message):
            if type(message) is not bytes or not message:
                raise _bad("message", message, "non-empty bytes")
            if b"\n" in message or message[:1].isspace() or message[-1:] == b"\r":
                raise _bad(
                    "message",
                    message,
                    "PUBS sends the rest of a line: no LF, no leading space, no CR at the end "
                    "(send PublishRecord instead)",
                )
            if b"\xff" in message:  # telnet's escaping of a 0xFF data byte
                message = message.replace(b"\xff", b"\xff\xff")
            return b"PUBS %s %s\r\n" % (_topic_bytes(topic, False), message)
        case PublishRecord(topic=topic, value=value, key=key, partition=partition, acks=acks):
            words = [b"PUB", _topic_bytes(topic, False)]
            if key is not None:
                words.append(b"key=" + escape_key(_bytes(key, "key")))
            words += _optional_int(b"partition", partition, 0, INT32_MAX)
            words += _acks_option(acks)
            idem = command.idempotence
            if idem is not None:
                if not isinstance(idem, Idempotence) or partition is None:
                    raise _bad("idempotence", idem, "an Idempotence, with a partition")
                words.append(b"pid=" + _int_bytes(idem.producer_id, "producer_id", 0, INT64_MAX))
                words.append(b"epoch=" + _int_bytes(idem.epoch, "epoch", 0, INT16_MAX))
                words.append(b"seq=" + _int_bytes(idem.sequence, "sequence", 0, INT32_MAX))
            value = _bytes(value, "value")
            if _inline_ok(value):
                first = value.split(None, 1)[0]
                if first == b"--" or _OPTION_RE.match(first):
                    words.append(b"--")
                words.append(value)
                return b" ".join(words) + _CRLF
            words.append(b"bytes=%d" % len(value))
            return b"".join((b" ".join(words), _CRLF, value, _CRLF))
        case PublishBatch(topic=topic, partition=partition, batch=batch, acks=acks):
            batch = _bytes(batch, "batch")
            words = [
                b"PUBB",
                _topic_bytes(topic, False),
                _int_bytes(partition, "partition", 0, INT32_MAX),
            ]
            words.append(b"%d" % len(batch))
            words += _acks_option(acks)
            return b"".join((b" ".join(words), _CRLF, batch, _CRLF))
        case Subs(topic=topic, group=group, partitions=partitions):
            words = [b"SUBS", _topic_bytes(topic, True), _name_bytes(group, "group")]
            if partitions is not None:
                words.append(_int_bytes(partitions, "partitions", 1, INT32_MAX))
            return b" ".join(words) + _CRLF
        case Cons(topic=topic, subscription_id=sub, offsets=offsets):
            words = [b"CONS", _topic_bytes(topic, True), _name_bytes(sub, "subscription_id")]
            if type(offsets) is int:
                words.append(_int_bytes(offsets, "offsets", 0, INT64_MAX))
            else:
                words.append(_pairs_bytes(offsets, "offsets", allow_empty=False))
            words += _optional_int(b"max", command.max_messages, 1, INT32_MAX)
            words += _optional_int(b"wait_ms", command.wait_ms, 0, INT32_MAX)
            return b" ".join(words) + _CRLF
        case Fetch(topic=topic, partition=partition, offset=offset):
            words = [
                b"FETCH",
                _topic_bytes(topic, True),
                _int_bytes(partition, "partition", 0, INT32_MAX),
                _int_bytes(offset, "offset", 0, INT64_MAX),
            ]
            words += _optional_int(b"max_bytes", command.max_bytes, 1, INT32_MAX)
            words += _optional_int(b"wait_ms", command.wait_ms, 0, INT32_MAX)
            if not isinstance(command.format, FetchFormat):
                raise _bad("format", command.format, "a FetchFormat")
            if command.format is not FetchFormat.BATCH:
                words.append(b"format=" + command.format.value.encode())
            if not isinstance(command.replica, FetchReplica):
                raise _bad("replica", command.replica, "a FetchReplica")
            if command.replica is not FetchReplica.ANY:
                words.append(b"replica=" + command.replica.value.encode())
            return b" ".join(words) + _CRLF
        case Latest(topic=topic, key=key):
            token = escape_key(_bytes(key, "key"))
            if not token:
                raise _bad("key", key, "a non-empty key")
            return b"LATEST %s %s\r\n" % (_topic_bytes(topic, True), token)
        case Commit(group=group, topic=topic, partition=partition, offset=offset):
            words = [
                b"COMMIT",
                _name_bytes(group, "group"),
                _topic_bytes(topic, True),
                _int_bytes(partition, "partition", 0, INT32_MAX),
                _int_bytes(offset, "offset", 0, INT64_MAX),
            ]
            if command.member is not None:
                words.append(b"member=" + _name_bytes(command.member, "member"))
            return b" ".join(words) + _CRLF
        case FetchOffsets(group=group, topic=topic):
            return b"OFFSETS %s %s\r\n" % (_name_bytes(group, "group"), _topic_bytes(topic, True))
        case Leave(subscription_id=sub):
            return b"LEAVE %s\r\n" % _name_bytes(sub, "subscription_id")
        case DescribeGroup(group=group, topic=topic):
            words = [b"GROUPS", _name_bytes(group, "group")]
            if topic is not None:
                words.append(_topic_bytes(topic, True))
            return b" ".join(words) + _CRLF
        case ListGroups(partition=None):
            return b"GROUPS\r\n"
        case ResetOffsets(group=group, topic=topic, kind=kind, value=value):
            words = [b"RESETOFFSETS", _name_bytes(group, "group"), _topic_bytes(topic, True)]
            if kind in (ResetKind.EARLIEST, ResetKind.LATEST) and value is None:
                words.append(kind.value.encode())
            elif kind in (ResetKind.OFFSET, ResetKind.TIME) and value is not None:
                number = _int_bytes(value, kind.value, 0, INT64_MAX)
                words.append(kind.value.encode() + b"=" + number)
            else:
                raise _bad("reset", command, "earliest/latest with no value, offset/time with one")
            if command.dry_run is True:
                words.append(b"dry_run=yes")
            elif command.dry_run is not False:
                raise _bad("dry_run", command.dry_run, "a bool")
            return b" ".join(words) + _CRLF
        case DeleteGroup(group=group):
            return b"DELGROUP %s\r\n" % _name_bytes(group, "group")
        case CreateTopic():
            return _topic_settings_line(b"CREATE", command, allow_internal=False)
        case AlterTopic(topic=topic, compact=compact):
            words = [b"ALTER", _topic_bytes(topic, False)]
            words += _optional_int(b"partitions", command.partitions, 1, INT32_MAX)
            words += _optional_int(b"retention_ms", command.retention_ms, -1, INT64_MAX)
            words += _optional_int(b"retention_bytes", command.retention_bytes, -1, INT64_MAX)
            if compact is not None:
                if type(compact) is not bool:
                    raise _bad("compact", compact, "a bool or None")
                words.append(b"compact=yes" if compact else b"compact=no")
            if len(words) == 2:
                raise _bad("alter", command, "at least one setting to change")
            return b" ".join(words) + _CRLF
        case ListTopics():
            return b"LIST\r\n"
        case DescribeTopic(topic=topic, time_ms=time_ms):
            words = [b"DESCRIBE", _topic_bytes(topic, True)]
            words += _optional_int(b"time", time_ms, 0, INT64_MAX)
            return b" ".join(words) + _CRLF
        case DeleteTopic(topic=topic):
            return b"DELETE %s\r\n" % _topic_bytes(topic, False)
        case Metadata(topics=topics):
            if type(topics) is not tuple:
                raise _bad("topics", topics, "a tuple of topic names")
            return b" ".join([b"METADATA", *(_topic_bytes(t, True) for t in topics)]) + _CRLF
        case Reassign(topic=topic, partition=partition, replicas=replicas):
            if type(replicas) is not tuple or not replicas:
                raise _bad("replicas", replicas, "a non-empty tuple of broker ids")
            return b"REASSIGN %s %s %s\r\n" % (
                _topic_bytes(topic, True),
                _int_bytes(partition, "partition", 0, INT32_MAX),
                b",".join(_int_bytes(r, "broker", 0, INT32_MAX) for r in replicas),
            )
        case AddBroker(broker_id=broker_id, peer=peer, controller=controller):
            return b"ADDBROKER %s %s %s\r\n" % (
                _int_bytes(broker_id, "id", 0, INT32_MAX),
                _name_bytes(peer, "peer"),
                _name_bytes(controller, "controller"),
            )
        case RemoveBroker(broker_id=broker_id):
            return b"REMOVEBROKER %s\r\n" % _int_bytes(broker_id, "id", 0, INT32_MAX)
        case Authenticate(mechanism=mechanism, payload=payload):
            if mechanism not in AUTH_MECHANISMS:
                raise _bad("mechanism", mechanism, f"one of {', '.join(AUTH_MECHANISMS)}")
            if type(payload) is not bytes or not payload:
                raise _bad("payload", payload, "non-empty bytes")
            return b"AUTH %s %s\r\n" % (mechanism.encode(), base64.b64encode(payload))
        case AclAdd(acl=acl):
            return b"ACL ADD %s\r\n" % _acl_bytes(acl)
        case AclRemove(acl=acl):
            return b"ACL REMOVE %s\r\n" % _acl_bytes(acl)
        case AclList(principal=principal):
            if principal is None:
                return b"ACL LIST\r\n"
            if type(principal) is not str or principal_error(principal) is not None:
                raise _bad("principal", principal, "User:<name> or User:*")
            return b"ACL LIST %s\r\n" % principal.encode("utf-8")
        case Help(command=word):
            if word is None:
                return b"HELP\r\n"
            if word not in _HELP:
                raise _bad("command", word, f"one of {', '.join(_HELP)}")
            return b"HELP %s\r\n" % word.encode()
        case Ping():
            return b"PING\r\n"
        case Quit():
            return b"QUIT\r\n"
    raise LocalProtocolError(f"not a command: {command!r}")


# ---------------------------------------------------------------------------------------------
# The server side: encode_reply.


def _optional_offset(value: int | None, what: str) -> bytes:
    return b"-" if value is None else _int_bytes(value, what, 0, INT64_MAX)


def _key_token(key: bytes | None) -> bytes:
    if key is None:
        return b"-"
    if key == b"-":  # "-" alone means "no key"
        return b"%2D"
    return escape_key(_bytes(key, "key"))


def _text_line(head: bytes, text: bytes) -> bytes:
    """``head``, then a space and ``text`` unless it is empty, then CRLF."""
    return b"%s %s\r\n" % (head, text) if text else head + _CRLF


def _leader_token(leader: object) -> bytes:
    return b"-" if leader is None else _int_bytes(leader, "leader", 0, INT32_MAX)


def encode_reply(reply: Reply) -> bytes:
    """The bytes of one reply line (with ``+DATA``: the line, the payload and CRLF).

    ``ReplyDecoder`` decodes them back into an equal reply. Lines end with CRLF, which every telnet
    client shows correctly. Raises ``LocalProtocolError`` for a reply whose fields break their
    rules (text with CR or LF, a negative offset, ...).
    """
    match reply:
        case MessageRow(partition=partition, offset=offset, key=key, value=value):
            line = b"+MSG %s %s %s" % (
                _int_bytes(partition, "partition", 0, INT32_MAX),
                _int_bytes(offset, "offset", 0, INT64_MAX),
                _key_token(key),
            )
            if value is None:
                return line + _CRLF
            return b"%s %s\r\n" % (line, escape_value(_bytes(value, "value")))
        case DataReply(next_offset=next_offset, payload=payload, high_watermark=hw):
            payload = _bytes(payload, "payload")
            words = [
                b"+DATA",
                _int_bytes(next_offset, "next_offset", 0, INT64_MAX),
                b"%d" % len(payload),
            ]
            words += _optional_int(b"hw", hw, 0, INT64_MAX)
            return b"".join((b" ".join(words), _CRLF, payload, _CRLF))
        case OkReply(text=text):
            return _text_line(b"+OK", _text_bytes(text, "text"))
        case ErrorReply(code=code, message=message):
            if not isinstance(code, ErrorCode):
                raise _bad("code", code, "an ErrorCode")
            return _text_line(b"-ERR " + code.name.encode(), _text_bytes(message, "message"))
        case EndReply(next_offsets=pairs):
            return _text_line(b"+END", _pairs_bytes(pairs, "next_offsets", allow_empty=True))
        case TopicRow():
            return _topic_settings_line(b"+TOPIC", reply, allow_internal=True)
        case PartitionRow(topic=topic, partition=partition, leader=leader, replicas=replicas):
            if type(replicas) is not tuple or not replicas:
                raise _bad("replicas", replicas, "a non-empty tuple of broker ids")
            words = [
                b"+PARTITION",
                _topic_bytes(topic, True),
                _int_bytes(partition, "partition", 0, INT32_MAX),
                b"leader=" + _leader_token(leader),
                b"replicas=" + b",".join(_int_bytes(r, "replica", 0, INT32_MAX) for r in replicas),
            ]
            words += _optional_int(b"start", reply.start_offset, 0, INT64_MAX)
            words += _optional_int(b"end", reply.end_offset, 0, INT64_MAX)
            words += _optional_int(b"time_offset", reply.time_offset, 0, INT64_MAX)
            return b" ".join(words) + _CRLF
        case BrokerRow(broker_id=broker_id, host=host, port=port):
            words = [
                b"+BROKER",
                _int_bytes(broker_id, "broker_id", 0, INT32_MAX),
                _name_bytes(host, "host"),
                _int_bytes(port, "port", 0, 65535),
            ]
            words += _optional_int(b"mqtt", reply.mqtt_port, 0, 65535)
            words += _optional_int(b"mqtt_tls", reply.mqtt_tls_port, 0, 65535)
            words += _optional_int(b"mqtt_ws", reply.mqtt_ws_port, 0, 65535)
            return b" ".join(words) + _CRLF
        case GroupRow():
            return b"+GROUP %s %s %s %s %s %s\r\n" % (
                _name_bytes(reply.group, "group"),
                _topic_bytes(reply.topic, True),
                _int_bytes(reply.partition, "partition", 0, INT32_MAX),
                b"-" if reply.owner is None else _name_bytes(reply.owner, "owner"),
                b"-"
                if reply.committed is None
                else _int_bytes(reply.committed, "offset", 0, INT64_MAX),
                b"-" if reply.end is None else _int_bytes(reply.end, "end", 0, INT64_MAX),
            )
        case GroupStateRow(group=group, topic=topic, state=state, members=members):
            return b"+GROUPSTATE %s %s %s %s\r\n" % (
                _name_bytes(group, "group"),
                _topic_bytes(topic, True),
                _name_bytes(state, "state"),
                _int_bytes(members, "members", 0, INT32_MAX),
            )
        case MemberRow(group=group, topic=topic, member=member, partitions=partitions):
            if type(partitions) is not tuple:
                raise _bad("partitions", partitions, "a tuple of partitions")
            return b"+MEMBER %s %s %s %s\r\n" % (
                _name_bytes(group, "group"),
                _topic_bytes(topic, True),
                _name_bytes(member, "member"),
                b",".join(_int_bytes(p, "partition", 0, INT32_MAX) for p in partitions) or b"-",
            )
        case OffsetRow(topic=topic, partition=partition, offset=offset):
            return b"+OFFSET %s %s %s\r\n" % (
                _topic_bytes(topic, True),
                _int_bytes(partition, "partition", 0, INT32_MAX),
                b"-" if offset is None else _int_bytes(offset, "offset", 0, INT64_MAX),
            )
        case AclRow():
            return b"+ACL %s\r\n" % _acl_bytes(reply)
        case InfoRow(text=text):
            return _text_line(b"+INFO", _text_bytes(text, "text"))
    raise LocalProtocolError(f"not a reply: {reply!r}")


# ---------------------------------------------------------------------------------------------
# The client side: ReplyDecoder.


def _broken(what: str, raw: bytes) -> RemoteProtocolError:
    return RemoteProtocolError(f"malformed reply: {what} in {_show(raw)}")


def _reply_int(raw: bytes, line: bytes, what: str, lo: int, hi: int) -> int:
    value = _parse_int(raw, lo, hi)
    if value is None:
        raise _broken(f"{what} is not an integer from {lo} to {hi}", line)
    return value


def _reply_topic(raw: bytes, line: bytes) -> str:
    name = raw.decode("ascii", "replace")
    if topic_name_error(name, allow_internal=True) is not None:
        raise _broken("invalid topic name", line)
    return name


def _reply_options(
    tokens: list[bytes], line: bytes, allowed: frozenset[bytes]
) -> dict[bytes, bytes]:
    options: dict[bytes, bytes] = {}
    for token in tokens:
        name, eq, value = token.partition(b"=")
        if not eq or name not in allowed or name in options:
            raise _broken(f"unexpected field {_show(token)}", line)
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
            raise _broken(f"fsync {_show(fsync_raw)} is not a policy", line) from None
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
    options = _reply_options(fields[3:], line, frozenset(_MQTT_PORT_KEYS))
    ports = (options.get(key) for key in _MQTT_PORT_KEYS)
    return BrokerRow(
        _reply_int(fields[0], line, "broker id", 0, INT32_MAX),
        host,
        _reply_int(fields[2], line, "port", 0, 65535),
        *(None if p is None else _reply_int(p, line, "MQTT port", 0, 65535) for p in ports),
    )


_MQTT_PORT_KEYS = (b"mqtt", b"mqtt_tls", b"mqtt_ws")  # +BROKER's optional fields, in order


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
        raise _broken(f"{_show(raw)} is not a {enum.__name__}", line) from None


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
