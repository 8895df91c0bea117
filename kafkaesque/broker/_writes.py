"""The write path: get one batch into a partition's log through its current leader.

``WritePath.start`` makes one attempt at once, synchronously: it proposes the batch to the local
Raft group when this broker leads the partition, or forwards it to the leader's broker. Doing
that step without awaiting is what keeps the order of the batches a session pipelines: the n-th
batch is proposed, or queued on the leader's connection, before the (n+1)-th. ``finish`` then
waits for the outcome, and ``write`` retries what failed before it was applied (no leader yet,
a leader that moved, a broker not connected) until the write deadline: a client sees a failover
as latency, never as an error, unless the partition stays without a quorum for the whole
timeout (``NO_QUORUM``: definitely not written) or the outcome stays unknown (``TIMEOUT``).

An attempt whose outcome was unknown (the leader's connection closed after the batch was sent)
is retried only when the batch carries a producer id and sequence: the leader, old or new,
recognises the retry and answers it with the first copy's offsets (``_producers``). Every batch
the broker builds itself carries its own (``PartitionAppender``), and so do an idempotent
client's. A client's batch without one is not sent again after an unknown outcome: the client
gets ``TIMEOUT`` and decides, since the broker cannot stamp a producer id into a batch whose body
CRC the client computed. So the broker never appends one request twice; only a client that
resends a batch without a producer id can make a duplicate.

No task waits for a write in the common case, at either end of a forward. ``when_written`` has
the outcome told by callback: for this leader's own proposal, from the Raft step that sees it
commit; for a forwarded attempt, from the task that reads the leader's answer. The leader answers
a peer's append the same way (``serve_forwarded``). A task is left only for the rare paths (a
failure to retry, an outcome still unknown at the deadline), where ``write`` or
``finish_forwarded`` answer exactly as they always have.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from kafkaesque.protocol import (
    Absent,
    Acks,
    Answer,
    Appended,
    AppendRequest,
    ErrorCode,
    FindResendRequest,
    Found,
    Refused,
    Retry,
    Unknown,
)
from kafkaesque.raft import NotLeader, ProposalDropped, Role
from kafkaesque.raft.driver import CommitTimeout, MultiRaft, RaftReplica
from kafkaesque.storage import NO_PRODUCER_ID, InvalidBatchError, decode_header

from ._errors import RequestError
from ._forwarding import (
    Forwarder,
    ForwardError,
    LeaderReplaced,
    PeerUnavailable,
    _Call,
)
from ._leaders import LeaderTable
from ._log_ids import log_id_of
from ._metadata_view import TopicInfo
from ._producers import Duplicate, ProducerStates, Refuse, rebuild
from ._resends import ResendIndex

log = logging.getLogger("kafkaesque.broker.writes")

_LEADER_ACK_POLL_S = 0.001
_LEADER_WAIT_POLL_S = 0.02
_MAX_BACKOFF_S = 0.1

UNSAFE_ACK_ENV = "KAFKAESQUE_UNSAFE_ACK_BEFORE_COMMIT"
"""Set to ``1`` in a broker's environment, it acknowledges every write the moment the leader has
appended it, before a quorum holds it: a deliberately broken mode, so that the jepsen_like
harness can show it catches lost acknowledged writes. Never set it otherwise."""


class _Retry(Exception):
    """This attempt failed; ``unknown`` if it may nevertheless have been applied."""

    def __init__(self, reason: str, *, unknown: bool = False) -> None:
        super().__init__(reason)
        self.unknown = unknown


@dataclass(slots=True)
class _Local:
    replica: RaftReplica
    last: int
    term: int
    count: int


@dataclass(slots=True)
class _Remote:
    req: int
    call: _Call


@dataclass(slots=True)
class _Failed:
    reason: str
    refusal: RequestError | None = None  # set when retrying cannot help (a bad batch)
    unknown: bool = False  # the batch may have been appended, and may still commit


Attempt = _Local | _Remote | _Failed


class WritePath:
    """Appends batches through partition leaders, local or remote. Trio thread only."""

    def __init__(
        self,
        node_id: int,
        raft: MultiRaft,
        leaders: LeaderTable,
        forwarder: Forwarder,
        *,
        timeout: float,
    ) -> None:
        self.node_id = node_id
        self._raft = raft
        self._leaders = leaders
        self._forwarder = forwarder
        self.timeout = timeout
        # Told each acknowledged write's latency, from its first attempt (for metrics).
        self.on_written: Callable[[float], None] | None = None
        self._producers: dict[str, ProducerStates] = {}  # by group, for the term we lead it
        self._resends: dict[str, ResendIndex] = {}  # by group, for the term we lead it
        # Deliberately broken mode (see UNSAFE_ACK_ENV): every ack is a leader-only ack.
        self.unsafe_ack_before_commit = os.environ.get(UNSAFE_ACK_ENV) == "1"
        # Peers' appends waiting for their commit (``serve_forwarded``): a heap by deadline,
        # whose entries that were answered are dropped lazily, from its top.
        self._forwards: list[tuple[float, int, _ForwardWaiter]] = []
        self._forward_seq = itertools.count()
        self._forward_watch: trio.CancelScope | None = None  # the watcher's sleep, while it runs
        self._forward_watching = False
        self._forward_wake_at = math.inf  # the watch's deadline
        if self.unsafe_ack_before_commit:
            log.warning("UNSAFE: acknowledging writes before they commit (%s=1)", UNSAFE_ACK_ENV)

    def leader_of(self, log_id: str) -> int | None:
        """The partition's leader as known here: the local replica's view first."""
        replica = self._raft.replicas.get(log_id)
        if replica is not None and replica.leader is not None:
            return replica.leader
        return self._leaders.leader(log_id)

    async def wait_for_leaders(self, info: TopicInfo) -> None:
        """Wait (up to the write timeout) until every partition of ``info`` has a leader."""
        with trio.move_on_after(self.timeout):
            while any(
                self.leader_of(log_id_of(info.name, p)) is None
                for p in range(info.config.partitions)
            ):
                await trio.sleep(_LEADER_WAIT_POLL_S)

    # -- one attempt ----------------------------------------------------------------------------

    def start(self, log_id: str, batch: bytes, count: int, acks: Acks, deadline: float) -> Attempt:
        """Propose or forward now, without awaiting; never raises."""
        replica = self._raft.replicas.get(log_id)
        if replica is not None and replica.role is Role.LEADER:
            return self._start_local(replica, batch, count)
        leader = self.leader_of(log_id)
        if leader is None or leader == self.node_id:
            return _Failed("the partition has no leader yet")
        remaining = max(0.0, deadline - trio.current_time())
        try:
            req, call = self._forwarder.start(
                leader, AppendRequest(log_id, batch, count, acks, remaining)
            )
        except PeerUnavailable as exc:
            return _Failed(str(exc))
        return _Remote(req, call)

    def _start_local(self, replica: RaftReplica, batch: bytes, count: int) -> Attempt:
        """Propose as the leader; an idempotent producer's retry is not appended twice.

        The batch is checked once, here: its header decides for the producer and rides with
        the proposal into the log (``check_proposal``)."""
        try:
            checked = replica.storage.check_proposal(batch, count)
        except InvalidBatchError as exc:
            return _Failed(str(exc), RequestError(ErrorCode.INVALID_BATCH, str(exc)))
        header = checked.header
        states = None
        if header.producer_id != NO_PRODUCER_ID:
            states = self._producer_states(replica)
            if states is None:
                return _Failed("the new leader is still loading producer state")
            decision = states.decide(header)
            if isinstance(decision, Refuse):
                if (
                    decision.code is ErrorCode.OUT_OF_ORDER_SEQUENCE
                    and not replica.committed_in_term
                ):
                    # Not yet a refusal: an earlier copy of this very batch may sit in a
                    # deposed leader's log, and commit there if this leader is deposed before
                    # anything of its term commits. "Not written" would then make the
                    # appender send these records again under a new producer id: twice in
                    # the log (issue 38). Once an entry of this term has committed, that copy
                    # is in this log (a duplicate, answered as one) or can never commit.
                    return _Failed(f"not yet decided ({decision.message})")
                return _Failed(decision.message, RequestError(decision.code, decision.message))
            if isinstance(decision, Duplicate):
                first, last = decision
                term = replica.node.log.term_at(last)
                return _Local(replica, last, term, last - first + 1)
        try:
            last, term = self._raft.propose_nowait(replica.id, checked, count)
        except (NotLeader, ProposalDropped) as exc:
            return _Failed(f"the local replica refused: {exc}")
        except InvalidBatchError as exc:
            return _Failed(str(exc), RequestError(ErrorCode.INVALID_BATCH, str(exc)))
        if states is not None:
            states.record(header, last - count + 1, last)
        return _Local(replica, last, term, count)

    def _producer_states(self, replica: RaftReplica) -> ProducerStates | None:
        """The producer windows of ``replica`` for this leader's term (None: not yet readable)."""
        node = replica.node
        states = self._producers.get(replica.id)
        if states is not None and states.term == node.term:
            return states
        raft_log = node.log
        if raft_log.stable_last() < raft_log.term_start_offset(node.term) - 1:
            return None  # entries of earlier terms are not all on disk yet: a moment
        states = self._producers[replica.id] = rebuild(replica.log, node.term)
        return states

    async def finish(self, attempt: Attempt, acks: Acks, deadline: float) -> tuple[int, int]:
        """``(first, last)`` offsets once written; ``_Retry`` or ``RequestError`` otherwise."""
        if isinstance(attempt, _Failed):
            if attempt.refusal is not None:
                raise attempt.refusal
            raise _Retry(attempt.reason, unknown=attempt.unknown)
        if isinstance(attempt, _Local):
            return await self._finish_local(attempt, acks, deadline)
        try:
            answer = await self._forwarder.finish(attempt.req, attempt.call, deadline)
        except LeaderReplaced as exc:
            # The old leader went silent and a new one is known (issue 23): answer the unknown
            # outcome now rather than wait on it, and do not send the batch again blindly: it
            # may already be in the new leader's log.
            raise RequestError(ErrorCode.TIMEOUT, f"{exc}; retry") from exc
        except ForwardError as exc:
            raise _Retry(str(exc), unknown=True) from exc
        return _outcome_of(answer)

    def when_written(
        self,
        attempt: Attempt,
        acks: Acks,
        deadline: float,
        callback: Callable[[tuple[int, int] | Attempt], None],
    ) -> bool:
        """Have ``callback`` told the outcome of ``attempt`` with no task waiting for it, when
        it is this leader's own proposal acknowledged at its commit (``Acks.QUORUM``) or an
        attempt forwarded to the leader's broker (any ``acks``: the leader applies them); else
        return False, register nothing, and let the caller await ``write(first=attempt)``.

        ``callback`` is called once, with the ``(first, last)`` offsets once written
        (``on_written`` was told), or with the attempt to go on with through
        ``write(first=...)``, which then answers and retries exactly as it would have awaited
        from the start. A proposal is told from the task that sees the commit index reach the
        entry or the entry cut (``RaftReplica.on_committed``; at once if it has committed
        already): a failed attempt when the entry was cut before it committed (``write``
        proposes again, as it would have), or ``attempt`` itself when the group woke it with
        the entry neither committed nor cut (the group was removed). A forwarded attempt is
        told from the task that reads the leader's answer or sees the call end
        (``Forwarder.on_done``): the offsets when the leader appended it, else ``attempt``
        itself (the leader's "retry", "unknown" or refusal, a lost connection, a replaced
        leader), whose ``finish`` then returns at once. Nothing here watches ``deadline``: the
        caller hands ``attempt`` to ``write`` once it passes, which then answers as it would
        have (``TIMEOUT``, mostly; ``callback`` is then never called for a forwarded one). So
        the common case costs no task and no pass of the scheduler. The callback runs inside
        another task's step (Raft's, or the peer reader's): it must be quick and must not
        raise.
        """
        started = deadline - self.timeout
        if isinstance(attempt, _Remote):
            call = attempt.call

            def answered() -> None:
                answer = call.answer
                if isinstance(answer, Appended):  # ``_outcome_of``'s one success
                    if self.on_written is not None:
                        self.on_written(trio.current_time() - started)
                    callback((answer.first, answer.last))
                else:
                    callback(attempt)

            self._forwarder.on_done(call, answered)
            return True
        # Under the unsafe mode every ack is a leader-only ack: ``_finish_local`` polls for it.
        if not isinstance(attempt, _Local) or acks is not Acks.QUORUM:
            return False
        if self.unsafe_ack_before_commit:
            return False
        self._on_commit(attempt, callback, started)
        return True

    def _on_commit(
        self,
        attempt: _Local,
        callback: Callable[[tuple[int, int] | Attempt], None],
        started: float | None,
    ) -> None:
        """Tell ``callback`` once the group commits ``attempt``'s entry or loses it (see
        ``when_written``); ``on_written`` too, of a write ``started`` then, if not None."""
        replica, last, term = attempt.replica, attempt.last, attempt.term

        def committed() -> None:
            log_ = replica.log
            in_log = log_.log_end_offset > last and log_.term_at(last) == term
            if in_log and replica.commit_index >= last:
                if started is not None and self.on_written is not None:
                    self.on_written(trio.current_time() - started)
                callback((last - attempt.count + 1, last))
            elif not in_log:
                cut = _cut(replica, last, term)
                callback(_Failed(str(cut), unknown=cut.unknown))
            else:
                callback(attempt)

        replica.on_committed(last, term, committed)

    async def _finish_local(self, a: _Local, acks: Acks, deadline: float) -> tuple[int, int]:
        replica, last, term = a.replica, a.last, a.term
        if self.unsafe_ack_before_commit:
            acks = Acks.LEADER
        log_ = replica.log
        seen = False  # whether our entry was ever in the log (then vanishing means lost)
        while True:
            in_log = log_.log_end_offset > last and log_.term_at(last) == term
            if replica.commit_index >= last or (acks is Acks.LEADER and in_log):
                if in_log:
                    return last - a.count + 1, last
                raise _cut(replica, last, term)
            if seen and not in_log:
                raise _cut(replica, last, term)
            seen |= in_log
            if trio.current_time() >= deadline:
                raise _Retry(f"offset {last} not committed in time", unknown=True)
            with trio.move_on_at(deadline):
                if acks is Acks.LEADER:
                    await trio.sleep(_LEADER_ACK_POLL_S)
                else:
                    await replica.wait_committed(last, term)
                    # Woken at the commit or once the entry was cut: not in the log now is lost.
                    seen = True

    # -- with retries ---------------------------------------------------------------------------

    async def write(
        self,
        log_id: str,
        batch: bytes,
        count: int,
        acks: Acks,
        *,
        first: Attempt | None = None,
        deadline: float | None = None,
    ) -> tuple[int, int]:
        """Write ``batch`` (``count`` offsets); return its ``(first, last)`` offsets.

        ``first`` is an attempt already started (to keep pipelined order). Raises
        ``RequestError``: ``NO_QUORUM`` if no attempt may have been applied, ``TIMEOUT`` if one
        may have been, or the leader's own refusal (e.g. ``INVALID_BATCH``).
        """
        if deadline is None:
            deadline = trio.current_time() + self.timeout
        started = deadline - self.timeout
        attempt = first or self.start(log_id, batch, count, acks, deadline)
        unknown = False
        reason = ""
        backoff = 0.005
        while True:
            try:
                written = await self.finish(attempt, acks, deadline)
            except RequestError as exc:
                if unknown and not exc.code.outcome_unknown:
                    # This attempt was refused (a producer's sequence out of order, say), but an
                    # earlier one may have been appended and may yet commit: "not written" would
                    # be false. The batch's fate is unknown, and so it is answered.
                    raise RequestError(
                        ErrorCode.TIMEOUT,
                        f"{log_id}: outcome unknown: an earlier attempt may have been applied "
                        f"({reason}); the last one was refused: {exc.message}",
                    ) from None
                raise
            except _Retry as retry:
                if retry.unknown and not _carries_producer_id(batch):
                    raise RequestError(
                        ErrorCode.TIMEOUT,
                        f"{log_id}: outcome unknown ({retry}); a batch without a producer id "
                        "is not sent again by the broker, since a second copy could be appended",
                    ) from None
                if retry.unknown or not unknown:
                    reason = str(retry)  # what made the outcome unknown is kept for the answer
                unknown |= retry.unknown
            else:
                if self.on_written is not None:
                    self.on_written(trio.current_time() - started)
                return written
            now = trio.current_time()
            if now >= deadline:
                if unknown:
                    raise RequestError(
                        ErrorCode.TIMEOUT, f"{log_id}: not acknowledged in time ({reason})"
                    )
                raise RequestError(
                    ErrorCode.NO_QUORUM, f"{log_id}: no leader with a quorum ({reason})"
                )
            await trio.sleep(min(backoff, deadline - now))
            backoff = min(backoff * 2, _MAX_BACKOFF_S)
            attempt = self.start(log_id, batch, count, acks, deadline)

    async def write_as_leader(
        self, log_id: str, batch: bytes, count: int, acks: Acks = Acks.QUORUM
    ) -> tuple[int, int]:
        """Write ``batch`` as this broker's leader replica, in one attempt: never forwarded,
        never retried elsewhere.

        For a write whose meaning rests on state this leader checked just before (a group
        coordinator's commit, checked against its table): forwarded to another leader, or
        retried until a delayed copy lands, it could be applied after writes that check never
        saw (found by jepsen_like: a commit's stale copy landed after later commits). Raises
        ``RequestError``: ``NOT_LEADER`` (nothing written; ask the new leader) or ``TIMEOUT``
        (the outcome is unknown).
        """
        return await self.begin_as_leader(log_id, batch, count).written(acks)

    def begin_as_leader(self, log_id: str, batch: bytes, count: int) -> LeaderWrite:
        """``write_as_leader`` in two steps: the batch is proposed now, synchronously (so
        batches begun one after the other are appended in that order, and a caller may begin
        the next before this one commits: a pipelining client's), and ``LeaderWrite.written``
        waits for its outcome. Raises ``RequestError(NOT_LEADER)`` at once if this broker does
        not lead the partition."""
        replica = self._raft.replicas.get(log_id)
        if replica is None or replica.role is not Role.LEADER:
            raise RequestError(ErrorCode.NOT_LEADER, f"{log_id}: not the leader here; retry")
        deadline = trio.current_time() + self.timeout
        return LeaderWrite(self, log_id, self._start_local(replica, batch, count), deadline)

    # -- MQTT QoS 1 resends ------------------------------------------------------------------

    async def find_resend(
        self, log_id: str, key: tuple[bytes, bytes], digest: int, deadline: float
    ) -> int | None:
        """The offset of the committed first copy of an MQTT QoS 1 resend, or None when the
        log does not hold one (see ``_resends``): asked of the partition's leader, local or
        remote, through failovers until ``deadline``.

        Raises ``RequestError`` (``TIMEOUT``) when no leader answered in time.
        """
        backoff = 0.005
        while True:
            replica = self._raft.replicas.get(log_id)
            try:
                if replica is not None and replica.role is Role.LEADER:
                    return await self._find_resend_here(replica, key, digest, deadline)
                leader = self.leader_of(log_id)
                if leader is None or leader == self.node_id:
                    raise _Retry("the partition has no leader yet")
                remaining = max(0.0, deadline - trio.current_time())
                answer = await self._forwarder.call(
                    leader,
                    FindResendRequest(log_id, *key, digest, remaining),
                    deadline=deadline,
                )
                return _found_of(answer)
            except (_Retry, ForwardError) as exc:
                reason = str(exc)
            now = trio.current_time()
            if now >= deadline:
                raise RequestError(
                    ErrorCode.TIMEOUT, f"{log_id}: a resend could not be looked up ({reason})"
                )
            await trio.sleep(min(backoff, deadline - now))
            backoff = min(backoff * 2, _MAX_BACKOFF_S)

    async def serve_find_resend(
        self, log_id: str, key: tuple[bytes, bytes], digest: int, seconds: float
    ) -> Found | Absent | Retry:
        """A peer's ``find_resend``, as this leader: the answer to send it."""
        replica = self._raft.replicas.get(log_id)
        if replica is None or replica.role is not Role.LEADER:
            return Retry("not the leader here")
        try:
            offset = await self._find_resend_here(
                replica, key, digest, trio.current_time() + seconds
            )
        except _Retry as retry:
            return Retry(str(retry))
        return Absent() if offset is None else Found(offset)

    async def _find_resend_here(
        self, replica: RaftReplica, key: tuple[bytes, bytes], digest: int, deadline: float
    ) -> int | None:
        try:
            # Every entry of an earlier term that will ever commit is in our log after this.
            await self._raft.read_index(
                replica.id, timeout=max(0.0, deadline - trio.current_time())
            )
        except (NotLeader, CommitTimeout) as exc:
            raise _Retry(f"no read point: {exc}") from exc
        node = replica.node
        if node.role is not Role.LEADER:
            raise _Retry("leadership moved")
        index = self._resends.get(replica.id)
        if index is None or index.term != node.term:
            index = self._resends[replica.id] = ResendIndex(node.term)
        while not index.catch_up(replica.log):  # a chunk at a time: the broker serves on between
            await trio.lowlevel.checkpoint()
        if node is not replica.node or node.role is not Role.LEADER or node.term != index.term:
            raise _Retry("leadership moved")
        offset = index.find(replica.log, key, digest)
        if offset is None:
            return None
        try:  # an entry of our own term may not have committed yet
            await self._finish_local(
                _Local(replica, offset, node.log.term_at(offset), 1), Acks.QUORUM, deadline
            )
        except _Retry as retry:
            if retry.unknown:
                raise
            return None  # replaced before it committed: the first copy is gone
        return offset

    # -- the leader's side of a forwarded append -------------------------------------------

    def start_forwarded(
        self, log_id: str, batch: bytes, count: int, acks: Acks, seconds: float
    ) -> ForwardedAppend | Retry:
        """Start a peer's append as the leader, at once; or the answer to send it now.

        Called in the order the peer's requests arrive, before any task switch: the batches a
        producer pipelines through one broker are then proposed in the order they were sent, so
        the leader's idempotence check does not refuse the later ones as out of order.
        """
        replica = self._raft.replicas.get(log_id)
        if replica is None or replica.role is not Role.LEADER:
            return Retry("not the leader here")
        deadline = trio.current_time() + seconds
        return ForwardedAppend(self.start(log_id, batch, count, acks, deadline), acks, deadline)

    async def finish_forwarded(
        self, append: ForwardedAppend
    ) -> Appended | Retry | Unknown | Refused:
        """Wait for a started peer's append; the answer to send it."""
        try:
            first, last = await self.finish(append.attempt, append.acks, append.deadline)
        except _Retry as retry:
            return Unknown(str(retry)) if retry.unknown else Retry(str(retry))
        except RequestError as exc:
            return Refused(exc.code, exc.message)
        return Appended(first, last)

    def serve_forwarded(
        self, peer: int, req: int, request: AppendRequest, nursery: trio.Nursery
    ) -> None:
        """Start peer ``peer``'s append ``req`` as the leader now, in arrival order
        (``start_forwarded``), and answer it once, through the forwarder.

        In the common case (this leader's proposal, ``Acks.QUORUM``, committed in time) the
        answer is sent from the Raft step that sees the commit, with no task: a task per
        forwarded append and its passes of the scheduler cost far more than the answer. The
        rare paths go to a task of ``nursery`` that awaits ``finish_forwarded``, as every
        append did before, so their answers are the same: another ``acks``, an attempt that
        failed at once (or a refusal), the group removed under it, or no commit by the
        deadline (a watcher, started in ``nursery`` the first time, hands it over then; the
        task answers ``Unknown``, or the offsets if it committed just then). An entry cut
        before it committed is answered ``Retry`` at once, with ``_finish_local``'s reason.
        """
        # ``start_forwarded``, inline: this runs once per forwarded write.
        replica = self._raft.replicas.get(request.log_id)
        if replica is None or replica.role is not Role.LEADER:
            self._forwarder.reply(peer, req, Retry("not the leader here"))
            return
        deadline = trio.current_time() + request.seconds
        attempt = self._start_local(replica, request.batch, request.count)
        if (
            not isinstance(attempt, _Local)
            or request.acks is not Acks.QUORUM
            or self.unsafe_ack_before_commit
        ):
            started = ForwardedAppend(attempt, request.acks, deadline)
            nursery.start_soon(self._answer_forwarded, peer, req, started)
            return
        waiter = _ForwardWaiter(peer, req, attempt, deadline, nursery)

        def committed(outcome: tuple[int, int] | Attempt) -> None:
            if not waiter.waiting:
                return  # its deadline passed first: a task answers it
            waiter.waiting = False
            forwards = self._forwards
            while forwards and not forwards[0][2].waiting:
                heapq.heappop(forwards)  # the usual case: commits come in deadline order
            if isinstance(outcome, tuple):
                self._forwarder.reply(peer, req, Appended(*outcome))
            elif isinstance(outcome, _Failed):
                failed = Unknown(outcome.reason) if outcome.unknown else Retry(outcome.reason)
                self._forwarder.reply(peer, req, failed)
            else:  # neither committed nor cut (the group was removed): as the task would
                nursery.start_soon(self._answer_forwarded, peer, req, waiter.append())

        self._on_commit(attempt, committed, None)  # the peer's own write path times it
        if not waiter.waiting:
            return  # told at once (a duplicate of a committed batch)
        heapq.heappush(self._forwards, (deadline, next(self._forward_seq), waiter))
        watch = self._forward_watch
        if watch is None:
            if not self._forward_watching:
                self._forward_watching = True
                nursery.start_soon(self._watch_forwarded)
        elif deadline < self._forward_wake_at:  # later ones wait for the watcher's next look
            self._forward_wake_at = watch.deadline = deadline

    async def _answer_forwarded(self, peer: int, req: int, append: ForwardedAppend) -> None:
        self._forwarder.reply(peer, req, await self.finish_forwarded(append))

    async def _watch_forwarded(self) -> None:
        """Hand each peer's append still unanswered at its deadline to a task of the nursery
        it came with (``serve_forwarded``). Sleeps until the earliest deadline, which a new
        earlier one moves forward; answered entries leave the heap from its top."""
        try:
            while True:
                forwards = self._forwards
                now = trio.current_time()
                while forwards and (not forwards[0][2].waiting or forwards[0][0] <= now):
                    _, _, late = heapq.heappop(forwards)
                    if late.waiting:
                        late.waiting = False
                        late.nursery.start_soon(
                            self._answer_forwarded, late.peer, late.req, late.append()
                        )
                self._forward_wake_at = forwards[0][0] if forwards else math.inf
                with trio.CancelScope(deadline=self._forward_wake_at) as watch:
                    self._forward_watch = watch
                    await trio.sleep_forever()
                self._forward_watch = None
        finally:
            self._forward_watch = None
            self._forward_watching = False


