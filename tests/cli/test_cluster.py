"""``LocalCluster`` and ``kafkaesque cluster up``: brokers never outlive what started them; a
broker that dies is named, the others go on, and it comes back (``--restart``,
``restart-broker``)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from kafkaesque.cli.cluster import STATE_FILE, RestartPolicy, Supervisor

from kafkaesque.client import Client, KafkaesqueError
from kafkaesque.local_cluster import LocalCluster, answers_ping, describe_exit, one_attempt

HARNESS = """
import sys, time
from kafkaesque.local_cluster import LocalCluster
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


# -- `kafkaesque cluster up` watching its brokers ------------------------------------------------

_READY_TIMEOUT_S = 90.0  # three brokers starting on two busy cores


class ClusterUp:
    """``kafkaesque cluster up -n 3`` on free ports, in a process group of its own (its brokers
    join it), with its output collected line by line by a thread."""

    def __init__(self, data_dir: Path, *flags: str) -> None:
        self.data_dir = data_dir
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kafkaesque.cli", "cluster", "up", "-n", "3",
             "--base-port", "0", "--data-dir", str(data_dir), *flags],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )  # fmt: skip
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, start: str, timeout: float) -> str:
        """The first line that starts with ``start``, waiting for it up to ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [line for line in list(self.lines) if line.startswith(start)]
            if found:
                return found[0]
            if self.proc.poll() is not None:
                self._reader.join(5)
                break
            time.sleep(0.1)
        logs = "".join(
            f"\n--- {log.name}:\n" + "\n".join(log.read_text(errors="replace").splitlines()[-10:])
            for log in sorted((self.data_dir / "logs").glob("*.log"))
        )
        raise AssertionError(f"no line {start!r} in:\n{self.output}{logs}")

    def ready(self) -> str:
        """Wait for ``ready``; the bootstrap list."""
        self.wait_for("ready", _READY_TIMEOUT_S)
        return self.wait_for("bootstrap ", 1).split()[1]

    def state(self) -> dict[str, Any]:
        return dict(json.loads((self.data_dir / STATE_FILE).read_text()))

    def pid(self, broker: int) -> int:
        return int(self.state()["brokers"][str(broker)]["pid"])

    def stop(self) -> int:
        """SIGTERM, as a service manager stops it; its exit status."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(60)

    def kill_all(self) -> None:
        """SIGKILL the whole process group: nothing of the test outlives it."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def _kafkaesque(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kafkaesque.cli", *args],
        capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip


def _address(bootstrap: str, broker: int) -> tuple[str, int]:
    host, _, port = bootstrap.split(",")[broker].rpartition(":")
    return host, int(port)


def _published_through(address: tuple[str, int], value: str, timeout: float) -> int:
    """``value`` published to ``t`` through ``address`` (and only it) until it is
    acknowledged; its offset."""
    deadline = time.monotonic() + timeout
    answer: object = "not sent yet"
    while time.monotonic() < deadline:
        try:
            with Client.pinned(address, config=one_attempt(20)) as client:
                return client.publish("t", value.encode())[1]
        except KafkaesqueError as exc:
            answer = exc
        time.sleep(0.5)
    raise AssertionError(f"PUB through {address} never acknowledged: {answer!r}")


def test_a_killed_leader_is_named_the_others_serve_and_restart_brings_it_back(
    tmp_path: Path,
) -> None:
    up = ClusterUp(tmp_path, "--restart")
    try:
        bootstrap = up.ready()
        with Client(bootstrap) as client:
            client.create_topic("t", 1, 3)
            deadline = time.monotonic() + 30
            while (leader := client.refresh_metadata(["t"]).partitions["t"][0].leader) is None:
                assert time.monotonic() < deadline, "no leader for t/0"
                time.sleep(0.2)
        victim, survivor = leader, (leader + 1) % 3
        old_pid = up.pid(victim)
        os.kill(old_pid, signal.SIGKILL)
        up.wait_for(f"broker {victim} died: killed by SIGKILL (signal 9); restarting it in", 30)

        # The others go on: a write through a survivor is acknowledged and read back through it.
        offset = _published_through(_address(bootstrap, survivor), "after-the-kill", 40)
        with Client(",".join(f"{h}:{p}" for h, p in [_address(bootstrap, survivor)])) as client:
            fetched = client.fetch("t", 0, offset)
        assert [r.value for r in fetched.records][:1] == [b"after-the-kill"]

        up.wait_for(f"broker {victim} is back: it answers on", 60)
        assert answers_ping(_address(bootstrap, victim), 5)
        new_pid = up.pid(victim)
        assert new_pid != old_pid and _alive(new_pid)
        assert up.proc.poll() is None, "cluster up stopped when one broker died"
        assert f"broker {victim} restarted (pid {new_pid})" in up.lines

        brokers = [up.pid(i) for i in range(3)]
        assert up.stop() == 0
        assert "stopping" in up.lines
        assert not any(_alive(pid) for pid in brokers), "a restarted broker outlived cluster up"
        assert not (tmp_path / STATE_FILE).exists()
    finally:
        up.kill_all()


def test_without_restart_a_dead_broker_is_down_in_status_until_restart_broker(
    tmp_path: Path,
) -> None:
    up = ClusterUp(tmp_path)
    try:
        bootstrap = up.ready()
        second = _kafkaesque("cluster", "up", "--base-port", "0", "--data-dir", str(tmp_path))
        assert second.returncode == 1
        assert f"another `kafkaesque cluster up` (pid {up.proc.pid}) runs on" in second.stderr
        with Client(bootstrap) as client:
            client.create_topic("t", 2, 3)
        # Broker 0 is the first of the bootstrap list: status must find the cluster without it.
        os.kill(up.pid(0), signal.SIGKILL)
        up.wait_for("broker 0 died: killed by SIGKILL (signal 9); the others go on; ", 30)

        status = _kafkaesque("status", "--bootstrap", bootstrap)
        assert status.returncode == 0, status.stderr
        lines = status.stdout.splitlines()
        assert lines[0] == "brokers (3, 1 down)"
        assert lines[1].split()[-1] == "STATE"
        assert [line.split()[-1] for line in lines[2:5]] == ["down", "up", "up"]
        assert "partitions (2, 2 under-replicated)" in lines
        rows = [line.split() for line in lines if line.startswith("t ")]
        assert len(rows) == 2
        for row in rows:
            assert "0" not in row[6].split(",")  # LIVE
            assert "under-replicated" in row[7]  # STATE
        assert not up.state()["brokers"]["0"]["running"]
        assert not any(line.startswith("broker 0 restarted") for line in up.lines)

        restarted = _kafkaesque("cluster", "restart-broker", "0", "--data-dir", str(tmp_path))
        assert restarted.returncode == 0, restarted.stderr
        assert restarted.stdout.startswith("broker 0 restarted (pid ")
        assert "broker 0 is back: it answers on" in restarted.stdout
        up.wait_for("broker 0 restarted (pid ", 5)
        assert answers_ping(_address(bootstrap, 0), 5)

        again = _kafkaesque("cluster", "restart-broker", "0", "--data-dir", str(tmp_path))
        assert again.returncode == 1
        assert "broker 0 is running (pid " in again.stderr
        unknown = _kafkaesque("cluster", "restart-broker", "5", "--data-dir", str(tmp_path))
        assert unknown.returncode == 1 and "no broker 5 in the cluster of" in unknown.stderr

        status = _kafkaesque("status", "--bootstrap", bootstrap)
        assert status.returncode == 0, status.stderr
        assert status.stdout.splitlines()[0] == "brokers (3)"

        brokers = [up.pid(i) for i in range(3)]
        assert up.stop() == 0
        assert not any(_alive(pid) for pid in brokers)
    finally:
        up.kill_all()


def test_restart_broker_without_a_running_cluster_is_one_clear_line(tmp_path: Path) -> None:
    result = _kafkaesque("cluster", "restart-broker", "1", "--data-dir", str(tmp_path))
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"kafkaesque cluster: no `kafkaesque cluster up` runs on {tmp_path} "
        f"(no {STATE_FILE}); start one, or give the --data-dir it runs on"
    )


def test_a_broker_that_dies_as_it_starts_is_restarted_a_bounded_number_of_times(
    tmp_path: Path,
) -> None:
    cluster = LocalCluster(str(tmp_path), 1)
    # A broker that exits with status 3 as it starts, as one with a bad setting does.
    cluster.command = lambda broker: [sys.executable, "-c", "raise SystemExit(3)"]  # type: ignore[method-assign]
    out = io.StringIO()
    policy = RestartPolicy(backoff_s=0.01, max_backoff_s=0.02, max_restarts=3, window_s=60)
    supervisor = Supervisor(cluster, out, policy)
    try:
        cluster.start(0)
        supervisor.open()
        deadline = time.monotonic() + 30
        while "stays down" not in out.getvalue() and time.monotonic() < deadline:
            supervisor.step(time.monotonic())
            time.sleep(0.02)
        for _ in range(20):  # it stays down: no more starts
            supervisor.step(time.monotonic())
            time.sleep(0.02)
    finally:
        supervisor.close()
        cluster.stop_all()
    lines = out.getvalue().splitlines()
    died = [line for line in lines if line.startswith("broker 0 died: exited with status 3")]
    assert len(died) == 4  # the first death and three restarts
    assert sum(line.startswith("broker 0 restarted") for line in lines) == 3
    assert "it died 4 times in 60 s, so it stays down" in died[-1]
    assert "kafkaesque cluster restart-broker 0 --data-dir" in died[-1]
    assert not (tmp_path / STATE_FILE).exists()


def test_the_restart_back_off_doubles_and_gives_up_within_its_window() -> None:
    policy = RestartPolicy(backoff_s=1, max_backoff_s=8, max_restarts=5, window_s=60)
    deaths: list[float] = []
    delays = []
    for now in (0.0, 1.0, 3.0, 7.0, 15.0, 23.0):
        deaths.append(now)
        delays.append(policy.delay(deaths, now))
    assert delays == [1, 2, 4, 8, 8, None]
    # A minute later the old deaths no longer count: back to the first delay.
    assert policy.delay([*deaths, 100.0], 100.0) == 1


def test_an_exit_is_described_by_its_signal_or_status() -> None:
    assert describe_exit(-9) == "killed by SIGKILL (signal 9)"
    assert describe_exit(-15) == "killed by SIGTERM (signal 15)"
    assert describe_exit(3) == "exited with status 3"
    assert describe_exit(0) == "exited with status 0"


def _fsync_helper_of(broker_pid: int) -> int:
    """The broker's fsync helper process (a child running ``_fsync_helper.py``)."""
    with open(f"/proc/{broker_pid}/task/{broker_pid}/children") as f:
        children = [int(c) for c in f.read().split()]
    helpers = []
    for child in children:
        with open(f"/proc/{child}/cmdline", "rb") as f:
            if b"_fsync_helper.py" in f.read():
                helpers.append(child)
    assert len(helpers) == 1, f"broker {broker_pid} has fsync helpers {helpers}"
    return helpers[0]


