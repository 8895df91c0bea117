"""The sans-I/O MQTT codec: round trips, framing, spec violations, fuzzing, and paho interop.

Tests that check a normative statement carry its id in their name or docstring (3.1.1 numbering
unless marked v5). Raw frames are written by hand here, from the spec's layouts, so the decoder
is never checked only against our own encoder.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from kafkaesque.protocol.mqtt import (
    MQTT_NEED_DATA,
    NO_PROPERTIES,
    Auth,
    Connack,
    ConnackReturnCode,
    Connect,
    Disconnect,
    MqttDecoder,
    MqttLocalProtocolError,
    MqttPacket,
    MqttProperties,
    MqttProtocolError,
    MqttReasonCode,
    MqttSubscription,
    MqttUnsupportedProtocolError,
    MqttVersion,
    Pingreq,
    Pingresp,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
    Will,
    encode_mqtt,
    encode_mqtt_puback,
    is_valid_mqtt_topic_filter,
    v311_connack_code,
)
from kafkaesque.protocol.mqtt._wire import encode_vbi

V31, V311, V5 = MqttVersion.V31, MqttVersion.V311, MqttVersion.V5
MALFORMED = MqttReasonCode.MALFORMED_PACKET
PROTOCOL_ERROR = MqttReasonCode.PROTOCOL_ERROR

# --- raw frame helpers ------------------------------------------------------------------------


def vbi(value: int) -> bytes:
    """A variable byte integer, written independently of the codec (v5 §1.5.5)."""
    out = bytearray()
    while True:
        value, byte = divmod(value, 128)
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def frame(first: int, body: bytes) -> bytes:
    return bytes((first,)) + vbi(len(body)) + body


def s(text: bytes) -> bytes:
    """A length-prefixed string or binary field."""
    return len(text).to_bytes(2, "big") + text


def connect_frame(
    level: int = 4, flags: int = 0x02, payload: bytes = s(b"dev"), name: bytes = b"MQTT"
) -> bytes:
    props = b"\x00" if level == 5 else b""
    return frame(0x10, s(name) + bytes((level, flags)) + b"\x00\x3c" + props + payload)


def server_decoder(version: MqttVersion = V311, max_packet_size: int = 1024 * 1024) -> MqttDecoder:
    """A server-side decoder that has already read a CONNECT of ``version``."""
    decoder = MqttDecoder(max_packet_size=max_packet_size)
    decoder.feed(encode_mqtt(Connect("dev"), version))
    assert isinstance(decoder.next_packet(), Connect)
    assert decoder.version == version
    return decoder


def expect_error(
    decoder: MqttDecoder, data: bytes, statement: str, reason: int = MALFORMED
) -> MqttProtocolError:
    decoder.feed(data)
    with pytest.raises(MqttProtocolError) as info:
        decoder.decode_many()
    error = info.value
    assert error.statement == statement, str(error)
    assert error.reason_code == reason, str(error)
    assert str(error).startswith(statement)
    return error


def decode_all(
    decoder: MqttDecoder, pieces: Iterable[bytes], many: bool = True
) -> list[MqttPacket]:
    out: list[MqttPacket] = []
    for piece in pieces:
        decoder.feed(piece)
        if many:
            out.extend(decoder.decode_many())
        else:
            while (packet := decoder.next_packet()) is not MQTT_NEED_DATA:
                out.append(packet)
    return out


# --- strategies -----------------------------------------------------------------------------

WILL = "will"
CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = range(1, 8)
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT, AUTH = range(8, 16)
ALL_KINDS: set[int | str] = {WILL, *range(1, 16)} - {PINGREQ, PINGRESP}

u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFF_FFFF)
flag = st.sampled_from([0, 1])
text = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=12)
binary = st.binary(max_size=24)
_levels = st.sampled_from(["a", "b", "", "$SYS", "é", "sensor-1", " "])
topic_names = st.lists(_levels, min_size=1, max_size=4).map("/".join).filter(bool)
topic_filters = st.builds(
    lambda levels, tail: "/".join(levels + tail),
    st.lists(_levels | st.just("+"), min_size=1, max_size=4),
    st.sampled_from([[], ["#"]]),
).filter(bool)

# The v5 property table (v5 §2.2.2.2, Table 2-4), restated here independently of the codec:
# name -> (identifier, packets that may carry it, a strategy for valid values).
PROPERTY_TABLE: dict[str, tuple[int, set[int | str], st.SearchStrategy[object]]] = {
    "payload_format_indicator": (0x01, {PUBLISH, WILL}, flag),
    "message_expiry_interval": (0x02, {PUBLISH, WILL}, u32),
    "content_type": (0x03, {PUBLISH, WILL}, text),
    "response_topic": (0x08, {PUBLISH, WILL}, topic_names),
    "correlation_data": (0x09, {PUBLISH, WILL}, binary),
    "subscription_identifiers": (
        0x0B,
        {PUBLISH, SUBSCRIBE},
        st.lists(st.integers(1, 268_435_455), min_size=1, max_size=3).map(tuple),
    ),
    "session_expiry_interval": (0x11, {CONNECT, CONNACK, DISCONNECT}, u32),
    "assigned_client_identifier": (0x12, {CONNACK}, text),
    "server_keep_alive": (0x13, {CONNACK}, u16),
    "authentication_method": (0x15, {CONNECT, CONNACK, AUTH}, text),
    "authentication_data": (0x16, {CONNECT, CONNACK, AUTH}, binary),
    "request_problem_information": (0x17, {CONNECT}, flag),
    "will_delay_interval": (0x18, {WILL}, u32),
    "request_response_information": (0x19, {CONNECT}, flag),
    "response_information": (0x1A, {CONNACK}, text),
    "server_reference": (0x1C, {CONNACK, DISCONNECT}, text),
    "reason_string": (
        0x1F,
        {CONNACK, PUBACK, PUBREC, PUBREL, PUBCOMP, SUBACK, UNSUBACK, DISCONNECT, AUTH},
        text,
    ),
    "receive_maximum": (0x21, {CONNECT, CONNACK}, st.integers(1, 0xFFFF)),
    "topic_alias_maximum": (0x22, {CONNECT, CONNACK}, u16),
    "topic_alias": (0x23, {PUBLISH}, st.integers(1, 0xFFFF)),
    "maximum_qos": (0x24, {CONNACK}, flag),
    "retain_available": (0x25, {CONNACK}, flag),
    "user_properties": (
        0x26,
        ALL_KINDS,
        st.lists(st.tuples(text, text), min_size=1, max_size=3).map(tuple),
    ),
    "maximum_packet_size": (0x27, {CONNECT, CONNACK}, st.integers(1, 0xFFFF_FFFF)),
    "wildcard_subscription_available": (0x28, {CONNACK}, flag),
    "subscription_identifier_available": (0x29, {CONNACK}, flag),
    "shared_subscription_available": (0x2A, {CONNACK}, flag),
}


@st.composite
def properties(draw: st.DrawFn, kind: int | str, *, from_client: bool = False) -> MqttProperties:
    optional = {
        name: strategy for name, (_, kinds, strategy) in PROPERTY_TABLE.items() if kind in kinds
    }
    if kind == SUBSCRIBE:
        optional["subscription_identifiers"] = st.tuples(st.integers(1, 268_435_455))
    if kind == PUBLISH and from_client:
        del optional["subscription_identifiers"]  # v5 MQTT-3.3.4-6
    if kind == CONNECT and "authentication_data" in optional:
        optional["authentication_method"] = text  # data needs a method (v5 §3.1.2.11.10)
    values: dict[str, Any] = draw(st.fixed_dictionaries({}, optional=optional))
    if kind == CONNECT and "authentication_data" in values:
        values.setdefault("authentication_method", "m")
    return MqttProperties(**values) if values else NO_PROPERTIES


def props_for(
    version: MqttVersion, kind: int | str, from_client: bool = False
) -> st.SearchStrategy[MqttProperties]:
    return properties(kind, from_client=from_client) if version == V5 else st.just(NO_PROPERTIES)


packet_ids = st.integers(1, 0xFFFF)


@st.composite
def connects(draw: st.DrawFn, version: MqttVersion) -> Connect:
    username = draw(st.none() | text)
    password = draw(st.none() | binary) if username is not None or version == V5 else None
    will = None
    if draw(st.booleans()):
        will = Will(
            draw(topic_names),
            draw(binary),
            draw(st.integers(0, 2)),
            draw(st.booleans()),
            draw(props_for(version, WILL)),
        )
    return Connect(
        draw(text),
        draw(st.booleans()),
        draw(u16),
        username,
        password,
        will,
        draw(props_for(version, CONNECT)),
    )


@st.composite
def publishes(draw: st.DrawFn, version: MqttVersion, from_client: bool) -> Publish:
    qos = draw(st.integers(0, 2))
    props = draw(props_for(version, PUBLISH, from_client))
    topic = draw(topic_names)
    if props.topic_alias is not None and draw(st.booleans()):
        topic = ""  # v5: the alias stands for the topic
    return Publish(
        topic,
        draw(st.binary(max_size=300)),
        qos,
        draw(st.booleans()),
        draw(st.booleans()) if qos else False,
        draw(packet_ids) if qos else 0,
        props,
    )


V5_CODES = {
    CONNACK: [0x00, *range(0x80, 0x8B), 0x8C, 0x90, 0x95, 0x97, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9F],
    PUBACK: [0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99],
    PUBREL: [0x00, 0x92],
    SUBACK: [0x00, 0x01, 0x02, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2],
    UNSUBACK: [0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91],
    DISCONNECT: [0x00, 0x04, *range(0x80, 0x84), 0x87, 0x89, *range(0x8B, 0xA3)],
    AUTH: [0x00, 0x18, 0x19],
}
V5_CODES[PUBREC] = V5_CODES[PUBACK]
V5_CODES[PUBCOMP] = V5_CODES[PUBREL]


def acks(
    cls: type[Puback | Pubrec | Pubrel | Pubcomp], kind: int, version: MqttVersion
) -> st.SearchStrategy[MqttPacket]:
    if version != V5:
        return st.builds(cls, packet_ids)
    return st.builds(cls, packet_ids, st.sampled_from(V5_CODES[kind]), properties(kind))


@st.composite
def subscribes(draw: st.DrawFn, version: MqttVersion) -> Subscribe:
    subs = []
    for topic_filter in draw(st.lists(topic_filters, min_size=1, max_size=4)):
        if version == V5:
            sub = MqttSubscription(
                topic_filter,
                draw(st.integers(0, 2)),
                draw(st.booleans()),
                draw(st.booleans()),
                draw(st.integers(0, 2)),
            )
        else:
            sub = MqttSubscription(topic_filter, draw(st.integers(0, 2)))
        subs.append(sub)
    return Subscribe(draw(packet_ids), tuple(subs), draw(props_for(version, SUBSCRIBE)))


def client_packets(version: MqttVersion) -> st.SearchStrategy[MqttPacket]:
    """Any packet a client sends after its CONNECT."""
    options: list[st.SearchStrategy[MqttPacket]] = [
        publishes(version, from_client=True),
        acks(Puback, PUBACK, version),
        acks(Pubrec, PUBREC, version),
        acks(Pubrel, PUBREL, version),
        acks(Pubcomp, PUBCOMP, version),
        subscribes(version),
        st.builds(
            Unsubscribe,
            packet_ids,
            st.lists(topic_filters, min_size=1, max_size=4).map(tuple),
            props_for(version, UNSUBSCRIBE),
        ),
        st.just(Pingreq()),
    ]
    if version == V5:
        options.append(
            st.builds(Disconnect, st.sampled_from(V5_CODES[DISCONNECT]), properties(DISCONNECT))
        )
        options.append(st.builds(Auth, st.sampled_from(V5_CODES[AUTH]), properties(AUTH)))
    else:
        options.append(st.just(Disconnect()))
    return st.one_of(options)


@st.composite
def connacks(draw: st.DrawFn, version: MqttVersion) -> Connack:
    code = draw(st.sampled_from(V5_CODES[CONNACK]) if version == V5 else st.integers(0, 5))
    present = draw(st.booleans()) if code == 0 else False
    return Connack(present, code, draw(props_for(version, CONNACK)))


def server_packets(version: MqttVersion) -> st.SearchStrategy[MqttPacket]:
    """Any packet a server sends."""
    suback_codes = V5_CODES[SUBACK] if version == V5 else [0, 1, 2, 0x80]
    options: list[st.SearchStrategy[MqttPacket]] = [
        connacks(version),
        publishes(version, from_client=False),
        acks(Puback, PUBACK, version),
        acks(Pubrec, PUBREC, version),
        acks(Pubrel, PUBREL, version),
        acks(Pubcomp, PUBCOMP, version),
        st.builds(
            Suback,
            packet_ids,
            st.lists(st.sampled_from(suback_codes), min_size=1, max_size=4).map(tuple),
            props_for(version, SUBACK),
        ),
        st.just(Pingresp()),
    ]
    if version == V5:
        options += [
            st.builds(
                Unsuback,
                packet_ids,
                st.lists(st.sampled_from(V5_CODES[UNSUBACK]), min_size=1, max_size=4).map(tuple),
                properties(UNSUBACK),
            ),
            st.builds(Disconnect, st.sampled_from(V5_CODES[DISCONNECT]), properties(DISCONNECT)),
            st.builds(Auth, st.sampled_from(V5_CODES[AUTH]), properties(AUTH)),
        ]
    else:
        options.append(st.builds(Unsuback, packet_ids))
    return st.one_of(options)


versions = st.sampled_from([V31, V311, V5])


@st.composite
def streams(draw: st.DrawFn) -> tuple[MqttVersion, bool, list[MqttPacket]]:
    """(version, server_side, packets): what one side of a connection receives."""
    version = draw(versions)
    server_side = draw(st.booleans())
    if server_side:
        packets = [draw(connects(version)), *draw(st.lists(client_packets(version), max_size=6))]
    else:
        packets = draw(st.lists(server_packets(version), min_size=1, max_size=6))
    return version, server_side, packets


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({cut % (len(data) + 1) for cut in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


# --- round trips ------------------------------------------------------------------------------


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(
    stream=streams(),
    cuts=st.lists(st.integers(0, 10_000), max_size=12),
    many=st.booleans(),
)
def test_round_trip_every_packet_type_split_anywhere(
    stream: tuple[MqttVersion, bool, list[MqttPacket]], cuts: list[int], many: bool
) -> None:
    """encode -> bytes split at random points -> feed the pieces -> the same packets, in order."""
    version, server_side, packets = stream
    wire = b"".join(encode_mqtt(packet, version) for packet in packets)
    decoder = MqttDecoder(server_side=server_side, version=None if server_side else version)
    assert decode_all(decoder, split(wire, cuts), many) == packets
    assert decoder.buffered == 0
    assert decoder.version == version
    # Re-encoding what was decoded gives the same bytes: encoding is a function of the value.
    assert b"".join(encode_mqtt(packet, version) for packet in packets) == wire


def test_every_packet_type_is_covered_by_the_round_trip() -> None:
    """The strategies above generate all 15 packet types (3.1.1 and v5 between them)."""
    seen: set[str] = set()

    @settings(max_examples=200, database=None, derandomize=True)
    @given(stream=streams())
    def collect(stream: tuple[MqttVersion, bool, list[MqttPacket]]) -> None:
        seen.update(type(packet).__name__ for packet in stream[2])

    collect()
    assert len(seen) == 15, seen


def test_byte_at_a_time() -> None:
    """Feeding one byte at a time yields each packet exactly when its last byte arrives."""
    packets: list[MqttPacket] = [
        Connect("c", keep_alive=5),
        Publish("t/" + "x" * 200, b"p" * 20_000, qos=1, packet_id=9),
        Puback(9),
        Pingreq(),
    ]
    decoder = MqttDecoder()
    out: list[MqttPacket] = []
    wire = b"".join(encode_mqtt(packet, V311) for packet in packets)
    for index in range(len(wire)):
        decoder.feed(wire[index : index + 1])
        packet = decoder.next_packet()
        if packet is not MQTT_NEED_DATA:
            out.append(packet)
            assert decoder.buffered == 0
    assert out == packets


def test_decode_many_returns_all_complete_packets_and_keeps_the_partial_one() -> None:
    acks_wire = b"".join(encode_mqtt_puback(packet_id) for packet_id in range(1, 101))
    decoder = server_decoder()
    partial = encode_mqtt(Publish("a", b"xyz"), V311)
    decoder.feed(acks_wire + partial[:3])
    assert decoder.decode_many() == [Puback(i) for i in range(1, 101)]
    assert decoder.buffered == 3
    assert decoder.decode_many() == []
    decoder.feed(partial[3:])
    assert decoder.decode_many() == [Publish("a", b"xyz")]


@pytest.mark.parametrize(
    ("packet", "version", "wire"),
    [
        # Hand-assembled from the spec's figures, not from our encoder.
        (Connect("", keep_alive=60), V311, b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c\x00\x00"),
        (Connect("", keep_alive=60), V5, b"\x10\x0d\x00\x04MQTT\x05\x02\x00\x3c\x00\x00\x00"),
        (Connect("a", False), V31, b"\x10\x0f\x00\x06MQIsdp\x03\x00\x00\x00\x00\x01a"),
        (
            Connect("a", username="u", password=b"p", will=Will("w", b"!", 1, True)),
            V311,
            b"\x10\x19\x00\x04MQTT\x04\xee\x00\x00\x00\x01a\x00\x01w\x00\x01!\x00\x01u\x00\x01p",
        ),
        (Connack(True, 0), V311, b"\x20\x02\x01\x00"),
        (Connack(False, 0x87), V5, b"\x20\x03\x00\x87\x00"),
        (Publish("a/b", b"hi"), V311, b"\x30\x07\x00\x03a/bhi"),
        (Publish("a/b", b"hi", 2, True, True, 10), V311, b"\x3d\x09\x00\x03a/b\x00\x0ahi"),
        (Publish("a", b"", 1, packet_id=1), V5, b"\x32\x06\x00\x01a\x00\x01\x00"),
        (
            Publish(
                "a", b"", properties=MqttProperties(topic_alias=5, user_properties=(("k", "v"),))
            ),
            V5,
            b"\x30\x0e\x00\x01a\x0a\x23\x00\x05\x26\x00\x01k\x00\x01v",
        ),
        (Puback(1), V311, b"\x40\x02\x00\x01"),
        (Puback(1, 0x10), V5, b"\x40\x03\x00\x01\x10"),
        (Pubrec(258), V311, b"\x50\x02\x01\x02"),
        (Pubrel(1), V311, b"\x62\x02\x00\x01"),
        (
            Pubcomp(1, 0x92, MqttProperties(reason_string="x")),
            V5,
            b"\x70\x08\x00\x01\x92\x04\x1f\x00\x01x",
        ),
        (Subscribe(1, (MqttSubscription("a/#", 1),)), V311, b"\x82\x08\x00\x01\x00\x03a/#\x01"),
        (
            Subscribe(2, (MqttSubscription("a", 2, True, True, 2),)),
            V5,
            b"\x82\x07\x00\x02\x00\x00\x01a\x2e",
        ),
        (Suback(1, (0, 1, 0x80)), V311, b"\x90\x05\x00\x01\x00\x01\x80"),
        (Suback(1, (0x8F,)), V5, b"\x90\x04\x00\x01\x00\x8f"),
        (Unsubscribe(3, ("a", "b/+")), V311, b"\xa2\x0a\x00\x03\x00\x01a\x00\x03b/+"),
        (Unsuback(3), V311, b"\xb0\x02\x00\x03"),
        (Unsuback(3, (0, 0x11)), V5, b"\xb0\x05\x00\x03\x00\x00\x11"),
        (Pingreq(), V311, b"\xc0\x00"),
        (Pingresp(), V5, b"\xd0\x00"),
        (Disconnect(), V311, b"\xe0\x00"),
        (Disconnect(0x04), V5, b"\xe0\x01\x04"),
        (
            Auth(0x18, MqttProperties(authentication_method="m")),
            V5,
            b"\xf0\x06\x18\x04\x15\x00\x01m",
        ),
    ],
)
def test_known_wire_forms(packet: MqttPacket, version: MqttVersion, wire: bytes) -> None:
    """Byte-exact encodings, and the decoder reading them back."""
    assert encode_mqtt(packet, version) == wire
    client_kinds = (Publish, Puback, Pubrec, Pubrel, Pubcomp, Subscribe, Unsubscribe, Pingreq)
    server_side = isinstance(packet, (*client_kinds, Disconnect, Auth))
    if isinstance(packet, Connect):
        decoder = MqttDecoder()
    elif server_side:
        decoder = server_decoder(version)
    else:
        decoder = MqttDecoder(server_side=False, version=version)
    decoder.feed(wire)
    assert decoder.decode_many() == [packet]


@pytest.mark.parametrize(
    ("value", "wire"),
    [
        (0, b"\x00"),
        (127, b"\x7f"),
        (128, b"\x80\x01"),
        (16_383, b"\xff\x7f"),
        (16_384, b"\x80\x80\x01"),
        (2_097_151, b"\xff\xff\x7f"),
        (2_097_152, b"\x80\x80\x80\x01"),
        (268_435_455, b"\xff\xff\xff\x7f"),
    ],
)
def test_remaining_length_boundaries(value: int, wire: bytes) -> None:
    """The boundary values of 3.1.1 Table 2.4 / v5 Table 1-1, both ways."""
    assert encode_vbi(value) == wire == vbi(value)
    decoder = server_decoder(max_packet_size=268_435_460)
    decoder.feed(b"\x30" + wire)
    if value:
        assert decoder.next_packet() is MQTT_NEED_DATA  # waits for the body, does not raise
        assert decoder.buffered == 1 + len(wire)


def test_short_v5_acks_and_disconnect_forms() -> None:
    """v5 §3.4.2.1, §3.14.2.1: reason code and properties may be omitted when not needed."""
    decoder = MqttDecoder(server_side=False, version=V5)
    decoder.feed(b"\x40\x02\x00\x07" + b"\x50\x03\x00\x07\x10" + b"\xe0\x00" + b"\xf0\x00")
    decoder.feed(b"\x70\x04\x00\x07\x92\x00" + b"\xe0\x02\x8b\x00")
    assert decoder.decode_many() == [
        Puback(7),
        Pubrec(7, 0x10),
        Disconnect(),
        Auth(),
        Pubcomp(7, 0x92),
        Disconnect(0x8B),
    ]


def test_client_reads_a_311_refusal_while_speaking_v5() -> None:
    """A 3.1.1-only server answers a v5 CONNECT with the 2-byte CONNACK 0x01 (MQTT-3.1.2-2)."""
    decoder = MqttDecoder(server_side=False, version=V5)
    decoder.feed(b"\x20\x02\x00\x84")
    assert decoder.next_packet() == Connack(False, MqttReasonCode.UNSUPPORTED_PROTOCOL_VERSION)


def test_encode_mqtt_puback_matches_encode() -> None:
    for packet_id in (1, 255, 256, 65535):
        assert encode_mqtt_puback(packet_id) == encode_mqtt(Puback(packet_id), V5)
        assert encode_mqtt_puback(packet_id) == encode_mqtt(Puback(packet_id), V311)
    for bad in (0, 65536, -1):
        with pytest.raises(MqttLocalProtocolError):
            encode_mqtt_puback(bad)


# --- fixed header violations -----------------------------------------------------------------

_FIXED_FLAGS = {
    1: 0,
    2: 0,
    4: 0,
    5: 0,
    6: 2,
    7: 0,
    8: 2,
    9: 0,
    10: 2,
    11: 0,
    12: 0,
    13: 0,
    14: 0,
    15: 0,
}
_FLAG_STATEMENTS = {6: "MQTT-3.6.1-1", 8: "MQTT-3.8.1-1", 10: "MQTT-3.10.1-1", 14: "MQTT-3.14.1-1"}
_FLAG_STATEMENTS[15] = "v5 MQTT-3.15.1-1"


@pytest.mark.parametrize("ptype", sorted(_FIXED_FLAGS))
def test_reserved_flags_rejected_before_the_body(ptype: int) -> None:
    """MQTT-2.2.2-1/-2 (v5 MQTT-2.1.3-1): every wrong flag nibble of every type is malformed,
    detected from the first two bytes. PUBREL/SUBSCRIBE/UNSUBSCRIBE need 0010 (MQTT-3.6.1-1,
    MQTT-3.8.1-1, MQTT-3.10.1-1); the rest 0000 (DISCONNECT: MQTT-3.14.1-1)."""
    server = ptype in {1, 4, 5, 6, 7, 8, 10, 12, 14, 15}
    for flags in range(16):
        if flags == _FIXED_FLAGS[ptype]:
            continue
        if ptype == 1:
            decoder = MqttDecoder()
        elif server:
            decoder = server_decoder(V5)
        else:
            decoder = MqttDecoder(server_side=False, version=V5)
        statement = _FLAG_STATEMENTS.get(ptype, "MQTT-2.2.2-2")
        expect_error(decoder, bytes((ptype << 4 | flags, 0x7F)), statement)


def test_publish_qos_3_is_malformed_3_3_1_4() -> None:
    """MQTT-3.3.1-4: both QoS bits set; rejected from the first byte."""
    expect_error(server_decoder(), b"\x36\x7f", "MQTT-3.3.1-4")


def test_publish_qos_0_with_dup_is_malformed_3_3_1_2() -> None:
    """MQTT-3.3.1-2: DUP must be 0 for QoS 0."""
    expect_error(server_decoder(), b"\x38\x05\x00\x01ahi", "MQTT-3.3.1-2")


def test_remaining_length_fifth_byte_is_malformed() -> None:
    """3.1.1 §2.2.3 / v5 §1.5.5: at most 4 length bytes; raised before any body byte."""
    expect_error(server_decoder(), b"\x30\xff\xff\xff\xff\x01", "§2.2.3")


@pytest.mark.parametrize("wire", [b"\xc0\x80\x00", b"\x30\x85\x80\x00", b"\x30\x80\x80\x80\x00"])
def test_remaining_length_not_minimal_is_malformed_v5_1_5_5_1(wire: bytes) -> None:
    """v5 MQTT-1.5.5-1: a length that could be written in fewer bytes is malformed."""
    expect_error(server_decoder(), wire, "v5 MQTT-1.5.5-1")


def test_oversized_packet_raises_as_soon_as_its_length_is_known() -> None:
    """v5 MQTT-3.2.2-15 / §3.1.2.11.4: 0x95 Packet Too Large, before the body is buffered."""
    decoder = server_decoder(max_packet_size=1000)
    decoder.feed(b"\x30\xe6")
    assert decoder.next_packet() is MQTT_NEED_DATA
    error = expect_error(decoder, b"\x07", "v5 MQTT-3.2.2-15", MqttReasonCode.PACKET_TOO_LARGE)
    assert "1000" in str(error)
    assert decoder.buffered == 0
    exact = server_decoder(max_packet_size=1000)
    exact.feed(frame(0x30, s(b"t") + b"x" * (1000 - 6)))  # 1000 bytes including the header
    assert isinstance(exact.next_packet(), Publish)


def test_packets_before_a_violation_are_delivered_first() -> None:
    """decode_many returns the good packets ahead of a violation; the next call raises it."""
    decoder = server_decoder()
    decoder.feed(encode_mqtt(Publish("a", b"1"), V311) + b"\xe0\x00" + b"\x36\x00")
    assert decoder.decode_many() == [Publish("a", b"1"), Disconnect()]
    with pytest.raises(MqttProtocolError, match=r"MQTT-3\.3\.1-4"):
        decoder.decode_many()


def test_errors_are_sticky() -> None:
    """After a violation the stream cannot be trusted: every later call raises the same error."""
    decoder = server_decoder()
    error = expect_error(decoder, b"\x36\x00", "MQTT-3.3.1-4")
    with pytest.raises(MqttProtocolError) as again:
        decoder.next_packet()
    assert again.value is error
    with pytest.raises(MqttProtocolError):
        decoder.feed(b"\xc0\x00")


# --- CONNECT ---------------------------------------------------------------------------------


def test_first_packet_must_be_connect_3_1_0_1() -> None:
    """MQTT-3.1.0-1: a server decoder refuses anything before CONNECT (0x82)."""
    expect_error(MqttDecoder(), b"\xc0\x00", "MQTT-3.1.0-1", PROTOCOL_ERROR)


def test_second_connect_is_a_protocol_error_3_1_0_2() -> None:
    """MQTT-3.1.0-2."""
    expect_error(server_decoder(), connect_frame(), "MQTT-3.1.0-2", PROTOCOL_ERROR)


@pytest.mark.parametrize(
    ("name", "level", "statement"),
    [
        (b"MQTT", 6, "MQTT-3.1.2-2"),
        (b"MQTT", 3, "MQTT-3.1.2-2"),
        (b"MQIsdp", 4, "MQTT-3.1.2-2"),
        (b"MQTX", 4, "MQTT-3.1.2-1"),
        (b"mqtt", 4, "MQTT-3.1.2-1"),
    ],
)
def test_unsupported_protocol_is_a_distinct_error(name: bytes, level: int, statement: str) -> None:
    """MQTT-3.1.2-1/-2: reported as MqttUnsupportedProtocolError so the server can answer
    CONNACK 0x01 (3.1.1 format) / 0x84 and close."""
    decoder = MqttDecoder()
    decoder.feed(connect_frame(level, name=name))
    with pytest.raises(MqttUnsupportedProtocolError) as info:
        decoder.next_packet()
    assert info.value.statement == statement
    assert info.value.reason_code == MqttReasonCode.UNSUPPORTED_PROTOCOL_VERSION
    assert (info.value.protocol_name, info.value.protocol_level) == (name.decode(), level)
    assert decoder.version is None
    assert v311_connack_code(info.value.reason_code) == 1
    refusal = Connack(reason_code=ConnackReturnCode.UNACCEPTABLE_PROTOCOL_VERSION)
    assert encode_mqtt(refusal, V311) == b"\x20\x02\x00\x01"


def test_connect_reserved_flag_3_1_2_3() -> None:
    """MQTT-3.1.2-3: bit 0 of the connect flags must be 0."""
    expect_error(MqttDecoder(), connect_frame(flags=0x03), "MQTT-3.1.2-3")


@pytest.mark.parametrize(
    ("flags", "statement"),
    [(0x08, "MQTT-3.1.2-13"), (0x20, "MQTT-3.1.2-15"), (0x1C, "MQTT-3.1.2-14")],
)
def test_connect_will_flags_3_1_2_11_to_15(flags: int, statement: str) -> None:
    """MQTT-3.1.2-11/-13/-15: no Will QoS or Retain without the Will flag; -14: no Will QoS 3."""
    payload = s(b"dev") + s(b"w") + s(b"x")
    decoder = MqttDecoder()
    expect_error(decoder, connect_frame(flags=flags | 0x02, payload=payload), statement)
    assert decoder.version == V311  # known, so the server can choose the CONNACK format


def test_password_without_username_3_1_2_22() -> None:
    """MQTT-3.1.2-22: refused in 3.1.1 (and 3.1); allowed in v5 (v5 §3.1.2.9)."""
    payload = s(b"dev") + s(b"secret")
    expect_error(MqttDecoder(), connect_frame(4, 0x42, payload), "MQTT-3.1.2-22")
    expect_error(MqttDecoder(), connect_frame(3, 0x42, payload, b"MQIsdp"), "MQTT-3.1.2-22")
    decoder = MqttDecoder()
    decoder.feed(connect_frame(5, 0x42, payload))
    assert decoder.next_packet() == Connect("dev", keep_alive=60, password=b"secret")
    with pytest.raises(MqttLocalProtocolError):
        encode_mqtt(Connect("dev", password=b"secret"), V311)


def test_will_topic_must_be_a_topic_name_3_1_3_10() -> None:
    """MQTT-3.1.3-10 / MQTT-3.3.2-2: a Will topic with a wildcard is refused with 0x90."""
    payload = s(b"dev") + s(b"a/#") + s(b"x")
    expect_error(
        MqttDecoder(),
        connect_frame(flags=0x06, payload=payload),
        "MQTT-3.1.3-10",
        MqttReasonCode.TOPIC_NAME_INVALID,
    )


@pytest.mark.parametrize(
    "payload",
    [s(b"dev") + b"\x00", s(b"dev") + s(b"extra")],
)
def test_connect_trailing_bytes_are_malformed(payload: bytes) -> None:
    """3.1.1 §2.2.3 / MQTT-3.1.4-1: bytes after the last field the flags announce."""
    expect_error(MqttDecoder(), connect_frame(payload=payload), "§2.2.3")


@pytest.mark.parametrize(
    "wire",
    [
        frame(0x10, s(b"MQTT") + b"\x04\x02\x00\x3c" + b"\x00\x09dev"),  # client id runs past
        frame(0x10, s(b"MQTT") + b"\x04\x82\x00\x3c" + s(b"dev")),  # username missing
        frame(0x10, s(b"MQTT") + b"\x04"),  # flags missing
        frame(0x10, b"\x00"),  # half a length field
    ],
)
def test_connect_truncated_fields_are_malformed(wire: bytes) -> None:
    """A field that runs past the remaining length is malformed (§2.2.3, MQTT-3.1.2-19)."""
    expect_error(MqttDecoder(), wire, "§2.2.3")


# --- strings ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [b"\xff", b"a\xc3", b"\xc0\xaf", b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xf4\x90\x80\x80"],
)
def test_ill_formed_utf8_is_malformed_1_5_3_1(raw: bytes) -> None:
    """MQTT-1.5.3-1 (v5 MQTT-1.5.4-1): invalid bytes, overlong forms, surrogates U+D800..U+DFFF
    and code points past U+10FFFF, in a topic, a client id and a topic filter."""
    expect_error(server_decoder(), frame(0x30, s(raw)), "MQTT-1.5.3-1")
    expect_error(MqttDecoder(), connect_frame(payload=s(raw)), "MQTT-1.5.3-1")
    expect_error(server_decoder(), frame(0x82, b"\x00\x01" + s(raw) + b"\x00"), "MQTT-1.5.3-1")


def test_nul_character_is_malformed_1_5_3_2() -> None:
    """MQTT-1.5.3-2 (v5 MQTT-1.5.4-2): U+0000 in any string."""
    expect_error(server_decoder(), frame(0x30, s(b"a\x00b")), "MQTT-1.5.3-2")
    expect_error(MqttDecoder(), connect_frame(payload=s(b"d\x00")), "MQTT-1.5.3-2")
    expect_error(server_decoder(), frame(0xA2, b"\x00\x01" + s(b"\x00")), "MQTT-1.5.3-2")


def test_bom_is_kept_1_5_3_3() -> None:
    """MQTT-1.5.3-3: U+FEFF is a character like any other, never stripped."""
    decoder = server_decoder()
    decoder.feed(frame(0x30, s("\ufeffa".encode())))
    packet = decoder.next_packet()
    assert isinstance(packet, Publish)
    assert packet.topic == "\ufeffa"


# --- PUBLISH -----------------------------------------------------------------------------------


@pytest.mark.parametrize("topic", [b"a/+", b"#", b"a/#", b"+"])
def test_wildcard_in_publish_topic_3_3_2_2(topic: bytes) -> None:
    """MQTT-3.3.2-2: refused with 0x90 Topic Name Invalid, in both directions."""
    expect_error(server_decoder(), frame(0x30, s(topic)), "MQTT-3.3.2-2", 0x90)
    client = MqttDecoder(server_side=False, version=V5)
    expect_error(client, frame(0x30, s(topic) + b"\x00"), "MQTT-3.3.2-2", 0x90)


def test_empty_topic_needs_a_v5_alias_4_7_3_1() -> None:
    """MQTT-4.7.3-1: an empty topic name is valid only with a v5 Topic Alias."""
    expect_error(server_decoder(), frame(0x30, s(b"") + b"x"), "MQTT-4.7.3-1", 0x90)
    expect_error(server_decoder(V5), frame(0x30, s(b"") + b"\x00x"), "MQTT-4.7.3-1", 0x90)
    decoder = server_decoder(V5)
    decoder.feed(frame(0x30, s(b"") + b"\x03\x23\x00\x01x"))
    assert decoder.next_packet() == Publish("", b"x", properties=MqttProperties(topic_alias=1))


@pytest.mark.parametrize(
    ("wire", "what"),
    [
        (frame(0x32, s(b"a") + b"\x00\x00"), "PUBLISH"),
        (frame(0x40, b"\x00\x00"), "PUBACK"),
        (frame(0x50, b"\x00\x00"), "PUBREC"),
        (frame(0x62, b"\x00\x00"), "PUBREL"),
        (frame(0x70, b"\x00\x00"), "PUBCOMP"),
        (frame(0x82, b"\x00\x00" + s(b"a") + b"\x00"), "SUBSCRIBE"),
        (frame(0xA2, b"\x00\x00" + s(b"a")), "UNSUBSCRIBE"),
    ],
)
def test_packet_identifier_zero_2_3_1_1(wire: bytes, what: str) -> None:
    """MQTT-2.3.1-1: packet identifiers are non-zero wherever present."""
    error = expect_error(server_decoder(), wire, "MQTT-2.3.1-1")
    assert what in str(error)


@pytest.mark.parametrize(
    "wire",
    [
        frame(0x30, b"\x00"),  # half a topic length
        frame(0x30, b"\x00\x05ab"),  # topic runs past the end
        frame(0x32, s(b"a") + b"\x00"),  # half a packet identifier
    ],
)
def test_publish_truncated_fields(wire: bytes) -> None:
    """§2.2.3: fields that run past the remaining length."""
    expect_error(server_decoder(), wire, "§2.2.3")


def test_client_publish_must_not_carry_a_subscription_identifier_v5_3_3_4_6() -> None:
    """v5 MQTT-3.3.4-6: only the server may send Subscription Identifiers in PUBLISH."""
    wire = frame(0x30, s(b"a") + b"\x02\x0b\x01")
    expect_error(server_decoder(V5), wire, "v5 MQTT-3.3.4-6", PROTOCOL_ERROR)
    client = MqttDecoder(server_side=False, version=V5)
    client.feed(wire)
    assert client.next_packet() == Publish(
        "a", properties=MqttProperties(subscription_identifiers=(1,))
    )


# --- acknowledgements, trailing bytes, reason codes -----------------------------------------


@pytest.mark.parametrize(
    "wire",
    [
        frame(0x40, b"\x00\x01\x00"),  # 3.1.1 PUBACK is exactly 2 bytes
        frame(0xC0, b"\x00"),  # PINGREQ has no body
        frame(0xE0, b"\x00"),  # 3.1.1 DISCONNECT has no body
        frame(0x62, b"\x00\x01\x00\x00\x00"),  # 3.1.1 PUBREL
    ],
)
def test_trailing_bytes_are_malformed(wire: bytes) -> None:
    """3.1.1 §2.2.3: the remaining length must match the packet's fields exactly."""
    expect_error(server_decoder(), wire, "§2.2.3")


