"""Multi-request operations written once, as generators of I/O steps (sans-I/O coroutines).

A generator here yields what it needs done (``Request``, ``Pipeline``, ``Sleep``) and is sent the
outcome; it never touches a socket or a clock of its own (the clock is a parameter). The sync
client runs it with blocking sockets, the trio client with trio streams (``_sync._drive``,
``_trio._drive``), so retries, metadata refresh, the consumer's poll loop and the group
subscription logic exist once, and tests can run them against a scripted broker.

Protocol between a generator and its driver:

- ``Request(address, command, timeout_s)``: send it and send back the ``Response``; a failure to
  get one is thrown into the generator as ``KafkaesqueError`` (``KafkaesqueConnectionError``
  for connection failures, after the driver marked the address failed in ``ClusterState``).
- ``Pipeline(requests)``: send them all (pipelined per connection), then send back one
  ``Response | KafkaesqueError`` per request, in order: errors are values here.
- ``Sleep(seconds)``: pause, send back None.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar

from kafkaesque.protocol import (
    GROUP_OFFSETS_TOPIC,
    Command,
    ErrorCode,
    PartitionRow,
    RemoteProtocolError,
    partition_for_key,
)

from . import _calls as calls
from ._consumer_core import (
    ConsumerCore,
    ConsumerRecord,
    FetchResult,
    OffsetReset,
    TopicPartition,
)
from ._errors import KafkaesqueConnectionError, KafkaesqueError
from ._metadata import Address, ClusterMetadata, unknown_topic
from ._retry import DEFAULT_RETRY, NO_RETRY, RetryPolicy, retry_decision
from ._security import PLAINTEXT, Security
from ._wire import Response

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Request:
    """Send ``command`` to ``address``; give up after ``timeout_s`` seconds."""

    address: Address
    command: Command
    timeout_s: float


@dataclass(frozen=True, slots=True)
class Pipeline:
    """Send every request before waiting for any reply; answers come back in order."""

    requests: tuple[Request, ...]


@dataclass(frozen=True, slots=True)
class Sleep:
    """Pause for ``seconds``."""

    seconds: float


Step: TypeAlias = Request | Pipeline | Sleep
Steps: TypeAlias = Generator[Step, Any, T]
"""A sans-I/O operation: yields steps, receives their outcomes, returns a ``T``."""


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """Timeouts (milliseconds), retries and security of a client. ``request_timeout_ms`` bounds
    one attempt (a long poll adds its wait); ``connect_timeout_ms`` bounds opening a connection
    (TCP, then the TLS handshake, then each step of the SASL exchange). ``security``: TLS and
    authentication of every connection the client opens (``Security``; plaintext by default)."""

    request_timeout_ms: float = 10_000.0
    connect_timeout_ms: float = 5_000.0
    retry: RetryPolicy = DEFAULT_RETRY
    security: Security = PLAINTEXT

    def __post_init__(self) -> None:
        if self.request_timeout_ms <= 0 or self.connect_timeout_ms <= 0:
            raise ValueError("timeouts must be positive")

    @property
    def request_timeout_s(self) -> float:
        """``request_timeout_ms`` in seconds."""
        return self.request_timeout_ms / 1000.0

    @property
    def connect_timeout_s(self) -> float:
        """``connect_timeout_ms`` in seconds."""
        return self.connect_timeout_ms / 1000.0


class ClusterState:
    """Where a request goes: the metadata snapshot, the bootstrap list, and recent failures.

    Pure and shared by the sync and trio clients. An address that failed is tried last until it
    works again, so a dead bootstrap broker costs one failed attempt, not one per request.
    """

    def __init__(self, bootstrap: Sequence[Address]) -> None:
        if not bootstrap:
            raise ValueError("the bootstrap list is empty")
        self.bootstrap = list(bootstrap)
        self.metadata = ClusterMetadata()
        self._failures: dict[Address, int] = {}
        self._failure_clock = 0

    def update_metadata(self, snapshot: ClusterMetadata, topics: Sequence[str] = ()) -> None:
        """Merge a fresh ``METADATA`` answer (asked about ``topics``; none: all of them)."""
        if topics:
            self.metadata = self.metadata.merged(snapshot, topics)
        else:
            self.metadata = snapshot

    def candidates(self) -> list[Address]:
        """Every address worth trying for "any broker": known brokers by id, then the bootstrap
        list, the least recently failed first."""
        known = [(b.host, b.port) for _, b in sorted(self.metadata.brokers.items())]
        ordered = list(dict.fromkeys(known + self.bootstrap))
        return sorted(ordered, key=lambda a: self._failures.get(a, 0))

    def address_for(self, route: calls.Route) -> Address:
        """The address a request with ``route`` goes to now."""
        if isinstance(route, calls.Pinned):
            return route.address
        if route is not None:
            leader = self.metadata.leader(route.topic, route.partition)
            if leader is not None and (leader.host, leader.port) not in self._failures:
                return (leader.host, leader.port)
        return self.candidates()[0]

    def connection_failed(self, address: Address) -> None:
        """``address`` could not be reached: try it last from now on."""
        self._failure_clock += 1
        self._failures[address] = self._failure_clock

    def connection_ok(self, address: Address) -> None:
        """``address`` answered: it is a normal candidate again."""
        self._failures.pop(address, None)


class PinnedState(ClusterState):
    """A ``ClusterState`` that sends every request to one broker, whatever the route and the
    metadata say: no rerouting to a leader, no other candidate after a failure. For questions
    whose answer is one broker's view (an operator's, a checker's: "which brokers does broker
    3 list?"). A ``METADATA`` answer is still kept, but only as what that broker said."""

    def candidates(self) -> list[Address]:
        """Only the pinned address."""
        return self.bootstrap[:1]

    def address_for(self, route: calls.Route) -> Address:
        """The pinned address, for every route."""
        return self.bootstrap[0]


