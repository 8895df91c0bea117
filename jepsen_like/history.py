"""The history of a jepsen_like run: the operations the harness saw, one JSON object a line.

The model is Jepsen's. Every client operation is an ``invoke`` event followed, later, by exactly
one completion of the same process: ``ok`` (it happened, with its results), ``fail`` (it definitely
did not happen) or ``info`` (indeterminate: it may have happened, or may still happen). A process
runs one operation at a time; a process that never completes its last operation left it
indeterminate. Some events are observations rather than requests (see ``OBSERVATIONS``): a member
learning its assignment, a consumer learning the committed offset, a client crashing. They are
recorded as a single completion, may arrive while their process has an operation in flight (a
rebalance happens inside ``poll``), and a crash abandons that in-flight operation.

An event is an envelope (``Event``: type, process, time, node) around an operation payload (one of
the frozen dataclasses below, named by its ``F``). On disk the two are flattened into one object::

    {"type":"ok","f":"send","process":3,"time":1250000,"node":"n2","topic":"t","partition":0,
     "value":"p3-17","idempotent":true,"offset":42}

Conventions the checker relies on, which the harness must keep:

* ``time`` is integer nanoseconds since the start of the test, from one monotonic clock (the
  harness's), so times of different processes compare. Events are written in time order.
* Sent values are unique strings across the whole history (``"p3-17"``: producer 3, sequence 17).
* Offsets are the broker's: they only increase and may have gaps (control batches take offsets).
* A completion repeats the invocation's arguments and adds its results (``Send.offset``,
  ``Poll.reads``, ``FetchCommitted.offset``).

Lines are numbered from 1, and the checker names the events that prove an anomaly by line, so
``read_history`` returns exactly one event per line and rejects blank lines.
"""

from __future__ import annotations

import gc
import json
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Literal, NamedTuple, TypeAlias, get_args

EventType: TypeAlias = Literal["invoke", "ok", "fail", "info"]
"""``fail`` means definitely not applied; ``info`` means it may or may not have been applied."""

Process: TypeAlias = int | str
"""A client id (an int for clients, by Jepsen's habit; a string such as ``"nemesis"`` otherwise)."""

NemesisPhase: TypeAlias = Literal["start", "stop"]

_EVENT_TYPES: frozenset[str] = frozenset(get_args(EventType))
_PHASES: frozenset[str] = frozenset(get_args(NemesisPhase))


class HistoryError(ValueError):
    """The history itself is malformed (bad JSON, missing field, a value sent twice, a process
    with two operations in flight...). It is a bug of the harness, never an anomaly of the system
    under test, so the checker raises it instead of reporting it."""


class TopicPartition(NamedTuple):
    """One partition of one topic, the unit every log rule is checked on."""

    topic: str
    partition: int


class Read(NamedTuple):
    """One record as a consumer received it. JSON: ``[topic, partition, offset, value]``."""

    topic: str
    partition: int
    offset: int
    value: str


class Seek(NamedTuple):
    """An explicitly assigned partition and the offset to read it from.

    ``offset`` None means "wherever the client is" (no expectation about the first read).
    JSON: ``[topic, partition, offset]``.
    """

    topic: str
    partition: int
    offset: int | None = None


# --------------------------------------------------------------------------------------------
# Field decoding. Strict, because a history that silently decodes wrong checks the wrong thing.


def _missing(key: str, want: str) -> HistoryError:
    return HistoryError(f"field {key!r}: expected {want}")


def _str(d: Mapping[str, Any], key: str) -> str:
    v = d.get(key)
    if type(v) is not str:
        raise _missing(key, "a string")
    return v


def _name(d: Mapping[str, Any], key: str) -> str:
    # Names repeat on every line; interning keeps a million-event history small in memory.
    return sys.intern(_str(d, key))


def _opt_str(d: Mapping[str, Any], key: str) -> str | None:
    v = d.get(key)
    if v is not None and type(v) is not str:
        raise _missing(key, "a string or null")
    return v


def _opt_name(d: Mapping[str, Any], key: str) -> str | None:
    v = _opt_str(d, key)
    return None if v is None else sys.intern(v)


