"""The vocabulary of the line protocol: commands, replies, error codes, names and limits.

Everything here is plain data: frozen dataclasses for the events a peer sends, enums for the closed
sets of words, and pure functions for the rules a name must follow. The byte-level grammar lives in
``_line.py``; the reference for users is ``docs/protocol.md``.

Contract shared by every event class: an event that ``LineDecoder`` or ``ReplyDecoder`` returns is
valid (names follow their rules, integers are in range). Constructing one by hand does not validate
it, because the decoder builds tens of thousands a second; ``encode_command`` and ``encode_reply``
validate instead and raise ``LocalProtocolError`` for an event that could not be decoded back.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass
from enum import Enum, StrEnum
from typing import Final, TypeAlias

# ---------------------------------------------------------------------------------------------
# Errors of the codec itself (not of the broker): who broke the protocol.


class ProtocolError(Exception):
    """Base of the codec's exceptions."""


class LocalProtocolError(ProtocolError):
    """Our own side misused the codec: an event that cannot be encoded, a wrong argument type.

    A bug in the caller, never caused by what the peer sent; fix the caller.
    """


class RemoteProtocolError(ProtocolError):
    """The peer sent bytes that break the protocol and the stream cannot be trusted any more.

    Raised only by ``ReplyDecoder`` (a client reading a server): replies are matched to requests by
    their order, so after a malformed reply the client cannot know which reply belongs to which
    request and must close the connection. ``LineDecoder`` never raises it: a malformed command is
    answered with an error and the next line is parsed (see ``BadCommand.framing_error`` for the
    one case where the server should close anyway).
    """


# ---------------------------------------------------------------------------------------------
# Error codes.


