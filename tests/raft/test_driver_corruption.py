"""The driver repairs corruption found at run time (issue 8): three brokers over loopback TCP.

A bit flipped in a sealed segment under a running broker is found by a consumer's read (an
error to the consumer, never bad data) or by the background scrub; the broker does not crash:
the group cuts its log before the bad batch, re-replicates from the leader (a corrupt leader
steps down first) and ends with exactly the committed history.

Without durable acknowledgements (``--fsync interval``) a power cut can take committed entries
from a quorum while a member keeps them: that member's log then disagrees with the new leader's
below its commit. It cuts its log there and follows the leader (``LogDiverged``), where it
used to crash the broker or spin with the leader forever.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import trio

from kafkaesque.broker._errors import RequestError
from kafkaesque.broker._reads import read_committed
from kafkaesque.local_cluster import free_ports
from kafkaesque.raft import Role
from kafkaesque.raft.driver import MultiRaft, PeerTransport
from kafkaesque.storage import (
    FsyncPolicy,
    LogConfig,
    PartitionLog,
    Record,
    build_batch,
    iter_batches,
)

GROUP = "t/0"
LOG_CONFIG = LogConfig(segment_bytes=2048, index_interval_bytes=256, segment_ms=None)
COUNT = 60


class Broker:
    def __init__(
        self,
        node_id: int,
        root: Path,
        peers: dict[int, tuple[str, int]],
        scrub: int,
        log_config: LogConfig = LOG_CONFIG,
    ) -> None:
        self.id = node_id
        self.port = peers[node_id][1]
        self.raft = MultiRaft(
            node_id,
            self._send,
            state_dir=str(root / f"b{node_id}"),
            peers=peers,
            scrub_bytes_per_tick=scrub,
        )
        self.transport = PeerTransport(
            node_id,
            peers,
            cluster="t",
            secret=b"s",
            on_items=self.raft.handle_items,
            on_peer_change=self.raft.peer_changed,
        )
        self.dir = root / f"b{node_id}" / "t-0"
        self.raft.add_replica(GROUP, str(self.dir), peers, log_config)
        self.scope = trio.CancelScope()

    def _send(self, peer: int, item: object) -> bool:
        return self.transport.send(peer, item)

    async def run(self) -> None:
        with self.scope:
            async with trio.open_nursery() as nursery:
                await nursery.start(self.transport.run, "127.0.0.1", self.port)
                await nursery.start(self.raft.run)

    @property
    def replica(self):  # type: ignore[no-untyped-def]
        return self.raft.replicas[GROUP]

    def committed_values(self) -> list[bytes]:
        return [r.value or b"" for r in self.replica.committed_records()]


def _value(i: int) -> bytes:
    return b"value-%03d-" % i + b"x" * 60


async def _leader(brokers: list[Broker]) -> Broker:
    with trio.fail_after(20):
        while True:
            leaders = [b for b in brokers if b.replica.role is Role.LEADER]
            if len(leaders) == 1:
                return leaders[0]
            await trio.sleep(0.02)


async def _commit(brokers: list[Broker], value: bytes) -> None:
    with trio.fail_after(30):
        while True:
            leader = await _leader(brokers)
            try:
                await leader.raft.propose(GROUP, build_batch([Record(value=value)]), 1, timeout=2)
                return
            except Exception:  # noqa: BLE001 - NotLeader, lost or timed out: find the leader again
                await trio.sleep(0.02)


async def _converged(brokers: list[Broker], want: list[bytes]) -> None:
    with trio.fail_after(30):
        while any(b.committed_values() != want for b in brokers):
            await trio.sleep(0.05)


def _flip_sealed(broker: Broker) -> int:
    """Flip a bit inside a record of a batch in the middle of the second segment, in place
    (the broker keeps running); return that batch's base offset."""
    second = sorted(broker.dir.glob("*.log"))[1]
    data = second.read_bytes()
    pos = 0
    for n, header in enumerate(iter_batches(data)):
        if n == 2:
            with open(second, "r+b") as f:
                f.seek(pos + header.size - 10)
                byte = f.read(1)
                f.seek(pos + header.size - 10)
                f.write(bytes([byte[0] ^ 0x08]))
            return header.base_offset
        pos += header.size
    raise AssertionError("the segment is too short")


