"""kill -9 of a partition's leader during a stream of acknowledged publishes loses nothing.

Clients publish through the two brokers that survive (writes are forwarded to the leader), in
pipelined windows, and record what was acknowledged; the leader's broker is killed partway. Every
acknowledged record must then be read back at its acknowledged offset. Retries inside the broker
may append a record twice (at-least-once until idempotent producers); a duplicate never takes an
acknowledged record's offset.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from kafkaesque.cli.cluster import LocalCluster

from kafkaesque.protocol import ErrorReply, MessageRow, OkReply, PartitionRow

from .line_client import LineClient

WINDOW = 50
SECONDS = 6.0


def _leader(cluster: LocalCluster, via: int, topic: str) -> int | None:
    with LineClient(cluster.client_address(via)) as c:
        rows = c.rows(f"METADATA {topic}")
    return next(r.leader for r in rows if isinstance(r, PartitionRow))


def test_kill_leader_during_acknowledged_publishes(tmp_path: Path) -> None:
    with LocalCluster(str(tmp_path), 3) as cluster:
        with LineClient(cluster.client_address(0)) as c:
            c.ok("CREATE stream 1 3")
        victim = _leader(cluster, 0, "stream")
        assert victim is not None
        survivors = [b for b in range(3) if b != victim]
        acked: dict[bytes, int] = {}
        errors: list[str] = []
        stop = time.monotonic() + SECONDS

        def produce(broker: int) -> None:
            with LineClient(cluster.client_address(broker), timeout=30) as c:
                n = 0
                while time.monotonic() < stop:
                    values = [b"b%d-%d" % (broker, n + i) for i in range(WINDOW)]
                    c.send(b"".join(b"PUB stream partition=0 " + v + b"\r\n" for v in values))
                    for value in values:
                        reply = c.answer()
                        if isinstance(reply, OkReply):
                            acked[value] = int(reply.text.split()[1])
                        elif isinstance(reply, ErrorReply):
                            errors.append(f"{reply.code.name} {reply.message}")
                    n += WINDOW

        threads = [threading.Thread(target=produce, args=(b,)) for b in survivors]
        for t in threads:
            t.start()
        time.sleep(SECONDS / 3)
        cluster.kill(victim)
        for t in threads:
            t.join(SECONDS + 60)
        assert not any(t.is_alive() for t in threads)

        stored: dict[int, bytes] = {}
        with LineClient(cluster.client_address(survivors[0])) as c:
            offset = 0
            while True:
                rows = c.rows(f"FETCH stream 0 {offset} format=text")
                got = [r for r in rows if isinstance(r, MessageRow)]
                if not got:
                    break
                stored.update((m.offset, m.value or b"") for m in got)
                offset = got[-1].offset + 1

    assert len(acked) > 100, f"too few acknowledged writes: {len(acked)}; errors {errors[:3]}"
    lost = {v: o for v, o in acked.items() if stored.get(o) != v}
    assert not lost, f"{len(lost)} acknowledged writes lost, e.g. {list(lost.items())[:3]}"
    # A client saw the failover only as latency: errors, if any, are retriable timeouts.
    assert all(e.startswith(("TIMEOUT", "NO_QUORUM")) for e in errors), errors[:3]


def test_a_partition_without_quorum_answers_a_clear_retriable_error(tmp_path: Path) -> None:
    with LocalCluster(str(tmp_path), 3, extra_args=["--write-timeout", "2"]) as cluster:
        with LineClient(cluster.client_address(0)) as c:
            c.ok("CREATE lonely 1 3")
            c.ok("PUBS lonely before")
        cluster.kill(1)
        cluster.kill(2)
        with LineClient(cluster.client_address(0)) as c:
            started = time.monotonic()
            reply = c.call("PUBS lonely after")
            waited = time.monotonic() - started
            assert c.ok("PING") == "PONG"
    assert isinstance(reply, ErrorReply), reply
    assert reply.code.name in ("NO_QUORUM", "TIMEOUT") and reply.code.retriable
    assert 1.5 < waited < 10, waited  # it waited for a leader, then gave up at its timeout