class ErrorCode(Enum):
    """The code of a ``-ERR CODE message`` reply; the wire spelling is the member's name.

    Each member carries ``retriable`` (the same request may succeed if sent again, after the
    backoff the guidance names), ``outcome_unknown`` (for a write: it may or may not have been
    applied, so only an idempotent retry is safe; "failed" and "maybe" are never conflated),
    ``guidance`` (what a client must do, also the member's ``__doc__``) and ``on_read`` (what
    the code means as the answer to a read, ``FETCH`` or ``CONS``; None when no read is ever
    answered with it). A read changes no data, so none of the codes leaves a read half-done.

    A write that fails with a code whose ``outcome_unknown`` is False was definitely not applied.
    Look a wire code up by name: ``ErrorCode["TIMEOUT"]`` (the values are the tuples).
    """

    UNKNOWN_COMMAND = (False, False, "The first word is no command. Fix the line (see HELP).", None)
    BAD_ARGS = (
        False,
        False,
        "The command's arguments do not follow its syntax (the message gives the usage), or the "
        "line holds a byte 0xFF that starts no telnet command. Fix them.",
        "The same (an unknown option, an offset that is no number...): nothing was read.",
    )
    UNKNOWN_TOPIC = (
        True,
        False,
        "The topic does not exist on this broker. Create it (a publish or SUBS creates it unless "
        "the broker runs with --no-auto-create-topics), or, if it was just created, retry after "
        "a short backoff: topic metadata reaches every broker a moment later (as Kafka's "
        "retriable UNKNOWN_TOPIC_OR_PARTITION).",
        "The topic does not exist on this broker; a read creates none.",
    )
    UNKNOWN_PARTITION = (
        False,
        False,
        "The topic has no such partition. Use a partition in [0, partitions) (see DESCRIBE).",
        "FETCH named a partition the topic does not have.",
    )
    INVALID_TOPIC = (
        False,
        False,
        "The topic name breaks the naming rules, or names an internal topic (prefix '__') in a "
        "command that writes or administers it. Pick a valid name.",
        "The topic name breaks the naming rules (reads accept internal names).",
    )
    TOPIC_EXISTS = (
        False,
        False,
        "CREATE named a topic that already exists. Nothing was changed.",
        None,
    )
    INVALID_CONFIG = (
        False,
        False,
        "CREATE or ALTER asked for a configuration the cluster cannot honour (for example more "
        "replicas than brokers, or fewer partitions than the topic has). Change the configuration.",
        None,
    )
    TOO_LARGE = (
        False,
        False,
        "A line, payload or message exceeds a limit of the broker. Nothing was applied; send "
        "smaller pieces (split the batch).",
        "The command line exceeds the line limit: nothing was read.",
    )
    INVALID_BATCH = (
        False,
        False,
        "The PUBB payload is not a valid record batch (length, CRC, magic or counts). Nothing was "
        "written; fix the encoder that built it.",
        None,
    )
    NOT_LEADER = (
        True,
        False,
        "The broker refused the write before appending it (leadership moved or is unknown). "
        "Nothing was written; refresh METADATA and retry.",
        "The replica that got the read cannot serve it now: the group's coordinator moved "
        "(CONS), a follower asked by another broker is behind the offset asked for, or a leader "
        "that found the offset past its log could not confirm it still leads (its log may be "
        "behind its successor's). Nothing was read; retry (refresh METADATA first).",
    )
    TIMEOUT = (
        True,
        True,
        "The request did not complete in time. A write may or may not have been applied: retry "
        "only idempotently (PUB with pid/epoch/seq, or a batch with a producer id) or accept "
        "possible duplicates.",
        "A CONS forwarded to the group's coordinator got no answer in time. A read changes no "
        "data: retrying is safe.",
    )
    NO_QUORUM = (
        True,
        False,
        "The partition's leader cannot reach a quorum of replicas and refused the write before "
        "appending it. Nothing was written; retry after a backoff.",
        "No broker holding a replica of the partition answered the read this broker forwarded "
        "(the leader and every follower are out of its reach, and it holds no replica that may "
        "serve). Nothing was read; retry after a backoff, or through another broker.",
    )
    BUSY = (
        True,
        False,
        "The broker shed load before doing anything (too many requests in flight). Retry after a "
        "backoff.",
        "The same: nothing was read; retry after a backoff.",
    )
    NOT_READY = (
        True,
        False,
        "The broker has just started and does not know the cluster yet: its copy of the "
        "metadata has not caught up with the controller quorum (or, for CREATE, fewer brokers "
        "than the replication factor have registered in a cluster configured with enough), or "
        "it is shutting down and read this request after it began to (it sends the replies it "
        "owes, then closes the connection). Nothing was done; refresh METADATA (from another "
        "broker if this one answers `NOT_READY` to it too) and retry after a short backoff, at "
        "once if the partition has a new leader (the client library does).",
        "The same: the broker does not know the cluster yet, or is shutting down; nothing was "
        "read. LATEST: the partition's leader is still building its key index (it became the "
        "leader moments ago). Retry after a short backoff.",
    )
    OFFSET_OUT_OF_RANGE = (
        False,
        False,
        "The offset is below the log start or above the log end. Reset to a valid offset (DESCRIBE "
        "gives start and end).",
        "FETCH: the offset is below the log start or past the end (with replica=local: this "
        "replica's log, which may be behind the leader's). CONS: past the end only; below the "
        "start it reads from the start.",
    )
    FENCED = (
        False,
        False,
        "Another producer with the same producer id has a newer epoch. This producer is fenced: "
        "stop producing with this id/epoch; nothing of this request was written.",
        None,
    )
    OUT_OF_ORDER_SEQUENCE = (
        False,
        False,
        "The sequence number is not the next one the broker expects for this producer and "
        "partition: an earlier write was lost or reordered. Nothing of this request was written; "
        "bump the epoch (or get a new producer id) and resend the unacknowledged writes in order.",
        None,
    )
    UNKNOWN_SUBSCRIPTION = (
        False,
        False,
        "The subscription id is unknown or expired, or belongs to another topic (the message "
        "names it). Subscribe again (SUBS) and use the new id, or name the subscription's own "
        "topic.",
        "CONS named a subscription that is unknown, expired or of another topic.",
    )
    NOT_ASSIGNED = (
        False,
        False,
        "The partition is not, or no longer, assigned to this member of the group: a rebalance "
        "gave it to another member. Nothing was read or committed; read on with a single offset "
        "or the partitions of your last +END (which lists what you own now).",
        "CONS named a partition the member does not own (any more).",
    )
    NO_REPLICA = (
        False,
        False,
        "FETCH replica=local went to a broker that holds no replica of the partition. Nothing was "
        "read; ask a broker that holds one (METADATA lists the replicas).",
        "FETCH replica=local only: this broker holds no replica of the partition.",
    )
    UNKNOWN_GROUP = (
        False,
        False,
        "The consumer group has no members and no committed offsets (it never committed, or it "
        "was deleted): nothing was changed. Check the name (GROUPS lists the groups).",
        None,
    )
    GROUP_NOT_EMPTY = (
        False,
        False,
        "RESETOFFSETS or DELGROUP named a group that still has live members: nothing was "
        "changed. Stop its consumers (or wait until their session times out) and send it again.",
        None,
    )
    NOT_COMPACTED = (
        False,
        False,
        "LATEST named a topic that is not compacted: only a compacted topic keeps the newest "
        "value of each key. Create the topic with compact=yes (or ALTER it) to use LATEST.",
        "LATEST named a topic that is not compacted; nothing was read.",
    )
    AUTH_FAILED = (
        False,
        False,
        "Authentication failed (a wrong user name or password, a broken SCRAM exchange), or the "
        "mechanism is not offered on this listener (PLAIN needs TLS), or this address failed too "
        "often and must wait (the message says how long). Check the credentials; the connection "
        "may start AUTH again.",
        None,
    )
    NOT_AUTHORIZED = (
        False,
        False,
        "The connection's principal may not do this (no ACL allows it, or one denies it), or the "
        "connection has not authenticated yet (AUTH first). Nothing was done. Ask an operator "
        "for an ACL (ACL ADD, docs/security.md).",
        "The principal may not read this topic or group; nothing was read.",
    )
    INTERNAL = (
        False,
        True,
        "The broker failed unexpectedly (a bug; it is logged). A write may or may not have been "
        "applied. Report it; an idempotent producer may retry.",
        "A bug, or a corrupt batch in the replica read: that replica cuts its log before the "
        "batch and copies it again from the leader. Retry, here or at another replica.",
    )

    def __init__(
        self, retriable: bool, outcome_unknown: bool, guidance: str, on_read: str | None
    ) -> None:
        self.retriable = retriable
        self.outcome_unknown = outcome_unknown
        self.guidance = guidance
        self.on_read = on_read
        self.__doc__ = guidance

    @property
    def code(self) -> str:
        """The wire spelling (``ErrorCode.TIMEOUT.code == "TIMEOUT"``)."""
        return self.name

    def __repr__(self) -> str:
        # The value is the (retriable, outcome_unknown, guidance, on_read) tuple: too long.
        return f"<ErrorCode.{self.name}>"


class Acks(StrEnum):
    """When the broker acknowledges a publish."""

    QUORUM = "quorum"
    """After a quorum of replicas persisted it (committed): survives a minority of failures."""
    LEADER = "leader"
    """After the leader appended it: faster, lost if the leader dies before replicating it."""


