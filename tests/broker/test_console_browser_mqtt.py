"""The console's consumer-group lag in time, its MQTT screens (retained messages, persistent
sessions of disconnected devices, a device's way to its log partition) and its timeline's
refused logins and rebalances, against a real one-broker cluster whose MQTT devices need a
password, in a real browser (Debian's chromium, Playwright's sync API) and over its JSON API.

What the page shows is checked against the line protocol (fetched records' timestamps, where a
device's record really is in the log, a group's committed offsets). One cluster and one browser
for the module; skipped as test_console_browser.py is where chromium or Playwright is missing.
``KAFKAESQUE_SCREENSHOTS=1`` saves the MQTT screens' screenshots under docs/console/.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from kafkaesque.client import Client, GroupConsumer
from kafkaesque.local_cluster import LocalCluster

from .mqtt_helpers import PahoDevice, wait_for
from .test_console_browser import Browsed, console_tab, expect

TOPIC = "readings"
USERS = {"meter": "meter-secret"}
PAYLOAD = b'{"watts": 42}'


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    directory = str(tmp_path_factory.mktemp("cluster"))
    with LocalCluster(directory, 1, mqtt=True, mqtt_users=USERS) as running:
        yield running


@pytest.fixture(scope="module")
def client(cluster: LocalCluster) -> Iterator[Client]:
    with Client(cluster.bootstrap) as connected:
        connected.create_topic(TOPIC, 2, 1)
        yield connected


@pytest.fixture(scope="module")
def tab(cluster: LocalCluster, client: Client) -> Iterator[Browsed]:
    with console_tab(cluster, height=900) as browsed:
        yield browsed


def api(cluster: LocalCluster, path: str) -> Any:
    """The JSON of the console's ``/api`` ``path`` on broker 0."""
    url = f"http://127.0.0.1:{cluster.ports[0].admin}/api/{path}"
    with urllib.request.urlopen(url, timeout=10) as answer:
        return json.loads(answer.read())


def device(cluster: LocalCluster, client_id: str, **kw: Any) -> PahoDevice:
    connected = PahoDevice(
        cluster.mqtt_address(0), client_id, username="meter", password=USERS["meter"], **kw
    )
    connected.wait_connected()
    return connected


def test_a_group_shows_its_lag_in_time(tab: Browsed, cluster: LocalCluster, client: Client) -> None:
    before_ms = time.time() * 1000
    offsets = [client.publish(TOPIC, b"old %d" % i, partition=0)[1] for i in range(3)]
    _, read = client.publish(TOPIC, b"read", partition=1)
    after_ms = time.time() * 1000
    client.commit("dash", TOPIC, 0, offsets[1])  # two records unread
    client.commit("dash", TOPIC, 1, read + 1)  # caught up
    oldest = client.fetch(TOPIC, 0, offsets[1]).records[0]
    assert oldest.offset == offsets[1]
    assert before_ms - 1000 <= oldest.timestamp <= after_ms + 1000
    time.sleep(0.3)  # so that the lag in time is well above 0
    asked_ms = time.time() * 1000
    group = api(cluster, "groups/dash")
    answered_ms = time.time() * 1000
    rows = {p["partition"]: p for t in group["topics"] for p in t["partitions"]}
    truth = {
        r.partition: (r.end or 0) - (r.committed or 0) for r in client.describe_group("dash", TOPIC)
    }
    assert rows[0]["lag"] == truth[0] == 2 and rows[1]["lag"] == truth[1] == 0
    assert rows[0]["oldest_unconsumed_ms"] == oldest.timestamp
    assert asked_ms - oldest.timestamp - 5 <= rows[0]["lag_ms"] <= answered_ms - oldest.timestamp
    assert rows[0]["lag_ms"] >= 300
    assert rows[1]["lag_ms"] == 0
    tab.page.goto(tab.base + "/#/group/dash")
    lagging = tab.page.get_by_test_id(f"lag-{TOPIC}-0").get_by_test_id("lag-time")
    expect(lagging).to_have_text(re.compile(r"^\d+(\.\d)? s$"))
    expect(tab.page.get_by_test_id(f"lag-{TOPIC}-1").get_by_test_id("lag-time")).to_have_text("0 s")


