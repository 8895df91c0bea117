"""The MQTT server connection state machine: packets in, actions out (no sockets, no clock)."""

from __future__ import annotations

import pytest

from kafkaesque.protocol.mqtt import (
    CONNECT_TIMEOUT_S,
    RECEIVE_MAXIMUM,
    TOPIC_ALIAS_MAXIMUM,
    Accepted,
    Action,
    Append,
    Close,
    Connack,
    Connect,
    Disconnect,
    MqttDecoder,
    MqttPacket,
    MqttProperties,
    MqttServerConnection,
    MqttSubscription,
    MqttVersion,
    Pingreq,
    Pingresp,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Refused,
    Released,
    Send,
    Suback,
    Subscribe,
    Subscribed,
    Unsuback,
    Unsubscribe,
    Unsubscribed,
    Will,
    encode_mqtt,
)
from kafkaesque.security import MqttAcl

V311 = MqttVersion.V311
V5 = MqttVersion.V5


def sent(actions: list[Action], version: MqttVersion) -> list[MqttPacket]:
    """The packets of the Send actions, decoded as a client would."""
    decoder = MqttDecoder(server_side=False, version=version)
    for action in actions:
        if isinstance(action, Send):
            decoder.feed(action.data)
    return decoder.decode_many()


def closes(actions: list[Action]) -> list[Close]:
    return [a for a in actions if isinstance(a, Close)]


def connected(
    version: MqttVersion = V311, *, keep_alive: int = 0, will: Will | None = None, **kw: object
) -> MqttServerConnection:
    conn = MqttServerConnection(0.0, **kw)  # type: ignore[arg-type]
    actions = conn.receive(
        encode_mqtt(Connect("dev-1", keep_alive=keep_alive, will=will), version), 0.0
    )
    assert [type(a) for a in actions] == [Accepted]
    max_packet_size = kw.get("max_packet_size", 1 << 20)
    assert isinstance(max_packet_size, int)
    assert sent([Send(conn.connack(False))], version) == [
        Connack(False, 0, connack_properties(version, max_packet_size, conn.inbound_maximum))
    ]
    return conn


def connack_properties(
    version: MqttVersion, max_packet_size: int = 1 << 20, receive_maximum: int = RECEIVE_MAXIMUM
) -> MqttProperties:
    """What a CONNACK announces: to a v5 client, the limits it must keep to (v5 §3.2.2.3.3,
    §3.2.2.3.6: absent ones would mean none) and the topic aliases it may set up."""
    if version is V5:
        return MqttProperties(
            receive_maximum=receive_maximum,
            maximum_packet_size=max_packet_size,
            topic_alias_maximum=TOPIC_ALIAS_MAXIMUM,
        )
    return MqttProperties()


# -- CONNECT ------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [V311, V5])
def test_connect_is_accepted_and_answered(version: MqttVersion) -> None:
    conn = MqttServerConnection(0.0)
    connect = Connect("dev-1", clean_start=False, keep_alive=30)
    actions = conn.receive(encode_mqtt(connect, version), 1.0)
    assert actions == [Accepted("dev-1", False, None, version, version is V311)]
    assert sent([Send(conn.connack(True))], version) == [
        Connack(True, 0, connack_properties(version))
    ]
    assert conn.connected and conn.client_id == "dev-1" and conn.keep_alive == 30


def test_v311_empty_client_id_needs_clean_session() -> None:
    conn = MqttServerConnection(0.0)
    actions = conn.receive(encode_mqtt(Connect("", clean_start=False), V311), 0.0)
    assert sent(actions, V311) == [Connack(False, 0x02)]  # identifier rejected
    assert closes(actions) == [Close(closes(actions)[0].reason, False)]


def test_empty_client_id_with_clean_session_gets_one_assigned() -> None:
    conn = MqttServerConnection(0.0)
    conn.receive(encode_mqtt(Connect("", clean_start=True), V5), 0.0)
    [connack] = sent([Send(conn.connack(False))], V5)
    assert isinstance(connack, Connack) and connack.reason_code == 0
    assert connack.properties.assigned_client_identifier == conn.client_id
    assert conn.client_id and conn.client_id.startswith("auto-")


