"""``ProducerCore``: accumulators, partitioner, in-flight bounds, reply mapping, retries."""

from __future__ import annotations

import pytest

from kafkaesque.client import (
    ClusterMetadata,
    DeliveryHandle,
    KafkaesqueConnectionError,
    KafkaesqueError,
    ListResponse,
    ProducerConfig,
    ProducerCore,
    RecordMetadata,
    RetryPolicy,
    SendRequest,
)
from kafkaesque.client._errors import leader_moved
from kafkaesque.protocol import (
    BrokerRow,
    DataReply,
    EndReply,
    ErrorCode,
    ErrorReply,
    OkReply,
    PartitionRow,
    partition_for_key,
)
from kafkaesque.storage import BatchType, Record, decode_header, decode_records

BROKERS = (BrokerRow(0, "h0", 1), BrokerRow(1, "h1", 2))


def cluster(partitions: int = 3, leaders: tuple[int | None, ...] = ()) -> ClusterMetadata:
    rows = [
        PartitionRow("t", p, leaders[p] if p < len(leaders) else p % 2, (0, 1))
        for p in range(partitions)
    ]
    return ClusterMetadata.from_response(ListResponse((*BROKERS, *rows), EndReply()))


def core(**settings: object) -> ProducerCore:
    defaults: dict[str, object] = {"linger_ms": 10.0, "batch_size": 1000}
    defaults.update(settings)
    producer = ProducerCore(ProducerConfig(**defaults))  # type: ignore[arg-type]
    producer.update_metadata(cluster())
    return producer


def rec(value: bytes = b"v" * 10, key: bytes | None = None) -> Record:
    return Record(value, key, timestamp=1000)


def test_a_batch_waits_for_linger_then_goes_to_its_leader() -> None:
    p = core()
    handles = [p.append("t", rec(), partition=1, now_ms=0) for _ in range(3)]
    assert p.ready(now_ms=9.9) == []
    assert p.next_wakeup_ms(now_ms=5) == 10.0
    (send,) = p.ready(now_ms=10)
    assert send.broker_id == 1 and send.command.partition == 1
    header = decode_header(send.command.batch)
    assert header.batch_type is BatchType.DATA and header.record_count == 3
    assert [r.value for r in decode_records(send.command.batch)] == [b"v" * 10] * 3
    assert not any(h.done() for h in handles)


def test_a_full_batch_goes_without_waiting() -> None:
    p = core(batch_size=104)  # each record counts 10 + 16 bytes
    for _ in range(4):
        p.append("t", rec(), partition=0, now_ms=0)
    (send,) = p.ready(now_ms=0)
    assert decode_header(send.command.batch).record_count == 4
    p.append("t", rec(), partition=0, now_ms=0)
    assert p.ready(now_ms=0) == []  # the next batch lingers (and partition 0 is busy)


def test_headers_count_towards_the_batch_size() -> None:
    # each record: 10 + 16 bytes, and its one header 4 + 4 + 2 more: three records, 108 bytes
    p = core(batch_size=108)
    headered = Record(b"v" * 10, None, headers=(("name", b"data"),), timestamp=1000)
    for _ in range(2):
        p.append("t", headered, partition=0, now_ms=0)
    assert p.ready(now_ms=0) == []  # 72 bytes: not full yet
    p.append("t", headered, partition=0, now_ms=0)
    (send,) = p.ready(now_ms=0)
    assert decode_header(send.command.batch).record_count == 3


def test_keys_pick_partitions_by_the_shared_hash_stably() -> None:
    p = core()
    keys = [b"k%d" % i for i in range(50)]
    first = [p.choose_partition("t", k, None) for k in keys]
    assert first == [partition_for_key(k, 3) for k in keys]
    assert first == [p.choose_partition("t", k, None) for k in keys]
    assert len(set(first)) == 3


def test_unkeyed_records_stick_to_a_partition_until_its_batch_closes() -> None:
    p = core(batch_size=60)  # two records fill a batch
    chosen = []
    for _ in range(6):
        p.append("t", rec(), now_ms=0)
        chosen.append(p.choose_partition("t", None, None))
    assert chosen == [0, 0, 1, 1, 2, 2]
    assert [s.command.partition for s in p.ready(now_ms=0)] == [0, 1]  # 2 is still open
    assert [s.command.partition for s in p.ready(now_ms=10)] == [2]


