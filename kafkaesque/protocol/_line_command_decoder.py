"""``LineDecoder``, the server side of the line protocol: the bytes a client sent in, commands out.

Robustness (what a peer cannot do to the server). A decoder never grows its buffer past about
one line limit plus one ``feed`` (or one payload limit while collecting a payload). A malformed
or oversized command becomes a ``BadCommand`` event, answered like any other command, and the
decoder carries on with the next line; it never raises because of what the peer sent.

Performance. The hot path (a PUBS line) is a handful of C-level bytes operations: ``find`` for
the newline, one ``split``, a dict lookup for the command word and one for the topic (validated
topics are cached), and the event's construction: about 2 microseconds a line on one core of the
development machine (see docs/protocol.md), a small part of a 50k lines/s budget.

The framing is described in ``_line_bytes.py``, the argument readers are in
``_line_command_args.py``.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Iterator
from enum import Enum
from typing import Final, TypeAlias

from ._line_bytes import (
    DEFAULT_LIMITS,
    INT16_MAX,
    INT32_MAX,
    INT64_MAX,
    NEED_DATA,
    OPTION_RE,
    LineLimits,
    NeedData,
    parse_int,
    show,
    unescape,
)
from ._line_command_args import (
    TELNET_RE,
    Payload,
    Reject,
    arg_acl,
    arg_address,
    arg_bool,
    arg_cons_offsets,
    arg_enum,
    arg_int,
    arg_name,
    arg_options,
    arg_principal,
    arg_tokens,
    telnet_one,
)
from ._line_commands import (
    AUTH_MECHANISMS,
    Acks,
    AclAdd,
    AclList,
    AclRemove,
    AddBroker,
    AlterTopic,
    Authenticate,
    BadCommand,
    Command,
    Commit,
    Cons,
    CreateTopic,
    DeleteGroup,
    DeleteTopic,
    DescribeGroup,
    DescribeTopic,
    ElectLeaders,
    Fetch,
    FetchFormat,
    FetchOffsets,
    FetchReplica,
    Fsync,
    Help,
    Idempotence,
    Latest,
    Leave,
    LineEvent,
    ListGroups,
    ListTopics,
    Metadata,
    Ping,
    PublishBatch,
    PublishRecord,
    Pubs,
    Quit,
    Reassign,
    RemoveBroker,
    ResetKind,
    ResetOffsets,
    Subs,
    is_internal_topic,
    topic_name_error,
)
from ._line_errors import ErrorCode, LocalProtocolError
from ._line_help import HELP, usage

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


_Parser: TypeAlias = "Callable[[LineDecoder, list[bytes], bytes], LineEvent | Payload]"


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
      with ``framing_error=True`` (see there): the session answers it and closes the connection.

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
        "_telnet",
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
        # Telnet mode (see ``_parse_line``): off until the first telnet command arrives.
        self._telnet = False

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
                if isinstance(event, Payload):
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
                        "command is dropped and the connection is closed (replies could no "
                        "longer be matched to commands)",
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

    def _start_payload(self, announced: Payload) -> BadCommand | None:
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

    def _parse_line(self, line: bytes) -> LineEvent | Payload | None:
        """One line (without its LF) into an event; None for a line with nothing on it.

        NVT line endings (RFC 854) are decoded here, with the IAC handling: a telnet client sends
        a bare CR as ``CR NUL`` (``printf 'x\\r\\n' | telnet`` sends ``x CR NUL CR LF``), so
        ``CR NUL`` is read as CR, and CRs at the end of the line are the line ending.
        """
        if b"\r\0" in line:
            line = line.replace(b"\r\0", b"\r")
        if b"\xff" in line:
            try:
                stripped = TELNET_RE.sub(telnet_one, line)
                if not self._telnet:
                    self._telnet_mode_on(line)
            except Reject as reject:
                # Refused; but if the line still reads as one announcing a payload, its bytes
                # must be skipped, or they would be taken for command lines.
                announced = self._parse_words(line)
                if isinstance(announced, Payload):
                    return Payload(announced.length, None, reject.event())
                return reject.event()
            line = stripped
        return self._parse_words(line)

    def _telnet_mode_on(self, line: bytes) -> None:
        """Telnet mode is per connection, off at first: a raw-socket client's 0xFF followed by
        0xF0-0xFE must not vanish. The first line holding a telnet command (an IAC sequence
        other than IAC IAC) is refused, saying so, and turns telnet mode on: from then on the
        connection is taken for a telnet client and its commands are dropped, as RFC 854 says.
        Raises ``Reject`` for that first line; returns if the line holds no telnet command."""
        for match in TELNET_RE.finditer(line):
            sequence = match.group()
            if sequence != b"\xff\xff":
                self._telnet = True
                raise Reject(
                    ErrorCode.BAD_ARGS,
                    f"bytes 0xFF 0x{sequence[1]:02X} at column {match.start() + 1} are a telnet "
                    "command (IAC, RFC 854): the line is refused, and from now on this "
                    "connection is taken for a telnet client, whose commands are dropped; a "
                    "data byte 0xFF is sent doubled (IAC IAC)",
                )

    def _parse_words(self, line: bytes) -> LineEvent | Payload | None:
        """``_parse_line`` once telnet commands are out of the line."""
        line = line.rstrip(b"\r")
        parts = line.split(None, 2)
        if not parts:
            return None
        word = parts[0]
        upper = word.upper()
        parser = _PARSERS.get(word) or _PARSERS.get(_ALIASES.get(upper, upper))
        if parser is None:
            return BadCommand(ErrorCode.UNKNOWN_COMMAND, f"unknown command {show(word)}; try HELP")
        try:
            return parser(self, parts, line)
        except Reject as reject:
            return reject.event()

    def _topic(self, raw: bytes, internal_ok: bool) -> str:
        """``raw`` as a validated topic name; internal names only if ``internal_ok``."""
        name = self._topics.get(raw)
        if name is None:
            name = raw.decode("ascii", "replace")
            reason = topic_name_error(name, allow_internal=True)
            if reason is not None:
                raise Reject(ErrorCode.INVALID_TOPIC, f"invalid topic name {show(raw)}: {reason}")
            if len(self._topics) >= _TOPIC_CACHE_SIZE:
                self._topics.clear()
                self._writable.clear()
            self._topics[raw] = name
            if not is_internal_topic(name):
                self._writable[raw] = name
        if not internal_ok and is_internal_topic(name):
            raise Reject(
                ErrorCode.INVALID_TOPIC, f"topic {name!r} is internal: it cannot be written here"
            )
        return name

    # One parser per command word. ``parts`` is ``line.split(None, 2)``; ``line`` is the whole line.

    def _parse_pubs(self, parts: list[bytes], line: bytes) -> LineEvent:
        if len(parts) < 3:
            raise Reject(ErrorCode.BAD_ARGS, usage("PUBS"))
        # The hot path: a dict lookup answers for a topic this connection has already named.
        return Pubs(self._writable.get(parts[1]) or self._topic(parts[1], False), parts[2])

    def _parse_subs(self, parts: list[bytes], line: bytes) -> LineEvent:
        tokens = arg_tokens(line, "SUBS", 2, 2)
        rest = tokens[2:]
        partitions = None
        if rest and b"=" not in rest[0]:  # the seed's positional count comes before options
            partitions = arg_int(rest.pop(0), "partitions", 1, INT32_MAX)
        timeout = arg_options(rest, frozenset({"session_timeout_ms"}), "SUBS").get(
            "session_timeout_ms"
        )
        return Subs(
            self._topic(tokens[0], True),
            arg_name(tokens[1], "group"),
            partitions,
            None if timeout is None else arg_int(timeout, "session_timeout_ms", 1, INT32_MAX),
        )

    def _parse_cons(self, parts: list[bytes], line: bytes) -> LineEvent:
        tokens = arg_tokens(line, "CONS", 3, 2)
        options = arg_options(tokens[3:], frozenset({"max", "wait_ms"}), "CONS")
        max_messages, wait_ms = options.get("max"), options.get("wait_ms")
        return Cons(
            self._topic(tokens[0], True),
            arg_name(tokens[1], "subscription id"),
            arg_cons_offsets(tokens[2]),
            None if max_messages is None else arg_int(max_messages, "max", 1, INT32_MAX),
            None if wait_ms is None else arg_int(wait_ms, "wait_ms", 0, INT32_MAX),
        )

    def _parse_create(self, parts: list[bytes], line: bytes) -> LineEvent:
        tokens = arg_tokens(line, "CREATE", 3, 4)
        options = arg_options(
            tokens[3:],
            frozenset({"retention_ms", "retention_bytes", "compact", "fsync"}),
            "CREATE",
        )
        retention_ms, retention_bytes = options.get("retention_ms"), options.get("retention_bytes")
        compact, fsync = options.get("compact"), options.get("fsync")
        return CreateTopic(
            self._topic(tokens[0], False),
            arg_int(tokens[1], "partitions", 1, INT32_MAX),
            arg_int(tokens[2], "replication_factor", 1, INT16_MAX),
            None if retention_ms is None else arg_int(retention_ms, "retention_ms", -1, INT64_MAX),
            None
            if retention_bytes is None
            else arg_int(retention_bytes, "retention_bytes", -1, INT64_MAX),
            False if compact is None else arg_bool(compact, "compact"),
            None if fsync is None else arg_enum(fsync, Fsync, "fsync"),
        )

    def _parse_alter(self, parts: list[bytes], line: bytes) -> LineEvent:
        tokens = arg_tokens(line, "ALTER", 1, 4)
        options = arg_options(tokens[1:], _ALTER_OPTIONS, "ALTER")
        if not options:
            raise Reject(ErrorCode.BAD_ARGS, f"nothing to change; {usage('ALTER')}")
        partitions, compact = options.get("partitions"), options.get("compact")
        retention_ms, retention_bytes = options.get("retention_ms"), options.get("retention_bytes")
        return AlterTopic(
            self._topic(tokens[0], False),
            None if partitions is None else arg_int(partitions, "partitions", 1, INT32_MAX),
            None if retention_ms is None else arg_int(retention_ms, "retention_ms", -1, INT64_MAX),
            None
            if retention_bytes is None
            else arg_int(retention_bytes, "retention_bytes", -1, INT64_MAX),
            None if compact is None else arg_bool(compact, "compact"),
        )

    def _parse_list(self, parts: list[bytes], line: bytes) -> LineEvent:
        arg_tokens(line, "LIST", 0)
        return ListTopics()

    def _parse_describe(self, parts: list[bytes], line: bytes) -> LineEvent:
        tokens = arg_tokens(line, "DESCRIBE", 1, 1)
        options = arg_options(tokens[1:], frozenset({"time"}), "DESCRIBE")
        time_ms = options.get("time")
        return DescribeTopic(
            self._topic(tokens[0], True),
            None if time_ms is None else arg_int(time_ms, "time", 0, INT64_MAX),
        )

    def _parse_delete(self, parts: list[bytes], line: bytes) -> LineEvent:
        tokens = arg_tokens(line, "DELETE", 1)
        return DeleteTopic(self._topic(tokens[0], False))

    def _parse_pub(self, parts: list[bytes], line: bytes) -> LineEvent | Payload:
        if len(parts) < 2:
            raise Reject(ErrorCode.BAD_ARGS, usage("PUB"))
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
            if OPTION_RE.match(token) is None:
                message = rest
                break
            option_tokens.append(token)
            rest = tail
        length_raw = next((t[6:] for t in option_tokens if t[:6].lower() == b"bytes="), None)
        if length_raw is None:
            fields = self._pub_fields(parts[1], option_tokens)
            if not message:
                raise Reject(
                    ErrorCode.BAD_ARGS,
                    f"missing message (an empty one needs bytes=0); {usage('PUB')}",
                )
            return PublishRecord(fields[0], message, *fields[1:])
        length = parse_int(length_raw, 0, INT64_MAX)
        if length is None:
            raise Reject(
                ErrorCode.BAD_ARGS,
                f"bytes= must be a byte count, not {show(length_raw)}; lost track of the commands, "
                "so the connection closes",
                framing_error=True,
            )
        try:
            if message is not None:
                raise Reject(ErrorCode.BAD_ARGS, "nothing may follow bytes=<n> on the line")
            topic, key, partition, acks, idempotence = self._pub_fields(parts[1], option_tokens)
        except Reject as reject:
            return Payload(length, None, reject.event())
        return Payload(
            length,
            lambda value: PublishRecord(topic, value, key, partition, acks, idempotence),
            None,
        )

    def _pub_fields(
        self, topic_raw: bytes, option_tokens: list[bytes]
    ) -> tuple[str, bytes | None, int | None, Acks, Idempotence | None]:
        """A PUB line's topic and options, validated: ``PublishRecord``'s fields but the value."""
        topic = self._topic(topic_raw, False)
        options = arg_options(option_tokens, _PUB_OPTIONS, "PUB")
        raw_key, raw_partition = options.get("key"), options.get("partition")
        key = None if raw_key is None else unescape(raw_key)
        partition = (
            None if raw_partition is None else arg_int(raw_partition, "partition", 0, INT32_MAX)
        )
        raw_acks = options.get("acks")
        acks = Acks.QUORUM if raw_acks is None else arg_enum(raw_acks, Acks, "acks")
        idempotence = None
        present = _IDEMPOTENCE_OPTIONS.intersection(options)
        if present:
            if present != _IDEMPOTENCE_OPTIONS:
                raise Reject(ErrorCode.BAD_ARGS, "pid=, epoch= and seq= go together")
            if partition is None:
                raise Reject(
                    ErrorCode.BAD_ARGS, "pid= needs partition= (sequences count per partition)"
                )
            idempotence = Idempotence(
                arg_int(options["pid"], "pid", 0, INT64_MAX),
                arg_int(options["epoch"], "epoch", 0, INT16_MAX),
                arg_int(options["seq"], "seq", 0, INT32_MAX),
            )
        return topic, key, partition, acks, idempotence

    def _parse_pubb(self, parts: list[bytes], line: bytes) -> LineEvent | Payload:
        tokens = line.split()[1:]
        if len(tokens) < 3:
            # No length on the line: assume none follows (a person typing), so no framing error.
            raise Reject(ErrorCode.BAD_ARGS, usage("PUBB"))
        length = parse_int(tokens[2], 0, INT64_MAX)
        if length is None:
            raise Reject(
                ErrorCode.BAD_ARGS,
                f"nbytes must be a byte count, not {show(tokens[2])}; lost track of the commands, "
                "so the connection closes",
                framing_error=True,
            )
        try:
            topic = self._topic(tokens[0], False)
            partition = arg_int(tokens[1], "partition", 0, INT32_MAX)
            raw_acks = arg_options(tokens[3:], frozenset({"acks"}), "PUBB").get("acks")
            acks = Acks.QUORUM if raw_acks is None else arg_enum(raw_acks, Acks, "acks")
        except Reject as reject:
            return Payload(length, None, reject.event())
        return Payload(length, lambda batch: PublishBatch(topic, partition, batch, acks), None)

    def _parse_fetch(self, parts: list[bytes], line: bytes) -> LineEvent:
        tokens = arg_tokens(line, "FETCH", 3, 4)
        options = arg_options(
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
            arg_int(tokens[1], "partition", 0, INT32_MAX),
            arg_int(tokens[2], "offset", 0, INT64_MAX),
            None if max_bytes is None else arg_int(max_bytes, "max_bytes", 1, INT32_MAX),
            None if wait_ms is None else arg_int(wait_ms, "wait_ms", 0, INT32_MAX),
            FetchFormat.BATCH if fmt is None else arg_enum(fmt, FetchFormat, "format"),
            FetchReplica.ANY if replica is None else arg_enum(replica, FetchReplica, "replica"),
        )

    def _parse_latest(self, parts: list[bytes], line: bytes) -> LineEvent:
        tokens = arg_tokens(line, "LATEST", 2)
        return Latest(self._topic(tokens[0], True), unescape(tokens[1]))

    def _parse_commit(self, parts: list[bytes], line: bytes) -> LineEvent:
        tokens = arg_tokens(line, "COMMIT", 4, 1)
        options = arg_options(tokens[4:], frozenset({"member"}), "COMMIT")
        member = options.get("member")
        return Commit(
            arg_name(tokens[0], "group"),
            self._topic(tokens[1], True),
            arg_int(tokens[2], "partition", 0, INT32_MAX),
            arg_int(tokens[3], "offset", 0, INT64_MAX),
            None if member is None else arg_name(member, "member"),
        )

    def _parse_leave(self, parts: list[bytes], line: bytes) -> LineEvent:
        tokens = arg_tokens(line, "LEAVE", 1)
        return Leave(arg_name(tokens[0], "subscription_id"))

    def _parse_groups(self, parts: list[bytes], line: bytes) -> LineEvent:
        tokens = arg_tokens(line, "GROUPS", 0, 2)
        if not tokens:
            return ListGroups()
        topic = self._topic(tokens[1], True) if len(tokens) == 2 else None
        return DescribeGroup(arg_name(tokens[0], "group"), topic)

    def _parse_resetoffsets(self, parts: list[bytes], line: bytes) -> LineEvent:
        tokens = arg_tokens(line, "RESETOFFSETS", 3, 1)
        group, topic = arg_name(tokens[0], "group"), self._topic(tokens[1], True)
        raw_dry = arg_options(tokens[3:], frozenset({"dry_run"}), "RESETOFFSETS").get("dry_run")
        dry_run = raw_dry is not None and arg_bool(raw_dry, "dry_run")
        name, eq, raw = tokens[2].partition(b"=")
        word = name.lower()
        if not eq and word in (b"earliest", b"latest"):
            return ResetOffsets(group, topic, ResetKind(word.decode()), None, dry_run)
        if eq and word in (b"offset", b"time"):
            what = "offset" if word == b"offset" else "time"
            value = arg_int(raw, what, 0, INT64_MAX)
            return ResetOffsets(group, topic, ResetKind(what), value, dry_run)
        raise Reject(
            ErrorCode.BAD_ARGS,
            f"reset to earliest, latest, offset=<n> or time=<ms>, not {show(tokens[2])}",
        )

    def _parse_delgroup(self, parts: list[bytes], line: bytes) -> LineEvent:
        tokens = arg_tokens(line, "DELGROUP", 1)
        return DeleteGroup(arg_name(tokens[0], "group"))

    def _parse_offsets(self, parts: list[bytes], line: bytes) -> LineEvent:
        tokens = arg_tokens(line, "OFFSETS", 2)
        return FetchOffsets(arg_name(tokens[0], "group"), self._topic(tokens[1], True))

    def _parse_reassign(self, parts: list[bytes], line: bytes) -> LineEvent:
        tokens = arg_tokens(line, "REASSIGN", 3)
        replicas = tuple(arg_int(r, "broker", 0, INT32_MAX) for r in tokens[2].split(b","))
        if len(set(replicas)) != len(replicas):
            raise Reject(ErrorCode.BAD_ARGS, "a broker is listed twice in the replicas")
        return Reassign(
            self._topic(tokens[0], True), arg_int(tokens[1], "partition", 0, INT32_MAX), replicas
        )

    def _parse_electleaders(self, parts: list[bytes], line: bytes) -> LineEvent:
        tokens = arg_tokens(line, "ELECTLEADERS", 0, 2)
        topic = self._topic(tokens[0], True) if tokens else None
        partition = arg_int(tokens[1], "partition", 0, INT32_MAX) if len(tokens) > 1 else None
        return ElectLeaders(topic, partition)

    def _parse_addbroker(self, parts: list[bytes], line: bytes) -> LineEvent:
        tokens = arg_tokens(line, "ADDBROKER", 3)
        return AddBroker(
            arg_int(tokens[0], "id", 0, INT32_MAX),
            arg_address(tokens[1], "peer"),
            arg_address(tokens[2], "controller"),
        )

    def _parse_removebroker(self, parts: list[bytes], line: bytes) -> LineEvent:
        tokens = arg_tokens(line, "REMOVEBROKER", 1)
        return RemoveBroker(arg_int(tokens[0], "id", 0, INT32_MAX))

    def _parse_metadata(self, parts: list[bytes], line: bytes) -> LineEvent:
        tokens = line.split()[1:]
        return Metadata(tuple(self._topic(token, True) for token in tokens))

    def _parse_auth(self, parts: list[bytes], line: bytes) -> LineEvent:
        tokens = arg_tokens(line, "AUTH", 2)
        mechanism = tokens[0].decode("ascii", "replace").upper()
        if mechanism not in AUTH_MECHANISMS:
            raise Reject(
                ErrorCode.BAD_ARGS,
                f"mechanism must be {'|'.join(AUTH_MECHANISMS)}, not {show(tokens[0])}; "
                f"{usage('AUTH')}",
            )
        # The payload may carry a password (PLAIN): an error never echoes it.
        try:
            payload = base64.b64decode(tokens[1], validate=True)
        except (binascii.Error, ValueError):
            raise Reject(
                ErrorCode.BAD_ARGS, f"the payload is not base64; {usage('AUTH')}"
            ) from None
        if not payload:
            raise Reject(ErrorCode.BAD_ARGS, f"the payload is empty; {usage('AUTH')}")
        return Authenticate(mechanism, payload)

    def _parse_acl(self, parts: list[bytes], line: bytes) -> LineEvent:
        tokens = line.split()[1:]
        verb = tokens[0].upper() if tokens else b""
        if verb == b"LIST" and len(tokens) <= 2:
            return AclList(arg_principal(tokens[1]) if len(tokens) == 2 else None)
        if verb in (b"ADD", b"REMOVE") and len(tokens) == 7:
            acl = arg_acl(tokens[1:])
            return AclAdd(acl) if verb == b"ADD" else AclRemove(acl)
        raise Reject(ErrorCode.BAD_ARGS, usage("ACL"))

    def _parse_help(self, parts: list[bytes], line: bytes) -> LineEvent:
        tokens = arg_tokens(line, "HELP", 0, 1)
        if not tokens:
            return Help()
        word = tokens[0].decode("ascii", "replace").upper()
        if word not in HELP:
            raise Reject(ErrorCode.BAD_ARGS, f"no command {show(tokens[0])}; HELP lists them")
        return Help(word)

    def _parse_ping(self, parts: list[bytes], line: bytes) -> LineEvent:
        arg_tokens(line, "PING", 0)
        return Ping()

    def _parse_quit(self, parts: list[bytes], line: bytes) -> LineEvent:
        arg_tokens(line, "QUIT", 0)
        return Quit()


_ALIASES: Final = {b"EXIT": b"QUIT"}  # what a shell user types to leave

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
    b"ELECTLEADERS": LineDecoder._parse_electleaders,
    b"ADDBROKER": LineDecoder._parse_addbroker,
    b"REMOVEBROKER": LineDecoder._parse_removebroker,
    b"AUTH": LineDecoder._parse_auth,
    b"ACL": LineDecoder._parse_acl,
    b"HELP": LineDecoder._parse_help,
    b"PING": LineDecoder._parse_ping,
    b"QUIT": LineDecoder._parse_quit,
}
assert set(_PARSERS) == {word.encode() for word in HELP}, "every command has help and a parser"
