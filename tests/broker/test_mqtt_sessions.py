"""Persistent sessions: subscriptions and unacknowledged QoS 1 deliveries survive a reconnect,
to any broker; one connection per client id in the whole cluster."""

from __future__ import annotations

import itertools
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, cast

import msgpack
import pytest

from kafkaesque.broker.mqtt._resume import Progress
from kafkaesque.broker.mqtt._sessions import (
    PositionKeys,
    SessionStore,
    StoredSession,
    decode_session,
    encode_session,
    session_record,
)
from kafkaesque.client import Client, Producer
from kafkaesque.local_cluster import LocalCluster
from kafkaesque.protocol.mqtt import (
    Disconnect,
    MqttProperties,
    MqttSubscription,
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
    encode_mqtt,
)

from .mqtt_helpers import RULES, PahoDevice, RawMqtt, read_topic, wait_for

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
            and session.positions.get(("commands", reboot.partition), Progress(0)).resume
            > reboot.offset
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


def receive_qos2(raw: RawMqtt, count: int) -> list[bytes]:
    """Receive ``count`` QoS 2 messages, each through its whole exchange (PUBREC, PUBREL,
    PUBCOMP), as a device does."""
    payloads: list[bytes] = []
    for publish in publishes(raw, count):
        assert publish.qos == 2, publish
        raw.send(encode_mqtt(Pubrec(publish.packet_id), raw.version))
        assert raw.receive() == Pubrel(publish.packet_id)
        raw.send(encode_mqtt(Pubcomp(publish.packet_id), raw.version))
        payloads.append(publish.payload)
    return payloads


@pytest.mark.parametrize("version", [V311, V5], ids=["3.1.1", "5.0"])
def test_completed_qos2_deliveries_are_not_repeated_after_a_quick_move_to_another_broker(
    cluster: LocalCluster, version: MqttVersion
) -> None:
    # A device that completed its QoS 2 exchanges, disconnected and at once reconnected through
    # another broker must not get those messages again (exactly once, MQTT-4.3.3): the new
    # broker resumes from the old one's last state of the session, not from an earlier save.
    device = f"phone-s0006-{version.name}"
    properties = MqttProperties(session_expiry_interval=3600 if version is V5 else None)
    topic = f"phones/{device}/commands"
    controller = PahoDevice(cluster.mqtt_address(2), f"controller-s0006-{version.name}")
    raw = RawMqtt(cluster.mqtt_address(0), version)
    raw.connect(device, clean_start=False, properties=properties)
    subscribe(raw, topic, qos=2)
    try:
        controller.wait_connected()
        for trial in range(4):
            for i in range(5):
                controller.publish(topic, b"t%d-%d" % (trial, i), qos=2)
            assert receive_qos2(raw, 5) == [b"t%d-%d" % (trial, i) for i in range(5)]
            raw.send(encode_mqtt(Disconnect(), version))
            raw.close()
            raw = RawMqtt(cluster.mqtt_address((trial + 1) % 3), version)
            connack = raw.connect(device, clean_start=False, properties=properties)
            assert connack.session_present is True
            try:
                again = raw.receive(timeout=1.5)
            except TimeoutError:
                again = None
            assert again is None, f"trial {trial}: delivered again: {again}"
    finally:
        raw.close()
        controller.close()


# -- v5 Session Expiry Interval ---------------------------------------------------------------


def stored_session(cluster: LocalCluster, device: str) -> StoredSession | None:
    """The last record of ``device``'s session in the table (None: there is none)."""
    stored = [
        r for r in read_topic(cluster.bootstrap, "__mqtt_sessions") if r.key == device.encode()
    ]
    return decode_session(stored[-1].value or b"") if stored else None


def connect_v5(
    cluster: LocalCluster, broker: int, device: str, expiry: int | None
) -> tuple[RawMqtt, bool]:
    """A v5 connection resuming ``device``'s session, and whether the session was present."""
    raw = RawMqtt(cluster.mqtt_address(broker), V5)
    properties = MqttProperties(session_expiry_interval=expiry)
    return raw, raw.connect(device, clean_start=False, properties=properties).session_present


