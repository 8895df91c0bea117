"""The nemesis: faults started at random times, held a while, healed, and recorded.

Each fault kind is a ``Fault``: ``start`` does the damage and returns the nodes it hit, ``stop``
heals it. The scheduler (``run_nemesis``) waits a random interval, picks an enabled kind, records
``invoke``/``ok`` of ``Nemesis(fault, "start", targets)``, holds the fault a random time, then
records the ``stop`` the same way. A start that found nothing to do (no leader known, no sealed
segment to flip) completes ``fail``: the checker then ignores it. At the end ``heal_everything``
undoes whatever is still active, so the final read sees a whole cluster.

Kinds (``NEMESES``):

* ``kill-leader``: kill -9 the leader of a random partition; restart it at stop.
* ``kill-minority``: kill -9 a random minority of the brokers at once; restart them at stop.
* ``pause``: SIGSTOP the leader of a random partition (or a random broker); SIGCONT at stop.
* ``partition``: one of: majority/minority halves, the leader of a partition isolated, a bridge
  (two halves that cannot talk, one node that talks to both), or a one-way cut (the leader can
  no longer send to the others but still hears them). Healed at stop.
* ``latency``: 50-300 ms added on every peer link (proxy layer). ``loss``: each chunk on a peer
  link resets its connection with a small probability (proxy layer: TCP cannot lose bytes).
* ``restart-all``: kill -9 every broker at once, then start them all.
* ``disk-truncate``: kill -9 one broker; cut a random tail off (or scribble garbage over the
  tail of) the active segment of each of its replicas; restart it at stop.
* ``disk-bitflip``: kill -9 one broker; flip one bit in a sealed segment of one of its replicas
  (a minority); restart it at stop.
* ``membership``: the first time, start a spare broker with ``--join`` and admit it
  (``ADDBROKER``); then REASSIGN a random partition to a different set of replicas (moving it
  off one broker and onto another; with no broker outside its replicas, dropping one), and at
  stop move it back: Raft membership changes under the other faults.
* ``rolling-restart``: what an operator does to upgrade: every broker in turn is stopped
  gracefully (SIGTERM: it hands its leaderships over), waited for, started again, and waited for
  until it serves (its METADATA lists every member: not NOT_READY) and its replicas have caught
  up, before the next one is stopped. All of it happens in the start; stop only starts a broker
  that did not come back in time.
* ``decommission``: a machine retired and replaced under load: a spare broker (a new id and
  data directory) is started with ``--join`` and admitted (``ADDBROKER``), then a random one of
  the other members is decommissioned (``REMOVEBROKER``: its replicas move, it leaves the
  controller quorum and the registry) and its process stopped. The cluster's ``members`` follow
  (the workload's bootstrap list, the other nemeses), and clients learn of the new broker from
  METADATA. Permanent: stop heals nothing (but starts a broker left down). Each one uses a
  spare placed at the start of the run (``DECOMMISSION_SPARES`` of them); once they are used
  up, it finds nothing to do.
* ``power-loss``: the power goes (``_powerloss``: every broker's data directory is an ext4 image
  on a loop device; a cut is SIGKILL, then the disk replaced by what it held at that instant, so
  every write not fsynced is lost, directory entries included). One shape at random: ``one``
  broker; ``all`` of them at once (every disk, a broker already down included); or Jepsen's NATS
  choreographies, ``pause-kill`` and ``part-kill``: starve a minority of writes (SIGSTOP, or a
  partition), power-fail one member of the majority and start it again, then let the starved
  minority back and take the rest of the majority away (SIGSTOP, or a partition), so that the
  crashed node and the starved ones form the new majority. Healed at stop (brokers started,
  resumed, the network healed).
"""

from __future__ import annotations

import os
import random
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial

import trio

from kafkaesque.client import AsyncClient, KafkaesqueError
from kafkaesque.protocol import (
    CLUSTER_RESOURCE_NAME,
    AclOperation,
    AclPattern,
    AclPermission,
    AclResource,
    AclRow,
)
from kafkaesque.storage import segment_data_end

