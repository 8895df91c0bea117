"""The bridge as a process (``kafkaesque mqtt-bridge``): killed with SIGKILL mid-stream while a
publisher keeps publishing QoS 1 to mosquitto, then restarted, it loses nothing (the persistent
session holds what was not acknowledged) and duplicates only what was in flight at the kill;
stopped with SIGTERM, it finishes what is in flight and leaves no duplicate at all."""

from __future__ import annotations

import collections
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kafkaesque.client import Client, Consumer, KafkaesqueError
from kafkaesque.local_cluster import LocalCluster
from tests.mosquitto import (
    MAX_INFLIGHT,
    Mosquitto,
    mosquitto_fixture,  # noqa: F401 - registers it
)

RULES = "phones/+/spectrum -> {topic} key=1\n"
RECEIVE_MAXIMUM = 100


def bridge_command(
    server: Mosquitto, cluster: LocalCluster, rules: Path, client_id: str
) -> list[str]:
    return [
        sys.executable, "-m", "kafkaesque.cli", "mqtt-bridge",
        "--upstream", server.address,
        "--bootstrap", cluster.bootstrap,
        "--rules", str(rules),
        "--client-id", client_id,
        "--receive-maximum", str(RECEIVE_MAXIMUM),
        "--stats-interval", "0",
    ]  # fmt: skip


@contextmanager
def bridge_process(command: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The bridge running (it printed ``ready``: subscribed); killed on exit if still alive."""
    with log.open("ab") as err:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err)
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        line = b""
        while not line.startswith(b"ready"):
            ready, _, _ = select.select(
                [proc.stdout], [], [], max(0.0, deadline - time.monotonic())
            )
            assert ready, f"the bridge did not get ready: {log.read_text()}"
            line = proc.stdout.readline()
            assert line, f"the bridge exited: {log.read_text()}"
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()


def read_values(
    bootstrap: str, topic: str, wanted: set[bytes], timeout: float = 60, *, quick: bool = False
) -> list[bytes]:
    """Every value in ``topic`` once all of ``wanted`` are there (or the timeout passed);
    ``quick``: return as soon as they are, without a last look for more."""
    values: list[bytes] = []
    deadline = time.monotonic() + timeout
    with Client(bootstrap) as client, Consumer(client) as consumer:
        while True:
            try:
                consumer.assign_topic(topic)
                break
            except KafkaesqueError:
                assert time.monotonic() < deadline, f"{topic} never appeared"
                time.sleep(0.2)
        while not wanted <= set(values) and time.monotonic() < deadline:
            values.extend(r.value or b"" for r in consumer.poll(0.05 if quick else 0.5))
        if not quick:
            values.extend(r.value or b"" for r in consumer.poll(1.0))
    return values


def test_kill_9_mid_stream_then_restart_loses_nothing(
    broker_cluster: LocalCluster, mosquitto: Mosquitto, tmp_path: Path
) -> None:
    rules = tmp_path / "rules"
    rules.write_text(RULES.format(topic="readings_restart"))
    command = bridge_command(mosquitto, broker_cluster, rules, "bridge-restart")
    log = tmp_path / "bridge.log"
    count = 3000
    messages = [b"serial-%05d" % i for i in range(count)]
    pub_command = [
        "mosquitto_pub", "-h", mosquitto.host, "-p", str(mosquitto.port),
        "-q", "1", "-t", "phones/d0/spectrum", "-l",
    ]  # fmt: skip
    publisher = subprocess.Popen(pub_command, stdin=subprocess.PIPE)
    assert publisher.stdin is not None
    try:
        with bridge_process(command, log) as first:
            for i in range(count // 3):
                publisher.stdin.write(messages[i] + b"\n")
                if i % 100 == 0:
                    publisher.stdin.flush()
                    time.sleep(0.02)
            publisher.stdin.flush()
            # A burst, and the kill as soon as the bridge has appended its first message: the
            # bridge is busy with it, some messages are in flight.
            burst = messages[count // 3 : 2 * count // 3]
            publisher.stdin.write(b"".join(m + b"\n" for m in burst))
            publisher.stdin.flush()
            read_values(broker_cluster.bootstrap, "readings_restart", {burst[0]}, quick=True)
            os.kill(first.pid, signal.SIGKILL)
            first.wait(timeout=30)
        # The publisher keeps publishing while no bridge runs: mosquitto queues for the session.
        time.sleep(0.5)
        with bridge_process(command, log):
            for i in range(2 * count // 3, count):
                publisher.stdin.write(messages[i] + b"\n")
            publisher.stdin.close()
            assert publisher.wait(timeout=60) == 0
            values = read_values(broker_cluster.bootstrap, "readings_restart", set(messages))
    finally:
        if publisher.poll() is None:
            publisher.kill()
            publisher.wait()
    counts = collections.Counter(values)
    missing = [m for m in messages if m not in counts]
    duplicates = sum(n - 1 for n in counts.values())
    print(f"kill -9 restart: {count} published, {len(missing)} missing, {duplicates} duplicates")
    assert missing == []
    assert set(counts) == set(messages)
    # Duplicates are the messages in flight at the kill (appended, PUBACK not yet received by
    # mosquitto): at most the server's in-flight window, all from before the kill.
    duplicated = [m for m, n in counts.items() if n > 1]
    assert duplicates <= MAX_INFLIGHT
    assert all(messages.index(m) < 2 * count // 3 for m in duplicated)


def test_sigterm_finishes_what_is_in_flight_and_restart_duplicates_nothing(
    broker_cluster: LocalCluster, mosquitto: Mosquitto, tmp_path: Path
) -> None:
    rules = tmp_path / "rules"
    rules.write_text(RULES.format(topic="readings_sigterm"))
    command = bridge_command(mosquitto, broker_cluster, rules, "bridge-sigterm")
    log = tmp_path / "bridge.log"
    first_half = [b"a-%04d" % i for i in range(500)]
    second_half = [b"b-%04d" % i for i in range(500)]
    pub = ["mosquitto_pub", "-h", mosquitto.host, "-p", str(mosquitto.port), "-q", "1", "-l"]
    with bridge_process(command, log) as first:
        subprocess.run(
            [*pub, "-t", "phones/d1/spectrum"],
            input=b"".join(m + b"\n" for m in first_half),
            check=True,
            timeout=60,
        )
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=30) == 0
    subprocess.run(
        [*pub, "-t", "phones/d1/spectrum"],
        input=b"".join(m + b"\n" for m in second_half),
        check=True,
        timeout=60,
    )
    with bridge_process(command, log):
        values = read_values(
            broker_cluster.bootstrap, "readings_sigterm", set(first_half + second_half)
        )
    assert sorted(values) == sorted(first_half + second_half)  # all, each exactly once
