"""A broker's MQTT listener: devices connect to any broker, publish into the log, subscribe.

``MqttService`` accepts connections on ``--mqtt-listen`` (plain TCP, TLS with ``--mqtt-tls``,
WebSocket with ``--mqtt-ws``) and runs each with an ``MqttDevice`` (one reader task, and a
writer task while it has something to send), watching every connection's deadline and cutting
off the devices that stay behind their deliveries. It is the device's host (``DeviceHost``) and
hands each request to the part that serves it: ``Admission`` (credentials and ACL),
``SessionKeeper`` (the client id's connection and session, its Will), ``Ingress`` (a PUBLISH
becomes a record of the log) and ``Egress`` (records of mapped log topics are delivered to
subscribed devices).
"""

from __future__ import annotations

import heapq
import logging
import os
import ssl
import time
from collections.abc import Iterable, Mapping
from typing import Any, Final

import trio

from kafkaesque.fd_stream import FdListener, peer_host
from kafkaesque.protocol import Shares
from kafkaesque.protocol.mqtt import (
    Accepted,
    Action,
    InvalidMappingError,
    MqttReasonCode,
    MqttServerConnection,
    MqttSubscription,
    TopicMapping,
)

from .._appender import Flight
from .._config import BrokerConfig, ConfigError
from .._metadata_view import TopicInfo
from ._admission import Admission
from ._deadlines import SCAN_S as DEADLINE_SCAN_S
from ._deadlines import Deadlines
from ._device import SLOW_GRACE_S, MqttDevice
from ._egress import Egress, Share
from ._ingress import Ingress
from ._retained import RetainedStore
from ._session_keeper import SessionKeeper
from ._websocket import WebSocketListener
from ._wiring import MqttWiring

log = logging.getLogger("kafkaesque.broker.mqtt")

MAX_PACKET_SIZE: Final = 1 << 20
_SHARES_EVERY_S: Final = 1.0


