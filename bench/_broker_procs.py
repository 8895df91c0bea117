"""Process plumbing of ``bench.broker``: load processes, CPU accounting, py-spy profiles, and
the scratch directory (removed afterwards, and reclaimed from runs that were killed).
"""

from __future__ import annotations

import collections
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SCRATCH_PREFIX = "kq-bench-broker-"
_OWNER_FILE = "owner.pid"


class LoadError(RuntimeError):
    """A load process failed, or did not say what was expected in time."""


class Load:
    """One ``python -m bench._broker_load`` (or ``module``) process; a context manager that
    always ends it."""

    def __init__(
        self,
        name: str,
        *args: str,
        env: Mapping[str, str] | None = None,
        module: str = "bench._broker_load",
    ) -> None:
        """``env``: variables added to this process's environment (a password: never on a
        command line); ``module``: the load generators' module (``bench._kafka_load``'s are
        librdkafka's)."""
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            cwd=REPO,
            env=None if env is None else {**os.environ, **env},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._stderr: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr.append(line)

    def expect(self, event: str, timeout: float) -> dict[str, Any]:
        """The next message with ``event`` (others are skipped); ``LoadError`` if the process
        ends or ``timeout`` seconds pass first."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise LoadError(f"{self.name}: no {event!r} within {timeout:.0f} s") from None
            if line is None:
                self.proc.wait(5)
                tail = "".join(self._stderr[-15:])
                raise LoadError(
                    f"{self.name} exited ({self.proc.returncode}) before {event!r}:\n{tail}"
                )
            message: dict[str, Any] = json.loads(line)
            if message.get("event") == event:
                return message

    def __enter__(self) -> Load:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


# -- CPU accounting -------------------------------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (all its threads) and of its live child processes
    (a broker's fsync helper) so far; 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            children = [int(c) for c in f.read().split()]
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK + sum(process_cpu_s(c) for c in children)


def machine_busy_s() -> float:
    """CPU seconds the whole machine spent busy so far (user, nice, system, irq, softirq)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:8]]
    user, nice, system, _idle, _iowait, irq, softirq = fields
    return (user + nice + system + irq + softirq) / _TICK


class StealWindow:
    """The share of this machine's CPU time the hypervisor gave to other guests (steal time)
    since the window was made. Above a few percent the machine is contended: every process of a
    benchmark may stall for tens of milliseconds at once, and latency figures suffer.

    ``ticks()`` gives the machine's CPU time so far (``/proc/stat``'s first eight columns)."""

    def __init__(self, ticks: Callable[[], list[int]] | None = None) -> None:
        self._ticks = ticks or _cpu_ticks
        self._begin = self._ticks()

    def percent(self) -> float:
        """Steal as a percentage of all CPU time (every core) since the window was made."""
        spent = [b - a for a, b in zip(self._begin, self._ticks(), strict=True)]
        return 100 * spent[7] / max(sum(spent), 1)

    def __str__(self) -> str:
        steal = self.percent()
        verdict = "contended: latency figures are unreliable" if steal > 2 else "quiet"
        return f"machine: hypervisor steal {steal:.1f}% of the CPU time during the run ({verdict})"


def _cpu_ticks() -> list[int]:
    """The machine's CPU time so far, in ticks: user, nice, system, idle, iowait, irq,
    softirq, steal."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:9]]
    return fields + [0] * (8 - len(fields))


@dataclass
class CpuShare:
    """Percent of one core used by each group of processes during a window."""

    brokers: list[float]
    load: float
    rest: float  # everything else on the machine: other people's work, the kernel

    def __str__(self) -> str:
        brokers = "/".join(f"{b:.0f}" for b in self.brokers)
        return (
            f"cpu (% of one core): brokers {brokers}, load generators {self.load:.0f}, "
            f"rest of the machine {self.rest:.0f} (of {100 * (os.cpu_count() or 1)})"
        )


class CpuWindow:
    """CPU used by the brokers, the load processes and everything else between ``start`` and
    ``stop`` (this process and any profiler count as "everything else")."""

    def __init__(self, brokers: list[int], load: list[int]) -> None:
        self.brokers, self.load = brokers, load
        self._begin: tuple[float, list[float], list[float], float] | None = None
        self.share: CpuShare | None = None

    def _sample(self) -> tuple[float, list[float], list[float], float]:
        return (
            time.monotonic(),
            [process_cpu_s(p) for p in self.brokers],
            [process_cpu_s(p) for p in self.load],
            machine_busy_s(),
        )

    def start(self) -> None:
        self._begin = self._sample()

    def stop(self) -> CpuShare:
        assert self._begin is not None
        t0, b0, l0, m0 = self._begin
        t1, b1, l1, m1 = self._sample()
        span = max(t1 - t0, 1e-9)
        brokers = [100 * (y - x) / span for x, y in zip(b0, b1, strict=True)]
        load = 100 * sum(y - x for x, y in zip(l0, l1, strict=True)) / span
        rest = max(0.0, 100 * (m1 - m0) / span - sum(brokers) - load)
        self.share = CpuShare(brokers, load, rest)
        return self.share


# -- profiles -------------------------------------------------------------------------------------

# Leaf frames where a thread waits rather than works (py-spy --nonblocking cannot tell idle).
_IDLE_LEAVES = (
    "get_events (",  # trio's epoll_wait
    "select (",
    "poll (",
    "WorkerThread._work (",  # trio's worker threads waiting for a job
    "wait (threading.py",
    "_wait_for_tstate_lock",
    "sleep (",
)


def py_spy() -> str | None:
    """The py-spy executable (next to this interpreter, else on PATH), or None."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


