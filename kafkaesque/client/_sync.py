"""The blocking client: ``Client`` (admin and single calls), ``Producer``, ``Consumer``,
``GroupConsumer``. Thin drivers of the sans-I/O cores; not thread-safe (one per thread).

Every method that talks to the cluster has a bounded duration: each attempt is bounded by the
request timeout, and attempts by the retry policy. Use them as context managers so sockets close.
"""

from __future__ import annotations

import contextlib
import math
import selectors
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from kafkaesque.protocol import (
    AclRow,
    AlterTopic,
    CreateTopic,
    ErrorCode,
    Fsync,
    GroupRow,
    GroupStateRow,
    PartitionRow,
    Ping,
    RemoteProtocolError,
    ResetKind,
    TopicRow,
)

from . import _calls as calls
from . import _fetched as fetched
from . import _log_bounds as log_bounds
from . import _steps as steps
from ._calls import GroupDescription
from ._consumer_core import (
    ConsumerCore,
    ConsumerPositions,
    ConsumerRecord,
    FetchResult,
    OffsetReset,
    TopicPartition,
)
from ._errors import (
    KafkaesqueConnectionError,
    KafkaesqueError,
    client_timeout,
    leader_moved,
    reply_broken,
)
from ._fetched import FetchedBatch
from ._metadata import (
    Address,
    ClusterMetadata,
    TopicDescription,
    one_address,
    parse_bootstrap,
)
from ._producer_core import (
    DeliveryHandle,
    ProducerConfig,
    ProducerCore,
    ProducerCounters,
    RecordMetadata,
)
from ._sync_connection import SyncConnection
from ._wire import Response, expect_ok

T = TypeVar("T")

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
REPLY_POLL_MS = 1.0
"""While batches are in flight, ``Producer.send`` looks for their replies this often (a look is
a system call: doing it for every record would cost more than the record)."""


def _now_ms() -> float:
    return time.monotonic() * 1000.0


