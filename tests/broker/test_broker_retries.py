"""The broker's own retries never append a client's request twice (issue 23, point 1).

A client that sends each value once, in plain ``PUB`` lines with no producer id, and never
resends, publishes through a broker that forwards to the partition's leader; the leader is
killed with kill -9 while windows of writes are in flight, several times. A forward whose
answer was lost is retried by the broker, and the new leader may already hold the batch: the
batch's producer id and sequence (the broker's own, ``PartitionAppender``) make the retry a
duplicate the leader answers instead of appending. Every value must be in the log at most once,
whatever the client was told (``+OK``, or a ``TIMEOUT`` whose outcome it cannot know).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from kafkaesque.local_cluster import LocalCluster
from kafkaesque.protocol import ErrorReply, OkReply

from .line_client import LineClient
from .test_leader_failover import _leader, _read_back

WINDOW = 64
ROUND_S = 2.5


def _wait_for_leader(cluster: LocalCluster, via: int, topic: str, timeout: float = 30) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        leader = _leader(cluster, via, topic)
        if leader is not None:
            return leader
        time.sleep(0.1)
    raise AssertionError(f"{topic} has no leader after {timeout} s")


@pytest.mark.parametrize(
    "rounds",
    [pytest.param(6, id="6-kills"), pytest.param(30, id="30-kills", marks=pytest.mark.slow)],
)
def test_writes_in_flight_across_leader_kills_are_each_in_the_log_once(
    tmp_path: Path, rounds: int
) -> None:
    replies: Counter[str] = Counter()
    with LocalCluster(str(tmp_path), 3) as cluster:
        with LineClient(cluster.client_address(0)) as c:
            c.ok("CREATE once 1 3")
        for round_ in range(rounds):
            victim = _wait_for_leader(cluster, (round_ + 1) % 3, "once")
            via = next(b for b in range(3) if b != victim)
            stop = time.monotonic() + ROUND_S

            def produce(via: int = via, round_: int = round_, stop: float = stop) -> None:
                with LineClient(cluster.client_address(via), timeout=60) as c:
                    n = 0
                    while time.monotonic() < stop:
                        values = [b"r%d-%d" % (round_, n + i) for i in range(WINDOW)]
                        c.send(b"".join(b"PUB once partition=0 -- " + v + b"\r\n" for v in values))
                        for _ in values:
                            reply = c.answer()
                            if isinstance(reply, OkReply):
                                replies["ok"] += 1
                            elif isinstance(reply, ErrorReply):
                                replies[reply.code.name] += 1
                        n += WINDOW

            thread = threading.Thread(target=produce)
            thread.start()
            time.sleep(ROUND_S / 2)
            cluster.kill(victim)
            thread.join(ROUND_S + 90)
            assert not thread.is_alive()
            cluster.start(victim)
            cluster.wait_ready()
        stored = _read_back(cluster, via, "once", 0)

    assert replies["ok"] > 500, f"too few acknowledged writes: {replies}"
    copies = Counter(stored.values())
    twice = sorted(v for v, n in copies.items() if n > 1)
    assert not twice, f"{len(twice)} values in the log more than once, e.g. {twice[:5]}; {replies}"
