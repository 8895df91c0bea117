"""Durable state after power losses: Raft terms and votes, the controller's metadata, leaders.

The harness reads each broker's terms and votes from its disk (``HardStates``) just after
killing it for a power loss (``before-cut``: what it had written, and so acted on; terms and
votes are fsynced before any message that depends on them), again once its disk has lost what
was not durable (``after-cut``: what it restarts with), and at the end of the run (``end``).
It records every ``CREATE`` it makes (``CreateTopic``), every broker's ``METADATA`` once every
broker is back (``MetadataSeen``), and whether each partition found a leader within 30 s of
that (``Leaders``). The rules:

* ``hard_state_regression``: a group's term after the cut is lower than before it, or the same
  term has lost or changed its vote, or the group's state is gone: the broker may vote again in
  a term it voted in, or go back to a term it left.
* ``double_vote``: one broker's observations of one group show two different votes in one term
  (the observations of a group that disappeared in between, a replica moved away and back,
  start over).
* ``metadata_regression``: a topic the controller acknowledged (an ``ok`` ``CreateTopic``), or
  that some broker listed earlier, is missing from a later broker's ``METADATA``, or listed
  with fewer partitions; the same for an ACL (``AddAcl``) in a later ``ACL LIST`` (runs never
  remove topics or ACLs).
* ``leaderless``: a partition with no leader 30 s after every broker was back.

One limit, from how the observation is made: a broker killed between renaming a new state file
into place and fsyncing its directory shows, before the cut, a state it had not acted on yet;
if the cut then loses the rename, the rule reports a regression the broker never used. The
window is one directory fsync during an election; the proof shows both states.
"""

from __future__ import annotations

from collections.abc import Sequence

from ._anomalies import DOUBLE_VOTE, HARD_STATE_REGRESSION, LEADERLESS, METADATA_REGRESSION
from ._check_findings import Findings
from .history import AddAcl, CreateTopic, Event, HardStates, Leaders, MetadataSeen, RaftState

__all__ = ["check_power"]


def check_power(events: Sequence[Event], findings: Findings) -> None:
    """Report the four kinds above from the observations in ``events``."""
    before: dict[str, tuple[int, HardStates]] = {}  # node -> its last before-cut observation
    votes: dict[tuple[str, str], dict[int, tuple[str, int]]] = {}  # (node, group) -> term ->
    acked: dict[str, tuple[int, int]] = {}  # topic -> (partitions, line of its ok CREATE)
    seen: dict[str, tuple[int, int]] = {}  # topic -> (most partitions listed, line)
    acls: dict[str, tuple[int, str]] = {}  # acl -> (line, how it became known)
    for i, ev in enumerate(events):
        op, line = ev.op, i + 1
        if ev.type != "ok":
            continue
        if isinstance(op, HardStates):
            node = ev.node or "?"
            if op.moment == "before-cut":
                before[node] = (line, op)
            elif op.moment == "after-cut" and node in before:
                _compare(findings, node, before.pop(node), (line, op))
            _votes(findings, node, line, op, votes)
        elif isinstance(op, CreateTopic):
            acked[op.topic] = (op.partitions, line)
        elif isinstance(op, AddAcl):
            acls.setdefault(op.acl, (line, "acknowledged"))
        elif isinstance(op, MetadataSeen):
            _metadata(findings, ev.node or "?", line, op, acked, seen)
            _acls(findings, ev.node or "?", line, op, acls)
        elif isinstance(op, Leaders):
            for tp in op.leaderless:
                findings.report(
                    LEADERLESS,
                    f"{tp.topic}/{tp.partition} had no leader {op.waited_s:.0f} s after every "
                    "broker was back",
                    (line,),
                    tp=(tp.topic, tp.partition),
                )


def _compare(
    findings: Findings, node: str, was: tuple[int, HardStates], now: tuple[int, HardStates]
) -> None:
    after = {s.group: s for s in now[1].states}
    for old in was[1].states:
        new = after.get(old.group)
        if new is None:
            what = "is gone"
        elif new.term < old.term:
            what = f"went back to term {new.term} vote {new.vote}"
        elif new.term == old.term and old.vote is not None and new.vote != old.vote:
            what = f"lost its vote: term {new.term} vote {new.vote}"
        else:
            continue
        findings.report(
            HARD_STATE_REGRESSION,
            f"{node}'s Raft state of {old.group} (term {old.term} vote {old.vote} before its "
            f"power loss) {what} after it",
            (was[0], now[0]),
        )


def _votes(
    findings: Findings,
    node: str,
    line: int,
    op: HardStates,
    votes: dict[tuple[str, str], dict[int, tuple[str, int]]],
) -> None:
    present = {s.group for s in op.states}
    for key in [k for k in votes if k[0] == node and k[1] not in present]:
        del votes[key]  # the group is gone from this broker: a later one is a new replica
    for s in op.states:
        _one_vote(findings, node, line, s, votes.setdefault((node, s.group), {}))


def _one_vote(
    findings: Findings, node: str, line: int, s: RaftState, terms: dict[int, tuple[str, int]]
) -> None:
    if s.vote is None:
        return
    earlier = terms.get(s.term)
    if earlier is None:
        terms[s.term] = (s.vote, line)
    elif earlier[0] != s.vote:
        findings.report(
            DOUBLE_VOTE,
            f"{node} voted for {earlier[0]} and for {s.vote} in term {s.term} of {s.group}",
            (earlier[1], line),
        )
        terms[s.term] = (s.vote, line)  # report each new vote once


def _metadata(
    findings: Findings,
    node: str,
    line: int,
    op: MetadataSeen,
    acked: dict[str, tuple[int, int]],
    seen: dict[str, tuple[int, int]],
) -> None:
    listed = dict(op.topics)
    wanted: dict[str, tuple[int, int, str]] = {
        t: (n, at, "acknowledged") for t, (n, at) in acked.items()
    }
    for t, (n, at) in seen.items():
        if t not in wanted or n > wanted[t][0]:
            wanted[t] = (n, at, "listed by a broker")
    for topic, (count, at, how) in sorted(wanted.items()):
        has = listed.get(topic)
        if has is not None and has >= count:
            continue
        shown = "lacks it" if has is None else f"lists {has} partitions"
        findings.report(
            METADATA_REGRESSION,
            f"topic {topic} ({count} partitions, {how} at line {at}): {node}'s METADATA {shown}",
            (at, line),
        )
    for topic, count in listed.items():
        if count > seen.get(topic, (0, 0))[0]:
            seen[topic] = (count, line)


def _acls(
    findings: Findings, node: str, line: int, op: MetadataSeen, known: dict[str, tuple[int, str]]
) -> None:
    if op.acls is None:
        return  # no ACL LIST answer: it proves nothing
    listed = set(op.acls)
    for acl, (at, how) in sorted(known.items()):
        if acl not in listed:
            findings.report(
                METADATA_REGRESSION,
                f"ACL {acl!r} ({how} at line {at}): {node}'s ACL LIST lacks it",
                (at, line),
            )
    for acl in op.acls:
        known.setdefault(acl, (line, "listed by a broker"))
