"""The bridge's MQTT client session core, without sockets: the server's bytes are made with the
same codec, server side (``encode_mqtt``), and ours decoded with a server-side ``MqttDecoder``."""

from __future__ import annotations

import pytest

from kafkaesque.protocol.mqtt import (
    Connack,
    Connect,
    Connected,
    Disconnect,
    MessageReceived,
    MqttClientCore,
    MqttClientOptions,
    MqttConnectionError,
    MqttDecoder,
    MqttPacket,
    MqttProperties,
    MqttSubscription,
    MqttVersion,
    Pingreq,
    Pingresp,
    Puback,
    Publish,
    PublishAcked,
    Suback,
    Subscribe,
    SubscribeAcked,
    encode_mqtt,
)

V5 = MqttVersion.V5


class Server:
    """The server's view: decodes what the client sent, encodes what it answers."""

    def __init__(self, version: MqttVersion = V5) -> None:
        self.version = version
        self.decoder = MqttDecoder(server_side=True)

    def read(self, data: bytes) -> list[MqttPacket]:
        self.decoder.feed(data)
        return self.decoder.decode_many()

    def send(self, *packets: MqttPacket) -> bytes:
        return b"".join(encode_mqtt(p, self.version) for p in packets)


def connected(
    version: MqttVersion = V5, *, keep_alive_s: int = 30, connack: Connack | None = None
) -> tuple[MqttClientCore, Server]:
    core = MqttClientCore(
        MqttClientOptions("127.0.0.1", 1883, "bridge", version=version, keep_alive_s=keep_alive_s),
        now=0.0,
    )
    server = Server(version)
    (connect,) = server.read(core.connect_bytes())
    assert isinstance(connect, Connect)
    events = core.receive_data(server.send(connack or Connack()))
    assert isinstance(events[0], Connected)
    return core, server


def test_connect_keeps_the_session_and_asks_for_a_long_expiry() -> None:
    core = MqttClientCore(MqttClientOptions("h", 1, "bridge-1", receive_maximum=500), now=0.0)
    (connect,) = Server().read(core.connect_bytes())
    assert isinstance(connect, Connect)
    assert connect.client_id == "bridge-1"
    assert connect.clean_start is False
    assert connect.properties.session_expiry_interval == 7 * 24 * 3600
    assert connect.properties.receive_maximum == 500


def test_v311_connect_has_no_properties_and_clean_session_off() -> None:
    core = MqttClientCore(MqttClientOptions("h", 1, "b", version=MqttVersion.V311), now=0.0)
    (connect,) = Server().read(core.connect_bytes())
    assert isinstance(connect, Connect) and connect.clean_start is False
    assert connect.properties.is_empty()


def test_a_refused_connect_ends_the_connection_with_the_reason() -> None:
    core = MqttClientCore(MqttClientOptions("h", 1, "b"), now=0.0)
    core.connect_bytes()
    with pytest.raises(MqttConnectionError) as refused:
        core.receive_data(Server().send(Connack(reason_code=0x86)))
    assert refused.value.reason_code == 0x86


def test_connack_reports_session_present_and_the_server_receive_maximum() -> None:
    core = MqttClientCore(MqttClientOptions("h", 1, "b"), now=0.0)
    core.connect_bytes()
    connack = Connack(session_present=True, properties=MqttProperties(receive_maximum=2))
    assert core.receive_data(Server().send(connack)) == [Connected(True, 2)]


def test_pubacks_leave_only_when_told_and_in_arrival_order() -> None:
    core, server = connected()
    publishes = [Publish("t", b"%d" % i, qos=1, packet_id=10 + i) for i in range(3)]
    events = core.receive_data(server.send(*publishes))
    assert events == [MessageReceived(p) for p in publishes]
    assert core.unacked_inbound == 3
    assert core.ack(12) == b""  # the third first: it must wait for the first two
    assert core.ack(11) == b""
    assert server.read(core.ack(10)) == [Puback(10), Puback(11), Puback(12)]
    assert core.unacked_inbound == 0
    assert core.ack(10) == b""  # twice: nothing more


