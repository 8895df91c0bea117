"""Option parsing: Spark's Kafka-source names, case-insensitive, and clear planning-time errors."""

from __future__ import annotations

import pytest
from kafkaesque.spark_source import OptionError
from kafkaesque.spark_source._options import Mode, Subscription, parse_options
from pyspark.sql.datasource import CaseInsensitiveDict

from kafkaesque.client import TopicPartition

BASE = {"bootstrap": "127.0.0.1:9092", "subscribe": "readings"}


def test_defaults_follow_sparks_kafka_source() -> None:
    batch = parse_options(BASE, Mode.BATCH)
    assert batch.subscription == Subscription(topics=("readings",))
    assert (batch.starting, batch.ending) == ("earliest", "latest")
    assert batch.fail_on_data_loss and not batch.include_headers and batch.use_arrow
    assert parse_options(BASE, Mode.STREAMING).starting == "latest"


def test_names_are_case_insensitive_whatever_the_mapping() -> None:
    # Spark hands a CaseInsensitiveDict whose keys it lower-cased; copying it into a dict keeps
    # only the lower-case keys. Both, and the camel case a user types, must mean the same.
    given = {
        "bootstrap": "h:1",
        "subscribe": "a, b ,a",
        "startingOffsets": '{"a": {"0": 5, "1": -2}, "b": {"0": -2}}',
        "minPartitions": "4",
        "includeHeaders": "TRUE",
    }
    spark_map = CaseInsensitiveDict(given)
    parsed = [
        parse_options(given, Mode.BATCH),
        parse_options(spark_map, Mode.BATCH),
        parse_options(dict(spark_map), Mode.BATCH),
    ]
    assert parsed[0] == parsed[1] == parsed[2]
    assert parsed[0].subscription.topics == ("a", "b")
    assert parsed[0].starting == {
        TopicPartition("a", 0): 5,
        TopicPartition("a", 1): -2,
        TopicPartition("b", 0): -2,
    }
    assert parsed[0].min_partitions == 4 and parsed[0].include_headers


def test_assign_and_pattern() -> None:
    assign = parse_options(
        {
            "bootstrap": "h:1",
            "assign": '{"t": [2, 0], "u": [1]}',
            "startingOffsets": '{"t": {"0": 1, "2": -2}, "u": {"1": 7}}',
        },
        Mode.BATCH,
    )
    assert assign.subscription.assigned == (
        TopicPartition("t", 0),
        TopicPartition("t", 2),
        TopicPartition("u", 1),
    )
    pattern = parse_options({"bootstrap": "h:1", "subscribePattern": "read.*"}, Mode.BATCH)
    assert pattern.subscription.matches("readings")
    assert not pattern.subscription.matches("xreadings")  # whole-name match, as Java's
    assert not parse_options({"bootstrap": "h:1", "subscribePattern": ".*"}).subscription.matches(
        "__consumer_offsets"
    )


@pytest.mark.parametrize(
    ("options", "mode", "message"),
    [
        ({"subscribe": "t"}, None, 'option "bootstrap" is required'),
        ({**BASE, "bootstrap": "h:port"}, None, "option bootstrap: bad port"),
        ({"bootstrap": "h:1"}, None, "exactly one of subscribe, subscribePattern and assign"),
        ({**BASE, "assign": '{"t": [0]}'}, None, "(got: subscribe, assign)"),
        ({**BASE, "subscribe": " , "}, None, "option subscribe names no topic"),
        ({"bootstrap": "h:1", "subscribePattern": "("}, None, "not a valid regex"),
        ({"bootstrap": "h:1", "assign": "[0]"}, None, "option assign must be JSON"),
        ({"bootstrap": "h:1", "assign": '{"t": [-1]}'}, None, "-1 is no partition"),
        ({**BASE, "startingOffsets": "oldest"}, None, "option startingOffsets must be"),
        ({**BASE, "startingOffsets": '{"t": {"x": 1}}'}, None, "partition 'x'"),
        ({**BASE, "endingOffsets": '{"readings": {"0": -3}}'}, None, "partition 0: -3"),
        ({**BASE, "startingOffsets": '{"other": {"0": 1}}'}, None, "topic 'other'"),
        ({**BASE, "minPartitions": "0"}, None, "minPartitions must be a positive integer"),
        ({**BASE, "failOnDataLoss": "yes"}, None, "failOnDataLoss must be true or false"),
        ({**BASE, "fetchMaxBytes": str(1 << 30)}, None, "fetchMaxBytes must be at most"),
        ({**BASE, "startingOfsets": "earliest"}, None, "unknown option 'startingofsets'"),
        ({**BASE, "kafka.group.id": "g"}, None, "'kafka.group.id' of Spark's Kafka source"),
        ({**BASE, "maxTriggerDelay": "5m"}, None, "'maxTriggerDelay' of Spark's Kafka"),
        ({**BASE, "path": "x"}, None, "kafkaesque takes no path"),
        ({**BASE, "kafka.bootstrap.servers": "other:1"}, None, "name different brokers"),
        ({**BASE, "startingOffsets": "latest"}, Mode.BATCH, '"latest" is not valid in a batch'),
        ({**BASE, "endingOffsets": "earliest"}, Mode.BATCH, '"earliest" is not valid in a'),
        (
            {**BASE, "startingOffsets": '{"readings": {"0": -1}}'},
            Mode.BATCH,
            "startingOffsets for readings/0 can't be latest (-1)",
        ),
        (
            {**BASE, "endingOffsets": '{"readings": {"0": -2}}'},
            Mode.BATCH,
            "endingOffsets for readings/0 can't be earliest (-2)",
        ),
        ({**BASE, "maxOffsetsPerTrigger": "5"}, Mode.BATCH, "streaming queries only"),
        ({**BASE, "endingOffsets": "latest"}, Mode.STREAMING, "endingOffsets is not valid in a"),
        (
            {"bootstrap": "h:1", "assign": '{"t": [0, 1]}', "startingOffsets": '{"t": {"0": 1}}'},
            None,
            "every assigned partition (-2 earliest, -1 latest); missing: t/1",
        ),
        (
            {"bootstrap": "h:1", "assign": '{"t": [0]}', "endingOffsets": '{"t": {"3": 1}}'},
            None,
            "names t/3, which assign does not",
        ),
    ],
)
def test_bad_options_fail_with_a_message_naming_the_option(
    options: dict[str, str], mode: Mode | None, message: str
) -> None:
    with pytest.raises(OptionError) as caught:
        parse_options(options, mode)
    assert message in str(caught.value)
