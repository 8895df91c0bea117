"""The MQTT listener against real clients (paho-mqtt, mosquitto_pub/sub) and real brokers.

One 3-broker cluster with MQTT on every broker is shared by the module; every test uses its
own device ids and MQTT topics, so the tests do not see each other's messages.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any, cast

import paho.mqtt.client as paho
import pytest
import trio
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from kafkaesque.broker.mqtt._egress import Egress
from kafkaesque.broker.mqtt._listener import MAX_PACKET_SIZE
from kafkaesque.client import Client, Producer
from kafkaesque.local_cluster import LocalCluster
from kafkaesque.protocol.mqtt import (
    RECEIVE_MAXIMUM,
    Disconnect,
    MqttProperties,
    MqttSubscription,
    MqttVersion,
    Pingreq,
    Pingresp,
    Puback,
    Publish,
    Suback,
    Subscribe,
    TopicMapping,
    Will,
    encode_mqtt,
)

from .mqtt_helpers import (
    RULES,
    PahoDevice,
    RawMqtt,
    headers_of,
    keyed_records,
    read_topic,
    wait_for,
)

# Payload-aware rules (issue 38): the key and kept fields from the JSON payload, the log topic
# from a payload field.
PAYLOAD_RULES = """
meters/+/reading -> meter-readings key=$.meter.id fields=kwh,meter.id
meters/+/event   -> meter-{$.kind}
dead-letter      -> meter-dead-letter
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    data = str(tmp_path_factory.mktemp("mqtt-cluster"))
    with LocalCluster(data, 3, mqtt=True, mqtt_rules=RULES + PAYLOAD_RULES) as c:
        yield c


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# -- ingress --------------------------------------------------------------------------------------


def test_paho_qos1_publishes_land_in_the_mapped_log_topic(cluster: LocalCluster) -> None:
    device = unique("phone")
    client = PahoDevice(cluster.mqtt_address(1), device)
    try:
        client.wait_connected()
        for serial in range(5):
            client.publish(f"phones/{device}/spectrum", b'{"serial": %d}' % serial, qos=1)
    finally:
        client.close()
    # Every PUBACKed message is committed: readable at once, keyed by the device, with headers.
    mine = keyed_records(cluster.bootstrap, "readings", device)
    assert [r.value for r in mine] == [b'{"serial": %d}' % i for i in range(5)]
    assert len({r.partition for r in mine}) == 1  # one device, one partition: in order
    assert headers_of(mine[0]) == {
        "mqtt.topic": f"phones/{device}/spectrum".encode(),
        "mqtt.qos": b"1",
        "mqtt.client": device.encode(),  # with the packet id, how a resend is recognised
        "mqtt.pid": b"1",
    }


def test_payload_aware_rules_map_json_and_dead_letter_what_does_not_parse(
    cluster: LocalCluster,
) -> None:
    meter = unique("meter")
    client = PahoDevice(cluster.mqtt_address(0), unique("gw"))
    try:
        client.wait_connected()
        reading = b'{"meter": {"id": "%s", "site": "x"}, "kwh": 3.5, "raw": [1]}' % meter.encode()
        client.publish("meters/gw/reading", reading, qos=1)  # each waits for its PUBACK
        client.publish("meters/gw/reading", b"<xml/>", qos=1)
        client.publish("meters/gw/reading", b'{"kwh": 1, "tag": "%s"}' % meter.encode(), qos=1)
        client.publish("meters/gw/event", b'{"kind": "alarm", "id": "%s"}' % meter.encode(), qos=1)
        admin = cluster.ports[0].admin
        with urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=10) as reply:
            metrics = reply.read().decode()
    finally:
        client.close()
    [mapped] = keyed_records(cluster.bootstrap, "meter-readings", meter)
    assert json.loads(mapped.value or b"") == {"kwh": 3.5, "meter": {"id": meter}}
    assert headers_of(mapped)["mqtt.topic"] == b"meters/gw/reading"
    assert [r.value for r in read_topic(cluster.bootstrap, "meter-alarm")] == [
        b'{"kind": "alarm", "id": "%s"}' % meter.encode()
    ]
    dead = read_topic(cluster.bootstrap, "meter-dead-letter")
    letters = [r for r in dead if r.value == b"<xml/>"]
    letters += [r for r in dead if meter.encode() in (r.value or b"")]
    assert [r.value for r in letters] == [b"<xml/>", b'{"kwh": 1, "tag": "%s"}' % meter.encode()]
    assert b"not JSON" in headers_of(letters[0])["error"]
    assert headers_of(letters[1])["error"] == b"no key field $.meter.id"
    assert headers_of(letters[1])["target.topic"] == b"meter-readings"
    counted = [ln for ln in metrics.splitlines() if ln.startswith("kafkaesque_mqtt_dead_letters")]
    assert counted and float(counted[0].split()[1]) >= 2


def test_qos0_and_unmapped_topics_go_to_the_fallback_topic(cluster: LocalCluster) -> None:
    topic = f"{unique('plant')}/temperature"
    client = PahoDevice(cluster.mqtt_address(0), unique("sensor"))
    try:
        client.wait_connected()
        client.publish(topic, b"21.5", qos=0)
        client.publish(topic, b"21.7", qos=1)  # after the QoS 0 one, on the same partition
    finally:
        client.close()
    records = keyed_records(cluster.bootstrap, "mqtt", topic)
    assert [(r.value, headers_of(r)["mqtt.qos"]) for r in records] == [
        (b"21.5", b"0"),
        (b"21.7", b"1"),
    ]


def test_mosquitto_pub_publishes(cluster: LocalCluster) -> None:
    device = unique("phone")
    host, port = cluster.mqtt_address(2)
    for qos in ("0", "1", "2"):
        subprocess.run(
            ["mosquitto_pub", "-h", host, "-p", str(port), "-q", qos, "-i", device,
             "-t", f"phones/{device}/spectrum", "-m", f"qos{qos}"],
            check=True, timeout=30,
        )  # fmt: skip
    values = [r.value for r in keyed_records(cluster.bootstrap, "readings", device)]
    # QoS 0 may be lost in principle; QoS 1 and 2 are in the log, once, in order.
    assert [v for v in values if v != b"qos0"] == [b"qos1", b"qos2"]
    assert values.count(b"qos0") <= 1


