"""Broker-to-broker messages: frozen dataclasses and their msgpack-ready wire form, sans I/O.

A broker forwards what it cannot do itself (a write to a partition's leader, a read to a replica,
a group command to its coordinator) and tells its peers what they need to route (the partitions
it leads, its MQTT shared-subscription groups). These items share each peer's one TCP connection
with Raft's messages (``kafkaesque.raft``'s frames carry lists of items); a broker item is a list
whose first element is an int tag of ``TAGS`` (at least ``PEER_TAG_MIN``, so the Raft driver's
own kinds, 0-2, stay apart).

Top-level messages (``PeerMessage``):

* ``PeerCall(req, request)``: run ``request`` and answer with ``PeerReply(req, ...)``; the request's
  type is the item's tag: ``[tag, req, ...request fields]``;
* ``PeerReply(req, answer)``: ``[REPLY, req, [answer tag, ...answer fields]]``;
* ``LeaderClaims``: every group the sender leads now, with its members (``LeaderTable``);
* ``Shares``: the MQTT shared-subscription groups with members on the sender;
* ``PeerView``: the peers the sender hears, and why the elections it won were held (the web
  console's who-hears-whom matrix and last elections).

The wire form (``to_wire`` and ``from_wire``) is in ``_peer_codec.py``.

Wire tags are never reused or renumbered: peers of different versions must agree. Tags 10-16
were the positional lists of the first broker-to-broker protocol (retired: a peer still sending
them is told apart, its items dropped as unknown, never misread).

A forwarded line-protocol reply (``CommandReply``) is the encoded reply, made once by the broker
that ran the command and relayed to the client as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, TypeAlias

from ._line_commands import (
    Acks,
    Commit,
    Cons,
    DeleteGroup,
    DescribeGroup,
    FetchOffsets,
    Leave,
    ListGroups,
    ResetOffsets,
    Subs,
)
from ._line_errors import ErrorCode

PEER_TAG_MIN: Final = 10
"""Items whose first element is an int at or above this are the broker's, not Raft's."""


class MalformedPeerMessage(Exception):
    """A peer broker sent an item that breaks this protocol (unknown tag, wrong arity, a field
    of the wrong type): drop the item and log it; never a crash."""


class MalformedPeerCall(MalformedPeerMessage):
    """A ``PeerCall`` whose request id could be read but not its request (a request or group
    command of a newer broker, say): answer ``req`` with ``Refused`` saying so, so that the
    caller learns at once, instead of waiting out its deadline."""

    def __init__(self, req: int, reason: str) -> None:
        super().__init__(reason)
        self.req = req


# -- requests (inside a ``PeerCall``) -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AppendRequest:
    """Append ``batch`` (``count`` offsets) as the leader of ``log_id``; answer within
    ``seconds`` with ``Appended``, ``Retry`` (not appended), ``Unknown`` or ``Refused``."""

    log_id: str
    batch: bytes
    count: int
    acks: Acks
    seconds: float


@dataclass(frozen=True, slots=True)
class FindResendRequest:
    """As the leader of ``log_id``, look an MQTT QoS 1 resend up in its log (its client id,
    packet id and payload digest); answer ``Found``, ``Absent`` or ``Retry`` within ``seconds``."""

    log_id: str
    client: bytes
    packet: bytes
    digest: int
    seconds: float


@dataclass(frozen=True, slots=True)
class BoundsRequest:
    """The log start and high watermark of each group the receiver leads (``Bounds``); with
    ``time_ms``, also the earliest committed offset whose record timestamp is >= it (the high
    watermark if none is: ``PartitionLog.offset_for_time``)."""

    log_ids: tuple[str, ...]
    time_ms: int | None = None


@dataclass(frozen=True, slots=True)
class ReadRequest:
    """Read committed batches of ``topic``/``partition`` from ``offset`` on the receiver's own
    replica (it never forwards again), waiting up to ``wait_ms`` for some; answer ``ReadResult``
    or ``Refused``."""

    topic: str
    partition: int
    offset: int
    max_bytes: int
    wait_ms: int


@dataclass(frozen=True, slots=True)
class Touch:
    """Internal, broker to coordinator (no client types it): the connections open on the sender
    hold these ``members`` of offsets partition ``partition`` (their ids start with
    ``<partition>.``); the coordinator counts it as hearing from each (as a CONS would), except
    from a member that asked for its own session timeout. Answered ``+OK``. Sent by every broker
    every third of its session timeout, one per offsets partition (see ``GroupCoordinator``)."""

    partition: int
    members: tuple[str, ...]


GroupCommand: TypeAlias = (
    Subs
    | Cons
    | Commit
    | FetchOffsets
    | Leave
    | DescribeGroup
    | ListGroups
    | ResetOffsets
    | DeleteGroup
    | Touch
)


@dataclass(frozen=True, slots=True)
class GroupCommandRequest:
    """Run this consumer-group command as the group's coordinator (it never forwards again);
    answer ``CommandReply`` with the encoded line-protocol reply."""

    command: GroupCommand


@dataclass(frozen=True, slots=True)
class LatestRequest:
    """``LATEST topic key`` as the leader of the key's ``partition`` (it never forwards again):
    answer ``CommandReply`` with the encoded line-protocol reply (``+MSG`` row and ``+END``, an
    error among them)."""

    topic: str
    partition: int
    key: bytes


@dataclass(frozen=True, slots=True)
class HandOverControllerRequest:
    """If the receiver leads the controller quorum, hand that leadership to another controller
    (Raft TimeoutNow, as a graceful shutdown does) within ``seconds``; answer
    ``ControllerHandOver``. Sent by the broker that decommissions the receiver: pysyncobj's
    leader cannot remove itself from the quorum."""

    seconds: float


@dataclass(frozen=True, slots=True)
class DecommissionRequest:
    """Decommission broker ``broker`` (``REMOVEBROKER``), which is the sender: a broker cannot
    take its own controller out of the quorum, so the one that got the command has the receiver
    carry it out (it never delegates again); answer ``Decommissioned`` or ``Refused``."""

    broker: int


Request: TypeAlias = (
    AppendRequest
    | FindResendRequest
    | BoundsRequest
    | ReadRequest
    | GroupCommandRequest
    | LatestRequest
    | HandOverControllerRequest
    | DecommissionRequest
)


# -- answers (inside a ``PeerReply``) -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Appended:
    """The batch is written at offsets ``first``..``last``."""

    first: int
    last: int


@dataclass(frozen=True, slots=True)
class Retry:
    """Not carried out (not the leader, no read point yet): send it again, freely."""

    reason: str


@dataclass(frozen=True, slots=True)
class Unknown:
    """Maybe carried out (appended, then not committed in time): only an idempotent retry."""

    reason: str


@dataclass(frozen=True, slots=True)
class Refused:
    """Refused for good, with the error its client gets (a bad batch, an unknown topic)."""

    code: ErrorCode
    message: str


@dataclass(frozen=True, slots=True)
class Found:
    """The committed first copy of the resend is at ``offset``."""

    offset: int


@dataclass(frozen=True, slots=True)
class Absent:
    """The log holds no copy of the resend."""


@dataclass(frozen=True, slots=True)
class Bounds:
    """``(log start, high watermark)`` of each asked group, in order, with the offset for the
    asked time as a third value when the request gave one; None for a group the receiver does
    not lead."""

    bounds: tuple[tuple[int, ...] | None, ...]


@dataclass(frozen=True, slots=True)
class ReadResult:
    """Committed batches read from the replica, the offset to read next, and its high
    watermark."""

    data: bytes
    next_offset: int
    high_watermark: int


@dataclass(frozen=True, slots=True)
class CommandReply:
    """A forwarded command's encoded line-protocol reply: relayed to the client as it is."""

    data: bytes


