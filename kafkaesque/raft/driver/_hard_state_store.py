"""The hard state (term, vote, commit) of every Raft group of one broker, in one file.

Why one file: an election changes the term and vote of many groups at once (all the groups of a
restarted broker, say), and each must be durable before its vote is sent. One fsync per group
per round is what made 1,000 partitions unable to elect leaders (a round of fsyncs outlasted the
election timeout); one file saved once per driver cycle makes the cost one fsync for all groups,
as TiKV's single write batch and Ra's shared WAL do.

The file is ``<broker dir>/raft-hard-states``: a state file (msgpack map group → [term, vote,
commit] with a CRC32C, written to a temporary file, fsynced and renamed), so a crash leaves the
previous or the new version, never a mix.
"""

from __future__ import annotations

from typing import Any

from kafkaesque.storage import read_state_file, write_state_file

from .. import HardState

FILE_NAME = "raft-hard-states"


class HardStateStore:
    """Hard states by group id. ``put`` is in memory; ``save`` makes everything durable.

    Not thread-safe, except that ``write(snapshot)`` may run on a worker thread while the owner
    goes on (it only reads the snapshot it is given).
    """

    def __init__(self, directory: str) -> None:
        self.directory = directory
        state = read_state_file(directory, FILE_NAME) or {"groups": {}}
        self._states: dict[str, HardState] = {
            str(g): HardState(int(t), None if v is None else int(v), int(c))
            for g, (t, v, c) in state["groups"].items()
        }
        self._dirty = False

    def get(self, replica: str) -> HardState | None:
        return self._states.get(replica)

    def put(self, replica: str, hard_state: HardState, *, urgent: bool) -> None:
        """Record ``replica``'s hard state; ``urgent`` (term or vote changed) needs a save."""
        self._states[replica] = hard_state
        self._dirty |= urgent

    def forget(self, replica: str) -> None:
        """Drop ``replica`` (no longer hosted); saved with the next change of term or vote."""
        self._states.pop(replica, None)

    @property
    def dirty(self) -> bool:
        """True when a term or vote changed since the last snapshot: save before sending."""
        return self._dirty

    def snapshot(self) -> dict[str, Any]:
        """What ``write`` needs, taken on the owner's thread; clears ``dirty``."""
        self._dirty = False
        return {"groups": {g: [h.term, h.vote, h.commit] for g, h in self._states.items()}}

    def write(self, snapshot: dict[str, Any]) -> None:
        """Write a snapshot durably (blocking: run it on a worker thread)."""
        write_state_file(self.directory, FILE_NAME, snapshot)

    def save(self) -> None:
        self.write(self.snapshot())