def test_qos2_is_appended_exactly_once(cluster: LocalCluster) -> None:
    device = unique("phone")
    client = PahoDevice(cluster.mqtt_address(0), device, version=paho.MQTTv5)
    try:
        client.wait_connected()
        for i in range(3):
            client.publish(f"phones/{device}/spectrum", b"q2-%d" % i, qos=2)
    finally:
        client.close()
    values = [r.value for r in keyed_records(cluster.bootstrap, "readings", device)]
    assert values == [b"q2-0", b"q2-1", b"q2-2"]


def test_a_retransmitted_qos2_publish_is_not_appended_twice(cluster: LocalCluster) -> None:
    device = unique("phone")
    raw = RawMqtt(cluster.mqtt_address(1))
    try:
        raw.connect(device)
        publish = Publish(f"phones/{device}/spectrum", b"once", qos=2, packet_id=11)
        raw.send(encode_mqtt(publish, MqttVersion.V311))
        assert raw.receive() is not None  # PUBREC
        raw.send(
            encode_mqtt(Publish(publish.topic, b"once", 2, dup=True, packet_id=11), raw.version)
        )
        assert raw.receive() is not None  # PUBREC again, no second append
    finally:
        raw.close()
    values = [r.value for r in keyed_records(cluster.bootstrap, "readings", device)]
    assert values == [b"once"]


def test_a_qos1_resend_of_a_committed_message_is_acknowledged_not_appended_again(
    cluster: LocalCluster,
) -> None:
    device = unique("phone")
    topic = f"phones/{device}/spectrum"
    first = RawMqtt(cluster.mqtt_address(0))
    try:
        first.connect(device)
        first.send(encode_mqtt(Publish(topic, b"reading", 1, packet_id=21), first.version))
        assert first.receive() == Puback(21)
    finally:
        first.close()  # as if the PUBACK had been lost with the connection
    again = RawMqtt(cluster.mqtt_address(2))  # the device reconnects elsewhere and resends
    try:
        again.connect(device)
        resend = Publish(topic, b"reading", 1, dup=True, packet_id=21)
        again.send(encode_mqtt(resend, again.version))
        assert again.receive() == Puback(21)
        # A DUP whose first copy never reached the log is appended: nothing is lost.
        lost = Publish(topic, b"never arrived", 1, dup=True, packet_id=22)
        again.send(encode_mqtt(lost, again.version))
        assert again.receive() == Puback(22)
    finally:
        again.close()
    records = keyed_records(cluster.bootstrap, "readings", device)
    assert [r.value for r in records] == [b"reading", b"never arrived"]
    assert headers_of(records[0])["mqtt.client"] == device.encode()
    assert headers_of(records[0])["mqtt.pid"] == b"21"


# -- egress ---------------------------------------------------------------------------------------


def test_a_command_appended_through_broker_c_reaches_the_device_on_broker_a(
    cluster: LocalCluster,
) -> None:
    device = unique("phone")
    phone = PahoDevice(cluster.mqtt_address(0), device)
    try:
        phone.wait_connected()
        phone.subscribe(f"phones/{device}/commands", qos=1)
        host, port = cluster.client_address(2)
        with Client(f"{host}:{port}") as client, Producer(client) as producer:
            started = time.monotonic()
            producer.send("commands", b'{"command": "blink"}', key=device.encode()).get(30)
        wait_for(lambda: phone.payloads() == [b'{"command": "blink"}'], 10, "the command")
        elapsed = time.monotonic() - started
        print(f"command delivered {elapsed * 1000:.0f} ms after the send started")
        assert phone.messages[0].topic == f"phones/{device}/commands"
        assert phone.messages[0].qos == 1
    finally:
        phone.close()


