"""The demo's preflight: each missing piece is one sentence naming it and its install command.

The machine is left alone: a piece is taken away by passing a stand-in lookup (``Probes``).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from kafkaesque.cli._preflight import (
    JAVA_PACKAGE,
    MIN_FREE_BYTES,
    Probes,
    demo_problems,
    java_major,
)

PRESENT = object()  # what find_spec returns for an installed module (any non-None value)


def machine(
    *,
    modules: tuple[str, ...] = ("pyspark", "pyarrow", "numba"),
    java: str | None = "/usr/bin/java",
    java_version: int | None = 17,
    ports_error: OSError | None = None,
    free: int = 10 * MIN_FREE_BYTES,
    writable: bool = True,
    environ: dict[str, str] | None = None,
    seen: dict[str, object] | None = None,
) -> Probes:
    """A machine with the given pieces; ``seen`` records what the checks asked about."""
    record = seen if seen is not None else {}

    def java_of(path: str) -> int | None:
        record["java"] = path
        return java_version

    def bind(n: int) -> None:
        record["ports"] = n
        if ports_error:
            raise ports_error

    def free_bytes(path: str) -> int:
        record["disk"] = path
        return free

    return Probes(
        find_spec=lambda name: PRESENT if name in modules else None,
        which=lambda name: java if name == "java" else None,
        java_version=java_of,
        bind_loopback_ports=bind,
        free_bytes=free_bytes,
        writable=lambda path: writable,
        environ=(environ or {}).get,
    )


def problems(probes: Probes, *, spark: bool = True, data_dir: str = "/tmp/demo") -> list[str]:
    found: list[str] = demo_problems(data_dir=data_dir, ports=15, spark=spark, probes=probes)
    return found


def test_a_machine_with_every_piece_has_no_problem() -> None:
    seen: dict[str, object] = {}
    assert problems(machine(seen=seen)) == []
    assert seen == {"java": "/usr/bin/java", "ports": 15, "disk": "/tmp"}


@pytest.mark.parametrize("module", ["pyspark", "pyarrow", "numba"])
def test_a_missing_spark_package_is_named_with_the_command_that_installs_it(module: str) -> None:
    others = tuple(m for m in ("pyspark", "pyarrow", "numba") if m != module)
    [problem] = problems(machine(modules=others))
    assert f"the Python package {module} is not installed" in problem
    assert "-m pip install" in problem and "[spark]" in problem
    assert "--no-spark" in problem
    assert "\n" not in problem


def test_several_missing_packages_are_one_sentence() -> None:
    [problem] = problems(machine(modules=("pyspark",)))
    assert "packages pyarrow, numba are not installed" in problem


def test_without_spark_neither_its_packages_nor_java_are_needed() -> None:
    seen: dict[str, object] = {}
    assert problems(machine(modules=(), java=None, seen=seen), spark=False) == []
    assert "java" not in seen


def test_no_java_on_the_path_names_the_package_that_installs_it() -> None:
    [problem] = problems(machine(java=None))
    assert problem.startswith("Java 17 or newer is not on the PATH (found: none;")
    assert f"apt-get install {JAVA_PACKAGE}" in problem


def test_an_old_java_is_named_with_its_version() -> None:
    [problem] = problems(machine(java_version=11))
    assert "(found: Java 11;" in problem


@pytest.mark.parametrize("version", [17, 21, 25])
def test_java_17_or_newer_is_enough(version: int) -> None:
    assert problems(machine(java_version=version)) == []


def test_java_home_is_the_java_spark_runs() -> None:
    seen: dict[str, object] = {}
    environ = {"JAVA_HOME": "/opt/jdk-11"}
    [problem] = problems(machine(java_version=11, environ=environ, seen=seen))
    assert seen["java"] == os.path.join("/opt/jdk-11", "bin", "java")
    assert "not at JAVA_HOME=/opt/jdk-11" in problem and "unset it" in problem


def test_ports_that_cannot_listen_are_a_problem() -> None:
    [problem] = problems(machine(ports_error=OSError(98, "Address already in use")))
    assert problem.startswith("cannot listen on 15 ports on 127.0.0.1")
    assert "Address already in use" in problem


def test_too_little_disk_is_measured_where_the_data_dir_will_be(tmp_path: Path) -> None:
    seen: dict[str, object] = {}
    data_dir = tmp_path / "not" / "yet"
    [problem] = problems(machine(free=MIN_FREE_BYTES - 1, seen=seen), data_dir=str(data_dir))
    assert seen["disk"] == str(tmp_path)  # the closest ancestor that exists
    assert problem.startswith(f"only {(MIN_FREE_BYTES - 1) // 2**20} MB free in {tmp_path}")
    assert "--data-dir" in problem


def test_a_data_dir_that_cannot_be_written_is_a_problem(tmp_path: Path) -> None:
    [problem] = problems(machine(writable=False), data_dir=str(tmp_path / "demo"))
    assert problem.startswith(f"cannot write to {tmp_path}")


def test_every_missing_piece_is_reported_at_once() -> None:
    found = problems(machine(modules=(), java=None, free=0))
    assert len(found) == 3  # the packages, Java, the disk


# -- java_major: the version of a real runtime layout --------------------------------------------


def _runtime(home: Path, release: str | None, prints: str = "") -> Path:
    """A Java home with bin/java (a script printing ``prints`` on stderr) and a release file."""
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text(f"#!/bin/sh\necho '{prints}' >&2\n")
    java.chmod(java.stat().st_mode | stat.S_IXUSR)
    if release is not None:
        (home / "release").write_text(f'IMPLEMENTOR="Test"\nJAVA_VERSION="{release}"\n')
    return java


@pytest.mark.parametrize(("release", "major"), [("17.0.15", 17), ("21", 21), ("1.8.0_382", 8)])
def test_java_major_reads_the_release_file(tmp_path: Path, release: str, major: int) -> None:
    java = _runtime(tmp_path / "jdk", release)
    link = tmp_path / "java"  # /usr/bin/java is a chain of links to the runtime's launcher
    link.symlink_to(java)
    assert java_major(str(link)) == major


def test_java_major_asks_a_runtime_without_a_release_file(tmp_path: Path) -> None:
    java = _runtime(tmp_path / "jdk", None, prints='openjdk version "21.0.2" 2024-01-16')
    assert java_major(str(java)) == 21


def test_java_major_of_something_that_is_not_java_is_none(tmp_path: Path) -> None:
    assert java_major(str(_runtime(tmp_path / "jdk", None, prints="hello"))) is None
    assert java_major(str(tmp_path / "missing")) is None