@dataclass(frozen=True, slots=True)
class LeaderWrite:
    """A batch this leader proposed (``WritePath.begin_as_leader``), not yet known written."""

    _path: WritePath
    log_id: str
    _attempt: Attempt
    _deadline: float

    async def written(self, acks: Acks) -> tuple[int, int]:
        """``(first, last)`` offsets once written as ``acks`` asks; ``RequestError``:
        ``NOT_LEADER`` (nothing written) or ``TIMEOUT`` (the outcome is unknown) otherwise."""
        try:
            return await self._path.finish(self._attempt, acks, self._deadline)
        except _Retry as retry:
            raise self._error(retry.unknown, str(retry)) from None

    @property
    def deadline(self) -> float:
        """When ``written`` gives up (trio time): the write timeout after the proposal."""
        return self._deadline

    def tells(self, acks: Acks) -> bool:
        """Whether ``when_written`` can tell this write's outcome as ``acks`` asks (a quorum's:
        the group tells its commit); else the caller awaits ``written``."""
        return acks is Acks.QUORUM and not self._path.unsafe_ack_before_commit

    def when_written(self, callback: Callable[[tuple[int, int] | RequestError], None]) -> None:
        """``written(Acks.QUORUM)`` with no task waiting (only where ``tells``): ``callback``
        gets the ``(first, last)`` offsets or the ``RequestError`` that ``written`` would
        raise, once, at once if the outcome is known now, else from the task that sees the
        group commit the entry or cut it (``WritePath.when_written``'s rules: quick, never
        raises). It is never called for an entry that neither commits nor is cut: the caller
        watches ``deadline`` and takes such a write's outcome as unknown (``TIMEOUT``) then,
        as ``written`` would. A group removed under the entry tells ``TIMEOUT`` at once."""
        attempt = self._attempt
        if isinstance(attempt, _Failed):
            callback(attempt.refusal or self._error(attempt.unknown, attempt.reason))
            return
        if not isinstance(attempt, _Local):  # begin_as_leader only starts local proposals
            raise TypeError(f"{self.log_id}: not a local proposal: {attempt!r}")

        def told(outcome: tuple[int, int] | Attempt) -> None:
            if isinstance(outcome, tuple):
                callback(outcome)
            elif isinstance(outcome, _Failed):
                callback(self._error(outcome.unknown, outcome.reason))
            else:  # neither committed nor cut: the group went away under it
                callback(self._error(True, "the group was removed before the entry committed"))

        self._path._on_commit(attempt, told, self._deadline - self._path.timeout)

    def _error(self, unknown: bool, reason: str) -> RequestError:
        code = ErrorCode.TIMEOUT if unknown else ErrorCode.NOT_LEADER
        return RequestError(code, f"{self.log_id}: {reason}; retry")