def test_a_device_leads_to_its_log_partition_its_readers_and_latest_value(
    tab: Browsed, cluster: LocalCluster, client: Client
) -> None:
    meter = device(cluster, "meter-1")
    try:
        meter.publish("meters/1/power", b'{"watts": 41}', qos=1)
        meter.publish("meters/1/power", PAYLOAD, qos=1, retain=True)
    finally:
        meter.close()
    # Where the line protocol finds it: the partition of the default log topic holding it.
    mapped = client.describe_topic("mqtt").partitions
    found = [
        (p.partition, r.offset)
        for p in mapped
        for r in client.fetch("mqtt", p.partition, 0).records
        if r.value == PAYLOAD
    ]
    assert len(found) == 1
    partition, offset = found[0]
    client.commit("billing", "mqtt", partition, offset)  # the last record unread
    view = api(cluster, "mqtt/devices/meter-1")
    [route] = view["routes"]
    assert (route["log_topic"], route["partition"]) == ("mqtt", partition)
    assert [(g["group_id"], g["lag"]) for g in route["groups"]] == [("billing", 1)]
    assert route["groups"][0]["lag_ms"] is not None and route["latest"]["offset"] == offset

    tab.page.goto(tab.base + "/#/mqtt")
    retained = tab.page.get_by_test_id("retained-meters/1/power")
    expect(retained.get_by_test_id("size")).to_have_text(str(len(PAYLOAD)))
    expect(retained.get_by_test_id("qos")).to_have_text("1")
    tab.page.get_by_test_id("device-pick").fill("meter-1")
    tab.page.get_by_role("button", name="Show").click()
    shown = tab.page.get_by_test_id("route-0")
    expect(shown.get_by_test_id("log-topic")).to_have_text("mqtt")
    expect(shown.get_by_test_id("partition")).to_have_text(str(partition))
    expect(shown.get_by_test_id("latest-value")).to_contain_text('"watts": 42')
    expect(shown.get_by_test_id("reader-billing").get_by_test_id("lag")).to_have_text("1")
    tab.shot("mqtt-device")


def test_a_disconnected_persistent_session_shows_its_queue(
    tab: Browsed, cluster: LocalCluster
) -> None:
    sleeper = device(cluster, "sleeper", clean=False)
    sleeper.subscribe("alerts/#")
    sleeper.close()
    tab.page.goto(tab.base + "/#/mqtt")
    row = tab.page.get_by_test_id("session-sleeper")
    expect(row.get_by_test_id("subscriptions")).to_have_text("alerts/#")
    expect(row.get_by_test_id("queued")).to_have_text("0")
    sender = device(cluster, "sender")
    try:
        for i in range(3):
            sender.publish("alerts/fire", b"alarm %d" % i, qos=1)
    finally:
        sender.close()
    expect(row.get_by_test_id("queued")).to_have_text("3")
    expect(tab.page.get_by_test_id("device-sender")).to_have_count(0)
    tab.shot("mqtt-sessions")


def test_a_refused_mqtt_login_is_on_the_timeline(tab: Browsed, cluster: LocalCluster) -> None:
    intruder = PahoDevice(cluster.mqtt_address(0), "intruder", username="meter", password="wrong")
    try:
        intruder.wait_connected()  # its CONNACK refuses it
    finally:
        intruder.close()
    wait_for(
        lambda: any(
            e["kind"] == "login" and "intruder" in e["text"] for e in api(cluster, "timeline")
        ),
        10,
        "the refused login on /api/timeline",
    )
    refused = tab.page.get_by_test_id("timeline").get_by_test_id("event-login")
    expect(refused.filter(has_text="intruder").first).to_be_visible()


def test_a_member_joining_and_leaving_is_on_the_timeline(
    tab: Browsed, cluster: LocalCluster, client: Client
) -> None:
    with GroupConsumer(cluster.bootstrap, TOPIC, "rebalancing") as member:
        member.poll(timeout=0.2)  # joins
        member.leave()

    def texts() -> list[str]:
        return [e["text"] for e in api(cluster, "timeline") if e["kind"] == "rebalance"]

    wait_for(lambda: any("rebalancing" in t and "left" in t for t in texts()), 10, "a leave")
    assert any("rebalancing" in t and "joined" in t for t in texts())
    rebalances = tab.page.get_by_test_id("timeline").get_by_test_id("event-rebalance")
    expect(rebalances.filter(has_text="rebalancing").first).to_be_visible()


def test_nothing_came_from_outside_and_nothing_failed(tab: Browsed) -> None:
    outside = [u for u in tab.requests if not u.startswith((tab.base + "/", "data:"))]
    assert tab.requests and not outside, outside
    assert not tab.errors, tab.errors