def test_round_robin_sends_each_unkeyed_record_to_the_next_partition() -> None:
    p = core(partitioner="round-robin")
    handles = [p.append("t", rec(), now_ms=0) for _ in range(7)]
    keyed = p.append("t", rec(key=b"k"), now_ms=0)  # a key still picks its own partition
    pinned = p.append("t", rec(), partition=2, now_ms=0)  # and so does an explicit partition
    sends = p.ready(now_ms=10)
    by_partition = {s.command.partition: decode_header(s.command.batch).record_count for s in sends}
    # 7 unkeyed: 0 1 2 0 1 2 0; then the keyed record and the pinned one join their partitions.
    expected = {0: 3, 1: 2, 2: 2}
    expected[partition_for_key(b"k", 3)] += 1
    expected[2] += 1
    assert by_partition == expected
    assert not any(h.done() for h in [*handles, keyed, pinned])
    # The turn carries on from where it was, for the next records of the topic.
    assert [p.choose_partition("t", None, None) for _ in range(3)] == [1, 2, 0]
    # A full batch is closed and a new one opened on the same partition: the turn moves once.
    small = core(partitioner="round-robin", batch_size=60)  # two records fill a batch
    for _ in range(7):
        small.append("t", rec(), now_ms=0)
    assert [s.command.partition for s in small.ready(now_ms=0)] == [0]  # 0 took a third record
    assert small.choose_partition("t", None, None) == 1


def test_round_robin_follows_a_changed_partition_count() -> None:
    p = core(partitioner="round-robin")
    assert [p.choose_partition("t", None, None) for _ in range(2)] == [0, 1]
    p.update_metadata(cluster(partitions=2))
    assert [p.choose_partition("t", None, None) for _ in range(3)] == [0, 1, 0]


def test_an_unknown_partitioner_is_refused() -> None:
    with pytest.raises(ValueError, match="round-robin, sticky, not random"):
        ProducerConfig(partitioner="random")  # type: ignore[arg-type]


def test_bad_partitions_and_topics_fail_at_once() -> None:
    p = core()
    with pytest.raises(KafkaesqueError) as info:
        p.append("t", rec(), partition=3, now_ms=0)
    assert info.value.code is ErrorCode.UNKNOWN_PARTITION
    with pytest.raises(KafkaesqueError) as info:
        p.append("nope", rec(), now_ms=0)
    assert info.value.code is ErrorCode.UNKNOWN_TOPIC and info.value.retriable
    with pytest.raises(KafkaesqueError) as info:
        core(max_request_bytes=200).append("t", rec(b"x" * 200), now_ms=0)
    assert info.value.code is ErrorCode.TOO_LARGE


def test_the_reply_gives_each_record_its_offset() -> None:
    p = core()
    handles = [p.append("t", rec(), partition=2, now_ms=0) for _ in range(3)]
    (send,) = p.ready(now_ms=10)
    p.on_response(send.batch_id, OkReply("2 40"), now_ms=11)
    assert [h.result() for h in handles] == [RecordMetadata("t", 2, 40 + i, 1000) for i in range(3)]
    assert p.pending == 0 and p.buffered_bytes == 0


def test_callbacks_run_once_the_outcome_is_known() -> None:
    p = core()
    seen: list[DeliveryHandle] = []
    handle = p.append("t", rec(), partition=0, now_ms=0)
    handle.add_done_callback(seen.append)
    with pytest.raises(RuntimeError):
        handle.result()
    (send,) = p.ready(now_ms=10)
    p.on_response(send.batch_id, OkReply("0 5"), now_ms=10)
    handle.add_done_callback(seen.append)
    assert seen == [handle, handle]


def send_all(p: ProducerCore, now: float) -> list[SendRequest]:
    return p.ready(now_ms=now)


def test_one_batch_in_flight_per_partition_and_max_in_flight_per_broker() -> None:
    p = core(batch_size=1, max_in_flight=2)  # every record is its own batch
    for partition in (0, 0, 2, 2):  # partitions 0 and 2 both lead on broker 0
        p.append("t", rec(), partition=partition, now_ms=0)
    first = send_all(p, 0)
    assert [s.command.partition for s in first] == [0, 2]
    assert send_all(p, 0) == []  # partitions busy, broker 0 full
    p.on_response(first[0].batch_id, OkReply("0 0"), now_ms=1)
    (second,) = send_all(p, 1)
    assert second.command.partition == 0


