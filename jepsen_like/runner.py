"""One jepsen_like run, start to verdict: network, brokers, clients, nemesis, heal, check, report.

``run(options)`` is what ``kafkaesque jepsen`` and the pytest entries call. Everything it starts
(namespaces, bridge, veths, proxies, broker processes) is torn down before it returns, also when
it fails. The run directory (``<base>/<utc time>-<pid>/``) keeps the history
(``history.jsonl``), the brokers' data and logs, the nemesis log, and the report (``index.html``
and its PNGs).

Placement: as root with iproute2, every broker gets its own network namespace and address
(``_netns``) and partitions are blackhole routes; otherwise every broker runs on 127.0.0.1 and
the per-link TCP proxies (``_proxy``) are the network, which the run says. The proxies also carry
latency and loss (this kernel has no netem), so they are put on the peer links whenever those
nemeses are enabled, namespaces or not. The controller quorum (pysyncobj) talks directly: in
loopback mode a partition cuts the Raft traffic but not the controller's.

``secure`` (``kafkaesque jepsen --secure``): the same run with TLS on the brokers' client, peer
(mutual) and admin ports, a SCRAM user that every client authenticates as, and a random cluster
secret (``_secure``); the proxies carry the peers' TLS bytes unchanged.

``power-loss`` among the nemeses (root only): every broker's data directory (``data/<id>``) is an
ext4 image (``images/``) mounted through a loop device, and writeback is held back for the run
(``_powerloss``); the broker logs stay on the host's disk. The images are unmounted, and the
writeback settings restored, before ``run`` returns, also when it fails; the images stay for a
post-mortem (mount one with ``mount -o loop``).
"""

from __future__ import annotations

import dataclasses
import os
import random
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field

import trio

from kafkaesque.client import KafkaesqueError
from kafkaesque.local_cluster import free_ports

from ._cluster import ClusterFault, JepsenCluster, NodeAddress, Placement
from ._disk_states import read_raft_states
from ._nemesis import (
    DECOMMISSION_SPARES,
    NEMESES,
    NemesisContext,
    Network,
    acl_text,
    heal_everything,
    open_acls,
    run_nemesis,
)
from ._netns import NetnsNetwork, netns_available
from ._powerloss import PowerLossDisks, WritebackHold, power_loss_available
from ._proxy import ProxyLayer
from ._report import write_report
from ._secure import SecureSetup
from ._workload import (
    Recorder,
    WorkloadOptions,
    consumer,
    final_read,
    group_member,
    producer,
    replica_reads,
)
from .checker import CheckResult, check_file
from .history import (
    CreateTopic,
    HardStates,
    HistoryWriter,
    InternalErrors,
    Leaders,
    MetadataSeen,
    TopicPartition,
)

__all__ = [
    "NEMESES",
    "JepsenError",
    "RunOptions",
    "RunOutcome",
    "WorkloadOptions",
    "power_loss_available",
    "run",
]

LEADER_WAIT_S = 30.0
"""How long after every broker is back a partition may go without a leader (``leaderless``)."""
_NETNS_PORTS = (9092, 9093, 9094, 9095)  # client, peer, controller, admin: one set a namespace


class JepsenError(Exception):
    """The run could not be made (bad options, a cluster that never came up)."""


@dataclass(frozen=True)
class RunOptions:
    """Everything a run needs; defaults are a short run on 3 nodes."""

    nodes: int = 3
    time_s: float = 60.0
    nemeses: tuple[str, ...] = ("kill-leader", "partition")
    interval_s: float = 8.0  # mean time between faults
    base_dir: str = ".kafkaesque-jepsen"
    network: str = "auto"  # auto | netns | loopback
    unsafe_ack_before_commit: bool = False
    seed: int | None = None
    recovery_s: float = 10.0  # after healing, before the final read
    secure: bool = False  # TLS, SCRAM and a random cluster secret (see the module docstring)
    fsync: str | None = None  # the brokers' --fsync (None: their default, always)
    workload: WorkloadOptions = field(default_factory=WorkloadOptions)

    def validate(self) -> RunOptions:
        unknown = [n for n in self.nemeses if n not in NEMESES]
        if unknown:
            raise JepsenError(f"unknown nemesis {', '.join(unknown)}; known: {', '.join(NEMESES)}")
        if self.nodes < 1:
            raise JepsenError("need at least one node")
        if self.network not in ("auto", "netns", "loopback"):
            raise JepsenError("--network is auto, netns or loopback")
        if self.network == "netns" and not netns_available():
            raise JepsenError("network namespaces need root and iproute2")
        if self.fsync not in (None, "always", "interval", "never"):
            raise JepsenError("--fsync is always, interval or never")
        if "power-loss" in self.nemeses and (why := power_loss_available()) is not None:
            raise JepsenError(why)
        return self


