"""The device simulator's report: what was sent and acknowledged over MQTT, checked against what
the log holds.

``check_log`` is pure: given, per device, how many readings were sent (serials ``0..sent-1``) and
which of them were never acknowledged, and the (device, serial) pairs read back from the log, it
counts the consumed, duplicated and missing readings. A missing reading that was acknowledged is
*lost* (the broker promised it, so this must be 0); a missing one that was never acknowledged is
reported apart (the device never heard back, so it would have sent it again).

``read_run`` reads those pairs from the log topic through the client library, keeping only this
run's records (the ``run`` field of the payload) from the offsets the run started at.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from kafkaesque.client import Client, Consumer, KafkaesqueError, TopicPartition

from .devices_fleet import WorkerResult

_READING: Final = re.compile(
    rb'"run": "(?P<run>[^"]*)", "device": "(?P<device>[^"]*)", "serial": (?P<serial>\d+)\s*, '
    rb'"ts_ms": (?P<ts>\d+)'
)


_FETCH_BYTES = 8 * 1024 * 1024  # per FETCH: fewer round trips (a third less time than 1 MiB)


def percentile(samples: Iterable[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) by nearest rank, or None without samples."""
    ordered = sorted(samples)
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def parse_reading(value: bytes) -> tuple[str, str, int, int] | None:
    """(run, device, serial, ts_ms) of a reading's payload, or None if it is not one."""
    match = _READING.search(value)
    if match is None:
        return None
    return (
        match["run"].decode(),
        match["device"].decode(),
        int(match["serial"]),
        int(match["ts"]),
    )


@dataclass(frozen=True)
class LogCheck:
    """The readings of one run as the log holds them."""

    consumed: int  # records of the run read from the log (duplicates included)
    duplicated: int  # records beyond the first of the same (device, serial)
    lost: int  # acknowledged but not in the log: must be 0
    missing_unacknowledged: int  # never acknowledged and not in the log
    unexpected: int  # a (device, serial) the run never sent
    lost_examples: tuple[tuple[str, int], ...] = ()


def check_log(
    devices: Mapping[str, tuple[int, list[int]]],
    seen: Iterable[tuple[str, int]],
    *,
    acknowledged: bool = True,
) -> LogCheck:
    """Compare what was sent (``devices``: id -> (sent, unacknowledged serials)) with the
    (device, serial) pairs found in the log. ``acknowledged=False`` (QoS 0: nothing is ever
    acknowledged) counts every missing reading as missing, none as lost."""
    found: dict[str, set[int]] = {}
    consumed = duplicated = unexpected = 0
    for device, serial in seen:
        consumed += 1
        serials = found.setdefault(device, set())
        if serial in serials:
            duplicated += 1
            continue
        serials.add(serial)
        outcome = devices.get(device)
        if outcome is None or serial >= outcome[0]:
            unexpected += 1
    lost = missing_unacked = 0
    examples: list[tuple[str, int]] = []
    for device, (sent, unacked) in sorted(devices.items()):
        have = found.get(device, set())
        unacked_set = set(unacked)
        for serial in range(sent):
            if serial in have:
                continue
            if serial in unacked_set or not acknowledged:
                missing_unacked += 1
            else:
                lost += 1
                if len(examples) < 10:
                    examples.append((device, serial))
    return LogCheck(consumed, duplicated, lost, missing_unacked, unexpected, tuple(examples))


def end_offsets(client: Client, topic: str) -> dict[int, int] | None:
    """Each partition's high watermark now, or None if ``topic`` does not exist yet."""
    if topic not in {row.topic for row in client.list_topics()}:
        return None
    with Consumer(client) as consumer:
        consumer.assign_topic(topic)
        return {tp.partition: offset for tp, offset in consumer.end_offsets().items()}


def read_run(
    client: Client,
    topic: str,
    run: str,
    start: Mapping[int, int] | None,
    timeout: float = 120.0,
    *,
    ends: Mapping[int, int] | None = None,
) -> tuple[list[tuple[str, int]], list[float]]:
    """This run's (device, serial) pairs in ``topic`` from ``start`` (partition -> offset; None:
    from the beginning) up to ``ends`` (partition -> offset; None: the high watermarks of now),
    and the end-to-end latencies (record timestamp minus the reading's ts_ms) in ms. Raises
    ``TimeoutError`` after ``timeout``.

    A high watermark is the commit index of the replica that reports it: right after a
    failover (a new leader whose term has not committed yet, or a follower answering for a
    silent leader) it can lie below records the old leader committed and acknowledged, which
    would then look lost; ``fence_ends`` gives ends that cannot. A partition ``ends`` leaves
    out is read up to its high watermark."""
    pairs: list[tuple[str, int]] = []
    e2e: list[float] = []
    deadline = time.monotonic() + timeout
    with Consumer(client, max_bytes=_FETCH_BYTES) as consumer:
        partitions = consumer.assign_topic(topic)
        consumer.seek_to_beginning()
        for tp in partitions:
            if start is not None and tp.partition in start:
                consumer.seek(tp, start[tp.partition])
        reached = consumer.end_offsets()
        if ends is not None:  # (a partition it leaves out: up to its high watermark)
            reached.update({tp: ends[tp.partition] for tp in partitions if tp.partition in ends})
        while not _reached(consumer, reached):
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic!r} back took over {timeout:.0f} s")
            for record in consumer.poll(1.0):
                reading = parse_reading(record.value or b"")
                if reading is None or reading[0] != run:
                    continue
                pairs.append((reading[1], reading[2]))
                if record.timestamp >= 0:
                    e2e.append(float(record.timestamp - reading[3]))
    return pairs, e2e


