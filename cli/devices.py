"""``kafkaesque devices``: simulated phones publishing readings over MQTT, and a report.

N devices (``phone-00000``...) connect to the MQTT addresses round-robin (like a load balancer),
subscribe to their commands topic ``phones/<device>/commands`` (QoS 1), and each publishes a
serial-numbered, timestamped reading to ``phones/<device>/spectrum`` every ``--interval`` seconds
(0: as fast as the window of unacknowledged QoS 1 packets allows) for ``--duration`` seconds.
The load generator writes pre-encoded packets on raw non-blocking sockets, many connections per
process, over ``--processes`` processes.

The MQTT addresses are ``--mqtt`` when given; else the plain MQTT listeners the cluster's
brokers advertise (``+BROKER ... mqtt=port`` in its metadata), the cluster being found as the
other client commands find it: ``--bootstrap``, else ``$KAFKAESQUE_BOOTSTRAP``, else
127.0.0.1:9092.

``--tls`` (or ``--cafile``) connects over TLS: to the TLS listeners the brokers advertise
(``mqtt_tls=port``), or to ``--mqtt``; the servers' certificates are checked against ``--cafile``
(default: the system's CAs). ``--username`` and ``--password`` (or $KAFKAESQUE_MQTT_PASSWORD)
are every device's credentials. The cluster itself (its metadata, the log read back) is
reached as ``--tls-ca``, ``--tls-cert``, ``--user`` and ``--cluster-password``
($KAFKAESQUE_PASSWORD) say, as ``kafkaesque mqtt-bridge`` does.

The report: devices connected, readings sent and acknowledged, PUBACK latency p50/p99, commands
received and their delivery latency. When the run talked to the cluster (``--bootstrap`` given,
or the MQTT addresses found through it) it then reads the log topic (``--topic``, default
``readings``) back through the line protocol, from the offsets the run started at, and counts
the readings consumed, duplicated, lost (acknowledged but not in the log: must be 0) and missing
without an acknowledgement, with the end-to-end latency (ts_ms to the record's timestamp). With
``--mqtt`` and no ``--bootstrap`` (devices against any MQTT broker) the log is not read. Exits 1
if an acknowledged reading is lost. ``--json`` prints the report as one JSON object.
Conventions: docs/devices.md.
"""

from __future__ import annotations

import argparse
import math
import os
import secrets
import sys
from typing import Any

from kafkaesque.client import (
    Client,
    ClientConfig,
    ClusterMetadata,
    KafkaesqueError,
    Security,
    parse_bootstrap,
)

from .devices_core import DeviceConfig
from .devices_fleet import Fleet, FleetError, FleetSpec
from .devices_report import Report, check_log, end_offsets, read_run
from .mqtt_bridge import add_cluster_security_options, cluster_security

SOCKETS_PER_PROCESS = 4000
DEFAULT_BOOTSTRAP = "127.0.0.1:9092"  # as the client commands (cli/client_options.py)
BOOTSTRAP_ENV = "KAFKAESQUE_BOOTSTRAP"
PASSWORD_ENV = "KAFKAESQUE_MQTT_PASSWORD"


