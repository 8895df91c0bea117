"""``kafkaesque completion bash|zsh``: print a shell completion script for the command.

Load it with ``source <(kafkaesque completion bash)`` (bash) or
``source <(kafkaesque completion zsh)`` (zsh), or save it where the shell looks for completions.
The script is made from the parser itself (every command, action and option), so it cannot
fall behind the commands; it completes command names, actions (``topic create``) and options.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any

SHELLS = ("bash", "zsh")


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "completion",
        help="print a shell completion script (bash or zsh)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("shell", choices=SHELLS, help="the shell the script is for")
    parser.set_defaults(run=run)


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The subcommands ``parser`` has (name -> its parser), or none."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _words(parser: argparse.ArgumentParser) -> list[str]:
    """What may follow ``parser``'s command: its subcommands, the choices of its positionals
    (``broker stop``), then its options."""
    words = list(_subparsers(parser))
    for action in parser._actions:
        if not action.option_strings and action.choices and not _subparsers(parser):
            words += [str(choice) for choice in action.choices]
        words += [o for o in action.option_strings if o.startswith("--") or len(o) == 2]
    return words


def completion_table() -> dict[str, list[str]]:
    """``"" -> commands``, ``"topic" -> actions and options``, ``"topic create" -> options``."""
    from .main import build_parser  # here, not at the top: main loads this module by name

    top = build_parser()
    table = {"": [*_subparsers(top), "--help", "--version"]}
    for name, command in _subparsers(top).items():
        table[name] = _words(command)
        for action, sub in _subparsers(command).items():
            table[f"{name} {action}"] = _words(sub)
    return table


def bash_script() -> str:
    """A bash completion function for ``kafkaesque`` (also run by zsh through bashcompinit)."""
    cases = []
    table = completion_table()
    # The most specific first: "topic create" before "topic *"; a command's own words apply
    # after any positional that is not one of its actions (e.g. ``consume <topic> --``).
    for key in sorted(table, key=lambda k: (-k.count(" "), k)):
        if not key:
            continue
        pattern = f'"{key}"' if " " in key else f'"{key} "*'
        cases.append(f"        {pattern}) words={shlex.quote(' '.join(table[key]))} ;;")
    commands = shlex.quote(" ".join(table[""]))
    return "\n".join(
        [
            "# kafkaesque completion (bash); made by `kafkaesque completion bash`",
            "_kafkaesque() {",
            '    local cur="${COMP_WORDS[COMP_CWORD]}" cmd="" sub="" w words',
            '    for w in "${COMP_WORDS[@]:1:COMP_CWORD-1}"; do',
            "        case $w in",
            "            -*) ;;",
            '            *) if [ -z "$cmd" ]; then cmd=$w; elif [ -z "$sub" ]; then sub=$w; fi ;;',
            "        esac",
            "    done",
            '    case "$cmd $sub" in',
            f'        " ") words={commands} ;;',
            *cases,
            '        *) words="" ;;',
            "    esac",
            '    COMPREPLY=($(compgen -W "$words" -- "$cur"))',
            "}",
            "complete -o default -F _kafkaesque kafkaesque",
            "",
        ]
    )


def zsh_script() -> str:
    """The bash function, loaded through zsh's bashcompinit (zsh's own bash-compatibility)."""
    return (
        "# kafkaesque completion (zsh); made by `kafkaesque completion zsh`\n"
        "autoload -U +X compinit && compinit\n"
        "autoload -U +X bashcompinit && bashcompinit\n" + bash_script()
    )


def run(args: argparse.Namespace) -> int:
    sys.stdout.write(bash_script() if args.shell == "bash" else zsh_script())
    return 0
