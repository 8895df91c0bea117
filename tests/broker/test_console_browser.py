"""The web console in a real browser (Debian's chromium, driven by Playwright's sync API)
against a real 3-broker cluster: each screen shows what the line protocol says, a record
published through the line protocol appears in the live view, a kill -9 of a leader shows the
new leader and the election on the timeline, and the page loads nothing from outside this
machine and logs no error. After the kill: each partition's last election (leader, term,
cause), the who-hears-whom matrix (the killed broker red, then back once restarted), and the
topic screen's messages by time, search (bounded), export and latest value, each against what
the line protocol says.

One cluster and one browser for the module. Skipped, with the reason, where chromium or
Playwright is missing (bin/_bootstrap.sh installs chromium; never ``playwright install``).
``KAFKAESQUE_SCREENSHOTS=1`` also saves the screenshots of docs/console.md under docs/console/.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import json
import os
import re
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.http import CHROMIUM
from bench.http import CHROMIUM_FLAGS as FLAGS
from kafkaesque.client import Client, TopicPartition
from kafkaesque.local_cluster import LocalCluster

from .mqtt_helpers import PahoDevice

TOPIC = "orders"
SHOTS = Path(__file__).resolve().parents[2] / "docs" / "console"

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
if not shutil.which(CHROMIUM):
    pytest.skip(
        f"{CHROMIUM} is missing (bin/_bootstrap.sh installs chromium)", allow_module_level=True
    )

expect = sync_api.expect


class Browsed:
    """The page of one console tab and everything it did."""

    def __init__(self, page: Any, base: str) -> None:
        self.page = page
        self.base = base
        self.requests: list[str] = []
        self.errors: list[str] = []
        page.on("request", lambda r: self.requests.append(r.url))
        page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))
        page.on(
            "console",
            lambda m: (
                self.errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None
            ),
        )

    def shot(self, name: str) -> None:
        if os.environ.get("KAFKAESQUE_SCREENSHOTS") == "1":
            SHOTS.mkdir(exist_ok=True)
            self.page.screenshot(path=str(SHOTS / f"{name}.png"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(str(tmp_path_factory.mktemp("cluster")), 3, mqtt=True) as running:
        yield running


@pytest.fixture(scope="module")
def client(cluster: LocalCluster) -> Iterator[Client]:
    with Client(cluster.bootstrap) as connected:
        connected.create_topic(TOPIC, 3, 3)
        for i in range(12):
            value = json.dumps({"order": i, "item": "book"}).encode()
            connected.publish(TOPIC, value, key=f"customer-{i % 4}".encode())
        yield connected


@contextlib.contextmanager
def console_tab(cluster: LocalCluster, height: int = 800) -> Iterator[Browsed]:
    """A headless chromium tab on broker 0's console (the browser closed at the end)."""
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": height})
            page.set_default_timeout(15_000)
            browsed = Browsed(page, f"http://127.0.0.1:{cluster.ports[0].admin}")
            page.goto(browsed.base + "/")
            yield browsed
        finally:
            browser.close()


@pytest.fixture(scope="module")
def tab(cluster: LocalCluster, client: Client) -> Iterator[Browsed]:
    with console_tab(cluster) as browsed:
        yield browsed


def test_overview_shows_every_broker_up_and_the_controller(tab: Browsed) -> None:
    page = tab.page
    expect(page.get_by_test_id("stream-state")).to_have_text("live")
    expect(page.get_by_test_id("brokers-up")).to_contain_text("3 / 3")
    for broker in range(3):
        expect(page.get_by_test_id(f"broker-{broker}").get_by_test_id("broker-state")).to_have_text(
            "up"
        )
    expect(page.get_by_test_id("controller")).to_contain_text("broker ")
    # Every partition (the topic's and the MQTT wing's internal ones) led, all replicas up.
    expect(page.get_by_test_id("leaderless")).to_have_text(re.compile(r"^0leaderless"))
    expect(page.get_by_test_id("under-replicated")).to_have_text(re.compile(r"^0under"))
    tab.shot("overview")


