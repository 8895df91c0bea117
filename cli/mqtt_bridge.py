"""``kafkaesque mqtt-bridge``: an existing MQTT broker (mosquitto, HiveMQ, EMQX) into the log.

Connects to ``--upstream`` as an MQTT client with a persistent session, subscribes QoS 1 (to the
rules' filters unless ``--subscribe`` names others; ``--share-group`` makes them
``$share/<group>/...`` so several bridges split the load), appends every message to the log
topic the rules map it to, and acknowledges it upstream only once committed. ``--to-mqtt``
publishes the records of log topics back to the upstream broker. Runs until SIGINT/SIGTERM, then
finishes what is in flight (at most ``--drain-timeout`` seconds) and disconnects.

``--upstream-tls`` (or ``--upstream-cafile``) speaks TLS to the upstream broker, verifying its
certificate (against the system's CAs or ``--upstream-cafile``) and its name or address;
``--upstream-certfile``/``--upstream-keyfile`` present a client certificate; ``--username`` and
``--password`` (or $KAFKAESQUE_MQTT_PASSWORD) are its credentials.

Its connection to the Kafkaesque cluster takes the client commands' security options
(docs/security.md): ``--tls`` / ``--tls-ca`` (TLS), ``--tls-cert`` (a client certificate),
``--user`` ($KAFKAESQUE_USER) with ``--cluster-password`` ($KAFKAESQUE_PASSWORD; ``--password``
is the upstream's), ``--sasl-mechanism``.

Prints ``ready`` on stdout once subscribed, then counters on stderr every ``--stats-interval``.
Each bridge instance needs its own ``--client-id`` (the upstream session is keyed by it), and
must keep it across restarts so that it finds its queued messages again.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import ssl
import sys
from pathlib import Path
from typing import Any

import trio

from kafkaesque.client import ClientConfig, Security
from kafkaesque.mqtt_bridge import (
    CONVERTER_NAMES,
    DEFAULT_SESSION_EXPIRY_S,
    BridgeConfig,
    BridgeError,
    BridgeStats,
    MqttBridge,
    MqttClientOptions,
    make_converter,
)
from kafkaesque.protocol.mqtt import (
    InvalidMappingError,
    InvalidMqttTopicError,
    MqttVersion,
    TopicMapping,
    validate_mqtt_topic_filter,
)
from kafkaesque.security import client_context

from .client_options import PASSWORD_ENV as PASSWORD_ENV_OF_CLIENTS
from .client_options import USER_ENV, SecurityCommandError, security_from_args

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
# A PUBACK waits for the quorum commit, so one bridge moves at most this many messages per commit
# latency: 10,000 moved 1.5 to 4x more than 1,000 in bench.bridge (docs/mqtt-bridge.md).
DEFAULT_RECEIVE_MAXIMUM = 10_000
BOOTSTRAP_ENV = "KAFKAESQUE_BOOTSTRAP"
PASSWORD_ENV = "KAFKAESQUE_MQTT_PASSWORD"
CLUSTER_PASSWORD_ENV = PASSWORD_ENV_OF_CLIENTS


class MqttBridgeError(Exception):
    """The bridge was configured wrongly or cannot run; the message says why."""


def add_parser(commands: Any) -> None:
    """Register ``mqtt-bridge`` on ``commands``."""
    p = commands.add_parser(
        "mqtt-bridge",
        help="bridge an existing MQTT broker into log topics (and back)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--upstream", required=True, help="the MQTT broker, host:port (port 1883)")
    p.add_argument(
        "--bootstrap",
        default=os.environ.get(BOOTSTRAP_ENV, DEFAULT_BOOTSTRAP),
        help=f"Kafkaesque brokers, host:port,... (default ${BOOTSTRAP_ENV} or {DEFAULT_BOOTSTRAP})",
    )
    p.add_argument("--rules", help="mapping rules file (default: '# -> mqtt key=topic')")
    p.add_argument(
        "--subscribe",
        action="append",
        default=[],
        metavar="FILTER",
        help="MQTT topic filter to subscribe (repeatable; default: the rules' filters)",
    )
    p.add_argument("--share-group", help="subscribe as $share/<group>/<filter>")
    p.add_argument(
        "--connections",
        type=int,
        default=1,
        help="upstream connections, each a member of --share-group (needed above 1), each "
        "client id but the first suffixed -1, -2, ... (default 1): an upstream broker reads "
        "each connection's acknowledgements in turn with its other clients', so one "
        "connection bounds one bridge's rate",
    )
    p.add_argument("--client-id", default="kafkaesque-bridge", help="MQTT client id (stable!)")
    p.add_argument("--username", help="MQTT user name")
    p.add_argument("--password", help=f"MQTT password (or ${PASSWORD_ENV})")
    p.add_argument(
        "--upstream-tls",
        action="store_true",
        help="TLS to the upstream broker (verified against the system CAs or --upstream-cafile)",
    )
    p.add_argument("--upstream-cafile", help="CA (PEM) of the upstream's certificate; implies TLS")
    p.add_argument("--upstream-certfile", help="client certificate (PEM) for the upstream")
    p.add_argument("--upstream-keyfile", help="its key (PEM; default: in --upstream-certfile)")
    p.add_argument("--converter", choices=CONVERTER_NAMES, default="raw")
    p.add_argument("--avro-schema", help="Avro schema file (JSON) for --converter avro")
    p.add_argument("--dead-letter-topic", help="log topic for refused payloads (else dropped)")
    p.add_argument(
        "--to-mqtt", default="", metavar="LOGTOPIC[,LOGTOPIC]", help="publish these back upstream"
    )
    p.add_argument("--egress-group", default="mqtt-bridge", help="consumer group of --to-mqtt")
    p.add_argument("--mqtt-version", choices=("3.1.1", "5"), default="5")
    p.add_argument("--keep-alive", type=int, default=30, help="seconds (default 30)")
    p.add_argument(
        "--session-expiry",
        type=int,
        default=DEFAULT_SESSION_EXPIRY_S,
        help="seconds the upstream keeps our session while we are away (MQTT 5)",
    )
    p.add_argument(
        "--receive-maximum",
        type=int,
        default=DEFAULT_RECEIVE_MAXIMUM,
        help=f"QoS 1 messages in flight (default {DEFAULT_RECEIVE_MAXIMUM})",
    )
    p.add_argument("--partitions", type=int, default=3, help="for log topics created on use")
    p.add_argument("--replication-factor", type=int, default=3)
    p.add_argument("--drain-timeout", type=float, default=10.0, help="seconds, on stop")
    p.add_argument("--stats-interval", type=float, default=10.0, help="seconds, 0: never")
    add_cluster_security_options(p)
    p.set_defaults(run=run_mqtt_bridge)


def add_cluster_security_options(parser: argparse.ArgumentParser, *, tls_flag: bool = True) -> None:
    """How a command that also speaks MQTT (its own ``--password``) reaches the cluster: the
    client commands' ``--tls`` (unless ``tls_flag`` is False: the command's ``--tls`` is about
    MQTT), ``--tls-ca``, ``--tls-cert``, ``--user``, ``--sasl-mechanism``, and the password as
    ``--cluster-password`` (or $KAFKAESQUE_PASSWORD)."""
    group = parser.add_argument_group("cluster security", "TLS and authentication to the cluster")
    if tls_flag:
        group.add_argument(
            "--tls", action="store_true", help="TLS to the cluster (system CAs, or --tls-ca's)"
        )
    group.add_argument("--tls-ca", metavar="FILE", help="the cluster's CA (PEM); implies TLS")
    group.add_argument("--tls-cert", metavar="FILE", help="client certificate (PEM, with its key)")
    group.add_argument(
        "--user",
        default=os.environ.get(USER_ENV) or None,
        metavar="NAME",
        help=f"authenticate to the cluster as NAME (${USER_ENV})",
    )
    group.add_argument(
        "--cluster-password", help=f"the cluster user's password (default ${CLUSTER_PASSWORD_ENV})"
    )
    group.add_argument(
        "--sasl-mechanism",
        default="SCRAM-SHA-256",
        choices=("SCRAM-SHA-256", "PLAIN"),
        type=str.upper,
        help="SCRAM-SHA-256 (default) or PLAIN (only with TLS)",
    )


def cluster_security(args: argparse.Namespace, *, tls_flag: bool = True) -> Security:
    """The ``Security`` of ``add_cluster_security_options`` (``ValueError`` if it cannot
    work: a user without a password, PLAIN without TLS). ``tls_flag`` as there."""
    options = argparse.Namespace(
        tls=args.tls if tls_flag else False,
        tls_ca=args.tls_ca,
        tls_cert=args.tls_cert,
        user=args.user,
        password=args.cluster_password,
        sasl_mechanism=args.sasl_mechanism,
    )
    try:
        security: Security = security_from_args(options)
    except SecurityCommandError as exc:
        raise ValueError(f"cluster security: {exc}") from None
    return security


def _address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep:
        return text, 1883
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise MqttBridgeError(f"--upstream must be host:port, not {text!r}")
    return host, int(port)


def build_config(args: argparse.Namespace) -> BridgeConfig:
    """The ``BridgeConfig`` the arguments describe; ``MqttBridgeError`` if they are wrong."""
    host, port = _address(args.upstream)
    mapping = TopicMapping.default()
    if args.rules:
        try:
            rules = Path(args.rules)
            mapping = TopicMapping.parse(rules.read_text(encoding="utf-8"), rules.parent)
        except (OSError, InvalidMappingError) as exc:
            raise MqttBridgeError(f"--rules {args.rules}: {exc}") from None
    for topic_filter in args.subscribe:
        try:
            validate_mqtt_topic_filter(topic_filter)
        except InvalidMqttTopicError as exc:
            raise MqttBridgeError(f"--subscribe {topic_filter!r}: {exc}") from None
        if topic_filter.startswith("$share/") and args.share_group:
            raise MqttBridgeError("--subscribe $share/... and --share-group: choose one")
    if args.share_group is not None and (
        not args.share_group or any(c in args.share_group for c in "/+#")
    ):
        raise MqttBridgeError("--share-group must be non-empty, without '/', '+' or '#'")
    if args.connections < 1:
        raise MqttBridgeError("--connections must be at least 1")
    if args.connections > 1 and args.share_group is None:
        raise MqttBridgeError(
            "--connections above 1 needs --share-group: each connection would receive every message"
        )
    tls = None
    if args.upstream_tls or args.upstream_cafile or args.upstream_certfile:
        try:
            tls = client_context(
                args.upstream_cafile, cert=args.upstream_certfile, key=args.upstream_keyfile
            )
        except (OSError, ssl.SSLError, ValueError) as exc:
            raise MqttBridgeError(f"--upstream TLS: cannot load the certificates: {exc}") from None
    elif args.upstream_keyfile:
        raise MqttBridgeError("--upstream-keyfile needs --upstream-certfile")
    try:
        converter = make_converter(args.converter, args.avro_schema)
        password = args.password or os.environ.get(PASSWORD_ENV)
        options = MqttClientOptions(
            host,
            port,
            args.client_id,
            version=MqttVersion.V5 if args.mqtt_version == "5" else MqttVersion.V311,
            username=args.username,
            password=None if password is None else password.encode(),
            keep_alive_s=args.keep_alive,
            session_expiry_s=args.session_expiry,
            receive_maximum=args.receive_maximum,
            tls=tls,
        )
        client = ClientConfig(security=cluster_security(args))
    except ValueError as exc:
        raise MqttBridgeError(str(exc)) from None
    return BridgeConfig(
        mqtt=options,
        bootstrap=args.bootstrap,
        mapping=mapping,
        subscriptions=tuple(args.subscribe),
        share_group=args.share_group,
        connections=args.connections,
        converter=converter,
        dead_letter_topic=args.dead_letter_topic,
        to_mqtt=tuple(t for t in args.to_mqtt.split(",") if t),
        egress_group=args.egress_group,
        partitions=args.partitions,
        replication_factor=args.replication_factor,
        client=client,
    )


def run_mqtt_bridge(args: argparse.Namespace) -> int:
    config = build_config(args)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s"
    )
    try:
        trio.run(_serve, config, args.drain_timeout, args.stats_interval)
    except BridgeError as exc:
        raise MqttBridgeError(str(exc)) from None
    return 0


async def _serve(config: BridgeConfig, drain_timeout: float, stats_interval: float) -> None:
    bridge = MqttBridge(config)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_on_signals, bridge, nursery.cancel_scope, drain_timeout)
        if stats_interval > 0:
            nursery.start_soon(_print_stats, bridge, stats_interval)
        await nursery.start(_run_and_stop, bridge, nursery.cancel_scope)
        if not bridge.stopping:
            print("ready", flush=True)


async def _run_and_stop(
    bridge: MqttBridge,
    scope: trio.CancelScope,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    await bridge.run(task_status=task_status)
    scope.cancel()  # stopped: end the signal and stats tasks too


async def _on_signals(bridge: MqttBridge, scope: trio.CancelScope, drain_timeout: float) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            if bridge.stopping:
                scope.cancel()  # a second signal: stop now
                return
            print("stopping", file=sys.stderr, flush=True)
            bridge.stop()
            scope.deadline = trio.current_time() + drain_timeout


def stats_line(stats: BridgeStats) -> str:
    """The counters as words and numbers (``received 10, appended 10, ...``), not a repr."""
    return ", ".join(
        f"{field.name.replace('_', ' ')} {getattr(stats, field.name):,}"
        for field in dataclasses.fields(stats)
    )


async def _print_stats(bridge: MqttBridge, interval: float) -> None:
    while True:
        await trio.sleep(interval)
        print(f"mqtt-bridge: {stats_line(bridge.stats)}", file=sys.stderr, flush=True)