def _int(d: Mapping[str, Any], key: str) -> int:
    v = d.get(key)
    if type(v) is not int:  # excludes bool, which is an int subclass
        raise _missing(key, "an integer")
    return v


def _opt_int(d: Mapping[str, Any], key: str) -> int | None:
    v = d.get(key)
    if v is not None and type(v) is not int:
        raise _missing(key, "an integer or null")
    return v


def _bool(d: Mapping[str, Any], key: str) -> bool:
    v = d.get(key, False)
    if type(v) is not bool:
        raise _missing(key, "a boolean")
    return v


def _list(d: Mapping[str, Any], key: str) -> list[Any]:
    v = d.get(key, [])
    if type(v) is not list:
        raise _missing(key, "a list")
    return v


def _names(d: Mapping[str, Any], key: str) -> tuple[str, ...]:
    out = []
    for v in _list(d, key):
        if type(v) is not str:
            raise _missing(key, "a list of strings")
        out.append(sys.intern(v))
    return tuple(out)


def _reads(d: Mapping[str, Any], key: str) -> tuple[Read, ...]:
    # The hot loop of reading a history (a drain holds every record): locals, no helper calls,
    # and tuple.__new__ instead of Read(...), whose generated __new__ costs a Python frame.
    out: list[Read] = []
    append = out.append
    intern = sys.intern
    new = tuple.__new__
    for r in _list(d, key):
        if type(r) is list and len(r) == 4:
            t, p, o, v = r
            if type(t) is str and type(p) is int and type(o) is int and type(v) is str:
                append(new(Read, (intern(t), p, o, v)))
                continue
        raise _missing(key, "a list of [topic, partition, offset, value]")
    return tuple(out)


def _partitions(d: Mapping[str, Any], key: str) -> tuple[TopicPartition, ...]:
    out = []
    for r in _list(d, key):
        if type(r) is not list or len(r) != 2 or type(r[0]) is not str or type(r[1]) is not int:
            raise _missing(key, "a list of [topic, partition]")
        out.append(TopicPartition(sys.intern(r[0]), r[1]))
    return tuple(out)


def _seeks(d: Mapping[str, Any], key: str) -> tuple[Seek, ...]:
    out = []
    for r in _list(d, key):
        if (
            type(r) is not list
            or len(r) != 3
            or type(r[0]) is not str
            or type(r[1]) is not int
            or (r[2] is not None and type(r[2]) is not int)
        ):
            raise _missing(key, "a list of [topic, partition, offset or null]")
        out.append(Seek(sys.intern(r[0]), r[1], r[2]))
    return tuple(out)


class PartitionEnd(NamedTuple):
    """How far a read of one replica went: offsets below ``end``. JSON: ``[topic, partition,
    end]``."""

    topic: str
    partition: int
    end: int


def _ends(d: Mapping[str, Any], key: str) -> tuple[PartitionEnd, ...]:
    out = []
    for r in _list(d, key):
        if (
            type(r) is not list
            or len(r) != 3
            or type(r[0]) is not str
            or type(r[1]) is not int
            or type(r[2]) is not int
        ):
            raise _missing(key, "a list of [topic, partition, end]")
        out.append(PartitionEnd(sys.intern(r[0]), r[1], r[2]))
    return tuple(out)


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


# --------------------------------------------------------------------------------------------
# Operations. Each names itself by ``F`` (the JSON "f") and flattens into the event's object.


