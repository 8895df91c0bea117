"""The read path: every read of committed data a broker serves, beside the write path.

``ReadPath`` reads a partition where it is best read: at its leader (here, or forwarded to the
leader's broker) so that a consumer sees a record as soon as it is acknowledged and a client reads
its own writes; at any other replica while the leader is out of reach; and, for long polls, at
this broker's own replica when it may serve them. It answers the reads peers forward here, and
knows the partitions' bounds (log start, high watermark) as their leaders have them.

The log follower of every reader of a log (CONS, the MQTT tail, egress and redelivery) is
``follow``: fetch from an offset, waiting for records, and from the log start when retention
passed the offset (the seed's CONS rule). The reads of one local replica, without forwarding, are
in ``_reads``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable

import trio

from kafkaesque.protocol import (
    Answer,
    Bounds,
    BoundsRequest,
    ErrorCode,
    ReadRequest,
    ReadResult,
    Refused,
    Reply,
)
from kafkaesque.raft import NotLeader, Role
from kafkaesque.raft.driver import CommitTimeout, MultiRaft, RaftReplica

from ._errors import RequestError, known_topic, unknown_partition
from ._forwarding import Forwarder, ForwardError
from ._log_ids import log_id_of
from ._metadata import ClusterMetadata
from ._metadata_view import TopicInfo
from ._reads import (
    DEFAULT_FETCH_BYTES,
    Fetched,
    beyond_follower,
    committed_offset_for_time,
    fetch_committed,
    message_rows,
    read_committed,
)
from ._writes import WritePath

log = logging.getLogger("kafkaesque.broker.reads")

_LOG_START_TRIES = 3
# A read may be served by any replica, so a forwarded one waits less for its answer; a replica
# that let one go unanswered is passed over by the reads of the next _READ_PASS_OVER_S seconds.
_READ_SLACK_S = 1.0
_READ_PASS_OVER_S = 5.0
_READS_PER_CHECKPOINT = 64  # local reads (about 30 us each) a CONS makes between checkpoints
_BOUNDS_WAIT_S = 1.0  # DESCRIBE falls back to this broker's replica after that


class ReadPath:
    """Reads of committed data for every reader of the broker (see the module docstring).

    Built by the broker with what it reads through: the Raft groups hosted here, the write
    path's view of the leaders (and its timeout), the forwarder to peers, who is connected, and
    the metadata (its topics).
    """

    def __init__(
        self,
        broker_id: int,
        raft: MultiRaft,
        writes: WritePath,
        forwarder: Forwarder,
        connected_peers: Callable[[], Collection[int]],
        metadata: ClusterMetadata,
    ) -> None:
        self._broker_id = broker_id
        self._raft = raft
        self._writes = writes
        self._forwarder = forwarder
        self._connected_peers = connected_peers
        self._metadata = metadata
        # broker -> until when reads pass it over (it let a forwarded read go unanswered)
        self._unanswered_reads: dict[int, float] = {}

    def local_replica(self, topic: str, partition: int) -> RaftReplica | None:
        """This broker's replica of the partition (its Raft group), if it hosts one."""
        return self._raft.replicas.get(log_id_of(topic, partition))

    async def follow(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_bytes: int,
        wait_s: float,
        *,
        local: bool = False,
    ) -> tuple[Fetched, int]:
        """One step of a log follower: ``fetch`` from ``offset`` (waiting up to ``wait_s`` for
        records), and when retention passed ``offset``, from the log start. Returns what was
        read and the offset it was read from (``offset``, or the log start). With ``local``,
        reads this broker's replica when it may serve a long poll (``_long_poll_replica``).

        Past the end of the leader's log, raises the ``OFFSET_OUT_OF_RANGE`` error naming the
        partition: an empty read would tell the follower "nothing yet", and it would wait for
        ever at an offset the log may never reach (the topic was deleted and created again).
        Other ``RequestError``s (no leader, no quorum) are raised as ``fetch`` raises them.
        """
        replica = self._long_poll_replica(topic, partition, offset) if local else None
        try:
            if replica is not None:
                return await self.read_local(replica, offset, max_bytes, wait_s), offset
            return await self.fetch(topic, partition, offset, max_bytes, wait_s), offset
        except RequestError as exc:
            if exc.code is not ErrorCode.OFFSET_OUT_OF_RANGE:
                raise
            failed = await self._past_the_end(topic, partition, offset, exc)
            if failed is not None:
                raise failed from exc
        return await self._from_log_start(topic, partition, offset)

    async def fetch(
        self, topic: str, partition: int, offset: int, max_bytes: int, wait_s: float
    ) -> Fetched:
        """Committed batches, from the leader when it can be reached, else from any replica.

        The leader learns of a commit first: reading there, a consumer sees a record as soon as
        it is acknowledged, and a client reads its own acknowledged writes. A follower is a
        heartbeat behind, so it serves reads only while the leader is out of reach (including a
        leader that let a read go unanswered in the last seconds: ``forward_to_replica``).
        """
        replica = self.local_replica(topic, partition)
        if replica is not None and replica.role is Role.LEADER:
            return await self.read_local(replica, offset, max_bytes, wait_s)
        info = known_topic(self._metadata.view.topics, topic)
        read = ReadRequest(topic, partition, offset, max_bytes, int(wait_s * 1000))
        local = replica is not None and not beyond_follower(replica, offset)
        try:
            answer = await self.forward_to_replica(info, partition, read, local_replica=local)
        except RequestError:
            if replica is None or beyond_follower(replica, offset):
                raise
            return await self.read_local(replica, offset, max_bytes, wait_s)
        if isinstance(answer, RequestError):  # the replica's own answer: no fallback
            raise answer
        return answer

    async def _from_log_start(self, topic: str, partition: int, offset: int) -> tuple[Fetched, int]:
        """The seed's CONS takes any offset: below the log start it reads from the start.

        The start is the leader's (retention runs on each replica at its own pace); it may move
        again before the read, hence a few tries.
        """
        for _ in range(_LOG_START_TRIES):
            start = await self._leader_log_start(topic, partition)
            if start is None or offset >= start:
                return Fetched(b"", offset, offset), offset  # past the end: nothing yet
            try:
                fetched = await self.fetch(topic, partition, start, DEFAULT_FETCH_BYTES, 0)
            except RequestError as exc:
                if exc.code is not ErrorCode.OFFSET_OUT_OF_RANGE:
                    raise
                continue
            return fetched, start
        raise RequestError(
            ErrorCode.OFFSET_OUT_OF_RANGE, f"{topic}/{partition}: the log start keeps moving"
        )

    async def _leader_log_start(self, topic: str, partition: int) -> int | None:
        """The partition's log start as its leader has it (None: unknown now)."""
        log_id = log_id_of(topic, partition)
        bounds = await self.leader_bounds([log_id])
        if log_id in bounds:
            return bounds[log_id][0]
        if self._writes.leader_of(log_id) is None:
            replica = self.local_replica(topic, partition)
            return None if replica is None else replica.log.log_start_offset
        return None

    async def cons_pass(
        self, topic: str, wanted: dict[int, int], limit: int, deadline: float
    ) -> tuple[list[Reply], dict[int, int]]:
        """Read the partitions of ``wanted`` (partition -> offset), waiting until ``deadline``
        for records if there are none. Returns the rows (at most ``limit``) and every
        partition's next offset.

        First every partition is read at once without waiting (so a CONS gets everything there
        is); only if that finds nothing, every partition is long-polled at once, and the first
        to deliver records is the answer (a record reaches its consumer as soon as it commits).

        A long poll (``deadline`` ahead) reads the replicas on this broker, followers too
        (``_long_poll_replica``): no request to the leader's broker and back, and a follower
        learns each commit one message after the leader. A CONS that does not wait reads at the
        leader, so a client reads its own acknowledged writes.
        """
        local = deadline > trio.current_time()
        results = await self._read_local_now(topic, wanted) if local else {}
        elsewhere = {p: o for p, o in wanted.items() if p not in results}
        if elsewhere:
            results.update(
                await self._read_partitions(topic, elsewhere, wait_until=None, local=local)
            )
        found = any(fetched.data for fetched, _ in results.values())
        if not found and deadline > trio.current_time():
            results = await self._read_partitions(topic, wanted, wait_until=deadline, local=local)
        rows: list[Reply] = []
        next_offsets = dict(wanted)
        for partition, (fetched, offset) in sorted(results.items()):
            if len(rows) >= limit:
                break
            got, next_offsets[partition] = message_rows(
                partition, fetched, offset, limit - len(rows)
            )
            rows.extend(got)
        return rows, next_offsets

    async def _read_local_now(
        self, topic: str, wanted: dict[int, int]
    ) -> dict[int, tuple[Fetched, int]]:
        """What ``_read_partitions`` finds without waiting in the partitions this broker's own
        replicas may serve (``_long_poll_replica``), read in this task: a task per partition
        costs a CONS of a few records more than its reads (measured: 9 partitions, 1.7 ms a
        pass in tasks against 0.4 ms of reads). Partitions left out (no such replica, or its
        answer is out of range: ``follow`` decides what that means) are for
        ``_read_partitions``; any other ``RequestError`` is raised, as there."""
        results: dict[int, tuple[Fetched, int]] = {}
        for done, (partition, offset) in enumerate(wanted.items(), 1):
            replica = self._long_poll_replica(topic, partition, offset)
            if replica is None:
                continue
            try:
                results[partition] = (read_committed(replica, offset, DEFAULT_FETCH_BYTES), offset)
            except RequestError as exc:
                if exc.code is not ErrorCode.OFFSET_OUT_OF_RANGE:
                    raise
            if done % _READS_PER_CHECKPOINT == 0:
                await trio.lowlevel.checkpoint()  # a subscription of many partitions shares
        return results

    async def _read_partitions(
        self, topic: str, wanted: dict[int, int], wait_until: float | None, *, local: bool
    ) -> dict[int, tuple[Fetched, int]]:
        """Read every partition concurrently; with ``wait_until``, long-poll and stop at the
        first that has records; with ``local``, from this broker's replicas where they may
        serve (``_long_poll_replica``). Returns what each read found (and from which offset)."""
        results: dict[int, tuple[Fetched, int]] = {}
        errors: list[RequestError] = []
        async with trio.open_nursery() as nursery:

            async def read(partition: int, offset: int) -> None:
                wait_s = 0.0 if wait_until is None else max(0.0, wait_until - trio.current_time())
                try:
                    fetched, offset = await self.follow(
                        topic, partition, offset, DEFAULT_FETCH_BYTES, wait_s, local=local
                    )
                except RequestError as exc:
                    errors.append(exc)
                    nursery.cancel_scope.cancel()
                    return
                results[partition] = (fetched, offset)
                if fetched.data and wait_until is not None:
                    nursery.cancel_scope.cancel()

            for partition, offset in wanted.items():
                nursery.start_soon(read, partition, offset)
        if errors:
            raise errors[0]
        return results

    def _long_poll_replica(self, topic: str, partition: int, offset: int) -> RaftReplica | None:
        """This broker's replica of the partition, if a long poll may read it: the leader, or
        a follower whose log reaches ``offset`` and that hears from its leader (a follower cut
        off would keep its consumers waiting while the leader has records)."""
        replica = self.local_replica(topic, partition)
        if replica is None or replica.role is Role.LEADER:
            return replica
        leader = replica.leader
        if leader is None or not self._raft.hears(leader) or beyond_follower(replica, offset):
            return None
        return replica

    async def _past_the_end(
        self, topic: str, partition: int, offset: int, out_of_range: RequestError
    ) -> RequestError | None:
        """What a CONS answers for an ``offset`` the partition's leader found out of range.

        None below the log start: CONS reads from the start instead (the seed's rule, see
        ``_from_log_start``). Past the end, the error FETCH answers, naming the partition: an
        empty read would tell the consumer "nothing yet" and it would wait for ever at an offset
        the log may never reach (the topic was deleted and created again, say). When the start
        is unknown now (no leader known), None too: ``_from_log_start`` answers nothing for the
        partition this time, and the consumer's next CONS asks again.
        """
        start = await self._leader_log_start(topic, partition)
        if start is None or offset < start:
            return None
        return RequestError(out_of_range.code, f"{topic}/{partition}: {out_of_range.message}")

    async def _read_replica(
        self, topic: str, partition: int, offset: int, max_bytes: int, wait_s: float
    ) -> Fetched:
        """A read a peer chose this replica for (``ReadRequest``): served from it, never
        forwarded again. Raises ``RequestError``; ``NOT_LEADER`` when this broker holds no
        replica, or its log ends before ``offset`` (behind the leader: not out of range).
        """
        info = known_topic(self._metadata.view.topics, topic)
        if partition >= info.config.partitions:
            raise unknown_partition(topic, partition, info.config.partitions)
        replica = self.local_replica(topic, partition)
        if replica is None:
            raise RequestError(ErrorCode.NOT_LEADER, "this broker holds no replica")
        if beyond_follower(replica, offset):
            # Behind, not out of range: a consumer told OFFSET_OUT_OF_RANGE resets its
            # position (to the log start), and would read again what it had read.
            raise RequestError(
                ErrorCode.NOT_LEADER,
                f"this replica's log ends at {replica.log.log_end_offset}, before offset "
                f"{offset}: it is behind the leader; retry",
            )
        return await self.read_local(replica, offset, max_bytes, wait_s)

    async def serve_read(self, peer: int, req: int, request: ReadRequest) -> None:
        """A peer chose this replica for a read (``ReadRequest``): served from it, never
        forwarded again; the answer goes back to ``peer`` as the reply to its request ``req``."""
        answer: Answer
        try:
            fetched = await self._read_replica(
                request.topic,
                request.partition,
                request.offset,
                request.max_bytes,
                request.wait_ms / 1000,
            )
        except RequestError as exc:
            answer = Refused(exc.code, exc.message)
        except Exception:  # a bug: answer it, log it, keep serving everyone else
            log.exception("broker %d: a read for broker %d failed", self._broker_id, peer)
            answer = Refused(ErrorCode.INTERNAL, "internal error (logged)")
        else:
            answer = ReadResult(bytes(fetched.data), fetched.next_offset, fetched.high_watermark)
        self._forwarder.reply(peer, req, answer)

    async def read_local(
        self, replica: RaftReplica, offset: int, max_bytes: int, wait_s: float
    ) -> Fetched:
        """``fetch_committed`` on this replica, where "past the end of the log" is answered
        OFFSET_OUT_OF_RANGE only by a leader that confirms it still leads.

        A consumer told OFFSET_OUT_OF_RANGE resets its position to the log start. A deposed
        leader that has not heard of its successor yet (it was paused, or cut off) has a shorter
        log than what was committed since; its "out of range" sent consumers back to offset 0
        (found by jepsen_like). It answers NOT_LEADER instead, and the consumer retries.
        """
        try:
            return await fetch_committed(replica, offset, max_bytes, wait_s)
        except RequestError as exc:
            if (
                exc.code is not ErrorCode.OFFSET_OUT_OF_RANGE
                or offset <= replica.log.log_end_offset
            ):
                raise
            try:
                await self._raft.read_index(replica.id, timeout=self._writes.timeout)
            except (NotLeader, CommitTimeout) as lost:
                raise RequestError(
                    ErrorCode.NOT_LEADER,
                    f"{replica.id}: offset {offset} is past this replica's log, which may be "
                    f"behind the leader's ({lost}); retry",
                ) from exc
            return await fetch_committed(replica, offset, max_bytes, wait_s)

    async def forward_to_replica(
        self, info: TopicInfo, partition: int, request: ReadRequest, *, local_replica: bool
    ) -> Fetched | RequestError:
        """Read on a broker holding a replica: the leader first, then the others. What the first
        that answers read, or the error it answered (returned: the caller tells it apart from
        ``NO_QUORUM``, raised when none answered).

        A replica that let a read go unanswered lately (a one-way cut: its connection looks up,
        but nothing from here reaches it) is tried last, and not at all when the caller has a
        ``local_replica`` to read instead: its reads are not held up by the same timeout again.
        """
        leader = self._writes.leader_of(log_id_of(info.name, partition))
        candidates = [leader] if leader is not None else []
        candidates += [r for r in info.replicas[partition] if r != leader]
        connected = self._connected_peers()
        now = trio.current_time()
        reachable = [b for b in candidates if b != self._broker_id and b in connected]
        answering = [b for b in reachable if self._unanswered_reads.get(b, now) <= now]
        if not local_replica:
            answering += [b for b in reachable if b not in answering]
        last_error = "no replica is reachable"
        for broker in answering:
            deadline = trio.current_time() + request.wait_ms / 1000 + _READ_SLACK_S
            try:
                answer = await self._forwarder.call(broker, request, deadline=deadline)
            except ForwardError as exc:
                self._unanswered_reads[broker] = trio.current_time() + _READ_PASS_OVER_S
                last_error = f"forwarding to broker {broker}: {exc}"
                continue
            match answer:
                case ReadResult(data, next_offset, high_watermark):
                    return Fetched(data, next_offset, high_watermark)
                case Refused(code, message):
                    return RequestError(code, message)
            raise RequestError(
                ErrorCode.INTERNAL, f"broker {broker} answered a read with {answer!r:.200}"
            )
        raise RequestError(ErrorCode.NO_QUORUM, f"{info.name}/{partition}: {last_error}; retry")

    async def leader_bounds(
        self, log_ids: Iterable[str], *, time_ms: int | None = None
    ) -> dict[str, tuple[int, ...]]:
        """The log start and high watermark of each group as its leader has them now (what a
        consumer reading from the leader finds); with ``time_ms`` a third value, the leader's
        earliest committed offset whose record timestamp is >= it (else the high watermark).
        Groups led elsewhere cost one ``BOUNDS`` request per leader, all at once; a group whose
        leader is unknown, or does not answer within ``_BOUNDS_WAIT_S``, or no longer leads it,
        is left out."""
        found: dict[str, tuple[int, ...]] = {}
        remote: dict[int, list[str]] = {}
        for log_id in log_ids:
            here = self.led_bounds(log_id, time_ms)
            if here is not None:
                found[log_id] = here
                continue
            leader = self._writes.leader_of(log_id)
            if leader is not None and leader != self._broker_id:
                remote.setdefault(leader, []).append(log_id)

        async def ask(leader: int, asked: list[str]) -> None:
            deadline = trio.current_time() + _BOUNDS_WAIT_S
            try:
                answer = await self._forwarder.call(
                    leader, BoundsRequest(tuple(asked), time_ms), deadline=deadline
                )
            except ForwardError as exc:
                log.info("broker %d: no bounds from broker %d: %s", self._broker_id, leader, exc)
                return
            width = 2 if time_ms is None else 3
            if not isinstance(answer, Bounds) or len(answer.bounds) != len(asked):
                log.warning("broker %d: malformed bounds answer of %d", self._broker_id, leader)
                return
            for log_id, bounds in zip(asked, answer.bounds, strict=True):
                if bounds is not None and len(bounds) == width:
                    found[log_id] = bounds

        async with trio.open_nursery() as nursery:
            for leader, asked in remote.items():
                nursery.start_soon(ask, leader, asked)
        return found

    def led_bounds(self, log_id: str, time_ms: int | None = None) -> tuple[int, ...] | None:
        """(log start, high watermark) of a group led here, else None; with ``time_ms`` also
        the offset for that time among the committed records (a bounded read of the log)."""
        replica = self._raft.replicas.get(log_id)
        if replica is None or replica.role is not Role.LEADER:
            return None
        start, end = replica.log.log_start_offset, replica.commit_index + 1
        if time_ms is None:
            return start, end
        at_time = committed_offset_for_time(replica, time_ms)
        return None if at_time is None else (start, end, at_time)

    async def high_watermarks(
        self, partitions: list[tuple[str, int]]
    ) -> dict[tuple[str, int], int]:
        """The high watermark of each of ``partitions`` as its leader has it (``leader_bounds``:
        one request per leader; those not known within its wait are left out)."""
        names = {log_id_of(topic, p): (topic, p) for topic, p in partitions}
        bounds = await self.leader_bounds(names)
        return {names[g]: b[1] for g, b in bounds.items() if g in names}
