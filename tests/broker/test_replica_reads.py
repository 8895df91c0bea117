"""``FETCH ... replica=local``: each broker's own replica, read over a real socket (issue 23).

A plain FETCH is served by the partition's leader whichever broker gets it, so it cannot show
what a follower holds. ``replica=local`` answers from the broker's own replica, up to its own
commit index, and never forwards: replicas can be compared, and a broker without a replica says
so (``NO_REPLICA``) instead of answering the leader's log.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from kafkaesque.client import Client, KafkaesqueError
from kafkaesque.local_cluster import LocalCluster
from kafkaesque.protocol import DataReply, ErrorCode, ErrorReply, MessageRow, PartitionRow

from .line_client import LineClient
from .test_leader_failover import _read_back, _replica_on_disk

CONVERGE_S = 30.0


def _local_read(cluster: LocalCluster, broker: int, topic: str, partition: int) -> dict[int, bytes]:
    """Every record broker ``broker``'s own replica holds committed, by offset."""
    out: dict[int, bytes] = {}
    with LineClient(cluster.client_address(broker)) as c:
        offset = 0
        for _ in range(10_000):  # bounded: each round moves past at least one record
            rows = c.rows(f"FETCH {topic} {partition} {offset} format=text replica=local")
            got = [r for r in rows if isinstance(r, MessageRow)]
            if not got:
                return out
            out.update((m.offset, m.value or b"") for m in got)
            offset = got[-1].offset + 1
    raise AssertionError("the local read did not end")


def _replicas(cluster: LocalCluster, topic: str) -> dict[int, tuple[int | None, tuple[int, ...]]]:
    """Partition -> (leader, replicas), as broker 0 knows them."""
    with LineClient(cluster.client_address(0)) as c:
        rows = c.rows(f"METADATA {topic}")
    return {r.partition: (r.leader, r.replicas) for r in rows if isinstance(r, PartitionRow)}


def _until_converged(
    cluster: LocalCluster, brokers: list[int], topic: str, want: dict[int, bytes]
) -> dict[int, dict[int, bytes]]:
    """Local reads of every broker in ``brokers`` once each equals ``want`` (bounded). Every
    read on the way must be a prefix of ``want``: a replica behind holds less, never other."""
    deadline = time.monotonic() + CONVERGE_S
    while True:
        reads = {b: _local_read(cluster, b, topic, 0) for b in brokers}
        for b, read in reads.items():
            assert all(want.get(o) == v for o, v in read.items()), (b, read, want)
            if read:
                assert set(read) == {o for o in want if o <= max(read)}, (b, read, want)
        if all(read == want for read in reads.values()):
            return reads
        assert time.monotonic() < deadline, f"replicas did not converge: {reads} vs {want}"
        time.sleep(0.2)


def test_every_replica_reads_its_own_log_and_a_broker_without_one_says_so(
    tmp_path: Path,
) -> None:
    with LocalCluster(str(tmp_path), 3) as cluster:
        with LineClient(cluster.client_address(0)) as c:
            c.ok("CREATE full 1 3")
            c.ok("CREATE pair 1 2")
            for i in range(10):
                c.ok(f"PUBS full v{i}")
            c.ok("PUBS pair p0")
        leader_view = _read_back(cluster, 0, "full", 0)
        assert sorted(leader_view.values()) == sorted(f"v{i}".encode() for i in range(10))
        _until_converged(cluster, [0, 1, 2], "full", leader_view)

        # A broker that holds no replica answers NO_REPLICA, not the leader's log (a plain
        # FETCH through it is forwarded and does answer).
        [(_, pair_replicas)] = _replicas(cluster, "pair").values()
        [outsider] = [b for b in range(3) if b not in pair_replicas]
        with LineClient(cluster.client_address(outsider)) as c:
            reply = c.call("FETCH pair 0 0 replica=local")
            assert isinstance(reply, ErrorReply), reply
            assert reply.code is ErrorCode.NO_REPLICA
            assert f"{outsider} holds no replica of pair/0" in reply.message
            assert isinstance(c.call("FETCH pair 0 0"), DataReply)
            missing = c.call("FETCH full 7 0 replica=local")
            assert isinstance(missing, ErrorReply)
            assert missing.code is ErrorCode.UNKNOWN_PARTITION
        # A follower's replica holds p0 committed once it hears of the commit (the next
        # round): wait for it, as for "full" (CI saw a follower read before it had).
        pair_view = _read_back(cluster, pair_replicas[0], "pair", 0)
        assert list(pair_view.values()) == [b"p0"]
        _until_converged(cluster, list(pair_replicas), "pair", pair_view)

        # The client library: fetch(..., replica=<broker id>) is that broker's replica=local.
        with Client(cluster.bootstrap) as client:
            for b in range(3):
                got = client.fetch("full", 0, 0, replica=b)
                assert [r.value for r in got.records] == list(leader_view.values())
                assert got.high_watermark is not None
                assert got.high_watermark > max(leader_view)
            with pytest.raises(KafkaesqueError) as refused:
                client.fetch("pair", 0, 0, replica=outsider)
            assert refused.value.code is ErrorCode.NO_REPLICA
            assert not refused.value.retriable
            with pytest.raises(KafkaesqueError, match="broker 7 is not registered"):
                client.fetch("full", 0, 0, replica=7)

        # A follower stopped while records are committed holds them only once it caught up.
        [(leader, _)] = _replicas(cluster, "full").values()
        assert leader is not None
        follower = next(b for b in range(3) if b != leader)
        cluster.stop(follower)
        with LineClient(cluster.client_address(leader)) as c:
            for i in range(5):
                c.ok(f"PUBS full w{i}")
        follower_dir = os.path.join(cluster.data_dir, str(follower), "full", "0")
        assert _replica_on_disk(follower_dir) == leader_view  # it was down for the w's
        leader_view = _read_back(cluster, leader, "full", 0)
        assert len(leader_view) == 15
        cluster.start(follower)
        cluster.wait_ready(brokers=[0, 1, 2])
        reads = _until_converged(cluster, [0, 1, 2], "full", leader_view)

        # A read no replica can serve: every broker holding one is down. The broker that got it
        # holds none and answers NO_QUORUM, the read-side meaning documented in the error table.
        for b in pair_replicas:
            cluster.stop(b)
        with LineClient(cluster.client_address(outsider)) as c:
            reply = c.call("FETCH pair 0 0")
            assert isinstance(reply, ErrorReply), reply
            assert reply.code is ErrorCode.NO_QUORUM and reply.code.retriable
            assert "pair/0" in reply.message

        # What each broker answered is what its own disk holds.
        cluster.stop_all()
        for b in range(3):
            on_disk = _replica_on_disk(os.path.join(cluster.data_dir, str(b), "full", "0"))
            assert on_disk == reads[b], b
