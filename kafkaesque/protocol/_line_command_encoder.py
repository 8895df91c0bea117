"""``encode_command``, the client side's writer: a command in, the bytes that send it out.

Also the field encoders (``int_bytes``, ``topic_bytes``, ``topic_settings_line``...): each checks
one value against its rule, raising ``LocalProtocolError``, and writes it. ``encode_reply`` uses
them too, so a ``CREATE`` and the ``+TOPIC`` row that reports the topic cannot drift.
"""

from __future__ import annotations

import base64
import functools

from ._line_bytes import CRLF, INT16_MAX, INT32_MAX, INT64_MAX, OPTION_RE, escape_key
from ._line_commands import (
    AUTH_MECHANISMS,
    Acks,
    AclAdd,
    AclList,
    AclRemove,
    AclRow,
    AddBroker,
    AlterTopic,
    Authenticate,
    Command,
    Commit,
    Cons,
    CreateTopic,
    DeleteGroup,
    DeleteTopic,
    DescribeGroup,
    DescribeTopic,
    ElectLeaders,
    Fetch,
    FetchFormat,
    FetchOffsets,
    FetchReplica,
    Fsync,
    Help,
    Idempotence,
    Latest,
    Leave,
    ListGroups,
    ListTopics,
    Metadata,
    Ping,
    PublishBatch,
    PublishRecord,
    Pubs,
    Quit,
    Reassign,
    RemoveBroker,
    ResetKind,
    ResetOffsets,
    Subs,
    acl_row_error,
    name_error,
    principal_error,
    topic_name_error,
)
from ._line_errors import LocalProtocolError
from ._line_help import HELP
from ._line_replies import TopicRow

# ---------------------------------------------------------------------------------------------
# The client side: encode_command.


def encode_error(what: str, value: object, rule: str) -> LocalProtocolError:
    return LocalProtocolError(f"cannot encode {what}={value!r}: {rule}")


@functools.lru_cache(maxsize=1024)
def topic_bytes(topic: str, internal_ok: bool) -> bytes:
    """A topic validated and encoded; cached because a client names the same few topics."""
    if type(topic) is not str:
        raise encode_error("topic", topic, "a topic is a str")
    reason = topic_name_error(topic, allow_internal=internal_ok)
    if reason is not None:
        raise encode_error("topic", topic, reason)
    return topic.encode("ascii")


def int_bytes(value: object, what: str, lo: int, hi: int) -> bytes:
    # type() and not isinstance(): a bool is an int to Python, and True is no partition number.
    if type(value) is not int or not lo <= value <= hi:
        raise encode_error(what, value, f"an int from {lo} to {hi}")
    return b"%d" % value


def name_bytes(value: object, what: str) -> bytes:
    if type(value) is not str or name_error(value) is not None:
        raise encode_error(what, value, "1 to 249 printable ASCII characters without spaces")
    return value.encode("ascii")


def text_bytes(value: object, what: str) -> bytes:
    if type(value) is not str or "\r" in value or "\n" in value:
        raise encode_error(what, value, "a str without CR or LF")
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates
        raise encode_error(what, value, "valid Unicode (no lone surrogates)") from None


def checked_bytes(value: object, what: str) -> bytes:
    if type(value) is not bytes:
        raise encode_error(what, value, "bytes")
    return value


def _inline_ok(value: bytes) -> bool:
    """Whether ``value`` survives as the rest of a command line, byte for byte.

    The decoder skips whitespace before the message, drops CRs at the end of the line and
    interprets 0xFF as telnet's IAC, and a line cannot hold LF.
    """
    return (
        bool(value)
        and b"\n" not in value
        and b"\xff" not in value
        and not value[:1].isspace()
        and value[-1:] != b"\r"
    )


def pairs_bytes(pairs: object, what: str, *, allow_empty: bool) -> bytes:
    """``(partition, offset)`` pairs as ``P:O,P:O``, partitions distinct."""
    if type(pairs) is not tuple or (not pairs and not allow_empty):
        raise encode_error(what, pairs, "a tuple of (partition, offset) pairs")
    items = []
    seen = set()
    for pair in pairs:
        if type(pair) is not tuple or len(pair) != 2 or pair[0] in seen:
            raise encode_error(what, pairs, "(partition, offset) pairs with distinct partitions")
        seen.add(pair[0])
        partition = int_bytes(pair[0], "partition", 0, INT32_MAX)
        items.append(partition + b":" + int_bytes(pair[1], "offset", 0, INT64_MAX))
    return b",".join(items)


