"""``LATEST topic key`` on real broker processes (issue 26, seed 002: a producer's latest
heartbeat by id).

Many keys written in rounds (small segments, compaction running every fraction of a second), then
every key's newest value asked through every broker (the leader answers from its key index; the
others forward to it), a tombstone answering "no value", clear errors for a topic that is not
compacted and for bad input, and the same answers from a new leader after the old one was killed.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kafkaesque.client import AsyncClient, Client, KafkaesqueError, Producer
from kafkaesque.local_cluster import LocalCluster
from kafkaesque.protocol import (
    EndReply,
    ErrorCode,
    ErrorReply,
    MessageRow,
    PartitionRow,
    partition_for_key,
)

from .line_client import LineClient

KEYS = 120
ROUNDS = 3
# Small segments and frequent passes: compaction rewrites segments while the index is used.
_ARGS = ["--segment-bytes", "4096", "--retention-check-interval", "0.2"]


def _write_rounds(bootstrap: str, topic: str, rounds: int, first: int = 0) -> dict[bytes, bytes]:
    """``rounds`` heartbeats of every device id, acknowledged; the newest value of each key."""
    newest: dict[bytes, bytes] = {}
    with Producer(bootstrap) as producer:
        futures = []
        for r in range(first, first + rounds):
            for i in range(KEYS):
                key, value = b"dev-%03d" % i, b"beat %d of dev-%03d" % (r, i)
                futures.append(producer.send(topic, value, key))
                newest[key] = value
        producer.flush()
        for future in futures:
            future.get(30)
    return newest


def _leader(cluster: LocalCluster, via: int, topic: str, partition: int) -> int | None:
    with LineClient(cluster.client_address(via)) as c:
        rows = c.rows(f"METADATA {topic}")
    return next(r.leader for r in rows if isinstance(r, PartitionRow) and r.partition == partition)


def test_latest_answers_each_keys_newest_value_from_every_broker(tmp_path: Path) -> None:
    with LocalCluster(str(tmp_path), 3, extra_args=_ARGS) as cluster:
        with LineClient(cluster.client_address(0)) as c:
            c.ok("CREATE beats 3 3 compact=yes")
            c.ok("CREATE plain 1 3")
        newest = _write_rounds(cluster.bootstrap, "beats", ROUNDS)
        with Producer(cluster.bootstrap) as producer:
            producer.send("beats", None, b"dev-007").get(30)  # a tombstone: the device is gone
        del newest[b"dev-007"]

        with Client(cluster.bootstrap) as client:
            for key, value in newest.items():
                record = client.latest("beats", key)
                assert record is not None, key
                assert (record.key, record.value) == (key, value)
            assert client.latest("beats", b"dev-007") is None
            assert client.latest("beats", b"never-written") is None

        # Through each broker, leader or not: the same newest value (forwarded to the leader).
        for broker in range(3):
            with LineClient(cluster.client_address(broker)) as c:
                for i in range(0, KEYS, 7):
                    key = b"dev-%03d" % i
                    answer = c.rows(b"LATEST beats " + key)
                    if key == b"dev-007":
                        assert answer == [EndReply()], answer
                        continue
                    assert isinstance(answer[0], MessageRow) and answer[1:] == [EndReply()]
                    assert (answer[0].key, answer[0].value) == (key, newest[key]), broker

        with LineClient(cluster.client_address(1)) as c:
            refused = c.call("LATEST plain dev-001")
            assert isinstance(refused, ErrorReply) and refused.code is ErrorCode.NOT_COMPACTED
            assert "not compacted" in refused.message
            unknown = c.call("LATEST nosuchtopic dev-001")
            assert isinstance(unknown, ErrorReply) and unknown.code is ErrorCode.UNKNOWN_TOPIC
            bad = c.call("LATEST beats")
            assert isinstance(bad, ErrorReply) and bad.code is ErrorCode.BAD_ARGS
            assert "LATEST <topic> <key>" in bad.message
            assert c.ok("PING") == "PONG"  # the session goes on


def test_a_new_leader_rebuilds_its_index_and_answers_the_newest_values(tmp_path: Path) -> None:
    with LocalCluster(str(tmp_path), 3, extra_args=_ARGS) as cluster:
        with LineClient(cluster.client_address(0)) as c:
            c.ok("CREATE beats 1 3 compact=yes")
        _write_rounds(cluster.bootstrap, "beats", ROUNDS)
        victim = _leader(cluster, 0, "beats", 0)
        assert victim is not None
        survivors = [b for b in range(3) if b != victim]
        with Client(cluster.bootstrap) as client:
            assert client.latest("beats", b"dev-001") is not None  # the old leader's index
        cluster.kill(victim)

        bootstrap = ",".join("{}:{}".format(*cluster.client_address(b)) for b in survivors)
        newest = _write_rounds(bootstrap, "beats", 1, first=ROUNDS)  # newer, to the new leader
        deadline = time.monotonic() + 30
        while _leader(cluster, survivors[0], "beats", 0) in (None, victim):
            assert time.monotonic() < deadline, "no new leader"
            time.sleep(0.1)
        with Client(bootstrap) as client:
            for key, value in newest.items():
                record = client.latest("beats", key)
                assert record is not None and record.value == value, (key, record)
        for broker in survivors:
            with LineClient(cluster.client_address(broker)) as c:
                answer = c.rows("LATEST beats dev-042")
                assert isinstance(answer[0], MessageRow)
                assert answer[0].value == newest[b"dev-042"]


async def test_the_trio_client_reads_the_latest_value_and_its_refusals(
    broker_cluster: LocalCluster,
) -> None:
    async with AsyncClient(broker_cluster.bootstrap) as client:
        await client.create_topic("async-beats", 2, 3, compact=True)
        await client.create_topic("async-plain", 1, 3)
        for n in range(3):
            await client.publish("async-beats", b"beat %d" % n, key=b"dev-1")
        record = await client.latest("async-beats", b"dev-1")
        assert record is not None
        assert (record.topic, record.key, record.value) == ("async-beats", b"dev-1", b"beat 2")
        assert record.partition == partition_for_key(b"dev-1", 2)
        assert await client.latest("async-beats", b"dev-2") is None
        with pytest.raises(KafkaesqueError) as refused:
            await client.latest("async-plain", b"dev-1")
        assert refused.value.code is ErrorCode.NOT_COMPACTED
        with pytest.raises(ValueError, match="non-empty key"):
            await client.latest("async-beats", b"")