@dataclass(frozen=True)
class RunOutcome:
    """What a run produced."""

    result: CheckResult
    run_dir: str
    history: str
    report: str
    network: str
    nemesis_log: tuple[str, ...]
    power_losses: dict[str, int] = field(default_factory=dict)
    """Power losses by shape (``one``, ``all``, ``pause-kill``, ``part-kill``) and broker by
    broker (``nodes``); empty without the power-loss nemesis."""


def run(options: RunOptions, *, say: Callable[[str], None] = print) -> RunOutcome:
    """Make one run and check it. Raises JepsenError if the cluster cannot be started."""
    options.validate()
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    run_dir = os.path.abspath(os.path.join(options.base_dir, f"{stamp}-{os.getpid()}"))
    os.makedirs(run_dir, exist_ok=True)
    use_netns = options.network == "netns" or (options.network == "auto" and netns_available())
    mode = "netns" if use_netns else "loopback"
    if use_netns:
        say(f"network: one namespace per broker (root), partitions by blackhole routes; {run_dir}")
    else:
        say(
            "network: NOT root (or --network loopback): brokers on 127.0.0.1, faults through "
            f"per-link TCP proxies only; {run_dir}"
        )
    history_path = os.path.join(run_dir, "history.jsonl")
    seed = options.seed if options.seed is not None else random.randrange(1 << 30)
    say(f"seed {seed}")
    with ExitStack() as stack:
        total = options.nodes + _spares(options)
        net = stack.enter_context(NetnsNetwork(total)) if use_netns else None
        disks: PowerLossDisks | None = None
        if "power-loss" in options.nemeses:
            stack.enter_context(WritebackHold())
            disks = stack.enter_context(
                PowerLossDisks(os.path.join(run_dir, "images"), os.path.join(run_dir, "data"))
            )
            for i in range(total):
                disks.add(i, os.path.join(run_dir, "data", str(i)))
            say(f"power-loss: {total} ext4 images on loop devices, writeback held back")
        writer = stack.enter_context(HistoryWriter(history_path))
        try:
            log, power_losses = trio.run(_run, options, run_dir, net, disks, writer, seed, say)
        except* ClusterFault as group:
            first = group.exceptions[0]
            raise JepsenError(f"{first} (run directory {run_dir})") from None
    result = check_file(history_path)
    report = write_report(run_dir, history_path, result, options_text(options, mode, seed), log)
    return RunOutcome(result, run_dir, history_path, report, mode, tuple(log), power_losses)


def options_text(options: RunOptions, mode: str, seed: int) -> str:
    return (
        f"nodes={options.nodes} time={options.time_s:.0f}s network={mode} seed={seed} "
        f"nemeses={','.join(options.nemeses) or 'none'} interval={options.interval_s}s "
        f"unsafe_ack_before_commit={options.unsafe_ack_before_commit} secure={options.secure} "
        f"fsync={options.fsync or 'always'}"
    )