class FetchFormat(StrEnum):
    """The shape of a FETCH reply."""

    BATCH = "batch"
    """``+DATA next_offset nbytes`` then the raw record batches (for client libraries)."""
    TEXT = "text"
    """One ``+MSG`` line per record then ``+END`` (for people in telnet)."""


class Fsync(StrEnum):
    """When a topic's replicas fsync what they append (docs/operations.md, "Durability settings").

    A topic's setting overrides the broker's ``--fsync``; the storage layer's ``FsyncPolicy``
    has the same words.
    """

    ALWAYS = "always"
    """Every write is fsynced by a majority before it is acknowledged: survives power loss."""
    INTERVAL = "interval"
    """Acknowledged once in a majority's page cache; fsynced every ``--fsync-interval-ms``."""
    NEVER = "never"
    """Acknowledged once in a majority's page cache; the operating system writes it back."""


class FetchReplica(StrEnum):
    """Which replica serves a FETCH."""

    ANY = "any"
    """The partition's leader when it can be reached (it knows of every commit first), else
    another replica: what consumers use."""
    LOCAL = "local"
    """This broker's own replica, never forwarded: what it holds committed as far as its own
    commit index goes (a follower's may lag the leader's). For checkers and operators comparing
    replicas; a broker without a replica of the partition answers ``NO_REPLICA``."""


# ---------------------------------------------------------------------------------------------
# Names.

MAX_TOPIC_NAME_LENGTH: Final = 249
INTERNAL_TOPIC_PREFIX: Final = "__"
MAX_NAME_LENGTH: Final = 249
"""Longest consumer group name, subscription id or broker host name."""

_TOPIC_RE: Final = re.compile(r"[A-Za-z0-9._-]{1,249}\Z")
_NAME_RE: Final = re.compile(r"[\x21-\x7e]{1,249}\Z")


class InvalidTopicNameError(ValueError):
    """A topic name breaks the rules of ``validate_topic_name``."""


def topic_name_error(name: str, *, allow_internal: bool = False) -> str | None:
    """Why ``name`` is not a valid topic name, or None if it is.

    The rules are Kafka's: 1 to 249 characters from ``[A-Za-z0-9._-]``, and not ``.`` or ``..``
    (they would name directories). Names starting with ``__`` are reserved for internal topics
    (``__consumer_offsets``); they are accepted only with ``allow_internal=True``, which the codec
    passes for commands that read or describe a topic and not for those that write, create or
    delete one. Kafka also warns that ``.`` and ``_`` collide in metric names; we do not refuse
    such pairs.
    """
    if not _TOPIC_RE.match(name):
        if not name:
            return "a topic name cannot be empty"
        if len(name) > MAX_TOPIC_NAME_LENGTH:
            return f"a topic name has at most {MAX_TOPIC_NAME_LENGTH} characters"
        return "a topic name uses only the characters A-Z a-z 0-9 . _ -"
    if name in (".", ".."):
        return "a topic name cannot be '.' or '..'"
    if not allow_internal and name.startswith(INTERNAL_TOPIC_PREFIX):
        return (
            f"topic names starting with {INTERNAL_TOPIC_PREFIX!r} are reserved for internal topics"
        )
    return None


def validate_topic_name(name: str, *, allow_internal: bool = False) -> str:
    """Return ``name`` if it is a valid topic name, else raise ``InvalidTopicNameError``.

    See ``topic_name_error`` for the rules.
    """
    reason = topic_name_error(name, allow_internal=allow_internal)
    if reason is not None:
        raise InvalidTopicNameError(f"invalid topic name {name!r}: {reason}")
    return name


def is_internal_topic(name: str) -> bool:
    """Whether ``name`` is in the namespace reserved for internal topics."""
    return name.startswith(INTERNAL_TOPIC_PREFIX)


def name_error(name: str) -> str | None:
    """Why ``name`` is not a valid group name, subscription id or host, or None if it is.

    Such names are one token of 1 to 249 printable ASCII characters without spaces (0x21-0x7E):
    any string a person can type as one word.
    """
    if _NAME_RE.match(name):
        return None
    return f"a name is 1 to {MAX_NAME_LENGTH} printable ASCII characters without spaces"


# ---------------------------------------------------------------------------------------------
# Limits.


@dataclass(frozen=True, slots=True)
class LineLimits:
    """Bounds a decoder enforces on what a peer sends, so a peer cannot make it buffer without end.

    ``max_line_length`` bounds a line without its terminator; ``max_payload`` bounds a binary
    payload (PUBB, ``PUB ... bytes=N``, ``+DATA``). ``LineDecoder`` answers a violation with a
    ``TOO_LARGE`` error and goes on; ``ReplyDecoder`` raises ``RemoteProtocolError``.
    """

    max_line_length: int = 64 * 1024
    max_payload: int = 8 * 1024 * 1024

    def __post_init__(self) -> None:
        # A limit below the longest fixed-form command would reject well-formed commands.
        if self.max_line_length < 64 or self.max_payload < 0:
            raise ValueError(f"unusable limits {self!r}: max_line_length >= 64, max_payload >= 0")


DEFAULT_LIMITS: Final = LineLimits()
DEFAULT_REPLY_LIMITS: Final = LineLimits(
    max_line_length=32 * 1024 * 1024, max_payload=64 * 1024 * 1024
)
"""A client trusts its server more: a ``+MSG`` line carries a whole (escaped) record value."""


# ---------------------------------------------------------------------------------------------
# Commands (client -> broker). Field order is the order of the arguments on the line.


