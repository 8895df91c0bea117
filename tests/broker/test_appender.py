"""The partition appender (PUBS, PUB, MQTT): when it seals its open batch (Nagle's rule), that
it starts batches from ``add`` and from the outcome of the batch before (no task, no await; in
order and within ``WINDOW`` when an outcome is told inside a start), and how it stamps batches,
over a write path that commits only when the test says so (a pure unit: the
appender's logic, no broker); and how a batch's outcome reaches its flight over a real write path
and Raft groups whose messages the test delivers by hand (no sockets)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, cast

import pytest
import trio
import trio.testing

from kafkaesque.broker._appender import _MAX_BATCH_RECORDS, Flight, PartitionAppender
from kafkaesque.broker._errors import RequestError
from kafkaesque.broker._forwarding import Forwarder
from kafkaesque.broker._leaders import LeaderTable
from kafkaesque.broker._producers import WINDOW
from kafkaesque.broker._reads import read_committed
from kafkaesque.broker._writes import WritePath, _Failed
from kafkaesque.protocol import Acks, ErrorCode
from kafkaesque.raft import Role
from kafkaesque.raft.driver import MultiRaft
from kafkaesque.storage import NO_PRODUCER_ID, Record, build_batch, decode_header


class _HeldWrites:
    """Records the size of each batch started; each write commits when ``commit`` is called."""

    timeout = 5.0

    def __init__(self) -> None:
        self.started: list[int] = []
        self.stamps: list[tuple[int, int]] = []  # (producer id, base sequence) of each batch
        self._held: list[tuple[int, trio.Event, list[int]]] = []  # count, committed, offsets
        self._next = 0

    def start(self, log_id: str, batch: bytes, count: int, *args: Any) -> None:
        self.started.append(count)
        header = decode_header(batch)
        self.stamps.append((header.producer_id, header.base_sequence))

    def when_written(self, *args: Any) -> bool:
        return False  # every write is awaited, by ``write``

    async def write(self, log_id: str, batch: bytes, count: int, *args: Any, **kw: Any) -> Any:
        committed, offsets = trio.Event(), list[int]()
        self._held.append((count, committed, offsets))
        await committed.wait()
        return offsets[0], offsets[1]

    def commit(self) -> None:
        """Commit the oldest write still held."""
        count, committed, offsets = self._held.pop(0)
        offsets += [self._next, self._next + count - 1]
        self._next += count
        committed.set()


async def _add(appender: PartitionAppender, n: int) -> Flight:
    flight = Flight(0)
    for i in range(n):
        flight, _ = appender.add(Record(value=b"reading %d" % i))
    await trio.testing.wait_all_tasks_blocked()
    return flight


async def test_small_batches_wait_for_the_one_in_flight_and_full_ones_are_pipelined() -> None:
    writes = _HeldWrites()
    appender = PartitionAppender(
        "readings-0", 0, Acks.QUORUM, cast(WritePath, writes), eager_flights=1
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(appender.run, nursery)
        await _add(appender, 1)
        assert writes.started == [1]  # nothing in flight: a trickle goes out record by record
        waiting = await _add(appender, 10)
        assert writes.started == [1]  # one batch in flight: the next one grows meanwhile
        writes.commit()
        await trio.testing.wait_all_tasks_blocked()
        assert writes.started == [1, 10]
        await _add(appender, 64)
        assert writes.started == [1, 10, 64]  # big enough to go beside the one in flight
        writes.commit()
        writes.commit()
        await trio.testing.wait_all_tasks_blocked()
        assert waiting.done.is_set() and waiting.error is None and waiting.base == 1
        nursery.cancel_scope.cancel()


async def test_by_default_a_trickle_goes_record_by_record_beside_one_in_flight() -> None:
    # Issue 36: with Nagle's rule alone, a record that came while a lone record was in flight
    # waited for its whole commit round (bench.write_trace: about a round of latency per write
    # at 1,000 msg/s). A second single record now goes beside it; behind two, or beside a
    # batch of several records (a load, not a trickle), Nagle's rule holds.
    writes = _HeldWrites()
    appender = PartitionAppender("readings-0", 0, Acks.QUORUM, cast(WritePath, writes))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(appender.run, nursery)
        await _add(appender, 1)
        await _add(appender, 1)
        assert writes.started == [1, 1]  # the second did not wait for the first's round
        waiting = await _add(appender, 5)
        assert writes.started == [1, 1]  # two in flight: the next grows meanwhile
        writes.commit()
        await trio.testing.wait_all_tasks_blocked()
        assert writes.started == [1, 1, 5]  # one single in flight: it goes
        await _add(appender, 1)
        writes.commit()
        await trio.testing.wait_all_tasks_blocked()
        assert writes.started == [1, 1, 5]  # beside a batch of five: it waits (Nagle)
        writes.commit()
        await trio.testing.wait_all_tasks_blocked()
        assert writes.started == [1, 1, 5, 1]
        assert waiting.done.is_set() and waiting.error is None and waiting.base == 2
        writes.commit()
        await trio.testing.wait_all_tasks_blocked()
        flights = [appender.add(Record(value=b"reading %d" % i))[0] for i in range(150)]
        assert writes.started == [1, 1, 5, 1, 1, 1, 64, 64]  # a burst: still few batches
        await trio.testing.wait_all_tasks_blocked()
        for _ in range(4):
            writes.commit()
            await trio.testing.wait_all_tasks_blocked()
        assert writes.started == [1, 1, 5, 1, 1, 1, 64, 64, 20]
        writes.commit()
        await trio.testing.wait_all_tasks_blocked()
        assert all(f.done.is_set() and f.error is None for f in flights)
        nursery.cancel_scope.cancel()


async def test_every_batch_carries_the_appenders_producer_id_and_its_next_sequence() -> None:
    # A PUB the broker retries after an unknown outcome must not be appended twice: the leader
    # recognises the retry by these stamps (issue 23: 22 plain PUBs were in the log twice).
    writes = _HeldWrites()
    appender = PartitionAppender(
        "orders-0", 0, Acks.LEADER, cast(WritePath, writes), eager_flights=1
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(appender.run, nursery)
        await _add(appender, 1)
        await _add(appender, 3)
        writes.commit()
        await trio.testing.wait_all_tasks_blocked()
        await _add(appender, 2)
        writes.commit()
        await trio.testing.wait_all_tasks_blocked()
        assert writes.started == [1, 3, 2]
        producer_ids = {pid for pid, _ in writes.stamps}
        assert len(producer_ids) == 1 and NO_PRODUCER_ID not in producer_ids
        assert [seq for _, seq in writes.stamps] == [0, 1, 4]
        nursery.cancel_scope.cancel()


async def test_a_batch_starts_inside_add_and_the_next_inside_the_outcome_with_no_task() -> None:
    # Issue 22: a task woken by every ``add`` cost a pass of the scheduler per write; ``add``
    # now starts what may go before it returns, and the outcome of a batch starts the next
    # one from the context that tells it. Nothing here awaits, and no task is spawned.
    writes = _ToldWrites()
    appender = PartitionAppender(
        "readings-0", 0, Acks.QUORUM, cast(WritePath, writes), eager_flights=1
    )
    spawns = _Spawns()
    trio.lowlevel.add_instrument(spawns)
    try:
        first, _ = appender.add(Record(value=b"reading"))
        assert writes.started == [1]  # started in ``add``: no await since
        second, index = appender.add(Record(value=b"reading"))
        third, _ = appender.add(Record(value=b"reading"))
        assert second is third and writes.started == [1]  # growing behind the one in flight
        writes.tell()
        assert first.done.is_set() and first.base == 0
        assert writes.started == [1, 2]  # started by the outcome of the first
        writes.tell()
        assert second.done.is_set() and second.base + index == 1
    finally:
        trio.lowlevel.remove_instrument(spawns)
    assert spawns.names == []


async def test_a_pipelined_burst_goes_as_few_batches_not_one_per_record() -> None:
    # A chunk of PUBS read at once is added with no await between the records: the first goes
    # alone (nothing in flight), the rest grow behind it (Nagle) and go in pipelining-sized
    # batches, never one batch per record.
    writes = _HeldWrites()
    appender = PartitionAppender(
        "readings-0", 0, Acks.QUORUM, cast(WritePath, writes), eager_flights=1
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(appender.run, nursery)
        flights = [appender.add(Record(value=b"reading %d" % i))[0] for i in range(150)]
        assert writes.started == [1, 64, 64]  # 21 left open: the batch in flight is small
        await trio.testing.wait_all_tasks_blocked()
        for _ in range(3):
            writes.commit()
            await trio.testing.wait_all_tasks_blocked()
        assert writes.started == [1, 64, 64, 21]  # sealed when nothing was in flight any more
        writes.commit()
        await trio.testing.wait_all_tasks_blocked()
        assert all(f.done.is_set() and f.error is None for f in flights)
        assert [seq for _, seq in writes.stamps] == [0, 1, 65, 129]
        nursery.cancel_scope.cancel()


async def test_a_batch_of_big_records_is_pipelined_by_its_bytes_keys_included() -> None:
    writes = _ToldWrites()
    appender = PartitionAppender(
        "readings-0", 0, Acks.QUORUM, cast(WritePath, writes), eager_flights=1
    )
    big = b"x" * (40 << 10)  # two of them pass the pipelining size in bytes, not in records
    appender.add(Record(value=big))
    appender.add(Record(value=big))
    assert writes.started == [1]
    appender.add(Record(value=big))
    assert writes.started == [1, 2]
    appender.add(Record(key=big, value=None))
    appender.add(Record(key=big, value=b""))
    assert writes.started == [1, 2, 2]


class _ToldWrites:
    """Tells every batch's outcome by the ``when_written`` callback: at once (inside the call)
    while ``at_once``, else when ``tell`` is called. Records, for each start, how many batches
    were in flight and how deep inside a callback it came."""

    timeout = 5.0

    def __init__(self) -> None:
        self.at_once = False
        self.started: list[int] = []
        self.stamps: list[int] = []  # base sequences, in start order
        self.in_flight = 0
        self.most_in_flight = 0
        self.depth = 0  # callbacks running now
        self.deepest_start = 0
        self._held: list[tuple[int, Any]] = []  # count, callback
        self._next = 0

    def start(self, log_id: str, batch: bytes, count: int, *args: Any) -> object:
        self.started.append(count)
        self.stamps.append(decode_header(batch).base_sequence)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        self.deepest_start = max(self.deepest_start, self.depth)
        return object()

    def when_written(self, attempt: object, acks: Acks, deadline: float, callback: Any) -> bool:
        if self.at_once:
            self._call(len(self.started) and self.started[-1], callback)
        else:
            self._held.append((self.started[-1], callback))
        return True

    def tell(self) -> None:
        """Tell the oldest untold batch it was written."""
        self._call(*self._held.pop(0))

    def _call(self, count: int, callback: Any) -> None:
        first, self._next = self._next, self._next + count
        self.in_flight -= 1
        self.depth += 1
        try:
            callback((first, first + count - 1))
        finally:
            self.depth -= 1


async def test_an_outcome_told_inside_the_start_starts_the_next_batch_from_the_outer_loop() -> None:
    # ``when_written`` may call back at once (a duplicate the log holds already): that finishes
    # the flight and would start the next batch from inside the start. Batches must still go
    # in order, one start at a time, never more than WINDOW in flight.
    writes = _ToldWrites()
    appender = PartitionAppender(
        "readings-0", 0, Acks.QUORUM, cast(WritePath, writes), eager_flights=1
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(appender.run, nursery)
        total = 1 + 64 * (WINDOW - 1) + 2 * _MAX_BATCH_RECORDS + 10
        flights = [appender.add(Record(value=b"%d" % i))[0] for i in range(total)]
        assert writes.started == [1] + [64] * (WINDOW - 1)  # the window is full: more wait
        assert len(appender._sealed) == 2  # full batches, waiting for room in the window
        writes.at_once = True
        writes.tell()  # finishes the first: the full ones start, each told inside its start
        assert writes.started == [1] + [64] * (WINDOW - 1) + [_MAX_BATCH_RECORDS] * 2
        assert writes.deepest_start == 1  # started from the first callback's loop, not deeper
        assert writes.most_in_flight <= WINDOW
        for _ in range(WINDOW - 1):
            writes.tell()  # the last one seals and starts the 10 left, told at once too
        assert sum(writes.started) == total
        assert writes.stamps == [0, *itertools.accumulate(writes.started[:-1])]
        assert all(f.done.is_set() and f.error is None for f in flights)
        # (this fake hands out offsets in the order it tells, which is not the start order)
        assert [flights[i].base for i in (0, total - 1)] == [0, total - 10]
        nursery.cancel_scope.cancel()


async def test_a_record_added_inside_an_outcome_told_at_once_goes_after_it_in_order() -> None:
    # A flight's waiter may add a record from inside the outcome of its batch, told inside the
    # batch's start: that record's batch starts from the loop already running, after it.
    writes = _ToldWrites()
    appender = PartitionAppender(
        "readings-0", 0, Acks.QUORUM, cast(WritePath, writes), eager_flights=1
    )
    offsets: list[int] = []

    def add_more(flight: Flight, index: int, left: int) -> None:
        offsets.append(flight.base + index)
        if left:
            more, more_index = appender.add(Record(value=b"more"))
            more.notify(lambda: add_more(more, more_index, left - 1))

    appender.add(Record(value=b"first"))  # in flight, held
    flight, index = appender.add(Record(value=b"second"))
    flight.notify(lambda: add_more(flight, index, 200))
    writes.at_once = True
    writes.tell()  # starts the second, told at once: its waiter adds the next one, and so on
    assert offsets == list(range(1, 202))  # each one started and told after the one before
    assert writes.started == [1] * 202 and writes.stamps == list(range(202))
    assert writes.deepest_start == 1  # a flat loop in the first callback, not 200 nested starts


async def test_records_added_before_run_are_started_and_get_their_task_once_it_runs() -> None:
    # Broker.appender starts ``run`` with start_soon, so a publish may reach ``add`` first: the
    # batch starts at once; a batch that needs a task gets it when ``run`` gives the nursery.
    writes = _HeldWrites()
    appender = PartitionAppender(
        "readings-0", 0, Acks.QUORUM, cast(WritePath, writes), eager_flights=1
    )
    flight, _ = appender.add(Record(value=b"early"))
    waiting, _ = appender.add(Record(value=b"second"))
    assert writes.started == [1]  # started with no nursery; the second grows meanwhile
    async with trio.open_nursery() as nursery:
        nursery.start_soon(appender.run, nursery)
        await trio.testing.wait_all_tasks_blocked()
        writes.commit()  # held by the task ``run`` spawned for it
        await trio.testing.wait_all_tasks_blocked()
        assert flight.done.is_set() and flight.error is None and flight.base == 0
        assert writes.started == [1, 1]
        writes.commit()
        await trio.testing.wait_all_tasks_blocked()
        assert waiting.done.is_set() and waiting.base == 1
        nursery.cancel_scope.cancel()


async def test_fail_all_fails_what_waits_and_refuses_what_comes() -> None:
    writes = _HeldWrites()
    appender = PartitionAppender(
        "readings-0", 0, Acks.QUORUM, cast(WritePath, writes), eager_flights=1
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(appender.run, nursery)
        in_flight, _ = appender.add(Record(value=b"a"))
        queued, _ = appender.add(Record(value=b"b"))
        await trio.testing.wait_all_tasks_blocked()
        appender.fail_all(RequestError(ErrorCode.UNKNOWN_TOPIC, "the topic was deleted"))
        assert queued.done.is_set() and queued.error is not None
        with pytest.raises(RequestError):
            appender.add(Record(value=b"c"))
        writes.commit()
        with trio.fail_after(5):
            await appender.settled()
        assert in_flight.error is None and writes.started == [1]
        nursery.cancel_scope.cancel()


# -- the outcome of a batch, over real Raft groups -----------------------------------------------

GROUP = "readings/0"


class _Brokers:
    """``n`` Raft drivers whose transport items the test delivers (``settle``), and each one's
    write path; no broker is connected to another for forwarding (a forward fails at once)."""

    def __init__(self, root: Path, n: int, timeout: float = 30.0) -> None:
        self.queue: list[tuple[int, int, Any]] = []
        self.rafts = [
            MultiRaft(i, self._sender(i), state_dir=str(root / f"s{i}"), peers=range(n))
            for i in range(n)
        ]
        for raft in self.rafts:
            raft.add_replica(GROUP, str(root / f"b{raft.node_id}"), range(n))
        self.writes = [
            WritePath(
                r.node_id, r, LeaderTable(), Forwarder(lambda peer, item: False), timeout=timeout
            )
            for r in self.rafts
        ]

    def _sender(self, src: int) -> Any:
        def send(dst: int, item: Any) -> bool:
            self.queue.append((src, dst, item))
            return True

        return send

    async def settle(self, cut_off: int | None = None, ticks: int = 0) -> None:
        """Tick ``ticks`` times, then process and deliver until quiet; what goes to or from
        ``cut_off`` is lost."""
        for _ in range(ticks):
            for raft in self.rafts:
                if raft.node_id != cut_off:
                    raft.tick()
        for _ in range(50):
            for raft in self.rafts:
                await raft._process()
            if not self.queue and not any(raft._dirty for raft in self.rafts):
                return
            queue, self.queue = self.queue, []
            for src, dst, item in queue:
                if cut_off not in (src, dst):
                    self.rafts[dst].handle_items(src, [item])

    def leader(self) -> MultiRaft:
        (leader,) = [r for r in self.rafts if r.replicas[GROUP].role is Role.LEADER]
        return leader

    def close(self) -> None:
        for raft in self.rafts:
            raft.close()


def _unconnected(peer: int, item: Any) -> bool:
    return False  # the transport's answer for a broker it is not connected to


class _Spawns(trio.abc.Instrument):
    """The names of the tasks spawned while it is installed."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        self.names.append(task.name)


