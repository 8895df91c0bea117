"""One broker: the tree of tasks that turns storage, Raft and metadata into a service.

``Broker.run`` owns everything it starts, in one nursery: the peer transport (Raft messages and
forwarded requests share one TCP connection per broker pair), the multi-raft driver, the
controller quorum's replica (pysyncobj, bridged into trio), the client listener (line protocol),
the admin HTTP listener (``/metrics``), and the loops that keep the local Raft groups in step
with the metadata and tell peers which partitions this broker leads. Cancelling ``run`` stops
all of it and closes every log.

Readiness (issue 23). A broker that has just started knows nothing of the cluster: its metadata
replica replays its journal and catches up with the controller quorum's leader only after its
listeners are open. Until then its view may lack topics that exist, so answering from it would
say ``UNKNOWN_TOPIC`` for a topic that exists (or auto-create one). The broker is **ready** once
its registration (sent after pysyncobj says this replica caught up with a leader) has been
committed by the controller quorum and applied by this replica: everything the quorum committed
before the registration is then applied here (the registration is a read barrier through the
quorum), and the broker is in the registry with its current addresses. Ready is reached once
and never lost: a broker cut off from the quorum later serves from the metadata it has, as
before. Until ready, every command that needs the metadata answers the retriable ``NOT_READY``
(``CommandHandler.dispatch``) and MQTT CONNECTs get "server unavailable"; PING, HELP and QUIT
are answered, and the ports are open, so that a broker that cannot reach a controller quorum
still says why instead of refusing connections.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import trio

from kafkaesque.fd_stream import peer_host
from kafkaesque.protocol import (
    PEER_VIEW_OFFSETS,
    Answer,
    AppendRequest,
    Bounds,
    BoundsRequest,
    CommandReply,
    Decommissioned,
    DecommissionRequest,
    ErrorCode,
    ErrorReply,
    FindResendRequest,
    GroupCommand,
    GroupCommandRequest,
    HandOverControllerRequest,
    LatestRequest,
    LeaderClaims,
    MalformedPeerCall,
    MalformedPeerMessage,
    PeerCall,
    PeerReply,
    PeerView,
    ReadRequest,
    Refused,
    Request,
    Shares,
    Touch,
    encode_reply,
    is_peer_item,
    peer_from_wire,
    peer_to_wire,
)
from kafkaesque.protocol.http import HttpLimits
from kafkaesque.raft import (
    RaftConfig,
    Role,
)
from kafkaesque.raft.driver import MultiRaft, PeerTransport
from kafkaesque.storage import makedirs_durable

from ._access import AccessControl
from ._appender import Appenders
from ._balancer import LeaderBalancer
from ._commands import CommandHandler
from ._config import Address, BrokerConfig, check_exposure, listen_addresses, open_warning
from ._decommission import serve_hand_over
from ._errors import RequestError
from ._forwarding import Forwarder
from ._groups import GroupCoordinator
from ._hosting import PartitionHosting, claim_of
from ._latest import LatestIndexes
from ._leaders import Claim, LeaderTable
from ._listening import listening_sockets
from ._log_ids import log_id_of
from ._metadata import ClusterMetadata
from ._metadata_view import BrokerInfo, MetadataError
from ._metrics import BrokerMetrics, ClusterProbes
from ._partitioner import Partitioner
from ._peer_views import ElectionNote, PeerViews
from ._read_path import ReadPath
from ._relay import CommandRelay
from ._session import serve_session
from ._shutdown import CONTROLLER_GRACE_S, Draining, HandOver, hand_over_groups
from ._tls import (
    BrokerTls,
    ClientPortGate,
    PeerRefusals,
    TlsRefusals,
)
from ._topic_admin import TopicAdmin
from ._writes import WritePath
from .http import ConsoleApi, HttpServer, HttpService, HttpWiring, SnapshotProbes, Timeline
from .kafka import KafkaService, KafkaWiring
from .mqtt import MqttService, MqttWiring

log = logging.getLogger("kafkaesque.broker")

_LEADER_SCAN_S = 0.05
_LEADER_REPORT_EVERY_S = 1.0
_REGISTER_RETRY_S = 0.5
_STARTUP_LOG_S = 60.0  # the start-up timeline (INFO lines "... s after start") ends then


class Broker:
    """A broker process's state and services. Create, then ``await nursery.start(b.run)``.

    The composition root: it builds the services (the write path, the read path, the appenders,
    the partitions hosted here, the topic admin, the consumer-group coordinator, the command
    handler, the MQTT wing) and hands each only what it needs; none of them holds the broker.
    What is the broker's own business (its nursery, readiness, admitting a peer, relaying to
    another broker) they get as small callables.
    """

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config.validate()
        check_exposure(config)  # safe defaults: ConfigError unless loopback, or secured
        self.tls = BrokerTls.load(config)  # ConfigError for a certificate that cannot be used
        broker_dir = config.broker_dir
        makedirs_durable(broker_dir)
        peers = {i: (a.host, a.port) for i, a in config.peers.items()}
        self.transport = PeerTransport(
            config.id,
            peers,
            cluster="kafkaesque",
            secret=config.cluster_secret.encode(),
            on_items=self._on_items,
            on_peer_change=self._on_peer_change,
            server_ssl=self.tls.peer_server,
            client_ssl=self.tls.peer_client,
        )
        self.raft = MultiRaft(
            config.id,
            self.transport.post,
            flush=self.transport.flush,
            state_dir=os.path.join(broker_dir, "__raft"),
            peers=peers,
            tick_interval=config.tick_interval_s,
            raft_config=lambda i: RaftConfig(id=i),
        )
        self.metadata = ClusterMetadata(
            config.id,
            {i: (a.host, a.port) for i, a in config.controllers.items()},
            os.path.join(broker_dir, "__controller"),
            config.cluster_secret.encode(),
            join=config.join,
        )
        # The broker's own nursery while it runs (services start work that outlives a request).
        self._nursery: trio.Nursery | None = None
        self.leaders = LeaderTable()
        self.views = PeerViews()  # what the peers hear, why leaders were elected (the console)
        # Written from the caller (no writer's pass per hop of a forwarded write).
        self.forwarder = Forwarder(self.transport.send_now)
        self.writes = WritePath(
            config.id, self.raft, self.leaders, self.forwarder, timeout=config.write_timeout_s
        )
        self.reads = ReadPath(
            config.id,
            self.raft,
            self.writes,
            self.forwarder,
            self.transport.connected_peers,
            self.metadata,
        )
        self.metrics = BrokerMetrics(config.id, lambda: list(self.raft.replicas.values()))
        self.tls_refusals = TlsRefusals(self.metrics.registry)
        self.metrics.registry.register(PeerRefusals(lambda: self.transport.rejected))
        # Set once this broker knows the cluster (see the module docstring); never cleared.
        self._ready = trio.Event()
        self.raft.on_group_commit = self.metrics.fsync_latency.observe
        self.writes.on_written = self.metrics.commit_latency.observe
        # Who each client connection is and what it may do (users file, ACLs): see ``_access``.
        self.access = AccessControl.from_config(config, self.metrics)
        self.metadata.add_view_listener(lambda view: self.access.set_acls(view.acls))
        # LATEST's key indexes, one per compacted partition led here (see ``_latest``).
        self.latest = LatestIndexes(lambda: self.raft.replicas, self._compacted, self._read_index)
        # One appender per partition published to here, its task in the broker's nursery.
        self.appenders = Appenders(self.writes, lambda: self._nursery)
        # The partitions hosted here, kept in step with the metadata (see ``_hosting``).
        self.hosting = PartitionHosting(
            config,
            self.metadata,
            self.raft,
            self.leaders,
            self.appenders,
            self.admit_peer,
        )
        # Group commands and LATEST sent here, answered by the broker that serves them.
        self.relay = CommandRelay(self.forwarder)
        self.admin = TopicAdmin(
            config,
            self.metadata,
            self.writes,
            self.reads,
            self.access,
            self.hosting.membership,
            self.forwarder,
            self.transport.connected_peers,
            lambda: self._nursery,
        )
        self.groups = GroupCoordinator(
            config.id,
            config.group_session_timeout_s,
            metadata=self.metadata,
            writes=self.writes,
            reads=self.reads,
            read_index=self._read_index,
            forward_to=self.relay.forward_to,
            nursery=lambda: self._nursery,
        )
        # The producers' rule for records without a partition, shared by the fronts.
        partitioner = Partitioner()
        self.commands = CommandHandler(
            config.id,
            metadata=self.metadata,
            writes=self.writes,
            reads=self.reads,
            appender=self.appenders.get,
            partitioner=partitioner,
            groups=self.groups,
            admin=self.admin,
            latest=self.latest,
            access=self.access,
            metrics=self.metrics,
            ready=self._ready.is_set,
            forward_latest=self.relay.forward_latest,
            admit_peer=self.admit_peer,
            elect_leaders=self._elect_leaders,
        )
        self.metrics.register_cluster(
            ClusterProbes(
                registered=lambda: self.metadata.view.brokers,
                hears=self.raft.hears,
                partitions=self._all_partitions,
                leader_of=lambda topic, p: self.writes.leader_of(log_id_of(topic, p)),
                committed=self.groups.committed_offsets,
                ends=self.reads.high_watermarks,
            )
        )
        self._connections = 0
        self._known_peers = set(config.peers) - {config.id}
        # Peers (re)connected since the last leadership report: told at once, not at the next
        # periodic report (a restarted broker routes nothing before it knows the leaders).
        self._unreported_peers: set[int] = set()
        self.client_port = config.client.port
        self.admin_port: int | None = None
        self._started_at = time.monotonic()
        # Cancelled by ``drain``: no new client connection is accepted from then on.
        self._accepting = trio.CancelScope()
        # Begun by ``drain``: the client connections (line protocol, MQTT) finish and close.
        self.draining = Draining()
        # The MQTT listeners (--mqtt-listen, --mqtt-tls-listen), if any; their rules, users and
        # certificates are read now.
        self.mqtt = (
            MqttService(
                MqttWiring(
                    config=config,
                    metadata=self.metadata,
                    reads=self.reads,
                    writes=self.writes,
                    appender=self.appenders.get,
                    register_stats=self.metrics.register_mqtt,
                    authorization_failed=self.metrics.mqtt_authorization_failed,
                    draining=self.draining,
                    ready=self._ready.is_set,
                    tell_peers=self.tell_peers,
                    connected_peers=self.transport.connected_peers,
                    wait_for_leaders=self.writes.wait_for_leaders,
                    login_refused=self._mqtt_login_refused,
                )
            )
            if config.mqtt_enabled
            else None
        )
        self.mqtt_port: int | None = None
        # The Kafka protocol listener (on unless --kafka-listen off; docs/kafka.md).
        self.kafka = KafkaService(
            KafkaWiring(
                config=config,
                metadata=self.metadata,
                writes=self.writes,
                reads=self.reads,
                admin=self.admin,
                groups=self.groups,
                access=self.access,
                leader_epoch=self._leader_epoch,
                draining=self.draining,
                tls=self.tls.kafka,
                tls_refusals=self.tls_refusals,
            )
        )
        self.kafka_port: int | None = None
        # The REST listener (on unless --http-listen off; docs/http.md): each call one command.
        self.http = HttpService(
            HttpWiring(
                config=config,
                dispatch=self.commands.dispatch,
                metadata=self.metadata,
                partitioner=partitioner,
                access=self.access,
                draining=self.draining,
                tls=self.tls.http,
                tls_refusals=self.tls_refusals,
            )
        )
        self.http_port: int | None = None
        # The admin port: /metrics, /healthz and the web console (docs/console.md), whose
        # timeline hears of refused logins and rebalances from here.
        self.timeline = Timeline()
        self.metrics.on_auth_failed = self._login_refused
        self.groups.on_rebalance = self._rebalanced
        self.console = ConsoleApi(
            self.http.api,
            self.metrics.scrape,
            SnapshotProbes(
                broker_id=config.id,
                view=lambda: self.metadata.view,
                hears=self.raft.hears,
                leader_of=lambda topic, p: self.writes.leader_of(log_id_of(topic, p)),
                replicas=self.raft.replicas.values,
                ends=self.reads.high_watermarks,
                heard_by=lambda peer: self.views.heard_by(peer, trio.current_time()),
                election=self.views.election,
                group_offsets=lambda: [
                    *self.groups.committed_offsets(),
                    *self.views.group_offsets(trio.current_time()),
                ],
            ),
            self.timeline,
            mqtt=None if self.mqtt is None else self.mqtt.describe,
            mqtt_device=None if self.mqtt is None else self.mqtt.device,
        )
        self._admin_server = HttpServer(
            self.console.handle,
            access=self.access,
            limits=HttpLimits(max_connections=64),
            broker_id=config.id,
            listener="admin",
            tls=self.tls.admin,
            tls_refusals=self.tls_refusals,
        )
        # The client port's protocol check and, with client_tls, its TLS (``_tls``).
        self._client_gate = ClientPortGate(self.tls.client, self.tls_refusals, self.draining)
        # Gives the groups led here back to their preferred replicas (stopped by ``drain``).
        self.balancer = LeaderBalancer(
            self.raft,
            self.hosting.preferred_replica,
            self.transport.connected_peers,
            rate=config.leader_balance_rate,
        )

    @property
    def ready(self) -> bool:
        """Whether this broker knows the cluster: its own registration, sent once its metadata
        replica caught up with a controller leader, is applied here (see the module docstring).
        False until then; once True, True for good."""
        return self._ready.is_set()

    async def wait_ready(self) -> None:
        """Return once :attr:`ready`. Unbounded: wrap it in ``trio.fail_after``."""
        await self._ready.wait()

    # -- lifetime -------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[Broker] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; ``started`` once every listener is bound."""
        config = self.config
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await nursery.start(
                    self.transport.run, config.peers[config.id].host, config.peers[config.id].port
                )
                await nursery.start(self.raft.run)
                await nursery.start(self.metadata.run)
                listeners = await trio.open_tcp_listeners(
                    config.client.port, host=config.client.host
                )
                self.client_port = listeners[0].socket.getsockname()[1]
                nursery.start_soon(self._accept_clients, listeners)
                if self.mqtt is not None:
                    self.mqtt_port = await nursery.start(self.mqtt.run)
                self.kafka_port = await nursery.start(self.kafka.run)
                self.http_port = await nursery.start(self.http.run)
                if config.admin is not None:
                    admin = await trio.open_tcp_listeners(config.admin.port, host=config.admin.host)
                    self.admin_port = admin[0].socket.getsockname()[1]
                    nursery.start_soon(trio.serve_listeners, self._admin_server.serve, admin)
                nursery.start_soon(self._register)
                nursery.start_soon(self.hosting.reconcile_loop)
                nursery.start_soon(self._leader_loop)
                nursery.start_soon(self.hosting.membership_loop)
                nursery.start_soon(self.balancer.run)
                nursery.start_soon(self.hosting.retention_loop)
                nursery.start_soon(self.hosting.interval_flush_loop)
                nursery.start_soon(self.groups.run_expiry)
                nursery.start_soon(self.groups.run_keep_alive)
                nursery.start_soon(self.latest.run)
                log.info(
                    "broker %d serving clients on %s:%d (%.2f s after start)",
                    config.id,
                    config.client.host,
                    self.client_port,
                    self._since_start(),
                )
                check_exposure(config, self._bound_listeners())
                warning = open_warning(config, self.client_port)
                if warning is not None:
                    log.warning("%s", warning)
                task_status.started(self)
        finally:
            self._nursery = None
            self.raft.close()

    def _bound_listeners(self) -> list[tuple[str, Address]]:
        """The addresses the kernel bound for this broker's listeners, by setting name (one port
        may be bound on several hosts). Where ``/proc`` cannot say (not Linux), the configured
        ones, which ``__init__`` checked already."""
        c = self.config
        ports = {
            "client": self.client_port,
            "peers": c.peers[c.id].port,
            "controllers": c.controllers[c.id].port,
            "admin": self.admin_port,
            "mqtt": self.mqtt_port,
            "mqtt_tls": self.mqtt.tls_port if self.mqtt is not None else None,
            "mqtt_ws": self.mqtt.ws_port if self.mqtt is not None else None,
            "kafka": self.kafka_port,
            "http": self.http_port,
        }
        try:
            sockets = listening_sockets()
        except OSError:
            return listen_addresses(c)
        return [
            (name, Address(host, port))
            for name, port in ports.items()
            if port
            for host, bound_port in sockets
            if bound_port == port
        ]

    async def _accept_clients(self, listeners: list[trio.SocketListener]) -> None:
        """Accept client connections until ``drain`` stops it. The listening sockets are closed
        then (a new client's connect is refused, and it tries another broker); the connections
        accepted so far are tasks of the broker's nursery and are served on."""
        assert self._nursery is not None  # started from run(), inside the nursery
        with self._accepting:
            await trio.serve_listeners(self._admit_client, listeners, handler_nursery=self._nursery)

    async def _admit_client(self, stream: trio.SocketStream) -> None:
        """A new client connection: the port's protocol check (and TLS handshake), then its
        session; a connection that spoke the wrong protocol was told and closed (``_tls``)."""
        _keep_alive(stream)
        served = await self._client_gate.admit(stream)
        if served is not None:
            await self._serve_client(served, tls=self._client_gate.tls)

    async def drain(self, timeout: float) -> HandOver:
        """Get ready to stop without a blip (graceful shutdown, see ``_shutdown``).

        Stops accepting client connections, then hands every Raft group led here, and the
        controller quorum's leadership if this broker holds it, to other brokers, for up to
        ``timeout`` seconds in all; the connections open here are served meanwhile (their writes
        are forwarded to the new leaders). Then they are drained (``Draining``): each finishes
        the requests it had taken, sends its replies and closes; this returns once they have
        closed too, or at the deadline. The caller then stops the broker (cancels ``run``):
        leaderships left here (none reachable to take them) go to an election then, and
        connections still open are cut. Returns what moved; never raises for a group that
        changed meanwhile.
        """
        started = trio.current_time()
        deadline = started + timeout
        self._accepting.cancel()
        if self.mqtt is not None:
            self.mqtt.stop_accepting()
        self.balancer.stop()
        controller: list[bool | None] = [None]
        controller_done = trio.Event()

        async def hand_over_controller() -> None:
            controller[0] = await self.metadata.hand_over_leadership(deadline)
            controller_done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(hand_over_controller)
            led, left = await hand_over_groups(self.raft, self.transport.connected_peers, deadline)
            with trio.move_on_at(min(deadline, trio.current_time() + CONTROLLER_GRACE_S)):
                await controller_done.wait()
            if not controller_done.is_set():  # no controller could take it: an election follows
                controller[0] = False
                nursery.cancel_scope.cancel()
        report = HandOver(led, left, controller[0], trio.current_time() - started)
        log.info("broker %d: %s", self.config.id, report.describe())
        # Only now: while the leaderships move, the connections are served as before (a write
        # waits out the transfer and is forwarded to the new leader), so a client sees latency,
        # not a refusal and its back-off (measured: bench.ops' rolling-restart gap p99 0.32 s
        # when the connections drained from the start, the probes' NOT_READY and retry).
        self.draining.begin()
        with trio.move_on_at(deadline):
            await self.draining.wait_closed()
        if self.draining.open:
            log.info(
                "broker %d: %d client connections still busy at the shutdown timeout: cut",
                self.config.id,
                self.draining.open,
            )
        return report

    async def _serve_client(self, stream: trio.abc.Stream, *, tls: bool = False) -> None:
        """Serve one client connection; ``tls``: ``stream`` is TLS (PLAIN may authenticate)."""
        self.metrics.connections.inc()
        if self._connections >= self.config.max_connections:
            reply = ErrorReply(ErrorCode.BUSY, "too many connections; retry later")
            with contextlib.suppress(trio.BrokenResourceError):  # it left first: fine
                await stream.send_all(encode_reply(reply))
            await stream.aclose()
            return
        self._connections += 1
        try:
            await serve_session(
                stream,
                self.commands.dispatch,
                self.config.limits,
                self.config.max_inflight_per_connection,
                lambda session: self.groups.connection_closed(session.members),
                self.metrics.bad_command,
                self.draining,
                self.access.new_session(peer_host(stream), tls=tls),
            )
        except Exception:  # a bug in serving one client must not take the broker down
            log.exception("broker %d: a client session failed", self.config.id)
        finally:
            self._connections -= 1

    def _login_refused(self) -> None:
        self.timeline.add("login", f"broker {self.config.id} refused a login (wrong credentials)")

    def _mqtt_login_refused(self, text: str) -> None:
        self.timeline.add("login", text)

    def _rebalanced(self, text: str) -> None:
        self.timeline.add("rebalance", text)

    async def _register(self) -> None:
        """Put this broker in the registry (retrying while the controller quorum forms), then
        be ready: the registration is applied here, so is everything committed before it."""
        c = self.config
        info = BrokerInfo(
            id=c.id,
            host=c.client_host,
            client_port=self.client_port,
            peer_port=c.peers[c.id].port,
            controller_port=c.controllers[c.id].port,
            admin_port=self.admin_port,
            mqtt_port=self.mqtt_port,
            mqtt_tls_port=self.mqtt.tls_port if self.mqtt is not None else None,
            mqtt_ws_port=self.mqtt.ws_port if self.mqtt is not None else None,
            kafka_port=self.kafka_port,
            http_port=self.http_port,
        )
        while True:
            try:
                await self.metadata.wait_ready()
                log.info(
                    "broker %d: metadata replica caught up with the controller leader "
                    "(%.2f s after start)",
                    c.id,
                    self._since_start(),
                )
                await self.metadata.register_broker(info)
                break
            except MetadataError as exc:
                log.info("broker %d: registering failed (%s); retrying", c.id, exc)
                await trio.sleep(_REGISTER_RETRY_S)
        self._ready.set()
        log.info(
            "broker %d ready: registered, metadata version %d (%.2f s after start)",
            c.id,
            self.metadata.view.version,
            self._since_start(),
        )

    def _since_start(self) -> float:
        """Seconds since this broker was built (for the start-up timeline in the log)."""
        return time.monotonic() - self._started_at

    # -- partitions -------------------------------------------------------------------------------

    def _elect_leaders(self, wanted: Callable[[str], bool]) -> tuple[int, int]:
        """``ELECTLEADERS``: the balancer's election of the groups led here (it is built after
        the command handler, which is given this)."""
        return self.balancer.elect_preferred(wanted)

    def admit_peer(self, broker: int, host: str, peer_port: int) -> None:
        """Know ``broker`` (a new member): connect to it and include it in Raft pings."""
        if broker not in self._known_peers and broker != self.config.id:
            self._known_peers.add(broker)
            self.transport.add_peer(broker, (host, peer_port))
            self.raft.add_peer(broker)

    # -- leadership reports -----------------------------------------------------------------------

    async def _leader_loop(self) -> None:
        """Tell every peer which groups this broker leads: on change, to a peer as soon as it
        (re)connects, and every second."""
        reported: dict[str, Claim] = {}
        last_report = -1e9
        settled = False  # every hosted group had a known leader once (logged, for the timeline)
        while True:
            await trio.sleep(_LEADER_SCAN_S)
            if not settled and self.ready and self.raft.replicas:
                settled = self._leaders_settled()
            # Forwards waiting on a paused old leader end once a new one is known (issue 23).
            self.forwarder.abandon_replaced(self.writes.leader_of, self.raft.hears)
            led = {g.id: claim_of(g) for g in self.raft.replicas.values() if g.role is Role.LEADER}
            won: dict[str, tuple[int, str, int]] = {}
            for log_id, claim in led.items():
                old = reported.get(log_id)
                if old is None or old.term != claim.term:
                    self.metrics.elections.inc()
                    won[log_id] = self._won(log_id)
            now = trio.current_time()
            if led != reported or now - last_report >= _LEADER_REPORT_EVERY_S:
                self.tell_peers(LeaderClaims(led))
                self.tell_peers(self._view(led if self._unreported_peers else won))
                reported, last_report = led, now
                self._unreported_peers.clear()
            elif self._unreported_peers:
                items = [peer_to_wire(LeaderClaims(led)), peer_to_wire(self._view(led))]
                for peer in self._unreported_peers:
                    for item in items:
                        self.transport.send(peer, item)
                self._unreported_peers.clear()

    def _won(self, log_id: str) -> tuple[int, str, int]:
        """Note the election that just made this broker the leader of ``log_id`` (its term and
        cause, from the Raft core; now, on the wall clock, in ms) and return it."""
        node = self.raft.replicas[log_id].node
        won = node.last_election
        cause = won.cause.value if won is not None and won.term == node.term else "unknown"
        note = ElectionNote(self.config.id, node.term, cause, int(time.time() * 1000))
        self.views.note(log_id, note)
        return note.term, note.cause, note.at_ms

    def _view(self, elections: Mapping[str, object]) -> PeerView:
        """This broker's ``PeerView``: the peers it hears, and its elections of ``elections``."""
        heard = tuple(p for p in sorted(self._known_peers) if self.raft.hears(p))
        mine: dict[str, tuple[int, str, int]] = {}
        for log_id in elections:
            note = self.views.election(log_id)
            if note is not None and note.leader == self.config.id:
                mine[log_id] = (note.term, note.cause, note.at_ms)
        offsets = tuple(self.groups.committed_offsets()[:PEER_VIEW_OFFSETS])
        return PeerView(heard, mine, offsets)

    def _leaders_settled(self) -> bool:
        """Whether the start-up's lookout for leaders is over: every hosted group has a known
        leader (logged, for the start-up timeline), or the start-up is long past (a group left
        leaderless would otherwise have every group looked at 20 times a second)."""
        if self._since_start() > _STARTUP_LOG_S:
            return True
        if any(self.writes.leader_of(g) is None for g in self.raft.replicas):
            return False
        log.info(
            "broker %d: each of the %d partitions hosted here has a leader (%.2f s after start)",
            self.config.id,
            len(self.raft.replicas),
            self._since_start(),
        )
        return True

    def tell_peers(self, message: LeaderClaims | Shares | PeerView) -> None:
        """Send ``message`` to every known peer broker (dropped for those not connected)."""
        item = peer_to_wire(message)  # encoded once for all of them
        for peer in self._known_peers:
            self.transport.send(peer, item)

    # -- forwarding -------------------------------------------------------------------------------

    def _leader_epoch(self, log_id: str) -> int:
        """The Raft term of the group's leader as known here (Kafka's leader epoch); -1 when
        no leader is known."""
        replica = self.raft.replicas.get(log_id)
        if replica is not None and replica.role is Role.LEADER:
            return replica.node.term
        claim = self.leaders.claim(log_id)
        return -1 if claim is None else claim.term

    def _read_index(self, log_id: str) -> Awaitable[int]:
        """A read barrier on ``log_id``, led here (``MultiRaft.read_index``), bounded by the
        write timeout."""
        return self.raft.read_index(log_id, timeout=self.writes.timeout)

    def _compacted(self, log_id: str) -> bool:
        """Whether the topic of ``log_id`` is compacted now (LATEST's indexes follow it)."""
        info = self.metadata.view.topics.get(log_id.rpartition("/")[0])
        return info is not None and info.config.compact

    def _all_partitions(self) -> list[tuple[str, int]]:
        """Every partition of the metadata view, as (topic, partition) (for the metrics)."""
        topics = self.metadata.view.topics.values()
        return [(t.name, p) for t in topics for p in range(len(t.replicas))]

    def _on_items(self, peer: int, items: list[Any]) -> None:
        raft_items = []
        for item in items:
            if is_peer_item(item):
                self._on_peer_item(peer, item)
            else:
                raft_items.append(item)
        if raft_items:
            self.raft.handle_items(peer, raft_items)

    def _on_peer_item(self, peer: int, item: list[Any]) -> None:
        """One broker-to-broker message (``protocol._peer_messages``): decoded once, then handled.

        A malformed one is the peer's protocol violation: dropped and logged, nothing else;
        but a call whose request id could be read (a request of a newer broker, say) is answered
        ``Refused``, so that its caller hears why at once instead of waiting out its deadline.
        """
        try:
            msg = peer_from_wire(item)
        except MalformedPeerCall as exc:
            log.warning("broker %d: refused a request of broker %d: %s", self.config.id, peer, exc)
            reason = (
                f"broker {self.config.id} cannot read this request ({exc}): is it of an older "
                "version than the sender?"
            )
            self.forwarder.reply(peer, exc.req, Refused(ErrorCode.BAD_ARGS, reason))
            return
        except MalformedPeerMessage as exc:
            log.warning(
                "broker %d: dropped a malformed message of broker %d: %s", self.config.id, peer, exc
            )
            return
        match msg:
            case PeerReply(req, answer):
                self.forwarder.answered(req, answer)
            case LeaderClaims(claims):
                self.leaders.report(peer, claims)
            case PeerView(heard, elections, offsets):
                self.views.report(peer, heard, dict(elections), trio.current_time(), offsets)
            case Shares(shares):
                if self.mqtt is not None:
                    self.mqtt.egress.peer_shares(peer, shares)
            case PeerCall(req, request):
                self._serve_call(peer, req, request)

    def _serve_call(self, peer: int, req: int, request: Request) -> None:
        """Answer a peer's request: at once, or from a task of the broker's nursery (none
        while it is stopping: the request is dropped, the peer's call times out)."""
        if isinstance(request, BoundsRequest):
            bounds = Bounds(
                tuple(self.reads.led_bounds(g, request.time_ms) for g in request.log_ids)
            )
            self.forwarder.reply(peer, req, bounds)
            return
        nursery = self._nursery
        if nursery is None:
            return
        match request:
            case AppendRequest():
                # Started here, in arrival order; answered with no task in the common case.
                self.writes.serve_forwarded(peer, req, request, nursery)
            case FindResendRequest(log_id, client, packet, digest, seconds):
                nursery.start_soon(
                    self._serve_find_resend, peer, req, log_id, (client, packet), digest, seconds
                )
            case ReadRequest():
                nursery.start_soon(self.reads.serve_read, peer, req, request)
            case GroupCommandRequest(command):
                nursery.start_soon(self._serve_group_command, peer, req, command)
            case LatestRequest():
                nursery.start_soon(self._serve_latest, peer, req, request)
            case HandOverControllerRequest(seconds):
                nursery.start_soon(self._serve_controller_hand_over, peer, req, seconds)
            case DecommissionRequest(broker):
                nursery.start_soon(self._serve_decommission, peer, req, broker)

    async def _serve_find_resend(
        self, peer: int, req: int, log_id: str, key: tuple[bytes, bytes], digest: int, s: float
    ) -> None:
        answer = await self.writes.serve_find_resend(log_id, key, digest, s)
        self.forwarder.reply(peer, req, answer)

    async def _serve_group_command(self, peer: int, req: int, command: GroupCommand) -> None:
        """A peer's client sent a group command that this broker coordinates: its reply is
        encoded here, once, and relayed by the peer as it is."""
        if isinstance(command, Touch):  # internal, not a client's: no ACL, no command metrics
            self.forwarder.reply(peer, req, CommandReply(await self.groups.touched(command)))
            return
        assert self._nursery is not None
        slot = self.commands.dispatch(command, self._nursery, None, forwarded=True)
        await slot.wait()
        self.forwarder.reply(peer, req, CommandReply(slot.encode()))

    async def _serve_latest(self, peer: int, req: int, request: LatestRequest) -> None:
        """A peer's client sent LATEST for a partition led here: answered from this replica's
        key index, never forwarded again; the encoded reply is relayed by the peer as it is."""
        try:
            data = await self.commands.latest(
                request.topic, request.key, request.partition, forwarded=True
            )
        except RequestError as exc:
            data = encode_reply(exc.reply())
        except Exception:  # a bug: answer it, log it, keep serving everyone else
            log.exception("broker %d: LATEST for broker %d failed", self.config.id, peer)
            data = encode_reply(ErrorReply(ErrorCode.INTERNAL, "internal error (logged)"))
        self.forwarder.reply(peer, req, CommandReply(data))

    async def _serve_controller_hand_over(self, peer: int, req: int, seconds: float) -> None:
        """A peer decommissions this broker, whose controller leads the quorum (pysyncobj's
        leader cannot remove itself): hand that leadership over, as a graceful stop does."""
        self.forwarder.reply(peer, req, await serve_hand_over(self.metadata, seconds))

    async def _serve_decommission(self, peer: int, req: int, broker: int) -> None:
        """``REMOVEBROKER`` sent to broker ``broker`` (the peer) itself, carried out here: a
        broker cannot take its own controller out of the quorum. Never delegated again."""
        answer: Answer
        try:
            answer = Decommissioned(await self.admin.remove_broker(broker, forwarded=True))
        except RequestError as exc:
            answer = Refused(exc.code, exc.message)
        except Exception:  # a bug: answer it, log it, keep serving everyone else
            log.exception("broker %d: decommissioning broker %d failed", self.config.id, broker)
            answer = Refused(ErrorCode.INTERNAL, "internal error (logged)")
        self.forwarder.reply(peer, req, answer)

    def _on_peer_change(self, peer: int, connected: bool) -> None:
        self.raft.peer_changed(peer, connected)
        if connected:
            self._unreported_peers.add(peer)
        if not connected:
            self.forwarder.peer_gone(peer)
            self.leaders.forget(peer)
            self.views.forget(peer)
            if self.mqtt is not None:
                self.mqtt.egress.peer_shares(peer, ())


# TCP keepalive on client connections: an open connection keeps its group members alive (see
# ``_groups``), so one whose client vanished without closing it (power lost, cable cut) must
# come to an end by itself: after 60 s of silence, 3 probes 10 s apart, then it counts as
# closed (its members leave). A quiet telnet user's kernel answers the probes: never cut.
_KEEPALIVE_IDLE_S = 60
_KEEPALIVE_INTERVAL_S = 10
_KEEPALIVE_PROBES = 3


def _keep_alive(stream: trio.SocketStream) -> None:
    """Turn TCP keepalive on for a client connection (what the platform offers of it); a
    socket that refuses (its peer already reset it) is left as it is: its reads will fail."""
    with contextlib.suppress(OSError):
        stream.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in (
            ("TCP_KEEPIDLE", _KEEPALIVE_IDLE_S),
            ("TCP_KEEPINTVL", _KEEPALIVE_INTERVAL_S),
            ("TCP_KEEPCNT", _KEEPALIVE_PROBES),
        ):
            option = getattr(socket, name, None)
            if option is not None:  # Linux has them all; others keep their defaults
                stream.setsockopt(socket.IPPROTO_TCP, option, value)
