"""The README's main job, run as a user runs it: the installed ``kafkaesque`` command."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path


def _kafkaesque() -> list[str]:
    exe = shutil.which("kafkaesque", path=str(Path(sys.executable).parent))
    return [exe] if exe else [sys.executable, "-m", "kafkaesque.cli"]


def test_demo_quick_writes_crashes_recovers_and_reads_back(tmp_path: Path) -> None:
    result = subprocess.run(
        [*_kafkaesque(), "demo", "--quick", "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "wrote    20,000 records" in result.stdout
    assert "recovery cut" in result.stdout and "torn write" in result.stdout
    assert result.stdout.rstrip().endswith("after a crash")
    assert (tmp_path / "demo" / "readings" / "0").is_dir()


def test_an_unknown_command_is_one_clear_error_and_a_non_zero_exit() -> None:
    result = subprocess.run(
        [*_kafkaesque(), "nosuch"], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode != 0
    assert "invalid choice: 'nosuch'" in result.stderr
    assert "Traceback" not in result.stderr
