"""One request and how to read its answer, for every command a client sends outside the producer.

A ``Call`` is data: the command, where it goes (``route``: a partition's leader, or any broker),
whether sending it twice is harmless (``idempotent``), and the pure function that turns the
response into a result or raises ``KafkaesqueError``. The sync and trio clients run calls with the
same retry loop (``_steps.run_call``); nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from kafkaesque.protocol import (
    Acks,
    AclAdd,
    AclList,
    AclRemove,
    AclRow,
    AddBroker,
    AlterTopic,
    Commit,
    Cons,
    ConsOffsets,
    CreateTopic,
    DeleteGroup,
    DeleteTopic,
    DescribeGroup,
    DescribeTopic,
    ElectLeaders,
    EndReply,
    ErrorCode,
    Fetch,
    FetchOffsets,
    FetchReplica,
    GroupRow,
    GroupStateRow,
    Latest,
    Leave,
    ListGroups,
    ListTopics,
    MemberRow,
    Metadata,
    OffsetRow,
    PartitionRow,
    Ping,
    PublishRecord,
    Reassign,
    RemoteProtocolError,
    RemoveBroker,
    ResetKind,
    ResetOffsets,
    Subs,
    TopicRow,
    parse_acl_removed_reply,
    parse_published_reply,
)
from kafkaesque.protocol import Command as WireCommand

from ._consumer_core import (
    ConsumerRecord,
    FetchResult,
    TopicPartition,
    decode_fetch,
    decode_messages,
)
from ._errors import KafkaesqueError
from ._metadata import (
    Address,
    ClusterMetadata,
    TopicDescription,
    offsets_from_response,
    topics_from_response,
)
from ._wire import Response, expect_data, expect_list, expect_ok

T = TypeVar("T")


DECOMMISSION_WAIT_S = 330.0
"""How long a ``REMOVEBROKER`` answer may take beyond the request timeout: the broker's own
bound on the moves (``kafkaesque.broker.DECOMMISSION_TIMEOUT_S``, 300 s) and a margin."""
REASSIGN_WAIT_S = 30.0
"""How long a ``REASSIGN`` answer may take beyond the request timeout by default."""


@dataclass(frozen=True, slots=True)
class Pinned:
    """A route to one broker's address, whatever the metadata says."""

    address: Address


Route = TopicPartition | Pinned | None


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """A command, its route and the reading of its response.

    ``route`` None: any broker (every broker accepts every command); a ``TopicPartition``: that
    partition's leader when the metadata knows it (the fast path), else any broker; a ``Pinned``
    address: that broker only (a subscription lives on the broker that made it).
    ``extra_timeout_s`` adds to the client's request timeout (a long poll's wait).
    """

    command: WireCommand
    parse: Callable[[Response], T]
    route: Route = None
    idempotent: bool = True
    extra_timeout_s: float = 0.0


@dataclass(frozen=True, slots=True)
class ConsBatch:
    """The answer to ``CONS``: the records, and each partition's next offset (from ``+END``)."""

    records: tuple[ConsumerRecord, ...]
    next_offsets: tuple[tuple[int, int], ...]


def _ok(response: Response) -> None:
    expect_ok(response)


def _pong(response: Response) -> str:
    return expect_ok(response).text


def ping() -> Call[str]:
    """``PING``; the result is the reply's text (``PONG``)."""
    return Call(Ping(), _pong)


def metadata(topics: tuple[str, ...] = ()) -> Call[ClusterMetadata]:
    """``METADATA [topics]``: brokers, and partitions with leader and replicas."""
    return Call(
        Metadata(topics), lambda response: ClusterMetadata.from_response(expect_list(response))
    )


def create_topic(spec: CreateTopic) -> Call[None]:
    """``CREATE``. Not idempotent: a retry after an outcome-unknown error could meet
    ``TOPIC_EXISTS`` for the topic the first attempt created, so it is not retried then."""
    return Call(spec, _ok, idempotent=False)


def alter_topic(spec: AlterTopic) -> Call[str]:
    """``ALTER``; the result is the reply's text (``altered`` or ``unchanged``). Idempotent:
    its values are absolute, so a retry after an outcome-unknown error changes nothing more."""
    return Call(spec, _pong)


def list_topics() -> Call[list[TopicRow]]:
    """``LIST``: every topic's settings, sorted by name."""
    return Call(ListTopics(), lambda response: topics_from_response(expect_list(response)))


