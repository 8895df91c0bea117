"""The README's main job, run as a user runs it: the installed ``kafkaesque`` command."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli._demo_pipeline import PipelineResult
from cli._demo_report import LogSummary, SparkTotals, failures


def _kafkaesque() -> list[str]:
    exe = shutil.which("kafkaesque", path=str(Path(sys.executable).parent))
    return [exe] if exe else [sys.executable, "-m", "kafkaesque.cli"]


_MARK = "KAFKAESQUE_TEST_DEMO_RUN"


def _marked_env(directory: Path) -> dict[str, str]:
    """The environment for a demo run: every process it starts inherits the marker."""
    return {**os.environ, _MARK: str(directory)}


def _processes_under(directory: Path) -> list[str]:
    """Command lines of live processes started by the demo run marked with ``directory``."""
    marker = f"{_MARK}={directory}".encode()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if marker in environ and cmdline:  # a zombie has an empty command line
            found.append(cmdline.decode(errors="replace"))
    return found


def _row(stdout: str, name: str) -> str:
    match = re.search(rf"^\s+{re.escape(name)}\s+(.+)$", stdout, re.MULTILINE)
    assert match, f"no row {name!r} in:\n{stdout}"
    return match.group(1).strip()


@pytest.mark.slow
def test_demo_quick_runs_the_pipeline_end_to_end_and_loses_nothing(tmp_path: Path) -> None:
    """The README's main job, whole. CI runs this same command first (``.ci/run``), and the
    demo's own verdict (``_demo_report.failures``, tested below) fails it on every promise
    checked here but the table's shape, the plot and the processes left; so this run sits in
    the slow tier instead of taking a minute of every ``bin/test``."""
    result = subprocess.run(
        [*_kafkaesque(), "demo", "--quick", "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env=_marked_env(tmp_path),
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    sent = int(_row(out, "readings sent").replace(",", ""))
    assert sent > 0
    assert _row(out, "acknowledged (PUBACK after quorum commit)") == _row(out, "readings sent")
    assert _row(out, "lost (acknowledged, not in the log)") == "0"
    assert int(_row(out, "in the log (distinct device, serial)").replace(",", "")) == sent
    # The phones on the killed broker resend with DUP; none is a second reading (issue 38).
    assert re.fullmatch(r"0 \(of [\d,]+ readings resent\)", _row(out, "duplicated in the log"))
    assert re.search(r"fault: kill -9 broker \d \(leader of readings/0\)\s+failover gap", out)
    commands = _row(out, "commands sent / delivered to phones")
    assert re.fullmatch(r"[\d,]+ / [\d,]+", commands) and not commands.startswith("0 ")
    devices, messages, lost, _ = _row(
        out, "Spark: devices, messages, lost by serial gap, duplicated"
    ).split(", ")
    assert (devices, lost) == ("200", "0")
    assert int(messages.replace(",", "")) >= sent
    png = tmp_path / "demo" / "demo.png"
    assert f"plot: {png}" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not _processes_under(tmp_path)


def test_ctrl_c_stops_every_process_the_demo_started(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [*_kafkaesque(), "demo", "--quick", "--no-spark", "--data-dir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_marked_env(tmp_path),
    )
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 120
        for line in proc.stdout:  # the status line shows once devices and controller run
            if line.startswith("t=") or time.monotonic() > deadline:
                break
        assert _processes_under(tmp_path), "the demo started no process under its data dir"
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0
    deadline = time.monotonic() + 20
    while _processes_under(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _processes_under(tmp_path)


def test_an_unknown_command_is_one_clear_error_and_a_non_zero_exit() -> None:
    result = subprocess.run(
        [*_kafkaesque(), "nosuch"], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode != 0
    assert "invalid choice: 'nosuch'" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_missing_piece_stops_the_demo_before_it_starts_anything(tmp_path: Path) -> None:
    """The preflight's answer: one line naming the piece and how to install it, nothing started."""
    env = {**_marked_env(tmp_path), "JAVA_HOME": str(tmp_path / "no-java")}
    result = subprocess.run(
        [*_kafkaesque(), "demo", "--quick", "--data-dir", str(tmp_path / "data")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert result.returncode == 1
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith(f"kafkaesque demo: Java 17 or newer is not at JAVA_HOME={tmp_path}")
    assert "--no-spark" in line
    assert not (tmp_path / "data").exists()
    assert not _processes_under(tmp_path)


def _run(sent: int, acknowledged: int, lost: int, commands: int) -> PipelineResult:
    report = {"sent": sent, "acknowledged": acknowledged, "lost": lost}
    return PipelineResult(0.0, {**report, "commands_received": commands}, commands_sent=5)


def _log(readings: dict[tuple[str, int], int]) -> LogSummary:
    log = LogSummary()
    log.readings.update(readings)
    return log


def test_the_demos_verdict_names_each_broken_promise() -> None:
    whole = _log({("p1", 1): 1, ("p1", 2): 1, ("p2", 1): 1})
    spark = SparkTotals(2, 3, 0, 0, 1.0, 2.0)
    assert failures(_run(3, 3, 0, 4), whole, spark, 2) == []
    assert failures(_run(3, 3, 0, 4), whole, None, 2) == []  # --no-spark
    twice = _log({("p1", 1): 1, ("p1", 2): 2, ("p2", 1): 1})
    assert failures(_run(3, 3, 0, 4), twice, spark, 2) == [
        "1 readings are in the log more than once"
    ]
    short = _log({("p1", 1): 1, ("p2", 1): 1})
    assert failures(_run(3, 2, 1, 0), short, SparkTotals(1, 2, 1, 0, 1.0, 2.0), 2) == [
        "1 acknowledged readings are not in the log",
        "1 of 3 readings were never acknowledged",
        "the log holds 2 distinct readings of the 3 sent",
        "none of the 5 commands reached a phone",
        "Spark saw 1 of 2 devices and 1 readings missing by serial gap",
    ]
    with pytest.raises(ValueError, match="lost"):
        failures(PipelineResult(0.0, {"sent": 1, "acknowledged": 1}), whole, None, 2)
