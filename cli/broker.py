"""``kafkaesque broker``: run one broker in the foreground until Ctrl-C or SIGTERM.

Settings come from a TOML file (``--config``, keys named as ``BrokerConfig``'s fields) and/or
flags, flags winning. Addresses of the cluster's brokers use Kafka's ``id@host:port`` lists::

    kafkaesque broker --id 0 --data-dir data --client 127.0.0.1:9092 \\
        --peers 0@127.0.0.1:9093,1@127.0.0.1:9103,2@127.0.0.1:9113 \\
        --controllers 0@127.0.0.1:9094,1@127.0.0.1:9104,2@127.0.0.1:9114 \\
        --admin 127.0.0.1:9095

Once every listener is bound it prints one line, ``broker <id> client=<host:port> ...``, then
``ready``; the cluster command and the tests wait for that line. A broker started with ``--join``
says ``ready`` only once the cluster has admitted it (``kafkaesque broker add``, the line
command ``ADDBROKER``) and its registration is applied: until then it says on stderr how to admit
it.

Stopping. SIGTERM stops gracefully: the broker stops accepting client connections, hands every
partition leadership it holds (and the controller quorum's, if it leads it) to an up-to-date
replica, waits until each has a leader elsewhere (at most ``--shutdown-timeout`` seconds, 5 by
default), then stops. Meanwhile its client connections drain: each finishes the requests it had
taken (writes forwarded to the new leaders; long polls answered at once), answers a request read
after that with the retriable ``NOT_READY``, and closes; an MQTT 5 device gets DISCONNECT 0x8B
(docs/operations.md, "Graceful shutdown and rolling restarts"). SIGINT (Ctrl-C), or a second
SIGTERM during the hand-over, stops at once, as a crash would look to the others (elections
follow).

Security (docs/security.md). ``--client-tls``, ``--admin-tls`` and ``--peer-tls`` put TLS on
the client port (TLS only: a plaintext client is told so and closed), the admin port (HTTPS) and
the Raft transport between brokers (mutual TLS over ``--tls-ca``), with the certificate
``--tls-cert``/``--tls-key``, re-read for new client and admin connections when its files
change. The controller quorum's traffic is encrypted by pysyncobj with the cluster secret
(``$KAFKAESQUE_CLUSTER_SECRET``). Safe defaults: a broker that listens beyond loopback
(0.0.0.0 and :: included) without ``--users-file`` (MQTT listeners: also ``--mqtt-users``), or
with the built-in development cluster secret, refuses to start unless ``--insecure``; a broker
without a users file says at start that anyone who can reach its client port may do anything.

While it runs, the broker keeps its pid in ``<data-dir>/<id>/broker.pid``;
``kafkaesque broker stop --data-dir <dir> --id <id>`` (or ``--config``) sends it SIGTERM and
waits until it has stopped.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import signal
import sys
import time
from typing import Any

import trio

from kafkaesque.broker import (
    DECOMMISSION_TIMEOUT_S,
    DEFAULT_SHUTDOWN_TIMEOUT_S,
    Broker,
    BrokerConfig,
    ConfigError,
    config_from_mapping,
    load_config,
    open_warning,
)
from kafkaesque.client import Client, ClientConfig, KafkaesqueError, Security
from kafkaesque.protocol import ErrorReply, OkReply, RemoveBroker
from kafkaesque.raft.driver import FsyncHelperDied

_FLAGS = {
    "id": "id",
    "data_dir": "data_dir",
    "client": "client",
    "peers": "peers",
    "controllers": "controllers",
    "admin": "admin",
    "mqtt": "mqtt",
    "mqtt_rules": "mqtt_rules",
    "mqtt_users": "mqtt_users",
    "mqtt_tls": "mqtt_tls",
    "mqtt_tls_cert": "mqtt_tls_cert",
    "mqtt_tls_key": "mqtt_tls_key",
    "mqtt_tls_client_ca": "mqtt_tls_client_ca",
    "mqtt_ws": "mqtt_ws",
    "kafka": "kafka",
    "http": "http",
    "mqtt_partitions": "mqtt_partitions",
    "mqtt_replication_factor": "mqtt_replication_factor",
    "advertised_host": "advertised_host",
    "join": "join",
    "auto_create_topics": "auto_create_topics",
    "default_partitions": "default_partitions",
    "default_replication_factor": "default_replication_factor",
    "write_timeout": "write_timeout_s",
    "segment_bytes": "segment_bytes",
    "fsync": "fsync",
    "fsync_interval_ms": "fsync_interval_ms",
    "retention_check_interval": "retention_check_interval_s",
    "session_timeout": "group_session_timeout_s",
    "group_initial_rebalance_delay": "group_initial_rebalance_delay_s",
    "max_line_length": "max_line_length",
    "max_payload": "max_payload",
    "leader_balance_rate": "leader_balance_rate",
    "tls_cert": "tls_cert",
    "tls_key": "tls_key",
    "tls_ca": "tls_ca",
    "client_tls": "client_tls",
    "admin_tls": "admin_tls",
    "peer_tls": "peer_tls",
    "kafka_tls": "kafka_tls",
    "http_tls": "http_tls",
    "users_file": "users_file",
    "super_users": "super_users",
    "mqtt_acl_file": "mqtt_acl_file",
    "insecure": "insecure",
    "auth_failure_limit": "auth_failure_limit",
    "auth_failure_window": "auth_failure_window_s",
}


_PARENT_CHECK_S = 0.5
PID_FILE = "broker.pid"
"""In the broker's own directory (``<data-dir>/<id>``) while it runs: its process id."""
_STOP_MARGIN_S = 10.0  # `broker stop` waits the shutdown timeout and this much more
_STOP_POLL_S = 0.05

