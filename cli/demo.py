"""``kafkaesque demo``: the README's main job, the seeds' crowdsourcing pipeline end to end.

1. Starts a local 3-broker cluster (data in ``<data-dir>/demo``, wiped first; loopback ports
   chosen free) with MQTT listeners, and creates ``readings`` (6 partitions, replication factor
   3) and ``commands`` (3 partitions, replication factor 3).
2. Starts simulated phones (``kafkaesque devices``) publishing serial-numbered, timestamped
   spectrum readings over MQTT QoS 1, spread over the three brokers as a load balancer would.
   The MQTT mapping puts ``phones/<id>/spectrum`` into ``readings`` keyed by the phone, and
   records of ``commands`` keyed by a phone out to ``phones/<id>/commands``.
3. A controller consumes ``readings`` through a consumer group at its own pace (half the
   devices' rate at first: the log absorbs the burst, the lag grows, then drains) and sends a
   command to a phone for every tenth reading of it; each phone counts what it receives.
4. Partway through, the leader of ``readings`` partition 0 is killed with kill -9, and brought
   back a few seconds later. A probe times writes to that partition: the failover gap.
5. A Spark job (local mode) reads ``readings`` through ``spark_source``: per-device messages,
   loss by serial-number gap, duplicates, latency percentiles.
6. Prints a summary table and writes a PNG plot of throughput and latency with the fault marked.

With ``--secure`` the same pipeline runs with security on every listener: TLS on the client,
peer and MQTT ports (a development CA), a random cluster secret, SCRAM-SHA-256 users for every
client and the devices, and an MQTT ACL that lets each phone publish only its own readings and
read only its own commands (docs/security.md).

Exits with status 1 if any acknowledged reading is missing from the log. Every process it
started is stopped when it ends, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from typing import TYPE_CHECKING, Any

from ._preflight import demo_problems

if TYPE_CHECKING:
    from ._demo_pipeline import DemoPlan

# The pipeline's modules (trio, the client, the cluster, Spark, matplotlib) are imported by
# ``run`` once the preflight found everything: ``kafkaesque demo --help`` and a missing piece
# answer at once.

DEFAULT_DATA_DIR = ".kafkaesque-data"
BROKERS = 3
PORTS_PER_BROKER = 5  # client, peer, controller, admin, MQTT: what LocalCluster picks for each


def mqtt_rules(readings: str, commands: str) -> str:
    """The brokers' MQTT mapping: phones publish readings, the controller's commands go back."""
    return f"""\