def test_not_leader_is_retried_after_a_backoff_with_fresh_metadata_and_same_bytes() -> None:
    p = core(retry=RetryPolicy(backoff_ms=100, backoff_max_ms=100))
    handle = p.append("t", rec(), partition=1, now_ms=0)
    (send,) = p.ready(now_ms=10)
    p.on_response(send.batch_id, ErrorReply(ErrorCode.NOT_LEADER, "moved"), now_ms=20)
    assert p.metadata_wanted and not handle.done()
    p.update_metadata(cluster(leaders=(0, 1, 0)))  # the refresh still names broker 1
    assert p.ready(now_ms=119) == [] and p.next_wakeup_ms(now_ms=20) == 120
    (retry,) = p.ready(now_ms=120)
    assert retry.broker_id == 1 and retry.command.batch == send.command.batch
    p.on_response(retry.batch_id, OkReply("1 7"), now_ms=130)
    assert handle.result().offset == 7


def test_a_retry_goes_at_once_to_a_new_leader_the_refresh_names() -> None:
    # KIP-951: the backoff spares the broker that refused; a new leader refused nothing.
    p = core(retry=RetryPolicy(backoff_ms=100, backoff_max_ms=100))
    handle = p.append("t", rec(), partition=1, now_ms=0)
    (send,) = p.ready(now_ms=10)
    p.on_response(send.batch_id, ErrorReply(ErrorCode.NOT_READY, "shutting down"), now_ms=20)
    assert p.metadata_wanted and p.ready(now_ms=21) == []
    p.update_metadata(cluster(leaders=(0, 0, 0)))
    (retry,) = p.ready(now_ms=21)
    assert retry.broker_id == 0 and retry.command.batch == send.command.batch
    p.on_response(retry.batch_id, OkReply("1 8"), now_ms=30)
    assert handle.result().offset == 8


def test_a_retry_is_not_overtaken_by_a_later_batch_of_its_partition() -> None:
    p = core(batch_size=1, retry=RetryPolicy(backoff_ms=5, backoff_max_ms=5))
    a = p.append("t", rec(b"a"), partition=0, now_ms=0)
    (first,) = p.ready(now_ms=0)
    b = p.append("t", rec(b"b"), partition=0, now_ms=0)
    p.on_error(first.batch_id, KafkaesqueConnectionError("refused", sent=False), now_ms=1)
    (again,) = p.ready(now_ms=6)
    assert again.command.batch == first.command.batch
    p.on_response(again.batch_id, OkReply("0 0"), now_ms=7)
    (then,) = p.ready(now_ms=7)
    p.on_response(then.batch_id, OkReply("0 1"), now_ms=8)
    assert (a.result().offset, b.result().offset) == (0, 1)


def test_non_retriable_errors_fail_every_record_of_the_batch() -> None:
    p = core()
    handles = [p.append("t", rec(), partition=0, now_ms=0) for _ in range(2)]
    (send,) = p.ready(now_ms=10)
    p.on_response(send.batch_id, ErrorReply(ErrorCode.INVALID_BATCH, "crc"), now_ms=11)
    for handle in handles:
        error = handle.exception()
        assert error is not None and error.code is ErrorCode.INVALID_BATCH
        assert not error.outcome_unknown
        with pytest.raises(KafkaesqueError):
            handle.result()
    assert p.pending == 0


def test_a_failure_after_an_unknown_outcome_says_maybe_not_failed() -> None:
    p = core(retry=RetryPolicy(max_attempts=2, backoff_ms=1, backoff_max_ms=1))
    handle = p.append("t", rec(), partition=0, now_ms=0)
    (send,) = p.ready(now_ms=10)
    p.on_response(send.batch_id, ErrorReply(ErrorCode.TIMEOUT, "slow"), now_ms=11)
    (retry,) = p.ready(now_ms=12)  # retried: duplicates are possible without idempotence
    p.on_response(retry.batch_id, ErrorReply(ErrorCode.NO_QUORUM, "no"), now_ms=13)
    error = handle.exception()
    assert error is not None and error.code is ErrorCode.NO_QUORUM and error.outcome_unknown


def test_unknown_outcomes_are_not_retried_when_duplicates_are_refused() -> None:
    p = core(retry_unknown_outcome=False)
    handle = p.append("t", rec(), partition=0, now_ms=0)
    (send,) = p.ready(now_ms=10)
    p.on_error(send.batch_id, KafkaesqueConnectionError("lost", sent=True), now_ms=11)
    error = handle.exception()
    assert error is not None and error.outcome_unknown


