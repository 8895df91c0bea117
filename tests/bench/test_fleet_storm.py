"""The reconnect storm of ``bench.fleet`` as a process test: a few hundred devices with persistent
sessions on 3 real brokers, one broker killed with SIGKILL under them. Everyone it held must come
back (to a survivor, with its session) and publish again, and no acknowledged reading may be
missing from the log. No timing target: the storm's speed is the benchmark's business."""

from __future__ import annotations

import math
from pathlib import Path

from bench.fleet import Plan, cluster_phase

PLAN = Plan(
    devices=240,
    processes=1,
    warmup=1.0,
    steady_s=2.0,
    storm_s=10.0,
    mosquitto_s=0.0,
    interval=1.0,
    command_share=0.02,
)


def test_every_device_of_a_killed_broker_comes_back_with_its_session(tmp_path: Path) -> None:
    result = cluster_phase(tmp_path, PLAN, log=lambda line: None)
    storm = result["storm"]
    assert result["connected"] == PLAN.devices and result["failed"] == 0
    # Devices go round-robin over the 3 brokers: a third of them were on the killed one.
    assert storm["devices"] >= PLAN.devices // 3 - 5, storm
    assert storm["back"] == storm["devices"], storm
    assert storm["publishing"] == storm["devices"], storm
    assert math.isfinite(storm["publishing_99_s"])
    assert result["sessions_lost"] == 0
    assert result["sessions_resumed"] >= storm["devices"]
    assert result["acknowledged"] > 0
    assert result["lost"] == 0, result["lost_examples"]