def test_wildcard_subscriptions_with_mosquitto_sub(cluster: LocalCluster) -> None:
    device = unique("phone")
    host, port = cluster.mqtt_address(2)
    sub = subprocess.Popen(
        ["mosquitto_sub", "-h", host, "-p", str(port), "-q", "1", "-v", "-C", "2",
         "-t", f"phones/{device}/#", "-t", f"phones/+/{device}-x"],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        time.sleep(1.0)  # mosquitto_sub gives no sign that its SUBACK came; let it subscribe
        pub = PahoDevice(cluster.mqtt_address(1), unique("pub"))
        try:
            pub.wait_connected()
            pub.publish(f"phones/{device}/spectrum", b"one")
            pub.publish(f"phones/{device}/commands", b"two")
        finally:
            pub.close()
        out, _ = sub.communicate(timeout=30)
    finally:
        if sub.poll() is None:
            sub.kill()
            sub.wait()
    assert out.decode().splitlines() == [
        f"phones/{device}/spectrum one",
        f"phones/{device}/commands two",
    ]


def test_plus_matches_one_level_only(cluster: LocalCluster) -> None:
    base = unique("zone")
    listener = PahoDevice(cluster.mqtt_address(0), unique("l"))
    pub = PahoDevice(cluster.mqtt_address(0), unique("p"))
    try:
        listener.wait_connected()
        pub.wait_connected()
        listener.subscribe(f"{base}/+/temp", qos=1)
        pub.publish(f"{base}/a/temp", b"yes")
        pub.publish(f"{base}/a/b/temp", b"no")
        pub.publish(f"{base}/b/temp", b"yes too")
        wait_for(lambda: len(listener.payloads()) >= 2, 10, "two messages")
        time.sleep(0.5)
        assert sorted(listener.payloads()) == [b"yes", b"yes too"]
    finally:
        listener.close()
        pub.close()


def test_unsubscribe_stops_deliveries(cluster: LocalCluster) -> None:
    topic = f"{unique('u')}/t"
    listener = PahoDevice(cluster.mqtt_address(1), unique("l"))
    pub = PahoDevice(cluster.mqtt_address(1), unique("p"))
    try:
        listener.wait_connected()
        pub.wait_connected()
        listener.subscribe(topic)
        pub.publish(topic, b"before")
        wait_for(lambda: listener.payloads() == [b"before"], 10, "the first message")
        done = []
        listener.client.on_unsubscribe = lambda *a: done.append(1)
        listener.client.unsubscribe(topic)
        wait_for(lambda: bool(done), 10, "UNSUBACK")
        pub.publish(topic, b"after")
        marker = f"{topic}/marker"
        listener.subscribe(marker)
        pub.publish(marker, b"marker")
        wait_for(lambda: b"marker" in listener.payloads(), 10, "the marker")
        assert listener.payloads() == [b"before", b"marker"]
    finally:
        listener.close()
        pub.close()


def test_a_shared_subscription_gives_each_message_to_one_member(cluster: LocalCluster) -> None:
    topic = f"{unique('jobs')}/new"
    members = [
        PahoDevice(cluster.mqtt_address(2), unique("worker"), version=paho.MQTTv5) for _ in range(2)
    ]
    pub = PahoDevice(cluster.mqtt_address(0), unique("p"))
    try:
        for member in members:
            member.wait_connected()
            member.subscribe(f"$share/workers/{topic}", qos=1)
        pub.wait_connected()
        for i in range(10):
            pub.publish(topic, b"job-%d" % i)
        wait_for(lambda: sum(len(m.payloads()) for m in members) >= 10, 15, "10 jobs")
        time.sleep(0.5)
        got = [p for m in members for p in m.payloads()]
        assert sorted(got) == sorted(b"job-%d" % i for i in range(10))
        assert all(m.payloads() for m in members)  # both took a share
    finally:
        for member in members:
            member.close()
        pub.close()


def test_a_shared_subscription_spans_brokers_each_message_to_one_member(
    cluster: LocalCluster,
) -> None:
    # Fixed names (no other test uses them): which broker serves which partition for the group
    # is a hash of these, and with them each broker serves some of the partitions used.
    prefix = "shared-tasks"
    members = [
        PahoDevice(cluster.mqtt_address(i), unique("worker"), version=paho.MQTTv5) for i in (0, 1)
    ]
    pub = PahoDevice(cluster.mqtt_address(2), unique("p"))
    try:
        for member in members:
            member.wait_connected()
            member.subscribe(f"$share/crew/{prefix}/+/new", qos=1)
        time.sleep(0.5)  # the brokers tell each other who has members (SHARES, within 50 ms)
        pub.wait_connected()
        # Ten topics, so the messages spread over the fallback topic's partitions.
        sent = [b"%d-%d" % (t, i) for i in range(3) for t in range(10)]
        for payload in sent:
            pub.publish(f"{prefix}/{payload.split(b'-')[0].decode()}/new", payload)
        wait_for(lambda: sum(len(m.payloads()) for m in members) >= len(sent), 15, "30 jobs")
        time.sleep(0.5)
        got = [p for m in members for p in m.payloads()]
        assert sorted(got) == sorted(sent)  # each message once, in the whole cluster
        assert all(m.payloads() for m in members)  # each broker serves some partitions
    finally:
        for member in members:
            member.close()
        pub.close()


def subscribed_v5(address: tuple[str, int], subscription: MqttSubscription) -> RawMqtt:
    """A new v5 device at ``address`` with ``subscription`` granted."""
    raw = RawMqtt(address, MqttVersion.V5)
    raw.connect(unique("sub"))
    raw.send(encode_mqtt(Subscribe(1, (subscription,)), raw.version))
    assert isinstance(raw.receive(), Suback)
    return raw


def test_no_local_keeps_a_devices_own_messages_from_it(cluster: LocalCluster) -> None:
    topic = f"{unique('chat')}/room"
    me = RawMqtt(cluster.mqtt_address(0), MqttVersion.V5)
    other = RawMqtt(cluster.mqtt_address(1), MqttVersion.V5)
    try:
        me.connect(unique("me"))
        other.connect(unique("other"))
        subscription = MqttSubscription(topic, 1, no_local=True)
        me.send(encode_mqtt(Subscribe(1, (subscription,)), me.version))
        assert isinstance(me.receive(), Suback)
        me.send(encode_mqtt(Publish(topic, b"mine", 1, packet_id=2), me.version))
        assert me.receive() == Puback(2)
        other.send(encode_mqtt(Publish(topic, b"theirs", 1, packet_id=3), other.version))
        assert other.receive() == Puback(3)
        delivered = me.receive()  # "mine" was appended first: it would come first
        assert isinstance(delivered, Publish) and delivered.payload == b"theirs"
    finally:
        me.close()
        other.close()


def test_retain_as_published_keeps_the_retain_flag_of_live_messages(
    cluster: LocalCluster,
) -> None:
    topic = f"{unique('lamp')}/state"
    keeps = subscribed_v5(
        cluster.mqtt_address(0), MqttSubscription(topic, 1, retain_as_published=True)
    )
    plain = subscribed_v5(cluster.mqtt_address(2), MqttSubscription(topic, 1))
    pub = RawMqtt(cluster.mqtt_address(1))
    try:
        pub.connect(unique("pub"))
        pub.send(encode_mqtt(Publish(topic, b"on", 1, retain=True, packet_id=1), pub.version))
        assert pub.receive() == Puback(1)
        pub.send(encode_mqtt(Publish(topic, b"blink", 1, packet_id=2), pub.version))
        assert pub.receive() == Puback(2)
        got = {}
        for name, raw in (("keeps", keeps), ("plain", plain)):
            packets = [raw.receive(), raw.receive()]
            assert all(isinstance(p, Publish) for p in packets)
            got[name] = [(p.payload, p.retain) for p in packets if isinstance(p, Publish)]
        # MQTT-3.3.1-12/13: RETAIN 0 on live messages, unless Retain As Published.
        assert got == {
            "keeps": [(b"on", True), (b"blink", False)],
            "plain": [(b"on", False), (b"blink", False)],
        }
    finally:
        for raw in (keeps, plain, pub):
            raw.close()


def test_a_live_message_goes_out_with_what_remains_of_its_expiry(cluster: LocalCluster) -> None:
    topic = f"{unique('alarm')}/fire"
    sub = subscribed_v5(cluster.mqtt_address(0), MqttSubscription(topic, 1))
    pub = RawMqtt(cluster.mqtt_address(1), MqttVersion.V5)
    try:
        pub.connect(unique("pub"))
        expiring = MqttProperties(message_expiry_interval=60)
        pub.send(
            encode_mqtt(Publish(topic, b"now", 1, packet_id=1, properties=expiring), pub.version)
        )
        assert pub.receive() == Puback(1)
        pub.send(encode_mqtt(Publish(topic, b"whenever", 1, packet_id=2), pub.version))
        assert pub.receive() == Puback(2)
        got = [p for p in (sub.receive(), sub.receive()) if isinstance(p, Publish)]
        assert [p.payload for p in got] == [b"now", b"whenever"]
        remains = got[0].properties.message_expiry_interval  # of 60, rounded up
        assert remains is not None and 55 <= remains <= 60
        assert got[1].properties.message_expiry_interval is None
    finally:
        sub.close()
        pub.close()


def test_an_expired_retained_message_is_not_sent(cluster: LocalCluster) -> None:
    prefix = unique("door")
    pub = RawMqtt(cluster.mqtt_address(2), MqttVersion.V5)
    try:
        pub.connect(unique("pub"))
        for packet_id, name, expiry in ((1, "code", 1), (2, "kept", None)):
            properties = MqttProperties(message_expiry_interval=expiry)
            publish = Publish(
                f"{prefix}/{name}", b"1234", 1, True, packet_id=packet_id, properties=properties
            )
            pub.send(encode_mqtt(publish, pub.version))
            assert pub.receive() == Puback(packet_id)
    finally:
        pub.close()
    time.sleep(1.5)  # the first one's interval passes

    def retained_now() -> list[str]:
        sub = RawMqtt(cluster.mqtt_address(0), MqttVersion.V5)
        try:
            sub.connect(unique("sub"))
            sub.send(encode_mqtt(Subscribe(1, (MqttSubscription(f"{prefix}/+", 1),)), sub.version))
            assert isinstance(sub.receive(), Suback)
            topics: list[str] = []
            while True:
                try:
                    packet = sub.receive(timeout=1.0)
                except TimeoutError:
                    return topics
                assert isinstance(packet, Publish) and packet.retain
                topics.append(packet.topic)
        finally:
            sub.close()

    deadline = time.monotonic() + 15
    while (topics := retained_now()) == [] and time.monotonic() < deadline:
        pass  # the broker follows the retained topic: it takes a moment
    assert topics == [f"{prefix}/kept"]


def paho_publish_properties(**values: object) -> Properties:
    properties = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    for name, value in values.items():
        setattr(properties, name, value)
    return properties


def paho_properties(message: paho.MQTTMessage) -> Any:
    """A received message's properties (paho sets their attributes at run time)."""
    assert message.properties is not None
    return message.properties


def test_a_v5_messages_properties_reach_its_subscribers_unaltered(cluster: LocalCluster) -> None:
    device = unique("phone")
    topic = f"phones/{device}/spectrum"
    sub = PahoDevice(cluster.mqtt_address(0), unique("dashboard"), version=paho.MQTTv5)
    pub = PahoDevice(cluster.mqtt_address(1), device, version=paho.MQTTv5)
    try:
        sub.wait_connected()
        pub.wait_connected()
        sub.subscribe(topic, qos=1)
        properties = paho_publish_properties(
            PayloadFormatIndicator=1,
            ContentType="application/json",
            ResponseTopic=f"phones/{device}/acks",
            CorrelationData=b"\x00reading-1",
            UserProperty=[("unit", "dB"), ("site", "north"), ("unit", "raw")],
        )
        info = pub.client.publish(topic, b'{"db": -71}', qos=1, properties=properties)
        info.wait_for_publish(30)
        wait_for(lambda: len(sub.messages) == 1, 10, "the message")
        got = paho_properties(sub.messages[0])
        assert got.PayloadFormatIndicator == 1
        assert got.ContentType == "application/json"
        assert got.ResponseTopic == f"phones/{device}/acks"
        assert got.CorrelationData == b"\x00reading-1"
        # Every User Property, in order, a repeated name included (MQTT-3.3.2-17/-18).
        assert got.UserProperty == [("unit", "dB"), ("site", "north"), ("unit", "raw")]
    finally:
        sub.close()
        pub.close()
    # In the log they are headers, for any consumer to read.
    [record] = keyed_records(cluster.bootstrap, "readings", device)
    assert [h for h in record.headers if h[0] not in ("mqtt.client", "mqtt.pid")] == [
        ("mqtt.topic", topic.encode()),
        ("mqtt.qos", b"1"),
        ("mqtt.format", b"1"),
        ("mqtt.content-type", b"application/json"),
        ("mqtt.response-topic", f"phones/{device}/acks".encode()),
        ("mqtt.correlation", b"\x00reading-1"),
        ("mqtt.user.unit", b"dB"),
        ("mqtt.user.site", b"north"),
        ("mqtt.user.unit", b"raw"),
    ]


def test_a_paho_v5_device_publishes_through_a_topic_alias(cluster: LocalCluster) -> None:
    device = unique("phone")
    topic = f"phones/{device}/spectrum"
    pub = PahoDevice(cluster.mqtt_address(2), device, version=paho.MQTTv5)
    try:
        pub.wait_connected()
        for index, name in enumerate((topic, "", "")):  # the topic once, then the alias alone
            properties = paho_publish_properties(TopicAlias=1)
            info = pub.client.publish(name, b"%d" % index, qos=1, properties=properties)
            info.wait_for_publish(30)
            assert info.is_published()
    finally:
        pub.close()
    records = keyed_records(cluster.bootstrap, "readings", device)
    assert [(r.value, headers_of(r)["mqtt.topic"]) for r in records] == [
        (b"0", topic.encode()),
        (b"1", topic.encode()),
        (b"2", topic.encode()),
    ]


def test_a_controller_asks_a_device_and_reads_its_reply_from_the_log(
    cluster: LocalCluster,
) -> None:
    """MQTT 5 request/response between a log client and a device: the command's headers give
    the device a Response Topic and Correlation Data; its reply lands in the log with them."""
    device = unique("phone")
    reply_topic = f"controller/{unique('c')}/replies"
    phone = PahoDevice(cluster.mqtt_address(0), device, version=paho.MQTTv5)
    try:
        phone.wait_connected()
        phone.subscribe(f"phones/{device}/commands", qos=1)
        host, port = cluster.client_address(2)
        with Client(f"{host}:{port}") as client, Producer(client) as producer:
            headers = [("mqtt.response-topic", reply_topic.encode()), ("mqtt.correlation", b"c-7")]
            producer.send("commands", b"blink", key=device.encode(), headers=headers).get(30)
        wait_for(lambda: len(phone.messages) == 1, 10, "the command")
        command = paho_properties(phone.messages[0])
        assert command.ResponseTopic == reply_topic
        assert command.CorrelationData == b"c-7"
        answer = paho_publish_properties(CorrelationData=command.CorrelationData)
        info = phone.client.publish(reply_topic, b"done", qos=1, properties=answer)
        info.wait_for_publish(30)
    finally:
        phone.close()
    # An unmapped topic: the fallback log topic, keyed by the MQTT topic.
    replies = keyed_records(cluster.bootstrap, "mqtt", reply_topic)
    assert [(r.value, headers_of(r)["mqtt.correlation"]) for r in replies] == [(b"done", b"c-7")]


def test_a_retained_message_keeps_its_properties(cluster: LocalCluster) -> None:
    topic = f"{unique('valve')}/state"
    pub = RawMqtt(cluster.mqtt_address(1), MqttVersion.V5)
    try:
        pub.connect(unique("pub"))
        properties = MqttProperties(content_type="text/plain", user_properties=(("by", "ops"),))
        publish = Publish(topic, b"open", 1, True, packet_id=1, properties=properties)
        pub.send(encode_mqtt(publish, pub.version))
        assert pub.receive() == Puback(1)
    finally:
        pub.close()

    def retained() -> Publish | None:
        sub = subscribed_v5(cluster.mqtt_address(2), MqttSubscription(topic, 1))
        try:
            packet = sub.receive(timeout=1.0)
        except TimeoutError:
            return None  # not yet read from the retained topic by that broker
        finally:
            sub.close()
        assert isinstance(packet, Publish)
        return packet

    deadline = time.monotonic() + 10
    while (got := retained()) is None and time.monotonic() < deadline:
        pass
    assert got is not None and got.retain and got.payload == b"open"
    assert got.properties.content_type == "text/plain"
    assert got.properties.user_properties == (("by", "ops"),)


def test_a_message_too_large_for_a_device_is_skipped_not_stuck(cluster: LocalCluster) -> None:
    """v5 Maximum Packet Size: the server does not send a larger packet (MQTT-3.1.2-24), and the
    device's next messages still come."""
    topic = f"{unique('camera')}/frames"
    sub = RawMqtt(cluster.mqtt_address(0), MqttVersion.V5)
    pub = RawMqtt(cluster.mqtt_address(1), MqttVersion.V5)
    try:
        sub.connect(unique("sub"), properties=MqttProperties(maximum_packet_size=1024))
        sub.send(encode_mqtt(Subscribe(1, (MqttSubscription(topic, 1),)), sub.version))
        assert isinstance(sub.receive(), Suback)
        pub.connect(unique("pub"))
        for packet_id, payload in enumerate((b"small-1", b"x" * 4096, b"small-2"), start=1):
            pub.send(encode_mqtt(Publish(topic, payload, 1, packet_id=packet_id), pub.version))
            assert pub.receive() == Puback(packet_id)
        got = [sub.receive(), sub.receive()]
        assert [p.payload for p in got if isinstance(p, Publish)] == [b"small-1", b"small-2"]
    finally:
        sub.close()
        pub.close()


def test_messages_carry_the_identifiers_of_the_subscriptions_they_match(
    cluster: LocalCluster,
) -> None:
    prefix = unique("plant")
    sub = RawMqtt(cluster.mqtt_address(1), MqttVersion.V5)
    pub = RawMqtt(cluster.mqtt_address(2))
    try:
        pub.connect(unique("pub"))
        pub.send(encode_mqtt(Publish(f"{prefix}/kept", b"r", 1, True, packet_id=1), pub.version))
        assert pub.receive() == Puback(1)
        sub.connect(unique("sub"))
        for packet_id, (topic_filter, identifier) in enumerate(
            ((f"{prefix}/+", 7), (f"{prefix}/#", 9), (f"$share/g{prefix}/{prefix}/live", 11)), 1
        ):
            properties = MqttProperties(subscription_identifiers=(identifier,))
            subscription = MqttSubscription(topic_filter, 1)
            sub.send(encode_mqtt(Subscribe(packet_id, (subscription,), properties), sub.version))
            suback = sub.receive()
            while isinstance(suback, Publish):  # the retained message, once per subscription
                suback = sub.receive()
            assert isinstance(suback, Suback)
        pub.send(encode_mqtt(Publish(f"{prefix}/live", b"go", 1, packet_id=2), pub.version))
        assert pub.receive() == Puback(2)
        live = sub.receive()
        while isinstance(live, Publish) and live.retain:  # retained copies not yet read
            live = sub.receive()
        assert isinstance(live, Publish) and live.payload == b"go"
        assert sorted(live.properties.subscription_identifiers) == [7, 9, 11]
    finally:
        sub.close()
        pub.close()


def test_retain_handling_1_sends_retained_messages_to_a_new_subscription_only(
    cluster: LocalCluster,
) -> None:
    topic = f"{unique('lamp')}/state"
    pub = RawMqtt(cluster.mqtt_address(0))
    try:
        pub.connect(unique("p"))
        pub.send(encode_mqtt(Publish(topic, b"on", 1, retain=True, packet_id=1), pub.version))
        assert pub.receive() == Puback(1)
    finally:
        pub.close()

    def retained_there() -> bool:  # the broker follows the retained topic: it takes a moment
        probe = RawMqtt(cluster.mqtt_address(0))
        try:
            probe.connect(unique("probe"))
            probe.send(encode_mqtt(Subscribe(1, (MqttSubscription(topic, 0),)), probe.version))
            assert isinstance(probe.receive(), Suback)
            return isinstance(probe.receive(timeout=1.0), Publish)
        except TimeoutError:
            return False
        finally:
            probe.close()

    wait_for(retained_there, 15, "the retained message")
    device = RawMqtt(cluster.mqtt_address(0), MqttVersion.V5)
    try:
        device.connect(unique("d"))

        def subscribe(packet_id: int, retain_handling: int) -> Publish | None:
            """SUBSCRIBE; the retained message that follows the SUBACK, if one comes."""
            sub = MqttSubscription(topic, 1, retain_handling=retain_handling)
            device.send(encode_mqtt(Subscribe(packet_id, (sub,)), device.version))
            assert isinstance(device.receive(), Suback)
            try:
                packet = device.receive(timeout=1.0)
            except TimeoutError:
                return None
            assert isinstance(packet, Publish)
            device.send(encode_mqtt(Puback(packet.packet_id), device.version))
            return packet

        assert subscribe(2, 1) is not None  # a new subscription gets it
        assert subscribe(3, 1) is None  # the subscription exists: nothing again
        again = subscribe(4, 0)  # Retain Handling 0: on every SUBSCRIBE
        assert again is not None and again.payload == b"on" and again.retain
    finally:
        device.close()


# -- sessions, Wills, keep-alive, auth ------------------------------------------------------------


def test_will_is_published_when_the_connection_drops(cluster: LocalCluster) -> None:
    device = unique("phone")
    status = f"{device}/status"
    watcher = PahoDevice(cluster.mqtt_address(1), unique("w"))
    try:
        watcher.wait_connected()
        watcher.subscribe(status)
        raw = RawMqtt(cluster.mqtt_address(0))
        raw.connect(device, will=Will(status, b"offline", qos=1))
        raw.close()  # no DISCONNECT: an abnormal end
        wait_for(lambda: watcher.payloads() == [b"offline"], 15, "the Will")
        # A clean DISCONNECT publishes no Will.
        raw = RawMqtt(cluster.mqtt_address(0))
        raw.connect(device, will=Will(status, b"second", qos=1))
        raw.send(encode_mqtt(Disconnect(), MqttVersion.V311))
        raw.close()
        raw = RawMqtt(cluster.mqtt_address(0))
        raw.connect(device, will=Will(status, b"third", qos=1))
        raw.close()
        wait_for(lambda: len(watcher.payloads()) >= 2, 15, "the third Will")
        assert watcher.payloads() == [b"offline", b"third"]
    finally:
        watcher.close()


def test_a_delayed_will_waits_and_a_reconnect_in_time_cancels_it(cluster: LocalCluster) -> None:
    device = unique("phone")
    status = f"{device}/status"
    session = MqttProperties(session_expiry_interval=3600)  # the session outlives the connection
    will = Will(status, b"gone", qos=1, properties=MqttProperties(will_delay_interval=2))
    watcher = PahoDevice(cluster.mqtt_address(2), unique("w"))
    try:
        watcher.wait_connected()
        watcher.subscribe(status)
        raw = RawMqtt(cluster.mqtt_address(0), MqttVersion.V5)
        raw.connect(device, clean_start=False, will=will, properties=session)
        raw.close()  # dropped; back within the delay, through another broker
        raw = RawMqtt(cluster.mqtt_address(1), MqttVersion.V5)
        raw.connect(device, clean_start=False, will=will, properties=session)
        time.sleep(3.0)
        assert watcher.payloads() == []  # the first drop's Will was cancelled
        raw.close()  # dropped for good this time
        time.sleep(1.0)
        assert watcher.payloads() == []  # not before the delay
        wait_for(lambda: watcher.payloads() == [b"gone"], 15, "the delayed Will")
    finally:
        watcher.close()


def test_keep_alive_expiry_closes_and_publishes_the_will(cluster: LocalCluster) -> None:
    device = unique("phone")
    watcher = PahoDevice(cluster.mqtt_address(2), unique("w"))
    try:
        watcher.wait_connected()
        watcher.subscribe(f"{device}/gone")
        raw = RawMqtt(cluster.mqtt_address(2))
        raw.connect(device, keep_alive=1, will=Will(f"{device}/gone", b"timeout"))
        raw.send(encode_mqtt(Pingreq(), MqttVersion.V311))
        assert isinstance(raw.receive(), Pingresp)
        assert raw.closed_by_server(timeout=20)  # silent for 1.5 x 1 s
        raw.close()
        wait_for(lambda: watcher.payloads() == [b"timeout"], 15, "the Will")
    finally:
        watcher.close()


@pytest.mark.parametrize("version", [MqttVersion.V311, MqttVersion.V5], ids=["3.1.1", "5.0"])
def test_a_short_keep_alive_holds_from_the_connect_on(
    cluster: LocalCluster, version: MqttVersion
) -> None:
    # A device silent from its CONNECT on is dropped 1.5 x its keep-alive later (MQTT-3.1.2-24,
    # v5 §3.1.2.10), not when the 10 s connect timeout would have run out.
    device = unique("phone")
    watcher = PahoDevice(cluster.mqtt_address(0), unique("w"))
    try:
        watcher.wait_connected()
        watcher.subscribe(f"{device}/gone")
        raw = RawMqtt(cluster.mqtt_address(0), version)
        raw.connect(device, keep_alive=1, will=Will(f"{device}/gone", b"silent", qos=1))
        accepted = time.monotonic()
        try:
            if version is MqttVersion.V5:
                assert raw.receive(timeout=4.0) == Disconnect(0x8D)  # Keep Alive timeout
            assert raw.closed_by_server(timeout=4.0)
        finally:
            raw.close()
        assert time.monotonic() - accepted < 4.0  # 1.5 s, plus the scan; far below 10 s
        wait_for(lambda: watcher.payloads() == [b"silent"], 4, "the Will")
    finally:
        watcher.close()


def test_a_second_connection_with_the_same_client_id_takes_over(cluster: LocalCluster) -> None:
    device = unique("phone")
    first = RawMqtt(cluster.mqtt_address(0), MqttVersion.V5)
    second = RawMqtt(cluster.mqtt_address(0), MqttVersion.V5)
    try:
        first.connect(device)
        second.connect(device)
        assert first.receive() == Disconnect(0x8E)
        assert first.closed_by_server()
        second.send(encode_mqtt(Pingreq(), MqttVersion.V5))
        assert isinstance(second.receive(), Pingresp)
    finally:
        first.close()
        second.close()


# -- malformed input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "garbage",
    [
        pytest.param(b"\x30\xff\xff\xff\xff\x7f", id="bad remaining length"),
        pytest.param(b"\xc0\x00", id="PINGREQ before CONNECT"),
        pytest.param(b"GET / HTTP/1.1\r\n\r\n", id="not MQTT"),
        pytest.param(b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c\x00\x05", id="client id past the end"),
    ],
)
def test_malformed_input_closes_that_connection_only(cluster: LocalCluster, garbage: bytes) -> None:
    bystander = PahoDevice(cluster.mqtt_address(0), unique("ok"))
    raw = RawMqtt(cluster.mqtt_address(0))
    try:
        bystander.wait_connected()
        raw.send(garbage)
        assert raw.closed_by_server()
        bystander.publish(f"phones/{unique('p')}/spectrum", b"still fine")
    finally:
        raw.close()
        bystander.close()


def _connected_raw(cluster: LocalCluster, version: MqttVersion = MqttVersion.V311) -> RawMqtt:
    raw = RawMqtt(cluster.mqtt_address(1), version)
    raw.connect(unique("raw"))
    return raw


def test_wildcard_in_a_publish_topic_closes_the_connection(cluster: LocalCluster) -> None:
    raw = _connected_raw(cluster)
    try:
        ok = encode_mqtt(Publish("a/b", b"x", qos=1, packet_id=1), MqttVersion.V311)
        raw.send(ok.replace(b"a/b", b"a/#"))
        assert raw.closed_by_server()
    finally:
        raw.close()


def test_wrong_fixed_header_flags_close_the_connection(cluster: LocalCluster) -> None:
    raw = _connected_raw(cluster)
    try:
        raw.send(b"\xc1\x00")  # PINGREQ with a reserved flag set
        assert raw.closed_by_server()
    finally:
        raw.close()


def test_an_oversized_publish_gets_v5_disconnect_0x95(cluster: LocalCluster) -> None:
    raw = _connected_raw(cluster, MqttVersion.V5)
    try:
        raw.send(b"\x30\x80\x80\x80\x01")  # remaining length 2 MiB, body never sent
        assert raw.receive() == Disconnect(0x95)
        assert raw.closed_by_server()
    finally:
        raw.close()


def test_a_v5_connack_announces_the_limits_the_broker_enforces(cluster: LocalCluster) -> None:
    """Maximum Packet Size and Receive Maximum are in the CONNACK (absent, they would mean no
    limit and 65535, v5 §3.2.2.3.3/§3.2.2.3.6); a PUBLISH of exactly the maximum is taken, one
    byte more gets DISCONNECT 0x95 Packet too large."""
    device = unique("phone")
    topic = f"phones/{device}/spectrum"
    phone = PahoDevice(cluster.mqtt_address(1), device, version=paho.MQTTv5)
    try:
        phone.wait_connected()
        [properties] = phone.connack_properties
        maximum = properties.MaximumPacketSize
        assert maximum == MAX_PACKET_SIZE
        assert properties.ReceiveMaximum == RECEIVE_MAXIMUM
        # A payload that makes the PUBLISH (as paho frames it: v5, QoS 1, no properties)
        # exactly the announced maximum.
        framing = len(encode_mqtt(Publish(topic, b"", 1, packet_id=1), MqttVersion.V5))
        payload = b"m" * (maximum - framing)
        payload = payload[: len(payload) - 2]  # the remaining length takes 2 more bytes
        assert len(encode_mqtt(Publish(topic, payload, 1, packet_id=1), MqttVersion.V5)) == maximum
        phone.publish(topic, payload, qos=1)  # waits for the PUBACK
        assert not phone.disconnected.is_set()
        phone.client.publish(topic, payload + b"!", qos=1)
        assert phone.disconnected.wait(10)
        assert [int(rc.value) for rc in phone.disconnect_reasons] == [0x95]
    finally:
        phone.close()
    assert [len(r.value or b"") for r in keyed_records(cluster.bootstrap, "readings", device)] == [
        len(payload)
    ]


def test_deliveries_keep_to_the_clients_receive_maximum(cluster: LocalCluster) -> None:
    """At most the v5 client's Receive Maximum of QoS 1 deliveries are unacknowledged at once
    (MQTT-3.3.4-9); each PUBACK lets one more go."""
    device = unique("phone")
    topic = f"phones/{device}/commands"
    sub = RawMqtt(cluster.mqtt_address(0), MqttVersion.V5)
    pub = RawMqtt(cluster.mqtt_address(2), MqttVersion.V5)
    try:
        sub.connect(unique("sub"), properties=MqttProperties(receive_maximum=2))
        sub.send(encode_mqtt(Subscribe(1, (MqttSubscription(topic, 1),)), sub.version))
        assert isinstance(sub.receive(), Suback)
        pub.connect(unique("pub"))
        for packet_id in range(1, 6):
            pub.send(
                encode_mqtt(Publish(topic, b"%d" % packet_id, 1, packet_id=packet_id), pub.version)
            )
            assert pub.receive() == Puback(packet_id)
        got = [sub.receive(), sub.receive()]
        assert [p.payload for p in got if isinstance(p, Publish)] == [b"1", b"2"]
        with pytest.raises(TimeoutError):
            sub.receive(timeout=1.0)  # a third would exceed the window
        for expected in (b"3", b"4", b"5"):
            first = got.pop(0)
            assert isinstance(first, Publish)
            sub.send(encode_mqtt(Puback(first.packet_id), sub.version))
            nxt = sub.receive()
            assert isinstance(nxt, Publish) and nxt.payload == expected
            got.append(nxt)
    finally:
        sub.close()
        pub.close()


def test_puback_arrives_after_commit_for_pipelined_publishes(cluster: LocalCluster) -> None:
    device = unique("phone")
    raw = RawMqtt(cluster.mqtt_address(2))
    try:
        raw.connect(device)
        data = b"".join(
            encode_mqtt(
                Publish(f"phones/{device}/spectrum", b"%d" % i, qos=1, packet_id=i + 1),
                MqttVersion.V311,
            )
            for i in range(200)
        )
        raw.send(data)
        acks = [raw.receive() for _ in range(200)]
        assert acks == [Puback(i + 1) for i in range(200)]  # in order (MQTT-4.6.0-2)
    finally:
        raw.close()
    values = [r.value for r in keyed_records(cluster.bootstrap, "readings", device)]
    assert values == [b"%d" % i for i in range(200)]


def test_users_file_checks_passwords(tmp_path_factory: pytest.TempPathFactory) -> None:
    data = str(tmp_path_factory.mktemp("mqtt-auth"))
    with LocalCluster(data, 1, mqtt=True, mqtt_users={"alice": "s3cret"}) as single:
        good = RawMqtt(single.mqtt_address(0))
        bad = RawMqtt(single.mqtt_address(0))
        anonymous = RawMqtt(single.mqtt_address(0), MqttVersion.V5)
        try:
            assert good.connect("a", username="alice", password=b"s3cret").reason_code == 0
            assert bad.connect("b", username="alice", password=b"nope").reason_code == 0x04
            assert bad.closed_by_server()
            assert anonymous.connect("c").reason_code == 0x86
        finally:
            for raw in (good, bad, anonymous):
                raw.close()


# -- retained messages ----------------------------------------------------------------------------


def test_retained_message_is_served_by_another_broker_and_deleted_by_empty(
    cluster: LocalCluster,
) -> None:
    topic = f"{unique('lamp')}/state"
    pub = PahoDevice(cluster.mqtt_address(0), unique("p"))
    try:
        pub.wait_connected()
        pub.publish(topic, b"on", qos=1, retain=True)
    finally:
        pub.close()

    def subscribe_and_collect(broker: int) -> list[tuple[bytes, bool]]:
        late = PahoDevice(cluster.mqtt_address(broker), unique("late"))
        try:
            late.wait_connected()
            late.subscribe(f"{topic.split('/', maxsplit=1)[0]}/#", qos=1)
            time.sleep(0.5)  # whatever is retained is sent right after the SUBACK
            return [(bytes(m.payload), bool(m.retain)) for m in late.messages]
        finally:
            late.close()

    wait_for(lambda: subscribe_and_collect(2) == [(b"on", True)], 15, "the retained message")
    pub = PahoDevice(cluster.mqtt_address(1), unique("p"))
    try:
        pub.wait_connected()
        pub.publish(topic, b"", qos=1, retain=True)  # deletes it
    finally:
        pub.close()
    wait_for(lambda: subscribe_and_collect(0) == [], 15, "the retained message to go")


# -- slow devices ---------------------------------------------------------------------------------


def test_a_slow_device_is_disconnected_and_slows_no_one_else(cluster: LocalCluster) -> None:
    topic = f"{unique('firehose')}/data"
    slow = RawMqtt(cluster.mqtt_address(0))
    fast = PahoDevice(cluster.mqtt_address(0), unique("fast"))
    pub = RawMqtt(cluster.mqtt_address(1))
    try:
        slow.connect(unique("slow"))
        slow.send(encode_mqtt(Subscribe(1, (MqttSubscription(topic, 1),)), MqttVersion.V311))
        assert isinstance(slow.receive(), Suback)
        fast.wait_connected()
        fast.subscribe(topic, qos=1)
        pub.connect(unique("pub"))
        # 1000 QoS 1 deliveries may wait for an acknowledgement, 1 MiB more may queue: this is
        # more than the device that never acknowledges can take, and nothing to the other one.
        count = 2000
        pad = b"x" * 2048
        pub.send(
            b"".join(
                encode_mqtt(Publish(topic, b"%d:" % i + pad, qos=1, packet_id=i + 1), pub.version)
                for i in range(count)
            )
        )
        for _ in range(count):
            assert isinstance(pub.receive(), Puback)
        # The device that never acknowledges is cut off; the other gets everything.
        wait_for(lambda: len(fast.payloads()) == count, 30, "every message at the fast device")
        assert slow.closed_by_server(timeout=20)
    finally:
        slow.close()
        pub.close()
        fast.close()


def test_metrics_count_connections_and_messages(cluster: LocalCluster) -> None:
    client = PahoDevice(cluster.mqtt_address(2), unique("m"))
    try:
        client.wait_connected()
        client.publish(f"phones/{unique('p')}/spectrum", b"x")
        admin = cluster.ports[2].admin
        with urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=10) as reply:
            text = reply.read().decode()
    finally:
        client.close()
    figures = {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line.startswith("kafkaesque_mqtt_")
    }
    assert figures["kafkaesque_mqtt_connections_total"] >= 1
    assert figures["kafkaesque_mqtt_messages_in_total"] >= 1
    assert figures["kafkaesque_mqtt_connected"] >= 1
    assert "kafkaesque_mqtt_dropped_total" in figures


