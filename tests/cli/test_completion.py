"""Shell completion (issue 37, point 11) and ``broker stop --help`` showing its own options."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from .test_client_commands import _kafkaesque


def _complete(script: str, *words: str) -> list[str]:
    """What bash's completion function offers after ``kafkaesque <words>`` (last: the prefix)."""
    words_text = " ".join(f"'{w}'" for w in ("kafkaesque", *words))
    program = (
        f"{script}\nCOMP_WORDS=({words_text}); COMP_CWORD={len(words)}; _kafkaesque; "
        'printf "%s\\n" "${COMPREPLY[@]}"'
    )
    result = subprocess.run(
        ["bash", "--norc", "-c", program], capture_output=True, timeout=30, check=True
    )
    return result.stdout.decode().split()


def test_bash_completion_offers_commands_actions_and_options() -> None:
    made = subprocess.run(
        [*_kafkaesque(), "completion", "bash"], capture_output=True, timeout=30, check=True
    )
    script = made.stdout.decode()
    assert "consume" in _complete(script, "")
    assert _complete(script, "com") == ["completion"]
    assert set(_complete(script, "topic", "")) >= {"create", "list", "describe", "delete"}
    assert "--replication-factor" in _complete(script, "topic", "create", "--r")
    assert "--from-beginning" in _complete(script, "consume", "t", "--from")
    assert _complete(script, "broker", "st") == ["stop"]
    assert [w for w in _complete(script, "completion", "") if w[0] != "-"] == ["bash", "zsh"]


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_zsh_completion_loads() -> None:
    made = subprocess.run(
        [*_kafkaesque(), "completion", "zsh"], capture_output=True, timeout=30, check=True
    )
    result = subprocess.run(
        ["zsh", "-f", "-c", made.stdout.decode() + "\nwhence -w _kafkaesque"],
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0 and b"function" in result.stdout, result.stderr


def test_broker_stop_help_shows_only_its_own_options() -> None:
    result = subprocess.run(
        [*_kafkaesque(), "broker", "stop", "--help"], capture_output=True, timeout=30, check=True
    )
    text = result.stdout.decode()
    assert text.startswith("usage: kafkaesque broker stop")
    for option in ("--data-dir", "--id", "--config", "--shutdown-timeout"):
        assert option in text
    assert "--peers" not in text and "--mqtt-listen" not in text
    full = subprocess.run(
        [*_kafkaesque(), "broker", "--help"], capture_output=True, timeout=30, check=True
    )
    assert "--peers" in full.stdout.decode()
