"""The line protocol's vocabulary: topic name rules, the seed's JSON envelope, error codes."""

from __future__ import annotations

from pathlib import Path

import pytest

from kafkaesque.protocol import (
    INTERNAL_TOPIC_PREFIX,
    MAX_TOPIC_NAME_LENGTH,
    BadCommand,
    ErrorCode,
    ErrorReply,
    InvalidTopicNameError,
    SeedMessage,
    is_internal_topic,
    parse_seed_message,
    topic_name_error,
    validate_topic_name,
)

# --- Topic names --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["orders", "a", "A-b_c.9", "t" * MAX_TOPIC_NAME_LENGTH, "...", ".hidden", "_x"]
)
def test_valid_topic_names(name: str) -> None:
    assert topic_name_error(name) is None
    assert validate_topic_name(name) == name


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("", "cannot be empty"),
        ("t" * (MAX_TOPIC_NAME_LENGTH + 1), "at most 249"),
        (".", "cannot be '.' or '..'"),
        ("..", "cannot be '.' or '..'"),
        ("a/b", "uses only"),
        ("a b", "uses only"),
        ("café", "uses only"),
        ("orders\n", "uses only"),
        ("__consumer_offsets", "reserved for internal topics"),
    ],
)
def test_invalid_topic_names(name: str, reason: str) -> None:
    found = topic_name_error(name)
    assert found is not None and reason in found
    with pytest.raises(InvalidTopicNameError, match=reason):
        validate_topic_name(name)


def test_internal_topics_are_valid_only_where_allowed() -> None:
    name = INTERNAL_TOPIC_PREFIX + "consumer_offsets"
    assert is_internal_topic(name)
    assert not is_internal_topic("_single")
    assert validate_topic_name(name, allow_internal=True) == name
    assert topic_name_error("__bad/name", allow_internal=True) is not None


# --- The seed's JSON envelope -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (
            b'{"Header": "header", "Key": "124", "Body": "Hello World!"}',
            SeedMessage(b"Hello World!", b"124", b"header"),
        ),
        (b'{"Body": "only a body"}', SeedMessage(b"only a body")),
        (b'{"Key": "k", "Body": ""}', SeedMessage(b"", b"k")),
        (
            b'{"key": 124, "body": "lower case, integer key"}',
            SeedMessage(b"lower case, integer key", b"124"),
        ),
        (b'{"KEY": null, "Header": null, "BODY": "nulls"}', SeedMessage(b"nulls")),
        (b'  {"Body": "caf\\u00e9 \xe2\x82\xac"}  ', SeedMessage("café €".encode())),
    ],
)
def test_seed_envelope_is_understood(message: bytes, expected: SeedMessage) -> None:
    assert parse_seed_message(message) == expected


@pytest.mark.parametrize(
    "message",
    [
        b"Hello World!",
        b"",
        b"{not json",
        b'{"Key": "k"}',  # no Body
        b'{"Body": 42}',  # not a string body
        b'{"Body": "b", "Key": true}',
        b'{"Body": "b", "Key": 1.5}',
        b'{"Body": "b", "Header": ["h"]}',
        b'{"Body": "b", "Extra": "x"}',  # an object that is something else
        b'{"Body": "b", "body": "c"}',  # ambiguous
        b'["Body", "b"]',
        b'{"Body": "\xff\xfe"}',  # not UTF-8
        b'{"Body": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",  # exhausts json's recursion
    ],
)
def test_anything_else_is_plain_text_with_no_key(message: bytes) -> None:
    assert parse_seed_message(message) == SeedMessage(message, None, None)


# --- Error codes --------------------------------------------------------------------------------

RETRIABLE = {
    ErrorCode.UNKNOWN_TOPIC,
    ErrorCode.NOT_LEADER,
    ErrorCode.TIMEOUT,
    ErrorCode.NO_QUORUM,
    ErrorCode.BUSY,
    ErrorCode.NOT_READY,
}
OUTCOME_UNKNOWN = {ErrorCode.TIMEOUT, ErrorCode.INTERNAL}


