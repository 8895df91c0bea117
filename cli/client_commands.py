"""The client-side commands: ``topic``, ``group``, ``produce``, ``consume`` and ``status``.

They talk to a running cluster through ``kafkaesque.client``, as any program would. The cluster
is found through ``--bootstrap host:port,...`` (default ``$KAFKAESQUE_BOOTSTRAP``, else
``127.0.0.1:9092``); ``--tls-ca FILE`` (or ``--tls``) and ``--user NAME`` (``$KAFKAESQUE_USER``,
the password from ``$KAFKAESQUE_PASSWORD``) connect with TLS and SCRAM (``client_options``).
A failure is one line on stderr (``kafkaesque <command>: CODE: message``) and a non-zero exit:
``main`` maps ``ClientCommandError`` and ``KafkaesqueError`` so.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Container, Iterator, Sequence
from typing import IO, Any, BinaryIO

from kafkaesque.client import (
    Client,
    Consumer,
    ConsumerRecord,
    DeliveryHandle,
    ErrorCode,
    GroupConsumer,
    GroupDescription,
    KafkaesqueError,
    OffsetReset,
    Producer,
    ProducerConfig,
    TopicPartition,
)
from kafkaesque.protocol import (
    Acks,
    Fsync,
    GroupRow,
    PartitionRow,
    TopicRow,
    is_internal_topic,
    topic_name_error,
)

from .client_options import (
    ClientCommandError,
    bootstrap_option,
    client_from_args,
    format_option,
    print_json,
    print_table,
    table_json,
    text_table,
)
from .record_formats import JSON, LineTemplate, record_formatter

PROGRESS_MIN_BYTES = 1024 * 1024
"""Inputs at least this large (a file) get a progress bar on stderr, when stderr is a terminal."""


def add_parsers(commands: Any) -> None:
    """Register ``topic``, ``group``, ``produce``, ``consume`` and ``status`` on ``commands``."""
    _add_topic(commands)
    _add_group(commands)
    _add_produce(commands)
    _add_consume(commands)
    _add_latest(commands)
    status = commands.add_parser(
        "status",
        help="brokers (up or down), then every partition's leader, replicas, offsets and "
        "state (ok, under-replicated, no-leader)",
    )
    bootstrap_option(status)
    status.add_argument("--group", help="also show this consumer group (needs --topic)")
    status.add_argument("--topic", help="the topic the group reads")
    status.add_argument(
        "--internal", action="store_true", help="also show internal topics (__consumer_offsets)"
    )
    status.add_argument(
        "--under-replicated",
        action="store_true",
        help="show only the partitions that are not ok (under-replicated or without a leader)",
    )
    format_option(status)
    status.set_defaults(run=run_status)


def _check_topic(name: str, *, writes: bool) -> str:
    """``name`` if it is a valid topic name for the command (internal names only for reading)."""
    reason = topic_name_error(name, allow_internal=not writes)
    if reason is not None:
        raise ClientCommandError(f"invalid topic name {name!r}: {reason}")
    return name


def _offset(value: int | None) -> str:
    return "-" if value is None else str(value)


# -- topic ---------------------------------------------------------------------------------------


def _add_topic(commands: Any) -> None:
    topic = commands.add_parser("topic", help="create, alter, list, describe or delete topics")
    actions = topic.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = actions.add_parser("create", help="create a topic")
    create.add_argument("name")
    create.add_argument("--partitions", type=int, required=True, help="number of partitions")
    create.add_argument(
        "--replication-factor", type=int, required=True, help="replicas of each partition"
    )
    create.add_argument("--retention-ms", type=int, help="keep records this long (-1: forever)")
    create.add_argument("--retention-bytes", type=int, help="keep this much per partition (-1)")
    create.add_argument("--compact", action="store_true", help="keep the latest record per key")
    create.add_argument(
        "--fsync",
        choices=[f.value for f in Fsync],
        help="this topic's fsync policy (default: each broker's --fsync; docs/operations.md)",
    )
    create.set_defaults(run=run_topic_create)
    alter = actions.add_parser(
        "alter",
        help="change a live topic: add partitions, change retention or compaction",
        description="Change a live topic on every broker, without restart. Partitions can only "
        "be added; keys then map to partitions by the new count, so a key's new records may go "
        "to another partition than its old ones (docs/operations.md).",
    )
    alter.add_argument("name")
    alter.add_argument("--partitions", type=int, help="the new partition count (never fewer)")
    alter.add_argument("--retention-ms", type=int, help="keep records this long (-1: forever)")
    alter.add_argument("--retention-bytes", type=int, help="keep this much per partition (-1)")
    alter.add_argument(
        "--cleanup-policy",
        choices=("delete", "compact"),
        help="delete: only retention removes records; compact: also keep the latest per key",
    )
    alter.set_defaults(run=run_topic_alter)
    listing = actions.add_parser("list", help="list topics (internal ones with --internal)")
    listing.add_argument(
        "--internal", action="store_true", help="also list internal topics (__consumer_offsets)"
    )
    listing.set_defaults(run=run_topic_list)
    offsets = actions.add_parser(
        "offsets",
        help="each partition's earliest and latest offset, or the offset of a time",
        description="Each partition's earliest offset (its log start) and latest (the next "
        "offset to be written, its high watermark); with --time, the first offset stamped at "
        "or after that time (the latest when none is), as consume --from-time starts.",
    )
    offsets.add_argument("name")
    offsets.add_argument(
        "--time",
        metavar="TIME",
        help="milliseconds since the epoch, or ISO 8601 (UTC when it names no zone)",
    )
    offsets.set_defaults(run=run_topic_offsets)
    describe = actions.add_parser("describe", help="a topic's settings and partitions")
    describe.add_argument("name")
    describe.set_defaults(run=run_topic_describe)
    delete = actions.add_parser("delete", help="delete a topic and its data")
    delete.add_argument("name")
    delete.set_defaults(run=run_topic_delete)
    reassign = actions.add_parser(
        "reassign",
        help="move a partition's replicas to these brokers (REASSIGN), first = preferred leader",
        description="Move a partition's replicas to exactly these brokers (the line command "
        "REASSIGN, as kafka-reassign-partitions --execute for one partition): the partition's "
        "leader changes its Raft membership one broker at a time while writes and reads go on. "
        "Returns once the move is done and prints the new replicas; the first broker listed is "
        "the preferred leader (`topic elect-leaders` moves the leadership there at once).",
    )
    reassign.add_argument("name")
    reassign.add_argument("partition", type=int)
    reassign.add_argument("replicas", metavar="BROKER,BROKER,...", help="the new replicas' ids")
    reassign.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        help="seconds to wait for the move (default 120); it goes on after a timeout, "
        "`topic describe` shows when it is done",
    )
    reassign.set_defaults(run=run_topic_reassign)
    elect = actions.add_parser(
        "elect-leaders",
        help="move each partition's leadership to its preferred replica now (ELECTLEADERS)",
        description="Preferred-leader election, as kafka-leader-election --election-type "
        "preferred: every partition (of the topic, or only the partition) whose leader is not "
        "its preferred replica (the first of its replicas) is handed to it now by a Raft "
        "leadership transfer, if that replica is up and caught up. Prints each partition's "
        "leader once the transfers are done (ELECTION: elected, already, or pending: the "
        "preferred replica is down or behind, and the brokers' leader balancing gives the "
        "partition back to it once it is ready).",
    )
    elect.add_argument("name", nargs="?", help="only this topic (default: every topic)")
    elect.add_argument("partition", nargs="?", type=int, help="only this partition of it")
    elect.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        help="seconds to wait for the new leaders (default 10)",
    )
    elect.set_defaults(run=run_topic_elect_leaders)
    for parser in (create, alter, listing, offsets, describe, delete, reassign, elect):
        bootstrap_option(parser)
    format_option(elect)
    for parser in (listing, offsets, describe):
        format_option(parser)


def run_topic_create(args: argparse.Namespace) -> int:
    _check_topic(args.name, writes=True)
    with client_from_args(args) as client:
        client.create_topic(
            args.name,
            args.partitions,
            args.replication_factor,
            retention_ms=args.retention_ms,
            retention_bytes=args.retention_bytes,
            compact=args.compact,
            fsync=None if args.fsync is None else Fsync(args.fsync),
        )
    print(
        f"created topic {args.name}: {args.partitions} partitions, "
        f"replication factor {args.replication_factor}"
    )
    return 0


def run_topic_alter(args: argparse.Namespace) -> int:
    _check_topic(args.name, writes=True)
    compact = None if args.cleanup_policy is None else args.cleanup_policy == "compact"
    asked = (args.partitions, args.retention_ms, args.retention_bytes, compact)
    if asked == (None, None, None, None):
        raise ClientCommandError(
            "nothing to change: give --partitions, --retention-ms, --retention-bytes or "
            "--cleanup-policy"
        )
    if args.partitions is not None and args.partitions < 1:
        raise ClientCommandError(f"--partitions must be at least 1, not {args.partitions}")
    for flag, value in (
        ("--retention-ms", args.retention_ms),
        ("--retention-bytes", args.retention_bytes),
    ):
        if value is not None and value < -1:
            raise ClientCommandError(f"{flag} must be -1 (unlimited) or more, not {value}")
    with client_from_args(args) as client:
        changed = client.alter_topic(
            args.name,
            partitions=args.partitions,
            retention_ms=args.retention_ms,
            retention_bytes=args.retention_bytes,
            compact=compact,
        )
        topic = client.describe_topic(args.name).topic
    print(f"{'altered' if changed else 'unchanged'} topic {args.name}: {_settings(topic)}")
    return 0


def _broker_ids(text: str) -> tuple[int, ...]:
    """``1,2,3`` as broker ids (each listed once), or a clear error."""
    try:
        ids = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ClientCommandError(
            f"replicas {text!r} must be broker ids separated by commas, e.g. 1,2,3"
        ) from None
    if any(i < 0 for i in ids):
        raise ClientCommandError(f"replicas {text!r}: a broker id is never negative")
    if len(set(ids)) != len(ids):
        raise ClientCommandError(f"replicas {text!r}: a broker is listed twice")
    return ids


def run_topic_reassign(args: argparse.Namespace) -> int:
    """``topic reassign <topic> <partition> <brokers>``: REASSIGN, then the replicas it made."""
    _check_topic(args.name, writes=True)
    if args.partition < 0:
        raise ClientCommandError(f"partition must be 0 or more, not {args.partition}")
    replicas = _broker_ids(args.replicas)
    if not args.timeout > 0:
        raise ClientCommandError(f"--timeout must be more than 0, not {args.timeout}")
    with client_from_args(args) as client:
        partitions = client.describe_topic(args.name).partitions
        if args.partition >= len(partitions):
            raise ClientCommandError(
                f"topic {args.name} has no partition {args.partition} "
                f"(it has {len(partitions)}: 0-{len(partitions) - 1})"
            )
        unknown = sorted(set(replicas) - set(client.refresh_metadata().brokers))
        if unknown:
            raise ClientCommandError(
                f"no broker {','.join(map(str, unknown))} is registered "
                "(`kafkaesque status` lists the brokers; `broker add` admits a new one)"
            )
        before = partitions[args.partition]
        try:
            client.reassign(args.name, args.partition, replicas, wait_s=args.timeout)
        except KafkaesqueError as exc:
            if exc.code is ErrorCode.TIMEOUT:
                raise ClientCommandError(
                    f"{exc}; the move goes on: `kafkaesque topic describe {args.name}` shows "
                    "the replicas once it is done"
                ) from exc
            raise
        after = client.describe_topic(args.name).partitions[args.partition]
    print(
        f"reassigned {args.name} partition {args.partition}: replicas "
        f"{','.join(map(str, before.replicas))} -> {','.join(map(str, after.replicas))} "
        f"(leader {_offset(after.leader)})"
    )
    return 0


_ELECT_POLL_S = 0.1


def run_topic_elect_leaders(args: argparse.Namespace) -> int:
    """``topic elect-leaders [topic [partition]]``: ELECTLEADERS on every broker, then a table
    of the partitions named, their leader and preferred replica, once they match (or at
    ``--timeout``)."""
    if args.name is not None:
        _check_topic(args.name, writes=False)
    if args.partition is not None and args.partition < 0:
        raise ClientCommandError(f"partition must be 0 or more, not {args.partition}")
    if not args.timeout > 0:
        raise ClientCommandError(f"--timeout must be more than 0, not {args.timeout}")

    def selected(client: Client) -> list[PartitionRow]:
        if args.name is None:
            partitions = client.refresh_metadata().partitions
            return [row for topic in sorted(partitions) for row in partitions[topic]]
        rows = client.describe_topic(args.name).partitions
        if args.partition is None:
            return list(rows)
        if args.partition >= len(rows):
            raise ClientCommandError(
                f"topic {args.name} has no partition {args.partition} (it has {len(rows)})"
            )
        return [rows[args.partition]]

    def preferred(row: PartitionRow) -> int | None:
        return row.replicas[0] if row.replicas else None

    with client_from_args(args) as client:
        before = {(r.topic, r.partition): r.leader == preferred(r) for r in selected(client)}
        client.elect_leaders(args.name, args.partition)
        deadline = time.monotonic() + args.timeout
        while True:
            rows = selected(client)
            if all(r.leader == preferred(r) for r in rows) or time.monotonic() > deadline:
                break
            time.sleep(_ELECT_POLL_S)
    table = []
    for r in rows:
        if r.leader == preferred(r):
            election = "already" if before.get((r.topic, r.partition)) else "elected"
        else:
            election = "pending"
        table.append((r.topic, r.partition, r.leader, preferred(r), election))
    print_table(args, ("TOPIC", "PARTITION", "LEADER", "PREFERRED", "ELECTION"), table)
    pending = sum(1 for row in table if row[-1] == "pending")
    if pending:
        print(
            f"{pending} partition(s) not on their preferred replica: it is down or behind; "
            "the brokers give them back once it is ready (docs/operations.md, leader balancing)",
            file=sys.stderr,
        )
    return 0


def _settings(t: TopicRow) -> str:
    """A ``TopicRow``'s settings as ``topic describe`` prints them."""
    settings = [f"partitions={t.partitions}", f"replication_factor={t.replication_factor}"]
    settings += [f"retention_ms={_offset(t.retention_ms)}"]
    settings += [f"retention_bytes={_offset(t.retention_bytes)}"]
    settings += [f"compact={'yes' if t.compact else 'no'}"]  # as `topic list` says it
    settings += [f"fsync={'broker' if t.fsync is None else t.fsync.value}"]
    return " ".join(settings)


