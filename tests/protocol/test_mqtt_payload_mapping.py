"""Payload-aware mapping rules (issue 38 point 5): keys, log topics and kept fields from a JSON
payload, a converter per rule, and every payload either mapped or unmappable, never a crash."""

from __future__ import annotations

import io
import json
from pathlib import Path

import fastavro
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafkaesque.protocol import validate_topic_name
from kafkaesque.protocol.mqtt import (
    InvalidMappingError,
    JsonPath,
    Mapped,
    Route,
    TopicMapping,
    Unmappable,
    json_converter,
)

RULES = """
sensors/+/data   -> readings  key=$.device.id  fields=t,device.id
plants/+/+       -> plant-{1}  key=2
events/#         -> events-{$.kind}  key=$.seq  format=json
blobs/#          -> blobs  format=raw
phones/+/spectrum -> spectrum key=1
dead-letter      -> bad-input
"""

READING = b'{"device": {"id": "d-7", "fw": "1.2"}, "t": 21.5, "noise": [1, 2, 3]}'


def test_the_key_comes_from_a_payload_field_and_only_the_kept_fields_stay() -> None:
    mapping = TopicMapping.parse(RULES)
    mapped = mapping.apply("sensors/s1/data", READING)
    assert isinstance(mapped, Mapped)
    assert (mapped.log_topic, mapped.key) == ("readings", b"d-7")
    assert json.loads(mapped.value) == {"t": 21.5, "device": {"id": "d-7"}}
    assert mapping.dead_letter_topic == "bad-input"


def test_the_log_topic_comes_from_a_topic_level_or_a_payload_field() -> None:
    mapping = TopicMapping.parse(RULES)
    assert mapping.apply("plants/p3/pump", b"\xff raw") == Mapped("plant-p3", b"pump", b"\xff raw")
    assert mapping.route("plants/p3/pump") == Route("plant-p3", b"pump")
    event = b'{"kind": "door", "seq": 12}'
    assert mapping.apply("events/a/b", event) == Mapped("events-door", b"12", event)


def test_numbers_are_keys_as_json_writes_them_and_indexes_reach_into_arrays() -> None:
    mapping = TopicMapping.parse("a/# -> a key=$.r[1].n")
    assert mapping.apply("a/x", b'{"r": [{}, {"n": 7}]}') == Mapped(
        "a", b"7", b'{"r": [{}, {"n": 7}]}'
    )
    assert JsonPath.parse("$.r[1].n").get({"r": [{}, {"n": 1.5}]}) == 1.5


@pytest.mark.parametrize(
    ("topic", "payload", "reason"),
    [
        ("sensors/s1/data", b"not json", "not JSON"),
        ("sensors/s1/data", b"\xff\xfe", "not UTF-8"),
        ("sensors/s1/data", b'{"t": 1}', "no key field $.device.id"),
        ("sensors/s1/data", b'{"device": {"id": null}}', "not a string or a number"),
        ("sensors/s1/data", b"[1, 2]", "no key field"),
        ("events/x", b'{"kind": "a b", "seq": 1}', "log topic 'events-a b'"),
        ("events/x", b'{"seq": 1}', "no field $.kind"),
        ("events/x", b"NaN", "not JSON"),
        ("plants/p 3/pump", b"", "log topic 'plant-p 3'"),
    ],
)
def test_what_cannot_be_mapped_says_why_and_where_it_was_going(
    topic: str, payload: bytes, reason: str
) -> None:
    mapped = TopicMapping.parse(RULES).apply(topic, payload)
    assert isinstance(mapped, Unmappable)
    assert reason in mapped.reason
    assert mapped.target.startswith(("readings", "events-", "plant-"))


def test_a_topic_level_that_makes_no_log_topic_name_has_no_route() -> None:
    mapping = TopicMapping.parse(RULES)
    assert isinstance(mapping.static_route("plants/p 3/pump"), Unmappable)
    assert mapping.static_route("sensors/s1/data") is None  # it reads the payload
    with pytest.raises(ValueError, match="reads the payload"):
        mapping.route("sensors/s1/data")


def test_a_rule_format_overrides_the_hosts_converter_and_without_one_the_hosts_applies() -> None:
    mapping = TopicMapping.parse(RULES)
    assert mapping.apply("blobs/1", b"\x00binary", json_converter) == Mapped(
        "blobs", None, b"\x00binary"
    )
    assert isinstance(mapping.apply("phones/p/spectrum", b"\x00", json_converter), Unmappable)
    assert mapping.apply("phones/p/spectrum", b"\x00") == Mapped("spectrum", b"p", b"\x00")


