"""``PartitionStorage``: a ``PartitionLog`` seen as the Raft log of its partition's group.

One offset space, no second journal: a DATA entry is a producer's record batch, written with the
entry's first offset and term stamped into its header; NOOP and CONFIG entries are one-record
control batches (batch types 1 and 2) whose record value is the entry's data.

Beside the log, the partition directory holds ``raft-state``: the configuration history (the
CONFIG entries' offsets and payloads, plus the configuration in force just before the log start)
and, unless a broker-wide ``HardStateStore`` keeps it, the hard state (term, vote, commit).
Keeping the history there, rather than finding CONFIG batches by scanning the log, is what keeps
a restart independent of the log's size. A bootstrap configuration is written there at the
group's first start; a replica started without one (a spare joining a running group) has no
file until the leader's first CONFIG entry or log start reaches it.

Durability: ``persist`` writes a Ready's log changes. A changed configuration history is saved
at once (rare). A changed term or vote goes to the ``HardStateStore``, which the driver saves,
once for all groups, before it sends any message; without a store it is saved at once here. The
log itself is fsynced by the caller (``flush`` or a flush ticket), once for many groups: group
commit. The commit index alone changes on almost every Ready; it is written along with the
other fields or on ``close``, since a stale commit index is harmless (a node relearns it).
"""

from __future__ import annotations

from collections.abc import Sequence

from kafkaesque.storage import (
    BatchType,
    CheckedBatch,
    CorruptLogError,
    InvalidBatchError,
    PartitionLog,
    Record,
    build_batch,
    decode_records,
    iter_batches,
    read_state_file,
    write_state_file,
)

from .. import Configuration, Entry, EntryKind, HardState, InitialState, Ready
from ._hard_state_store import HardStateStore

STATE_FILE = "raft-state"


