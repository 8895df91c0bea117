"""The broker's one error value: a protocol ``ErrorCode`` and a message for people.

Everything a command can fail with becomes a ``RequestError`` at the edge and is answered
``-ERR CODE message``; the code says whether to retry and whether a write may have happened
(``ErrorCode.retriable`` / ``outcome_unknown``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from kafkaesque.protocol import ErrorCode, ErrorReply

_Info = TypeVar("_Info")


class RequestError(Exception):
    """A request failed in a way its client must hear about, as ``-ERR code message``."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(f"{code.name} {message}")
        self.code = code
        self.message = message

    def reply(self) -> ErrorReply:
        return ErrorReply(self.code, self.message)


def unknown_partition(topic: str, partition: int, count: int) -> RequestError:
    """The error for a partition number a topic of ``count`` partitions does not have."""
    return RequestError(
        ErrorCode.UNKNOWN_PARTITION,
        f"{topic} has partitions 0..{count - 1}, not {partition}",
    )


def known_topic(topics: Mapping[str, _Info], topic: str) -> _Info:
    """``topics[topic]`` (the metadata's topics); ``RequestError`` UNKNOWN_TOPIC without it."""
    info = topics.get(topic)
    if info is None:
        raise RequestError(ErrorCode.UNKNOWN_TOPIC, f"no topic {topic!r}")
    return info
