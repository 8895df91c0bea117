"""``kafkaesque demo --secure``: the README's pipeline with TLS on every listener, SCRAM users and
an MQTT ACL, run as a user runs it; nothing lost, and every part of it (devices over MQTT with
TLS, controller, failover probe, the log read back, Spark) worked through security.

It publishes for 12 s at ``--quick``'s pace, not ``--quick``'s 30 s: the kill and restart of a
broker still fall inside (at 35% and 15% of the run), and the plaintext demo test has the long
run."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from .test_demo import _kafkaesque, _marked_env, _processes_under, _row


def test_demo_secure_runs_the_pipeline_through_tls_and_scram(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            *_kafkaesque(),
            "demo",
            "--duration",
            "12",
            "--interval",
            "0.5",
            "--secure",
            "--data-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env=_marked_env(tmp_path),
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    assert re.search(r"^security: TLS on the client, peer and MQTT ports", out, re.MULTILINE), out
    sent = int(_row(out, "readings sent").replace(",", ""))
    assert sent > 0
    assert _row(out, "acknowledged (PUBACK after quorum commit)") == _row(out, "readings sent")
    assert _row(out, "lost (acknowledged, not in the log)") == "0"
    assert int(_row(out, "in the log (distinct device, serial)").replace(",", "")) == sent
    commands = _row(out, "commands sent / delivered to phones")
    assert re.fullmatch(r"[\d,]+ / [\d,]+", commands) and not commands.startswith("0 ")
    devices, messages, lost, _ = _row(
        out, "Spark: devices, messages, lost by serial gap, duplicated"
    ).split(", ")
    assert (devices, lost) == ("200", "0")
    assert int(messages.replace(",", "")) >= sent
    # The brokers ran with TLS, users and the MQTT ACL, and the users file holds no password.
    security = tmp_path / "demo" / "security"
    entries = [
        line for line in (security / "users").read_text().splitlines() if not line.startswith("#")
    ]
    assert {line.split(":")[0] for line in entries} == {"demo", "phones"}
    assert all(":SCRAM-SHA-256:" in line for line in entries)
    assert "pattern write phones/%c/spectrum" in (security / "mqtt-acl.txt").read_text()
    assert not _processes_under(tmp_path)
