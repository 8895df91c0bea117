"""The MQTT bridge against a real mosquitto and a real 3-broker cluster: what is published
upstream QoS 1 lands in the mapped log topics with key and headers; poison payloads go to the
dead-letter topic (or are dropped) without blocking; Avro round-trips; two bridges of one share
group split the load and lose nothing; log records go back out to MQTT subscribers."""

from __future__ import annotations

import io
import json
import os
import signal
from pathlib import Path

import fastavro
import pytest
import trio
import trio.testing

from kafkaesque.client import AsyncClient, ProducerConfig, open_producer
from kafkaesque.local_cluster import LocalCluster
from kafkaesque.mqtt_bridge import (
    INGEST_RUN,
    BridgeConfig,
    BridgeError,
    MqttBridge,
    avro_converter,
    json_converter,
    load_avro_schema,
)
from kafkaesque.protocol.mqtt import MqttClientOptions, MqttVersion, TopicMapping
from tests.broker.mqtt_bridge_helpers import (
    mqtt_options,
    publish,
    read_topic,
    running_bridge,
    subscribed,
    unread_bytes,
)
from tests.mosquitto import (
    Mosquitto,
    mosquitto_fixture,  # noqa: F401 - registers it
    running_mosquitto,
)

RULES = """
phones/+/spectrum -> {readings} key=1
phones/+/commands -> {commands} key=1
"""


def _mapping(readings: str, commands: str = "commands") -> TopicMapping:
    return TopicMapping.parse(RULES.format(readings=readings, commands=commands))


def _both_ways(cluster: LocalCluster, mosquitto: Mosquitto, name: str) -> BridgeConfig:
    """A bridge into ``readings_<name>`` that also publishes ``commands_<name>`` upstream."""
    return BridgeConfig(
        mqtt=mqtt_options(mosquitto, f"bridge-{name}"),
        bootstrap=cluster.bootstrap,
        mapping=_mapping(f"readings_{name}", commands=f"commands_{name}"),
        to_mqtt=(f"commands_{name}",),
        egress_group=f"bridge-{name}",
    )


async def test_published_messages_land_in_the_mapped_topic_with_key_and_headers(
    broker_cluster: LocalCluster, mosquitto: Mosquitto
) -> None:
    config = BridgeConfig(
        mqtt=mqtt_options(mosquitto, "bridge-basic"),
        bootstrap=broker_cluster.bootstrap,
        mapping=_mapping("readings_basic"),
    )
    async with running_bridge(config) as bridge:
        await publish(mosquitto, "phones/p1/spectrum", b"a0", b"a1", b"a2")
        await publish(mosquitto, "phones/p2/spectrum", b"b0", b"b1")
        records = await read_topic(broker_cluster.bootstrap, "readings_basic", 5)
    assert len(records) == 5
    by_key: dict[bytes | None, list[bytes | None]] = {}
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        by_key.setdefault(record.key, []).append(record.value)
        headers = dict(record.headers)
        assert headers["mqtt.topic"] == b"phones/" + (record.key or b"") + b"/spectrum"
        assert headers["mqtt.qos"] == b"1"
    assert by_key == {b"p1": [b"a0", b"a1", b"a2"], b"p2": [b"b0", b"b1"]}
    assert bridge.stats.acked == 5


async def test_invalid_json_goes_to_the_dead_letter_topic_and_does_not_block(
    broker_cluster: LocalCluster, mosquitto: Mosquitto
) -> None:
    config = BridgeConfig(
        mqtt=mqtt_options(mosquitto, "bridge-json"),
        bootstrap=broker_cluster.bootstrap,
        mapping=_mapping("readings_json"),
        converter=json_converter,
        dead_letter_topic="bridge_dlq",
    )
    async with running_bridge(config) as bridge:
        await publish(
            mosquitto, "phones/p1/spectrum", b'{"serial": 0}', b"{not json", b'{"serial": 1}'
        )
        good = await read_topic(broker_cluster.bootstrap, "readings_json", 2)
        dead = await read_topic(broker_cluster.bootstrap, "bridge_dlq", 1)
    assert sorted(r.value or b"" for r in good) == [b'{"serial": 0}', b'{"serial": 1}']
    assert [r.value for r in dead] == [b"{not json"]
    headers = dict(dead[0].headers)
    assert headers["mqtt.topic"] == b"phones/p1/spectrum"
    assert headers["target.topic"] == b"readings_json"
    assert b"not JSON" in headers["error"]
    assert (bridge.stats.dead_lettered, bridge.stats.dropped, bridge.stats.acked) == (1, 0, 3)


