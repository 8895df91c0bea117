"""``KafkaesqueDataSource`` and its readers as Spark's Python workers call them (no JVM)."""

from __future__ import annotations

import pytest
from kafkaesque.spark_source import KafkaesqueDataSource, OptionError
from kafkaesque.spark_source._schema import spark_schema
from kafkaesque.spark_source._source import KafkaesqueStreamReader


def test_a_stream_with_a_batch_only_option_is_refused_at_the_first_call_not_at_creation() -> None:
    source = KafkaesqueDataSource(
        {"bootstrap": "127.0.0.1:1", "subscribe": "t", "endingOffsets": "latest"}
    )
    source.schema()  # what load() asks: the same for batch and streaming queries
    # PySpark's runner calls reader.stop() in a finally around streamReader(): had it raised,
    # the runner's UnboundLocalError would have hidden this message.
    reader = source.streamReader(spark_schema(False))
    reader.stop()
    for call in (
        reader.getDefaultReadLimit,
        reader.initialOffset,
        reader.latestOffset,
        reader.prepareForTriggerAvailableNow,
    ):
        with pytest.raises(OptionError, match="endingOffsets is not valid in a streaming query"):
            call()


def test_a_stream_with_good_options_gets_the_real_reader() -> None:
    source = KafkaesqueDataSource({"bootstrap": "127.0.0.1:1", "subscribe": "t"})
    assert isinstance(source.streamReader(spark_schema(False)), KafkaesqueStreamReader)
