"""The house rules of docs/architecture.md, checked on the import graph of the whole tree.

Every ``import`` and ``from ... import`` of our packages counts, wherever it is written (in a
function, or under ``TYPE_CHECKING``: a circle through a type-only import is still a circle for
whoever reads the code). The rules:

- no import circle anywhere;
- no module imports another package's private module (a ``_name`` module of a package it is not
  inside): a package's public face is its ``__init__``;
- each layer imports only the layers below it (``LAYERS``, the table of docs/architecture.md);
  the outer packages (cli, spark_source, jepsen_like, bench, examples) and the MQTT bridge use
  the cluster through the public client.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Folder -> the dotted name its modules import as (cli/, spark_source/ and jepsen_like/ are
# installed inside the kafkaesque package: pyproject.toml's package-dir).
SOURCES = {
    "kafkaesque": "kafkaesque",
    "cli": "kafkaesque.cli",
    "spark_source": "kafkaesque.spark_source",
    "jepsen_like": "kafkaesque.jepsen_like",
    "bench": "bench",
    "examples": "examples",
}

# Package -> the packages of ours its modules may import (besides their own modules). The
# longest matching prefix of a module's name picks its rule.
LAYERS: dict[str, frozenset[str]] = {
    # A version-2 batch holds a Kafka batch verbatim: storage reads its records with Kafka's codec.
    "kafkaesque.storage": frozenset({"kafkaesque.protocol"}),
    "kafkaesque.fd_stream": frozenset(),
    "kafkaesque.protocol": frozenset(),
    "kafkaesque.security": frozenset({"kafkaesque.protocol"}),
    "kafkaesque.raft": frozenset({"kafkaesque.storage"}),
    "kafkaesque.raft.driver": frozenset(
        {"kafkaesque.raft", "kafkaesque.storage", "kafkaesque.fd_stream"}
    ),
    "kafkaesque.client": frozenset(
        {"kafkaesque.protocol", "kafkaesque.security", "kafkaesque.storage"}
    ),
    "kafkaesque.mqtt_bridge": frozenset({"kafkaesque.client", "kafkaesque.protocol.mqtt"}),
    "kafkaesque.broker": frozenset(
        {
            "kafkaesque.fd_stream",
            "kafkaesque.protocol",
            "kafkaesque.raft",
            "kafkaesque.security",
            "kafkaesque.storage",
        }
    ),
    "kafkaesque.spark_source": frozenset({"kafkaesque.client"}),
    # jepsen_like's corrupting nemesis edits segment files on disk: it needs their format; its
    # power-loss probes add ACLs, whose rows (AclRow) the client takes from the protocol.
    "kafkaesque.jepsen_like": frozenset(
        {
            "kafkaesque.client",
            "kafkaesque.local_cluster",
            "kafkaesque.protocol",
            "kafkaesque.storage",
        }
    ),
}


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int


def module_name(path: Path, root: Path) -> str | None:
    """The dotted name ``path`` imports as, or None outside ``SOURCES``."""
    relative = path.relative_to(root).with_suffix("")
    parts = list(relative.parts)
    prefix = SOURCES.get(parts[0])
    if prefix is None:
        return None
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([prefix, *parts[1:]])


def modules(root: Path) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for folder in SOURCES:
        for path in sorted((root / folder).rglob("*.py")):
            if path.is_symlink() or any(p.is_symlink() for p in path.parents if p != root):
                continue  # a worktree's links to cli/ etc. (the same files, other names)
            name = module_name(path, root)
            if name is not None:
                found[name] = path
    return found


def _targets(name: str, is_package: bool, node: ast.Import | ast.ImportFrom) -> Iterator[str]:
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name
        return
    base = node.module or ""
    if node.level:
        parts = name.split(".") if is_package else name.split(".")[:-1]
        parts = parts[: len(parts) - (node.level - 1)]
        base = ".".join([*parts, *([base] if base else [])])
    for alias in node.names:
        yield f"{base}.{alias.name}"  # a submodule, or a name of module ``base``
    yield base


def imports(known: dict[str, Path]) -> list[Import]:
    """Every import of a known module by a known module (the module itself, or the nearest
    enclosing known package of a name imported from it)."""
    found: set[Import] = set()
    for name, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for target in _targets(name, is_package, node):
                while target and target not in known:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    found.add(Import(name, target, node.lineno))
    # ``from pkg import sub`` also yields ``pkg``: keep the most precise target per line
    precise = {(i.importer, i.line, i.imported) for i in found}
    return sorted(
        (
            i
            for i in found
            if not any(
                other.startswith(i.imported + ".")
                for imp, line, other in precise
                if imp == i.importer and line == i.line
            )
        ),
        key=lambda i: (i.importer, i.line, i.imported),
    )


def circles(edges: Iterable[Import]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    graph: dict[str, set[str]] = {}
    for edge in edges:
        graph.setdefault(edge.importer, set()).add(edge.imported)
        graph.setdefault(edge.imported, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def private_crossings(edges: Iterable[Import]) -> list[Import]:
    """Imports of a private module (``_name``) of a package the importer is not inside."""
    crossing = []
    for edge in edges:
        parts = edge.imported.split(".")
        for depth, part in enumerate(parts):
            if part.startswith("_") and not part.startswith("__"):
                owner = ".".join(parts[:depth])
                if edge.importer != owner and not edge.importer.startswith(owner + "."):
                    crossing.append(edge)
                break
    return crossing


def _rule(module: str) -> tuple[str, frozenset[str]] | None:
    matches = [p for p in LAYERS if module == p or module.startswith(p + ".")]
    if not matches:
        return None
    package = max(matches, key=len)
    return package, LAYERS[package]


def layer_violations(edges: Iterable[Import]) -> list[Import]:
    """Imports a layer's rule in ``LAYERS`` does not allow."""
    bad = []
    for edge in edges:
        rule = _rule(edge.importer)
        if rule is None:
            continue
        package, allowed = rule
        target = edge.imported
        inside = target == package or target.startswith(package + ".")
        if not inside and not any(target == a or target.startswith(a + ".") for a in allowed):
            bad.append(edge)
    return bad