def subscribe_and_leave(
    cluster: LocalCluster, device: str, expiry: int, at_disconnect: int | None = None
) -> None:
    """A v5 session of ``expiry`` seconds subscribes to its commands, then DISCONNECTs (with
    ``at_disconnect`` as its new expiry, if given)."""
    raw, _ = connect_v5(cluster, 0, device, expiry)
    subscribe(raw, f"phones/{device}/commands")
    raw.send(encode_mqtt(Disconnect(0, MqttProperties(session_expiry_interval=at_disconnect)), V5))
    raw.close()


def wait_for_session(
    cluster: LocalCluster, device: str, condition: Callable[[StoredSession], bool], what: str
) -> StoredSession:
    wait_for(lambda: (s := stored_session(cluster, device)) is not None and condition(s), 15, what)
    session = stored_session(cluster, device)
    assert session is not None
    return session


def test_a_v5_session_is_gone_once_its_expiry_interval_has_passed(cluster: LocalCluster) -> None:
    device = "phone-s0010"
    subscribe_and_leave(cluster, device, expiry=1)
    # Its owner marks it deleted once the second has passed (no reconnect needed).
    wait_for_session(cluster, device, lambda s: s.deleted, "the expired session to be deleted")
    raw, present = connect_v5(cluster, 1, device, expiry=60)
    try:
        assert present is False
        command(cluster, device, b"not subscribed any more")
        with pytest.raises(TimeoutError):
            raw.receive(timeout=1.0)
    finally:
        raw.close()


def test_a_v5_session_within_its_expiry_interval_is_resumed(cluster: LocalCluster) -> None:
    device = "phone-s0011"
    subscribe_and_leave(cluster, device, expiry=3600)
    session = wait_for_session(
        cluster, device, lambda s: s.ended_ms is not None, "the session's end to be stored"
    )
    assert session.expiry_s == 3600 and not session.deleted
    raw, present = connect_v5(cluster, 2, device, expiry=3600)
    try:
        assert present is True
        command(cluster, device, b"still here")
        assert [p.payload for p in publishes(raw, 1)] == [b"still here"]
    finally:
        raw.close()


def test_a_v5_disconnect_with_expiry_0_ends_the_session(cluster: LocalCluster) -> None:
    device = "phone-s0012"
    subscribe_and_leave(cluster, device, expiry=3600, at_disconnect=0)
    wait_for_session(cluster, device, lambda s: s.deleted, "the session to end")
    raw, present = connect_v5(cluster, 1, device, expiry=None)
    raw.close()
    assert present is False


def test_a_resumed_session_is_not_sent_what_expired_meanwhile(cluster: LocalCluster) -> None:
    device = "phone-s0013"
    subscribe_and_leave(cluster, device, expiry=3600)
    wait_for_session(cluster, device, lambda s: s.ended_ms is not None, "the session's end")
    controller = RawMqtt(cluster.mqtt_address(1), V5)
    try:
        controller.connect("controller-s0013")
        for packet_id, text, expiry in (
            (1, b"stale soon", 1),
            (2, b"for good", None),
            (3, b"later", 60),
        ):
            properties = MqttProperties(message_expiry_interval=expiry)
            publish = Publish(
                f"phones/{device}/commands", text, 1, packet_id=packet_id, properties=properties
            )
            controller.send(encode_mqtt(publish, V5))
            assert controller.receive() == Puback(packet_id)
    finally:
        controller.close()
    time.sleep(1.5)  # the first one expires while the device is away
    raw, present = connect_v5(cluster, 2, device, expiry=3600)
    try:
        assert present
        got = publishes(raw, 2)
        assert [p.payload for p in got] == [b"for good", b"later"]
        assert got[0].properties.message_expiry_interval is None
        remains = got[1].properties.message_expiry_interval  # what remains of 60, rounded up
        assert remains is not None and 45 <= remains <= 59
    finally:
        raw.close()