def protocol_violation(exc: RemoteProtocolError) -> KafkaesqueConnectionError:
    """The error a broker's broken reply becomes (not retriable: it is a bug somewhere)."""
    return KafkaesqueConnectionError(
        f"the broker broke the protocol: {exc}", sent=True, retriable=False
    )


def run_call(
    state: ClusterState, config: ClientConfig, call: calls.Call[T], *, refresh: bool = True
) -> Steps[T]:
    """Send ``call`` and read its result, retrying as ``retry_decision`` says.

    Before a retry that follows a stale-leader or connection error, the metadata is re-read (when
    ``refresh``). Raises the last ``KafkaesqueError`` when retries run out.
    """
    attempts = 0
    while True:
        attempts += 1
        request = Request(
            state.address_for(call.route),
            call.command,
            config.request_timeout_s + call.extra_timeout_s,
        )
        try:
            response: Response = yield request
            return call.parse(response)
        except RemoteProtocolError as exc:
            raise protocol_violation(exc) from exc
        except KafkaesqueError as error:
            decision = retry_decision(config.retry, error, attempts, idempotent=call.idempotent)
            if decision is None:
                raise
            if decision.refresh_metadata and refresh:
                yield from refresh_metadata(state, config)
            if decision.delay_s > 0:
                yield Sleep(decision.delay_s)


_REFRESH_BROKERS = 2
"""How many brokers a metadata refresh asks at most, one after the other, when the connection to
the first fails (it stopped, or restarted since its pooled connection was last used)."""


def refresh_metadata(
    state: ClusterState, config: ClientConfig, topics: tuple[str, ...] = ()
) -> Steps[ClusterMetadata | None]:
    """Re-read ``METADATA`` (for ``topics``; none: all) into ``state``; None if it failed (the
    caller's own retry goes on with what it knew, and backs off).

    One attempt per broker, at most ``_REFRESH_BROKERS`` of them: when the connection to the
    first candidate fails (a broker that stopped gracefully, or a pooled connection that a
    restarted broker closed meanwhile), or it answers ``NOT_READY`` (it is stopping, or has just
    started), the next is asked at once. Otherwise the caller would retry, a backoff later, on
    the metadata it had, which names the broker that just handed its leaderships over. A broker
    that answers anything else, even an error, ends the refresh.
    """
    once = dataclasses.replace(config, retry=NO_RETRY)
    call = calls.metadata(topics)
    for address in state.candidates()[:_REFRESH_BROKERS]:
        pinned = dataclasses.replace(call, route=calls.Pinned(address))
        try:
            snapshot = yield from run_call(state, once, pinned, refresh=False)
        except KafkaesqueConnectionError:
            state.connection_failed(address)
            continue
        except KafkaesqueError as exc:
            if exc.code is ErrorCode.NOT_READY:
                continue
            return None
        state.update_metadata(snapshot, topics)
        return snapshot
    return None