def run_topic_list(args: argparse.Namespace) -> int:
    with client_from_args(args) as client:
        topics = client.list_topics()
    rows = [_topic_row(t) for t in topics if args.internal or not is_internal_topic(t.topic)]
    print_table(args, TOPIC_HEADER, rows)
    return 0


TOPIC_HEADER = (
    "TOPIC",
    "PARTITIONS",
    "REPLICATION",
    "RETENTION_MS",
    "RETENTION_BYTES",
    "COMPACT",
    "FSYNC",
)
"""``topic list``'s columns (and the keys of its JSON, in lower case)."""


def _topic_row(t: TopicRow) -> tuple[object, ...]:
    fsync = "broker" if t.fsync is None else t.fsync.value
    return (t.topic, t.partitions, t.replication_factor, t.retention_ms, t.retention_bytes,
            t.compact, fsync)  # fmt: skip


def run_topic_offsets(args: argparse.Namespace) -> int:
    """``topic offsets``: PARTITION EARLIEST LATEST, and OFFSET (the time's) with ``--time``."""
    _check_topic(args.name, writes=False)
    when = None if args.time is None else parse_time_ms(args.time, option="--time")
    with client_from_args(args) as client:
        bounds = client.partition_offsets(args.name)
        at = (
            {} if when is None else client.offsets_for_times({(args.name, p): when for p in bounds})
        )
    header = ("PARTITION", "EARLIEST", "LATEST") + (("OFFSET",) if when is not None else ())
    rows = [
        (p, start, end, *(() if when is None else (at[TopicPartition(args.name, p)],)))
        for p, (start, end) in sorted(bounds.items())
    ]
    print_table(args, header, rows)
    return 0


