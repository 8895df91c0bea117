"""Offset resolution, range planning and admission control: pure and deterministic."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafkaesque.spark_source import DataLossError, OptionError
from kafkaesque.spark_source._offsets import (
    Bounds,
    OffsetRange,
    cap_offsets,
    check_batch_range,
    check_starts,
    from_json,
    merge_latest,
    plan_ranges,
    resolve,
    to_json,
)

from kafkaesque.client import TopicPartition

A0, A1, B0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)
BOUNDS = {A0: Bounds(0, 100), A1: Bounds(10, 50), B0: Bounds(0, 0)}


def test_json_has_string_partition_keys_like_sparks_kafka_source() -> None:
    offsets = {A1: 23, B0: 4, A0: 7}
    assert to_json(offsets) == {"a": {"0": 7, "1": 23}, "b": {"0": 4}}
    assert from_json(to_json(offsets)) == offsets
    with pytest.raises(ValueError, match="bad offset for a/x"):
        from_json({"a": {"x": 1}})


def test_resolve_earliest_latest_and_explicit() -> None:
    assert resolve("earliest", BOUNDS, "startingOffsets") == {A0: 0, A1: 10, B0: 0}
    assert resolve("latest", BOUNDS, "endingOffsets") == {A0: 100, A1: 50, B0: 0}
    explicit = {A0: 5, A1: -2, B0: -1}
    assert resolve(explicit, BOUNDS, "startingOffsets") == {A0: 5, A1: 10, B0: 0}
    with pytest.raises(OptionError, match=r"every partition read .* missing: a/1, b/0"):
        resolve({A0: 5}, BOUNDS, "startingOffsets")
    with pytest.raises(OptionError, match="not read or do not exist: a/7"):
        resolve({**explicit, TopicPartition("a", 7): 1}, BOUNDS, "startingOffsets")


def test_batch_ranges_are_checked_against_the_partitions(caplog: pytest.LogCaptureFixture) -> None:
    end = {A0: 100, A1: 50, B0: 0}
    with pytest.raises(OptionError, match=r"startingOffsets for a/0 \(60\) is after .* \(40\)"):
        check_batch_range({A0: 60, A1: 10, B0: 0}, {**end, A0: 40}, BOUNDS, fail_on_data_loss=True)
    with pytest.raises(OptionError, match=r"endingOffsets for a/1 is 51, but .* ends at 50"):
        check_batch_range({A0: 0, A1: 10, B0: 0}, {**end, A1: 51}, BOUNDS, fail_on_data_loss=True)
    below = {A0: 0, A1: 3, B0: 0}
    with pytest.raises(DataLossError, match="partition a/1: offsets 3 to 9 are no longer"):
        check_batch_range(below, end, BOUNDS, fail_on_data_loss=True)
    with caplog.at_level(logging.WARNING, "kafkaesque.spark_source"):
        assert check_batch_range(below, end, BOUNDS, fail_on_data_loss=False)[A1] == 10
    assert "offsets 3 to 9 are no longer available" in caplog.text


def test_a_start_past_the_end_is_refused_the_same_way_in_batch_and_streaming() -> None:
    beyond = {A0: 10_000_000, A1: 10, B0: 0}
    message = r"startingOffsets for a/0 is 10000000, but the partition ends at 100 \(committed"
    with pytest.raises(OptionError, match=message):
        check_starts(beyond, BOUNDS)  # what a stream's initialOffset checks
    with pytest.raises(OptionError, match=message):  # and a batch query, whatever its end
        check_batch_range(beyond, {A0: 100, A1: 50, B0: 0}, BOUNDS, fail_on_data_loss=True)
    check_starts({A0: 100, A1: 50, B0: 0}, BOUNDS)  # at the end is fine: nothing yet to read


def test_one_range_per_partition_then_split_for_min_partitions() -> None:
    start, end = {A0: 0, A1: 10, B0: 0}, {A0: 100, A1: 50, B0: 0}
    assert plan_ranges(start, end) == [OffsetRange(A0, 0, 100), OffsetRange(A1, 10, 50)]
    split = plan_ranges(start, end, 7)
    assert len(split) == 7
    assert [r for r in split if r.tp == A0] == [
        OffsetRange(A0, 0, 20),
        OffsetRange(A0, 20, 40),
        OffsetRange(A0, 40, 60),
        OffsetRange(A0, 60, 80),
        OffsetRange(A0, 80, 100),
    ]
    # a partition new to a stream (absent from start) is read from its log start
    assert plan_ranges({A0: 0}, {A0: 0, A1: 30}) == [OffsetRange(A1, 0, 30, from_earliest=True)]


SPANS = st.dictionaries(
    st.integers(0, 5).map(lambda p: TopicPartition("t", p)),
    st.tuples(st.integers(0, 1000), st.integers(0, 1000)),
    min_size=1,
).map(
    lambda spans: ({tp: min(s) for tp, s in spans.items()}, {tp: max(s) for tp, s in spans.items()})
)
"""(start, end) offsets of up to six partitions, start <= end."""


@given(SPANS, st.integers(1, 20))
def test_split_ranges_cover_exactly_what_was_asked(
    spans: tuple[dict[TopicPartition, int], dict[TopicPartition, int]], min_partitions: int
) -> None:
    start, end = spans
    ranges = plan_ranges(start, end, min_partitions)
    assert ranges == plan_ranges(start, end, min_partitions)  # deterministic
    covered = {tp: [(r.from_offset, r.until_offset) for r in ranges if r.tp == tp] for tp in end}
    for tp, pieces in covered.items():
        offsets = [o for lo, hi in pieces for o in range(lo, hi)]
        assert offsets == list(range(start[tp], end[tp]))
    total = sum(end[tp] - start[tp] for tp in end)
    assert len(ranges) >= min(min_partitions, total)


@given(SPANS, st.integers(1, 800))
def test_cap_never_exceeds_the_budget_nor_the_latest(
    spans: tuple[dict[TopicPartition, int], dict[TopicPartition, int]], budget: int
) -> None:
    start, latest = spans
    capped = cap_offsets(start, latest, budget)
    assert all(start[tp] <= capped[tp] <= latest[tp] for tp in latest)
    lag = sum(latest[tp] - start[tp] for tp in latest)
    assert sum(capped[tp] - start[tp] for tp in latest) == min(budget, lag)
    assert capped == cap_offsets(start, latest, budget)
    lagging = [tp for tp in latest if latest[tp] > start[tp]]
    if budget >= len(lagging):  # none starves
        assert all(capped[tp] > start[tp] for tp in lagging)


def test_cap_shares_the_budget_by_lag() -> None:
    assert cap_offsets({A0: 0, A1: 0, B0: 5}, {A0: 300, A1: 100, B0: 5}, 100) == {
        A0: 75,
        A1: 25,
        B0: 5,
    }
    # a partition with little lag still moves
    assert cap_offsets({A0: 0, A1: 0, B0: 0}, {A0: 1000, A1: 1000, B0: 1}, 3) == {
        A0: 1,
        A1: 1,
        B0: 1,
    }


def test_merge_latest_keeps_new_partitions_and_flags_vanished_ones(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert merge_latest({A0: 5}, {A0: 9, A1: 3}, fail_on_data_loss=True) == {A0: 9, A1: 3}
    with pytest.raises(DataLossError, match="partition a/1 disappeared"):
        merge_latest({A0: 5, A1: 2}, {A0: 9}, fail_on_data_loss=True)
    with pytest.raises(DataLossError, match="now ends at 4, before offset 5"):
        merge_latest({A0: 5}, {A0: 4}, fail_on_data_loss=True)
    with caplog.at_level(logging.WARNING, "kafkaesque.spark_source"):
        assert merge_latest({A0: 5, A1: 2}, {A0: 4}, fail_on_data_loss=False) == {A0: 5}
    assert "disappeared" in caplog.text and "now ends at 4" in caplog.text