def _values(raft: MultiRaft) -> list[bytes | None]:
    return [r.value for r in raft.replicas[GROUP].committed_records()]


async def test_a_batch_its_own_leader_commits_finishes_its_flight_with_no_task(
    tmp_path: Path,
) -> None:
    # Issue 22: a task per batch, awaiting the commit, cost two passes of the scheduler per
    # write; the group now calls the appender back from the step that sees the commit.
    brokers = _Brokers(tmp_path, 1)
    await brokers.settle()
    appender = PartitionAppender(GROUP, 0, Acks.QUORUM, brokers.writes[0], eager_flights=1)
    written: list[float] = []
    brokers.writes[0].on_written = written.append
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(appender.run, nursery)
            await trio.testing.wait_all_tasks_blocked()
            spawns = _Spawns()
            trio.lowlevel.add_instrument(spawns)
            try:
                flight, index = appender.add(Record(value=b"reading"))
                await trio.testing.wait_all_tasks_blocked()  # proposed in ``add`` already
                assert not flight.done.is_set()
                await brokers.settle()  # the group commits it, and tells the appender
                assert flight.done.is_set()
            finally:
                trio.lowlevel.remove_instrument(spawns)
            assert spawns.names == []
            assert flight.error is None and flight.base + index == 1  # the leader's no-op is 0
            assert _values(brokers.rafts[0]) == [b"reading"]
            assert len(written) == 1  # the write path's latency metric heard of it
            nursery.cancel_scope.cancel()
    finally:
        brokers.close()


