"""What every command that talks to the cluster takes: ``--bootstrap`` and the security options
(``--tls``, ``--tls-ca``, ``--user``, ``--password``, ``--sasl-mechanism``), the client they make,
and the errors such a command raises for the user's input.

Below both ``client_commands`` and ``security_commands`` (the ACL commands are client commands
too), so that neither imports the other.

A password is never prompted for (scripts and CI have no terminal): it comes from ``--password``
or ``$KAFKAESQUE_PASSWORD`` (better: not in the process list). See docs/security.md.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kafkaesque.client import Client

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
BOOTSTRAP_ENV = "KAFKAESQUE_BOOTSTRAP"
PASSWORD_ENV = "KAFKAESQUE_PASSWORD"
USER_ENV = "KAFKAESQUE_USER"


class SecurityCommandError(Exception):
    """A security command was used wrongly or could not finish; the message says why."""


# --- The client commands' security options ----------------------------------------------------


def add_security_options(parser: argparse.ArgumentParser) -> None:
    """``--tls``, ``--tls-ca``, ``--tls-cert``, ``--user``, ``--password``, ``--sasl-mechanism``."""
    group = parser.add_argument_group(
        "security", "TLS and authentication (the broker's --client-tls and --users-file)"
    )
    group.add_argument(
        "--tls",
        action="store_true",
        help="connect with TLS, trusting the system's CAs (or --tls-ca's)",
    )
    group.add_argument(
        "--tls-ca", metavar="FILE", help="connect with TLS, trusting this CA (PEM); implies --tls"
    )
    group.add_argument(
        "--tls-cert", metavar="FILE", help="present this client certificate (PEM, with its key)"
    )
    group.add_argument(
        "--user",
        default=os.environ.get(USER_ENV) or None,
        metavar="NAME",
        help=f"authenticate as NAME (${USER_ENV}); the password comes from --password or "
        f"${PASSWORD_ENV}",
    )
    group.add_argument(
        "--password",
        default=None,
        help=f"the user's password (default ${PASSWORD_ENV}; never prompted for)",
    )
    group.add_argument(
        "--sasl-mechanism",
        default="SCRAM-SHA-256",
        choices=("SCRAM-SHA-256", "PLAIN"),
        type=str.upper,
        help="SCRAM-SHA-256 (default: no password on the wire) or PLAIN (only with TLS)",
    )


def security_from_args(args: argparse.Namespace) -> Any:
    """The ``kafkaesque.client.Security`` the options name (``SecurityCommandError`` if they
    cannot work: a user without a password, PLAIN without TLS, an unreadable file)."""
    from kafkaesque.client import Security

    tls = bool(getattr(args, "tls", False) or getattr(args, "tls_ca", None))
    tls = tls or bool(getattr(args, "tls_cert", None))
    user = getattr(args, "user", None)
    password = getattr(args, "password", None) or os.environ.get(PASSWORD_ENV)
    if user and password is None:
        raise SecurityCommandError(
            f"--user {user} needs a password: --password, or set ${PASSWORD_ENV}"
        )
    protocol = ("SASL_" if user else "") + ("SSL" if tls else "PLAINTEXT")
    try:
        return Security(
            protocol=protocol,
            sasl_mechanism=getattr(args, "sasl_mechanism", None) or "SCRAM-SHA-256",
            username=user or None,
            password=password if user else None,
            ssl_cafile=getattr(args, "tls_ca", None),
            ssl_certfile=getattr(args, "tls_cert", None),
        )
    except ValueError as exc:
        raise SecurityCommandError(str(exc)) from exc


class ClientCommandError(Exception):
    """A client command was used wrongly or could not finish; the message says why."""


def bootstrap_option(parser: argparse.ArgumentParser) -> None:
    """``--bootstrap`` and the security options (``--tls-ca``, ``--user``...: see
    ``add_security_options``), which every command that talks to the cluster takes."""
    parser.add_argument(
        "--bootstrap",
        default=os.environ.get(BOOTSTRAP_ENV) or DEFAULT_BOOTSTRAP,
        metavar="HOST:PORT,...",
        help=f"brokers to start from (${BOOTSTRAP_ENV}, else {DEFAULT_BOOTSTRAP})",
    )
    add_security_options(parser)


def client_from_args(args: argparse.Namespace) -> Client:
    """A client of ``--bootstrap``, connecting as the security options say."""
    from kafkaesque.client import Client, ClientConfig  # here: `kafkaesque user` needs none

    try:
        security = security_from_args(args)
    except SecurityCommandError as exc:
        raise ClientCommandError(str(exc)) from exc
    try:
        return Client(args.bootstrap, config=ClientConfig(security=security))
    except ValueError as exc:
        raise ClientCommandError(f"--bootstrap: {exc}") from exc


def format_option(parser: argparse.ArgumentParser) -> None:
    """``--format text|json`` of a command that prints tables."""
    parser.add_argument(
        "--format",
        choices=("text", "json"),
        default="text",
        help="text (tables, the default) or json (one document: lists of objects whose keys are "
        "the columns in lower case; - is null)",
    )


def cell(value: object) -> str:
    """A table cell: ``-`` for None (nothing there), ``yes``/``no`` for a bool, a list's items
    joined by ``,``."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, tuple | list):  # replicas, a member's partitions
        return ",".join(map(str, value)) or "-"
    return str(value)


def table_json(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[dict[str, object]]:
    """A table as ``--format json`` has it: an object a row, keyed by the columns in lower case."""
    keys = [name.lower() for name in header]
    return [dict(zip(keys, row, strict=True)) for row in rows]


def print_json(document: object) -> None:
    """Print ``document`` as JSON on stdout (indented, for people; ``jq`` reads it either way)."""
    print(json.dumps(document, indent=2))


def print_table(
    args: argparse.Namespace, header: Sequence[str], rows: Sequence[Sequence[object]]
) -> None:
    """One table, as ``--format`` asks: text columns, or a JSON list (``table_json``)."""
    if getattr(args, "format", "text") == "json":
        print_json(table_json(header, rows))
    else:
        for line in text_table(header, rows):
            print(line)


def text_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    """Left-aligned columns, two spaces apart, header first (cells as ``cell`` writes them)."""
    cells = [list(header), *([cell(c) for c in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