@dataclass(frozen=True, slots=True)
class Pubs:
    """``PUBS topic message``: the seed's publish. ``message`` is the rest of the line, as bytes.

    The broker interprets the message with ``parse_seed_message`` (the seed's JSON envelope or
    plain text). Contract: ``message`` is non-empty, contains no LF, does not start with ASCII
    whitespace and does not end with CR (otherwise send ``PublishRecord``).
    """

    topic: str
    message: bytes


@dataclass(frozen=True, slots=True)
class Subs:
    """``SUBS topic group [partitions]``: join a consumer group; the reply is ``+OK <sub_id>``.

    ``partitions`` is the seed's "number of partitions to subscribe to" (None: the broker decides).
    """

    topic: str
    group: str
    partitions: int | None = None


ConsOffsets: TypeAlias = int | tuple[tuple[int, int], ...]
"""One offset for every partition of a subscription, or explicit ``(partition, offset)`` pairs."""


@dataclass(frozen=True, slots=True)
class Cons:
    """``CONS topic sub_id offset [max=N] [wait_ms=W]``: read through a subscription.

    ``offsets`` is the seed's single offset (for every partition the subscription holds) or the
    pairs ``P:O,P:O`` a previous ``+END`` line printed. The reply is ``+MSG`` rows then ``+END``.
    """

    topic: str
    subscription_id: str
    offsets: ConsOffsets
    max_messages: int | None = None
    wait_ms: int | None = None


@dataclass(frozen=True, slots=True)
class CreateTopic:
    """``CREATE topic partitions replication_factor [retention_ms=] [retention_bytes=] [compact=]
    [fsync=]``.

    A retention of None takes the broker's default; -1 means unlimited (Kafka's convention).
    ``fsync`` None takes each broker's ``--fsync``.
    """

    topic: str
    partitions: int
    replication_factor: int
    retention_ms: int | None = None
    retention_bytes: int | None = None
    compact: bool = False
    fsync: Fsync | None = None


@dataclass(frozen=True, slots=True)
class AlterTopic:
    """``ALTER topic [partitions=N] [retention_ms=N] [retention_bytes=N] [compact=yes|no]``.

    Changes a live topic; at least one option. None leaves a setting as it is; a retention of -1
    is unlimited. Partitions only grow (keys then map by the new count). Every value is absolute,
    so sending the same ALTER twice is harmless.
    """

    topic: str
    partitions: int | None = None
    retention_ms: int | None = None
    retention_bytes: int | None = None
    compact: bool | None = None


@dataclass(frozen=True, slots=True)
class ListTopics:
    """``LIST``: one ``+TOPIC`` row per topic, then ``+END``."""


@dataclass(frozen=True, slots=True)
class DescribeTopic:
    """``DESCRIBE topic [time=MS]``: a ``+TOPIC`` row, one ``+PARTITION`` row per partition,
    ``+END``. With ``time_ms`` each row also gives the partition's offset for that time (Kafka's
    ListOffsets by timestamp): the earliest committed offset whose record timestamp is >= it."""

    topic: str
    time_ms: int | None = None


@dataclass(frozen=True, slots=True)
class DeleteTopic:
    """``DELETE topic``: ``+OK`` once deleted."""

    topic: str


@dataclass(frozen=True, slots=True)
class Idempotence:
    """The producer identity that lets a broker drop a retried duplicate (Kafka's idempotence).

    ``sequence`` counts this producer's records on one partition; the broker accepts only the next
    one and answers a duplicate with the original offset.
    """

    producer_id: int
    epoch: int
    sequence: int


@dataclass(frozen=True, slots=True)
class PublishRecord:
    """``PUB topic [key=K] [partition=P] [acks=A] [pid= epoch= seq=] message``: one record.

    ``key`` None means no key (round-robin unless ``partition`` is given). ``idempotence``
    requires ``partition`` (sequences are per partition). The reply is ``+OK partition offset``.
    """

    topic: str
    value: bytes
    key: bytes | None = None
    partition: int | None = None
    acks: Acks = Acks.QUORUM
    idempotence: Idempotence | None = None


@dataclass(frozen=True, slots=True)
class PublishBatch:
    """``PUBB topic partition nbytes [acks=A]`` then ``nbytes`` bytes of one record batch.

    The batch is opaque to the codec (the storage layer validates it). The reply is
    ``+OK partition base_offset``.
    """

    topic: str
    partition: int
    batch: bytes
    acks: Acks = Acks.QUORUM


@dataclass(frozen=True, slots=True)
class Fetch:
    """``FETCH topic partition offset [max_bytes=N] [wait_ms=W] [format=batch|text]
    [replica=any|local]``.

    Reads committed data from ``offset``; waits up to ``wait_ms`` for some to arrive (None: the
    broker's default, no wait). ``replica`` says which replica serves it (``FetchReplica``).
    """

    topic: str
    partition: int
    offset: int
    max_bytes: int | None = None
    wait_ms: int | None = None
    format: FetchFormat = FetchFormat.BATCH
    replica: FetchReplica = FetchReplica.ANY


@dataclass(frozen=True, slots=True)
class Latest:
    """``LATEST topic key``: the newest committed value of ``key`` in a compacted topic, from
    the key's partition's leader (its key index, no scan). Answered by one ``+MSG`` row and
    ``+END``, or by ``+END`` alone when the key has no value (never written, or deleted by a
    tombstone or retention). ``key`` is percent-escaped on the line, as ``PUB key=``."""

    topic: str
    key: bytes


@dataclass(frozen=True, slots=True)
class Commit:
    """``COMMIT group topic partition offset [member=ID]``: ``offset`` is the next one the group
    will read. With ``member`` (a subscription id) the commit is refused unless that member owns
    the partition (a member that lost it in a rebalance is fenced)."""

    group: str
    topic: str
    partition: int
    offset: int
    member: str | None = None


