"""The controller quorum: cluster metadata replicated by pysyncobj on every controller.

What the metadata holds, its value types, errors and rules are in :mod:`._metadata_view`.

Layout. :class:`._metadata_state.MetadataState` is the state machine, pure and deterministic
(:mod:`._metadata_state`). ``_ReplicatedState`` is pysyncobj's handle on it: one
``@replicated`` method per command. :class:`ClusterMetadata` is the trio side.

Threads. Each :class:`ClusterMetadata` runs its ``SyncObj`` in one thread of its own
(:class:`._thread_bridge.TickingThread`, ``autoTick=False``): the SyncObj is built, ticked, applies
its log and is destroyed on that thread, and :class:`MetadataState` is only ever touched there.
The trio thread only enqueues commands (pysyncobj's queue is thread-safe) and receives answers and
immutable :class:`MetadataView` snapshots through ``TrioToken.run_sync_soon``
(:mod:`._thread_bridge`).

Errors. An apply function never raises (see :mod:`._metadata_state`): a refusal is returned as a
:class:`MetadataError` value and raised on the caller's side. :class:`MetadataUnavailable` is the
retriable failure; its ``maybe_applied`` tells "certainly not applied" from "outcome unknown".

Durability (pysyncobj 0.3.17, read from its source). The journal is written through ``mmap`` and
never fsynced, term and vote are saved by write-and-rename without fsync, and the commit index is
saved about once a second: metadata survives a crash of the process (the kernel holds the pages),
not a power loss of a majority. A restarted replica may replay less than it had applied and
catches up from the leader.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import queue
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast

import trio
from pysyncobj import SyncObj, SyncObjConf, SyncObjConsumer, SyncObjException
from pysyncobj import replicated as _pysyncobj_replicated

from kafkaesque.protocol import AclRow
from kafkaesque.storage import makedirs_durable

from . import _controller_journal, _thread_bridge
from ._metadata_state import MetadataState
from ._metadata_view import (
    ALTERABLE,
    BrokerInfo,
    InvalidConfigError,
    MetadataError,
    MetadataUnavailable,
    MetadataView,
    TopicConfig,
    TopicInfo,
    acl_problem,
    acl_tuple,
    config_problem,
)

__all__ = [
    "ControllerSettings",
    "ClusterMetadata",
]

log = logging.getLogger("kafkaesque.broker.metadata")

_T = TypeVar("_T")
_F = TypeVar("_F", bound=Callable[..., object])

_RETRY_DELAY = 0.05  # seconds between two sends of a command pysyncobj certainly refused


@dataclass(frozen=True)
class ControllerSettings:
    """pysyncobj tuning. The defaults suit a LAN or loopback cluster.

    Elections start after ``raft_min_timeout``..``raft_max_timeout`` without a leader; a leader
    that heard from no majority for ``leader_fallback_timeout`` steps down (pysyncobj's default of
    30 s keeps a cut-off leader in office that long); ``connection_retry_time`` is the reconnection
    period (pysyncobj's default is 5 s; a restarted controller is not heard before a member
    reconnects to it, and a broker is not ready before that: 0.2 s, issue 23). ``tick_period``
    bounds how long the controller thread sleeps in ``poll`` between two ticks: a command
    appended by one tick is replicated by the next, so it is also a command's delay (a stop
    request and a call queued from trio wake the poll at once). The log is compacted into the
    full dump after ``log_compaction_min_entries`` entries or ``log_compaction_min_time``
    seconds.
    """

    raft_min_timeout: float = 0.4
    raft_max_timeout: float = 1.4
    append_entries_period: float = 0.1
    connection_timeout: float = 3.5
    connection_retry_time: float = 0.2
    leader_fallback_timeout: float = 3.0
    tick_period: float = 0.05
    log_compaction_min_entries: int = 5000
    log_compaction_min_time: float = 300.0
    #: False: pysyncobj's own journal, which never fsyncs (a power cut can roll back a vote or
    #: forget acknowledged metadata). Only for measuring what durability costs (bench.controller).
    durable_journal: bool = True


# --- pysyncobj's handle on the state machine ------------------------------------------------


class _Decorator(Protocol):
    def __call__(self, func: _F, /) -> _F: ...


# pysyncobj has no type hints. This is the very same function object, only typed: `replicated`
# finds the class body it decorates by frame depth, so it must not be wrapped in another function.
_replicated = cast(_Decorator, _pysyncobj_replicated)


@dataclass(frozen=True)
class _Applied:
    """What a command returns to its caller: its answer, and the state version just after it."""

    version: int
    value: object


class _ReplicatedState(SyncObjConsumer):  # type: ignore[misc]  # pysyncobj is untyped
    """The commands of :class:`MetadataState` as pysyncobj replicated methods.

    Called on the trio thread, a method only enqueues its command
    (``_thread_bridge.call_replicated``); pysyncobj then runs its body on its own thread on every
    replica, in log order. Arguments and the dump are plain tuples, never our classes (see
    :meth:`MetadataState.to_primitive`).
    """

    def __init__(self) -> None:
        super().__init__()
        self.state = MetadataState()
        # A dump this code cannot read. pysyncobj logs and swallows any error of loading a dump
        # and then stops applying (its journal starts after the dump): kept here so that the
        # controller stops loudly instead (see ClusterMetadata._post_status).
        self.load_error: Exception | None = None

    def _applied(self, value: object) -> _Applied:
        return _Applied(self.state.version, value)

    @_replicated
    def register_broker(self, fields: tuple[Any, ...]) -> _Applied:
        self.state.register_broker(BrokerInfo(*fields))
        return self._applied(None)

    # ``auto`` was added after journals existed: an old entry has two arguments, and a new
    # argument (rather than a new replicated method, which would renumber pysyncobj's methods,
    # numbered in name order) keeps them readable.
    @_replicated
    def create_topic(self, name: str, config: tuple[Any, ...], auto: bool = False) -> _Applied:
        return self._applied(self.state.create_topic(name, TopicConfig(*config), auto=auto))

    @_replicated
    def delete_topic(self, name: str) -> _Applied:
        return self._applied(self.state.delete_topic(name))

    @_replicated
    def set_replicas(self, topic: str, partition: int, replicas: tuple[int, ...]) -> _Applied:
        return self._applied(self.state.set_replicas(topic, partition, replicas))

    # pysyncobj numbers replicated methods in name order, and a journal holds the numbers: a
    # new method whose name sorts after every older one (hence "update_", not "alter_") leaves
    # the older ones' numbers, so journals written before it still read.
    @_replicated
    def update_topic(self, name: str, changes: tuple[tuple[str, Any], ...]) -> _Applied:
        return self._applied(self.state.alter_topic(name, dict(changes)))

    # Sorts after "update_topic" (see above): "remove_broker" would renumber it.
    @_replicated
    def withdraw_broker(self, broker_id: int) -> _Applied:
        return self._applied(self.state.remove_broker(broker_id))

    # Sorts after "withdraw_broker" (see above). Adds and removes ACLs (6-tuples of str).
    @_replicated
    def write_acls(self, add: tuple[Any, ...], remove: tuple[Any, ...]) -> _Applied:
        return self._applied(self.state.write_acls(add, remove))

    def _serialize(self) -> dict[str, Any]:
        return self.state.to_primitive()

    def _deserialize(self, data: Mapping[str, Any]) -> None:
        try:
            self.state = MetadataState.from_primitive(data)
        except (ValueError, TypeError, KeyError) as exc:
            self.load_error = exc


# --- The trio side --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Controller:
    """The objects that live on the controller thread (see :class:`ClusterMetadata`)."""

    sync: Any  # pysyncobj.SyncObj
    replicated: _ReplicatedState


@dataclass(frozen=True)
class _Status:
    """What the controller thread tells the trio side after a tick."""

    view: MetadataView
    ready: bool  # a leader is known and this replica caught up with it
    members: frozenset[str]  # controller addresses in this replica's configuration


def _ask_transfer(sync: Any) -> None:
    """On the controller thread: ask pysyncobj to hand its leadership to the most caught-up
    connected follower. A failure is logged, never raised: it would stop the controller."""
    try:
        sync.transferLeadership(None, None)
    except Exception:
        log.exception("pysyncobj's transferLeadership failed")


def _address(host: str, port: int) -> str:
    return f"{host}:{port}"


def _expect(kind: type[_T], value: object) -> _T:
    if not isinstance(value, kind):
        raise AssertionError(f"expected a {kind.__name__}, got {value!r}")
    return value


class ClusterMetadata:
    """One controller of the metadata quorum, used from trio.

    ``controllers`` maps broker ids to controller addresses and must include ``self_id``; with
    ``join=True`` it holds the running members plus this one, and this replica waits for a member
    to :meth:`add_controller` it (pysyncobj needs no other setting for that: the members refuse
    its connections until then, so it cannot vote or disturb them; ``join`` states the intent).
    State goes to ``data_dir`` (journal and full dump). ``secret`` is the cluster password:
    pysyncobj sends pickles, so anyone who can reach the port without it could run code here.
    ``timeout`` bounds every command.

    ``on_change`` is called on the trio thread, from :meth:`run`'s task, with the new view after
    changes (consecutive changes may be coalesced into one call); an exception from it ends
    :meth:`run`.

    Every command but :meth:`delete_topic` is idempotent, and is sent again within ``timeout``
    whenever an attempt failed (a leader change, a follower whose leader vanished); after the
    timeout it raises :class:`MetadataUnavailable`. When a command returns, :attr:`view` already
    shows its effect.
    """

    def __init__(
        self,
        self_id: int,
        controllers: Mapping[int, tuple[str, int]],
        data_dir: str,
        secret: bytes,
        *,
        timeout: float = 5.0,
        on_change: Callable[[MetadataView], None] | None = None,
        join: bool = False,
        settings: ControllerSettings | None = None,
    ) -> None:
        if self_id not in controllers:
            raise ValueError(f"controllers must include this broker ({self_id})")
        if not secret:
            raise ValueError("the cluster secret must not be empty")
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0, not {timeout}")
        self._self_id = self_id
        self._ids_by_address = {_address(*addr): bid for bid, addr in controllers.items()}
        self._self_address = _address(*controllers[self_id])
        self._data_dir = data_dir
        self._secret = secret
        self._timeout = timeout
        self._on_change = on_change
        self._join = join
        self._settings = settings or ControllerSettings()
        # Trio thread only:
        self._view = MetadataState().snapshot(None)
        self._ready = False
        self._members: frozenset[str] = frozenset()
        self._changed = trio.Event()  # set and replaced whenever a status arrives
        self._view_changed = trio.Event()  # set when on_change has a view to see
        self._controller: _Controller | None = None
        self._started = False
        self._stopped = False
        self._token: trio.lowlevel.TrioToken | None = None
        self._view_listeners: list[Callable[[MetadataView], None]] = []
        # Controller thread only: the last status posted.
        self._posted: _Status | None = None
        # Calls for the controller thread, given the SyncObj (pysyncobj is not thread-safe
        # beyond its command queue): put by the trio thread, run at the start of a tick.
        self._on_thread: queue.SimpleQueue[Callable[[Any], object]] = queue.SimpleQueue()

    # -- reading --

    @property
    def view(self) -> MetadataView:
        """The latest view applied by this replica; replaced (never mutated) on the trio thread."""
        return self._view

    @property
    def members(self) -> frozenset[str]:
        """Controller addresses (``host:port``) in this replica's configuration, itself included.

        Empty until :meth:`run` has started; updated on the trio thread after every change.
        """
        return self._members

    def add_view_listener(self, listener: Callable[[MetadataView], None]) -> None:
        """Call ``listener`` with each new view, on the trio thread, the moment it arrives
        (before any task sees it through :attr:`view`, and before a command that changed it
        returns): what must never lag the view (the access checks' ACLs). It must be quick and
        must not raise."""
        self._view_listeners.append(listener)

    async def wait_changed(self, after_version: int) -> MetadataView:
        """Return the view as soon as its version is above ``after_version``. Unbounded."""
        while self._view.version <= after_version:
            await self._changed.wait()
        return self._view

    async def wait_ready(self) -> None:
        """Return once a leader is known and this replica has applied what it had committed.

        "Caught up" is pysyncobj's ``isReady``: it is reached once and never lost, whereas a
        leader must be known at the time of the call. Unbounded: wrap it in ``trio.fail_after``.
        """
        while not self._ready:
            await self._changed.wait()

    # -- running --

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run this controller until cancelled; report started once its port is bound.

        Starts the SyncObj (journal and full dump in ``data_dir``) on a thread of its own, keeps
        :attr:`view` current, and calls ``on_change``. On exit the SyncObj is destroyed and its
        thread has ended. May be called once.

        Raises ``OSError`` if the controller port cannot be bound (before reporting started).
        Later failures (of the controller thread, or of ``on_change``) come out of its nursery in
        an ``ExceptionGroup``.
        """
        if self._started:
            raise RuntimeError("ClusterMetadata.run() may be called once")
        self._started = True
        self._token = trio.lowlevel.current_trio_token()
        try:
            thread = await _thread_bridge.TickingThread.open(
                f"kafkaesque-controller-{self._self_id}", self._open, self._tick, self._close
            )
        except BaseException:
            self._stopped = True
            raise
        if self._join:
            log.info("controller %d waits to be added to the quorum", self._self_id)
        try:
            self._controller = thread.value
            async with trio.open_nursery() as nursery:
                nursery.start_soon(thread.wait)
                if self._on_change is not None:
                    nursery.start_soon(self._call_on_change, self._on_change)
                task_status.started()
        finally:
            self._controller = None
            self._stopped = True
            # Out of the tick's poll at once; aclose() sets the thread's stop flag first.
            self._wake(thread.value)
            await thread.aclose()

    async def _call_on_change(self, on_change: Callable[[MetadataView], None]) -> None:
        while True:
            await self._view_changed.wait()
            self._view_changed = trio.Event()
            on_change(self._view)

    def _open(self) -> _Controller:
        """Build the SyncObj; on the controller thread (binding and key derivation block)."""
        makedirs_durable(self._data_dir)
        s = self._settings
        journal = os.path.join(self._data_dir, "controller.journal")
        dump = os.path.join(self._data_dir, "controller.dump")
        if s.durable_journal:
            _controller_journal.install()
            _controller_journal.register(journal, dump)  # durable before it acks or votes
        conf = SyncObjConf(
            password=self._secret,  # it sends pickles: never without a password
            # Without it pysyncobj binds the wildcard (0.0.0.0 or ::) whatever host it was
            # given: a loopback cluster would expose its pickle port everywhere (issue 39).
            bindAddress=self._self_address,
            autoTick=False,  # ticked by our own thread, so its lifetime is ours
            appendEntriesUseBatch=False,  # batching costs ~100 ms a commit
            useFork=False,  # never fork a threaded process
            journalFile=journal,
            # Without it, a replica restarted after a compaction stops applying.
            fullDumpFile=dump,
            dynamicMembershipChange=True,
            # Without a leader, refuse at once (MISSING_LEADER: certainly not applied; we retry)
            # rather than queue: a queued command would apply whenever a leader shows up, maybe
            # long after its caller gave up.
            commandsWaitLeader=False,
            # One bind attempt: pysyncobj's constructor busy-loops between attempts.
            maxBindRetries=1,
            raftMinTimeout=s.raft_min_timeout,
            raftMaxTimeout=s.raft_max_timeout,
            appendEntriesPeriod=s.append_entries_period,
            connectionTimeout=s.connection_timeout,
            connectionRetryTime=s.connection_retry_time,
            leaderFallbackTimeout=s.leader_fallback_timeout,
            logCompactionMinEntries=s.log_compaction_min_entries,
            logCompactionMinTime=s.log_compaction_min_time,
        )
        others = [a for a in self._ids_by_address if a != self._self_address]
        handle = _ReplicatedState()
        try:
            sync = SyncObj(self._self_address, others, conf=conf, consumers=[handle])
        except SyncObjException as exc:
            if exc.errorCode == "BindError":
                raise OSError(f"cannot bind the controller port {self._self_address}") from exc
            raise
        controller = _Controller(sync, handle)
        # Called in every tick after the log is applied and before the tick sleeps in poll: a
        # status posted after doTick() returned would lag the answers by up to a poll timeout.
        sync.addOnTickCallback(lambda: self._post_status(controller))
        return controller

    def _tick(self, controller: _Controller) -> None:
        """Run the calls queued by the trio side (``hand_over_leadership``), then one pysyncobj
        tick (it posts the status, see _open); on the controller thread.

        Not a longer sleep when idle: a command the tick appends is replicated only by the next
        tick (pysyncobj's leader sends it with its next AppendEntries), so a longer poll delays
        every metadata change (measured: a follower broker's view then lagged a CREATE that the
        leader's broker had answered; tests/broker/test_line_session.py's DESCRIBE test failed
        3 times in 23).
        """
        sync = controller.sync
        while not self._on_thread.empty():
            self._on_thread.get_nowait()(sync)
        sync.doTick(self._settings.tick_period)

    def _wake(self, controller: _Controller) -> None:
        """Wake the controller thread from its poll, from any thread (a stop request)."""
        notifier = getattr(controller.sync, "_SyncObj__pipeNotifier", None)
        if notifier is not None:
            with contextlib.suppress(OSError):  # closed already: the thread has ended
                notifier.notify()

    def _close(self, controller: _Controller) -> None:
        controller.sync.destroy()  # with autoTick=False: closes sockets and journal right here

    def _post_status(self, controller: _Controller) -> None:
        """Post a status to trio if the view, readiness or membership changed (controller thread).

        Command answers are posted while the tick applies the log and this later in the same
        tick, in that order: the view showing a command's effect reaches trio right after its
        answer.
        """
        if controller.replicated.load_error is not None:
            error = controller.replicated.load_error
            raise RuntimeError("cannot read the metadata dump") from error
        sync = controller.sync
        state = controller.replicated.state
        leader_node = sync._getLeader()
        leader = None if leader_node is None else self._broker_id(leader_node.id, state)
        members = frozenset([sync.selfNode.id, *(node.id for node in sync.otherNodes)])
        ready = leader_node is not None and bool(sync.isReady())
        last = self._posted
        if last is None or last.view.version != state.version:
            view = state.snapshot(leader)
        elif last.view.controller_leader != leader:
            view = dataclasses.replace(last.view, controller_leader=leader)
        elif (last.ready, last.members) == (ready, members):
            return
        else:
            view = last.view
        self._posted = _Status(view, ready, members)
        assert self._token is not None  # set by run() before the thread starts
        _thread_bridge.post(self._token, self._receive, self._posted)

    def _broker_id(self, address: str, state: MetadataState) -> int | None:
        found = self._ids_by_address.get(address)
        if found is not None:
            return found
        # A controller added at run time is known by its broker's registration.
        for broker in state.brokers.values():
            if _address(broker.host, broker.controller_port) == address:
                return broker.id
        return None

    def _receive(self, status: _Status) -> None:
        """Take a status from the controller thread; runs in trio's loop, must not raise."""
        if status.view is not self._view:
            self._view = status.view
            for listener in self._view_listeners:
                listener(status.view)
            self._view_changed.set()
        self._ready = status.ready
        self._members = status.members
        self._changed.set()
        self._changed = trio.Event()

    def _running(self) -> _Controller:
        if self._controller is not None:
            return self._controller
        if self._stopped:
            raise MetadataUnavailable("the controller has stopped", maybe_applied=False)
        raise RuntimeError("ClusterMetadata.run() has not started")

    # -- commands --

    async def _command(self, command: str, *args: object, idempotent: bool = True) -> object:
        """Replicate ``command`` (a method of ``_ReplicatedState``); return its answer or raise."""

        def select(controller: _Controller) -> Callable[..., object]:
            method: Callable[..., object] = getattr(controller.replicated, command)
            return method

        deadline = trio.current_time() + self._timeout
        answer = await self._replicate(select, *args, deadline=deadline, idempotent=idempotent)
        applied = _expect(_Applied, answer)
        if isinstance(applied.value, MetadataError):
            raise applied.value
        # Its view is posted right after its answer (see _post_status): wait for it, so that the
        # caller's next read of `view` shows its own write.
        with trio.move_on_after(self._timeout):
            await self.wait_changed(applied.version - 1)
        return applied.value

    async def _replicate(
        self,
        select: Callable[[_Controller], Callable[..., object]],
        *args: object,
        deadline: float,
        idempotent: bool,
        done: Callable[[], bool] = lambda: False,
    ) -> object:
        """Send a command until it is answered, ``done()`` is true, or the deadline passes.

        ``select`` picks the pysyncobj method from the running controller, afresh for every
        attempt (the controller may have stopped meanwhile). A command pysyncobj certainly
        refused (no leader at the moment, say) is sent again; so is one of unknown outcome when
        ``idempotent`` (applying it twice is harmless). Returns its answer, or None if ``done()``
        came true first. Raises :class:`MetadataUnavailable`, with ``maybe_applied`` if any
        attempt may have been applied.
        """
        maybe_applied = False
        while not done():
            method = select(self._running())
            remaining = max(0.0, deadline - trio.current_time())
            try:
                return await _thread_bridge.call_replicated(method, *args, timeout=remaining)
            except _thread_bridge.ReplicationError as exc:
                maybe_applied = maybe_applied or exc.maybe_applied
                hopeless = exc.maybe_applied and not idempotent
                if hopeless or deadline - trio.current_time() <= _RETRY_DELAY:
                    raise MetadataUnavailable(
                        f"controller quorum unavailable ({exc})", maybe_applied=maybe_applied
                    ) from exc
                log.debug("controller %d: %s; sending it again", self._self_id, exc)
            await trio.sleep(_RETRY_DELAY)
        return None

    async def hand_over_leadership(self, deadline: float) -> bool | None:
        """If this replica leads the controller quorum, hand the leadership to another
        controller before this broker stops (graceful shutdown); ``deadline`` in trio time.

        Uses pysyncobj's ``transferLeadership`` (Raft TimeoutNow to the most caught-up connected
        follower; pysyncobj refuses while none matches the leader's last index, so it is asked
        again every ``_RETRY_DELAY``). Returns None if this replica did not lead (nothing to
        do), True once the view names another leader, False if none does by ``deadline`` (the
        quorum then elects one after this broker stops, as after a crash). None too for a quorum
        of one controller: there is nobody to hand it to. Never raises.
        """
        me = self._self_id
        controller = self._controller
        if controller is None or self._view.controller_leader != me or len(self._members) < 2:
            return None  # not the leader, or a quorum of one: nobody to hand it to
        if not callable(getattr(controller.sync, "transferLeadership", None)):
            log.warning("controller %d: this pysyncobj cannot transfer leadership", me)
            return False
        while True:
            leader = self._view.controller_leader
            if leader is not None and leader != me:
                log.info("controller %d handed its leadership to controller %d", me, leader)
                return True
            now = trio.current_time()
            if now >= deadline or self._controller is None:
                return False
            if leader == me:  # stepped down already (None): the successor is being elected
                self._on_thread.put(_ask_transfer)
                self._wake(controller)
            with trio.move_on_at(min(deadline, now + _RETRY_DELAY)):
                await self._changed.wait()

    async def register_broker(self, info: BrokerInfo) -> None:
        """Register or update a broker (idempotent)."""
        await self._command("register_broker", dataclasses.astuple(info))

    async def create_topic(
        self, name: str, config: TopicConfig, *, auto: bool = False
    ) -> TopicInfo:
        """Create a topic, assigned over the registered brokers when the command is applied.

        Idempotent: the same config returns the existing topic. Raises :class:`TopicExistsError`
        for a different config, :class:`InvalidConfigError` (see
        :meth:`MetadataState.create_topic`), :class:`MetadataUnavailable`. With ``auto`` (a
        creation on first use), any existing topic is returned, and the replication factor is
        capped at the registered brokers, both decided as the command is applied.
        """
        problem = config_problem(name, config)
        if problem is not None:  # fail fast; apply checks it again
            raise InvalidConfigError(problem)
        fields = dataclasses.astuple(config)
        # A plain CREATE keeps the two-argument entry that older brokers apply too.
        args = (name, fields, True) if auto else (name, fields)
        answer = await self._command("create_topic", *args)
        return _expect(TopicInfo, answer)

    async def alter_topic(self, name: str, changes: Mapping[str, int | bool | None]) -> TopicInfo:
        """Change a live topic (see :meth:`MetadataState.alter_topic`); returns the topic as
        changed. Idempotent (the values are absolute). Raises :class:`UnknownTopicError`,
        :class:`InvalidConfigError`, :class:`MetadataUnavailable`.
        """
        unknown = sorted(set(changes) - ALTERABLE)
        if unknown:  # fail fast; apply checks it again
            raise InvalidConfigError(f"cannot alter {', '.join(unknown)} of a topic")
        # Sorted pairs: plain values in the journal, the same bytes for the same request.
        answer = await self._command("update_topic", name, tuple(sorted(changes.items())))
        return _expect(TopicInfo, answer)

    async def delete_topic(self, name: str) -> None:
        """Delete a topic. Raises :class:`UnknownTopicError`.

        Not idempotent: after a :class:`MetadataUnavailable` with ``maybe_applied``, a retry may
        find the topic already gone.
        """
        await self._command("delete_topic", name, idempotent=False)

    async def set_replicas(
        self, topic: str, partition: int, replicas: tuple[int, ...]
    ) -> TopicInfo:
        """Replace one partition's replicas (see :meth:`MetadataState.set_replicas`)."""
        answer = await self._command("set_replicas", topic, partition, tuple(replicas))
        return _expect(TopicInfo, answer)

    async def remove_broker(self, broker_id: int) -> None:
        """Take a broker out of the registry (see :meth:`MetadataState.remove_broker`).
        Idempotent. Raises :class:`InvalidConfigError`, :class:`MetadataUnavailable`."""
        await self._command("withdraw_broker", broker_id)

    async def add_acl(self, acl: AclRow) -> bool:
        """Add an ACL (idempotent); whether it was new. Raises :class:`InvalidConfigError`
        for an ACL that cannot be (see :func:`acl_problem`), :class:`MetadataUnavailable`."""
        row = acl_tuple(acl)
        problem = acl_problem(row)
        if problem is not None:  # fail fast; apply checks it again
            raise InvalidConfigError(problem)
        added, _ = _expect(tuple, await self._command("write_acls", (row,), ()))
        return bool(added)

    async def remove_acl(self, acl: AclRow) -> int:
        """Remove an ACL; how many were removed (0: it was not there). Idempotent (a retry
        after an unknown outcome may answer 0). Raises :class:`InvalidConfigError`,
        :class:`MetadataUnavailable`."""
        row = acl_tuple(acl)
        problem = acl_problem(row)
        if problem is not None:
            raise InvalidConfigError(problem)
        _, removed = _expect(tuple, await self._command("write_acls", (), (row,)))
        return int(removed)

    def controller_address(self, broker_id: int) -> str | None:
        """The ``host:port`` of broker ``broker_id``'s controller in this replica's quorum
        configuration (by the configured controllers, else the registration), or None."""
        for address in self._members:
            found = self._ids_by_address.get(address)
            if found is None:
                found = next(
                    (
                        b.id
                        for b in self._view.brokers.values()
                        if _address(b.host, b.controller_port) == address
                    ),
                    None,
                )
            if found == broker_id:
                return address
        return None

    async def remove_controller(self, broker_id: int) -> None:
        """Remove broker ``broker_id``'s controller from the running quorum.

        Idempotent: returns at once if it is not a member (``controller_address``).
        pysyncobj's leader cannot remove itself (it ignores the change): the caller makes sure
        ``broker_id`` does not lead (it hands the lead over when it stops gracefully); this
        replica must not be the one removed. Raises :class:`MetadataUnavailable`, and
        ``MetadataError`` if asked to remove this replica itself.
        """
        if broker_id == self._self_id:
            raise MetadataError("a controller cannot remove itself from the quorum")
        address = self.controller_address(broker_id)
        if address is None:
            return

        await self._change_quorum(
            lambda controller: controller.sync.removeNodeFromCluster,
            address,
            done=lambda: address not in self._members,
        )
        log.info("controller of broker %d at %s left the quorum", broker_id, address)

    async def add_controller(self, broker_id: int, addr: tuple[str, int]) -> None:
        """Add broker ``broker_id``'s controller at ``addr`` to the running quorum.

        Idempotent: returns at once if it is a member already. Add one controller at a time
        (pysyncobj refuses a change while another is uncommitted; that refusal is retried until
        the timeout). The new controller should run with ``join=True``; it then catches up from
        the leader. Raises :class:`MetadataUnavailable`.
        """
        address = _address(*addr)
        if address in self._members:
            return
        await self._change_quorum(
            lambda controller: controller.sync.addNodeToCluster,
            address,
            done=lambda: address in self._members,
        )
        log.info("controller of broker %d at %s is in the quorum", broker_id, address)

    async def _change_quorum(
        self,
        method: Callable[[_Controller], Callable[..., Any]],
        address: str,
        *,
        done: Callable[[], bool],
    ) -> None:
        """Add or remove the controller at ``address`` (pysyncobj's ``method``), then wait,
        within the timeout, until this replica's view of the membership shows it (``done``).

        pysyncobj refuses (REQUEST_DENIED) a change while another is uncommitted, and adding
        a member already there: retried until ``done`` or the deadline. The change is applied
        where the command answers; the status listing it is posted right after."""
        deadline = trio.current_time() + self._timeout
        await self._replicate(method, address, deadline=deadline, idempotent=True, done=done)
        with trio.move_on_after(self._timeout):
            while not done():
                await self._changed.wait()