@dataclass(frozen=True, slots=True)
class Send:
    """Produce one record.

    The invocation names ``topic`` and either ``partition`` or a ``key`` that picks it; an ``ok``
    completion must give both ``partition`` and the ``offset`` the broker acknowledged.
    ``idempotent`` says whether the producer had idempotence on: with it, a value may appear at
    most once in the log even when the send was retried or ended ``info``.
    """

    F: ClassVar[str] = "send"
    topic: str
    value: str
    partition: int | None = None
    key: str | None = None
    idempotent: bool = False
    offset: int | None = None

    def fields(self) -> dict[str, Any]:
        """The JSON fields of this operation (None-valued ones are left out)."""
        return _drop_none(
            {
                "topic": self.topic,
                "partition": self.partition,
                "key": self.key,
                "value": self.value,
                "idempotent": self.idempotent,
                "offset": self.offset,
            }
        )

    @classmethod
    def from_fields(cls, d: Mapping[str, Any]) -> Send:
        """Decode what ``fields`` wrote. Raises HistoryError on a missing or mistyped field."""
        # Sends are half of a history: check every field inline, and only when one is wrong
        # go through the helpers below, which say which.
        get = d.get
        topic, value, partition = get("topic"), get("value"), get("partition")
        key, idempotent, offset = get("key"), get("idempotent", False), get("offset")
        if (
            type(topic) is str
            and type(value) is str
            and (partition is None or type(partition) is int)
            and (key is None or type(key) is str)
            and type(idempotent) is bool
            and (offset is None or type(offset) is int)
        ):
            return cls(sys.intern(topic), value, partition, key, idempotent, offset)
        return cls(
            topic=_name(d, "topic"),
            value=_str(d, "value"),
            partition=_opt_int(d, "partition"),
            key=_opt_str(d, "key"),
            idempotent=_bool(d, "idempotent"),
            offset=_opt_int(d, "offset"),
        )


@dataclass(frozen=True, slots=True)
class Poll:
    """One poll of a consumer; ``reads`` are the records returned, in the order returned.

    Whether the consumer is in assign or subscribe mode is its process's latest ``Assign`` or
    ``Subscribe``. A subscribe-mode (group) consumer gives its ``group`` and the ``generation``
    its assignment came from: a change of generation between two polls is a rebalance, across
    which its position may jump.
    """

    F: ClassVar[str] = "poll"
    reads: tuple[Read, ...] = ()
    group: str | None = None
    generation: int | None = None

    def fields(self) -> dict[str, Any]:
        """The JSON fields of this operation (None-valued ones are left out)."""
        return _drop_none({"reads": self.reads, "group": self.group, "generation": self.generation})

    @classmethod
    def from_fields(cls, d: Mapping[str, Any]) -> Poll:
        """Decode what ``fields`` wrote. Raises HistoryError on a missing or mistyped field."""
        return cls(
            reads=_reads(d, "reads"),
            group=_opt_name(d, "group"),
            generation=_opt_int(d, "generation"),
        )


@dataclass(frozen=True, slots=True)
class Assign:
    """Put a consumer in assign mode on exactly these partitions, each from its ``Seek`` offset.

    It starts a new reading session: the consumer's earlier position no longer constrains it.
    """

    F: ClassVar[str] = "assign"
    partitions: tuple[Seek, ...] = ()

    def fields(self) -> dict[str, Any]:
        """The JSON fields of this operation."""
        return {"partitions": self.partitions}

    @classmethod
    def from_fields(cls, d: Mapping[str, Any]) -> Assign:
        """Decode what ``fields`` wrote. Raises HistoryError on a missing or mistyped field."""
        return cls(partitions=_seeks(d, "partitions"))


@dataclass(frozen=True, slots=True)
class Subscribe:
    """Put a consumer in subscribe mode: member of ``group``, consuming ``topics``."""

    F: ClassVar[str] = "subscribe"
    group: str
    topics: tuple[str, ...] = ()

    def fields(self) -> dict[str, Any]:
        """The JSON fields of this operation."""
        return {"group": self.group, "topics": self.topics}

    @classmethod
    def from_fields(cls, d: Mapping[str, Any]) -> Subscribe:
        """Decode what ``fields`` wrote. Raises HistoryError on a missing or mistyped field."""
        return cls(group=_name(d, "group"), topics=_names(d, "topics"))


@dataclass(frozen=True, slots=True)
class Crash:
    """The process's client crashed (or was closed hard) and will be reopened.

    Its in-flight operation, if any, is abandoned (indeterminate); its reading position and any
    group assignment it held end here.
    """

    F: ClassVar[str] = "crash"

    def fields(self) -> dict[str, Any]:
        """The JSON fields of this operation (none)."""
        return {}

    @classmethod
    def from_fields(cls, d: Mapping[str, Any]) -> Crash:
        """Decode what ``fields`` wrote."""
        return cls()


