"""The controller's journal is durable before pysyncobj acknowledges or votes (issue 36), and
reads and writes pysyncobj's own format."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pysyncobj.journal import FileJournal

from kafkaesque.broker._controller_journal import DurableJournal
from kafkaesque.storage import makedirs_durable
from tests.power_cut import DiskAtCrash, SyncRecorder, crash_settings, power_cut, recording_syncs


def test_a_journal_written_by_pysyncobj_opens_unchanged_and_back(tmp_path: Path) -> None:
    path = str(tmp_path / "controller.journal")
    theirs = FileJournal(path)
    for i in range(1, 6):
        theirs.add(b"cmd%d" % i, i, 1 + i // 3)
    theirs.setCurrentTerm(3, "127.0.0.1:1")
    theirs._destroy()
    ours = DurableJournal(path, None)
    assert [(bytes(c), i, t) for c, i, t in ours] == [
        (b"cmd%d" % i, i, 1 + i // 3) for i in range(1, 6)
    ]
    assert (ours.getCurrentTerm(), ours.getVotedForNodeId()) == (3, "127.0.0.1:1")
    ours.deleteEntriesFrom(3)
    ours.add(b"other", 4, 4)
    ours.deleteEntriesTo(1)
    ours._destroy()
    again = FileJournal(path)
    assert [(bytes(c), i, t) for c, i, t in (again[k] for k in range(len(again)))] == [
        (b"cmd2", 2, 1),
        (b"cmd3", 3, 2),
        (b"other", 4, 4),
    ]
    again._destroy()


def test_an_entry_added_after_a_compaction_is_written_whatever_was_truncated(
    tmp_path: Path,
) -> None:
    """A truncation pending in memory, a compaction, then the truncated entry again: the
    compaction rewrote the file without it, so it must be written (it once was taken for one
    still on disk)."""
    path = str(tmp_path / "controller.journal")
    journal = DurableJournal(path, None)
    journal.add(b"one", 1, 1)
    journal.add(b"two", 2, 1)
    journal.deleteEntriesFrom(1)
    journal.deleteEntriesTo(1)
    journal.add(b"two", 2, 1)
    journal._destroy()
    reopened = DurableJournal(path, None)
    assert [(bytes(c), i, t) for c, i, t in reopened] == [(b"two", 2, 1)]
    reopened._destroy()


Op = tuple[str, int]
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(1, 3)),
        st.tuples(st.just("vote"), st.integers(0, 2)),
        st.tuples(st.just("truncate"), st.integers(0, 3)),
        st.tuples(st.just("compact"), st.integers(0, 3)),
    ),
    min_size=1,
    max_size=12,
)


@crash_settings(60)
@given(ops=OPS, data=st.data())
def test_what_the_journal_returned_from_survives_a_power_cut(
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    ops: list[Op],
    data: st.DataObject,
) -> None:
    """After any cut: every entry ``add`` returned from (and not truncated since) is there, no
    torn one, and term and vote are the last ``setCurrentTerm`` set: a node never votes twice."""
    root = tmp_path_factory.mktemp("disk")
    path = str(root / "ctl" / "controller.journal")
    entries: list[tuple[bytes, int, int]] = []
    term, vote = 0, None
    added: set[tuple[bytes, int, int]] = set()
    with recording_syncs(monkeypatch, root) as synced:
        makedirs_durable(str(root / "ctl"))  # as the broker makes its data directory
        (root / "ctl" / "controller.dump").write_bytes(b"dump")  # pysyncobj's, not synced
        journal = DurableJournal(path, str(root / "ctl" / "controller.dump"))
        for op, n in ops:
            if op == "add":
                for _ in range(n):
                    idx = entries[-1][1] + 1 if entries else 1
                    entry = (b"c%d" % idx * 30, idx, term)
                    journal.add(*entry)
                    entries.append(entry)
                    added.add(entry)
            elif op == "vote":
                term += 1
                vote = f"127.0.0.1:{n}"
                journal.setCurrentTerm(term, vote)
            elif op == "truncate":
                keep = max(0, len(entries) - n)
                journal.deleteEntriesFrom(keep)
                del entries[keep:]
            else:
                drop = min(n, len(entries))
                journal.deleteEntriesTo(drop)
                del entries[:drop]
        at_cut = DiskAtCrash.of(root)
        synced_at_cut = SyncRecorder(dict(synced.files), dict(synced.dirs))
        journal._destroy()
    image = tmp_path_factory.mktemp("after-cut")
    power_cut(at_cut, synced_at_cut, image, data.draw)
    after = DurableJournal(str(image / "ctl" / "controller.journal"), None)
    recovered = [(bytes(c), i, t) for c, i, t in after]
    assert recovered[: len(entries)] == entries
    # Beyond them only entries a truncation dropped and nothing overwrote since (pysyncobj
    # truncates on every overlapping resend; the journal writes a cut out only at a conflict).
    assert all(entry in added for entry in recovered[len(entries) :])
    indexes = [i for _, i, _ in recovered]
    assert indexes == list(range(indexes[0], indexes[0] + len(indexes))) if indexes else True
    assert (after.getCurrentTerm(), after.getVotedForNodeId()) == (term, vote)
    after._destroy()
