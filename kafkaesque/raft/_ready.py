"""What the core hands to its driver: a ``Ready``, and the records inside it.

The driver's loop, in this order (etcd's contract, adapted to a log that is the partition log):

1. ``rd = node.ready()`` (only when ``node.has_ready()``; never twice without ``advance``).
2. Make durable, in this order: ``rd.log_reset`` (wipe the log, set its start), then delete offsets
   ``>= rd.truncate_from``, then append ``rd.entries``, then ``rd.hard_state``. One fsync after all
   of them is enough; what matters is that all are durable before step 3.
3. Send ``rd.messages``: they may acknowledge entries or announce votes of this very Ready, so
   sending them earlier could lose an acknowledged write or double-vote after a crash. One
   exception (thesis §10.2.1, etcd's too): when every message is a leader's AppendEntries or
   heartbeat and the Ready changes neither term nor vote, they may go before step 2, so followers
   write while the leader does; the leader counts itself only for what ``advance`` says is
   durable.
4. Expose ``rd.committed`` (consumers may now read up to its last offset), answer
   ``rd.read_states`` once the applied offset reaches their index, fail ``rd.dropped_reads``.
5. ``node.advance(rd)``.

``step``, ``tick``, ``propose`` and friends may be called between ``ready()`` and ``advance()``
(e.g. while the fsync runs); their effects go into the next ``Ready``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._membership import Configuration
from ._messages import Message
from ._types import Entry, HardState, Role


@dataclass(frozen=True, slots=True)
class SoftState:
    """Volatile state worth reporting (routing, metrics); never persisted."""

    role: Role
    leader: int | None


@dataclass(frozen=True, slots=True)
class ReadState:
    """A read-index answer: serve read ``ctx`` once the applied offset is >= ``index``."""

    ctx: bytes
    index: int


@dataclass(frozen=True, slots=True)
class LogReset:
    """Replace the whole local log by an empty one starting at ``start``.

    Sent by a leader whose log no longer holds what a follower needs (retention deleted it). The
    storage keeps ``prev_term`` as the term at ``start - 1`` and ``config`` as the configuration in
    force at ``start - 1``; every offset below ``start`` is committed. Applications re-read their
    state from the log itself (it is the state), so nothing else is transferred.
    """

    start: int
    prev_term: int
    config: Configuration


@dataclass(frozen=True, slots=True)
class Ready:
    """A batch of work for the driver; see the module docstring for the required order."""

    # Role or leader changed since the previous Ready (informational, no ordering duty).
    soft_state: SoftState | None
    # Persist BEFORE sending ``messages``. None when unchanged.
    hard_state: HardState | None
    # Apply first: discard every entry, the log now starts (empty) at ``log_reset.start``.
    log_reset: LogReset | None
    # Then delete every offset >= truncate_from (a follower's divergent, uncommitted tail).
    # Invariant: truncate_from > the commit index; it equals entries[0].first when set.
    truncate_from: int | None
    # Then append these (contiguous, starting right after the log's last offset).
    entries: tuple[Entry, ...]
    # Send only AFTER everything above is durable.
    messages: tuple[Message, ...]
    # Offsets (first, last) newly committed: expose them after everything above is durable.
    committed: tuple[int, int] | None
    # Read-index answers (leader only).
    read_states: tuple[ReadState, ...]
    # Read-index requests this node will never answer (it lost leadership): fail them.
    dropped_reads: tuple[bytes, ...]

    def is_empty(self) -> bool:
        """True when the Ready asks nothing of the driver."""
        return (
            self.soft_state is None
            and self.hard_state is None
            and self.log_reset is None
            and not self.entries
            and not self.messages
            and self.committed is None
            and not self.read_states
            and not self.dropped_reads
        )
