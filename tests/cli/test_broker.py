"""``kafkaesque broker``: a setting that cannot work stops it at once, with one clear line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--mqtt-tls-listen", "127.0.0.1:0"], "mqtt_tls needs mqtt_tls_cert"),
        (
            ["--mqtt-tls-listen", "127.0.0.1:0", "--mqtt-tls-cert", "missing.pem"],
            "mqtt_tls: cannot load the certificates",
        ),
        (
            ["--mqtt-listen", "127.0.0.1:0", "--mqtt-users", "missing.txt"],
            "mqtt_users: cannot read",
        ),
    ],
)
def test_a_bad_setting_is_one_line_and_a_non_zero_exit(
    tmp_path: Path, flags: list[str], message: str
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kafkaesque.cli", "broker", "--id", "0",
         "--data-dir", str(tmp_path), "--client", "127.0.0.1:0",
         "--peers", "0@127.0.0.1:0", "--controllers", "0@127.0.0.1:0", *flags],
        check=False, cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode != 0
    [line] = result.stderr.strip().splitlines()  # no traceback
    assert line.startswith("kafkaesque broker: ")
    assert message in line