async def test_without_a_dead_letter_topic_a_poison_message_is_dropped_and_counted(
    broker_cluster: LocalCluster, mosquitto: Mosquitto
) -> None:
    config = BridgeConfig(
        mqtt=mqtt_options(mosquitto, "bridge-drop"),
        bootstrap=broker_cluster.bootstrap,
        mapping=_mapping("readings_drop"),
        converter=json_converter,
    )
    async with running_bridge(config) as bridge:
        await publish(mosquitto, "phones/p1/spectrum", b"\xff\xfe", b"[1, 2]")
        records = await read_topic(broker_cluster.bootstrap, "readings_drop", 1)
    assert [r.value for r in records] == [b"[1, 2]"]
    assert (bridge.stats.dropped, bridge.stats.acked) == (1, 2)


async def test_payload_aware_rules_key_route_and_trim_json_and_dead_letter_the_rest(
    broker_cluster: LocalCluster, mosquitto: Mosquitto
) -> None:
    # The same rules as the brokers' own listeners (issue 38); the dead-letter topic is the
    # rules' own, and a rule's format= wins over the bridge's converter.
    mapping = TopicMapping.parse(
        "meters/+/reading -> bridge_meters key=$.meter.id fields=kwh,meter.id\n"
        "meters/+/event   -> bridge_meter-{$.kind}\n"
        "meters/+/blob    -> bridge_blobs format=raw\n"
        "dead-letter      -> bridge_meter_dlq\n"
    )
    config = BridgeConfig(
        mqtt=mqtt_options(mosquitto, "bridge-payload"),
        bootstrap=broker_cluster.bootstrap,
        mapping=mapping,
        converter=json_converter,
    )
    async with running_bridge(config) as bridge:
        await publish(
            mosquitto, "meters/gw/reading", b'{"meter": {"id": "m1"}, "kwh": 2, "x": 0}', b"{"
        )
        await publish(mosquitto, "meters/gw/event", b'{"kind": "alarm"}')
        await publish(mosquitto, "meters/gw/blob", b"\x00\xff")
        [reading] = await read_topic(broker_cluster.bootstrap, "bridge_meters", 1)
        [event] = await read_topic(broker_cluster.bootstrap, "bridge_meter-alarm", 1)
        [blob] = await read_topic(broker_cluster.bootstrap, "bridge_blobs", 1)
        [dead] = await read_topic(broker_cluster.bootstrap, "bridge_meter_dlq", 1)
    assert (reading.key, json.loads(reading.value or b"")) == (
        b"m1",
        {"kwh": 2, "meter": {"id": "m1"}},
    )
    assert (event.value, blob.value, dead.value) == (b'{"kind": "alarm"}', b"\x00\xff", b"{")
    assert b"not JSON" in dict(dead.headers)["error"]
    assert dict(dead.headers)["target.topic"] == b"bridge_meters"
    assert (bridge.stats.dead_lettered, bridge.stats.received) == (1, 4)


AVRO_SCHEMA = {
    "type": "record",
    "name": "Reading",
    "fields": [
        {"name": "device", "type": "string"},
        {"name": "serial", "type": "long"},
        {"name": "spectrum", "type": {"type": "array", "items": "double"}},
    ],
}


async def test_avro_converter_stores_records_that_decode_with_the_schema(
    broker_cluster: LocalCluster, mosquitto: Mosquitto, tmp_path: Path
) -> None:
    schema_file = tmp_path / "reading.avsc"
    schema_file.write_text(json.dumps(AVRO_SCHEMA))
    schema = load_avro_schema(schema_file)
    config = BridgeConfig(
        mqtt=mqtt_options(mosquitto, "bridge-avro"),
        bootstrap=broker_cluster.bootstrap,
        mapping=_mapping("readings_avro"),
        converter=avro_converter(schema),
        dead_letter_topic="bridge_avro_dlq",
    )
    reading = {"device": "phone-00007", "serial": 42, "spectrum": [0.5, 1.5]}
    async with running_bridge(config):
        await publish(
            mosquitto,
            "phones/phone-00007/spectrum",
            json.dumps(reading).encode(),
            b'{"device": "phone-00007"}',  # missing fields: refused
        )
        records = await read_topic(broker_cluster.bootstrap, "readings_avro", 1)
        dead = await read_topic(broker_cluster.bootstrap, "bridge_avro_dlq", 1)
    assert len(records) == 1
    decoded = fastavro.schemaless_reader(io.BytesIO(records[0].value or b""), schema, None)
    assert decoded == reading
    assert b"Avro schema" in dict(dead[0].headers)["error"]


