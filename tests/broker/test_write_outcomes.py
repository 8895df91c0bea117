"""A write reported as definitely not written must never be in the log (issue 36, G1a).

Found by jepsen_like under ``power-loss,pause,partition`` (seed 119): an idempotent send was
answered with an error that says "nothing was written", yet its record was committed and read.
Two ways the write path could say so, each shown here on real Raft groups (``_Cluster``):

* a leader whose proposal was cut from its own log called it lost for good ("truncated before it
  committed": ``NOT_LEADER`` from ``write_as_leader``, ``Retry`` to a forwarding broker). But the
  leader that cut it need not be the last one: a replica that received the entry before it was
  cut may win a later election and commit it. Only an entry replaced below the commit index is
  lost for good;
* ``write`` retried an attempt whose outcome was unknown and passed on the refusal of a later
  attempt (``OUT_OF_ORDER_SEQUENCE``, say) as its answer, although the first may have landed.
  This is what happened in the run (``test_seed_119_...`` replays it): the retry went to a
  paused old leader, whose claim the forwarding broker fell back on once the new leader's
  connection closed, and which refused the batch as out of order when it resumed.
"""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing

from kafkaesque.broker._errors import RequestError
from kafkaesque.protocol import (
    Acks,
    ErrorCode,
    PeerCall,
    PeerReply,
    Refused,
    Retry,
    Unknown,
    peer_from_wire,
)
from kafkaesque.raft import Role
from kafkaesque.storage import Record, build_batch

from .test_forwarding import (
    GROUP,
    PAUSED,
    _claim,
    _Cluster,
    _ForwardingWrites,
    _request,
    _requests,
)


async def _elect(
    cluster: _Cluster, among: tuple[int, ...], *, above: int = 0, rounds: int = 400
) -> int:
    """Tick ``among`` (the others are not ticked) until one of them leads a term above
    ``above``; return it at once, before its first appends are delivered."""
    for _ in range(rounds):
        for b in among:
            cluster.rafts[b].tick()
        while await cluster.round():
            for b in among:
                node = cluster.rafts[b].replicas[GROUP].node
                if node.role is Role.LEADER and node.term > above:
                    return b
    raise AssertionError(f"none of {among} was elected")


async def test_an_entry_cut_from_its_leaders_log_may_still_commit_and_is_answered_unknown(
    tmp_path: Path,
) -> None:
    # Five replicas. The leader L appends two entries, one its own write (write_as_leader), one
    # a peer's forwarded append, and only F receives them. A new leader N is elected by the
    # other three without them, and its first append reaches L only: L cuts both entries from
    # its log. Then N stops, and F, which still holds them, is elected by the other three (its
    # log is the more up-to-date) and commits them. L must not have said "not written".
    async with trio.open_nursery() as nursery:
        cluster = _Cluster(tmp_path, 5, nursery)
        try:
            await cluster.settle()
            lead = cluster.leader()
            f, *others = (b for b in range(5) if b != lead)
            term = cluster.rafts[lead].replicas[GROUP].node.term
            cluster.isolate(lead, but=(f,))
            outcome: list[object] = []

            async def own_write() -> None:
                try:
                    outcome.append(
                        await cluster.writes[lead].write_as_leader(
                            GROUP, build_batch([Record(value=b"own")]), 1
                        )
                    )
                except RequestError as exc:
                    outcome.append(exc)

            nursery.start_soon(own_write)
            await trio.testing.wait_all_tasks_blocked()
            # A peer's append. Its answer is addressed to L itself, so that the harness records
            # it whatever links are cut by then (a peer would drop it, its call lost).
            cluster.writes[lead].serve_forwarded(
                lead, 7, _request(build_batch([Record(value=b"forwarded")]), 30.0), nursery
            )
            await cluster.settle()
            assert cluster.values(f) == []  # F holds both, uncommitted: 2 replicas of 5
            assert outcome == [] and cluster.replies == []

            # N is elected by the other three (L and F are cut off), then reaches L alone.
            cluster.isolate(f)
            n = await _elect(cluster, tuple(others))
            c2, c3 = (b for b in others if b != n)
            cluster.cut.discard(frozenset((lead, n)))
            cluster.isolate(n, but=(lead,))
            for _ in range(20):
                await cluster.round()
            await trio.testing.wait_all_tasks_blocked()
            assert cluster.rafts[lead].replicas[GROUP].role is Role.FOLLOWER
            assert cluster.rafts[lead].replicas[GROUP].log.log_end_offset == 2  # both cut

            # L's answers, now: neither may say "not written".
            (error,) = outcome
            assert isinstance(error, RequestError), error
            assert error.code is ErrorCode.TIMEOUT, error  # was NOT_LEADER: "nothing written"
            ((src, dst, item),) = cluster.replies
            reply = peer_from_wire(item)
            assert (src, dst) == (lead, lead) and isinstance(reply, PeerReply) and reply.req == 7
            assert isinstance(reply.answer, Unknown), reply  # was Retry: "not written"
            assert f"of term {term} was cut" in reply.answer.reason

            # N stops; F, which holds the entries, is elected by c2 and c3, and commits them.
            cluster.dead.add(n)
            cluster.cut.clear()
            cluster.isolate(lead)
            assert await _elect(cluster, (f, c2, c3)) == f
            await cluster.settle()
            assert cluster.values(f) == [b"own", b"forwarded"]  # committed: what consumers read
            nursery.cancel_scope.cancel()
        finally:
            cluster.close()


