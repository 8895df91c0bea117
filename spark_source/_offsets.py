"""Offsets and offset ranges: resolving what the options ask for, planning, admission control.

Pure: the cluster's state comes in as ``Bounds`` per partition (log start and high watermark,
from the driver's metadata request). An offset here is Kafka's "next offset": a range
``[from_offset, until_offset)`` holds the data records whose offsets fall in it. Offsets may skip
(Raft's control batches take offsets that hold no record), so a range of n offsets holds at most
n records.

Streaming offsets are JSON objects shaped like Spark's Kafka source's, with partition numbers as
string keys: ``{"readings": {"0": 23, "1": 17}}``. Every function here is deterministic in its
arguments, which is what makes a replayed micro-batch read exactly what the first attempt read.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kafkaesque.client import TopicPartition

from ._options import EARLIEST, LATEST, OffsetSpec, OptionError, TimeSpec, time_option

log = logging.getLogger("kafkaesque.spark_source")

PartitionOffsets = dict[TopicPartition, int]


class DataLossError(RuntimeError):
    """Records the query should read are gone (retention deleted them, or the partition is gone)
    and ``failOnDataLoss`` is true. The message names the partition and the offsets."""


@dataclass(frozen=True)
class Bounds:
    """A partition's readable offsets now: ``start`` (log start) up to ``end`` (high watermark,
    exclusive: everything below it is committed)."""

    start: int
    end: int


@dataclass(frozen=True)
class OffsetRange:
    """One Spark task's share: partition ``tp`` from ``from_offset`` up to ``until_offset``.

    ``from_earliest``: the range begins at the partition's log start whatever it is then (a
    partition that appeared while a stream ran has no recorded start); records retention deleted
    below it are then not a loss.
    """

    tp: TopicPartition
    from_offset: int
    until_offset: int
    from_earliest: bool = False

    @property
    def size(self) -> int:
        return self.until_offset - self.from_offset


def name(tp: TopicPartition) -> str:
    """``topic/partition``, as messages spell a partition."""
    return f"{tp.topic}/{tp.partition}"


# -- JSON -------------------------------------------------------------------------------------


def to_json(offsets: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    """``{"topic": {"0": 23}}``, topics and partitions in order (so equal offsets compare
    equal as text too: Spark compares serialized offsets)."""
    out: dict[str, dict[str, int]] = {}
    for tp in sorted(offsets):
        out.setdefault(tp.topic, {})[str(tp.partition)] = offsets[tp]
    return out


def from_json(value: Any) -> PartitionOffsets:
    """The inverse of ``to_json``. Raises ``ValueError`` for anything else (a checkpoint written
    by another source, or edited by hand)."""
    if not isinstance(value, dict):
        raise ValueError(f"kafkaesque offsets are a JSON object, not {value!r}")
    offsets: PartitionOffsets = {}
    for topic, by_partition in value.items():
        if not isinstance(by_partition, dict):
            raise ValueError(f"offsets of topic {topic!r} are not an object: {by_partition!r}")
        for key, offset in by_partition.items():
            if not str(key).isdigit() or not isinstance(offset, int) or offset < 0:
                raise ValueError(f"bad offset for {topic}/{key}: {offset!r}")
            offsets[TopicPartition(topic, int(key))] = offset
    return offsets


# -- resolving the options --------------------------------------------------------------------


def resolve(
    spec: OffsetSpec, bounds: Mapping[TopicPartition, Bounds], option: str
) -> PartitionOffsets:
    """The offsets ``spec`` (of option ``option``) stands for, for every partition in ``bounds``.

    Explicit offsets must name every partition read (as in Spark's Kafka source: -2 earliest,
    -1 latest) and no other: ``OptionError`` naming the partitions otherwise.
    """
    if spec == "earliest":
        return {tp: b.start for tp, b in bounds.items()}
    if spec == "latest":
        return {tp: b.end for tp, b in bounds.items()}
    assert not isinstance(spec, str)
    missing = sorted(set(bounds) - set(spec))
    if missing:
        raise OptionError(
            f"option {option} must give an offset for every partition read (-2 earliest, "
            f"-1 latest); missing: {', '.join(name(tp) for tp in missing)}"
        )
    extra = sorted(set(spec) - set(bounds))
    if extra:
        raise OptionError(
            f"option {option} names partitions that are not read or do not exist: "
            + ", ".join(name(tp) for tp in extra)
        )
    resolved: PartitionOffsets = {}
    for tp, b in bounds.items():
        offset = spec[tp]
        resolved[tp] = b.start if offset == EARLIEST else b.end if offset == LATEST else offset
    return resolved


def times_for(spec: TimeSpec, bounds: Mapping[TopicPartition, Bounds]) -> PartitionOffsets:
    """The timestamp to start each partition of ``bounds`` at: ``startingTimestamp`` for all,
    or ``startingOffsetsByTimestamp``, which must name every partition read and no other (as in
    Spark's Kafka source): ``OptionError`` naming the partitions otherwise."""
    if isinstance(spec, int):
        return dict.fromkeys(bounds, spec)
    option = time_option(spec)
    missing = sorted(set(bounds) - set(spec))
    if missing:
        raise OptionError(
            f"option {option} must give a timestamp for every partition read; missing: "
            + ", ".join(name(tp) for tp in missing)
        )
    extra = sorted(set(spec) - set(bounds))
    if extra:
        raise OptionError(
            f"option {option} names partitions that are not read or do not exist: "
            + ", ".join(name(tp) for tp in extra)
        )
    return dict(spec)


def resolve_times(
    spec: TimeSpec,
    times: Mapping[TopicPartition, int],
    found: Mapping[TopicPartition, int],
    bounds: Mapping[TopicPartition, Bounds],
    *,
    latest_if_no_match: bool,
) -> PartitionOffsets:
    """The starting offsets for ``times``: ``found`` (the client's ``offsets_for_times``: the
    earliest offset whose record timestamp is >= the time, or the end when none is), for every
    partition of ``bounds``, which were read *after* ``found``.

    Why after: ``found`` is the high watermark of that moment when no record matched, and a
    later end is at least as high, so ``found >= end`` means no match for certain; below the
    end, it is a match (or the end of that moment, with records since: a start as good as
    "latest" was then). No match: the partition's end with ``latest_if_no_match``
    (``startingOffsetsByTimestampStrategy=latest``), else ``OptionError`` (``error``, the
    default), as Spark's Kafka source does.
    """
    resolved: PartitionOffsets = {}
    for tp in sorted(bounds):
        offset, b = found[tp], bounds[tp]
        if offset < b.end:
            resolved[tp] = offset
        elif latest_if_no_match:
            resolved[tp] = b.end
        else:
            raise OptionError(
                f"{time_option(spec)}: partition {name(tp)} has no record at or after "
                f"timestamp {times[tp]} (it ends at {b.end}); set "
                "startingOffsetsByTimestampStrategy=latest to start such partitions at their end"
            )
    return resolved


def data_loss_message(tp: TopicPartition, lost_from: int, lost_until: int, now: str) -> str:
    """What a lost range is called in errors and warnings."""
    return (
        f"partition {name(tp)}: offsets {lost_from} to {lost_until - 1} are no longer available "
        f"({now}); set failOnDataLoss=false to read what remains"
    )


def check_starts(start: PartitionOffsets, bounds: Mapping[TopicPartition, Bounds]) -> None:
    """Refuse a resolved ``startingOffsets`` that lies past a partition's end (its high
    watermark): ``OptionError`` naming the partition, the offset and the end. Batch and streaming
    queries give the same message for this mistake (a stream would otherwise wait for the
    partition to reach the offset, and ``merge_latest`` would take it for a recreated topic)."""
    for tp in sorted(start):
        b = bounds.get(tp)
        if b is not None and start[tp] > b.end:
            raise OptionError(
                f"startingOffsets for {name(tp)} is {start[tp]}, but the partition ends at "
                f"{b.end} (committed offsets only)"
            )


def check_batch_range(
    start: PartitionOffsets,
    end: PartitionOffsets,
    bounds: Mapping[TopicPartition, Bounds],
    *,
    fail_on_data_loss: bool,
) -> PartitionOffsets:
    """Check a batch query's resolved offsets against the partitions as they are; returns the
    starts to read from (moved up to the log start where retention deleted the beginning and
    ``fail_on_data_loss`` is false; that gap is logged).

    Raises ``OptionError`` when a start lies after what is committed (``check_starts``) or
    after its end, or an end after what is committed, and ``DataLossError`` when a range begins
    below the log start and ``fail_on_data_loss``.
    """
    check_starts(start, bounds)
    starts = dict(start)
    for tp in sorted(end):
        b, lo, hi = bounds[tp], start[tp], end[tp]
        if lo > hi:
            raise OptionError(
                f"startingOffsets for {name(tp)} ({lo}) is after its endingOffsets ({hi})"
            )
        if hi > b.end:
            raise OptionError(
                f"endingOffsets for {name(tp)} is {hi}, but the partition ends at {b.end} "
                "(committed offsets only)"
            )
        if lo < b.start:
            message = data_loss_message(tp, lo, min(b.start, hi), f"the log starts at {b.start}")
            if fail_on_data_loss:
                raise DataLossError(message)
            log.warning("%s; reading from %d", message, b.start)
            starts[tp] = min(b.start, hi)
    return starts


# -- planning ---------------------------------------------------------------------------------


def plan_ranges(
    start: Mapping[TopicPartition, int],
    end: Mapping[TopicPartition, int],
    min_partitions: int | None = None,
) -> list[OffsetRange]:
    """One range per partition of ``end`` with something to read, in partition order, then
    split into equal pieces for ``min_partitions``: at least ``min_partitions`` ranges in all
    (when there are that many offsets), each partition's number of pieces in proportion to its
    offsets, as Spark's Kafka source divides large partitions.

    A partition of ``end`` absent from ``start`` (it appeared after the stream began) is read
    from its log start (``from_earliest``). Deterministic: the same arguments give the same
    ranges, which is what lets a micro-batch be replayed exactly.
    """
    ranges: list[OffsetRange] = []
    for tp in sorted(end):
        if tp in start:
            lo, earliest = start[tp], False
        else:
            lo, earliest = 0, True
        if end[tp] > lo:
            ranges.append(OffsetRange(tp, lo, end[tp], earliest))
    total = sum(r.size for r in ranges)
    if not min_partitions or min_partitions <= len(ranges) or total == 0:
        return ranges
    pieces = _share(min_partitions, {i: r.size for i, r in enumerate(ranges)}, minimum=1)
    split: list[OffsetRange] = []
    for i, r in enumerate(ranges):
        n = min(pieces[i], r.size)
        cuts = [r.from_offset + r.size * k // n for k in range(n + 1)]
        for k in range(n):
            split.append(OffsetRange(r.tp, cuts[k], cuts[k + 1], r.from_earliest and k == 0))
    return split


def _share(budget: int, weights: Mapping[Any, int], *, minimum: int = 0) -> dict[Any, int]:
    """``budget`` units shared in proportion to ``weights`` (largest remainder; ties to the
    larger weight, then the smaller key), each key getting at least ``minimum``. The result
    adds up to ``max(budget, minimum * len(weights))``. Deterministic."""
    total = sum(weights.values())
    exact = {k: w * budget / total if total else 0.0 for k, w in weights.items()}
    given = {k: max(math.floor(x), minimum) for k, x in exact.items()}
    left = budget - sum(given.values())
    order = sorted(weights, key=lambda k: (-(exact[k] - math.floor(exact[k])), -weights[k], k))
    for k in order[: max(left, 0)]:
        given[k] += 1
    return given


def cap_offsets(
    start: Mapping[TopicPartition, int], latest: Mapping[TopicPartition, int], max_offsets: int
) -> PartitionOffsets:
    """``latest`` cut back so that at most ``max_offsets`` offsets lie between ``start`` (which
    has every partition of ``latest``) and it.

    Every partition with lag gets one offset first when the budget allows (so a small partition
    is not starved by large ones, as Spark's Kafka source rounds small shares up); the rest is
    shared in proportion to the lags, the odd offsets going to the largest remainders. A trigger
    thus reads at most ``max_offsets`` records. Deterministic.
    """
    lags = {tp: max(latest[tp] - start[tp], 0) for tp in latest}
    if sum(lags.values()) <= max_offsets:
        return dict(latest)
    lagging = [tp for tp, lag in lags.items() if lag]
    first = dict.fromkeys(lagging if max_offsets >= len(lagging) else (), 1)
    rest = _share(max_offsets - len(first), {tp: lags[tp] - first.get(tp, 0) for tp in lags})
    return {tp: start[tp] + first.get(tp, 0) + rest[tp] for tp in latest}


def merge_latest(
    start: Mapping[TopicPartition, int],
    latest: Mapping[TopicPartition, int],
    *,
    fail_on_data_loss: bool,
) -> PartitionOffsets:
    """The end offsets a stream may move to: ``latest`` for every partition read now, never
    behind ``start`` (a partition whose end went backwards, a truncated log, stays where it was);
    a partition of ``start`` that is no longer read (its topic was deleted) is a data loss.
    """
    merged: PartitionOffsets = {}
    for tp in sorted(set(start) | set(latest)):
        if tp not in latest:
            message = f"partition {name(tp)} disappeared (was its topic deleted?)"
            if fail_on_data_loss:
                raise DataLossError(message + "; set failOnDataLoss=false to go on without it")
            log.warning("%s; going on without it", message)
            continue
        if tp in start and latest[tp] < start[tp]:
            message = (
                f"partition {name(tp)} now ends at {latest[tp]}, before offset {start[tp]} "
                "already read (was the topic recreated?)"
            )
            if fail_on_data_loss:
                raise DataLossError(message + "; set failOnDataLoss=false to go on")
            log.warning("%s; waiting for it to pass %d", message, start[tp])
            merged[tp] = start[tp]
            continue
        merged[tp] = latest[tp]
    return merged


def ends_of(bounds: Mapping[TopicPartition, Bounds]) -> PartitionOffsets:
    """The high watermark of every partition."""
    return {tp: b.end for tp, b in bounds.items()}
