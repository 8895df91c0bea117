"""The controller's Raft journal, durable before pysyncobj acknowledges or votes (issue 36).

pysyncobj 0.3.17's ``FileJournal`` writes entries through an mmap that it msyncs only on a clean
stop, and stores term and vote with a rename that is never fsynced: one node's power cut can
roll back its vote (a double vote in one term), a whole cluster's can forget topics, ACLs and
users it had acknowledged. ``DurableJournal`` keeps pysyncobj's file format (a data directory
written by pysyncobj opens unchanged) and writes it with ``pwrite`` and ``fdatasync``:

- an entry is on disk before ``add`` returns, so before a follower answers an append and before
  a leader counts its own copy; the header's end offset is raised only after the entry it
  covers is durable, so a cut never leaves an end pointing at a torn record;
- a truncation (``deleteEntriesFrom``) lowers the end durably before anything is overwritten;
- term and vote are written to a temporary file, fsynced, renamed, and the directory fsynced
  before ``setCurrentTerm`` returns (pysyncobj sends the vote after it);
- before entries are dropped for a snapshot (``deleteEntriesTo``, ``clear``) the dump that
  holds them is fsynced, with its directory; the compacted journal replaces the old one whole.

pysyncobj builds its journal through ``pysyncobj.syncobj.createJournal``; ``install`` wraps that
function once so that the journal files registered with ``register`` (ours) get this class and
any other SyncObj in the process keeps pysyncobj's own.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
from typing import Any

import pysyncobj.syncobj
from pysyncobj.journal import Journal, createJournal
from pysyncobj.pickle import dumps, loads, to_bytes
from pysyncobj.version import VERSION

log = logging.getLogger("kafkaesque.controller")

# pysyncobj's journal format (journal.py): a 40-byte header (name 24, version 8, format 4, the
# end offset of the last record 4), then records: size u32, index u64, term u64, command, size u32.
_NAME_SIZE, _VERSION_SIZE = 24, 8
_FORMAT_VERSION = 1
_END_AT = _NAME_SIZE + _VERSION_SIZE + 4
_FIRST_RECORD = _END_AT + 4
_U32 = struct.Struct("<I")
_IDX_TERM = struct.Struct("<QQ")

Entry = tuple[bytes, int, int]


def _header() -> bytes:
    name = b"PYSYNCOBJ".ljust(_NAME_SIZE, b"\0")
    version = str(VERSION).encode().ljust(_VERSION_SIZE, b"\0")
    return name + version + struct.pack("<II", _FORMAT_VERSION, _FIRST_RECORD)


def _record(command: Any, idx: int, term: int) -> bytes:
    body = _IDX_TERM.pack(idx, term) + bytes(to_bytes(command))
    size = _U32.pack(len(body))
    return size + body + size


def _parse(data: bytes, path: str) -> tuple[list[Entry], int]:
    """The entries of a journal file and the offset after the last one. A record that does not
    fit or whose two sizes differ ends the journal there (a file of an older writer, torn)."""
    if len(data) < _FIRST_RECORD:
        return [], _FIRST_RECORD
    (end,) = _U32.unpack_from(data, _END_AT)
    entries: list[Entry] = []
    pos = _FIRST_RECORD
    while pos < min(end, len(data)):
        if pos + 4 > len(data):
            break
        (size,) = _U32.unpack_from(data, pos)
        if size < _IDX_TERM.size or pos + size + 8 > len(data):
            break
        if _U32.unpack_from(data, pos + 4 + size)[0] != size:
            break
        idx, term = _IDX_TERM.unpack_from(data, pos + 4)
        entries.append((data[pos + 4 + _IDX_TERM.size : pos + 4 + size], idx, term))
        pos += size + 8
    if pos != end:
        log.warning("%s: the journal ends at byte %d, its header said %d: torn", path, pos, end)
    return entries, pos


class DurableJournal(Journal):  # type: ignore[misc]  # pysyncobj is untyped
    """pysyncobj's ``Journal`` interface over ``path``, every change durable when it returns
    (see the module's docstring). ``dump_path``: the snapshot pysyncobj writes beside it.

    Used on pysyncobj's thread only.
    """

    def __init__(self, path: str, dump_path: str | None) -> None:
        self._path = path
        self._dump_path = dump_path
        self._directory = os.path.dirname(os.path.abspath(path))
        new = not os.path.exists(path)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        if new or os.fstat(self._fd).st_size < _FIRST_RECORD:
            os.pwrite(self._fd, _header(), 0)
            os.fsync(self._fd)
            self._sync_directory()
        with open(path, "rb") as f:
            self._entries, self._end = _parse(f.read(), path)
        # Entries truncated in memory whose bytes still follow ``_end`` on disk, in order, with
        # the disk's end offset still after them (see deleteEntriesFrom).
        self._cut: list[Entry] = []
        self._meta_path = path + ".meta"
        self._meta: dict[str, Any] = self._read_meta()
        self._meta_saved = True

    # -- entries ------------------------------------------------------------------------------

    def add(self, command: Any, idx: int, term: int) -> None:
        if self._cut:
            if (bytes(self._cut[0][0]), self._cut[0][1], self._cut[0][2]) == (
                bytes(to_bytes(command)),
                idx,
                term,
            ):
                # The entry a truncation removed, sent again: still on disk where it belongs.
                self._cut.pop(0)
                self._entries.append((command, idx, term))
                self._end += len(_record(command, idx, term))
                return
            self._apply_cut()
        record = _record(command, idx, term)
        os.pwrite(self._fd, record, self._end)
        os.fsync(self._fd)  # the record first: the end never points at a torn one
        self._set_end(self._end + len(record))
        self._entries.append((command, idx, term))

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        """Drop the entries from ``entryFrom`` on; on disk only when a different entry is added
        there (or another change comes first).

        pysyncobj truncates whenever a leader's append overlaps what a follower holds (a resend
        while an answer is under way), then adds the same entries again; Raft truncates only at
        a conflict (section 5.3). Writing that out would cost an fsync per entry twice, and a cut
        in between would leave the follower shorter than what it acknowledged.
        """
        dropped = self._entries[entryFrom:]
        del self._entries[entryFrom:]
        for command, idx, term in dropped:
            self._end -= len(_record(command, idx, term))
        self._cut = dropped + self._cut

    def _apply_cut(self) -> None:
        """Make a pending truncation durable: before anything overwrites those bytes."""
        if self._cut:
            self._cut = []
            self._set_end(self._end)

    def deleteEntriesTo(self, entryTo: int) -> None:
        self._sync_dump()  # the dump holds what is dropped: durable first
        self._cut = []  # the file is rewritten from the entries kept: nothing cut stays on disk
        kept = self._entries[entryTo:]
        body = b"".join(_record(*entry) for entry in kept)
        header = bytearray(_header())
        _U32.pack_into(header, _END_AT, _FIRST_RECORD + len(body))
        tmp = self._path + ".tmp"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, bytes(header) + body)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        os.replace(tmp, self._path)
        self._sync_directory()
        os.close(self._fd)
        self._fd = fd
        self._entries = list(kept)
        self._end = _FIRST_RECORD + len(body)

    def clear(self) -> None:
        self._cut = []
        self._sync_dump()  # called when a dump replaces the journal
        self._entries = []
        self._set_end(_FIRST_RECORD)

    def __getitem__(self, item: Any) -> Any:
        return self._entries[item]

    def __len__(self) -> int:
        return len(self._entries)

    def _set_end(self, end: int) -> None:
        os.pwrite(self._fd, _U32.pack(end), _END_AT)
        os.fsync(self._fd)
        self._end = end

    def _sync_dump(self) -> None:
        if self._dump_path is None:
            return
        try:
            fd = os.open(self._dump_path, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self._sync_directory()

    def _sync_directory(self) -> None:
        fd = os.open(self._directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # -- term, vote and commit index ------------------------------------------------------------

    def _read_meta(self) -> dict[str, Any]:
        try:
            with open(self._meta_path, "rb") as f:
                meta = loads(f.read())
        except FileNotFoundError:
            return {}
        if not isinstance(meta, dict):
            raise ValueError(f"{self._meta_path}: not a term and vote record")
        return meta

    def _store_meta(self) -> None:
        tmp = self._meta_path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, dumps(self._meta))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self._meta_path)
        self._sync_directory()
        self._meta_saved = True

    def setCurrentTerm(self, term: int, votedForNodeId: Any) -> None:
        self._meta["currentTerm"] = term
        self._meta["votedForNodeId"] = votedForNodeId
        self._store_meta()  # before pysyncobj sends anything that depends on it

    def getCurrentTerm(self) -> int:
        return int(self._meta.get("currentTerm", 0))

    def getVotedForNodeId(self) -> Any:
        return self._meta.get("votedForNodeId")

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:
        # Raft needs no durable commit index (it is learnt again from the leader); saved with
        # the next term change or within a second, as pysyncobj does.
        self._meta["raftCommitIndex"] = raftCommitIndex
        self._meta_saved = False

    def getRaftCommitIndex(self) -> int:
        return int(self._meta.get("raftCommitIndex", 1))

    def onOneSecondTimer(self) -> None:
        if not self._meta_saved:
            self._store_meta()

    def flush(self) -> None:
        """Nothing to do: every change was durable when it returned."""

    def _destroy(self) -> None:
        os.close(self._fd)


_dumps_by_journal: dict[str, str | None] = {}
_install_lock = threading.Lock()


def register(journal_path: str, dump_path: str | None) -> None:
    """Have pysyncobj open ``journal_path`` as a ``DurableJournal`` (call before its SyncObj
    is built; ``install`` must have run)."""
    _dumps_by_journal[os.path.abspath(journal_path)] = dump_path


def _create_journal(journal_file: str | None = None) -> Any:
    if journal_file is not None and os.path.abspath(journal_file) in _dumps_by_journal:
        return DurableJournal(journal_file, _dumps_by_journal[os.path.abspath(journal_file)])
    return createJournal(journal_file)


def install() -> None:
    """Route pysyncobj's journal creation through ``_create_journal`` (idempotent)."""
    with _install_lock:
        if pysyncobj.syncobj.createJournal is not _create_journal:
            pysyncobj.syncobj.createJournal = _create_journal