@pytest.mark.parametrize(
    ("session", "now_ms", "expired"),
    [
        (StoredSession(0, 1, expiry_s=10, ended_ms=1_000), 10_999, False),
        (StoredSession(0, 1, expiry_s=10, ended_ms=1_000), 11_000, True),
        (StoredSession(0, 1, expiry_s=0, ended_ms=1_000), 1_000, True),
        (StoredSession(0, 1, expiry_s=10), 10**15, False),  # still connected
        (StoredSession(0, 1, expiry_s=None, ended_ms=1_000), 10**15, False),  # never (3.1.1)
        (StoredSession(0, 1, deleted=True, expiry_s=0, ended_ms=0), 10**15, False),
    ],
)
def test_when_a_stored_session_has_expired(
    session: StoredSession, now_ms: int, expired: bool
) -> None:
    assert session.expired(now_ms) is expired


def test_a_session_record_keeps_its_lifetime_end_and_subscription_identifiers() -> None:
    session = StoredSession(
        2,
        7,
        (MqttSubscription("a/+", 1, identifier=12), MqttSubscription("b", 0)),
        awaiting_release=(3,),
        expiry_s=90,
        ended_ms=1_700_000_000_000,
    )
    assert decode_session(encode_session(session)) == session


def test_a_record_written_before_session_expiry_existed_never_expires() -> None:
    old = msgpack.packb([1, 4, [["a/+", 1, False, False, 0]], [["t", 0, 12]], [], False])
    session = decode_session(old)
    assert session is not None and session.positions == {("t", 0): Progress(12)}
    assert session.subscriptions == (MqttSubscription("a/+", 1),)  # identifier 0: none
    assert session.expiry_s is None and session.ended_ms is None
    assert not session.expired(10**15)


def test_decoded_sessions_share_their_positions() -> None:
    """Every broker holds every session: the (log topic, partition) key of a position is one
    object for all the sessions of a table that read that partition, not one each; past the
    table's limit, new pairs are keys of their own."""
    keys = PositionKeys(limit=1)
    first, second, other = (
        decode_session(encode_session(StoredSession(0, 1, positions={(t, 2): Progress(n)})), keys)
        for t, n in (("c", 5), ("c", 9), ("d", 1))
    )
    assert first is not None and second is not None and other is not None
    ((a, progress),) = first.positions.items()
    ((b, _),) = second.positions.items()
    assert a == ("c", 2) and progress == Progress(5)
    assert a is b
    ((d, _),) = other.positions.items()
    assert d == ("d", 2) and keys("d", 2) is not d


# -- handing a session over between brokers: the table's rules --------------------------------


class Table:
    """A ``SessionStore`` fed records directly, as its tail would, in log order."""

    def __init__(self) -> None:
        self.changes: list[StoredSession] = []

        async def no_topic(name: str) -> Any:
            raise AssertionError("not used")

        self.store = SessionStore(
            cast(Any, None), no_topic, lambda _client, session: self.changes.append(session)
        )

    def write(self, session: StoredSession) -> None:
        self.store._apply(session_record("dev", session, 0))

    @property
    def now(self) -> StoredSession:
        return self.store.sessions["dev"]


SUBS = (MqttSubscription("phones/dev/#", 2),)


def test_a_takeover_after_the_last_write_of_the_previous_connection_takes_that_state() -> None:
    table = Table()
    table.write(StoredSession(0, 1, SUBS, {("commands", 0): Progress(5)}))  # a periodic save
    last = StoredSession(
        0, 1, SUBS, {("commands", 0): Progress(10)}, ended_ms=1_000
    )  # at DISCONNECT
    table.write(last)
    # Broker 1 read the table before the last write: its takeover carries the older state.
    table.write(StoredSession(1, 2, SUBS, {("commands", 0): Progress(5)}, awaiting_owner=0))
    assert table.now == StoredSession(
        1, 2, SUBS, {("commands", 0): Progress(10)}
    )  # done: awaits no one