def test_the_delivery_timeout_bounds_retries() -> None:
    p = core(delivery_timeout_ms=100, retry=RetryPolicy(backoff_ms=30, backoff_max_ms=30))
    handle = p.append("t", rec(), partition=0, now_ms=0)
    (send,) = p.ready(now_ms=10)
    p.on_response(send.batch_id, ErrorReply(ErrorCode.BUSY, ""), now_ms=80)  # 80 + 30 > 100
    error = handle.exception()
    assert error is not None and error.code is ErrorCode.BUSY


def test_a_batch_waiting_too_long_expires() -> None:
    p = core(delivery_timeout_ms=50, linger_ms=0, max_in_flight=1, batch_size=1)
    blocked = [p.append("t", rec(), partition=0, now_ms=0) for _ in range(2)]
    (first,) = p.ready(now_ms=0)
    p.ready(now_ms=60)  # the second batch waited 60 ms behind the first
    error = blocked[1].exception()
    assert error is not None and error.code is ErrorCode.TIMEOUT and not error.outcome_unknown
    p.on_response(first.batch_id, OkReply("0 0"), now_ms=61)
    assert blocked[0].result().offset == 0 and p.pending == 0


def test_a_reply_of_the_wrong_shape_fails_the_batch_as_a_violation() -> None:
    p = core()
    handle = p.append("t", rec(), partition=0, now_ms=0)
    (send,) = p.ready(now_ms=10)
    p.on_response(send.batch_id, DataReply(0, b""), now_ms=11)
    error = handle.exception()
    assert isinstance(error, KafkaesqueConnectionError) and not error.retriable


def test_fail_all_settles_everything_and_ignores_late_replies() -> None:
    p = core()
    sent = p.append("t", rec(), partition=0, now_ms=0)
    (send,) = p.ready(now_ms=10)
    waiting = p.append("t", rec(), partition=0, now_ms=10)
    p.fail_all(KafkaesqueConnectionError("closed", sent=True))
    assert sent.exception() is not None and waiting.exception() is not None
    assert sent.exception().outcome_unknown  # type: ignore[union-attr]
    p.on_response(send.batch_id, OkReply("0 0"), now_ms=11)  # ignored
    assert p.pending == 0 and p.buffered_bytes == 0


def test_a_partition_without_leader_goes_to_any_broker_and_asks_for_metadata() -> None:
    p = core()
    p.update_metadata(cluster(leaders=(None, 1, 1)))
    p.append("t", rec(), partition=0, now_ms=0)
    (send,) = p.ready(now_ms=10)
    assert send.broker_id is None and p.metadata_wanted


def test_a_lingering_batch_of_a_busy_partition_keeps_filling_until_it_can_go() -> None:
    p = core(linger_ms=1.0)
    p.append("t", rec(), partition=0, now_ms=0)
    (first,) = p.ready(now_ms=1)
    waiting = [p.append("t", rec(), partition=0, now_ms=2 + i) for i in range(3)]
    assert p.ready(now_ms=10) == []  # lingered, but partition 0 is busy: the batch stays open
    # Only the reply can move it: no busy wake-ups, just the leader check of the batch in flight.
    assert p.next_wakeup_ms(now_ms=10) == 1 + p.config.leader_check_ms
    waiting.append(p.append("t", rec(), partition=0, now_ms=11))  # it still takes records
    p.on_response(first.batch_id, OkReply("0 0"), now_ms=12)
    (second,) = p.ready(now_ms=12)  # freed: the grown batch goes at once, as one batch
    assert decode_header(second.command.batch).record_count == 4
    p.on_response(second.batch_id, OkReply("0 1"), now_ms=13)
    assert [h.result().offset for h in waiting] == [1, 2, 3, 4]


def test_unkeyed_records_leave_a_partition_whose_lingering_batch_must_wait() -> None:
    p = core(linger_ms=1.0)
    p.append("t", rec(), now_ms=0)
    (first,) = p.ready(now_ms=1)  # partition 0 in flight; the sticky partition moved to 1
    assert first.command.partition == 0
    p.append("t", rec(), now_ms=1)
    (second,) = p.ready(now_ms=2)
    assert second.command.partition == 1