async def test_a_leaders_writes_need_no_task_of_the_appender_at_all(tmp_path: Path) -> None:
    # ``run`` is not even started: ``add`` proposes, and the step that commits a batch starts
    # the next one (a proposal from inside the Raft step's callback).
    brokers = _Brokers(tmp_path, 1)
    await brokers.settle()
    group = brokers.rafts[0].replicas[GROUP]
    appender = PartitionAppender(GROUP, 0, Acks.QUORUM, brokers.writes[0], eager_flights=1)
    try:
        spawns = _Spawns()
        trio.lowlevel.add_instrument(spawns)
        try:
            first, _ = appender.add(Record(value=b"one"))
            assert group.node.log.last_index() == 1  # proposed inside ``add``
            second, index = appender.add(Record(value=b"two"))
            third, _ = appender.add(Record(value=b"three"))
            assert group.node.log.last_index() == 1  # growing behind the one in flight
            await brokers.settle()  # commits the first, which proposes the next; commits it
            assert first.done.is_set() and first.error is None and first.base == 1
            assert second is third and second.done.is_set() and second.base + index == 2
        finally:
            trio.lowlevel.remove_instrument(spawns)
        assert spawns.names == []
        assert _values(brokers.rafts[0]) == [b"one", b"two", b"three"]
    finally:
        brokers.close()


