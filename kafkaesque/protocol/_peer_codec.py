"""The wire form of the broker-to-broker messages of ``_peer_messages.py``, sans I/O.

``to_wire`` maps a message to a list of msgpack-encodable values and ``from_wire`` maps it back,
checking every field's type (and the few values that can be checked alone: a count is positive,
a deadline finite). Anything else raises ``MalformedPeerMessage``: the peer broke the protocol;
the receiver drops that item and logs it (the connection and the broker go on).

Tags decide the message type (``REQUEST_TAGS``, ``ANSWER_TAGS``, ``COMMAND_TAGS``); a tag is
never reused or renumbered, so peers of different versions agree (see ``_peer_messages.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import fields
from enum import Enum
from typing import Any, Final

from ._line_commands import (
    Acks,
    Commit,
    Cons,
    ConsOffsets,
    DeleteGroup,
    DescribeGroup,
    FetchOffsets,
    Leave,
    ListGroups,
    ResetKind,
    ResetOffsets,
    Subs,
)
from ._line_errors import ErrorCode
from ._peer_messages import (
    ANSWER_TAGS,
    COMMAND_TAGS,
    LEADER_CLAIMS_TAG,
    PEER_TAG_MIN,
    PEER_VIEW_TAG,
    REPLY_TAG,
    REQUEST_TAGS,
    SHARES_TAG,
    Absent,
    Answer,
    Appended,
    AppendRequest,
    Bounds,
    BoundsRequest,
    CommandReply,
    ControllerHandOver,
    Decommissioned,
    DecommissionRequest,
    FindResendRequest,
    Found,
    GroupCommand,
    GroupCommandRequest,
    HandOverControllerRequest,
    LatestRequest,
    LeaderClaim,
    LeaderClaims,
    MalformedPeerCall,
    MalformedPeerMessage,
    PeerCall,
    PeerMessage,
    PeerReply,
    PeerView,
    ReadRequest,
    ReadResult,
    Refused,
    Request,
    Retry,
    Shares,
    Touch,
    Unknown,
)

# -- field decoders ------------------------------------------------------------------------------


def _int(x: object) -> int:
    if type(x) is not int:
        raise MalformedPeerMessage(f"expected an int, got {x!r:.60}")
    return x


def _natural(x: object) -> int:
    if type(x) is not int or x < 0:
        raise MalformedPeerMessage(f"expected an int >= 0, got {x!r:.60}")
    return x


def _opt_natural(x: object) -> int | None:
    return None if x is None else _natural(x)


def _positive(x: object) -> int:
    if type(x) is not int or x < 1:
        raise MalformedPeerMessage(f"expected an int >= 1, got {x!r:.60}")
    return x


def _opt_positive(x: object) -> int | None:
    return None if x is None else _positive(x)


def _str(x: object) -> str:
    if type(x) is not str:
        raise MalformedPeerMessage(f"expected a string, got {x!r:.60}")
    return x


def _opt_str(x: object) -> str | None:
    return None if x is None else _str(x)


def _bytes(x: object) -> bytes:
    if type(x) is not bytes:
        raise MalformedPeerMessage(f"expected bytes, got {type(x).__name__}")
    return x


def _bool(x: object) -> bool:
    if type(x) is not bool:
        raise MalformedPeerMessage(f"expected a bool, got {x!r:.60}")
    return x


def _seconds(x: object) -> float:
    if type(x) is not float and type(x) is not int:
        raise MalformedPeerMessage(f"expected a number of seconds, got {x!r:.60}")
    if not 0 <= x < math.inf:  # NaN fails too
        raise MalformedPeerMessage(f"expected a finite number of seconds >= 0, got {x!r}")
    return float(x)


def _reset_kind(x: object) -> ResetKind:
    try:
        return ResetKind(_str(x))
    except ValueError:
        raise MalformedPeerMessage(f"unknown reset kind {x!r:.60}") from None


def _acks(x: object) -> Acks:
    try:
        return Acks(_str(x))
    except ValueError:
        raise MalformedPeerMessage(f"unknown acks {x!r:.60}") from None


def _code(x: object) -> ErrorCode:
    try:
        return ErrorCode[_str(x)]
    except KeyError:
        raise MalformedPeerMessage(f"unknown error code {x!r:.60}") from None


def _list(x: object, what: str) -> list[Any] | tuple[Any, ...]:
    if not isinstance(x, list | tuple):
        raise MalformedPeerMessage(f"expected a list of {what}, got {type(x).__name__}")
    return x


def _pair(x: object, what: str) -> tuple[int, int]:
    if not isinstance(x, list | tuple) or len(x) != 2:
        raise MalformedPeerMessage(f"expected a pair of {what}, got {x!r:.60}")
    return _natural(x[0]), _natural(x[1])


def _arity(obj: list[Any] | tuple[Any, ...], n: int, name: str) -> None:
    if len(obj) != n + 1:
        raise MalformedPeerMessage(f"{name} needs {n} fields, got {len(obj) - 1}")


# -- requests -------------------------------------------------------------------------------------


def _cons_offsets(x: object) -> ConsOffsets:
    if type(x) is int:
        return _natural(x)
    return tuple(_pair(p, "partition and offset") for p in _list(x, "partition offsets"))


def _members(x: object) -> tuple[str, ...]:
    return tuple(_str(m) for m in _list(x, "members"))


# Each group command's fields in declaration order, with the decoder of each.
_COMMAND_FIELDS: Final[dict[type, tuple[Callable[[object], Any], ...]]] = {
    Subs: (_str, _str, _opt_positive, _opt_positive),
    Cons: (_str, _str, _cons_offsets, _opt_positive, _opt_natural),
    Commit: (_str, _str, _natural, _natural, _opt_str),
    FetchOffsets: (_str, _str),
    Leave: (_str,),
    DescribeGroup: (_str, _opt_str),
    ListGroups: (_opt_natural,),
    ResetOffsets: (_str, _str, _reset_kind, _opt_natural, _bool),
    DeleteGroup: (_str,),
    Touch: (_natural, _members),
}
# Fields added to a command after its first version: sent only when not None, so that a broker
# of before them reads the command as it always did; read as None when absent.
_COMMAND_FIELDS_SINCE: Final[dict[type, int]] = {Subs: 3}
_COMMAND_NAMES: Final[dict[type, tuple[str, ...]]] = {
    cls: tuple(f.name for f in fields(cls)) for cls in COMMAND_TAGS
}
_COMMAND_BY_TAG: Final[dict[int, type]] = {tag: cls for cls, tag in COMMAND_TAGS.items()}


def _command_to_wire(command: GroupCommand) -> list[object]:
    values = [getattr(command, n) for n in _COMMAND_NAMES[type(command)]]
    first = _COMMAND_FIELDS_SINCE.get(type(command), len(values))
    while len(values) > first and values[-1] is None:
        values.pop()
    # An enum (ResetOffsets.kind) goes as its plain value, which its decoder reads back.
    return [COMMAND_TAGS[type(command)], *(v.value if isinstance(v, Enum) else v for v in values)]


def _command(x: object) -> GroupCommand:
    obj = _list(x, "command fields")
    tag = obj[0] if obj else None
    cls = _COMMAND_BY_TAG.get(tag) if type(tag) is int else None
    if cls is None:
        raise MalformedPeerMessage(f"unknown group command tag {tag!r:.60}")
    decoders = _COMMAND_FIELDS[cls]
    if _COMMAND_FIELDS_SINCE.get(cls, len(decoders)) < len(obj) <= len(decoders):
        decoders = decoders[: len(obj) - 1]  # a broker of before the later fields
    _arity(obj, len(decoders), cls.__name__)
    command: GroupCommand = cls(*(d(v) for d, v in zip(decoders, obj[1:], strict=True)))
    return command


def _append(o: list[Any] | tuple[Any, ...]) -> AppendRequest:
    _arity(o, 6, "AppendRequest")
    return AppendRequest(_str(o[2]), _bytes(o[3]), _positive(o[4]), _acks(o[5]), _seconds(o[6]))


def _find_resend(o: list[Any] | tuple[Any, ...]) -> FindResendRequest:
    _arity(o, 6, "FindResendRequest")
    return FindResendRequest(_str(o[2]), _bytes(o[3]), _bytes(o[4]), _int(o[5]), _seconds(o[6]))


def _bounds_request(o: list[Any] | tuple[Any, ...]) -> BoundsRequest:
    if len(o) == 3:  # no time asked (a broker of before ``time_ms`` sends only these)
        return BoundsRequest(tuple(_str(g) for g in _list(o[2], "groups")))
    _arity(o, 3, "BoundsRequest")
    return BoundsRequest(tuple(_str(g) for g in _list(o[2], "groups")), _natural(o[3]))


def _read(o: list[Any] | tuple[Any, ...]) -> ReadRequest:
    _arity(o, 6, "ReadRequest")
    return ReadRequest(_str(o[2]), _natural(o[3]), _natural(o[4]), _positive(o[5]), _natural(o[6]))


def _group_command(o: list[Any] | tuple[Any, ...]) -> GroupCommandRequest:
    _arity(o, 2, "GroupCommandRequest")
    return GroupCommandRequest(_command(o[2]))


def _latest(o: list[Any] | tuple[Any, ...]) -> LatestRequest:
    _arity(o, 4, "LatestRequest")
    return LatestRequest(_str(o[2]), _natural(o[3]), _bytes(o[4]))


def _hand_over_controller(o: list[Any] | tuple[Any, ...]) -> HandOverControllerRequest:
    _arity(o, 2, "HandOverControllerRequest")
    return HandOverControllerRequest(_seconds(o[2]))


def _decommission(o: list[Any] | tuple[Any, ...]) -> DecommissionRequest:
    _arity(o, 2, "DecommissionRequest")
    return DecommissionRequest(_natural(o[2]))


_REQUEST_DECODERS: Final[dict[int, Callable[[list[Any] | tuple[Any, ...]], Request]]] = {
    REQUEST_TAGS[AppendRequest]: _append,
    REQUEST_TAGS[FindResendRequest]: _find_resend,
    REQUEST_TAGS[BoundsRequest]: _bounds_request,
    REQUEST_TAGS[ReadRequest]: _read,
    REQUEST_TAGS[GroupCommandRequest]: _group_command,
    REQUEST_TAGS[LatestRequest]: _latest,
    REQUEST_TAGS[HandOverControllerRequest]: _hand_over_controller,
    REQUEST_TAGS[DecommissionRequest]: _decommission,
}


def _request_fields(request: Request) -> list[object]:
    match request:
        case AppendRequest(log_id, batch, count, acks, seconds):
            return [log_id, batch, count, acks.value, seconds]
        case FindResendRequest(log_id, client, packet, digest, seconds):
            return [log_id, client, packet, digest, seconds]
        case BoundsRequest(log_ids, time_ms):
            return [list(log_ids)] if time_ms is None else [list(log_ids), time_ms]
        case ReadRequest(topic, partition, offset, max_bytes, wait_ms):
            return [topic, partition, offset, max_bytes, wait_ms]
        case GroupCommandRequest(command):
            return [_command_to_wire(command)]
        case LatestRequest(topic, partition, key):
            return [topic, partition, key]
        case HandOverControllerRequest(seconds):
            return [seconds]
        case DecommissionRequest(broker):
            return [broker]
    raise TypeError(f"not a peer request: {request!r}")


# -- answers ---------------------------------------------------------------------------------------


def answer_to_wire(answer: Answer) -> list[object]:
    """``[tag, ...fields]`` of an answer (inside a ``PeerReply``)."""
    match answer:
        case Appended(first, last):
            return [ANSWER_TAGS[Appended], first, last]
        case Retry(reason) | Unknown(reason):
            return [ANSWER_TAGS[type(answer)], reason]
        case Refused(code, message):
            return [ANSWER_TAGS[Refused], code.name, message]
        case Found(offset):
            return [ANSWER_TAGS[Found], offset]
        case Absent():
            return [ANSWER_TAGS[Absent]]
        case Bounds(bounds):
            return [ANSWER_TAGS[Bounds], [None if b is None else list(b) for b in bounds]]
        case ReadResult(data, next_offset, high_watermark):
            return [ANSWER_TAGS[ReadResult], data, next_offset, high_watermark]
        case CommandReply(data):
            return [ANSWER_TAGS[CommandReply], data]
        case ControllerHandOver(handed_over, leader):
            return [ANSWER_TAGS[ControllerHandOver], handed_over, leader]
        case Decommissioned(moved):
            return [ANSWER_TAGS[Decommissioned], moved]
    raise TypeError(f"not a peer answer: {answer!r}")


def _bound(x: object) -> tuple[int, ...] | None:
    if x is None:
        return None
    if isinstance(x, list | tuple) and len(x) == 3:  # with the offset for a time
        return _natural(x[0]), _natural(x[1]), _natural(x[2])
    return _pair(x, "offsets")


def answer_from_wire(obj: object) -> Answer:
    """Inverse of ``answer_to_wire``; raises ``MalformedPeerMessage``."""
    o = _list(obj, "answer fields")
    tag = o[0] if o else None
    if type(tag) is not int:
        raise MalformedPeerMessage(f"unknown answer tag {tag!r:.60}")
    if tag == 40:
        _arity(o, 2, "Appended")
        return Appended(_natural(o[1]), _natural(o[2]))
    if tag in (41, 42):
        _arity(o, 1, "Retry" if tag == 41 else "Unknown")
        return Retry(_str(o[1])) if tag == 41 else Unknown(_str(o[1]))
    if tag == 43:
        _arity(o, 2, "Refused")
        return Refused(_code(o[1]), _str(o[2]))
    if tag == 44:
        _arity(o, 1, "Found")
        return Found(_natural(o[1]))
    if tag == 45:
        _arity(o, 0, "Absent")
        return Absent()
    if tag == 46:
        _arity(o, 1, "Bounds")
        return Bounds(tuple(_bound(b) for b in _list(o[1], "bounds")))
    if tag == 47:
        _arity(o, 3, "ReadResult")
        return ReadResult(_bytes(o[1]), _natural(o[2]), _natural(o[3]))
    if tag == 48:
        _arity(o, 1, "CommandReply")
        return CommandReply(_bytes(o[1]))
    if tag == 49:
        _arity(o, 2, "ControllerHandOver")
        return ControllerHandOver(None if o[1] is None else _bool(o[1]), _opt_natural(o[2]))
    if tag == 50:
        _arity(o, 1, "Decommissioned")
        return Decommissioned(_natural(o[1]))
    raise MalformedPeerMessage(f"unknown answer tag {tag}")


# -- leader claims, shares -------------------------------------------------------------------------


def _claims_to_wire(claims: Mapping[str, LeaderClaim]) -> dict[str, list[object]]:
    # msgpack has no sets: sorted lists.
    return {
        g: [c.term, sorted(c.voters), sorted(c.learners), c.committed] for g, c in claims.items()
    }


def _claims(x: object) -> dict[str, LeaderClaim]:
    if not isinstance(x, dict):
        raise MalformedPeerMessage(f"expected a map of claims, got {type(x).__name__}")
    out: dict[str, LeaderClaim] = {}
    for log_id, value in x.items():
        v = _list(value, "claim fields")
        if len(v) != 4:
            raise MalformedPeerMessage(f"a claim needs 4 fields, got {len(v)}")
        out[_str(log_id)] = LeaderClaim(
            _int(v[0]),
            frozenset(_natural(n) for n in _list(v[1], "voters")),
            frozenset(_natural(n) for n in _list(v[2], "learners")),
            _bool(v[3]),
        )
    return out


def _elections(x: object) -> dict[str, tuple[int, str, int]]:
    if not isinstance(x, dict):
        raise MalformedPeerMessage(f"expected a map of elections, got {type(x).__name__}")
    out: dict[str, tuple[int, str, int]] = {}
    for log_id, value in x.items():
        v = _list(value, "election fields")
        if len(v) != 3:
            raise MalformedPeerMessage(f"an election needs 3 fields, got {len(v)}")
        out[_str(log_id)] = (_natural(v[0]), _str(v[1]), _natural(v[2]))
    return out


def _group_offset(x: object) -> tuple[str, str, int, int]:
    v = _list(x, "committed offset")
    if len(v) != 4:
        raise MalformedPeerMessage(f"a committed offset needs 4 fields, got {len(v)}")
    return _str(v[0]), _str(v[1]), _natural(v[2]), _natural(v[3])


def _share(x: object) -> tuple[str, str]:
    if not isinstance(x, list | tuple) or len(x) != 2:
        raise MalformedPeerMessage(f"expected a share name and filter, got {x!r:.60}")
    return _str(x[0]), _str(x[1])


# -- messages --------------------------------------------------------------------------------------


def to_wire(msg: PeerMessage) -> list[object]:
    """The message as a list of msgpack-encodable values (``[tag, ...]``, see the module doc)."""
    if type(msg) is PeerCall:
        request = msg.request
        return [REQUEST_TAGS[type(request)], msg.req, *_request_fields(request)]
    if type(msg) is PeerReply:
        return [REPLY_TAG, msg.req, answer_to_wire(msg.answer)]
    if type(msg) is LeaderClaims:
        return [LEADER_CLAIMS_TAG, _claims_to_wire(msg.claims)]
    if type(msg) is Shares:
        return [SHARES_TAG, [list(s) for s in msg.shares]]
    if type(msg) is PeerView:
        elections = {g: list(e) for g, e in msg.elections.items()}
        return [PEER_VIEW_TAG, list(msg.heard), elections, [list(o) for o in msg.offsets]]
    raise TypeError(f"not a peer message: {msg!r}")


def is_peer_item(item: object) -> bool:
    """Whether a transport item is the broker's (a list tagged at or above ``PEER_TAG_MIN``),
    not Raft's. Cheap: it runs for every item of every frame."""
    if type(item) is not list or not item:
        return False
    tag = item[0]
    return type(tag) is int and tag >= PEER_TAG_MIN


