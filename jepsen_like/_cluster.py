"""The cluster under test: broker processes, each in its own namespace (root) or on loopback.

``JepsenCluster`` only starts, signals and restarts ``kafkaesque broker`` processes and asks them
questions over the line protocol, as an operator would. The network (namespaces, proxies) is
built by the runner and handed in as ``Placement``: where each broker listens and how it is told
about the others. Every process it starts is killed by ``stop_all`` (the runner calls it in a
``finally``), and each runs with ``--exit-with-parent`` in case the harness itself dies.

Beyond crashes (``kill``), it does what an operator does: a graceful stop (``terminate``: SIGTERM,
the broker hands its leaderships over), waiting until a restarted broker's replicas have caught
up (``wait_in_sync``, from the brokers' ``/metrics``), admitting a spare (``add_broker``) and
decommissioning a member (``remove_broker``). ``members`` is always the set of brokers admitted
and not decommissioned: the workload's bootstrap list and every nemesis read it.
"""

from __future__ import annotations

import os
import signal
import urllib.request
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

import trio

from kafkaesque.client import (
    AsyncClient,
    ClientConfig,
    ClusterMetadata,
    ErrorCode,
    KafkaesqueConnectionError,
    KafkaesqueError,
)

# The same rule as ``kafkaesque cluster restart --rolling`` (LocalCluster.wait_in_sync): which
# partition of a restarted broker is still behind its leader, read from every broker's /metrics.
from kafkaesque.local_cluster import (
    BrokerProcesses,
    broker_program,
    one_attempt,
    parse_samples,
    replicas_behind,
)

from ._secure import SecureSetup

# The broker's deliberately broken mode (kafkaesque/broker/_writes.py): acks before commit.
UNSAFE_ACK_ENV = "KAFKAESQUE_UNSAFE_ACK_BEFORE_COMMIT"
# Brokers only: a PYTHONPATH that puts another build of kafkaesque first (testing one build's
# broker with this harness, e.g. a snapshot of a commit while the checkout is being edited).
BROKER_PYTHONPATH_ENV = "KAFKAESQUE_JEPSEN_BROKER_PYTHONPATH"

_SCRAPE_TIMEOUT_S = 2.0
_POLL_S = 0.1  # how often a wait for a process or a replica looks again
STOP_TIMEOUT_S = 30.0
"""How long ``terminate`` waits for a SIGTERMed broker to exit (its hand-over takes at most its
``--shutdown-timeout``, 5 s) before it kills it."""
REMOVE_TIMEOUT_S = 240.0
"""How long ``remove_broker`` keeps sending ``REMOVEBROKER`` (each attempt waits for the moves)."""
NO_ANSWER = (KafkaesqueConnectionError, trio.TooSlowError)
"""What ``ask`` raises when the broker gave no answer (unreachable, cut, paused, too slow)."""

T = TypeVar("T")
Question = Callable[[AsyncClient], Awaitable[T]]
"""What the harness asks one broker: a call of the public client."""


class ClusterFault(RuntimeError):
    """The cluster could not be started or did not answer in time."""


@dataclass(frozen=True, slots=True)
class NodeAddress:
    """Where one broker listens (its own, real addresses)."""

    host: str
    client: int
    peer: int
    controller: int
    admin: int | None = None  # /metrics (``wait_in_sync`` reads it); None: not served


@dataclass(slots=True)
class Placement:
    """How broker processes are placed: their addresses, the peer address each one is told for
    every other (a proxy, or the real one), and the command prefix that puts it in its network."""

    nodes: dict[int, NodeAddress]
    peer_views: dict[int, dict[int, tuple[str, int]]] = field(default_factory=dict)
    prefixes: dict[int, list[str]] = field(default_factory=dict)

    def peer_of(self, viewer: int, node: int) -> tuple[str, int]:
        """The address ``viewer`` dials for ``node``'s Raft transport."""
        view = self.peer_views.get(viewer, {})
        if node in view:
            return view[node]
        a = self.nodes[node]
        return a.host, a.peer