@dataclass(frozen=True, slots=True)
class ControllerHandOver:
    """What a ``HandOverControllerRequest`` did: ``handed_over`` is None if the receiver did not
    lead the controller quorum (nothing to do), True once another controller leads as the
    receiver sees it, False if none took the lead in time; ``leader`` is the controller leader
    the receiver knows at the end (None: none known)."""

    handed_over: bool | None
    leader: int | None


@dataclass(frozen=True, slots=True)
class Decommissioned:
    """The broker asked is out of the registry and the controller quorum; ``moved``: how many
    partitions this request reassigned."""

    moved: int


Answer: TypeAlias = (
    Appended
    | Retry
    | Unknown
    | Refused
    | Found
    | Absent
    | Bounds
    | ReadResult
    | CommandReply
    | ControllerHandOver
    | Decommissioned
)


# -- top-level messages -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PeerCall:
    """Request ``req`` of the sender (its ids are its own; the answer names it)."""

    req: int
    request: Request


@dataclass(frozen=True, slots=True)
class PeerReply:
    """The answer to the receiver's request ``req``."""

    req: int
    answer: Answer


@dataclass(frozen=True, slots=True)
class LeaderClaim:
    """A leader's report of one group: its term, its members, and whether they are committed
    (False while a membership change is in flight)."""

    term: int
    voters: frozenset[int]
    learners: frozenset[int]
    committed: bool