@dataclass(frozen=True, slots=True)
class ForwardedAppend:
    """A peer's append this leader has started (``WritePath.start_forwarded``)."""

    attempt: Attempt
    acks: Acks
    deadline: float


@dataclass(eq=False, slots=True)
class _ForwardWaiter:
    """A peer's append whose commit this leader's group will tell (``serve_forwarded``)."""

    peer: int
    req: int
    attempt: _Local
    deadline: float
    nursery: trio.Nursery = field(repr=False)
    waiting: bool = True  # False once answered, or handed to a task at its deadline

    def append(self) -> ForwardedAppend:
        """For ``finish_forwarded``, on the rare paths (built only then: it is frozen, so
        dearer to build)."""
        return ForwardedAppend(self.attempt, Acks.QUORUM, self.deadline)


def _cut(replica: RaftReplica, last: int, term: int) -> _Retry:
    """Why this leader's proposal (offset ``last`` of ``term``) is no longer in ``replica``'s
    log, as the retry to raise: definite only when another entry has committed at its offset.

    An entry cut from this replica's log may still be committed: the leader that cut it need
    not be the last one. Any replica that received it before it was cut here may win a later
    election (with five replicas, two majorities; with three, a repaired log or a reset) and
    commit it, as Raft commits whatever a new leader holds of earlier terms. Only the commit
    index settles it: once it covers the offset and the log there holds another term, the
    committed entry is another one (Log Matching), and ours never commits."""
    held = replica.log.term_at(last)
    if held is not None and held != term and replica.commit_index >= last:
        return _Retry(f"offset {last} of term {term} was replaced before it committed")
    return _Retry(
        f"offset {last} of term {term} was cut from this replica's log before it committed "
        "(another replica may hold it and commit it: the outcome is unknown)",
        unknown=True,
    )


def _found_of(answer: Answer) -> int | None:
    """Read a leader's answer to a ``FindResendRequest`` (see ``serve_find_resend``)."""
    match answer:
        case Found(offset):
            return offset
        case Absent():
            return None
        case Retry(reason):
            raise _Retry(f"leader: {reason}")
    raise _Retry(f"an answer that does not fit the request: {answer!r:.200}", unknown=True)


def _outcome_of(answer: Answer) -> tuple[int, int]:
    """Read a leader's answer to a forwarded append (see ``finish_forwarded``)."""
    match answer:
        case Appended(first, last):
            return first, last
        case Retry(reason):
            raise _Retry(f"leader: {reason}")
        case Unknown(reason):
            raise _Retry(f"leader: {reason}", unknown=True)
        case Refused(code, message):
            raise RequestError(code, message)
    raise _Retry(f"an answer that does not fit the request: {answer!r:.200}", unknown=True)


def _carries_producer_id(batch: bytes) -> bool:
    """Whether the leader can tell a retry of ``batch`` from a new batch (its producer id)."""
    try:
        return decode_header(batch, verify=False).producer_id != NO_PRODUCER_ID
    except InvalidBatchError:
        return False
