"""Broker-to-broker messages: every message survives msgpack both ways, and anything a peer
could send that is not one is a ``MalformedPeerMessage`` (never another exception)."""

from __future__ import annotations

import contextlib
import math
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafkaesque.protocol import (
    Absent,
    Acks,
    Appended,
    AppendRequest,
    Bounds,
    BoundsRequest,
    CommandReply,
    Commit,
    Cons,
    ControllerHandOver,
    Decommissioned,
    DecommissionRequest,
    DeleteGroup,
    DescribeGroup,
    ErrorCode,
    FetchOffsets,
    FindResendRequest,
    Found,
    GroupCommandRequest,
    HandOverControllerRequest,
    LatestRequest,
    LeaderClaim,
    LeaderClaims,
    Leave,
    ListGroups,
    MalformedPeerCall,
    MalformedPeerMessage,
    PeerCall,
    PeerMessage,
    PeerReply,
    PeerView,
    ReadRequest,
    ReadResult,
    Refused,
    ResetKind,
    ResetOffsets,
    Retry,
    Shares,
    Subs,
    Touch,
    Unknown,
    is_peer_item,
    peer_from_wire,
    peer_to_wire,
)
from kafkaesque.protocol._peer_messages import (
    ANSWER_TAGS,
    COMMAND_TAGS,
    PEER_TAG_MIN,
    REQUEST_TAGS,
    TAGS,
)

naturals = st.integers(min_value=0, max_value=2**63 - 1)
positives = st.integers(min_value=1, max_value=2**31 - 1)
ints = st.integers(min_value=-(2**63), max_value=2**63 - 1)
names = st.text(max_size=20)
seconds = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)

group_commands = st.one_of(
    st.builds(Subs, names, names, st.none() | positives, st.none() | positives),
    st.builds(
        Cons,
        names,
        names,
        naturals | st.tuples(*[st.tuples(naturals, naturals)] * 2),
        st.none() | positives,
        st.none() | naturals,
    ),
    st.builds(Commit, names, names, naturals, naturals, st.none() | names),
    st.builds(FetchOffsets, names, names),
    st.builds(Leave, names),
    st.builds(DescribeGroup, names, st.none() | names),
    st.builds(ListGroups, st.none() | naturals),
    st.builds(
        ResetOffsets,
        names,
        names,
        st.sampled_from(ResetKind),
        st.none() | naturals,
        st.booleans(),
    ),
    st.builds(DeleteGroup, names),
    st.builds(Touch, naturals, st.lists(names).map(tuple)),
)
requests = st.one_of(
    st.builds(AppendRequest, names, st.binary(), positives, st.sampled_from(Acks), seconds),
    st.builds(FindResendRequest, names, st.binary(), st.binary(), ints, seconds),
    st.builds(BoundsRequest, st.lists(names).map(tuple), st.none() | naturals),
    st.builds(ReadRequest, names, naturals, naturals, positives, naturals),
    st.builds(GroupCommandRequest, group_commands),
    st.builds(LatestRequest, names, naturals, st.binary()),
    st.builds(HandOverControllerRequest, seconds),
    st.builds(DecommissionRequest, naturals),
)
answers = st.one_of(
    st.builds(Appended, naturals, naturals),
    st.builds(Retry, names),
    st.builds(Unknown, names),
    st.builds(Refused, st.sampled_from(ErrorCode), names),
    st.builds(Found, naturals),
    st.just(Absent()),
    st.builds(
        Bounds,
        st.lists(
            st.none() | st.tuples(naturals, naturals) | st.tuples(naturals, naturals, naturals)
        ).map(tuple),
    ),
    st.builds(ReadResult, st.binary(), naturals, naturals),
    st.builds(CommandReply, st.binary()),
    st.builds(ControllerHandOver, st.none() | st.booleans(), st.none() | naturals),
    st.builds(Decommissioned, naturals),
)
node_sets = st.frozensets(st.integers(min_value=0, max_value=1000))
messages: st.SearchStrategy[PeerMessage] = st.one_of(
    st.builds(PeerCall, ints, requests),
    st.builds(PeerReply, ints, answers),
    st.builds(
        LeaderClaims,
        st.dictionaries(names, st.builds(LeaderClaim, ints, node_sets, node_sets, st.booleans())),
    ),
    st.builds(Shares, st.lists(st.tuples(names, names)).map(tuple)),
    st.builds(
        PeerView,
        st.lists(naturals).map(tuple),
        st.dictionaries(names, st.tuples(naturals, names, naturals)),
        st.lists(st.tuples(names, names, naturals, naturals)).map(tuple),
    ),
)


