"""Power loss for real: one ext4 image per broker on a loop device, cut by copying the image.

A broker's data directory is an ext4 filesystem in an image file (``DiskImage``), mounted through
a loop device. What the filesystem has written back to the loop device is in the image file (the
backing file's page cache); what it has not (dirty pages of the broker's files, mmap pages not
msynced, metadata in a journal transaction not yet committed) is only in the upper filesystem's
memory. A power loss (``DiskImage.power_cut``) is therefore:

1. the broker is SIGKILLed (the caller's part: no process may hold the filesystem);
2. the image file is copied while the loop device is idle: ``/sys/block/loopN/stat`` (writes
   completed, sectors, flushes, I/O in flight) is read before and after the copy and must be
   unchanged with nothing in flight, else the copy is made again. The copy is what the disk held
   at one instant;
3. the original is unmounted (its loop device released, the file deleted) and the copy mounted
   in its place: ext4 replays its own journal, so the kernel decides what survived, directory
   entries, fallocated extents and mmap pages included.

Mount options (``MOUNT_OPTIONS``): ``data=ordered`` (the default: data blocks reach the disk
before the metadata that points at them, so no garbage appears in a file, only loss);
``commit=3600`` so that the journal is committed only when someone fsyncs (ext4's default of 5 s
would make every metadata change older than 5 s survive by luck; a power loss within 5 s of it
loses it anyway, and a correct program may not rely on the timer); ``noauto_da_alloc`` so that
ext4's replace-by-rename heuristic (it flushes a file's data when it is renamed over another)
does not hide a missing fsync before a rename. Not ``sync`` (every write would be durable: nothing
to lose) and not ``data=journal`` (it changes what an fsync of one file drags along, not what an
unsynced write is worth). Barriers stay on; they reach the loop device as flushes of the backing
file, which the copy does not need (it reads the backing file's page cache), so they neither help
nor hide anything.

Writeback is held back for the run (``WritebackHold``): no periodic flusher
(``vm.dirty_writeback_centisecs=0``), dirty pages never expire, and the background and foreground
thresholds raised, so that unsynced data stays in memory until it is lost rather than reaching
the disk by luck. The previous values are saved in ``/run/kqj-writeback.json`` with the pids of
the runs that hold them; the last run to leave restores them, and a run that finds only dead
holders restores them first (a run killed before its ``finally``).

Limits: a write in flight at the instant of the cut is whole or absent (the copy waits for an
idle device): no torn 4 KiB blocks and no reordering of submitted writes (the storage crash
simulator, ``tests/power_cut.py``, covers those). A ``sync(2)`` by any other process on the
machine writes these filesystems back too.

Everything here is synchronous and fast (milliseconds per image); root only.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from ._netns import pid_alive

IMAGE_BYTES = 512 * 1024 * 1024  # sparse: only what the filesystem writes takes disk space
MOUNT_OPTIONS = "loop,data=ordered,commit=3600,noauto_da_alloc"
IMAGE_SUFFIX = ".kqj-img"
COPY_ATTEMPTS = 50
UMOUNT_ATTEMPTS = 50
DETACH_WAIT_S = 5.0

WRITEBACK_STATE = "/run/kqj-writeback.json"
_VM = "/proc/sys/vm"
# The held values: no flusher, pages never expire (100 h), thresholds at 50 % / 80 % of memory.
_HELD = {
    "dirty_writeback_centisecs": "0",
    "dirty_expire_centisecs": "36000000",
    "dirty_background_ratio": "50",
    "dirty_ratio": "80",
}
# Saved and restored; the *_bytes settings are the other face of the *_ratio ones.
_SAVED = (
    "dirty_writeback_centisecs",
    "dirty_expire_centisecs",
    "dirty_background_ratio",
    "dirty_background_bytes",
    "dirty_ratio",
    "dirty_bytes",
)


class PowerLossError(RuntimeError):
    """A mount, copy or unmount failed; the message says which and why."""


def power_loss_available() -> str | None:
    """None if power losses can be made here (root, mkfs.ext4, losetup, mount, loop devices);
    else why not."""
    if os.geteuid() != 0:
        return "power-loss needs root (loop devices and mounts)"
    for tool in ("mkfs.ext4", "losetup", "mount", "umount"):
        if shutil.which(tool) is None:
            return f"power-loss needs {tool}"
    if not os.path.exists("/dev/loop-control"):
        return "power-loss needs loop devices (/dev/loop-control)"
    return None


def _run(*args: str) -> str:
    proc = subprocess.run(list(args), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise PowerLossError(f"{' '.join(args)}: {(proc.stderr or proc.stdout).strip()}")
    return proc.stdout


def _mount_source(mount_point: str) -> str | None:
    """The device mounted on ``mount_point`` in this mount namespace, None if nothing is."""
    target = os.path.realpath(mount_point)
    found: str | None = None
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            parts = line.split()
            sep = parts.index("-")
            if _unescape(parts[4]) == target:
                found = parts[sep + 2]  # the last mount on a point is the visible one
    return found


def _unescape(path: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), path)


def _loop_stat(device: str) -> tuple[int, ...]:
    """The loop device's counters that any write changes: writes completed, merged, sectors,
    time, I/O in flight, flushes (``Documentation/block/stat.rst``); reads are left out (reading
    the backing file does not go through the device)."""
    with open(f"/sys/block/{os.path.basename(device)}/stat", encoding="ascii") as f:
        fields = [int(x) for x in f.read().split()]
    return (*fields[4:9], *fields[15:17])


def _in_flight(stat: tuple[int, ...]) -> int:
    return stat[4]


def _copy_sparse(src: str, dst: str) -> None:
    _run("cp", "--sparse=always", src, dst)


@dataclass
class DiskImage:
    """One broker's disk: ``path`` (an ext4 image) mounted on ``mount_point``."""

    path: str
    mount_point: str
    generation: int = 0  # power losses survived
    mounted: bool = False
    log: list[str] = field(default_factory=list)

    def create(self, size: int = IMAGE_BYTES) -> None:
        """Make a sparse ext4 image (tables initialized now, so no background thread writes to
        it later) and mount it; ``mount_point`` is made if missing and must be empty."""
        with open(self.path, "wb") as f:
            f.truncate(size)
        _run(
            "mkfs.ext4", "-q", "-F", "-b", "4096", "-N", "16384", "-J", "size=16",
            "-E", "lazy_itable_init=0,lazy_journal_init=0", self.path,
        )  # fmt: skip
        os.makedirs(self.mount_point, exist_ok=True)
        self.mount()

    def mount(self) -> None:
        _run("mount", "-t", "ext4", "-o", MOUNT_OPTIONS, self.path, self.mount_point)
        self.mounted = True
        # lost+found would look like a topic to a broker listing its data directory.
        with contextlib.suppress(OSError):
            os.rmdir(os.path.join(self.mount_point, "lost+found"))

    def device(self) -> str:
        source = _mount_source(self.mount_point)
        if source is None or not source.startswith("/dev/loop"):
            raise PowerLossError(f"{self.mount_point} is not mounted from a loop device")
        return source

    def power_cut(self) -> int:
        """Replace the disk by what it held at one instant (the broker must be dead); returns
        how many copies it took to catch the device idle."""
        device = self.device()
        copy = f"{self.path}.cut"
        attempts = 0
        while True:
            attempts += 1
            before = _loop_stat(device)
            if _in_flight(before) == 0:
                _copy_sparse(self.path, copy)
                if _loop_stat(device) == before:
                    break
            if attempts >= COPY_ATTEMPTS:
                raise PowerLossError(f"{device} never idle across a copy of {self.path}")
            time.sleep(0.01)
        self.unmount()
        os.replace(copy, self.path)
        self.mount()
        self.generation += 1
        return attempts

    def unmount(self) -> None:
        """Unmount (the loop device goes with it: ``mount -o loop`` sets autoclear). A mount
        still busy (a dead process's mount namespace not yet torn down) is retried, then
        detached lazily so that nothing is left behind."""
        if not self.mounted:
            return
        last = ""
        for _ in range(UMOUNT_ATTEMPTS):
            if _mount_source(self.mount_point) is None:
                break
            proc = subprocess.run(
                ["umount", self.mount_point], capture_output=True, text=True, check=False
            )
            if proc.returncode == 0:
                break
            last = proc.stderr.strip()
            time.sleep(0.05)
        else:
            _run("umount", "-l", self.mount_point)
            self.log.append(f"{self.mount_point}: lazy unmount ({last})")
        self.mounted = False
        if not _detach(self.path, DETACH_WAIT_S):
            # Another mount namespace still holds the filesystem (a broker started under
            # ``ip netns exec`` copied every mount of its time); the device goes when it does.
            self.log.append(f"{self.path}: loop device still held; released when its holder exits")