def broker_address(state: ClusterState, config: ClientConfig, broker_id: int) -> Steps[Address]:
    """Where broker ``broker_id`` takes clients (from metadata, re-read once if it is not
    known). Raises ``KafkaesqueError`` (not retriable) if the cluster has no such broker."""
    row = state.metadata.brokers.get(broker_id)
    if row is None:
        yield from refresh_metadata(state, config)
        row = state.metadata.brokers.get(broker_id)
    if row is None:
        raise KafkaesqueError(
            None,
            f"broker {broker_id} is not registered in the cluster",
            retriable=False,
            outcome_unknown=False,
        )
    return (row.host, row.port)


def fetch(
    state: ClusterState,
    config: ClientConfig,
    topic: str,
    partition: int,
    offset: int,
    *,
    max_bytes: int | None = None,
    wait_ms: int | None = None,
    replica: int | None = None,
) -> Steps[FetchResult]:
    """One ``FETCH`` (see ``Client.fetch``), with retries; ``replica`` a broker id."""
    address = None if replica is None else (yield from broker_address(state, config, replica))
    call = calls.fetch(
        topic, partition, offset, max_bytes=max_bytes, wait_ms=wait_ms, replica=address
    )
    return (yield from run_call(state, config, call))


def latest(
    state: ClusterState, config: ClientConfig, topic: str, key: bytes
) -> Steps[ConsumerRecord | None]:
    """One ``LATEST`` (see ``Client.latest``), with retries: sent to the leader of the key's
    partition when the metadata knows the topic's partition count (computed as the producers
    do), else to any broker, which forwards it there. ``ValueError`` for an empty key."""
    if not key:
        raise ValueError("LATEST needs a non-empty key")
    count = state.metadata.partition_count(topic)
    partition = None if count is None else partition_for_key(key, count)
    return (yield from run_call(state, config, calls.latest(topic, key, partition)))


def reset_positions(state: ClusterState, config: ClientConfig, core: ConsumerCore) -> Steps[None]:
    """Give every assigned partition without a position its reset offset (DESCRIBE per topic)."""
    core.apply_reset((yield from partition_rows(state, config, core.needs_reset())))


def poll(
    state: ClusterState,
    config: ClientConfig,
    core: ConsumerCore,
    *,
    timeout_s: float,
    max_records: int | None,
    clock: Callable[[], float],
) -> Steps[list[ConsumerRecord]]:
    """Fetch from every assigned partition until records come or ``timeout_s`` passes.

    The first round does not wait; later rounds long-poll (``wait_ms``) for what remains of the
    timeout. Returns at most ``max_records`` records (the positions of partitions whose records
    were held back go back to the first one not returned). Raises ``KafkaesqueError`` for an
    error that retrying will not cure; retriable ones refresh the metadata and back off.
    """
    deadline = clock() + max(timeout_s, 0.0)
    first = True
    failures = 0
    while True:
        if core.needs_reset():
            yield from reset_positions(state, config, core)
        remaining_ms = max(int((deadline - clock()) * 1000), 0)
        plan = core.plan(0 if first else remaining_ms)
        first = False
        if not plan:
            return []
        results = yield Pipeline(
            tuple(
                Request(
                    state.address_for(tp),
                    fetch,
                    config.request_timeout_s + (fetch.wait_ms or 0) / 1000.0,
                )
                for tp, fetch in plan
            )
        )
        records: list[ConsumerRecord] = []
        errors: list[KafkaesqueError] = []
        for (tp, fetch), result in zip(plan, results, strict=True):
            try:
                if isinstance(result, KafkaesqueError):
                    raise result
                records.extend(core.on_fetch(tp, fetch, result).records)
            except RemoteProtocolError as exc:
                errors.append(protocol_violation(exc))
            except KafkaesqueError as exc:
                errors.append(exc)
        if records:
            return _hold_back(core, records, max_records)
        if errors:
            failures += 1
            decision = retry_decision(config.retry, errors[0], failures, idempotent=True)
            if decision is None:
                raise errors[0]
            if decision.refresh_metadata:
                yield from refresh_metadata(state, config)
            yield Sleep(min(decision.delay_s, max(deadline - clock(), 0.0)))
        if clock() >= deadline:
            return []


