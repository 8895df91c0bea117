"""The producer's batch encoder makes exactly the bytes of the storage layer's ``build_batch``."""

from __future__ import annotations

import pytest
from hypothesis import given

from kafkaesque.client._encoding import Row, encode_batch
from kafkaesque.storage import Record, build_batch, decode_header, decode_records
from tests.storage.test_batch import records_st  # timestamps in any order: not always sorted


def rows_of(records: list[Record]) -> tuple[list[Row], int, list[int]]:
    """The rows a producer batch holds for ``records``, as ``ProducerBatch.append`` builds them."""
    base = records[0].timestamp
    rows = [(i, r.timestamp - base, r.key, r.value, r.headers) for i, r in enumerate(records)]
    return rows, base, [r.timestamp for r in records]


@given(records=records_st)
def test_the_bytes_are_build_batchs(records: list[Record]) -> None:
    assert encode_batch(*rows_of(records)) == build_batch(records)


@pytest.mark.parametrize("count", [15, 16, 65_535, 65_536])  # every msgpack array header size
def test_long_batches_at_the_array_header_boundaries(count: int) -> None:
    records = [Record(b"v%d" % i, None, (), 1_000 + i % 7) for i in range(count)]
    batch = encode_batch(*rows_of(records))
    assert batch == build_batch(records)
    assert decode_header(batch).record_count == count
    assert [r.value for r in decode_records(batch)][-1] == b"v%d" % (count - 1)


def test_no_rows_is_refused() -> None:
    with pytest.raises(ValueError):
        encode_batch([], 0, [])
