"""HELP: one usage line and one description per command word.

``COMMAND_WORDS`` lists the words, ``help_replies`` answers ``HELP [command]``, and ``usage`` is
the line the decoder's BAD_ARGS messages quote, so a telnet user who gets a command wrong sees
how to write it.
"""

from __future__ import annotations

from typing import Final

from ._line_errors import LocalProtocolError
from ._line_replies import EndReply, InfoRow

# ---------------------------------------------------------------------------------------------
# Help: one usage line and one description per command word. The BAD_ARGS messages quote the
# usage, so a telnet user who gets a command wrong sees how to write it.

HELP: Final[dict[str, tuple[str, str]]] = {
    "PUBS": (
        "PUBS <topic> <message>",
        'Publish the rest of the line (the seed\'s {"Header","Key","Body"} JSON is understood); '
        "a missing topic is created. Replies +OK <partition> <offset>.",
    ),
    "SUBS": (
        "SUBS <topic> <group> [<partitions>] [session_timeout_ms=<ms>]",
        "Join a consumer group (a missing topic is created); the member lives while this "
        "connection is open (session_timeout_ms: only while it sends CONS or COMMIT that often). "
        "Replies +OK <subscription_id>, then partitions=<got> asked=<partitions> if it got fewer "
        "partitions than asked.",
    ),
    "CONS": (
        "CONS <topic> <subscription_id> <offset>|<p>:<o>,... [max=<n>] [wait_ms=<ms>]",
        "Read through a subscription. Replies +MSG <partition> <offset> <key> <value> rows, "
        "then +END <p>:<next>,... to paste into the next CONS.",
    ),
    "PUB": (
        "PUB <topic> [key=<k>] [partition=<p>] [acks=quorum|leader] "
        "[pid=<id> epoch=<e> seq=<s>] [--] <message>   or   ... bytes=<n> then <n> bytes",
        "Publish one record with a key, partition or producer sequence. Replies +OK <partition> "
        "<offset>.",
    ),
    "PUBB": (
        "PUBB <topic> <partition> <nbytes> [acks=quorum|leader]",
        "Then <nbytes> bytes of an encoded record batch and CRLF. Replies +OK <partition> "
        "<base_offset>.",
    ),
    "FETCH": (
        "FETCH <topic> <partition> <offset> [max_bytes=<n>] [wait_ms=<ms>] [format=batch|text] "
        "[replica=any|local]",
        "Read committed data. Replies +DATA <next_offset> <nbytes> and the bytes, or with "
        "format=text +MSG rows and +END. replica=local reads this broker's own replica (up to "
        "its own commit index), never forwarded.",
    ),
    "LATEST": (
        "LATEST <topic> <key>",
        "The newest committed value of <key> (percent-escaped, as PUB key=) in a compacted "
        "topic, from its partition's leader: a +MSG row then +END, or +END alone if the key has "
        "no value (never written, or deleted by a tombstone or retention).",
    ),
    "CREATE": (
        "CREATE <topic> <partitions> <replication_factor> [retention_ms=<ms>] "
        "[retention_bytes=<n>] [compact=yes|no] [fsync=always|interval|never]",
        "Create a topic (-1 retention: unlimited; fsync: the brokers' --fsync if absent). "
        "Replies +OK.",
    ),
    "ALTER": (
        "ALTER <topic> [partitions=<n>] [retention_ms=<ms>] [retention_bytes=<n>] [compact=yes|no]",
        "Change a live topic: add partitions (never fewer; keys then map by the new count), "
        "retention (-1: unlimited), compaction. Replies +OK.",
    ),
    "LIST": ("LIST", "List the topics: +TOPIC rows, then +END."),
    "DESCRIBE": (
        "DESCRIBE <topic> [time=<ms>]",
        "Describe a topic: a +TOPIC row, +PARTITION rows, then +END. With time=, each row's "
        "time_offset= is the first offset whose record timestamp is >= <ms> (else the end).",
    ),
    "DELETE": ("DELETE <topic>", "Delete a topic. Replies +OK."),
    "COMMIT": (
        "COMMIT <group> <topic> <partition> <offset>",
        "Commit the next offset the group will read. Replies +OK.",
    ),
    "OFFSETS": (
        "OFFSETS <group> <topic>",
        "Read a group's committed offsets: +OFFSET rows, then +END.",
    ),
    "LEAVE": (
        "LEAVE <subscription_id>",
        "Leave the subscription's group now (closing the connection does it too). Replies +OK.",
    ),
    "GROUPS": (
        "GROUPS [<group> [<topic>]]",
        "No argument: the groups, a +GROUPSTATE <group> <topic> <state> <members> row each. With "
        "<group>: per topic it reads (or <topic>), +GROUPSTATE, +MEMBER <group> <topic> <member> "
        "<partitions> rows, +GROUP <group> <topic> <partition> <owner> <committed> <end> rows (- "
        "for none; lag = end - committed). Then +END.",
    ),
    "RESETOFFSETS": (
        "RESETOFFSETS <group> <topic> earliest|latest|offset=<n>|time=<ms> [dry_run=yes]",
        "Move an inactive group's committed offsets on <topic> (backwards too): to each "
        "partition's start, end, <n> (kept within start..end) or first offset at or after <ms>. "
        "+OFFSET rows with the new offsets, then +END. dry_run=yes: only show them.",
    ),
    "DELGROUP": (
        "DELGROUP <group>",
        "Delete an inactive group: its committed offsets on every topic. Replies +OK.",
    ),
    "METADATA": (
        "METADATA [<topic> ...]",
        "Brokers and partition leaders: +BROKER rows, +PARTITION rows, then +END.",
    ),
    "REASSIGN": (
        "REASSIGN <topic> <partition> <broker>,<broker>...",
        "Move a partition's replicas, one broker at a time. Replies +OK once they are these.",
    ),
    "ELECTLEADERS": (
        "ELECTLEADERS [<topic> [<partition>]]",
        "Hand the partitions this broker leads to their preferred replicas now (the first of "
        "their replicas, if caught up). Replies +OK moved=<n> skipped=<m>.",
    ),
    "ADDBROKER": (
        "ADDBROKER <id> <peer_host:port> <controller_host:port>",
        "Admit a broker started with --join to the cluster. Replies +OK.",
    ),
    "REMOVEBROKER": (
        "REMOVEBROKER <id>",
        "Decommission a broker: move its replicas away, take it out of the controller quorum "
        "and the registry. Replies +OK moved=<partitions>; refused if a partition would fall "
        "below its replication factor.",
    ),
    "AUTH": (
        "AUTH SCRAM-SHA-256|PLAIN <base64>",
        "One step of a SASL exchange (docs/security.md). Replies +OK continue <base64> (send "
        "the next step) or +OK authenticated <user> [<base64 server-final>]; a broker with a "
        "users file answers nothing but PING, HELP, QUIT and AUTH before it.",
    ),
    "ACL": (
        "ACL ADD|REMOVE <principal> allow|deny <operation> topic|group|cluster "
        "literal|prefixed <name>   or   ACL LIST [<principal>]",
        "Manage the access rules (principal User:<name> or User:*; operation read, write, "
        "create, delete, alter, describe, commit, admin or all; cluster's name kafka-cluster). "
        "ADD replies +OK, REMOVE +OK removed=<0|1>, LIST +ACL rows then +END.",
    ),
    "HELP": ("HELP [<command>]", "This help."),
    "PING": ("PING", "Replies +OK PONG."),
    "QUIT": ("QUIT", "Replies +OK bye and closes the connection (EXIT does the same)."),
}

COMMAND_WORDS: Final = tuple(HELP)
"""Every command word, in the order HELP lists them."""


def help_replies(command: str | None = None) -> tuple[InfoRow | EndReply, ...]:
    """The reply to ``HELP [command]``: ``+INFO`` rows then ``+END``.

    ``command`` is a word of ``COMMAND_WORDS`` (as ``LineDecoder`` produces it), or None for the
    summary of every command. Raises ``LocalProtocolError`` for an unknown word.
    """
    if command is None:
        rows = [InfoRow(usage) for usage, _ in HELP.values()]
        rows.append(
            InfoRow("One command a line; HELP <command> explains one. See docs/protocol.md.")
        )
        return (*rows, EndReply())
    entry = HELP.get(command)
    if entry is None:
        raise LocalProtocolError(f"no help for unknown command {command!r}")
    return InfoRow(entry[0]), InfoRow(entry[1]), EndReply()


def usage(word: str) -> str:
    return f"usage: {HELP[word][0]}"