class Cluster:
    """Three brokers in one process; ``restart`` stops one as a crash would and starts it."""

    def __init__(
        self, root: Path, scrub: int, nursery: trio.Nursery, log_config: LogConfig = LOG_CONFIG
    ) -> None:
        ports = free_ports(3)
        self.root, self.scrub, self.nursery = root, scrub, nursery
        self.log_config = log_config
        self.peers = {i: ("127.0.0.1", ports[i]) for i in range(3)}
        self.brokers = [Broker(i, root, self.peers, scrub, log_config) for i in range(3)]
        for b in self.brokers:
            nursery.start_soon(b.run)

    def stop(self, broker: Broker) -> None:
        broker.scope.cancel()
        broker.raft.close()

    def start(self, node_id: int) -> Broker:
        broker = Broker(node_id, self.root, self.peers, self.scrub, self.log_config)
        self.brokers[node_id] = broker
        self.nursery.start_soon(broker.run)
        return broker

    def close(self) -> None:
        for b in self.brokers:
            if not b.scope.cancel_called:
                self.stop(b)


async def _run(  # type: ignore[no-untyped-def]
    tmp_path: Path, scrub: int, scenario, log_config: LogConfig = LOG_CONFIG
) -> None:
    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, scrub, nursery, log_config)
        try:
            brokers = cluster.brokers
            want = [_value(i) for i in range(COUNT)]
            for value in want:
                await _commit(brokers, value)
            await _converged(brokers, want)
            assert all(len(list(b.dir.glob("*.log"))) >= 3 for b in brokers)
            await scenario(cluster, want)
        finally:
            nursery.cancel_scope.cancel()
            cluster.close()


