"""The rows the source produces: Spark's Kafka schema, as a Spark ``StructType`` and in Arrow.

Spark checks that every Arrow batch a Python data source yields has exactly the Arrow schema it
derives from the Spark schema (``to_arrow_schema(schema, timezone="UTC")``): same names, types
and nullability, or the query fails. ``ARROW_SCHEMA`` is written out here, not derived at run
time, and a test holds it equal to Spark's derivation.
"""

from __future__ import annotations

import pyarrow as pa  # type: ignore[import-untyped]
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

TIMESTAMP_TYPE_CREATE_TIME = 0
"""``timestampType`` of every record: the producer's creation time, as Kafka's CreateTime."""

_COLUMNS = (
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),
    StructField("timestampType", IntegerType()),
)
_HEADERS = StructField(
    "headers",
    ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())])),
)

ARROW_HEADERS_TYPE = pa.list_(
    pa.field("element", pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
)
_ARROW_COLUMNS = [
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("timestamp", pa.timestamp("us", tz="UTC")),
    pa.field("timestampType", pa.int32()),
]


def spark_schema(include_headers: bool) -> StructType:
    """``key binary, value binary, topic string, partition int, offset long, timestamp timestamp,
    timestampType int`` (+ ``headers array<struct<key string, value binary>>``), all nullable:
    the schema of Spark's Kafka source."""
    return StructType([*_COLUMNS, _HEADERS] if include_headers else list(_COLUMNS))


def arrow_schema(include_headers: bool) -> pa.Schema:
    """The Arrow schema of the batches the fast path yields (equal to Spark's derivation)."""
    if include_headers:
        return pa.schema([*_ARROW_COLUMNS, pa.field("headers", ARROW_HEADERS_TYPE)])
    return pa.schema(_ARROW_COLUMNS)
