"""The clients of a run: each records every operation it makes into the history.

Two workloads, both checked by ``checker.check``:

* ``queue``: producer processes append unique values (``p<process>-<seq>``) to keyed partitions,
  half of them with idempotence on and half off; assign-mode consumers read every partition from
  the start, over and over (each pass is a new ``Assign`` session); and, once faults are healed,
  one ``FinalRead`` of every partition to its high watermark decides what was lost, and one
  ``ReplicaRead`` per broker reads its own replicas (``FETCH ... replica=local``) so that the
  checker compares them.
* ``groups``: members of one consumer group join (``Subscribe``), poll, commit what they read
  (with their member id, so a member that lost a partition is fenced), read the committed
  offsets back (``FetchCommitted``), and now and then leave (``LEAVE``) or crash (vanish
  without a word; the group notices after its session timeout).

Outcomes follow the client's error taxonomy: an error whose ``outcome_unknown`` is False is a
``fail`` (definitely not applied), any other is ``info``. Every process runs one operation at a
time, and every wait is bounded, so stopping the run takes at most one timeout.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

import trio

from kafkaesque.client import (
    AsyncClient,
    AsyncConsumer,
    AsyncGroupConsumer,
    ClientConfig,
    KafkaesqueError,
    ProducerConfig,
    TopicPartition,
    open_producer,
)

from ._secure import SecureSetup
from .history import (
    Assign,
    Commit,
    Crash,
    Event,
    EventType,
    FetchCommitted,
    FinalRead,
    HistoryWriter,
    Op,
    PartitionEnd,
    Poll,
    Process,
    Read,
    ReplicaRead,
    Seek,
    Send,
    Subscribe,
)
from .history import TopicPartition as HistoryTP

_NS = 1_000_000_000

Bootstrap = Callable[[], Sequence[str]]
"""The brokers a client starts from, asked each time one is opened: the cluster's members change
(a broker decommissioned, another admitted), and a client opened later must not start from
brokers that are gone only. Each client learns the rest from METADATA, as any client does."""


class Recorder:
    """Writes events to the history with times from one monotonic clock (ns since the start).

    Also keeps, for the report, the ok sends' (completion time, latency) pairs.
    """

    def __init__(self, writer: HistoryWriter) -> None:
        self.writer = writer
        self._t0 = time.monotonic_ns()
        self.send_latencies: list[tuple[float, float]] = []

    def now(self) -> int:
        return time.monotonic_ns() - self._t0

    def record(
        self,
        kind: EventType,
        process: Process,
        op: Op,
        node: str | None = None,
        *,
        error: BaseException | None = None,
    ) -> int:
        """Write one event now; returns its time (ns). ``error``: what it failed with."""
        t = self.now()
        why = None if error is None else repr(error)
        self.writer.write(Event(kind, process, t, op, node, why))
        return t


def outcome_of(exc: KafkaesqueError) -> EventType:
    """``fail`` only when the error says nothing was applied."""
    return "info" if exc.outcome_unknown else "fail"


@dataclass(frozen=True, slots=True)
class WorkloadOptions:
    """How many clients of each kind, and how hard they push."""

    topic: str = "jepsen"
    partitions: int = 4
    producers: int = 4
    consumers: int = 2
    group_members: int = 0  # the groups workload (0: off)
    group: str = "jepsen-group"
    keys: int = 32
    send_timeout_s: float = 12.0
    consumer_pass_s: float = 30.0  # an assign-mode consumer restarts from 0 this often
    rate_per_producer: float = 0.0  # sends/s per producer process (0: as fast as acked)
    secure: SecureSetup | None = None  # a --secure run: every client uses TLS and SCRAM


def _client(bootstrap: Sequence[str], opts: WorkloadOptions) -> AsyncClient:
    if opts.secure is None:
        return AsyncClient(list(bootstrap), config=ClientConfig())
    config = ClientConfig(security=opts.secure.client_security())
    return AsyncClient(list(bootstrap), config=config)


async def producer(
    rec: Recorder,
    process: int,
    bootstrap: Bootstrap,
    opts: WorkloadOptions,
    idempotent: bool,
    stop: trio.Event,
) -> None:
    """Send unique values until ``stop``; one send in flight at a time."""
    config = ProducerConfig(
        linger_ms=1.0,
        idempotent=idempotent,
        request_timeout_ms=4_000.0,
        delivery_timeout_ms=opts.send_timeout_s * 1000,
        # A plain producer never resends after an unknown outcome: each value is then sent
        # once, and a value the log holds twice is the broker's duplicate (the checker's rule).
        retry_unknown_outcome=idempotent,
    )
    rng = random.Random(process)
    seq = 0
    while not stop.is_set():
        try:
            async with _client(bootstrap(), opts) as client, open_producer(client, config) as prod:
                while not stop.is_set():
                    seq += 1
                    value = f"p{process}-{seq}"
                    key = f"k{rng.randrange(opts.keys)}"
                    op = Send(opts.topic, value, key=key, idempotent=idempotent)
                    t0 = rec.record("invoke", process, op)
                    try:
                        future = await prod.send(opts.topic, value.encode(), key.encode())
                        meta = await future.get(opts.send_timeout_s)
                    except KafkaesqueError as exc:
                        rec.record(outcome_of(exc), process, op, error=exc)
                        if not exc.retriable:
                            break  # reopen the producer: a fenced or broken one stays broken
                        await trio.sleep(0.05)
                        continue
                    t1 = rec.record(
                        "ok",
                        process,
                        Send(opts.topic, value, meta.partition, key, idempotent, meta.offset),
                    )
                    rec.send_latencies.append((t1 / _NS, (t1 - t0) / _NS))
                    if opts.rate_per_producer > 0:
                        await trio.sleep(1.0 / opts.rate_per_producer)
        except KafkaesqueError:
            # The producer could not even start (no broker answers): try again shortly.
            await trio.sleep(0.5)


def _reads(records: Sequence[object]) -> tuple[Read, ...]:
    out = []
    for r in records:
        value = getattr(r, "value", None)
        out.append(
            Read(
                getattr(r, "topic"),  # noqa: B009 - ConsumerRecord, typed loosely on purpose
                getattr(r, "partition"),  # noqa: B009
                getattr(r, "offset"),  # noqa: B009
                value.decode(errors="replace") if isinstance(value, bytes) else "",
            )
        )
    return tuple(out)


async def consumer(
    rec: Recorder, process: int, bootstrap: Bootstrap, opts: WorkloadOptions, stop: trio.Event
) -> None:
    """Read every partition from offset 0, starting over every ``consumer_pass_s``.

    A failed poll ends the reading session (the client may have moved its positions before
    failing): the next one seeks to just after the last record returned, and the checker holds
    its first record to be the first value at or after that offset.
    """
    positions: dict[int, int] = {}
    while not stop.is_set():
        pass_end = trio.current_time() + opts.consumer_pass_s
        positions.clear()
        while not stop.is_set() and trio.current_time() < pass_end:
            if not await _consumer_session(
                rec, process, bootstrap, opts, stop, pass_end, positions
            ):
                await trio.sleep(0.2)


async def _consumer_session(
    rec: Recorder,
    process: int,
    bootstrap: Bootstrap,
    opts: WorkloadOptions,
    stop: trio.Event,
    end: float,
    positions: dict[int, int],
) -> bool:
    """Assign every partition at ``positions`` (default 0) and poll until ``end``; False if a
    poll failed."""
    async with _client(bootstrap(), opts) as client:
        cons = AsyncConsumer(client)
        tps = [TopicPartition(opts.topic, p) for p in range(opts.partitions)]
        cons.assign(tps)
        for tp in tps:
            cons.seek(tp, positions.get(tp.partition, 0))
        seeks = tuple(Seek(opts.topic, p, positions.get(p, 0)) for p in range(opts.partitions))
        rec.record("invoke", process, Assign(seeks))
        rec.record("ok", process, Assign(seeks))
        # A deadline checked between polls, not a cancel scope: cancelling a poll in flight
        # would leave its invocation without a completion.
        while not stop.is_set() and trio.current_time() < end:
            rec.record("invoke", process, Poll())
            try:
                with trio.fail_after(10):
                    records = await cons.poll(timeout=0.5)
            except (KafkaesqueError, trio.TooSlowError):
                rec.record("fail", process, Poll())
                return False
            reads = _reads(records)
            for r in reads:
                positions[r.partition] = r.offset + 1
            rec.record("ok", process, Poll(reads))
    return True


async def group_member(
    rec: Recorder, process: int, bootstrap: Bootstrap, opts: WorkloadOptions, stop: trio.Event
) -> None:
    """Join, poll and commit; now and then leave cleanly or crash, then join again."""
    rng = random.Random(1000 + process)
    while not stop.is_set():
        async with _client(bootstrap(), opts) as client:
            member = AsyncGroupConsumer(
                client, opts.topic, opts.group, auto_offset_reset="earliest"
            )
            sub = Subscribe(opts.group, (opts.topic,))
            rec.record("invoke", process, sub)
            rec.record("ok", process, sub)
            end = trio.current_time() + rng.uniform(5.0, 20.0)
            while not stop.is_set() and trio.current_time() < end:
                await _member_round(rec, process, client, member, opts)
            if rng.random() < 0.5 and member.cursor.subscription_id and member.cursor.address:
                await _leave(member)
            rec.record("ok", process, Crash())  # the session ends; its positions with it
        await trio.sleep(rng.uniform(0.0, 2.0))


async def _member_round(
    rec: Recorder,
    process: int,
    client: AsyncClient,
    member: AsyncGroupConsumer,
    opts: WorkloadOptions,
) -> None:
    rec.record("invoke", process, Poll(group=opts.group))
    try:
        with trio.fail_after(10):
            records = await member.poll(timeout=0.5)
    except (KafkaesqueError, trio.TooSlowError):
        rec.record("fail", process, Poll(group=opts.group))
        await trio.sleep(0.2)
        return
    rec.record("ok", process, Poll(_reads(records), group=opts.group))
    cursor = member.cursor
    moved = {p: o for p, o in cursor.offsets.items() if cursor.committed.get(p) != o}
    for partition, offset in sorted(moved.items()):
        op = Commit(opts.group, opts.topic, partition, offset, cursor.subscription_id)
        rec.record("invoke", process, op)
        try:
            with trio.fail_after(10):
                await client.commit_as_member(
                    opts.group, opts.topic, partition, offset, cursor.subscription_id
                )
        except KafkaesqueError as exc:
            rec.record(outcome_of(exc), process, op, error=exc)
            continue
        except trio.TooSlowError:
            rec.record("info", process, op)
            continue
        cursor.committed[partition] = offset
        rec.record("ok", process, op)
    # Read the committed offsets back (the checker holds them to never go backwards).
    for partition in sorted(moved):
        fetch = FetchCommitted(opts.group, opts.topic, partition)
        rec.record("invoke", process, fetch)
        try:
            with trio.fail_after(10):
                offsets = await client.committed_offsets(opts.group, opts.topic)
        except (KafkaesqueError, trio.TooSlowError):
            rec.record("fail", process, fetch)
            continue
        done = FetchCommitted(opts.group, opts.topic, partition, offsets.get(partition))
        rec.record("ok", process, done)


async def _leave(member: AsyncGroupConsumer) -> None:
    # Leaving is a courtesy; the session timeout does the same later.
    with trio.move_on_after(3), contextlib.suppress(KafkaesqueError):
        await member.leave()


async def final_read(
    rec: Recorder,
    process: Process,
    bootstrap: Sequence[str],
    opts: WorkloadOptions,
    high_watermarks: Callable[[], Awaitable[Mapping[int, int]]],
) -> bool:
    """Read every partition from 0 to its high watermark; True if complete (``ok``).

    ``high_watermarks`` gives partition → end; it is asked again once that end is reached, and
    the read goes on until two answers in a row are reached (a lagging replica's stale end
    must not pass for the partition's end: that would report every later record lost). A
    partition it gives no end for makes the read incomplete (``info``).
    """
    tps = tuple(HistoryTP(opts.topic, p) for p in range(opts.partitions))
    rec.record("invoke", process, FinalRead(tps))
    reads: list[Read] = []
    async with _client(bootstrap, opts) as client:
        cons = AsyncConsumer(client)
        assigned = [TopicPartition(opts.topic, p) for p in range(opts.partitions)]
        cons.assign(assigned)
        for tp in assigned:
            cons.seek(tp, 0)
        try:
            with trio.fail_after(180):
                confirmed = 0
                while confirmed < 2:
                    ends = await high_watermarks()
                    if set(ends) != set(range(opts.partitions)):
                        raise KafkaesqueError(None, "no end known", retriable=True,
                                              outcome_unknown=False)  # fmt: skip
                    reached = all(
                        (cons.position(TopicPartition(opts.topic, p)) or 0) >= end
                        for p, end in ends.items()
                    )
                    if reached:
                        confirmed += 1
                        continue
                    confirmed = 0
                    for _ in range(1000):
                        records = await cons.poll(timeout=1.0)
                        reads.extend(_reads(records))
                        if not records:
                            break
        except (KafkaesqueError, trio.TooSlowError):
            rec.record("info", process, FinalRead(tps, tuple(reads)))
            return False
    rec.record("ok", process, FinalRead(tps, tuple(reads)))
    return True


REPLICA_CONVERGE_S = 30.0
"""How long the replica reads wait for the replicas of a partition to report one end."""
_REPLICA_READ_S = 120.0  # one broker's whole read
_REPLICA_FETCH_BYTES = 1 << 20


async def replica_reads(
    rec: Recorder,
    brokers: Mapping[int, tuple[str, int]],
    opts: WorkloadOptions,
    high_watermarks: Callable[[], Awaitable[Mapping[int, int]]],
) -> None:
    """Read every broker's own replica of every partition (``FETCH ... replica=local``), one
    ``ReplicaRead`` per broker (process ``replica-<id>``, node ``n<id>``).

    First waits, up to ``REPLICA_CONVERGE_S``, until every replica of each partition reports
    one end at least the partition's high watermark (``high_watermarks``): replicas that have
    converged are compared over the whole log. One that has not is read anyway, up to its own
    end: the checker holds it only to what it says it committed. A partition a broker holds no
    replica of (``NO_REPLICA``) is left out of its read; any other failure ends that broker's
    read ``info``. With no broker running (each stopped on its own) there is none to read.
    """
    if not brokers:
        return
    async with _client([f"{h}:{p}" for h, p in brokers.values()], opts) as client:

        async def end_of(node: int, partition: int) -> int | None:
            """The replica's high watermark; None if the broker holds no replica. (The client
            finds broker ``node`` by its METADATA: the client address it was started with,
            ``brokers[node]``.)"""
            try:
                with trio.fail_after(10):
                    got = await client.fetch(opts.topic, partition, 0, max_bytes=1, replica=node)
            except KafkaesqueError as exc:
                if exc.code_name == "NO_REPLICA":
                    return None
                raise
            return got.high_watermark if got.high_watermark is not None else got.next_offset

        with trio.move_on_after(REPLICA_CONVERGE_S):
            while True:
                try:
                    target = await high_watermarks()
                    ends = {
                        (node, p): await end_of(node, p)
                        for node in brokers
                        for p in range(opts.partitions)
                    }
                except (KafkaesqueError, trio.TooSlowError):
                    await trio.sleep(0.5)
                    continue
                if all(
                    end is None or end >= target.get(p, 0) for (_, p), end in ends.items()
                ) and all(
                    len({e for (_, q), e in ends.items() if q == p and e is not None}) <= 1
                    for p in range(opts.partitions)
                ):
                    break
                await trio.sleep(0.5)

        for node in sorted(brokers):
            await _replica_read(rec, client, node, opts, end_of)


async def _replica_read(
    rec: Recorder,
    client: AsyncClient,
    node: int,
    opts: WorkloadOptions,
    end_of: Callable[[int, int], Awaitable[int | None]],
) -> None:
    process, where = f"replica-{node}", f"n{node}"
    rec.record("invoke", process, ReplicaRead(), where)
    reads: list[Read] = []
    ends: list[PartitionEnd] = []
    try:
        with trio.fail_after(_REPLICA_READ_S):
            for partition in range(opts.partitions):
                end = await end_of(node, partition)
                if end is None:
                    continue  # no replica here
                offset = 0
                while offset < end:
                    got = await client.fetch(
                        opts.topic, partition, offset, max_bytes=_REPLICA_FETCH_BYTES, replica=node
                    )
                    reads.extend(_reads([r for r in got.records if r.offset < end]))
                    if got.next_offset <= offset:
                        raise KafkaesqueError(None, f"no progress at offset {offset}",
                                              retriable=False, outcome_unknown=False)  # fmt: skip
                    offset = got.next_offset
                ends.append(PartitionEnd(opts.topic, partition, end))
    except (KafkaesqueError, trio.TooSlowError):
        rec.record("info", process, ReplicaRead(tuple(ends), tuple(reads)), where)
        return
    rec.record("ok", process, ReplicaRead(tuple(ends), tuple(reads)), where)
