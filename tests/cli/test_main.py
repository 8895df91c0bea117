"""The ``kafkaesque`` entry point: a cheap start, ``--version``, and one line per user error."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from kafkaesque.cli.main import COMMANDS, USER_ERRORS, build_parser, main

# Modules that take most of a second to import; none is needed to list the commands.
HEAVY = ("trio", "kafkaesque.broker", "kafkaesque.jepsen_like", "matplotlib", "pyspark", "numpy")


def _modules_after(argv: list[str], env: dict[str, str] | None = None) -> list[str]:
    """The modules a fresh interpreter has imported after ``main(argv)``, our own and heavy ones."""
    code = (
        "import json, sys\n"
        "from kafkaesque.cli.main import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(json.dumps(sorted(sys.modules)), file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={**os.environ, **(env or {})},
    )
    names: list[str] = json.loads(done.stderr.splitlines()[-1])
    return names


def _heavy(modules: list[str]) -> list[str]:
    return [m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY)]


@pytest.mark.parametrize("argv", [["--help"], ["--version"]])
def test_help_and_version_import_no_command_module(argv: list[str]) -> None:
    modules = _modules_after(argv)
    assert _heavy(modules) == []
    commands = sorted({c.module for c in COMMANDS.values()})
    assert [m for m in modules if m in {f"kafkaesque.cli{c}" for c in commands}] == []
    assert "kafkaesque.client" not in modules


def test_the_demo_s_help_and_preflight_import_nothing_heavy(tmp_path: Path) -> None:
    """A demo that lacks a piece says so before it loads (or starts) anything."""
    assert _heavy(_modules_after(["demo", "--help"])) == []
    lacking_java = {"JAVA_HOME": str(tmp_path)}
    modules = _modules_after(["demo", "--quick", "--data-dir", str(tmp_path)], lacking_java)
    assert "kafkaesque.cli.demo" in modules
    assert _heavy(modules) == []


@pytest.mark.parametrize("argv", [["topic", "--help"], ["status", "--help"]])
def test_a_command_imports_neither_the_broker_nor_the_plots(argv: list[str]) -> None:
    heavy = _heavy(_modules_after(argv))
    assert [m for m in heavy if not m.startswith("trio")] == []  # the client runs on trio


def test_the_command_table_names_exactly_the_commands_the_modules_register() -> None:
    """A command missing from ``COMMANDS`` could not be run: ``main`` would not load its module."""
    every = build_parser()  # every module loaded: their own parsers
    commands = next(a for a in every._subparsers._group_actions if a.dest == "command")
    assert list(commands.choices) == list(COMMANDS)


def test_help_lists_every_command_with_its_summary(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    listed = " ".join(capsys.readouterr().out.split())  # argparse wraps long summaries
    for name, command in COMMANDS.items():
        assert f"{name} {command.help}" in listed


def test_every_user_error_names_an_exception_class() -> None:
    for module, name in USER_ERRORS:
        loaded = importlib.import_module(module, "kafkaesque.cli")
        assert issubclass(getattr(loaded, name), Exception), (module, name)


def test_version_is_the_installed_distribution_s(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"kafkaesque {importlib.metadata.version('kafkaesque')}\n"


def test_a_user_error_of_a_command_loaded_on_demand_is_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["topic", "create", "bad name", "--partitions", "1", "--replication-factor", "1"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("kafkaesque topic: invalid topic name 'bad name'")
    assert err.count("\n") == 1


def test_a_command_s_options_are_parsed_by_its_own_parser() -> None:
    args = build_parser(["status"]).parse_args(["status", "--group", "g", "--topic", "t"])
    assert (args.command, args.group, args.topic) == ("status", "g", "t")


def test_an_unknown_command_lists_the_known_ones(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["nosuch"])
    assert exit_.value.code == 2
    assert "invalid choice: 'nosuch' (choose from 'broker', 'cluster'" in capsys.readouterr().err
