"""Value types shared by the Raft core, its storage and its messages.

The partition log IS the Raft log: one offset space. An entry is a record batch spanning the
offsets ``[first, last]``; its Raft index is ``last``. Entries are contiguous (the next entry's
``first`` is this one's ``last + 1``) and offsets start at 0, so an empty log has
``last_index == start_offset - 1 == -1`` and the sentinel term at index -1 is 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import Any


class ElectionCause(Enum):
    """Why a node started the campaign it won (``RaftNode.last_election``), as data set where
    campaigns start, never guessed from logs afterwards."""

    STARTUP = "start-up"  # no leader known since the node started (a new group, a restart)
    TIMEOUT = "leader timeout"  # the election timeout ran out without word from the leader
    LEADER_GONE = "leader gone"  # the driver knew the leader's broker gone (connection closed)
    TRANSFER = "leadership transfer"  # the leader handed over (TimeoutNow, thesis §3.10)
    CHECK_QUORUM = "check-quorum step-down"  # this node led, lost its majority, stepped down


@dataclass(frozen=True, slots=True)
class Election:
    """An election a node won: the term it leads in and why the campaign was held."""

    term: int
    cause: ElectionCause


class EntryKind(IntEnum):
    """What an entry carries. The values match ``kafkaesque.storage``'s ``BatchType``."""

    DATA = 0
    NOOP = 1  # the no-op a new leader appends at the start of its term (Raft §8)
    CONFIG = 2  # a membership configuration (data = ``Configuration.encode()``)


@dataclass(frozen=True, slots=True)
class Entry:
    """One log entry: an opaque record batch covering offsets ``[first, last]``.

    The core never parses ``data``; the driver stamps ``first`` and ``term`` into the batch header
    when it writes the batch. Control entries (``NOOP``, ``CONFIG``) take one offset.

    ``prepared`` is what the storage made of ``data`` when the entry was proposed here (its
    checked batch: ``PartitionStorage.check_proposal``), handed back to it when the entry is
    written, so the batch is parsed once. Opaque to the core, never sent, not compared; None
    for entries that came from the wire.
    """

    term: int  # Invariant: term >= 1 (term 0 exists only as the sentinel before offset 0).
    first: int  # Invariant: 0 <= first <= last.
    last: int
    kind: EntryKind
    data: bytes = b""
    prepared: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.term < 1:
            raise ValueError(f"entry term must be >= 1, got {self.term}")
        if self.first < 0 or self.last < self.first:
            raise ValueError(f"bad entry offsets [{self.first}, {self.last}]")
        if self.kind is not EntryKind.DATA and self.first != self.last:
            raise ValueError(f"a {self.kind.name} entry takes exactly one offset")

    @property
    def count(self) -> int:
        """How many offsets the entry takes."""
        return self.last - self.first + 1

    @property
    def size(self) -> int:
        """The bytes counted against message budgets (the payload)."""
        return len(self.data)


@dataclass(frozen=True, slots=True)
class HardState:
    """What must be durable before any message reflecting it is sent (Raft Figure 2).

    ``commit`` is persisted so a restarted node knows what it may expose at once; losing a recent
    commit value is harmless (it is learned again), losing ``term`` or ``vote`` is not.
    """

    term: int = 0
    vote: int | None = None  # Invariant: the node voted for in ``term``, or None.
    commit: int = -1


class Role(Enum):
    """The role of a node (Raft §5.1, plus the pre-candidate of the thesis §9.6)."""

    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre-candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"