def run_topic_describe(args: argparse.Namespace) -> int:
    _check_topic(args.name, writes=False)
    with client_from_args(args) as client:
        description = client.describe_topic(args.name)
    t = description.topic
    if args.format == JSON:
        topic = table_json(TOPIC_HEADER, [_topic_row(t)])[0]
        rows = _partition_rows(description.partitions, with_topic=False)
        print_json({"topic": topic, "partitions": table_json(PARTITION_HEADER, rows)})
        return 0
    print(f"topic {t.topic}: {_settings(t)}")
    _print_partitions(description.partitions, with_topic=False)
    return 0


def run_topic_delete(args: argparse.Namespace) -> int:
    _check_topic(args.name, writes=True)
    with client_from_args(args) as client:
        client.delete_topic(args.name)
    print(f"deleted topic {args.name}")
    return 0


PARTITION_HEADER = ("PARTITION", "LEADER", "REPLICAS", "START", "END")


def _partition_rows(rows: Sequence[Any], *, with_topic: bool) -> list[tuple[object, ...]]:
    return [
        (row.topic,) * with_topic
        + (row.partition, row.leader, tuple(row.replicas), row.start_offset, row.end_offset)
        for row in rows
    ]


def _print_partitions(rows: Sequence[Any], *, with_topic: bool) -> None:
    header = ("TOPIC",) * with_topic + PARTITION_HEADER
    for line in text_table(header, _partition_rows(rows, with_topic=with_topic)):
        print(line)


# -- group ---------------------------------------------------------------------------------------