@pytest.mark.parametrize(
    ("wire", "statement"),
    [
        (frame(0x40, b"\x00\x01\x05"), "v5 MQTT-3.4.2-1"),
        (frame(0x50, b"\x00\x01\x92"), "v5 MQTT-3.5.2-1"),
        (frame(0x62, b"\x00\x01\x10"), "v5 MQTT-3.6.2-1"),
        (frame(0x70, b"\x00\x01\x80"), "v5 MQTT-3.7.2-1"),
        (frame(0xE0, b"\x05"), "v5 MQTT-3.14.2-1"),
        (frame(0xF0, b"\x01"), "v5 MQTT-3.15.2-1"),
    ],
)
def test_reason_code_not_valid_for_the_packet(wire: bytes, statement: str) -> None:
    """v5 MQTT-3.4.2-1 etc.: each packet type has its own list of reason codes."""
    expect_error(server_decoder(V5), wire, statement)


def test_connack_checks_3_2_2() -> None:
    """§3.2.2.1 reserved ack flags (v5 MQTT-3.2.2-1); MQTT-3.2.2-4 no session with a refusal
    (v5 MQTT-3.2.2-6); §3.2.2.3 return codes 6..255 reserved; v5 MQTT-3.2.2-8 reason codes."""
    expect_error(MqttDecoder(server_side=False, version=V311), b"\x20\x02\x02\x00", "§3.2.2.1")
    expect_error(
        MqttDecoder(server_side=False, version=V311), b"\x20\x02\x01\x05", "MQTT-3.2.2-4", 0x82
    )
    expect_error(MqttDecoder(server_side=False, version=V311), b"\x20\x02\x00\x06", "§3.2.2.3")
    expect_error(
        MqttDecoder(server_side=False, version=V5), b"\x20\x03\x00\x10\x00", "v5 MQTT-3.2.2-8"
    )


