"""Persistent MQTT sessions, kept in a compacted internal topic that every broker follows.

A session that outlives its connection (3.1.1 clean session 0; 5.0 session expiry above 0) is
one record of ``__mqtt_sessions`` keyed by the client id: its owner (the broker of its current
connection), an epoch that grows at each connection, its subscriptions, and per log partition
its ``Progress`` (``_resume``): the offset from which every matching record is still to be
delivered, and below it the deliveries not acknowledged yet, with their packet ids and states;
and, once the connection ended, when, and for how long the session outlives it (v5 Session
Expiry Interval; 3.1.1 sessions do not expire). An expired session is as absent to a reconnect,
and its owner marks it deleted. The broker writes it when the device connects (taking
ownership), subscribes or unsubscribes (before the SUBACK / UNSUBACK), every ``SAVE_EVERY_S``
while deliveries are acknowledged, and when the connection ends. A clean start ends it: a record
marked deleted with the next epoch (not a tombstone, so that a late write of the previous owner,
of a lower epoch, cannot bring it back).

Every broker reads the table (``TopicTail``). A device reconnecting with clean session 0 to any
broker finds its session there (the broker first catches up with everything committed), gets
session present = 1, its subscriptions back, the deliveries that were in flight resumed under
their packet ids, and everything else it lacks from the log (``_resume``).
When a broker sees a newer epoch of a session it has a connection for, owned by another broker,
it closes that connection: a client id has one connection in the whole cluster.

Records of an older epoch than the table's are ignored, so a late write of the previous owner
cannot undo a takeover; so is a record of the table's epoch by another owner (two connections
that raced for the same epoch: the first in the log has it).

Handing a session over between brokers. The device decides when it moves: it may send
DISCONNECT to broker A and its CONNECT to broker B at once, and B may read the table before A has
written the session's last state (what the device acknowledged last): resuming from an earlier
save, B would deliver again QoS 2 messages whose exchange was complete, which MQTT-4.3.3 forbids.
So a session whose table record does not say its connection ended (``ended_ms``) is taken over
in two steps:

1. B writes a takeover record: the next epoch, owner B, ``awaiting_owner`` A. Applied over the
   record before it (the newest of the previous epoch, A's), it takes that record's state, and
   if that record is A's last (the connection ended), the handover is done (nothing awaited).
2. Otherwise A, applying the takeover, ends its connection if it still has it and writes a
   handover record: the same epoch, owner B, ``handed_by`` A, with the session's last state as
   A knows it (frozen when the connection ended, or the table's if A knows nothing newer). It is
   applied only over the takeover record still awaiting A, so a late one changes nothing.

B resumes delivery once the handover is done, or after ``HANDOVER_S`` (A is down, say: then from
the last state in the table, at least once), and then writes the session as its own (nothing
awaited) unless the handover record already is that. When A is not connected to B (killed, as
in a reconnect storm, where hundreds of its devices arrive at once), nobody would answer: B's
takeover record then awaits nothing and is at once its own, one write for the whole takeover,
and a B that was waiting for A stops waiting as soon as it sees A gone. Every broker applies the
same records in the same order, so every table agrees.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Final

import msgpack

from kafkaesque.protocol import INTERNAL_TOPIC_PREFIX
from kafkaesque.protocol.mqtt import MqttSubscription
from kafkaesque.storage import Record

from .._metadata_view import TopicInfo
from .._read_path import ReadPath
from ._resume import Owed, Position, Progress
from ._tail import TopicTail

SESSIONS_TOPIC: Final = INTERNAL_TOPIC_PREFIX + "mqtt_sessions"
SAVE_EVERY_S: Final = 1.0
HANDOVER_S: Final = 3.0
"""How long a broker taking a session over waits for the previous owner's last state."""
_MAX_POSITIONS: Final = 100_000


class PositionKeys:
    """The (log topic, partition) keys of the sessions' positions, one object per pair.

    Every broker holds every session, each with a position per partition it reads: the same few
    pairs over and over. Decoded, each would be a tuple and a string of its own (0.1 KiB);
    a table's sessions share them instead. Bounded by the partitions that sessions read; past
    ``limit`` pairs, new ones are no longer shared."""

    def __init__(self, limit: int = _MAX_POSITIONS) -> None:
        self._shared: dict[Position, Position] = {}
        self._limit = limit

    def __call__(self, topic: str, partition: int) -> Position:
        key = (topic, partition)
        shared = self._shared.get(key)
        if shared is None:
            if len(self._shared) >= self._limit:
                return key
            shared = self._shared[key] = key
        return shared


def _unshared(topic: str, partition: int) -> Position:
    return (topic, partition)


@dataclass(frozen=True, slots=True)
class StoredSession:
    owner: int
    epoch: int
    subscriptions: tuple[MqttSubscription, ...] = ()
    positions: dict[Position, Progress] = field(default_factory=dict)
    awaiting_release: tuple[int, ...] = ()
    deleted: bool = False  # ended by a clean start: kept as a marker so its epoch is known
    expiry_s: int | None = None  # how long it outlives its connection (None: for ever)
    ended_ms: int | None = None  # when its connection ended (None: connected)
    # A takeover record: the previous owner, whose last state of the session it awaits.
    awaiting_owner: int | None = None
    # A handover record: the previous owner, which wrote this last state for the new owner.
    handed_by: int | None = None

    def expired(self, now_ms: int) -> bool:
        """Whether its connection ended more than ``expiry_s`` ago (v5 Session Expiry)."""
        if self.deleted or self.expiry_s is None or self.ended_ms is None:
            return False
        return now_ms >= self.ended_ms + 1000 * self.expiry_s