def test_a_takeover_before_the_last_write_waits_for_the_previous_owners_handover() -> None:
    table = Table()
    table.write(StoredSession(0, 1, SUBS, {("commands", 0): Progress(5)}))
    table.write(StoredSession(1, 2, SUBS, {("commands", 0): Progress(5)}, awaiting_owner=0))
    assert table.now.awaiting_owner == 0
    table.write(
        StoredSession(0, 1, SUBS, {("commands", 0): Progress(10)}, ended_ms=1_000)
    )  # too late
    assert table.now.positions == {("commands", 0): Progress(5)}
    table.write(
        StoredSession(2, 2, SUBS, {("commands", 0): Progress(10)}, handed_by=2)
    )  # not awaited
    assert table.now.awaiting_owner == 0
    table.write(StoredSession(1, 2, SUBS, {("commands", 0): Progress(10)}, handed_by=0))
    assert table.now == StoredSession(1, 2, SUBS, {("commands", 0): Progress(10)}, handed_by=0)
    # The new owner's own writes go on; a second handover is late and changes nothing.
    table.write(StoredSession(1, 2, SUBS, {("commands", 0): Progress(12)}))
    table.write(StoredSession(1, 2, SUBS, {("commands", 0): Progress(10)}, handed_by=0))
    assert table.now == StoredSession(1, 2, SUBS, {("commands", 0): Progress(12)})


def test_a_handover_after_the_new_owner_gave_up_waiting_is_ignored() -> None:
    table = Table()
    table.write(StoredSession(0, 1, SUBS, {("commands", 0): Progress(5)}))
    table.write(StoredSession(1, 2, SUBS, {("commands", 0): Progress(5)}, awaiting_owner=0))
    table.write(StoredSession(1, 2, SUBS, {("commands", 0): Progress(7)}))  # resumed without it
    table.write(StoredSession(1, 2, SUBS, {("commands", 0): Progress(10)}, handed_by=0))
    assert table.now == StoredSession(1, 2, SUBS, {("commands", 0): Progress(7)})


def test_two_owners_racing_for_one_epoch_the_first_in_the_log_has_it() -> None:
    table = Table()
    table.write(StoredSession(0, 1, SUBS))
    table.write(StoredSession(1, 2, SUBS))
    table.write(StoredSession(2, 2, SUBS, {("commands", 0): Progress(99)}))
    assert table.now == StoredSession(1, 2, SUBS)
    assert [s.owner for s in table.changes] == [0, 1]


def test_a_takeover_of_a_session_deleted_meanwhile_awaits_no_one() -> None:
    table = Table()
    table.write(StoredSession(0, 1, deleted=True))
    table.write(StoredSession(1, 2, SUBS, awaiting_owner=0))
    assert table.now == StoredSession(1, 2, SUBS)


def test_a_session_record_keeps_who_it_awaits_and_who_handed_it_over() -> None:
    for session in (
        StoredSession(1, 3, SUBS, {("t", 0): Progress(4)}, (7,), awaiting_owner=0),
        StoredSession(1, 3, SUBS, {("t", 0): Progress(4)}, (7,), expiry_s=60, handed_by=0),
    ):
        assert decode_session(encode_session(session)) == session


# -- what a resumed session is sent (MQTT-4.4.0-1) ----------------------------------------------


def expiry_of(version: MqttVersion) -> MqttProperties:
    return MqttProperties(session_expiry_interval=3600 if version is V5 else None)


def nothing_more(raw: RawMqtt, within: float = 1.5) -> None:
    try:
        extra = raw.receive(timeout=within)
    except TimeoutError:
        return
    raise AssertionError(f"delivered again: {extra}")


