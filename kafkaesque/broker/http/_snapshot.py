"""One shared picture of the cluster per second, for the console and ``/metrics``.

``ClusterSnapshots.current()`` gives the latest ``Snapshot`` (brokers up or down, the
controller, each partition's leader, the under-replicated and leaderless partitions, message
and byte rates); a snapshot older than ``period_s`` is replaced first, by one caller while the
others wait for it. So however many tabs and scrapers ask, the broker builds at most one
snapshot a second, and nothing when nobody asks: an unwatched broker pays nothing. A snapshot
reads only this broker's memory (the metadata view, the leader table, the Raft groups hosted
here): a tab on the overview costs no request to another broker.

The end offsets of a snapshot are the commit indexes of the replicas hosted here (exact where
this broker leads; a follower's may be a heartbeat behind). The screens that show end offsets
(the topics list, a topic) ask ``exact_ends()`` instead: every partition's high watermark as
its leader has it (one ``BOUNDS`` request per other leader), also shared and at most once a
period.

The rates come from a ring of the last ``ring`` (time, messages, bytes) samples, one per
snapshot: messages are the sum of the end offsets hosted here (offsets, control batches
included), bytes the size of the logs hosted here. Each new snapshot is compared with the one
before, and what changed (a broker heard or no more, a new controller, a partition's new leader
or none) goes to the ``Timeline``.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import trio

from kafkaesque.raft import Role
from kafkaesque.raft.driver import RaftReplica

from .._metadata_view import MetadataView
from .._peer_views import ElectionNote
from ._timeline import Timeline

PERIOD_S: Final = 1.0
RING: Final = 120
_DETAILED_MOVES: Final = 12  # leader changes told one by one in a snapshot; the rest summed up

Partition = tuple[str, int]


@dataclass(frozen=True)
class SnapshotProbes:
    """What a snapshot reads, each a callable of the broker's services (no ``Broker``).

    ``view``: the metadata view. ``hears(peer)``: whether this broker hears that peer now.
    ``leader_of(topic, partition)``: its leader as known here, or None. ``replicas``: the Raft
    groups hosted here. ``ends(partitions)``: their high watermarks as their leaders have them
    (one request per leader; those not known are left out). ``heard_by(peer)``: the brokers
    ``peer`` hears, as its last ``PeerView`` said (None: no recent word from it).
    ``election(log_id)``: the last known election of a group (its leader, term and cause).
    ``group_offsets()``: (group, topic, partition, committed offset) of the consumer groups
    this broker and its peers coordinate (the peers' as their last ``PeerView`` said)."""

    broker_id: int
    view: Callable[[], MetadataView]
    hears: Callable[[int], bool]
    leader_of: Callable[[str, int], int | None]
    replicas: Callable[[], Iterable[RaftReplica]]
    ends: Callable[[list[Partition]], Awaitable[Mapping[Partition, int]]]
    heard_by: Callable[[int], frozenset[int] | None] = lambda peer: None
    election: Callable[[str], ElectionNote | None] = lambda log_id: None
    group_offsets: Callable[[], Iterable[tuple[str, str, int, int]]] = lambda: ()


@dataclass(frozen=True)
class Snapshot:
    """The cluster as this broker saw it at ``at`` (wall clock, seconds)."""

    at: float
    broker_id: int
    controller: int | None
    brokers: dict[int, dict[str, Any]]  # id -> host, port, admin_port, up, hears
    leaders: dict[Partition, int | None]
    terms: dict[Partition, int]  # of the groups hosted here
    ends: dict[Partition, int]  # end offsets (commit index + 1) of the replicas hosted here
    replicas: dict[Partition, tuple[int, ...]]
    under_replicated: frozenset[Partition]
    leaderless: frozenset[Partition]
    messages: int  # sum of the end offsets hosted here
    log_bytes: int  # of the logs hosted here
    rates: tuple[float, float]  # messages/s, bytes/s since the snapshot before
    history: tuple[tuple[float, float, float], ...] = field(default=())  # (at, msg/s, bytes/s)
    topic_rates: dict[str, float] = field(default_factory=dict)

    def overview(self) -> dict[str, Any]:
        """The console's overview, as JSON."""
        return {
            "at": self.at,
            "broker": self.broker_id,
            "controller": self.controller,
            "brokers": [{"id": b, **info} for b, info in sorted(self.brokers.items())],
            "partitions": len(self.leaders),
            "under_replicated": _names(self.under_replicated),
            "under_replicated_count": len(self.under_replicated),
            "leaderless": _names(self.leaderless),
            "leaderless_count": len(self.leaderless),
            "messages_per_s": round(self.rates[0], 2),
            "bytes_per_s": round(self.rates[1], 1),
            "history": [list(h) for h in self.history],
        }

    def topics(
        self,
        ends: Mapping[Partition, int] | None = None,
        offsets: Iterable[tuple[str, str, int, int]] = (),
    ) -> list[dict[str, Any]]:
        """The console's topics list, as JSON: one row a topic, with ``ends`` (default: the
        snapshot's own), and the consumer groups with committed ``offsets`` (group, topic,
        partition, offset) on it and the largest lag among them (a partition's end less a
        group's committed offset, never below 0; None when no end is known)."""
        ends = self.ends if ends is None else ends
        rows: dict[str, dict[str, Any]] = {}
        groups: dict[str, set[str]] = {}
        lags: dict[str, int] = {}
        for group, topic, p, committed in offsets:
            groups.setdefault(topic, set()).add(group)
            end = ends.get((topic, p))
            if end is not None:
                lags[topic] = max(lags.get(topic, 0), end - committed)
        for (topic, p), leader in self.leaders.items():
            row = rows.setdefault(
                topic,
                {
                    "name": topic,
                    "partitions": 0,
                    "replication": len(self.replicas.get((topic, p), ())),
                    "end_offset": 0,
                    "unknown_ends": 0,
                    "leaderless": 0,
                    "under_replicated": 0,
                    "messages_per_s": round(self.topic_rates.get(topic, 0.0), 2),
                },
            )
            row["partitions"] += 1
            end = ends.get((topic, p))
            if end is None:
                row["unknown_ends"] += 1
            else:
                row["end_offset"] += end
            row["leaderless"] += leader is None or (topic, p) in self.leaderless
            row["under_replicated"] += (topic, p) in self.under_replicated
        for topic, row in rows.items():
            row["groups"] = sorted(groups.get(topic, ()))
            row["max_lag"] = lags.get(topic)
        return sorted(rows.values(), key=lambda r: r["name"])


class ClusterSnapshots:
    """Builds and shares the snapshots (see the module docstring)."""

    def __init__(
        self,
        probes: SnapshotProbes,
        timeline: Timeline,
        *,
        period_s: float = PERIOD_S,
        ring: int = RING,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._probes = probes
        self._timeline = timeline
        self._period_s = period_s
        self._clock = clock
        self._ring: collections.deque[tuple[float, float, float]] = collections.deque(maxlen=ring)
        self._last: Snapshot | None = None
        self._lock = trio.Lock()
        self._exact: tuple[float, dict[Partition, int]] | None = None  # (when, ends)
        self._exact_lock = trio.Lock()
        self.built = 0  # snapshots built so far (the tests count them)

    @property
    def period_s(self) -> float:
        return self._period_s

    async def current(self) -> Snapshot:
        """The latest snapshot, built first if the last one is ``period_s`` old or more."""
        async with self._lock:
            last = self._last
            if last is not None and self._clock() - last.at < self._period_s:
                return last
            snapshot = self._build(last)
            self._last = snapshot
            self.built += 1
            if last is not None:
                self._tell_changes(last, snapshot)
            return snapshot

    def group_offsets(self) -> list[tuple[str, str, int, int]]:
        """The committed offsets of the consumer groups this broker and its peers coordinate
        (``SnapshotProbes.group_offsets``: in memory, no request)."""
        return list(self._probes.group_offsets())

    async def exact_ends(self) -> dict[Partition, int]:
        """Every partition's high watermark as its leader has it (those whose leader did not
        answer are left out), read at most once a period and shared like the snapshots."""
        async with self._exact_lock:
            if self._exact is not None and self._clock() - self._exact[0] < self._period_s:
                return self._exact[1]
            partitions = list((await self.current()).leaders)
            ends = dict(await self._probes.ends(partitions)) if partitions else {}
            self._exact = (self._clock(), ends)
            return ends

    def _build(self, last: Snapshot | None) -> Snapshot:
        probes = self._probes
        view = probes.view()
        me = probes.broker_id
        brokers: dict[int, dict[str, Any]] = {}
        for b, registered in sorted(view.brokers.items()):
            brokers[b] = {
                "host": registered.host,
                "port": registered.client_port,
                "admin_port": registered.admin_port,
                "up": b == me or probes.hears(b),
            }
        for b, info in brokers.items():
            info["hears"] = self._hears(b, info["up"], brokers)
        up = {b for b, seen in brokers.items() if seen["up"]}
        leaders: dict[Partition, int | None] = {}
        replicas: dict[Partition, tuple[int, ...]] = {}
        for topic, topic_info in view.topics.items():
            for p, assigned in enumerate(topic_info.replicas):
                leaders[(topic, p)] = probes.leader_of(topic, p)
                replicas[(topic, p)] = assigned
        terms: dict[Partition, int] = {}
        ends: dict[Partition, int] = {}
        log_bytes = 0
        for replica in probes.replicas():
            name, _, index = replica.id.rpartition("/")
            key = (name, int(index))
            terms[key] = replica.node.term
            ends[key] = replica.commit_index + 1
            log_bytes += replica.log.size_bytes
            if replica.node.role is Role.LEADER:
                leaders[key] = me
        under = frozenset(k for k, rs in replicas.items() if any(r not in up for r in rs))
        leaderless = frozenset(k for k, leader in leaders.items() if leader not in up)
        messages = sum(ends.values())
        at = self._clock()
        rates = (0.0, 0.0)
        topic_rates: dict[str, float] = {}
        if last is not None and at > last.at:
            dt = at - last.at
            rates = (
                max(0.0, (messages - last.messages) / dt),
                max(0.0, (log_bytes - last.log_bytes) / dt),
            )
            for key, end in ends.items():
                before = last.ends.get(key)
                if before is not None and end > before:
                    topic_rates[key[0]] = topic_rates.get(key[0], 0.0) + (end - before) / dt
        self._ring.append((round(at, 3), round(rates[0], 2), round(rates[1], 1)))
        return Snapshot(
            at=at,
            broker_id=me,
            controller=view.controller_leader,
            brokers=brokers,
            leaders=leaders,
            terms=terms,
            ends=ends,
            replicas=replicas,
            under_replicated=under,
            leaderless=leaderless,
            messages=messages,
            log_bytes=log_bytes,
            rates=rates,
            history=tuple(self._ring),
            topic_rates=topic_rates,
        )

    def _hears(self, broker: int, up: bool, peers: Iterable[int]) -> dict[str, bool | None]:
        """Whom ``broker`` hears (the overview's who-hears-whom matrix): this broker's own
        pings, another's last ``PeerView``; None: unknown (it is down, or no recent view)."""
        probes = self._probes
        if broker == probes.broker_id:
            return {str(p): probes.hears(p) for p in peers if p != broker}
        heard = probes.heard_by(broker) if up else None
        return {str(p): None if heard is None else p in heard for p in peers if p != broker}

    def _tell_changes(self, old: Snapshot, new: Snapshot) -> None:
        """Put on the timeline what changed from ``old`` to ``new``."""
        add = self._timeline.add
        for b, now in new.brokers.items():
            then = old.brokers.get(b)
            if then is None:
                add("broker", f"broker {b} joined the cluster", broker=b)
            elif then["up"] and not now["up"]:
                add("broker", f"broker {b} is down (broker {new.broker_id} no longer hears it)",
                    broker=b, up=False)  # fmt: skip
            elif not then["up"] and now["up"]:
                add("broker", f"broker {b} is back", broker=b, up=True)
        for b in old.brokers.keys() - new.brokers.keys():
            add("broker", f"broker {b} left the cluster", broker=b)
        if old.controller != new.controller:
            add("controller", f"controller: broker {old.controller} -> {new.controller}",
                old=old.controller, new=new.controller)  # fmt: skip
        for partitions, state in (
            (new.under_replicated - old.under_replicated, "under-replicated"),
            (old.under_replicated - new.under_replicated, "fully replicated again"),
        ):
            if partitions:
                names = _names(partitions, _DETAILED_MOVES)
                more = (
                    f" and {len(partitions) - len(names)} more"
                    if len(partitions) > len(names)
                    else ""
                )
                add("replication", f"{', '.join(names)}{more} {state}", partitions=names,
                    count=len(partitions), under=state == "under-replicated")  # fmt: skip
        moved = [
            (key, old.leaders.get(key), leader)
            for key, leader in new.leaders.items()
            if key in old.leaders and old.leaders[key] != leader
        ]
        for (topic, p), before, after in moved[:_DETAILED_MOVES]:
            name = f"{topic}/{p}"
            term = new.terms.get((topic, p))
            detail: dict[str, Any] = {"topic": topic, "partition": p, "old": before, "new": after}
            if after is None:
                add("partition", f"{name} has no leader (was broker {before})", **detail)
            elif term is not None and term != old.terms.get((topic, p)):
                add("election", f"{name}: broker {after} elected leader in term {term} "
                    f"(was {before})", term=term, **detail)  # fmt: skip
            elif before is None:
                add("election", f"{name}: broker {after} leads", **detail)
            else:
                add("leader", f"{name}: leader moved from broker {before} to {after}", **detail)
        if len(moved) > _DETAILED_MOVES:
            add("leader", f"{len(moved) - _DETAILED_MOVES} more partitions changed leader",
                count=len(moved) - _DETAILED_MOVES)  # fmt: skip


def _names(partitions: Iterable[Partition], limit: int = 50) -> list[str]:
    return [f"{t}/{p}" for t, p in sorted(partitions)[:limit]]