class Client:
    """A blocking client of a Kafkaesque cluster: connections, metadata, admin and single calls.

    ``bootstrap`` is ``"host:port,host:port"`` (or a list): any reachable broker will do, the
    others are found through ``METADATA``. Connections open lazily, one per broker, and stay
    open until ``close``. Errors are ``KafkaesqueError``; retriable ones are retried (see
    ``RetryPolicy``) before they reach the caller.
    """

    def __init__(
        self,
        bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP,
        *,
        config: steps.ClientConfig | None = None,
    ) -> None:
        self.config = config or steps.ClientConfig()
        self.state = steps.ClusterState(parse_bootstrap(bootstrap))
        self._connections: dict[Address, SyncConnection] = {}

    @classmethod
    def pinned(cls, address: str | Address, *, config: steps.ClientConfig | None = None) -> Client:
        """A client of the one broker at ``address`` (``"host:port"`` or a pair): every call
        goes there, whatever its route, and retries too (``PinnedState``); nothing is rerouted
        to a leader or another broker. For asking one broker what it sees (its ``METADATA``,
        its ``PING``). ``ValueError`` unless ``address`` is exactly one address."""
        client = cls(config=config)
        client.state = steps.PinnedState(one_address(address))
        return client

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every connection. Idempotent."""
        for connection in self._connections.values():
            connection.close()
        self._connections.clear()

    # -- running calls and steps ---------------------------------------------------------------

    def call(self, call: calls.Call[T]) -> T:
        """Run one ``Call`` with retries (see ``_calls`` for the calls there are)."""
        return self.run(steps.run_call(self.state, self.config, call))

    def run(self, operation: steps.Steps[T]) -> T:
        """Drive a sans-I/O operation to its end with blocking I/O."""
        outcome: Any = None
        failure: KafkaesqueError | None = None
        while True:
            try:
                step = operation.send(outcome) if failure is None else operation.throw(failure)
            except StopIteration as stop:
                result: T = stop.value
                return result
            outcome, failure = None, None
            if isinstance(step, steps.Sleep):
                time.sleep(step.seconds)
            elif isinstance(step, steps.Request):
                outcome = self._pipeline((step,))[0]
                if isinstance(outcome, KafkaesqueError):
                    outcome, failure = None, outcome
            else:
                outcome = self._pipeline(step.requests)

    def connection(self, address: Address) -> SyncConnection:
        """The open connection to ``address``, connecting if needed (``KafkaesqueConnectionError``
        if it cannot; the address is then tried last by later requests)."""
        connection = self._connections.get(address)
        if connection is not None and not connection.closed:
            return connection
        try:
            connection = SyncConnection(
                address,
                connect_timeout_s=self.config.connect_timeout_s,
                security=self.config.security,
            )
        except KafkaesqueConnectionError:
            self.state.connection_failed(address)
            raise
        self._connections[address] = connection
        return connection

    def abandon(self, address: Address, error: KafkaesqueError) -> None:
        """Give up on the connection to ``address`` as if it had been lost: it is closed with
        ``error`` as the reason (requests waiting on it fail with it; a late reply is never
        read), and the next request to ``address`` opens a new one. Tried last from now on."""
        connection = self._connections.get(address)
        if connection is not None:
            connection.abort(error)
        self.state.connection_failed(address)

    def existing_connection(self, address: Address) -> SyncConnection | None:
        """The connection to ``address`` if one was opened (it may have failed since)."""
        return self._connections.get(address)

    def _pipeline(self, requests: Sequence[steps.Request]) -> list[Response | KafkaesqueError]:
        sent: list[tuple[SyncConnection, int, float] | KafkaesqueError] = []
        for request in requests:
            try:
                connection = self.connection(request.address)
                deadline = time.monotonic() + request.timeout_s
                sent.append((connection, connection.send(request.command), deadline))
            except KafkaesqueError as exc:
                sent.append(exc)
        results: list[Response | KafkaesqueError] = []
        for request, item in zip(requests, sent, strict=True):
            if isinstance(item, KafkaesqueError):
                results.append(item)
                continue
            connection, ticket, deadline = item
            try:
                results.append(connection.wait(ticket, deadline))
                self.state.connection_ok(request.address)
            except KafkaesqueError as exc:
                self.state.connection_failed(request.address)
                results.append(exc)
        return results

    # -- cluster and admin ---------------------------------------------------------------------

    def refresh_metadata(self, topics: Iterable[str] = ()) -> ClusterMetadata:
        """Re-read ``METADATA`` (for ``topics``; none: all) and return the merged snapshot."""
        wanted = tuple(topics)
        snapshot = self.call(calls.metadata(wanted))
        self.state.update_metadata(snapshot, wanted)
        return self.state.metadata

    def ping(self) -> str:
        """``PING`` any broker; returns ``PONG``."""
        return self.call(calls.ping())

    def probe_brokers(self, timeout_s: float = 1.0) -> dict[int, KafkaesqueError | None]:
        """Every registered broker asked ``PING`` on a connection of its own: broker id → None
        if it answered ``+OK`` within ``timeout_s``, else the error that says why not.

        The registry (``METADATA``'s brokers, refreshed first if this client has none) lists
        every broker ever admitted, running or not: this is how a client tells a broker that
        is down (killed, stopped, cut off, paused) from a live one. Every broker is asked before
        any answer is awaited, so the answers take ``timeout_s`` at most in all (a connect that
        hangs, not refused, adds up to ``timeout_s`` each). Never retries; the probe connections
        are closed before it returns and the client's own connections are left alone.
        """
        if not self.state.metadata.brokers:
            self.refresh_metadata()
        brokers = sorted(self.state.metadata.brokers.items())
        deadline = time.monotonic() + timeout_s
        asked: dict[int, tuple[SyncConnection, int]] = {}
        result: dict[int, KafkaesqueError | None] = {}
        try:
            for broker_id, row in brokers:
                connection = None
                try:
                    connection = SyncConnection(
                        (row.host, row.port),
                        connect_timeout_s=timeout_s,
                        security=self.config.security,
                    )
                    asked[broker_id] = (connection, connection.send(Ping(), timeout_s=timeout_s))
                except KafkaesqueError as exc:
                    result[broker_id] = exc
                    if connection is not None:
                        connection.close()
            for broker_id, (connection, ticket) in asked.items():
                try:
                    expect_ok(connection.wait(ticket, deadline))
                    result[broker_id] = None
                except KafkaesqueError as exc:
                    result[broker_id] = exc
                except RemoteProtocolError as exc:
                    host, port = connection.address
                    result[broker_id] = reply_broken(f"{host}:{port}", exc)
        finally:
            for connection, _ in asked.values():
                connection.close()
        return {broker_id: result[broker_id] for broker_id, _ in brokers}

    def create_topic(
        self,
        topic: str,
        partitions: int,
        replication_factor: int,
        *,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
        compact: bool = False,
        fsync: Fsync | None = None,
    ) -> None:
        """Create a topic (``TOPIC_EXISTS`` if it exists, ``INVALID_CONFIG`` if the cluster
        cannot honour it). Retention None takes the broker's default; -1 is unlimited.
        ``fsync`` None takes each broker's ``--fsync`` (docs/operations.md)."""
        spec = CreateTopic(
            topic, partitions, replication_factor, retention_ms, retention_bytes, compact, fsync
        )
        self.call(calls.create_topic(spec))

    def alter_topic(
        self,
        topic: str,
        *,
        partitions: int | None = None,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
        compact: bool | None = None,
    ) -> bool:
        """Change a live topic (``ALTER``): more partitions (never fewer), retention (-1:
        unlimited), compaction; None leaves a setting as it is, and at least one must be given
        (``ValueError`` otherwise). Returns whether anything changed. ``INVALID_CONFIG`` for
        fewer partitions than the topic has; ``UNKNOWN_TOPIC``. Keys map by the new partition
        count once the producer's metadata shows it (docs/operations.md)."""
        if (partitions, retention_ms, retention_bytes, compact) == (None, None, None, None):
            raise ValueError("alter_topic: give at least one setting to change")
        spec = AlterTopic(topic, partitions, retention_ms, retention_bytes, compact)
        return self.call(calls.alter_topic(spec)) != "unchanged"

    def list_topics(self) -> list[TopicRow]:
        """Every topic's settings, sorted by name."""
        return self.call(calls.list_topics())

    def describe_topic(self, topic: str) -> TopicDescription:
        """A topic's settings and partitions (leader, replicas, start and end offsets)."""
        return self.call(calls.describe_topic(topic))

    def offsets_for_times(
        self, timestamps: Mapping[TopicPartition, int] | Mapping[tuple[str, int], int]
    ) -> dict[TopicPartition, int]:
        """For each partition, the earliest committed offset whose record timestamp is >= the
        given one (milliseconds since the epoch), or its high watermark if none is (where a
        consumer that seeks there waits for the next record): Kafka's ``offsetsForTimes``, read
        through each partition's leader and its time index (``DESCRIBE time=``). Timestamps
        need not increase along a partition: the answer is the first record that reaches the
        time. ``ValueError`` for a negative timestamp; ``UNKNOWN_PARTITION``, ``UNKNOWN_TOPIC``."""
        wanted = {TopicPartition(*tp): ts for tp, ts in timestamps.items()}
        return self.run(steps.offsets_for_times(self.state, self.config, wanted))

    def delete_topic(self, topic: str) -> None:
        """Delete a topic and its data."""
        self.call(calls.delete_topic(topic))

    def publish(
        self, topic: str, value: bytes, *, key: bytes | None = None, partition: int | None = None
    ) -> tuple[int, int]:
        """Publish one record unbatched (``PUB``); returns ``(partition, offset)``. For many
        records use a ``Producer``."""
        return self.call(calls.publish(topic, value, key=key, partition=partition))

    def fetch(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_bytes: int | None = None,
        wait_ms: int | None = None,
        replica: int | None = None,
    ) -> FetchResult:
        """One ``FETCH``: records at or after ``offset``, from the partition's leader.

        With ``replica`` (a broker id), from that broker's own replica instead (``FETCH ...
        replica=local``, never forwarded): what it holds committed, up to its own commit index,
        which a follower learns a moment after the leader (``high_watermark`` is that replica's).
        For checkers and operators comparing replicas; ``NO_REPLICA`` if it holds none.
        """
        return self.run(
            steps.fetch(
                self.state,
                self.config,
                topic,
                partition,
                offset,
                max_bytes=max_bytes,
                wait_ms=wait_ms,
                replica=replica,
            )
        )

    def fetch_batch(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_bytes: int | None = None,
        wait_ms: int | None = None,
    ) -> FetchedBatch:
        """One ``FETCH`` from the partition's leader, with retries, its payload left as the log
        stores it: whole committed batches, control batches included, for a reader that decodes
        in bulk (``data_batches`` says where the records lie; ``batch_records`` decodes them).
        Errors as ``fetch``'s, ``OFFSET_OUT_OF_RANGE`` included (never reset here)."""
        return self.call(
            fetched.fetch_batch(topic, partition, offset, max_bytes=max_bytes, wait_ms=wait_ms)
        )

    def partition_offsets(self, topic: str) -> dict[int, tuple[int, int]]:
        """Each partition of ``topic`` → ``(start, end)``: its log start and its high watermark
        (everything below is committed). A partition the broker answering ``DESCRIBE`` holds no
        replica of is asked of its leader. ``UNKNOWN_TOPIC``; ``NOT_LEADER`` (retriable) while
        such a partition has no leader."""
        return self.run(log_bounds.partition_offsets(self.state, self.config, topic))

    def latest(self, topic: str, key: bytes) -> ConsumerRecord | None:
        """The newest committed record of ``key`` in the compacted ``topic`` (``LATEST``),
        or None if the key has no value (never written, or deleted by a tombstone or by
        retention): read from the leader's key index, without a scan. Seed 002's "latest
        heartbeat of a producer by id". ``timestamp`` is -1 and ``headers`` empty (``+MSG``
        shows neither). ``KafkaesqueError`` ``NOT_COMPACTED`` for a topic that is not
        compacted; ``NOT_READY`` (a new leader still building its index) is retried."""
        return self.run(steps.latest(self.state, self.config, topic, key))

    def commit(self, group: str, topic: str, partition: int, offset: int) -> None:
        """Store ``offset`` as the next offset ``group`` reads from the partition."""
        self.call(calls.commit(group, topic, partition, offset))

    def commit_as_member(
        self, group: str, topic: str, partition: int, offset: int, member: str | None
    ) -> None:
        """``commit``, fenced: the broker refuses it (``NOT_ASSIGNED``) unless the subscription
        ``member`` owns the partition, so a member that lost it in a rebalance cannot move the
        group's offset (None: not fenced, as ``commit``)."""
        self.call(calls.commit(group, topic, partition, offset, member))

    def committed_offsets(self, group: str, topic: str) -> dict[int, int | None]:
        """The group's committed offsets: partition → offset (None: none committed)."""
        return self.call(calls.committed_offsets(group, topic))

    def describe_group(self, group: str, topic: str) -> list[GroupRow]:
        """Each partition of ``topic`` in ``group``: owner, committed offset and end."""
        return self.call(calls.describe_group(group, topic))

    def describe_consumer_group(
        self, group: str, topic: str | None = None
    ) -> list[GroupDescription]:
        """The group on each topic it reads (only ``topic`` if given): state, members (those
        without partitions too) and partitions; ``UNKNOWN_GROUP`` if the cluster knows nothing
        of it (no members, no committed offsets)."""
        return self.call(calls.describe_consumer_group(group, topic))

    def list_groups(self) -> list[GroupStateRow]:
        """Every consumer group, once per topic it reads, with its state and member count."""
        return self.call(calls.list_groups())

    def reset_offsets(
        self,
        group: str,
        topic: str,
        to: ResetKind | str,
        value: int | None = None,
        *,
        dry_run: bool = False,
    ) -> dict[int, int]:
        """Move an inactive group's committed offsets on ``topic``: ``to`` is ``earliest``,
        ``latest``, ``offset`` (``value``, kept within each partition's start and end) or
        ``time`` (``value`` in ms: each partition's first offset at or after it). Returns
        partition → new offset; ``GROUP_NOT_EMPTY`` while the group has members on ``topic``.
        ``dry_run``: check and compute the same, change nothing (Kafka's plan without
        ``--execute``)."""
        return self.call(calls.reset_offsets(group, topic, to, value, dry_run))

    def delete_group(self, group: str) -> None:
        """Delete an inactive group (its committed offsets on every topic): ``GROUP_NOT_EMPTY``
        while it has members, ``UNKNOWN_GROUP`` if there is none."""
        self.call(calls.delete_group(group))

    def partitions_for(self, topic: str) -> int:
        """How many partitions ``topic`` has (from metadata; refreshed if unknown)."""
        return self.run(steps.partition_count(self.state, self.config, topic))

    def add_broker(self, broker_id: int, peer: str, controller: str) -> None:
        """Admit broker ``broker_id`` to the cluster (``ADDBROKER``): it runs already, started
        with ``--join``; ``peer`` and ``controller`` (``host:port``) are where its Raft
        transport and its controller listen. Not retried after an outcome-unknown error."""
        self.call(calls.add_broker(broker_id, peer, controller))

    def elect_leaders(self, topic: str | None = None, partition: int | None = None) -> int:
        """Preferred-leader election (``ELECTLEADERS``, Kafka's ``kafka-leader-election
        --election-type preferred``): every registered broker is asked to hand the partitions
        it leads (``topic``'s, or only its ``partition``; None: all) to their preferred replica
        (the first of their replicas) if that replica is up and caught up. Returns how many
        transfers were started; they take a round trip each (watch ``describe_topic``). A
        broker that cannot be reached is passed over (it leads nothing its peers can see).
        ``UNKNOWN_TOPIC``/``UNKNOWN_PARTITION`` for what does not exist; ``NOT_AUTHORIZED``
        without the cluster's ``admin`` right."""
        moved = 0
        for broker in sorted(self.refresh_metadata().brokers.values(), key=lambda b: b.broker_id):
            try:
                moved += self.call(
                    calls.elect_leaders(topic, partition, (broker.host, broker.port))
                )
            except KafkaesqueConnectionError:
                continue
        return moved

    def remove_broker(self, broker_id: int, *, wait_s: float = calls.DECOMMISSION_WAIT_S) -> int:
        """Decommission broker ``broker_id`` (``REMOVEBROKER``): its replicas move to other
        brokers, then it leaves the controller quorum and the registry; returns how many
        partitions moved. The answer may take ``wait_s`` beyond the request timeout (the moves).
        ``INVALID_CONFIG`` if a partition would fall below its replication factor; ``TIMEOUT``
        (retriable) while moves go on. Stop the broker once it returns."""
        return self.call(calls.remove_broker(broker_id, wait_s))

    def reassign(
        self,
        topic: str,
        partition: int,
        replicas: Sequence[int],
        *,
        wait_s: float = calls.REASSIGN_WAIT_S,
    ) -> None:
        """Move a partition's replicas to exactly ``replicas`` (``REASSIGN``), one server at a
        time; returns once its Raft group has exactly these voters (``wait_s`` beyond the
        request timeout at most)."""
        self.call(calls.reassign(topic, partition, tuple(replicas), wait_s))

    def add_acl(self, acl: AclRow) -> None:
        """Add an ACL (``ACL ADD``; one that exists changes nothing). Every broker enforces it
        once the controller quorum has it. ``NOT_AUTHORIZED`` without ``alter`` on the cluster;
        ``LocalProtocolError`` for an ACL that breaks the rules (``acl_row_error``)."""
        self.call(calls.add_acl(acl))

    def remove_acl(self, acl: AclRow) -> int:
        """Remove an ACL given by its six fields (``ACL REMOVE``); returns how many were removed
        (0: there was none). ``NOT_AUTHORIZED`` without ``alter`` on the cluster."""
        return self.call(calls.remove_acl(acl))

    def list_acls(self, principal: str | None = None) -> list[AclRow]:
        """The cluster's ACLs (only those naming exactly ``principal``, e.g. ``User:alice``, when
        given). ``NOT_AUTHORIZED`` without ``describe`` on the cluster."""
        return self.call(calls.list_acls(principal))


def _own_client(client: Client | str | Sequence[str]) -> tuple[Client, bool]:
    if isinstance(client, Client):
        return client, False
    return Client(client), True


class RecordFuture:
    """The outcome of one record sent by a ``Producer``: ``get(timeout)`` waits for it."""

    __slots__ = ("_handle", "_producer")

    def __init__(self, handle: DeliveryHandle, producer: Producer) -> None:
        self._handle = handle
        self._producer = producer

    @property
    def handle(self) -> DeliveryHandle:
        """The pure outcome holder (``done``, ``result``, ``exception``, callbacks)."""
        return self._handle

    def done(self) -> bool:
        """Whether the outcome is known."""
        return self._handle.done()

    def get(self, timeout: float | None = None) -> RecordMetadata:
        """Where the record was stored; raises its ``KafkaesqueError``. Drives the producer's
        I/O while waiting (linger included); ``timeout`` seconds (None: the delivery timeout)."""
        self._producer._wait_until(self._handle.done, timeout)
        return self._handle.result()


class Producer(ProducerCounters):
    """A batching producer (blocking flavour). See ``ProducerCore`` for batching, partitioning,
    ordering and the at-least-once retry contract (retries may duplicate records).

    No background thread: I/O happens inside ``send``, ``poll``, ``flush``, ``RecordFuture.get``
    and ``close``. A batch waiting for ``linger_ms`` is sent by the next of those calls, so a
    program that stops sending calls ``flush`` (``close`` and the context manager do). ``send``
    itself does I/O only when a batch opened or closed, a linger or backoff ended, or
    ``REPLY_POLL_MS`` passed with batches in flight: most records cost no system call.
    """

    def __init__(
        self,
        client: Client | str | Sequence[str] = DEFAULT_BOOTSTRAP,
        config: ProducerConfig | None = None,
    ) -> None:
        self._client, self._owns_client = _own_client(client)
        self._core = ProducerCore(config)
        self._core.update_metadata(self._client.state.metadata)
        self._in_flight: dict[tuple[Address, int], int] = {}  # (address, ticket) -> batch id
        self._deadlines: dict[tuple[Address, int], float] = {}
        self._metadata_backoff_until = 0.0
        self._closed = False
        self._selector = selectors.DefaultSelector()  # the connections with batches in flight
        self._seen_changes = -1  # the core's ``changes`` at the last pump
        self._pump_due_ms = 0.0  # when ``send`` must pump again at the latest

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self.close(timeout=None if exc_type is None else 0.0)

    def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        *,
        partition: int | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
        timestamp_ms: int | None = None,
    ) -> RecordFuture:
        """Queue one record; returns its future at once (the record is sent in a batch).

        Blocks while the buffer is full (``max_buffered_bytes``), at most ``delivery_timeout_ms``.
        Raises ``KafkaesqueError`` now for what cannot succeed: an unknown topic (after a metadata
        refresh), a partition out of range, a record larger than ``max_request_bytes``.
        """
        if self._closed:
            raise RuntimeError("the producer is closed")
        core = self._core
        if not core.has_room():
            self._wait_until(core.has_room, None)
        now = time.monotonic() * 1000.0  # _now_ms(), inline: this runs for every record
        if timestamp_ms is None:
            timestamp_ms = time.time_ns() // 1_000_000
        if type(headers) is not tuple:
            headers = tuple(headers)
        try:
            handle = core.add(
                topic, value, key, headers, timestamp_ms, partition=partition, now_ms=now
            )
        except KafkaesqueError as exc:
            if exc.code is not ErrorCode.UNKNOWN_TOPIC:
                raise
            self._client.partitions_for(topic)  # UNKNOWN_TOPIC again if the cluster has none
            core.update_metadata(self._client.state.metadata)
            handle = core.add(
                topic, value, key, headers, timestamp_ms, partition=partition, now_ms=now
            )
        if core.changes != self._seen_changes or now >= self._pump_due_ms:
            self._pump(0.0)
        return RecordFuture(handle, self)

    def poll(self, timeout: float = 0.0) -> None:
        """Send what is ready and read the replies that arrive within ``timeout`` seconds."""
        self._pump(timeout)

    def flush(self, timeout: float | None = None) -> None:
        """Send everything now and wait until every record is delivered or failed.

        ``timeout`` seconds (None: the delivery timeout plus the request timeout); raises
        ``KafkaesqueConnectionError`` if records are still pending then."""
        self._core.flush()
        self._wait_until(lambda: self._core.pending == 0, timeout)

    def close(self, timeout: float | None = None) -> None:
        """Flush (``timeout`` as ``flush``), fail whatever is left, close the connections."""
        if self._closed:
            return
        try:
            self.flush(timeout)
        except KafkaesqueError:
            pass  # the records left are failed just below, each with the reason
        finally:
            self._closed = True
            self._core.fail_all(
                KafkaesqueConnectionError("the producer was closed before delivery", sent=True)
            )
            self._selector.close()
            if self._owns_client:
                self._client.close()

    def _wait_until(self, condition: Any, timeout: float | None) -> None:
        if timeout is None:
            timeout = (self.config.delivery_timeout_ms + self.config.request_timeout_ms) / 1000
        deadline = time.monotonic() + timeout
        while not condition():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise client_timeout(f"{self._core.pending} records still pending", sent=True)
            self._pump(remaining)

    def _pump(self, timeout: float) -> None:
        """One round: refresh metadata if asked, send ready batches, wait (up to ``timeout``,
        the next linger/backoff deadline, or a request deadline) for replies and read them, and
        send what those replies let go (the next batch of a partition that was busy)."""
        core = self._core
        self._send_ready()
        now = _now_ms()
        wake = core.next_wakeup_ms(now)
        limits = [now + timeout * 1000, *self._deadlines.values()]
        if wake is not None:
            limits.append(wake)
        wait_s = max(min(limits) - now, 0.0) / 1000
        if self._read_replies(wait_s):
            self._send_ready()
        now = _now_ms()
        wake = core.next_wakeup_ms(now)
        due = math.inf if wake is None else wake
        if self._in_flight:
            due = min(due, now + REPLY_POLL_MS)
        self._pump_due_ms = due
        self._seen_changes = core.changes

    def _send_ready(self) -> None:
        core, client = self._core, self._client
        silent = core.check_leaders(_now_ms())
        if core.metadata_wanted and time.monotonic() >= self._metadata_backoff_until:
            self._metadata_backoff_until = time.monotonic() + core.config.retry.backoff_s(1)
            for address in self._addresses(silent):
                client.state.connection_failed(address)  # ask another broker
            client.run(steps.refresh_metadata(client.state, client.config))
            core.update_metadata(client.state.metadata)
            for address in self._addresses(core.replaced_leaders(_now_ms())):
                self._abandon(address)
        now = _now_ms()
        for send in core.ready(now):
            broker = (
                core.metadata.brokers.get(send.broker_id) if send.broker_id is not None else None
            )
            address = (broker.host, broker.port) if broker else client.state.address_for(None)
            try:
                connection = client.connection(address)
                ticket = connection.send(
                    send.command, timeout_s=core.config.request_timeout_ms / 1000
                )
            except KafkaesqueError as exc:
                core.on_error(send.batch_id, exc, _now_ms())
                continue
            self._in_flight[(address, ticket)] = send.batch_id
            self._deadlines[(address, ticket)] = now + core.config.request_timeout_ms

    def _addresses(self, broker_ids: Iterable[int]) -> list[Address]:
        brokers = self._core.metadata.brokers
        return [(b.host, b.port) for b in map(brokers.get, broker_ids) if b is not None]

    def _abandon(self, address: Address) -> None:
        """Give up on ``address``'s connection (its broker is silent and another leads):
        close it, and end each batch in flight on it as a lost connection's, now, before a
        new connection to ``address`` can reuse its tickets."""
        error = leader_moved(f"{address[0]}:{address[1]}", self._core.config.leader_check_ms)
        self._client.abandon(address, error)
        now = _now_ms()
        for key in [key for key in self._in_flight if key[0] == address]:
            del self._deadlines[key]
            self._core.on_error(self._in_flight.pop(key), error, now)

    def _readable(self, connections: list[SyncConnection], wait_s: float) -> list[object]:
        """Which of ``connections`` have bytes to read, waiting up to ``wait_s``."""
        selector = self._selector
        wanted = set(connections)
        for key in list(selector.get_map().values()):
            if key.fileobj not in wanted:  # answered, or closed (then its fd may be reused)
                selector.unregister(key.fileobj)
        registered = {key.fileobj for key in selector.get_map().values()}
        for connection in connections:
            if connection not in registered:
                selector.register(connection, selectors.EVENT_READ)
        return [key.fileobj for key, _ in selector.select(wait_s)]

    def _read_replies(self, wait_s: float) -> bool:
        """Wait up to ``wait_s`` for replies and settle what they answer; False if none came."""
        core, client = self._core, self._client
        addresses = {address for address, _ in self._in_flight}
        connections = [client.connection(a) for a in addresses if not self._gone(a)]
        if connections:
            ready = self._readable(connections, wait_s)
            for connection in connections:
                if connection in ready:
                    with contextlib.suppress(KafkaesqueError):  # its tickets fail below
                        connection.read_some(0.0)
        elif wait_s > 0 and core.pending:
            time.sleep(wait_s)
        in_flight = len(self._in_flight)
        now = _now_ms()
        done: dict[Address, dict[int, Response]] = {}
        for key in list(self._in_flight):
            address, ticket = key
            maybe = client.existing_connection(address)
            if address not in done:
                done[address] = {} if maybe is None else maybe.take_done()
            response = done[address].pop(ticket, None)
            if response is not None:
                core.on_response(self._in_flight.pop(key), response, now)
            elif maybe is None or maybe.failure is not None:
                error = maybe.failure if maybe is not None else None
                client.state.connection_failed(address)
                core.on_error(
                    self._in_flight.pop(key),
                    error or KafkaesqueConnectionError("connection lost", sent=True),
                    now,
                )
            elif self._deadlines[key] <= now:
                maybe.close()  # the broker is stuck: its other requests fail too
                core.on_error(self._in_flight.pop(key), client_timeout("PUBB", sent=True), now)
            else:
                continue
            del self._deadlines[key]
        return len(self._in_flight) < in_flight

    def _gone(self, address: Address) -> bool:
        connection = self._client.existing_connection(address)
        return connection is None or connection.closed