async def _elect_another(brokers: _Brokers, old: MultiRaft) -> MultiRaft:
    """Election timeouts pass without a word from ``old``: another broker leads."""
    others = [r for r in brokers.rafts if r is not old]
    for _ in range(100):
        if any(r.replicas[GROUP].role is Role.LEADER for r in others):
            break
        await brokers.settle(cut_off=old.node_id, ticks=1)
    return next(r for r in others if r.replicas[GROUP].role is Role.LEADER)


async def test_a_batch_cut_before_it_commits_is_retried_by_a_task_and_gets_its_offset(
    tmp_path: Path,
) -> None:
    brokers = _Brokers(tmp_path, 3)
    await brokers.settle()
    old = brokers.leader()
    appender = PartitionAppender(
        GROUP, 0, Acks.QUORUM, brokers.writes[old.node_id], eager_flights=1
    )
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(appender.run, nursery)
            await trio.testing.wait_all_tasks_blocked()
            spawns = _Spawns()
            trio.lowlevel.add_instrument(spawns)
            flight, index = appender.add(Record(value=b"reading"))
            await trio.testing.wait_all_tasks_blocked()  # proposed; it never leaves ``old``
            new = await _elect_another(brokers, old)
            new.propose_nowait(GROUP, _one_record_batch(), 1)
            await brokers.settle(cut_off=old.node_id)
            assert spawns.names == []  # told nothing yet
            # The new leader's heartbeats reach the old one, which cuts the entry: the group
            # tells the appender, and the batch goes the task way (forwarding fails here).
            for _ in range(10):
                await brokers.settle(ticks=1)
            trio.lowlevel.remove_instrument(spawns)
            assert [name.rsplit(".", 1)[-1] for name in spawns.names] == ["_complete"]
            assert not flight.done.is_set()
            # The old leader leads again: the task's next attempt proposes it there.
            new.transfer_leadership(GROUP, old.node_id)
            with trio.fail_after(10):
                while not flight.done.is_set():
                    await brokers.settle(ticks=1)
                    await trio.sleep(0.01)  # the task's backoff
            assert flight.error is None
            values = _values(old)
            assert values.count(b"reading") == 1
            records = old.replicas[GROUP].committed_records()
            assert [r.offset for r in records if r.value == b"reading"] == [flight.base + index]
            nursery.cancel_scope.cancel()
    finally:
        brokers.close()