class PartitionStorage:
    """The ``RaftStorage`` of one partition, and the writes its driver makes. Not thread-safe."""

    def __init__(
        self,
        log: PartitionLog,
        bootstrap: Configuration | None = None,
        *,
        hard_states: HardStateStore | None = None,
        key: str = "",
    ) -> None:
        """Wrap an open log; ``bootstrap`` seeds the group's first configuration if it has none.

        With ``hard_states``, term/vote/commit live there under ``key`` (one file per broker).
        """
        self.log = log
        self._store = hard_states
        self._key = key
        state = read_state_file(log.directory, STATE_FILE)
        hard = HardState()
        if state is None:
            self._configs: list[tuple[int, bytes]] = (
                [(-1, bootstrap.encode())] if bootstrap is not None else []
            )
        else:
            self._configs = [(int(o), bytes(c)) for o, c in state["configs"]]
            if "term" in state:
                vote = state["vote"]
                hard = HardState(
                    int(state["term"]), None if vote is None else int(vote), int(state["commit"])
                )
        if hard_states is not None:
            hard = hard_states.get(key) or hard
        # A commit index written before a crash cut the log's tail must not outrun the log.
        self._hard = HardState(hard.term, hard.vote, min(hard.commit, self.last_index()))
        self._trim_configs_to(self.last_index() + 1)
        if state is None and bootstrap is not None:
            # The group's first configuration is kept from its first start: the caller may
            # have none to give at the next (the partition moved meanwhile, and a replica that
            # starts with no configuration waits for a leader, which may be this one).
            self._save()

    # -- RaftStorage ------------------------------------------------------------------------

    def initial_state(self) -> InitialState:
        return InitialState(self._hard, tuple(self._configs), self.log.lost_end_offset)

    def start_offset(self) -> int:
        return self.log.log_start_offset

    def last_index(self) -> int:
        return self.log.log_end_offset - 1

    def term_at(self, index: int) -> int:
        term = self.log.term_at(index)
        if term is None:
            raise IndexError(
                f"offset {index} outside [{self.start_offset() - 1}, {self.last_index()}]"
            )
        return term

    def entries(self, lo: int, max_bytes: int) -> Sequence[Entry]:
        if not self.start_offset() <= lo <= self.last_index() + 1:
            raise IndexError(
                f"offset {lo} outside [{self.start_offset()}, {self.last_index() + 1}]"
            )
        out: list[Entry] = []
        size, offset, end = 0, lo, self.last_index() + 1
        while offset < end:  # one read serves one segment: go on into the next
            result = self.log.read(offset, max(max_bytes - size, 1))
            data, pos = result.data, 0
            for header in iter_batches(data, verify=False):  # the log verified them
                batch = bytes(data[pos : pos + header.size])
                pos += header.size
                kind = EntryKind(header.batch_type)
                if kind is EntryKind.DATA:
                    payload = batch
                else:
                    records = decode_records(batch, header)
                    payload = (records[0].value or b"") if records else b""
                if out and size + len(payload) > max_bytes:
                    return out
                out.append(
                    Entry(header.term, header.base_offset, header.last_offset, kind, payload)
                )
                size += len(payload)
            if not data or size >= max_bytes:
                break
            offset = result.next_offset
        return out

    def term_start_offset(self, term: int) -> int:
        start = self.start_offset()
        for t, s in self.log.term_starts():
            if t >= term:
                return max(s, start)
        return self.last_index() + 1

    # -- the driver's writes ---------------------------------------------------------------

    def check_proposal(self, batch: bytes | CheckedBatch, count: int) -> CheckedBatch:
        """Refuse what cannot be proposed as a DATA entry of ``count`` offsets; else the
        checked batch, which the entry carries to ``persist`` (``Entry.prepared``).

        It must be one valid batch of data records (``PartitionLog.check_batch``): a control
        batch proposed as data would be read back as a control entry, and a configuration one
        would change the group's membership. A batch checked already (by this log) is only
        held to ``count``. Raises ``InvalidBatchError``.
        """
        if isinstance(batch, CheckedBatch):
            checked, header = batch, batch.header
            if header.last_offset_delta + 1 != count:
                raise InvalidBatchError(
                    f"the batch spans {header.last_offset_delta + 1} offsets, not {count}"
                )
        else:
            checked = self.log.check_batch(batch, span=count)
            header = checked.header
        if header.batch_type is not BatchType.DATA:
            raise InvalidBatchError(
                f"a proposal must be a batch of data, not of {header.batch_type.name}"
            )
        return checked

    @property
    def hard_state(self) -> HardState:
        return self._hard

    def persist(self, rd: Ready) -> None:
        """Write a Ready's log changes and hard state, in the order ``Ready`` documents.

        Everything but the log's own fsync is durable on return (see the module docstring).
        """
        save = False
        if rd.log_reset is not None:
            reset = rd.log_reset
            self.log.reset(reset.start, reset.prev_term)
            self._configs = [(reset.start - 1, reset.config.encode())]
            save = True
        if rd.truncate_from is not None:
            self.log.truncate(rd.truncate_from)
            save |= self._trim_configs_to(rd.truncate_from)
        if rd.entries:
            self._append(rd.entries)
        for entry in rd.entries:
            if entry.kind is EntryKind.CONFIG:
                self._configs.append((entry.last, entry.data))
                save = True
        if rd.hard_state is not None:
            old, self._hard = self._hard, rd.hard_state
            changed = (old.term, old.vote) != (rd.hard_state.term, rd.hard_state.vote)
            if self._store is not None:
                self._store.put(self._key, rd.hard_state, urgent=changed)
            else:
                save |= changed
        if save:
            self._save()

    def _append(self, entries: Sequence[Entry]) -> None:
        """Write entries as batches stamped with their offsets and terms: one group write."""
        batches = [
            (
                (entry.prepared or entry.data)
                if entry.kind is EntryKind.DATA
                else build_batch([Record(value=entry.data)], batch_type=BatchType(entry.kind)),
                entry.term,
            )
            for entry in entries
        ]
        for entry, result in zip(entries, self.log.append_many(batches), strict=True):
            if (result.base_offset, result.last_offset) != (entry.first, entry.last):
                raise AssertionError(
                    f"entry {entry.first}-{entry.last} landed at "
                    f"{result.base_offset}-{result.last_offset}: the log and Raft disagree"
                )

    def _trim_configs_to(self, end: int) -> bool:
        kept = [c for c in self._configs if c[0] < end]
        changed = len(kept) != len(self._configs)
        self._configs = kept
        return changed

    def repair_corruption(self, error: CorruptLogError) -> int:
        """Cut the log before the corrupt batch ``error`` points at; return the new log end.

        See ``PartitionLog.repair_corruption``: what was durable and is now gone is recorded as
        the log's lost end, which ``initial_state`` reports. The configuration history and the
        commit index follow the shorter log. The caller (the driver) builds a new core over this
        storage afterwards, as after a restart: the old core's view of the log is wrong.
        """
        end = self.log.repair_corruption(error)
        if self._trim_configs_to(end):
            self._save()
        self._commit_within_log()
        return end

    def _commit_within_log(self) -> None:
        hard = self._hard
        if hard.commit > self.last_index():
            self._hard = HardState(hard.term, hard.vote, self.last_index())
            if self._store is not None:
                self._store.put(self._key, self._hard, urgent=False)

    def cut_diverged(self, offset: int) -> int:
        """Cut the log to end before ``offset`` (an entry boundary), at or below the commit
        index: entries committed here that the group's leader does not hold (``LogDiverged``);
        return the new log end.

        Nothing is recorded as lost: this disk lost nothing, the quorum did. The configuration
        history and the commit index follow the shorter log; the caller builds a new core over
        this storage afterwards, as after ``repair_corruption``.
        """
        self.log.truncate(offset)
        if self._trim_configs_to(offset):
            self._save()
        self._commit_within_log()
        return self.log.log_end_offset

    def enforce_retention(self, applied: int) -> list[int]:
        """Apply the log's retention below ``applied + 1``; keep the configuration history right."""
        deleted = self.log.enforce_retention(max_offset=applied + 1)
        if deleted:
            start = self.start_offset()
            below = [c for c in self._configs if c[0] < start]
            self._configs = below[-1:] + [c for c in self._configs if c[0] >= start]
            self._save()
        return deleted

    def _save(self) -> None:
        state: dict[str, object] = {"configs": [[o, c] for o, c in self._configs]}
        if self._store is None:
            state.update(term=self._hard.term, vote=self._hard.vote, commit=self._hard.commit)
        write_state_file(self.log.directory, STATE_FILE, state)

    def close(self) -> None:
        """Save the latest commit index (with the store: the store's owner saves) and close."""
        if self._store is None:
            self._save()
        self.log.close()