log = logging.getLogger("kafkaesque.cli.broker")


class BrokerCommandError(Exception):
    """The broker could not start; the message says why."""


# The options each action reads, for its own --help (``broker stop --help`` lists these only,
# not the forty a broker's start takes).
_ACTION_OPTIONS: dict[str, tuple[str, ...]] = {
    "stop": ("--data-dir", "--id", "--config", "--shutdown-timeout"),
    "remove": ("broker_id", "--bootstrap", "--user", "--password", "--tls-ca"),
    "add": ("broker_id", "peer", "controller", "--bootstrap", "--user", "--password", "--tls-ca"),
}


class _ActionHelp(argparse.Action):
    """``-h``/``--help``: after ``stop`` or ``remove``, only that action's options; else all."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        action = getattr(namespace, "action", None)
        if action in _ACTION_OPTIONS:
            _action_parser(parser, action).print_help()
        else:
            parser.print_help()
        parser.exit()


def _action_parser(broker: argparse.ArgumentParser, action: str) -> argparse.ArgumentParser:
    """A parser for ``kafkaesque broker <action>`` holding copies of that action's arguments."""
    first = (broker.description or "").split("\n\n")[0]
    own = argparse.ArgumentParser(
        prog=f"{broker.prog} {action}", description=_ACTION_HELP[action] or first
    )
    wanted = _ACTION_OPTIONS[action]
    for arg in broker._actions:
        names = arg.option_strings or [arg.dest]
        if any(name in wanted for name in names):
            own._add_action(arg)
    return own


