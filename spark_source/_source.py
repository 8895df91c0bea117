"""The PySpark data source ``kafkaesque``: the classes Spark calls, batch and streaming.

Where each piece runs, which is what the design follows:

* ``KafkaesqueDataSource`` is pickled by Spark and rebuilt in every Python process it starts.
  Its ``options`` are Spark's case-insensitive map, kept as given (``_options`` reads it
  case-insensitively, so a copy into a plain dict would do too).
* ``schema``, ``reader``/``streamReader`` and ``partitions`` run on the driver side (Spark's
  Python planner, and for a stream one long-lived Python process per query that answers
  ``initialOffset``, ``latestOffset``, ``partitions``, ``commit``): offsets are resolved there,
  with one metadata request.
* ``read`` runs in executors, in a copy of the reader rebuilt from a pickle: it uses nothing but
  the ``RangePartition`` it is given (``_read``).

Streaming, step by step: ``initialOffset`` resolves ``startingOffsets`` (default ``latest``) once
for a new query; a restarted query starts from its checkpoint instead. Each trigger,
``latestOffset(start, limit)`` reads the partitions' high watermarks, keeps new partitions (read
from their log start), and caps the offsets at ``maxOffsetsPerTrigger`` (``ReadMaxRows``);
``partitions(start, end)`` cuts ranges, a pure function of the two offsets, so a micro-batch
that Spark replays after a restart (its offsets were logged, its commit was not) reads exactly
the same records. ``commit`` needs no action: the source keeps no state that commit would free.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.types import StructType

from kafkaesque.client import Client, TopicPartition

from ._compat import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from ._discover import discover
from ._offsets import (
    Bounds,
    PartitionOffsets,
    cap_offsets,
    check_batch_range,
    check_starts,
    ends_of,
    from_json,
    merge_latest,
    plan_ranges,
    resolve,
    resolve_times,
    times_for,
    to_json,
)
from ._options import Mode, OptionError, SourceOptions, parse_options
from ._read import RangePartition, ReadSettings, read_partition
from ._schema import spark_schema

log = logging.getLogger("kafkaesque.spark_source")

NAME = "kafkaesque"


class KafkaesqueDataSource(DataSource):
    """``spark.read.format("kafkaesque")`` and ``spark.readStream.format("kafkaesque")``.

    Options, schema and semantics: docs/spark.md. Every option is checked when Spark plans the
    query (``OptionError``), before any task runs.
    """

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return spark_schema(parse_options(self.options).include_headers)

    def reader(self, schema: StructType) -> DataSourceReader:
        options = parse_options(self.options, Mode.BATCH)
        _check_schema(schema, options)
        return KafkaesqueBatchReader(options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """The stream's reader; for options a stream refuses, a reader that raises their
        ``OptionError`` at Spark's first call.

        Why not raise here: PySpark's stream runner calls ``reader.stop()`` in a ``finally``
        around this call, so an exception raised here comes out as PySpark's own
        ``UnboundLocalError`` with ours buried in its context. And not at ``load()``: Spark
        only asks a Python source for its ``schema()`` then, without saying whether the query
        is a stream (the options, process and environment are those of a batch ``load()``),
        so the checks of streaming alone can run no earlier than the query's start."""
        try:
            options = parse_options(self.options, Mode.STREAMING)
            _check_schema(schema, options)
        except OptionError as exc:
            return _RefusedStreamReader(exc)
        return KafkaesqueStreamReader(options)


def _check_schema(schema: StructType, options: SourceOptions) -> None:
    expected = spark_schema(options.include_headers)
    if schema != expected:
        raise OptionError(
            "kafkaesque has a fixed schema (as Spark's Kafka source): do not pass one with "
            f".schema(); expected {expected.simpleString()}, got {schema.simpleString()}"
        )


def _ranges(
    options: SourceOptions, start: PartitionOffsets, end: PartitionOffsets
) -> list[InputPartition]:
    settings = ReadSettings.of(options)
    return [RangePartition(r, settings) for r in plan_ranges(start, end, options.min_partitions)]


def _starting_offsets(
    client: Client, options: SourceOptions, bounds: dict[TopicPartition, Bounds]
) -> tuple[PartitionOffsets, dict[TopicPartition, Bounds]]:
    """Where the query starts, and the bounds to plan with.

    With ``startingTimestamp`` or ``startingOffsetsByTimestamp`` (which take precedence over
    ``startingOffsets``, as in Spark's Kafka source) the offsets for the times are asked of the
    partitions' leaders (``Client.offsets_for_times``), then the bounds are read again: a later
    end tells for certain which partitions had no record at or after their time (see
    ``resolve_times``). Partitions that appeared between the two reads are left to the next
    trigger (a stream reads them from their log start) or to the next run (a batch).
    """
    spec = options.starting_times
    if spec is None:
        return resolve(options.starting, bounds, "startingOffsets"), bounds
    times = times_for(spec, bounds)
    found = client.offsets_for_times(times)
    after = {tp: b for tp, b in discover(client, options.subscription).items() if tp in found}
    start = resolve_times(
        spec, times, found, after, latest_if_no_match=options.latest_if_no_time_match
    )
    return start, after


