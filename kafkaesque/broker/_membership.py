"""Moving a partition's replicas: its leader steers the Raft membership toward the assignment.

The metadata holds the assignment an operator asked for (``REASSIGN``); the partition's Raft
group holds the membership in force. The broker that leads the group closes the gap one server
at a time (Ongaro's thesis §4.1, which keeps any two majorities overlapping without joint
consensus): add each new broker as a learner, promote it once it has caught up, then remove the
brokers that are no longer assigned. A leader that must leave hands leadership to an assigned
voter first; the new leader finishes the job. Every step is retried until it takes, so a
leader that dies mid-way leaves nothing half done: its successor computes the next step from the
membership it finds.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from kafkaesque.raft import Configuration

Action = Literal["add_learner", "promote", "remove", "transfer"]


class Change(NamedTuple):
    action: Action
    node: int


def next_change(conf: Configuration, target: frozenset[int], leader: int) -> Change | None:
    """The next single-server step from ``conf`` toward voters ``target`` (None: done).

    Pure. New brokers come in (as learners, then voters) before old ones leave, so the group
    never has fewer voters than either assignment. A learner that is not caught up is promoted
    later: the core refuses until it is, and the caller simply retries.
    """
    if not target:
        return None
    missing = target - conf.members
    if missing:
        return Change("add_learner", min(missing))
    waiting = conf.learners & target
    if waiting:
        return Change("promote", min(waiting))
    leaving = conf.voters - target
    others = leaving - {leader}
    if others:
        return Change("remove", min(others))
    if leader in leaving:
        return Change("transfer", min(target & conf.voters))
    extra_learners = conf.learners - target
    if extra_learners:
        return Change("remove", min(extra_learners))
    return None
