"""Before ``kafkaesque demo`` starts anything: is every piece it will need there?

The demo runs minutes of work before its Spark step; a piece found missing there (a Python
package, Java) would end it with a traceback. ``demo_problems`` looks for every piece first, in
well under a second: it finds modules with ``importlib.util.find_spec`` (nothing is imported), reads
Java's version from the ``release`` file next to it, binds and releases loopback ports, and asks
the file system for free space. Each problem comes back as one sentence that names the piece and
the command that installs or frees it.

The lookups are injected (``Probes``) so tests can take a piece away without touching the machine.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

MIN_JAVA = 17  # Spark 4 runs on Java 17 or newer
MIN_FREE_BYTES = 500 * 1024 * 1024  # the demo's cluster logs, Spark's scratch files and the plot
SPARK_MODULES = (
    "pyspark",
    "pyarrow",
    "numba",
)  # the Spark step: Spark, its Arrow path, the scanner
JAVA_PACKAGE = "openjdk-17-jre-headless"
_JAVA_VERSION_TIMEOUT_S = 10.0


def java_major(java: str) -> int | None:
    """The major version of the Java runtime whose launcher is ``java`` (e.g. 17), or None.

    Reads ``JAVA_VERSION`` from the runtime's ``release`` file (``<home>/release`` beside
    ``<home>/bin/java``; every OpenJDK build has one), which costs no JVM start; only a runtime
    without one is asked with ``java -version``.
    """
    launcher = Path(java).resolve()
    for home in (launcher.parent.parent, launcher.parent.parent.parent):  # JDK, or JDK 8's jre/
        try:
            text = (home / "release").read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        match = re.search(r'^JAVA_VERSION="([^"]+)"', text, re.MULTILINE)
        if match:
            return _major(match.group(1))
    try:
        done = subprocess.run(
            [java, "-version"],
            capture_output=True,
            text=True,
            timeout=_JAVA_VERSION_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r'version "([^"]+)"', done.stderr + done.stdout)
    return _major(match.group(1)) if match else None


def _major(version: str) -> int | None:
    """17 for "17.0.15", 8 for "1.8.0_382", 21 for "21"; None if it is not a version."""
    parts = version.split(".")
    if parts[0] == "1" and len(parts) > 1:
        parts = parts[1:]
    digits = re.match(r"\d+", parts[0])
    return int(digits.group()) if digits else None


def _bind_loopback_ports(n: int) -> None:
    """Raise OSError unless ``n`` ports can listen on 127.0.0.1 (they are released again).

    Not ``local_cluster.free_ports``: the launcher brings the client and trio with it, and the
    preflight runs before anything heavy is loaded."""
    with contextlib.ExitStack() as stack:
        for _ in range(n):
            stack.enter_context(socket.create_server(("127.0.0.1", 0)))


def _free_bytes(path: str) -> int:
    return shutil.disk_usage(path).free


@dataclass(frozen=True)
class Probes:
    """How the checks look at the machine; tests pass stand-ins for the piece they take away."""

    find_spec: Callable[[str], object | None] = importlib.util.find_spec
    which: Callable[[str], str | None] = shutil.which
    java_version: Callable[[str], int | None] = java_major
    bind_loopback_ports: Callable[[int], None] = _bind_loopback_ports
    free_bytes: Callable[[str], int] = _free_bytes
    writable: Callable[[str], bool] = lambda path: os.access(path, os.W_OK | os.X_OK)
    environ: Callable[[str], str | None] = os.environ.get


def _pip_install_spark() -> str:
    """The command that installs the ``spark`` extra into this interpreter's environment."""
    root = Path(__file__).resolve().parent.parent
    here = f"-e '{root}[spark]'" if (root / "pyproject.toml").is_file() else "'kafkaesque[spark]'"
    return f"{sys.executable} -m pip install {here}"


def _nearest_existing(path: str) -> str:
    """``path`` or its closest ancestor that exists: where a directory made there would live."""
    current = os.path.abspath(path)
    while not os.path.exists(current) and os.path.dirname(current) != current:
        current = os.path.dirname(current)
    return current


def _java_problem(probes: Probes) -> str | None:
    # Spark's launcher runs $JAVA_HOME/bin/java when JAVA_HOME is set, else `java` on the PATH.
    java_home = probes.environ("JAVA_HOME")
    if java_home:
        java: str | None = os.path.join(java_home, "bin", "java")
        where = f"at JAVA_HOME={java_home}"
        fix = f"point JAVA_HOME at Java {MIN_JAVA} or newer, or unset it"
    else:
        java = probes.which("java")
        where = "on the PATH"
        fix = f"install it with: apt-get install {JAVA_PACKAGE} (bin/kafkaesque does, as root)"
    found = probes.java_version(java) if java else None
    if found is not None and found >= MIN_JAVA:
        return None
    have = "none" if found is None else f"Java {found}"
    return (
        f"Java {MIN_JAVA} or newer is not {where} (found: {have}; Spark runs on it); {fix}, "
        "or run without Spark: --no-spark"
    )


def demo_problems(
    *, data_dir: str, ports: int, spark: bool, probes: Probes | None = None
) -> list[str]:
    """What the demo would lack, one sentence per piece; empty when everything is there.

    ``data_dir``: where the demo writes (it need not exist yet); ``ports``: how many loopback
    ports its processes will listen on; ``spark``: whether the Spark step runs (it needs Java and
    the ``spark`` extra). Starts nothing and imports nothing.
    """
    probes = probes or Probes()
    problems = []
    missing = [name for name in SPARK_MODULES if spark and probes.find_spec(name) is None]
    if missing:
        problems.append(
            f"the Python package{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
            f"{'are' if len(missing) > 1 else 'is'} not installed (the Spark step needs "
            f"{'them' if len(missing) > 1 else 'it'}); install with: {_pip_install_spark()} "
            "(bin/kafkaesque does), or run without Spark: --no-spark"
        )
    if spark and (java := _java_problem(probes)):
        problems.append(java)
    try:
        probes.bind_loopback_ports(ports)
    except OSError as exc:
        problems.append(
            f"cannot listen on {ports} ports on 127.0.0.1 ({exc}); the demo's brokers need "
            "them: free some ports (stop other servers) and run it again"
        )
    existing = _nearest_existing(data_dir)
    if not probes.writable(existing):
        problems.append(
            f"cannot write to {existing} (the data dir {data_dir} goes there); "
            "pass a writable --data-dir"
        )
    else:
        free = probes.free_bytes(existing)
        if free < MIN_FREE_BYTES:
            problems.append(
                f"only {free // 2**20} MB free in {existing} (the demo needs "
                f"{MIN_FREE_BYTES // 2**20} MB for {data_dir}); free some space or pass a "
                "--data-dir on another disk"
            )
    return problems
