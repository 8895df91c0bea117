"""Raft messages: frozen dataclasses, group-agnostic (the driver adds the group id).

Every message carries ``src``, ``dst`` and ``term``. Heartbeats are a type of their own (term,
commit, read round) so the transport can coalesce the heartbeats of all groups between two brokers
into one frame per tick; one without ``reply`` carries a commit and asks no answer.
``to_wire``/``from_wire`` map each message to a msgpack-encodable list ``[tag, src, dst, term,
...fields]`` and back; ``from_wire`` validates shapes and raises ``MalformedMessage`` on anything
else (the transport then closes the connection).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, Final, TypeAlias

from ._errors import MalformedMessage
from ._membership import Configuration
from ._types import Entry, EntryKind


@dataclass(frozen=True, slots=True)
class RequestVote:
    """Ask for a vote (or a pre-vote, thesis §9.6, where ``term`` is the candidate's term + 1 and
    nobody changes state). ``transfer`` marks a campaign started by TimeoutNow: it overrides leader
    stickiness (thesis §3.10)."""

    src: int
    dst: int
    term: int
    last_index: int
    last_term: int
    pre_vote: bool = False
    transfer: bool = False


@dataclass(frozen=True, slots=True)
class RequestVoteResponse:
    """A (pre-)vote answer. A grant carries the requested term, a refusal the voter's own term."""

    src: int
    dst: int
    term: int
    granted: bool
    pre_vote: bool = False


@dataclass(frozen=True, slots=True)
class AppendEntries:
    """Replicate ``entries`` after ``prev_index`` (whose term must be ``prev_term``, §5.3)."""

    src: int
    dst: int
    term: int
    prev_index: int
    prev_term: int
    commit: int
    entries: tuple[Entry, ...] = ()