async def test_two_bridges_of_a_share_group_split_the_load_and_lose_nothing(
    broker_cluster: LocalCluster, mosquitto: Mosquitto
) -> None:
    mapping = _mapping("readings_shared")
    configs = [
        BridgeConfig(
            mqtt=mqtt_options(mosquitto, f"bridge-share-{i}"),
            bootstrap=broker_cluster.bootstrap,
            mapping=mapping,
            share_group="kafkaesque",
        )
        for i in range(2)
    ]
    count = 400
    async with running_bridge(configs[0]) as first, running_bridge(configs[1]) as second:
        messages = [f"m{i}".encode() for i in range(count)]
        async with trio.open_nursery() as nursery:  # several publishers, several devices
            for d in range(4):
                nursery.start_soon(publish, mosquitto, f"phones/d{d}/spectrum", *messages[d::4])
        records = await read_topic(broker_cluster.bootstrap, "readings_shared", count)
    values = sorted(r.value or b"" for r in records)
    assert values == sorted(messages)  # every message once: nothing lost, no duplicate
    assert first.stats.acked > 0 and second.stats.acked > 0
    assert first.stats.acked + second.stats.acked == count


async def test_one_bridge_of_several_connections_splits_the_load_and_publishes_once(
    broker_cluster: LocalCluster, mosquitto: Mosquitto
) -> None:
    """Each connection is a member of the share group (an upstream broker reads one client's
    PUBACKs in turn with the others'); egress runs on the first only, or each record would go
    upstream once a connection."""
    config = BridgeConfig(
        mqtt=mqtt_options(mosquitto, "bridge-conns"),
        bootstrap=broker_cluster.bootstrap,
        mapping=_mapping("readings_conns", commands="commands_conns"),
        to_mqtt=("commands_conns",),
        egress_group="bridge-conns",
        share_group="kafkaesque-conns",
        connections=3,
    )
    count = 600
    commands = ("-q", "1", "-t", "phones/+/commands", "-v")
    async with (
        running_bridge(config) as bridge,
        subscribed(mosquitto, *commands, count=1) as subscriber,
    ):
        messages = [f"m{i}".encode() for i in range(count)]
        async with trio.open_nursery() as nursery:
            for d in range(6):
                nursery.start_soon(publish, mosquitto, f"phones/d{d}/spectrum", *messages[d::6])
        records = await read_topic(broker_cluster.bootstrap, "readings_conns", count)
        async with AsyncClient(broker_cluster.bootstrap) as client:
            await client.publish("commands_conns", b'{"command": "sleep"}', key=b"p9")
        with trio.fail_after(30):
            lines = await subscriber.messages()
        with trio.move_on_after(1):  # a second copy would come within this
            await trio.sleep_forever()
    assert sorted(r.value or b"" for r in records) == sorted(messages)
    assert bridge.stats.acked == count and bridge.stats.subscribed == 3
    assert lines == ['phones/p9/commands {"command": "sleep"}']
    assert bridge.stats.published == 1


def test_several_connections_need_shared_subscriptions() -> None:
    options = MqttClientOptions("127.0.0.1", 1883, "bridge")
    with pytest.raises(ValueError, match="shared subscriptions"):
        BridgeConfig(mqtt=options, bootstrap="127.0.0.1:1", connections=2)
    with pytest.raises(ValueError, match="at least 1"):
        BridgeConfig(mqtt=options, bootstrap="127.0.0.1:1", connections=0)
    explicit = BridgeConfig(
        mqtt=options, bootstrap="127.0.0.1:1", subscriptions=("$share/g/a/#",), connections=2
    )
    assert [explicit.connection_options(i).client_id for i in range(3)] == [
        "bridge",
        "bridge-1",
        "bridge-2",
    ]