@dataclass(frozen=True, slots=True)
class FetchOffsets:
    """``OFFSETS group topic``: one ``+OFFSET`` row per partition, then ``+END``."""

    group: str
    topic: str


@dataclass(frozen=True, slots=True)
class Leave:
    """``LEAVE subscription_id``: leave the consumer group now (its partitions move at once)."""

    subscription_id: str


@dataclass(frozen=True, slots=True)
class DescribeGroup:
    """``GROUPS group [topic]``: for each topic the group reads (only ``topic`` if given), a
    ``+GROUPSTATE`` row, a ``+MEMBER`` row per member (also those without partitions) and a
    ``+GROUP`` row per partition (owner, committed, end); then ``+END``. ``UNKNOWN_GROUP`` if the
    group has no members and no committed offsets."""

    group: str
    topic: str | None = None


@dataclass(frozen=True, slots=True)
class ListGroups:
    """``GROUPS``: a ``+GROUPSTATE`` row per group and topic it reads, then ``+END``.

    ``partition`` is not on the line: a broker asks each coordinator for the groups of one
    partition of the offsets topic (None: all of them, gathered from every coordinator)."""

    partition: int | None = None


class ResetKind(StrEnum):
    """Where ``RESETOFFSETS`` moves a group's committed offsets to."""

    EARLIEST = "earliest"
    """Each partition's log start."""
    LATEST = "latest"
    """Each partition's end (its high watermark): the group skips what is there now."""
    OFFSET = "offset"
    """One offset for every partition, clamped into [log start, end] as Kafka's --to-offset."""
    TIME = "time"
    """Each partition's earliest offset whose record timestamp is >= a time in ms (else its end)."""


@dataclass(frozen=True, slots=True)
class ResetOffsets:
    """``RESETOFFSETS group topic earliest|latest|offset=N|time=MS [dry_run=yes]``: move an
    inactive group's committed offsets of every partition of ``topic`` (backwards too);
    ``+OFFSET`` rows with the new offsets, then ``+END``. ``GROUP_NOT_EMPTY`` while the group has
    members on ``topic``. ``value`` is the offset or the time (None for earliest and latest).
    ``dry_run``: the same checks and answer, nothing written (Kafka's plan without --execute)."""

    group: str
    topic: str
    kind: ResetKind
    value: int | None = None
    dry_run: bool = False


@dataclass(frozen=True, slots=True)
class DeleteGroup:
    """``DELGROUP group``: forget an inactive group (its committed offsets and assignments on
    every topic); ``+OK``. ``GROUP_NOT_EMPTY`` while it has members, ``UNKNOWN_GROUP`` if none."""

    group: str


@dataclass(frozen=True, slots=True)
class Metadata:
    """``METADATA [topic ...]``: ``+BROKER`` rows, ``+PARTITION`` rows, ``+END``.

    No topics means every topic.
    """

    topics: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Reassign:
    """``REASSIGN topic partition broker,broker,...``: move a partition's replicas.

    The replicas are changed one server at a time (add a learner, catch it up, promote it;
    remove). The reply ``+OK`` comes once the partition's Raft group has exactly these voters.
    """

    topic: str
    partition: int
    replicas: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class AddBroker:
    """``ADDBROKER id peer_host:port controller_host:port``: admit a new broker to the cluster.

    The new broker runs already (``kafkaesque broker --join``); this adds it to the controller
    quorum and tells every broker where its Raft transport listens.
    """

    broker_id: int
    peer: str
    controller: str


@dataclass(frozen=True, slots=True)
class RemoveBroker:
    """``REMOVEBROKER id``: decommission a broker.

    Moves every replica it holds to other brokers (one membership change at a time per
    partition), then removes it from the controller quorum and the registry. ``+OK moved=<n>``
    once done; refused with ``INVALID_CONFIG`` if a partition would fall below its replication
    factor. Sent to any broker but the one leaving.
    """

    broker_id: int


class AclPermission(StrEnum):
    """Whether an ACL grants or refuses; a deny wins over any allow."""

    ALLOW = "allow"
    DENY = "deny"


class AclOperation(StrEnum):
    """What an ACL lets a principal do (Kafka's operations, docs/security.md)."""

    READ = "read"
    WRITE = "write"
    CREATE = "create"
    DELETE = "delete"
    ALTER = "alter"
    DESCRIBE = "describe"
    COMMIT = "commit"
    ADMIN = "admin"  # the cluster's membership and placement: REASSIGN, ADDBROKER, REMOVEBROKER
    ALL = "all"


class AclResource(StrEnum):
    """The kind of thing an ACL is about."""

    TOPIC = "topic"
    GROUP = "group"
    CLUSTER = "cluster"  # named CLUSTER_RESOURCE_NAME, as Kafka's "kafka-cluster"


class AclPattern(StrEnum):
    """How an ACL's name matches: the name itself (``*``: every name), or every name it starts."""

    LITERAL = "literal"
    PREFIXED = "prefixed"


CLUSTER_RESOURCE_NAME: Final = "kafka-cluster"
ANY_PRINCIPAL: Final = "User:*"
PRINCIPAL_PREFIX: Final = "User:"
AUTH_MECHANISMS: Final = ("SCRAM-SHA-256", "PLAIN")
"""The SASL mechanisms ``AUTH`` names (upper-case; the decoder folds the case of what it reads)."""

_PREFIX_RE: Final = re.compile(r"[A-Za-z0-9._-]{1,249}\Z")