@pytest.mark.parametrize(("version", "code"), [(V311, 0x04), (V5, 0x86)])
def test_credentials_go_to_the_driver_which_may_refuse_them(
    version: MqttVersion, code: int
) -> None:
    conn = MqttServerConnection(0.0, credentials_required=True)
    connect = Connect("dev-1", username="alice", password=b"wrong")
    publish = Publish("a/b", b"x", qos=1, packet_id=1)
    actions = conn.receive(encode_mqtt(connect, version) + encode_mqtt(publish, version), 0.0)
    [accepted] = [a for a in actions if isinstance(a, Accepted)]
    assert (accepted.username, accepted.password) == ("alice", b"wrong")
    refused = conn.bad_credentials()
    assert sent(refused, version) == [Connack(False, code)]
    assert len(closes(refused)) == 1 and conn.closed and not closes(refused)[0].will
    assert conn.bad_credentials() == []


@pytest.mark.parametrize(("version", "code"), [(V311, 0x05), (V5, 0x87)])
def test_not_authorized_refuses_an_accepted_connect(version: MqttVersion, code: int) -> None:
    conn = MqttServerConnection(0.0, credentials_required=True)
    conn.receive(encode_mqtt(Connect("d", username="u", password=b"p"), version), 0.0)
    refused = conn.not_authorized()
    assert sent(refused, version) == [Connack(False, code)] and conn.closed


def test_a_connect_without_credentials_is_refused_when_they_are_required() -> None:
    anonymous = MqttServerConnection(0.0, credentials_required=True)
    refused = anonymous.receive(encode_mqtt(Connect("d"), V311), 0.0)
    assert sent(refused, V311) == [Connack(False, 0x04)]
    no_password = MqttServerConnection(0.0, credentials_required=True)
    refused = no_password.receive(encode_mqtt(Connect("d", username="alice"), V5), 0.0)
    assert sent(refused, V5) == [Connack(False, 0x86)]
    open_conn = MqttServerConnection(0.0)
    [accepted] = open_conn.receive(encode_mqtt(Connect("d", username="x"), V311), 0.0)
    assert isinstance(accepted, Accepted) and accepted.password is None


# -- ACLs -----------------------------------------------------------------------------------------

ACL = MqttAcl.parse("pattern write phones/%c/spectrum\npattern read phones/%c/commands\n")


def acl_connection(version: MqttVersion, client_id: str = "p1") -> MqttServerConnection:
    conn = MqttServerConnection(0.0, acl=ACL)
    [accepted] = conn.receive(encode_mqtt(Connect(client_id), version), 0.0)
    assert isinstance(accepted, Accepted)
    return conn


@pytest.mark.parametrize(
    ("version", "qos", "answer"),
    [
        (V5, 1, Puback(7, 0x87)),
        (V5, 2, Pubrec(7, 0x87)),
        (V311, 1, Puback(7)),  # acknowledged and dropped (MQTT-3.3.5-2)
        (V311, 2, Pubrec(7)),
        (V5, 0, None),
        (V311, 0, None),
    ],
)
def test_a_refused_publish_is_answered_and_not_appended(
    version: MqttVersion, qos: int, answer: MqttPacket | None
) -> None:
    conn = acl_connection(version)
    publish = Publish("phones/p2/spectrum", b"x", qos=qos, packet_id=7 if qos else 0)
    actions = conn.receive(encode_mqtt(publish, version), 0.0)
    assert not any(isinstance(a, Append) for a in actions)
    assert Refused("publish", "phones/p2/spectrum") in actions
    assert sent(actions, version) == ([] if answer is None else [answer])
    assert not conn.closed and conn.unanswered == 0
    if qos == 2 and version is V311:  # its PUBREL is answered
        done = conn.receive(encode_mqtt(Pubrel(7), version), 0.0)
        assert sent(done, version) == [Pubcomp(7)]


