"""Issue 8's disk-fault nemesis against three real broker processes.

Write and acknowledge; stop a follower; flip a bit in a sealed segment of its copy of the
partition (a minority fault); restart it. Sealed segments are trusted on open, so the broker
finds the flip with its background scrub, logs "corruption: ...", cuts its log before the bad
batch, does not vote until it has re-replicated what it lost, and catches up. At the end every
replica's copy, read straight from its files, holds exactly the acknowledged records.
"""

from __future__ import annotations

import time
from pathlib import Path

from kafkaesque.client import Client
from kafkaesque.local_cluster import LocalCluster
from kafkaesque.storage import (
    BatchType,
    LogConfig,
    PartitionLog,
    decode_records,
    iter_batches,
)

TOPIC = "disk"
SEGMENT_BYTES = 4096
COUNT = 150


def _partition_dir(cluster: LocalCluster, broker: int) -> Path:
    (found,) = Path(cluster.data_dir, str(broker)).glob(f"{TOPIC}*/0")
    return found


def _replica_values(directory: Path) -> list[bytes]:
    """The data records of a replica's copy, read from its files (the broker is stopped)."""
    out: list[bytes] = []
    log = PartitionLog.open(str(directory), LogConfig(segment_bytes=SEGMENT_BYTES))
    try:
        log.verify()
        offset = log.log_start_offset
        while offset < log.log_end_offset:
            result = log.read(offset, 1 << 20)
            pos = 0
            for header in iter_batches(result.data):
                batch = result.data[pos : pos + header.size]
                pos += header.size
                if header.batch_type is BatchType.DATA:
                    out.extend(r.value or b"" for r in decode_records(batch, header))
            offset = result.next_offset
    finally:
        log.close()
    return out


def _flip_in_sealed_segment(directory: Path) -> Path:
    segments = sorted(directory.glob("*.log"))
    assert len(segments) >= 3, "the test needs sealed segments"
    victim = segments[1]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x20
    victim.write_bytes(bytes(data))
    return victim


def _wait_for(predicate: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _publish_all(client: Client, values: list[bytes]) -> None:
    for value in values:
        deadline = time.monotonic() + 30
        while True:
            try:
                client.publish(TOPIC, value, partition=0)
                break
            except Exception:  # noqa: BLE001 - leader change: retry (values are unique)
                assert time.monotonic() < deadline, "publish kept failing"
                time.sleep(0.2)


def test_a_follower_with_a_flipped_bit_reports_repairs_and_loses_nothing(tmp_path: Path) -> None:
    with LocalCluster(
        str(tmp_path / "cluster"), 3, extra_args=["--segment-bytes", str(SEGMENT_BYTES)]
    ) as cluster:
        cluster.wait_ready()
        acked = [b"record-%04d-" % i + b"y" * 40 for i in range(COUNT)]
        with Client(cluster.bootstrap) as client:
            client.create_topic(TOPIC, 1, 3)
            _publish_all(client, acked[: COUNT // 2])
            (row,) = client.describe_topic(TOPIC).partitions
            assert row.leader is not None
            follower = next(b for b in row.replicas if b != row.leader)
            directory = _partition_dir(cluster, follower)
            _wait_for(  # a follower may still be catching up: let it hold sealed segments
                lambda: len(list(directory.glob("*.log"))) >= 3, 30, "the follower's copy"
            )
            cluster.stop(follower)
            damaged = _flip_in_sealed_segment(directory)
            cluster.start(follower)
            cluster.wait_ready()
            log_file = Path(cluster.log_dir, f"broker-{follower}.log")
            _wait_for(
                lambda: "corruption: " in log_file.read_text(errors="replace"),
                60,
                "the corruption report",
            )
            # Writes go on during the repair (the other two replicas are a majority).
            _publish_all(client, acked[COUNT // 2 :])
            _wait_for(
                lambda: "repaired" in log_file.read_text(errors="replace"),
                60,
                "the re-replication",
            )
        text = log_file.read_text(errors="replace")
        assert damaged.name in text
        cluster.stop_all()
        for broker in range(3):
            assert _replica_values(_partition_dir(cluster, broker)) == acked, f"broker {broker}"
