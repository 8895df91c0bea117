"""Persistent sessions: subscriptions and unacknowledged QoS 1 deliveries survive a reconnect,
to any broker; one connection per client id in the whole cluster."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kafkaesque.cli.cluster import LocalCluster

from kafkaesque.broker._mqtt_sessions import decode_session
from kafkaesque.client import Client, Producer
from kafkaesque.protocol import (
    Disconnect,
    MqttProperties,
    MqttSubscription,
    MqttVersion,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    encode_mqtt,
)

from .mqtt_helpers import RULES, RawMqtt, read_topic, wait_for

V311 = MqttVersion.V311
V5 = MqttVersion.V5


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    data = str(tmp_path_factory.mktemp("mqtt-sessions"))
    with LocalCluster(data, 3, mqtt=True, mqtt_rules=RULES) as c:
        yield c


def command(cluster: LocalCluster, device: str, text: bytes, broker: int = 1) -> None:
    host, port = cluster.client_address(broker)
    with Client(f"{host}:{port}") as client, Producer(client) as producer:
        producer.send("commands", text, key=device.encode()).get(30)


def subscribe(raw: RawMqtt, topic_filter: str, qos: int = 1) -> None:
    raw.send(encode_mqtt(Subscribe(1, (MqttSubscription(topic_filter, qos),)), raw.version))
    suback = raw.receive()
    assert isinstance(suback, Suback) and suback.reason_codes == (qos,)


def publishes(raw: RawMqtt, count: int) -> list[Publish]:
    got: list[Publish] = []
    while len(got) < count:
        try:
            packet = raw.receive(timeout=15)
        except TimeoutError:
            raise AssertionError(f"got {got} of {count} PUBLISHes") from None
        assert isinstance(packet, Publish), packet
        got.append(packet)
    return got


def test_a_session_resumes_on_another_broker_with_what_was_missed(cluster: LocalCluster) -> None:
    device = "phone-s0001"
    raw = RawMqtt(cluster.mqtt_address(0))
    assert raw.connect(device, clean_start=False).session_present is False
    subscribe(raw, f"phones/{device}/commands")
    raw.send(encode_mqtt(Disconnect(), V311))
    raw.close()
    for i in range(3):
        command(cluster, device, b"cmd-%d" % i)
    # Back, on another broker, without subscribing again.
    raw = RawMqtt(cluster.mqtt_address(2))
    try:
        assert raw.connect(device, clean_start=False).session_present is True
        got = publishes(raw, 3)
        assert [p.payload for p in got] == [b"cmd-0", b"cmd-1", b"cmd-2"]
        assert {p.topic for p in got} == {f"phones/{device}/commands"}
        for p in got:
            raw.send(encode_mqtt(Puback(p.packet_id), V311))
        command(cluster, device, b"live")  # and the subscription is live again
        assert [p.payload for p in publishes(raw, 1)] == [b"live"]
    finally:
        raw.close()


def test_an_unacknowledged_delivery_is_delivered_again(cluster: LocalCluster) -> None:
    device = "phone-s0002"
    raw = RawMqtt(cluster.mqtt_address(1))
    raw.connect(device, clean_start=False)
    subscribe(raw, f"phones/{device}/commands")
    command(cluster, device, b"reboot")
    [first] = publishes(raw, 1)
    raw.close()  # crashed before its PUBACK
    raw = RawMqtt(cluster.mqtt_address(0))
    try:
        assert raw.connect(device, clean_start=False).session_present is True
        [again] = publishes(raw, 1)
        assert again.payload == b"reboot"
        raw.send(encode_mqtt(Puback(again.packet_id), V311))
        raw.send(encode_mqtt(Disconnect(), V311))
    finally:
        raw.close()
    # Acknowledged now: once the session's last state is stored (the old broker writes it as
    # the connection ends; a reconnect racing it may get the message once more, as QoS 1
    # allows), the next connection gets nothing again, only what is new.
    [reboot] = [r for r in read_topic(cluster.bootstrap, "commands") if r.value == b"reboot"]

    def acknowledged() -> bool:
        stored = [
            r for r in read_topic(cluster.bootstrap, "__mqtt_sessions") if r.key == device.encode()
        ]
        session = decode_session(stored[-1].value or b"") if stored else None
        return (
            session is not None
            and session.positions.get(("commands", reboot.partition), 0) > reboot.offset
        )

    wait_for(acknowledged, 15, "the acknowledgement to be stored")
    raw = RawMqtt(cluster.mqtt_address(2))
    try:
        assert raw.connect(device, clean_start=False).session_present is True
        command(cluster, device, b"next")
        assert [p.payload for p in publishes(raw, 1)] == [b"next"]
    finally:
        raw.close()
    assert first.payload == b"reboot"


def test_clean_session_discards_the_stored_one(cluster: LocalCluster) -> None:
    device = "phone-s0003"
    raw = RawMqtt(cluster.mqtt_address(0))
    raw.connect(device, clean_start=False)
    subscribe(raw, f"phones/{device}/commands")
    raw.send(encode_mqtt(Disconnect(), V311))
    raw.close()
    raw = RawMqtt(cluster.mqtt_address(1))
    assert raw.connect(device, clean_start=True).session_present is False
    raw.send(encode_mqtt(Disconnect(), V311))
    raw.close()
    raw = RawMqtt(cluster.mqtt_address(2))
    try:
        assert raw.connect(device, clean_start=False).session_present is False
    finally:
        raw.close()


def test_a_connection_on_another_broker_takes_the_session_over(cluster: LocalCluster) -> None:
    device = "phone-s0004"
    expiry = MqttProperties(session_expiry_interval=3600)
    first = RawMqtt(cluster.mqtt_address(0), V5)
    second = RawMqtt(cluster.mqtt_address(2), V5)
    try:
        first.connect(device, clean_start=False, properties=expiry)
        second.connect(device, clean_start=False, properties=expiry)
        assert first.receive(timeout=15) == Disconnect(0x8E)
        assert first.closed_by_server()
    finally:
        first.close()
        second.close()


def test_qos2_exactly_once_across_a_reconnect_to_another_broker(cluster: LocalCluster) -> None:
    device = "phone-s0005"
    topic = f"phones/{device}/spectrum"
    raw = RawMqtt(cluster.mqtt_address(0))
    raw.connect(device, clean_start=False)
    raw.send(encode_mqtt(Publish(topic, b"first", qos=2, packet_id=5), V311))
    assert raw.receive() == Pubrec(5)
    raw.close()  # gone before its PUBREL
    raw = RawMqtt(cluster.mqtt_address(1))
    try:
        assert raw.connect(device, clean_start=False).session_present is True
        raw.send(encode_mqtt(Publish(topic, b"first", qos=2, dup=True, packet_id=5), V311))
        assert raw.receive() == Pubrec(5)  # known: not appended again
        raw.send(encode_mqtt(Pubrel(5), V311))
        assert raw.receive() == Pubcomp(5)
    finally:
        raw.close()
    raw = RawMqtt(cluster.mqtt_address(2))
    try:
        raw.connect(device, clean_start=False)
        # Id 5 is free again: a new message with it is a new message.
        raw.send(encode_mqtt(Publish(topic, b"second", qos=2, packet_id=5), V311))
        assert raw.receive() == Pubrec(5)
        raw.send(encode_mqtt(Pubrel(5), V311))
        assert raw.receive() == Pubcomp(5)
    finally:
        raw.close()
    values = [
        r.value for r in read_topic(cluster.bootstrap, "readings") if r.key == device.encode()
    ]
    assert values == [b"first", b"second"]
