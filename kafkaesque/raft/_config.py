"""Tuning of one Raft node, and the switch for the planted bugs of the simulator's self-test."""

from __future__ import annotations

from dataclasses import dataclass

# Planted bugs: each re-creates a classic Raft mistake so the simulator can prove it finds it.
# Only tests set them; the default is none, and production code never reads these names.
BUG_COMMIT_OLD_TERM = "commit_old_term"  # count replicas of an older term's entry (§5.4.2)
BUG_VOTE_WITHOUT_LOG_CHECK = "vote_without_log_check"  # grant (pre-)votes without §5.4.1's check
BUG_FORGET_VOTE = "forget_vote"  # the vote is left out of the persisted hard state
KNOWN_BUGS = frozenset({BUG_COMMIT_OLD_TERM, BUG_VOTE_WITHOUT_LOG_CHECK, BUG_FORGET_VOTE})


@dataclass(frozen=True, slots=True)
class RaftConfig:
    """Settings of one node. Times are in ticks; the driver ticks every 50 ms.

    Pre-vote, check-quorum and leader stickiness are always on: one broker runs ~1000 groups, and a
    partially connected broker must not depose every leader it can reach.
    """

    id: int
    # A follower campaigns after a random timeout in [election_tick, 2 * election_tick): 0.5-1 s.
    election_tick: int = 10
    # Leader heartbeat period; heartbeats are cheap and coalesced per broker pair.
    heartbeat_tick: int = 1
    # Payload bytes per AppendEntries (at least one entry is always sent).
    max_msg_bytes: int = 1 << 20
    # AppendEntries messages in flight per follower in the replicate state.
    max_inflight: int = 16
    # Tell a follower a new commit at once (a heartbeat that asks no answer) when no
    # AppendEntries carries it: a follower serving long polls then hands a record to its
    # consumer a hop after the leader commits it, not when the next write or tick comes.
    eager_commit_news: bool = True
    # Whether this node acknowledges entries only once they are durable here (``--fsync
    # always``). Without it (``--fsync interval``) a power cut can take entries that members
    # acknowledged, and a quorum can lose entries it committed: the leader's match for us can
    # then lie beyond our log, and our committed prefix can disagree with a new leader's log.
    # With durable acknowledgements neither happens unless a disk lost fsynced data (a commit
    # beyond the log then stops the process); without, they are what the policy gives up, and
    # the follower follows the leader's log (``LogDiverged``: the driver cuts ours there).
    durable_acks: bool = True
    testing_bugs: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if not 0 < self.heartbeat_tick < self.election_tick:
            raise ValueError("need 0 < heartbeat_tick < election_tick")
        if self.max_msg_bytes < 0 or self.max_inflight < 1:
            raise ValueError("need max_msg_bytes >= 0 and max_inflight >= 1")
        unknown = self.testing_bugs - KNOWN_BUGS
        if unknown:
            raise ValueError(f"unknown planted bugs {sorted(unknown)}")
