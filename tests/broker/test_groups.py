"""Consumer groups: server-side assignment, fencing, durable offsets, failures of members and
of the coordinator's broker."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import msgpack

from kafkaesque.local_cluster import LocalCluster
from kafkaesque.protocol import (
    DataReply,
    ErrorCode,
    ErrorReply,
    GroupRow,
    MessageRow,
    OffsetRow,
    OkReply,
    PartitionRow,
    partition_for_key,
)
from kafkaesque.storage import BatchType, decode_records, iter_batches

from .line_client import LineClient


def owners(c: LineClient, group: str, topic: str) -> dict[int, str | None]:
    return {
        r.partition: r.owner for r in c.rows(f"GROUPS {group} {topic}") if isinstance(r, GroupRow)
    }


def owned_by(table: dict[int, str | None], member: str) -> set[int]:
    return {p for p, m in table.items() if m == member}


def test_members_share_partitions_and_a_moved_partition_is_fenced(
    broker_cluster: LocalCluster,
) -> None:
    with LineClient(broker_cluster.client_address(0)) as admin:
        admin.ok("CREATE shared6 6 3")
        for i in range(30):
            admin.ok(f"PUBS shared6 m{i}")
        a = LineClient(broker_cluster.client_address(1))
        b = LineClient(broker_cluster.client_address(2))
        ida, idb = a.ok("SUBS shared6 crew"), b.ok("SUBS shared6 crew")
        table = owners(admin, "crew", "shared6")
        assert len(owned_by(table, ida)) == 3 and len(owned_by(table, idb)) == 3
        got_a = [r for r in a.rows(f"CONS shared6 {ida} 0") if isinstance(r, MessageRow)]
        assert {m.partition for m in got_a} == owned_by(table, ida)

        c = LineClient(broker_cluster.client_address(0))
        idc = c.ok("SUBS shared6 crew")
        after = owners(admin, "crew", "shared6")
        assert sorted(len(owned_by(after, m)) for m in (ida, idb, idc)) == [2, 2, 2]
        assert owned_by(after, ida) <= owned_by(table, ida)  # sticky: a only gave some up
        moved = owned_by(table, ida) - owned_by(after, ida)
        assert moved and moved <= owned_by(after, idc)
        p = moved.pop()
        fenced = a.call(f"CONS shared6 {ida} {p}:0")
        assert isinstance(fenced, ErrorReply) and fenced.code is ErrorCode.NOT_ASSIGNED
        stale = a.call(f"COMMIT crew shared6 {p} 5 member={ida}")
        assert isinstance(stale, ErrorReply) and stale.code is ErrorCode.NOT_ASSIGNED
        # A partition the topic does not have is not "moved by a rebalance": it does not exist.
        nowhere = a.call(f"CONS shared6 {ida} 7:0")
        assert isinstance(nowhere, ErrorReply) and nowhere.code is ErrorCode.UNKNOWN_PARTITION
        assert "no partition 7" in nowhere.message
        kept = sorted(owned_by(after, ida))
        assert a.ok(f"COMMIT crew shared6 {kept[0]} 3 member={ida}") == ""
        backwards = a.call(f"COMMIT crew shared6 {kept[0]} 2 member={ida}")
        assert isinstance(backwards, ErrorReply)
        assert backwards.code is ErrorCode.OFFSET_OUT_OF_RANGE

        c.close()  # its connection closing is its leaving
        deadline = time.monotonic() + 10
        while idc in owners(admin, "crew", "shared6").values() and time.monotonic() < deadline:
            time.sleep(0.05)
        final = owners(admin, "crew", "shared6")
        assert idc not in final.values() and set(final.values()) == {ida, idb}
        a.ok(f"LEAVE {ida}")
        assert set(owners(admin, "crew", "shared6").values()) == {idb}
        gone = a.call(f"CONS shared6 {ida} 0")
        assert isinstance(gone, ErrorReply) and gone.code is ErrorCode.UNKNOWN_SUBSCRIPTION
        a.close()
        b.close()


SECONDS = 16.0


def test_kill_a_consumer_then_the_coordinators_broker(tmp_path: Path) -> None:
    """3 consumer processes share 6 partitions; kill -9 one, then the coordinator's broker."""
    args = ["--session-timeout", "3"]
    with LocalCluster(str(tmp_path), 3, extra_args=args) as cluster:
        with LineClient(cluster.client_address(0)) as admin:
            admin.ok("CREATE work 6 3")
            admin.rows("OFFSETS team work")  # creates the offsets topic
        coordinator_partition = partition_for_key(b"team", 8)
        produced: dict[tuple[int, int], str] = {}
        stop_producing = time.monotonic() + SECONDS - 6

        def produce() -> None:
            i, via = 0, 0
            c = LineClient(cluster.client_address(via), timeout=15)
            while time.monotonic() < stop_producing:
                try:
                    reply = c.call(f"PUBS work v{i}")
                except OSError:
                    c.close()
                    via += 1
                    c = LineClient(cluster.client_address(via % 3), timeout=15)
                    continue
                if isinstance(reply, OkReply):
                    p, o = map(int, reply.text.split())
                    produced[(p, o)] = f"v{i}"
                i += 1
                time.sleep(0.002)
            c.close()

        producer = threading.Thread(target=produce)
        producer.start()
        brokers = cluster.bootstrap
        histories = [tmp_path / f"consumer-{i}.jsonl" for i in range(3)]
        peers = brokers.split(",")
        consumers = [
            subprocess.Popen(
                [
                    *(sys.executable, "-m", "tests.broker.group_consumer", "--topic", "work"),
                    *("--group", "team", "--history", str(histories[i])),
                    *("--seconds", str(SECONDS), "--brokers", ",".join(peers[i:] + peers[:i])),
                ],
                cwd=Path(__file__).parents[2],
            )
            for i in range(3)
        ]
        try:
            time.sleep(4)
            consumers[0].kill()  # kill -9 a consumer mid-stream
            time.sleep(3)
            with LineClient(cluster.client_address(0)) as c:
                rows = c.rows("METADATA __consumer_offsets")
            coordinator = next(
                r.leader
                for r in rows
                if isinstance(r, PartitionRow) and r.partition == coordinator_partition
            )
            assert coordinator is not None
            cluster.kill(coordinator)  # then the coordinator's broker
            survivor = next(b for b in range(3) if b != coordinator)
            for proc in consumers[1:]:
                proc.wait(SECONDS + 30)
        finally:
            for proc in consumers:
                proc.kill()
                proc.wait()
        producer.join(30)
        with LineClient(cluster.client_address(survivor)) as c:
            committed_rows = c.rows("OFFSETS team work")
            timeline = assignment_timeline(c, coordinator_partition, "team", "work")
    assert timeline is not None
    committed = {r.partition: r.offset for r in committed_rows if isinstance(r, OffsetRow)}

    processed: dict[tuple[int, int], str] = {}
    delivered: dict[tuple[int, int], tuple[float, float, str]] = {}
    for path in histories:
        if path.exists():
            for line in path.read_text().splitlines():
                h = json.loads(line)
                processed[(h["partition"], h["offset"])] = h["value"]
                delivered[(h["partition"], h["offset"])] = (h["sent"], h["t"], h["member"])
    # Enough to matter, not a speed: a busy machine (CI beside a jepsen run) managed 98.
    assert len(produced) > 50
    # Every committed message was processed, with its value: none skipped.
    for (p, o), value in produced.items():
        if committed.get(p) is not None and o < committed[p]:  # type: ignore[operator]
            assert processed.get((p, o)) == value, f"committed {p}:{o} never processed"
    assert any(committed.values()), "nothing was committed"
    # No partition ever had two owners. The assignment history is the coordinator's own log
    # (its records carry the time the old owners were fenced): every delivery must fall, for
    # some part of its CONS's round trip, in a span during which its member owned the partition.
    spans = _ownership_spans(timeline, "team", "work")
    for (p, o), (sent, received, member) in delivered.items():
        owned = [(start, end) for start, end, m in spans.get(p, []) if m == member]
        assert any(start <= received + 0.002 and sent - 0.002 <= end for start, end in owned), (
            f"{p}:{o} was delivered to {member} in [{sent}, {received}] while it owned none"
        )


