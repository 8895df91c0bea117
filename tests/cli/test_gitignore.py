"""What the commands write by default in the checkout stays out of git's way."""

from __future__ import annotations

import argparse
import shutil
import subprocess
from pathlib import Path

import pytest
from kafkaesque.cli import jepsen

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(
    shutil.which("git") is None or not (REPO / ".git").exists(), reason="not a git checkout"
)
def test_the_default_jepsen_folder_is_ignored_by_git() -> None:
    parser = argparse.ArgumentParser()
    jepsen.add_parser(parser.add_subparsers())
    folder = parser.parse_args(["jepsen"]).dir
    written = Path(folder) / "run-1" / "report.html"  # a run's files, under the folder
    checked = subprocess.run(
        ["git", "check-ignore", "-q", str(written)], cwd=REPO, check=False, timeout=30
    )
    assert checked.returncode == 0, f"git does not ignore {written}: add {folder}/ to .gitignore"