class JepsenCluster(BrokerProcesses):
    """The brokers of one run. Synchronous process control (the local-cluster launcher's
    ``BrokerProcesses``, with this run's placement and environment); async questions (trio)."""

    def __init__(
        self,
        placement: Placement,
        data_dir: str,
        log_dir: str,
        *,
        members: list[int],
        spares: list[int] | None = None,
        segment_bytes: int = 256 * 1024,
        unsafe_ack_before_commit: bool = False,
        log_level: str = "WARNING",
        security: SecureSetup | None = None,
        fsync: str | None = None,
    ) -> None:
        """``security``: TLS and SCRAM on every broker port, and every question asked over
        them (a ``--secure`` run); None: plaintext. ``fsync``: the brokers' ``--fsync``
        (always, interval, never; None: their default, always)."""
        super().__init__(log_dir)
        self.placement = placement
        self.data_dir = data_dir
        self.members = list(members)  # brokers admitted to the cluster (voters)
        self.spares = list(spares or [])  # placed, not started: for ADDBROKER
        self.retired: list[int] = []  # decommissioned (REMOVEBROKER) and stopped: never again
        self.segment_bytes = segment_bytes
        self.unsafe = unsafe_ack_before_commit
        self.log_level = log_level
        self.security = security
        self.fsync = fsync
        self.paused: set[int] = set()

    # -- processes ------------------------------------------------------------------------------

    def command(self, node: int, *, join: bool = False) -> list[str]:
        """The full command line of broker ``node`` (namespace prefix included)."""
        p = self.placement
        known = sorted(set(self.members) | {node})
        peers = ",".join(f"{j}@{':'.join(map(str, p.peer_of(node, j)))}" for j in known)
        controllers = ",".join(f"{j}@{p.nodes[j].host}:{p.nodes[j].controller}" for j in known)
        a = p.nodes[node]
        return [
            *p.prefixes.get(node, []),
            *broker_program(), "broker",
            "--id", str(node),
            "--data-dir", self.data_dir,
            "--client", f"{a.host}:{a.client}",
            "--peers", peers,
            "--controllers", controllers,
            "--segment-bytes", str(self.segment_bytes),
            "--log-level", self.log_level,
            "--exit-with-parent",
            *([] if self.security else ["--insecure"]),  # 10.x addresses, open (safe defaults)
            *(["--admin", f"{a.host}:{a.admin}"] if a.admin is not None else []),
            *(["--join"] if join else []),
            *(["--fsync", self.fsync] if self.fsync else []),
            *(self.security.broker_args(node) if self.security else []),
        ]  # fmt: skip

    def start(self, node: int, *, join: bool = False) -> None:
        """Start broker ``node`` (it must not be running)."""
        if self.running(node):
            raise ClusterFault(f"broker {node} is already running")
        env = dict(os.environ)
        env.pop(UNSAFE_ACK_ENV, None)
        if self.unsafe:
            env[UNSAFE_ACK_ENV] = "1"
        if self.security is not None:
            env.update(self.security.broker_env())
        if os.environ.get(BROKER_PYTHONPATH_ENV):
            env["PYTHONPATH"] = os.environ[BROKER_PYTHONPATH_ENV]
        self.spawn(node, self.command(node, join=join), env)
        self.paused.discard(node)

    def alive(self) -> list[int]:
        """Members whose process runs (paused ones included)."""
        return [i for i in self.members if self.running(i)]

    def kill(self, node: int) -> None:
        """SIGKILL: a crash, no goodbye."""
        super().kill(node)
        self.paused.discard(node)

    def pid(self, node: int) -> int | None:
        """The pid of broker ``node``'s process (running or not), None if never started."""
        proc = self.procs.get(node)
        return None if proc is None else proc.pid

    async def terminate(self, node: int, timeout: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM (a graceful stop: the broker hands its leaderships over, then exits) and wait
        for the process to exit. Returns its exit status; None if it was not running, or did not
        exit within ``timeout`` and was killed (SIGKILL) then."""
        proc = self.procs.get(node)
        if proc is None or proc.poll() is not None:
            return None
        proc.send_signal(signal.SIGCONT)  # a paused broker could not act on SIGTERM
        self.paused.discard(node)
        proc.send_signal(signal.SIGTERM)
        with trio.move_on_after(timeout):
            while proc.poll() is None:
                await trio.sleep(_POLL_S)
            return proc.returncode
        self.kill(node)
        return None

    def pause(self, node: int) -> None:
        if self.running(node):
            self.procs[node].send_signal(signal.SIGSTOP)
            self.paused.add(node)

    def resume(self, node: int) -> None:
        if self.running(node):
            self.procs[node].send_signal(signal.SIGCONT)
        self.paused.discard(node)

    def stop_all(self) -> None:
        """Kill every process started (SIGCONT first, so a paused one can die), close logs."""
        self.kill_all()
        self.paused.clear()

    # -- questions ------------------------------------------------------------------------------

    def client_address(self, node: int) -> tuple[str, int]:
        a = self.placement.nodes[node]
        return a.host, a.client

    @property
    def bootstrap(self) -> list[str]:
        return [":".join(map(str, self.client_address(i))) for i in self.members]

    def client_config(self, timeout: float) -> ClientConfig:
        """The settings of the harness's own clients: one attempt (the procedures below retry
        as an operator does, and must know which broker answered), ``timeout`` for the
        connection and the request, TLS and SCRAM in a secure run."""
        return one_attempt(
            timeout, None if self.security is None else self.security.client_security()
        )

    async def ask(self, node: int, question: Question[T], timeout: float = 3.0) -> T:
        """Ask broker ``node``, and no other, ``question`` (e.g. ``lambda c:
        c.refresh_metadata()``) on a pinned client of its own: a fresh connection (as an
        operator's command opens one: never one a fault left half-open), closed after it, one
        attempt, within ``timeout``. Raises what the client raises (``KafkaesqueConnectionError``:
        no answer; another ``KafkaesqueError``: the broker's refusal) or ``trio.TooSlowError``."""
        with trio.fail_after(timeout):
            address = self.client_address(node)
            async with AsyncClient.pinned(address, config=self.client_config(timeout)) as client:
                return await question(client)

    async def ask_any(self, question: Question[T], timeout: float = 3.0) -> T:
        """``ask`` the first running, unpaused member that answers (a refusal is an answer)."""
        last: Exception | None = None
        for node in self.alive():
            if node in self.paused:
                continue
            try:
                return await self.ask(node, question, timeout)
            except NO_ANSWER as exc:
                last = exc
        raise ClusterFault(f"no broker answered: {last}")

    async def leaders(self, topic: str) -> dict[int, int]:
        """Partition → leader id, as some broker reports it now (partitions without one left
        out)."""
        try:
            metadata = await self.ask_any(lambda c: c.refresh_metadata([topic]))
        except KafkaesqueError:  # a refusal (NOT_READY...): no answer is a ClusterFault
            return {}
        rows = metadata.partitions.get(topic, ())
        return {row.partition: row.leader for row in rows if row.leader is not None}

    async def add_broker(self, timeout: float = 60.0) -> int:
        """Start the next spare with ``--join``, admit it with ``ADDBROKER``, wait until every
        member lists it; it is a member from then on. Raises ClusterFault (the spare is killed
        and kept as a spare) if it cannot."""
        if not self.spares:
            raise ClusterFault("no spare broker left")
        node = self.spares[0]
        self.start(node, join=True)
        a = self.placement.nodes[node]
        peer = self.placement.peer_of(min(self.members), node)
        try:
            try:
                await self.ask_any(
                    lambda c: c.add_broker(
                        node, f"{peer[0]}:{peer[1]}", f"{a.host}:{a.controller}"
                    ),
                    timeout,
                )
            except KafkaesqueError as exc:
                raise ClusterFault(f"ADDBROKER {node} answered {exc}") from exc
            self.members.append(node)
            self.spares.remove(node)
            await self.wait_ready(timeout, nodes=[m for m in self.alive() if m not in self.paused])
        except (ClusterFault, OSError, trio.TooSlowError):
            if node in self.spares:
                self.kill(node)
            raise
        return node

    async def remove_broker(self, node: int, timeout: float = REMOVE_TIMEOUT_S) -> str:
        """Decommission member ``node`` as an operator does: ``REMOVEBROKER`` (sent to another
        running member) until ``+OK``, then, once no broker's METADATA lists it nor places a
        replica on it, stop its process (SIGTERM) and retire it. Returns the ``+OK`` line.

        ``REMOVEBROKER`` is idempotent, so a retriable error (``TIMEOUT``: the moves go on;
        ``NO_QUORUM``, ``NOT_READY``...) or a lost connection is answered by sending it again.
        The ``BUSY`` of brokers that could not remove the controller quorum's leader (its message
        says "controller quorum") is answered the way that message says: the broker is stopped
        gracefully (it hands the lead over) and the command is sent again. Raises
        ``ClusterFault`` on a refusal that is not retriable (nothing changed then:
        ``INVALID_CONFIG``), or if it is not done within ``timeout``; ``node`` is then still a
        member.
        """
        if node not in self.members:
            raise ClusterFault(f"broker {node} is not a member")
        deadline = trio.current_time() + timeout
        last = "not sent yet"
        moved: int | None = None
        while trio.current_time() < deadline:
            senders = [m for m in self.alive() if m != node and m not in self.paused]
            if not senders:
                raise ClusterFault(f"no other broker runs to send REMOVEBROKER {node} to")
            try:
                moved = await self.ask(
                    senders[0],
                    lambda c: c.remove_broker(node, wait_s=0.0),  # the timeout is the wait
                    max(1.0, deadline - trio.current_time()),
                )
                break
            except NO_ANSWER as exc:
                if isinstance(exc, KafkaesqueError) and not exc.retriable:
                    # A reply that breaks the protocol: no refusal to act on, nothing changed.
                    raise ClusterFault(f"REMOVEBROKER {node} answered {exc}") from exc
                last = f"n{senders[0]}: {exc}"
                await trio.sleep(0.5)
                continue
            except KafkaesqueError as exc:
                last = f"-ERR {exc.code_name} {exc.message}".rstrip()
                if exc.code is ErrorCode.BUSY and "controller quorum" in exc.message:
                    await self.terminate(node)
                elif not exc.retriable:
                    raise ClusterFault(f"REMOVEBROKER {node} answered {last!r}") from exc
                await trio.sleep(0.5)
        else:
            raise ClusterFault(f"REMOVEBROKER {node} not done in {timeout:.0f} s ({last})")
        await self._wait_gone(node, max(5.0, deadline - trio.current_time()))
        await self.terminate(node)
        self.members.remove(node)
        self.retired.append(node)
        return f"+OK moved={moved}"  # the broker's reply line (its one form)

    async def _metadata(self, node: int, timeout: float) -> ClusterMetadata:
        """Broker ``node``'s ``METADATA``; a refusal (``NOT_READY``...) lists nothing."""
        try:
            return await self.ask(node, lambda c: c.refresh_metadata(), timeout)
        except KafkaesqueError as exc:
            if exc.code is None:
                raise
            return ClusterMetadata()

    async def _wait_gone(self, node: int, timeout: float) -> None:
        """Until every running member's METADATA neither registers ``node`` nor gives it a
        replica; ``ClusterFault`` after ``timeout``."""
        last = "no answer yet"
        with trio.move_on_after(timeout):
            while True:
                others = [m for m in self.alive() if m != node and m not in self.paused]
                try:
                    views = [await self._metadata(m, 3.0) for m in others]
                except NO_ANSWER as exc:
                    last = str(exc)
                    await trio.sleep(_POLL_S)
                    continue
                holding = [where for view in views for where in _holding(view, node)]
                if not holding:
                    return
                last = holding[0]
                await trio.sleep(_POLL_S)
        raise ClusterFault(f"broker {node} still in the cluster's metadata: {last}")

    async def scrape(self, node: int) -> list[tuple[str, dict[str, str], float]]:
        """Broker ``node``'s ``/metrics`` samples. ``OSError`` if it does not answer in time;
        ``ClusterFault`` if it serves none (placed without an admin port)."""
        a = self.placement.nodes[node]
        if a.admin is None:
            raise ClusterFault(f"broker {node} has no admin port")
        scheme = "http" if self.security is None else "https"
        url = f"{scheme}://{a.host}:{a.admin}/metrics"
        context = None if self.security is None else self.security.ssl_context()

        def get() -> str:
            with urllib.request.urlopen(url, timeout=_SCRAPE_TIMEOUT_S, context=context) as reply:
                return str(reply.read().decode("utf-8", "replace"))

        samples: list[tuple[str, dict[str, str], float]] = parse_samples(
            await trio.to_thread.run_sync(get)
        )
        return samples

    async def wait_in_sync(self, node: int, timeout: float = 60.0) -> None:
        """Until every partition with a replica on ``node`` has a leader and ``node``'s log
        reaches where the leader's log ended when first seen (``kafkaesque cluster restart
        --rolling``'s rule), read from every running member's ``/metrics``. ``ClusterFault``
        after ``timeout``, saying which partition is behind."""
        targets: dict[tuple[str, str], int] = {}
        waiting = "no answer yet"
        with trio.move_on_after(timeout):
            while True:
                try:
                    samples = {
                        m: await self.scrape(m) for m in self.alive() if m not in self.paused
                    }
                except OSError as exc:
                    waiting = f"metrics unreadable: {exc}"
                else:
                    behind: str | None = replicas_behind(node, samples, targets)
                    if behind is None:
                        return
                    waiting = behind
                await trio.sleep(_POLL_S)
        raise ClusterFault(
            f"broker {node}'s replicas did not catch up in {timeout:.0f} s ({waiting})"
        )

    async def high_watermarks(self, topic: str) -> dict[int, int]:
        """Partition → the highest ``end=`` (high watermark) any running broker reports.

        DESCRIBE gives the leader's view, but a broker that cannot reach the leader (a nemesis
        at work) gives its own replica's, and a replica that is behind (just restarted,
        repairing a damaged log) reports a stale end; no replica reports an end past the commit
        index, so the maximum is the best lower bound of what is committed.
        """
        out: dict[int, int] = {}
        for node in self.alive():
            if node in self.paused:
                continue
            try:
                description = await self.ask(node, lambda c: c.describe_topic(topic))
            except (KafkaesqueError, trio.TooSlowError):
                continue
            for row in description.partitions:
                if row.end_offset is not None:
                    out[row.partition] = max(out.get(row.partition, 0), row.end_offset)
        return out

    async def registered(self, node: int) -> int:
        """How many brokers ``node``'s METADATA lists."""
        return len((await self._metadata(node, 2.0)).brokers)

    async def wait_ready(self, timeout: float = 90.0, nodes: list[int] | None = None) -> None:
        """Until every running member (or ``nodes``) lists every member as registered."""
        wanted = nodes if nodes is not None else self.alive()
        last = "no answer yet"
        with trio.move_on_after(timeout):
            while True:
                for i in wanted:
                    if not self.running(i):
                        raise ClusterFault(f"broker {i} exited; see {self.log_dir}/broker-{i}.log")
                try:
                    counts = [await self.registered(i) for i in wanted]
                    if all(c >= len(self.members) for c in counts):
                        return
                    last = f"registered counts {counts}"
                except NO_ANSWER as exc:
                    last = str(exc)
                await trio.sleep(0.3)
        raise ClusterFault(f"the cluster did not become ready in {timeout:.0f} s ({last})")

    async def create_topic(self, topic: str, partitions: int, rf: int, timeout: float = 60) -> None:
        """CREATE the topic, retrying until some broker says +OK."""
        last = ""
        with trio.move_on_after(timeout):
            while True:
                try:
                    await self.ask_any(lambda c: c.create_topic(topic, partitions, rf), 30.0)
                    return
                except (ClusterFault, KafkaesqueError, trio.TooSlowError) as exc:
                    last = str(exc)
                await trio.sleep(0.5)
        raise ClusterFault(f"CREATE {topic} failed: {last}")


def _holding(view: ClusterMetadata, node: int) -> list[str]:
    """Where one broker's METADATA still has ``node``: registered, or a replica of a partition."""
    found = [f"broker {node} registered"] if node in view.brokers else []
    for rows in view.partitions.values():
        found += [
            f"{r.topic}/{r.partition} replicas {r.replicas}" for r in rows if node in r.replicas
        ]
    return found


def partition_dirs(data_dir: str, node: int, topic: str) -> Mapping[int, str]:
    """Partition → directory of ``node``'s replicas of ``topic`` that exist on disk."""
    base = os.path.join(data_dir, str(node), topic)
    out: dict[int, str] = {}
    if os.path.isdir(base):
        for name in os.listdir(base):
            if name.isdigit():
                out[int(name)] = os.path.join(base, name)
    return out