async def test_an_entry_replaced_below_the_commit_index_is_definitely_not_written(
    tmp_path: Path,
) -> None:
    # The other side of the rule: once another entry has committed at its offset, the cut
    # entry can never commit, and the answer stays definite (retry: nothing was written).
    async with trio.open_nursery() as nursery:
        cluster = _Cluster(tmp_path, 3, nursery)
        try:
            await cluster.settle()
            old = cluster.leader()
            cluster.writes[old].serve_forwarded(
                1, 7, _request(build_batch([Record(value=b"a")]), 30.0), nursery
            )
            cluster.isolate(old)  # the entry never leaves the old leader
            await cluster.settle()
            others = tuple(b for b in range(3) if b != old)
            new = await _elect(cluster, others)
            await cluster.settle()  # its no-op commits at the entry's offset, on the two others
            assert cluster.rafts[new].replicas[GROUP].commit_index >= 1
            cluster.cut.clear()  # the new leader's appends reach the old one, which cuts
            for _ in range(10):
                await cluster.settle(ticks=1)
            ((_, _, item),) = cluster.replies
            reply = peer_from_wire(item)
            assert isinstance(reply, PeerReply) and isinstance(reply.answer, Retry), reply
            assert "replaced before it committed" in reply.answer.reason
            nursery.cancel_scope.cancel()
        finally:
            cluster.close()


def _pid_batch(value: bytes, sequence: int) -> bytes:
    return build_batch([Record(value=value)], producer_id=PRODUCER, base_sequence=sequence)


PRODUCER = 2612573960162241306