def _hold_back(
    core: ConsumerCore, records: list[ConsumerRecord], max_records: int | None
) -> list[ConsumerRecord]:
    if max_records is None or len(records) <= max_records:
        return records
    kept, held = records[:max_records], records[max_records:]
    rewind: dict[TopicPartition, int] = {}
    for record in held:
        tp = TopicPartition(record.topic, record.partition)
        rewind.setdefault(tp, record.offset)
    for tp, offset in rewind.items():
        core.seek(tp, offset)
    return kept


# -- group subscriptions (SUBS / CONS / COMMIT) -------------------------------------------------


class GroupCursor:
    """A group subscription's state: where it lives, its id, and each partition's next offset.

    ``offsets`` holds the next offset per partition as the latest ``+END`` (or the starting point)
    said; ``committed`` what was last committed, so ``commit`` sends only what moved. A partition
    the group had no commit for, started at its log start (``EARLIEST``), counts as committed
    there: committing that start would change nothing (the policy finds it again), and would show
    a 0 in ``GROUPS`` that nobody committed, where a partition never read shows ``-`` (as Kafka's
    kafka-consumer-groups does). With ``LATEST`` the start is committed, as Kafka commits a
    consumer's position: the next member goes on from there, not from a later end.
    """

    def __init__(
        self,
        topic: str,
        group: str,
        *,
        partitions: int | None = None,
        start: int | None = None,
        reset: OffsetReset = OffsetReset.LATEST,
    ) -> None:
        self.topic = topic
        self.group = group
        self.partitions = partitions
        self.start = start
        self.reset = reset
        self.address: Address | None = None
        self.subscription_id: str | None = None
        self.offsets: dict[int, int] = {}
        self.committed: dict[int, int] = {}

    def unprocessed(self, records: Sequence[ConsumerRecord]) -> None:
        """Records the last poll returned that were not processed (the reader stopped early):
        the next ``CONS`` and ``commit`` start at the first of them in each partition."""
        for record in reversed(records):
            self.offsets[record.partition] = record.offset

    def cons_offsets(self) -> int | tuple[tuple[int, int], ...]:
        """The offsets argument of the next ``CONS``: explicit pairs once known, else the single
        start offset (the seed's form)."""
        if self.offsets:
            return tuple(sorted(self.offsets.items()))
        return self.start or 0


def group_start(state: ClusterState, config: ClientConfig, cursor: GroupCursor) -> Steps[None]:
    """Subscribe, then find where to start in each partition the subscription holds: the
    explicit ``start`` offset (sent in the seed's single-offset form), else the offsets reached
    so far, else the group's committed offsets, else the reset policy's (log start or end).

    The subscription is made at, and read through, the group's coordinator when the metadata
    names it (``coordinator_address``): any broker would forward each CONS there, a hop more
    for every read."""
    cursor.address = yield from coordinator_address(state, config, cursor.group)
    cursor.subscription_id = yield from run_call(
        state,
        config,
        calls.subscribe(
            cursor.topic, cursor.group, cursor.partitions, route=calls.Pinned(cursor.address)
        ),
    )
    if cursor.start is None or cursor.offsets:
        yield from _learn_partitions(state, config, cursor)