def test_suback_codes_3_9_3_2() -> None:
    """MQTT-3.9.3-2: 3.1.1 SUBACK codes are 0, 1, 2 or 0x80; a SUBACK has at least one."""
    client = MqttDecoder(server_side=False, version=V311)
    expect_error(client, frame(0x90, b"\x00\x01\x03"), "MQTT-3.9.3-2")
    client = MqttDecoder(server_side=False, version=V311)
    expect_error(client, frame(0x90, b"\x00\x01"), "MQTT-3.8.4-5")


# --- SUBSCRIBE / UNSUBSCRIBE -----------------------------------------------------------------


def test_subscribe_without_filters_3_8_3_3() -> None:
    """MQTT-3.8.3-3 (v5 MQTT-3.8.3-2): a protocol violation (0x82)."""
    expect_error(server_decoder(), frame(0x82, b"\x00\x01"), "MQTT-3.8.3-3", PROTOCOL_ERROR)
    expect_error(server_decoder(V5), frame(0x82, b"\x00\x01\x00"), "MQTT-3.8.3-3", PROTOCOL_ERROR)


def test_unsubscribe_without_filters_3_10_3_2() -> None:
    """MQTT-3.10.3-2."""
    expect_error(server_decoder(), frame(0xA2, b"\x00\x01"), "MQTT-3.10.3-2", PROTOCOL_ERROR)


