"""Security commands: ``kafkaesque acl add|remove|list`` (the cluster's ACLs, through a broker)
and ``kafkaesque user add|remove|list|import`` (a users file of salted SCRAM hashes, on disk:
brokers reread it within a second of a change). The security options every client command
takes (``--tls``, ``--tls-ca``, ``--user``, ``--password``, ``--sasl-mechanism``) are
``client_options``'.

A password is never prompted for (scripts and CI have no terminal): it comes from ``--password``
or ``$KAFKAESQUE_PASSWORD`` (better: not in the process list). See docs/security.md.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from .client_options import (
    PASSWORD_ENV,
    SecurityCommandError,
    bootstrap_option,
    client_from_args,
    format_option,
    print_table,
)

# --- kafkaesque acl ---------------------------------------------------------------------------


def add_parsers(commands: Any) -> None:
    """Register ``acl`` and ``user`` on ``commands``."""
    _add_acl(commands)
    _add_user(commands)


def _client_options(parser: argparse.ArgumentParser) -> None:
    bootstrap_option(parser)  # with the security options


def _acl_fields(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--principal",
        required=True,
        help="User:<name>, or User:* for every principal (a bare name means User:<name>)",
    )
    permission = parser.add_mutually_exclusive_group()
    permission.add_argument(
        "--allow", dest="permission", action="store_const", const="allow", help="(the default)"
    )
    permission.add_argument(
        "--deny", dest="permission", action="store_const", const="deny", help="deny wins over allow"
    )
    parser.add_argument(
        "--operation",
        required=True,
        type=str.lower,
        choices=(
            "read",
            "write",
            "create",
            "delete",
            "alter",
            "describe",
            "commit",
            "admin",
            "all",
        ),
    )
    resource = parser.add_mutually_exclusive_group(required=True)
    resource.add_argument("--topic", metavar="NAME", help="a topic (* for every topic)")
    resource.add_argument("--group", metavar="NAME", help="a consumer group (* for every group)")
    resource.add_argument(
        "--cluster", action="store_true", help="the cluster (admin, alter, describe)"
    )
    parser.add_argument(
        "--prefixed", action="store_true", help="NAME is a prefix: every topic or group it starts"
    )


def _add_acl(commands: Any) -> None:
    acl = commands.add_parser(
        "acl",
        help="add, remove or list the cluster's ACLs",
        description="Who may do what (docs/security.md). Once any ACL exists, what no ACL "
        "allows is refused (NOT_AUTHORIZED); a deny wins over any allow.",
    )
    actions = acl.add_subparsers(dest="action", required=True, metavar="ACTION")
    add = actions.add_parser("add", help="add an ACL")
    _acl_fields(add)
    add.set_defaults(run=run_acl_add)
    remove = actions.add_parser("remove", help="remove an ACL (the same fields as add)")
    _acl_fields(remove)
    remove.set_defaults(run=run_acl_remove)
    listing = actions.add_parser("list", help="list the ACLs")
    listing.add_argument("--principal", help="only those naming this principal")
    listing.set_defaults(run=run_acl_list)
    format_option(listing)
    for parser in (add, remove, listing):
        _client_options(parser)


def _principal(text: str) -> str:
    from kafkaesque.protocol import PRINCIPAL_PREFIX, principal_error

    principal = text if text.startswith(PRINCIPAL_PREFIX) else PRINCIPAL_PREFIX + text
    reason = principal_error(principal)
    if reason is not None:
        raise SecurityCommandError(f"--principal {text!r}: {reason}")
    return principal


def acl_from_args(args: argparse.Namespace) -> Any:
    """The ``AclRow`` that ``acl add``/``acl remove``'s options name."""
    from kafkaesque.protocol import (
        CLUSTER_RESOURCE_NAME,
        AclOperation,
        AclPattern,
        AclPermission,
        AclResource,
        AclRow,
        acl_name_error,
    )

    if args.cluster:
        resource, name = AclResource.CLUSTER, CLUSTER_RESOURCE_NAME
    elif args.topic is not None:
        resource, name = AclResource.TOPIC, args.topic
    else:
        resource, name = AclResource.GROUP, args.group
    pattern = AclPattern.PREFIXED if args.prefixed else AclPattern.LITERAL
    reason = acl_name_error(resource, pattern, name)
    if reason is not None:
        raise SecurityCommandError(f"--{resource.value} {name!r}: {reason}")
    return AclRow(
        _principal(args.principal),
        AclPermission(args.permission or "allow"),
        AclOperation(args.operation),
        resource,
        pattern,
        name,
    )


def _acl_words(acl: Any) -> str:
    return " ".join(
        (acl.principal, acl.permission, acl.operation, acl.resource, acl.pattern, acl.name)
    )


def run_acl_add(args: argparse.Namespace) -> int:
    acl = acl_from_args(args)
    with client_from_args(args) as client:
        client.add_acl(acl)
    print(f"added: {_acl_words(acl)}")
    return 0


def run_acl_remove(args: argparse.Namespace) -> int:
    acl = acl_from_args(args)
    with client_from_args(args) as client:
        removed = client.remove_acl(acl)
    print(f"removed: {_acl_words(acl)}" if removed else f"no such ACL: {_acl_words(acl)}")
    return 0