def test_error_codes_are_distinct_and_documented() -> None:
    # Members are tuples: two equal tuples would silently become aliases of one member.
    names = [
        "UNKNOWN_COMMAND", "BAD_ARGS", "UNKNOWN_TOPIC", "UNKNOWN_PARTITION", "INVALID_TOPIC",
        "TOPIC_EXISTS", "INVALID_CONFIG", "TOO_LARGE", "INVALID_BATCH", "NOT_LEADER", "TIMEOUT",
        "NO_QUORUM", "BUSY", "NOT_READY", "OFFSET_OUT_OF_RANGE", "FENCED", "OUT_OF_ORDER_SEQUENCE",
        "UNKNOWN_SUBSCRIPTION", "NOT_ASSIGNED", "NO_REPLICA", "UNKNOWN_GROUP", "GROUP_NOT_EMPTY",
        "NOT_COMPACTED", "AUTH_FAILED", "NOT_AUTHORIZED", "INTERNAL",
    ]  # fmt: skip
    assert [code.name for code in ErrorCode] == names
    for code in ErrorCode:
        assert code.code == code.name
        assert code.__doc__ == code.guidance
        assert len(code.guidance) > 30
        assert repr(code) == f"<ErrorCode.{code.name}>"


def test_retriable_and_unknown_outcome_codes() -> None:
    assert {code for code in ErrorCode if code.retriable} == RETRIABLE
    assert {code for code in ErrorCode if code.outcome_unknown} == OUTCOME_UNKNOWN


def test_bad_command_reply() -> None:
    event = BadCommand(ErrorCode.BAD_ARGS, "usage: PING", framing_error=True)
    assert event.reply() == ErrorReply(ErrorCode.BAD_ARGS, "usage: PING")


def _documented_error_rows() -> dict[str, list[str]]:
    """The rows of docs/protocol.md's error table: code -> the other cells."""
    page = Path(__file__).parents[2] / "docs" / "protocol.md"
    section = page.read_text(encoding="utf-8").split("\n## Errors\n", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, list[str]] = {}
    for line in section.splitlines():
        if line.startswith("| `"):
            cells = [cell.strip() for cell in line.strip("|").split(" | ")]
            rows[cells[0].strip("`")] = cells[1:]
    return rows


def test_the_documented_error_table_is_the_error_codes() -> None:
    rows = _documented_error_rows()
    assert list(rows) == [code.name for code in ErrorCode]
    for code in ErrorCode:
        retriable, applied, on_read, guidance = rows[code.name]
        assert retriable == ("yes" if code.retriable else "no"), code
        assert applied == ("**maybe**" if code.outcome_unknown else "no"), code
        assert on_read == (code.on_read or "-"), code
        assert guidance == code.guidance, code


def test_every_code_a_read_can_meet_says_what_it_means_for_a_read() -> None:
    # The codes FETCH, CONS and LATEST answer (kafkaesque/broker/_commands.py, _reads.py,
    # _groups.py, _latest.py, Broker.forward_to, forward_latest and forward_to_replica): none
    # may be documented for writes only.
    read_codes = {
        ErrorCode.BAD_ARGS, ErrorCode.UNKNOWN_TOPIC, ErrorCode.UNKNOWN_PARTITION,
        ErrorCode.INVALID_TOPIC, ErrorCode.TOO_LARGE, ErrorCode.NOT_LEADER, ErrorCode.TIMEOUT,
        ErrorCode.NO_QUORUM, ErrorCode.BUSY, ErrorCode.NOT_READY, ErrorCode.OFFSET_OUT_OF_RANGE,
        ErrorCode.UNKNOWN_SUBSCRIPTION, ErrorCode.NOT_ASSIGNED, ErrorCode.NO_REPLICA,
        ErrorCode.NOT_COMPACTED, ErrorCode.NOT_AUTHORIZED, ErrorCode.INTERNAL,
    }  # fmt: skip
    assert {code for code in ErrorCode if code.on_read is not None} == read_codes
    assert "write" not in " ".join(str(code.on_read) for code in read_codes)