@dataclass
class _Tally:
    """Samples of some profiles: busy and idle counts, self and inclusive counts per function."""

    busy: int = 0
    idle: int = 0
    own: collections.Counter[str] = field(default_factory=collections.Counter)
    inclusive: collections.Counter[str] = field(default_factory=collections.Counter)

    def add(self, path: Path) -> None:
        for line in path.read_text().splitlines() if path.exists() else ():
            stack, _, count = line.rpartition(" ")
            if not stack or not count.isdigit():
                continue
            n = int(count)
            frames = [_short(f) for f in stack.split(";")]
            if any(leaf in frames[-1] for leaf in _IDLE_LEAVES):
                self.idle += n
                continue
            self.busy += n
            self.own[frames[-1]] += n
            for frame in set(frames):
                if "(kafkaesque/" in frame:
                    self.inclusive[frame] += n

    def top(self, counter: collections.Counter[str], n: int) -> list[str]:
        return [f"  {100 * k / max(self.busy, 1):5.1f}%  {f}" for f, k in counter.most_common(n)]


class Profiles:
    """py-spy on every broker for one phase, twice: the thread holding the GIL (where Python
    spends CPU) and every thread (also time blocked in fsync and socket calls)."""

    def __init__(self, directory: Path, phase: str, pids: list[int], seconds: float) -> None:
        exe = py_spy()
        if exe is None:
            raise RuntimeError("--profile needs py-spy")
        directory.mkdir(parents=True, exist_ok=True)
        record = [exe, "record", "-d", str(max(1, round(seconds))), "-f", "raw", "--nonblocking"]
        self.gil = [directory / f"{phase}-broker{i}-gil.txt" for i in range(len(pids))]
        self.all = [directory / f"{phase}-broker{i}-threads.txt" for i in range(len(pids))]
        runs = [(pid, path, ["--gil"]) for pid, path in zip(pids, self.gil, strict=True)]
        runs += [(pid, path, []) for pid, path in zip(pids, self.all, strict=True)]
        self._procs = [
            subprocess.Popen(
                [*record, *extra, "-p", str(pid), "-o", str(path)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for pid, path, extra in runs
        ]

    def finish(self, timeout: float = 30.0) -> None:
        for proc in self._procs:
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def summary(self, top: int = 8) -> list[str]:
        """The hottest functions of the three brokers together."""
        gil, every = _Tally(), _Tally()
        for path in self.gil:
            gil.add(path)
        for path in self.all:
            every.add(path)
        if not gil.busy or not every.busy:
            return ["no samples (py-spy failed?)"]
        return [
            "GIL held (Python running), self time:",
            *gil.top(gil.own, top),
            "GIL held, inclusive time of Kafkaesque's functions:",
            *gil.top(gil.inclusive, top),
            f"all threads, busy {100 * every.busy / (every.busy + every.idle):.0f}% of samples "
            "(blocked in fsync or socket calls counts as busy), self time:",
            *every.top(every.own, top // 2),
        ]


def _short(frame: str) -> str:
    """``func (path/to/file.py:12)`` as ``func (file.py)``, keeping ``kafkaesque/`` when there."""
    name, _, where = frame.partition(" (")
    path = where.rsplit(":", 1)[0]
    parts = path.split("/")
    keep = parts.index("kafkaesque") if "kafkaesque" in parts else len(parts) - 1
    return f"{name} ({'/'.join(parts[keep:])})"


# -- the scratch directory --------------------------------------------------------------------


def make_scratch() -> Path:
    """A new scratch directory under the system temp dir, marked with this process's id, after
    removing those of earlier runs whose process is gone (a run killed by SIGKILL leaves one)."""
    base = Path(tempfile.gettempdir())
    for old in base.glob(f"{SCRATCH_PREFIX}*"):
        try:
            pid = int((old / _OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue  # not ours, or just being made: leave it
        if not _alive(pid):
            shutil.rmtree(old, ignore_errors=True)
    root = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX))
    (root / _OWNER_FILE).write_text(str(os.getpid()))
    return root


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
