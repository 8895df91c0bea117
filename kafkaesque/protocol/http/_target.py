"""A request target (``/topics/t/partitions/0/records?offset=5``) split into decoded path
segments and query parameters."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qsl, unquote_to_bytes


class BadTarget(ValueError):
    """A target that is no origin-form path (``/...``), or whose escapes are not UTF-8."""


@dataclass(frozen=True, slots=True)
class Target:
    """``segments``: the path's segments, percent-decoded (``/a/b%2Fc`` → ``("a", "b/c")``; a
    trailing slash adds nothing); ``raw_segments`` the same as bytes (a key may be any bytes);
    ``query``: the parameters, the last one of a repeated name winning."""

    segments: tuple[str, ...]
    raw_segments: tuple[bytes, ...]
    query: dict[str, str]


def parse_target(target: bytes) -> Target:
    """Split ``target`` (as h11 gives it). Raises ``BadTarget``."""
    text = target.decode("ascii", "replace")
    if not text.startswith("/"):
        raise BadTarget(f"the target must be a path starting with /: {text[:80]!r}")
    path, _, query = text.partition("?")
    raw = tuple(unquote_to_bytes(s) for s in path.split("/")[1:] if s != "")
    try:
        segments = tuple(s.decode("utf-8") for s in raw)
        params = parse_qsl(query, keep_blank_values=True, errors="strict")
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadTarget(f"the target is not UTF-8 once decoded: {exc}") from exc
    return Target(segments, raw, dict(params))