@pytest.mark.parametrize("options", [0x03, 0x04, 0x41, 0xFC])
def test_subscribe_reserved_option_bits_3_8_3_4(options: int) -> None:
    """MQTT-3-8.3-4 (3.1.1's own id): the upper 6 bits are reserved and QoS 3 is malformed."""
    wire = frame(0x82, b"\x00\x01" + s(b"a") + bytes((options,)))
    expect_error(server_decoder(), wire, "MQTT-3-8.3-4")


def test_subscribe_v5_options() -> None:
    """v5 MQTT-3.8.3-5 reserved bits 6-7; v5 §3.8.3.1 QoS 3 and Retain Handling 3;
    v5 MQTT-3.8.3-4 No Local on a shared subscription."""
    base = b"\x00\x01\x00" + s(b"a")
    expect_error(server_decoder(V5), frame(0x82, base + b"\x40"), "v5 MQTT-3.8.3-5")
    expect_error(server_decoder(V5), frame(0x82, base + b"\x03"), "v5 §3.8.3.1")
    expect_error(server_decoder(V5), frame(0x82, base + b"\x30"), "v5 §3.8.3.1", PROTOCOL_ERROR)
    shared = b"\x00\x01\x00" + s(b"$share/g/a") + b"\x04"
    expect_error(server_decoder(V5), frame(0x82, shared), "v5 MQTT-3.8.3-4", PROTOCOL_ERROR)


