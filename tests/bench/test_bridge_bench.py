"""``bench.bridge``'s baseline pieces: its mosquitto and the plain subscriber it counts with."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from bench._mqtt_procs import MOSQUITTO, Mosquitto
from bench.bridge import FILTER, plain_subscriber

pytestmark = pytest.mark.skipif(
    not os.path.exists(MOSQUITTO) or shutil.which("mosquitto_pub") is None,
    reason="mosquitto is not installed",
)


def test_the_plain_subscriber_counts_every_message_then_is_stopped(tmp_path: Path) -> None:
    with Mosquitto(tmp_path / "mosquitto") as mosquitto:
        host, port = mosquitto.address
        with plain_subscriber(mosquitto, tmp_path / "sub.out") as received:
            before = received()  # the probe that showed it subscribed
            lines = b"".join(b"reading %d\n" % n for n in range(25))
            topic = FILTER.replace("+", "phone-1")
            subprocess.run(
                ["mosquitto_pub", "-h", host, "-p", str(port), "-q", "1", "-t", topic, "-l"],
                input=lines,
                check=True,
                timeout=30,
            )
            deadline = time.monotonic() + 20
            while received() - before < 25 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert received() - before == 25
            assert _subscribers(host, port) == 1
        assert _subscribers(host, port) == 0


def _subscribers(host: str, port: int) -> int:
    """How many mosquitto_sub processes of this server run now."""
    pattern = f"mosquitto_sub -h {host} -p {port} "
    found = subprocess.run(["pgrep", "-f", pattern], check=False, capture_output=True, text=True)
    return len(found.stdout.split())