def test_an_allowed_publish_is_appended() -> None:
    conn = acl_connection(V5)
    publish = Publish("phones/p1/spectrum", b"x", qos=1, packet_id=1)
    [append] = conn.receive(encode_mqtt(publish, V5), 0.0)
    assert isinstance(append, Append) and append.topic == "phones/p1/spectrum"


def test_a_publish_right_behind_the_connect_is_checked_too() -> None:
    conn = MqttServerConnection(0.0, acl=ACL)
    data = encode_mqtt(Connect("p1"), V5) + encode_mqtt(
        Publish("phones/p2/spectrum", b"x", qos=1, packet_id=1), V5
    )
    actions = conn.receive(data, 0.0)
    assert not any(isinstance(a, Append) for a in actions)


@pytest.mark.parametrize(("version", "refused_code"), [(V5, 0x87), (V311, 0x80)])
def test_a_refused_filter_gets_its_code_in_the_suback(
    version: MqttVersion, refused_code: int
) -> None:
    conn = acl_connection(version)
    subscribe = Subscribe(
        3,
        (
            MqttSubscription("phones/p1/commands", 1),
            MqttSubscription("phones/+/commands", 1),
        ),
    )
    actions = conn.receive(encode_mqtt(subscribe, version), 0.0)
    assert Refused("subscribe", "phones/+/commands") in actions
    [subscribed] = [a for a in actions if isinstance(a, Subscribed)]
    assert [s.topic_filter for s in subscribed.subscriptions] == ["phones/p1/commands"]
    assert sent([Send(subscribed.suback)], version) == [Suback(3, (1, refused_code))]


def test_a_will_the_client_may_not_publish_refuses_the_connect() -> None:
    conn = MqttServerConnection(0.0, acl=ACL)
    connect = Connect("p1", will=Will("phones/p2/spectrum", b"gone", 0, False))
    actions = conn.receive(encode_mqtt(connect, V5), 0.0)
    assert Refused("will", "phones/p2/spectrum") in actions
    assert sent(actions, V5) == [Connack(False, 0x87)] and conn.closed
    fine = MqttServerConnection(0.0, acl=ACL)
    connect = Connect("p1", will=Will("phones/p1/spectrum", b"gone", 0, False))
    assert isinstance(fine.receive(encode_mqtt(connect, V5), 0.0)[0], Accepted)


def test_a_packet_before_connect_closes_without_an_answer() -> None:
    conn = MqttServerConnection(0.0)
    actions = conn.receive(encode_mqtt(Pingreq(), V311), 0.0)
    assert [type(a) for a in actions] == [Close]


def test_unknown_protocol_level_gets_connack_0x01() -> None:
    conn = MqttServerConnection(0.0)
    bad = bytearray(encode_mqtt(Connect("d"), V311))
    bad[8] = 9  # the protocol level byte (after 0x10, length, 00 04 'MQTT')
    actions = conn.receive(bytes(bad), 0.0)
    assert sent(actions, V311) == [Connack(False, 0x01)]
    assert conn.closed


def test_no_connect_in_time_closes() -> None:
    conn = MqttServerConnection(0.0)
    assert conn.deadline() == CONNECT_TIMEOUT_S
    assert conn.expired(CONNECT_TIMEOUT_S - 1) == []
    [close] = conn.expired(CONNECT_TIMEOUT_S)
    assert isinstance(close, Close) and not close.will


# -- keep-alive ---------------------------------------------------------------------------------


def test_keep_alive_allows_one_and_a_half_periods() -> None:
    conn = connected(keep_alive=10)
    conn.receive(encode_mqtt(Pingreq(), V311), 5.0)
    assert conn.deadline() == 5.0 + 15.0
    assert conn.expired(19.9) == []
    [close] = conn.expired(20.0)
    assert isinstance(close, Close) and close.will


def test_keep_alive_zero_never_expires() -> None:
    conn = connected(keep_alive=0)
    assert conn.deadline() == float("inf")