@dataclass(frozen=True, slots=True)
class Commit:
    """Commit ``offset`` (the next offset to read, Kafka's convention) for a group's partition.

    ``member`` and ``generation`` are those the committing member held, when it is one.
    """

    F: ClassVar[str] = "commit"
    group: str
    topic: str
    partition: int
    offset: int
    member: str | None = None
    generation: int | None = None

    def fields(self) -> dict[str, Any]:
        """The JSON fields of this operation (None-valued ones are left out)."""
        return _drop_none(
            {
                "group": self.group,
                "topic": self.topic,
                "partition": self.partition,
                "offset": self.offset,
                "member": self.member,
                "generation": self.generation,
            }
        )

    @classmethod
    def from_fields(cls, d: Mapping[str, Any]) -> Commit:
        """Decode what ``fields`` wrote. Raises HistoryError on a missing or mistyped field."""
        return cls(
            group=_name(d, "group"),
            topic=_name(d, "topic"),
            partition=_int(d, "partition"),
            offset=_int(d, "offset"),
            member=_opt_name(d, "member"),
            generation=_opt_int(d, "generation"),
        )


@dataclass(frozen=True, slots=True)
class FetchCommitted:
    """A read of a group's committed offset for a partition; ``offset`` None = nothing committed.

    Either an explicit operation (invoke + completion) or an observation (a lone ``ok``) made
    inside a poll, as a member does when it is given a partition.
    """

    F: ClassVar[str] = "fetch_committed"
    group: str
    topic: str
    partition: int
    offset: int | None = None

    def fields(self) -> dict[str, Any]:
        """The JSON fields of this operation (None-valued ones are left out)."""
        return _drop_none(
            {
                "group": self.group,
                "topic": self.topic,
                "partition": self.partition,
                "offset": self.offset,
            }
        )

    @classmethod
    def from_fields(cls, d: Mapping[str, Any]) -> FetchCommitted:
        """Decode what ``fields`` wrote. Raises HistoryError on a missing or mistyped field."""
        return cls(
            group=_name(d, "group"),
            topic=_name(d, "topic"),
            partition=_int(d, "partition"),
            offset=_opt_int(d, "offset"),
        )


@dataclass(frozen=True, slots=True)
class Assignment:
    """An observation by a group member: from this event's time on it owns ``partitions``.

    It owns them until its process's next ``Assignment``, ``Crash``, ``Assign`` or ``Subscribe``.
    The member must record a revocation (an Assignment with no partitions) when it gives its
    partitions up, that is before it rejoins in an eager rebalance and when it decides its
    session is lost; otherwise the checker sees it as still owning them.
    """

    F: ClassVar[str] = "assignment"
    group: str
    member: str
    generation: int
    partitions: tuple[TopicPartition, ...] = ()

    def fields(self) -> dict[str, Any]:
        """The JSON fields of this operation."""
        return {
            "group": self.group,
            "member": self.member,
            "generation": self.generation,
            "partitions": self.partitions,
        }

    @classmethod
    def from_fields(cls, d: Mapping[str, Any]) -> Assignment:
        """Decode what ``fields`` wrote. Raises HistoryError on a missing or mistyped field."""
        return cls(
            group=_name(d, "group"),
            member=_name(d, "member"),
            generation=_int(d, "generation"),
            partitions=_partitions(d, "partitions"),
        )


@dataclass(frozen=True, slots=True)
class FinalRead:
    """The drain after healing: every record of ``partitions`` from the start, in log order.

    An ``ok`` completion promises that each listed partition was read to its end (its high
    watermark at the time), so a committed value missing from it is lost. An ``info`` completion
    carries what was read before giving up; its reads count as observations but prove no loss.
    """

    F: ClassVar[str] = "final_read"
    partitions: tuple[TopicPartition, ...] = ()
    reads: tuple[Read, ...] = ()

    def fields(self) -> dict[str, Any]:
        """The JSON fields of this operation."""
        return {"partitions": self.partitions, "reads": self.reads}

    @classmethod
    def from_fields(cls, d: Mapping[str, Any]) -> FinalRead:
        """Decode what ``fields`` wrote. Raises HistoryError on a missing or mistyped field."""
        return cls(partitions=_partitions(d, "partitions"), reads=_reads(d, "reads"))


