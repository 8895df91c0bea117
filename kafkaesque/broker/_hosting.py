"""The partitions this broker hosts: one Raft group and log each, kept in step with the metadata.

``PartitionHosting`` opens the replicas the metadata assigns here and drops those it moved away
or deleted (``reconcile_loop``), steers every group led here toward its assigned replicas, one
membership change at a time (``membership_loop``, see ``_membership``), and keeps the hosted logs:
retention and compaction (``retention_loop``), the ``interval`` fsync policy's flushes
(``interval_flush_loop``). The broker runs the loops in its nursery.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Callable

import trio

from kafkaesque.raft import InvalidConfigChange, NotLeader, ProposalDropped, RaftUsageError, Role
from kafkaesque.raft.driver import MultiRaft, RaftReplica
from kafkaesque.storage import FlushTicket, FsyncPolicy, LogConfig

from ._appender import Appenders
from ._config import BrokerConfig
from ._leaders import Claim, LeaderTable
from ._log_ids import log_id_of
from ._membership import Change, next_change
from ._metadata import ClusterMetadata
from ._metadata_view import TopicInfo

log = logging.getLogger("kafkaesque.broker")

_RECONCILE_EVERY_S = 1.0
_COMPACTED_SEGMENT_BYTES = 1 << 20
_MEMBERSHIP_EVERY_S = 0.2


class PartitionHosting:
    """The replicas hosted here (see the module docstring).

    Built by the broker with its settings, the metadata that assigns the replicas, the Raft
    driver that hosts them, the leaders' claims (each group's membership as its leader reports
    it), the appenders (a deleted topic's go), and ``admit_peer``: the broker's own business of
    knowing every registered broker.
    """

    def __init__(
        self,
        config: BrokerConfig,
        metadata: ClusterMetadata,
        raft: MultiRaft,
        leaders: LeaderTable,
        appenders: Appenders,
        admit_peer: Callable[[int, str, int], None],
    ) -> None:
        self._config = config
        self._metadata = metadata
        self._raft = raft
        self._leaders = leaders
        self._appenders = appenders
        self._admit_peer = admit_peer

    async def reconcile_loop(self) -> None:
        """Host the partitions the metadata assigns here; know every registered broker.

        Runs on every metadata change and every ``_RECONCILE_EVERY_S`` (a replica that was
        moved away is dropped only once the group's leader has committed its removal, which
        the metadata does not announce).
        """
        version = -1
        # Replicas of a partition being moved away that this broker held when it stopped: it
        # is still a member of their groups (perhaps the only one with the log) until their
        # leader commits its removal, so it opens them again, though no longer assigned here.
        leaving = await trio.to_thread.run_sync(_partitions_on_disk, self._config.broker_dir)
        while True:
            with trio.move_on_after(_RECONCILE_EVERY_S):
                await self._metadata.wait_changed(version)
            view = self._metadata.view
            version = view.version
            for broker in view.brokers.values():
                self._admit_peer(broker.id, broker.host, broker.peer_port)
            for info in view.topics.values():
                for partition, replicas in enumerate(info.replicas):
                    held = (info.name, partition) in leaving and partition in info.reassigned
                    if self._config.id in replicas or held:
                        leaving.discard((info.name, partition))
                        self.host(info, partition, replicas)
            for log_id in list(self._raft.replicas):
                topic, _, number = log_id.rpartition("/")
                hosted = view.topics.get(topic)
                if hosted is None:
                    await self._drop(log_id, deleted=True)
                elif self._config.id not in hosted.replicas[int(number)] and self._moved_away(
                    log_id
                ):
                    log.info("broker %d: %s moved away; dropping it", self._config.id, log_id)
                    await self._drop(log_id)

    def _moved_away(self, log_id: str) -> bool:
        """Whether a committed membership of the group no longer holds this broker."""
        claim = self.membership(log_id)
        return (
            claim is not None
            and claim.committed
            and self._config.id not in claim.voters | claim.learners
        )

    def membership(self, log_id: str) -> Claim | None:
        """The group's members as its leader sees them (this broker's, if it leads)."""
        replica = self._raft.replicas.get(log_id)
        if replica is not None and replica.role is Role.LEADER:
            return claim_of(replica)
        return self._leaders.claim(log_id)

    async def retention_loop(self) -> None:
        """Delete each hosted log's oldest segments past its topic's size or age limit, and
        compact the sealed segments of compacted topics (the latest record of each key stays).

        Every replica does it on its own, and only below its commit index; a follower that
        falls behind the leader's new log start is caught up from there (Raft's log-start
        catch-up), and compaction keeps every batch's offsets and term, so Raft's view of the
        log does not change. Deleting is a few unlinks; compacting a compacted topic's small
        segments is short: both stay on the event loop.
        """
        while True:
            await trio.sleep(self._config.retention_check_interval_s)
            topics = self._metadata.view.topics
            for replica in list(self._raft.replicas.values()):
                if self._raft.replicas.get(replica.id) is not replica:
                    continue  # dropped meanwhile
                bound = replica.commit_index + 1
                replica.log.enforce_retention(max_offset=bound)
                info = topics.get(replica.id.rpartition("/")[0])
                if info is not None and info.config.compact and replica.log.segment_count > 1:
                    replica.log.compact(max_offset=bound)
                await trio.lowlevel.checkpoint()

    async def interval_flush_loop(self) -> None:
        """fsync the logs of the ``interval`` fsync policy that hold unflushed writes, every
        half interval: the Raft driver flushes such a log only when a later write finds the
        interval passed, so a burst followed by silence would stay in the page cache for as
        long as the silence lasts. With this loop a power loss loses at most about the last
        interval of acknowledged writes, as ``--fsync interval`` promises (docs/operations.md).

        The fsyncs run on a worker thread (as the driver's do), all of a pass at once; a log
        dropped meanwhile is not told (its ticket only closed a duplicate descriptor). A failed
        fsync is fatal, as in the driver: what the log holds on disk is unknown, so it is
        raised and stops the broker.
        """
        period = self._config.fsync_interval_ms / 2000
        while True:
            await trio.sleep(period)
            due = [
                (replica, replica.log.flush_ticket())
                for replica in list(self._raft.replicas.values())
                if replica.log.config.fsync is FsyncPolicy.INTERVAL
                and replica.log.flushed_end_offset < replica.log.log_end_offset
            ]
            if not due:
                continue
            await trio.to_thread.run_sync(_run_tickets, [ticket for _, ticket in due])
            for replica, ticket in due:
                if self._raft.replicas.get(replica.id) is replica:
                    replica.log.flushed(ticket)

    async def membership_loop(self) -> None:
        """Steer every group led here toward its assigned replicas (see ``_membership``)."""
        while True:
            await trio.sleep(_MEMBERSHIP_EVERY_S)
            topics = self._metadata.view.topics
            for replica in list(self._raft.replicas.values()):
                topic, _, partition = replica.id.rpartition("/")
                info = topics.get(topic)
                if info is None or replica.role is not Role.LEADER:
                    continue
                target = frozenset(info.replicas[int(partition)])
                change = next_change(replica.node.configuration, target, self._config.id)
                if change is not None:
                    self._apply(replica.id, change)

    def _apply(self, log_id: str, change: Change) -> None:
        steps = {
            "add_learner": self._raft.add_learner,
            "promote": self._raft.promote,
            "remove": self._raft.remove_member,
            "transfer": self._raft.transfer_leadership,
        }
        try:
            steps[change.action](log_id, change.node)
        except (NotLeader, ProposalDropped, InvalidConfigChange, RaftUsageError) as exc:
            log.debug("broker %d: %s %s later: %s", self._config.id, change, log_id, exc)
            return
        log.info("broker %d: %s: %s %d", self._config.id, log_id, change.action, change.node)

    def preferred_replica(self, log_id: str) -> int | None:
        """The preferred leader of a group: its partition's first assigned replica (None: the
        topic or partition is not in the metadata)."""
        topic, _, number = log_id.rpartition("/")
        info = self._metadata.view.topics.get(topic)
        if info is None or not number.isdigit() or int(number) >= len(info.replicas):
            return None
        replicas = info.replicas[int(number)]
        return replicas[0] if replicas else None

    def _log_config(self, info: TopicInfo) -> LogConfig:
        """The settings of ``info``'s partition logs here: the topic's, this broker's where the
        topic has none (the fsync policy)."""
        c = info.config
        return LogConfig(
            # A compacted topic rolls small segments: compaction rewrites only sealed ones, and
            # its pause stays short (the live keys of a small log, not 64 MiB of history).
            segment_bytes=min(self._config.segment_bytes, _COMPACTED_SEGMENT_BYTES)
            if c.compact
            else self._config.segment_bytes,
            retention_ms=c.retention_ms,
            retention_bytes=c.retention_bytes,
            fsync=FsyncPolicy(c.fsync or self._config.fsync),
            fsync_interval_ms=self._config.fsync_interval_ms,
        )

    def host(self, info: TopicInfo, partition: int, replicas: tuple[int, ...]) -> None:
        log_id = log_id_of(info.name, partition)
        log_config = self._log_config(info)
        replica = self._raft.replicas.get(log_id)
        if replica is not None:
            # A live change (ALTER): retention and segment size are read by the log at each
            # use, so the open log takes them now. The fsync policy is fixed at CREATE, so a
            # change of it never meets a log with acknowledged data it did not flush.
            if replica.log.config != log_config:
                replica.log.config = log_config
            return
        directory = os.path.join(self._config.broker_dir, info.name, str(partition))
        # The assignment spreads first replicas over the brokers: they are the preferred leaders
        # of a new partition. A replica of a reassigned partition joins its running group as a
        # spare (``TopicInfo.reassigned``): it waits for the leader to add and catch it up.
        bootstrap = info.bootstrap(partition)
        self._raft.add_replica(
            log_id,
            directory,
            bootstrap,
            log_config,
            preferred=replicas[0] if bootstrap is not None else -1,
        )

    async def _drop(self, log_id: str, *, deleted: bool = False) -> None:
        """Stop hosting the group and delete its files; ``deleted``: the whole topic went,
        so writes queued for it here fail too."""
        topic, _, partition = log_id.rpartition("/")
        if deleted:
            self._appenders.topic_deleted(topic, int(partition))
        directory = self._raft.remove_replica(log_id)
        if directory is not None:
            await trio.to_thread.run_sync(_remove_tree, directory)
            topic_dir = os.path.dirname(directory)
            await trio.to_thread.run_sync(_remove_empty_dir, topic_dir)


def _run_tickets(tickets: list[FlushTicket]) -> None:
    """Run every flush ticket (on a worker thread); the first failure is raised after all ran."""
    errors: list[OSError] = []
    for ticket in tickets:
        try:
            ticket.run()
        except OSError as exc:
            errors.append(exc)
    if errors:
        raise errors[0]


def _partitions_on_disk(broker_dir: str) -> set[tuple[str, int]]:
    """``(topic, partition)`` of every partition directory under ``broker_dir``."""
    found: set[tuple[str, int]] = set()
    with contextlib.suppress(FileNotFoundError):
        for topic in os.scandir(broker_dir):
            if topic.is_dir():
                found.update(
                    (topic.name, int(p.name))
                    for p in os.scandir(topic.path)
                    if p.is_dir() and p.name.isdigit()
                )
    return found


def _remove_tree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _remove_empty_dir(path: str) -> None:
    # Fails while other partitions of the topic are still there (or when it is gone already).
    with contextlib.suppress(OSError):
        os.rmdir(path)


def claim_of(replica: RaftReplica) -> Claim:
    """The group's members as this broker, its leader, reports them (``LeaderClaims``)."""
    node = replica.node
    conf = node.configuration
    return Claim(node.term, conf.voters, conf.learners, node.configuration_committed)