def optional_int(name: bytes, value: object, lo: int, hi: int) -> list[bytes]:
    if value is None:
        return []
    return [name + b"=" + int_bytes(value, name.decode(), lo, hi)]


def _acks_option(acks: object) -> list[bytes]:
    if not isinstance(acks, Acks):
        raise encode_error("acks", acks, "an Acks")
    return [] if acks is Acks.QUORUM else [b"acks=" + acks.value.encode()]


def topic_settings_line(
    word: bytes, spec: CreateTopic | TopicRow, *, allow_internal: bool
) -> bytes:
    """``word topic partitions rf [retention_ms=] [retention_bytes=] [compact=yes] [fsync=]`` CRLF.

    One encoder for what a CREATE asks and what a ``+TOPIC`` row reports, so they cannot drift.
    """
    words = [
        word,
        topic_bytes(spec.topic, allow_internal),
        int_bytes(spec.partitions, "partitions", 1, INT32_MAX),
        int_bytes(spec.replication_factor, "replication_factor", 1, INT16_MAX),
    ]
    words += optional_int(b"retention_ms", spec.retention_ms, -1, INT64_MAX)
    words += optional_int(b"retention_bytes", spec.retention_bytes, -1, INT64_MAX)
    if type(spec.compact) is not bool:
        raise encode_error("compact", spec.compact, "a bool")
    if spec.compact:
        words.append(b"compact=yes")
    if spec.fsync is not None:
        if not isinstance(spec.fsync, Fsync):
            raise encode_error("fsync", spec.fsync, "an Fsync")
        words.append(b"fsync=" + spec.fsync.value.encode())
    return b" ".join(words) + CRLF


def acl_bytes(acl: AclRow) -> bytes:
    """An ACL's six words, as ``ACL ADD`` and a ``+ACL`` row write them."""
    reason = acl_row_error(acl)  # checks the types too: the caller's AclRow may be anything
    if reason is not None:
        raise encode_error("acl", acl, reason)
    return " ".join(
        (acl.principal, acl.permission, acl.operation, acl.resource, acl.pattern, acl.name)
    ).encode("utf-8")