@dataclass(frozen=True, slots=True)
class LeaderClaims:
    """The sender leads exactly these groups now."""

    claims: Mapping[str, LeaderClaim]


@dataclass(frozen=True, slots=True)
class Shares:
    """The MQTT shared-subscription groups ``(share name, inner filter)`` with members on the
    sender (none: an empty tuple)."""

    shares: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class PeerView:
    """What the sender sees, sent beside its ``LeaderClaims``: ``heard``, the peer brokers it
    hears now (its Raft pings' verdict); ``elections``, for groups it leads, the election that
    made it leader: ``log_id -> (term, cause, wall-clock ms when it was seen won)``, ``cause``
    an ``ElectionCause`` value. Only the elections new since the sender's last view, or all of
    them for a peer that (re)connected: a receiver keeps the one of highest term per group.
    ``offsets``: the committed offsets of the consumer groups the sender coordinates, as
    ``(group, topic, partition, offset)``, all of them each time (at most
    ``PEER_VIEW_OFFSETS``): the console's topics list shows each topic's groups and their lag
    from them, with no request per group."""

    heard: tuple[int, ...]
    elections: Mapping[str, tuple[int, str, int]]
    offsets: tuple[tuple[str, str, int, int], ...] = ()


PEER_VIEW_OFFSETS: Final = 2000
"""The most committed offsets one ``PeerView`` carries (a broker coordinating more shows the
console the first ones)."""

PeerMessage: TypeAlias = PeerCall | PeerReply | LeaderClaims | Shares | PeerView

# Wire tags: never reuse or renumber one (10-16: the retired positional protocol).
REQUEST_TAGS: Final[dict[type, int]] = {
    AppendRequest: 20,
    FindResendRequest: 21,
    BoundsRequest: 22,
    ReadRequest: 23,
    GroupCommandRequest: 24,
    LatestRequest: 25,
    HandOverControllerRequest: 26,
    DecommissionRequest: 27,
}
REPLY_TAG: Final = 30
LEADER_CLAIMS_TAG: Final = 31
SHARES_TAG: Final = 32
PEER_VIEW_TAG: Final = 33
ANSWER_TAGS: Final[dict[type, int]] = {
    Appended: 40,
    Retry: 41,
    Unknown: 42,
    Refused: 43,
    Found: 44,
    Absent: 45,
    Bounds: 46,
    ReadResult: 47,
    CommandReply: 48,
    ControllerHandOver: 49,
    Decommissioned: 50,
}
# Consumer-group commands inside a ``GroupCommandRequest`` (a tag space of their own).
COMMAND_TAGS: Final[dict[type, int]] = {
    Subs: 1,
    Cons: 2,
    Commit: 3,
    FetchOffsets: 4,
    Leave: 5,
    DescribeGroup: 6,
    ListGroups: 7,
    ResetOffsets: 8,
    DeleteGroup: 9,
    Touch: 10,
}
TAGS: Final[frozenset[int]] = frozenset(
    {*REQUEST_TAGS.values(), REPLY_TAG, LEADER_CLAIMS_TAG, SHARES_TAG, PEER_VIEW_TAG}
)
"""Every tag a top-level broker item may carry."""