def describe_topic(topic: str) -> Call[TopicDescription]:
    """``DESCRIBE``: the topic's settings and its partitions (leader, replicas, start, end)."""
    return Call(
        DescribeTopic(topic),
        lambda response: TopicDescription.from_response(expect_list(response)),
    )


def offsets_for_time(topic: str, time_ms: int) -> Call[dict[int, int]]:
    """``DESCRIBE topic time=MS``: partition → the earliest committed offset whose record
    timestamp is >= ``time_ms`` (the high watermark when none is), as each leader has it.

    A partition whose leader did not answer (an election, a leader out of reach) and that the
    answering broker holds no replica of comes without one: that raises the retriable
    ``NOT_LEADER``, so the call is sent again (after a metadata refresh) until retries run out.
    """

    def parse(response: Response) -> dict[int, int]:
        rows = [r for r in expect_list(response).rows if isinstance(r, PartitionRow)]
        missing = [r.partition for r in rows if r.time_offset is None]
        if missing:
            raise KafkaesqueError(
                ErrorCode.NOT_LEADER,
                f"{topic}: no leader answered for partition(s) "
                f"{', '.join(map(str, missing))}; retry",
            )
        return {r.partition: r.time_offset for r in rows if r.time_offset is not None}

    return Call(DescribeTopic(topic, time_ms), parse)


def delete_topic(topic: str) -> Call[None]:
    """``DELETE``. Not idempotent (a retry would meet ``UNKNOWN_TOPIC``)."""
    return Call(DeleteTopic(topic), _ok, idempotent=False)


def commit(
    group: str, topic: str, partition: int, offset: int, member: str | None = None
) -> Call[None]:
    """``COMMIT``: ``offset`` is the next one ``group`` reads (idempotent: it sets a value).

    With ``member`` (a subscription id) the broker refuses it (``NOT_ASSIGNED``) unless that
    member owns the partition: a member that lost it in a rebalance is fenced."""
    return Call(Commit(group, topic, partition, offset, member), _ok)


def leave(subscription_id: str, address: Address) -> Call[None]:
    """``LEAVE``: end a group subscription now (its partitions move at once), sent to the broker
    that holds it. Not retried after an outcome-unknown error: leaving is a courtesy (the
    session timeout does the same later)."""
    return Call(Leave(subscription_id), _ok, Pinned(address), idempotent=False)


def describe_group(group: str, topic: str) -> Call[list[GroupRow]]:
    """``GROUPS``: each partition's owner, committed offset and end, for ``group`` on ``topic``."""
    return Call(
        DescribeGroup(group, topic),
        lambda response: [r for r in expect_list(response).rows if isinstance(r, GroupRow)],
    )


@dataclass(frozen=True, slots=True)
class GroupDescription:
    """A consumer group on one topic, as ``GROUPS <group>`` shows it: its ``state``
    (``Stable`` or ``Empty``, with the member count), its members with the partitions each owns
    (a member beyond the partition count owns none) and each partition's owner, committed
    offset and end (lag = end - committed)."""

    state: GroupStateRow
    members: tuple[MemberRow, ...]
    partitions: tuple[GroupRow, ...]

    @property
    def topic(self) -> str:
        """The topic the group reads here."""
        return self.state.topic


def _descriptions(response: Response) -> list[GroupDescription]:
    """Cut a ``GROUPS <group>`` reply at each ``+GROUPSTATE``: one description a topic."""
    found: list[GroupDescription] = []
    for row in expect_list(response).rows:
        if isinstance(row, GroupStateRow):
            found.append(GroupDescription(row, (), ()))
        elif not found:
            raise RemoteProtocolError(f"GROUPS answered a {type(row).__name__} before +GROUPSTATE")
        elif isinstance(row, MemberRow):
            last = found[-1]
            found[-1] = GroupDescription(last.state, (*last.members, row), last.partitions)
        elif isinstance(row, GroupRow):
            last = found[-1]
            found[-1] = GroupDescription(last.state, last.members, (*last.partitions, row))
    return found


def describe_consumer_group(group: str, topic: str | None = None) -> Call[list[GroupDescription]]:
    """``GROUPS group [topic]``: the group on each topic it reads (only ``topic`` if given);
    ``UNKNOWN_GROUP`` if it has no members and no committed offsets."""
    return Call(DescribeGroup(group, topic), _descriptions)


def list_groups() -> Call[list[GroupStateRow]]:
    """``GROUPS``: every group and topic it reads, with its state and member count."""
    return Call(
        ListGroups(),
        lambda response: [r for r in expect_list(response).rows if isinstance(r, GroupStateRow)],
    )