def _add_group(commands: Any) -> None:
    group = commands.add_parser(
        "group",
        help="list, describe, reset the offsets of or delete consumer groups",
        description="Consumer group admin, as Kafka's kafka-consumer-groups.sh: a reset or a "
        "delete is refused while the group has live members (stop its consumers first).",
    )
    actions = group.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="every group, with its state and member count")
    listing.set_defaults(run=run_group_list)
    describe = actions.add_parser(
        "describe", help="a group's state, members and per-partition offsets and lag"
    )
    describe.add_argument("name", nargs="?", help="the group (or --all-groups)")
    describe.add_argument(
        "--all-groups", action="store_true", help="every group (with --topic: every one reading it)"
    )
    describe.add_argument("--topic", help="only this topic (default: every topic it reads)")
    describe.set_defaults(run=run_group_describe)
    reset = actions.add_parser(
        "reset",
        help="move an inactive group's committed offsets on a topic",
        description="Move an inactive group's committed offsets on every partition of a topic "
        "(backwards too) and print them. As Kafka's, without --execute it only prints where "
        "they would go (a dry run: the same checks, nothing changed).",
    )
    reset.add_argument("name", nargs="?", help="the group (or --all-groups)")
    reset.add_argument("--all-groups", action="store_true", help="every group that reads --topic")
    reset.add_argument("--topic", required=True, help="the topic whose offsets move")
    to = reset.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-earliest", action="store_true", help="each partition's start")
    to.add_argument("--to-latest", action="store_true", help="each partition's end")
    to.add_argument(
        "--to-offset", type=int, help="this offset (kept within each partition's start..end)"
    )
    to.add_argument(
        "--to-datetime",
        help="the first offset at or after this time: milliseconds since the epoch, or ISO "
        "8601 (UTC when it names no zone)",
    )
    to.add_argument(
        "--to-current",
        action="store_true",
        help="the committed offsets as they are (a partition with none: its end), as Kafka's",
    )
    to.add_argument(
        "--shift-by",
        type=int,
        metavar="N",
        help="each committed offset plus N (negative: back), kept within start..end",
    )
    to.add_argument(
        "--by-duration",
        metavar="PnDTnHnMnS",
        help="the first offset at or after this long ago (ISO 8601 duration, as Kafka's: "
        "PT1H, P1DT30M)",
    )
    reset.add_argument(
        "--execute", action="store_true", help="apply the reset (without it: a dry run)"
    )
    reset.set_defaults(run=run_group_reset)
    delete = actions.add_parser("delete", help="delete an inactive group (its committed offsets)")
    delete.add_argument("name")
    delete.set_defaults(run=run_group_delete)
    for parser in (listing, describe, reset, delete):
        bootstrap_option(parser)
    for parser in (listing, describe, reset):
        format_option(parser)


def run_group_list(args: argparse.Namespace) -> int:
    with client_from_args(args) as client:
        groups = client.list_groups()
    rows = [(g.group, g.topic, g.state, g.members) for g in groups]
    print_table(args, ("GROUP", "TOPIC", "STATE", "MEMBERS"), rows)
    return 0


def _group_names(
    client: Client, args: argparse.Namespace, topic: str | None, *, some: bool = True
) -> list[str]:
    """The group the command names, or with ``--all-groups`` every group (reading ``topic``);
    none is an error if ``some`` (a reset of every group), else an empty list (describe)."""
    if args.all_groups == (args.name is not None):
        raise ClientCommandError("name a group or give --all-groups (not both)")
    if args.name is not None:
        return [args.name]
    names = sorted({g.group for g in client.list_groups() if topic in (None, g.topic)})
    if not names and some:
        raise ClientCommandError(
            "there are no consumer groups" + ("" if topic is None else f" reading {topic}")
        )
    return names


def run_group_describe(args: argparse.Namespace) -> int:
    topic = None if args.topic is None else _check_topic(args.topic, writes=False)
    descriptions: list[GroupDescription] = []
    with client_from_args(args) as client:
        for name in _group_names(client, args, topic, some=False):
            try:
                descriptions += client.describe_consumer_group(name, topic)
            except KafkaesqueError as exc:
                # --all-groups: a group deleted since the list is gone, not an error.
                if not args.all_groups or exc.code is not ErrorCode.UNKNOWN_GROUP:
                    raise
    if args.format == JSON:
        print_json([_group_json(d) for d in descriptions])
        return 0
    for i, d in enumerate(descriptions):
        if i:
            print()
        s = d.state
        print(f"group {s.group} on {s.topic}: {s.state}, {s.members} member(s)")
        if d.members:
            for line in text_table(MEMBER_HEADER, _member_rows(d)):
                print(line)
        for line in text_table(GROUP_HEADER, _group_rows(d.partitions)):
            print(line)
    return 0


MEMBER_HEADER = ("MEMBER", "PARTITIONS")
GROUP_HEADER = ("PARTITION", "OWNER", "COMMITTED", "END", "LAG")


def _member_rows(d: GroupDescription) -> list[tuple[object, ...]]:
    return [(m.member, tuple(m.partitions)) for m in d.members]


def _group_rows(rows: Sequence[GroupRow]) -> list[tuple[object, ...]]:
    return [(g.partition, g.owner or None, g.committed, g.end, _lag(g)) for g in rows]


def _group_json(d: GroupDescription) -> dict[str, object]:
    """A group on a topic as ``group describe --format json`` prints it."""
    s = d.state
    return {
        "group": s.group,
        "topic": s.topic,
        "state": s.state,
        "members": table_json(MEMBER_HEADER, _member_rows(d)),
        "partitions": table_json(GROUP_HEADER, _group_rows(d.partitions)),
    }


def _reset_target(args: argparse.Namespace) -> tuple[str, int | None]:
    """``(kind, value)`` of ``group reset``'s ``--to-*`` option: a ``RESETOFFSETS`` kind, or
    ``current`` / ``shift`` (``value`` N), which ``_reset_from_committed`` does."""
    if args.to_current:
        return "current", None
    if args.shift_by is not None:
        return "shift", args.shift_by
    if args.to_earliest:
        return "earliest", None
    if args.to_latest:
        return "latest", None
    if args.to_offset is not None:
        if args.to_offset < 0:
            raise ClientCommandError(f"--to-offset {args.to_offset} is negative")
        return "offset", args.to_offset
    if args.by_duration is not None:
        return "time", max(0, int(time.time() * 1000) - parse_duration_ms(args.by_duration))
    try:
        return "time", parse_time_ms(args.to_datetime)
    except ClientCommandError as exc:  # its message names --from-time, the consume option
        raise ClientCommandError(
            f"--to-datetime {args.to_datetime!r} is neither milliseconds since the epoch nor "
            "ISO 8601 (2026-11-26T08:00:00Z), or is before 1970"
        ) from exc


_DURATION = re.compile(
    r"P(?:(?P<d>\d+)D)?(?:T(?=\d)(?:(?P<h>\d+)H)?(?:(?P<m>\d+)M)?(?:(?P<s>\d+(?:\.\d+)?)S)?)?"
)


def parse_duration_ms(text: str) -> int:
    """``--by-duration``: an ISO 8601 duration of days, hours, minutes and seconds
    (``PnDTnHnMnS``, as kafka-consumer-groups takes), in milliseconds."""
    found = _DURATION.fullmatch(text.upper())
    if found is None or text.upper() in ("P", "PT"):
        raise ClientCommandError(
            f"--by-duration {text!r} is not an ISO 8601 duration (PT1H, P1DT30M, PT90S)"
        )
    d, h, m, sec = (float(found[k] or 0) for k in "dhms")
    return int(((d * 24 + h) * 60 + m) * 60_000 + sec * 1000)


