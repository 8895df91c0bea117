"""Entry point of the ``kafkaesque`` command: parses arguments and runs one subcommand.

Errors are printed as one clear line on stderr with a non-zero exit status; a traceback means a
bug in Kafkaesque, not in the user's input.

Starting is cheap: ``kafkaesque --help`` and ``--version`` import no subcommand module, and a
command imports only its own module (the broker's, the demo's and ``jepsen``'s pull in trio, the
broker or matplotlib, which take a second to import). The table ``COMMANDS`` names each command's
module and holds the one-line summary ``kafkaesque --help`` lists (a module's own ``help=`` is
only seen by a parser built with every module); ``tests/cli/test_main.py`` checks that the table
names exactly the commands the modules register.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from kafkaesque import __version__


class Command(NamedTuple):
    """A subcommand: the module (relative to this package) that registers it, and its summary."""

    module: str
    help: str


COMMANDS: dict[str, Command] = {
    "broker": Command(".broker", "run one broker"),
    "cluster": Command(".cluster", "run a local cluster of brokers"),
    "demo": Command(
        ".demo", "run the end-to-end demo: MQTT phones -> replicated log -> controller -> Spark"
    ),
    "devices": Command(
        ".devices", "simulate MQTT devices publishing readings, and report what reached the log"
    ),
    "topic": Command(".client_commands", "create, list, describe or delete topics"),
    "group": Command(
        ".client_commands", "list, describe, reset the offsets of or delete consumer groups"
    ),
    "produce": Command(
        ".client_commands",
        "publish stdin (or a file), one record per line, with a batching producer; "
        "records without --key go to the partitions in turn (round-robin)",
    ),
    "consume": Command(
        ".client_commands",
        "print a topic's records, one value per line (or --format), waiting for new ones "
        "until Ctrl-C (-e: exit at the end)",
    ),
    "latest": Command(
        ".client_commands",
        "print the newest value of a key in a compacted topic (LATEST), e.g. a device's last "
        "heartbeat",
    ),
    "status": Command(
        ".client_commands",
        "brokers (up or down), then every partition's leader, replicas, offsets and "
        "state (ok, under-replicated, no-leader)",
    ),
    "acl": Command(".security_commands", "add, remove or list the cluster's ACLs"),
    "user": Command(
        ".security_commands",
        "add, remove, list or import the users of a users file (salted SCRAM hashes)",
    ),
    "completion": Command(".completion", "print a shell completion script (bash or zsh)"),
    "jepsen": Command(".jepsen", "run a fault-injection test and check its history"),
    "mqtt-bridge": Command(
        ".mqtt_bridge", "bridge an existing MQTT broker into log topics (and back)"
    ),
}

# The errors a command raises for the user's input or the cluster's state: printed as one line.
# (module, class name): a class whose module was never imported cannot have been raised, so
# ``main`` looks them up in sys.modules instead of importing every command to catch them.
USER_ERRORS: tuple[tuple[str, str], ...] = (
    ("kafkaesque.client._errors", "KafkaesqueError"),
    (".broker", "BrokerCommandError"),
    ("kafkaesque.local_cluster", "ClusterError"),
    (".demo", "DemoError"),
    (".devices", "DevicesError"),
    (".client_options", "ClientCommandError"),
    (".client_options", "SecurityCommandError"),
    ("kafkaesque.jepsen_like.runner", "JepsenError"),
    (".mqtt_bridge", "MqttBridgeError"),
)


def _absolute(module: str) -> str:
    """The full name of ``module``, which may be relative to this package (".demo")."""
    return f"{__package__}{module}" if module.startswith(".") else module


def _register(commands: argparse._SubParsersAction[argparse.ArgumentParser], module: str) -> None:
    """Import ``module`` and let it register its command(s) on ``commands``."""
    loaded = importlib.import_module(module, __package__)
    register = getattr(loaded, "add_parser", None) or loaded.add_parsers
    register(commands)


def build_parser(load: Iterable[str] | None = None) -> argparse.ArgumentParser:
    """The ``kafkaesque`` parser, with full subparsers for the commands in ``load`` (None: all).

    Every other command is listed by name and help only, without importing its module; parsing
    its arguments needs it loaded (``main`` loads the command it is given).
    """
    wanted = {COMMANDS[name].module for name in (COMMANDS if load is None else load)}
    parser = argparse.ArgumentParser(
        prog="kafkaesque",
        description="A Raft-replicated, partitioned log broker.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    registered: set[str] = set()
    for name, command in COMMANDS.items():
        if name in registered:
            continue
        if command.module in wanted:
            # a module may register several commands (client_commands: topic, produce, ...)
            _register(commands, command.module)
            registered |= {n for n, c in COMMANDS.items() if c.module == command.module}
        else:
            commands.add_parser(name, help=command.help, add_help=False)
            registered.add(name)
    return parser


def _command_in(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` names: its first argument that is not an option, if known.

    The top-level parser has no option that takes a value, so the first non-option is the
    command; an unknown one is left to argparse, which says which commands exist.
    """
    first = next((arg for arg in argv if not arg.startswith("-")), None)
    return first if first in COMMANDS else None