def _learn_partitions(
    state: ClusterState, config: ClientConfig, cursor: GroupCursor
) -> Steps[None]:
    # SUBS does not say which partitions it holds; a CONS in the single-offset form does: its
    # +END names every partition of the subscription. Its record (max=1) is not used.
    assert cursor.subscription_id is not None and cursor.address is not None
    probe = yield from run_call(
        state,
        config,
        calls.consume(
            cursor.topic,
            cursor.subscription_id,
            0,
            max_messages=1,
            wait_ms=0,
            route=calls.Pinned(cursor.address),
        ),
    )
    held = [partition for partition, _ in probe.next_offsets]
    missing = [p for p in held if p not in cursor.offsets]
    if missing:
        committed = yield from run_call(
            state, config, calls.committed_offsets(cursor.group, cursor.topic)
        )
        edges = {}
        if any(committed.get(p) is None for p in missing):
            rows = yield from partition_rows(
                state, config, [TopicPartition(cursor.topic, p) for p in missing]
            )
            edges = {
                tp.partition: (
                    r.start_offset if cursor.reset is OffsetReset.EARLIEST else r.end_offset
                )
                for tp, r in rows.items()
            }
        for p in missing:
            offset = committed.get(p)
            if offset is not None:
                cursor.committed[p] = offset
            cursor.offsets[p] = offset if offset is not None else edges.get(p) or 0
            if offset is None and cursor.reset is OffsetReset.EARLIEST:
                cursor.committed[p] = cursor.offsets[p]  # see the class docstring
    cursor.offsets = {p: cursor.offsets[p] for p in held}


def group_poll(
    state: ClusterState,
    config: ClientConfig,
    cursor: GroupCursor,
    *,
    wait_ms: int,
    max_records: int | None,
) -> Steps[list[ConsumerRecord]]:
    """One ``CONS`` through the subscription (subscribing first if needed), advancing the
    cursor. An expired subscription (``UNKNOWN_SUBSCRIPTION``) or a lost broker is joined again,
    and a changed assignment (``NOT_ASSIGNED``: a rebalance moved a partition) learnt again,
    once each call, keeping the offsets reached."""
    for attempt in range(2):
        if cursor.subscription_id is None or cursor.address is None:
            yield from group_start(state, config, cursor)
        assert cursor.subscription_id is not None and cursor.address is not None
        try:
            batch = yield from run_call(
                state,
                config,
                calls.consume(
                    cursor.topic,
                    cursor.subscription_id,
                    cursor.cons_offsets(),
                    max_messages=max_records,
                    wait_ms=wait_ms,
                    route=calls.Pinned(cursor.address),
                ),
            )
        except KafkaesqueError as error:
            if attempt:
                raise
            if error.code is ErrorCode.NOT_ASSIGNED and cursor.offsets:
                yield from _learn_partitions(state, config, cursor)
            elif error.code is ErrorCode.UNKNOWN_SUBSCRIPTION or (
                error.code is None and error.retriable
            ):
                cursor.subscription_id = None
            else:
                raise
            continue
        cursor.offsets.update(batch.next_offsets)
        return list(batch.records)
    raise AssertionError("unreachable: the loop returns or raises")


def group_commit(state: ClusterState, config: ClientConfig, cursor: GroupCursor) -> Steps[int]:
    """Commit every partition's offset that moved since the last commit; returns how many."""
    moved = {p: o for p, o in cursor.offsets.items() if cursor.committed.get(p) != o}
    for partition, offset in sorted(moved.items()):
        yield from run_call(
            state,
            config,
            calls.commit(cursor.group, cursor.topic, partition, offset, cursor.subscription_id),
        )
        cursor.committed[partition] = offset
    return len(moved)


# -- small shared lookups ----------------------------------------------------------------------


