"""Raft's I/O half: the trio driver that runs many groups of one broker over files and sockets.

The pure core (``kafkaesque.raft``) decides; this package does what it decides: it persists
each ``Ready`` (fsync on a worker thread, group commit across groups), sends its messages over
the peer transport, ticks the cores on a trio clock, and wakes whoever waits for a commit.

* ``MultiRaft(node_id, send, *, state_dir, ...)``: every group of one broker, one trio task
  (``run``); ``add_replica``, ``remove_replica``, ``propose`` / ``propose_nowait``,
  ``read_index``, membership changes, ``handle_items`` and ``peer_changed`` (the transport's
  callbacks), ``hears(peer)``.
* ``RaftReplica``: one hosted group (its core, ``PartitionStorage``, commit index and waiters).
* ``PeerTransport``: the authenticated, optionally TLS, msgpack frame transport between brokers;
  ``PeerProtocolError`` and ``AuthenticationError`` for a peer that breaks its protocol.
* Storage on disk: ``PartitionStorage`` (the core's storage over a ``PartitionLog``),
  ``HardStateStore`` (every group's term and vote, one file), ``FsyncWorkers``.
* Outcomes of a proposal: ``CommitTimeout`` (unknown), ``ProposalLost`` (definitely failed).
* ``preferred_leader(group_id, voters)``: the replica that stands first in a new group.
"""

from ._errors import CommitTimeout, ProposalLost
from ._fsync import FsyncHelperDied, FsyncWorkers
from ._hard_state_store import HardStateStore
from ._multi_raft import SCRUB_BYTES_PER_TICK, MultiRaft, preferred_leader
from ._partition_storage import PartitionStorage
from ._replica import RaftReplica
from ._transport import PeerTransport
from ._wire import AuthenticationError, PeerProtocolError

__all__ = [
    "SCRUB_BYTES_PER_TICK",
    "AuthenticationError",
    "CommitTimeout",
    "FsyncHelperDied",
    "FsyncWorkers",
    "HardStateStore",
    "MultiRaft",
    "PartitionStorage",
    "PeerProtocolError",
    "PeerTransport",
    "ProposalLost",
    "RaftReplica",
    "preferred_leader",
]
