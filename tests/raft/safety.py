"""Raft's safety properties (paper Figure 3) checked over the simulator's whole history.

Checks run after every simulator event (tick, delivery, Ready) and are incremental so they stay
cheap: the history is recorded, never recomputed.

* Election safety: at most one leader per term, ever (``leader_of_term``).
* Leader append-only: while a node leads a term, the last entry it had is still there unchanged.
* Log matching: every persisted entry is recorded in a graph keyed by (last offset, term) with its
  content and its predecessor's key; an entry seen again must be identical with the same
  predecessor, so by induction equal (index, term) implies equal prefixes.
* Leader completeness: an entry seen committed by a node in term T is in the log of every leader
  of a term > T (checked when a leader appears and when an entry is newly seen committed).
* State-machine safety: a committed offset is committed with one entry only, on every node, forever.
* Commit index: monotonic per incarnation, never beyond the node's log; a leader's count never
  goes beyond its durable log; applied <= commit. What the driver may expose at once
  (``exposable_commit``) is in the node's durable log view and is the entry committed there.
* Read index: a read answers at an offset at least as high as everything known committed when
  the read was asked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kafkaesque.raft import Entry, EntryKind, Ready, Role

if TYPE_CHECKING:
    from .sim import SimNode


class SafetyViolation(AssertionError):
    """A Raft safety property failed; the message carries the seed and a trace."""


class LivenessViolation(AssertionError):
    """A healed cluster did not elect a leader and commit in time; seed and trace attached."""


@dataclass
class _Watch:
    """What the checker remembers about one node (reset at each restart)."""

    commit: int = -1
    exposed: int = -1  # the highest ``exposable_commit`` checked
    leader_term: int | None = None
    leader_last: tuple[int, int] | None = None


_GraphValue = tuple[int, EntryKind, bytes, tuple[int, int]]


class SafetyChecker:
    """Safety invariants over the history of one simulated cluster."""

    def __init__(self, nodes: dict[int, SimNode], fail: Callable[[str], SafetyViolation]) -> None:
        self._nodes = nodes
        self._fail = fail
        self.leader_of_term: dict[int, int] = {}
        # last offset -> (entry, term of the node that first saw it committed)
        self.committed: dict[int, tuple[Entry, int]] = {}
        self._committed_by_first: dict[int, Entry] = {}
        self.max_committed = -1
        self._graph: dict[tuple[int, int], _GraphValue] = {}
        self._watch: dict[int, _Watch] = {node: _Watch() for node in nodes}
        self._reads: dict[bytes, int] = {}

    def restarted(self, node: SimNode) -> None:
        """A new incarnation: its commit may restart lower (monotonic per incarnation)."""
        assert node.core is not None
        self._watch[node.id] = _Watch(commit=node.core.commit)
        self.check_node(node)

    # -- per event ------------------------------------------------------------------------------

    def check_node(self, node: SimNode) -> None:
        """Check one live node after an event touched it."""
        core = node.core
        assert core is not None
        w = self._watch[node.id]
        log = core.log
        if core.role is Role.LEADER:
            holder = self.leader_of_term.setdefault(core.term, node.id)
            if holder != node.id:
                raise self._fail(
                    f"election safety: n{holder} and n{node.id} both led term {core.term}"
                )
            if w.leader_term != core.term:
                w.leader_term, w.leader_last = core.term, None
                self._check_new_leader(node)
            if w.leader_last is not None:
                li, lt = w.leader_last
                if log.last_index() < li or log.term_at(li) != lt:
                    raise self._fail(
                        f"leader append-only: n{node.id} leading term {core.term} lost its entry "
                        f"{li}/{lt}"
                    )
            w.leader_last = (log.last_index(), log.last_term())
        else:
            w.leader_term = w.leader_last = None
        commit = core.commit
        if commit < w.commit:
            raise self._fail(f"n{node.id} commit went back from {w.commit} to {commit}")
        if commit > log.last_index():
            raise self._fail(f"n{node.id} commit {commit} beyond last {log.last_index()}")
        if core.applied > commit:
            raise self._fail(f"n{node.id} applied {core.applied} beyond commit {commit}")
        if commit > w.commit:
            if core.role is Role.LEADER and commit > node.disk.last_index():
                raise self._fail(
                    f"leader n{node.id} committed {commit} beyond its durable log "
                    f"{node.disk.last_index()}"
                )
            self._record_commits(node, w.commit, commit)
            w.commit = commit
        exposed = core.exposable_commit()
        if exposed > w.exposed:
            self._check_exposed(node, w.exposed, exposed)
            w.exposed = exposed

    def _check_exposed(self, node: SimNode, old: int, new: int) -> None:
        """What the driver may expose between Readys (replies, long polls: issue 36) is in this
        node's log, and is the entry committed there."""
        assert node.core is not None
        log = node.core.log
        if new > log.stable_last():
            raise self._fail(f"n{node.id} exposes commit {new} beyond {log.stable_last()}")
        lo = max(old + 1, log.start_offset())
        if lo > new:
            return
        for e in log.entries_between(lo, new):
            known = self.committed.get(e.last)
            if known is None or known[0] != e:
                raise self._fail(
                    f"n{node.id} exposes {e.first}-{e.last}/{e.term} as committed, but "
                    f"{'nothing' if known is None else known[0]} was committed there"
                )

    def _has(self, node: SimNode, e: Entry) -> bool:
        assert node.core is not None
        log = node.core.log
        if e.last > log.last_index() or log.term_at(e.last) != e.term:
            return False
        return log.entries_between(e.last, e.last) == [e]

    def _check_new_leader(self, node: SimNode) -> None:
        assert node.core is not None
        term, start = node.core.term, node.core.log.start_offset()
        for e, seen_in in self.committed.values():
            if seen_in < term and e.first >= start and not self._has(node, e):
                raise self._fail(
                    f"leader completeness: n{node.id} leads term {term} without entry "
                    f"{e.first}-{e.last}/{e.term} committed by term {seen_in}"
                )

    def _record_commits(self, node: SimNode, old: int, new: int) -> None:
        assert node.core is not None
        core = node.core
        lo = max(old + 1, core.log.start_offset())
        if lo > new:
            return
        for e in core.log.entries_between(lo, new):
            known = self.committed.get(e.last)
            same_first = self._committed_by_first.get(e.first)
            if (known is not None and known[0] != e) or (same_first not in (None, e)):
                other = known[0] if known is not None else same_first
                raise self._fail(
                    f"state machine safety: n{node.id} commits {e} where {other} was committed"
                )
            if known is not None:
                continue
            self.committed[e.last] = (e, core.term)
            self._committed_by_first[e.first] = e
            self.max_committed = max(self.max_committed, e.last)
            for other_node in self._nodes.values():
                oc = other_node.core
                if (
                    oc is not None
                    and oc.role is Role.LEADER
                    and oc.term > core.term
                    and e.first >= oc.log.start_offset()
                    and not self._has(other_node, e)
                ):
                    raise self._fail(
                        f"leader completeness: n{other_node.id} leads term {oc.term} without "
                        f"{e.first}-{e.last}/{e.term}, committed in term {core.term}"
                    )

    def persisted(self, node: SimNode, rd: Ready) -> None:
        """Log matching over every persisted entry (called right after the disk took ``rd``)."""
        if rd.entries:
            first = rd.entries[0].first
            prev_key = (first - 1, node.disk.term_at(first - 1))
            for e in rd.entries:
                key = (e.last, e.term)
                value = (e.first, e.kind, e.data, prev_key)
                seen = self._graph.setdefault(key, value)
                if seen != value:
                    raise self._fail(
                        f"log matching: n{node.id} persisted {e} after {prev_key}, but "
                        f"({e.last}, {e.term}) was {seen}"
                    )
                prev_key = key
        for rs in rd.read_states:
            need = self._reads.pop(rs.ctx, None)
            if need is None:
                raise self._fail(f"n{node.id} answered unknown read {rs.ctx!r}")
            if rs.index < need:
                raise self._fail(
                    f"stale read: n{node.id} answered {rs.ctx!r} at {rs.index}, but {need} was "
                    "committed when it was asked"
                )
        for ctx in rd.dropped_reads:
            self._reads.pop(ctx, None)

    def read_asked(self, ctx: bytes) -> None:
        """A read was asked now: its answer must cover everything committed so far."""
        self._reads[ctx] = self.max_committed