_ACTION_HELP = {
    "stop": "SIGTERM the broker running with this --data-dir and --id (or --config), found by "
    "its broker.pid, and wait until it has handed its leaderships over and stopped.",
    "remove": "Decommission a broker (REMOVEBROKER): its replicas move to the other brokers, "
    "then it leaves the controller quorum and the registry; stop it afterwards.",
    "add": "Admit a broker started with --join (ADDBROKER): it joins the controller quorum, "
    "registers, and every broker connects to its Raft transport (peer) address; then move "
    "partitions onto it with `kafkaesque topic reassign`.",
}


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "broker",
        help="run one broker",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        add_help=False,
    )
    parser.add_argument("-h", "--help", action=_ActionHelp, help="show this help and exit")
    parser.add_argument(
        "action",
        nargs="?",
        choices=("stop", "remove", "add"),
        help="stop: SIGTERM the broker running with this --data-dir and --id (or --config), "
        "found by its broker.pid, and wait until it has handed its leaderships over and stopped; "
        "remove <id>: decommission broker <id> (REMOVEBROKER: its replicas move to the other "
        "brokers, then it leaves the controller quorum and the registry; stop it afterwards); "
        "add <id> <peer host:port> <controller host:port>: admit a broker started with --join "
        "(ADDBROKER)",
    )
    parser.add_argument(
        "broker_id", nargs="?", type=int, help="remove, add: the broker to remove or admit"
    )
    parser.add_argument(
        "peer", nargs="?", help="add: where the new broker's Raft transport listens (host:port)"
    )
    parser.add_argument(
        "controller", nargs="?", help="add: where the new broker's controller listens (host:port)"
    )
    parser.add_argument(
        "--bootstrap",
        default=os.environ.get("KAFKAESQUE_BOOTSTRAP") or "127.0.0.1:9092",
        metavar="HOST:PORT,...",
        help="remove, add: brokers to start from ($KAFKAESQUE_BOOTSTRAP, else 127.0.0.1:9092)",
    )
    parser.add_argument(
        "--user",
        default=os.environ.get("KAFKAESQUE_USER") or None,
        metavar="NAME",
        help="remove, add: authenticate as NAME ($KAFKAESQUE_USER; the password from --password "
        "or $KAFKAESQUE_PASSWORD); needs the cluster's admin right (docs/security.md)",
    )
    parser.add_argument(
        "--password", help="remove, add: the user's password (default $KAFKAESQUE_PASSWORD)"
    )
    parser.add_argument("--config", help="a TOML file of settings")
    parser.add_argument("--id", type=int, help="this broker's id")
    parser.add_argument("--data-dir", help="data directory (partitions in <dir>/<id>/...)")
    parser.add_argument("--client", help="host:port for clients (line protocol)")
    parser.add_argument("--peers", help="Raft transport of every broker: id@host:port,...")
    parser.add_argument("--controllers", help="controller quorum of every broker: id@host:port,...")
    parser.add_argument("--admin", help="host:port for /metrics")
    parser.add_argument(
        "--mqtt-listen", "--mqtt", dest="mqtt", help="host:port for MQTT devices (off if absent)"
    )
    parser.add_argument(
        "--kafka-listen",
        "--kafka",
        dest="kafka",
        metavar="HOST:PORT|off",
        help="host:port for Kafka clients (docs/kafka.md; default: the client host, port + 100; "
        "off: none)",
    )
    parser.add_argument(
        "--http-listen",
        "--http",
        dest="http",
        metavar="HOST:PORT|off",
        help="host:port for the REST API (docs/http.md; default: the client host, port + 200; "
        "off: none)",
    )
    parser.add_argument("--mqtt-rules", help="a file of MQTT topic mapping rules (docs/mqtt.md)")
    parser.add_argument(
        "--mqtt-users",
        help="devices' salted users, the --users-file format (`kafkaesque user add`; absent: "
        "anonymous devices)",
    )
    parser.add_argument(
        "--mqtt-tls-listen", dest="mqtt_tls", help="host:port for MQTT over TLS (off if absent)"
    )
    parser.add_argument("--mqtt-tls-cert", help="the broker's certificate chain (PEM)")
    parser.add_argument("--mqtt-tls-key", help="its private key (PEM; absent: in the cert file)")
    parser.add_argument(
        "--mqtt-tls-client-ca", help="require device certificates signed by this CA (PEM)"
    )
    parser.add_argument(
        "--mqtt-ws-listen", dest="mqtt_ws", help="host:port for MQTT over WebSocket (off if absent)"
    )
    parser.add_argument(
        "--mqtt-partitions", type=int, help="partitions of log topics MQTT creates (6)"
    )
    parser.add_argument(
        "--mqtt-replication-factor", type=int, help="replicas of log topics MQTT creates (3)"
    )
    parser.add_argument("--advertised-host", help="the host name clients are told")
    parser.add_argument("--join", action="store_true", default=None, help="join a running cluster")
    parser.add_argument(
        "--no-auto-create-topics",
        dest="auto_create_topics",
        action="store_false",
        default=None,
        help="a publish or SUBS naming a missing topic answers UNKNOWN_TOPIC (default: creates it)",
    )
    parser.add_argument(
        "--default-partitions", type=int, help="partitions of auto-created topics (3)"
    )
    parser.add_argument(
        "--default-replication-factor",
        type=int,
        help="replicas of auto-created topics, capped at the brokers registered (3)",
    )
    parser.add_argument("--write-timeout", type=float, help="seconds a write may wait (10)")
    parser.add_argument("--segment-bytes", type=int, help="roll segments at this size (64 MiB)")
    parser.add_argument(
        "--fsync",
        choices=("always", "interval", "never"),
        help="when partition logs are fsynced: before acknowledging (always, the default), every "
        "--fsync-interval-ms, or when the OS decides; a topic's fsync= overrides it "
        "(docs/operations.md)",
    )
    parser.add_argument(
        "--fsync-interval-ms", type=int, help="fsync period of --fsync interval (1000)"
    )
    parser.add_argument(
        "--retention-check-interval", type=float, help="seconds between retention passes (30)"
    )
    parser.add_argument(
        "--session-timeout", type=float, help="seconds before a silent group member leaves (10)"
    )
    parser.add_argument(
        "--group-initial-rebalance-delay",
        type=float,
        help="seconds a new Kafka consumer group waits for more members before its first "
        "generation (3, as Kafka's group.initial.rebalance.delay.ms)",
    )
    parser.add_argument(
        "--leader-balance-rate",
        type=float,
        help="leader transfers a second this broker may start to give partitions back to their "
        "preferred replicas (50; 0: no balancing)",
    )
    parser.add_argument("--max-line-length", type=int, help="longest command line (64 KiB)")
    parser.add_argument("--max-payload", type=int, help="largest binary payload (8 MiB)")
    parser.add_argument(
        "--shutdown-timeout",
        type=float,
        default=DEFAULT_SHUTDOWN_TIMEOUT_S,
        help="seconds a SIGTERM spends handing leaderships over before stopping "
        f"({DEFAULT_SHUTDOWN_TIMEOUT_S:g}; 0: stop at once)",
    )
    security = parser.add_argument_group("security (docs/security.md)")
    security.add_argument("--tls-cert", help="this broker's certificate chain (PEM)")
    security.add_argument("--tls-key", help="its private key (PEM; default: in --tls-cert)")
    security.add_argument("--tls-ca", help="the CA that signs the cluster's certificates (PEM)")
    for flag, what in (
        ("--client-tls", "the client port speaks TLS (only)"),
        ("--admin-tls", "the admin port (/metrics) speaks HTTPS"),
        ("--peer-tls", "brokers talk mutual TLS over --tls-ca"),
        ("--kafka-tls", "the Kafka port speaks TLS (only): SASL_SSL, and PLAIN is offered"),
        ("--http-tls", "the REST port speaks HTTPS (only): HTTP Basic is offered"),
    ):
        security.add_argument(flag, action="store_true", default=None, help=what)
    security.add_argument(
        "--users-file",
        help="SCRAM-SHA-256 users (`kafkaesque user add`): clients must AUTH (off if absent)",
    )
    security.add_argument(
        "--super-users",
        type=lambda text: tuple(p.strip() for p in text.split(",") if p.strip()),
        metavar="User:NAME,...",
        help="principals every ACL check lets through (as Kafka's super.users)",
    )
    security.add_argument(
        "--auth-failure-limit",
        type=int,
        help="failed logins (AUTH, MQTT CONNECT) an address may make per --auth-failure-window "
        "before it is refused unheard (10; 0: no limit)",
    )
    security.add_argument(
        "--auth-failure-window", type=float, help="seconds the failure limit counts over (60)"
    )
    security.add_argument(
        "--mqtt-acl-file", help="MQTT ACLs in mosquitto's acl_file format (off if absent)"
    )
    security.add_argument(
        "--insecure",
        action="store_true",
        default=None,
        help="listen beyond loopback without authentication or with the development secret",
    )
    parser.add_argument("--log-level", default="WARNING", help="logging level (WARNING)")
    parser.add_argument(
        "--exit-with-parent",
        action="store_true",
        help="stop when the process that started this broker exits (for harnesses)",
    )
    parser.set_defaults(run=run)