@dataclass(frozen=True, slots=True)
class AppendEntriesResponse:
    """Answer to AppendEntries or InstallLogStart.

    On success ``index`` is the last offset now known to match the leader. On a rejection
    ``index`` is the rejected ``prev_index`` and the hint says where to retry: the follower's term
    at ``prev_index`` (``conflict_term``) and the first offset it holds of that term
    (``conflict_index``), or, when its log is too short, ``conflict_term=None`` and its
    ``last_index + 1``.
    """

    src: int
    dst: int
    term: int
    success: bool
    index: int
    conflict_term: int | None = None
    conflict_index: int = -1


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Leader liveness and commit. ``commit`` is min(leader commit, follower's known match) so a
    follower never commits past what it has of this leader's log. ``round`` is the leader's
    read-index round (0 for none) that the response echoes. Without ``reply`` it is only news of
    a commit, for a follower that holds all the leader has: nothing to answer (no response)."""

    src: int
    dst: int
    term: int
    commit: int
    round: int = 0
    reply: bool = True


@dataclass(frozen=True, slots=True)
class HeartbeatResponse:
    """Answer to a heartbeat, echoing its read-index round."""

    src: int
    dst: int
    term: int
    round: int = 0


@dataclass(frozen=True, slots=True)
class InstallLogStart:
    """The leader's log starts at ``start`` (retention deleted what the follower needs).

    Raft's InstallSnapshot without a snapshot: the state is the log itself, so the follower only
    learns where the log starts, the term at ``start - 1`` and the configuration in force there.
    """

    src: int
    dst: int
    term: int
    start: int
    prev_term: int
    config: Configuration


@dataclass(frozen=True, slots=True)
class TimeoutNow:
    """Leadership transfer: campaign at once, without pre-vote (thesis §3.10)."""

    src: int
    dst: int
    term: int


Message: TypeAlias = (
    RequestVote
    | RequestVoteResponse
    | AppendEntries
    | AppendEntriesResponse
    | Heartbeat
    | HeartbeatResponse
    | InstallLogStart
    | TimeoutNow
)

# Wire tags: never reuse or renumber one, peers of different versions must agree.
TAGS: Final[dict[type, int]] = {
    RequestVote: 1,
    RequestVoteResponse: 2,
    AppendEntries: 3,
    AppendEntriesResponse: 4,
    Heartbeat: 5,
    HeartbeatResponse: 6,
    InstallLogStart: 7,
    TimeoutNow: 8,
}
_BY_TAG: Final[dict[int, type]] = {tag: cls for cls, tag in TAGS.items()}


def _entry_to_wire(e: Entry) -> list[object]:
    return [e.term, e.first, e.last, int(e.kind), e.data]


def _int(x: object) -> int:
    if type(x) is not int:
        raise MalformedMessage(f"expected an int, got {x!r}")
    return x


def _opt_int(x: object) -> int | None:
    return None if x is None else _int(x)


def _bool(x: object) -> bool:
    if type(x) is not bool:
        raise MalformedMessage(f"expected a bool, got {x!r}")
    return x


_KINDS: Final = tuple(EntryKind)  # by wire value (0, 1, 2...)
_KIND_COUNT: Final = len(_KINDS)


def _entries(x: object) -> tuple[Entry, ...]:
    # Once per replicated batch on a follower: the checks are inlined, and the exact types
    # msgpack gives (list, bytes) are tested first, which costs no isinstance call.
    if type(x) is not list and not isinstance(x, list | tuple):
        raise MalformedMessage(f"expected a list of entries, got {type(x).__name__}")
    out = []
    for item in x:
        if (type(item) is not list and not isinstance(item, list | tuple)) or len(item) != 5:
            raise MalformedMessage(f"bad entry {item!r}")
        term, first, last, kind, data = item
        if not (type(term) is type(first) is type(last) is type(kind) is int):
            raise MalformedMessage(f"bad entry {item!r}")
        if type(data) is not bytes and not isinstance(data, bytes):
            raise MalformedMessage("entry data must be bytes")
        if not 0 <= kind < _KIND_COUNT:
            raise MalformedMessage(f"unknown entry kind {kind}")
        try:
            out.append(Entry(term, first, last, _KINDS[kind], data))
        except ValueError as exc:
            raise MalformedMessage(f"bad entry: {exc}") from exc
    return tuple(out)


# Field decoders by field name; each message field maps to exactly one of them.
_DECODERS: Final[dict[str, Callable[[object], Any]]] = {
    "src": _int,
    "dst": _int,
    "term": _int,
    "last_index": _int,
    "last_term": _int,
    "pre_vote": _bool,
    "transfer": _bool,
    "granted": _bool,
    "prev_index": _int,
    "prev_term": _int,
    "commit": _int,
    "entries": _entries,
    "success": _bool,
    "index": _int,
    "conflict_term": _opt_int,
    "conflict_index": _int,
    "round": _int,
    "reply": _bool,
    "start": _int,
    "config": Configuration.from_wire,
}
_FIELDS: Final[dict[type, tuple[str, ...]]] = {
    cls: tuple(f.name for f in fields(cls)) for cls in TAGS
}


def _generic_to_wire(msg: Message) -> list[object]:
    """``to_wire`` for any message, driven by its dataclass fields (the reference form)."""
    out: list[object] = [TAGS[type(msg)]]
    for name in _FIELDS[type(msg)]:
        value = getattr(msg, name)
        if name == "entries":
            value = [_entry_to_wire(e) for e in value]
        elif name == "config":
            value = value.to_wire()
        out.append(value)
    return out


def _generic_from_wire(cls: type, obj: list[Any] | tuple[Any, ...]) -> Message:
    """``from_wire`` for any message class, field by field (the reference form: its errors
    name the field that is wrong)."""
    names = _FIELDS[cls]
    if len(obj) != len(names) + 1:
        raise MalformedMessage(f"{cls.__name__} needs {len(names)} fields, got {len(obj) - 1}")
    kwargs = {name: _DECODERS[name](value) for name, value in zip(names, obj[1:], strict=True)}
    msg: Message = cls(**kwargs)
    return msg


# The messages of every write's round (an append, its answer; heartbeats and their answers
# every tick) have hand-written encoders and decoders: the generic ones cost a getattr and an
# append per field and a decoder call per field, and these run for every message a broker
# sends or receives. They produce and accept exactly what the generic ones do (same tags, same
# layout, same checks; tests/raft/test_messages.py compares them), and leave the error message
# of a malformed one to the generic decoder.


def _append_to_wire(m: AppendEntries) -> list[object]:
    return [
        3,
        m.src,
        m.dst,
        m.term,
        m.prev_index,
        m.prev_term,
        m.commit,
        [[e.term, e.first, e.last, int(e.kind), e.data] for e in m.entries],
    ]


def _append_response_to_wire(m: AppendEntriesResponse) -> list[object]:
    return [4, m.src, m.dst, m.term, m.success, m.index, m.conflict_term, m.conflict_index]


def _heartbeat_to_wire(m: Heartbeat) -> list[object]:
    return [5, m.src, m.dst, m.term, m.commit, m.round, m.reply]


def _heartbeat_response_to_wire(m: HeartbeatResponse) -> list[object]:
    return [6, m.src, m.dst, m.term, m.round]


def _append_from_wire(obj: list[Any] | tuple[Any, ...]) -> Message:
    if len(obj) == 8:
        _, src, dst, term, prev_index, prev_term, commit, entries = obj
        if type(src) is type(dst) is type(term) is type(prev_index) is int and (
            type(prev_term) is type(commit) is int
        ):
            return AppendEntries(src, dst, term, prev_index, prev_term, commit, _entries(entries))
    return _generic_from_wire(AppendEntries, obj)


def _append_response_from_wire(obj: list[Any] | tuple[Any, ...]) -> Message:
    if len(obj) == 8:
        _, src, dst, term, success, index, conflict_term, conflict_index = obj
        if (
            type(src) is type(dst) is type(term) is type(index) is type(conflict_index) is int
            and type(success) is bool
            and (conflict_term is None or type(conflict_term) is int)
        ):
            return AppendEntriesResponse(
                src, dst, term, success, index, conflict_term, conflict_index
            )
    return _generic_from_wire(AppendEntriesResponse, obj)


def _heartbeat_from_wire(obj: list[Any] | tuple[Any, ...]) -> Message:
    if len(obj) == 7:
        _, src, dst, term, commit, round_, reply = obj
        if type(src) is type(dst) is type(term) is type(commit) is type(round_) is int and (
            type(reply) is bool
        ):
            return Heartbeat(src, dst, term, commit, round_, reply)
    return _generic_from_wire(Heartbeat, obj)


def _heartbeat_response_from_wire(obj: list[Any] | tuple[Any, ...]) -> Message:
    if len(obj) == 5:
        _, src, dst, term, round_ = obj
        if type(src) is type(dst) is type(term) is type(round_) is int:
            return HeartbeatResponse(src, dst, term, round_)
    return _generic_from_wire(HeartbeatResponse, obj)


_TO_WIRE: Final[dict[type, Callable[[Any], list[object]]]] = {
    cls: _generic_to_wire for cls in TAGS
} | {
    AppendEntries: _append_to_wire,
    AppendEntriesResponse: _append_response_to_wire,
    Heartbeat: _heartbeat_to_wire,
    HeartbeatResponse: _heartbeat_response_to_wire,
}
_FROM_WIRE: Final[dict[int, Callable[[list[Any] | tuple[Any, ...]], Message]]] = {
    tag: functools.partial(_generic_from_wire, cls) for cls, tag in TAGS.items()
} | {
    TAGS[AppendEntries]: _append_from_wire,
    TAGS[AppendEntriesResponse]: _append_response_from_wire,
    TAGS[Heartbeat]: _heartbeat_from_wire,
    TAGS[HeartbeatResponse]: _heartbeat_response_from_wire,
}


def to_wire(msg: Message) -> list[object]:
    """``[tag, src, dst, term, ...fields in declaration order]``, msgpack-encodable."""
    return _TO_WIRE[type(msg)](msg)


def from_wire(obj: object) -> Message:
    """Inverse of ``to_wire`` (accepts lists or tuples, as msgpack may give either).

    Raises:
        MalformedMessage: unknown tag, wrong arity or a field of the wrong type.
    """
    if not isinstance(obj, list | tuple) or not obj:
        raise MalformedMessage(f"expected a non-empty list, got {type(obj).__name__}")
    tag = obj[0]
    decode = _FROM_WIRE.get(tag) if type(tag) is int else None
    if decode is None:
        raise MalformedMessage(f"unknown message tag {tag!r}")
    return decode(obj)


def describe(msg: Message) -> str:
    """A short line for traces (``n1->n2 AppendEntries t=3 prev=4/2 ents=[5-7/3]``)."""
    head = f"n{msg.src}->n{msg.dst} {type(msg).__name__} t={msg.term}"
    if isinstance(msg, RequestVote):
        kind = "pre" if msg.pre_vote else ("transfer" if msg.transfer else "vote")
        return f"{head} {kind} last={msg.last_index}/{msg.last_term}"
    if isinstance(msg, RequestVoteResponse):
        return f"{head} {'pre' if msg.pre_vote else 'vote'} granted={msg.granted}"
    if isinstance(msg, AppendEntries):
        ents = ",".join(f"{e.first}-{e.last}/{e.term}" for e in msg.entries)
        return f"{head} prev={msg.prev_index}/{msg.prev_term} commit={msg.commit} ents=[{ents}]"
    if isinstance(msg, AppendEntriesResponse):
        if msg.success:
            return f"{head} ok index={msg.index}"
        return (
            f"{head} reject prev={msg.index} hint_term={msg.conflict_term} "
            f"hint_index={msg.conflict_index}"
        )
    if isinstance(msg, Heartbeat):
        return f"{head} commit={msg.commit} round={msg.round}" + ("" if msg.reply else " no-reply")
    if isinstance(msg, HeartbeatResponse):
        return f"{head} round={msg.round}"
    if isinstance(msg, InstallLogStart):
        return f"{head} start={msg.start} prev_term={msg.prev_term} {msg.config}"
    return head