def encode_session(session: StoredSession) -> bytes:
    data: bytes = msgpack.packb(
        [
            session.owner,
            session.epoch,
            [
                [
                    s.topic_filter,
                    s.qos,
                    s.no_local,
                    s.retain_as_published,
                    s.retain_handling,
                    s.identifier,
                ]
                for s in session.subscriptions
            ],
            # Where to resume, as the first format had it (read by brokers that know no more).
            [[topic, partition, p.resume] for (topic, partition), p in session.positions.items()],
            list(session.awaiting_release),
            session.deleted,
            session.expiry_s,
            session.ended_ms,
            session.awaiting_owner,
            session.handed_by,
            [
                [
                    topic,
                    partition,
                    p.next,
                    [[o.offset, o.packet_id, o.qos, o.released] for o in p.owed],
                ]
                for (topic, partition), p in session.positions.items()
            ],
        ]
    )
    return data


def decode_session(
    data: bytes, position: Callable[[str, int], Position] = _unshared
) -> StoredSession | None:
    """The session in ``data``; None when it is not one (written by a newer format, corrupt).
    ``position`` makes each position's key (``PositionKeys``: shared with other sessions)."""
    try:
        owner, epoch, subs, positions, awaiting, deleted, *more = msgpack.unpackb(data)
        # Fields added later: records written before them have none.
        expiry, ended, awaited_owner, handed_by, progress = (*more, *[None] * 5)[:5]
        if progress is None:  # the first format: resume from there, at least once
            stored = {position(str(t), int(p)): Progress(int(o)) for t, p, o in positions}
        else:
            stored = {
                position(str(t), int(p)): Progress(
                    int(n), tuple(Owed(int(o), int(i), int(q), bool(r)) for o, i, q, r in owed)
                )
                for t, p, n, owed in progress
            }
        return StoredSession(
            int(owner),
            int(epoch),
            tuple(_subscription(*s) for s in subs),
            stored,
            tuple(int(i) for i in awaiting),
            bool(deleted),
            None if expiry is None else int(expiry),
            None if ended is None else int(ended),
            None if awaited_owner is None else int(awaited_owner),
            None if handed_by is None else int(handed_by),
        )
    except (ValueError, TypeError, msgpack.UnpackException):
        return None


def _subscription(
    topic_filter: str, qos: int, no_local: bool, rap: bool, handling: int, *more: int
) -> MqttSubscription:
    """A stored subscription (records written before identifiers were kept have none)."""
    identifier = int(more[0]) if more else 0
    return MqttSubscription(
        str(topic_filter), int(qos), bool(no_local), bool(rap), int(handling), identifier
    )


class SessionStore:
    """This broker's copy of the persistent sessions, by client id."""

    def __init__(
        self,
        reads: ReadPath,
        ensure_topic: Callable[[str], Awaitable[TopicInfo]],
        on_change: Callable[[str, StoredSession], None],
    ) -> None:
        self.sessions: dict[str, StoredSession] = {}
        self._keys = PositionKeys()
        self._on_change = on_change
        self.tail = TopicTail(reads, SESSIONS_TOPIC, ensure_topic, self._apply)

    async def run(self) -> None:
        await self.tail.run()

    def _apply(self, record: Record) -> None:
        if record.key is None:
            return
        try:
            client_id = record.key.decode()
        except UnicodeDecodeError:
            return
        if record.value is None:
            self.sessions.pop(client_id, None)
            return
        session = decode_session(record.value, self._keys)
        if session is None:
            return
        old = self.sessions.get(client_id)
        if session.handed_by is not None:
            if not _awaits(old, session):
                return  # the new owner stopped waiting for it (or never asked its writer)
            session = replace(session, awaiting_owner=None)
        elif old is not None:
            if session.epoch < old.epoch:
                return  # a late write of an earlier owner
            if session.epoch == old.epoch and session.owner != old.owner:
                return  # two connections raced for one epoch: the first in the log has it
            if session.awaiting_owner is not None and session.epoch > old.epoch:
                session = _taken_over(session, old)
        self.sessions[client_id] = session
        self._on_change(client_id, session)


def _awaits(current: StoredSession | None, handover: StoredSession) -> bool:
    """Whether ``current`` is a takeover record awaiting ``handover``."""
    return (
        current is not None
        and current.awaiting_owner is not None
        and current.awaiting_owner == handover.handed_by
        and current.epoch == handover.epoch
        and current.owner == handover.owner
    )


def _taken_over(takeover: StoredSession, previous: StoredSession) -> StoredSession:
    """A takeover record as applied over ``previous``, the newest record of the epoch before it:
    with that record's state (at least as new as what the new owner read), and awaiting nothing
    if it is the previous connection's last one (its end is recorded) or the session is gone."""
    if previous.deleted:
        return replace(takeover, awaiting_owner=None)
    if previous.owner != takeover.awaiting_owner:
        return takeover
    return replace(
        previous,
        owner=takeover.owner,
        epoch=takeover.epoch,
        expiry_s=takeover.expiry_s,
        ended_ms=None,
        awaiting_owner=None if previous.ended_ms is not None else takeover.awaiting_owner,
        handed_by=None,
    )


def session_record(client_id: str, session: StoredSession | None, timestamp: int) -> Record:
    """The record storing ``session`` (None: deleting it)."""
    value = None if session is None else encode_session(session)
    return Record(value=value, key=client_id.encode(), timestamp=timestamp)