def test_the_counters_follow_delivered_and_failed_records() -> None:
    p = core()
    for partition in (0, 1, 1):
        p.append("t", rec(), partition=partition, now_ms=0)
    sends = {s.command.partition: s for s in p.ready(now_ms=10)}
    p.on_response(sends[1].batch_id, OkReply("1 0"), now_ms=11)
    p.on_response(sends[0].batch_id, ErrorReply(ErrorCode.INVALID_BATCH, "crc"), now_ms=11)
    assert (p.delivered, p.failed, p.pending) == (2, 1, 0)


def test_a_reply_naming_another_partition_fails_the_batch_as_a_violation() -> None:
    p = core()
    handle = p.append("t", rec(), partition=0, now_ms=0)
    (send,) = p.ready(now_ms=10)
    p.on_response(send.batch_id, OkReply("1 5"), now_ms=11)
    error = handle.exception()
    assert isinstance(error, KafkaesqueConnectionError) and not error.retriable


def test_records_keep_their_own_timestamps_in_the_metadata() -> None:
    p = core()
    handles = [
        p.append("t", Record(b"v", timestamp=ts), partition=0, now_ms=0) for ts in (50, 20, 70)
    ]
    (send,) = p.ready(now_ms=10)
    assert [r.timestamp for r in decode_records(send.command.batch)] == [50, 20, 70]
    p.on_response(send.batch_id, OkReply("0 9"), now_ms=11)
    assert [h.result() for h in handles] == [
        RecordMetadata("t", 0, 9 + i, ts) for i, ts in enumerate((50, 20, 70))
    ]


def test_unordered_batches_of_a_partition_go_together_up_to_the_broker_bound() -> None:
    p = core(batch_size=1, max_in_flight=3, ordered=False, idempotent=False, leader_check_ms=4e4)
    for _ in range(5):
        p.append("t", rec(), partition=0, now_ms=0)
    sends = p.ready(now_ms=0)
    assert [s.command.partition for s in sends] == [0, 0, 0]
    # Broker 0 is full: only a reply frees it, so the next wake-up is the delivery deadline
    # (the leader check, later, is not due before it).
    assert p.next_wakeup_ms(now_ms=1) == 30_000.0
    p.on_response(sends[0].batch_id, OkReply("0 0"), now_ms=2)
    assert len(p.ready(now_ms=2)) == 1


def test_batches_carry_the_producer_id_and_consecutive_sequences_per_partition() -> None:
    p = core(batch_size=1)
    sends = []
    for value in (b"a", b"b", b"c"):
        p.append("t", rec(value), partition=0, now_ms=0)
        (send,) = p.ready(now_ms=0)
        sends.append(send)
        p.on_response(send.batch_id, OkReply(f"0 {len(sends)}"), now_ms=0)
    headers = [decode_header(s.command.batch) for s in sends]
    assert len({h.producer_id for h in headers}) == 1 and headers[0].producer_id >= 0
    assert [(h.producer_epoch, h.base_sequence) for h in headers] == [(0, 0), (0, 1), (0, 2)]


def test_a_batch_that_fails_for_good_makes_the_producer_start_over() -> None:
    p = core(batch_size=1)
    p.append("t", rec(), partition=0, now_ms=0)
    (send,) = p.ready(now_ms=0)
    p.on_response(send.batch_id, ErrorReply(ErrorCode.INVALID_BATCH, "no"), now_ms=1)
    p.append("t", rec(), partition=0, now_ms=2)
    (after,) = p.ready(now_ms=2)
    old, new = decode_header(send.command.batch), decode_header(after.command.batch)
    assert new.producer_id != old.producer_id and new.base_sequence == 0


def test_idempotence_needs_ordered_batches() -> None:
    with pytest.raises(ValueError, match="one batch in flight"):
        ProducerConfig(ordered=False)
    assert not ProducerConfig(ordered=False, idempotent=False).idempotent


# -- a silent leader (a paused broker answers nothing, its partitions elect another leader) ---


def asks_metadata(p: ProducerCore) -> bool:
    """``metadata_wanted`` read through a call (mypy would narrow the property between asserts)."""
    return p.metadata_wanted