def test_invalid_filters_are_left_to_the_server() -> None:
    """Filters are not judged by the decoder: the server answers each one in SUBACK
    (0x80 in 3.1.1, 0x8F in v5), so one bad filter does not cost the connection."""
    decoder = server_decoder()
    decoder.feed(frame(0x82, b"\x00\x01" + s(b"a/#/b") + b"\x01" + s(b"ok") + b"\x00"))
    packet = decoder.next_packet()
    assert isinstance(packet, Subscribe)
    assert [sub.topic_filter for sub in packet.subscriptions] == ["a/#/b", "ok"]
    with pytest.raises(MqttLocalProtocolError):
        encode_mqtt(packet, V311)


# --- direction and version -------------------------------------------------------------------


@pytest.mark.parametrize("ptype", [2, 9, 11, 13])
def test_server_refuses_packets_only_servers_send(ptype: int) -> None:
    """CONNACK, SUBACK, UNSUBACK, PINGRESP never come from a client (§2.1.2): 0x82."""
    flags = 0
    expect_error(server_decoder(V5), bytes((ptype << 4 | flags, 0)), "§2.1.2", PROTOCOL_ERROR)


@pytest.mark.parametrize(("ptype", "flags"), [(1, 0), (8, 2), (10, 2), (12, 0)])
def test_client_refuses_packets_only_clients_send(ptype: int, flags: int) -> None:
    """CONNECT, SUBSCRIBE, UNSUBSCRIBE, PINGREQ never come from a server (§2.1.2)."""
    decoder = MqttDecoder(server_side=False, version=V311)
    expect_error(decoder, bytes((ptype << 4 | flags, 0)), "§2.1.2", PROTOCOL_ERROR)