async def test_log_records_are_published_to_mqtt_subscribers(
    broker_cluster: LocalCluster, mosquitto: Mosquitto
) -> None:
    config = _both_ways(broker_cluster, mosquitto, "egress")
    commands = ("-q", "1", "-t", "phones/+/commands", "-v")
    async with (
        running_bridge(config) as bridge,
        subscribed(mosquitto, *commands, count=2) as subscriber,
    ):
        async with AsyncClient(broker_cluster.bootstrap) as client:
            await client.publish("commands_egress", b'{"command": "calibrate"}', key=b"p7")
            await client.publish("commands_egress", b'{"command": "sleep"}', key=b"p8")
        with trio.fail_after(30):
            lines = sorted(await subscriber.messages())
        # The bridge is stopped now, maybe before the PUBACK of the second record came back to
        # it (the subscriber may have it first): the stop waits for it, and commits.
    assert lines == [
        'phones/p7/commands {"command": "calibrate"}',
        'phones/p8/commands {"command": "sleep"}',
    ]
    assert bridge.stats.published == 2
    async with AsyncClient(broker_cluster.bootstrap) as client:
        committed = await client.committed_offsets("bridge-egress", "commands_egress")
    assert sum(offset or 0 for offset in committed.values()) >= 2


async def test_v5_message_properties_cross_the_bridge_both_ways(
    broker_cluster: LocalCluster, mosquitto: Mosquitto
) -> None:
    config = _both_ways(broker_cluster, mosquitto, "props")
    commands = ("-V", "mqttv5", "-q", "1", "-t", "phones/+/commands", "-F", "%t|%R|%P|%p")
    async with running_bridge(config):
        # Upstream to the log: the properties become headers.
        v5 = ["-D", "publish", "user-property", "unit", "dB",
              "-D", "publish", "response-topic", "phones/p9/acks"]  # fmt: skip
        await publish(mosquitto, "phones/p9/spectrum", b"-71", v5=v5)
        [record] = await read_topic(broker_cluster.bootstrap, "readings_props", 1)
        headers = dict(record.headers)
        assert headers["mqtt.user.unit"] == b"dB"
        assert headers["mqtt.response-topic"] == b"phones/p9/acks"
        # The log to upstream: a record's property headers become properties.
        command_headers = [("mqtt.response-topic", b"ctl/replies"), ("mqtt.user.by", b"ops")]
        async with subscribed(mosquitto, *commands, count=1) as subscriber:
            async with (
                AsyncClient(broker_cluster.bootstrap) as client,
                open_producer(client) as producer,
            ):
                await producer.send(
                    "commands_props", b"calibrate", key=b"p9", headers=command_headers
                )
            with trio.fail_after(30):
                lines = await subscriber.messages()
    assert lines == ["phones/p9/commands|ctl/replies|by:ops|calibrate"]


async def test_a_stop_waits_for_the_puback_of_a_record_it_published_and_commits_it(
    broker_cluster: LocalCluster, mosquitto: Mosquitto
) -> None:
    """Stopped while the upstream has not acknowledged a record the bridge published from the
    log, the bridge waits for the PUBACK, then commits the record's offset: the group's next
    bridge does not publish it again. (Seen under load: the stop cancelled that wait, so the
    subscriber had the record, the bridge neither counted nor committed it.)"""
    config = _both_ways(broker_cluster, mosquitto, "in_flight")
    payload = b"calibrate " * 100
    async with AsyncClient(broker_cluster.bootstrap) as client:
        async with (
            subscribed(mosquitto, "-q", "1", "-t", "phones/+/commands", count=1) as sub,
            running_bridge(config) as bridge,
        ):
            mosquitto.process.send_signal(signal.SIGSTOP)  # reads nothing, answers nothing
            try:
                partition, offset = await client.publish("commands_in_flight", payload, key=b"p1")
                with trio.fail_after(30):  # the bridge's PUBLISH lies unread at the server
                    while unread_bytes(mosquitto.port) < len(payload):
                        await trio.sleep(0.05)
                bridge.stop()
                # The stop does all it can without the server: without the fix, it ended.
                await trio.testing.wait_all_tasks_blocked(cushion=0.2)
            finally:
                mosquitto.process.send_signal(signal.SIGCONT)
            with trio.fail_after(30):
                assert await sub.messages() == [payload.decode()]
        assert bridge.stats.published == 1
        committed = await client.committed_offsets("bridge-in_flight", "commands_in_flight")
    assert committed[partition] == offset + 1  # past the record: not published again