class KafkaesqueBatchReader(DataSourceReader):
    """A batch query: offsets resolved once, when Spark plans, into one range per partition."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        options = self.options
        with Client(options.bootstrap, config=options.client_config()) as client:
            bounds = discover(client, options.subscription)
            start, bounds = _starting_offsets(client, options, bounds)
        end = resolve(options.ending, bounds, "endingOffsets")
        start = check_batch_range(start, end, bounds, fail_on_data_loss=options.fail_on_data_loss)
        return _ranges(options, start, end)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return read_partition(partition)


class KafkaesqueStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """A streaming query, by offset ranges (see the module docstring for the protocol).

    Holds a client while the query runs (in the driver's stream process), never pickled: the
    executors' copies only ever call ``read``.
    """

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._client: Client | None = None
        self._latest: PartitionOffsets | None = None  # high watermarks at the last trigger
        self._target: PartitionOffsets | None = None  # the end of a Trigger.AvailableNow run
        self._last_end: PartitionOffsets | None = None  # for Spark < 4.2 (no start given)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = None  # sockets do not travel; a copy opens its own
        return state

    def _bounds(self) -> dict[Any, Bounds]:
        if self._client is None:
            self._client = Client(self.options.bootstrap, config=self.options.client_config())
        return discover(self._client, self.options.subscription)

    def initialOffset(self) -> dict[str, Any]:
        bounds = self._bounds()
        assert self._client is not None  # opened by ``_bounds``
        offsets, bounds = _starting_offsets(self._client, self.options, bounds)
        check_starts(offsets, bounds)
        self._last_end = offsets
        return to_json(offsets)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = ends_of(self._bounds())

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def latestOffset(
        self, start: dict[str, Any] | None = None, limit: ReadLimit | None = None
    ) -> dict[str, Any]:
        """The end of the next micro-batch: the high watermarks, capped by ``limit``.

        Spark 4.2+ passes ``start`` (the previous end) and ``limit``; Spark 4.1 passes neither,
        and then the cap of ``maxOffsetsPerTrigger`` counts from the last end this process
        returned (after a restart, the first trigger reads all that is available).
        """
        bounds = self._bounds()
        latest = self._latest = ends_of(bounds)
        if self._target is not None:  # Trigger.AvailableNow: nothing past what was there
            target = self._target
            latest = {tp: min(end, target[tp]) for tp, end in latest.items() if tp in target}
        begin = from_json(start) if start is not None else self._last_end
        if begin is None:
            end = latest
        else:
            end = merge_latest(begin, latest, fail_on_data_loss=self.options.fail_on_data_loss)
            max_rows = self._max_rows(limit, start is None)
            if max_rows is not None:
                counted_from = {tp: begin.get(tp, bounds[tp].start) for tp in end}
                end = cap_offsets(counted_from, end, max_rows)
        self._last_end = end
        return to_json(end)

    def _max_rows(self, limit: ReadLimit | None, old_engine: bool) -> int | None:
        if old_engine or limit is None:
            return self.options.max_offsets_per_trigger
        if isinstance(limit, ReadMaxRows):
            return int(limit.max_rows)
        return None  # ReadAllAvailable: a trigger that wants everything, or no limit set

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """The high watermarks seen at the last trigger, so the query's progress shows lag."""
        return None if self._latest is None else to_json(self._latest)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        planned = from_json(end)
        # Spark < 4.2 passes no start to latestOffset: the batch Spark plans (also the one it
        # replays after a restart, from its checkpoint) is where the next one starts.
        self._last_end = planned
        return _ranges(self.options, from_json(start), planned)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return read_partition(partition)

    def commit(self, end: dict[str, Any]) -> None:
        # Nothing to release: ranges are re-derived from offsets alone. Spark may call this late
        # or never (a crash), which costs nothing here.
        log.debug("micro-batch up to %s committed", end)

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


class _RefusedStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """A stream whose options were refused: every call Spark makes raises that ``OptionError``
    (``stop`` excepted, which has nothing to release). It offers what the real reader offers
    (Trigger.AvailableNow, the ``latestOffset(start, limit)`` signature), so Spark's feature
    checks pass and the first call it makes reports the options' error, not a missing feature.
    """

    def __init__(self, error: OptionError) -> None:
        self.error = error

    def _refuse(self) -> NoReturn:
        raise self.error

    def initialOffset(self) -> dict[str, Any]:
        self._refuse()

    def prepareForTriggerAvailableNow(self) -> None:
        self._refuse()

    def getDefaultReadLimit(self) -> ReadLimit:
        self._refuse()

    def latestOffset(
        self, start: dict[str, Any] | None = None, limit: ReadLimit | None = None
    ) -> dict[str, Any]:
        self._refuse()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        self._refuse()

    def read(self, partition: InputPartition) -> Iterator[Any]:
        self._refuse()

    def commit(self, end: dict[str, Any]) -> None:
        self._refuse()

    def stop(self) -> None:
        pass
