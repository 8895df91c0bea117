"""``kafkaesque jepsen``: a fault-injection run against a real cluster, checked and reported.

Starts ``--nodes`` broker processes (each in its own network namespace when run as root, else on
loopback behind per-link proxies), runs producers and consumers that record every operation,
injects the ``--nemesis`` faults at random intervals, heals, reads everything back, checks the
history and writes an HTML report with plots. The last line printed is
``RESULT valid=1|0 ops=... acked=... lost=... ...``; the exit status is 0 when the history is
valid, 2 when it is not. See docs/jepsen.md.
"""

from __future__ import annotations

import argparse
from typing import Any

from kafkaesque.jepsen_like.runner import (
    NEMESES,
    JepsenError,
    RunOptions,
    WorkloadOptions,
    power_loss_available,
    run,
)

__all__ = ["JepsenError", "add_parser", "run_jepsen"]


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "jepsen",
        help="run a fault-injection test and check its history",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--nodes", type=int, default=3, help="brokers (3)")
    parser.add_argument("--time", type=float, default=60.0, help="seconds of load and faults (60)")
    parser.add_argument(
        "--nemesis",
        default="kill-leader,partition",
        help=f"comma-separated faults, or 'all' or 'none' ({', '.join(NEMESES)})",
    )
    parser.add_argument(
        "--interval", type=float, default=8.0, help="mean seconds between faults (8)"
    )
    parser.add_argument(
        "--workload",
        default="queue,groups",
        help="queue, groups, or both (queue,groups)",
    )
    parser.add_argument("--partitions", type=int, default=4, help="partitions of the topic (4)")
    parser.add_argument("--producers", type=int, default=4, help="producer processes (4)")
    parser.add_argument("--consumers", type=int, default=2, help="assign-mode consumers (2)")
    parser.add_argument("--members", type=int, default=3, help="group members, groups workload (3)")
    parser.add_argument(
        "--network",
        choices=("auto", "netns", "loopback"),
        default="auto",
        help="namespaces (root) or loopback with proxies; auto picks namespaces when root",
    )
    parser.add_argument(
        "--dir", default=".kafkaesque-jepsen", help="runs go here (.kafkaesque-jepsen)"
    )
    parser.add_argument("--seed", type=int, help="random seed of the nemesis (random)")
    parser.add_argument(
        "--secure",
        action="store_true",
        help="TLS on every broker port (a development CA), SCRAM clients, a random cluster secret",
    )
    parser.add_argument(
        "--fsync",
        choices=("always", "interval", "never"),
        help="the brokers' --fsync (always: fsync before acknowledging, their default; interval "
        "acknowledges unsynced writes: power-loss must catch it losing them)",
    )
    parser.add_argument("--unsafe-ack-before-commit", action="store_true", help=argparse.SUPPRESS)
    parser.set_defaults(run=run_jepsen)


def run_jepsen(args: argparse.Namespace) -> int:
    nemeses = _nemeses(args.nemesis)
    workloads = {w.strip() for w in args.workload.split(",") if w.strip()}
    if not workloads <= {"queue", "groups"}:
        raise JepsenError("--workload is queue, groups or queue,groups")
    workload = WorkloadOptions(
        partitions=args.partitions,
        producers=args.producers,
        consumers=args.consumers if "queue" in workloads else 0,
        group_members=args.members if "groups" in workloads else 0,
    )
    options = RunOptions(
        nodes=args.nodes,
        time_s=args.time,
        nemeses=nemeses,
        interval_s=args.interval,
        base_dir=args.dir,
        network=args.network,
        unsafe_ack_before_commit=args.unsafe_ack_before_commit,
        seed=args.seed,
        secure=args.secure,
        fsync=args.fsync,
        workload=workload,
    )
    outcome = run(options, say=lambda line: print(line, flush=True))
    print(f"report: {outcome.report}")
    print(f"history: {outcome.history}")
    if "power-loss" in nemeses:
        print(power_loss_line(outcome.power_losses))
    print(outcome.result.summary())
    return 0 if outcome.result.valid else 2


def power_loss_line(counts: dict[str, int]) -> str:
    """``power losses: brokers=… events=… all=… one=… pause-kill=… part-kill=…``."""
    shapes = ("all", "one", "pause-kill", "part-kill")
    events = sum(counts.get(s, 0) for s in shapes)
    rest = " ".join(f"{s}={counts.get(s, 0)}" for s in shapes)
    return f"power losses: events={events} brokers={counts.get('nodes', 0)} {rest}"


def _nemeses(text: str) -> tuple[str, ...]:
    if text == "all":  # every one this machine can make: power-loss needs root and loop devices
        usable = power_loss_available() is None
        return tuple(str(n) for n in NEMESES if usable or n != "power-loss")
    if text in ("", "none"):
        return ()
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in NEMESES]
    if unknown:
        raise JepsenError(f"unknown nemesis {', '.join(unknown)}; known: {', '.join(NEMESES)}")
    return names