async def test_a_batch_untold_at_its_deadline_is_answered_timeout(tmp_path: Path) -> None:
    brokers = _Brokers(tmp_path, 3, timeout=0.5)
    await brokers.settle()
    leader = brokers.leader()
    appender = PartitionAppender(
        GROUP, 0, Acks.QUORUM, brokers.writes[leader.node_id], eager_flights=1
    )
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(appender.run, nursery)
            flight, _ = appender.add(Record(value=b"reading"))
            await trio.testing.wait_all_tasks_blocked()
            await brokers.settle(cut_off=leader.node_id)  # a quorum never hears of it
            with trio.fail_after(5):
                await flight.done.wait()
            assert flight.error is not None and flight.error.code is ErrorCode.TIMEOUT
            nursery.cancel_scope.cancel()
    finally:
        brokers.close()


def _one_record_batch() -> bytes:
    return build_batch([Record(value=b"other")])


async def _elect_without_committing(brokers: _Brokers, old: MultiRaft) -> MultiRaft:
    """Another broker wins an election while ``old`` hears nothing, and is stopped the moment
    it leads: its no-op reaches nobody, so nothing of its term commits."""
    others = [r for r in brokers.rafts if r is not old]
    for _ in range(100):
        for raft in others:
            raft.tick()
        for _ in range(50):
            for raft in brokers.rafts:
                await raft._process()
            leader = next((r for r in others if r.replicas[GROUP].role is Role.LEADER), None)
            if leader is not None:
                brokers.queue.clear()  # its first appends are lost
                return leader
            queue, brokers.queue = brokers.queue, []
            if not queue:
                break
            for src, dst, item in queue:
                if old.node_id not in (src, dst):
                    brokers.rafts[dst].handle_items(src, [item])
    raise AssertionError("no other broker was elected")


