"""Wire form of the messages: msgpack round trips and rejection of malformed input."""

from __future__ import annotations

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
    st.builds(Heartbeat, ids, ids, terms, offsets, st.integers(0, 2**40)),
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