def coordinator_address(state: ClusterState, config: ClientConfig, group: str) -> Steps[Address]:
    """Where ``group``'s coordinator listens: the leader of its partition of the group offsets
    topic (Kafka's FindCoordinator), from the metadata, read once for that topic if it is not
    known. Any broker when that leader is unknown, unreachable lately, or hidden (the topic
    exists once a group first joined; a principal may not describe it): a broker forwards group
    commands to the coordinator, so this only saves a hop."""
    count = state.metadata.partition_count(GROUP_OFFSETS_TOPIC)
    if count is None:
        try:
            snapshot = yield from run_call(state, config, calls.metadata((GROUP_OFFSETS_TOPIC,)))
        except KafkaesqueError as error:
            if error.code not in (ErrorCode.UNKNOWN_TOPIC, ErrorCode.NOT_AUTHORIZED):
                raise
            return state.address_for(None)
        state.update_metadata(snapshot, (GROUP_OFFSETS_TOPIC,))
        count = state.metadata.partition_count(GROUP_OFFSETS_TOPIC)
    if not count:
        return state.address_for(None)
    partition = partition_for_key(group.encode(), count)
    return state.address_for(TopicPartition(GROUP_OFFSETS_TOPIC, partition))


def partition_count(state: ClusterState, config: ClientConfig, topic: str) -> Steps[int]:
    """How many partitions ``topic`` has: from the metadata, re-read once if it does not know the
    topic. Raises ``KafkaesqueError`` ``UNKNOWN_TOPIC`` if it still does not, or
    ``NOT_AUTHORIZED`` if the cluster hides it from this principal."""
    count = state.metadata.partition_count(topic)
    if count is None:
        snapshot = yield from run_call(state, config, calls.metadata((topic,)))
        state.update_metadata(snapshot, (topic,))
        count = state.metadata.partition_count(topic)
    if count is None:
        # METADATA leaves out what the principal may not describe, as if absent; DESCRIBE says
        # NOT_AUTHORIZED for such a topic, whether it exists or not (its existence stays
        # hidden), and the user learns why, as Kafka's TOPIC_AUTHORIZATION_FAILED says.
        description = yield from run_call(state, config, calls.describe_topic(topic))
        if description.partitions:
            return len(description.partitions)
        raise unknown_topic(topic)
    return count


def offsets_for_times(
    state: ClusterState, config: ClientConfig, timestamps: Mapping[TopicPartition, int]
) -> Steps[dict[TopicPartition, int]]:
    """For each partition, the earliest committed offset whose record timestamp is >= its
    timestamp (milliseconds since the epoch), or its high watermark when none is: Kafka's
    ``offsetsForTimes``, except that "none" is the end, where a consumer would wait for one.

    One ``DESCRIBE time=`` per topic and timestamp. Raises ``ValueError`` for a negative
    timestamp, ``KafkaesqueError`` ``UNKNOWN_PARTITION`` for a partition the topic does not
    have (and whatever the calls raise once retries run out)."""
    asked: dict[tuple[str, int], list[TopicPartition]] = {}
    for tp, ts in timestamps.items():
        if ts < 0:
            raise ValueError(f"timestamp {ts} of {tp.topic}/{tp.partition} is negative")
        asked.setdefault((tp.topic, ts), []).append(tp)
    found: dict[TopicPartition, int] = {}
    for (topic, ts), tps in sorted(asked.items()):
        offsets = yield from run_call(state, config, calls.offsets_for_time(topic, ts))
        for tp in tps:
            if tp.partition not in offsets:
                raise KafkaesqueError(
                    ErrorCode.UNKNOWN_PARTITION, f"{topic} has no partition {tp.partition}"
                )
            found[tp] = offsets[tp.partition]
    return found


def partition_rows(
    state: ClusterState, config: ClientConfig, partitions: Iterable[TopicPartition]
) -> Steps[dict[TopicPartition, PartitionRow]]:
    """The ``DESCRIBE`` rows (leader, replicas, start, end) of ``partitions``, one call per topic.
    A partition the topic does not have is left out."""
    wanted = set(partitions)
    rows: dict[TopicPartition, PartitionRow] = {}
    for topic in sorted({tp.topic for tp in wanted}):
        description = yield from run_call(state, config, calls.describe_topic(topic))
        for row in description.partitions:
            tp = TopicPartition(topic, row.partition)
            if tp in wanted:
                rows[tp] = row
    return rows
