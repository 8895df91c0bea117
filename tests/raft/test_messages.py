"""Wire form of the messages: msgpack round trips and rejection of malformed input."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafkaesque.raft import (
    AppendEntries,
    AppendEntriesResponse,
    Configuration,
    Entry,
    EntryKind,
    Heartbeat,
    HeartbeatResponse,
    InstallLogStart,
    MalformedMessage,
    Message,
    RequestVote,
    RequestVoteResponse,
    TimeoutNow,
    describe,
    from_wire,
    to_wire,
)
from kafkaesque.raft._messages import TAGS, _generic_from_wire, _generic_to_wire

ids = st.integers(0, 2**31)
terms = st.integers(0, 2**40)
offsets = st.integers(-1, 2**62)


@st.composite
def entry_runs(draw: st.DrawFn) -> tuple[Entry, ...]:
    first = draw(st.integers(0, 2**40))
    out = []
    for kind in draw(st.lists(st.sampled_from(list(EntryKind)), max_size=5)):
        count = draw(st.integers(1, 100)) if kind is EntryKind.DATA else 1
        out.append(
            Entry(
                draw(st.integers(1, 2**40)),
                first,
                first + count - 1,
                kind,
                draw(st.binary(max_size=64)),
            )
        )
        first += count
    return tuple(out)


configs = st.builds(
    lambda v, learn: Configuration(frozenset(v), frozenset(learn) - frozenset(v)),
    st.sets(ids, max_size=5),
    st.sets(ids, max_size=3),
)

messages: st.SearchStrategy[Message] = st.one_of(
    st.builds(RequestVote, ids, ids, terms, offsets, terms, st.booleans(), st.booleans()),
    st.builds(RequestVoteResponse, ids, ids, terms, st.booleans(), st.booleans()),
    st.builds(AppendEntries, ids, ids, terms, offsets, terms, offsets, entry_runs()),
    st.builds(
        AppendEntriesResponse, ids, ids, terms, st.booleans(), offsets, st.none() | terms, offsets
    ),
    st.builds(Heartbeat, ids, ids, terms, offsets, st.integers(0, 2**40), st.booleans()),
    st.builds(HeartbeatResponse, ids, ids, terms, st.integers(0, 2**40)),
    st.builds(InstallLogStart, ids, ids, terms, offsets, terms, configs),
    st.builds(TimeoutNow, ids, ids, terms),
)


@settings(max_examples=300, derandomize=True)
@given(messages)
def test_every_message_round_trips_through_msgpack(msg: Message) -> None:
    wire = msgpack.packb(to_wire(msg))
    assert from_wire(msgpack.unpackb(wire)) == msg
    assert describe(msg).startswith(f"n{msg.src}->n{msg.dst}")


@settings(max_examples=300, derandomize=True)
@given(messages)
def test_the_specialised_codecs_agree_with_the_generic_ones(msg: Message) -> None:
    """AppendEntries, its answer and heartbeats have hand-written codecs: same tags, same
    layout as the field-driven reference (peers of different versions must agree)."""
    wire = to_wire(msg)
    assert wire == _generic_to_wire(msg)
    unpacked = msgpack.unpackb(msgpack.packb(wire))
    assert from_wire(unpacked) == _generic_from_wire(type(msg), unpacked) == msg


def _outcome(decode: Any, obj: Any) -> object:
    try:
        return decode(obj)
    except MalformedMessage:
        return MalformedMessage


junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63),
    st.floats(allow_nan=False),
    st.text(max_size=2),
    st.binary(max_size=2),
    st.lists(st.integers(0, 3), max_size=5),
)


@settings(max_examples=400, derandomize=True)
@given(messages, st.integers(1, 8), junk, st.integers(-1, 1))
def test_the_specialised_decoders_refuse_what_the_generic_one_refuses(
    msg: Message, field: int, value: object, arity: int
) -> None:
    """Same validation: a field of the wrong type, or a wrong arity, is a ``MalformedMessage``
    on both paths; anything else decodes to the same message."""
    wire = msgpack.unpackb(msgpack.packb(to_wire(msg)))
    if field < len(wire):
        wire[field] = value
    if arity < 0:
        wire = wire[:-1]
    elif arity > 0:
        wire = [*wire, value]
    assert wire[0] == TAGS[type(msg)]
    assert _outcome(from_wire, wire) == _outcome(
        lambda obj: _generic_from_wire(type(msg), obj), wire
    )


@pytest.mark.parametrize(
    "obj",
    [
        None,
        [],
        [99, 1, 2, 3],
        [8, 1, 2],  # too short
        [8, 1, 2, 3, 4],  # too long
        [8, 1, 2, "3"],  # a string term
        [8, True, 2, 3],  # a bool where an int belongs
        [5, 1, 2, 3, 4, 5.0],  # a float round
        [3, 1, 2, 3, 0, 0, 0, [[1, 5, 4, 0, b""]]],  # entry with last < first
        [3, 1, 2, 3, 0, 0, 0, [[1, 1, 1, 7, b""]]],  # unknown entry kind
        [3, 1, 2, 3, 0, 0, 0, [[1, 1, 1, 0, "text"]]],  # data not bytes
        [7, 1, 2, 3, 4, 5, [[1], [1]]],  # voter and learner at once
    ],
)
def test_malformed_wire_input_is_rejected(obj: object) -> None:
    with pytest.raises(MalformedMessage):
        from_wire(obj)


def test_configuration_entry_payload_round_trips() -> None:
    conf = Configuration.of([1, 2, 3], [7])
    assert Configuration.decode(conf.encode()) == conf
    with pytest.raises(MalformedMessage):
        Configuration.decode(b"\xc1")