def user_name_error(name: str) -> str | None:
    """Why ``name`` cannot be a user's name on a line (``+OK authenticated``, a principal), or
    None: 1 to 244 printable characters (UTF-8 on the wire), no spaces or control characters."""
    if not name or len(name) > MAX_NAME_LENGTH - len(PRINCIPAL_PREFIX):
        return f"a user name has 1 to {MAX_NAME_LENGTH - len(PRINCIPAL_PREFIX)} characters"
    if any(c.isspace() or not c.isprintable() for c in name):
        return "a user name has no spaces or control characters"
    return None


def principal_error(principal: str) -> str | None:
    """Why ``principal`` is not one an ACL can name, or None if it is.

    A principal is ``User:<name>`` (``User:*``: every principal), one token: ``User:`` then a
    name as ``user_name_error`` wants it.
    """
    if not principal.startswith(PRINCIPAL_PREFIX):
        return "a principal is User:<name> (or User:* for every one)"
    reason = user_name_error(principal[len(PRINCIPAL_PREFIX) :])
    return None if reason is None else f"a principal is User:<name>: {reason}"


def acl_name_error(resource: AclResource, pattern: AclPattern, name: str) -> str | None:
    """Why ``name`` cannot be the resource name of an ACL on ``resource`` with ``pattern``.

    ``cluster``: only ``kafka-cluster``, literal. ``topic``: a topic name (internal ones too) or
    ``*``; prefixed, a non-empty run of topic-name characters. ``group``: a group name or ``*``.
    A prefixed ACL names a prefix, never ``*`` (as Kafka refuses a wildcard prefix).
    """
    if resource is AclResource.CLUSTER:
        if name != CLUSTER_RESOURCE_NAME or pattern is not AclPattern.LITERAL:
            return f"the cluster resource is named {CLUSTER_RESOURCE_NAME}, literal"
        return None
    if name == "*":
        return None if pattern is AclPattern.LITERAL else "a prefixed ACL names a prefix, not *"
    if resource is AclResource.TOPIC:
        if pattern is AclPattern.PREFIXED:
            if _PREFIX_RE.match(name):
                return None
            return "a topic prefix uses only the characters A-Z a-z 0-9 . _ -"
        return topic_name_error(name, allow_internal=True)
    return name_error(name)


def acl_row_error(acl: AclRow) -> str | None:
    """Why ``acl`` could not go on a line (``ACL ADD``, a ``+ACL`` row), or None if it can."""
    if type(acl) is not AclRow:
        return "an ACL is an AclRow"
    if type(acl.principal) is not str or type(acl.name) is not str:
        return "principal and name are str"
    for value, enum in (
        (acl.permission, AclPermission),
        (acl.operation, AclOperation),
        (acl.resource, AclResource),
        (acl.pattern, AclPattern),
    ):
        if not isinstance(value, enum):
            return f"{value!r} is not an {enum.__name__}"
    return principal_error(acl.principal) or acl_name_error(acl.resource, acl.pattern, acl.name)


@dataclass(frozen=True, slots=True)
class AclRow:
    """``+ACL principal permission operation resource pattern name``: one access rule, as
    ``ACL ADD`` takes it and ``ACL LIST`` shows it. ``principal`` is ``User:<name>`` or
    ``User:*``."""

    principal: str
    permission: AclPermission
    operation: AclOperation
    resource: AclResource
    pattern: AclPattern
    name: str


@dataclass(frozen=True, slots=True)
class Authenticate:
    """``AUTH MECHANISM base64``: one step of a SASL exchange (``SCRAM-SHA-256`` or ``PLAIN``).

    Answered ``+OK continue <base64>`` (a challenge: send the next step) or ``+OK authenticated
    <user> [<base64 server-final>]``; ``-ERR AUTH_FAILED`` resets the exchange. ``payload`` is
    the decoded bytes."""

    mechanism: str
    payload: bytes


@dataclass(frozen=True, slots=True)
class AclAdd:
    """``ACL ADD principal permission operation resource pattern name``: ``+OK``."""

    acl: AclRow


@dataclass(frozen=True, slots=True)
class AclRemove:
    """``ACL REMOVE principal permission operation resource pattern name``:
    ``+OK removed=<0|1>``."""

    acl: AclRow


@dataclass(frozen=True, slots=True)
class AclList:
    """``ACL LIST [principal]``: ``+ACL`` rows then ``+END``."""

    principal: str | None = None


@dataclass(frozen=True, slots=True)
class Help:
    """``HELP [command]``: ``+INFO`` rows then ``+END`` (see ``help_replies``)."""

    command: str | None = None


@dataclass(frozen=True, slots=True)
class Ping:
    """``PING``: ``+OK PONG``."""


@dataclass(frozen=True, slots=True)
class Quit:
    """``QUIT``: ``+OK bye``, then the broker closes the connection."""


Command: TypeAlias = (
    Pubs
    | Subs
    | Cons
    | CreateTopic
    | AlterTopic
    | ListTopics
    | DescribeTopic
    | DeleteTopic
    | PublishRecord
    | PublishBatch
    | Fetch
    | Latest
    | Commit
    | FetchOffsets
    | Leave
    | DescribeGroup
    | ListGroups
    | ResetOffsets
    | DeleteGroup
    | Metadata
    | Reassign
    | AddBroker
    | RemoveBroker
    | Authenticate
    | AclAdd
    | AclRemove
    | AclList
    | Help
    | Ping
    | Quit
)