def config_of(args: argparse.Namespace) -> BrokerConfig:
    values = {field: getattr(args, flag) for flag, field in _FLAGS.items()}
    values = {k: v for k, v in values.items() if v is not None}
    secret = os.environ.get("KAFKAESQUE_CLUSTER_SECRET")
    if secret:
        values["cluster_secret"] = secret
    try:
        if args.config:
            return load_config(args.config, values)
        return config_from_mapping(values)
    except ConfigError as exc:
        raise BrokerCommandError(str(exc)) from exc


_GIL_SWITCH_INTERVAL_S = 0.0005


def run(args: argparse.Namespace) -> int:
    if args.action == "stop":
        return stop(args)
    if args.action == "remove":
        return remove(args)
    if args.action == "add":
        return add(args)
    if args.broker_id is not None:
        raise BrokerCommandError(f"unexpected argument {args.broker_id} (only for remove, add)")
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.WARNING),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    config = config_of(args)
    shutdown_timeout = float(args.shutdown_timeout)
    if not shutdown_timeout >= 0:  # also refuses NaN
        raise BrokerCommandError(f"--shutdown-timeout must be >= 0, not {args.shutdown_timeout}")
    # A broker allocates a few short-lived objects per record; with the default threshold
    # (700) the cyclic collector runs thousands of times a second under load, for nothing:
    # almost nothing here forms cycles. Measured: ~20% more records per broker CPU-second.
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)
    # A thread that wants the GIL (the controller's, a group commit's that saves the hard
    # state) waits for the switch interval (5 ms by default) while the loop is busy: such waits
    # around each fsync were most of a write's latency under load, before the logs' fsyncs
    # moved to a helper process.
    sys.setswitchinterval(_GIL_SWITCH_INTERVAL_S)
    try:
        trio.run(_serve, config, args.exit_with_parent, shutdown_timeout)
    except (OSError, ConfigError) as exc:
        raise BrokerCommandError(f"cannot start broker {config.id}: {exc}") from exc
    except BaseExceptionGroup as group:
        died: BaseException | None = group.subgroup(FsyncHelperDied)
        if died is None:
            raise
        while isinstance(died, BaseExceptionGroup):  # the first one, wherever it is nested
            died = died.exceptions[0]
        raise BrokerCommandError(f"broker {config.id} stopped: {died}") from group
    return 0


