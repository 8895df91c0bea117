"""What a leader knows about each follower (etcd's tracker), and quorum arithmetic.

A follower is probed (one AppendEntries at a time, until one succeeds) and then replicated to
(AppendEntries pipelined optimistically, at most ``max_inflight`` unacknowledged). When its next
offset falls below the leader's log start, the probe is an ``InstallLogStart`` instead.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from enum import Enum

from ._errors import RaftInvariantError
from ._membership import Configuration


class ProgressState(Enum):
    """How the leader sends to a follower."""

    PROBE = "probe"
    REPLICATE = "replicate"


class Inflights:
    """The last offsets of AppendEntries sent and not yet acknowledged, oldest first."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._lasts: deque[int] = deque()

    def __len__(self) -> int:
        return len(self._lasts)

    def full(self) -> bool:
        """No more AppendEntries may be sent until some are acknowledged."""
        return len(self._lasts) >= self._capacity

    def add(self, last: int) -> None:
        """Record a message whose last entry is ``last``."""
        if len(self._lasts) >= self._capacity:  # full()
            raise RaftInvariantError("sending beyond the in-flight window")
        if self._lasts and last <= self._lasts[-1]:
            raise RaftInvariantError(f"in-flight offsets must grow: {last} after {self._lasts[-1]}")
        self._lasts.append(last)

    def free_le(self, index: int) -> None:
        """Forget the messages acknowledged by a match at ``index``."""
        while self._lasts and self._lasts[0] <= index:
            self._lasts.popleft()

    def reset(self) -> None:
        """Forget everything (on a state change)."""
        self._lasts.clear()


class Progress:
    """A leader's view of one follower (or of itself)."""

    __slots__ = (
        "acked_round",
        "answered",
        "inflights",
        "is_learner",
        "match",
        "next",
        "probe_sent",
        "recent_active",
        "sent_commit",
        "state",
    )

    def __init__(self, next_index: int, max_inflight: int, is_learner: bool) -> None:
        # Invariant: match < next; match only grows within a term, except when the follower
        # reports that its disk lost entries it had acknowledged (``lost_to``).
        self.match = -1
        self.next = next_index
        self.state = ProgressState.PROBE
        self.probe_sent = False  # PROBE: a probe is out; wait for its answer or a heartbeat reply
        self.inflights = Inflights(max_inflight)
        self.recent_active = False  # heard from within the current election timeout
        self.answered = False  # answered an AppendEntries since the last heartbeat
        self.is_learner = is_learner
        self.acked_round = 0  # highest read-index round echoed
        self.sent_commit = -1  # the highest commit offset this follower was told it may apply

    def is_paused(self) -> bool:
        """Whether sending more AppendEntries must wait."""
        if self.state is ProgressState.PROBE:
            return self.probe_sent
        return self.inflights.full()

    def become_probe(self) -> None:
        """Probe from just after the last known match."""
        self.state = ProgressState.PROBE
        self.next = self.match + 1
        self.probe_sent = False
        self.inflights.reset()

    def become_replicate(self) -> None:
        """Pipeline from just after the match."""
        self.state = ProgressState.REPLICATE
        self.next = self.match + 1
        self.probe_sent = False
        self.inflights.reset()

    def sent_entries(self, last: int) -> None:
        """An AppendEntries whose last entry is ``last`` went out."""
        if self.state is ProgressState.REPLICATE:
            self.inflights.add(last)
            self.next = last + 1
        else:
            self.probe_sent = True

    def maybe_update(self, index: int) -> bool:
        """The follower matches up to ``index``; return whether that is news."""
        updated = index > self.match
        if updated:
            self.match = index
            self.probe_sent = False
        if index >= self.next:
            self.next = index + 1
        return updated

    def lost_to(self, last: int) -> None:
        """The follower's log now ends at ``last``, below its match: probe from there.

        A delayed rejection from before the follower caught up may also land here; lowering
        the match then only costs a round trip (the follower answers with its real match).
        """
        self.match = min(self.match, last)
        self.become_probe()

    def maybe_decr_to(self, rejected: int, hint_next: int) -> bool:
        """A rejection of the AppendEntries with ``prev_index == rejected``; return whether it
        was current (stale or duplicated rejections are ignored).

        On a current rejection the follower is probed again from ``hint_next`` (never at or below
        the match, never above the rejected offset).
        """
        if self.state is ProgressState.REPLICATE:
            if rejected <= self.match:
                return False
        elif rejected != self.next - 1:
            return False
        self.state = ProgressState.PROBE
        self.next = max(min(rejected, hint_next), self.match + 1)
        self.probe_sent = False
        self.inflights.reset()
        return True


def quorum_value(values: Iterable[int], voters: int) -> int:
    """The largest value that a majority of ``voters`` have reached (missing voters count as
    having nothing, so pass one value per voter). With no voters: -1."""
    ordered = sorted(values, reverse=True)
    if not ordered:
        return -1
    return ordered[voters // 2]


class ProgressTracker:
    """Progress of every member (leader only) and the votes of an election."""

    def __init__(self, max_inflight: int) -> None:
        self._max_inflight = max_inflight
        self.progress: dict[int, Progress] = {}
        self.votes: dict[int, bool] = {}

    def reset(self, config: Configuration, next_index: int) -> None:
        """Fresh progress for every member, probing from ``next_index`` (a new leader)."""
        self.progress = {
            node: Progress(next_index, self._max_inflight, node in config.learners)
            for node in config.members
        }

    def apply_config(self, config: Configuration, next_index: int) -> None:
        """Follow a configuration change: add new members, drop removed ones, flag learners."""
        for node in list(self.progress):
            if node not in config.members:
                del self.progress[node]
        for node in config.members:
            pr = self.progress.get(node)
            if pr is None:
                self.progress[node] = Progress(next_index, self._max_inflight, False)
                pr = self.progress[node]
            pr.is_learner = node in config.learners

    def quorum_match(self, config: Configuration) -> int:
        """The highest offset a majority of voters hold (the commit candidate)."""
        # A list, not a generator: asked on every acknowledgement, and a generator costs a
        # resumption per voter.
        progress = self.progress
        matches = [progress[v].match if v in progress else -1 for v in config.voters]
        return quorum_value(matches, len(matches))

    def quorum_round(self, config: Configuration) -> int:
        """The highest read-index round a majority of voters have echoed."""
        return quorum_value(
            (self.progress[v].acked_round if v in self.progress else 0 for v in config.voters),
            len(config.voters),
        )

    def quorum_active(self, config: Configuration) -> bool:
        """Whether a majority of voters were heard from recently (check-quorum, thesis §6.2)."""
        active = sum(
            1 for v in config.voters if v in self.progress and self.progress[v].recent_active
        )
        return active > len(config.voters) // 2

    def record_vote(self, node: int, granted: bool) -> None:
        """Count a vote; a node's first answer wins (duplicates are ignored)."""
        self.votes.setdefault(node, granted)

    def tally(self, config: Configuration) -> bool | None:
        """True if won, False if lost, None while pending (voters only)."""
        granted = sum(1 for v in config.voters if self.votes.get(v) is True)
        rejected = sum(1 for v in config.voters if self.votes.get(v) is False)
        quorum = len(config.voters) // 2 + 1
        if granted >= quorum:
            return True
        if len(config.voters) - rejected < quorum:
            return False
        return None
