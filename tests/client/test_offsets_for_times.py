"""``offsets_for_times`` (Kafka's ``offsetsForTimes``) and ``kafkaesque consume --from-time``.

The steps run against a scripted broker first (retries, errors); then the sync client, the trio
client and the CLI against real broker processes (the ``broker_cluster`` fixture), asking every
broker, so that the partitions led elsewhere are answered through the peer request.
"""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
import trio

from kafkaesque.client import (
    AsyncClient,
    Client,
    ClientConfig,
    ClusterState,
    KafkaesqueError,
    ListResponse,
    Producer,
    RetryPolicy,
    TopicPartition,
)
from kafkaesque.client import _steps as steps
from kafkaesque.local_cluster import LocalCluster
from kafkaesque.protocol import DescribeTopic, EndReply, ErrorCode, PartitionRow, TopicRow
from tests.cli.test_client_commands import ok, run
from tests.client.test_steps import drive

CONFIG = ClientConfig(retry=RetryPolicy(max_attempts=3, backoff_ms=10, backoff_max_ms=10))
T0, T1 = TopicPartition("t", 0), TopicPartition("t", 1)


def _reply(*offsets: int | None) -> ListResponse:
    rows = [PartitionRow("t", p, 0, (0,), 0, 100, o) for p, o in enumerate(offsets)]
    return ListResponse((TopicRow("t", len(rows), 1), *rows), EndReply())


def test_one_describe_per_topic_and_time_and_a_missing_answer_is_retried() -> None:
    state = ClusterState([("boot", 9)])
    asked: list[Any] = []
    replies = {500: iter([_reply(None, 7), _reply(4, 7)]), 900: iter([_reply(60, 70)])}

    def answer(request: steps.Request) -> Any:
        command = request.command
        if isinstance(command, DescribeTopic):
            asked.append(command)
            assert command.time_ms is not None
            return next(replies[command.time_ms])
        return ListResponse((), EndReply())  # the metadata refresh before the retry

    result, _ = drive(steps.offsets_for_times(state, CONFIG, {T0: 500, T1: 900}), answer)
    assert result == {T0: 4, T1: 70}
    assert asked == [DescribeTopic("t", 500), DescribeTopic("t", 500), DescribeTopic("t", 900)]


def test_a_partition_the_topic_lacks_and_a_negative_time_are_refused() -> None:
    state = ClusterState([("boot", 9)])
    with pytest.raises(KafkaesqueError) as info:
        drive(
            steps.offsets_for_times(state, CONFIG, {TopicPartition("t", 5): 1}),
            lambda request: _reply(3),
        )
    assert info.value.code is ErrorCode.UNKNOWN_PARTITION
    with pytest.raises(ValueError, match="negative"):
        drive(steps.offsets_for_times(state, CONFIG, {T0: -1}), lambda request: _reply(3))


# -- against real brokers -------------------------------------------------------------------------

# Per partition, the timestamps of the records sent, in order: not monotonic.
STAMPS = {0: [1_000, 3_000, 2_000, 5_000, 4_000, 4_500], 1: [100, 300, 200]}


@pytest.fixture(scope="module")
def sent(broker_cluster: LocalCluster) -> dict[int, list[tuple[int, int]]]:
    """Topic ``times`` (2 partitions, 3 replicas): partition → (offset, timestamp) sent."""
    out: dict[int, list[tuple[int, int]]] = {0: [], 1: []}
    with Client(broker_cluster.bootstrap) as client:
        client.create_topic("times", 2, 3)
        for partition, stamps in STAMPS.items():
            for i, ts in enumerate(stamps):
                # One batch per record, flushed each: the record order is the send order.
                with Producer(client) as producer:
                    future = producer.send(
                        "times", b"p%d-%d" % (partition, i), partition=partition, timestamp_ms=ts
                    )
                    producer.flush()
                out[partition].append((future.get().offset, ts))
    return out


def _want(sent: list[tuple[int, int]], ts: int, end: int) -> int:
    return next((offset for offset, stamp in sent if stamp >= ts), end)


PROBES = [0, 1_000, 1_001, 2_500, 3_001, 4_200, 5_000, 5_001, 10**13]


def test_every_broker_answers_as_the_leaders_do(
    broker_cluster: LocalCluster, sent: dict[int, list[tuple[int, int]]]
) -> None:
    for address in broker_cluster.bootstrap.split(","):
        with Client(address) as client:
            ends = {p.partition: p.end_offset for p in client.describe_topic("times").partitions}
            for ts in PROBES:
                got = client.offsets_for_times({("times", 0): ts, ("times", 1): ts})
                assert got == {
                    TopicPartition("times", p): _want(sent[p], ts, ends[p])  # type: ignore[arg-type]
                    for p in (0, 1)
                }, f"time {ts} through {address}"


def test_the_trio_client(
    broker_cluster: LocalCluster, sent: dict[int, list[tuple[int, int]]]
) -> None:
    async def main() -> dict[TopicPartition, int]:
        async with AsyncClient(broker_cluster.bootstrap) as client:
            return await client.offsets_for_times({("times", 0): 2_500, ("times", 1): 150})

    got = trio.run(main)
    assert got == {
        TopicPartition("times", 0): sent[0][1][0],
        TopicPartition("times", 1): sent[1][1][0],
    }


def test_consume_from_time(
    broker_cluster: LocalCluster, sent: dict[int, list[tuple[int, int]]]
) -> None:
    # 2,500 ms: the record stamped 3,000 and every one after it, whatever their stamps.
    out = ok(broker_cluster, "consume", "times", "-e", "--partition", "0", "--from-time", "2500")
    assert out.split() == ["p0-1", "p0-2", "p0-3", "p0-4", "p0-5"]
    iso = ok(
        broker_cluster,
        "consume",
        "times",
        "-e",
        "--partition",
        "0",
        "--from-time",
        "1970-01-01T00:00:04.200Z",
    )
    assert iso.split() == ["p0-3", "p0-4", "p0-5"]
    naive = ok(
        broker_cluster, "consume", "times", "-e", "--long", "--from-time", "1970-01-01T00:00:00.150"
    )  # no zone: UTC; every partition
    assert sorted(naive.splitlines()) == sorted(
        [f"0 {o} - p0-{i}" for i, (o, _) in enumerate(sent[0])]
        + [f"1 {o} - p1-{i}" for i, (o, _) in enumerate(sent[1]) if i > 0]
    )
    later = ok(broker_cluster, "consume", "times", "-e", "--from-time", "6000")
    assert later == ""


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--from-time", "yesterday"), "neither milliseconds"),
        (("--from-time", "1969-12-31T23:59:59Z"), "before 1970"),
        (("--from-time", "5", "--group", "g"), "--from-time cannot be used with --group"),
        (("--from-time", "5", "--offset", "3"), "not allowed with"),
    ],
)
def test_consume_from_time_refuses_what_it_cannot_do(
    broker_cluster: LocalCluster, args: tuple[str, ...], says: str
) -> None:
    result: subprocess.CompletedProcess[bytes] = run(broker_cluster, "consume", "times", *args)
    assert result.returncode != 0
    assert says in result.stderr.decode()
