"""``LocalCluster``: brokers never outlive the harness that started them, even a killed one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HARNESS = """
import sys, time
from kafkaesque.cli.cluster import LocalCluster
cluster = LocalCluster(sys.argv[1], 1)
cluster.__enter__()
print(" ".join(str(p.pid) for p in cluster.procs.values()), flush=True)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its dead parent's reaper) counts as gone.
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[1].split()[0] != "Z"


def test_brokers_stop_when_their_harness_is_killed(tmp_path: Path) -> None:
    harness = subprocess.Popen(
        [sys.executable, "-c", HARNESS, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    pids: list[int] = []
    try:
        assert harness.stdout is not None
        pids = [int(p) for p in harness.stdout.readline().split()]
        assert pids and all(_alive(p) for p in pids)
        harness.send_signal(signal.SIGKILL)  # no chance to clean up
        harness.wait()
        deadline = time.monotonic() + 15
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(p) for p in pids), "a broker outlived its harness"
    finally:
        harness.kill()
        harness.wait()
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