def reset_offsets(
    group: str, topic: str, to: ResetKind | str, value: int | None = None, dry_run: bool = False
) -> Call[dict[int, int]]:
    """``RESETOFFSETS``: move an inactive group's committed offsets on ``topic`` to each
    partition's ``earliest`` / ``latest`` offset, to ``offset`` ``value`` (kept within each
    partition's start and end) or to the first offset at ``time`` ``value`` (ms); the result
    is partition → new offset. ``GROUP_NOT_EMPTY`` while the group has members on ``topic``.
    ``dry_run``: the same checks and result, nothing changed. Idempotent (it sets values: a
    retry sets the same ones, or newer bounds')."""
    kind = ResetKind(to)
    if (value is None) != (kind in (ResetKind.EARLIEST, ResetKind.LATEST)):
        needs = "a value" if value is None else "no value"
        raise ValueError(f"a reset to {kind.value} takes {needs}")
    return Call(
        ResetOffsets(group, topic, kind, value, dry_run),
        lambda response: {
            r.partition: r.offset
            for r in expect_list(response).rows
            if isinstance(r, OffsetRow) and r.offset is not None
        },
    )


def delete_group(group: str) -> Call[None]:
    """``DELGROUP``: forget an inactive group. Not idempotent (a retry after an unknown outcome
    would meet ``UNKNOWN_GROUP``)."""
    return Call(DeleteGroup(group), _ok, idempotent=False)


def committed_offsets(group: str, topic: str) -> Call[dict[int, int | None]]:
    """``OFFSETS``: partition → committed offset, None where the group has none."""
    return Call(
        FetchOffsets(group, topic),
        lambda response: offsets_from_response(expect_list(response)),
    )


def subscribe(
    topic: str, group: str, partitions: int | None = None, *, route: Route = None
) -> Call[str]:
    """``SUBS``: join ``group``; the result is the subscription id. Not idempotent (a retry could
    join twice)."""
    return Call(Subs(topic, group, partitions), _subscription_id, route, idempotent=False)


def _subscription_id(response: Response) -> str:
    # "+OK <id>", or "+OK <id> partitions=<got> asked=<n>" when it got fewer than it asked for.
    words = expect_ok(response).text.split(" ")
    if not words[0] or any("=" not in w for w in words[1:]):
        raise RemoteProtocolError(f"SUBS answered '+OK {' '.join(words)}'")
    return words[0]


def consume(
    topic: str,
    subscription_id: str,
    offsets: ConsOffsets,
    *,
    max_messages: int | None = None,
    wait_ms: int | None = None,
    route: Route = None,
) -> Call[ConsBatch]:
    """``CONS``: records through a subscription, and where each partition continues."""

    def parse(response: Response) -> ConsBatch:
        rows = expect_list(response)
        end: EndReply = rows.end
        return ConsBatch(tuple(decode_messages(topic, rows)), end.next_offsets)

    return Call(
        Cons(topic, subscription_id, offsets, max_messages, wait_ms),
        parse,
        route,
        extra_timeout_s=(wait_ms or 0) / 1000.0,
    )


def publish(
    topic: str,
    value: bytes,
    *,
    key: bytes | None = None,
    partition: int | None = None,
    acks: Acks = Acks.QUORUM,
) -> Call[tuple[int, int]]:
    """``PUB``: one record, unbatched; the result is ``(partition, offset)``. The broker picks the
    partition when none is given. Not retried after an outcome-unknown error (no duplicates)."""

    def parse(response: Response) -> tuple[int, int]:
        return parse_published_reply(expect_ok(response))

    route = None if partition is None else TopicPartition(topic, partition)
    return Call(PublishRecord(topic, value, key, partition, acks), parse, route, idempotent=False)


def fetch(
    topic: str,
    partition: int,
    offset: int,
    *,
    max_bytes: int | None = None,
    wait_ms: int | None = None,
    replica: Address | None = None,
) -> Call[FetchResult]:
    """``FETCH``: records at or after ``offset``. Without ``replica``, sent to the partition's
    leader (any broker would forward it there); with a broker's address, ``replica=local`` to
    that broker: its own replica's committed records (``NO_REPLICA`` if it holds none)."""
    if replica is None:
        command = Fetch(topic, partition, offset, max_bytes=max_bytes, wait_ms=wait_ms)
        route: Route = TopicPartition(topic, partition)
    else:
        command = Fetch(topic, partition, offset, max_bytes, wait_ms, replica=FetchReplica.LOCAL)
        route = Pinned(replica)

    def parse(response: Response) -> FetchResult:
        return decode_fetch(topic, partition, offset, expect_data(response))

    return Call(command, parse, route, extra_timeout_s=(wait_ms or 0) / 1000)


