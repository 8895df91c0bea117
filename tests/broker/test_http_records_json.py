"""REST reads write each record's JSON straight from the stored fields (``_records_json``):
the text must be exactly what the record's dict (``_record_json``, as LATEST shows a record)
serialises to, for any records, offsets and both embedded formats."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafkaesque.broker.http._rest import _record_json, _records_json
from kafkaesque.broker.http._rest_errors import RestError, to_json
from kafkaesque.storage import Record, build_batch, data_records

_json_values: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text() | st.floats(allow_nan=False),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=6,
)
_headers = st.lists(st.tuples(st.text(max_size=8), st.binary(max_size=8)), max_size=3)


def _batches(records: list[Record], per_batch: int) -> bytes:
    return b"".join(
        build_batch(records[i : i + per_batch], base_offset=7 + i)
        for i in range(0, len(records), per_batch)
    )


def _expected(payload: bytes, start: int, embedded: str) -> bytes:
    return to_json([_record_json("t\u00e9", 2, r, embedded) for r in data_records(payload, start)])


@settings(max_examples=150, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.none() | st.binary(max_size=12),
            st.none() | _json_values.map(lambda v: json.dumps(v, ensure_ascii=False).encode()),
            _headers,
            st.integers(0, 10**13),
        ),
        min_size=1,
        max_size=12,
    ),
    per_batch=st.integers(1, 5),
    skip=st.integers(0, 14),
    embedded=st.sampled_from(["binary", "json"]),
)
def test_the_records_text_is_what_their_dicts_serialise_to(
    rows: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]], int]],
    per_batch: int,
    skip: int,
    embedded: str,
) -> None:
    records = [
        Record(value, key, headers=tuple(headers), timestamp=ts) for key, value, headers, ts in rows
    ]
    payload = _batches(records, per_batch)
    start = 7 + skip
    text = _records_json("t\u00e9", 2, payload, start, embedded)
    assert text == _expected(payload, start, embedded)
    json.loads(text)  # (and it is JSON)


def test_a_value_that_is_not_json_is_refused_with_406_in_the_json_format() -> None:
    payload = _batches([Record(b"{not json", b"k")], 1)
    assert json.loads(_records_json("t", 0, payload, 0, "binary"))[0]["value"] == "e25vdCBqc29u"
    with pytest.raises(RestError) as refused:
        _records_json("t", 0, payload, 0, "json")
    assert refused.value.status == 406