def _shown(edges: list[Import]) -> str:
    return "\n".join(f"  {e.importer}:{e.line} imports {e.imported}" for e in edges)


@pytest.fixture(scope="module")
def graph() -> list[Import]:
    return imports(modules(ROOT))


def test_no_import_circles(graph: list[Import]) -> None:
    found = circles(graph)
    assert not found, "import circles:\n" + "\n".join("  " + " <-> ".join(c) for c in found)


def test_no_private_module_of_another_package_is_imported(graph: list[Import]) -> None:
    found = private_crossings(graph)
    assert not found, "private modules imported from outside their package:\n" + _shown(found)


def test_each_layer_imports_only_the_layers_below_it(graph: list[Import]) -> None:
    found = layer_violations(graph)
    assert not found, "imports across a layer boundary (LAYERS):\n" + _shown(found)


def test_the_outer_packages_use_the_broker_only_through_its_public_face(
    graph: list[Import],
) -> None:
    outer = ("kafkaesque.cli", "kafkaesque.jepsen_like", "kafkaesque.spark_source", "bench")
    found = [
        e
        for e in graph
        if e.importer.startswith(outer)
        and e.imported.startswith(("kafkaesque.broker.", "kafkaesque.raft.driver."))
    ]
    assert not found, "outer packages reaching into the broker or the Raft driver:\n" + _shown(
        found
    )


# -- the checker itself: each rule fails on a tree that breaks it ----------------------------------


def _tree(root: Path, files: dict[str, str]) -> list[Import]:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return imports(modules(root))


def test_the_checker_finds_a_circle_through_a_type_only_import(tmp_path: Path) -> None:
    edges = _tree(
        tmp_path,
        {
            "kafkaesque/__init__.py": "",
            "kafkaesque/broker/__init__.py": "",
            "kafkaesque/broker/_a.py": "from ._b import B\n",
            "kafkaesque/broker/_b.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ._a import A\n"
            ),
            "kafkaesque/broker/_c.py": "from . import _a\n",
        },
    )
    assert circles(edges) == [["kafkaesque.broker._a", "kafkaesque.broker._b"]]


def test_the_checker_finds_private_imports_and_layer_crossings(tmp_path: Path) -> None:
    edges = _tree(
        tmp_path,
        {
            "kafkaesque/__init__.py": "",
            "kafkaesque/storage/__init__.py": "from ._log import Log\n",
            "kafkaesque/storage/_log.py": "def f():\n    from kafkaesque.fd_stream import X\n",
            "kafkaesque/fd_stream.py": "X = 1\n",
            "kafkaesque/raft/__init__.py": "from kafkaesque.storage import Log\n",
            "spark_source/__init__.py": "from kafkaesque.storage._log import Log\n",
        },
    )
    assert [(e.importer, e.imported) for e in private_crossings(edges)] == [
        ("kafkaesque.spark_source", "kafkaesque.storage._log")
    ]
    assert sorted((e.importer, e.imported) for e in layer_violations(edges)) == [
        ("kafkaesque.spark_source", "kafkaesque.storage._log"),
        ("kafkaesque.storage._log", "kafkaesque.fd_stream"),
    ]
