"""bench.kafka_codec runs and ends with its RESULT line (the figures themselves are not judged
here: speed is the benchmark's business, not a test's)."""

from __future__ import annotations

import pytest

from bench import kafka_codec
from kafkaesque.broker import produced_batches
from kafkaesque.storage import decode_records


def test_the_quick_run_prints_every_field(capsys: pytest.CaptureFixture[str]) -> None:
    assert kafka_codec.main(["--quick"]) == 0
    result = capsys.readouterr().out.splitlines()[-1]
    fields = dict(field.split("=") for field in result.removeprefix("RESULT ").split())
    assert sorted(fields) == [
        "fetch_us_per_record",
        "fetch_verbatim_us_per_record",
        "kafka_us_per_batch",
        "kafka_us_per_record",
        "native_us_per_batch",
        "native_us_per_record",
        "records_per_batch",
        "v1_build_us_per_record",
        "v1_read_us_per_record",
        "v2_build_us_per_record",
        "v2_read_us_per_record",
    ]
    assert all(float(value) >= 0 for value in fields.values())


def test_the_measured_record_set_is_a_librdkafka_like_batch_of_100_byte_values() -> None:
    (batch,) = produced_batches(kafka_codec.kafka_record_set())
    records = decode_records(batch.data)
    assert len(records) == batch.record_count > 2000
    assert {(r.key, len(r.value or b""), r.headers) for r in records} == {(None, 100, ())}
    native = decode_records(kafka_codec.native_batch(kafka_codec.kafka_record_set()))
    assert [(r.timestamp, r.value) for r in native] == [(r.timestamp, r.value) for r in records]