class _Device:
    """What ``Egress`` uses of a device when it only subscribes and drops."""

    def __init__(self) -> None:
        self.subscriptions: dict[str, Any] = {}


async def test_egress_says_when_its_shared_groups_change_and_only_then() -> None:
    """The listener tells its peers its shared groups when ``shares_changed`` is set (it no
    longer looks 20 times a second): set by a group's first member and by its last leaving."""

    async def no_topic(name: str) -> Any:
        raise AssertionError("not asked for")

    egress = Egress(0, cast(Any, None), cast(Any, None), TopicMapping.default(), no_topic)
    reading = trio.Event()
    reading.set()
    egress._start_reading = lambda log_topic: reading  # type: ignore[method-assign]
    one, two = _Device(), _Device()
    shared = MqttSubscription("$share/crew/a/b", qos=1)

    await egress.subscribe(cast(Any, one), [MqttSubscription("a/b", qos=1)])
    assert not egress.shares_changed.is_set()  # a plain subscription
    await egress.subscribe(cast(Any, one), [shared])
    assert egress.shares_changed.is_set()
    assert egress.local_shares() == {("crew", "a/b")}
    egress.shares_changed = trio.Event()  # as the listener does once it told its peers
    await egress.subscribe(cast(Any, two), [shared])
    egress.drop(cast(Any, one))
    assert not egress.shares_changed.is_set()  # the group still has a member
    egress.drop(cast(Any, two))
    assert egress.shares_changed.is_set()
    assert egress.local_shares() == frozenset()
