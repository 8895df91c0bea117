"""Payload converters and the pure routing of the bridge (``to_log_record``)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import fastavro
import pytest

from kafkaesque.mqtt_bridge import (
    ConversionError,
    LogRecord,
    Refused,
    default_filters,
    json_converter,
    make_converter,
    raw_converter,
    shared_filter,
    subscriptions_for,
    to_log_record,
)
from kafkaesque.protocol.mqtt import MqttVersion, Publish, TopicMapping

SCHEMA = {
    "type": "record",
    "name": "Reading",
    "fields": [{"name": "device", "type": "string"}, {"name": "serial", "type": "long"}],
}
MAPPING = TopicMapping.parse(
    "phones/+/spectrum -> readings key=1\nphones/+/commands -> commands key=1"
)


def test_raw_passes_any_bytes() -> None:
    assert raw_converter(b"\xff\x00") == b"\xff\x00"


@pytest.mark.parametrize("payload", [b'{"a": 1}', b"[]", b"3", b'"x"', '{"é": 1}'.encode()])
def test_json_accepts_one_utf8_json_value_unchanged(payload: bytes) -> None:
    assert json_converter(payload) == payload


@pytest.mark.parametrize("payload", [b"{", b"", b"\xff\xfe", b"{} {}", b"NaN", b"[Infinity]"])
def test_json_refuses_what_is_not_json(payload: bytes) -> None:
    with pytest.raises(ConversionError):
        json_converter(payload)


def test_avro_encodes_json_that_matches_the_schema(tmp_path: Path) -> None:
    schema_file = tmp_path / "s.avsc"
    schema_file.write_text(json.dumps(SCHEMA))
    convert = make_converter("avro", schema_file)
    encoded = convert(b'{"device": "phone-00001", "serial": 3}')
    schema = fastavro.parse_schema(SCHEMA)
    assert fastavro.schemaless_reader(io.BytesIO(encoded), schema, None) == {
        "device": "phone-00001",
        "serial": 3,
    }
    with pytest.raises(ConversionError, match="Avro schema"):
        convert(b'{"device": "phone-00001", "serial": "three"}')
    with pytest.raises(ConversionError, match="not JSON"):
        convert(b"\x02\x04")


def test_make_converter_refuses_unknown_names_and_missing_schemas(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown converter"):
        make_converter("xml")
    with pytest.raises(ValueError, match="--avro-schema"):
        make_converter("avro")
    bad = tmp_path / "bad.avsc"
    bad.write_text('{"type": "record"}')
    with pytest.raises(ValueError, match=r"bad\.avsc"):
        make_converter("avro", bad)


def test_a_publish_becomes_a_keyed_record_with_mqtt_headers() -> None:
    publish = Publish("phones/p7/spectrum", b"{}", qos=1, packet_id=3)
    assert to_log_record(publish, MAPPING, json_converter) == LogRecord(
        "readings", b"{}", b"p7", (("mqtt.topic", b"phones/p7/spectrum"), ("mqtt.qos", b"1"))
    )


def test_an_unmatched_topic_goes_to_the_fallback_topic_keyed_by_topic() -> None:
    record = to_log_record(Publish("other/x", b"v"), MAPPING, raw_converter)
    assert isinstance(record, LogRecord)
    assert (record.topic, record.key) == ("mqtt", b"other/x")


def test_a_refused_payload_becomes_a_dead_letter_or_is_dropped() -> None:
    publish = Publish("phones/p7/spectrum", b"{oops", qos=1, packet_id=3)
    dropped = to_log_record(publish, MAPPING, json_converter)
    assert isinstance(dropped, Refused) and dropped.dead_letter is None
    refused = to_log_record(publish, MAPPING, json_converter, "dlq")
    assert isinstance(refused, Refused) and refused.dead_letter is not None
    letter = refused.dead_letter
    assert (letter.topic, letter.value, letter.key) == ("dlq", b"{oops", b"p7")
    headers = dict(letter.headers)
    assert headers["target.topic"] == b"readings"
    assert headers["error"].startswith(b"not JSON")


def test_default_filters_skip_the_topics_published_back_to_mqtt() -> None:
    assert default_filters(MAPPING, frozenset()) == ("phones/+/spectrum", "phones/+/commands")
    assert default_filters(MAPPING, frozenset({"commands"})) == ("phones/+/spectrum",)
    assert default_filters(TopicMapping.default(), frozenset()) == ("#",)
    assert shared_filter("a/+", "g") == "$share/g/a/+"
    assert shared_filter("a/+", None) == "a/+"


def test_v5_subscriptions_ask_for_no_local_and_retained_messages_only_when_new() -> None:
    plain, shared = subscriptions_for(["a/+", "$share/g/b/#"], MqttVersion.V5)
    assert (plain.qos, plain.no_local, plain.retain_handling) == (1, True, 1)
    assert (shared.qos, shared.no_local, shared.retain_handling) == (1, False, 1)
    (v311,) = subscriptions_for(["a/+"], MqttVersion.V311)
    assert (v311.qos, v311.no_local, v311.retain_handling) == (1, False, 0)