def user_error_types() -> tuple[type[Exception], ...]:
    """The classes of ``USER_ERRORS`` whose modules are imported (the others were not raised)."""
    found: list[type[Exception]] = []
    for module, name in USER_ERRORS:
        loaded = sys.modules.get(_absolute(module))
        if loaded is not None:
            found.append(getattr(loaded, name))
    return tuple(found)


INTERNAL_ERROR_EXIT = 70
"""The exit status of an unexpected exception (sysexits' EX_SOFTWARE): a bug, said in one line."""

BROKEN_PIPE_EXIT = 141
"""The exit status when stdout's reader went away (``status | head``): 128 + SIGPIPE, as cat's."""

TRACEBACK_ENV = "KAFKAESQUE_TRACEBACK"
"""Set (to anything) to let an unexpected exception's traceback through, for a bug report."""


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's final flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout already closed or not a real file: nothing to flush
        pass


def main(argv: list[str] | None = None) -> int:
    """Run one command; every outcome is an exit status and at most one line on stderr.

    The user's errors (the classes of ``USER_ERRORS``, and the OS's: a refused connection, a
    missing file) exit 1; Ctrl-C 130; a closed stdout (``| head``) ``BROKEN_PIPE_EXIT``, silently;
    anything else is a bug, said in one line with ``INTERNAL_ERROR_EXIT`` (``TRACEBACK_ENV`` shows
    its traceback). argparse's usage errors exit 2, as argparse does.
    """
    if argv is None:
        argv = sys.argv[1:]
    command = _command_in(argv)
    name = f"kafkaesque {command}" if command else "kafkaesque"
    try:
        parser = build_parser([command] if command else [])
        args = parser.parse_args(argv)
        result: int = args.run(args)
        sys.stdout.flush()  # inside the handler: a broken pipe shows at this flush, if not before
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        _silence_stdout()
        return BROKEN_PIPE_EXIT
    except SystemExit:
        raise  # argparse's --help (0) and usage errors (2), already printed
    except user_error_types() as exc:  # evaluated when an exception is raised, after run
        print(f"{name}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # the user's environment: a refused connection, a missing file
        print(
            f"{name}: {exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else ""),
            file=sys.stderr,
        )
        return 1
    except Exception as exc:
        if os.environ.get(TRACEBACK_ENV):
            raise
        print(
            f"{name}: internal error: {type(exc).__name__}: {exc} (a bug in Kafkaesque; "
            f"{TRACEBACK_ENV}=1 shows the traceback)",
            file=sys.stderr,
        )
        return INTERNAL_ERROR_EXIT
    return result


if __name__ == "__main__":
    raise SystemExit(main())