def agree(shown: Callable[[], str], truth: Callable[[], str], timeout: float = 20.0) -> None:
    """Wait until the page shows what the line protocol says, both read again each time (an
    election under load adds a leader's no-op batch: the end offsets may move meanwhile)."""
    deadline = time.monotonic() + timeout
    while True:
        expected = truth()
        seen = shown()
        if seen == expected:
            return
        assert time.monotonic() < deadline, (
            f"the page shows {seen!r}, the line protocol {expected!r}"
        )
        time.sleep(0.3)


def test_topics_list_shows_the_end_offsets_describe_gives(tab: Browsed, client: Client) -> None:
    tab.page.goto(tab.base + "/#/topics")
    cell = tab.page.get_by_test_id(f"topic-{TOPIC}").get_by_test_id("end-offset")
    expect(cell).to_be_visible()
    agree(
        cell.inner_text,
        lambda: f"{sum(p.end_offset or 0 for p in client.describe_topic(TOPIC).partitions):,}",
    )
    tab.page.get_by_role("columnheader", name="Partitions").click()  # sortable
    expect(tab.page.get_by_role("columnheader", name=re.compile("Partitions ▲"))).to_be_visible()
    tab.shot("topics")


def test_topic_shows_leaders_and_end_offsets_and_pretty_json(tab: Browsed, client: Client) -> None:
    page = tab.page
    page.goto(tab.base + f"/#/topic/{TOPIC}")
    expect(page.get_by_test_id("partition-2")).to_be_visible()

    def shown() -> str:
        return " ".join(
            page.get_by_test_id(f"partition-{p}").get_by_test_id(field).inner_text()
            for p in range(3)
            for field in ("leader", "end-offset")
        )

    def described() -> str:
        rows = client.describe_topic(TOPIC).partitions
        return " ".join(f"{r.leader} {r.end_offset}" for r in rows)

    agree(shown, described)
    # The newest records of partition 0: JSON values pretty-printed, keys as text.
    expect(page.get_by_test_id("messages").get_by_test_id("value").first).to_contain_text(
        '"item": "book"'
    )
    expect(page.get_by_test_id("messages").get_by_test_id("key").first).to_contain_text("customer-")
    tab.shot("topic")


def test_a_record_published_by_the_line_protocol_appears_in_the_live_view(
    tab: Browsed, client: Client
) -> None:
    page = tab.page
    page.get_by_test_id("message-partition").select_option("1")
    page.get_by_test_id("live").check()
    expect(page.get_by_test_id("messages")).to_be_visible()
    _, offset = client.publish(TOPIC, b'{"live": "tail"}', partition=1)
    row = page.get_by_test_id(f"message-{offset}")
    expect(row.get_by_test_id("value")).to_contain_text('"live": "tail"')
    page.get_by_test_id("live").uncheck()


def test_the_produce_form_writes_through_rest(tab: Browsed, client: Client) -> None:
    page = tab.page
    page.get_by_test_id("produce-value").fill("from the console")
    page.get_by_test_id("produce").click()
    result = page.get_by_test_id("produce-result")
    expect(result).to_contain_text("at offset")
    partition, offset = map(int, re.findall(r"\d+", result.inner_text())[:2])
    fetched = client.fetch(TOPIC, partition, offset)
    assert [m.value for m in fetched.records][:1] == [b"from the console"]


def test_a_group_shows_the_lag_the_line_protocol_gives_and_previews_a_reset(
    tab: Browsed, client: Client
) -> None:
    page = tab.page
    for p in range(3):
        client.commit("billing", TOPIC, p, 1)
    rows = client.describe_group("billing", TOPIC)
    page.goto(tab.base + "/#/groups")
    expect(page.get_by_test_id("group-billing")).to_contain_text(TOPIC)
    page.get_by_role("link", name="billing").click()
    assert all(r.committed == 1 and r.end is not None for r in rows)
    expect(page.get_by_test_id(f"lag-{TOPIC}-2")).to_be_visible()

    def shown() -> str:
        return " ".join(
            page.get_by_test_id(f"lag-{TOPIC}-{p}").get_by_test_id(field).inner_text()
            for p in range(3)
            for field in ("end-offset", "lag")
        )

    def described() -> str:
        rows = sorted(client.describe_group("billing", TOPIC), key=lambda r: r.partition)
        return " ".join(f"{r.end:,} {(r.end or 0) - 1:,}" for r in rows)

    agree(shown, described)
    page.get_by_test_id("reset-to").select_option("earliest")
    page.get_by_test_id("reset-preview-button").click()
    expect(page.get_by_test_id("reset-preview")).to_contain_text('"dry_run": true')
    assert [r.committed for r in client.describe_group("billing", TOPIC)] == [1, 1, 1]
    # The topics list names the group (its coordinator may be another broker: its PeerView
    # tells the console's) and the largest lag the line protocol gives.
    page.goto(tab.base + "/#/topics")
    row = page.get_by_test_id(f"topic-{TOPIC}")
    expect(row.get_by_test_id("groups")).to_contain_text("billing")
    agree(
        row.get_by_test_id("max-lag").inner_text,
        lambda: f"{max((r.end or 0) - 1 for r in client.describe_group('billing', TOPIC)):,}",
    )


