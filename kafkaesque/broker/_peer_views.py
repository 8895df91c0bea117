"""What each broker sees of the others, and why each partition's leader was elected, as the
peers' ``PeerView`` messages say (for the web console; docs/console.md). Pure, no I/O.

Every broker already tells every peer which groups it leads, every second and on change
(``LeaderClaims``); beside it goes a ``PeerView``: the peers it hears now (its Raft pings'
verdict) and the elections it won since its last view. So the console's who-hears-whom matrix
and each partition's last election cost no request when a tab asks: the console's broker
reads them from here.

A view older than ``stale_s`` (a paused broker sends nothing) or of a peer whose connection
closed says nothing: the console shows that broker's row as unknown. Elections are kept per
group, the highest term wins (the sender's own ones are noted here too).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

STALE_S: Final = 5.0


@dataclass(frozen=True, slots=True)
class ElectionNote:
    """The election that made ``leader`` the leader of a group: its term, its cause (an
    ``ElectionCause`` value) and when the leader saw it won (wall clock, ms)."""

    leader: int
    term: int
    cause: str
    at_ms: int

    def json(self) -> dict[str, Any]:
        return {"leader": self.leader, "term": self.term, "cause": self.cause, "at_ms": self.at_ms}


class PeerViews:
    """The peers' views (see the module docstring). ``now`` is any monotonic clock, in seconds,
    the same for every call."""

    def __init__(self, stale_s: float = STALE_S) -> None:
        self._stale_s = stale_s
        self._heard: dict[int, tuple[frozenset[int], float]] = {}  # peer -> (heard, when)
        # peer -> (its groups' committed offsets, when)
        self._offsets: dict[int, tuple[tuple[tuple[str, str, int, int], ...], float]] = {}
        self._elections: dict[str, ElectionNote] = {}  # log id -> the newest known

    def report(
        self,
        peer: int,
        heard: tuple[int, ...],
        elections: dict[str, tuple[int, str, int]],
        now: float,
        offsets: tuple[tuple[str, str, int, int], ...] = (),
    ) -> None:
        """``peer`` hears ``heard`` now, won ``elections`` (``log_id -> (term, cause, ms)``) and
        coordinates groups with these committed ``offsets`` (group, topic, partition, offset)."""
        self._heard[peer] = (frozenset(heard), now)
        self._offsets[peer] = (offsets, now)
        for log_id, (term, cause, at_ms) in elections.items():
            self.note(log_id, ElectionNote(peer, term, cause, at_ms))

    def note(self, log_id: str, election: ElectionNote) -> None:
        """Keep ``election`` of ``log_id`` unless a later term's is known."""
        known = self._elections.get(log_id)
        if known is None or election.term >= known.term:
            self._elections[log_id] = election

    def forget(self, peer: int) -> None:
        """``peer``'s connection closed: what it heard is unknown from now on."""
        self._heard.pop(peer, None)
        self._offsets.pop(peer, None)

    def heard_by(self, peer: int, now: float) -> frozenset[int] | None:
        """The peers ``peer`` hears, as it last said, or None: no recent view of it."""
        seen = self._heard.get(peer)
        if seen is None or now - seen[1] > self._stale_s:
            return None
        return seen[0]

    def group_offsets(self, now: float) -> list[tuple[str, str, int, int]]:
        """The committed offsets of the groups the peers coordinate, as their recent views said
        (a peer whose view is stale or whose connection closed adds none)."""
        return [
            offset
            for offsets, when in self._offsets.values()
            if now - when <= self._stale_s
            for offset in offsets
        ]

    def election(self, log_id: str) -> ElectionNote | None:
        """The newest known election of ``log_id`` (None: none seen since this broker started)."""
        return self._elections.get(log_id)
