"""Raft, one group per partition: the pure core. Its I/O half, the trio driver and the msgpack
transport, is the subpackage ``kafkaesque.raft.driver``.

The public API of the core (the trio driver and the simulator use only these names):

* ``RaftNode(config, storage, rng, *, applied=None)``: ``tick()``, ``step(msg)``,
  ``propose(data, count=1) -> offset``, ``add_learner/promote/remove(node) -> offset``,
  ``transfer_leadership(to)``, ``read_index(ctx)``, ``campaign()``, ``has_ready()``,
  ``ready() -> Ready``, ``advance(ready)``, ``status() -> Status``.
* ``RaftConfig``, ``Configuration``: settings and membership.
* ``RaftStorage`` (the Protocol storage implements), ``InitialState``, ``MemoryStorage``.
* Values: ``Entry``, ``EntryKind``, ``HardState``, ``Role``, ``Ready``, ``SoftState``,
  ``ReadState``, ``LogReset``; ``Election`` and ``ElectionCause`` (``RaftNode.last_election``).
* Messages and their wire form: ``Message`` and its types, ``to_wire``, ``from_wire``.
* ``QuiescencePolicy``, ``QuietState``, ``OrphanWake``: when a quiet group stops ticking and
  what wakes it (time is a tick count passed in).
* Errors: ``RaftError``, ``NotLeader``, ``ProposalDropped``, ``InvalidConfigChange``,
  ``RaftUsageError``, ``MalformedMessage``, ``RaftInvariantError``, ``LogDiverged``.
"""

from ._config import (
    BUG_COMMIT_OLD_TERM,
    BUG_FORGET_VOTE,
    BUG_VOTE_WITHOUT_LOG_CHECK,
    KNOWN_BUGS,
    RaftConfig,
)
from ._core import ProgressInfo, RaftNode, Status
from ._errors import (
    InvalidConfigChange,
    LogDiverged,
    MalformedMessage,
    NotLeader,
    ProposalDropped,
    RaftError,
    RaftInvariantError,
    RaftUsageError,
)
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
    describe,
    from_wire,
    to_wire,
)
from ._progress import ProgressState
from ._quiescence import QUIESCE_AFTER_TICKS, OrphanWake, QuiescencePolicy, QuietState
from ._ready import LogReset, ReadState, Ready, SoftState
from ._storage import InitialState, MemoryStorage, RaftStorage
from ._types import Election, ElectionCause, Entry, EntryKind, HardState, Role

__all__ = [
    "BUG_COMMIT_OLD_TERM",
    "BUG_FORGET_VOTE",
    "BUG_VOTE_WITHOUT_LOG_CHECK",
    "KNOWN_BUGS",
    "QUIESCE_AFTER_TICKS",
    "AppendEntries",
    "AppendEntriesResponse",
    "Configuration",
    "Election",
    "ElectionCause",
    "Entry",
    "EntryKind",
    "HardState",
    "Heartbeat",
    "HeartbeatResponse",
    "InitialState",
    "InstallLogStart",
    "InvalidConfigChange",
    "LogDiverged",
    "LogReset",
    "MalformedMessage",
    "MemoryStorage",
    "Message",
    "NotLeader",
    "OrphanWake",
    "ProgressInfo",
    "ProgressState",
    "ProposalDropped",
    "QuiescencePolicy",
    "QuietState",
    "RaftConfig",
    "RaftError",
    "RaftInvariantError",
    "RaftLog",
    "RaftNode",
    "RaftStorage",
    "RaftUsageError",
    "ReadState",
    "Ready",
    "RequestVote",
    "RequestVoteResponse",
    "Role",
    "SoftState",
    "Status",
    "TimeoutNow",
    "describe",
    "from_wire",
    "to_wire",
]
