"""The sessions of the devices connected to one broker: from the CONNECT to the end.

``SessionKeeper`` registers each connection by client id (a second connection with a client id
already connected here takes its session over: the first is closed, MQTT-3.1.4-2), finds or
creates its persistent session in the sessions table (``_sessions``, taking it over from
another broker when its connection there is not known to have ended), restores its
subscriptions after the CONNACK and delivers again what it may lack (``_redeliver``), saves
its state as it changes, and, when the connection ends, writes its last state and publishes
its Will (at once, or after the v5 Will Delay Interval). Sessions owned here that expire are
marked deleted (``_expiry_loop``).
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import replace
from typing import Final

import trio

from kafkaesque.protocol.mqtt import (
    Close,
    Will,
    log_topics_for,
    message_headers,
    mqtt_topic_matches,
)

from .._appender import Flight
from .._errors import RequestError
from ._deadlines import Deadlines
from ._device import MqttDevice, now_ms
from ._egress import Egress, deliver_to
from ._ingress import Ingress
from ._replay import ReplayCache
from ._resume import CatchUp, Owed, Place, Position, Progress, session_progress
from ._sessions import (
    HANDOVER_S,
    SAVE_EVERY_S,
    SESSIONS_TOPIC,
    SessionStore,
    StoredSession,
    session_record,
)
from ._wiring import MqttWiring

log = logging.getLogger("kafkaesque.broker.mqtt")

EXPIRY_SWEEP_S: Final = 1.0  # how often owners look for expired sessions
_CATCHING_UP: Final = sys.maxsize  # a connection's known epoch while it looks its session up


class SessionKeeper:
    """The sessions of one broker's MQTT devices (see the module docstring). Trio thread only.

    ``devices``: the connected sessions, by client id. ``store``: the sessions table, which
    every broker follows. ``stats`` is the service's counters, of which this counts ``wills``.
    ``start_in`` comes before the first device is accepted.
    """

    def __init__(
        self,
        wiring: MqttWiring,
        egress: Egress,
        ingress: Ingress,
        deadlines: Deadlines[MqttDevice],
        stats: dict[str, int],
    ) -> None:
        self._wiring = wiring
        self._config = wiring.config
        self._egress = egress
        self._ingress = ingress
        self._mapping = ingress.mapping
        self._deadlines = deadlines
        self._stats = stats
        self.store = SessionStore(wiring.reads, ingress.ensure_topic, self._session_changed)
        self._replay = ReplayCache(wiring.reads, ingress.mapping)
        self.devices: dict[str, MqttDevice] = {}  # connected sessions, by client id
        # The last state of sessions whose connection here ended, until the table has it (or a
        # newer epoch): what a takeover through another broker is handed (``_hand_over``).
        self._final: dict[str, StoredSession] = {}
        self._nursery: trio.Nursery | None = None

    def start_in(self, nursery: trio.Nursery) -> None:
        """Follow the sessions table, save and expire sessions, in ``nursery``: the service's,
        which runs the connections too, so that the redelivery of a resumed session and the
        delayed Will of one that ended can start in it for as long as a connection lives."""
        self._nursery = nursery
        nursery.start_soon(self.store.run)
        nursery.start_soon(self._save_loop)
        nursery.start_soon(self._expiry_loop)

    async def accept(self, device: MqttDevice) -> bool:
        """A CONNECT was accepted: take the client id over from an older connection, find or
        create its session. Returns whether a session was present (for the CONNACK).

        A broker that is not ready yet refuses it instead (CONNACK "server unavailable") and
        the CONNACK that the caller then queues behind the close is never sent."""
        accepted = device.accepted
        assert accepted is not None
        if not self._wiring.ready():
            # It could not find the device's session, nor place its records, from metadata it
            # has not loaded yet (see ``Broker.ready``): the device is told to come back.
            device.perform_nowait(device.conn.unavailable())
            return False
        # The connect timeout no longer applies: 1.5 x the keep-alive does, which may be sooner.
        self._deadlines.moved_earlier(device)
        client_id = accepted.client_id
        old = self.devices.get(client_id)
        if old is not None and old is not device:
            # Its last state, recorded as ended, is in the table before this connection reads
            # it (nothing to hand over between brokers, see ``_sessions``).
            self.closing(old)
            await self.save_session(old)
            old.owner_lost = True
            old.perform_nowait(old.conn.take_over())
            self._egress.drop(old)
        self.devices[client_id] = device
        store = self.store
        # Until this connection has its epoch, every record it catches up with is the past: it
        # takes the newest epoch there is, plus one. (Marking only the epoch known before the
        # catch-up let a record of the previous connection, not yet read here, take the new
        # one over before its CONNACK: seen in CI as a reconnect through another broker that
        # got DISCONNECT 0x8E.) Afterwards only a newer epoch owned elsewhere takes this
        # connection over (``_session_changed``).
        device.known_epoch = _CATCHING_UP
        if accepted.persistent or not accepted.clean_start or client_id in store.sessions:
            await store.tail.catch_up()  # another broker may have just written it
        stored = store.sessions.get(client_id)
        epoch = _epoch_of(stored) + 1
        device.known_epoch = epoch - 1
        expired = stored is not None and stored.expired(now_ms())
        present = (
            stored is not None and not stored.deleted and not expired and not accepted.clean_start
        )
        if present and stored is not None and stored.ended_ms is None:
            # Its last connection is not known to have ended: its broker may hold a newer state
            # of it than the table's (see ``_sessions``, handing a session over).
            taken = await self._take_over(client_id, stored, epoch, device.conn.session_expiry_s)
            if taken is None:  # another connection took the session meanwhile
                device.owner_lost = True
                device.perform_nowait(device.conn.take_over())
                return False
            stored, owned = taken
            present = not stored.deleted
        else:
            owned = False
        if present:
            device.restored = stored
        if accepted.persistent:
            device.session_epoch = device.known_epoch = epoch
            if owned and present and stored is not None:
                # The table's record is this connection's own already (the handover, or a
                # takeover of a session whose owner is gone): writing it again changes nothing.
                device.saved_subscriptions = frozenset(stored.subscriptions)
            else:
                await self.save_session(device)  # this broker owns it now
        elif stored is not None and not stored.deleted:
            device.known_epoch = epoch
            # The stored session ends with this connection (before the CONNACK, so that a
            # reconnect anywhere sees it gone).
            ended = StoredSession(self._config.id, epoch, deleted=True)
            flight = await self._append_session(client_id, ended)
            await flight.done.wait()
        return present

    async def _take_over(
        self, client_id: str, stored: StoredSession, epoch: int, expiry_s: int | None
    ) -> tuple[StoredSession, bool] | None:
        """Take over the session ``stored`` at ``epoch``, owned by a connection that is not known
        to have ended: its state once its previous owner handed it over (or ``HANDOVER_S``
        later, the newest the table has), or None if another connection took it meanwhile;
        with whether the table holds it as this broker's own, awaiting nothing (the caller
        need not write it again).

        A previous owner that is not connected to this broker (killed, say) cannot answer:
        the takeover record then awaits nothing, and is at once the session as this broker
        owns it, from the table's last state (at least once), in one write."""
        me = self._config.id
        takeover = replace(
            stored,
            owner=me,
            epoch=epoch,
            expiry_s=expiry_s,
            ended_ms=None,
            awaiting_owner=stored.owner if self._answers(stored.owner) else None,
            handed_by=None,
        )
        await self._ingress.ensure_topic(SESSIONS_TOPIC)
        record = session_record(client_id, takeover, int(time.time() * 1000))
        flight, index = self._ingress.appender(SESSIONS_TOPIC, 0).add(record)
        await flight.done.wait()
        if flight.error is not None:
            log.info("mqtt %s: taking the session over failed: %s", client_id, flight.error)
            return stored, False  # resumed from what the table has: at least once
        tail = self.store.tail
        with trio.move_on_after(HANDOVER_S):
            await tail.reach(flight.base + index + 1)
            # A previous owner that is not reachable cannot answer: the table's state it is.
            # Asked again at each read of the table: in a reconnect storm the devices of a
            # killed broker arrive before this one's transport noticed it is gone, and each
            # would otherwise wait the whole ``HANDOVER_S`` for it.
            while (
                self._answers(stored.owner)
                and (now := self.store.sessions.get(client_id)) is not None
                and now.epoch == epoch
                and now.owner == me
                and now.awaiting_owner is not None
            ):
                await tail.moved()
        if tail.offset <= flight.base + index:
            return takeover, False  # not read back in time: the state read at the CONNECT
        now = self.store.sessions.get(client_id)
        if now is None or now.epoch != epoch or now.owner != me:
            return None
        if now.awaiting_owner is not None:
            log.info("mqtt %s: no handover from broker %d in time", client_id, stored.owner)
        return now, now.awaiting_owner is None

    def _answers(self, broker: int) -> bool:
        """Whether ``broker`` may hand a session over: it is this one, or connected to it."""
        return broker == self._config.id or broker in self._wiring.connected_peers()

    async def restore(self, device: MqttDevice) -> None:
        """After the CONNACK: the restored session's deliveries in flight (MQTT-4.4.0-1: the
        PUBRELs at once, under their ids, which no new delivery may take), its subscriptions,
        then its catch-up from the log (``_resume``)."""
        stored = device.restored
        if stored is None:
            return
        conn = device.conn
        conn.awaiting_release |= set(stored.awaiting_release)
        for where, progress in stored.positions.items():
            device.catching_up[where] = CatchUp(progress)
            device.in_order_from[where] = progress.next
            for owed in progress.owed:
                if not owed.packet_id:
                    continue
                try:
                    pubrel = conn.resume(
                        owed.packet_id, owed.qos, owed.released, (*where, owed.offset)
                    )
                except ValueError as exc:  # a record this broker cannot make sense of
                    log.warning("mqtt %s: not resuming %s: %s", device.client_id, owed, exc)
                    continue
                device.unacked.setdefault(where, set()).add(owed.offset)
                if pubrel:
                    device.send(pubrel)
        if stored.subscriptions:
            await self._egress.subscribe(device, stored.subscriptions)
        device.restored = None
        if device.catching_up and self._nursery is not None:
            self._nursery.start_soon(self._redeliver, device)

    def _session_changed(self, client_id: str, session: StoredSession) -> None:
        """A session record was applied: a newer epoch elsewhere closes our connection; a
        takeover that awaits this broker gets the session's last state (``_hand_over``)."""
        me = self._config.id
        final = self._final.get(client_id)
        if final is not None and (
            session.epoch > final.epoch
            or (session.owner == me and (session.ended_ms is not None or session.deleted))
        ):
            del self._final[client_id]  # its last state is in the table, or superseded
        else:
            final = None
        if session.awaiting_owner == me:
            # (Taken over by this broker itself: the connection here is the new one.)
            device = None if session.owner == me else self.devices.get(client_id)
            self._hand_over(client_id, session, device, final)
            return
        if session.owner == me:
            return
        device = self.devices.get(client_id)
        if device is not None and device.known_epoch < session.epoch:
            log.info("mqtt %s: taken over by broker %d", client_id, session.owner)
            device.owner_lost = True
            device.perform_nowait(device.conn.take_over())

    def _hand_over(
        self,
        client_id: str,
        takeover: StoredSession,
        device: MqttDevice | None,
        final: StoredSession | None,
    ) -> None:
        """Another broker took over a session this one owned: end its connection here if it
        is still on, and write the session's last state for the new owner (a handover record)."""
        state = takeover  # this broker knows nothing newer than the table
        if device is not None and device.known_epoch < takeover.epoch:
            log.info("mqtt %s: taken over by broker %d", client_id, takeover.owner)
            if device.session_epoch is not None:
                self.closing(device)  # its state now, as it ends
                state = device.frozen or state
            device.owner_lost = True
            device.perform_nowait(device.conn.take_over())
        elif final is not None:
            state = final  # its connection ended; that last write is not in the table yet
        handover = replace(
            state,
            owner=takeover.owner,
            epoch=takeover.epoch,
            expiry_s=takeover.expiry_s,
            ended_ms=None,
            awaiting_owner=None,
            handed_by=self._config.id,
        )
        try:
            record = session_record(client_id, handover, int(time.time() * 1000))
            self._ingress.appender(SESSIONS_TOPIC, 0).add(record)
        except RequestError as exc:
            log.info("mqtt %s: handing the session over failed: %s", client_id, exc)

    def save_session_nowait(self, device: MqttDevice) -> Flight | None:
        """Start writing a persistent session's state; its flight (None: nothing to write)."""
        if device.session_epoch is None or device.owner_lost or device.client_id is None:
            return None
        if SESSIONS_TOPIC not in self._wiring.metadata.view.topics:
            return None  # not possible once a persistent session was accepted (it wrote one)
        record = session_record(
            device.client_id, self._session_state(device), int(time.time() * 1000)
        )
        flight, _ = self._ingress.appender(SESSIONS_TOPIC, 0).add(record)
        return flight

    def closing(self, device: MqttDevice) -> None:
        """The connection is ending: freeze its session's state now (records that pass the
        readers from now on are after its positions), with the time it ended, and stop
        delivering to it. A v5 DISCONNECT that set the session expiry to 0 ends the session."""
        if device.frozen is None and device.session_epoch is not None:
            if device.conn.session_expiry_s == 0:
                device.frozen = StoredSession(self._config.id, device.session_epoch, deleted=True)
            else:
                device.frozen = replace(self._session_state(device), ended_ms=now_ms())
        self._egress.drop(device)

    async def save_session(self, device: MqttDevice, *, wait: bool = True) -> None:
        """Write a persistent session's state (its owner, subscriptions, positions)."""
        if device.session_epoch is None or device.owner_lost or device.client_id is None:
            return
        session = device.frozen or self._session_state(device)
        device.dirty = False
        flight = await self._append_session(device.client_id, session)
        if wait:
            await flight.done.wait()
            if flight.error is None:
                device.saved_subscriptions = frozenset(session.subscriptions)

    async def save_subscriptions(self, device: MqttDevice) -> None:
        """Store a persistent session's subscriptions (before its SUBACK), unless its last
        record known committed holds them already: a device resuming its session subscribes
        again to what it had, and in a reconnect storm that write, awaited before each SUBACK,
        is one of the few per CONNECT that the sessions table's one partition takes."""
        if device.saved_subscriptions != frozenset(device.subscriptions.values()):
            await self.save_session(device)

    def _session_state(self, device: MqttDevice) -> StoredSession:
        assert device.session_epoch is not None
        base = device.restored  # not restored yet: keep what was stored
        if base is not None:
            subscriptions = base.subscriptions
            positions = base.positions
        else:
            subscriptions = tuple(device.subscriptions.values())
            positions = self._progress(device)
        return StoredSession(
            self._config.id,
            device.session_epoch,
            subscriptions,
            positions,
            tuple(sorted(device.conn.awaiting_release)),
            expiry_s=device.conn.session_expiry_s,
        )

    def _progress(self, device: MqttDevice) -> dict[Position, Progress]:
        """Per log partition, where the device's QoS 1/2 deliveries stand (``_resume``)."""
        topics: set[str] = set()
        for topic_filter, sub in device.subscriptions.items():
            if sub.qos > 0:
                topics |= log_topics_for(self._mapping, topic_filter)
        live = {w: at for w, at in self._egress.positions.items() if w[0] in topics}
        in_flight: dict[Place, tuple[int, int, bool]] = {}
        for tag, packet_id, qos, released in device.conn.in_flight():
            if isinstance(tag, tuple):
                in_flight[tag] = (packet_id, qos, released)
        return session_progress(
            live, device.catching_up, device.unacked, in_flight, device.in_order_from
        )

    async def _append_session(self, client_id: str, session: StoredSession | None) -> Flight:
        await self._ingress.ensure_topic(SESSIONS_TOPIC)
        record = session_record(client_id, session, int(time.time() * 1000))
        flight, _ = self._ingress.appender(SESSIONS_TOPIC, 0).add(record)
        return flight

    async def _expiry_loop(self) -> None:
        """Mark deleted the sessions this broker owns that expired (v5 Session Expiry). At the
        session's own epoch: a reconnect elsewhere meanwhile writes a newer one, which wins."""
        me = self._config.id
        while True:
            await trio.sleep(EXPIRY_SWEEP_S)
            now = now_ms()
            for client_id, stored in list(self.store.sessions.items()):
                if stored.owner != me or client_id in self.devices or not stored.expired(now):
                    continue
                ended = StoredSession(me, stored.epoch, deleted=True)
                try:
                    await self._append_session(client_id, ended)
                except RequestError as exc:
                    log.info("mqtt %s: ending the expired session failed: %s", client_id, exc)

    async def _save_loop(self) -> None:
        """Save the positions of sessions whose deliveries were acknowledged meanwhile."""
        while True:
            await trio.sleep(SAVE_EVERY_S)
            for device in list(self.devices.values()):
                if device.dirty and device.session_epoch is not None:
                    try:
                        await self.save_session(device, wait=False)
                    except RequestError as exc:
                        log.info("mqtt %s: saving the session failed: %s", device.client_id, exc)

    async def _redeliver(self, device: MqttDevice) -> None:
        """Catch a resumed session up, partition by partition, from the log (``_resume``):
        each until it reaches the live reader's position, where the live deliveries of that
        partition take over (in the same step, so no record is sent twice or skipped)."""
        for where in sorted(device.catching_up):
            catch = device.catching_up[where]
            while not device.conn.closed:
                live = self._egress.positions.get(where)
                if live is not None and catch.caught_up(live):
                    del device.catching_up[where]  # the live reader delivers from here on
                    break
                if live is None or live <= catch.cursor:
                    await trio.sleep(0.05)  # not reading yet, or behind the stored state
                    continue
                await self._catch_up(device, where, catch)
            if device.conn.closed:
                return  # the next connection resumes from what is left

    async def _catch_up(self, device: MqttDevice, where: Position, catch: CatchUp) -> None:
        """One stretch of the partition from ``catch.cursor`` (``_replay``: read and decoded
        once for every session of this broker), decided record by record up to the live
        reader's position: only the records the session may want (of the exact topics it
        subscribes to, or every one with a wildcard, and the ones it owes)."""
        try:
            stretch = await self._replay.read(where, catch.cursor)
        except RequestError as exc:
            log.debug("mqtt %s: catching up on %s: %s", device.client_id, where, exc)
            await trio.sleep(0.2)
            return
        if stretch is None:  # the replica read is behind: a moment
            await trio.sleep(0.05)
            return
        self._given_up(device, where, catch.advance(stretch.log_start))  # below the log's start
        subscriptions = [
            s
            for s in device.subscriptions.values()
            if s.qos > 0 and not s.topic_filter.startswith("$share/")
        ]
        topics: set[str] | None = set()
        for s in subscriptions:
            if "+" in s.topic_filter or "#" in s.topic_filter:
                topics = None  # a wildcard: every record may match
                break
            assert topics is not None
            topics.add(s.topic_filter)
        # Not past the live reader, which delivers from there on (its position only grows).
        upper = min(stretch.end, self._egress.positions.get(where, catch.cursor))
        low = catch.cursor
        for record in stretch.candidates(low, upper, topics, catch.owed_offsets()):
            if record.offset < catch.cursor:
                continue
            while not device.has_room():
                if device.conn.closed:
                    return
                await trio.sleep(0.01)
            decided = catch.decide(record.offset)
            catch.advance(record.offset + 1)
            if decided is None:
                continue
            place = (*where, record.offset)
            topic = record.topic
            if topic is None:
                self._given_up(device, where, [decided])
                continue
            origin = record.origin
            matching = [
                s
                for s in subscriptions
                if mqtt_topic_matches(s.topic_filter, topic)
                and origin.wanted_by(s, device.client_id_bytes)
            ]
            if decided.packet_id:  # in flight: the same PUBLISH again, whatever matches now
                expires = origin.expires_ms(record.timestamp)
                identifiers = tuple(s.identifier for s in matching if s.identifier)
                retain = origin.retained and any(s.retain_as_published for s in matching)
                device.deliver(
                    topic,
                    record.payload,
                    decided.qos,
                    retain,
                    place,
                    expires,
                    identifiers,
                    origin.forwarded,
                    decided.packet_id,
                )
            elif matching:
                deliver_to(device, topic, record.payload, origin, matching, place, record.timestamp)
        if upper > low:
            catch.advance(upper)  # past control batches too

    def _given_up(self, device: MqttDevice, where: Position, lost: list[Owed]) -> None:
        """Deliveries of a resumed session whose records are gone from the log (retention) or
        map to no MQTT topic any more: their packet ids are free, nothing is owed."""
        for owed in lost:
            if owed.packet_id:
                device.conn.forget(owed.packet_id)
            device.unacked.get(where, set()).discard(owed.offset)
            log.info(
                "mqtt %s: %s/%d@%d is gone: not redelivered", device.client_id, *where, owed.offset
            )

    async def device_gone(self, device: MqttDevice) -> None:
        """The connection ended: forget it, and publish its Will if the end was abnormal."""
        for action in device.conn.connection_lost():  # when it ended without a Close
            if isinstance(action, Close):
                device.publish_will = action.will
        self._deadlines.ended()
        self.closing(device)
        client_id = device.client_id
        if client_id is not None and self.devices.get(client_id) is device:
            del self.devices[client_id]
        if (
            client_id is not None
            and device.frozen is not None
            and device.session_epoch is not None
            and not device.owner_lost
        ):
            # Until the table has it: a takeover through another broker may need it sooner.
            self._final[client_id] = device.frozen
        try:
            await self.save_session(device, wait=False)
        except RequestError as exc:
            log.info("mqtt %s: saving the session failed: %s", client_id, exc)
        will = device.will
        if not device.publish_will or will is None:
            return
        delay = will.properties.will_delay_interval or 0
        expiry = device.conn.session_expiry_s
        if expiry is not None:
            delay = min(delay, expiry)  # the Will goes out when the session ends, at the latest
        if delay > 0 and client_id is not None and device.session_epoch is not None:
            # v5 Will Delay Interval (§3.1.3.2.2): the session lives on, so the Will waits; a
            # reconnect within the delay cancels it.
            assert self._nursery is not None
            self._nursery.start_soon(
                self._delayed_will, will, client_id, device.session_epoch, float(delay)
            )
            return
        await self._publish_will(will, client_id or "")

    async def _delayed_will(self, will: Will, client_id: str, epoch: int, delay: float) -> None:
        await trio.sleep(delay)
        stored = self.store.sessions.get(client_id)
        if client_id in self.devices or (stored is not None and stored.epoch != epoch):
            return  # the device came back, here or on another broker (a newer epoch)
        await self._publish_will(will, client_id)

    async def _publish_will(self, will: Will, client_id: str) -> None:
        self._stats["wills"] += 1
        property_headers = message_headers(will.properties)
        args = (will.topic, will.payload, will.qos, will.retain, client_id, 0, property_headers)
        try:
            if self._ingress.append_nowait(*args) is None:
                await self._ingress.ensure_route(will.topic, will.payload)
                self._ingress.append_nowait(*args)
        except RequestError as exc:
            log.info("mqtt %s: the Will could not be published: %s", client_id, exc)


def _epoch_of(session: StoredSession | None) -> int:
    return 0 if session is None else session.epoch