class Consumer(ConsumerPositions):
    """Reads partitions by offset (``FETCH``), from their leaders, blocking.

    ``assign`` explicit partitions or ``assign_topic`` for all of a topic's partitions; ``seek``,
    ``position``; ``poll(timeout)`` returns the records available (long-polling up to
    ``timeout`` seconds); iterating (``for record in consumer``) polls forever (follow mode) or,
    with ``follow=False``, until every partition is read up to its high watermark.
    """

    def __init__(
        self,
        client: Client | str | Sequence[str] = DEFAULT_BOOTSTRAP,
        *,
        auto_offset_reset: OffsetReset | str = OffsetReset.EARLIEST,
        max_bytes: int = 1024 * 1024,
    ) -> None:
        self._client, self._owns_client = _own_client(client)
        self._core = ConsumerCore(reset=OffsetReset(auto_offset_reset), max_bytes=max_bytes)

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections (when this consumer opened them)."""
        if self._owns_client:
            self._client.close()

    def assign_topic(self, topic: str) -> list[TopicPartition]:
        """Read every partition of ``topic``; returns them."""
        partitions = [TopicPartition(topic, p) for p in range(self._client.partitions_for(topic))]
        self.assign(partitions)
        return partitions

    def seek_to_beginning(self) -> None:
        """Every assigned partition from its log start."""
        self._seek_rows(self._rows(), end=False)

    def seek_to_end(self) -> None:
        """Every assigned partition from its high watermark (only new records)."""
        self._seek_rows(self._rows(), end=True)

    def end_offsets(self) -> dict[TopicPartition, int]:
        """Each assigned partition's high watermark, as the cluster reports it now."""
        return {tp: row.end_offset or 0 for tp, row in self._rows().items()}

    def poll(self, timeout: float = 1.0, max_records: int | None = None) -> list[ConsumerRecord]:
        """The records available now, or the first that arrive within ``timeout`` seconds."""
        return self._client.run(
            steps.poll(
                self._client.state,
                self._client.config,
                self._core,
                timeout_s=timeout,
                max_records=max_records,
                clock=time.monotonic,
            )
        )

    def records(
        self, *, follow: bool = True, poll_timeout: float = 1.0
    ) -> Iterator[ConsumerRecord]:
        """Every record from the current positions on. With ``follow`` it never ends (stop by
        breaking out); without, it ends once each partition is read to the high watermark it
        had when the iteration started."""
        ends = None if follow else self.end_offsets()
        while True:
            if ends is not None and self._reached(ends):
                return
            yield from self.poll(poll_timeout)

    def __iter__(self) -> Iterator[ConsumerRecord]:
        return self.records(follow=True)

    def _rows(self) -> dict[TopicPartition, PartitionRow]:
        client = self._client
        return client.run(steps.partition_rows(client.state, client.config, self.assignment()))