async def _serve(
    config: BrokerConfig,
    exit_with_parent: bool = False,
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT_S,
) -> None:
    unstarted = Broker(config)  # reads its files (rules, users, certificates): ConfigError
    pid_file: str | None = None
    try:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                broker: Broker = await nursery.start(unstarted.run)
                if exit_with_parent:
                    nursery.start_soon(_watch_parent, os.getppid(), nursery.cancel_scope)
                print(_listening(config, broker), flush=True)
                warning = open_warning(config, broker.client_port)
                if warning is not None:  # also logged; said here whatever the log level
                    print(warning, file=sys.stderr, flush=True)
                pid_file = _write_pid_file(config)
                if config.join:
                    # Listening is not being a member: `ready` is said once the cluster admitted
                    # this broker (its registration is applied here), not before.
                    nursery.start_soon(_say_ready_once_admitted, config, broker)
                else:
                    print("ready", flush=True)
                draining = False
                async for signum in signals:
                    if signum == signal.SIGTERM and not draining and shutdown_timeout > 0:
                        draining = True
                        nursery.start_soon(_stop_gracefully, broker, shutdown_timeout, nursery)
                        continue
                    if draining:
                        print(
                            f"broker {config.id}: stopping at once (a second signal)",
                            file=sys.stderr,
                            flush=True,
                        )
                    nursery.cancel_scope.cancel()
                    break
    finally:
        if pid_file is not None:
            _remove_pid_file(pid_file)
    print(f"broker {config.id} stopped", file=sys.stderr, flush=True)


