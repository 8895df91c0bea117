"""Topic mapping: MQTT topic -> (log topic, key) for ingress, record -> MQTT topic for egress."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafkaesque.protocol import validate_topic_name
from kafkaesque.protocol.mqtt import MQTT_TOPIC_HEADER, InvalidMappingError, Route, TopicMapping

RULES = """
# the demo's rules
phones/+/spectrum -> readings key=1   # one device, one partition
phones/+/commands -> commands key=1
sensors/#         -> sensors  key=topic
alerts/+          -> alerts
"""


def test_a_rule_routes_to_its_log_topic_with_the_chosen_level_as_key() -> None:
    mapping = TopicMapping.parse(RULES)
    assert mapping.route("phones/phone-7/spectrum") == Route("readings", b"phone-7")
    assert mapping.route("sensors/a/b") == Route("sensors", b"sensors/a/b")
    assert mapping.route("alerts/fire") == Route("alerts", None)


def test_the_first_matching_rule_wins() -> None:
    mapping = TopicMapping.parse("a/+ -> first\na/b -> second\n")
    assert mapping.route("a/b").log_topic == "first"


def test_a_topic_no_rule_matches_goes_to_the_fallback_topic_keyed_by_the_topic() -> None:
    mapping = TopicMapping.parse(RULES)
    assert mapping.route("other/ünïcode topic") == Route("mqtt", "other/ünïcode topic".encode())
    assert mapping.route("$SYS/x") == Route("mqtt", b"$SYS/x")  # '#' rules never see $-topics
    assert TopicMapping.parse("default -> everything").route("x").log_topic == "everything"
    assert TopicMapping.default().route("a/b") == Route("mqtt", b"a/b")


def test_a_rule_for_the_filter_hash_is_not_a_comment() -> None:
    mapping = TopicMapping.parse("# -> all key=topic\n# phones/+/x -> commented out\n")
    assert [r.topic_filter for r in mapping.rules] == ["#"]
    assert mapping.route("x/y").log_topic == "all"


def test_egress_prefers_the_records_mqtt_topic_header() -> None:
    mapping = TopicMapping.parse(RULES)
    headers = [(MQTT_TOPIC_HEADER, b"phones/p1/spectrum")]
    assert mapping.mqtt_topic_for("readings", b"p1", headers) == "phones/p1/spectrum"


def test_egress_without_header_puts_the_key_in_the_plus_level() -> None:
    mapping = TopicMapping.parse(RULES)
    assert mapping.mqtt_topic_for("commands", b"phone-7") == "phones/phone-7/commands"
    assert mapping.mqtt_topic_for("sensors", b"sensors/a") == "sensors/a"
    assert mapping.mqtt_topic_for("mqtt", b"free/topic") == "free/topic"


@pytest.mark.parametrize(
    ("log_topic", "key"),
    [
        ("commands", None),  # nothing to put in the '+'
        ("commands", b"a/b"),  # a key holding '/' would address another topic
        ("commands", b"+"),
        ("commands", b"\xff"),  # not UTF-8
        ("alerts", b"fire"),  # the rule has no key level
        ("unmapped", b"x"),
        ("sensors", b"other/a"),  # key=topic, but the key is not under the rule's filter
    ],
)
def test_egress_gives_no_topic_when_the_record_cannot_be_mapped_back(
    log_topic: str, key: bytes | None
) -> None:
    assert TopicMapping.parse(RULES).mqtt_topic_for(log_topic, key) is None


@pytest.mark.parametrize(
    "line",
    [
        "phones/+/spectrum readings",  # no arrow
        "phones/+/spectrum ->",  # no log topic
        "phones/+/spectrum -> bad/topic",  # not a valid log topic name
        "phones/#/x -> t",  # '#' not last
        "$share/g/a -> t",  # shared subscriptions are for subscribers
        "a/+ -> t key=2",  # no such level
        "a/# -> t key=1",  # the level is under the '#'
        "a/+ -> t key=device",
        "a/+ -> t part=1",
        "a -> t key=1 extra",
        "default -> t key=0",
    ],
)
def test_a_malformed_rule_is_refused_with_its_line_number(line: str) -> None:
    with pytest.raises(InvalidMappingError, match=r"^line 2: "):
        TopicMapping.parse("ok/+ -> fine\n" + line)


def test_log_topics_lists_every_target_and_the_fallback() -> None:
    assert TopicMapping.parse(RULES).log_topics() == {
        "readings",
        "commands",
        "sensors",
        "alerts",
        "mqtt",
    }


_level = st.text(
    alphabet=st.characters(blacklist_characters="/+#\0", blacklist_categories=["Cs"]),
    min_size=1,
    max_size=12,
)


@given(device=_level)
def test_a_key_routed_from_a_plus_level_maps_back_to_the_same_topic(device: str) -> None:
    mapping = TopicMapping.parse(RULES)
    topic = f"phones/{device}/commands"
    route = mapping.route(topic)
    validate_topic_name(route.log_topic)
    assert mapping.mqtt_topic_for(route.log_topic, route.key) == topic