def encode_command(command: Command) -> bytes:
    """The bytes that send ``command``: a CRLF-ended line, then its payload and CRLF if it has one.

    ``LineDecoder`` decodes them back into an equal command. The encoding is canonical: options
    appear only when they differ from their default, in a fixed order. ``PublishRecord`` goes inline
    when its value survives as the rest of a line (``--`` is added if the value would read as an
    option) and with ``bytes=N`` otherwise. Raises ``LocalProtocolError`` for a command whose
    fields break their rules (see each class), so a bad command fails here, not at the server.
    """
    match command:
        case Pubs(topic=topic, message=message):
            if type(message) is not bytes or not message:
                raise encode_error("message", message, "non-empty bytes")
            if b"\n" in message or message[:1].isspace() or message[-1:] == b"\r":
                raise encode_error(
                    "message",
                    message,
                    "PUBS sends the rest of a line: no LF, no leading space, no CR at the end "
                    "(send PublishRecord instead)",
                )
            if b"\xff" in message:  # telnet's escaping of a 0xFF data byte
                message = message.replace(b"\xff", b"\xff\xff")
            return b"PUBS %s %s\r\n" % (topic_bytes(topic, False), message)
        case PublishRecord(topic=topic, value=value, key=key, partition=partition, acks=acks):
            words = [b"PUB", topic_bytes(topic, False)]
            if key is not None:
                words.append(b"key=" + escape_key(checked_bytes(key, "key")))
            words += optional_int(b"partition", partition, 0, INT32_MAX)
            words += _acks_option(acks)
            idem = command.idempotence
            if idem is not None:
                if not isinstance(idem, Idempotence) or partition is None:
                    raise encode_error("idempotence", idem, "an Idempotence, with a partition")
                words.append(b"pid=" + int_bytes(idem.producer_id, "producer_id", 0, INT64_MAX))
                words.append(b"epoch=" + int_bytes(idem.epoch, "epoch", 0, INT16_MAX))
                words.append(b"seq=" + int_bytes(idem.sequence, "sequence", 0, INT32_MAX))
            value = checked_bytes(value, "value")
            if _inline_ok(value):
                first = value.split(None, 1)[0]
                if first == b"--" or OPTION_RE.match(first):
                    words.append(b"--")
                words.append(value)
                return b" ".join(words) + CRLF
            words.append(b"bytes=%d" % len(value))
            return b"".join((b" ".join(words), CRLF, value, CRLF))
        case PublishBatch(topic=topic, partition=partition, batch=batch, acks=acks):
            batch = checked_bytes(batch, "batch")
            words = [
                b"PUBB",
                topic_bytes(topic, False),
                int_bytes(partition, "partition", 0, INT32_MAX),
            ]
            words.append(b"%d" % len(batch))
            words += _acks_option(acks)
            return b"".join((b" ".join(words), CRLF, batch, CRLF))
        case Subs(topic=topic, group=group, partitions=partitions):
            words = [b"SUBS", topic_bytes(topic, True), name_bytes(group, "group")]
            if partitions is not None:
                words.append(int_bytes(partitions, "partitions", 1, INT32_MAX))
            words += optional_int(b"session_timeout_ms", command.session_timeout_ms, 1, INT32_MAX)
            return b" ".join(words) + CRLF
        case Cons(topic=topic, subscription_id=sub, offsets=offsets):
            words = [b"CONS", topic_bytes(topic, True), name_bytes(sub, "subscription_id")]
            if type(offsets) is int:
                words.append(int_bytes(offsets, "offsets", 0, INT64_MAX))
            else:
                words.append(pairs_bytes(offsets, "offsets", allow_empty=False))
            words += optional_int(b"max", command.max_messages, 1, INT32_MAX)
            words += optional_int(b"wait_ms", command.wait_ms, 0, INT32_MAX)
            return b" ".join(words) + CRLF
        case Fetch(topic=topic, partition=partition, offset=offset):
            words = [
                b"FETCH",
                topic_bytes(topic, True),
                int_bytes(partition, "partition", 0, INT32_MAX),
                int_bytes(offset, "offset", 0, INT64_MAX),
            ]
            words += optional_int(b"max_bytes", command.max_bytes, 1, INT32_MAX)
            words += optional_int(b"wait_ms", command.wait_ms, 0, INT32_MAX)
            if not isinstance(command.format, FetchFormat):
                raise encode_error("format", command.format, "a FetchFormat")
            if command.format is not FetchFormat.BATCH:
                words.append(b"format=" + command.format.value.encode())
            if not isinstance(command.replica, FetchReplica):
                raise encode_error("replica", command.replica, "a FetchReplica")
            if command.replica is not FetchReplica.ANY:
                words.append(b"replica=" + command.replica.value.encode())
            return b" ".join(words) + CRLF
        case Latest(topic=topic, key=key):
            token = escape_key(checked_bytes(key, "key"))
            if not token:
                raise encode_error("key", key, "a non-empty key")
            return b"LATEST %s %s\r\n" % (topic_bytes(topic, True), token)
        case Commit(group=group, topic=topic, partition=partition, offset=offset):
            words = [
                b"COMMIT",
                name_bytes(group, "group"),
                topic_bytes(topic, True),
                int_bytes(partition, "partition", 0, INT32_MAX),
                int_bytes(offset, "offset", 0, INT64_MAX),
            ]
            if command.member is not None:
                words.append(b"member=" + name_bytes(command.member, "member"))
            return b" ".join(words) + CRLF
        case FetchOffsets(group=group, topic=topic):
            return b"OFFSETS %s %s\r\n" % (name_bytes(group, "group"), topic_bytes(topic, True))
        case Leave(subscription_id=sub):
            return b"LEAVE %s\r\n" % name_bytes(sub, "subscription_id")
        case DescribeGroup(group=group, topic=topic):
            words = [b"GROUPS", name_bytes(group, "group")]
            if topic is not None:
                words.append(topic_bytes(topic, True))
            return b" ".join(words) + CRLF
        case ListGroups(partition=None):
            return b"GROUPS\r\n"
        case ResetOffsets(group=group, topic=topic, kind=kind, value=value):
            words = [b"RESETOFFSETS", name_bytes(group, "group"), topic_bytes(topic, True)]
            if kind in (ResetKind.EARLIEST, ResetKind.LATEST) and value is None:
                words.append(kind.value.encode())
            elif kind in (ResetKind.OFFSET, ResetKind.TIME) and value is not None:
                number = int_bytes(value, kind.value, 0, INT64_MAX)
                words.append(kind.value.encode() + b"=" + number)
            else:
                raise encode_error(
                    "reset", command, "earliest/latest with no value, offset/time with one"
                )
            if command.dry_run is True:
                words.append(b"dry_run=yes")
            elif command.dry_run is not False:
                raise encode_error("dry_run", command.dry_run, "a bool")
            return b" ".join(words) + CRLF
        case DeleteGroup(group=group):
            return b"DELGROUP %s\r\n" % name_bytes(group, "group")
        case CreateTopic():
            return topic_settings_line(b"CREATE", command, allow_internal=False)
        case AlterTopic(topic=topic, compact=compact):
            words = [b"ALTER", topic_bytes(topic, False)]
            words += optional_int(b"partitions", command.partitions, 1, INT32_MAX)
            words += optional_int(b"retention_ms", command.retention_ms, -1, INT64_MAX)
            words += optional_int(b"retention_bytes", command.retention_bytes, -1, INT64_MAX)
            if compact is not None:
                if type(compact) is not bool:
                    raise encode_error("compact", compact, "a bool or None")
                words.append(b"compact=yes" if compact else b"compact=no")
            if len(words) == 2:
                raise encode_error("alter", command, "at least one setting to change")
            return b" ".join(words) + CRLF
        case ListTopics():
            return b"LIST\r\n"
        case DescribeTopic(topic=topic, time_ms=time_ms):
            words = [b"DESCRIBE", topic_bytes(topic, True)]
            words += optional_int(b"time", time_ms, 0, INT64_MAX)
            return b" ".join(words) + CRLF
        case DeleteTopic(topic=topic):
            return b"DELETE %s\r\n" % topic_bytes(topic, False)
        case Metadata(topics=topics):
            if type(topics) is not tuple:
                raise encode_error("topics", topics, "a tuple of topic names")
            return b" ".join([b"METADATA", *(topic_bytes(t, True) for t in topics)]) + CRLF
        case Reassign(topic=topic, partition=partition, replicas=replicas):
            if type(replicas) is not tuple or not replicas:
                raise encode_error("replicas", replicas, "a non-empty tuple of broker ids")
            return b"REASSIGN %s %s %s\r\n" % (
                topic_bytes(topic, True),
                int_bytes(partition, "partition", 0, INT32_MAX),
                b",".join(int_bytes(r, "broker", 0, INT32_MAX) for r in replicas),
            )
        case ElectLeaders(topic=topic, partition=partition):
            words = [b"ELECTLEADERS"]
            if topic is not None:
                words.append(topic_bytes(topic, True))
            if partition is not None:
                if topic is None:
                    raise encode_error("partition", partition, "given with its topic")
                words.append(int_bytes(partition, "partition", 0, INT32_MAX))
            return b" ".join(words) + CRLF
        case AddBroker(broker_id=broker_id, peer=peer, controller=controller):
            return b"ADDBROKER %s %s %s\r\n" % (
                int_bytes(broker_id, "id", 0, INT32_MAX),
                name_bytes(peer, "peer"),
                name_bytes(controller, "controller"),
            )
        case RemoveBroker(broker_id=broker_id):
            return b"REMOVEBROKER %s\r\n" % int_bytes(broker_id, "id", 0, INT32_MAX)
        case Authenticate(mechanism=mechanism, payload=payload):
            if mechanism not in AUTH_MECHANISMS:
                raise encode_error("mechanism", mechanism, f"one of {', '.join(AUTH_MECHANISMS)}")
            if type(payload) is not bytes or not payload:
                raise encode_error("payload", payload, "non-empty bytes")
            return b"AUTH %s %s\r\n" % (mechanism.encode(), base64.b64encode(payload))
        case AclAdd(acl=acl):
            return b"ACL ADD %s\r\n" % acl_bytes(acl)
        case AclRemove(acl=acl):
            return b"ACL REMOVE %s\r\n" % acl_bytes(acl)
        case AclList(principal=principal):
            if principal is None:
                return b"ACL LIST\r\n"
            if type(principal) is not str or principal_error(principal) is not None:
                raise encode_error("principal", principal, "User:<name> or User:*")
            return b"ACL LIST %s\r\n" % principal.encode("utf-8")
        case Help(command=word):
            if word is None:
                return b"HELP\r\n"
            if word not in HELP:
                raise encode_error("command", word, f"one of {', '.join(HELP)}")
            return b"HELP %s\r\n" % word.encode()
        case Ping():
            return b"PING\r\n"
        case Quit():
            return b"QUIT\r\n"
    raise LocalProtocolError(f"not a command: {command!r}")