def _listening(config: BrokerConfig, broker: Broker) -> str:
    """The line that says where the broker listens: ``broker <id> client=<host:port> ...``."""
    parts = [f"broker {config.id}", f"client={config.client.host}:{broker.client_port}"]
    parts.append(f"peer={config.peers[config.id]}")
    parts.append(f"controller={config.controllers[config.id]}")
    if broker.admin_port is not None and config.admin is not None:
        parts.append(f"admin={config.admin.host}:{broker.admin_port}")
    if broker.mqtt_port is not None and config.mqtt is not None:
        parts.append(f"mqtt={config.mqtt.host}:{broker.mqtt_port}")
    if broker.mqtt is not None and config.mqtt_tls is not None:
        parts.append(f"mqtt_tls={config.mqtt_tls.host}:{broker.mqtt.tls_port}")
    if broker.mqtt is not None and config.mqtt_ws is not None:
        parts.append(f"mqtt_ws={config.mqtt_ws.host}:{broker.mqtt.ws_port}")
    kafka = config.kafka_listener
    if broker.kafka_port is not None and kafka is not None:
        parts.append(f"kafka={kafka.host}:{broker.kafka_port}")
    http = config.http_listener
    if broker.http_port is not None and http is not None:
        parts.append(f"http={http.host}:{broker.http_port}")
    return " ".join(parts)


def _write_pid_file(config: BrokerConfig) -> str:
    """Put this process's id in ``<broker dir>/broker.pid`` (whole, by a rename); its path."""
    path = os.path.join(config.broker_dir, PID_FILE)
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w", encoding="ascii") as f:
        f.write(f"{os.getpid()}\n")
    os.replace(temporary, path)
    return path


def _remove_pid_file(path: str) -> None:
    """Remove ``path`` if it still holds this process's id (a broker started since keeps its)."""
    try:
        with open(path, encoding="ascii") as f:
            if f.read().strip() != str(os.getpid()):
                return
        os.remove(path)
    except OSError:
        pass  # gone already, or unreadable: nothing of ours to remove


REMOVE_TIMEOUT_S = DECOMMISSION_TIMEOUT_S + 30.0
"""How long ``broker remove`` waits for the answer (the broker's own bound, and a margin)."""


def remove(args: argparse.Namespace) -> int:
    """``kafkaesque broker remove <id>``: send ``REMOVEBROKER <id>`` to a broker other than
    the one leaving (the leaving one would pass it on: one hop less) and print what moved."""
    leaving = args.broker_id
    if leaving is None:
        raise BrokerCommandError("broker remove needs the id of the broker to remove")
    if args.peer is not None:
        raise BrokerCommandError(f"unexpected argument {args.peer} (only for add)")
    with _cluster_client(args) as client:
        try:
            brokers = client.refresh_metadata().brokers
        except KafkaesqueError as exc:
            raise BrokerCommandError(f"cannot reach the cluster: {exc}") from exc
        if leaving not in brokers:
            raise BrokerCommandError(f"no broker {leaving} is registered")
        others = [(b.host, b.port) for i, b in sorted(brokers.items()) if i != leaving]
        problem = f"no broker other than {leaving} is registered"
        for address in others:
            try:
                reply = client.connection(address).request(RemoveBroker(leaving), REMOVE_TIMEOUT_S)
            except KafkaesqueError as exc:
                problem = f"broker at {address[0]}:{address[1]}: {exc}"
                continue
            if isinstance(reply, OkReply):
                moved = reply.text.removeprefix("moved=")
                print(f"removed broker {leaving} ({moved} partitions moved); stop it now")
                return 0
            if isinstance(reply, ErrorReply):
                raise BrokerCommandError(f"{reply.code.name}: {reply.message}")
            problem = f"unexpected answer {reply!r:.200}"
        raise BrokerCommandError(f"broker {leaving} was not removed: {problem}")