async def test_mqtt_311_works_the_same(broker_cluster: LocalCluster, mosquitto: Mosquitto) -> None:
    config = BridgeConfig(
        mqtt=mqtt_options(mosquitto, "bridge-v311", version=MqttVersion.V311),
        bootstrap=broker_cluster.bootstrap,
        mapping=_mapping("readings_v311"),
    )
    async with running_bridge(config):
        await publish(mosquitto, "phones/p3/spectrum", b"x0", b"x1")
        records = await read_topic(broker_cluster.bootstrap, "readings_v311", 2)
    assert [(r.key, r.value) for r in records] == [(b"p3", b"x0"), (b"p3", b"x1")]


async def test_the_bridge_reconnects_on_its_own_when_the_upstream_restarts(
    broker_cluster: LocalCluster, tmp_path: Path
) -> None:
    with running_mosquitto(tmp_path / "first") as first:
        config = BridgeConfig(
            mqtt=mqtt_options(first, "bridge-reconnect", keep_alive_s=2),
            bootstrap=broker_cluster.bootstrap,
            mapping=_mapping("readings_reconnect"),
            backoff_max_s=1.0,
        )
        async with running_bridge(config) as bridge:
            await publish(first, "phones/p1/spectrum", b"before")
            await read_topic(broker_cluster.bootstrap, "readings_reconnect", 1)
            first.process.kill()
            first.process.wait()
            # The same port, a new server without our session: the bridge subscribes again.
            with running_mosquitto(tmp_path / "second", port=first.port) as second:
                with trio.fail_after(30):
                    while bridge.stats.subscribed < 2:
                        await trio.sleep(0.1)
                await publish(second, "phones/p1/spectrum", b"after")
                records = await read_topic(broker_cluster.bootstrap, "readings_reconnect", 2)
    assert sorted(r.value or b"" for r in records) == [b"after", b"before"]


async def test_the_bridge_logs_in_with_a_user_name_and_password(
    broker_cluster: LocalCluster, tmp_path: Path
) -> None:
    passwords = tmp_path / "passwords"
    passwords.touch()
    await trio.run_process(["mosquitto_passwd", "-b", str(passwords), "bridge", "s3cret"])
    # As root, mosquitto drops to user "mosquitto", which cannot read the test's directory.
    user = "user root\n" if os.geteuid() == 0 else ""
    secured = f"allow_anonymous false\npassword_file {passwords}\n{user}"
    with running_mosquitto(tmp_path / "secured", extra_config=secured) as server:
        config = BridgeConfig(
            mqtt=mqtt_options(server, "bridge-auth", username="bridge", password=b"s3cret"),
            bootstrap=broker_cluster.bootstrap,
            mapping=_mapping("readings_auth"),
        )
        async with running_bridge(config):
            await trio.run_process(
                ["mosquitto_pub", "-h", server.host, "-p", str(server.port), "-q", "1",
                 "-u", "bridge", "-P", "s3cret", "-t", "phones/p1/spectrum", "-m", "hello"]
            )  # fmt: skip
            records = await read_topic(broker_cluster.bootstrap, "readings_auth", 1)
    assert [r.value for r in records] == [b"hello"]


async def test_a_message_the_log_refuses_for_good_is_dropped_and_does_not_block(
    broker_cluster: LocalCluster, mosquitto: Mosquitto
) -> None:
    config = BridgeConfig(
        mqtt=mqtt_options(mosquitto, "bridge-too-large"),
        bootstrap=broker_cluster.bootstrap,
        mapping=_mapping("readings_too_large"),
        producer=ProducerConfig(max_request_bytes=4096),
    )
    async with running_bridge(config) as bridge:
        await publish(mosquitto, "phones/p1/spectrum", b"x" * 10_000)
        await publish(mosquitto, "phones/p1/spectrum", b"small")
        records = await read_topic(broker_cluster.bootstrap, "readings_too_large", 1)
    assert [r.value for r in records] == [b"small"]
    assert (bridge.stats.dropped, bridge.stats.acked) == (1, 2)


