"""``encode_reply``, the server side's writer: a reply in, its line (and payload) out."""

from __future__ import annotations

from ._line_bytes import CRLF, INT32_MAX, INT64_MAX, escape_key, escape_value
from ._line_command_encoder import (
    acl_bytes,
    checked_bytes,
    encode_error,
    int_bytes,
    name_bytes,
    optional_int,
    pairs_bytes,
    text_bytes,
    topic_bytes,
    topic_settings_line,
)
from ._line_commands import AclRow
from ._line_errors import ErrorCode, ErrorReply, LocalProtocolError
from ._line_replies import (
    BrokerRow,
    DataReply,
    EndReply,
    GroupRow,
    GroupStateRow,
    InfoRow,
    MemberRow,
    MessageRow,
    OffsetRow,
    OkReply,
    PartitionRow,
    Reply,
    TopicRow,
)

# ---------------------------------------------------------------------------------------------
# The server side: encode_reply.


def _optional_offset(value: int | None, what: str) -> bytes:
    return b"-" if value is None else int_bytes(value, what, 0, INT64_MAX)


def _key_token(key: bytes | None) -> bytes:
    if key is None:
        return b"-"
    if key == b"-":  # "-" alone means "no key"
        return b"%2D"
    return escape_key(checked_bytes(key, "key"))


def _text_line(head: bytes, text: bytes) -> bytes:
    """``head``, then a space and ``text`` unless it is empty, then CRLF."""
    return b"%s %s\r\n" % (head, text) if text else head + CRLF


def _leader_token(leader: object) -> bytes:
    return b"-" if leader is None else int_bytes(leader, "leader", 0, INT32_MAX)


def encode_reply(reply: Reply) -> bytes:
    """The bytes of one reply line (with ``+DATA``: the line, the payload and CRLF).

    ``ReplyDecoder`` decodes them back into an equal reply. Lines end with CRLF, which every telnet
    client shows correctly. Raises ``LocalProtocolError`` for a reply whose fields break their
    rules (text with CR or LF, a negative offset, ...).
    """
    match reply:
        case MessageRow(partition=partition, offset=offset, key=key, value=value):
            line = b"+MSG %s %s %s" % (
                int_bytes(partition, "partition", 0, INT32_MAX),
                int_bytes(offset, "offset", 0, INT64_MAX),
                _key_token(key),
            )
            if value is None:
                return line + CRLF
            return b"%s %s\r\n" % (line, escape_value(checked_bytes(value, "value")))
        case DataReply(next_offset=next_offset, payload=payload, high_watermark=hw):
            payload = checked_bytes(payload, "payload")
            words = [
                b"+DATA",
                int_bytes(next_offset, "next_offset", 0, INT64_MAX),
                b"%d" % len(payload),
            ]
            words += optional_int(b"hw", hw, 0, INT64_MAX)
            return b"".join((b" ".join(words), CRLF, payload, CRLF))
        case OkReply(text=text):
            return _text_line(b"+OK", text_bytes(text, "text"))
        case ErrorReply(code=code, message=message):
            if not isinstance(code, ErrorCode):
                raise encode_error("code", code, "an ErrorCode")
            return _text_line(b"-ERR " + code.name.encode(), text_bytes(message, "message"))
        case EndReply(next_offsets=pairs):
            return _text_line(b"+END", pairs_bytes(pairs, "next_offsets", allow_empty=True))
        case TopicRow():
            return topic_settings_line(b"+TOPIC", reply, allow_internal=True)
        case PartitionRow(topic=topic, partition=partition, leader=leader, replicas=replicas):
            if type(replicas) is not tuple or not replicas:
                raise encode_error("replicas", replicas, "a non-empty tuple of broker ids")
            words = [
                b"+PARTITION",
                topic_bytes(topic, True),
                int_bytes(partition, "partition", 0, INT32_MAX),
                b"leader=" + _leader_token(leader),
                b"replicas=" + b",".join(int_bytes(r, "replica", 0, INT32_MAX) for r in replicas),
            ]
            words += optional_int(b"start", reply.start_offset, 0, INT64_MAX)
            words += optional_int(b"end", reply.end_offset, 0, INT64_MAX)
            words += optional_int(b"time_offset", reply.time_offset, 0, INT64_MAX)
            return b" ".join(words) + CRLF
        case BrokerRow(broker_id=broker_id, host=host, port=port):
            words = [
                b"+BROKER",
                int_bytes(broker_id, "broker_id", 0, INT32_MAX),
                name_bytes(host, "host"),
                int_bytes(port, "port", 0, 65535),
            ]
            words += optional_int(b"mqtt", reply.mqtt_port, 0, 65535)
            words += optional_int(b"mqtt_tls", reply.mqtt_tls_port, 0, 65535)
            words += optional_int(b"mqtt_ws", reply.mqtt_ws_port, 0, 65535)
            words += optional_int(b"kafka", reply.kafka_port, 0, 65535)
            words += optional_int(b"http", reply.http_port, 0, 65535)
            return b" ".join(words) + CRLF
        case GroupRow():
            return b"+GROUP %s %s %s %s %s %s\r\n" % (
                name_bytes(reply.group, "group"),
                topic_bytes(reply.topic, True),
                int_bytes(reply.partition, "partition", 0, INT32_MAX),
                b"-" if reply.owner is None else name_bytes(reply.owner, "owner"),
                b"-"
                if reply.committed is None
                else int_bytes(reply.committed, "offset", 0, INT64_MAX),
                b"-" if reply.end is None else int_bytes(reply.end, "end", 0, INT64_MAX),
            )
        case GroupStateRow(group=group, topic=topic, state=state, members=members):
            return b"+GROUPSTATE %s %s %s %s\r\n" % (
                name_bytes(group, "group"),
                topic_bytes(topic, True),
                name_bytes(state, "state"),
                int_bytes(members, "members", 0, INT32_MAX),
            )
        case MemberRow(group=group, topic=topic, member=member, partitions=partitions):
            if type(partitions) is not tuple:
                raise encode_error("partitions", partitions, "a tuple of partitions")
            return b"+MEMBER %s %s %s %s\r\n" % (
                name_bytes(group, "group"),
                topic_bytes(topic, True),
                name_bytes(member, "member"),
                b",".join(int_bytes(p, "partition", 0, INT32_MAX) for p in partitions) or b"-",
            )
        case OffsetRow(topic=topic, partition=partition, offset=offset):
            return b"+OFFSET %s %s %s\r\n" % (
                topic_bytes(topic, True),
                int_bytes(partition, "partition", 0, INT32_MAX),
                b"-" if offset is None else int_bytes(offset, "offset", 0, INT64_MAX),
            )
        case AclRow():
            return b"+ACL %s\r\n" % acl_bytes(reply)
        case InfoRow(text=text):
            return _text_line(b"+INFO", text_bytes(text, "text"))
    raise LocalProtocolError(f"not a reply: {reply!r}")