@pytest.mark.parametrize("version", [V311, V5], ids=["3.1.1", "5.0"])
@pytest.mark.parametrize("elsewhere", [False, True], ids=["same-broker", "other-broker"])
@pytest.mark.parametrize("clean", [True, False], ids=["disconnect", "lost"])
def test_a_resumed_session_continues_each_delivery_where_it_stood(
    cluster: LocalCluster, version: MqttVersion, elsewhere: bool, clean: bool
) -> None:
    """Six deliveries left in every state a reconnect can find them in: acknowledged (QoS 1
    PUBACK, QoS 2 PUBCOMP) ones never come again; in-flight ones come again under their
    packet ids with DUP set, a QoS 2 one past PUBREC as its PUBREL; then what is new, under
    ids that do not clash with them; each once."""
    device = f"phone-r{version.name}{int(elsewhere)}{int(clean)}"
    topic = f"phones/{device}/commands"
    controller = PahoDevice(cluster.mqtt_address(2), f"controller-{device}")
    raw = RawMqtt(cluster.mqtt_address(0), version)
    try:
        controller.wait_connected()
        raw.connect(device, clean_start=False, properties=expiry_of(version))
        subscribe(raw, topic, qos=2)
        qos = [1, 2, 1, 2, 2, 1]
        for i, q in enumerate(qos):
            controller.publish(topic, b"m%d" % i, qos=q)
        m = publishes(raw, 6)
        assert [(p.payload, p.qos, p.dup) for p in m] == [
            (b"m%d" % i, q, False) for i, q in enumerate(qos)
        ]
        raw.send(encode_mqtt(Pubrec(m[1].packet_id), version))  # m1: the whole exchange
        assert raw.receive() == Pubrel(m[1].packet_id)
        raw.send(encode_mqtt(Pubcomp(m[1].packet_id), version))
        raw.send(encode_mqtt(Puback(m[2].packet_id), version))  # m2, m5: acknowledged
        raw.send(encode_mqtt(Puback(m[5].packet_id), version))
        raw.send(encode_mqtt(Pubrec(m[3].packet_id), version))  # m3: past PUBREC
        assert raw.receive() == Pubrel(m[3].packet_id)
        raw.send(encode_mqtt(Pingreq(), version))  # (the broker has read all of it)
        assert raw.receive() == Pingresp()
        if clean:
            raw.send(encode_mqtt(Disconnect(), version))
        raw.close()  # m0 and m4 in flight
        controller.publish(topic, b"m6", qos=1)
        raw = RawMqtt(cluster.mqtt_address(1 if elsewhere else 0), version)
        assert raw.connect(device, clean_start=False, properties=expiry_of(version)).session_present
        assert raw.receive() == Pubrel(m[3].packet_id)
        again = publishes(raw, 3)
        held = {m[0].packet_id, m[3].packet_id, m[4].packet_id}
        assert [(p.payload, p.qos, p.dup) for p in again] == [
            (b"m0", 1, True),
            (b"m4", 2, True),
            (b"m6", 1, False),
        ]
        assert again[0].packet_id == m[0].packet_id and again[1].packet_id == m[4].packet_id
        assert again[2].packet_id not in held
        raw.send(encode_mqtt(Pubcomp(m[3].packet_id), version))
        raw.send(encode_mqtt(Puback(again[0].packet_id), version))
        raw.send(encode_mqtt(Pubrec(again[1].packet_id), version))
        assert raw.receive() == Pubrel(again[1].packet_id)
        raw.send(encode_mqtt(Pubcomp(again[1].packet_id), version))
        raw.send(encode_mqtt(Puback(again[2].packet_id), version))
        nothing_more(raw)
        raw.send(encode_mqtt(Disconnect(), version))
        raw.close()
        raw = RawMqtt(cluster.mqtt_address(2), version)  # and nothing is owed any more
        assert raw.connect(device, clean_start=False, properties=expiry_of(version)).session_present
        nothing_more(raw)
    finally:
        raw.close()
        controller.close()


def test_a_session_resumed_under_load_gets_each_message_once_per_connection(
    cluster: LocalCluster,
) -> None:
    """Six topics at about 200 messages a second; the subscriber's connection is cut (or ends
    with DISCONNECT) every 0.6 s and resumed on the next broker. On no connection does a
    message come twice, none is lost, and a message that comes again on a later connection is
    a retransmission (DUP, its packet id) of one whose PUBACK the broker never read."""
    device = "phone-race"
    keys = [f"race{i}" for i in range(6)]
    sent: list[bytes] = []
    stop = threading.Event()

    def produce() -> None:
        host, port = cluster.client_address(0)
        with Client(f"{host}:{port}") as client, Producer(client) as producer:
            for n in range(1000):
                if stop.is_set():
                    return
                value = b"%s-%d" % (keys[n % 6].encode(), n)
                producer.send("commands", value, key=keys[n % 6].encode())
                sent.append(value)
                time.sleep(0.005)
            producer.flush()

    received: dict[bytes, list[tuple[int, Publish]]] = {}
    raw = RawMqtt(cluster.mqtt_address(0))
    raw.connect(device, clean_start=False)
    subscribe(raw, "phones/+/commands")
    producer = threading.Thread(target=produce)
    producer.start()
    try:
        for connection in range(40):
            until = time.monotonic() + (0.6 if connection < 8 else 3.0)
            while time.monotonic() < until:
                try:
                    packet = raw.receive(timeout=0.2)
                except TimeoutError:
                    if not producer.is_alive() and all(v in received for v in sent):
                        break
                    continue
                assert isinstance(packet, Publish), packet
                raw.send(encode_mqtt(Puback(packet.packet_id), V311))
                if packet.payload.split(b"-")[0].decode() in keys:
                    copies = received.setdefault(packet.payload, [])
                    assert all(c != connection for c, _ in copies), f"twice: {packet}"
                    if copies:
                        assert packet.dup and packet.packet_id == copies[-1][1].packet_id, packet
                    copies.append((connection, packet))
            if not producer.is_alive() and all(v in received for v in sent):
                break
            if connection % 2:
                raw.send(encode_mqtt(Disconnect(), V311))
            raw.close()
            raw = RawMqtt(cluster.mqtt_address((connection + 1) % 3))
            assert raw.connect(device, clean_start=False).session_present
    finally:
        stop.set()
        producer.join(30)
        raw.close()
    assert len(sent) == 1000
    assert [v for v in sent if v not in received] == []