async def test_a_backlog_is_taken_a_bounded_run_at_a_time(
    broker_cluster: LocalCluster, mosquitto: Mosquitto
) -> None:
    # A backlog queued for the session while the bridge was away arrives in a few large reads;
    # ingest must let the producer's sender, the reader and the acker run every INGEST_RUN
    # messages, not take a whole window (1,000 here) first. A task beside it sees the runs as
    # the step of ``received`` between two of its turns: at most two runs (trio runs each task
    # once a batch, in any order).
    total = 3000
    config = BridgeConfig(
        mqtt=mqtt_options(mosquitto, "bridge-backlog"),
        bootstrap=broker_cluster.bootstrap,
        mapping=_mapping("readings_backlog"),
    )
    async with running_bridge(config):
        pass  # the session exists, subscribed: mosquitto queues for it from now on
    await publish(mosquitto, "phones/p1/spectrum", *[b"m%d" % n for n in range(total)])
    bridge = MqttBridge(config)
    steps: list[int] = []

    async def watch() -> None:
        seen = 0
        with trio.move_on_after(60):
            while bridge.stats.acked < total:
                await trio.lowlevel.checkpoint()
                steps.append(bridge.stats.received - seen)
                seen = bridge.stats.received

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch)
        await nursery.start(bridge.run)
        with trio.fail_after(60):
            while bridge.stats.acked < total:
                await trio.sleep(0.05)
        bridge.stop()
    assert bridge.stats.received == total
    assert 0 < max(steps) <= 2 * INGEST_RUN


async def test_egress_resumes_from_the_committed_position_after_a_restart(
    broker_cluster: LocalCluster, mosquitto: Mosquitto
) -> None:
    mapping = _mapping("readings_resume", commands="commands_resume")
    config = BridgeConfig(
        mqtt=mqtt_options(mosquitto, "bridge-resume"),
        bootstrap=broker_cluster.bootstrap,
        mapping=mapping,
        to_mqtt=("commands_resume",),
        egress_group="bridge-resume",
    )
    async with running_bridge(config):
        pass  # the group starts at the end of the log, and commits that position
    async with AsyncClient(broker_cluster.bootstrap) as client, open_producer(client) as producer:
        # Appended while no bridge runs; the second names its MQTT topic in a header.
        await producer.send("commands_resume", b"while-away", key=b"p1")
        await producer.send(
            "commands_resume", b"by-header", key=b"p2", headers=[("mqtt.topic", b"custom/topic")]
        )
        await producer.flush()
    both = ("-q", "1", "-t", "phones/+/commands", "-t", "custom/#", "-v")
    async with (
        subscribed(mosquitto, *both, count=2) as subscriber,
        running_bridge(config) as bridge,
    ):
        with trio.fail_after(30):
            lines = sorted(await subscriber.messages())
    assert lines == ["custom/topic by-header", "phones/p1/commands while-away"]
    assert bridge.stats.published == 2


async def test_a_retained_message_is_appended_once_not_on_every_reconnect(
    broker_cluster: LocalCluster, mosquitto: Mosquitto
) -> None:
    retained = [
        "mosquitto_pub", "-h", mosquitto.host, "-p", str(mosquitto.port),
        "-q", "1", "-r", "-t", "phones/p9/spectrum", "-m", "retained",
    ]  # fmt: skip
    await trio.run_process(retained)
    config = BridgeConfig(
        mqtt=mqtt_options(mosquitto, "bridge-retained"),
        bootstrap=broker_cluster.bootstrap,
        mapping=_mapping("readings_retained"),
    )
    async with running_bridge(config):
        await read_topic(broker_cluster.bootstrap, "readings_retained", 1)
    async with running_bridge(config):  # the session is kept: SUBSCRIBE again
        await publish(mosquitto, "phones/p9/spectrum", b"live")
        records = await read_topic(broker_cluster.bootstrap, "readings_retained", 2)
    assert sorted(r.value or b"" for r in records) == [b"live", b"retained"]


async def test_a_log_topic_the_cluster_cannot_create_is_a_fatal_error(
    broker_cluster: LocalCluster, mosquitto: Mosquitto
) -> None:
    config = BridgeConfig(
        mqtt=mqtt_options(mosquitto, "bridge-fatal"),
        bootstrap=broker_cluster.bootstrap,
        mapping=_mapping("readings_fatal", commands="commands_fatal"),
        to_mqtt=("commands_fatal",),
        replication_factor=5,  # more replicas than brokers
    )
    with trio.fail_after(30), pytest.raises(BridgeError, match="commands_fatal"):
        await MqttBridge(config).run()