def _through_msgpack(value: Any) -> Any:
    """What the peer's ``FrameDecoder`` hands over (``kafkaesque.raft.driver``'s settings)."""
    packed = msgpack.packb(value, use_bin_type=True)
    return msgpack.unpackb(packed, raw=False, strict_map_key=False)


@given(messages)
def test_every_message_survives_the_wire(msg: PeerMessage) -> None:
    wire = peer_to_wire(msg)
    assert is_peer_item(_through_msgpack(wire))
    assert peer_from_wire(_through_msgpack(wire)) == msg
    assert peer_from_wire(wire) == msg  # unpacked as it was packed (tuples kept) too


def test_tags_are_distinct_and_clear_of_raft_kinds() -> None:
    top = [*REQUEST_TAGS.values(), *(TAGS - set(REQUEST_TAGS.values()))]
    every = [*top, *ANSWER_TAGS.values()]
    assert len(set(every)) == len(every)
    assert min(every) >= PEER_TAG_MIN > 2  # the Raft driver's kinds are 0-2
    assert not set(every) & set(range(10, 17))  # the retired positional protocol's
    assert len(set(COMMAND_TAGS.values())) == len(COMMAND_TAGS)


def test_raft_items_are_not_peer_items() -> None:
    assert not is_peer_item([0, "t/0", [5, 1, 2, 3, 0]])
    assert not is_peer_item([2, "t/0", 3, 4])
    assert not is_peer_item([])
    assert not is_peer_item(["x"])
    assert not is_peer_item({"t": 20})
    assert is_peer_item([20, 1])  # a broker item, malformed or not: from_wire judges it


APPEND = REQUEST_TAGS[AppendRequest]
REPLY = peer_to_wire(PeerReply(1, Absent()))[0]


@pytest.mark.parametrize(
    "item",
    [
        None,
        [],
        "text",
        [None],
        ["20"],
        [True, 1],  # a bool is not a tag
        [99, 1],  # an unknown tag
        [10, 1, "t/0", b"b", 1, "quorum", 5.0],  # the retired positional APPEND
        [APPEND],  # no request id
        [APPEND, 1, "t/0", b"batch", 1, "quorum"],  # a field short
        [APPEND, 1, "t/0", b"batch", 1, "quorum", 5.0, "extra"],
        [APPEND, "1", "t/0", b"batch", 1, "quorum", 5.0],  # request id as text
        [APPEND, 1, b"t/0", b"batch", 1, "quorum", 5.0],  # group as bytes
        [APPEND, 1, "t/0", "batch", 1, "quorum", 5.0],  # batch as text
        [APPEND, 1, "t/0", b"batch", 0, "quorum", 5.0],  # no offsets
        [APPEND, 1, "t/0", b"batch", True, "quorum", 5.0],  # a bool count
        [APPEND, 1, "t/0", b"batch", 1, "all", 5.0],  # unknown acks
        [APPEND, 1, "t/0", b"batch", 1, "quorum", -1.0],
        [APPEND, 1, "t/0", b"batch", 1, "quorum", math.nan],
        [APPEND, 1, "t/0", b"batch", 1, "quorum", math.inf],
        [APPEND, 1, "t/0", b"batch", 1, "quorum", "5"],
        [REQUEST_TAGS[BoundsRequest], 1, "t/0"],  # groups not a list
        [REQUEST_TAGS[BoundsRequest], 1, [1]],
        [REQUEST_TAGS[ReadRequest], 1, "t", -1, 0, 1, 0],  # a negative partition
        [REQUEST_TAGS[GroupCommandRequest], 1, [99, "g"]],  # unknown command
        [REQUEST_TAGS[GroupCommandRequest], 1, []],
        [REQUEST_TAGS[GroupCommandRequest], 1, [COMMAND_TAGS[Leave]]],  # a field short
        [REQUEST_TAGS[GroupCommandRequest], 1, [COMMAND_TAGS[Cons], "t", "m", [[1]], None, None]],
        [REQUEST_TAGS[GroupCommandRequest], 1, [COMMAND_TAGS[Subs], "t", "g", 0]],
        [REQUEST_TAGS[GroupCommandRequest], 1, [COMMAND_TAGS[Subs], "t", "g", None, 0]],
        [REQUEST_TAGS[GroupCommandRequest], 1, [COMMAND_TAGS[Subs], "t", "g", 1, 1, 1]],
        [REQUEST_TAGS[GroupCommandRequest], 1, [COMMAND_TAGS[Subs], "t"]],
        [REQUEST_TAGS[GroupCommandRequest], 1, [COMMAND_TAGS[Touch], 1, "1.a"]],
        [REQUEST_TAGS[GroupCommandRequest], 1, [COMMAND_TAGS[Touch], -1, []]],
        [REQUEST_TAGS[GroupCommandRequest], 1, [COMMAND_TAGS[Touch], 1, [1]]],
        [REQUEST_TAGS[LatestRequest], 1, "t", 0, "key"],  # key as text
        [REQUEST_TAGS[LatestRequest], 1, "t", -1, b"key"],  # a negative partition
        [REQUEST_TAGS[LatestRequest], 1, "t", 0],  # no key
        [REQUEST_TAGS[HandOverControllerRequest], 1, math.nan],
        [REQUEST_TAGS[HandOverControllerRequest], 1, "5"],
        [REPLY, 1, [ANSWER_TAGS[ControllerHandOver], "yes", 1]],
        [REPLY, 1, [ANSWER_TAGS[ControllerHandOver], True, -1]],  # a negative broker id
        [REQUEST_TAGS[DecommissionRequest], 1, "3"],
        [REQUEST_TAGS[DecommissionRequest], 1],  # no broker
        [REPLY, 1, [ANSWER_TAGS[Decommissioned], -1]],
        [REPLY, 1],  # no answer
        [REPLY, 1, "ok"],
        [REPLY, 1, []],
        [REPLY, 1, [ANSWER_TAGS[Appended], 1]],
        [REPLY, 1, [ANSWER_TAGS[Appended], 1, "2"]],
        [REPLY, 1, [ANSWER_TAGS[Refused], "NO_SUCH_CODE", "m"]],
        [REPLY, 1, [ANSWER_TAGS[Bounds], [[1, 2, 3, 4]]]],  # (a third value: the time's offset)
        [REPLY, 1, [ANSWER_TAGS[ReadResult], "data", 1, 1]],
        [REPLY, 1, [REQUEST_TAGS[AppendRequest], 1, 1]],  # a request is no answer
        [REPLY, 1, [99]],
        [peer_to_wire(LeaderClaims({}))[0], {"t/0": [1, [0], [], 1]}],  # committed as an int
        [peer_to_wire(LeaderClaims({}))[0], {"t/0": [1, [0], []]}],
        [peer_to_wire(LeaderClaims({}))[0], {1: [1, [0], [], True]}],
        [peer_to_wire(LeaderClaims({}))[0], [["t/0", 1]]],
        [peer_to_wire(Shares(()))[0], [["a"]]],
        [peer_to_wire(Shares(()))[0], [[1, 2]]],
    ],
)
def test_malformed_items_are_refused_as_such(item: Any) -> None:
    with pytest.raises(MalformedPeerMessage):
        peer_from_wire(item)