PAHO_SUBSCRIBER = r"""
import sys
import time
import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

port, client_id = int(sys.argv[1]), sys.argv[2]
v5, subscribe = sys.argv[3] == "5", sys.argv[4] == "1"
protocol = paho.MQTTv5 if v5 else paho.MQTTv311
kwargs = {} if v5 else {"clean_session": False}
client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=protocol, **kwargs)

def on_connect(client, userdata, flags, rc, props):
    if subscribe:
        client.subscribe("phones/+/commands", qos=1)
    else:
        print("ready", flush=True)

def on_subscribe(client, userdata, mid, codes, props):
    print("ready", flush=True)

def on_message(client, userdata, message):
    print(message.payload.decode(), int(message.dup), message.mid, flush=True)
    time.sleep(0.01)  # slower than the stream: PUBLISHes wait in flight

client.on_connect, client.on_subscribe, client.on_message = on_connect, on_subscribe, on_message
if v5:
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 3600
    client.connect("127.0.0.1", port, clean_start=False, properties=props)
else:
    client.connect("127.0.0.1", port)
client.loop_forever()
"""


@pytest.mark.parametrize("version", ["3.1.1", "5"])
def test_a_paho_subscriber_killed_again_and_again_loses_nothing(
    cluster: LocalCluster, version: str
) -> None:
    """A paho subscriber (QoS 1, persistent session) is killed -9 three times while messages
    flow, each time started again on the next broker: it gets every message, none twice in
    one process, and a message it gets again is a retransmission (DUP, the same packet id).
    It reads slower than the stream, so each kill leaves PUBLISHes in flight."""
    device = f"paho-killed-{version}"
    keys = [f"paho{version}k{i}" for i in range(3)]
    values = [b"%s-%d" % (keys[n % 3].encode(), n) for n in range(300)]
    host, port = cluster.client_address(1)
    got: dict[str, list[tuple[int, bool, int]]] = {}

    def start(broker: int, first: bool) -> subprocess.Popen[str]:
        port = cluster.mqtt_address(broker)[1]
        args = [str(port), device, version, "1" if first else "0"]
        child = subprocess.Popen(
            [sys.executable, "-c", PAHO_SUBSCRIBER, *args], stdout=subprocess.PIPE, text=True
        )
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        return child

    def collect(child: subprocess.Popen[str], generation: int) -> None:
        assert child.stdout is not None
        for line in child.stdout:
            if len(line.split()) != 3:
                continue  # cut short by the kill: as if never received
            value, dup, mid = line.split()
            if value.split("-")[0] in keys:
                got.setdefault(value, []).append((generation, dup == "1", int(mid)))

    with Client(f"{host}:{port}") as client, Producer(client) as producer:
        children: list[subprocess.Popen[str]] = []
        readers: list[threading.Thread] = []
        try:
            for generation in range(4):
                child = start(generation % 3, generation == 0)
                children.append(child)
                reader = threading.Thread(target=collect, args=(child, generation), daemon=True)
                reader.start()
                readers.append(reader)
                for n, value in enumerate(values[generation * 75 : (generation + 1) * 75]):
                    producer.send("commands", value, key=value.split(b"-")[0])
                    time.sleep(0.004)
                    if n == 60 and generation < 3:
                        # SIGKILL in mid-stream: no DISCONNECT, and PUBLISHes in flight.
                        child.kill()
                        child.wait(10)
                producer.flush()
            wait_for(lambda: all(v.decode() in got for v in values), 30, "every message")
        finally:
            for child in children:
                child.kill()
                child.wait(10)
            for reader in readers:
                reader.join(10)
            for child in children:
                assert child.stdout is not None
                child.stdout.close()
    # Each kill left PUBLISHes in flight, which came again as retransmissions.
    assert sum(any(dup for _, dup, _ in copies) for copies in got.values()) >= 3
    for text, copies in got.items():
        generations = [g for g, _, _ in copies]
        assert len(set(generations)) == len(generations), f"{text} twice in one process"
        for (_, _, mid), (_, dup, again) in itertools.pairwise(copies):
            assert dup and again == mid, f"{text} delivered again as new: {copies}"


