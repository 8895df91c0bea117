"""The Raft node: a pure state machine in the style of etcd-io/raft.

Inputs: ``tick()`` (abstract time), ``step(message)``, ``propose``, membership changes,
``transfer_leadership``, ``read_index``. Output: ``ready()`` returns what to persist, send and
expose; ``advance(ready)`` says it was done. No sockets, clocks, files, threads or global
randomness: storage is read through ``RaftStorage`` and randomness comes from the injected
``random.Random``, so one seed replays one run exactly.

What is implemented (paper = the Raft paper, thesis = Ongaro's dissertation):
elections with randomized timeouts (§5.2), pre-vote (thesis §9.6), check-quorum (thesis §6.2) and
leader stickiness (thesis §4.2.3), log replication with the consistency check (§5.3), backtracking
by term (the reject hint), pipelining with a bounded in-flight window, batching of proposals into
one AppendEntries per follower and Ready, commit only by counting replicas of a current-term entry
(§5.4.2), a no-op at the start of each term, leadership transfer (thesis §3.10), one-server
membership changes (thesis §4.1), catch-up of followers behind the leader's log start, and
read-index (thesis §6.4).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from ._config import (
    BUG_FORGET_VOTE,
    BUG_VOTE_WITHOUT_LOG_CHECK,
    RaftConfig,
)
from ._errors import (
    LogDiverged,
    MalformedMessage,
    RaftInvariantError,
    RaftUsageError,
)
from ._leader import LeaderMixin
from ._log import RaftLog
from ._membership import Configuration
from ._messages import (
    AppendEntries,
    AppendEntriesResponse,
    Heartbeat,
    HeartbeatResponse,
    InstallLogStart,
    Message,
    RequestVote,
    RequestVoteResponse,
    TimeoutNow,
)
from ._progress import ProgressState, ProgressTracker
from ._read_only import ReadOnly
from ._ready import LogReset, ReadState, Ready, SoftState
from ._storage import RaftStorage
from ._types import Election, ElectionCause, Entry, EntryKind, HardState, Role

_LEADER_MESSAGES = (AppendEntries, Heartbeat, InstallLogStart)
# The same, for the hot paths' dispatch on the exact type (``type(m) in ...``, ``type(m) is
# ...``: no builtin call per test, unlike ``isinstance``). Message classes are never subclassed:
# ``to_wire`` already maps exact types to encoders.
_LEADER_TYPES: frozenset[type] = frozenset(_LEADER_MESSAGES)


@dataclass(frozen=True, slots=True)
class ProgressInfo:
    """A leader's view of one member, for metrics and tests."""

    match: int
    next: int
    state: ProgressState
    recent_active: bool
    is_learner: bool
    inflight: int


@dataclass(frozen=True, slots=True)
class Status:
    """A snapshot of a node's state (``progress`` is filled on the leader only)."""

    id: int
    term: int
    vote: int | None
    role: Role
    leader: int | None
    commit: int
    applied: int
    start_offset: int
    last_index: int
    configuration: Configuration
    lead_transferee: int | None
    progress: dict[int, ProgressInfo]
    lost_end: int | None = None  # set while the node re-replicates entries its disk lost