def run_group_reset(args: argparse.Namespace) -> int:
    topic = _check_topic(args.topic, writes=False)
    kind, value = _reset_target(args)
    rows = []
    with client_from_args(args) as client:
        for name in _group_names(client, args, topic):
            if kind in ("current", "shift"):
                offsets = _reset_from_committed(client, name, topic, value, execute=args.execute)
            else:
                offsets = client.reset_offsets(name, topic, kind, value, dry_run=not args.execute)
            rows += [(name, topic, p, o) for p, o in sorted(offsets.items())]
    print_table(args, ("GROUP", "TOPIC", "PARTITION", "NEW_OFFSET"), rows)
    if not args.execute:  # as Kafka warns when --execute is missing
        print("dry run: nothing was changed; add --execute to apply", file=sys.stderr)
    return 0


def _reset_from_committed(
    client: Client, group: str, topic: str, shift: int | None, *, execute: bool
) -> dict[int, int]:
    """``--to-current`` (``shift`` None) or ``--shift-by shift``: each partition's new offset,
    from its committed one, kept within the partition's start and end; written if ``execute``.

    As Kafka's: ``--to-current`` puts a partition without a commit at its end, ``--shift-by``
    refuses one (there is nothing to shift). ``RESETOFFSETS`` sets one offset on every
    partition, so the write is two steps: a reset to the lowest new offset (which refuses a
    group with members, ``GROUP_NOT_EMPTY``, as every reset does), then a ``COMMIT`` forward
    for each partition meant to be further on (commits only move forward).
    """
    committed = client.committed_offsets(group, topic)
    bounds = client.partition_offsets(topic)
    targets: dict[int, int] = {}
    for partition, (start, end) in sorted(bounds.items()):
        current = committed.get(partition)
        if current is None and shift is not None:
            raise ClientCommandError(
                f"group {group} has no committed offset on {topic} partition {partition} to "
                "shift: place one with --to-earliest, --to-latest or --to-offset"
            )
        wanted = end if current is None else current + (shift or 0)
        targets[partition] = min(max(wanted, start), end)
    lowest = min(targets.values(), default=0)
    placed = client.reset_offsets(group, topic, "offset", lowest, dry_run=not execute)
    if execute:
        for partition, offset in sorted(targets.items()):
            if placed.get(partition, offset) < offset:
                client.commit(group, topic, partition, offset)
    return targets


def run_group_delete(args: argparse.Namespace) -> int:
    with client_from_args(args) as client:
        client.delete_group(args.name)
    print(f"deleted group {args.name}")
    return 0


# -- status --------------------------------------------------------------------------------------


def run_status(args: argparse.Namespace) -> int:
    if args.group and not args.topic:
        raise ClientCommandError("--group needs --topic")
    with client_from_args(args) as client:
        # The group first: one that does not exist is an error before anything is printed.
        group = (
            client.describe_group(args.group, _check_topic(args.topic, writes=False))
            if args.group
            else None
        )
        metadata = client.refresh_metadata()
        rows = [row for topic in sorted(metadata.partitions) for row in metadata.partitions[topic]]
        if any(r.start_offset is None or r.end_offset is None for r in rows):
            rows = [
                row
                for topic in sorted(metadata.partitions)
                for row in client.describe_topic(topic).partitions
            ]
        probes = client.probe_brokers(PROBE_TIMEOUT_S)
    if not args.internal:
        rows = [row for row in rows if not is_internal_topic(row.topic)]
    down = {broker for broker, error in probes.items() if error is not None}
    leads = Counter(row.leader for row in rows if row.leader is not None)  # LEADERS column
    brokers = [
        (
            b.broker_id,
            b.host,
            b.port,
            b.mqtt_port,
            b.mqtt_tls_port,
            b.mqtt_ws_port,
            leads.get(b.broker_id, 0),
            "down" if b.broker_id in down else "up",
        )
        for _, b in sorted(metadata.brokers.items())
    ]
    states = [partition_state(row, down) for row in rows]
    if args.under_replicated:
        kept = [(row, state) for row, state in zip(rows, states, strict=True) if state != "ok"]
        rows, states = [row for row, _ in kept], [state for _, state in kept]
    partition_table = [
        (
            row.topic,
            row.partition,
            row.leader,
            tuple(row.replicas),
            row.start_offset,
            row.end_offset,
            tuple(r for r in row.replicas if r not in down),
            state,
        )
        for row, state in zip(rows, states, strict=True)
    ]
    group_table = None if group is None else _group_rows(group)
    if args.format == JSON:
        document: dict[str, object] = {
            "brokers": table_json(BROKER_HEADER, brokers),
            "partitions": table_json(STATUS_PARTITION_HEADER, partition_table),
        }
        if group_table is not None:
            document["group"] = {
                "group": args.group,
                "topic": args.topic,
                "partitions": table_json(GROUP_HEADER, group_table),
            }
        print_json(document)
        return 0
    print(f"brokers ({len(brokers)}{f', {len(down)} down' if down else ''})")
    for line in text_table(BROKER_HEADER, brokers):
        print(line)
    print()
    under = sum("under-replicated" in state for state in states)
    print(f"partitions ({len(rows)}{f', {under} under-replicated' if under else ''})")
    for line in text_table(STATUS_PARTITION_HEADER, partition_table):
        print(line)
    if group_table is not None:
        print()
        print(f"group {args.group} on {args.topic}")
        for line in text_table(GROUP_HEADER, group_table):
            print(line)
    return 0


BROKER_HEADER = ("ID", "HOST", "PORT", "MQTT", "MQTT_TLS", "MQTT_WS", "LEADERS", "STATE")
STATUS_PARTITION_HEADER = (
    "TOPIC", "PARTITION", "LEADER", "REPLICAS", "START", "END", "LIVE", "STATE"
)  # fmt: skip


PROBE_TIMEOUT_S = 1.0
"""``status`` shows a broker as down when it does not answer ``PING`` within this long."""


