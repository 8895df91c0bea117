"""A broker's MQTT listener: devices connect to any broker, publish into the log, subscribe.

``MqttService`` accepts connections on ``--mqtt-listen`` and runs each with an ``MqttDevice``
(one reader task and one writer task). Ingress: a PUBLISH is routed by the topic mapping
(``--mqtt-rules``; default ``# -> mqtt key=topic``) to a log topic, partition (by the rule's
key) and appended through one ``PartitionAppender`` per partition, shared by every connection
of the broker: the records of thousands of devices become a few batches, each appended exactly
once even when retried across a leader failover. Records carry the headers ``mqtt.topic`` and
``mqtt.qos``, and a v5 message's properties (``message_headers``). A log topic the mapping
names is created on first use when missing (``--mqtt-partitions``,
``--mqtt-replication-factor`` capped at the registered brokers), as Kafka's
``auto.create.topics.enable`` does. Egress is ``Egress``.

``--mqtt-users`` names a users file of salted SCRAM-SHA-256 credentials (the format of
``--users-file``, so one file may serve both; ``kafkaesque user add``; the old ``user:password``
format is refused with the command that converts it); without it devices connect anonymously.
A device's password is checked off the event loop (PBKDF2 takes milliseconds on purpose); an
address that failed ``auth_failure_limit`` times within ``auth_failure_window_s`` gets CONNACK
"not authorized" without a check. The file is read again when it changes. ``--mqtt-acl-file``
(mosquitto's ``acl_file``, ``kafkaesque.security.MqttAcl``) says what each device may publish,
subscribe to and receive; refusals are logged at INFO and counted in /metrics. A second
connection with a client id already connected here takes its session over (the first is
closed, MQTT-3.1.4-2).
"""

from __future__ import annotations

import itertools
import logging
import os
import ssl
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Final

import trio

from kafkaesque._fd_stream import FdListener, peer_host
from kafkaesque.protocol import Acks, ErrorCode, Shares, partition_for_key
from kafkaesque.protocol.mqtt import (
    MQTT_CLIENT_HEADER,
    MQTT_PACKET_ID_HEADER,
    MQTT_QOS_HEADER,
    MQTT_RETAIN_HEADER,
    MQTT_TOPIC_HEADER,
    Accepted,
    Action,
    Close,
    InvalidMappingError,
    MqttServerConnection,
    MqttSubscription,
    Route,
    TopicMapping,
    Will,
    log_topics_for,
    message_headers,
    mqtt_topic_matches,
    origin_of,
)
from kafkaesque.security import (
    FailureLimiter,
    MqttAcl,
    MqttAclError,
    ScramCredential,
    UsersFileError,
    UserStore,
    derive_credential,
    verify_password,
)
from kafkaesque.storage import Record, data_records, end_offset

from .._appender import Flight, PartitionAppender
from .._config import BrokerConfig, ConfigError
from .._errors import RequestError
from .._log_ids import log_id_of
from .._metadata_view import MetadataError, TopicConfig, TopicExistsError, TopicInfo
from .._resends import resend_key, value_digest
from .._thread_bridge import run_in_thread
from ._deadlines import SCAN_S as DEADLINE_SCAN_S
from ._deadlines import Deadlines
from ._device import SLOW_GRACE_S, MqttDevice, now_ms
from ._egress import Egress, Share, deliver_to
from ._retained import RETAINED_TOPIC, RetainedStore
from ._sessions import (
    HANDOVER_S,
    SAVE_EVERY_S,
    SESSIONS_TOPIC,
    Position,
    SessionStore,
    StoredSession,
    session_record,
)
from ._websocket import WebSocketListener
from ._wiring import MqttWiring

log = logging.getLogger("kafkaesque.broker.mqtt")

MAX_PACKET_SIZE: Final = 1 << 20
_QOS_HEADERS: Final = {q: (MQTT_QOS_HEADER, str(q).encode()) for q in (0, 1, 2)}
_ROUTE_CACHE: Final = 65536
_BROKERS_WAIT_S: Final = 15.0
_SHARES_EVERY_S: Final = 1.0
EXPIRY_SWEEP_S: Final = 1.0  # how often owners look for expired sessions
_CATCHING_UP: Final = sys.maxsize  # a connection's known epoch while it looks its session up