def _cluster_client(args: argparse.Namespace) -> Client:
    """A client of ``--bootstrap`` as ``--user``/``--password`` (and ``--tls-ca``: TLS) say."""
    user = args.user
    password = args.password or os.environ.get("KAFKAESQUE_PASSWORD")
    if user and password is None:
        raise BrokerCommandError(
            f"--user {user} needs a password: --password, or set $KAFKAESQUE_PASSWORD"
        )
    tls = args.tls_ca is not None
    try:
        security = Security(
            protocol=("SASL_" if user else "") + ("SSL" if tls else "PLAINTEXT"),
            username=user or None,
            password=password if user else None,
            ssl_cafile=args.tls_ca,
        )
        return Client(args.bootstrap, config=ClientConfig(security=security))
    except ValueError as exc:
        raise BrokerCommandError(f"--bootstrap: {exc}") from exc


def _address_arg(value: str | None, what: str) -> str:
    """``value`` if it is ``host:port`` (a port 1-65535), else a clear error."""
    if value is None:
        raise BrokerCommandError(
            f"broker add needs the new broker's {what} address: "
            "broker add <id> <peer host:port> <controller host:port>"
        )
    host, colon, port = value.rpartition(":")
    if not (colon and host and port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        raise BrokerCommandError(f"{what} address {value!r} is not host:port")
    return value


def add(args: argparse.Namespace) -> int:
    """``kafkaesque broker add <id> <peer> <controller>``: admit a broker started with
    ``--join`` (``ADDBROKER``), then wait until it is registered; exit 1 if it is a member
    already (nothing to do: ``ADDBROKER`` would answer ``+OK``, which hides a typo'd id)."""
    joining = args.broker_id
    if joining is None:
        raise BrokerCommandError(
            "broker add needs the id of the broker to admit: "
            "broker add <id> <peer host:port> <controller host:port>"
        )
    peer = _address_arg(args.peer, "peer (Raft transport)")
    controller = _address_arg(args.controller, "controller")
    with _cluster_client(args) as client:
        brokers = client.refresh_metadata().brokers
        if joining in brokers:
            known = brokers[joining]
            raise BrokerCommandError(
                f"broker {joining} is already a member of the cluster (clients at "
                f"{known.host}:{known.port}); nothing to do"
            )
        client.add_broker(joining, peer, controller)
        deadline = time.monotonic() + ADD_REGISTER_TIMEOUT_S
        while joining not in client.refresh_metadata().brokers:
            if time.monotonic() > deadline:
                print(
                    f"admitted broker {joining}; it has not registered yet (is it running, "
                    f"started with --join?): `kafkaesque status` shows it once it has"
                )
                return 0
            time.sleep(_ADD_POLL_S)
    print(
        f"added broker {joining} (peer {peer}, controller {controller}); move partitions onto "
        f"it with `kafkaesque topic reassign <topic> <partition> <brokers>`"
    )
    return 0


ADD_REGISTER_TIMEOUT_S = 30.0
"""How long ``broker add`` waits for the admitted broker to register before saying so."""
_ADD_POLL_S = 0.1


def stop(args: argparse.Namespace) -> int:
    """``kafkaesque broker stop``: SIGTERM the broker of ``--data-dir``/``--id`` (or
    ``--config``) found by its pid file, and wait until its process is gone."""
    if args.config:
        try:
            config = load_config(args.config)
        except ConfigError as exc:
            raise BrokerCommandError(str(exc)) from exc
        data_dir = args.data_dir or config.data_dir
        broker_id = config.id if args.id is None else args.id
    else:
        if args.data_dir is None or args.id is None:
            raise BrokerCommandError("broker stop needs --data-dir and --id (or --config)")
        data_dir, broker_id = args.data_dir, args.id
    path = os.path.join(data_dir, str(broker_id), PID_FILE)
    try:
        with open(path, encoding="ascii") as f:
            pid = int(f.read().strip())
    except FileNotFoundError:
        raise BrokerCommandError(f"no broker {broker_id} runs on {data_dir} (no {path})") from None
    except (OSError, ValueError) as exc:
        raise BrokerCommandError(f"cannot read {path}: {exc}") from exc
    if not _running(pid) or not _is_broker(pid):
        raise BrokerCommandError(
            f"broker {broker_id} (pid {pid}, from {path}) is not running: it was killed"
        )
    started = time.monotonic()
    os.kill(pid, signal.SIGTERM)
    deadline = started + float(args.shutdown_timeout) + _STOP_MARGIN_S
    while _running(pid):
        if time.monotonic() >= deadline:
            raise BrokerCommandError(
                f"broker {broker_id} (pid {pid}) did not stop in {deadline - started:g} s"
            )
        time.sleep(_STOP_POLL_S)
    print(f"broker {broker_id} (pid {pid}) stopped in {time.monotonic() - started:.2f} s")
    return 0


def _is_broker(pid: int) -> bool:
    """Whether process ``pid`` is a ``kafkaesque broker`` (a pid file left by a killed broker
    may name a process started since); True where ``/proc`` cannot tell."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            words = f.read().split(b"\0")
    except OSError:
        return True
    return b"broker" in words and any(b"kafkaesque" in word for word in words)


def _running(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, ended and not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: it runs
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return True  # no /proc: kill(0) said it exists


async def _say_ready_once_admitted(config: BrokerConfig, broker: Broker) -> None:
    """For a ``--join`` broker: say how to admit it (stderr), then ``ready`` once it is a member.

    It becomes one when a member runs ``ADDBROKER`` (``kafkaesque broker add``): its controller
    is then let into the quorum, catches up, and its registration is applied here
    (``Broker.wait_ready``); until then it answers ``NOT_READY``.
    """
    if not broker.ready:
        print(
            f"broker {config.id}: waiting to be admitted: run `kafkaesque broker add {config.id} "
            f"{config.peers[config.id]} {config.controllers[config.id]}` against the cluster",
            file=sys.stderr,
            flush=True,
        )
    await broker.wait_ready()
    print(f"broker {config.id}: admitted to the cluster", file=sys.stderr, flush=True)
    print("ready", flush=True)


async def _stop_gracefully(broker: Broker, timeout: float, nursery: trio.Nursery) -> None:
    """Hand the broker's leaderships over (``Broker.drain``, at most ``timeout`` seconds), say
    what moved on stderr, then stop everything in ``nursery``."""
    print(
        f"broker {broker.config.id}: SIGTERM: handing leaderships over (up to {timeout:g} s)",
        file=sys.stderr,
        flush=True,
    )
    try:
        report = await broker.drain(timeout)
    except Exception:  # a bug in the hand-over must not keep the broker from stopping
        log.exception("broker %d: the hand-over failed; stopping anyway", broker.config.id)
    else:
        print(f"broker {broker.config.id}: {report.describe()}", file=sys.stderr, flush=True)
    nursery.cancel_scope.cancel()


async def _watch_parent(parent: int, scope: trio.CancelScope) -> None:
    """Stop when the process that started us is gone (a killed test or benchmark harness
    must not leave brokers running behind it)."""
    while os.getppid() == parent:
        await trio.sleep(_PARENT_CHECK_S)
    print("the parent process is gone: stopping", file=sys.stderr, flush=True)
    scope.cancel()