# kafkaesque demo: phones publish readings, the controller's commands go back to one phone
phones/+/spectrum -> {readings} key=1
phones/+/commands -> {commands} key=1
"""


class DemoError(Exception):
    """The demo could not do what it set out to do; the message says why."""


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "demo",
        help="run the end-to-end demo: MQTT phones -> replicated log -> controller -> Spark",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help="where the cluster lives")
    parser.add_argument("--devices", type=int, default=200, help="simulated phones (200)")
    parser.add_argument(
        "--interval", type=float, default=1.0, help="seconds between a phone's readings (1.0)"
    )
    parser.add_argument(
        "--duration", type=float, default=120.0, help="seconds the phones publish (120)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="a short run (30 s of publishing, under 2 minutes)"
    )
    parser.add_argument("--no-spark", action="store_true", help="skip the Spark job")
    parser.add_argument(
        "--secure",
        action="store_true",
        help="TLS on every listener, SCRAM users, an MQTT ACL (a development CA)",
    )
    parser.set_defaults(run=run)


def _sizes(args: argparse.Namespace) -> tuple[float, float]:
    """``(duration, interval)`` of the run the arguments ask for; DemoError if they make none."""
    duration = 30.0 if args.quick else args.duration
    interval = 0.5 if args.quick else args.interval
    if args.devices < 1 or interval <= 0 or duration < 10:
        raise DemoError("--devices must be positive, --interval > 0 and --duration >= 10")
    return float(duration), float(interval)


def plan_for(args: argparse.Namespace) -> DemoPlan:
    duration, interval = _sizes(args)
    from ._demo_pipeline import DemoPlan

    return DemoPlan(
        devices=args.devices,
        interval_s=interval,
        duration_s=duration,
        fault_at_s=duration * 0.35,
        restart_after_s=min(10.0, duration * 0.15),
        slow_until_s=duration * 0.5,
        command_every=10,
    )


def preflight(args: argparse.Namespace) -> None:
    """Raise DemoError naming every missing piece (and how to install it) before anything starts."""
    problems = demo_problems(
        data_dir=args.data_dir, ports=BROKERS * PORTS_PER_BROKER, spark=not args.no_spark
    )
    if problems:
        raise DemoError("; ".join(problems))


def run(args: argparse.Namespace) -> int:
    _sizes(args)  # the user's own mistake first, then what the machine lacks
    preflight(args)
    plan = plan_for(args)
    import trio

    from kafkaesque.client import Client, ClientConfig
    from kafkaesque.local_cluster import LocalCluster

    from ._demo_pipeline import COMMANDS, READINGS, DemoRunError, devices_command, run_pipeline
    from ._demo_report import failures, format_table, plot, read_log, summary_rows
    from ._demo_secure import DemoSecurity

    root = os.path.join(os.path.abspath(args.data_dir), "demo")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    out = sys.stdout
    print(f"starting {BROKERS} brokers in {root} ...", file=out, flush=True)
    started = time.monotonic()
    rules = mqtt_rules(READINGS, COMMANDS)
    data = os.path.join(root, "cluster")
    security = DemoSecurity.make(os.path.join(root, "security")) if args.secure else None
    if security is None:
        cluster_of_demo = LocalCluster(data, BROKERS, mqtt=True, mqtt_rules=rules)
        config = ClientConfig()
    else:
        security.export_secret()
        cluster_of_demo = security.cluster(data, BROKERS, rules)
        config = security.dev.client_config()
        print(
            "security: TLS on the client, peer and MQTT ports (CA "
            f"{security.dev.pki.ca}), SCRAM users demo and phones, MQTT ACL {security.acl_file}",
            file=out,
        )
    with cluster_of_demo as cluster:
        mqtt = [f"{host}:{port}" for host, port in cluster.mqtt_addresses]
        with Client(cluster.bootstrap, config=config) as client:
            client.create_topic(READINGS, 6, 3)
            client.create_topic(COMMANDS, 3, 3)
        print(f"brokers: clients {cluster.bootstrap}  MQTT {','.join(mqtt)}", file=out)
        print(
            f"{plan.devices} phones publish every {plan.interval_s:g} s for "
            f"{plan.duration_s:g} s; kill -9 at t={plan.fault_at_s:.0f}s",
            file=out,
            flush=True,
        )
        extra = security.devices_args() if security else None
        command = devices_command(cluster, plan, mqtt, extra)
        env = security.devices_env() if security else None
        try:
            result = trio.run(run_pipeline, cluster, plan, out, command, config, env)
        except DemoRunError as exc:
            raise DemoError(str(exc)) from exc
        log = read_log(cluster.bootstrap, config)
        spark = None
        if not args.no_spark:
            print("Spark: per-device report of readings (local mode) ...", file=out, flush=True)
            from ._demo_spark import spark_report

            options = security.spark_options() if security else None
            spark = spark_report(cluster.bootstrap, options=options)
    png = os.path.join(root, "demo.png")
    plot(result, log, png)
    print(format_table(summary_rows(result, log, spark)), file=out)
    print(f"plot: {png}", file=out)
    print(f"done in {time.monotonic() - started:.0f} s", file=out)
    try:
        broken = failures(result, log, spark, plan.devices)
    except ValueError as exc:
        raise DemoError(str(exc)) from exc
    for failure in broken:
        print(f"FAILED: {failure}", file=out)
    return 1 if broken else 0