def test_v5_keep_alive_expiry_sends_disconnect_0x8d() -> None:
    conn = connected(V5, keep_alive=2)
    actions = conn.expired(3.0)
    assert sent(actions, V5) == [Disconnect(0x8D)]


def test_pingreq_gets_pingresp() -> None:
    conn = connected()
    assert sent(conn.receive(encode_mqtt(Pingreq(), V311), 1.0), V311) == [Pingresp()]


# -- PUBLISH ------------------------------------------------------------------------------------


def test_qos0_appends_without_ack() -> None:
    conn = connected()
    actions = conn.receive(encode_mqtt(Publish("a/b", b"x"), V311), 1.0)
    assert actions == [Append("a/b", b"x", 0, False, b"")]


def test_qos1_appends_with_a_puback_for_after_the_commit() -> None:
    conn = connected()
    actions = conn.receive(encode_mqtt(Publish("a/b", b"x", qos=1, packet_id=7), V311), 1.0)
    assert actions == [Append("a/b", b"x", 1, False, encode_mqtt(Puback(7), V311), 7)]


def test_a_qos1_publish_with_dup_set_is_a_resend_to_look_up_first() -> None:
    conn = connected()
    publish = Publish("a/b", b"x", qos=1, dup=True, packet_id=7)
    actions = conn.receive(encode_mqtt(publish, V311), 1.0)
    assert actions == [Append("a/b", b"x", 1, False, encode_mqtt(Puback(7), V311), 7, True)]


def test_several_packets_in_one_read_keep_their_order() -> None:
    conn = connected()
    data = b"".join(
        encode_mqtt(Publish("t", b"%d" % i, qos=1, packet_id=i + 1), V311) for i in range(5)
    )
    actions = conn.receive(data[:13], 1.0) + conn.receive(data[13:], 1.0)
    assert [a.payload for a in actions if isinstance(a, Append)] == [b"0", b"1", b"2", b"3", b"4"]


def test_qos2_is_appended_once_and_released() -> None:
    conn = connected()
    publish = Publish("a/b", b"x", qos=2, packet_id=9)
    first = conn.receive(encode_mqtt(publish, V311), 1.0)
    assert first == [Append("a/b", b"x", 2, False, encode_mqtt(Pubrec(9), V311), 9)]
    # The device did not see the PUBREC and sends the PUBLISH again, DUP set: PUBREC only.
    again = conn.receive(encode_mqtt(Publish("a/b", b"x", qos=2, packet_id=9, dup=True), V311), 2)
    assert sent(again, V311) == [Pubrec(9)] and len(again) == 1
    [released] = conn.receive(encode_mqtt(Pubrel(9), V311), 3.0)
    assert released == Released(9, encode_mqtt(Pubcomp(9), V311))
    assert conn.awaiting_release == set()
    # A PUBREL for an unknown id is answered at once (v5: reason 0x92 would say so).
    assert sent(conn.receive(encode_mqtt(Pubrel(10), V311), 3.5), V311) == [Pubcomp(10)]
    # After PUBCOMP the id is free: a new PUBLISH with it is a new message.
    new = conn.receive(encode_mqtt(publish, V311), 4.0)
    assert [type(a) for a in new] == [Append]


def test_v5_publishes_beyond_the_announced_receive_maximum_get_disconnect_0x93() -> None:
    conn = connected(V5, receive_maximum=2)
    topic = "phones/p1/spectrum"
    first = conn.receive(encode_mqtt(Publish(topic, b"1", qos=1, packet_id=1), V5), 0.0)
    second = conn.receive(encode_mqtt(Publish(topic, b"2", qos=2, packet_id=2), V5), 0.0)
    assert [type(a) for a in first + second] == [Append, Append]
    conn.answered()  # the PUBACK of the first went out: room for one more
    third = conn.receive(encode_mqtt(Publish(topic, b"3", qos=1, packet_id=3), V5), 0.0)
    assert [type(a) for a in third] == [Append]
    # QoS 0 does not count; a retransmission of an unreleased QoS 2 message is not a new one.
    more = conn.receive(encode_mqtt(Publish(topic, b"q0", qos=0), V5), 0.0)
    more += conn.receive(encode_mqtt(Publish(topic, b"2", qos=2, dup=True, packet_id=2), V5), 0.0)
    assert [type(a) for a in more] == [Append, Send]
    fourth = conn.receive(encode_mqtt(Publish(topic, b"4", qos=1, packet_id=4), V5), 0.0)
    assert sent(fourth, V5) == [Disconnect(0x93)]
    assert [c.will for c in closes(fourth)] == [True]