@dataclass(frozen=True, slots=True)
class ReplicaRead:
    """A read of one broker's own replicas (``FETCH ... replica=local``), after the final read:
    every record each replica holds committed, from offset 0 up to ``end`` (that replica's own
    high watermark when its read began), in log order. The event's ``node`` names the broker.

    An ``ok`` completion promises that each partition of ``ends`` was read whole below its end,
    so a committed value placed below that end and missing here is missing from this replica;
    partitions the broker holds no replica of are absent. An ``info`` completion carries what was
    read before giving up: observations, proof of nothing missing.
    """

    F: ClassVar[str] = "replica_read"
    ends: tuple[PartitionEnd, ...] = ()
    reads: tuple[Read, ...] = ()

    def fields(self) -> dict[str, Any]:
        """The JSON fields of this operation."""
        return {"ends": self.ends, "reads": self.reads}

    @classmethod
    def from_fields(cls, d: Mapping[str, Any]) -> ReplicaRead:
        """Decode what ``fields`` wrote. Raises HistoryError on a missing or mistyped field."""
        return cls(ends=_ends(d, "ends"), reads=_reads(d, "reads"))


@dataclass(frozen=True, slots=True)
class Nemesis:
    """A fault being started or stopped (``phase``) by the nemesis, on ``targets`` (nodes).

    A fault is active from its start's invocation to the completion of the next stop of the same
    ``fault`` name; a start that completes ``fail`` never happened.
    """

    F: ClassVar[str] = "nemesis"
    fault: str
    phase: NemesisPhase
    targets: tuple[str, ...] = ()

    def fields(self) -> dict[str, Any]:
        """The JSON fields of this operation."""
        return {"fault": self.fault, "phase": self.phase, "targets": self.targets}

    @classmethod
    def from_fields(cls, d: Mapping[str, Any]) -> Nemesis:
        """Decode what ``fields`` wrote. Raises HistoryError on a missing or mistyped field."""
        phase = _str(d, "phase")
        if phase not in _PHASES:
            raise _missing("phase", '"start" or "stop"')
        return cls(
            fault=_name(d, "fault"),
            phase="start" if phase == "start" else "stop",
            targets=_names(d, "targets"),
        )


class RaftState(NamedTuple):
    """One Raft group's durable term and vote on one broker. JSON: ``[group, term, vote]``; the
    controller quorum's group is ``"controller"``, a partition's is its Raft group id."""

    group: str
    term: int
    vote: str | None


def _raft_states(d: Mapping[str, Any], key: str) -> tuple[RaftState, ...]:
    out: list[RaftState] = []
    for item in _list(d, key):
        if (
            not isinstance(item, list)
            or len(item) != 3
            or type(item[0]) is not str
            or type(item[1]) is not int
            or not (item[2] is None or type(item[2]) is str)
        ):
            raise _missing(key, "a list of [group, term, vote]")
        out.append(RaftState(item[0], item[1], item[2]))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class HardStates:
    """What one broker's disk holds of its Raft terms and votes (the event's ``node``), read by
    the harness while the broker is down: ``moment`` is ``before-cut`` (just killed: what it
    had written, so what it had acted on), ``after-cut`` (what survived its power loss: what it
    will restart with) or ``end`` (stopped at the end of the run). A lone ``ok`` of the process
    ``disk``."""

    F: ClassVar[str] = "hard_states"
    moment: str
    states: tuple[RaftState, ...] = ()

    def fields(self) -> dict[str, Any]:
        """The JSON fields of this operation."""
        return {"moment": self.moment, "states": [list(s) for s in self.states]}

    @classmethod
    def from_fields(cls, d: Mapping[str, Any]) -> HardStates:
        """Decode what ``fields`` wrote. Raises HistoryError on a missing or mistyped field."""
        return cls(moment=_str(d, "moment"), states=_raft_states(d, "states"))


@dataclass(frozen=True, slots=True)
class CreateTopic:
    """``CREATE topic partitions`` by the harness (process ``admin``): an ``ok`` is the
    controller's acknowledgement that the topic exists, durably."""

    F: ClassVar[str] = "create_topic"
    topic: str
    partitions: int

    def fields(self) -> dict[str, Any]:
        """The JSON fields of this operation."""
        return {"topic": self.topic, "partitions": self.partitions}

    @classmethod
    def from_fields(cls, d: Mapping[str, Any]) -> CreateTopic:
        """Decode what ``fields`` wrote. Raises HistoryError on a missing or mistyped field."""
        return cls(topic=_name(d, "topic"), partitions=_int(d, "partitions"))