def _stamped(value: bytes, sequence: int) -> bytes:
    return build_batch([Record(value=value)], producer_id=7, base_sequence=sequence)


async def test_a_new_leader_refuses_out_of_order_only_once_its_term_committed(
    tmp_path: Path,
) -> None:
    # Issue 38 (duplicated readings after a reconnect storm): batch 0 of a producer reached
    # only the old leader, so its outcome was unknown; a new leader took batch 1 first (a
    # producer it does not know may start at any sequence) and then refused batch 0 as out of
    # order. The appender took that as "not written" and sent batch 0's records again under a
    # new producer id; but the new leader was deposed before anything of its term committed,
    # the old one led again and committed the first copy: the records were in the log twice.
    # The refusal now waits for an entry of the new leader's term to commit (until then it is
    # a retriable "not yet"); after that, the first copy is in its log or never commits.
    brokers = _Brokers(tmp_path, 3)
    await brokers.settle()
    old = brokers.leader()
    try:
        deadline = trio.current_time() + 30
        first = brokers.writes[old.node_id].start(
            GROUP, _stamped(b"b0", 0), 1, Acks.QUORUM, deadline
        )
        assert not isinstance(first, _Failed)
        await brokers.settle(cut_off=old.node_id)  # on the old leader's disk, nowhere else
        new = await _elect_without_committing(brokers, old)
        paths = brokers.writes[new.node_id]
        later = paths.start(GROUP, _stamped(b"b1", 1), 1, Acks.QUORUM, deadline)
        assert not isinstance(later, _Failed)  # a producer it does not know: any sequence
        retry = paths.start(GROUP, _stamped(b"b0", 0), 1, Acks.QUORUM, deadline)
        assert isinstance(retry, _Failed)
        assert retry.refusal is None, retry.refusal  # was OUT_OF_ORDER_SEQUENCE: "not written"
        assert not retry.unknown  # not appended here: the write path simply tries again
        # Why "not written" was false: the new leader loses its leadership before its term
        # commits, and the old one, whose log is the longest, commits the first copy.
        deposed_term = new.replicas[GROUP].node.term
        group = old.replicas[GROUP]
        for _ in range(200):
            if group.role is Role.LEADER and group.node.term > deposed_term:
                break
            await brokers.settle(cut_off=new.node_id, ticks=1)
        await brokers.settle(cut_off=new.node_id)
        assert _values(old).count(b"b0") == 1
        # The retry, at the leader whose term committed, is the duplicate it is; a batch that
        # does not follow is still refused for good there.
        duplicate = brokers.writes[old.node_id].start(
            GROUP, _stamped(b"b0", 0), 1, Acks.QUORUM, deadline
        )
        assert not isinstance(duplicate, _Failed)
        gap = brokers.writes[old.node_id].start(GROUP, _stamped(b"b5", 5), 1, Acks.QUORUM, deadline)
        assert isinstance(gap, _Failed) and gap.refusal is not None
        assert gap.refusal.code is ErrorCode.OUT_OF_ORDER_SEQUENCE
    finally:
        brokers.close()