def test_v311_has_no_receive_maximum_to_exceed() -> None:
    conn = connected(V311, receive_maximum=1)
    topic = "phones/p1/spectrum"
    for packet_id in (1, 2, 3):
        actions = conn.receive(encode_mqtt(Publish(topic, b"x", 1, packet_id=packet_id), V311), 0)
        assert [type(a) for a in actions] == [Append]  # TCP backpressure is its only bound


def test_a_pubcomp_for_an_earlier_connection_does_not_lend_quota() -> None:
    conn = connected(V5, receive_maximum=1)
    conn.answered()  # the PUBCOMP of a QoS 2 message the session had before this connection
    topic = "phones/p1/spectrum"
    conn.receive(encode_mqtt(Publish(topic, b"1", qos=1, packet_id=1), V5), 0.0)
    second = conn.receive(encode_mqtt(Publish(topic, b"2", qos=1, packet_id=2), V5), 0.0)
    assert sent(second, V5) == [Disconnect(0x93)]


def test_receive_maximum_must_be_a_two_byte_count_above_0() -> None:
    with pytest.raises(ValueError, match="receive_maximum"):
        MqttServerConnection(0.0, receive_maximum=0)


def test_wildcard_in_publish_topic_closes_the_connection() -> None:
    conn = connected()
    bad = bytearray(encode_mqtt(Publish("a/b", b"x"), V311))
    bad[bad.index(b"a/b") + 2] = ord("#")
    actions = conn.receive(bytes(bad), 1.0)
    assert [type(a) for a in actions] == [Close] and conn.closed


def test_v5_malformed_packet_gets_disconnect_with_reason() -> None:
    conn = connected(V5)
    bad = bytearray(encode_mqtt(Publish("a/b", b"x"), V5))
    bad[bad.index(b"a/b") + 2] = ord("+")
    actions = conn.receive(bytes(bad), 1.0)
    [disconnect] = sent(actions, V5)
    assert isinstance(disconnect, Disconnect) and disconnect.reason_code == 0x90
    assert closes(actions)[0].will  # an abnormal end: the Will is due


def test_oversized_packet_closes_before_the_body_arrives() -> None:
    conn = connected(V5, max_packet_size=1024)
    big = encode_mqtt(Publish("a", b"x" * 5000), V5)
    actions = conn.receive(big[:8], 1.0)
    assert sent(actions, V5) == [Disconnect(0x95)]
    assert conn.closed


def test_a_topic_alias_stands_for_the_topic_it_was_set_with() -> None:
    conn = connected(V5)
    with_alias = MqttProperties(topic_alias=3)
    first = Publish("phones/p1/spectrum", b"a", properties=with_alias)
    then = Publish("", b"b", properties=with_alias)  # the alias alone (v5 3.3.2.3.4)
    renamed = Publish("phones/p1/battery", b"c", properties=with_alias)  # a new mapping
    actions = conn.receive(b"".join(encode_mqtt(p, V5) for p in (first, then, renamed, then)), 1)
    assert [(a.topic, a.payload) for a in actions if isinstance(a, Append)] == [
        ("phones/p1/spectrum", b"a"),
        ("phones/p1/spectrum", b"b"),
        ("phones/p1/battery", b"c"),
        ("phones/p1/battery", b"b"),
    ]
    assert not conn.closed


def test_an_alias_that_was_never_set_is_a_protocol_error() -> None:
    conn = connected(V5)
    publish = Publish("", b"x", properties=MqttProperties(topic_alias=7))
    actions = conn.receive(encode_mqtt(publish, V5), 1.0)
    assert not [a for a in actions if isinstance(a, Append)]
    assert sent(actions, V5) == [Disconnect(0x82)]