def from_wire(obj: object) -> PeerMessage:
    """Inverse of ``to_wire`` (lists or tuples, as msgpack may give either).

    Raises ``MalformedPeerMessage``: an unknown tag, a wrong arity, a field of the wrong type.
    """
    if not isinstance(obj, list | tuple) or not obj:
        raise MalformedPeerMessage(f"expected a non-empty list, got {type(obj).__name__}")
    tag = obj[0]
    if type(tag) is not int:
        raise MalformedPeerMessage(f"unknown peer message tag {tag!r:.60}")
    decode = _REQUEST_DECODERS.get(tag)
    if decode is not None:
        if len(obj) < 2:
            raise MalformedPeerMessage("a request needs an id")
        req = _int(obj[1])
        try:
            return PeerCall(req, decode(obj))
        except MalformedPeerCall:
            raise
        except MalformedPeerMessage as exc:
            raise MalformedPeerCall(req, str(exc)) from None
    if tag == REPLY_TAG:
        _arity(obj, 2, "PeerReply")
        return PeerReply(_int(obj[1]), answer_from_wire(obj[2]))
    if tag == LEADER_CLAIMS_TAG:
        _arity(obj, 1, "LeaderClaims")
        return LeaderClaims(_claims(obj[1]))
    if tag == SHARES_TAG:
        _arity(obj, 1, "Shares")
        return Shares(tuple(_share(s) for s in _list(obj[1], "shares")))
    if tag == PEER_VIEW_TAG:
        _arity(obj, 3, "PeerView")
        heard = tuple(_natural(b) for b in _list(obj[1], "heard"))
        offsets = tuple(_group_offset(o) for o in _list(obj[3], "offsets"))
        return PeerView(heard, _elections(obj[2]), offsets)
    raise MalformedPeerMessage(f"unknown peer message tag {tag}")


# The package exports them under these names (``kafkaesque.protocol`` holds other codecs too).
peer_to_wire = to_wire
peer_from_wire = from_wire
