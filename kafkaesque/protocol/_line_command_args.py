"""How ``LineDecoder`` reads the arguments of a command line.

Each ``arg_*`` reader turns one or more tokens into a validated value or raises ``Reject``, which
the decoder turns into a ``BadCommand`` answered in the command's place. ``Payload`` is a parser's
answer for a line that announces a binary payload. Telnet's own commands (IAC sequences) are taken
out of a line before it is split (``TELNET_RE`` and ``telnet_one``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Final, TypeVar

from ._line_bytes import INT32_MAX, INT64_MAX, parse_int, show
from ._line_commands import (
    AclOperation,
    AclPattern,
    AclPermission,
    AclResource,
    AclRow,
    BadCommand,
    Command,
    ConsOffsets,
    acl_name_error,
    name_error,
    principal_error,
)
from ._line_errors import ErrorCode
from ._line_help import usage

_E = TypeVar("_E", bound=StrEnum)


# Telnet (RFC 854). IAC (0xFF) starts a command: IAC IAC is a data byte 0xFF; IAC + WILL/WONT/
# DO/DONT (0xFB-0xFE) + an option byte is a 3-byte negotiation, IAC SB ... IAC SE (0xFA ... 0xFF
# 0xF0, with IAC IAC for a 0xFF inside) a subnegotiation, and IAC + any other command byte
# (0xF0-0xF9: SE, NOP, DM, BRK, IP, AO, AYT, EC, EL, GA) a 2-byte command. A broker that never
# negotiates drops the commands; a telnet client sends them when its user presses Ctrl-C ("IAC
# IP") and the like. Anything else after an IAC (a data byte, the end of the line) is not telnet:
# the last alternative matches the lone IAC, and the line is refused rather than guessed at.
TELNET_RE: Final = re.compile(
    rb"\xff(?:\xff|[\xfb-\xfe].|\xfa(?:[^\xff]|\xff\xff)*\xff\xf0|[\xf0-\xf9]|)", re.DOTALL
)


def telnet_one(match: re.Match[bytes]) -> bytes:
    """A telnet sequence's replacement: 0xFF for IAC IAC, nothing for a command; raises
    ``Reject`` for a lone IAC (see ``TELNET_RE``)."""
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
    raise Reject(
        ErrorCode.BAD_ARGS,
        f"byte 0xFF (telnet IAC) at column {at + 1} {what}; a data byte 0xFF is sent doubled "
        "(IAC IAC): the line is refused, not guessed at",
    )


# ---------------------------------------------------------------------------------------------
# The server side: LineDecoder.


class Reject(Exception):
    """Raised inside a command parser; ``LineDecoder`` turns it into a ``BadCommand`` event."""

    def __init__(self, code: ErrorCode, message: str, *, framing_error: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.framing_error = framing_error

    def event(self) -> BadCommand:
        return BadCommand(self.code, self.message, self.framing_error)


@dataclass(slots=True)
class Payload:
    """A parser's answer for a command line that announces a payload of ``length`` bytes.

    Exactly one of ``build`` (turns the payload into the command) and ``error`` (the command is
    rejected; its payload is skipped so the next command is found) is set.
    """

    length: int
    build: Callable[[bytes], Command] | None
    error: BadCommand | None


def arg_int(raw: bytes, what: str, lo: int, hi: int) -> int:
    value = parse_int(raw, lo, hi)
    if value is None:
        raise Reject(
            ErrorCode.BAD_ARGS, f"{what} must be an integer from {lo} to {hi}, not {show(raw)}"
        )
    return value


def arg_name(raw: bytes, what: str) -> str:
    name = raw.decode("ascii", "replace")
    reason = name_error(name)
    if reason is not None:
        raise Reject(ErrorCode.BAD_ARGS, f"invalid {what} {show(raw)}: {reason}")
    return name


def arg_enum(raw: bytes, enum: type[_E], what: str) -> _E:
    try:
        return enum(raw.decode("ascii").lower())
    except ValueError:  # UnicodeDecodeError is a ValueError too
        choices = "|".join(member.value for member in enum)
        raise Reject(ErrorCode.BAD_ARGS, f"{what} must be {choices}, not {show(raw)}") from None


_TRUE: Final = frozenset({b"yes", b"true", b"on", b"1"})
_FALSE: Final = frozenset({b"no", b"false", b"off", b"0"})


def arg_bool(raw: bytes, what: str) -> bool:
    folded = raw.lower()
    if folded in _TRUE:
        return True
    if folded in _FALSE:
        return False
    raise Reject(ErrorCode.BAD_ARGS, f"{what} must be yes or no, not {show(raw)}")


def arg_address(raw: bytes, what: str) -> str:
    host, sep, port = arg_name(raw, what).rpartition(":")
    if not sep or not host or parse_int(port.encode(), 0, 65535) is None:
        raise Reject(ErrorCode.BAD_ARGS, f"{what} must be host:port, not {show(raw)}")
    return f"{host}:{port}"


def arg_options(tokens: list[bytes], allowed: frozenset[str], word: str) -> dict[str, bytes]:
    """``name=value`` tokens into a dict; an unknown, malformed or repeated option is rejected."""
    options: dict[str, bytes] = {}
    for token in tokens:
        name, eq, value = token.partition(b"=")
        key = name.decode("ascii", "replace").lower()
        if not eq or key not in allowed:
            hint = " (put -- before a message that starts with name=)" if word == "PUB" else ""
            raise Reject(
                ErrorCode.BAD_ARGS, f"unexpected argument {show(token)}{hint}; {usage(word)}"
            )
        if key in options:
            raise Reject(ErrorCode.BAD_ARGS, f"option {key}= given twice")
        options[key] = value
    return options


def arg_tokens(line: bytes, word: str, positional: int, optional: int = 0) -> list[bytes]:
    """The tokens after the command word: ``positional`` required, up to ``optional`` more."""
    tokens = line.split()[1:]
    if not positional <= len(tokens) <= positional + optional:
        raise Reject(ErrorCode.BAD_ARGS, usage(word))
    return tokens


def arg_cons_offsets(raw: bytes) -> ConsOffsets:
    if raw.isdigit():
        return arg_int(raw, "offset", 0, INT64_MAX)
    pairs: list[tuple[int, int]] = []
    for item in raw.split(b","):
        partition, colon, offset = item.partition(b":")
        if not colon:
            raise Reject(
                ErrorCode.BAD_ARGS,
                f"offset must be <offset> or <partition>:<offset>,..., not {show(raw)}",
            )
        pair = (
            arg_int(partition, "partition", 0, INT32_MAX),
            arg_int(offset, "offset", 0, INT64_MAX),
        )
        if any(pair[0] == seen for seen, _ in pairs):
            raise Reject(ErrorCode.BAD_ARGS, f"partition {pair[0]} given twice in {show(raw)}")
        pairs.append(pair)
    return tuple(pairs)


def arg_principal(raw: bytes) -> str:
    try:
        principal = raw.decode("utf-8")  # a user's name may be any printable text
    except UnicodeDecodeError:
        principal = ""  # refused below
    reason = principal_error(principal)
    if reason is not None:
        raise Reject(ErrorCode.BAD_ARGS, f"invalid principal {show(raw)}: {reason}; {usage('ACL')}")
    return principal


def arg_acl(tokens: list[bytes]) -> AclRow:
    """The six words of ``ACL ADD|REMOVE`` (principal to name) as an ``AclRow``."""
    principal = arg_principal(tokens[0])
    permission = arg_enum(tokens[1], AclPermission, "permission")
    operation = arg_enum(tokens[2], AclOperation, "operation")
    resource = arg_enum(tokens[3], AclResource, "resource")
    pattern = arg_enum(tokens[4], AclPattern, "pattern")
    name = tokens[5].decode("ascii", "replace")
    reason = acl_name_error(resource, pattern, name)
    if reason is not None:
        raise Reject(ErrorCode.BAD_ARGS, f"invalid {resource} name {show(tokens[5])}: {reason}")
    return AclRow(principal, permission, operation, resource, pattern, name)