def test_an_alias_above_the_announced_maximum_is_invalid() -> None:
    conn = connected(V5)
    alias = MqttProperties(topic_alias=TOPIC_ALIAS_MAXIMUM + 1)
    actions = conn.receive(encode_mqtt(Publish("a", b"x", properties=alias), V5), 1.0)
    assert sent(actions, V5) == [Disconnect(0x94)]  # MQTT-3.3.2-9


def test_aliases_belong_to_one_connection() -> None:
    """A reconnect (even of the same session) starts with no aliases (v5 3.3.2.3.4)."""
    first = connected(V5)
    first.receive(
        encode_mqtt(Publish("a/b", b"x", properties=MqttProperties(topic_alias=1)), V5), 1
    )
    second = connected(V5)
    actions = second.receive(
        encode_mqtt(Publish("", b"y", properties=MqttProperties(topic_alias=1)), V5), 1
    )
    assert sent(actions, V5) == [Disconnect(0x82)]


# -- SUBSCRIBE ----------------------------------------------------------------------------------


def test_subscribe_grants_and_refuses_per_filter() -> None:
    conn = connected()
    subscribe = Subscribe(
        3,
        (
            MqttSubscription("phones/+/commands", 1),
            MqttSubscription("a/#", 2),
            MqttSubscription("$share/g/x/+", 0),
            MqttSubscription("$share//x", 0),
        ),
    )
    [subscribed] = conn.receive(encode_mqtt(subscribe, V311), 1.0)
    assert isinstance(subscribed, Subscribed)
    assert [s.topic_filter for s in subscribed.subscriptions] == [
        "phones/+/commands",
        "a/#",
        "$share/g/x/+",
    ]
    # The driver sends the SUBACK once the subscriptions are live.
    assert sent([Send(subscribed.suback)], V311) == [Suback(3, (1, 2, 0, 0x80))]


def test_a_v5_subscription_identifier_goes_with_each_filter_and_back_out() -> None:
    conn = connected(V5)
    subscribe = Subscribe(
        4,
        (MqttSubscription("a/+", 1), MqttSubscription("b/#", 0)),
        MqttProperties(subscription_identifiers=(7,)),
    )
    [subscribed] = conn.receive(encode_mqtt(subscribe, V5), 1.0)
    assert isinstance(subscribed, Subscribed)
    assert [s.identifier for s in subscribed.subscriptions] == [7, 7]
    data = conn.deliver("a/x", b"x", 1, identifiers=(7, 9))
    assert data is not None
    [publish] = sent([Send(data)], V5)
    assert isinstance(publish, Publish) and publish.properties.subscription_identifiers == (7, 9)


def test_subscribe_with_nothing_granted_just_answers() -> None:
    conn = connected(V5)
    actions = conn.receive(encode_mqtt(Subscribe(5, (MqttSubscription("$share//x"),)), V5), 1.0)
    assert sent(actions, V5) == [Suback(5, (0x8F,))]


def test_unsubscribe() -> None:
    conn = connected(V5)
    actions = conn.receive(encode_mqtt(Unsubscribe(4, ("a/#",)), V5), 1.0)
    assert sent(actions, V5) == [Unsuback(4, (0,))]
    assert actions[-1] == Unsubscribed(("a/#",))


# -- deliveries ---------------------------------------------------------------------------------


def test_deliveries_take_packet_ids_until_acknowledged() -> None:
    conn = connected()
    data = conn.deliver("a", b"x", 1)
    assert data is not None
    decoder = MqttDecoder(server_side=False, version=V311)
    decoder.feed(data)
    [publish] = decoder.decode_many()
    assert isinstance(publish, Publish) and publish.qos == 1
    assert conn.inflight == {publish.packet_id: 1}
    conn.receive(encode_mqtt(Puback(publish.packet_id), V311), 2.0)
    assert conn.inflight == {}


