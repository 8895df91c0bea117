"""What an operator alerts on, scraped from ``/metrics`` of a real three-broker cluster: brokers
up and down as each broker sees them, under-replicated and offline partitions, a consumer
group's lag, and requests counted by their protocol word (unknown lines too)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from kafkaesque.local_cluster import LocalCluster
from kafkaesque.protocol import ErrorCode, ErrorReply

from .line_client import LineClient

Sample = tuple[str, dict[str, str], float]
_WAIT_S = 30.0


def pick(samples: list[Sample], name: str, **labels: str) -> list[float]:
    """The values of the samples named ``name`` whose labels include ``labels``."""
    return [v for n, ls, v in samples if n == name and labels.items() <= ls.items()]


def wait_for(
    cluster: LocalCluster, brokers: list[int], check: Callable[[dict[int, list[Sample]]], bool]
) -> dict[int, list[Sample]]:
    """Scrape ``brokers`` until ``check`` holds for their samples (AssertionError after
    ``_WAIT_S``, with the last scrape)."""
    deadline = time.monotonic() + _WAIT_S
    while True:
        scraped = {b: cluster.scrape(b) for b in brokers}
        if check(scraped):
            return scraped
        if time.monotonic() > deadline:
            raise AssertionError(f"not seen in {_WAIT_S:.0f} s; last scrape: {scraped}")
        time.sleep(0.2)


def test_an_operator_sees_brokers_partitions_lag_and_requests(tmp_path: Path) -> None:
    with LocalCluster(str(tmp_path), 3) as cluster:
        cluster.wait_ready()
        with LineClient(cluster.client_address(0)) as client:
            client.ok("CREATE ops 2 3")
            for i in range(5):
                client.ok(f"PUB ops partition=0 m{i}")
            client.ok("PUBS ops hello")
            member = client.ok("SUBS ops readers").split()[0]
            client.rows(f"CONS ops {member} 0")
            client.ok("COMMIT readers ops 0 2")
            unknown = client.call("FROBNICATE secret-token")
            malformed = client.call("PUB")
        assert isinstance(unknown, ErrorReply) and unknown.code is ErrorCode.UNKNOWN_COMMAND
        assert isinstance(malformed, ErrorReply) and malformed.code is ErrorCode.BAD_ARGS
        everyone = [0, 1, 2]

        def all_up(scraped: dict[int, list[Sample]]) -> bool:
            return all(
                pick(s, "kafkaesque_broker_up", peer=str(p)) == [1.0]
                for s in scraped.values()
                for p in everyone
            )

        def lag_shown(scraped: dict[int, list[Sample]]) -> bool:
            lags = [
                v
                for s in scraped.values()
                for v in pick(s, "kafkaesque_consumer_group_lag", group="readers", topic="ops")
            ]
            return len(lags) == 1  # one coordinator, and it committed in one partition

        def healthy(scraped: dict[int, list[Sample]]) -> bool:
            return all(
                pick(s, "kafkaesque_under_replicated_partitions") == [0.0]
                and pick(s, "kafkaesque_offline_partitions") == [0.0]
                for s in scraped.values()
            )

        scraped = wait_for(cluster, everyone, lambda s: all_up(s) and lag_shown(s) and healthy(s))
        # The lag is the leader's high watermark minus the committed offset (2).
        ends = [
            v + 1
            for s in scraped.values()
            for v in pick(s, "kafkaesque_partition_commit_index", topic="ops", partition="0")
            if pick(s, "kafkaesque_partition_is_leader", topic="ops", partition="0") == [1.0]
        ]
        lags = [
            v
            for s in scraped.values()
            for v in pick(s, "kafkaesque_consumer_group_lag", group="readers", partition="0")
        ]
        assert len(ends) == 1 and ends[0] >= 6  # 5 records and the leader's no-op, at least
        assert lags == [ends[0] - 2]
        # Requests by the word the client typed; what was no command under a bounded label.
        mine = scraped[0]
        requests = {ls["command"]: v for n, ls, v in mine if n == "kafkaesque_requests_total"}
        assert requests["PUB"] == 5
        assert requests["CREATE"] == 1 and requests["PUBS"] == 1 and requests["SUBS"] == 1
        assert requests["UNKNOWN"] == 1 and requests["MALFORMED"] == 1
        assert "PublishRecord" not in requests and "Pubs" not in requests
        assert not any("secret" in ls.get("command", "") for _, ls, _ in mine)

        # One broker dies: the others see it down, and what they lead is under-replicated
        # (broker 2 held a replica of every partition), yet every partition has a leader.
        cluster.kill(2)

        def two_down(scraped: dict[int, list[Sample]]) -> bool:
            return (
                all(
                    pick(s, "kafkaesque_broker_up", peer="2") == [0.0]
                    and pick(s, "kafkaesque_broker_up", peer="0") == [1.0]
                    and pick(s, "kafkaesque_broker_up", peer="1") == [1.0]
                    for s in scraped.values()
                )
                and sum(
                    v
                    for s in scraped.values()
                    for v in pick(s, "kafkaesque_under_replicated_partitions")
                )
                == 10
            )  # 2 of ops, 8 of the consumer offsets: each led by 0 or 1 now

        scraped = wait_for(cluster, [0, 1], two_down)
        wait_for(
            cluster,
            [0, 1],
            lambda s: all(pick(x, "kafkaesque_offline_partitions") == [0.0] for x in s.values()),
        )

        # A second one dies: no quorum is left anywhere, so no partition has a leader.
        cluster.kill(1)
        wait_for(cluster, [0], lambda s: pick(s[0], "kafkaesque_offline_partitions") == [10.0])
