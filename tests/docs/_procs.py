"""Processes the doc tests start: documented commands run by bash, and long-running ones.

Every process started here carries a marker in its environment (inherited by whatever it starts:
brokers, Spark, mosquitto clients), so the test can tell whether any of them outlived a stop, and
kill exactly those (by pid) if they did.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

MARK = "KAFKAESQUE_DOC_TEST_RUN"
ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Env:
    """The environment documented commands run in: the repo's ``.venv/bin`` first on the PATH,
    the cluster's bootstrap as the client commands' default, and this run's marker."""

    marker: str
    bootstrap: str

    def variables(self) -> dict[str, str]:
        path = f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
        return {
            **os.environ,
            "PATH": path,
            "KAFKAESQUE_BOOTSTRAP": self.bootstrap,
            MARK: self.marker,
        }


def marked_processes(marker: str) -> dict[int, str]:
    """pid -> command line of the live processes carrying ``marker``."""
    needle = f"{MARK}={marker}".encode()
    found: dict[int, str] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if needle in environ and cmdline:  # a zombie has an empty command line
            found[int(pid)] = cmdline.decode(errors="replace").strip()
    return found


def kill_marked(marker: str) -> dict[int, str]:
    """SIGKILL every live process carrying ``marker`` (one by one, by pid); what was killed."""
    found = marked_processes(marker)
    for pid in found:
        with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
            os.kill(pid, signal.SIGKILL)
    return found


def run_script(
    script: str, env: Env, timeout: float, cwd: Path = ROOT
) -> subprocess.CompletedProcess[str]:
    """``script`` run by ``bash -euo pipefail`` in ``cwd``; output captured."""
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd,
        env=env.variables(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


class LongRunning:
    """A command that runs until it is told to stop (``cluster up``, ``broker``).

    ``wait_for("ready")`` reads its output until that line; ``stop(sig)`` sends ``sig`` (SIGINT:
    Ctrl-C; SIGTERM) and returns the exit status. The caller checks, and kills the leftovers of,
    the marker it gave in ``env``.
    """

    def __init__(self, command: str, env: Env, cwd: Path = ROOT) -> None:
        self.command = command
        self.output = ""
        self.proc = subprocess.Popen(
            ["bash", "-euo", "pipefail", "-c", f"exec {command}"],
            cwd=cwd,
            env=env.variables(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        assert self.proc.stdout is not None
        self._fd = self.proc.stdout.fileno()
        os.set_blocking(self._fd, False)

    def wait_for(self, line: str, timeout: float) -> None:
        """Until the command prints ``line``; AssertionError if it exits or time runs out."""
        deadline = time.monotonic() + timeout
        while line not in self.output.splitlines():
            left = deadline - time.monotonic()
            assert left > 0, f"no {line!r} in {timeout:.0f} s from {self.command}:\n{self.output}"
            readable, _, _ = select.select([self._fd], [], [], min(left, 1.0))
            if readable and not self._read():
                raise AssertionError(f"{self.command} exited before {line!r}:\n{self.output}")

    def _read(self) -> bool:
        """Whatever output is there; False at its end."""
        try:
            chunk = os.read(self._fd, 65536)
        except BlockingIOError:
            return True
        self.output += chunk.decode(errors="replace")
        return bool(chunk)

    def stop(self, sig: signal.Signals, timeout: float) -> int:
        """Send ``sig``, wait for the exit (SIGKILL after ``timeout``); the exit status.

        Idempotent: once stopped, it returns the same status.
        """
        assert self.proc.stdout is not None
        if self.proc.stdout.closed:
            return self.proc.returncode
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        deadline = time.monotonic() + 5.0  # a leftover child could hold the pipe open
        while time.monotonic() < deadline:
            readable, _, _ = select.select([self._fd], [], [], 0.5)
            if readable and not self._read():
                break
        self.proc.stdout.close()
        return self.proc.returncode