@dataclass(frozen=True, slots=True)
class AddAcl:
    """``ACL ADD`` by the harness (process ``admin``), ``acl`` in its ``ACL LIST`` row form
    (``principal permission operation resource pattern name``): an ``ok`` is the
    controller's acknowledgement."""

    F: ClassVar[str] = "add_acl"
    acl: str

    def fields(self) -> dict[str, Any]:
        """The JSON fields of this operation."""
        return {"acl": self.acl}

    @classmethod
    def from_fields(cls, d: Mapping[str, Any]) -> AddAcl:
        """Decode what ``fields`` wrote. Raises HistoryError on a missing or mistyped field."""
        return cls(acl=_str(d, "acl"))


@dataclass(frozen=True, slots=True)
class MetadataSeen:
    """One broker's ``METADATA`` and ``ACL LIST`` (the event's ``node``) after every broker is
    back: each topic it lists with its number of partitions (``[topic, count]``), and each ACL
    (``AddAcl``'s form; None: the broker did not answer ``ACL LIST``). A lone ``ok`` of the
    process ``harness``."""

    F: ClassVar[str] = "metadata"
    topics: tuple[tuple[str, int], ...] = ()
    acls: tuple[str, ...] | None = None

    def fields(self) -> dict[str, Any]:
        """The JSON fields of this operation."""
        return {"topics": [list(t) for t in self.topics], "acls": self.acls}

    @classmethod
    def from_fields(cls, d: Mapping[str, Any]) -> MetadataSeen:
        """Decode what ``fields`` wrote. Raises HistoryError on a missing or mistyped field."""
        topics: list[tuple[str, int]] = []
        for item in _list(d, "topics"):
            if (
                not isinstance(item, list)
                or len(item) != 2
                or type(item[0]) is not str
                or type(item[1]) is not int
            ):
                raise _missing("topics", "a list of [topic, partitions]")
            topics.append((item[0], item[1]))
        acls = d.get("acls")
        if acls is not None and (
            not isinstance(acls, list) or not all(type(a) is str for a in acls)
        ):
            raise _missing("acls", "a list of strings or null")
        return cls(topics=tuple(topics), acls=None if acls is None else tuple(acls))


@dataclass(frozen=True, slots=True)
class Leaders:
    """After every broker is back: the partitions of the run's topic that still had no leader
    after ``waited_s`` seconds of asking (empty: every one had one). A lone ``ok`` of the
    process ``harness``."""

    F: ClassVar[str] = "leaders"
    waited_s: float
    leaderless: tuple[TopicPartition, ...] = ()

    def fields(self) -> dict[str, Any]:
        """The JSON fields of this operation."""
        return {"waited_s": self.waited_s, "leaderless": self.leaderless}

    @classmethod
    def from_fields(cls, d: Mapping[str, Any]) -> Leaders:
        """Decode what ``fields`` wrote. Raises HistoryError on a missing or mistyped field."""
        waited = d.get("waited_s")
        if not isinstance(waited, (int, float)) or isinstance(waited, bool):
            raise _missing("waited_s", "a number")
        return cls(waited_s=float(waited), leaderless=_partitions(d, "leaderless"))


@dataclass(frozen=True, slots=True)
class InternalErrors:
    """After every broker stopped: each line of the brokers' logs that reports an internal error
    (the CLI's ``internal error: ... (a bug in Kafkaesque ...)``, with the log it is in), in the
    order found; empty if none. A lone ``ok`` of the process ``harness``."""

    F: ClassVar[str] = "internal_errors"
    lines: tuple[str, ...] = ()

    def fields(self) -> dict[str, Any]:
        """The JSON fields of this operation."""
        return {"lines": list(self.lines)}

    @classmethod
    def from_fields(cls, d: Mapping[str, Any]) -> InternalErrors:
        """Decode what ``fields`` wrote. Raises HistoryError on a missing or mistyped field."""
        lines = _list(d, "lines")
        if not all(type(line) is str for line in lines):
            raise _missing("lines", "a list of strings")
        return cls(lines=tuple(lines))


