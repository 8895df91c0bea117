"""The power-loss mechanism on its own: a loop-mounted ext4 image, cut by an idle-device copy.

What a real power cut loses must be lost here, and what was made durable must survive: a write
without fsync is gone, one with fsync is kept, mmap pages count only once msynced, a new file or
a rename whose directory was not fsynced may be gone (and is, with nothing else fsynced after
it). And nothing is left behind: every mount and loop device released, the writeback settings
restored, also when the block fails. Needs root, mkfs.ext4 and loop devices (skipped otherwise).
"""

from __future__ import annotations

import mmap
import os
import subprocess
import time

import pytest
from kafkaesque.jepsen_like._powerloss import (
    IMAGE_SUFFIX,
    DiskImage,
    PowerLossDisks,
    WritebackHold,
    cleanup_stale,
    power_loss_available,
)

pytestmark = pytest.mark.skipif(
    power_loss_available() is not None, reason=str(power_loss_available())
)

_VM = ("dirty_writeback_centisecs", "dirty_expire_centisecs", "dirty_background_ratio")


def _vm() -> dict[str, str]:
    return {k: open(f"/proc/sys/vm/{k}").read().strip() for k in _VM}


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write(path: str, data: bytes, *, sync: bool, mode: str = "wb") -> None:
    with open(path, mode) as f:
        f.write(data)
        f.flush()
        if sync:
            os.fsync(f.fileno())


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def _leftovers(image_dir: str) -> str:
    with open("/proc/self/mountinfo") as f:
        mounts = f.read()
    loops = subprocess.run(["losetup", "-a"], capture_output=True, text=True, check=False).stdout
    # Only this test's: other runs (another test, a jepsen run) may hold images meanwhile.
    return "\n".join(line for line in (mounts + loops).splitlines() if image_dir in line)


def test_a_power_cut_loses_exactly_what_was_not_made_durable(tmp_path: str) -> None:
    images, mnt = os.path.join(tmp_path, "images"), os.path.join(tmp_path, "data")
    before = _vm()
    with WritebackHold(), PowerLossDisks(images) as disks:
        assert _vm()["dirty_writeback_centisecs"] == "0"
        disk = disks.add(0, mnt)
        d = os.path.join(mnt, "d")
        os.mkdir(d)
        _fsync_dir(mnt)
        # Durable: data fsynced, its new directory entry fsynced too.
        _write(os.path.join(d, "synced"), b"a" * 10_000, sync=True)
        _fsync_dir(d)
        # An mmap journal (pysyncobj's kind): msynced pages count, the others do not.
        _write(os.path.join(d, "mapped"), b"\0" * 8192, sync=True)
        _fsync_dir(d)
        with open(os.path.join(d, "mapped"), "r+b") as f:
            m = mmap.mmap(f.fileno(), 8192)
            m[0:4] = b"kept"
            m.flush(0, 4096)  # msync
            m[4096:4100] = b"lost"
            m.close()
        # A rename of fsynced data without an fsync of the directory.
        _write(os.path.join(d, "state.tmp"), b"new state", sync=True)
        os.rename(os.path.join(d, "state.tmp"), os.path.join(d, "state"))
        # Nothing fsynced from here on.
        _write(os.path.join(d, "synced"), b"b" * 5_000, sync=False, mode="ab")
        _write(os.path.join(d, "unsynced"), b"c" * 10_000, sync=False)
        os.mkdir(os.path.join(mnt, "newdir"))

        attempts = disk.power_cut()

        assert attempts >= 1 and disk.generation == 1
        assert _read(os.path.join(d, "synced")) == b"a" * 10_000  # the append is gone
        mapped = _read(os.path.join(d, "mapped"))
        assert mapped is not None
        assert mapped[0:4] == b"kept" and mapped[4096:4100] == b"\0" * 4
        # The rename was never committed: the old name holds the data, the new one is absent.
        assert _read(os.path.join(d, "state")) is None
        assert _read(os.path.join(d, "state.tmp")) == b"new state"
        assert _read(os.path.join(d, "unsynced")) is None
        assert not os.path.exists(os.path.join(mnt, "newdir"))

        # The surviving disk is a disk like any other: durable writes survive the next cut.
        _write(os.path.join(d, "second"), b"d" * 100, sync=True)
        _fsync_dir(d)
        disk.power_cut()
        assert disk.generation == 2
        assert _read(os.path.join(d, "second")) == b"d" * 100
        assert _read(os.path.join(d, "synced")) == b"a" * 10_000
    assert _vm() == before
    assert _leftovers(images) == ""
    assert not os.listdir(mnt)  # unmounted: the empty mount point is all that is left


def test_everything_is_released_when_the_run_fails(tmp_path: str) -> None:
    images = os.path.join(tmp_path, "images")
    before = _vm()
    with (
        pytest.raises(RuntimeError, match="harness failed"),
        WritebackHold(),
        PowerLossDisks(images) as disks,
    ):
        for node in range(3):
            disks.add(node, os.path.join(tmp_path, "data", str(node)))
        _write(os.path.join(tmp_path, "data", "1", "dirty"), b"x" * 100, sync=False)
        raise RuntimeError("harness failed")
    assert _vm() == before
    assert _leftovers(images) == ""


def test_a_process_in_a_mount_namespace_of_its_own_lets_the_old_disk_go(tmp_path: str) -> None:
    # A broker under `ip netns exec` runs in a mount namespace of its own, a copy of ours made
    # when it started: with the data directory a shared mount, it follows a disk's replacement
    # and lets go of the old filesystem at once (its loop device released), instead of holding
    # it until it exits.
    images, data = os.path.join(tmp_path, "images"), os.path.join(tmp_path, "data")
    with WritebackHold(), PowerLossDisks(images, data) as disks:
        disk = disks.add(0, os.path.join(data, "0"))
        other = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "slave", "sleep", "60"],
            stdout=subprocess.DEVNULL,
        )
        try:
            time.sleep(0.3)  # the namespace is made, with the disk in it
            assert _read_in(other.pid, os.path.join(data, "0")) is not None
            disk.power_cut()
            assert "(deleted)" not in _leftovers(images)
            _write(os.path.join(data, "0", "after"), b"x", sync=True)
            assert "after" in _read_in(other.pid, os.path.join(data, "0"))
        finally:
            other.kill()
            other.wait()
    assert _leftovers(images) == ""
    assert _leftovers(data) == ""


def _read_in(pid: int, directory: str) -> list[str]:
    """The names in ``directory`` as process ``pid``'s mount namespace sees it."""
    return os.listdir(f"/proc/{pid}/root{directory}")


def test_the_disks_of_a_run_that_died_are_released_by_the_next(tmp_path: str) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()  # its pid names a run that is gone (killed before its cleanup)
    image = os.path.join(tmp_path, f"kqj-{dead.pid}-n0{IMAGE_SUFFIX}")
    mine = os.path.join(tmp_path, f"kqj-{os.getpid()}-n1{IMAGE_SUFFIX}")
    stale, alive = DiskImage(image, os.path.join(tmp_path, "d0")), DiskImage(mine, str(tmp_path))
    alive.mount_point = os.path.join(tmp_path, "d1")
    stale.create()
    alive.create()
    try:
        assert os.path.join(tmp_path, "d0") in cleanup_stale()
        assert _leftovers(image) == ""
        assert alive.device()  # a live run's disk is left alone
    finally:
        alive.unmount()
        stale.unmount()
    assert _leftovers(str(tmp_path)) == ""