def partition_state(row: PartitionRow, down: Container[int]) -> str:
    """``ok``, or what is wrong with the partition when the brokers in ``down`` are down.

    ``under-replicated``: fewer of its replicas are live than it has (the replication factor):
    one more failure may stop it. ``no-leader``: no leader is known, or the one the metadata
    names is down; writes wait for an election. Both may hold (``no-leader,under-replicated``).
    Words without spaces, so that the column stays one word for ``awk``.
    """
    problems = []
    if row.leader is None or row.leader in down:
        problems.append("no-leader")
    if any(replica in down for replica in row.replicas):
        problems.append("under-replicated")
    return ",".join(problems) or "ok"


def _lag(row: GroupRow) -> int | None:
    return None if row.end is None else row.end - (row.committed or 0)


# -- produce -------------------------------------------------------------------------------------


def _add_produce(commands: Any) -> None:
    produce = commands.add_parser(
        "produce",
        help="publish stdin (or a file), one record per line, with a batching producer; "
        "records without --key go to the partitions in turn (round-robin)",
    )
    produce.add_argument("topic")
    produce.add_argument("--key", help="the key of every record (picks their partition)")
    produce.add_argument("--partition", type=int, help="publish to this partition")
    produce.add_argument("--file", help="read this file instead of stdin")
    produce.add_argument(
        "-f",
        "--format",
        metavar="TEMPLATE",
        help="read each line's key, headers and partition too, by an rpk-style template: %%k "
        "key (empty: none), %%v value, %%h headers (name=value,...), %%p partition, text "
        "between them as it is (-f '%%k %%v'); a line that does not match is not sent, and "
        "counted as an error",
    )
    produce.add_argument(
        "--acks", choices=[a.value for a in Acks], default=Acks.QUORUM.value, help="(quorum)"
    )
    produce.add_argument("--linger-ms", type=float, default=5.0, help="batch wait (5)")
    produce.add_argument("--batch-size", type=int, default=64 * 1024, help="batch bytes (65536)")
    bootstrap_option(produce)
    produce.set_defaults(run=run_produce)


class Progress:
    """A one-line progress bar on a terminal: redrawn at most ten times a second."""

    WIDTH = 30

    def __init__(self, stream: IO[str], total_bytes: int | None) -> None:
        self._stream = stream
        self._total = total_bytes
        self._started = time.monotonic()
        self._drawn = 0.0

    def update(self, records: int, done_bytes: int, *, final: bool = False) -> None:
        now = time.monotonic()
        if not final and now - self._drawn < 0.1:
            return
        self._drawn = now
        rate = records / max(now - self._started, 1e-9)
        text = f"{records:,} records, {rate:,.0f}/s"
        if self._total:
            share = min(done_bytes / self._total, 1.0)
            filled = int(share * self.WIDTH)
            text = f"[{'#' * filled}{'.' * (self.WIDTH - filled)}] {share:4.0%} {text}"
        self._stream.write(f"\r{text}")
        if final:
            self._stream.write("\n")
        self._stream.flush()


def _lines(stream: BinaryIO) -> Iterator[bytes]:
    for line in stream:
        if line.endswith(b"\n"):
            line = line[:-2] if line.endswith(b"\r\n") else line[:-1]
        yield line


def run_produce(args: argparse.Namespace) -> int:
    _check_topic(args.topic, writes=True)
    key = None if args.key is None else os.fsencode(args.key)
    template = None if args.format is None else LineTemplate(args.format)
    if template is not None:
        for letter, flag, given in (("k", "--key", args.key), ("p", "--partition", args.partition)):
            if letter in template.fields and given is not None:
                raise ClientCommandError(f"{flag} cannot be used with %{letter} in -f")
    # Unkeyed lines go round-robin, record by record, as the seed and the broker's PUBS do: a
    # short burst (``seq 1000``) spreads over every partition instead of filling one batch.
    config = ProducerConfig(
        linger_ms=args.linger_ms,
        batch_size=args.batch_size,
        acks=Acks(args.acks),
        partitioner="round-robin",
    )
    try:
        source: BinaryIO = open(args.file, "rb") if args.file else sys.stdin.buffer  # noqa: SIM115
    except OSError as exc:
        raise ClientCommandError(f"cannot read {args.file}: {exc.strerror}") from exc
    total = os.fstat(source.fileno()).st_size if args.file else None
    progress = None
    if sys.stderr.isatty() and total is not None and total >= PROGRESS_MIN_BYTES:
        progress = Progress(sys.stderr, total)
    delivered: Counter[int] = Counter()
    failures: list[KafkaesqueError] = []

    def settled(handle: DeliveryHandle) -> None:
        error = handle.exception()
        if error is None:
            delivered[handle.result().partition] += 1
        else:
            failures.append(error)

    started = time.monotonic()
    records = read_bytes = 0
    unmatched: list[int] = []  # line numbers that did not match -f
    with client_from_args(args) as client, source, Producer(client, config) as producer:
        for number, line in enumerate(_lines(source), 1):
            read_bytes += len(line) + 1
            records += 1
            if template is None:
                future = producer.send(args.topic, line, key, partition=args.partition)
            elif (parsed := template.parse(line)) is None:
                unmatched.append(number)
                continue
            else:
                future = producer.send(
                    args.topic,
                    parsed.value,
                    parsed.key if "k" in template.fields else key,
                    partition=parsed.partition if "p" in template.fields else args.partition,
                    headers=parsed.headers,
                )
            future.handle.add_done_callback(settled)
            if progress is not None:
                progress.update(records, read_bytes)
        producer.flush()
    if progress is not None:
        progress.update(records, read_bytes, final=True)
    elapsed = time.monotonic() - started
    spread = ", ".join(f"{p}:{n}" for p, n in sorted(delivered.items())) or "-"
    print(
        f"produced {sum(delivered.values()):,} of {records:,} records to {args.topic} "
        f"in {elapsed:.2f} s ({records / max(elapsed, 1e-9):,.0f} records/s); "
        f"partition:records {spread}"
    )
    if unmatched:
        raise ClientCommandError(
            f"{len(unmatched):,} line{'s' * (len(unmatched) > 1)} did not match -f "
            f"{args.format!r} and {'were' if len(unmatched) > 1 else 'was'} not sent; the first: "
            f"line {unmatched[0]}"
        )
    if failures:
        raise ClientCommandError(f"{len(failures):,} records failed; the first: {failures[0]}")
    return 0


# -- consume -------------------------------------------------------------------------------------

LONG_FORMAT = "{partition} {offset} {key} {value}"
"""``--long``: where each record is, then what it holds (a missing key prints as -)."""

