"""The replies of the line protocol (broker -> client): frozen dataclasses, one per reply line.

A reply to one command is exactly one of ``OkReply``, ``ErrorReply`` (in ``_line_errors.py``),
``DataReply``, or a list: zero or more rows followed by one ``EndReply``. The functions here build
and read the ``+OK`` texts whose shape more than one side relies on (a publish's partition and
offset, an AUTH step, an ACL removal).

The contract of ``_line_commands.py`` holds here too: a reply ``ReplyDecoder`` returns is valid;
one built by hand is validated by ``encode_reply``, which raises ``LocalProtocolError``.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import TypeAlias

from ._line_commands import AclRow, Fsync, user_name_error
from ._line_errors import ErrorReply, LocalProtocolError, RemoteProtocolError

# ---------------------------------------------------------------------------------------------
# Replies (broker -> client). A reply to one command is exactly one of: ``OkReply``,
# ``ErrorReply``, ``DataReply``, or a list: zero or more rows followed by one ``EndReply``.


@dataclass(frozen=True, slots=True)
class OkReply:
    """``+OK[ text]``. ``text`` is one line of UTF-8 (no CR or LF); its meaning is the command's."""

    text: str = ""


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
    """``+BROKER id host port [mqtt=port] [mqtt_tls=port] [mqtt_ws=port] [kafka=port]
    [http=port]``: where a broker listens for the line protocol, and on the same host for MQTT
    devices (plain, over TLS, over WebSocket), Kafka clients and REST calls (when it does).
    A reader ignores a ``name=value`` field it does not know: later brokers may add some."""

    broker_id: int
    host: str
    port: int
    mqtt_port: int | None = None
    mqtt_tls_port: int | None = None
    mqtt_ws_port: int | None = None
    kafka_port: int | None = None
    http_port: int | None = None


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