def load_users(path: str | None) -> UserStore | None:
    """The salted users file ``path`` (reloaded when it changes); None without a file.
    ``ConfigError`` for a file that cannot be read or has a bad line (a plaintext one too)."""
    if path is None:
        return None
    try:
        os.stat(path)
    except OSError as exc:
        raise ConfigError(f"mqtt_users: cannot read {path}: {exc}") from exc
    try:
        return UserStore(path)
    except UsersFileError as exc:
        raise ConfigError(f"mqtt_users: {exc}") from exc


def load_acl(path: str | None) -> MqttAcl | None:
    """The ACL file ``path`` (mosquitto's ``acl_file``); None without one."""
    if path is None:
        return None
    try:
        return MqttAcl.load(path)
    except MqttAclError as exc:
        raise ConfigError(f"mqtt_acl_file: {exc}") from exc


def check_password(
    credential: ScramCredential | None, decoy: ScramCredential, password: bytes | None
) -> bool:
    """Whether ``password`` is ``credential``'s (None: an unknown user, checked against
    ``decoy`` all the same, so that the time taken does not tell which users exist). Slow on
    purpose: call it in a worker thread."""
    try:
        text = (password or b"").decode()
    except UnicodeDecodeError:
        text = ""
    matches = verify_password(credential or decoy, text)
    return matches and credential is not None and password is not None


def load_mapping(path: str | None) -> TopicMapping:
    """The rules of ``path``, or the default mapping without a file."""
    if path is None:
        return TopicMapping.default()
    try:
        with open(path, encoding="utf-8") as f:
            return TopicMapping.parse(f.read())
    except OSError as exc:
        raise ConfigError(f"mqtt_rules: cannot read {path}: {exc}") from exc
    except InvalidMappingError as exc:
        raise ConfigError(f"mqtt_rules: {path}: {exc}") from exc


def load_tls(config: BrokerConfig) -> ssl.SSLContext | None:
    """The server side of the MQTT TLS listener (None without one): TLS 1.2 or later, the
    broker's certificate chain, and with ``mqtt_tls_client_ca`` a certificate that CA signed
    required of every device."""
    if config.mqtt_tls is None:
        return None
    assert config.mqtt_tls_cert is not None  # BrokerConfig.validate
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(config.mqtt_tls_cert, config.mqtt_tls_key)
        if config.mqtt_tls_client_ca is not None:
            context.load_verify_locations(config.mqtt_tls_client_ca)
            context.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"mqtt_tls: cannot load the certificates: {exc}") from exc
    return context