@dataclass(frozen=True, slots=True)
class BadCommand:
    """What ``LineDecoder`` returns for input it could not turn into a command.

    The broker answers it like any command, with ``reply()``, in its place in the pipeline; the
    decoder has already moved on to the next line. ``framing_error`` is the remote-protocol-error
    hint: True when the peer broke the byte framing (a payload not followed by CRLF, or a payload
    length that cannot be read), so the decoder had to guess where the next command starts and
    replies may no longer match requests by order. The broker should send the reply and close.
    """

    code: ErrorCode
    message: str
    framing_error: bool = False

    def reply(self) -> ErrorReply:
        """The ``-ERR`` reply that answers this line."""
        return ErrorReply(self.code, self.message)


LineEvent: TypeAlias = Command | BadCommand
"""What ``LineDecoder.next_event`` returns besides ``NEED_DATA``."""


# ---------------------------------------------------------------------------------------------
# Replies (broker -> client). A reply to one command is exactly one of: ``OkReply``,
# ``ErrorReply``, ``DataReply``, or a list: zero or more rows followed by one ``EndReply``.


@dataclass(frozen=True, slots=True)
class OkReply:
    """``+OK[ text]``. ``text`` is one line of UTF-8 (no CR or LF); its meaning is the command's."""

    text: str = ""


@dataclass(frozen=True, slots=True)
class ErrorReply:
    """``-ERR CODE[ message]``. ``message`` is one line for people; programs read ``code``."""

    code: ErrorCode
    message: str = ""


@dataclass(frozen=True, slots=True)
class DataReply:
    """``+DATA next_offset nbytes[ hw=N]`` CRLF, ``nbytes`` bytes of record batches, CRLF.

    ``next_offset`` is where the next FETCH starts (past the last batch, control batches
    included). ``high_watermark`` is the partition's commit index when the broker knows it.
    """

    next_offset: int
    payload: bytes
    high_watermark: int | None = None


@dataclass(frozen=True, slots=True)
class MessageRow:
    """``+MSG partition offset key value``: one record, for people (CONS, FETCH format=text).

    ``key`` None is printed ``-``; ``value`` None (a tombstone) ends the line after the key.
    Headers and timestamps are not shown; FETCH format=batch carries them.
    """

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


@dataclass(frozen=True, slots=True)
class TopicRow:
    """``+TOPIC name partitions replication_factor [retention_ms=N] [retention_bytes=N] [...]``.

    The options appear when set: then ``compact=yes``, only when True, and ``fsync=<policy>``
    when the topic has its own (None: each broker's ``--fsync``).
    """

    topic: str
    partitions: int
    replication_factor: int
    retention_ms: int | None = None
    retention_bytes: int | None = None
    compact: bool = False
    fsync: Fsync | None = None


@dataclass(frozen=True, slots=True)
class PartitionRow:
    """``+PARTITION topic partition leader=ID|- replicas=ID,ID [start=N] [end=N]
    [time_offset=N]``.

    ``leader`` None: no leader known right now (an election is running). ``start_offset`` and
    ``end_offset`` are the log start and the high watermark, when the broker reports them.
    ``time_offset`` answers ``DESCRIBE time=``: the earliest committed offset whose record
    timestamp is >= the time (the high watermark when none is).
    """

    topic: str
    partition: int
    leader: int | None
    replicas: tuple[int, ...]
    start_offset: int | None = None
    end_offset: int | None = None
    time_offset: int | None = None


@dataclass(frozen=True, slots=True)
class BrokerRow:
    """``+BROKER id host port [mqtt=port] [mqtt_tls=port] [mqtt_ws=port]``: where a broker listens
    for the line protocol, and on the same host for MQTT devices: plain, over TLS, over WebSocket
    (when it does)."""

    broker_id: int
    host: str
    port: int
    mqtt_port: int | None = None
    mqtt_tls_port: int | None = None
    mqtt_ws_port: int | None = None


@dataclass(frozen=True, slots=True)
class OffsetRow:
    """``+OFFSET topic partition offset|-``: a group's committed offset (None: none committed)."""

    topic: str
    partition: int
    offset: int | None


@dataclass(frozen=True, slots=True)
class InfoRow:
    """``+INFO text``: one line of help for people."""

    text: str


@dataclass(frozen=True, slots=True)
class EndReply:
    """``+END[ P:O,P:O...]``: ends a list; after ``+MSG`` rows, each partition's next offset.

    The pairs are printed so that a telnet user can paste them into the next CONS.
    """

    next_offsets: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class GroupRow:
    """``+GROUP group topic partition owner|- committed|- end|-``: one partition of a group.

    ``owner`` is the member (subscription id) that owns it, ``committed`` the group's committed
    offset and ``end`` the partition's high watermark; the lag is ``end - committed``.
    """

    group: str
    topic: str
    partition: int
    owner: str | None
    committed: int | None
    end: int | None


@dataclass(frozen=True, slots=True)
class GroupStateRow:
    """``+GROUPSTATE group topic state members``: a group on one topic. ``state`` is ``Stable``
    (it has members) or ``Empty`` (none: only committed offsets), as Kafka names them;
    ``members`` is how many it has."""

    group: str
    topic: str
    state: str
    members: int


@dataclass(frozen=True, slots=True)
class MemberRow:
    """``+MEMBER group topic member partitions|-``: a member of a group and the partitions it
    owns (comma-separated; ``-``: none, as a member beyond the partition count has)."""

    group: str
    topic: str
    member: str
    partitions: tuple[int, ...]


Row: TypeAlias = (
    MessageRow
    | TopicRow
    | PartitionRow
    | BrokerRow
    | OffsetRow
    | GroupRow
    | GroupStateRow
    | MemberRow
    | AclRow
    | InfoRow
)
Reply: TypeAlias = OkReply | ErrorReply | DataReply | Row | EndReply


