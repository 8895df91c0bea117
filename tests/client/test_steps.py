"""The sans-I/O operations of ``_steps``, run against a scripted broker (no sockets, no sleeps)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kafkaesque.client import (
    ClientConfig,
    ClusterMetadata,
    ClusterState,
    ConsumerCore,
    ConsumerRecord,
    KafkaesqueConnectionError,
    KafkaesqueError,
    ListResponse,
    RetryPolicy,
    TopicPartition,
)
from kafkaesque.client import _calls as calls
from kafkaesque.client import _steps as steps
from kafkaesque.protocol import (
    GROUP_OFFSETS_TOPIC,
    BrokerRow,
    Command,
    DataReply,
    DescribeTopic,
    EndReply,
    ErrorCode,
    ErrorReply,
    Fetch,
    MessageRow,
    Metadata,
    OkReply,
    PartitionRow,
    Ping,
    TopicRow,
    partition_for_key,
)
from kafkaesque.storage import Record, build_batch

CONFIG = ClientConfig(retry=RetryPolicy(max_attempts=3, backoff_ms=10, backoff_max_ms=10))
Answer = Callable[[steps.Request], Any]


def drive(operation: steps.Steps[Any], answer: Answer) -> tuple[Any, list[Any]]:
    """Run ``operation``; ``answer`` plays the broker. Returns the result and the steps seen."""
    seen: list[Any] = []
    outcome: Any = None
    failure: KafkaesqueError | None = None
    while True:
        try:
            step = operation.send(outcome) if failure is None else operation.throw(failure)
        except StopIteration as stop:
            return stop.value, seen
        seen.append(step)
        outcome, failure = None, None
        if isinstance(step, steps.Request):
            result = answer(step)
            if isinstance(result, KafkaesqueError):
                failure = result
            else:
                outcome = result
        elif isinstance(step, steps.Pipeline):
            outcome = [answer(r) for r in step.requests]


def metadata_reply(leader: int) -> ListResponse:
    rows = (BrokerRow(0, "h0", 1), BrokerRow(1, "h1", 2), PartitionRow("t", 0, leader, (0, 1)))
    return ListResponse(rows, EndReply())


def test_a_stale_leader_is_retried_on_the_new_one_after_a_refresh() -> None:
    state = ClusterState([("boot", 9)])
    state.update_metadata(ClusterMetadata.from_response(metadata_reply(0)))
    replies = iter([ErrorReply(ErrorCode.NOT_LEADER, "moved"), metadata_reply(1), OkReply("PONG")])

    def answer(request: steps.Request) -> Any:
        return next(replies)

    call = calls.Call(Ping(), calls._pong, TopicPartition("t", 0))
    result, seen = drive(steps.run_call(state, CONFIG, call), answer)
    assert result == "PONG"
    requests = [s for s in seen if isinstance(s, steps.Request)]
    assert [type(r.command) for r in requests] == [Ping, Metadata, Ping]
    assert requests[0].address == ("h0", 1) and requests[2].address == ("h1", 2)
    assert steps.Sleep(0.01) in seen


def test_a_write_whose_outcome_is_unknown_is_not_retried() -> None:
    state = ClusterState([("boot", 9)])
    lost = KafkaesqueConnectionError("lost", sent=True)
    call = calls.delete_topic("t")
    try:
        drive(steps.run_call(state, CONFIG, call), lambda r: lost)
    except KafkaesqueError as error:
        assert error is lost
    else:
        raise AssertionError("expected the error")


def test_retries_run_out() -> None:
    state = ClusterState([("boot", 9)])
    busy = ErrorReply(ErrorCode.BUSY, "later")
    seen: list[Command] = []

    def answer(request: steps.Request) -> Any:
        seen.append(request.command)
        return busy

    try:
        drive(steps.run_call(state, CONFIG, calls.list_topics()), answer)
    except KafkaesqueError as error:
        assert error.code is ErrorCode.BUSY
    assert len(seen) == 3


def test_poll_resets_then_long_polls_until_records_come() -> None:
    state = ClusterState([("boot", 9)])
    core = ConsumerCore()
    core.assign([TopicPartition("t", 0)])
    clock = iter(range(100)).__next__
    batch = build_batch([Record(b"hello")], base_offset=7)
    fetches: list[Fetch] = []

    def answer(request: steps.Request) -> Any:
        if isinstance(request.command, DescribeTopic):
            rows = (TopicRow("t", 1, 1), PartitionRow("t", 0, 0, (0,), 7, 7))
            return ListResponse(rows, EndReply())
        assert isinstance(request.command, Fetch)
        fetches.append(request.command)
        return DataReply(7, b"") if len(fetches) == 1 else DataReply(8, batch)

    records, _ = drive(
        steps.poll(state, CONFIG, core, timeout_s=10, max_records=None, clock=clock),
        answer,
    )
    assert [r.value for r in records] == [b"hello"]
    assert next(f.wait_ms for f in fetches) == 0 and (fetches[1].wait_ms or 0) > 0
    assert core.positions[TopicPartition("t", 0)] == 8


def test_poll_holds_back_records_beyond_max() -> None:
    state = ClusterState([("boot", 9)])
    core = ConsumerCore()
    tp = TopicPartition("t", 0)
    core.assign([tp])
    core.seek(tp, 0)
    batch = build_batch([Record(b"%d" % i) for i in range(5)])
    records, _ = drive(
        steps.poll(state, CONFIG, core, timeout_s=1, max_records=2, clock=lambda: 0.0),
        lambda r: DataReply(5, batch),
    )
    assert [r.offset for r in records] == [0, 1] and core.positions[tp] == 2


def test_group_poll_resubscribes_once_and_commits_what_moved() -> None:
    state = ClusterState([("boot", 9)])
    cursor = steps.GroupCursor("t", "g", start=0)
    subs = iter(["sub-1", "sub-2"])
    cons_calls: list[Any] = []

    def answer(request: steps.Request) -> Any:
        name = type(request.command).__name__
        if name == "Metadata":  # no group joined yet: no offsets topic, any broker will do
            return ErrorReply(ErrorCode.UNKNOWN_TOPIC, f"no topic {GROUP_OFFSETS_TOPIC}")
        if name == "Subs":
            return OkReply(next(subs))
        if name == "Cons":
            cons_calls.append(request.command)
            if len(cons_calls) == 1:
                return ErrorReply(ErrorCode.UNKNOWN_SUBSCRIPTION, "expired")
            rows = (MessageRow(0, 3, b"k", b"a"), MessageRow(1, 0, None, b"b"))
            return ListResponse(rows, EndReply(((0, 4), (1, 1))))
        assert name == "Commit"
        return OkReply()

    records, _ = drive(
        steps.group_poll(state, CONFIG, cursor, wait_ms=10, max_records=None), answer
    )
    assert [(r.partition, r.offset, r.key, r.value) for r in records] == [
        (0, 3, b"k", b"a"),
        (1, 0, None, b"b"),
    ]
    assert [c.subscription_id for c in cons_calls] == ["sub-1", "sub-2"]
    cursor.unprocessed([ConsumerRecord("t", 1, 0, None, b"b")])
    assert cursor.cons_offsets() == ((0, 4), (1, 0))
    moved, _ = drive(steps.group_commit(state, CONFIG, cursor), answer)
    assert moved == 2
    again, _ = drive(steps.group_commit(state, CONFIG, cursor), answer)
    assert again == 0


def test_a_group_subscribes_and_reads_at_its_coordinator() -> None:
    """Kafka's FindCoordinator: the leader of the group's partition of the offsets topic, so
    that no broker forwards each CONS to it."""
    state = ClusterState([("boot", 9)])
    cursor = steps.GroupCursor("t", "g", start=0)
    mine = partition_for_key(b"g", 8)
    rows: tuple[BrokerRow | PartitionRow, ...] = (
        BrokerRow(0, "h0", 1),
        BrokerRow(1, "h1", 2),
        *(PartitionRow(GROUP_OFFSETS_TOPIC, p, int(p == mine), (0, 1)) for p in range(8)),
    )
    seen: list[tuple[str, Any]] = []

    def answer(request: steps.Request) -> Any:
        name = type(request.command).__name__
        seen.append((name, request.address))
        if name == "Metadata":
            return ListResponse(rows, EndReply())
        if name == "Subs":
            return OkReply(f"{mine}.0123456789abcdef")
        assert name == "Cons"
        return ListResponse((MessageRow(0, 0, None, b"a"),), EndReply(((0, 1),)))

    records, _ = drive(
        steps.group_poll(state, CONFIG, cursor, wait_ms=10, max_records=None), answer
    )
    assert [r.value for r in records] == [b"a"]
    assert seen == [("Metadata", ("boot", 9)), ("Subs", ("h1", 2)), ("Cons", ("h1", 2))]


def test_a_refresh_asks_the_next_broker_when_the_first_connection_fails() -> None:
    # Broker 0 stopped (or restarted and closed the pooled connection): the refresh asks
    # broker 1 at once instead of leaving the caller with the metadata it had (issue 26).
    state = ClusterState([("boot", 9)])
    state.update_metadata(ClusterMetadata.from_response(metadata_reply(0)))
    asked: list[Any] = []

    def answer(request: steps.Request) -> Any:
        asked.append(request.address)
        if request.address == ("h0", 1):
            return KafkaesqueConnectionError("h0:1: the broker closed the connection", sent=True)
        return metadata_reply(1)

    result, _ = drive(steps.refresh_metadata(state, CONFIG), answer)
    assert asked == [("h0", 1), ("h1", 2)]
    assert result is not None and state.metadata.leader("t", 0) == BrokerRow(1, "h1", 2)
    assert state.candidates()[-1] == ("h0", 1)  # tried last from now on

    # A broker that is stopping (or starting) answers NOT_READY: the next one is asked.
    asked.clear()

    def stopping(request: steps.Request) -> Any:
        asked.append(request.address)
        if request.address == ("h1", 2):
            return ErrorReply(ErrorCode.NOT_READY, "the broker is shutting down")
        return metadata_reply(0)

    state.update_metadata(ClusterMetadata.from_response(metadata_reply(1)))
    result, _ = drive(steps.refresh_metadata(state, CONFIG), stopping)
    assert asked[0] == ("h1", 2) and len(asked) == 2
    assert result is not None and state.metadata.leader("t", 0) == BrokerRow(0, "h0", 1)

    # A broker that answers another error ends the refresh; so does a second failure.
    asked.clear()
    refused = drive(
        steps.refresh_metadata(state, CONFIG), lambda r: ErrorReply(ErrorCode.BUSY, "later")
    )
    assert refused[0] is None
    asked.clear()

    def unreachable(request: steps.Request) -> Any:
        asked.append(request.address)
        return KafkaesqueConnectionError("refused", sent=False)

    assert drive(steps.refresh_metadata(state, CONFIG), unreachable)[0] is None
    assert len(asked) == 2