from ._cluster import ClusterFault, JepsenCluster, partition_dirs
from ._disk_states import read_raft_states
from ._powerloss import PowerLossDisks, PowerLossError
from ._proxy import ProxyLayer
from ._workload import Recorder
from .history import AddAcl, CreateTopic, EventType, HardStates, Nemesis, NemesisPhase

NEMESES: tuple[str, ...] = (
    "kill-leader",
    "kill-minority",
    "pause",
    "partition",
    "latency",
    "loss",
    "restart-all",
    "disk-truncate",
    "disk-bitflip",
    "membership",
    "rolling-restart",
    "decommission",
    "power-loss",
)
PROCESS = "nemesis"
DECOMMISSION_SPARES = 3
"""Spare brokers placed for the ``decommission`` nemesis: one is used per decommission."""
READY_TIMEOUT_S = 60.0
"""How long a restarted broker gets to serve, and then to catch up, in a rolling restart."""


class NothingToDo(Exception):
    """The fault found no target (no leader known, no file to damage): it did not happen."""


@dataclass
class Network:
    """The fault surfaces a run has: route cuts (namespaces) and/or proxies. Cuts go to both, so
    that traffic through a proxy is cut as well as traffic on the direct route."""

    cut_routes: Callable[[int, int], None] | None
    heal_routes: Callable[[], None] | None
    proxies: ProxyLayer | None

    def cut(self, src: int, dst: int) -> None:
        if self.cut_routes is not None:
            self.cut_routes(src, dst)
        if self.proxies is not None:
            self.proxies.cut(src, dst)

    def heal(self) -> None:
        if self.heal_routes is not None:
            self.heal_routes()
        if self.proxies is not None:
            self.proxies.heal()


@dataclass
class NemesisContext:
    """What faults act on."""

    cluster: JepsenCluster
    network: Network
    topic: str
    partitions: int
    rng: random.Random
    log: list[str] = field(default_factory=list)  # what was done, for the report
    dead: set[int] = field(default_factory=set)  # killed by us, to restart
    moved: dict[int, list[int]] = field(default_factory=dict)  # partition -> replicas before
    # The membership nemesis admits one spare, once; decommission uses the others.
    membership_added: bool = False
    # The disk images of a power-loss run (None: the brokers' disks are the host's).
    disks: PowerLossDisks | None = None
    # Power losses made, by shape, and in all, broker by broker ("nodes").
    power_losses: Counter[str] = field(default_factory=Counter)
    power_loss_bag: list[str] = field(default_factory=list)  # the next shapes, in order
    recorder: Recorder | None = None  # set by run_nemesis: observations go to the history
    probes: int = 0  # probe topics created (power-loss)
    acls_opened: bool = False  # OPEN_ACLS acknowledged (open_acls): probe ACLs may be added


Action = Callable[[NemesisContext], Awaitable[tuple[str, ...]]]


def _names(nodes: list[int] | set[int]) -> tuple[str, ...]:
    return tuple(f"n{i}" for i in sorted(nodes))


def _show(nodes: list[int]) -> str:
    return ",".join(_names(nodes))


async def _leader(ctx: NemesisContext) -> int:
    try:
        leaders = await ctx.cluster.leaders(ctx.topic)
    except (ClusterFault, OSError, trio.TooSlowError) as exc:
        raise NothingToDo(f"no broker answered METADATA: {exc}") from exc
    live = [n for n in leaders.values() if n in ctx.cluster.alive()]
    if not live:
        raise NothingToDo("no partition has a live leader")
    return ctx.rng.choice(live)


def _kill(ctx: NemesisContext, nodes: list[int] | set[int]) -> None:
    for n in nodes:
        ctx.cluster.kill(n)
        ctx.dead.add(n)


def _restart(ctx: NemesisContext) -> tuple[str, ...]:
    started = sorted(ctx.dead)
    for n in started:
        if not ctx.cluster.running(n):
            ctx.cluster.start(n)
    ctx.dead.clear()
    return _names(started)


async def _start_kill_leader(ctx: NemesisContext) -> tuple[str, ...]:
    node = await _leader(ctx)
    _kill(ctx, [node])
    return _names([node])


