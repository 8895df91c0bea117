"""A storage crash simulator: what a partition log comes back to after a power cut (issue 36).

The log runs on real files; every ``fsync``/``fdatasync`` is recorded (by inode: the content of
a file, the entries of a directory). A power loss then builds the disk as the cut may leave it:
a directory holds the entries of its last fsync (or, as a kernel may also have written them
back, its current ones); a file holds, sector by sector (512 bytes), what it held at its last
fsync or what was written since (lost, torn or reordered writes), and is no longer than its
current length or shorter than what was synced. Unsynced new files come back empty or partly
written. Recovery on that disk must never lose a write the log called durable, never present a
torn record, and never take a normal torn tail for lost fsynced data (a false corruption
verdict makes a replica stop voting: with two of them a partition has no leader).
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafkaesque.raft import HardState
from kafkaesque.raft.driver import HardStateStore
from kafkaesque.storage import (
    FsyncPolicy,
    LogConfig,
    PartitionLog,
    Record,
    build_batch,
    data_records,
    makedirs_durable,
)
from tests.power_cut import DiskAtCrash, SyncRecorder, crash_settings, power_cut, recording_syncs

Op = tuple[str, int]
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 4)),
        st.tuples(st.just("flush"), st.just(0)),
        st.tuples(st.just("roll"), st.just(0)),
        st.tuples(st.just("reopen"), st.just(0)),
    ),
    min_size=1,
    max_size=14,
)


@crash_settings(100)
@given(ops=OPS, data=st.data())
def test_recovery_after_a_power_cut_keeps_every_durable_write(
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    ops: list[Op],
    data: st.DataObject,
) -> None:
    root = tmp_path_factory.mktemp("disk")
    directory = root / "broker" / "topic" / "0"
    config = LogConfig(fsync=FsyncPolicy.ALWAYS, index_interval_bytes=256)
    values: list[bytes | None] = []
    durable = 0
    with recording_syncs(monkeypatch, root) as synced:
        log = PartitionLog.open(str(directory), config)
        try:
            for op, n in ops:
                if op == "append":
                    batch = [Record(value=b"v%d" % (len(values) + i) * 40) for i in range(n)]
                    log.append(build_batch(batch), term=1)
                    values += [r.value for r in batch]
                elif op == "flush":
                    log.maybe_flush()
                elif op == "roll":
                    log.maybe_flush()
                    log.roll()
                else:
                    log.maybe_flush()
                    log.close()
                    log = PartitionLog.open(str(directory), config)
                durable = max(durable, log.durable_end_offset)
            # The cut: what the processes see and what was synced, before close syncs more.
            at_cut = DiskAtCrash.of(root)
            synced_at_cut = SyncRecorder(dict(synced.files), dict(synced.dirs))
        finally:
            log.close()
    image = tmp_path_factory.mktemp("after-cut")
    power_cut(at_cut, synced_at_cut, image, data.draw)
    recovered_dir = image / "broker" / "topic" / "0"
    assert recovered_dir.is_dir(), "a durable write's directory is gone"
    with PartitionLog.open(str(recovered_dir), config) as after:
        assert after.log_end_offset >= durable, "a write the log called durable is gone"
        assert after.lost_end_offset is None, "a torn unsynced tail was taken for a loss"
        got: list[bytes | None] = []
        offset = after.log_start_offset
        while offset < after.log_end_offset:
            read = after.read(offset)
            got += [r.value for r in data_records(read.data, offset)]
            offset = read.next_offset
        assert got == values[: len(got)], "a record that was never written"


@crash_settings(50)
@given(terms=st.lists(st.integers(1, 3), min_size=1, max_size=8), data=st.data())
def test_a_saved_term_and_vote_survive_a_power_cut(
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    terms: list[int],
    data: st.DataObject,
) -> None:
    """Raft's term and vote (the per-broker state file) never go backwards: a node that forgot
    its vote could vote twice in one term."""
    root = tmp_path_factory.mktemp("disk")
    state_dir = root / "broker" / "raft"
    saved = None
    with recording_syncs(monkeypatch, root) as synced:
        makedirs_durable(str(state_dir))
        store = HardStateStore(str(state_dir))
        term = 0
        for step in terms:
            term += step
            store.put("t/0", HardState(term, step % 3, 0), urgent=True)
            store.save()
            saved = store.get("t/0")
        store.put("t/0", HardState(term + 1, None, 0), urgent=True)  # changed, not yet saved
        at_cut = DiskAtCrash.of(root)
        synced_at_cut = SyncRecorder(dict(synced.files), dict(synced.dirs))
    image = tmp_path_factory.mktemp("after-cut")
    power_cut(at_cut, synced_at_cut, image, data.draw)
    assert HardStateStore(str(image / "broker" / "raft")).get("t/0") == saved
