"""An MQTT 5 message's properties as record headers, and back as the properties of a delivery."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafkaesque.protocol.mqtt import (
    NO_PROPERTIES,
    MqttProperties,
    MqttVersion,
    Publish,
    delivery_properties,
    encode_mqtt,
    is_forwarded_header,
    message_headers,
)

# What MQTT may carry in a string: any UTF-8 but U+0000 (and no surrogates).
mqtt_text = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"))
topic_names = st.from_regex(r"[a-z0-9]{1,8}(/[a-z0-9]{0,8}){0,3}", fullmatch=True)


@st.composite
def message_properties(draw: st.DrawFn) -> MqttProperties:
    return MqttProperties(
        payload_format_indicator=draw(st.none() | st.sampled_from([0, 1])),
        message_expiry_interval=draw(st.none() | st.integers(0, 2**32 - 1)),
        content_type=draw(st.none() | mqtt_text),
        response_topic=draw(st.none() | topic_names),
        correlation_data=draw(st.none() | st.binary(max_size=64)),
        user_properties=tuple(draw(st.lists(st.tuples(mqtt_text, mqtt_text), max_size=5))),
    )


@given(message_properties(), st.lists(st.integers(1, 2**28 - 1), max_size=3))
def test_a_delivery_carries_the_properties_the_publisher_sent(
    properties: MqttProperties, identifiers: list[int]
) -> None:
    headers = message_headers(properties)
    forwarded = [(name, value) for name, value in headers if is_forwarded_header(name)]
    remaining = properties.message_expiry_interval
    delivered = delivery_properties(forwarded, remaining, tuple(identifiers))
    assert delivered == MqttProperties(
        payload_format_indicator=properties.payload_format_indicator,
        message_expiry_interval=remaining,
        content_type=properties.content_type,
        response_topic=properties.response_topic,
        correlation_data=properties.correlation_data,
        subscription_identifiers=tuple(identifiers),
        user_properties=properties.user_properties,
    )
    # And the PUBLISH that carries them can be encoded.
    encode_mqtt(Publish("t", b"x", 1, packet_id=1, properties=delivered), MqttVersion.V5)


def test_no_properties_make_no_headers() -> None:
    assert message_headers(NO_PROPERTIES) == ()


def test_the_expiry_is_kept_but_not_forwarded_as_it_is() -> None:
    # The delivery carries what remains of the interval, computed from the record's timestamp.
    assert message_headers(MqttProperties(message_expiry_interval=30)) == (("mqtt.expiry", b"30"),)
    assert not is_forwarded_header("mqtt.expiry")
    for name in ("mqtt.topic", "mqtt.qos", "mqtt.client", "mqtt.pid", "mqtt.retain", "unit"):
        assert not is_forwarded_header(name)


@pytest.mark.parametrize(
    "header",
    [
        ("mqtt.content-type", b"\xff\xfe"),  # not UTF-8
        ("mqtt.content-type", b"a\x00b"),  # U+0000 (MQTT-1.5.4-2)
        ("mqtt.response-topic", b"replies/+"),  # wildcards (MQTT-3.3.2-14)
        ("mqtt.response-topic", b""),
        ("mqtt.format", b"2"),
        ("mqtt.format", b"yes"),
        ("mqtt.correlation", b"x" * 65_536),  # longer than an MQTT binary field
        ("mqtt.user.site", b"\xc3"),
        ("mqtt.user.a\x00b", b"x"),
        ("mqtt.user." + "k" * 65_536, b"x"),
    ],
)
def test_a_header_mqtt_cannot_carry_is_left_out(header: tuple[str, bytes]) -> None:
    """A controller's record may carry anything; the delivery goes out without that header."""
    good = ("mqtt.user.ok", b"yes")
    properties = delivery_properties([header, good])
    assert properties == MqttProperties(user_properties=(("ok", "yes"),))
    encode_mqtt(Publish("t", b"x", properties=properties), MqttVersion.V5)


def test_a_controllers_record_asks_a_device_for_a_reply() -> None:
    """MQTT 5 request/response, from headers a controller sets on a record (PUBS or client)."""
    properties = delivery_properties(
        [
            ("mqtt.response-topic", b"controller/replies"),
            ("mqtt.correlation", b"cmd-42"),
            ("mqtt.user.priority", b"high"),
        ]
    )
    assert properties.response_topic == "controller/replies"
    assert properties.correlation_data == b"cmd-42"
    assert properties.user_properties == (("priority", "high"),)