def latest(topic: str, key: bytes, partition: int | None = None) -> Call[ConsumerRecord | None]:
    """``LATEST``: the newest committed record of ``key`` in a compacted topic, None if the key
    has no value. Sent to the leader of ``partition`` (the key's, when the caller knows the
    partition count), else to any broker (it forwards to the leader)."""

    def parse(response: Response) -> ConsumerRecord | None:
        records = decode_messages(topic, expect_list(response))
        if len(records) > 1:
            raise RemoteProtocolError(f"LATEST answered {len(records)} rows, not one at most")
        return records[0] if records else None

    route = None if partition is None else TopicPartition(topic, partition)
    return Call(Latest(topic, key), parse, route)


def add_acl(acl: AclRow) -> Call[None]:
    """``ACL ADD``: allow or deny a principal an operation on a resource (idempotent: adding an
    ACL that exists changes nothing). Needs ``alter`` on the cluster."""
    return Call(AclAdd(acl), _ok)


def remove_acl(acl: AclRow) -> Call[int]:
    """``ACL REMOVE``: how many ACLs it removed (1, or 0 if there was no such ACL). Retried like
    an idempotent call (the ACLs end the same): a retry after an unknown outcome may answer 0
    for an ACL the first attempt removed. Needs ``alter`` on the cluster."""
    return Call(AclRemove(acl), lambda response: parse_acl_removed_reply(expect_ok(response)))


def list_acls(principal: str | None = None) -> Call[list[AclRow]]:
    """``ACL LIST [principal]``: the ACLs (naming exactly ``principal``, when given). Needs
    ``describe`` on the cluster."""
    return Call(
        AclList(principal),
        lambda response: [r for r in expect_list(response).rows if isinstance(r, AclRow)],
    )


def add_broker(broker_id: int, peer: str, controller: str) -> Call[None]:
    """``ADDBROKER``: admit broker ``broker_id`` (started with ``--join``), whose Raft transport
    listens at ``peer`` and controller at ``controller`` (``host:port`` each). Not idempotent:
    a retry after an outcome-unknown error could meet the member the first attempt admitted."""
    return Call(AddBroker(broker_id, peer, controller), _ok, idempotent=False)


def elect_leaders(topic: str | None, partition: int | None, address: Address) -> Call[int]:
    """``ELECTLEADERS [topic [partition]]`` to the broker at ``address``: it hands the
    partitions it leads (those named) to their preferred replicas; the result is how many
    transfers it started (``+OK moved=<n> skipped=<m>``). Idempotent: a partition led by its
    preferred replica is left alone."""
    return Call(ElectLeaders(topic, partition), _elected, route=Pinned(address))


def _elected(response: Response) -> int:
    text = expect_ok(response).text
    fields = dict(word.partition("=")[::2] for word in text.split())
    moved = fields.get("moved", "")
    if moved.isascii() and moved.isdigit():
        return int(moved)
    raise RemoteProtocolError(f"ELECTLEADERS answered '+OK {text[:80]}'")


def remove_broker(broker_id: int, wait_s: float) -> Call[int]:
    """``REMOVEBROKER``: decommission ``broker_id``; the result is how many partitions moved
    off it (``+OK moved=<n>``). The broker answers once every move is done, so the attempt
    may take ``wait_s`` beyond the request timeout. Idempotent: a retry finds the moves done
    or under way and waits for them."""
    return Call(RemoveBroker(broker_id), _moved, extra_timeout_s=wait_s)


def _moved(response: Response) -> int:
    name, eq, count = expect_ok(response).text.partition("=")
    if name == "moved" and eq and count.isdigit() and count.isascii():
        return int(count)
    raise RemoteProtocolError(f"REMOVEBROKER answered '+OK {expect_ok(response).text[:80]}'")


def reassign(topic: str, partition: int, replicas: tuple[int, ...], wait_s: float) -> Call[None]:
    """``REASSIGN``: make ``replicas`` the partition's replicas (one server at a time); the
    broker answers once its Raft group has exactly these voters, so the attempt may take
    ``wait_s`` beyond the request timeout. Idempotent: the replicas are absolute."""
    return Call(Reassign(topic, partition, replicas), _ok, extra_timeout_s=wait_s)