async def test_seed_119_a_write_whose_leader_lost_power_waits_for_the_next_leader(
    tmp_path: Path,
) -> None:
    # The interleaving of the jepsen run (seed 119, pause-kill), on three real Raft groups:
    # S led the partition, then was paused; A was elected and leads; broker V forwards a
    # producer's batch (sequence 2) to A, which appends it and replicates it to V, then loses
    # power before it commits. V's connection to A closes (outcome unknown) and V forgets A's
    # leadership claim. In the jepsen run S's older claim was then the best V knew: V retried
    # at S, which resumed still believing it led its term and refused the batch as out of order
    # (its producer window ends at sequence 0). That refusal said "nothing written" to the
    # client; V, the most up-to-date replica, was then elected and committed the batch. Two
    # fixes: a refusal after an attempt of unknown outcome is TIMEOUT (the next test), and the
    # leader table does not fall back to a claim of a term below a withdrawn one (this test).
    async with trio.open_nursery() as nursery:
        cluster = _Cluster(tmp_path, 3, nursery)
        try:
            await cluster.settle()
            s = cluster.leader()
            s_term = cluster.rafts[s].replicas[GROUP].node.term
            cluster.writes[s].serve_forwarded(s, 1, _request(_pid_batch(b"p-0", 0), 30.0), nursery)
            await cluster.settle()
            cluster.dead.add(s)  # paused: it still believes it leads
            a = await _elect(cluster, tuple(b for b in range(3) if b != s))
            (v,) = (b for b in range(3) if b not in (s, a))
            await cluster.settle()
            a_term = cluster.rafts[a].replicas[GROUP].node.term
            for broker, term in ((s, s_term), (a, a_term)):  # the claims V heard
                cluster.tables[v].report(broker, {GROUP: _claim(term)})
            cluster.writes[a].serve_forwarded(a, 2, _request(_pid_batch(b"p-1", 1), 30.0), nursery)
            await cluster.settle()
            assert cluster.values(a) == [b"p-0", b"p-1"]

            outcome: list[object] = []

            async def send_via_v() -> None:
                try:
                    written = await cluster.writes[v].write(
                        GROUP, _pid_batch(b"p-2", 2), 1, Acks.QUORUM
                    )
                    outcome.append(written)
                except RequestError as exc:
                    outcome.append(exc)

            nursery.start_soon(send_via_v)
            await trio.testing.wait_all_tasks_blocked()
            await cluster.round()  # the forward reaches A, which appends the batch
            await cluster.round()  # A's append reaches V
            cluster.dead.add(a)  # A loses power before V's acknowledgement reaches it
            await cluster.round()  # V persists the batch
            v_log = cluster.rafts[v].replicas[GROUP].log
            assert v_log.log_end_offset == 5  # no-ops at 0 and 2, p-0, p-1, p-2 (uncommitted)
            # V hears that A's connection closed (as ``Broker._on_peer_change`` tells it).
            cluster.forwarders[v].peer_gone(a)
            cluster.rafts[v].peer_changed(a, False)
            cluster.tables[v].forget(a)
            cluster.dead.discard(s)  # S resumes, still the leader of its term
            # V does not fall back to S's older claim (term A's existed: S is deposed), so it
            # never hears S's refusal (OUT_OF_ORDER_SEQUENCE, "nothing written", before the
            # leader table's fix; TIMEOUT after the write path's): it waits for the election.
            for _ in range(25):
                await cluster.round()
                await trio.sleep(0.002)
            assert not outcome, f"V answered before a leader of term {a_term} or later: {outcome}"
            # The batch was not lost: V holds it and is elected (S's log is behind), commits
            # it, and V's write is answered with its offset (the retry is the same batch).
            assert await _elect(cluster, (s, v), above=a_term) == v
            with trio.fail_after(5):
                while not outcome:
                    await cluster.round()
                    await trio.sleep(0.002)
            await cluster.settle()
            assert cluster.values(v) == [b"p-0", b"p-1", b"p-2"]
            (written,) = outcome
            assert not isinstance(written, RequestError), written
            nursery.cancel_scope.cancel()
        finally:
            cluster.close()


async def test_a_refusal_after_an_attempt_of_unknown_outcome_is_answered_timeout(
    tmp_path: Path,
) -> None:
    # The first attempt reached the leader, whose connection then closed: it may have been
    # appended. The retry, at the new leader, is refused (out of order, say): the answer must
    # not be that refusal ("nothing was written"), but TIMEOUT (the outcome is unknown).
    f = _ForwardingWrites(tmp_path)
    batch = build_batch([Record(value=b"x")], producer_id=77, base_sequence=24)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(f.write, batch)
        await trio.testing.wait_all_tasks_blocked()
        f.table.report(1, {"t/0": _claim(4)})
        f.forwarder.peer_gone(PAUSED)  # the first attempt's outcome is unknown
        with trio.fail_after(5):
            while len(f.wire.sent) < 2:  # the retry, after a short back-off
                await trio.sleep(0.005)
        assert _requests(f.wire)[1][0] == 1
        call = peer_from_wire(f.wire.sent[1][1])
        assert isinstance(call, PeerCall)
        refusal = Refused(ErrorCode.OUT_OF_ORDER_SEQUENCE, "expected seq 23, got 24")
        f.forwarder.answered(call.req, refusal)
    (error,) = f.outcome
    assert isinstance(error, RequestError), error
    assert error.code is ErrorCode.TIMEOUT, error  # was OUT_OF_ORDER_SEQUENCE
    assert error.code.outcome_unknown and "expected seq 23, got 24" in error.message
    f.raft.close()


async def test_a_refusal_of_the_only_attempt_is_passed_on(tmp_path: Path) -> None:
    # Nothing was in doubt: the leader's refusal is the answer, as before.
    f = _ForwardingWrites(tmp_path)
    batch = build_batch([Record(value=b"x")], producer_id=77, base_sequence=24)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(f.write, batch)
        await trio.testing.wait_all_tasks_blocked()
        call = peer_from_wire(f.wire.sent[0][1])
        assert isinstance(call, PeerCall)
        f.forwarder.answered(call.req, Refused(ErrorCode.OUT_OF_ORDER_SEQUENCE, "expected 23"))
    (error,) = f.outcome
    assert isinstance(error, RequestError) and error.code is ErrorCode.OUT_OF_ORDER_SEQUENCE
    f.raft.close()