async def test_a_consumer_read_that_hits_corruption_gets_an_error_and_the_replica_repairs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The nemesis of issue 8: a bit flips in a sealed segment of a stopped follower, which
    restarts (sealed segments are trusted on open) and serves a consumer."""

    async def scenario(cluster: Cluster, want: list[bytes]) -> None:
        leader = await _leader(cluster.brokers)
        victim = next(b for b in cluster.brokers if b is not leader)
        cluster.stop(victim)
        bad = _flip_sealed(victim)
        follower = cluster.start(victim.id)
        with trio.fail_after(30):
            while follower.replica.commit_index < COUNT:
                await trio.sleep(0.05)
        with pytest.raises(RequestError, match="corruption"):
            read_committed(follower.replica, bad, 1 << 20)
        # The driver cuts the log, re-replicates it from the leader and ends whole again.
        with trio.fail_after(30):
            while follower.raft.corruptions < 1 or follower.replica.node.status().lost_end:
                await trio.sleep(0.05)
        await _commit(cluster.brokers, b"after")
        await _converged(cluster.brokers, [*want, b"after"])
        follower.replica.log.verify()
        assert read_committed(follower.replica, bad, 1 << 20).data

    await _run(tmp_path, 0, scenario)
    assert any("corruption: " in r.getMessage() for r in caplog.records)


async def test_the_scrub_finds_a_flip_under_the_leader_which_steps_down_and_repairs(
    tmp_path: Path,
) -> None:
    """A bit flips under a running leader, in bytes it verified long ago: the scrub finds it."""

    async def scenario(cluster: Cluster, want: list[bytes]) -> None:
        leader = await _leader(cluster.brokers)
        _flip_sealed(leader)
        with trio.fail_after(30):
            while leader.raft.corruptions < 1:
                await trio.sleep(0.05)
        # Another broker leads, the old leader re-replicates, nothing committed is lost.
        await _commit(cluster.brokers, b"after")
        await _converged(cluster.brokers, [*want, b"after"])
        leader.replica.log.verify()
        assert leader.replica.log.lost_end_offset is None

    await _run(tmp_path, 64 * 1024, scenario)


async def test_a_follower_whose_acknowledged_tail_was_cut_re_replicates_it(
    tmp_path: Path,
) -> None:
    """The other half of the nemesis: the tail of a stopped follower's active segment is cut
    below what it had fsynced (and acknowledged). On restart it knows what it lost, does not
    vote until the leader has resent it, and ends whole."""

    async def scenario(cluster: Cluster, want: list[bytes]) -> None:
        leader = await _leader(cluster.brokers)
        victim = next(b for b in cluster.brokers if b is not leader)
        cluster.stop(victim)
        active = sorted(victim.dir.glob("*.log"))[-1]
        data = active.read_bytes()
        batches = [h.size for h in iter_batches(data)]
        assert len(batches) >= 3
        with open(active, "r+b") as f:
            f.truncate(len(data) - sum(batches[-3:]) + 5)  # 3 batches gone, a torn 4th
        follower = cluster.start(victim.id)
        status = follower.replica.node.status()
        assert status.lost_end is not None  # its old end: it may not vote below it
        assert status.lost_end > follower.replica.log.log_end_offset
        assert follower.replica.log.corruptions == 1
        with trio.fail_after(30):
            while follower.replica.node.status().lost_end is not None:
                assert follower.replica.role is not Role.LEADER
                await trio.sleep(0.05)
        await _commit(cluster.brokers, b"after")
        await _converged(cluster.brokers, [*want, b"after"])
        assert follower.replica.log.lost_end_offset is None

    await _run(tmp_path, 0, scenario)


async def test_without_durable_acks_a_member_whose_committed_tail_the_quorum_lost_follows_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``--fsync interval``: two members lose their unsynced tail in a power cut (the log cut
    as recovery finds it) while the third kept it, committed. The two elect a leader and commit
    new entries at those offsets; the third comes back, cuts its log where it disagrees, and
    ends with the new history, without a crash or an endless exchange with the leader."""
    cut = COUNT - 10

    async def scenario(cluster: Cluster, want: list[bytes]) -> None:
        for broker in cluster.brokers:
            cluster.stop(broker)
        for broker in cluster.brokers[1:]:
            log = PartitionLog.open(str(broker.dir), cluster.log_config)
            boundary = next(o for o in range(cut, COUNT) if _starts_batch(log, o))
            log.truncate(boundary)
            log.close()
        survivors = [cluster.start(i) for i in (1, 2)]
        new = [b"new-%d" % i for i in range(2)]  # fewer than were lost: the old commit is above
        for value in new:
            await _commit(survivors, value)
        with trio.fail_after(30):
            while any(b.committed_values()[-1:] != new[-1:] for b in survivors):
                await trio.sleep(0.05)
        kept = survivors[0].committed_values()
        assert kept[-len(new) :] == new and len(kept) < COUNT + len(new)
        keeper = cluster.start(0)
        with trio.fail_after(30):
            while keeper.replica.divergences < 1:
                await trio.sleep(0.02)
        # Readers never take more as committed than the log holds (its old commit lies beyond
        # the new history's end: more was lost than written since).
        assert keeper.replica.commit_index < keeper.replica.log.log_end_offset
        await _converged(cluster.brokers, kept)
        assert keeper.replica.divergences == 1 and keeper.raft.corruptions == 0
        await _commit(cluster.brokers, b"after")
        await _converged(cluster.brokers, [*kept, b"after"])

    await _run(tmp_path, 0, scenario, replace(LOG_CONFIG, fsync=FsyncPolicy.INTERVAL))
    assert any("diverged: " in r.getMessage() for r in caplog.records)


def _starts_batch(log: PartitionLog, offset: int) -> bool:
    result = log.read(offset, 1 << 20)
    return next(iter_batches(result.data)).base_offset == offset