async def _start_kill_minority(ctx: NemesisContext) -> tuple[str, ...]:
    members = ctx.cluster.alive()
    k = (len(ctx.cluster.members) - 1) // 2
    if k < 1 or len(members) < len(ctx.cluster.members):
        raise NothingToDo("no minority to kill")
    nodes = ctx.rng.sample(members, k)
    _kill(ctx, nodes)
    return _names(nodes)


async def _stop_restart(ctx: NemesisContext) -> tuple[str, ...]:
    return _restart(ctx)


async def _start_pause(ctx: NemesisContext) -> tuple[str, ...]:
    try:
        node = await _leader(ctx)
    except NothingToDo:
        alive = ctx.cluster.alive()
        if not alive:  # every broker down (a fault left unhealed, or stopped by someone else)
            raise
        node = ctx.rng.choice(alive)
    ctx.cluster.pause(node)
    return _names([node])


async def _stop_pause(ctx: NemesisContext) -> tuple[str, ...]:
    paused = sorted(ctx.cluster.paused)
    for n in paused:
        ctx.cluster.resume(n)
    return _names(paused)


def _cut_between(ctx: NemesisContext, a: list[int], b: list[int]) -> None:
    for x in a:
        for y in b:
            ctx.network.cut(x, y)
            ctx.network.cut(y, x)


