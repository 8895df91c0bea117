"""A real mosquitto server for tests: ``running_mosquitto(dir)`` and the ``mosquitto`` fixture.

Each server listens on a free loopback port with a config file written to the test's directory,
and is killed when the test ends (also when it fails). Its config keeps every queued QoS 1
message of an offline persistent session (``max_queued_messages 0``) and lets 1000 be in flight
to a client, so bridge tests can count on "nothing dropped" and measure throughput.

Import the fixture into a test module (it is named ``mosquitto``)::

    from tests.mosquitto import mosquitto_fixture  # noqa: F401
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from kafkaesque.local_cluster import free_ports

MOSQUITTO = "/usr/sbin/mosquitto"
MAX_INFLIGHT = 1000
"""QoS 1 messages the server sends a client before waiting for its PUBACKs."""
DEFAULT_CONFIG = f"""\
allow_anonymous true
persistence false
max_inflight_messages {MAX_INFLIGHT}
max_queued_messages 0
set_tcp_nodelay true
"""


@dataclass
class Mosquitto:
    """A running server: ``host``, ``port``, ``address`` (``host:port``) and its ``process``."""

    host: str
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def publish(self, topic: str, *messages: str | bytes, qos: int = 1) -> None:
        """Publish ``messages`` with ``mosquitto_pub`` (one connection, in order); waits."""
        args = ["mosquitto_pub", "-h", self.host, "-p", str(self.port), "-q", str(qos), "-t", topic]
        if len(messages) == 1:
            payload = messages[0]
            data = payload.encode() if isinstance(payload, str) else payload
            subprocess.run([*args, "-s"], input=data, check=True, timeout=30)
            return
        lines = b"".join((m.encode() if isinstance(m, str) else m) + b"\n" for m in messages)
        subprocess.run([*args, "-l"], input=lines, check=True, timeout=60)


def _wait_listening(host: str, port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"mosquitto exited: {log.read_text(errors='replace')}")
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("mosquitto did not start listening")


@contextmanager
def running_mosquitto(
    directory: Path, extra_config: str = "", port: int | None = None
) -> Iterator[Mosquitto]:
    """Start mosquitto on ``port`` (default: a free loopback port); kill it on exit."""
    if shutil.which(MOSQUITTO) is None and not Path(MOSQUITTO).exists():
        pytest.skip("mosquitto is not installed")
    directory.mkdir(parents=True, exist_ok=True)
    if port is None:
        (port,) = free_ports(1)
    config = directory / "mosquitto.conf"
    config.write_text(f"listener {port} 127.0.0.1\n{DEFAULT_CONFIG}{extra_config}")
    log = directory / "mosquitto.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [MOSQUITTO, "-c", str(config)], stdout=out, stderr=subprocess.STDOUT
        )
    try:
        _wait_listening("127.0.0.1", port, process, log)
        yield Mosquitto("127.0.0.1", port, process, log)
    finally:
        process.kill()
        process.wait(timeout=10)


@pytest.fixture(name="mosquitto")
def mosquitto_fixture(tmp_path: Path) -> Iterator[Mosquitto]:
    """A fresh mosquitto server for one test."""
    with running_mosquitto(tmp_path / "mosquitto") as server:
        yield server