def run_acl_list(args: argparse.Namespace) -> int:
    principal = None if args.principal is None else _principal(args.principal)
    with client_from_args(args) as client:
        acls = client.list_acls(principal)
    if not acls and args.format == "text":
        print("no ACLs: every principal may do everything" if principal is None else "no ACLs")
        return 0
    rows = [
        (a.principal, str(a.permission), str(a.operation), str(a.resource), str(a.pattern), a.name)
        for a in sorted(acls, key=_acl_words)
    ]
    header = ("PRINCIPAL", "PERMISSION", "OPERATION", "RESOURCE", "PATTERN", "NAME")
    print_table(args, header, rows)
    return 0


# --- kafkaesque user --------------------------------------------------------------------------


def _add_user(commands: Any) -> None:
    user = commands.add_parser(
        "user",
        help="add, remove, list or import the users of a users file (salted SCRAM hashes)",
        description="Manage a broker's --users-file: one salted SCRAM-SHA-256 hash per user, "
        "never a password. Brokers reread the file within a second of a change.",
    )
    actions = user.add_subparsers(dest="action", required=True, metavar="ACTION")
    add = actions.add_parser("add", help="add a user, or set a user's password")
    add.add_argument("name")
    add.add_argument(
        "--password", help=f"the password (default ${PASSWORD_ENV}; never prompted for)"
    )
    add.add_argument(
        "--iterations", type=int, default=4096, help="PBKDF2 iterations (4096, the least)"
    )
    add.set_defaults(run=run_user_add)
    remove = actions.add_parser("remove", help="remove a user")
    remove.add_argument("name")
    remove.set_defaults(run=run_user_remove)
    listing = actions.add_parser("list", help="the users' names")
    listing.set_defaults(run=run_user_list)
    imports = actions.add_parser(
        "import",
        help="hash an old plaintext user:password file (MQTT's) into a users file",
    )
    imports.add_argument("old", metavar="OLD", help="the plaintext file (user:password lines)")
    imports.set_defaults(run=run_user_import)
    for parser in (add, remove, listing, imports):
        parser.add_argument("--users-file", required=True, metavar="FILE", help="the users file")


def _load(path: str, *, missing_ok: bool) -> dict[str, Any]:
    from kafkaesque.security import UsersFileError, load_users

    if missing_ok and not os.path.exists(path):
        return {}
    try:
        return load_users(path)
    except UsersFileError as exc:
        raise SecurityCommandError(str(exc)) from exc


def _save(path: str, users: dict[str, Any]) -> None:
    from kafkaesque.security import save_users

    try:
        save_users(path, users)
    except (OSError, ValueError) as exc:
        raise SecurityCommandError(f"{path}: cannot write the users file: {exc}") from exc


def run_user_add(args: argparse.Namespace) -> int:
    from kafkaesque.security import MIN_ITERATIONS, check_username, derive_credential

    password = args.password if args.password is not None else os.environ.get(PASSWORD_ENV)
    if not password:
        raise SecurityCommandError(f"give the password: --password, or set ${PASSWORD_ENV}")
    if args.iterations < MIN_ITERATIONS:
        raise SecurityCommandError(f"--iterations must be at least {MIN_ITERATIONS}")
    try:
        check_username(args.name)
    except ValueError as exc:
        raise SecurityCommandError(str(exc)) from exc
    users = _load(args.users_file, missing_ok=True)
    existed = args.name in users
    users[args.name] = derive_credential(password, iterations=args.iterations)
    _save(args.users_file, users)
    print(f"{'updated' if existed else 'added'} user {args.name} in {args.users_file}")
    return 0


def run_user_remove(args: argparse.Namespace) -> int:
    users = _load(args.users_file, missing_ok=False)
    if args.name not in users:
        raise SecurityCommandError(f"{args.users_file}: no user {args.name!r}")
    del users[args.name]
    _save(args.users_file, users)
    print(f"removed user {args.name} from {args.users_file}")
    return 0


def run_user_list(args: argparse.Namespace) -> int:
    for name in sorted(_load(args.users_file, missing_ok=False)):
        print(name)
    return 0


def run_user_import(args: argparse.Namespace) -> int:
    from kafkaesque.security import UsersFileError, import_plaintext

    try:
        with open(args.old, encoding="utf-8") as f:
            imported = import_plaintext(f.read().splitlines())
    except OSError as exc:
        raise SecurityCommandError(f"{args.old}: {exc.strerror or exc}") from exc
    except (UsersFileError, UnicodeDecodeError) as exc:
        raise SecurityCommandError(f"{args.old}: {exc}") from exc
    same = os.path.exists(args.users_file) and os.path.samefile(args.old, args.users_file)
    users = {} if same else _load(args.users_file, missing_ok=True)
    clashes = sorted(set(users) & set(imported))
    users.update(imported)
    _save(args.users_file, users)
    print(
        f"imported {len(imported)} user(s) from {args.old} into {args.users_file}"
        + (f" (replaced: {', '.join(clashes)})" if clashes else "")
    )
    return 0