def _ownership_spans(
    timeline: list[tuple[float, dict[str, list[int]]]], group: str, topic: str
) -> dict[int, list[tuple[float, float, str]]]:
    """partition -> [(from, to, owner)] from the assignment records, in log order."""
    spans: dict[int, list[tuple[float, float, str]]] = defaultdict(list)
    for i, (start, assignment) in enumerate(timeline):
        end = timeline[i + 1][0] if i + 1 < len(timeline) else float("inf")
        for member, partitions in assignment.items():
            for p in partitions:
                spans[p].append((start, end, member))
    return spans


def assignment_timeline(
    client: LineClient, partition: int, group: str, topic: str
) -> list[tuple[float, dict[str, list[int]]]] | None:
    """The group's assignment records in ``__consumer_offsets``: (time in s, assignment).

    None when a FETCH is refused (the partition has no leader now, after a restart say).
    """
    timeline = []
    offset = 0
    while True:
        reply = client.call(f"FETCH __consumer_offsets {partition} {offset}")
        if isinstance(reply, ErrorReply):
            return None
        assert isinstance(reply, DataReply)
        pos = 0
        for header in iter_batches(reply.payload):
            batch = reply.payload[pos : pos + header.size]
            pos += header.size
            if header.batch_type is not BatchType.DATA:
                continue
            for record in decode_records(batch, header):
                if record.offset >= offset and record.key is not None:
                    key = msgpack.unpackb(record.key)
                    if key == ["a", group, topic] and record.value is not None:
                        timeline.append((record.timestamp / 1000, msgpack.unpackb(record.value)))
        if reply.next_offset == offset:
            return timeline
        offset = reply.next_offset