def published_reply(partition: int, offset: int) -> OkReply:
    """The reply to PUBS, PUB and PUBB: ``+OK partition offset`` (PUBB: the batch's base offset)."""
    return OkReply(f"{partition} {offset}")


def parse_published_reply(reply: OkReply) -> tuple[int, int]:
    """``(partition, offset)`` from a ``published_reply``; ``RemoteProtocolError`` if malformed."""
    fields = reply.text.split(" ")
    if len(fields) == 2 and fields[0].isdigit() and fields[1].isdigit():
        return int(fields[0]), int(fields[1])
    raise RemoteProtocolError(f"expected '+OK partition offset', got '+OK {reply.text}'")


def auth_continue_reply(challenge: bytes) -> OkReply:
    """The reply to an ``AUTH`` step that needs another: ``+OK continue <base64 challenge>``."""
    if type(challenge) is not bytes or not challenge:
        raise LocalProtocolError(f"an AUTH challenge is non-empty bytes, not {challenge!r}")
    return OkReply("continue " + base64.b64encode(challenge).decode("ascii"))


def auth_authenticated_reply(username: str, server_final: bytes | None = None) -> OkReply:
    """The reply to the last ``AUTH`` step: ``+OK authenticated <username> [<base64 final>]``
    (SCRAM sends its server-final, which the client verifies; PLAIN none)."""
    if type(username) is not str or user_name_error(username) is not None:
        raise LocalProtocolError(f"cannot put user name {username!r} on a line")
    if server_final is None:
        return OkReply(f"authenticated {username}")
    if type(server_final) is not bytes or not server_final:
        raise LocalProtocolError(f"a server-final is non-empty bytes, not {server_final!r}")
    return OkReply(f"authenticated {username} {base64.b64encode(server_final).decode('ascii')}")


def auth_reply_parts(text: str) -> tuple[str, str | None, bytes]:
    """An ``AUTH`` step's ``+OK`` text as ``(step, username, payload)``.

    ``("continue", None, challenge)`` for ``continue <base64>``; ``("authenticated", username,
    server_final)`` for ``authenticated <username> [<base64>]`` (``b""`` when there is none).
    Raises ``RemoteProtocolError`` for any other text: the server broke the exchange.
    """
    words = text.split(" ")
    try:
        if words[0] == "continue" and len(words) == 2 and words[1]:
            return "continue", None, base64.b64decode(words[1], validate=True)
        if words[0] == "authenticated" and len(words) in (2, 3) and words[1]:
            final = base64.b64decode(words[2], validate=True) if len(words) == 3 else b""
            return "authenticated", words[1], final
    except (binascii.Error, ValueError):
        pass
    raise RemoteProtocolError(f"malformed AUTH reply '+OK {text[:80]}'")


def acl_removed_reply(removed: int) -> OkReply:
    """The reply to ``ACL REMOVE``: ``+OK removed=<0|1>`` (0: there was no such ACL)."""
    return OkReply(f"removed={removed}")


def parse_acl_removed_reply(reply: OkReply) -> int:
    """How many ACLs an ``ACL REMOVE`` removed; ``RemoteProtocolError`` if the text is not
    ``removed=<n>``."""
    name, eq, count = reply.text.partition("=")
    if name == "removed" and eq and count.isdigit() and count.isascii():
        return int(count)
    raise RemoteProtocolError(f"expected '+OK removed=<n>', got '+OK {reply.text[:80]}'")


# ---------------------------------------------------------------------------------------------
# The seed's JSON message envelope.


@dataclass(frozen=True, slots=True)
class SeedMessage:
    """A PUBS message split into the record it stands for."""

    value: bytes
    key: bytes | None = None
    header: bytes | None = None


_SEED_FIELDS: Final = frozenset({"header", "key", "body"})


def parse_seed_message(message: bytes) -> SeedMessage:
    """Interpret a PUBS message as the seed did: its JSON envelope, or else plain text.

    The envelope is a JSON object ``{"Header": "...", "Key": "124", "Body": "Hello World!"}``
    whose ``Body`` is a string and whose optional ``Key`` (a string or an integer) and ``Header``
    (a string) may be null. Field names match case-insensitively, as Go's ``encoding/json`` (the
    seed's language) matches them. Anything else, including an object with other fields or a
    non-string body, is plain text: the whole message is the value and there is no key. Values
    come back UTF-8 encoded. Pure and total: never raises.
    """
    # Cheap test first: plain text (the common case) must not pay for a JSON parse.
    if message.lstrip()[:1] != b"{":
        return SeedMessage(message)
    try:
        obj = json.loads(message)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError are both ValueErrors
        return SeedMessage(message)
    except RecursionError:  # deeply nested brackets: plainly not the envelope
        return SeedMessage(message)
    if not isinstance(obj, dict):
        return SeedMessage(message)
    fields: dict[str, object] = {}
    for name, field_value in obj.items():
        folded = name.lower()
        if folded not in _SEED_FIELDS or folded in fields:
            return SeedMessage(message)
        fields[folded] = field_value
    body, key, header = fields.get("body"), fields.get("key"), fields.get("header")
    if not isinstance(body, str):
        return SeedMessage(message)
    if isinstance(key, int) and not isinstance(key, bool):
        key = str(key)
    if not (key is None or isinstance(key, str)) or not (header is None or isinstance(header, str)):
        return SeedMessage(message)
    return SeedMessage(
        value=body.encode("utf-8", "surrogatepass"),
        key=None if key is None else key.encode("utf-8", "surrogatepass"),
        header=None if header is None else header.encode("utf-8", "surrogatepass"),
    )