def test_a_call_whose_request_cannot_be_read_names_its_id_so_it_can_be_refused() -> None:
    """A newer broker's group command (``Touch`` was one once): the receiver answers that call
    (``MalformedPeerCall.req``) instead of leaving its caller to wait out its deadline."""
    with pytest.raises(MalformedPeerCall) as raised:
        peer_from_wire([REQUEST_TAGS[GroupCommandRequest], 41, [99, 3, ["3.a"]]])
    assert raised.value.req == 41 and "unknown group command tag 99" in str(raised.value)
    with pytest.raises(MalformedPeerMessage) as no_id:
        peer_from_wire([REQUEST_TAGS[GroupCommandRequest], "41", [99]])
    assert not isinstance(no_id.value, MalformedPeerCall)


def test_subs_goes_as_a_broker_of_before_session_timeout_ms_reads_it() -> None:
    """Without the option, SUBS has the three fields it always had (an older coordinator reads
    it); with it, four; and the three-field form of an older broker reads as no option."""
    tag = COMMAND_TAGS[Subs]
    plain = peer_to_wire(PeerCall(1, GroupCommandRequest(Subs("t", "g", 2))))
    assert plain[2] == [tag, "t", "g", 2]
    timed = peer_to_wire(PeerCall(1, GroupCommandRequest(Subs("t", "g", None, 500))))
    assert timed[2] == [tag, "t", "g", None, 500]
    old = peer_from_wire([REQUEST_TAGS[GroupCommandRequest], 1, [tag, "t", "g", None]])
    assert old == PeerCall(1, GroupCommandRequest(Subs("t", "g")))


@given(messages, st.data())
def test_a_changed_field_is_refused_or_read_as_a_message(msg: PeerMessage, data: Any) -> None:
    """Whatever a peer puts in any field, decoding raises ``MalformedPeerMessage`` or gives a
    message: never another exception (the receiver's item loop catches only that)."""
    wire = peer_to_wire(msg)
    index = data.draw(st.integers(min_value=0, max_value=len(wire) - 1))
    junk = data.draw(
        st.one_of(st.none(), st.booleans(), ints, st.floats(), names, st.binary(), st.just([]))
    )
    wire[index] = junk
    with contextlib.suppress(MalformedPeerMessage):
        peer_from_wire(_through_msgpack(wire))