class MqttService:
    """The MQTT side of one broker (see the module docstring). Trio thread only."""

    def __init__(self, wiring: MqttWiring) -> None:
        config = wiring.config
        assert config.mqtt_enabled
        self._wiring = wiring
        self._config = config
        self.mapping = load_mapping(config.mqtt_rules)
        self.users = load_users(config.mqtt_users)
        self.acl = load_acl(config.mqtt_acl_file)
        self._limiter = FailureLimiter(config.auth_failure_limit, config.auth_failure_window_s)
        # An unknown user's password is checked against this, as long as a known one's.
        self._decoy = derive_credential(os.urandom(16).hex()) if self.users is not None else None
        self._tls = load_tls(config)
        self.port: int | None = None
        self.tls_port: int | None = None
        self.ws_port: int | None = None
        self.egress = Egress(
            config.id, wiring.reads, wiring.metadata, self.mapping, self.ensure_topic
        )
        self.retained = RetainedStore(wiring.reads, self.ensure_topic)
        self.sessions = SessionStore(wiring.reads, self.ensure_topic, self._session_changed)
        self._devices: dict[str, MqttDevice] = {}  # connected sessions, by client id
        # The last state of sessions whose connection here ended, until the table has it (or a
        # newer epoch): what a takeover through another broker is handed (``_hand_over``).
        self._final: dict[str, StoredSession] = {}
        self._deadlines: Deadlines[MqttDevice] = Deadlines()  # every connection, even unnamed
        self._routes: dict[str, Route] = {}
        self._round_robin: dict[str, itertools.count[int]] = {}
        self._creating: dict[str, trio.Event] = {}
        self._nursery: trio.Nursery | None = None
        # Cancelled by ``stop_accepting`` (a graceful shutdown): the listeners close.
        self._accepting = trio.CancelScope()
        self.stats: dict[str, int] = dict.fromkeys(
            (
                "connections",
                "bytes_in",
                "writes_out",
                "messages_in",
                "dropped",
                "slow_disconnects",
                "wills",
                "resends_found",
                "auth_failures",
            ),
            0,
        )
        wiring.register_stats(self._stats)

    def _stats(self) -> Mapping[str, int]:
        return {
            **self.stats,
            "connected": len(self._devices),
            "subscriptions": self.egress.subscriptions,
            "messages_out": self.egress.delivered,
            "retained": len(self.retained.messages),
        }

    async def run(
        self, *, task_status: trio.TaskStatus[int | None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen until cancelled; ``started`` with the bound TCP port (None: TLS only)."""
        config = self._config
        listeners: list[trio.abc.Listener[trio.abc.Stream]] = []
        where = []
        if config.mqtt is not None:
            plain = await trio.open_tcp_listeners(config.mqtt.port, host=config.mqtt.host)
            self.port = plain[0].socket.getsockname()[1]
            listeners += [FdListener(listener) for listener in plain]
            where.append(f"{config.mqtt.host}:{self.port}")
        if config.mqtt_tls is not None:
            assert self._tls is not None
            tls = await trio.open_tcp_listeners(config.mqtt_tls.port, host=config.mqtt_tls.host)
            self.tls_port = tls[0].socket.getsockname()[1]
            listeners += [trio.SSLListener(FdListener(listener), self._tls) for listener in tls]
            where.append(f"{config.mqtt_tls.host}:{self.tls_port} (TLS)")
        if config.mqtt_ws is not None:
            ws = await trio.open_tcp_listeners(config.mqtt_ws.port, host=config.mqtt_ws.host)
            self.ws_port = ws[0].socket.getsockname()[1]
            listeners += [WebSocketListener(FdListener(listener)) for listener in ws]
            where.append(f"{config.mqtt_ws.host}:{self.ws_port} (WebSocket)")
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await nursery.start(self.egress.run)
            nursery.start_soon(self.retained.run)
            nursery.start_soon(self.sessions.run)
            nursery.start_soon(self._save_loop)
            nursery.start_soon(self._expiry_loop)
            nursery.start_soon(self._slow_loop)
            nursery.start_soon(self._deadline_loop)
            nursery.start_soon(self._shares_loop)
            nursery.start_soon(self._accept, listeners, nursery)
            log.info("broker %d: MQTT on %s", config.id, ", ".join(where))
            task_status.started(self.port)

    async def _accept(
        self, listeners: list[trio.abc.Listener[trio.abc.Stream]], nursery: trio.Nursery
    ) -> None:
        """Accept MQTT connections until ``stop_accepting``; the listening sockets close then,
        and the connections accepted so far (tasks of ``nursery``) are served on."""
        with self._accepting:
            await trio.serve_listeners(self._serve, listeners, handler_nursery=nursery)

    def stop_accepting(self) -> None:
        """A graceful shutdown began: accept no more connections (a device's connect is refused
        and it tries another broker). The connections open are drained by the broker's
        ``Draining``: each device is told (``MqttDevice.shut_down``)."""
        self._accepting.cancel()

    async def _shares_loop(self) -> None:
        """Tell the peers which shared-subscription groups have members here: as soon as they
        change (``Egress.shares_changed``), and every ``_SHARES_EVERY_S`` (a peer that
        reconnected meanwhile hears them by then): an idle broker wakes once a second."""
        told: frozenset[Share] | None = None
        told_at = -1e9
        while True:
            with trio.move_on_at(told_at + _SHARES_EVERY_S):
                await self.egress.shares_changed.wait()
            self.egress.shares_changed = trio.Event()
            shares = self.egress.local_shares()
            now = trio.current_time()
            if shares != told or now - told_at >= _SHARES_EVERY_S:
                self._wiring.tell_peers(Shares(tuple(sorted(shares))))
                told, told_at = shares, now

    async def _serve(self, stream: trio.abc.Stream) -> None:
        self.stats["connections"] += 1
        conn = MqttServerConnection(
            trio.current_time(),
            credentials_required=self.users is not None,
            acl=self.acl,
            max_packet_size=MAX_PACKET_SIZE,
        )
        device = MqttDevice(self, stream, conn)
        device.address = peer_host(stream)
        self._deadlines.add(device)
        try:
            with self._wiring.draining.connection(device.shut_down):
                await device.serve()
        except Exception:  # a bug in one connection must not take the listener down
            log.exception("broker %d: an MQTT connection failed", self._config.id)

    # -- security -------------------------------------------------------------------------------

    async def admit(self, device: MqttDevice, accepted: Accepted) -> list[Action] | None:
        """Check the credentials of a CONNECT the state machine accepted; the actions that
        refuse it, or None to go on. Every failure is logged, counted and held against the
        device's address (``FailureLimiter``)."""
        users = self.users
        if users is None:
            return None
        assert self._decoy is not None and accepted.username is not None
        address = device.address
        who = f"mqtt {accepted.client_id} (user {accepted.username!r}, from {address})"
        if self._limiter.blocked(address) > 0:
            self.stats["auth_failures"] += 1
            log.info("%s: refused, too many authentication failures from its address", who)
            return device.conn.not_authorized()
        credential = users.credential(accepted.username)
        if await run_in_thread(check_password, credential, self._decoy, accepted.password):
            self._limiter.succeeded(address)
            return None
        self._limiter.failed(address)
        self.stats["auth_failures"] += 1
        log.info("%s: wrong user name or password", who)
        return device.conn.bad_credentials()

    def refused(self, device: MqttDevice, action: str, topic: str) -> None:
        """The ACL refused ``action`` (publish, subscribe, receive, will) on ``topic``."""
        log.info(
            "mqtt %s (user %r, from %s): %s %r not authorized by the ACL",
            device.client_id,
            device.username,
            device.address,
            action,
            topic,
        )
        self._wiring.authorization_failed(action)

    # -- sessions -------------------------------------------------------------------------------

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
        old = self._devices.get(client_id)
        if old is not None and old is not device:
            # Its last state, recorded as ended, is in the table before this connection reads
            # it (nothing to hand over between brokers, see ``_sessions``).
            self.closing(old)
            await self.save_session(old)
            old.owner_lost = True
            old.perform_nowait(old.conn.take_over())
            self.egress.drop(old)
        self._devices[client_id] = device
        store = self.sessions
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
            handed = await self._take_over(client_id, stored, epoch, device.conn.session_expiry_s)
            if handed is None:  # another connection took the session meanwhile
                device.owner_lost = True
                device.perform_nowait(device.conn.take_over())
                return False
            stored = handed
            present = not stored.deleted
        if present:
            device.restored = stored
        if accepted.persistent:
            device.session_epoch = device.known_epoch = epoch
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
    ) -> StoredSession | None:
        """Take over the session ``stored`` at ``epoch``, owned by a connection that is not known
        to have ended: its state once its previous owner handed it over (or ``HANDOVER_S``
        later, the newest the table has), or None if another connection took it meanwhile."""
        me = self._config.id
        takeover = replace(
            stored,
            owner=me,
            epoch=epoch,
            expiry_s=expiry_s,
            ended_ms=None,
            awaiting_owner=stored.owner,
            handed_by=None,
        )
        await self.ensure_topic(SESSIONS_TOPIC)
        record = session_record(client_id, takeover, int(time.time() * 1000))
        flight, index = self._appender(SESSIONS_TOPIC, 0).add(record)
        await flight.done.wait()
        if flight.error is not None:
            log.info("mqtt %s: taking the session over failed: %s", client_id, flight.error)
            return stored  # resumed from what the table has: at least once
        tail = self.sessions.tail
        # A previous owner that is not reachable cannot answer: the table's state it is.
        answers = stored.owner == me or stored.owner in self._wiring.connected_peers()
        with trio.move_on_after(HANDOVER_S):
            await tail.reach(flight.base + index + 1)
            while (
                answers
                and (now := self.sessions.sessions.get(client_id)) is not None
                and now.epoch == epoch
                and now.owner == me
                and now.awaiting_owner is not None
            ):
                await tail.moved()
        if tail.offset <= flight.base + index:
            return takeover  # not read back in time: the state read at the CONNECT
        now = self.sessions.sessions.get(client_id)
        if now is None or now.epoch != epoch or now.owner != me:
            return None
        if now.awaiting_owner is not None:
            log.info("mqtt %s: no handover from broker %d in time", client_id, stored.owner)
        return now

    async def restore(self, device: MqttDevice) -> None:
        """After the CONNACK: the restored session's subscriptions, then its redeliveries."""
        stored = device.restored
        if stored is None:
            return
        device.conn.awaiting_release |= set(stored.awaiting_release)
        device.catching_up = dict(stored.positions)
        if stored.subscriptions:
            await self.egress.subscribe(device, stored.subscriptions)
        device.restored = None
        if stored.positions and self._nursery is not None:
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
            device = None if session.owner == me else self._devices.get(client_id)
            self._hand_over(client_id, session, device, final)
            return
        if session.owner == me:
            return
        device = self._devices.get(client_id)
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
            self._appender(SESSIONS_TOPIC, 0).add(record)
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
        flight, _ = self._appender(SESSIONS_TOPIC, 0).add(record)
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
        self.egress.drop(device)

    async def save_session(self, device: MqttDevice, *, wait: bool = True) -> None:
        """Write a persistent session's state (its owner, subscriptions, positions)."""
        if device.session_epoch is None or device.owner_lost or device.client_id is None:
            return
        session = device.frozen or self._session_state(device)
        device.dirty = False
        flight = await self._append_session(device.client_id, session)
        if wait:
            await flight.done.wait()

    def _session_state(self, device: MqttDevice) -> StoredSession:
        assert device.session_epoch is not None
        base = device.restored  # not restored yet: keep what was stored
        subscriptions = (
            base.subscriptions if base is not None else tuple(device.subscriptions.values())
        )
        return StoredSession(
            self._config.id,
            device.session_epoch,
            subscriptions,
            self._positions(device),
            tuple(sorted(device.conn.awaiting_release)),
            expiry_s=device.conn.session_expiry_s,
        )

    def _positions(self, device: MqttDevice) -> dict[Position, int]:
        """Per log partition, the offset from which the device may lack a QoS 1/2 message."""
        positions: dict[Position, int] = {}
        base = device.restored
        if base is not None:
            positions.update(base.positions)
        topics: set[str] = set()
        for topic_filter, sub in device.subscriptions.items():
            if sub.qos > 0:
                topics |= log_topics_for(self.mapping, topic_filter)
        for where, live in self.egress.positions.items():
            if where[0] in topics:
                positions[where] = live
        for where, offset in device.catching_up.items():
            positions[where] = min(positions.get(where, offset), offset)
        for where, offsets in device.unacked.items():
            if offsets:
                first = min(offsets)
                positions[where] = min(positions.get(where, first), first)
        return positions

    async def _append_session(self, client_id: str, session: StoredSession | None) -> Flight:
        await self.ensure_topic(SESSIONS_TOPIC)
        record = session_record(client_id, session, int(time.time() * 1000))
        flight, _ = self._appender(SESSIONS_TOPIC, 0).add(record)
        return flight

    async def _slow_loop(self) -> None:
        """Cut off the devices that stayed behind their deliveries for too long."""
        while True:
            await trio.sleep(SLOW_GRACE_S / 4)
            now = trio.current_time()
            for device in list(self._devices.values()):
                since = device.behind_since
                if since is not None and now - since > SLOW_GRACE_S:
                    device.cut_off()

    async def _deadline_loop(self) -> None:
        """Close the connections that stayed silent past their deadline (see _mqtt_deadlines)."""
        while True:
            await trio.sleep(DEADLINE_SCAN_S)
            now = trio.current_time()
            for device in self._deadlines.due(now):
                device.expire(now)

    async def _expiry_loop(self) -> None:
        """Mark deleted the sessions this broker owns that expired (v5 Session Expiry). At the
        session's own epoch: a reconnect elsewhere meanwhile writes a newer one, which wins."""
        me = self._config.id
        while True:
            await trio.sleep(EXPIRY_SWEEP_S)
            now = now_ms()
            for client_id, stored in list(self.sessions.sessions.items()):
                if stored.owner != me or client_id in self._devices or not stored.expired(now):
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
            for device in list(self._devices.values()):
                if device.dirty and device.session_epoch is not None:
                    try:
                        await self.save_session(device, wait=False)
                    except RequestError as exc:
                        log.info("mqtt %s: saving the session failed: %s", device.client_id, exc)

    async def _redeliver(self, device: MqttDevice) -> None:
        """Deliver again what a resumed session may lack: the records from its stored
        positions up to where the live readers were when it subscribed, that match its QoS 1/2
        subscriptions (they were kept in the log)."""
        reads = self._wiring.reads
        for where, start in sorted(device.catching_up.items()):
            end = self.egress.positions.get(where)
            offset = start
            while end is not None and offset < end and not device.conn.closed:
                try:
                    fetched, offset = await reads.follow(where[0], where[1], offset, 1 << 18, 0)
                except RequestError:
                    await trio.sleep(0.2)
                    continue
                if not fetched.data:  # the replica read is behind: a moment
                    await trio.sleep(0.05)
                    continue
                offset = await self._redeliver_batches(device, where, fetched.data, offset, end)
                device.catching_up[where] = offset
            if device.conn.closed:
                return  # the next connection resumes from what is left
            device.catching_up.pop(where, None)

    async def _redeliver_batches(
        self, device: MqttDevice, where: Position, data: bytes | memoryview, offset: int, end: int
    ) -> int:
        subscriptions = [
            s
            for s in device.subscriptions.values()
            if s.qos > 0 and not s.topic_filter.startswith("$share/")
        ]
        for record in data_records(data, offset, verify=False):
            if record.offset >= end:
                break  # in offset order: the live readers deliver the rest
            topic = self.mapping.mqtt_topic_for(where[0], record.key, record.headers)
            if topic is None:
                continue
            origin = origin_of(record.headers)
            matching = [
                s
                for s in subscriptions
                if mqtt_topic_matches(s.topic_filter, topic)
                and origin.wanted_by(s, device.client_id_bytes)
            ]
            if not matching:
                continue
            while not device.has_room():
                if device.conn.closed:
                    return record.offset
                await trio.sleep(0.01)
            place = (*where, record.offset)
            payload = record.value or b""
            deliver_to(device, topic, payload, origin, matching, place, record.timestamp)
        last = end_offset(data)  # past control batches too, but not past ``end``
        return offset if last is None else max(offset, min(last, end))

    async def device_gone(self, device: MqttDevice) -> None:
        """The connection ended: forget it, and publish its Will if the end was abnormal."""
        for action in device.conn.connection_lost():  # when it ended without a Close
            if isinstance(action, Close):
                device.publish_will = action.will
        self._deadlines.ended()
        self.closing(device)
        client_id = device.client_id
        if client_id is not None and self._devices.get(client_id) is device:
            del self._devices[client_id]
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
        stored = self.sessions.sessions.get(client_id)
        if client_id in self._devices or (stored is not None and stored.epoch != epoch):
            return  # the device came back, here or on another broker (a newer epoch)
        await self._publish_will(will, client_id)

    async def _publish_will(self, will: Will, client_id: str) -> None:
        self.stats["wills"] += 1
        property_headers = message_headers(will.properties)
        args = (will.topic, will.payload, will.qos, will.retain, client_id, 0, property_headers)
        try:
            if self.append_nowait(*args) is None:
                await self.ensure_route(will.topic)
                self.append_nowait(*args)
        except RequestError as exc:
            log.info("mqtt %s: the Will could not be published: %s", client_id, exc)

    async def subscribe(
        self, device: MqttDevice, subscriptions: Iterable[MqttSubscription]
    ) -> None:
        """Add subscriptions: live, and stored (persistent sessions), before the SUBACK."""
        await self.egress.subscribe(device, subscriptions)
        await self.save_session(device)

    def send_retained(
        self, device: MqttDevice, subscriptions: tuple[MqttSubscription, ...]
    ) -> None:
        """Send the retained messages matching new subscriptions."""
        self.retained.send_to(device, subscriptions)

    async def unsubscribe(self, device: MqttDevice, topic_filters: Iterable[str]) -> None:
        self.egress.unsubscribe(device, topic_filters)
        await self.save_session(device)

    # -- ingress --------------------------------------------------------------------------------

    def route(self, topic: str) -> Route:
        route = self._routes.get(topic)
        if route is None:
            if len(self._routes) >= _ROUTE_CACHE:
                self._routes.clear()
            route = self._routes[topic] = self.mapping.route(topic)
        return route

    def append_nowait(
        self,
        topic: str,
        payload: bytes,
        qos: int,
        retain: bool,
        client_id: str = "",
        packet_id: int = 0,
        property_headers: tuple[tuple[str, bytes], ...] = (),
    ) -> list[Flight] | None:
        """Append one PUBLISH of ``client_id`` (``property_headers``: the headers that keep its
        v5 message properties, ``message_headers``); the flights its acknowledgement waits for
        (the last is the record's own). None when its log topic must be created first
        (``ensure_route``). Raises ``RequestError`` when the broker cannot take it (shutting
        down, topic deleted).
        """
        placed = self._place(topic, client_id, retain)
        if placed is None:
            return None
        route, partition = placed
        headers = [(MQTT_TOPIC_HEADER, topic.encode()), _QOS_HEADERS[qos]]
        if client_id:  # who published it: for No Local, and with the packet id for resends
            client, packet = resend_key(client_id, packet_id)
            headers.append((MQTT_CLIENT_HEADER, client))
            if qos == 1 and packet_id:
                headers.append((MQTT_PACKET_ID_HEADER, packet))
        if retain:
            headers.append((MQTT_RETAIN_HEADER, b"1"))
        headers += property_headers
        record = Record(
            value=payload,
            key=route.key,
            headers=tuple(headers),
            timestamp=int(time.time() * 1000),
        )
        flight, _ = self._appender(route.log_topic, partition).add(record)
        self.stats["messages_in"] += 1
        if not retain:
            return [flight]
        # The retained copy: keyed by the MQTT topic; an empty payload is a tombstone.
        retained = Record(
            value=payload or None,
            key=topic.encode(),
            headers=(_QOS_HEADERS[qos], *property_headers),
            timestamp=record.timestamp,
        )
        retained_flight, _ = self._appender(RETAINED_TOPIC, 0).add(retained)
        return [flight, retained_flight]

    async def append_resend(
        self,
        topic: str,
        payload: bytes,
        retain: bool,
        client_id: str,
        packet_id: int,
        property_headers: tuple[tuple[str, bytes], ...] = (),
    ) -> list[Flight] | None:
        """A QoS 1 PUBLISH sent again (DUP set): as ``append_nowait``, but when the partition's
        log holds the first copy already, nothing is appended and the flight returned is done,
        at that copy's offset (see ``_resends``). If the lookup fails, the resend is appended
        (at least once, as MQTT promises)."""
        placed = self._place(topic, client_id, retain)
        if placed is None:
            return None
        route, partition = placed
        # A first copy sent through this broker gets its outcome first (it may be in a batch).
        await self._appender(route.log_topic, partition).settled()
        writes = self._wiring.writes
        try:
            offset = await writes.find_resend(
                log_id_of(route.log_topic, partition),
                resend_key(client_id, packet_id),
                value_digest(payload),
                trio.current_time() + writes.timeout,
            )
        except RequestError as exc:
            log.info("mqtt %s: resend of packet %d appended again: %s", client_id, packet_id, exc)
            offset = None
        if offset is None:
            return self.append_nowait(
                topic, payload, 1, retain, client_id, packet_id, property_headers
            )
        self.stats["resends_found"] += 1
        flight = Flight(partition)
        flight.base = offset
        flight.finish()
        return [flight]

    def _place(self, topic: str, client_id: str, retain: bool) -> tuple[Route, int] | None:
        """The route and partition of a PUBLISH to ``topic`` by ``client_id``; None when a topic
        it needs does not exist yet. Without a key in the route, the partition follows the
        client id: each device's messages stay in one partition, in order."""
        route = self.route(topic)
        topics = self._wiring.metadata.view.topics
        info = topics.get(route.log_topic)
        if info is None or (retain and RETAINED_TOPIC not in topics):
            return None
        count = info.config.partitions
        if route.key is not None:
            return route, partition_for_key(route.key, count)
        if client_id:
            return route, partition_for_key(client_id.encode(), count)
        counter = self._round_robin.setdefault(route.log_topic, itertools.count())
        return route, next(counter) % count

    def _appender(self, topic: str, partition: int) -> PartitionAppender:
        """The partition's appender, shared with the line protocol's quorum-acked publishes:
        one open batch per partition on this broker, whoever the records come from."""
        return self._wiring.appender(topic, partition, Acks.QUORUM)

    async def ensure_route(self, topic: str) -> TopicInfo:
        """The log topic of MQTT topic ``topic`` (and the retained topic), created if missing;
        ``RequestError`` if that fails."""
        await self.ensure_topic(RETAINED_TOPIC)
        return await self.ensure_topic(self.route(topic).log_topic)

    async def ensure_topic(self, name: str) -> TopicInfo:
        """Topic ``name``, created when missing: ``RETAINED_TOPIC`` compacted with one
        partition, a mapped log topic with ``--mqtt-partitions``. The replication factor is
        ``--mqtt-replication-factor`` capped at the cluster's size; a broker that starts first
        waits a little for the others to register before creating a topic with fewer."""
        wiring = self._wiring
        compact = name in (RETAINED_TOPIC, SESSIONS_TOPIC)
        while True:
            info = wiring.metadata.view.topics.get(name)
            if info is not None:
                return info
            creating = self._creating.get(name)
            if creating is None:
                break
            await creating.wait()
        self._creating[name] = done = trio.Event()
        try:
            config = self._config
            wanted = min(config.mqtt_replication_factor, len(config.peers))
            with trio.move_on_after(_BROKERS_WAIT_S):
                while len(wiring.metadata.view.brokers) < wanted:
                    await trio.sleep(0.1)
            brokers = max(1, len(wiring.metadata.view.brokers))
            topic_config = TopicConfig(
                partitions=1 if compact else config.mqtt_partitions,
                replication_factor=min(config.mqtt_replication_factor, brokers),
                retention_ms=None if compact else config.default_retention_ms,
                retention_bytes=None if compact else config.default_retention_bytes,
                compact=compact,
            )
            try:
                info = await wiring.metadata.create_topic(name, topic_config)
            except TopicExistsError:  # another broker created it with its own view
                info = wiring.metadata.view.topics[name]
            except MetadataError as exc:
                raise RequestError(ErrorCode.NO_QUORUM, f"creating {name}: {exc}") from exc
            log.info("broker %d: created log topic %s for MQTT", config.id, name)
            await wiring.wait_for_leaders(info)
            return info
        finally:
            del self._creating[name]
            done.set()

    # -- figures --------------------------------------------------------------------------------

    def metrics_in(self, nbytes: int) -> None:
        self.stats["bytes_in"] += nbytes

    def metrics_out(self) -> None:
        self.stats["writes_out"] += 1

    def dropped(self, count: int) -> None:
        self.stats["dropped"] += count

    def slow_consumer(self) -> None:
        self.stats["slow_disconnects"] += 1


def _epoch_of(session: StoredSession | None) -> int:
    return 0 if session is None else session.epoch
