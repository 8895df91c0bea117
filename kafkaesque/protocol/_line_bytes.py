"""The telnet-friendly line protocol, sans I/O: the byte-level pieces every part of it shares.

Server side: ``LineDecoder`` turns the bytes a client sent into commands (``feed`` then
``next_event`` until ``NEED_DATA``), and ``encode_reply`` turns replies into bytes. Client side:
``encode_command`` and ``ReplyDecoder``. No sockets, no clock, no threads: the broker owns those
(as h11 leaves them to its caller). The grammar is written down in ``docs/protocol.md``.

Framing. A command is one line ended by LF (a CR before it is dropped; CRLF and LF may mix). Two
commands carry a binary payload after their line, memcached style: ``PUBB ... nbytes`` and
``PUB ... bytes=N`` announce N bytes, which follow the line and are followed by CRLF (or LF). A
reply is one line ended by CRLF, except ``+DATA next nbytes`` which is followed the same way by its
payload. Replies come in the order of the commands; a list reply is rows ended by ``+END``.

This module holds what the four halves (command decoder and encoder, reply encoder and decoder)
have in common: the integer bounds, ``NEED_DATA``, the ``LineLimits`` a decoder enforces, the
percent-escaping of keys and values, and the strict integer reading and the printable excerpt a
decoder's error messages use.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import Final

INT16_MAX: Final = 2**15 - 1
INT32_MAX: Final = 2**31 - 1
INT64_MAX: Final = 2**63 - 1


class NeedData(Enum):
    """The type of ``NEED_DATA``: what ``next_event`` returns when it needs more bytes."""

    NEED_DATA = "NEED_DATA"


NEED_DATA: Final = NeedData.NEED_DATA
"""No complete event is buffered: ``feed`` more bytes, then call ``next_event`` again."""


# ---------------------------------------------------------------------------------------------
# Limits.


@dataclass(frozen=True, slots=True)
class LineLimits:
    """Bounds a decoder enforces on what a peer sends, so a peer cannot make it buffer without end.

    ``max_line_length`` bounds a line without its terminator; ``max_payload`` bounds a binary
    payload (PUBB, ``PUB ... bytes=N``, ``+DATA``). ``LineDecoder`` answers a violation with a
    ``TOO_LARGE`` error and goes on; ``ReplyDecoder`` raises ``RemoteProtocolError``.
    """

    max_line_length: int = 64 * 1024
    max_payload: int = 8 * 1024 * 1024

    def __post_init__(self) -> None:
        # A limit below the longest fixed-form command would reject well-formed commands.
        if self.max_line_length < 64 or self.max_payload < 0:
            raise ValueError(f"unusable limits {self!r}: max_line_length >= 64, max_payload >= 0")


DEFAULT_LIMITS: Final = LineLimits()
DEFAULT_REPLY_LIMITS: Final = LineLimits(
    max_line_length=32 * 1024 * 1024, max_payload=64 * 1024 * 1024
)
"""A client trusts its server more: a ``+MSG`` line carries a whole (escaped) record value."""


# ---------------------------------------------------------------------------------------------
# Byte-level helpers.

CRLF: Final = b"\r\n"
OPTION_RE: Final = re.compile(rb"[A-Za-z_]+=")

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


def show(raw: bytes) -> str:
    """A peer's bytes, shortened and made printable ASCII, for an error message."""
    shown = repr(raw[:60])[1:]
    return shown + "..." if len(raw) > 60 else shown


def parse_int(raw: bytes, lo: int, hi: int) -> int | None:
    """``raw`` as a decimal integer in [lo, hi], or None. Only ASCII digits and, if lo < 0, '-'.

    ``int()`` alone would also accept spaces, '+' and '_' separators, which no peer should send.
    """
    digits = raw[1:] if lo < 0 and raw[:1] == b"-" else raw
    if not digits.isdigit() or len(digits) > 19:
        return None
    value = int(raw)
    return value if lo <= value <= hi else None