def test_the_mqtt_screen_shows_a_connected_device_and_its_subscription(
    tab: Browsed, cluster: LocalCluster
) -> None:
    device = PahoDevice(cluster.mqtt_address(0), "phone-7")
    try:
        device.wait_connected()
        device.subscribe("phones/+/alerts")
        tab.page.goto(tab.base + "/#/mqtt")
        row = tab.page.get_by_test_id("device-phone-7")
        expect(row.get_by_test_id("subscriptions")).to_have_text("phones/+/alerts")
        expect(tab.page.get_by_test_id("mapping")).to_contain_text("mqtt")  # the default topic
        tab.shot("mqtt")
    finally:
        device.close()
    expect(tab.page.get_by_test_id("device-phone-7")).to_have_count(0)


def test_the_acls_screen_shows_the_acls_and_users_acl_list_gives(
    tab: Browsed, client: Client
) -> None:
    assert client.list_acls() == []
    tab.page.goto(tab.base + "/#/acls")
    expect(tab.page.get_by_text("No ACLs: every authenticated principal")).to_be_visible()
    expect(tab.page.get_by_test_id("users")).to_contain_text("No users file")


def test_a_killed_leader_shows_its_successor_and_the_election(
    tab: Browsed, cluster: LocalCluster, client: Client
) -> None:
    page = tab.page
    described = client.describe_topic(TOPIC).partitions
    # A partition led by another broker than the console's (broker 0), so the tab lives on.
    victim = next((p for p in described if p.leader is not None and p.leader != 0), None)
    if victim is None or victim.leader is None:
        pytest.skip("every partition is led by the console's broker")
    old = victim.leader
    page.goto(tab.base + f"/#/topic/{TOPIC}")
    row = page.get_by_test_id(f"partition-{victim.partition}")
    expect(row.get_by_test_id("leader")).to_have_text(str(old))
    cluster.kill(old)
    expect(row.get_by_test_id("leader")).not_to_have_text(str(old), timeout=20_000)
    expect(row.get_by_test_id("leader")).to_have_text(re.compile(r"^[0-2]$"), timeout=20_000)
    elections = page.get_by_test_id("timeline").get_by_test_id("event-election")
    expect(elections.filter(has_text=f"{TOPIC}/{victim.partition}").first).to_be_visible(
        timeout=20_000
    )
    down = page.get_by_test_id("timeline").get_by_test_id("event-broker")
    expect(down.filter(has_text=f"broker {old} is down").first).to_be_visible(timeout=20_000)
    page.goto(tab.base + "/#/")
    expect(page.get_by_test_id("brokers-up")).to_contain_text("2 / 3")
    tab.shot("failover")


def test_nothing_came_from_outside_and_nothing_failed(tab: Browsed) -> None:
    outside = [u for u in tab.requests if not u.startswith((tab.base + "/", "data:"))]
    assert tab.requests and not outside, outside
    assert not tab.errors, tab.errors


# -- who hears whom, last elections, and the topic screen's tools (issue 34; after the kill) ---