def _detach(image: str, wait_s: float = 0.0) -> bool:
    """Detach the loop devices backed by ``image`` (autoclear normally does it, once the
    filesystem is really gone: a dead process's mount namespace is torn down asynchronously);
    True when none is left, waiting up to ``wait_s`` for it."""
    deadline = time.monotonic() + wait_s
    while True:
        out = subprocess.run(
            ["losetup", "-j", image], capture_output=True, text=True, check=False
        ).stdout
        devices = [line.split(":", 1)[0] for line in out.splitlines()]
        for device in devices:
            subprocess.run(["losetup", "-d", device], capture_output=True, check=False)
        if not devices:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


class PowerLossDisks:
    """The disks of one run: ``add`` makes and mounts one image per broker; leaving the context
    (also on errors) unmounts every one and releases its loop device. The images stay in
    ``image_dir`` (sparse files) for a post-mortem; ``remove_images`` deletes them."""

    def __init__(self, image_dir: str, mount_root: str | None = None) -> None:
        """``mount_root``: the directory the disks are mounted under (the brokers' data
        directory). It is made a shared mount (bound onto itself) for the run, so that a
        process started in a mount namespace of its own (``ip netns exec`` makes one, with
        every mount of its time, as a slave of ours) sees a disk replaced, and lets go of the
        old filesystem when it is unmounted here, rather than holding it (and its loop device)
        until it exits."""
        self.image_dir = image_dir
        self.mount_root = mount_root
        self._bound = False
        self.disks: dict[int, DiskImage] = {}

    def __enter__(self) -> PowerLossDisks:
        cleanup_stale()
        os.makedirs(self.image_dir, exist_ok=True)
        if self.mount_root is not None:
            os.makedirs(self.mount_root, exist_ok=True)
            _run("mount", "--bind", self.mount_root, self.mount_root)
            self._bound = True
            _run("mount", "--make-shared", self.mount_root)
        return self

    def add(self, node: int, mount_point: str) -> DiskImage:
        name = f"kqj-{os.getpid()}-n{node}{IMAGE_SUFFIX}"
        disk = DiskImage(os.path.join(self.image_dir, name), mount_point)
        self.disks[node] = disk
        disk.create()
        return disk

    def close(self) -> None:
        errors: list[str] = []
        for disk in self.disks.values():
            try:
                disk.unmount()
            except (PowerLossError, OSError) as exc:
                errors.append(str(exc))
        if self._bound and self.mount_root is not None:
            proc = subprocess.run(
                ["umount", self.mount_root], capture_output=True, text=True, check=False
            )
            if proc.returncode != 0:
                subprocess.run(["umount", "-l", self.mount_root], capture_output=True, check=False)
            self._bound = False
        if errors:
            raise PowerLossError("; ".join(errors))

    def remove_images(self) -> None:
        for disk in self.disks.values():
            if not disk.mounted:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(disk.path)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def cleanup_stale() -> list[str]:
    """Unmount the images of runs whose process is gone (killed before their ``finally``);
    returns their mount points."""
    removed: list[str] = []
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        lines = f.read().splitlines()
    for line in lines:
        parts = line.split()
        sep = parts.index("-")
        device, point = parts[sep + 2], _unescape(parts[4])
        if not device.startswith("/dev/loop"):
            continue
        backing = _backing_file(device)
        m = re.fullmatch(rf"kqj-(\d+)-n\d+{re.escape(IMAGE_SUFFIX)}", os.path.basename(backing))
        if m and not pid_alive(int(m.group(1))):
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)
            _detach(backing)
            removed.append(point)
    return removed


