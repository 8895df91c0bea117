"""The task's fetch loop as a pure unit: a scripted client, a fake clock.

Real brokers cover failover and retention (test_failover, test_batch); this covers what they
cannot make happen on demand: a replica that stays behind until the deadline, and retriable
errors in a row before data comes.
"""

from __future__ import annotations

import pytest
from kafkaesque.spark_source import ReadStalledError
from kafkaesque.spark_source._offsets import OffsetRange
from kafkaesque.spark_source._read import ReadSettings, _RangeFetcher

from kafkaesque.client import (
    FetchedBatch,
    KafkaesqueConnectionError,
    KafkaesqueError,
    TopicPartition,
)
from kafkaesque.protocol import DataReply, ErrorCode
from kafkaesque.storage import Record, build_batch

TP = TopicPartition("t", 0)
SETTINGS = ReadSettings("h:1", True, False, True, 1 << 20, failover_timeout_ms=5_000)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class ScriptedClient:
    """Answers each FETCH with the next scripted reply (or raises it, if an error); the last
    reply repeats. Each call takes ``call_s`` seconds of ``clock``."""

    def __init__(
        self, replies: list[DataReply | KafkaesqueError], clock: FakeClock, call_s: float = 0.0
    ) -> None:
        self.replies = replies
        self.clock = clock
        self.call_s = call_s
        self.offsets: list[int] = []

    def refresh_metadata(self, topics: list[str]) -> None:
        del topics

    def fetch_batch(
        self, topic: str, partition: int, offset: int, *, max_bytes: int, wait_ms: int
    ) -> FetchedBatch:
        del max_bytes, wait_ms
        self.offsets.append(offset)
        self.clock.now += self.call_s
        reply = self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]
        if isinstance(reply, KafkaesqueError):
            raise reply
        return FetchedBatch(
            topic, partition, offset, reply.payload, reply.next_offset, reply.high_watermark
        )


def fetcher(client: ScriptedClient) -> _RangeFetcher:
    return _RangeFetcher(client, OffsetRange(TP, 1, 3), SETTINGS, client.clock, client.clock.sleep)


def test_retriable_errors_are_retried_until_data_comes() -> None:
    data = build_batch([Record(b"a"), Record(b"b")], base_offset=1)
    client = ScriptedClient(
        [
            KafkaesqueConnectionError("broker gone", sent=True),
            KafkaesqueError(ErrorCode.NOT_LEADER, "election"),
            DataReply(3, data, 3),
        ],
        FakeClock(),
    )
    assert list(fetcher(client).chunks()) == [(data, 1)]
    assert client.offsets == [1, 1, 1]


def test_a_range_that_makes_no_progress_fails_after_the_timeout() -> None:
    # a replica that never catches up: each empty fetch waits a little, then answers nothing
    client = ScriptedClient([DataReply(1, b"", 1)], FakeClock(), call_s=0.2)
    with pytest.raises(ReadStalledError, match=r"reading t/0 made no progress at offset 1"):
        list(fetcher(client).chunks())
    assert client.clock.now >= SETTINGS.failover_timeout_ms / 1000


def test_errors_retrying_cannot_cure_are_raised_at_once() -> None:
    client = ScriptedClient(
        [KafkaesqueError(ErrorCode.UNKNOWN_PARTITION, "no partition 0")], FakeClock()
    )
    with pytest.raises(KafkaesqueError, match="UNKNOWN_PARTITION"):
        list(fetcher(client).chunks())
    assert client.offsets == [1]