def test_qos2_delivery_handshake() -> None:
    conn = connected()
    data = conn.deliver("a", b"x", 2)
    assert data is not None
    [packet_id] = conn.inflight
    rel = conn.receive(encode_mqtt(Pubrec(packet_id), V311), 1.0)
    assert sent(rel, V311) == [Pubrel(packet_id)]
    conn.receive(encode_mqtt(Pubcomp(packet_id), V311), 1.0)
    assert conn.inflight == {}


# -- endings and Wills --------------------------------------------------------------------------


def test_disconnect_suppresses_the_will() -> None:
    conn = connected(will=Will("dead", b"bye"))
    actions = conn.receive(encode_mqtt(Disconnect(), V311), 1.0)
    assert [(type(a), getattr(a, "will", None)) for a in actions] == [(Close, False)]
    assert conn.connection_lost() == []


def test_v5_disconnect_with_will_message_keeps_it() -> None:
    conn = connected(V5, will=Will("dead", b"bye"))
    actions = conn.receive(encode_mqtt(Disconnect(0x04), V5), 1.0)
    assert closes(actions)[0].will


def test_lost_connection_publishes_the_will() -> None:
    conn = connected(will=Will("dead", b"bye"))
    [close] = conn.connection_lost()
    assert isinstance(close, Close) and close.will


def test_take_over_sends_v5_disconnect_0x8e() -> None:
    conn = connected(V5)
    actions = conn.take_over()
    assert sent(actions, V5) == [Disconnect(0x8E)]
    assert conn.closed and conn.receive(encode_mqtt(Pingreq(), V5), 1.0) == []


def test_v5_session_expiry_makes_the_session_persistent() -> None:
    conn = MqttServerConnection(0.0)
    connect = Connect("d", clean_start=True, properties=MqttProperties(session_expiry_interval=60))
    [accepted] = conn.receive(encode_mqtt(connect, V5), 0.0)
    assert isinstance(accepted, Accepted) and accepted.persistent and accepted.clean_start


@pytest.mark.parametrize(
    ("interval", "lifetime"), [(None, 0), (0, 0), (1, 1), (3600, 3600), (0xFFFFFFFF, None)]
)
def test_v5_session_expiry_interval_is_the_sessions_lifetime(
    interval: int | None, lifetime: int | None
) -> None:
    conn = MqttServerConnection(0.0)
    properties = MqttProperties(session_expiry_interval=interval)
    [accepted] = conn.receive(encode_mqtt(Connect("d", properties=properties), V5), 0.0)
    assert isinstance(accepted, Accepted) and accepted.persistent is (lifetime != 0)
    assert conn.session_expiry_s == lifetime  # 0: ends with the connection; None: never


def test_a_v311_persistent_session_never_expires() -> None:
    conn = MqttServerConnection(0.0)
    [accepted] = conn.receive(encode_mqtt(Connect("d", clean_start=False), V311), 0.0)
    assert isinstance(accepted, Accepted) and accepted.persistent
    assert conn.session_expiry_s is None


def test_v5_disconnect_may_change_the_session_expiry() -> None:
    conn = MqttServerConnection(0.0)
    connect = Connect("d", properties=MqttProperties(session_expiry_interval=60))
    conn.receive(encode_mqtt(connect, V5), 0.0)
    disconnect = Disconnect(0, MqttProperties(session_expiry_interval=0))
    actions = conn.receive(encode_mqtt(disconnect, V5), 1.0)
    assert [type(a) for a in actions] == [Close] and conn.session_expiry_s == 0


def test_v5_disconnect_giving_a_life_to_a_session_that_had_none_is_a_protocol_error() -> None:
    conn = connected(V5)  # no Session Expiry Interval: the session ends with the connection
    disconnect = Disconnect(0, MqttProperties(session_expiry_interval=30))
    actions = conn.receive(encode_mqtt(disconnect, V5), 1.0)
    assert sent(actions, V5) == [Disconnect(0x82)]  # MQTT-3.14.2-2
    assert closes(actions) and conn.session_expiry_s == 0


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_a_publish_carries_its_message_expiry_to_the_log(qos: int) -> None:
    conn = connected(V5)
    publish = Publish(
        "t", b"x", qos, packet_id=qos and 5, properties=MqttProperties(message_expiry_interval=30)
    )
    [append] = conn.receive(encode_mqtt(publish, V5), 1.0)
    assert isinstance(append, Append) and append.property_headers == (("mqtt.expiry", b"30"),)


