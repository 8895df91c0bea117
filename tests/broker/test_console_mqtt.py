"""Pure units of the console's MQTT views: what the ingress remembers of where each device's
PUBLISHes went (bounded), and an ended session's queue. The browser test
(test_console_browser_mqtt.py) runs them against a real broker."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from kafkaesque.broker.http._console_mqtt import mqtt_screen
from kafkaesque.broker.mqtt import _ingress
from kafkaesque.protocol import partition_for_key
from kafkaesque.protocol.mqtt import TopicMapping


def _ingress_over(partitions: int) -> _ingress.Ingress:
    topic = SimpleNamespace(config=SimpleNamespace(partitions=partitions))
    wiring = SimpleNamespace(
        config=SimpleNamespace(id=0),
        metadata=SimpleNamespace(view=SimpleNamespace(topics={"mqtt": topic})),
    )
    return _ingress.Ingress(cast(Any, wiring), TopicMapping.default(), {})


def test_the_ingress_remembers_where_each_device_published_within_bounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_ingress, "PUBLISHED_CLIENTS", 3)
    ingress = _ingress_over(6)
    for i in range(_ingress.PUBLISHED_TOPICS + 2):
        ingress._place(f"meters/{i}", b"x", "meter-1", False)
    kept = ingress.published("meter-1")
    assert len(kept) == _ingress.PUBLISHED_TOPICS
    assert "meters/0" not in kept and "meters/1" not in kept  # the oldest went first
    to = kept["meters/5"]  # the default rule: log topic mqtt, keyed by the MQTT topic
    assert to == ("mqtt", partition_for_key(b"meters/5", 6), b"meters/5")
    for device in ("a", "b", "c"):
        ingress._place("t", b"x", device, False)
    assert ingress.published("meter-1") == {}  # the oldest device was forgotten
    assert set(ingress.published("c")) == {"t"}
    ingress._place("t", b"x", "", False)  # no client id: nothing to remember
    assert ingress.published("") == {}


def test_an_ended_session_queues_what_it_owes_and_what_it_has_not_read() -> None:
    described: dict[str, Any] = {
        "sessions": [
            {
                "client_id": "sleeper",
                "owed": 2,
                "positions": [
                    {"topic": "mqtt", "partition": 0, "next": 10},
                    {"topic": "mqtt", "partition": 1, "next": 7},  # past the end: nothing
                    {"topic": "gone", "partition": 0, "next": 3},  # no end known
                ],
            }
        ]
    }
    ends = {("mqtt", 0): 15, ("mqtt", 1): 5}
    [session] = mqtt_screen(described, ends)["sessions"]
    assert session["queued"] == 2 + 5 and "positions" not in session