async def _start_partition(ctx: NemesisContext) -> tuple[str, ...]:
    members = list(ctx.cluster.members)
    ctx.rng.shuffle(members)
    shape = ctx.rng.choice(["halves", "isolate-leader", "bridge", "one-way"])
    if shape in ("isolate-leader", "one-way"):
        try:
            leader = await _leader(ctx)
        except NothingToDo:
            leader = members[0]
        others = [m for m in members if m != leader]
        if shape == "isolate-leader":
            _cut_between(ctx, [leader], others)
        else:
            for o in others:  # the leader cannot send; it still hears the others
                ctx.network.cut(leader, o)
        ctx.log.append(f"partition {shape}: n{leader} | {_show(others)}")
        return _names([leader])
    if shape == "bridge" and len(members) >= 3:
        bridge, rest = members[0], members[1:]
        half = len(rest) // 2
        _cut_between(ctx, rest[:half], rest[half:])
        ctx.log.append(f"partition bridge n{bridge}: {_show(rest[:half])} | {_show(rest[half:])}")
        return _names([bridge])
    minority = members[: (len(members) - 1) // 2 or 1]
    majority = members[len(minority) :]
    _cut_between(ctx, minority, majority)
    ctx.log.append(f"partition halves: {_show(minority)} | {_show(majority)}")
    return _names(minority)


async def _stop_network(ctx: NemesisContext) -> tuple[str, ...]:
    ctx.network.heal()
    return ()


async def _start_latency(ctx: NemesisContext) -> tuple[str, ...]:
    if ctx.network.proxies is None:
        raise NothingToDo("no proxy layer")
    delay = ctx.rng.uniform(0.05, 0.3)
    ctx.network.proxies.set_delay(delay)
    ctx.log.append(f"latency {delay * 1000:.0f} ms on every peer link")
    return _names(ctx.cluster.members)


async def _start_loss(ctx: NemesisContext) -> tuple[str, ...]:
    if ctx.network.proxies is None:
        raise NothingToDo("no proxy layer")
    p = ctx.rng.uniform(0.005, 0.05)
    ctx.network.proxies.set_loss(p)
    ctx.log.append(f"loss: a peer connection resets with p={p:.3f} per chunk")
    return _names(ctx.cluster.members)


async def _start_restart_all(ctx: NemesisContext) -> tuple[str, ...]:
    nodes = ctx.cluster.alive()
    _kill(ctx, nodes)
    return _names(nodes)


def _segments(ctx: NemesisContext, node: int) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for p, d in partition_dirs(ctx.cluster.data_dir, node, ctx.topic).items():
        logs = sorted(f for f in os.listdir(d) if f.endswith(".log"))
        if logs:
            out[p] = [os.path.join(d, f) for f in logs]
    return out


async def _start_disk_truncate(ctx: NemesisContext) -> tuple[str, ...]:
    if ctx.cluster.paused or ctx.dead:
        raise NothingToDo("another node is down")
    node = ctx.rng.choice(ctx.cluster.alive())
    _kill(ctx, [node])  # files are touched only while their broker is stopped
    for p, logs in _segments(ctx, node).items():
        active = logs[-1]
        size = segment_data_end(active)  # the file runs on with preallocated zeros
        if size == 0:
            continue
        cut = ctx.rng.randint(1, min(size, 4096))
        if ctx.rng.random() < 0.5:
            os.truncate(active, size - cut)
            ctx.log.append(f"n{node} {ctx.topic}/{p}: truncated {cut} bytes off {active}")
        else:
            with open(active, "r+b") as f:
                f.seek(size - cut)
                f.write(bytes(ctx.rng.randrange(256) for _ in range(cut)))
            ctx.log.append(f"n{node} {ctx.topic}/{p}: {cut} garbage bytes at the end of {active}")
    return _names([node])


async def _start_disk_bitflip(ctx: NemesisContext) -> tuple[str, ...]:
    if ctx.cluster.paused or ctx.dead:
        raise NothingToDo("another node is down")
    candidates = [
        (node, p, logs[:-1])
        for node in ctx.cluster.alive()
        for p, logs in _segments(ctx, node).items()
        if len(logs) > 1
    ]
    if not candidates:
        raise NothingToDo("no sealed segment yet")
    node, p, sealed = ctx.rng.choice(candidates)
    _kill(ctx, [node])
    path = ctx.rng.choice(sealed)
    size = os.path.getsize(path)
    if size == 0:
        raise NothingToDo("empty sealed segment")
    pos, bit = ctx.rng.randrange(size), ctx.rng.randrange(8)
    with open(path, "r+b") as f:
        f.seek(pos)
        byte = f.read(1)[0]
        f.seek(pos)
        f.write(bytes([byte ^ (1 << bit)]))
    ctx.log.append(f"n{node} {ctx.topic}/{p}: flipped bit {bit} of byte {pos} of {path}")
    return _names([node])


async def _start_membership(ctx: NemesisContext) -> tuple[str, ...]:
    if not ctx.membership_added and ctx.cluster.spares and not ctx.dead and not ctx.cluster.paused:
        ctx.membership_added = True
        node = await ctx.cluster.add_broker()  # once: the spare joins for good
        ctx.log.append(f"n{node} added to the cluster (ADDBROKER)")
        return _names([node])
    members = ctx.cluster.members
    p = ctx.rng.randrange(ctx.partitions)
    topic = ctx.topic
    replicas: list[int] = []
    try:
        metadata = await ctx.cluster.ask_any(lambda c: c.refresh_metadata([topic]))
    except KafkaesqueError:
        pass  # a refusal (NOT_READY...): no replicas known
    else:
        row = metadata.partition(topic, p)
        replicas = [] if row is None else list(row.replicas)
    if not replicas:
        raise NothingToDo(f"no replicas known for {ctx.topic}/{p}")
    outside = [m for m in members if m not in replicas]
    new = [*replicas]
    if outside:  # move one replica to a broker that had none: one added, one removed
        new[ctx.rng.randrange(len(new))] = ctx.rng.choice(outside)
    elif len(new) > 1:  # every broker holds it: remove one (it is added back at stop)
        new.pop(ctx.rng.randrange(len(new)))
    else:
        raise NothingToDo("a single replica on the only broker")
    try:
        await ctx.cluster.ask_any(partial(_reassign, topic, p, new), timeout=30.0)
    except KafkaesqueError as exc:  # a refusal (no answer is a ClusterFault)
        raise NothingToDo(f"REASSIGN answered {exc}") from exc
    ctx.moved[p] = replicas
    ctx.log.append(f"{ctx.topic}/{p}: replicas {replicas} -> {new}")
    return _names(new)


async def _reassign(topic: str, p: int, replicas: list[int], client: AsyncClient) -> None:
    """``REASSIGN`` ``topic``/``p`` to ``replicas``; the ``ask`` timeout bounds its wait."""
    await client.reassign(topic, p, replicas, wait_s=0.0)


async def _stop_membership(ctx: NemesisContext) -> tuple[str, ...]:
    back: list[int] = []
    for p, replicas in sorted(ctx.moved.items()):
        try:
            await ctx.cluster.ask_any(partial(_reassign, ctx.topic, p, replicas), timeout=30.0)
        except KafkaesqueError as exc:  # a refusal (no answer is a ClusterFault)
            ctx.log.append(f"{ctx.topic}/{p}: moving back answered {exc}")
            continue
        except (ClusterFault, OSError, trio.TooSlowError) as exc:
            ctx.log.append(f"{ctx.topic}/{p}: moving back failed: {exc}")
            continue
        back.extend(replicas)
        del ctx.moved[p]
    return _names(set(back))


def _require_whole(ctx: NemesisContext) -> None:
    """An operator's procedure starts from a healthy cluster: every member running, none paused
    (a fault left unhealed, e.g. a broker that did not come back, makes it find nothing to do)."""
    down = [m for m in ctx.cluster.members if not ctx.cluster.running(m)]
    if ctx.dead or ctx.cluster.paused or down:
        raise NothingToDo(f"not every broker is up (down: {_show(down)})")


async def _start_rolling_restart(ctx: NemesisContext) -> tuple[str, ...]:
    """Restart every member, one at a time, gracefully; returns those stopped. A broker that
    does not come back (or catch up) in time ends the rolling restart there, as an operator
    would stop: it is the last one returned, and the log says why."""
    _require_whole(ctx)
    cluster = ctx.cluster
    done: list[int] = []
    for node in sorted(cluster.members):
        old = cluster.pid(node)
        t0 = trio.current_time()
        status = await cluster.terminate(node)
        t1 = trio.current_time()
        how = f"exit {status}" if status is not None else "killed: no exit after SIGTERM"
        try:
            cluster.start(node)
            await cluster.wait_ready(READY_TIMEOUT_S, nodes=[node])
            t2 = trio.current_time()
            await cluster.wait_in_sync(node, READY_TIMEOUT_S)
        except (ClusterFault, OSError, trio.TooSlowError) as exc:
            # It was stopped: the fault happened to it, so it is among the targets.
            ctx.log.append(f"rolling-restart n{node}: {how}; not back: {exc}; stopped there")
            if not cluster.running(node):
                ctx.dead.add(node)  # started again at stop
            done.append(node)
            break
        t3 = trio.current_time()
        ctx.log.append(
            f"rolling-restart n{node}: pid {old} -> {cluster.pid(node)}: SIGTERM, {how} after "
            f"{t1 - t0:.2f} s, ready {t2 - t1:.2f} s later, in sync {t3 - t2:.2f} s later"
        )
        done.append(node)
    return _names(done)


async def _start_decommission(ctx: NemesisContext) -> tuple[str, ...]:
    """Admit a spare, then decommission one of the other members; returns (new, removed)."""
    _require_whole(ctx)
    cluster = ctx.cluster
    if not cluster.spares:
        raise NothingToDo("no spare broker left to bring in")
    old = list(cluster.members)
    new = await cluster.add_broker()
    ctx.log.append(f"decommission: n{new} added (ADDBROKER)")
    leaving = ctx.rng.choice(old)
    try:
        reply = await cluster.remove_broker(leaving)
    except (ClusterFault, OSError, trio.TooSlowError) as exc:
        # The spare stays a member: the cluster grew by one, which is no harm to the run.
        ctx.log.append(f"decommission: n{leaving} not removed: {exc}")
        if not cluster.running(leaving):
            ctx.dead.add(leaving)  # stopped for a BUSY answer: started again at stop
        return _names([new])
    # A partition the membership nemesis moved is not moved back onto a broker that is gone.
    for p, replicas in sorted(ctx.moved.items()):
        if leaving in replicas:
            ctx.log.append(f"{ctx.topic}/{p}: not moved back to {replicas}: n{leaving} is gone")
            del ctx.moved[p]
    ctx.log.append(
        f"decommission: n{leaving} removed ({reply}), gone from every broker's METADATA, "
        f"stopped; members {_show(cluster.members)}"
    )
    return _names([new, leaving])


POWER_LOSS_SHAPES = ("one", "one", "pause-kill", "part-kill")
"""The shapes after each whole-cluster loss, in a random order (a bag, as Tetris deals its
pieces): every run's first power loss is the whole cluster's (the harshest, and the one a run of
30 s must not miss), then these four, then the whole cluster again... The NATS choreographies
need three brokers; with fewer, a single broker loses power instead."""
PROBE_TIMEOUT_S = 5.0
"""How long a power loss waits for the CREATE of its probe topic (then it goes ahead)."""
STARVE_S = (2.0, 4.0)
"""How long the minority is starved of writes before a member of the majority loses power."""


async def _power_off(ctx: NemesisContext, nodes: list[int]) -> None:
    """SIGKILL ``nodes`` (those running) and cut their disks' power; they are ``dead`` then."""
    disks = ctx.disks
    if disks is None:
        raise NothingToDo("no disk images: power-loss needs root")
    _kill(ctx, nodes)  # every process first: a whole-cluster loss is one instant for all
    for n in nodes:
        disk = disks.disks[n]
        _observe(ctx, n, disk.mount_point, "before-cut")
        try:
            attempts = await trio.to_thread.run_sync(disk.power_cut)
        except (PowerLossError, OSError) as exc:
            raise ClusterFault(f"power cut of n{n} failed: {exc}") from exc
        _observe(ctx, n, disk.mount_point, "after-cut")
        ctx.power_losses["nodes"] += 1
        ctx.log.extend(disk.log)
        disk.log.clear()
        ctx.log.append(f"power-loss n{n}: disk cut (copy {attempts}), generation {disk.generation}")


def _observe(ctx: NemesisContext, node: int, broker_dir: str, moment: str) -> None:
    """Record what ``node``'s disk holds of its terms and votes (it must be down)."""
    states, problems = read_raft_states(broker_dir)
    ctx.log.extend(f"n{node} {moment}: {p}" for p in problems)
    if ctx.recorder is not None:
        ctx.recorder.record("ok", "disk", HardStates(moment, states), f"n{node}")


async def _probe_topic(ctx: NemesisContext) -> None:
    """CREATE a topic of one partition before a power loss: the controller has acknowledged it,
    so every broker must list it once all are back (``metadata_regression``)."""
    rec = ctx.recorder
    ctx.probes += 1
    op = CreateTopic(f"{ctx.topic}-probe-{ctx.probes}", 1)
    rf = min(3, len(ctx.cluster.members))
    if rec is not None:
        rec.record("invoke", "admin", op)
    kind: EventType
    try:
        await ctx.cluster.ask_any(lambda c: c.create_topic(op.topic, 1, rf), PROBE_TIMEOUT_S)
    except KafkaesqueError as exc:
        kind = "fail" if not exc.outcome_unknown else "info"
        ctx.log.append(f"CREATE {op.topic}: {exc}")
    except (ClusterFault, OSError, trio.TooSlowError) as exc:
        kind = "info"
        ctx.log.append(f"CREATE {op.topic}: {exc}")
    else:
        kind = "ok"
    if rec is not None:
        rec.record(kind, "admin", op)
    if ctx.acls_opened:  # else the first ACL would close the cluster to the workload
        await add_acl(ctx, probe_acl(op.topic))


async def open_acls(ctx: NemesisContext, timeout: float = 60.0) -> None:
    """Add ``OPEN_ACLS`` (recorded), each sent again until acknowledged (``ACL ADD`` is
    idempotent): once a cluster has one ACL, what no ACL allows is refused, so everyone is
    allowed everything before the power losses' probes add theirs. Run before the workload
    starts. ``ClusterFault`` if they are not all acknowledged within ``timeout``."""
    with trio.move_on_after(timeout):
        for row in OPEN_ACLS:
            while await add_acl(ctx, row) != "ok":
                await trio.sleep(0.5)
        ctx.acls_opened = True
        return
    raise ClusterFault("ACL ADD of the open ACLs not acknowledged")


async def add_acl(ctx: NemesisContext, row: AclRow) -> EventType:
    """``ACL ADD`` ``row``, recorded as ``AddAcl`` by ``admin``; returns how it completed."""
    rec = ctx.recorder
    acl = AddAcl(acl_text(row))
    if rec is not None:
        rec.record("invoke", "admin", acl)
    kind: EventType
    try:
        await ctx.cluster.ask_any(lambda c: c.add_acl(row), PROBE_TIMEOUT_S)
    except KafkaesqueError as exc:
        kind = "fail" if not exc.outcome_unknown else "info"
        ctx.log.append(f"ACL ADD {acl.acl}: {exc}")
    except (ClusterFault, OSError, trio.TooSlowError) as exc:
        kind = "info"
        ctx.log.append(f"ACL ADD {acl.acl}: {exc}")
    else:
        kind = "ok"
    if rec is not None:
        rec.record(kind, "admin", acl)
    return kind


OPEN_ACLS = tuple(
    AclRow("User:*", AclPermission.ALLOW, AclOperation.ALL, resource, AclPattern.LITERAL, name)
    for resource, name in (
        (AclResource.CLUSTER, CLUSTER_RESOURCE_NAME),
        (AclResource.TOPIC, "*"),
        (AclResource.GROUP, "*"),
    )
)
"""Everyone may do everything (``open_acls``): added before the workload of a power-loss run."""


def probe_acl(topic: str) -> AclRow:
    """The ACL a power loss's probe adds: everyone may do everything on its probe topic (an
    allow among allows: it changes no answer, and its loss shows in ``ACL LIST``)."""
    return AclRow(
        "User:*", AclPermission.ALLOW, AclOperation.ALL, AclResource.TOPIC, AclPattern.LITERAL,
        topic,
    )  # fmt: skip


def acl_text(row: AclRow) -> str:
    """An ACL as ``ACL LIST`` shows it: ``principal permission operation resource pattern
    name``."""
    return " ".join(
        str(x)
        for x in (row.principal, row.permission, row.operation, row.resource, row.pattern, row.name)
    )


async def _start_power_loss(ctx: NemesisContext) -> tuple[str, ...]:
    members = list(ctx.cluster.members)
    await _probe_topic(ctx)
    if not ctx.power_loss_bag:
        bag = list(POWER_LOSS_SHAPES)
        ctx.rng.shuffle(bag)
        ctx.power_loss_bag = ["all", *bag]
    shape = ctx.power_loss_bag.pop(0)
    if shape.endswith("-kill") and len(members) < 3:
        shape = "one"
    if shape == "all":
        await _power_off(ctx, members)  # a broker already down loses its disk's cache too
        ctx.power_losses["all"] += 1
        ctx.log.append(f"power-loss all: {_show(members)}")
        return _names(members)
    up = [m for m in ctx.cluster.alive() if m not in ctx.cluster.paused]
    if shape == "one" or len(up) < len(members):
        if not up:
            raise NothingToDo("no broker runs")
        node = ctx.rng.choice(up)
        await _power_off(ctx, [node])
        ctx.power_losses["one"] += 1
        return _names([node])
    # NATS (jepsen-io/nats nemesis.clj pause-kill / part-kill): starve a minority, power-fail
    # one member of the majority, then a new majority: the crashed node and the starved ones.
    ctx.rng.shuffle(members)
    k = (len(members) - 1) // 2
    minority, majority = members[:k], members[k:]
    crashed, rest = majority[0], majority[1:]
    pause = shape == "pause-kill"
    if pause:
        for m in minority:
            ctx.cluster.pause(m)
    else:
        _cut_between(ctx, minority, majority)
    await trio.sleep(ctx.rng.uniform(*STARVE_S))
    await _power_off(ctx, [crashed])
    ctx.cluster.start(crashed)
    ctx.dead.discard(crashed)
    if pause:
        for m in minority:
            ctx.cluster.resume(m)
        for r in rest:
            ctx.cluster.pause(r)
    else:
        ctx.network.heal()
        _cut_between(ctx, [*minority, crashed], rest)
    ctx.power_losses[shape] += 1
    ctx.log.append(
        f"power-loss {shape}: starved {_show(minority)}, n{crashed} power-failed and restarted, "
        f"then {'paused' if pause else 'cut off'} {_show(rest)}"
    )
    return _names(members)


async def _stop_power_loss(ctx: NemesisContext) -> tuple[str, ...]:
    ctx.network.heal()
    resumed = await _stop_pause(ctx)
    return tuple(sorted(set(resumed) | set(_restart(ctx))))


FAULTS: dict[str, tuple[Action, Action, tuple[float, float]]] = {
    # kind: (start, stop, (min, max) seconds held)
    "kill-leader": (_start_kill_leader, _stop_restart, (2.0, 8.0)),
    "kill-minority": (_start_kill_minority, _stop_restart, (2.0, 8.0)),
    "pause": (_start_pause, _stop_pause, (2.0, 8.0)),
    "partition": (_start_partition, _stop_network, (3.0, 10.0)),
    "latency": (_start_latency, _stop_network, (3.0, 10.0)),
    "loss": (_start_loss, _stop_network, (3.0, 10.0)),
    "restart-all": (_start_restart_all, _stop_restart, (0.5, 2.0)),
    "disk-truncate": (_start_disk_truncate, _stop_restart, (1.0, 3.0)),
    "disk-bitflip": (_start_disk_bitflip, _stop_restart, (1.0, 3.0)),
    "membership": (_start_membership, _stop_membership, (5.0, 15.0)),
    # The work is done in the start (seconds per broker); stop only starts a broker that was
    # left down (one that did not come back, or was stopped for BUSY and not removed).
    "rolling-restart": (_start_rolling_restart, _stop_restart, (0.5, 2.0)),
    "decommission": (_start_decommission, _stop_restart, (0.5, 2.0)),
    "power-loss": (_start_power_loss, _stop_power_loss, (1.0, 6.0)),
}


async def _apply(rec: Recorder, kind: str, phase: str, action: Action, ctx: NemesisContext) -> bool:
    """Record and run one phase; True if it happened."""
    start = phase == "start"
    which: NemesisPhase = "start" if start else "stop"
    rec.record("invoke", PROCESS, Nemesis(kind, which))
    try:
        targets = await action(ctx)
    except (NothingToDo, ClusterFault, OSError, trio.TooSlowError) as exc:
        ctx.log.append(f"{kind} {phase}: {exc}")
        rec.record(
            "fail" if start else "info", PROCESS, Nemesis(kind, "start" if start else "stop")
        )
        return False
    rec.record("ok", PROCESS, Nemesis(kind, which, targets))
    return True


async def run_nemesis(
    rec: Recorder,
    ctx: NemesisContext,
    kinds: list[str],
    interval_s: float,
    stop: trio.Event,
) -> None:
    """Until ``stop``: wait ~``interval_s``, start a random fault, hold it, heal it."""
    ctx.recorder = rec
    while not stop.is_set():
        with trio.move_on_after(ctx.rng.uniform(0.5 * interval_s, 1.5 * interval_s)):
            await stop.wait()
        if stop.is_set():
            return
        kind = ctx.rng.choice(kinds)
        start, stop_action, (lo, hi) = FAULTS[kind]
        if await _apply(rec, kind, "start", start, ctx):
            with trio.move_on_after(ctx.rng.uniform(lo, hi)):
                await stop.wait()
            await _apply(rec, kind, "stop", stop_action, ctx)


async def heal_everything(ctx: NemesisContext) -> None:
    """Undo every fault still active: network, pauses, dead brokers, moved partitions."""
    ctx.network.heal()
    for n in sorted(ctx.cluster.paused):
        ctx.cluster.resume(n)
    _restart(ctx)
    for n in ctx.cluster.members:
        if not ctx.cluster.running(n):
            ctx.cluster.start(n)
    if ctx.moved:
        await _stop_membership(ctx)