RECORD_FORMAT_HELP = (
    "how to print a record: json (an object a line); an rpk-style template (%%t topic, %%p "
    "partition, %%o offset, %%d timestamp, %%k key, %%v value, %%h headers, \\n newline: "
    "-f '%%k %%v\\n'); or {topic} {partition} {offset} {key} {value} {timestamp} {headers} "
    "and a newline (default: {value}; a missing key prints as -)"
)


def _add_consume(commands: Any) -> None:
    consume = commands.add_parser(
        "consume",
        help="print a topic's records, one value per line (or --format), waiting for new ones "
        "until Ctrl-C (-e: exit at the end)",
        description="Print a topic's records, one value per line (or --format). As "
        "kafka-console-consumer and rpk, it keeps waiting for new records until Ctrl-C, --max "
        "records, or, with -e (--no-wait), the end of what each partition holds when reached.",
    )
    consume.add_argument("topic")
    start = consume.add_mutually_exclusive_group()
    start.add_argument(
        "--from-beginning", action="store_true", help="start at the oldest record (else: the end)"
    )
    start.add_argument(
        "-o",
        "--offset",
        type=_start_offset,
        metavar="N|-N|@TIME",
        help="start at offset N; -N: at the last N records of each partition; @TIME: as "
        "--from-time",
    )
    start.add_argument(
        "--from-time",
        metavar="TIME",
        help="start at the first record stamped at or after TIME: milliseconds since the epoch, "
        "or ISO 8601 (2026-11-26T08:00:00+01:00; UTC when it names no zone)",
    )
    consume.add_argument("--partition", type=int, help="only this partition (else: all)")
    consume.add_argument("--group", help="read through this consumer group and commit offsets")
    ending = consume.add_mutually_exclusive_group()
    ending.add_argument(
        "-e",
        "--no-wait",
        action="store_false",
        dest="follow",
        help="exit at the end of each partition (the high watermark when it is reached) instead "
        "of waiting for new records",
    )
    ending.add_argument(
        "--follow",
        action="store_true",
        dest="follow",
        default=True,
        help="wait for new records until Ctrl-C (the default, as kafka-console-consumer and "
        "rpk do)",
    )
    consume.add_argument("--max", type=int, help="stop after this many records")
    shape = consume.add_mutually_exclusive_group()
    shape.add_argument(
        "-l",
        "--long",
        action="store_const",
        const=LONG_FORMAT,
        dest="format",
        default="{value}",  # the first action of a dest gives its default
        help="print `partition offset key value` for each record",
    )
    shape.add_argument("-f", "--format", default="{value}", help=RECORD_FORMAT_HELP)
    bootstrap_option(consume)
    consume.set_defaults(run=run_consume)


# -- latest --------------------------------------------------------------------------------------

NO_VALUE_EXIT = 3
"""``latest``'s exit status when the key has no value (1 is an error, 0 a value printed)."""


def _add_latest(commands: Any) -> None:
    latest = commands.add_parser(
        "latest",
        help="print the newest value of a key in a compacted topic (LATEST), e.g. a device's "
        "last heartbeat",
    )
    latest.add_argument("topic", help="a compacted topic")
    latest.add_argument("key", help="the key (as text, UTF-8)")
    shape = latest.add_mutually_exclusive_group()
    shape.add_argument(
        "-l",
        "--long",
        action="store_const",
        const=LONG_FORMAT,
        dest="format",
        default="{value}",
        help="print `partition offset key value`",
    )
    shape.add_argument("-f", "--format", default="{value}", help=RECORD_FORMAT_HELP)
    bootstrap_option(latest)
    latest.set_defaults(run=run_latest)


def run_latest(args: argparse.Namespace) -> int:
    """Print the key's newest value; exit ``NO_VALUE_EXIT`` (a line on stderr) if it has none."""
    _check_topic(args.topic, writes=False)
    key = args.key.encode()
    if not key:
        raise ClientCommandError("the key must not be empty")
    render = record_formatter(args.format)
    with client_from_args(args) as client:
        record = client.latest(args.topic, key)
    if record is None:
        print(
            f"kafkaesque latest: {args.topic}: no value for key {args.key!r} (never written, "
            "or deleted by a tombstone or retention)",
            file=sys.stderr,
        )
        return NO_VALUE_EXIT
    sys.stdout.buffer.write(render(record))
    sys.stdout.buffer.flush()
    return 0


def run_consume(args: argparse.Namespace) -> int:
    _check_topic(args.topic, writes=False)
    if args.max is not None and args.max < 1:
        raise ClientCommandError("--max must be at least 1")
    if args.group and args.partition is not None:
        raise ClientCommandError("--partition cannot be used with --group (the group assigns)")
    if isinstance(args.offset, str):  # -o @TIME
        args.from_time, args.offset = args.offset, None
    from_time = None if args.from_time is None else parse_time_ms(args.from_time)
    if args.group and args.offset is not None and args.offset < 0:
        raise ClientCommandError(
            f"--offset {args.offset} (the last records) cannot be used with --group"
        )
    if args.group and from_time is not None:
        raise ClientCommandError(
            "--from-time cannot be used with --group (a group reads from its committed offsets)"
        )
    printer = _Printer(record_formatter(args.format), args.max, flush=args.follow)
    status = 0
    try:
        with client_from_args(args) as client:
            if args.group:
                _consume_group(client, args, printer)
            else:
                _consume_partitions(client, args, printer, from_time)
            sys.stdout.buffer.flush()
    except BrokenPipeError:
        # The reader (e.g. ``head``) went away: stop quietly, as ``cat`` does.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except KeyboardInterrupt:
        # Ctrl-C is how a waiting consume ends: say what it read (as kafka-console-consumer's
        # "Processed a total of N messages"), with the shell's status for SIGINT.
        status = INTERRUPTED_EXIT
    print(consumed_summary(printer.seen, hint=args.format == "{value}"), file=sys.stderr)
    return status


INTERRUPTED_EXIT = 130
"""``consume``'s exit status when Ctrl-C ended it (128 + SIGINT, as ``main``'s)."""