def test_a_batch_left_unanswered_by_a_replaced_leader_ends_unknown_and_goes_to_the_new_one() -> (
    None
):
    p = core(retry=RetryPolicy(backoff_ms=100, backoff_max_ms=100))
    handle = p.append("t", rec(), partition=1, now_ms=0)
    (send,) = p.ready(now_ms=10)
    assert send.broker_id == 1 and p.next_wakeup_ms(now_ms=11) == 1010
    assert p.check_leaders(now_ms=1009) == frozenset() and not asks_metadata(p)
    assert p.check_leaders(now_ms=1010) == {1} and asks_metadata(p)  # silent a whole check
    p.update_metadata(cluster(leaders=(0, 0, 0)))  # read from broker 0: partition 1 moved
    assert p.replaced_leaders(now_ms=1010) == {1}
    assert p.replaced_leaders(now_ms=1500) == frozenset()  # given up on once
    # Until the driver reports the end of the attempt, the batch is not sent again.
    assert p.ready(now_ms=1500) == [] and not handle.done()
    p.on_error(send.batch_id, leader_moved("h1:2", 1000), now_ms=1501)
    assert not handle.done() and asks_metadata(p)  # retried like a lost connection
    assert p.ready(now_ms=1600) == []  # the backoff
    (retry,) = p.ready(now_ms=1601)
    assert retry.broker_id == 0 and retry.command.batch == send.command.batch  # same sequence
    p.on_response(retry.batch_id, OkReply("1 3"), now_ms=1602)
    assert handle.result().offset == 3


def test_a_silent_broker_still_named_leader_keeps_its_batch_and_is_checked_again() -> None:
    p = core()
    handle = p.append("t", rec(), partition=1, now_ms=0)
    (send,) = p.ready(now_ms=10)
    assert p.check_leaders(now_ms=1010) == {1} and asks_metadata(p)
    p.update_metadata(cluster())  # still broker 1 (no election yet)
    assert p.replaced_leaders(now_ms=1010) == frozenset()
    assert p.in_flight_ids() == [send.batch_id] and not handle.done()
    # The next check comes a quarter of leader_check_ms later, not at every wake-up.
    assert p.next_wakeup_ms(now_ms=1011) == 1260
    assert p.check_leaders(now_ms=1100) == {1} and not asks_metadata(p)
    assert p.check_leaders(now_ms=1260) == {1} and asks_metadata(p)
    p.on_response(send.batch_id, OkReply("1 0"), now_ms=1300)  # it was only slow
    assert handle.result().offset == 0
    assert p.check_leaders(now_ms=5000) == frozenset() and p.next_wakeup_ms(5000) is None


def test_a_replaced_leader_without_idempotent_retries_fails_with_an_unknown_outcome() -> None:
    p = core(idempotent=False, retry_unknown_outcome=False)
    handle = p.append("t", rec(), partition=1, now_ms=0)
    (send,) = p.ready(now_ms=10)
    p.check_leaders(now_ms=1010)
    p.update_metadata(cluster(leaders=(0, 0, 0)))
    assert p.replaced_leaders(now_ms=1010) == {1}
    p.on_error(send.batch_id, leader_moved("h1:2", 1000), now_ms=1011)
    error = handle.exception()
    assert isinstance(error, KafkaesqueConnectionError)
    assert error.outcome_unknown and error.retriable and "another leader" in error.message
    assert p.ready(now_ms=5000) == [] and p.pending == 0


def test_giving_up_on_a_broker_ends_every_batch_on_its_connection() -> None:
    p = core()
    p.update_metadata(cluster(leaders=(1, 1, 0)))
    p.append("t", rec(), partition=0, now_ms=0)
    (old,) = p.ready(now_ms=10)
    p.append("t", rec(), partition=1, now_ms=800)
    (young,) = p.ready(now_ms=810)  # in flight for less than leader_check_ms
    p.check_leaders(now_ms=1010)
    p.update_metadata(cluster(leaders=(0, 1, 0)))  # only partition 0 moved
    assert p.replaced_leaders(now_ms=1010) == {1}
    # Both ride the connection that is closed: the driver reports both; neither is named again.
    assert p.replaced_leaders(now_ms=2000) == frozenset()
    for send in (old, young):
        p.on_error(send.batch_id, leader_moved("h1:2", 1000), now_ms=2001)
    assert {s.broker_id for s in p.ready(now_ms=3000)} == {0, 1}


def test_a_batch_sent_to_any_broker_is_left_to_that_broker() -> None:
    p = core()
    p.update_metadata(cluster(leaders=(None, 1, 1)))
    p.append("t", rec(), partition=0, now_ms=0)
    (send,) = p.ready(now_ms=10)
    assert send.broker_id is None
    p.update_metadata(cluster())
    assert p.check_leaders(now_ms=5000) == frozenset() and not asks_metadata(p)
    assert p.replaced_leaders(now_ms=5000) == frozenset()


def test_leader_check_ms_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        ProducerConfig(leader_check_ms=0)