def test_the_last_election_of_each_partition_names_its_leader_term_and_cause(
    tab: Browsed, client: Client
) -> None:
    """After the kill above: each partition's last election names the leader DESCRIBE gives,
    and those the killed broker led were won in a later term for its loss (the Raft core's
    recorded cause, not a log line)."""
    page = tab.page
    page.goto(tab.base + f"/#/topic/{TOPIC}")
    expect(page.get_by_test_id("partition-2")).to_be_visible()
    pattern = re.compile(r"^term (\d+): broker (\d), ([a-z -]+), \d{4}-\d\d-\d\d ")

    def shown() -> str:
        texts = []
        for p in range(3):
            row = page.get_by_test_id(f"partition-{p}")
            found = pattern.match(row.get_by_test_id("election").inner_text())
            texts.append("none" if found is None else found.group(2))
        return " ".join(texts)

    agree(shown, lambda: " ".join(str(r.leader) for r in client.describe_topic(TOPIC).partitions))
    causes = [
        pattern.match(page.get_by_test_id(f"partition-{p}").get_by_test_id("election").inner_text())
        for p in range(3)
    ]
    assert all(c is not None for c in causes)
    assert {c.group(3) for c in causes if c is not None} <= {
        "start-up", "leader gone", "leader timeout", "leadership transfer"
    }  # fmt: skip
    later = [c for c in causes if c is not None and int(c.group(1)) > 1]
    assert later, "the killed broker's partitions elected a new leader in a later term"
    assert {c.group(3) for c in later} <= {"leader gone", "leader timeout"}


def test_the_overview_shows_who_hears_whom_the_killed_broker_in_red_then_back(
    tab: Browsed, cluster: LocalCluster
) -> None:
    """The matrix (row hears column): the killed broker's row unknown, its column not heard by
    the others (each says so in its PeerView); restarted, every cell is heard again."""
    page = tab.page
    dead = next(b for b in range(3) if b not in cluster.alive())
    alive = [b for b in range(3) if b != dead]
    page.goto(tab.base + "/#/")
    for other in alive:
        expect(page.get_by_test_id(f"heard-{dead}-{other}")).to_have_attribute(
            "data-heard", "unknown"
        )
        expect(page.get_by_test_id(f"heard-{other}-{dead}")).to_have_attribute(
            "data-heard", "false", timeout=20_000
        )
        expect(page.get_by_test_id(f"heard-{other}-{dead}")).to_have_class(re.compile("down"))
    expect(page.get_by_test_id(f"heard-{alive[0]}-{alive[1]}")).to_have_attribute(
        "data-heard", "true"
    )
    expect(page.get_by_test_id(f"heard-{alive[1]}-{alive[0]}")).to_have_attribute(
        "data-heard", "true"
    )
    cluster.start(dead)
    cluster.wait_ready(brokers=[0, 1, 2])
    for a in range(3):
        for b in range(3):
            if a != b:
                expect(page.get_by_test_id(f"heard-{a}-{b}")).to_have_attribute(
                    "data-heard", "true", timeout=30_000
                )


def _local_input(ms: int) -> str:
    """``ms`` as a datetime-local input's value, in this machine's time zone (the browser's)."""
    moment = datetime.datetime.fromtimestamp(ms / 1000)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}"