class DevicesError(Exception):
    """The device run could not start or finish; the message says why."""


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "devices",
        help="simulate MQTT devices publishing readings, and report what reached the log",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--mqtt",
        help="MQTT host:port[,host:port...]; devices spread over them round-robin (default: "
        "the MQTT listeners the cluster's brokers advertise)",
    )
    parser.add_argument("-n", "--devices", type=int, default=200, help="how many devices (200)")
    parser.add_argument(
        "--interval",
        type=float,
        default=1.0,
        help="seconds between one device's readings (1.0); 0 = as fast as the window allows",
    )
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of publishing (10)")
    parser.add_argument("--qos", type=int, choices=(0, 1), default=1, help="readings' QoS (1)")
    parser.add_argument(
        "--window", type=int, default=100, help="unacknowledged QoS 1 readings per device (100)"
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=0,
        help=f"load processes (default: one per {SOCKETS_PER_PROCESS} devices)",
    )
    parser.add_argument(
        "--bootstrap",
        metavar="HOST:PORT,...",
        help="the cluster: where its MQTT listeners are, and the log read back to count losses "
        f"(${BOOTSTRAP_ENV}, else {DEFAULT_BOOTSTRAP})",
    )
    parser.add_argument("--topic", default="readings", help="the log topic of the readings")
    parser.add_argument("--username", help="MQTT user name")
    parser.add_argument("--password", help=f"MQTT password (or ${PASSWORD_ENV})")
    parser.add_argument(
        "--tls",
        action="store_true",
        help="connect over TLS (to the brokers' MQTT TLS listeners unless --mqtt)",
    )
    parser.add_argument(
        "--cafile", help="the CA (PEM) of the MQTT servers' certificates; implies --tls"
    )
    parser.add_argument("--keep-alive", type=int, default=60, help="MQTT keep-alive seconds (60)")
    parser.add_argument(
        "--no-commands", action="store_true", help="do not subscribe to the commands topics"
    )
    parser.add_argument(
        "--persistent-session",
        action="store_true",
        help="connect with clean session 0: the brokers keep each device's subscription and "
        "commands while it is away, and a reconnection must find its session",
    )
    parser.add_argument(
        "--warmup", type=float, default=0.0, help="seconds left out of the rate and latencies"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    add_cluster_security_options(parser, tls_flag=False)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.devices < 1:
        raise DevicesError("--devices must be at least 1")
    if args.interval < 0 or args.duration <= 0 or args.warmup < 0:
        raise DevicesError("--interval and --warmup must be >= 0, --duration > 0")
    cluster = args.bootstrap or os.environ.get(BOOTSTRAP_ENV) or DEFAULT_BOOTSTRAP
    tls = bool(args.tls or args.cafile)
    if args.cafile and not os.path.isfile(args.cafile):
        raise DevicesError(f"--cafile {args.cafile}: no such file")
    try:
        security = cluster_security(args, tls_flag=False)
        addresses = (
            tuple(parse_bootstrap(args.mqtt))
            if args.mqtt
            else find_mqtt(cluster, tls=tls, security=security)
        )
        config = DeviceConfig(
            run=secrets.token_hex(4),
            qos=args.qos,
            window=args.window,
            keep_alive=args.keep_alive,
            subscribe=not args.no_commands,
            clean=not args.persistent_session,
            username=args.username,
            password=args.password or os.environ.get(PASSWORD_ENV),
        )
    except ValueError as exc:
        raise DevicesError(str(exc)) from None
    spec = FleetSpec(
        addresses=addresses,
        devices=args.devices,
        config=config,
        interval=args.interval,
        duration=args.duration,
        warmup=min(args.warmup, args.duration / 2),
        tls=tls,
        cafile=args.cafile,
    )
    if not args.mqtt and not args.json:
        where = ",".join(f"{host}:{port}" for host, port in addresses)
        print(f"MQTT listeners of the cluster at {cluster}: {where}", file=sys.stderr)
    processes = args.processes or math.ceil(args.devices / SOCKETS_PER_PROCESS)
    # The log is read back whenever the run talked to the cluster; --mqtt alone may name any
    # MQTT broker (mosquitto), which has no log.
    check = args.bootstrap or (cluster if not args.mqtt else None)
    report = run_devices(spec, processes, check, args.topic, quiet=args.json, security=security)
    if args.json:
        print(report.to_json())
    else:
        for line in report.lines():
            print(line)
    return 1 if report.lost else 0


def find_mqtt(
    bootstrap: str, *, tls: bool = False, security: Security | None = None
) -> tuple[tuple[str, int], ...]:
    """The MQTT listeners (``tls``: the TLS ones) of the cluster at ``bootstrap``
    (``mqtt_listeners`` of its metadata).

    Raises ``DevicesError`` when the cluster cannot be asked (saying to give ``--mqtt``) or
    advertises no listener; ``ValueError`` for a malformed ``bootstrap``."""
    try:
        with Client(bootstrap, config=_client_config(security)) as client:
            metadata = client.refresh_metadata()
    except KafkaesqueError as exc:
        raise DevicesError(
            f"cannot ask the cluster at {bootstrap} for its MQTT listeners ({exc}); "
            "give --bootstrap, or the MQTT addresses with --mqtt host:port,..."
        ) from None
    listeners = mqtt_listeners(metadata, tls=tls)
    if not listeners:
        flag = "--mqtt-tls-listen" if tls else "--mqtt"
        raise DevicesError(
            f"no broker of the cluster at {bootstrap} listens for MQTT{' over TLS' if tls else ''}"
            f" (start the brokers with {flag}), or give the MQTT addresses with --mqtt "
            "host:port,..."
        )
    return listeners


def _client_config(security: Security | None) -> ClientConfig:
    return ClientConfig() if security is None else ClientConfig(security=security)


def mqtt_listeners(metadata: ClusterMetadata, *, tls: bool = False) -> tuple[tuple[str, int], ...]:
    """``(host, port)`` of every broker that advertises a plain MQTT listener (``tls``: a TLS
    one), by broker id (the devices spread over them in this order). Empty when none does."""
    ports = (
        (row.host, row.mqtt_tls_port if tls else row.mqtt_port)
        for _, row in sorted(metadata.brokers.items())
    )
    return tuple((host, port) for host, port in ports if port is not None)


def run_devices(
    spec: FleetSpec,
    processes: int,
    bootstrap: str | None = None,
    topic: str = "readings",
    *,
    quiet: bool = True,
    security: Security | None = None,
) -> Report:
    """One run of ``spec`` (connect, publish, drain), then the log check when ``bootstrap`` is
    given. The demo calls this in-process; ``kafkaesque devices --json`` prints its result.

    The devices run in ``processes`` worker processes started with ``spawn``, which imports the
    caller's main module again: call this from the ``kafkaesque`` command, from ``python -m``
    of a package, or under ``if __name__ == "__main__":``. Raises ``DevicesError`` when no
    device could connect, a worker failed, or reading the log back took too long."""
    client = Client(bootstrap, config=_client_config(security)) if bootstrap else None
    try:
        start = end_offsets(client, topic) if client is not None else None
        with Fleet(spec, processes) as fleet:
            ready = fleet.wait_ready()
            if not quiet:
                print(
                    f"{ready.connected:,} devices connected ({ready.failed:,} failed) in "
                    f"{ready.seconds:.1f} s; publishing for {spec.duration:g} s",
                    file=sys.stderr,
                )
            if ready.connected == 0:
                detail = "; ".join(ready.errors[:3]) or "no detail"
                raise DevicesError(f"no device could connect ({detail})")
            fleet.go()
            result = fleet.result()
        report = Report.build(spec.config.run, spec.devices, spec.config.qos, result)
        if client is not None:
            pairs, e2e = read_run(client, topic, spec.config.run, start)
            check = check_log(result.devices, pairs, acknowledged=spec.config.qos > 0)
            report.add_log(check, e2e)
        return report
    except (FleetError, TimeoutError) as exc:
        raise DevicesError(str(exc)) from None
    finally:
        if client is not None:
            client.close()