def test_the_fsync_helper_dies_with_its_broker_and_stops_it_when_it_dies(tmp_path: Path) -> None:
    with LocalCluster(str(tmp_path), 1) as cluster:
        with Client(cluster.bootstrap) as client:
            client.create_topic("durable", 1, 1)
            client.publish("durable", b"fsynced by the helper")  # its first round starts it
        broker = cluster.procs[0]
        helper = _fsync_helper_of(broker.pid)
        os.kill(helper, signal.SIGINT)  # a Ctrl-C reaches the whole process group: ignored
        time.sleep(0.2)
        assert _alive(helper) and broker.poll() is None
        os.kill(helper, signal.SIGKILL)
        assert broker.wait(timeout=15) == 1  # stopped, not a crash (exit status 70)
        with open(cluster.log_path(0)) as f:
            last = f.read().strip().splitlines()[-1]
        assert last.startswith(
            f"kafkaesque broker: broker 0 stopped: the fsync helper (pid {helper}) ended"
        )

        cluster.close_log(0)
        cluster.start(0)
        cluster.wait_ready()
        with Client(cluster.bootstrap) as client:
            client.publish("durable", b"after the restart")
        broker = cluster.procs[0]
        helper = _fsync_helper_of(broker.pid)
        broker.send_signal(signal.SIGKILL)
        broker.wait()
        deadline = time.monotonic() + 10
        while _alive(helper) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(helper), "the fsync helper outlived its broker's kill -9"
