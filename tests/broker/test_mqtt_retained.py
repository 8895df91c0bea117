"""Retained messages live in a replicated compacted topic: they survive broker restarts."""

from __future__ import annotations

import time

import pytest

from kafkaesque.local_cluster import LocalCluster

from .mqtt_helpers import RULES, PahoDevice, wait_for


def _retained(cluster: LocalCluster, broker: int, topic_filter: str) -> list[tuple[str, bytes]]:
    device = PahoDevice(cluster.mqtt_address(broker), f"reader-{time.monotonic_ns()}")
    try:
        device.wait_connected()
        device.subscribe(topic_filter, qos=1)
        time.sleep(0.5)
        return [(m.topic, bytes(m.payload)) for m in device.messages if m.retain]
    finally:
        device.close()


def test_retained_message_survives_a_restart_and_is_served_by_every_broker(
    tmp_path: pytest.TempPathFactory,
) -> None:
    with LocalCluster(str(tmp_path), 3, mqtt=True, mqtt_rules=RULES) as cluster:
        pub = PahoDevice(cluster.mqtt_address(0), "publisher")
        try:
            pub.wait_connected()
            pub.publish("phones/phone-00001/config", b"rate=10", qos=1, retain=True)
            pub.publish("phones/phone-00002/config", b"rate=20", qos=1, retain=True)
        finally:
            pub.close()
        expected = [
            ("phones/phone-00001/config", b"rate=10"),
            ("phones/phone-00002/config", b"rate=20"),
        ]
        # Broker 0 took the PUBLISHes; kill it: the others serve the retained messages.
        cluster.kill(0)
        for broker in (1, 2):
            wait_for(
                lambda b=broker: sorted(_retained(cluster, b, "phones/+/config")) == expected,  # type: ignore[misc]
                30,
                f"retained messages on broker {broker}",
            )
        # Restart every broker: the retained messages come back from the logs.
        cluster.stop_all()
        cluster.start_all()
        cluster.wait_ready()
        wait_for(lambda: sorted(_retained(cluster, 0, "phones/#")) == expected, 60, "after restart")