def _backing_file(device: str) -> str:
    try:
        with open(f"/sys/block/{os.path.basename(device)}/loop/backing_file") as f:
            return f.read().strip().removesuffix(" (deleted)")  # a disk replaced by its cut
    except OSError:
        return ""


class WritebackHold:
    """Hold writeback back while in the context (see the module docstring); restore after."""

    def __enter__(self) -> WritebackHold:
        with _state_locked() as state:
            holders = [p for p in state.get("holders", []) if pid_alive(p)]
            if not holders and "saved" in state:
                _restore(state["saved"])  # a run that died holding them
                state.clear()
            if "saved" not in state:
                state["saved"] = {k: _read_vm(k) for k in _SAVED}
            state["holders"] = [*holders, os.getpid()]
            for k, v in _HELD.items():
                _write_vm(k, v)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with _state_locked() as state:
            holders = [p for p in state.get("holders", []) if p != os.getpid() and pid_alive(p)]
            if holders:
                state["holders"] = holders
                return
            if "saved" in state:
                _restore(state["saved"])
            state.clear()


def _read_vm(name: str) -> str:
    with open(os.path.join(_VM, name), encoding="ascii") as f:
        return f.read().strip()


def _write_vm(name: str, value: str) -> None:
    with open(os.path.join(_VM, name), "w", encoding="ascii") as f:
        f.write(value)


def _restore(saved: dict[str, str]) -> None:
    # Writing a *_ratio zeroes its *_bytes twin and the other way round: write the one in use.
    for k in ("dirty_writeback_centisecs", "dirty_expire_centisecs"):
        _write_vm(k, saved[k])
    for ratio, size in (("dirty_background_ratio", "dirty_background_bytes"),
                        ("dirty_ratio", "dirty_bytes")):  # fmt: skip
        if saved.get(size, "0") != "0":
            _write_vm(size, saved[size])
        else:
            _write_vm(ratio, saved[ratio])


@contextlib.contextmanager
def _state_locked() -> Iterator[dict[str, Any]]:
    """The saved settings and their holders, under an exclusive lock, written back at exit."""
    fd = os.open(WRITEBACK_STATE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        raw = os.pread(fd, 1 << 16, 0)
        try:
            state = json.loads(raw) if raw.strip() else {}
        except ValueError:
            state = {}
        yield state
        data = json.dumps(state).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
    finally:
        os.close(fd)
