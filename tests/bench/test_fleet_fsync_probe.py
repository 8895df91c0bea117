"""``bench.fleet``'s fsync probe: what a plain fsync of a small append costs on the brokers'
filesystem, the part of a PUBACK that is the durability promise."""

from __future__ import annotations

import time
from pathlib import Path

from bench.fleet import FSYNC_PROBE_EVERY_S, FsyncProbe


def test_the_probe_times_fsyncs_until_stopped_and_leaves_no_file(tmp_path: Path) -> None:
    probe = FsyncProbe(tmp_path).start()
    time.sleep(10 * FSYNC_PROBE_EVERY_S)
    samples = probe.stop()
    assert len(samples) >= 2
    assert all(ms > 0 for ms in samples)
    assert not any(tmp_path.iterdir())
    assert len(probe.stop()) == len(samples)  # stopped: no more samples
