"""Errors of the Raft core, sorted by who must act (the project's error taxonomy).

* ``NotLeader``: this node cannot take the request; the caller retries at ``leader`` (a hint that
  may be stale or ``None``). Nothing was appended.
* ``ProposalDropped``: this node is the leader but refuses the request for now (a leadership
  transfer is running, a membership change is already in flight, ...). Nothing was appended; retry
  later.
* ``InvalidConfigChange`` and ``RaftUsageError``: the caller misused the API (added a member twice,
  called ``ready()`` twice without ``advance()``). A bug in the caller; retrying will not help.
* ``MalformedMessage``: a peer sent bytes or a message that break the protocol's shape. The
  transport closes that connection (h11's RemoteProtocolError).
* ``RaftInvariantError``: a broken invariant of the algorithm (a truncation below the commit index,
  two leaders in one term seen from inside, a commit index beyond the log). Fail-stop: it is not a
  ``RaftError`` on purpose, so ``except RaftError`` never swallows it; the process must stop that
  group and an operator must look.
* ``LogDiverged``: a follower's committed prefix disagrees with its leader's log, which only
  acknowledgements that do not wait for fsync make possible (``RaftConfig.durable_acks`` off).
  Not a ``RaftError`` either: the driver must cut the log where it says and start a new core.
"""

from __future__ import annotations


class RaftError(Exception):
    """Base of the errors a caller of the Raft core may handle."""


class NotLeader(RaftError):
    """The request needs the leader and this node is not it.

    ``leader`` is the leader this node last heard from in its current term, or ``None`` if it knows
    of none; the caller may forward the request there.
    """

    def __init__(self, leader: int | None) -> None:
        super().__init__(f"not the leader (leader hint: {leader})")
        self.leader = leader


class ProposalDropped(RaftError):
    """The leader refused the request for now; nothing was appended, the caller may retry."""


class InvalidConfigChange(RaftError, ValueError):
    """A membership change that can never be valid from the current configuration."""


class RaftUsageError(RaftError):
    """The caller broke the API contract (call order, arguments)."""


class MalformedMessage(RaftError, ValueError):
    """A message from a peer does not have the protocol's shape; close that connection."""


class RaftInvariantError(Exception):
    """A Raft invariant is broken. Fail-stop: never catch this to carry on."""


class LogDiverged(Exception):
    """This follower's log disagrees with its leader's at or below its commit index: a quorum
    lost entries this follower saw committed (acknowledgements that did not wait for fsync, then
    a power cut). Raised by ``step`` only with ``RaftConfig.durable_acks`` off; the core must act
    no more. The driver cuts the log to end before ``offset`` (an entry boundary, where the
    first entry that disagrees begins) and builds a new core over it, which then follows the
    leader's log from there."""

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(f"log disagrees with the leader's from offset {offset} on: {reason}")
        self.offset = offset
        self.reason = reason
