"""The errors of the line protocol: who broke it, and what a broker answers when a command fails.

``LocalProtocolError`` (our own side misused the codec) and ``RemoteProtocolError`` (the peer
broke the byte stream) are the codec's exceptions, split as h11 splits them. ``ErrorCode`` is the
broker's answer to a command it read but could not carry out, with what a client must do about
it, and ``ErrorReply`` is the ``-ERR CODE message`` line that carries one. The reference for
users is ``docs/protocol.md`` (its table of codes is kept in step with ``ErrorCode`` by
``tests/protocol/test_line_commands.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

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


@dataclass(frozen=True, slots=True)
class ErrorReply:
    """``-ERR CODE[ message]``. ``message`` is one line for people; programs read ``code``."""

    code: ErrorCode
    message: str = ""