@pytest.mark.parametrize("version", [MqttVersion.V311, V5])
@pytest.mark.parametrize("packet_id", [1, 255, 256, 65535])
def test_a_puback_is_the_encoders_puback(version: MqttVersion, packet_id: int) -> None:
    core, server = connected(version)
    core.receive_data(server.send(Publish("t", b"x", qos=1, packet_id=packet_id)))
    assert core.ack(packet_id) == encode_mqtt(Puback(packet_id), version)


def test_qos0_messages_need_no_ack() -> None:
    core, server = connected()
    (event,) = core.receive_data(server.send(Publish("t", b"x")))
    assert isinstance(event, MessageReceived) and event.publish.qos == 0
    assert core.unacked_inbound == 0


def test_a_resend_of_a_message_still_in_flight_is_not_delivered_twice() -> None:
    core, server = connected(MqttVersion.V311)
    first = Publish("t", b"x", qos=1, packet_id=5)
    assert len(core.receive_data(server.send(first))) == 1
    assert core.receive_data(server.send(Publish("t", b"x", qos=1, packet_id=5, dup=True))) == []
    assert server.read(core.ack(5)) == [Puback(5)]


def test_subscribe_and_publish_take_distinct_packet_ids_freed_by_their_answers() -> None:
    core, server = connected()
    sub_id, data = core.subscribe([MqttSubscription("$share/g/a/+", qos=1)])
    (subscribe,) = server.read(data)
    assert isinstance(subscribe, Subscribe) and subscribe.packet_id == sub_id
    pub_id, data = core.publish("a/b", b"hi")
    (publish,) = server.read(data)
    assert isinstance(publish, Publish) and publish.qos == 1 and publish.packet_id == pub_id
    assert pub_id != sub_id and core.outbound_in_flight == 2
    events = core.receive_data(server.send(Puback(pub_id), Suback(sub_id, (1,))))
    assert events == [PublishAcked(pub_id, 0), SubscribeAcked(sub_id, (1,))]
    assert core.outbound_in_flight == 0


def test_publishing_stops_at_the_server_receive_maximum() -> None:
    core, server = connected(connack=Connack(properties=MqttProperties(receive_maximum=1)))
    pub_id, _ = core.publish("a", b"1")
    assert not core.can_publish()
    with pytest.raises(RuntimeError):
        core.publish("a", b"2")
    core.receive_data(server.send(Puback(pub_id)))
    assert core.can_publish()


def test_a_puback_for_an_unknown_packet_id_is_a_protocol_violation() -> None:
    core, server = connected()
    with pytest.raises(MqttConnectionError, match="unknown packet id"):
        core.receive_data(server.send(Puback(77)))


def test_keep_alive_pings_when_idle_and_gives_up_without_an_answer() -> None:
    core, server = connected(keep_alive_s=10)
    assert core.tick(5.0) == b""
    assert core.next_tick_at() == 10.0
    assert server.read(core.tick(10.0)) == [Pingreq()]
    assert core.tick(15.0) == b""  # waiting for PINGRESP
    core.receive_data(server.send(Pingresp()))
    core.note_sent(12.0)
    assert core.next_tick_at() == 22.0
    assert server.read(core.tick(22.0)) == [Pingreq()]
    with pytest.raises(MqttConnectionError, match="PINGRESP"):
        core.tick(32.0)


def test_sending_resets_the_keep_alive_timer() -> None:
    core, _ = connected(keep_alive_s=10)
    core.note_sent(8.0)
    assert core.tick(10.0) == b""
    assert core.next_tick_at() == 18.0


def test_a_server_disconnect_ends_the_connection() -> None:
    core, server = connected()
    with pytest.raises(MqttConnectionError) as ended:
        core.receive_data(server.send(Disconnect(reason_code=0x8E)))
    assert ended.value.reason_code == 0x8E


def test_after_the_connection_ended_old_acks_send_nothing() -> None:
    core, server = connected()
    core.receive_data(server.send(Publish("t", b"x", qos=1, packet_id=1)))
    with pytest.raises(MqttConnectionError):
        core.receive_data(server.send(Disconnect()))
    assert core.ack(1) == b""