def test_reserved_and_v5_only_types() -> None:
    """Type 0 is forbidden; AUTH (15) is reserved in 3.1.1; a 3.1.1 server sends no DISCONNECT."""
    expect_error(server_decoder(V5), b"\x00\x00", "MQTT-2.2.1")
    expect_error(server_decoder(V311), b"\xf0\x00", "MQTT-2.2.1")
    client = MqttDecoder(server_side=False, version=V311)
    expect_error(client, b"\xe0\x00", "§2.1.2", PROTOCOL_ERROR)


def test_constructor_contract() -> None:
    with pytest.raises(ValueError, match="client-side"):
        MqttDecoder(server_side=False)
    with pytest.raises(ValueError, match="max_packet_size"):
        MqttDecoder(max_packet_size=1)
    assert MqttDecoder(version=V5).version == V5


# --- v5 properties ---------------------------------------------------------------------------

_KIND_FRAMES: dict[int | str, Callable[[bytes], bytes]] = {
    # For each packet kind: a valid frame around a property block ``p`` (block includes length).
    CONNECT: lambda p: frame(0x10, s(b"MQTT") + b"\x05\x02\x00\x00" + p + s(b"c")),
    WILL: lambda p: frame(
        0x10, s(b"MQTT") + b"\x05\x06\x00\x00\x00" + s(b"c") + p + s(b"w") + s(b"")
    ),
    CONNACK: lambda p: frame(0x20, b"\x00\x00" + p),
    PUBLISH: lambda p: frame(0x30, s(b"t") + p),
    PUBACK: lambda p: frame(0x40, b"\x00\x01\x00" + p),
    PUBREC: lambda p: frame(0x50, b"\x00\x01\x00" + p),
    PUBREL: lambda p: frame(0x62, b"\x00\x01\x00" + p),
    PUBCOMP: lambda p: frame(0x70, b"\x00\x01\x00" + p),
    SUBSCRIBE: lambda p: frame(0x82, b"\x00\x01" + p + s(b"a") + b"\x00"),
    SUBACK: lambda p: frame(0x90, b"\x00\x01" + p + b"\x00"),
    UNSUBSCRIBE: lambda p: frame(0xA2, b"\x00\x01" + p + s(b"a")),
    UNSUBACK: lambda p: frame(0xB0, b"\x00\x01" + p + b"\x00"),
    DISCONNECT: lambda p: frame(0xE0, b"\x00" + p),
    AUTH: lambda p: frame(0xF0, b"\x00" + p),
}
_CLIENT_KINDS = {CONNECT, WILL, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP, SUBSCRIBE, UNSUBSCRIBE}
_CLIENT_KINDS |= {DISCONNECT, AUTH}