def test_messages_by_time_search_export_and_latest_agree_with_the_line_protocol(
    tab: Browsed, client: Client
) -> None:
    page = tab.page
    client.publish(TOPIC, b'{"before": true}', key=b"early", partition=0)
    time.sleep(0.05)
    moment = int(time.time() * 1000)
    time.sleep(0.05)
    _, first_after = client.publish(TOPIC, b'{"after": true}', key=b"late", partition=0)
    page.goto(tab.base + f"/#/topic/{TOPIC}")
    page.get_by_test_id("message-partition").select_option("0")
    # By time: the offset the line protocol's ListOffsets (DESCRIBE time=) gives, read from there.
    page.get_by_test_id("message-time").fill(_local_input(moment))
    page.get_by_test_id("read-time").click()
    note = page.get_by_test_id("time-result")
    expect(note).to_have_attribute("data-offset", str(first_after))
    assert client.offsets_for_times({(TOPIC, 0): moment}) == {TopicPartition(TOPIC, 0): first_after}
    expect(page.get_by_test_id(f"message-{first_after}").get_by_test_id("value")).to_contain_text(
        '"after": true'
    )
    # Search from offset 0: the records whose key is exactly customer-1, and how many scanned.
    records = client.fetch(TOPIC, 0, 0).records
    page.get_by_test_id("message-offset").fill("0")
    page.get_by_test_id("search-q").fill("customer-1")
    page.get_by_test_id("search-in").select_option("exact-key")
    page.get_by_test_id("search").click()
    expected = [r.offset for r in records if r.key == b"customer-1"]
    summary = page.get_by_test_id("search-summary")
    expect(summary).to_contain_text(f"{len(expected)} found in ")
    expect(summary).to_contain_text("the end of the partition")
    found = page.get_by_test_id("search-results").locator("tr[data-testid^='found-']")
    expect(found).to_have_count(len(expected))
    assert [int(t.removeprefix("found-")) for t in found.evaluate_all(
        "rows => rows.map(r => r.dataset.testid)")] == expected  # fmt: skip
    # Export the shown range (read from offset 0) as JSON lines: the line protocol's records.
    page.get_by_test_id("read").click()
    expect(
        page.get_by_test_id("message-0").or_(page.get_by_test_id("message-1")).first
    ).to_be_visible()
    shown_rows = page.get_by_test_id("messages").locator("tr[data-testid^='message-']")
    shown_count = shown_rows.count()
    with page.expect_download() as download:
        page.get_by_test_id("export").click()
    lines = Path(download.value.path()).read_text().splitlines()
    exported = [json.loads(line) for line in lines]
    assert len(exported) == shown_count
    by_offset = {r.offset: r for r in records}
    for row in exported:
        record = by_offset[row["offset"]]
        assert base64.b64decode(row["value"]) == record.value
        assert (row["key"] and base64.b64decode(row["key"])) == record.key
    # The latest value of a key, in a compacted topic: what LATEST gives.
    client.create_topic("phones", 1, 3, compact=True)
    client.publish("phones", b'{"battery": 80}', key=b"phone-1")
    client.publish("phones", b'{"battery": 79}', key=b"phone-1")
    page.goto(tab.base + "/#/topics")  # once the console's snapshot knows the new topic
    page.get_by_test_id("topic-phones").get_by_role("link").click()
    page.get_by_test_id("latest-key").fill("phone-1")
    page.get_by_test_id("latest").click()
    expect(page.get_by_test_id("latest-result").get_by_test_id("value")).to_contain_text(
        '"battery": 79'
    )
    latest = client.latest("phones", b"phone-1")
    assert latest is not None and latest.value == b'{"battery": 79}'
    errors = len(tab.errors)
    page.get_by_test_id("latest-key").fill("phone-2")
    page.get_by_test_id("latest").click()
    expect(page.get_by_test_id("latest-result")).to_contain_text("no value")
    page.wait_for_timeout(200)
    # Chromium logs REST's 404 for a key without a value as a console error: that one only.
    assert all("404" in e for e in tab.errors[errors:]), tab.errors[errors:]
    del tab.errors[errors:]


def test_a_search_scans_at_most_its_limit_and_says_where_the_next_one_starts(
    cluster: LocalCluster, client: Client
) -> None:
    """The bound that keeps a search from pinning the broker: ``limit`` records (10,000 at
    most; more is refused), how many were scanned, and the offset to search on from."""
    base = f"http://127.0.0.1:{cluster.ports[0].admin}/api/topics/{TOPIC}/partitions/0/search"
    with urllib.request.urlopen(base + "?offset=0&in=value&q=book&limit=3") as answer:
        body = json.loads(answer.read())
    records = client.fetch(TOPIC, 0, 0).records[:3]
    assert (body["scanned"], body["end_reached"]) == (3, False)
    assert body["next_offset"] == records[-1].offset + 1
    assert [m["offset"] for m in body["matches"]] == [
        r.offset for r in records if b"book" in (r.value or b"")
    ]
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(base + "?offset=0&in=value&q=book&limit=10001")
    assert refused.value.code == 422


def test_the_new_screens_loaded_nothing_from_outside_and_logged_no_error(tab: Browsed) -> None:
    test_nothing_came_from_outside_and_nothing_failed(tab)
