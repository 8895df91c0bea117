"""The trio client: ``AsyncClient``, ``open_producer``/``AsyncProducer``, ``AsyncConsumer``,
``AsyncGroupConsumer``. Thin drivers of the same sans-I/O cores as the blocking client.

Structured concurrency: the producer's sender runs in a nursery that ``open_producer`` owns, so
nothing outlives the ``async with``; every wait is bounded by a deadline.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import trio

from kafkaesque.protocol import (
    AclRow,
    AlterTopic,
    CreateTopic,
    Fsync,
    GroupStateRow,
    PartitionRow,
    ResetKind,
    TopicRow,
)
from kafkaesque.storage import wall_clock_ms

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
from ._errors import KafkaesqueConnectionError, KafkaesqueError, client_timeout, leader_moved
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
    SendRequest,
)
from ._trio_connection import TrioConnection
from ._wire import Response

T = TypeVar("T")

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"


def _now_ms() -> float:
    return trio.current_time() * 1000.0


class AsyncClient:
    """A trio client of a Kafkaesque cluster; the async twin of ``Client`` (same methods, same
    errors, same retries). Safe to share between tasks: requests to one broker are pipelined on
    one connection. Use ``async with AsyncClient(bootstrap) as client``.
    """

    def __init__(
        self,
        bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP,
        *,
        config: steps.ClientConfig | None = None,
    ) -> None:
        self.config = config or steps.ClientConfig()
        self.state = steps.ClusterState(parse_bootstrap(bootstrap))
        self._connections: dict[Address, TrioConnection] = {}
        self._connecting: dict[Address, trio.Lock] = {}

    @classmethod
    def pinned(
        cls, address: str | Address, *, config: steps.ClientConfig | None = None
    ) -> AsyncClient:
        """A client of the one broker at ``address``: every call goes there (see
        ``Client.pinned``)."""
        client = cls(config=config)
        client.state = steps.PinnedState(one_address(address))
        return client

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close every connection. Idempotent."""
        connections, self._connections = list(self._connections.values()), {}
        for connection in connections:
            await connection.aclose()

    async def call(self, call: calls.Call[T]) -> T:
        """Run one ``Call`` with retries."""
        return await self.run(steps.run_call(self.state, self.config, call))

    async def run(self, operation: steps.Steps[T]) -> T:
        """Drive a sans-I/O operation to its end with trio I/O."""
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
                await trio.sleep(step.seconds)
            elif isinstance(step, steps.Request):
                outcome = (await self._pipeline((step,)))[0]
                if isinstance(outcome, KafkaesqueError):
                    outcome, failure = None, outcome
            else:
                outcome = await self._pipeline(step.requests)

    async def connection(self, address: Address) -> TrioConnection:
        """The open connection to ``address``, connecting if needed (``KafkaesqueConnectionError``
        if it cannot; the address is then tried last by later requests)."""
        lock = self._connecting.setdefault(address, trio.Lock())
        async with lock:  # one connect per broker, however many tasks want it
            connection = self._connections.pop(address, None)
            if connection is not None:
                if not connection.closed:
                    self._connections[address] = connection
                    return connection
                await connection.aclose()  # failed: release its socket
            try:
                connection = await TrioConnection.connect(
                    address,
                    timeout_s=self.config.connect_timeout_s,
                    security=self.config.security,
                )
            except KafkaesqueConnectionError:
                self.state.connection_failed(address)
                raise
            self._connections[address] = connection
            return connection

    def abandon(self, address: Address, error: KafkaesqueError) -> None:
        """Give up on the connection to ``address`` as if it had been lost: every request
        waiting on it fails with ``error`` at once, a late reply is never read, and the next
        request to ``address`` opens a new connection. The address is tried last from now on."""
        connection = self._connections.get(address)
        if connection is not None:
            connection.abort(error)
        self.state.connection_failed(address)

    async def request(self, address: Address, command: Any, timeout_s: float) -> Response:
        """One attempt of ``command`` on ``address``, no retry; marks the address's health."""
        try:
            connection = await self.connection(address)
            response = await connection.request(command, timeout_s)
        except KafkaesqueConnectionError:
            self.state.connection_failed(address)
            raise
        self.state.connection_ok(address)
        return response

    async def _pipeline(
        self, requests: Sequence[steps.Request]
    ) -> list[Response | KafkaesqueError]:
        sent: list[tuple[TrioConnection, int, float] | KafkaesqueError] = []
        for request in requests:
            try:
                connection = await self.connection(request.address)
                deadline = trio.current_time() + request.timeout_s
                sent.append((connection, await connection.send(request.command), deadline))
            except KafkaesqueError as exc:
                sent.append(exc)
        results: list[Response | KafkaesqueError] = []
        for request, item in zip(requests, sent, strict=True):
            if isinstance(item, KafkaesqueError):
                results.append(item)
                continue
            connection, ticket, deadline = item
            try:
                results.append(await connection.wait(ticket, deadline))
                self.state.connection_ok(request.address)
            except KafkaesqueError as exc:
                self.state.connection_failed(request.address)
                results.append(exc)
        return results

    # -- cluster and admin (see ``Client`` for the contracts) ----------------------------------

    async def refresh_metadata(self, topics: Iterable[str] = ()) -> ClusterMetadata:
        """Re-read ``METADATA`` (for ``topics``; none: all) and return the merged snapshot."""
        wanted = tuple(topics)
        self.state.update_metadata(await self.call(calls.metadata(wanted)), wanted)
        return self.state.metadata

    async def ping(self) -> str:
        """``PING`` any broker; returns ``PONG``."""
        return await self.call(calls.ping())

    async def create_topic(
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
        """Create a topic (see ``Client.create_topic``)."""
        spec = CreateTopic(
            topic, partitions, replication_factor, retention_ms, retention_bytes, compact, fsync
        )
        await self.call(calls.create_topic(spec))

    async def alter_topic(
        self,
        topic: str,
        *,
        partitions: int | None = None,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
        compact: bool | None = None,
    ) -> bool:
        """Change a live topic (see ``Client.alter_topic``); whether anything changed."""
        if (partitions, retention_ms, retention_bytes, compact) == (None, None, None, None):
            raise ValueError("alter_topic: give at least one setting to change")
        spec = AlterTopic(topic, partitions, retention_ms, retention_bytes, compact)
        return await self.call(calls.alter_topic(spec)) != "unchanged"

    async def list_topics(self) -> list[TopicRow]:
        """Every topic's settings, sorted by name."""
        return await self.call(calls.list_topics())

    async def describe_topic(self, topic: str) -> TopicDescription:
        """A topic's settings and partitions."""
        return await self.call(calls.describe_topic(topic))

    async def offsets_for_times(
        self, timestamps: Mapping[TopicPartition, int] | Mapping[tuple[str, int], int]
    ) -> dict[TopicPartition, int]:
        """For each partition, the earliest committed offset whose record timestamp is >= the
        given one, or its high watermark if none is (see ``Client.offsets_for_times``)."""
        wanted = {TopicPartition(*tp): ts for tp, ts in timestamps.items()}
        return await self.run(steps.offsets_for_times(self.state, self.config, wanted))

    async def delete_topic(self, topic: str) -> None:
        """Delete a topic and its data."""
        await self.call(calls.delete_topic(topic))

    async def publish(
        self, topic: str, value: bytes, *, key: bytes | None = None, partition: int | None = None
    ) -> tuple[int, int]:
        """Publish one record unbatched (``PUB``); returns ``(partition, offset)``."""
        return await self.call(calls.publish(topic, value, key=key, partition=partition))

    async def fetch(
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
        return await self.run(
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

    async def fetch_batch(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_bytes: int | None = None,
        wait_ms: int | None = None,
    ) -> FetchedBatch:
        """One ``FETCH`` from the partition's leader, its payload undecoded (see
        ``Client.fetch_batch``)."""
        return await self.call(
            fetched.fetch_batch(topic, partition, offset, max_bytes=max_bytes, wait_ms=wait_ms)
        )

    async def partition_offsets(self, topic: str) -> dict[int, tuple[int, int]]:
        """Each partition of ``topic`` → ``(start, end)`` (see ``Client.partition_offsets``)."""
        return await self.run(log_bounds.partition_offsets(self.state, self.config, topic))

    async def latest(self, topic: str, key: bytes) -> ConsumerRecord | None:
        """The newest committed record of ``key`` in the compacted ``topic`` (``LATEST``),
        or None if the key has no value (never written, or deleted by a tombstone or by
        retention): read from the leader's key index, without a scan. Seed 002's "latest
        heartbeat of a producer by id". ``timestamp`` is -1 and ``headers`` empty (``+MSG``
        shows neither). ``KafkaesqueError`` ``NOT_COMPACTED`` for a topic that is not
        compacted; ``NOT_READY`` (a new leader still building its index) is retried."""
        return await self.run(steps.latest(self.state, self.config, topic, key))

    async def commit(self, group: str, topic: str, partition: int, offset: int) -> None:
        """Store ``offset`` as the next offset ``group`` reads from the partition."""
        await self.call(calls.commit(group, topic, partition, offset))

    async def commit_as_member(
        self, group: str, topic: str, partition: int, offset: int, member: str | None
    ) -> None:
        """``commit``, fenced: the broker refuses it (``NOT_ASSIGNED``) unless the subscription
        ``member`` owns the partition, so a member that lost it in a rebalance cannot move the
        group's offset (None: not fenced, as ``commit``)."""
        await self.call(calls.commit(group, topic, partition, offset, member))

    async def committed_offsets(self, group: str, topic: str) -> dict[int, int | None]:
        """The group's committed offsets: partition → offset (None: none committed)."""
        return await self.call(calls.committed_offsets(group, topic))

    async def describe_consumer_group(
        self, group: str, topic: str | None = None
    ) -> list[GroupDescription]:
        """The group on each topic it reads (only ``topic`` if given): state, members (those
        without partitions too) and partitions; ``UNKNOWN_GROUP`` if the cluster knows nothing
        of it (no members, no committed offsets)."""
        return await self.call(calls.describe_consumer_group(group, topic))

    async def list_groups(self) -> list[GroupStateRow]:
        """Every consumer group, once per topic it reads, with its state and member count."""
        return await self.call(calls.list_groups())

    async def reset_offsets(
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
        return await self.call(calls.reset_offsets(group, topic, to, value, dry_run))

    async def delete_group(self, group: str) -> None:
        """Delete an inactive group (its committed offsets on every topic): ``GROUP_NOT_EMPTY``
        while it has members, ``UNKNOWN_GROUP`` if there is none."""
        await self.call(calls.delete_group(group))

    async def add_acl(self, acl: AclRow) -> None:
        """Add an ACL (see ``Client.add_acl``)."""
        await self.call(calls.add_acl(acl))

    async def remove_acl(self, acl: AclRow) -> int:
        """Remove an ACL; how many were removed (see ``Client.remove_acl``)."""
        return await self.call(calls.remove_acl(acl))

    async def list_acls(self, principal: str | None = None) -> list[AclRow]:
        """The cluster's ACLs, or those naming ``principal`` (see ``Client.list_acls``)."""
        return await self.call(calls.list_acls(principal))

    async def add_broker(self, broker_id: int, peer: str, controller: str) -> None:
        """Admit a broker started with ``--join`` (see ``Client.add_broker``)."""
        await self.call(calls.add_broker(broker_id, peer, controller))

    async def elect_leaders(self, topic: str | None = None, partition: int | None = None) -> int:
        """Preferred-leader election on every broker; how many transfers were started (see
        ``Client.elect_leaders``)."""
        brokers = (await self.refresh_metadata()).brokers
        moved = 0
        for broker in sorted(brokers.values(), key=lambda b: b.broker_id):
            try:
                moved += await self.call(
                    calls.elect_leaders(topic, partition, (broker.host, broker.port))
                )
            except KafkaesqueConnectionError:
                continue
        return moved

    async def remove_broker(
        self, broker_id: int, *, wait_s: float = calls.DECOMMISSION_WAIT_S
    ) -> int:
        """Decommission a broker; how many partitions moved (see ``Client.remove_broker``)."""
        return await self.call(calls.remove_broker(broker_id, wait_s))

    async def reassign(
        self,
        topic: str,
        partition: int,
        replicas: Sequence[int],
        *,
        wait_s: float = calls.REASSIGN_WAIT_S,
    ) -> None:
        """Move a partition's replicas (see ``Client.reassign``)."""
        await self.call(calls.reassign(topic, partition, tuple(replicas), wait_s))

    async def partitions_for(self, topic: str) -> int:
        """How many partitions ``topic`` has (from metadata; refreshed if unknown)."""
        return await self.run(steps.partition_count(self.state, self.config, topic))


@asynccontextmanager
async def _client_for(client: AsyncClient | str | Sequence[str]) -> AsyncIterator[AsyncClient]:
    if isinstance(client, AsyncClient):
        yield client
    else:
        async with AsyncClient(client) as own:
            yield own


class AsyncRecordFuture:
    """The outcome of one record sent by an ``AsyncProducer``: ``await future.get()``."""

    __slots__ = ("_handle", "_producer")

    def __init__(self, handle: DeliveryHandle, producer: AsyncProducer) -> None:
        self._handle = handle
        self._producer = producer

    @property
    def handle(self) -> DeliveryHandle:
        """The pure outcome holder (``done``, ``result``, ``exception``, callbacks)."""
        return self._handle

    def done(self) -> bool:
        """Whether the outcome is known."""
        return self._handle.done()

    async def get(self, timeout: float | None = None) -> RecordMetadata:
        """Where the record was stored; raises its ``KafkaesqueError``."""
        await self._producer._wait_until(self._handle.done, timeout)
        return self._handle.result()


@asynccontextmanager
async def open_producer(
    client: AsyncClient | str | Sequence[str] = DEFAULT_BOOTSTRAP,
    config: ProducerConfig | None = None,
) -> AsyncIterator[AsyncProducer]:
    """A batching producer whose sender runs until the ``async with`` ends.

    On a normal exit every record is flushed first (within the delivery timeout); on an
    exception, or if the flush times out, what is left fails with ``KafkaesqueConnectionError``.
    """
    async with _client_for(client) as own, trio.open_nursery() as nursery:
        producer = AsyncProducer(own, config, nursery)
        nursery.start_soon(producer._sender)
        try:
            yield producer
            await producer.flush()
        finally:
            producer._close()
            nursery.cancel_scope.cancel()


class AsyncProducer(ProducerCounters):
    """A batching producer (trio flavour); open it with ``open_producer``. See ``ProducerCore``
    for batching, partitioning, ordering and the at-least-once retry contract."""

    def __init__(
        self, client: AsyncClient, config: ProducerConfig | None, nursery: trio.Nursery
    ) -> None:
        self._client = client
        self._core = ProducerCore(config)
        self._core.update_metadata(client.state.metadata)
        self._nursery = nursery
        self._wakeup = trio.Event()  # the sender has something new to look at
        self._progress = trio.Event()  # some record was settled; replaced after each set
        self._metadata_backoff_until = 0.0
        self._closed = False
        self._seen_changes = -1  # the core's ``changes`` when the sender last looked

    async def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        *,
        partition: int | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
        timestamp_ms: int | None = None,
    ) -> AsyncRecordFuture:
        """Queue one record (see ``Producer.send``); waits only while the buffer is full."""
        if self._closed:
            raise RuntimeError("the producer is closed")
        core = self._core
        if core.metadata.partition_count(topic) is None:
            await self._client.partitions_for(topic)
            core.update_metadata(self._client.state.metadata)
        if not core.has_room():
            await self._wait_until(core.has_room, None)
        handle = core.add(
            topic,
            value,
            key,
            tuple(headers),
            int(wall_clock_ms()) if timestamp_ms is None else timestamp_ms,
            partition=partition,
            now_ms=_now_ms(),
        )
        if core.changes != self._seen_changes:  # a batch opened or closed: the sender acts
            self._wakeup.set()
        return AsyncRecordFuture(handle, self)

    async def flush(self, timeout: float | None = None) -> None:
        """Send everything now and wait until every record is settled (see ``Producer.flush``)."""
        self._core.flush()
        self._wakeup.set()
        await self._wait_until(lambda: self._core.pending == 0, timeout)

    async def _wait_until(self, condition: Callable[[], bool], timeout: float | None) -> None:
        if timeout is None:
            timeout = (self.config.delivery_timeout_ms + self.config.request_timeout_ms) / 1000
        with trio.move_on_after(timeout):
            while not condition():
                progress = self._progress
                await progress.wait()
            return
        raise client_timeout(f"{self._core.pending} records still pending", sent=True)

    def _notify(self) -> None:
        self._wakeup.set()
        self._progress.set()
        self._progress = trio.Event()

    def _close(self) -> None:
        self._closed = True
        self._core.fail_all(
            KafkaesqueConnectionError("the producer was closed before delivery", sent=True)
        )
        self._notify()

    async def _sender(self) -> None:
        core, client = self._core, self._client
        while True:
            silent = core.check_leaders(_now_ms())
            if core.metadata_wanted and trio.current_time() >= self._metadata_backoff_until:
                self._metadata_backoff_until = trio.current_time() + core.config.retry.backoff_s(1)
                for address in self._addresses(silent):
                    client.state.connection_failed(address)  # ask another broker
                await client.run(steps.refresh_metadata(client.state, client.config))
                core.update_metadata(client.state.metadata)
                for host, port in self._addresses(core.replaced_leaders(_now_ms())):
                    # The _send_one tasks waiting on it report their batches' end.
                    error = leader_moved(f"{host}:{port}", core.config.leader_check_ms)
                    client.abandon((host, port), error)
            now = _now_ms()
            for send in core.ready(now):
                self._nursery.start_soon(self._send_one, send)
            self._seen_changes = core.changes
            wake = core.next_wakeup_ms(now)
            wake_s = math.inf if wake is None else wake / 1000
            if core.metadata_wanted:
                wake_s = min(wake_s, self._metadata_backoff_until)
            self._wakeup = trio.Event()
            with trio.move_on_at(wake_s):
                await self._wakeup.wait()

    def _addresses(self, broker_ids: Iterable[int]) -> list[Address]:
        brokers = self._core.metadata.brokers
        return [(b.host, b.port) for b in map(brokers.get, broker_ids) if b is not None]

    async def _send_one(self, send: SendRequest) -> None:
        broker = None if send.broker_id is None else self._core.metadata.brokers.get(send.broker_id)
        address = (broker.host, broker.port) if broker else self._client.state.address_for(None)
        try:
            response = await self._client.request(
                address, send.command, self.config.request_timeout_ms / 1000
            )
        except KafkaesqueError as exc:
            self._core.on_error(send.batch_id, exc, _now_ms())
        else:
            self._core.on_response(send.batch_id, response, _now_ms())
        self._notify()


class AsyncConsumer(ConsumerPositions):
    """Reads partitions by offset (``FETCH``), trio flavour of ``Consumer``: ``await poll()``,
    ``async for record in consumer.records(follow=...)``."""

    def __init__(
        self,
        client: AsyncClient,
        *,
        auto_offset_reset: OffsetReset | str = OffsetReset.EARLIEST,
        max_bytes: int = 1024 * 1024,
    ) -> None:
        self._client = client
        self._core = ConsumerCore(reset=OffsetReset(auto_offset_reset), max_bytes=max_bytes)

    async def assign_topic(self, topic: str) -> list[TopicPartition]:
        """Read every partition of ``topic``; returns them."""
        count = await self._client.partitions_for(topic)
        partitions = [TopicPartition(topic, p) for p in range(count)]
        self.assign(partitions)
        return partitions

    async def seek_to_beginning(self) -> None:
        """Every assigned partition from its log start."""
        self._seek_rows(await self._rows(), end=False)

    async def seek_to_end(self) -> None:
        """Every assigned partition from its high watermark (only new records)."""
        self._seek_rows(await self._rows(), end=True)

    async def end_offsets(self) -> dict[TopicPartition, int]:
        """Each assigned partition's high watermark, as the cluster reports it now."""
        return {tp: row.end_offset or 0 for tp, row in (await self._rows()).items()}

    async def poll(
        self, timeout: float = 1.0, max_records: int | None = None
    ) -> list[ConsumerRecord]:
        """The records available now, or the first that arrive within ``timeout`` seconds."""
        client = self._client
        return await client.run(
            steps.poll(
                client.state,
                client.config,
                self._core,
                timeout_s=timeout,
                max_records=max_records,
                clock=trio.current_time,
            )
        )

    async def records(
        self, *, follow: bool = True, poll_timeout: float = 1.0
    ) -> AsyncIterator[ConsumerRecord]:
        """Every record from the current positions on (see ``Consumer.records``)."""
        ends = None if follow else await self.end_offsets()
        while ends is None or not self._reached(ends):
            for record in await self.poll(poll_timeout):
                yield record

    async def _rows(self) -> dict[TopicPartition, PartitionRow]:
        client = self._client
        return await client.run(
            steps.partition_rows(client.state, client.config, self.assignment())
        )


class AsyncGroupConsumer:
    """Reads a topic through a consumer group subscription, trio flavour of ``GroupConsumer``."""

    def __init__(
        self,
        client: AsyncClient,
        topic: str,
        group: str,
        *,
        partitions: int | None = None,
        start: int | None = None,
        auto_offset_reset: OffsetReset | str = OffsetReset.LATEST,
    ) -> None:
        self._client = client
        self.cursor = steps.GroupCursor(
            topic, group, partitions=partitions, start=start, reset=OffsetReset(auto_offset_reset)
        )

    async def poll(
        self, timeout: float = 1.0, max_records: int | None = None
    ) -> list[ConsumerRecord]:
        """The next records through the subscription, waiting up to ``timeout`` seconds."""
        client = self._client
        return await client.run(
            steps.group_poll(
                client.state,
                client.config,
                self.cursor,
                wait_ms=int(timeout * 1000),
                max_records=max_records,
            )
        )

    async def commit(self) -> int:
        """Commit the offsets reached; returns how many partitions moved."""
        client = self._client
        return await client.run(steps.group_commit(client.state, client.config, self.cursor))

    async def leave(self) -> None:
        """Leave the group now (``LEAVE`` to the broker holding the subscription): its
        partitions move to the other members at once instead of after the session timeout.
        Nothing to do before the first poll joined. One attempt: ``KafkaesqueError`` if it
        fails or its outcome is unknown (the session timeout then does the same, later)."""
        cursor = self.cursor
        if cursor.subscription_id is None or cursor.address is None:
            return
        await self._client.call(calls.leave(cursor.subscription_id, cursor.address))
