"""``RecordRouter``: the bridge's routing of a stream of PUBLISHes, with the topic-only part
kept per topic, answers exactly as ``to_log_record`` does for each one."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafkaesque.mqtt_bridge import (
    Converter,
    LogRecord,
    RecordRouter,
    json_converter,
    raw_converter,
    to_log_record,
)
from kafkaesque.protocol.mqtt import NO_PROPERTIES, MqttProperties, Publish, TopicMapping

# Rules of every kind: topic-only (cached), payload fields, templates, a format per rule, a
# dead-letter line; topics that none matches take the fallback rule.
RULES = """
phones/+/spectrum -> readings key=1
phones/+/raw -> raw-readings key=1 format=raw
phones/+/json -> json-readings key=$.device format=json fields=$.device
phones/+/+/tmpl -> t-{2} key=1
whole/# -> whole key=topic
nokey/+ -> nokey
dead-letter -> dlq
"""
TOPICS = [
    "phones/p1/spectrum",
    "phones/p2/spectrum",
    "phones/p1/raw",
    "phones/p1/json",
    "phones/p1/x/tmpl",
    "phones/p1/bad$/tmpl",
    "whole/a/b",
    "nokey/n",
    "other/x",
]
PAYLOADS = [b'{"device": "d7", "v": 1}', b"{oops", b"\xff\x00", b"", b'"s"']
PROPERTIES = [
    NO_PROPERTIES,
    MqttProperties(user_properties=(("site", "lab"),), content_type="application/json"),
    MqttProperties(message_expiry_interval=30),
]

publishes = st.builds(
    lambda topic, payload, qos, properties: Publish(
        topic, payload, qos=qos, packet_id=1 if qos else 0, properties=properties
    ),
    st.sampled_from(TOPICS),
    st.sampled_from(PAYLOADS),
    st.sampled_from([0, 1]),
    st.sampled_from(PROPERTIES),
)


@settings(max_examples=60, deadline=None)
@given(
    stream=st.lists(publishes, min_size=1, max_size=40),
    converter=st.sampled_from([raw_converter, json_converter]),
    dead_letter=st.sampled_from([None, "explicit-dlq"]),
    cache_size=st.sampled_from([1, 2, 1000]),
)
def test_the_router_answers_as_to_log_record_for_every_publish_of_a_stream(
    stream: list[Publish], converter: Converter, dead_letter: str | None, cache_size: int
) -> None:
    mapping = TopicMapping.parse(RULES)
    router = RecordRouter(mapping, converter, dead_letter, cache_size=cache_size)
    for publish in stream:
        assert router.route(publish) == to_log_record(publish, mapping, converter, dead_letter)


def test_the_same_topic_at_another_qos_or_with_properties_gets_its_own_headers() -> None:
    router = RecordRouter(TopicMapping.parse(RULES), raw_converter)
    topic = "phones/p1/spectrum"
    first = router.route(Publish(topic, b"a", qos=1, packet_id=1))
    at_qos0 = router.route(Publish(topic, b"b"))
    with_props = router.route(
        Publish(topic, b"c", qos=1, packet_id=2, properties=MqttProperties(content_type="x"))
    )
    assert first == LogRecord(
        "readings", b"a", b"p1", (("mqtt.topic", topic.encode()), ("mqtt.qos", b"1"))
    )
    assert isinstance(at_qos0, LogRecord) and dict(at_qos0.headers)["mqtt.qos"] == b"0"
    assert isinstance(with_props, LogRecord) and len(with_props.headers) == 3


def test_the_kept_routes_stay_within_the_cache_size() -> None:
    router = RecordRouter(TopicMapping.parse(RULES), raw_converter, cache_size=3)
    for n in range(50):
        router.route(Publish(f"phones/p{n}/spectrum", b"v", qos=1, packet_id=1))
        assert len(router._static) <= 3
    with pytest.raises(ValueError):
        RecordRouter(TopicMapping.parse(RULES), raw_converter, cache_size=0)