def test_an_avro_rule_stores_the_kept_fields_under_its_schema(tmp_path: Path) -> None:
    schema = {
        "type": "record",
        "name": "Reading",
        "fields": [{"name": "id", "type": "string"}, {"name": "t", "type": "double"}],
    }
    (tmp_path / "reading.avsc").write_text(json.dumps(schema))
    mapping = TopicMapping.parse(
        "r/+ -> r key=$.id fields=id,t format=avro schema=reading.avsc", tmp_path
    )
    mapped = mapping.apply("r/1", b'{"id": "d1", "t": 2.5, "extra": true}')
    assert isinstance(mapped, Mapped) and mapped.key == b"d1"
    decoded = fastavro.schemaless_reader(io.BytesIO(mapped.value), fastavro.parse_schema(schema))
    assert decoded == {"id": "d1", "t": 2.5}
    refused = mapping.apply("r/1", b'{"id": "d1", "t": "warm"}')
    assert isinstance(refused, Unmappable) and "Avro schema" in refused.reason


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("a/+ -> a key=$", "names no field"),
        ("a/+ -> a key=$.a..b", "expected '.name' or '[N]'"),
        ("a/+ -> a key=device", "key must be"),
        ("a/+ -> a fields=a[0]", "not array elements"),
        ("a/+ -> a fields=a format=raw", "not with format=raw"),
        ("a/+ -> a format=xml", "format must be one of"),
        ("a/+ -> a format=avro", "needs schema=FILE"),
        ("a/+ -> a format=avro schema=missing.avsc", "missing.avsc"),
        ("a/+ -> a schema=x.avsc", "goes with format=avro"),
        ("a/+ -> a-{2}", "log topic level 2"),
        ("a/# -> a-{1}", "before any '#'"),
        ("a/+ -> a-{x}", "expected {N} or {$.field}"),
        ("a/+ -> a{$.b}!", "log topic"),
        ("a/+ -> a key=1 key=1", "given twice"),
        ("a/+ -> a colour=red", "unknown option"),
        ("dead-letter -> bad key=1", "takes no options"),
        ("dead-letter -> no way", "unknown option"),
    ],
)
def test_a_bad_option_is_refused_naming_the_line(line: str, problem: str) -> None:
    with pytest.raises(InvalidMappingError, match="line 2") as caught:
        TopicMapping.parse(f"x -> x\n{line}\n")
    assert problem in str(caught.value)


def test_rules_without_payload_options_map_as_before() -> None:
    mapping = TopicMapping.parse("phones/+/spectrum -> readings key=1\n")
    assert mapping.apply("phones/p1/spectrum", b"\xff") == Mapped("readings", b"p1", b"\xff")
    assert mapping.dead_letter_topic is None
    assert mapping.log_topics() == {"readings", "mqtt"}
    assert TopicMapping.parse(RULES).log_topics() == {"readings", "blobs", "spectrum", "mqtt"}


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(["id", "t", "kind", "device", "seq", "r"]), inner)
    ),
    max_leaves=12,
)
_payloads = st.one_of(
    st.binary(max_size=64),
    _json.map(lambda d: json.dumps(d).encode()),
    st.sampled_from([b"[" * 5000, b"1" * 5000, b"Infinity", b'{"kind": "\\ud800"}']),
)
_topics = st.sampled_from(
    ["sensors/s/data", "plants/a/b", "plants/a b/c", "events/x/y", "blobs/1", "phones/p/spectrum"]
)


_AVRO_RULE = "avro/+ -> avro key=$.id fields=id,t,tags format=avro schema=any.avsc\n"
_AVRO_SCHEMA = {
    "type": "record",
    "name": "Any",
    "fields": [
        {"name": "id", "type": ["null", "string", "long"], "default": None},
        {"name": "t", "type": ["null", "double", "boolean"], "default": None},
        {"name": "tags", "type": {"type": "array", "items": "string"}, "default": []},
    ],
}


@pytest.fixture(scope="module")
def property_mapping(tmp_path_factory: pytest.TempPathFactory) -> TopicMapping:
    folder = tmp_path_factory.mktemp("avro")
    (folder / "any.avsc").write_text(json.dumps(_AVRO_SCHEMA))
    return TopicMapping.parse(_AVRO_RULE + RULES, folder)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(topic=st.one_of(_topics, st.just("avro/1")), payload=_payloads)
def test_any_payload_is_mapped_or_unmappable_never_an_exception(
    property_mapping: TopicMapping, topic: str, payload: bytes
) -> None:
    mapping = property_mapping
    for converter in (None, json_converter):
        mapped = mapping.apply(topic, payload, converter)
        if isinstance(mapped, Mapped):
            validate_topic_name(mapped.log_topic)
        else:
            assert isinstance(mapped, Unmappable) and mapped.reason