@pytest.mark.parametrize("version", [V311, V5], ids=["3.1.1", "5.0"])
def test_qos2_deliveries_are_exactly_once_through_a_kill_9_of_the_subscribers_broker(
    cluster: LocalCluster, version: MqttVersion
) -> None:
    """The broker of a QoS 2 subscriber is killed -9 with deliveries in every state (complete,
    past PUBREC, sent, not sent yet). Resumed through another broker, a client that keeps its
    side of the session (method B: a packet id is held from delivery until PUBREL,
    MQTT-4.3.3) hands each message to its application exactly once: the session stored each
    packet id before its PUBLISH went, and each PUBREC before its PUBREL."""
    device = f"phone-k9{version.name}"
    topic = f"phones/{device}/commands"
    controller = PahoDevice(cluster.mqtt_address(2), f"controller-{device}")
    raw = RawMqtt(cluster.mqtt_address(0), version)
    app: list[bytes] = []
    held: set[int] = set()

    def take(publish: Publish) -> None:
        """Method B: deliver unless its id is held; answer PUBREC."""
        assert publish.qos == 2, publish
        if publish.packet_id not in held:
            assert publish.payload not in app, f"delivered twice: {publish}"
            held.add(publish.packet_id)
            app.append(publish.payload)
        raw.send(encode_mqtt(Pubrec(publish.packet_id), version))

    try:
        controller.wait_connected()
        raw.connect(device, clean_start=False, properties=expiry_of(version))
        subscribe(raw, topic, qos=2)
        for i in range(6):
            controller.publish(topic, b"k%d" % i, qos=2)
        first = publishes(raw, 6)
        for publish in first:  # k0-k5 past PUBREC
            take(publish)
        for _ in range(6):
            pubrel = raw.receive()
            assert isinstance(pubrel, Pubrel), pubrel
            if pubrel.packet_id in {p.packet_id for p in first[:3]}:  # k0-k2 complete
                held.discard(pubrel.packet_id)
                raw.send(encode_mqtt(Pubcomp(pubrel.packet_id), version))
        for i in range(6, 12):
            controller.publish(topic, b"k%d" % i, qos=2)
        for publish in publishes(raw, 4):  # k6-k9 delivered; k10, k11 maybe not sent yet
            held.add(publish.packet_id)
            app.append(publish.payload)
        cluster.kill(0)
        raw.close()
        raw = RawMqtt(cluster.mqtt_address(1), version)
        assert raw.connect(device, clean_start=False, properties=expiry_of(version)).session_present
        deadline = time.monotonic() + 30
        while sorted(app) != sorted(b"k%d" % i for i in range(12)) or held:
            assert time.monotonic() < deadline, (app, held)
            packet = raw.receive(timeout=10)
            if isinstance(packet, Publish):
                take(packet)
            else:
                assert isinstance(packet, Pubrel), packet
                held.discard(packet.packet_id)
                raw.send(encode_mqtt(Pubcomp(packet.packet_id), version))
        nothing_more(raw)
        assert sorted(app) == sorted(b"k%d" % i for i in range(12))  # each once
    finally:
        raw.close()
        controller.close()
        if not cluster.running(0):
            cluster.start(0)
            cluster.wait_ready()