class RaftNode(LeaderMixin):
    """One member of one Raft group. Not thread-safe: one driver task owns it.

    Reading ``term``, ``role``, ``leader``, ``commit`` and ``configuration`` is cheap; ``status()``
    builds a full snapshot.
    """

    def __init__(
        self,
        config: RaftConfig,
        storage: RaftStorage,
        rng: random.Random,
        *,
        applied: int | None = None,
    ) -> None:
        """Open (or re-open after a crash) the node over its storage.

        ``applied`` is the offset the driver has already exposed (default: nothing beyond the log
        start, so the first Ready re-announces every persisted committed offset).
        """
        self.id = config.id
        self._cfg = config
        self._rng = rng
        self._bugs = config.testing_bugs
        self._forget_vote = BUG_FORGET_VOTE in self._bugs  # read at every step: looked up once
        init = storage.initial_state()
        # Invariant: the term never decreases during the life of the node (persisted ones too).
        self._term = init.hard_state.term
        # Invariant: None, or the node this node voted for in self._term.
        self._vote = init.hard_state.vote
        self._log = RaftLog(storage, init.hard_state.commit, applied)
        # Configurations in force from each offset on, oldest first (see _membership). The first
        # one may be the base below the log start.
        self._configs: list[tuple[int, Configuration]] = [
            (offset, Configuration.decode(data)) for offset, data in init.configs
        ]
        self._conf = self._configs[-1][1] if self._configs else Configuration()
        # The end of what this node may have acknowledged and its disk lost (corruption), or
        # None. Invariant: while the log ends below it, the node neither votes nor campaigns:
        # a quorum it was counted in may hold a committed entry only on the others, and its
        # vote could elect a leader without it (Protocol-Aware Recovery, FAST '18).
        self._lost_end = init.lost_end
        self._tracker = ProgressTracker(config.max_inflight)
        self._read_only = ReadOnly()
        self._role = Role.FOLLOWER
        self._leader: int | None = None
        # Invariant: election_elapsed counts ticks since the last reset (leader contact, vote
        # granted, role change); stickiness and check-quorum compare it with election_tick.
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        self._randomized_timeout = config.election_tick
        self._transferee: int | None = None
        # Why elections start (``ElectionCause``): whether a leader was known in this node's
        # life, the term in which this node stepped down by check-quorum (or None), the cause
        # of the campaign under way, and the election this node last won.
        self._had_leader = False
        self._quorum_lost_term: int | None = None
        self._campaign_cause = ElectionCause.STARTUP
        self._last_election: Election | None = None
        self._read_round = 0  # the latest read-index round of this leader term
        self._round_unsent = False  # a round was opened and its heartbeats are not out yet
        self._reads_before_commit: list[bytes] = []
        self._needs_bcast = False  # new entries or progress: send what followers lack
        # A follower holds entries up to a commit it was not told (``eager_commit_news``).
        self._commit_news = False
        self._msgs: list[Message] = []
        self._read_states: list[ReadState] = []
        self._dropped_reads: list[bytes] = []
        self._ready_out: Ready | None = None
        self._prev_hard = init.hard_state
        self._prev_soft = SoftState(Role.FOLLOWER, None)
        self.become_follower(self._term, None)

    # -- cheap accessors ----------------------------------------------------------------------

    @property
    def term(self) -> int:
        """The current term (a proposal accepted now is appended in this term)."""
        return self._term

    @property
    def role(self) -> Role:
        """The current role."""
        return self._role

    @property
    def leader(self) -> int | None:
        """The leader heard from in the current term, if any."""
        return self._leader

    @property
    def commit(self) -> int:
        """The commit offset (everything at or below it is committed)."""
        return self._log.commit

    @property
    def applied(self) -> int:
        """The offset the driver reported as exposed (through ``advance``)."""
        return self._log.applied

    @property
    def configuration(self) -> Configuration:
        """The configuration in force (the last one appended to the log, committed or not)."""
        return self._conf

    @property
    def configuration_committed(self) -> bool:
        """Whether the configuration in force is committed (no membership change in flight)."""
        return not self._configs or self._configs[-1][0] <= self._log.commit

    @property
    def log(self) -> RaftLog:
        """The log view (storage + unstable tail). Read it; never write through it."""
        return self._log

    def status(self) -> Status:
        """A full snapshot of the node's state."""
        progress = {
            node: ProgressInfo(
                pr.match, pr.next, pr.state, pr.recent_active, pr.is_learner, len(pr.inflights)
            )
            for node, pr in self._tracker.progress.items()
        }
        return Status(
            self.id,
            self._term,
            self._vote,
            self._role,
            self._leader,
            self._log.commit,
            self._log.applied,
            self._log.start_offset(),
            self._log.last_index(),
            self._conf,
            self._transferee,
            progress,
            self._lost_end if self._recovering() else None,
        )

    def _recovering(self) -> bool:
        """Whether the log still ends below entries this node may have acknowledged and lost.

        A sole voter has nobody to re-replicate from nor to outvote: it goes on with what it
        has (the loss was reported when it was found).
        """
        return (
            self._lost_end is not None
            and self._log.last_index() < self._lost_end - 1
            and self._conf.voters != {self.id}
        )

    # -- role transitions -----------------------------------------------------------------------

    def _reset(self, term: int) -> None:
        if self._leader is not None:  # (read here, not on every leader message)
            self._had_leader = True
        if term < self._term:
            raise RaftInvariantError(f"term going backwards: {self._term} -> {term}")
        if term != self._term:
            self._term = term
            self._vote = None
        self._leader = None
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        # [T, 2T): spreads candidates out so that one usually wins alone (§5.2).
        self._randomized_timeout = self._cfg.election_tick + self._rng.randrange(
            self._cfg.election_tick
        )
        self._transferee = None
        self._tracker.votes = {}
        self._tracker.progress = {}
        self._needs_bcast = False
        self._commit_news = False
        self._round_unsent = False
        self._read_round = 0
        self._dropped_reads.extend(self._read_only.drop_all())
        self._dropped_reads.extend(self._reads_before_commit)
        self._reads_before_commit = []

    def become_follower(self, term: int, leader: int | None) -> None:
        """Follow ``leader`` (None: unknown) in ``term``; a new term clears the vote."""
        self._reset(term)
        self._role = Role.FOLLOWER
        self._leader = leader

    def become_pre_candidate(self) -> None:
        """Start a pre-vote: the term and the vote do not change (thesis §9.6)."""
        if self._role is Role.LEADER:
            raise RaftInvariantError("a leader cannot become a pre-candidate")
        self._reset(self._term)
        self._role = Role.PRE_CANDIDATE

    def become_candidate(self) -> None:
        """Start an election: next term, vote for self (§5.2)."""
        if self._role is Role.LEADER:
            raise RaftInvariantError("a leader cannot become a candidate")
        self._reset(self._term + 1)
        self._vote = self.id
        self._role = Role.CANDIDATE

    def become_leader(self) -> None:
        """Lead: probe every member from the end of the log, then append this term's no-op."""
        if self._role is not Role.CANDIDATE:
            raise RaftInvariantError(f"only a candidate can become leader, not a {self._role}")
        self._reset(self._term)
        self._role = Role.LEADER
        self._leader = self.id
        self._tracker.reset(self._conf, self._log.last_index() + 1)
        self._last_election = Election(self._term, self._campaign_cause)
        me = self._tracker.progress.get(self.id)
        if me is not None:
            me.maybe_update(self._log.stable_last())
            me.become_replicate()
            me.recent_active = True
        # The no-op lets the leader commit (and so learn the commit of) its predecessors'
        # entries: only current-term entries are committed by counting replicas (§5.4.2, §8).
        self._append_own(EntryKind.NOOP, b"", 1)

    # -- configuration ----------------------------------------------------------------------------

    def _config_at(self, index: int) -> Configuration:
        """The configuration in force at ``index`` (the last one appended at or below it)."""
        current = Configuration()
        for offset, conf in self._configs:
            if offset > index:
                break
            current = conf
        return current

    def _configs_changed(self) -> None:
        """React to a configuration appended or truncated: it takes effect at once (§4.1)."""
        self._conf = self._configs[-1][1] if self._configs else Configuration()
        if self._role is not Role.LEADER:
            return
        self._tracker.apply_config(self._conf, self._log.last_index() + 1)
        if self._transferee is not None and self._transferee not in self._conf.voters:
            self._transferee = None
        # A smaller quorum may commit or confirm reads at once.
        self._maybe_commit()
        self._maybe_release_reads()

    def _truncate_configs(self, after: int) -> None:
        while self._configs and self._configs[-1][0] >= after:
            self._configs.pop()

    def _push_configs(self, entries: Sequence[Entry]) -> bool:
        pushed = False
        for e in entries:
            if e.kind is EntryKind.CONFIG:
                self._configs.append((e.last, Configuration.decode(e.data)))
                pushed = True
        return pushed

    # -- elections ------------------------------------------------------------------------------

    def _promotable(self) -> bool:
        """Whether this node may campaign.

        A voter of the latest configuration may. So may a voter whose own removal is appended
        but not known to be committed: its log may be the only up-to-date one left (a leader
        that appended its removal and then lost leadership), and the voters of the new
        configuration, which still need its vote under the old one, would refuse everybody else.
        It campaigns under the new configuration, where its own vote does not count, which is
        safe because majorities of the two configurations overlap. (Found by the simulator.)

        A node whose disk lost entries it may have acknowledged may not, until repaired.
        """
        if self._recovering():
            return False
        if self.id in self._conf.voters:
            return True
        return (
            len(self._configs) >= 2
            and self._configs[-1][0] > self._log.commit
            and self.id in self._configs[-2][1].voters
        )

    def campaign(self, cause: ElectionCause | None = None) -> None:
        """Start an election now (with pre-vote), as if the election timeout had fired.

        ``cause``: why, as the driver knows it (``LEADER_GONE``); None: as a timeout's would be
        (``STARTUP`` when this node never knew a leader)."""
        self._hup(transfer=False, cause=cause)

    @property
    def last_election(self) -> Election | None:
        """The election this node last won in its life (its term and cause; the node leads
        now if that term is its current one and its role is LEADER); None if it never led."""
        return self._last_election

    def _timeout_cause(self) -> ElectionCause:
        """Why a campaign that nobody asked for starts now."""
        if self._quorum_lost_term == self._term:
            return ElectionCause.CHECK_QUORUM
        if not self._had_leader and self._leader is None:
            return ElectionCause.STARTUP
        return ElectionCause.TIMEOUT

    def forget_leader(self) -> None:
        """Forget the current leader (etcd's ForgetLeader): it is known to be gone.

        Only a follower acts on it. Without a leader there is no stickiness, so this node
        grants (pre-)votes at once instead of waiting out its election timeout; whether to
        vote still depends on the candidate's log, so safety is untouched. The driver calls it
        when the leader's broker is known to be down (its connection closed, or it stopped
        answering pings); a node that still hears the leader keeps refusing campaigns.
        """
        if self._role is Role.FOLLOWER:
            if self._leader is not None:
                self._had_leader = True
            self._leader = None

    def leader_silent_for(self, ticks: int, *, stand_first: bool = False) -> None:
        """The leader's broker has not been heard from for ``ticks`` ticks (the driver's per-node
        ping, which runs even while a quiesced group does not tick: its leader sends no
        heartbeats while idle, so the group's own clock stands still).

        A follower of a known leader counts that silence toward its election timeout as if it
        had ticked through it: a paused leader (SIGSTOP: connections open, nothing answered) is
        then replaced within the same timeout as a leader whose heartbeats stopped, instead of
        the detection delay plus a whole fresh timeout. Leader stickiness ends when it would
        have; pre-vote still guards a mistaken verdict (a voter that hears the leader refuses).

        The driver names one survivor to ``stand_first``: it campaigns exactly one election
        timeout after the silence began, when the others' stickiness has just ended, and the
        others wait at least a tick longer, so that a random tie cannot split the vote and
        cost a second timeout.
        """
        if ticks < 0:
            raise RaftUsageError(f"negative silence: {ticks} ticks")
        if self._role is not Role.FOLLOWER or self._leader is None:
            return
        self._election_elapsed = max(self._election_elapsed, ticks)
        tick = self._cfg.election_tick
        if stand_first:
            self._randomized_timeout = tick
        else:
            self._randomized_timeout = max(self._randomized_timeout, tick + 1)

    def _hup(self, transfer: bool, cause: ElectionCause | None = None) -> None:
        if self._role is Role.LEADER or not self._promotable():
            return
        # The cause is set where the campaign starts (read before the role change resets the
        # leader), and kept by the election it may win (``become_leader``).
        if transfer:
            self._campaign_cause = ElectionCause.TRANSFER
            self.become_candidate()
        else:
            self._campaign_cause = self._timeout_cause() if cause is None else cause
            self.become_pre_candidate()
        pre = self._role is Role.PRE_CANDIDATE
        # A pre-vote asks "would you vote for me in the next term?" without changing anyone's term.
        term = self._term + 1 if pre else self._term
        self._tracker.record_vote(self.id, True)
        if self._tally_and_act():
            return
        last_index, last_term = self._log.last_index(), self._log.last_term()
        for voter in sorted(self._conf.voters - {self.id}):
            self._send(RequestVote(self.id, voter, term, last_index, last_term, pre, transfer))

    def _tally_and_act(self) -> bool:
        """Act on the votes so far; return True if the campaign ended."""
        result = self._tracker.tally(self._conf)
        if result is None:
            return False
        if not result:
            self.become_follower(self._term, None)
        elif self._role is Role.PRE_CANDIDATE:
            self.become_candidate()
            self._tracker.record_vote(self.id, True)
            if not self._tally_and_act():
                last_index, last_term = self._log.last_index(), self._log.last_term()
                for voter in sorted(self._conf.voters - {self.id}):
                    self._send(RequestVote(self.id, voter, self._term, last_index, last_term))
        else:
            self.become_leader()
        return True

    def _handle_vote_request(self, m: RequestVote) -> None:
        # Vote at most once per term, first come first served (§5.2); a pre-vote for a future term
        # binds nobody. Refuse a candidate whose log is behind ours (§5.4.1).
        can_vote = (
            self._vote == m.src
            or (self._vote is None and self._leader is None)
            or (m.pre_vote and m.term > self._term)
        )
        log_ok = BUG_VOTE_WITHOUT_LOG_CHECK in self._bugs or self._log.is_up_to_date(
            m.last_index, m.last_term
        )
        # A node that lost entries it may have acknowledged cannot tell whether the candidate
        # holds them: its vote would vouch for entries it no longer has (§5.4.1 breaks).
        if can_vote and log_ok and not self._recovering():
            self._send(RequestVoteResponse(self.id, m.src, m.term, True, m.pre_vote))
            if not m.pre_vote:
                self._election_elapsed = 0
                self._vote = m.src
        else:
            self._send(RequestVoteResponse(self.id, m.src, self._term, False, m.pre_vote))

    # -- time -------------------------------------------------------------------------------------

    def tick(self) -> None:
        """One unit of abstract time (the driver calls it every 50 ms)."""
        if self._role is Role.LEADER:
            self._tick_heartbeat()
        else:
            self._election_elapsed += 1
            if self._election_elapsed >= self._randomized_timeout:
                if self._promotable():
                    self._election_elapsed = 0
                    self._hup(transfer=False)
                elif self._recovering():
                    self._election_elapsed = 0
                    self._ask_repair()

    def _ask_repair(self) -> None:
        """Tell the voters where our log ends, since we may not campaign: a leader (even an idle
        one that heard nothing to wake it) reads it as a follower that lost entries and resends
        them (``_handle_append_response``); other nodes ignore it."""
        last = self._log.last_index()
        for voter in sorted(self._conf.voters - {self.id}):
            self._say_lost(voter, last, last + 1)

    def _say_lost(self, to: int, index: int, resend_from: int) -> None:
        """A rejection of ``index`` that a leader reads as "lost" (no conflict term, an index at
        or below its match for us): it lowers our match below ``resend_from`` and resends from
        there, however high the match was (``_handle_append_response``)."""
        self._send(AppendEntriesResponse(self.id, to, self._term, False, index, None, resend_from))

    def _tick_heartbeat(self) -> None:
        self._heartbeat_elapsed += 1
        self._election_elapsed += 1
        if self._election_elapsed >= self._cfg.election_tick:
            self._election_elapsed = 0
            # Check-quorum: a leader cut off from a majority steps down instead of accepting
            # writes it can never commit and answering reads it cannot confirm (thesis §6.2).
            if not self._tracker.quorum_active(self._conf):
                self._quorum_lost_term = self._term
                self.become_follower(self._term, None)
                return
            for node, pr in self._tracker.progress.items():
                pr.recent_active = node == self.id
            self._transferee = None  # a transfer that took a whole election timeout failed
        if self._heartbeat_elapsed >= self._cfg.heartbeat_tick:
            self._heartbeat_elapsed = 0
            self._bcast_heartbeat(skip_answering=True)

    # -- receiving --------------------------------------------------------------------------------

    def step(self, m: Message) -> None:
        """Process a message from a peer.

        Raises:
            RaftUsageError: the message is not addressed to this node, or comes from it.
            MalformedMessage: the message breaks the protocol's shape (close that connection).
        """
        if m.dst != self.id or m.src == self.id:
            raise RaftUsageError(f"message {m.src}->{m.dst} stepped into node {self.id}")
        if m.term > self._term:
            if isinstance(m, RequestVote):
                # Leader stickiness: a node that heard from a live leader within the election
                # timeout ignores campaigns, so a partitioned node rejoining with a higher term
                # cannot depose a healthy leader. A transfer's campaign is wanted: it passes.
                in_lease = (
                    self._leader is not None and self._election_elapsed < self._cfg.election_tick
                )
                if in_lease and not m.transfer:
                    return
            if isinstance(m, RequestVote) and m.pre_vote:
                pass  # a pre-vote never changes our term
            elif isinstance(m, RequestVoteResponse) and m.pre_vote and m.granted:
                pass  # granted pre-votes carry the term we would campaign in, not a new one
            else:
                leader = m.src if isinstance(m, _LEADER_MESSAGES) else None
                self.become_follower(m.term, leader)
        elif m.term < self._term:
            self._step_stale(m)
            return
        if type(m) is RequestVote:
            self._handle_vote_request(m)
        elif self._role is Role.LEADER:
            self._step_leader(m)
        elif self._role is Role.FOLLOWER:
            self._step_follower(m)
        else:
            self._step_candidate(m)

    def _step_stale(self, m: Message) -> None:
        # A leader from an older term may have been partitioned away; with check-quorum and
        # pre-vote nobody would ever raise its term, so answer with ours to make it step down.
        if isinstance(m, AppendEntries | InstallLogStart):
            self._send(AppendEntriesResponse(self.id, m.src, self._term, False, -1))
        elif isinstance(m, Heartbeat):
            self._send(HeartbeatResponse(self.id, m.src, self._term))
        elif isinstance(m, RequestVote) and m.pre_vote:
            # Tell a pre-candidate with an old term that it is behind, so it can catch up.
            self._send(RequestVoteResponse(self.id, m.src, self._term, False, True))

    def _step_follower(self, m: Message) -> None:
        kind = type(m)
        if kind in _LEADER_TYPES:
            self._election_elapsed = 0
            self._leader = m.src
            if type(m) is AppendEntries:
                self._handle_append_entries(m)
            elif type(m) is Heartbeat:
                self._handle_heartbeat(m)
            elif type(m) is InstallLogStart:
                self._handle_install_log_start(m)
        elif kind is TimeoutNow:
            self._hup(transfer=True)
        # Responses meant for a leader or candidate are stale here: ignore.

    def _step_candidate(self, m: Message) -> None:
        if isinstance(m, _LEADER_MESSAGES):
            # Another node won this term (§5.2).
            self.become_follower(self._term, m.src)
            self._step_follower(m)
        elif isinstance(m, RequestVoteResponse):
            if m.pre_vote != (self._role is Role.PRE_CANDIDATE):
                return  # an answer to an earlier campaign of the other kind
            self._tracker.record_vote(m.src, m.granted)
            self._tally_and_act()

    def _step_leader(self, m: Message) -> None:
        if type(m) in _LEADER_TYPES:
            raise RaftInvariantError(f"two leaders in term {self._term}: {self.id} and {m.src}")
        pr = self._tracker.progress.get(m.src)
        if pr is None:
            return  # not (or no longer) a member
        if type(m) is AppendEntriesResponse:
            pr.recent_active = pr.answered = True
            self._handle_append_response(m, pr)
        elif type(m) is HeartbeatResponse:
            pr.recent_active = True
            self._handle_heartbeat_response(m, pr)

    # -- follower side of replication -------------------------------------------------------------

    def _handle_append_entries(self, m: AppendEntries) -> None:
        expect = m.prev_index + 1
        for e in m.entries:
            if e.first != expect or e.term > m.term:
                raise MalformedMessage(f"AppendEntries entries not contiguous after {m.prev_index}")
            expect = e.last + 1
        log = self._log
        if not self._cfg.durable_acks and m.prev_index <= log.commit:
            # Without durable acknowledgements a quorum may have lost part of our committed
            # prefix (below, with them, it matches any leader's: Leader Completeness).
            if not self._committed_prefix_matches(m):
                # Our committed entry at prev_index is not the leader's: we do not hold it. It
                # resends from where our term there begins, and ``_check_committed`` then finds
                # the first entry that disagrees.
                self._say_lost(
                    m.src, m.prev_index, log.term_start_offset(log.term_at(m.prev_index))
                )
                return
            if m.prev_index < log.commit:
                verified = self._check_committed(m)
                self._send(AppendEntriesResponse(self.id, m.src, self._term, True, verified))
                return
        elif m.prev_index < log.commit:
            # Old or duplicated: our committed prefix matches any leader's (Leader Completeness).
            self._send(AppendEntriesResponse(self.id, m.src, self._term, True, log.commit))
            return
        last_new = self._maybe_append(m)
        if last_new is None:
            self._reject_append(m)
        else:
            self._send(AppendEntriesResponse(self.id, m.src, self._term, True, last_new))

    def _maybe_append(self, m: AppendEntries) -> int | None:
        """Append ``m.entries`` if the log matches at ``m.prev_index`` (§5.3); return the last
        offset now known to match the leader, or None if the consistency check failed."""
        log = self._log
        if not log.match_term(m.prev_index, m.prev_term):
            return None
        entries = m.entries
        conflict = log.find_conflict(entries)
        if conflict < len(entries):
            tail = entries[conflict:]
            truncating = tail[0].first <= log.last_index()
            log.truncate_and_append(tail)
            if truncating:
                self._truncate_configs(tail[0].first)
            if self._push_configs(tail) or truncating:
                self._configs_changed()
        last_new = entries[-1].last if entries else m.prev_index
        log.commit_to(min(m.commit, last_new))
        if self._lost_end is not None and last_new >= self._lost_end - 1:
            # Our log now matches a leader's up to the old end: every committed entry we may
            # have acknowledged is back (Log Matching), so our vote is sound again.
            self._lost_end = None
        return last_new

    def _committed_prefix_matches(self, m: AppendEntries) -> bool:
        log = self._log
        return m.prev_index < log.start_offset() - 1 or log.match_term(m.prev_index, m.prev_term)

    def _check_committed(self, m: AppendEntries) -> int:
        """The last offset at or below our commit known to match the leader's log, after a
        ``prev_index`` that matches; ``LogDiverged`` at the first of ``m``'s entries at or below
        our commit that is not ours (each one before it matched, so its first offset is an entry
        boundary here too: Log Matching)."""
        log = self._log
        last = log.last_index()
        below = log.start_offset() - 1  # committed long ago, and its terms no longer kept
        verified = m.prev_index
        for e in m.entries:
            if e.first > log.commit:
                break
            if e.last < below:
                continue
            if e.last > last or log.term_at(e.last) != e.term:
                raise LogDiverged(
                    e.first,
                    f"the leader's entry ({e.first}-{e.last}, term {e.term}) is not ours, at or "
                    f"below our commit {log.commit}",
                )
            verified = min(e.last, log.commit)
        return verified

    def _reject_append(self, m: AppendEntries) -> None:
        log = self._log
        if m.prev_index > log.last_index():
            # Too short: retry right after our last offset.
            hint_term, hint_index = None, log.last_index() + 1
        else:
            # Divergent at prev_index: the leader can skip our whole conflicting term at once.
            hint_term = log.term_at(m.prev_index)
            hint_index = min(log.term_start_offset(hint_term), m.prev_index)
        self._send(
            AppendEntriesResponse(
                self.id, m.src, self._term, False, m.prev_index, hint_term, hint_index
            )
        )

    def _handle_heartbeat(self, m: Heartbeat) -> None:
        # The leader sends min(its commit, our match): all of it is in our log (raises if not),
        # unless our disk lost entries we acknowledged: because we know it (``_lost_end``), or
        # because acknowledgements did not wait for our fsync. The leader's match for us is then
        # stale.
        log = self._log
        last = log.last_index()
        if m.commit > last and (self._lost_end is not None or not self._cfg.durable_acks):
            if self._lost_end is not None:
                # What we still hold is a prefix of what matched the leader, so it is committed
                # (not known without durable acknowledgements: a quorum may have lost entries).
                log.commit_to(last)
            self._say_lost(m.src, m.commit, last + 1)  # where our log really ends
        else:
            log.commit_to(m.commit)
        if m.reply:
            self._send(HeartbeatResponse(self.id, m.src, self._term, m.round))

    def _handle_install_log_start(self, m: InstallLogStart) -> None:
        log = self._log
        if m.start - 1 <= log.commit:
            pass  # we already hold (committed) everything below the leader's start
        elif log.match_term(m.start - 1, m.prev_term):
            log.commit_to(m.start - 1)  # our log matches there: just fast-forward
        else:
            log.restore(LogReset(m.start, m.prev_term, m.config))
            self._configs = [(m.start - 1, m.config)]
            self._configs_changed()
        self._send(AppendEntriesResponse(self.id, m.src, self._term, True, log.commit))

    def _send(self, m: Message) -> None:
        self._msgs.append(m)

    # -- Ready / advance ---------------------------------------------------------------------------

    def has_ready(self) -> bool:
        """Whether ``ready()`` would ask something of the driver (False while one is out)."""
        # Asked after every step, often several times: cheapest and likeliest causes first,
        # and the hard and soft states compared field by field, not built to be compared.
        if self._ready_out is not None:
            return False
        log = self._log
        if self._msgs or log.commit > log.applied or log.has_pending():
            return True
        if self._role is Role.LEADER and (
            self._needs_bcast or self._round_unsent or self._commit_news
        ):
            return True
        hard, soft = self._prev_hard, self._prev_soft
        return bool(
            self._read_states
            or self._dropped_reads
            or self._term != hard.term
            or (None if self._forget_vote else self._vote) != hard.vote
            or log.commit != hard.commit
            or self._role is not soft.role
            or self._leader != soft.leader
        )

    def exposable_commit(self) -> int:
        """The commit the driver may expose now, between Readys (one out, or the next waiting
        for a round): reads of it and acknowledgements of writes at or below it need not wait
        for this node's fsync in flight. Committed means durable on a majority: a leader counts
        itself only once durable, so a commit its followers made may be ahead of its own disk.

        A leader's log never diverges, and every entry it sent was written to storage when it
        was sent (``ready()``'s entries are written before its messages go, or at once
        after them): its commit is exposable. A follower's is bounded by what storage holds
        validly now (its durable prefix: beyond it, storage may hold stale entries a pending
        truncation will cut); nothing while a log reset is pending.
        """
        log = self._log
        if self._role is Role.LEADER:
            return log.commit
        if log.reset_pending():
            return log.applied
        return min(log.commit, log.stable_last())

    def commit_news(self) -> list[Message]:
        """Take the commit news due now (``eager_commit_news``): heartbeats that ask no answer
        and tell each follower the commit it holds entries up to. They may be sent at once,
        while a Ready is out: they announce only what a majority holds on disk, and neither
        acknowledge nor vote. Without this, they go with the next Ready."""
        if self._role is not Role.LEADER or not self._commit_news:
            return []
        self._commit_news = False
        start = len(self._msgs)
        self._send_commit_news()
        news = self._msgs[start:]
        del self._msgs[start:]
        return news

    def quiescent(self) -> bool:
        """Whether this leader has nothing left to tell its group, which may then stop ticking:
        everything it holds is committed, durable here and held by every member, every member
        was told the commit, no transfer runs and no Ready is pending or out.

        A follower not yet told the commit must hear it first (by the tick's heartbeat): a
        quiesced group sends nothing more, and the follower would otherwise stay behind.
        """
        if (
            self._role is not Role.LEADER
            or self._transferee is not None
            or self._ready_out is not None
            or self.has_ready()
        ):
            return False
        last = self._log.last_index()
        if self._log.commit != last:
            return False
        return all(
            pr.match == last and (node == self.id or pr.sent_commit >= last)
            for node, pr in self._tracker.progress.items()
        )

    def ready_needs_storage(self) -> bool:
        """Whether the next Ready has something to make durable: log work, a new term or vote.

        One that has not (a commit to expose, commit news, an answer that acknowledges only
        what is already durable) may be handled, its messages sent, at once.
        """
        prev = self._prev_hard
        return (
            self._log.has_pending()
            or self._term != prev.term
            or (None if self._forget_vote else self._vote) != prev.vote
        )

    def ready(self) -> Ready:
        """Collect the work for the driver (see ``_ready`` for the order it must follow).

        Raises:
            RaftUsageError: the previous Ready was not advanced.
        """
        if self._ready_out is not None:
            raise RaftUsageError("advance() the previous Ready before asking for another")
        self._flush()
        log = self._log
        prev_hard, prev_soft = self._prev_hard, self._prev_soft
        vote = None if self._forget_vote else self._vote
        hard: HardState | None = None
        if (self._term, vote, log.commit) != (prev_hard.term, prev_hard.vote, prev_hard.commit):
            hard = self._prev_hard = HardState(self._term, vote, log.commit)
        soft: SoftState | None = None
        if self._role is not prev_soft.role or self._leader != prev_soft.leader:
            soft = self._prev_soft = SoftState(self._role, self._leader)
        reset, truncate_from, entries = log.take_pending()
        rd = Ready(
            soft_state=soft,
            hard_state=hard,
            log_reset=reset,
            truncate_from=truncate_from,
            entries=entries,
            messages=tuple(self._msgs),
            committed=(log.applied + 1, log.commit) if log.commit > log.applied else None,
            read_states=tuple(self._read_states),
            dropped_reads=tuple(self._dropped_reads),
        )
        self._msgs, self._read_states, self._dropped_reads = [], [], []
        self._ready_out = rd
        return rd

    def advance(self, rd: Ready) -> None:
        """The driver made ``rd`` durable, sent its messages and exposed its committed range.

        Raises:
            RaftUsageError: ``rd`` is not the Ready handed out last.
        """
        if rd is not self._ready_out:
            raise RaftUsageError("advance() takes the Ready returned by the last ready()")
        self._ready_out = None
        self._log.persisted(rd.log_reset, rd.entries)
        if rd.committed is not None:
            self._log.applied_to(rd.committed[1])
        if self._role is Role.LEADER:
            me = self._tracker.progress.get(self.id)
            # The leader counts itself only for what it has made durable (and a match at or
            # below the commit cannot move it: see _maybe_commit).
            if (
                me is not None
                and me.maybe_update(self._log.stable_last())
                and me.match > self._log.commit
            ):
                self._maybe_commit()