async def _run(
    options: RunOptions,
    run_dir: str,
    net: NetnsNetwork | None,
    disks: PowerLossDisks | None,
    writer: HistoryWriter,
    seed: int,
    say: Callable[[str], None],
) -> tuple[list[str], dict[str, int]]:
    n = options.nodes
    total = n + _spares(options)
    want_proxies = net is None or bool({"latency", "loss"} & set(options.nemeses))
    async with trio.open_nursery() as services:
        placement = Placement(nodes={})
        if net is not None:
            for i in range(total):
                placement.nodes[i] = NodeAddress(net.address(i), *_NETNS_PORTS)
                placement.prefixes[i] = net.exec_prefix(i)
        else:
            ports = free_ports(4 * total)
            for i in range(total):
                placement.nodes[i] = NodeAddress("127.0.0.1", *ports[4 * i : 4 * i + 4])
        proxies: ProxyLayer | None = None
        proxy_host = net.host_address if net else "127.0.0.1"
        if want_proxies:
            proxies = ProxyLayer(proxy_host, seed=seed)
            await proxies.link_all(services, placement, n)
        security: SecureSetup | None = None
        if options.secure:
            hosts = [proxy_host, *(a.host for a in placement.nodes.values())]
            security = SecureSetup.make_run(run_dir, range(total), hosts)
            secure_workload = dataclasses.replace(options.workload, secure=security)
            options = dataclasses.replace(options, workload=secure_workload)
        cluster = JepsenCluster(
            placement,
            os.path.join(run_dir, "data"),
            os.path.join(run_dir, "logs"),
            members=list(range(n)),
            spares=list(range(n, total)),
            unsafe_ack_before_commit=options.unsafe_ack_before_commit,
            security=security,
            fsync=options.fsync,
        )
        network = Network(
            net.cut if net else None,
            net.heal if net else None,
            proxies,
        )
        ctx = NemesisContext(
            cluster, network, options.workload.topic, options.workload.partitions,
            random.Random(seed), disks=disks,
        )  # fmt: skip
        rec = Recorder(writer)
        try:
            for i in range(n):
                cluster.start(i)
            await cluster.wait_ready()
            await cluster.create_topic(
                options.workload.topic, options.workload.partitions, min(3, n)
            )
            say(f"cluster of {n} ready; running {options.time_s:.0f} s")
            created = CreateTopic(options.workload.topic, options.workload.partitions)
            rec.record("invoke", "admin", created)  # done above: its ok is the controller's
            rec.record("ok", "admin", created)
            if "power-loss" in options.nemeses:
                ctx.recorder = rec
                await open_acls(ctx)  # before the probes' ACLs, which would close the cluster
            await _workloads(rec, cluster, ctx, options)
            say("healing and reading everything back")
            await heal_everything(ctx)
            try:
                await cluster.wait_ready(timeout=120)
            except ClusterFault as exc:
                # A broker that cannot come back (a disk fault it does not survive) is a
                # finding, not a harness failure: read what the others have, and report it.
                ctx.log.append(f"after healing: {exc}")
                say(f"after healing: {exc}")
            await _wait_leaders(rec, cluster, options.workload)
            await _record_metadata(rec, cluster)
            await trio.sleep(options.recovery_s)
            bootstrap = cluster.bootstrap
            topic = options.workload.topic
            for attempt in range(3):
                if await final_read(
                    rec,
                    f"final-{attempt}",
                    bootstrap,
                    options.workload,
                    lambda: cluster.high_watermarks(topic),
                ):
                    break
                await trio.sleep(5)
            # Every replica on its own: a record missing from one follower is invisible to
            # reads served by the leader (Jepsen's NATS analysis found loss only per node).
            await replica_reads(
                rec,
                {i: cluster.client_address(i) for i in cluster.alive()},
                options.workload,
                lambda: cluster.high_watermarks(topic),
            )
        finally:
            cluster.stop_all()
            services.cancel_scope.cancel()
            _record_end_states(rec, cluster)
            rec.record("ok", "harness", InternalErrors(internal_errors(cluster.log_dir)))
    return ctx.log, dict(ctx.power_losses)


