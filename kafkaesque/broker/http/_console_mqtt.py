"""The console's MQTT screen and its device view.

``/api/mqtt``: the MQTT wing's description (``MqttService.describe``: devices connected here,
the topic mapping, retained messages, persistent sessions whose connection ended, counters),
with each ended session's ``queued``: the deliveries it owes (sent, not acknowledged) plus the
records of its partitions past the offset it resumes from, against the shared snapshot's end
offsets (an upper bound: records of those partitions that match none of its subscriptions count
too).

``/api/mqtt/devices/{client_id}``: from a device to its log partitions. Where its PUBLISHes
went is what this broker's own topic mapping and partitioning placed them at
(``MqttService.device``, never a copy of their rules); for each (MQTT topic, log topic,
partition): the partition's leader and end offset (REST's describe), the consumer groups reading
it with their lag in records and in time (REST's groups and lags, ``_console_groups``), and its
latest value: REST's latest-by-key where the log topic is compacted and the rule gives a key,
else the newest record of the partition that this device published to that MQTT topic, among
the last ``TAIL_RECORDS`` (one bounded read). Everything goes through the REST handlers, as the
caller (``InnerRest``).
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from kafkaesque.protocol.mqtt import MQTT_CLIENT_HEADER, MQTT_TOPIC_HEADER

from ._console_groups import InnerRest, add_lag_times, segment
from ._rest_errors import RestError

TAIL_RECORDS: Final = 200
TAIL_BYTES: Final = 256 * 1024
MAX_GROUPS: Final = 50


def mqtt_screen(described: dict[str, Any], ends: Mapping[tuple[str, int], int]) -> dict[str, Any]:
    """``described`` (``MqttService.describe``) with each ended session's ``queued``."""
    for session in described.get("sessions", ()):
        behind = 0
        for p in session.pop("positions"):
            end = ends.get((p["topic"], p["partition"]))
            if end is not None:
                behind += max(0, end - p["next"])
        session["queued"] = session["owed"] + behind
    return described


async def device_view(
    rest: InnerRest, device: dict[str, Any], *, clock: Callable[[], float] = time.time
) -> dict[str, Any]:
    """The device view of ``device`` (``MqttService.device``; see the module docstring)."""
    client_id = device["client_id"]
    described: dict[str, Any] = {}  # log topic -> REST's describe
    groups: list[dict[str, Any]] | None = None
    lags: dict[tuple[str, str], list[dict[str, Any]]] = {}  # (group, topic) -> lag rows
    timed: list[tuple[str, dict[str, Any]]] = []
    routes = []
    for sent in device["published"]:
        topic, partition = sent["log_topic"], sent["partition"]
        route: dict[str, Any] = {
            "mqtt_topic": sent["mqtt_topic"],
            "log_topic": topic,
            "partition": partition,
            "key": _text(sent["key"]),
            "leader": None,
            "end_offset": None,
            "groups": [],
            "latest": None,
            "error": None,
        }
        routes.append(route)
        try:  # one route the caller may not read (its ACLs) leaves the others shown
            if topic not in described:
                described[topic], _ = await rest.get(f"/topics/{segment(topic)}")
            about = described[topic]
            place: dict[str, Any] = next(
                (p for p in about["partitions"] if p["partition"] == partition), {}
            )
            route.update(leader=place.get("leader"), end_offset=place.get("end_offset"))
            if groups is None:
                groups, _ = await rest.get("/consumer-groups")
            for group in groups[:MAX_GROUPS]:
                name = group["group_id"]
                if not any(t["topic"] == topic for t in group["topics"]):
                    continue
                if (name, topic) not in lags:
                    body, _ = await rest.get(
                        f"/consumer-groups/{segment(name)}/lags?topic={segment(topic)}"
                    )
                    lags[name, topic] = body["lags"]
                for row in lags[name, topic]:
                    if row["partition"] == partition:
                        reader = {"group_id": name, **row}
                        route["groups"].append(reader)
                        timed.append((topic, reader))
            compacted = bool(about.get("configs", {}).get("compact"))
            route["latest"] = await _latest(rest, client_id, sent, compacted, place)
        except RestError as exc:
            route["error"] = f"{exc.status} {exc.message}"
    await add_lag_times(rest, timed, clock)
    return {**{k: v for k, v in device.items() if k != "published"}, "routes": routes}


async def _latest(
    rest: InnerRest, client_id: str, sent: dict[str, Any], compacted: bool, place: dict[str, Any]
) -> dict[str, Any] | None:
    topic, partition, key = sent["log_topic"], sent["partition"], sent["key"]
    if compacted and key is not None:
        try:
            row, _ = await rest.get(f"/topics/{segment(topic)}/latest/{segment(key)}")
        except RestError as exc:
            if exc.status == 404:
                return None
            raise
        return {"offset": row["offset"], "value": row["value"], "by": "latest value of its key"}
    end = place.get("end_offset")
    if end is None:
        return None
    start = max(place.get("start_offset") or 0, end - TAIL_RECORDS)
    records, _ = await rest.get(
        f"/topics/{segment(topic)}/partitions/{partition}/records"
        f"?offset={start}&max_bytes={TAIL_BYTES}"
    )
    wanted = {
        (MQTT_CLIENT_HEADER, _b64(client_id.encode())),
        (MQTT_TOPIC_HEADER, _b64(sent["mqtt_topic"].encode())),
    }
    newest = None
    for record in records:
        headers = {(h["name"], h["value"]) for h in record["headers"]}
        if wanted <= headers:
            newest = record
    if newest is None:
        return None
    return {
        "offset": newest["offset"],
        "timestamp": newest["timestamp"],
        "value": newest["value"],
        "by": f"newest record of this device in the last {TAIL_RECORDS} of the partition",
    }


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _text(key: bytes | None) -> str | None:
    """A key as text (UTF-8), or in hex when it is not."""
    if key is None:
        return None
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError:
        return key.hex(" ")