def test_a_publish_carries_its_message_properties_to_the_log_in_order() -> None:
    conn = connected(V5)
    properties = MqttProperties(
        payload_format_indicator=1,
        content_type="application/json",
        response_topic="phones/p1/replies",
        correlation_data=b"\x00\x01req-7",
        user_properties=(("unit", "dB"), ("site", "north"), ("unit", "raw")),
    )
    publish = Publish("t", b"{}", 1, packet_id=3, properties=properties)
    [append] = conn.receive(encode_mqtt(publish, V5), 1.0)
    assert isinstance(append, Append)
    assert append.property_headers == (
        ("mqtt.format", b"1"),
        ("mqtt.content-type", b"application/json"),
        ("mqtt.response-topic", b"phones/p1/replies"),
        ("mqtt.correlation", b"\x00\x01req-7"),
        ("mqtt.user.unit", b"dB"),
        ("mqtt.user.site", b"north"),
        ("mqtt.user.unit", b"raw"),  # a name may repeat; the order is kept (MQTT-3.3.2-18)
    )


@pytest.mark.parametrize(("version", "sent_expiry"), [(V5, 12), (V311, None)])
def test_a_delivery_passes_on_what_remains_of_the_expiry(
    version: MqttVersion, sent_expiry: int | None
) -> None:
    conn = connected(version)
    data = conn.deliver("t", b"x", 1, expiry_s=12)
    assert data is not None
    [publish] = sent([Send(data)], version)
    assert isinstance(publish, Publish)
    assert publish.properties.message_expiry_interval == sent_expiry  # 3.1.1 has no properties


@pytest.mark.parametrize("version", [V5, V311])
def test_a_delivery_passes_on_the_messages_properties_to_v5_only(version: MqttVersion) -> None:
    forwarded = (
        ("mqtt.response-topic", b"controller/replies"),
        ("mqtt.correlation", b"req-9"),
        ("mqtt.user.site", b"north"),
    )
    data = connected(version).deliver("t", b"x", 1, forwarded=forwarded)
    assert data is not None
    [publish] = sent([Send(data)], version)
    assert isinstance(publish, Publish)
    p = publish.properties
    if version is V5:
        assert (p.response_topic, p.correlation_data) == ("controller/replies", b"req-9")
        assert p.user_properties == (("site", "north"),)
    else:
        assert p.is_empty()


def test_a_delivery_larger_than_the_clients_maximum_packet_size_is_discarded() -> None:
    conn = MqttServerConnection(0.0)
    connect = Connect("dev-1", properties=MqttProperties(maximum_packet_size=64))
    assert [type(a) for a in conn.receive(encode_mqtt(connect, V5), 0.0)] == [Accepted]
    assert conn.deliver("t", b"x" * 100, 1, tag="big") == b""  # MQTT-3.1.2-24/-25
    assert not conn.inflight  # as if it had been sent and acknowledged: nothing waits for it
    small = conn.deliver("t", b"x" * 10, 1, tag="small")
    assert small is not None and len(small) <= 64
    [publish] = sent([Send(small)], V5)
    assert isinstance(publish, Publish) and publish.payload == b"x" * 10


def test_tagged_deliveries_report_their_acknowledgement() -> None:
    from kafkaesque.protocol.mqtt import Acked

    conn = connected()
    conn.deliver("a", b"x", 1, tag=("readings", 0, 42))
    conn.deliver("a", b"y", 1)  # untagged: no report
    first, second = conn.inflight
    assert conn.receive(encode_mqtt(Puback(first), V311), 1.0) == [Acked(("readings", 0, 42))]
    assert conn.receive(encode_mqtt(Puback(second), V311), 1.0) == []