async def test_a_new_leaders_high_watermark_lies_below_what_the_old_one_acknowledged(
    tmp_path: Path,
) -> None:
    # Issue 38 ("lost" readings, all in flight at the kill): bench.fleet read the log back up
    # to the high watermarks reported after the storm. The old leader commits a batch with one
    # follower's acknowledgement and is killed before the followers hear of the commit; the new
    # leader's high watermark (its commit index + 1, what DESCRIBE and FETCH report) stays
    # below the batch until its own term commits: a reader stopping there misses a record that
    # was acknowledged. It is in the log all along; ``devices_report.fence_ends`` reads up to
    # a marker committed in the new term instead.
    brokers = _Brokers(tmp_path, 3)
    await brokers.settle()
    old = brokers.leader()
    follower = next(r for r in brokers.rafts if r is not old)
    try:
        last, _ = old.propose_nowait(GROUP, _one_record_batch(), 1)
        for _ in range(4):  # the append to one follower, its answer: nothing else delivered
            for raft in brokers.rafts:
                await raft._process()
            queue, brokers.queue = brokers.queue, []
            for src, dst, item in queue:
                if {src, dst} == {old.node_id, follower.node_id}:
                    brokers.rafts[dst].handle_items(src, [item])
            if old.replicas[GROUP].commit_index >= last:
                break
        assert old.replicas[GROUP].commit_index >= last  # committed: acknowledged to its writer
        brokers.queue.clear()  # the old leader is killed: its news of the commit is lost
        new = await _elect_without_committing(brokers, old)
        assert new.replicas[GROUP].node.log.last_index() >= last  # the batch is in its log
        assert read_committed(new.replicas[GROUP], 0, 1 << 20).high_watermark <= last
        for _ in range(50):  # its no-op commits, and the batch with it
            if read_committed(new.replicas[GROUP], 0, 1 << 20).high_watermark > last:
                break
            await brokers.settle(cut_off=old.node_id, ticks=1)
        assert read_committed(new.replicas[GROUP], 0, 1 << 20).high_watermark > last
        assert _values(new).count(b"other") == 1
    finally:
        brokers.close()