class GroupConsumer:
    """Reads a topic through a consumer group subscription (``SUBS``/``CONS``/``COMMIT``).

    Starts from ``start`` if given, else from the group's committed offsets, else (per
    partition) from ``auto_offset_reset``. ``poll`` long-polls; ``commit`` stores the offsets
    reached so far (call it after processing: at-least-once).
    """

    def __init__(
        self,
        client: Client | str | Sequence[str],
        topic: str,
        group: str,
        *,
        partitions: int | None = None,
        start: int | None = None,
        auto_offset_reset: OffsetReset | str = OffsetReset.LATEST,
    ) -> None:
        self._client, self._owns_client = _own_client(client)
        self.cursor = steps.GroupCursor(
            topic,
            group,
            partitions=partitions,
            start=start,
            reset=OffsetReset(auto_offset_reset),
        )

    def __enter__(self) -> GroupConsumer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections (when this consumer opened them)."""
        if self._owns_client:
            self._client.close()

    def poll(self, timeout: float = 1.0, max_records: int | None = None) -> list[ConsumerRecord]:
        """The next records through the subscription, waiting up to ``timeout`` seconds."""
        return self._client.run(
            steps.group_poll(
                self._client.state,
                self._client.config,
                self.cursor,
                wait_ms=int(timeout * 1000),
                max_records=max_records,
            )
        )

    def commit(self) -> int:
        """Commit the offsets reached; returns how many partitions moved."""
        return self._client.run(
            steps.group_commit(self._client.state, self._client.config, self.cursor)
        )

    def leave(self) -> None:
        """Leave the group now (``LEAVE`` to the broker holding the subscription): its
        partitions move to the other members at once instead of after the session timeout.
        Nothing to do before the first poll joined. One attempt: ``KafkaesqueError`` if it
        fails or its outcome is unknown (the session timeout then does the same, later)."""
        cursor = self.cursor
        if cursor.subscription_id is None or cursor.address is None:
            return
        self._client.call(calls.leave(cursor.subscription_id, cursor.address))
        cursor.subscription_id = None

    def committed(self) -> dict[int, int | None]:
        """The group's committed offsets, as the cluster has them."""
        return self._client.committed_offsets(self.cursor.group, self.cursor.topic)