_FENCE_S: Final = 120.0  # how long ``fence_ends`` tries each partition
_FENCE_PAUSE_S: Final = 1.0


def fence_ends(
    client: Client, topic: str, partitions: int, run: str, timeout: float = _FENCE_S
) -> tuple[dict[int, int], list[str]]:
    """Append a marker record (no reading: ``parse_reading`` skips it) to each partition of
    ``topic``; the offset after each, the ends of a read that misses no committed record, and
    what went wrong. A marker is acknowledged once committed in its leader's term, and every
    record any leader committed before is then below it (Raft's Leader Completeness), whatever
    the high watermarks said. A marker is sent again after an error (a second copy is
    harmless); a partition that took none within ``timeout`` is left out of the ends (the
    caller reads it up to its high watermark) and named in the problems."""
    marker = json.dumps({"marker": run}).encode()
    ends: dict[int, int] = {}
    problems: list[str] = []
    for partition in range(partitions):
        deadline = time.monotonic() + timeout
        while True:
            try:
                ends[partition] = client.publish(topic, marker, partition=partition)[1] + 1
                break
            except KafkaesqueError as exc:
                if time.monotonic() + _FENCE_PAUSE_S > deadline:
                    problems.append(
                        f"{topic}/{partition} took no marker in {timeout:.0f} s ({exc}): read up "
                        "to its high watermark, which may lag what was acknowledged"
                    )
                    break
                time.sleep(_FENCE_PAUSE_S)
    return ends, problems


def _reached(consumer: Consumer, ends: Mapping[TopicPartition, int]) -> bool:
    return all((consumer.position(tp) or 0) >= end for tp, end in ends.items())


@dataclass
class Report:
    """Everything ``kafkaesque devices`` reports (``--json`` prints ``as_dict()``)."""

    run: str
    devices: int
    connected: int
    failed: int
    dropped: int  # connections the server closed during the run
    reconnected: int  # of those, connected again (their unacknowledged readings resent)
    resent: int
    qos: int
    seconds: float
    sent: int
    acknowledged: int
    unacknowledged: int
    msgs_per_s: float  # acknowledged (QoS 1) or sent (QoS 0) per second in the measured window
    puback_p50_ms: float | None
    puback_p99_ms: float | None
    commands_received: int
    command_p50_ms: float | None
    command_p99_ms: float | None
    consumed: int | None = None
    duplicated: int | None = None
    lost: int | None = None
    missing_unacknowledged: int | None = None
    unexpected: int | None = None
    e2e_p50_ms: float | None = None
    e2e_p99_ms: float | None = None
    lost_examples: list[tuple[str, int]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @classmethod
    def build(cls, run: str, devices: int, qos: int, result: WorkerResult) -> Report:
        window = max(result.window_s, 1e-9)
        rate = (result.acknowledged_in_window if qos else result.sent_in_window) / window
        return cls(
            run=run,
            devices=devices,
            connected=result.connected,
            failed=result.failed,
            dropped=result.dropped,
            reconnected=result.reconnected,
            resent=result.resent,
            qos=qos,
            seconds=result.window_s,
            sent=result.sent,
            acknowledged=result.acknowledged,
            unacknowledged=sum(len(u) for _, u in result.devices.values()) if qos else 0,
            msgs_per_s=rate,
            puback_p50_ms=percentile(result.puback_ms, 0.5),
            puback_p99_ms=percentile(result.puback_ms, 0.99),
            commands_received=result.commands,
            command_p50_ms=percentile(result.command_ms, 0.5),
            command_p99_ms=percentile(result.command_ms, 0.99),
            errors=list(result.errors),
        )

    def add_log(self, check: LogCheck, e2e_ms: list[float]) -> None:
        self.consumed = check.consumed
        self.duplicated = check.duplicated
        self.lost = check.lost
        self.missing_unacknowledged = check.missing_unacknowledged
        self.unexpected = check.unexpected
        self.lost_examples = list(check.lost_examples)
        self.e2e_p50_ms = percentile(e2e_ms, 0.5)
        self.e2e_p99_ms = percentile(e2e_ms, 0.99)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.as_dict())

    def lines(self) -> list[str]:
        """The report for a human."""
        out = [
            f"run {self.run}: {self.connected:,} of {self.devices:,} devices connected "
            f"({self.failed:,} failed); {self.dropped:,} connections dropped by the server during "
            f"the run, {self.reconnected:,} reconnected, {self.resent:,} readings resent",
            f"sent {self.sent:,} readings at QoS {self.qos}, acknowledged {self.acknowledged:,}, "
            f"unacknowledged {self.unacknowledged:,}; {self.msgs_per_s:,.0f} msg/s over "
            f"{self.seconds:.1f} s",
            f"PUBACK latency p50 {_ms(self.puback_p50_ms)}, p99 {_ms(self.puback_p99_ms)}",
            f"commands received {self.commands_received:,}; delivery latency p50 "
            f"{_ms(self.command_p50_ms)}, p99 {_ms(self.command_p99_ms)}",
        ]
        if self.consumed is not None:
            out.append(
                f"log: consumed {self.consumed:,}, duplicated {self.duplicated:,}, lost "
                f"(acknowledged, not in the log) {self.lost:,}, missing and never acknowledged "
                f"{self.missing_unacknowledged:,}, unexpected {self.unexpected:,}"
            )
            out.append(
                f"end to end (ts_ms -> record timestamp) p50 {_ms(self.e2e_p50_ms)}, "
                f"p99 {_ms(self.e2e_p99_ms)}"
            )
            if self.lost_examples:
                shown = ", ".join(f"{d}#{s}" for d, s in self.lost_examples)
                out.append(f"LOST: {shown}")
        out.extend(f"error: {e}" for e in self.errors[:5])
        return out


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} ms"