Op: TypeAlias = (
    Send
    | Poll
    | Assign
    | Subscribe
    | Crash
    | Commit
    | FetchCommitted
    | Assignment
    | FinalRead
    | ReplicaRead
    | Nemesis
    | HardStates
    | CreateTopic
    | AddAcl
    | MetadataSeen
    | Leaders
    | InternalErrors
)

_OP_CLASSES: tuple[type[Op], ...] = (
    Send,
    Poll,
    Assign,
    Subscribe,
    Crash,
    Commit,
    FetchCommitted,
    Assignment,
    FinalRead,
    ReplicaRead,
    Nemesis,
    HardStates,
    CreateTopic,
    AddAcl,
    MetadataSeen,
    Leaders,
    InternalErrors,
)
_BY_F: dict[str, type[Op]] = {c.F: c for c in _OP_CLASSES}

OBSERVATIONS: tuple[type[Op], ...] = (Assignment, FetchCommitted, Crash)
"""Operations that may be recorded as a lone completion while their process has another
operation in flight (they happen inside it, or end it)."""

_ENVELOPE = ("type", "f", "process", "time", "node", "error")


@dataclass(frozen=True, slots=True)
class Event:
    """One line of the history: an invocation or completion of ``op`` by ``process``.

    ``node`` is the broker the client talked to, when it knows (None for the nemesis, or for a
    client that goes through whichever broker answers). ``error`` is what a ``fail`` or ``info``
    completion failed with, as the client said it (for whoever reads the history; the checker
    does not judge by it).
    """

    type: EventType
    process: Process
    time: int
    op: Op
    node: str | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The flat JSON object of this event: envelope fields, ``f``, then the op's fields."""
        d: dict[str, Any] = {"type": self.type, "f": self.op.F, "process": self.process}
        d["time"] = self.time
        if self.node is not None:
            d["node"] = self.node
        if self.error is not None:
            d["error"] = self.error
        d.update(self.op.fields())
        return d

    def to_json(self) -> str:
        """One line of JSON, without the newline."""
        return json.dumps(self.to_dict(), separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Event:
        """Decode what ``to_dict`` wrote. Raises HistoryError if it is not a valid event."""
        kind = d.get("type")
        if kind not in _EVENT_TYPES:
            raise _missing("type", "one of invoke, ok, fail, info")
        f = d.get("f")
        op_class = _BY_F.get(f) if type(f) is str else None
        if op_class is None:
            raise _missing("f", f"one of {', '.join(sorted(_BY_F))}")
        process = d.get("process")
        if type(process) is not int and type(process) is not str:
            raise _missing("process", "an integer or a string")
        time = d.get("time")
        if type(time) is not int:
            raise _missing("time", "an integer")
        node = d.get("node")
        if node is not None:
            if type(node) is not str:
                raise _missing("node", "a string or null")
            node = sys.intern(node)
        error = d.get("error")
        if error is not None and type(error) is not str:
            raise _missing("error", "a string or null")
        return cls(kind, process, time, op_class.from_fields(d), node, error)

    @classmethod
    def from_json(cls, text: str) -> Event:
        """Decode one line written by ``to_json``. Raises HistoryError on anything else."""
        try:
            d = json.loads(text)
        except ValueError as e:
            raise HistoryError(f"not JSON: {e}") from None
        if type(d) is not dict:
            raise HistoryError("not a JSON object")
        return cls.from_dict(d)

    def describe(self) -> str:
        """A short human description for reports, e.g. ``ok send t/0 'p3-17' @42 by 3``."""
        op = self.op
        who = f"by {self.process}" + (f" via {self.node}" if self.node else "")
        if isinstance(op, Send):
            where = op.topic if op.partition is None else f"{op.topic}/{op.partition}"
            at = "" if op.offset is None else f" @{op.offset}"
            return f"{self.type} send {where} {op.value!r}{at} {who}"
        if isinstance(op, (Poll, FinalRead, ReplicaRead)):
            return f"{self.type} {op.F} of {len(op.reads)} records {who}"
        if isinstance(op, (Commit, FetchCommitted)):
            at = "" if op.offset is None else f" @{op.offset}"
            return f"{self.type} {op.F} {op.group} {op.topic}/{op.partition}{at} {who}"
        if isinstance(op, Assignment):
            parts = ", ".join(f"{t}/{p}" for t, p in op.partitions) or "nothing"
            return f"{op.member} of {op.group} gen {op.generation} owns {parts} ({who})"
        if isinstance(op, Nemesis):
            return f"{self.type} nemesis {op.phase} {op.fault} {','.join(op.targets)}"
        return f"{self.type} {op.F} {who}"


# --------------------------------------------------------------------------------------------
# Files.


def _count_lines(path: Path) -> int:
    """Lines already in ``path``; raises HistoryError if its last line is torn."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return 0
    if data and not data.endswith(b"\n"):
        raise HistoryError(f"{path}: last line is torn (no newline); repair it before appending")
    return data.count(b"\n")


class HistoryWriter:
    """Appends events to a JSON-lines history file, one line per event.

    Each ``write`` returns only after the line reached the OS (flushed), so a harness killed at
    any point leaves every earlier event on disk and at most a torn last line, which
    ``read_history`` can drop. With ``fsync=True`` each line is also fsynced, for histories that
    must survive the machine. Appending to an existing file continues its line numbering. Not
    thread-safe: write from one thread (the trio loop).
    """

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = False) -> None:
        self._path = Path(path)
        self._lines = _count_lines(self._path)
        self._file = self._path.open("a", encoding="utf-8", newline="\n")
        self._fsync = fsync

    @property
    def path(self) -> Path:
        """The file written."""
        return self._path

    @property
    def line_count(self) -> int:
        """Lines in the file so far (the line number of the last event written)."""
        return self._lines

    def write(self, event: Event) -> int:
        """Append ``event`` and return its 1-based line number, the name the checker uses."""
        self._file.write(event.to_json() + "\n")
        self._file.flush()
        if self._fsync:
            os.fsync(self._file.fileno())
        self._lines += 1
        return self._lines

    def write_all(self, events: Iterable[Event]) -> None:
        """Append many events with one flush at the end (for tools, not a live harness)."""
        n = 0
        for e in events:
            self._file.write(e.to_json() + "\n")
            n += 1
        self._file.flush()
        if self._fsync:
            os.fsync(self._file.fileno())
        self._lines += n

    def close(self) -> None:
        """Close the file; further writes raise ValueError."""
        self._file.close()

    def __enter__(self) -> HistoryWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for the block (restoring its state after).

    Decoding or checking a million-event history allocates millions of objects that all stay
    alive; every few thousand allocations the collector would walk all of them again, which
    made reading and checking four times slower. Nothing built here forms reference cycles, so
    reference counting frees everything that is dropped anyway.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def parse_history(lines: Iterable[str], *, source: str = "<history>") -> list[Event]:
    """Decode JSON lines (with or without their newlines) into events, one per line.

    Raises HistoryError naming ``source`` and the line number on a blank or invalid line.
    """
    events: list[Event] = []
    from_json = Event.from_json
    with gc_paused():
        for n, line in enumerate(lines, 1):
            if not line.strip():
                raise HistoryError(f"{source}:{n}: blank line")
            try:
                events.append(from_json(line))
            except HistoryError as e:
                raise HistoryError(f"{source}:{n}: {e}") from None
    return events


def read_history(path: str | os.PathLike[str], *, allow_torn_tail: bool = True) -> list[Event]:
    """Read a history file; event ``i`` of the result is line ``i + 1`` of the file.

    With ``allow_torn_tail`` a last line that has no newline and does not decode is dropped: it
    is what a harness killed in the middle of a write leaves. Any other bad line raises
    HistoryError naming the file and line.
    """
    text = Path(path).read_text(encoding="utf-8")
    lines = text.split("\n")
    last = lines.pop()  # "" when the file ends with a newline, else an unterminated last line
    if last:
        try:
            Event.from_json(last)
            lines.append(last)
        except HistoryError:
            if not allow_torn_tail:
                lines.append(last)  # decoding it again below reports it with its line number
    return parse_history(lines, source=str(path))


def write_history(path: str | os.PathLike[str], events: Iterable[Event]) -> None:
    """Write ``events`` as a new history file (replacing any file at ``path``)."""
    Path(path).unlink(missing_ok=True)
    with HistoryWriter(path) as w:
        w.write_all(events)