async def _wait_leaders(rec: Recorder, cluster: JepsenCluster, w: WorkloadOptions) -> None:
    """Every broker is back: record which partitions still have no leader after
    ``LEADER_WAIT_S`` of asking (``leaderless``: a power loss can leave two replicas of a
    partition unable to vote, and the partition without a leader for good)."""
    t0 = trio.current_time()
    missing = list(range(w.partitions))
    while True:
        try:
            led = await cluster.leaders(w.topic)
        except (ClusterFault, OSError, trio.TooSlowError):
            led = {}
        missing = [p for p in range(w.partitions) if p not in led]
        if not missing or trio.current_time() - t0 >= LEADER_WAIT_S:
            break
        await trio.sleep(0.5)
    waited = round(trio.current_time() - t0, 3)
    leaderless = tuple(TopicPartition(w.topic, p) for p in missing)
    rec.record("ok", "harness", Leaders(waited, leaderless))


async def _record_metadata(rec: Recorder, cluster: JepsenCluster) -> None:
    """Record every running broker's METADATA (topics and partition counts) once all are back:
    a topic acknowledged earlier must be in each (``metadata_regression``)."""
    for node in cluster.alive():
        try:
            metadata = await cluster.ask(node, lambda c: c.refresh_metadata(), 5.0)
        except (KafkaesqueError, OSError, trio.TooSlowError):
            continue  # no answer proves nothing
        topics = tuple(sorted((t, len(rows)) for t, rows in metadata.partitions.items()))
        acls: tuple[str, ...] | None
        try:
            rows = await cluster.ask(node, lambda c: c.list_acls(), 5.0)
            acls = tuple(sorted(acl_text(r) for r in rows))
        except (KafkaesqueError, OSError, trio.TooSlowError):
            acls = None  # no answer proves nothing
        rec.record("ok", "harness", MetadataSeen(topics, acls), f"n{node}")


INTERNAL_ERROR_MARK = ": internal error: "
"""What the CLI writes when a broker stops on an exception it did not expect (a bug)."""


def internal_errors(log_dir: str) -> tuple[str, ...]:
    """Every line of the brokers' logs in ``log_dir`` (``broker-N.log``) that reports an
    internal error, as ``broker-N.log: <line>``."""
    found: list[str] = []
    if not os.path.isdir(log_dir):
        return ()
    for name in sorted(os.listdir(log_dir)):
        if not (name.startswith("broker-") and name.endswith(".log")):
            continue
        with open(os.path.join(log_dir, name), errors="replace") as f:
            found.extend(f"{name}: {line.strip()}" for line in f if INTERNAL_ERROR_MARK in line)
    return tuple(found)


def _record_end_states(rec: Recorder, cluster: JepsenCluster) -> None:
    """Record every broker's terms and votes from its disk once all are stopped (the last
    observation of each for ``double_vote``)."""
    for node in sorted({*cluster.members, *cluster.retired}):
        broker_dir = os.path.join(cluster.data_dir, str(node))
        if os.path.isdir(broker_dir):
            states, _ = read_raft_states(broker_dir)
            rec.record("ok", "disk", HardStates("end", states), f"n{node}")


def _spares(options: RunOptions) -> int:
    """Brokers kept in reserve for the membership and decommission nemeses to add (with
    ADDBROKER): one for membership, one per decommission."""
    return (1 if "membership" in options.nemeses else 0) + (
        DECOMMISSION_SPARES if "decommission" in options.nemeses else 0
    )


async def _workloads(
    rec: Recorder, cluster: JepsenCluster, ctx: NemesisContext, options: RunOptions
) -> None:
    stop = trio.Event()
    w = options.workload

    def bootstrap() -> list[str]:
        # Asked at each (re)connection: the members change when a broker is decommissioned.
        return cluster.bootstrap

    async with trio.open_nursery() as nursery:
        process = 0
        for k in range(w.producers):
            nursery.start_soon(producer, rec, process, bootstrap, w, k % 2 == 0, stop)
            process += 1
        for _ in range(w.consumers):
            nursery.start_soon(consumer, rec, process, bootstrap, w, stop)
            process += 1
        for _ in range(w.group_members):
            nursery.start_soon(group_member, rec, process, bootstrap, w, stop)
            process += 1
        if options.nemeses:
            nursery.start_soon(
                run_nemesis, rec, ctx, list(options.nemeses), options.interval_s, stop
            )
        await trio.sleep(options.time_s)
        stop.set()