def load_mapping(path: str | None) -> TopicMapping:
    """The rules of ``path``, or the default mapping without a file."""
    if path is None:
        return TopicMapping.default()
    try:
        with open(path, encoding="utf-8") as f:
            return TopicMapping.parse(f.read(), os.path.dirname(path))
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
                "dead_letters",
                # Misbehaving connections, each closed at a bounded cost (docs/mqtt.md).
                "connect_timeouts",
                "keepalive_timeouts",
                "oversized_packets",
                "malformed_packets",
            ),
            0,
        )
        self._admission = Admission(wiring, self.stats)
        self._tls = load_tls(config)
        self.port: int | None = None
        self.tls_port: int | None = None
        self.ws_port: int | None = None
        self._ingress = ingress = Ingress(wiring, self.mapping, self.stats)
        # The hot path: a device's PUBLISH goes to the ingress with no call in between.
        self.append_nowait = ingress.append_nowait
        self.egress = Egress(
            config.id, wiring.reads, wiring.metadata, self.mapping, ingress.ensure_topic
        )
        self.retained = RetainedStore(wiring.reads, ingress.ensure_topic)
        self._deadlines: Deadlines[MqttDevice] = Deadlines()  # every connection, even unnamed
        self._sessions = SessionKeeper(wiring, self.egress, ingress, self._deadlines, self.stats)
        # Cancelled by ``stop_accepting`` (a graceful shutdown): the listeners close.
        self._accepting = trio.CancelScope()
        wiring.register_stats(self._stats)

    def _stats(self) -> Mapping[str, int]:
        return {
            **self.stats,
            "connected": len(self._sessions.devices),
            "subscriptions": self.egress.subscriptions,
            "messages_out": self.egress.delivered,
            "retained": len(self.retained.messages),
        }

    def describe(self, max_devices: int = 500) -> dict[str, Any]:
        """What the web console's MQTT screen shows (JSON): the devices connected here (the
        first ``max_devices`` by client id) with their subscriptions, the topic mapping, the
        retained messages and the persistent sessions whose connection ended (the first
        ``max_devices`` of each, by topic and client id; their ``_count``s say how many there
        are in all) and the counters. A session's ``positions`` are the log partitions it reads
        with the next offset to deliver (the console adds what it still lacks)."""
        devices = []
        for client_id in sorted(self._sessions.devices)[:max_devices]:
            device = self._sessions.devices[client_id]
            devices.append(
                {
                    "client_id": client_id,
                    "address": device.address,
                    "username": device.username,
                    "subscriptions": sorted(device.subscriptions),
                    "queued_bytes": device.queued_bytes,
                    "dropped": device.dropped,
                }
            )
        mapping = self.mapping
        return {
            "devices": devices,
            "connected": len(self._sessions.devices),
            "mapping": [
                {"filter": r.topic_filter, "log_topic": r.log_topic, "key_level": r.key_level}
                for r in mapping.rules
            ],
            "default_log_topic": mapping.default_log_topic,
            "stats": dict(self._stats()),
            "retained": self._retained_rows(max_devices),
            "retained_count": len(self.retained.messages),
            **self._ended_sessions(max_devices),
        }

    def _retained_rows(self, limit: int) -> list[dict[str, Any]]:
        """The first ``limit`` retained messages by topic (one pass over them all, each time
        the console's MQTT screen asks, every few seconds while it is open; the sessions
        alike)."""
        first = heapq.nsmallest(limit, self.retained.messages.items(), key=lambda item: item[0])
        return [
            {"topic": topic, "size": len(m.payload), "qos": m.qos, "at_ms": m.at_ms}
            for topic, m in first
        ]

    def _ended_sessions(self, limit: int) -> dict[str, Any]:
        now_ms = int(time.time() * 1000)
        ended = [
            (client_id, stored)
            for client_id, stored in self._sessions.store.sessions.items()
            if stored.ended_ms is not None and not stored.deleted and not stored.expired(now_ms)
        ]
        rows = [
            {
                "client_id": client_id,
                "ended_ms": stored.ended_ms,
                "expiry_s": stored.expiry_s,
                "owner": stored.owner,
                "subscriptions": sorted(sub.topic_filter for sub in stored.subscriptions),
                "owed": sum(len(p.owed) for p in stored.positions.values()),
                "positions": [
                    {"topic": topic, "partition": partition, "next": p.next}
                    for (topic, partition), p in sorted(stored.positions.items())
                ],
            }
            for client_id, stored in heapq.nsmallest(limit, ended, key=lambda item: item[0])
        ]
        return {"sessions": rows, "sessions_count": len(ended)}

    def device(self, client_id: str) -> dict[str, Any] | None:
        """What the console's device view starts from: whether ``client_id`` is connected here
        (and its subscriptions), its persistent session (from the table every broker follows),
        and where its PUBLISHes through this broker went (``Ingress.published``: this broker's
        own mapping and partitioning), as a list of MQTT topic, log topic, partition and key
        (bytes or None). None when this broker knows nothing of it."""
        connected = self._sessions.devices.get(client_id)
        stored = self._sessions.store.sessions.get(client_id)
        if stored is not None and stored.deleted:
            stored = None
        published = self._ingress.published(client_id)
        if connected is None and stored is None and not published:
            return None
        subscriptions = (
            sorted(connected.subscriptions)
            if connected is not None
            else sorted(sub.topic_filter for sub in stored.subscriptions)
            if stored is not None
            else []
        )
        return {
            "client_id": client_id,
            "connected": connected is not None,
            "address": None if connected is None else connected.address,
            "session_ended_ms": None if stored is None else stored.ended_ms,
            "subscriptions": subscriptions,
            "published": [
                {
                    "mqtt_topic": topic,
                    "log_topic": to.log_topic,
                    "partition": to.partition,
                    "key": to.key,
                }
                for topic, to in sorted(published.items())
            ],
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
            await nursery.start(self.egress.run)
            nursery.start_soon(self.retained.run)
            self._sessions.start_in(nursery)
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
            credentials_required=self._admission.users is not None,
            acl=self._admission.acl,
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

    async def _slow_loop(self) -> None:
        """Cut off the devices that stayed behind their deliveries for too long."""
        while True:
            await trio.sleep(SLOW_GRACE_S / 4)
            now = trio.current_time()
            for device in list(self._sessions.devices.values()):
                since = device.behind_since
                if since is not None and now - since > SLOW_GRACE_S:
                    device.cut_off()

    async def _deadline_loop(self) -> None:
        """Close the connections that stayed silent past their deadline (see ``_deadlines``)."""
        while True:
            await trio.sleep(DEADLINE_SCAN_S)
            now = trio.current_time()
            for device in self._deadlines.due(now):
                connected = device.conn.connected
                if device.expire(now):
                    self.stats["keepalive_timeouts" if connected else "connect_timeouts"] += 1

    # -- the device's host: admission -----------------------------------------------------------

    async def admit(self, device: MqttDevice, accepted: Accepted) -> list[Action] | None:
        """See ``Admission.admit``."""
        return await self._admission.admit(device, accepted)

    def refused(self, device: MqttDevice, action: str, topic: str) -> None:
        """See ``Admission.refused``."""
        self._admission.refused(device, action, topic)

    # -- the device's host: its session ---------------------------------------------------------

    async def accept(self, device: MqttDevice) -> bool:
        """See ``SessionKeeper.accept``."""
        return await self._sessions.accept(device)

    async def restore(self, device: MqttDevice) -> None:
        """See ``SessionKeeper.restore``."""
        await self._sessions.restore(device)

    def save_session_nowait(self, device: MqttDevice) -> Flight | None:
        """See ``SessionKeeper.save_session_nowait``."""
        return self._sessions.save_session_nowait(device)

    def closing(self, device: MqttDevice) -> None:
        """See ``SessionKeeper.closing``."""
        self._sessions.closing(device)

    async def device_gone(self, device: MqttDevice) -> None:
        """See ``SessionKeeper.device_gone``."""
        await self._sessions.device_gone(device)

    async def subscribe(
        self, device: MqttDevice, subscriptions: Iterable[MqttSubscription]
    ) -> None:
        """Add subscriptions: live, and stored (persistent sessions), before the SUBACK."""
        await self.egress.subscribe(device, subscriptions)
        await self._sessions.save_subscriptions(device)

    def send_retained(
        self, device: MqttDevice, subscriptions: tuple[MqttSubscription, ...]
    ) -> None:
        """Send the retained messages matching new subscriptions."""
        self.retained.send_to(device, subscriptions)

    async def unsubscribe(self, device: MqttDevice, topic_filters: Iterable[str]) -> None:
        self.egress.unsubscribe(device, topic_filters)
        await self._sessions.save_session(device)

    # -- the device's host: ingress (``append_nowait`` is the ingress's own, see __init__) ------

    async def append_resend(
        self,
        topic: str,
        payload: bytes,
        retain: bool,
        client_id: str,
        packet_id: int,
        property_headers: tuple[tuple[str, bytes], ...] = (),
    ) -> list[Flight] | None:
        """See ``Ingress.append_resend``."""
        return await self._ingress.append_resend(
            topic, payload, retain, client_id, packet_id, property_headers
        )

    async def ensure_route(self, topic: str, payload: bytes) -> TopicInfo:
        """See ``Ingress.ensure_route``."""
        return await self._ingress.ensure_route(topic, payload)

    # -- figures --------------------------------------------------------------------------------

    def metrics_in(self, nbytes: int) -> None:
        self.stats["bytes_in"] += nbytes

    def metrics_out(self) -> None:
        self.stats["writes_out"] += 1

    def dropped(self, count: int) -> None:
        self.stats["dropped"] += count

    def slow_consumer(self) -> None:
        self.stats["slow_disconnects"] += 1

    def protocol_error(self, code: int) -> None:
        """A connection closed for a protocol violation (reason ``code``): an oversized packet
        or another malformed one."""
        too_large = code == MqttReasonCode.PACKET_TOO_LARGE
        self.stats["oversized_packets" if too_large else "malformed_packets"] += 1
