"""A model of what a power cut leaves of real files, for crash simulators (issue 36).

Every ``fsync``/``fdatasync`` is recorded by inode (a file's content, a directory's entries);
``power_cut`` then writes a disk a cut may leave: each directory with the entries of its last
fsync (or, as the kernel may have written them back, its current ones), each file sector by
sector (512 bytes) as synced or as written since (lost, torn and reordered writes), any length
between the two versions. ``draw`` (hypothesis's ``data.draw``) makes every choice.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

SECTOR = 512


def crash_settings(max_examples: int) -> settings:
    """Hypothesis settings for a crash simulator: real files, so no deadline, and the tests'
    temporary-directory fixtures are shared by the examples (each makes its own directories)."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


@dataclass
class SyncRecorder:
    """What reached the disk for certain: the last fsynced content of each inode."""

    files: dict[int, bytes] = field(default_factory=dict)
    dirs: dict[int, dict[str, int]] = field(default_factory=dict)

    def record(self, fd: int) -> None:
        st_ = os.fstat(fd)
        proc = f"/proc/self/fd/{fd}"
        if stat.S_ISDIR(st_.st_mode):
            self.dirs[st_.st_ino] = {
                n: os.lstat(os.path.join(proc, n)).st_ino for n in os.listdir(proc)
            }
        else:
            with open(proc, "rb") as f:  # the descriptor itself may be write-only
                self.files[st_.st_ino] = f.read()


@contextmanager
def recording_syncs(monkeypatch: pytest.MonkeyPatch, root: Path) -> Iterator[SyncRecorder]:
    recorder = SyncRecorder()
    recorder.dirs[os.stat(root).st_ino] = {}  # the root existed before, empty
    real_fsync, real_fdatasync = os.fsync, os.fdatasync

    def fsync(fd: int) -> None:
        real_fsync(fd)
        recorder.record(fd)

    def fdatasync(fd: int) -> None:
        real_fdatasync(fd)
        recorder.record(fd)

    with monkeypatch.context() as m:
        m.setattr(os, "fsync", fsync)
        m.setattr(os, "fdatasync", fdatasync)
        yield recorder


@dataclass
class DiskAtCrash:
    """The files and directories as the processes saw them at the cut (the page cache)."""

    files: dict[int, bytes]
    dirs: dict[int, dict[str, int]]
    root: int

    @classmethod
    def of(cls, root: Path) -> DiskAtCrash:
        files, dirs = {}, {}
        for path in [root, *root.rglob("*")]:
            ino = os.lstat(path).st_ino
            if path.is_dir():
                dirs[ino] = {p.name: os.lstat(p).st_ino for p in path.iterdir()}
            else:
                files[ino] = path.read_bytes()
        return cls(files, dirs, os.lstat(root).st_ino)


Draw = Callable[[st.SearchStrategy[int]], int]


def power_cut(now: DiskAtCrash, synced: SyncRecorder, image: Path, draw: Draw) -> None:
    """Write into ``image`` a disk that a power cut may leave of ``now``."""

    def rebuild(ino: int, into: Path) -> None:
        listed = synced.dirs.get(ino, {})
        if ino in now.dirs and draw(st.integers(0, 1)):  # the kernel wrote the entries back
            listed = now.dirs[ino]
        for name, child in listed.items():
            if child in now.dirs or child in synced.dirs:
                (into / name).mkdir()
                rebuild(child, into / name)
            else:
                (into / name).write_bytes(file_after_cut(child, now, synced, draw))

    rebuild(now.root, image)


def file_after_cut(ino: int, now: DiskAtCrash, synced: SyncRecorder, draw: Draw) -> bytes:
    """Sector by sector, what was synced or what was written since; the length anywhere
    between the two versions' (a sector never written back reads as zeros)."""
    old = synced.files.get(ino, b"")
    new = now.files.get(ino, old)
    length = draw(st.integers(min(len(old), len(new)), max(len(old), len(new))))
    out = bytearray()
    for start in range(0, length, SECTOR):
        end = min(start + SECTOR, length)
        part = new[start:end] if draw(st.integers(0, 1)) else old[start:end]
        out += part.ljust(end - start, b"\0")
    return bytes(out)
