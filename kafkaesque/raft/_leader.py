"""The leader's half of ``RaftNode``: replication, commit, heartbeats, read-index, and the
requests only a leader takes (proposals, membership changes, transfers, reads).

A mixin only to keep modules small: every method runs on a ``RaftNode``; the state it touches is
declared here for the type checker and defined and documented in ``_core``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._config import BUG_COMMIT_OLD_TERM
from ._errors import NotLeader, ProposalDropped, RaftUsageError
from ._membership import Configuration
from ._messages import (
    AppendEntries,
    AppendEntriesResponse,
    Heartbeat,
    HeartbeatResponse,
    InstallLogStart,
    TimeoutNow,
)
from ._progress import Progress, ProgressState
from ._ready import ReadState
from ._types import Entry, EntryKind, Role

if TYPE_CHECKING:
    import random
    from collections.abc import Sequence

    from ._config import RaftConfig
    from ._log import RaftLog
    from ._messages import Message
    from ._progress import ProgressTracker
    from ._read_only import ReadOnly


class LeaderMixin:
    """Leader-side methods of ``RaftNode``."""

    if TYPE_CHECKING:
        # Declared for the type checker only; RaftNode defines (and documents) all of them.
        id: int
        _cfg: RaftConfig
        _rng: random.Random
        _bugs: frozenset[str]
        _term: int
        _role: Role
        _log: RaftLog
        _conf: Configuration
        _configs: list[tuple[int, Configuration]]
        _tracker: ProgressTracker
        _read_only: ReadOnly
        _transferee: int | None
        _read_round: int
        _round_unsent: bool
        _reads_before_commit: list[bytes]
        _read_states: list[ReadState]
        _needs_bcast: bool
        _commit_news: bool
        _heartbeat_elapsed: int
        _election_elapsed: int
        _leader: int | None

        def _send(self, m: Message) -> None: ...
        def become_follower(self, term: int, leader: int | None) -> None: ...
        def _config_at(self, index: int) -> Configuration: ...
        def _push_configs(self, entries: Sequence[Entry]) -> bool: ...
        def _configs_changed(self) -> None: ...

    # -- leader side of replication ---------------------------------------------------------------

    def _append_own(self, kind: EntryKind, data: bytes, count: int, prepared: Any = None) -> int:
        last = self._log.last_index()
        entry = Entry(self._term, last + 1, last + count, kind, data, prepared)
        self._log.append([entry])
        self._needs_bcast = True
        if kind is EntryKind.CONFIG:
            self._push_configs([entry])
            self._configs_changed()
        # A single voter commits as soon as the entry is durable (see advance).
        return entry.last

    def _send_append(self, to: int, pr: Progress, send_if_empty: bool) -> bool:
        """Send what ``to`` lacks (if not paused); return whether a message went out."""
        if pr.is_paused():
            return False
        log = self._log
        start = log.start_offset()
        if pr.next < start:
            # Retention deleted what the follower needs: tell it where our log starts.
            if pr.state is ProgressState.REPLICATE:
                pr.become_probe()
            prev = start - 1
            self._send(
                InstallLogStart(
                    self.id, to, self._term, start, log.term_at(prev), self._config_at(prev)
                )
            )
            pr.probe_sent = True
            return True
        entries: list[Entry] = []
        if pr.next <= log.last_index():
            entries = log.entries(pr.next, self._cfg.max_msg_bytes)
            pr.next = entries[0].first  # a hint may point inside an entry: resend all of it
        elif not send_if_empty:
            return False
        prev = pr.next - 1
        if not entries and pr.state is ProgressState.REPLICATE and prev == pr.match:
            # It holds everything we have: only the commit could be news, and that rides on
            # what is sent anyway (§5.3: "in future AppendEntries RPCs (including
            # heartbeats)"): the next AppendEntries or the tick's heartbeat. An empty
            # AppendEntries would cost the follower an answer and us a step to read it.
            return False
        self._send(
            AppendEntries(
                self.id, to, self._term, prev, log.term_at(prev), log.commit, tuple(entries)
            )
        )
        last_new = entries[-1].last if entries else prev
        pr.sent_commit = max(pr.sent_commit, min(log.commit, last_new))
        if entries:
            pr.sent_entries(entries[-1].last)
        elif pr.state is ProgressState.PROBE:
            pr.probe_sent = True
        return True

    def _bcast_append(self) -> None:
        """Send every follower the entries it lacks, and probe each follower being probed with
        no probe out (a member just added, say). Nothing to a replicating follower that holds
        every entry or has them on their way: a commit alone waits for what is sent anyway."""
        last = self._log.last_index()  # the log does not change while we send
        for node, pr in self._tracker.progress.items():
            if node == self.id:
                continue
            # Fill the window: each call sends at most max_msg_bytes. Once the follower's next
            # offset is past our last, another call would send nothing (nothing is empty-sent
            # here): stop without making it.
            sent = self._send_append(node, pr, pr.state is ProgressState.PROBE)
            while sent and pr.state is ProgressState.REPLICATE and pr.next <= last:
                sent = self._send_append(node, pr, False)

    def _bcast_heartbeat(self, *, skip_answering: bool = False) -> None:
        """Heartbeat every follower; with ``skip_answering``, not those that answered an
        AppendEntries since the last heartbeat and hold our whole log: their answer shows both
        sides alive. Such a follower that was not told our commit yet gets it in a heartbeat
        that asks no answer (the commit's only carrier when no AppendEntries follows). Unless
        reads wait for a round (only heartbeats carry rounds, and their answers confirm it)."""
        commit = self._log.commit
        last = self._log.last_index()
        skip_answering = skip_answering and not len(self._read_only)
        for node, pr in self._tracker.progress.items():
            if node == self.id:
                continue
            answered, pr.answered = pr.answered, False
            told = min(pr.match, commit)
            if skip_answering and answered and pr.match == last:
                if pr.sent_commit >= told:
                    continue
                pr.sent_commit = told
                self._send(Heartbeat(self.id, node, self._term, told, self._read_round, False))
                continue
            pr.sent_commit = max(pr.sent_commit, told)
            self._send(Heartbeat(self.id, node, self._term, told, self._read_round))

    def _handle_append_response(self, m: AppendEntriesResponse, pr: Progress) -> None:
        if not m.success:
            if m.conflict_term is None and m.conflict_index <= pr.match:
                # The follower's log ends below what it acknowledged: its disk lost entries
                # (corruption). Its match goes down with its log, so its old acknowledgement is
                # never counted for entries it no longer holds, and we resend from there.
                pr.lost_to(m.conflict_index - 1)
                self._send_append(m.src, pr, True)
                return
            if m.conflict_term is None:
                hint_next = m.conflict_index
            else:
                # Skip the follower's conflicting term in one round trip: if we have that term,
                # resume after our last entry of it; otherwise at its first offset in their log.
                ours = self._log.last_index_of_term(m.conflict_term)
                hint_next = m.conflict_index if ours is None else ours + 1
            if pr.maybe_decr_to(m.index, hint_next):
                self._send_append(m.src, pr, True)
            return
        if pr.maybe_update(m.index):
            if pr.state is ProgressState.PROBE:
                pr.become_replicate()
            else:
                pr.inflights.free_le(m.index)
            # A match at or below the commit cannot move the quorum past it (see
            # _maybe_commit). A new commit rides on the next AppendEntries; with
            # ``eager_commit_news`` a follower that would wait for one hears it at this step's
            # end (``_send_commit_news``), else at the tick's heartbeat.
            if pr.match > self._log.commit:
                self._maybe_commit()
            if (
                self._cfg.eager_commit_news
                and pr.sent_commit < min(pr.match, self._log.commit)
                and pr.state is ProgressState.REPLICATE
            ):
                self._commit_news = True
            if pr.next <= self._log.last_index():
                self._needs_bcast = True  # the window opened on entries not sent yet: send them
            if m.src == self._transferee and pr.match == self._log.last_index():
                self._send(TimeoutNow(self.id, m.src, self._term))

    def _handle_heartbeat_response(self, m: HeartbeatResponse, pr: Progress) -> None:
        if m.round > pr.acked_round:
            pr.acked_round = m.round
            self._maybe_release_reads()
        if pr.match >= self._log.last_index():
            return
        if pr.state is ProgressState.PROBE:
            pr.probe_sent = False  # the probe (or its answer) was lost: probe again
            self._send_append(m.src, pr, True)
        elif pr.inflights.full():
            # Every message of the window may have been lost. An empty AppendEntries is answered
            # by a rejection (and a new probe) if so, without waiting for a new proposal.
            prev = pr.next - 1
            if prev >= self._log.start_offset() - 1:
                self._send(
                    AppendEntries(
                        self.id, m.src, self._term, prev, self._log.term_at(prev), self._log.commit
                    )
                )
            else:
                # Retention deleted the end of the window: nothing there to probe with. Probe
                # from the match instead, which tells the follower where our log starts now.
                pr.become_probe()
                self._send_append(m.src, pr, True)
        else:
            self._send_append(m.src, pr, True)

    def _maybe_commit(self) -> bool:
        """Commit the offset a majority of voters hold, if it is of this term (§5.4.2).

        Called whenever a match rises or the voters change, so between calls the quorum's
        match is at most the commit or not of this term: a match that rises to at most the
        commit leaves it so, and its caller may skip this call.
        """
        if self._role is not Role.LEADER:
            return False
        index = self._tracker.quorum_match(self._conf)
        log = self._log
        if index <= log.commit:
            return False
        # Figure 8: an entry of an older term replicated on a majority may still be overwritten
        # by a future leader; only counting replicas of a current-term entry is safe.
        term = log.term_at(index)
        if term != self._term and BUG_COMMIT_OLD_TERM not in self._bugs:
            return False
        # The first commit of this term releases the reads that waited for it (none wait once
        # it happened: the list is tested first, so that the usual commit looks up no term).
        first_of_term = (
            bool(self._reads_before_commit)
            and term == self._term
            and log.term_at(log.commit) != self._term
        )
        log.commit_to(index)
        if self._cfg.eager_commit_news:
            self._commit_news = True  # (this Ready has the commit range: never an empty one)
        if first_of_term:
            reads, self._reads_before_commit = self._reads_before_commit, []
            for ctx in reads:
                self._add_read(ctx)
        self._after_commit()
        return True

    def _after_commit(self) -> None:
        # Forget configurations below the log start (keep the one in force there: a follower
        # caught up through InstallLogStart needs it).
        if len(self._configs) > 1:  # (the log start is only read when there is one to drop)
            start = self._log.start_offset()
            while len(self._configs) > 1 and self._configs[1][0] <= start - 1:
                self._configs.pop(0)
        if (
            self._role is Role.LEADER
            and self.id not in self._conf.voters
            and self._configs
            and self._configs[-1][0] <= self._log.commit
        ):
            # Our removal is committed: lead no more (thesis §4.2.2).
            self.become_follower(self._term, None)

    # -- read index ------------------------------------------------------------------------------

    def _add_read(self, ctx: bytes) -> None:
        if self._conf.voters == {self.id}:
            self._read_states.append(ReadState(ctx, self._log.commit))
            return
        if not self._round_unsent:
            self._read_round += 1
            self._round_unsent = True
        self._read_only.add(self._read_round, ctx, self._log.commit)

    def _maybe_release_reads(self) -> None:
        if self._role is not Role.LEADER or not len(self._read_only):
            return
        me = self._tracker.progress.get(self.id)
        if me is not None:
            # Our own echo: a round counts for us only once its heartbeats are out.
            me.acked_round = self._read_round - (1 if self._round_unsent else 0)
        self._read_states.extend(self._read_only.release(self._tracker.quorum_round(self._conf)))

    def _flush(self) -> None:
        """Turn pending leader work into messages (batching everything since the last Ready)."""
        if self._role is not Role.LEADER:
            return
        if self._round_unsent:
            self._round_unsent = False
            self._heartbeat_elapsed = 0
            self._bcast_heartbeat()
        if self._needs_bcast:
            self._needs_bcast = False
            self._bcast_append()
        if self._commit_news:
            self._commit_news = False
            self._send_commit_news()

    def _send_commit_news(self) -> None:
        """Tell each replicating follower the commit it holds entries up to and was not told,
        in a heartbeat that asks no answer (after ``_bcast_append``: a follower that gets new
        entries in this Ready learns the commit with them). ``eager_commit_news`` only.

        Why: a follower's replica serves long polls (a consumer reading its own broker's
        replica); told only by the next AppendEntries, it would hand each record over as late as
        the next write of the partition, or a tick (50 ms) after the last one."""
        commit = self._log.commit
        for node, pr in self._tracker.progress.items():
            if node == self.id or pr.state is not ProgressState.REPLICATE:
                continue
            told = min(pr.match, commit)
            if pr.sent_commit < told:
                pr.sent_commit = told
                self._send(Heartbeat(self.id, node, self._term, told, self._read_round, False))

    # -- the application's requests ----------------------------------------------------------

    def _require_leader(self) -> None:
        if self._role is not Role.LEADER:
            raise NotLeader(self._leader)
        if self._transferee is not None:
            raise ProposalDropped(f"leadership is being transferred to {self._transferee}")

    def propose(self, data: bytes, count: int = 1, prepared: Any = None) -> int:
        """Append a DATA entry of ``count`` offsets; return its last offset (its Raft index).

        ``prepared`` rides with the entry to the storage (``Entry.prepared``).

        The entry is in the current ``term``. It is committed once a Ready's ``committed`` range
        covers the returned offset while the log still holds it in that term; a later
        ``truncate_from`` at or below it means it was lost (the client may retry).

        Raises:
            NotLeader: not the leader (``leader`` hint attached).
            ProposalDropped: a transfer is running or this leader is being removed.
            ValueError: ``count < 1``.
        """
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count}")
        self._require_leader()
        if self.id not in self._conf.members:
            raise ProposalDropped("this leader is being removed from the group")
        return self._append_own(EntryKind.DATA, data, count, prepared)

    def _propose_config(self, new: Configuration) -> int:
        if self._log.term_at(self._log.commit) != self._term:
            # Without this, a change may be lost to a leader elected by the previous
            # configuration's majority (Ongaro, raft-dev 2015, "single-server changes bug").
            raise ProposalDropped("no entry of this term is committed yet")
        if self._configs and self._configs[-1][0] > self._log.commit:
            raise ProposalDropped("a membership change is already in flight")
        return self._append_own(EntryKind.CONFIG, new.encode(), 1)

    def add_learner(self, node: int) -> int:
        """Propose adding ``node`` as a learner; return the CONFIG entry's offset.

        Raises:
            NotLeader, ProposalDropped: as for ``propose`` (also: a change is in flight, or no
                entry of this term is committed yet).
            InvalidConfigChange: ``node`` is already a member.
        """
        self._require_leader()
        return self._propose_config(self._conf.add_learner(node))

    def promote(self, node: int) -> int:
        """Propose making learner ``node`` a voter; return the CONFIG entry's offset.

        Raises:
            NotLeader, ProposalDropped: as for ``add_learner``; also when the learner has not yet
                replicated the committed prefix (a lagging new voter would stall commits).
            InvalidConfigChange: ``node`` is not a learner.
        """
        self._require_leader()
        new = self._conf.promote(node)
        pr = self._tracker.progress.get(node)
        if pr is None or pr.match < self._log.commit:
            raise ProposalDropped(f"learner {node} has not caught up yet")
        return self._propose_config(new)

    def remove(self, node: int) -> int:
        """Propose removing ``node`` (voter or learner; may be this leader, which then steps down
        once the removal is committed); return the CONFIG entry's offset.

        Raises:
            NotLeader, ProposalDropped: as for ``add_learner``.
            InvalidConfigChange: ``node`` is not a member, or is the last voter.
        """
        self._require_leader()
        return self._propose_config(self._conf.remove(node))

    def transfer_leadership(self, to: int) -> None:
        """Hand leadership to voter ``to``: catch it up, then send it TimeoutNow (thesis §3.10).

        Proposals are refused while the transfer runs; it is abandoned after an election timeout.
        Transferring to self is a no-op.

        Raises:
            NotLeader: not the leader.
            RaftUsageError: ``to`` is not a voter.
        """
        if self._role is not Role.LEADER:
            raise NotLeader(self._leader)
        if to == self.id:
            return
        if to not in self._conf.voters:
            raise RaftUsageError(f"cannot transfer leadership to non-voter {to}")
        if self._transferee == to:
            return
        self._transferee = to
        self._election_elapsed = 0  # the transfer gets one election timeout
        pr = self._tracker.progress[to]
        if pr.match == self._log.last_index():
            self._send(TimeoutNow(self.id, to, self._term))
        else:
            self._send_append(to, pr, True)

    def read_index(self, ctx: bytes) -> None:
        """Ask for a linearizable read point; the answer comes as a ``ReadState(ctx, index)``.

        Serve the read once the applied offset reaches ``index``. If leadership is lost first, the
        ctx comes back in ``Ready.dropped_reads``. See ``_read_only`` for why it is safe.

        Raises:
            NotLeader: not the leader (forward the read there).
        """
        if self._role is not Role.LEADER:
            raise NotLeader(self._leader)
        if self._log.term_at(self._log.commit) != self._term:
            self._reads_before_commit.append(ctx)
        else:
            self._add_read(ctx)