_SAMPLE_VALUES: dict[str, bytes] = {
    # One valid encoded value per wire type, keyed by property name.
    "payload_format_indicator": b"\x01",
    "message_expiry_interval": b"\x00\x00\x00\x05",
    "content_type": s(b"ct"),
    "response_topic": s(b"r/t"),
    "correlation_data": s(b"\x00\xff"),
    "subscription_identifiers": b"\x05",
    "session_expiry_interval": b"\x00\x00\x00\x05",
    "assigned_client_identifier": s(b"id"),
    "server_keep_alive": b"\x00\x05",
    "authentication_method": s(b"m"),
    "authentication_data": s(b"d"),
    "request_problem_information": b"\x01",
    "will_delay_interval": b"\x00\x00\x00\x05",
    "request_response_information": b"\x01",
    "response_information": s(b"ri"),
    "server_reference": s(b"sr"),
    "reason_string": s(b"rs"),
    "receive_maximum": b"\x00\x05",
    "topic_alias_maximum": b"\x00\x05",
    "topic_alias": b"\x00\x05",
    "maximum_qos": b"\x01",
    "retain_available": b"\x01",
    "user_properties": s(b"k") + s(b"v"),
    "maximum_packet_size": b"\x00\x00\x00\x05",
    "wildcard_subscription_available": b"\x01",
    "subscription_identifier_available": b"\x01",
    "shared_subscription_available": b"\x01",
}


def _decoder_for(kind: int | str) -> MqttDecoder:
    if kind in (CONNECT, WILL):
        return MqttDecoder()
    if kind in _CLIENT_KINDS:
        return server_decoder(V5)
    return MqttDecoder(server_side=False, version=V5)


@pytest.mark.parametrize("name", sorted(PROPERTY_TABLE))
def test_each_property_is_accepted_exactly_where_table_2_4_allows_it(name: str) -> None:
    """v5 §2.2.2.2: a property in a packet that may not carry it is a Malformed Packet; in one
    that may, it decodes to its field. Checked for every property against every packet kind."""
    ident, kinds, _ = PROPERTY_TABLE[name]
    for kind, build in _KIND_FRAMES.items():
        if kind == PUBLISH and name == "subscription_identifiers":
            continue  # allowed, but only from the server: covered by its own test
        block = bytes((ident,)) + _SAMPLE_VALUES[name]
        if kind == CONNECT and name == "authentication_data":
            block += b"\x15" + s(b"m")
        decoder = _decoder_for(kind)
        decoder.feed(build(vbi(len(block)) + block))
        if kind in kinds:
            packets = decoder.decode_many()
            assert packets, (name, kind)
        else:
            with pytest.raises(MqttProtocolError) as info:
                decoder.decode_many()
            assert info.value.statement == "v5 §2.2.2.2", (name, kind, str(info.value))
            assert info.value.reason_code == MALFORMED


@pytest.mark.parametrize(
    ("block", "reason"),
    [
        (b"\x23\x00\x01\x23\x00\x02", PROTOCOL_ERROR),  # Topic Alias twice
        (b"\x23\x00\x00", PROTOCOL_ERROR),  # Topic Alias 0 (v5 MQTT-3.3.2-8)
        (b"\x01\x02", PROTOCOL_ERROR),  # Payload Format Indicator 2
        (b"\x08" + s(b"a/#"), PROTOCOL_ERROR),  # wildcard in Response Topic (v5 MQTT-3.3.2-14)
        (b"\x7f\x00", MALFORMED),  # unknown identifier
        (b"\x81\x01", MALFORMED),  # identifier with a continuation bit: none exists
        (b"\x02\x00\x00", MALFORMED),  # four-byte value cut short by the block length
        (b"\x03\x00\x09ab", MALFORMED),  # string runs past the block
    ],
)
def test_property_violations(block: bytes, reason: int) -> None:
    """v5 §2.2.2.2: duplicates and bad values are Protocol Errors; unknown identifiers and
    truncated values are Malformed Packets. User Property may repeat."""
    decoder = server_decoder(V5)
    decoder.feed(frame(0x30, s(b"t") + vbi(len(block)) + block))
    with pytest.raises(MqttProtocolError) as info:
        decoder.decode_many()
    assert info.value.reason_code == reason, str(info.value)


def test_repeatable_properties_keep_their_order() -> None:
    """User Property may appear many times, order kept (v5 MQTT-3.3.2-18); Subscription
    Identifier repeats in a server PUBLISH but not in SUBSCRIBE (v5 §3.8.2.1.2)."""
    pairs = b"".join(b"\x26" + s(k) + s(v) for k, v in [(b"b", b"1"), (b"a", b"2"), (b"b", b"3")])
    decoder = server_decoder(V5)
    decoder.feed(frame(0x30, s(b"t") + vbi(len(pairs)) + pairs))
    packet = decoder.next_packet()
    assert isinstance(packet, Publish)
    assert packet.properties.user_properties == (("b", "1"), ("a", "2"), ("b", "3"))
    ids = b"\x0b\x01\x0b\x02"
    client = MqttDecoder(server_side=False, version=V5)
    client.feed(frame(0x30, s(b"t") + vbi(len(ids)) + ids))
    assert client.next_packet() == Publish(
        "t", properties=MqttProperties(subscription_identifiers=(1, 2))
    )
    twice = frame(0x82, b"\x00\x01" + vbi(len(ids)) + ids + s(b"a") + b"\x00")
    expect_error(server_decoder(V5), twice, "v5 §2.2.2.2", PROTOCOL_ERROR)


def test_authentication_data_needs_a_method() -> None:
    """v5 §3.1.2.11.10: Authentication Data without Authentication Method is a Protocol Error."""
    block = b"\x16" + s(b"d")
    wire = frame(0x10, s(b"MQTT") + b"\x05\x02\x00\x00" + vbi(len(block)) + block + s(b"c"))
    expect_error(MqttDecoder(), wire, "v5 §3.1.2.11.10", PROTOCOL_ERROR)


# --- the encoder refuses what it cannot express ------------------------------------------------


@pytest.mark.parametrize(
    ("packet", "version"),
    [
        (Publish("a/+", b""), V311),
        (Publish("", b""), V5),
        (Publish("a\x00", b""), V311),
        (Publish("\ud800", b""), V311),
        (Publish("a", b"", qos=3), V311),
        (Publish("a", b"", qos=1), V311),  # packet id 0
        (Publish("a", b"", qos=0, packet_id=4), V311),
        (Publish("a", b"", qos=0, dup=True), V311),
        (Publish("a", properties=MqttProperties(message_expiry_interval=1)), V311),
        (Publish("a", properties=MqttProperties(reason_string="x")), V5),  # not allowed
        (Publish("a", properties=MqttProperties(payload_format_indicator=2)), V5),
        (Publish("a", properties=MqttProperties(message_expiry_interval=2**32)), V5),
        (Puback(0), V311),
        (Puback(1, 0x10), V311),
        (Puback(1, 0x92), V5),
        (Subscribe(1, ()), V311),
        (Subscribe(1, (MqttSubscription("a/#/b"),)), V311),
        (Subscribe(1, (MqttSubscription("a", no_local=True),)), V311),
        (Subscribe(1, (MqttSubscription("$share/g/a", no_local=True),)), V5),
        (Subscribe(1, (MqttSubscription("a", retain_handling=3),)), V5),
        (
            Subscribe(1, (MqttSubscription("a"),), MqttProperties(subscription_identifiers=(1, 2))),
            V5,
        ),
        (Suback(1, ()), V5),
        (Suback(1, (0x8F,)), V311),
        (Unsubscribe(1, ()), V5),
        (Unsuback(1, (0,)), V311),
        (Unsuback(1, ()), V5),
        (Connack(True, 5), V311),
        (Connack(False, 6), V311),
        (Connack(False, 0x10), V5),
        (Connect("c", keep_alive=70_000), V311),
        (Connect("c", will=Will("a/#", b"")), V311),
        (Connect("c", properties=MqttProperties(authentication_data=b"x")), V5),
        (Disconnect(0x04), V311),
        (Auth(), V311),
        (Pingreq(), 6),
    ],
)
def test_encoder_refuses_invalid_packets(packet: MqttPacket, version: MqttVersion) -> None:
    """Local misuse raises MqttLocalProtocolError (a ValueError) and sends nothing."""
    with pytest.raises(MqttLocalProtocolError):
        encode_mqtt(packet, version)


