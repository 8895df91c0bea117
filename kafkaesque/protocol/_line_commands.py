"""The commands of the line protocol (client -> broker), and the words and names they are made of.

Everything here is plain data: frozen dataclasses for the commands a client sends (``Command``)
and for a line the decoder could not read (``BadCommand``), enums for the closed sets of words
(acks, fetch formats, fsync policies, the ACL words), and pure functions for the rules a name
must follow (topics, groups, users, principals, ACL resources). The replies are in
``_line_replies.py`` and the errors in ``_line_errors.py``; the byte-level grammar lives in the
codec modules (``_line_command_decoder.py``, ``_line_command_encoder.py``,
``_line_reply_encoder.py``, ``_line_reply_decoder.py``); the reference for users is
``docs/protocol.md``.

Contract shared by every event class: an event that ``LineDecoder`` or ``ReplyDecoder`` returns is
valid (names follow their rules, integers are in range). Constructing one by hand does not validate
it, because the decoder builds tens of thousands a second; ``encode_command`` and ``encode_reply``
validate instead and raise ``LocalProtocolError`` for an event that could not be decoded back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Final, TypeAlias

from ._line_errors import ErrorCode, ErrorReply


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
GROUP_OFFSETS_TOPIC: Final = INTERNAL_TOPIC_PREFIX + "consumer_offsets"
"""The internal topic of the consumer groups: the leader of its partition
``partition_for_key(group)`` is the group's coordinator, as in Kafka."""
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
    """``SUBS topic group [partitions] [session_timeout_ms=N]``: join a consumer group; the
    reply is ``+OK <sub_id>``.

    ``partitions`` is the seed's "number of partitions to subscribe to" (None: the broker decides).
    ``session_timeout_ms`` None: the member lives as long as the connection that joined it (its
    broker keeps it alive), then one broker session timeout; a number: the member is gone once its
    coordinator has not heard from it (SUBS, CONS, COMMIT member=) for that long, open connection
    or not (a client that heartbeats and wants a hung process noticed).
    """

    topic: str
    group: str
    partitions: int | None = None
    session_timeout_ms: int | None = None


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
class ElectLeaders:
    """``ELECTLEADERS [topic [partition]]``: preferred-leader election, now.

    The broker that gets it hands each partition it leads (of ``topic``, or only ``partition``
    of it; None: every topic) whose preferred replica (the first of its replicas) is another
    broker to that replica, by a Raft leadership transfer, if the replica is a connected,
    caught-up voter; ``+OK moved=<n> skipped=<m>`` (skipped: preferred replica not eligible
    now), answered once the transfers are started, not done. It moves only what it leads:
    ``kafkaesque topic elect-leaders`` sends it to every broker.
    """

    topic: str | None = None
    partition: int | None = None


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
    ADMIN = "admin"  # membership and placement: REASSIGN, ELECTLEADERS, ADDBROKER, REMOVEBROKER
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
    | ElectLeaders
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