def consumed_summary(seen: dict[int, tuple[int, int, int]], *, hint: bool) -> str:
    """The line ``consume`` ends with, on stderr: how many records, from which partitions.

    ``seen`` maps partition -> (records, first offset, last offset). Records of several
    partitions interleave in the output (each partition's own are in offset order), so that is
    said when it happened, with ``hint`` adding how to see each record's place (``--long``)."""
    total = sum(count for count, _, _ in seen.values())
    records = f"{total:,} record{'' if total == 1 else 's'}"
    if len(seen) <= 1:
        for partition, (_, first, last) in seen.items():
            where = f"offset {first}" if first == last else f"offsets {first} to {last}"
            return f"consumed {records} from partition {partition}, {where}"
        return f"consumed {records}"
    parts = ", ".join(f"{seen[p][0]:,} from partition {p}" for p in sorted(seen))
    text = f"consumed {records}: {parts}; in offset order within a partition, not across them"
    return text + (" (--long prints each record's partition and offset)" if hint else "")


class _Printer:
    """Writes records to stdout; ``emit`` says whether more are wanted (``--max``).

    ``seen``: per partition, the records printed and the first and last offset printed."""

    def __init__(
        self, render: Callable[[ConsumerRecord], bytes], limit: int | None, *, flush: bool
    ) -> None:
        self.render = render
        self.limit = limit
        self.flush = flush
        self.count = 0
        self.seen: dict[int, tuple[int, int, int]] = {}

    def remaining(self) -> int | None:
        return None if self.limit is None else self.limit - self.count

    def emit(self, record: ConsumerRecord) -> bool:
        # Counted before it is written: a Ctrl-C right after the write (a reader may act on
        # the line at once) must not leave the record out of the summary.
        self.count += 1
        count, first, _ = self.seen.get(record.partition, (0, record.offset, 0))
        self.seen[record.partition] = (count + 1, first, record.offset)
        out = sys.stdout.buffer
        out.write(self.render(record))
        if self.flush:
            out.flush()
        return self.limit is None or self.count < self.limit


def _reset(args: argparse.Namespace) -> OffsetReset:
    return OffsetReset.EARLIEST if args.from_beginning else OffsetReset.LATEST


def _consume_group(client: Client, args: argparse.Namespace, printer: _Printer) -> None:
    if args.offset is not None:  # the group starts every partition there: past an end says so
        for partition, (_, end) in sorted(client.partition_offsets(args.topic).items()):
            if args.offset > end:
                raise ClientCommandError(
                    f"--offset {args.offset} is past the end of {args.topic} partition "
                    f"{partition} (its next offset is {end})"
                )
    group = GroupConsumer(
        client, args.topic, args.group, start=args.offset, auto_offset_reset=_reset(args)
    )
    try:
        more = True
        while more:
            records = group.poll(1.0, max_records=printer.remaining())
            printed = 0
            try:
                for record in records:
                    more = printer.emit(record)
                    printed += 1
                    if not more:
                        break
            finally:
                # Commit what was printed, not more (at-least-once), even after an error.
                group.cursor.unprocessed(records[printed:])
                group.commit()
            if not records and not args.follow:
                return
    finally:
        # As Kafka's console consumer does on close: the group is Empty (or rebalanced) at
        # once, not after the session timeout. A failed LEAVE is only a later rebalance.
        with contextlib.suppress(KafkaesqueError):
            group.leave()


def _start_offset(text: str) -> int | str:
    """``--offset``'s value: an offset (N >= 0), the last N records (-N), or ``@TIME`` (kept as
    the text after @, parsed by ``parse_time_ms`` in ``run_consume``, which says what is wrong)."""
    if text.startswith("@"):
        return text[1:]
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an offset (N), the last N records (-N) or a time (@TIME)"
        ) from None


def parse_time_ms(text: str, *, option: str = "--from-time") -> int:
    """``--from-time``: milliseconds since the epoch (digits), or an ISO 8601 date and time
    (UTC when it names no zone). Raises ``ClientCommandError`` for anything else."""
    if text.isdigit():
        return int(text)
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise ClientCommandError(
            f"{option} {text!r} is neither milliseconds since the epoch nor ISO 8601 "
            "(2026-11-26T08:00:00Z)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    # Exact arithmetic: a float timestamp could turn .123 s into 122 ms.
    ms = (when - datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)) // datetime.timedelta(
        milliseconds=1
    )
    if ms < 0:
        raise ClientCommandError(f"{option} {text!r} is before 1970")
    return ms


LAST_RECORDS_STEPS = 8
"""How many times ``last_records_start`` steps back before it settles for what it found."""


def last_records_start(client: Client, tp: TopicPartition, count: int, start: int, end: int) -> int:
    """The offset from which the partition's last ``count`` records follow (``start``, its log
    start, if it holds fewer): ``-o -N``.

    Not simply ``end - count``: offsets also number control batches (the no-op a new leader
    appends at each leader change), which hold no record, so the last ``count`` offsets may
    hold fewer records. It reads back from ``end - count`` and steps back by what is missing
    (at most ``LAST_RECORDS_STEPS`` times; a partition full of control batches gets fewer)."""
    at = max(start, end - count)
    for _ in range(LAST_RECORDS_STEPS):
        if at <= start:
            return start
        reader = Consumer(client)
        reader.assign([tp])
        reader.seek(tp, at)
        found = sum(1 for record in reader.records(follow=False) if record.offset < end)
        if found >= count:
            return at
        at = max(start, at - (count - found))
    return at


def _consume_partitions(
    client: Client, args: argparse.Namespace, printer: _Printer, from_time: int | None = None
) -> None:
    consumer = Consumer(client, auto_offset_reset=_reset(args))
    if args.partition is None:
        consumer.assign_topic(args.topic)
    else:
        count = client.partitions_for(args.topic)
        if not 0 <= args.partition < count:
            raise ClientCommandError(
                f"{args.topic} has partitions 0 to {count - 1}, not {args.partition}"
            )
        consumer.assign([TopicPartition(args.topic, args.partition)])
    if args.offset is not None:
        bounds = client.partition_offsets(args.topic)
        for tp in consumer.assignment():
            start, end = bounds[tp.partition]
            if args.offset < 0:  # the last -offset records
                consumer.seek(tp, last_records_start(client, tp, -args.offset, start, end))
            elif args.offset > end:
                raise ClientCommandError(
                    f"--offset {args.offset} is past the end of {args.topic} partition "
                    f"{tp.partition} (its next offset is {end})"
                )
            else:
                consumer.seek(tp, args.offset)
    if from_time is not None:
        offsets = client.offsets_for_times({tp: from_time for tp in consumer.assignment()})
        for tp, offset in offsets.items():
            consumer.seek(tp, offset)
    for record in consumer.records(follow=args.follow):
        if not printer.emit(record):
            return