def test_v311_connack_code_mapping() -> None:
    assert v311_connack_code(MqttReasonCode.SUCCESS) == ConnackReturnCode.ACCEPTED
    assert v311_connack_code(0x85) == ConnackReturnCode.IDENTIFIER_REJECTED
    assert v311_connack_code(0x86) == ConnackReturnCode.BAD_USER_NAME_OR_PASSWORD
    assert v311_connack_code(0x87) == ConnackReturnCode.NOT_AUTHORIZED
    assert v311_connack_code(0x88) == ConnackReturnCode.SERVER_UNAVAILABLE
    assert v311_connack_code(MALFORMED) is None  # MQTT-3.1.4-1: close without CONNACK


# --- fuzzing -----------------------------------------------------------------------------------


def _redecode(packet: MqttPacket, version: MqttVersion, server_side: bool) -> MqttPacket:
    decoder = MqttDecoder(
        server_side=server_side, version=None if isinstance(packet, Connect) else version
    )
    decoder.feed(encode_mqtt(packet, version))
    (again,) = decoder.decode_many()
    return again


def _encodable(packet: MqttPacket) -> bool:
    """Filters are judged by the server, not the decoder; the encoder refuses invalid ones."""
    if isinstance(packet, Subscribe):
        return all(is_valid_mqtt_topic_filter(sub.topic_filter) for sub in packet.subscriptions)
    if isinstance(packet, Unsubscribe):
        return all(is_valid_mqtt_topic_filter(f) for f in packet.topic_filters)
    return True


@settings(max_examples=250, suppress_health_check=[HealthCheck.too_slow])
@given(
    stream=streams(),
    mutations=st.lists(
        st.tuples(
            st.sampled_from(["flip", "set", "insert", "delete"]),
            st.integers(0, 10**6),
            st.integers(0, 255),
        ),
        min_size=1,
        max_size=4,
    ),
    cuts=st.lists(st.integers(0, 10**6), max_size=6),
    max_packet_size=st.sampled_from([8, 64, 1024 * 1024]),
)
def test_mutated_streams_only_ever_raise_protocol_errors(
    stream: tuple[MqttVersion, bool, list[MqttPacket]],
    mutations: list[tuple[str, int, int]],
    cuts: list[int],
    max_packet_size: int,
) -> None:
    """Whatever the damage, the decoder raises MqttProtocolError or decodes packets that the
    encoder accepts and that decode again to themselves; it never lets IndexError,
    struct.error or UnicodeDecodeError escape, and once it answers NEED_DATA it holds less
    than one maximum-size packet."""
    version, server_side, packets = stream
    wire = bytearray(b"".join(encode_mqtt(packet, version) for packet in packets))
    for op, where, value in mutations:
        at = where % (len(wire) + 1)
        if op == "insert":
            wire[at:at] = bytes((value,))
        elif at < len(wire):
            if op == "flip":
                wire[at] ^= 1 << (value % 8)
            elif op == "set":
                wire[at] = value
            else:
                del wire[at]
    decoder = MqttDecoder(
        max_packet_size=max_packet_size,
        server_side=server_side,
        version=None if server_side else version,
    )
    try:
        for piece in split(bytes(wire), cuts):
            decoder.feed(piece)
            while (packet := decoder.next_packet()) is not MQTT_NEED_DATA:
                assert decoder.version is not None
                if _encodable(packet):
                    assert _redecode(packet, decoder.version, server_side) == packet
            assert decoder.buffered < max(max_packet_size, 5)
    except MqttProtocolError as error:
        assert str(error).startswith(error.statement)


@settings(max_examples=300)
@given(
    garbage=st.binary(min_size=1, max_size=200),
    server_side=st.booleans(),
    version=versions,
)
def test_random_bytes_only_ever_raise_protocol_errors(
    garbage: bytes, server_side: bool, version: MqttVersion
) -> None:
    """Pure noise after a valid start (a CONNECT on the server side)."""
    decoder = MqttDecoder(
        max_packet_size=64, server_side=server_side, version=None if server_side else version
    )
    if server_side:
        decoder.feed(encode_mqtt(Connect("x"), version))
    decoder.feed(garbage)
    try:
        decoder.decode_many()
    except MqttProtocolError:
        return
    assert decoder.buffered < 64


# --- interop with the reference client (paho-mqtt, a dev-only dependency) --------------------


@pytest.mark.parametrize("protocol", ["3.1.1", "5"])
def test_paho_client_interop(protocol: str) -> None:
    """paho-mqtt talks to a tiny server built on this codec over loopback: we decode what paho
    sends (CONNECT, SUBSCRIBE, PUBLISH, PUBACK, DISCONNECT) and paho accepts what we encode
    (CONNACK, SUBACK, PUBLISH, PUBACK)."""
    mqtt = pytest.importorskip("paho.mqtt.client")
    version = V5 if protocol == "5" else V311
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(10)
    port = listener.getsockname()[1]
    received: list[MqttPacket] = []
    failures: list[BaseException] = []

    def serve() -> None:
        try:
            conn, _ = listener.accept()
            conn.settimeout(10)
            decoder = MqttDecoder()
            with conn:
                while True:
                    data = conn.recv(65536)
                    if not data:
                        return
                    decoder.feed(data)
                    for packet in decoder.decode_many():
                        received.append(packet)
                        assert decoder.version is not None
                        version = decoder.version
                        if isinstance(packet, Connect):
                            conn.sendall(encode_mqtt(Connack(), version))
                        elif isinstance(packet, Subscribe):
                            codes = tuple(sub.qos for sub in packet.subscriptions)
                            conn.sendall(encode_mqtt(Suback(packet.packet_id, codes), version))
                            down = Publish("cmd/dev-1", b"reboot", 1, packet_id=42)
                            conn.sendall(encode_mqtt(down, version))
                        elif isinstance(packet, Publish) and packet.qos == 1:
                            conn.sendall(encode_mqtt_puback(packet.packet_id))
                        elif isinstance(packet, Disconnect):
                            return
        except BaseException as error:  # noqa: BLE001 - handed to the test thread
            failures.append(error)
        finally:
            listener.close()

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    got_message = threading.Event()
    got_puback = threading.Event()
    messages: list[tuple[str, bytes, int]] = []
    client = mqtt.Client(
        mqtt.CallbackAPIVersion.VERSION2,
        client_id="dev-1",
        protocol=mqtt.MQTTv5 if version == V5 else mqtt.MQTTv311,
    )

    def on_message(_client: object, _userdata: object, message: object) -> None:
        messages.append((message.topic, message.payload, message.qos))  # type: ignore[attr-defined]
        got_message.set()

    client.on_message = on_message
    client.on_publish = lambda *args: got_puback.set()
    client.username_pw_set("user", "pw")
    client.will_set("dev/dead", b"gone", qos=1)
    client.connect("127.0.0.1", port, keepalive=30)
    client.loop_start()
    try:
        client.subscribe("cmd/+", qos=1)
        assert got_message.wait(10), failures
        client.publish("telemetry/dev-1", b"21.5", qos=1).wait_for_publish(10)
        assert got_puback.wait(10)
        client.disconnect()
    finally:
        client.loop_stop()
    server.join(10)
    assert not failures, failures
    assert messages == [("cmd/dev-1", b"reboot", 1)]
    kinds = [type(packet).__name__ for packet in received]
    assert kinds[:2] == ["Connect", "Subscribe"] and kinds[-1] == "Disconnect", kinds
    connect = received[0]
    assert isinstance(connect, Connect)
    assert (connect.client_id, connect.username, connect.password) == ("dev-1", "user", b"pw")
    assert connect.will == Will("dev/dead", b"gone", 1)
    telemetry = [p for p in received if isinstance(p, Publish)]
    assert [(p.topic, p.payload, p.qos) for p in telemetry] == [("telemetry/dev-1", b"21.5", 1)]
    assert Puback(42) in received  # paho acknowledged our downstream PUBLISH
