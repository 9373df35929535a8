"""The package's folders are its layers: imports point down, never up, and never round.

Every module of ``turnledger`` is parsed (never imported) and each of its imports
becomes an edge between two modules. Three rules:

* **direction**: a module may import its own folder and the layers below it
  (:data:`LAYERS`), never a layer above, nor a sibling folder of its own layer.
  Every import counts here, including the ones inside functions and under
  ``TYPE_CHECKING``: a deferred or type-only import of a higher layer still ties
  the lower one to it;
* **no cycles** between modules, over the imports that run when a module is
  imported or called (``TYPE_CHECKING``-only imports are left out: they never run,
  and they are the usual way to name a type of a module that imports you);
* **a docstring** opens every module, saying what it owns.

:data:`ALLOWED_TODAY` would list an upward edge the code has, each with what
removes it; it is empty, and an allowed edge that is gone fails the test too, so
the list can only shrink.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[2] / "layers" / "turnledger" / "turnledger"
PACKAGE = "turnledger"
#: The local runner, outside the layer: its modules must not import each other round either.
LOCAL_DIR = PACKAGE_DIR.parents[1] / "local" / "turnledger_local"

#: The layers, lowest first. A module's layer is its first folder under the package
#: (``turnledger.turn.pipeline`` -> ``turn``), or its own name at the root
#: (``turnledger.runtime`` -> ``runtime``; the package itself is ``""``). Folders of one
#: layer must not import each other.
LAYERS: tuple[frozenset[str], ...] = (
    # The vocabulary (models, errors, settings, deadline, observability); the package
    # root (its version).
    frozenset({"", "core"}),
    # Storage and the model providers: neither knows the other.
    frozenset({"store", "providers"}),
    # Tools (their specs are the providers' ToolSpec) and the working context (built
    # into the providers' Message list).
    frozenset({"tools", "context"}),
    # The turn: its owner (lifecycle), the service, its execution, drafts, long turns.
    frozenset({"turn"}),
    # Operations beside turns: sweep and erasure, export/import, notifications.
    frozenset({"ops"}),
    # The composition root: builds the store, providers, tools and the services.
    frozenset({"runtime"}),
    # The entry points: the HTTP edge (api/) and the sweep function's (handlers.py).
    frozenset({"api", "handlers"}),
)

#: Upward edges the code has today, as (importer, imported, why it is there / the fix).
#: Remove an entry when its edge is gone; the goal is an empty set (it is).
ALLOWED_TODAY: frozenset[tuple[str, str]] = frozenset()

#: Edges left out of the cycle check today, as (importer, imported); empty, and it stays so.
CYCLE_EDGES_ALLOWED_TODAY: frozenset[tuple[str, str]] = frozenset()


@dataclass(frozen=True)
class Edge:
    """One import: ``source`` imports ``target`` at ``line``."""

    source: str
    target: str
    line: int
    type_only: bool

    def where(self) -> str:
        path = PACKAGE_DIR.parent / (self.source.replace(".", "/"))
        file = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        return f"{file.relative_to(PACKAGE_DIR.parents[2])}:{self.line}"


def module_name(path: Path, root: Path = PACKAGE_DIR) -> str:
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    """Every module of the package, by dotted name."""
    return {
        module_name(p): p for p in sorted(PACKAGE_DIR.rglob("*.py")) if "__pycache__" not in p.parts
    }


def _type_checking_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                for sub in ast.walk(inner):
                    if isinstance(sub, ast.stmt):
                        lines.add(sub.lineno)
    return lines


def edges_of(name: str, path: Path, known: set[str], package: str = PACKAGE) -> Iterator[Edge]:
    """The imports of module ``name`` into ``package``, resolved to modules in ``known``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    type_only = _type_checking_lines(tree)
    here = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = here.split(".")
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            # ``from pkg import mod`` imports the module; ``from mod import name`` the module.
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            if target != package and not target.startswith(package + "."):
                continue
            while target not in known and "." in target:
                target = target.rpartition(".")[0]
            if target in known and target != name:
                yield Edge(name, target, node.lineno, node.lineno in type_only)


def all_edges() -> list[Edge]:
    found = modules()
    known = set(found)
    return sorted(
        {e for name, path in found.items() for e in edges_of(name, path, known)},
        key=lambda e: (e.source, e.line, e.target),
    )


def group_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def rank_of(group: str) -> int:
    for rank, groups in enumerate(LAYERS):
        if group in groups:
            return rank
    raise AssertionError(f"folder or root module {group!r} is in no layer of LAYERS")


def upward(edge: Edge) -> bool:
    """Whether ``edge`` points to a higher layer or across folders of one layer."""
    source, target = group_of(edge.source), group_of(edge.target)
    if source == target:
        return False
    return rank_of(target) >= rank_of(source)


def cycles(edges: list[Edge]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.source, set()).add(e.target)
        graph.setdefault(e.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_folder_and_root_module_has_a_layer() -> None:
    groups = {group_of(m) for m in modules()}
    assert len(groups) >= 8, groups  # the walk found the package
    for group in groups:
        rank_of(group)


def test_no_import_points_up() -> None:
    found = [e for e in all_edges() if upward(e)]
    unexpected = [e for e in found if (e.source, e.target) not in ALLOWED_TODAY]
    report = "\n".join(
        f"  {e.where()}: {e.source} ({group_of(e.source) or 'root'}) imports {e.target} "
        f"({group_of(e.target) or 'root'}){' [TYPE_CHECKING]' if e.type_only else ''}"
        for e in unexpected
    )
    assert not unexpected, f"imports from a higher layer or a sibling folder:\n{report}"


def test_allowed_upward_edges_still_exist() -> None:
    # An edge that was removed must leave ALLOWED_TODAY, so the set only shrinks.
    present = {(e.source, e.target) for e in all_edges() if upward(e)}
    gone = sorted(ALLOWED_TODAY - present)
    assert not gone, f"remove from ALLOWED_TODAY (no longer imported): {gone}"


def test_allowed_cycle_edges_still_exist() -> None:
    present = {(e.source, e.target) for e in all_edges()}
    gone = sorted(CYCLE_EDGES_ALLOWED_TODAY - present)
    assert not gone, f"remove from CYCLE_EDGES_ALLOWED_TODAY (no longer imported): {gone}"


def test_no_import_cycles() -> None:
    edges = [
        e
        for e in all_edges()
        if not e.type_only and (e.source, e.target) not in CYCLE_EDGES_ALLOWED_TODAY
    ]
    found = cycles(edges)
    lines = []
    for component in found:
        members = set(component)
        lines.append("  cycle: " + ", ".join(component))
        lines.extend(
            f"    {e.where()}: {e.source} -> {e.target}"
            for e in edges
            if e.source in members and e.target in members
        )
    assert not found, "import cycles between modules:\n" + "\n".join(lines)


@pytest.mark.parametrize("name", sorted(modules()))
def test_every_module_opens_with_a_docstring(name: str) -> None:
    tree = ast.parse(modules()[name].read_text(encoding="utf-8"))
    docstring = ast.get_docstring(tree)
    assert docstring and docstring.strip(), f"{name} has no opening docstring"


def test_the_checks_see_an_upward_edge_and_a_cycle(tmp_path: Path) -> None:
    # Guards the scan itself: relative, absolute, deferred and type-only imports are
    # all edges, and a two-module loop is a cycle.
    edge = Edge("turnledger.store.base", "turnledger.turn.session", 1, False)
    assert upward(edge)
    assert upward(Edge("turnledger.store.base", "turnledger.providers.base", 1, False))
    assert not upward(Edge("turnledger.turn.pipeline", "turnledger.store.base", 1, False))
    loop = [
        Edge("turnledger.a", "turnledger.b", 1, False),
        Edge("turnledger.b", "turnledger.a", 1, False),
        Edge("turnledger.b", "turnledger.c", 2, False),
    ]
    assert cycles(loop) == [["turnledger.a", "turnledger.b"]]
    module = tmp_path / "m.py"
    module.write_text(
        '"""m."""\n'
        "from typing import TYPE_CHECKING\n"
        "from ..core import models\n"
        "from turnledger.turn.session import Session\n"
        "if TYPE_CHECKING:\n"
        "    from ..api import app\n"
        "def f():\n"
        "    from ..runtime import get_runtime\n",
        encoding="utf-8",
    )
    known = {
        "turnledger.core",
        "turnledger.core.models",
        "turnledger.turn.session",
        "turnledger.api.app",
        "turnledger.runtime",
    }
    found = {(e.target, e.type_only) for e in edges_of("turnledger.store.m", module, known)}
    assert found == {
        ("turnledger.core.models", False),
        ("turnledger.turn.session", False),
        ("turnledger.api.app", True),
        ("turnledger.runtime", False),
    }


def local_cycles(root: Path) -> list[list[str]]:
    """The import cycles between the modules of the local runner found under ``root``
    (``TYPE_CHECKING``-only imports left out, deferred ones counted)."""
    found = {
        module_name(p, root): p for p in sorted(root.rglob("*.py")) if "__pycache__" not in p.parts
    }
    edges = [
        e
        for name, path in found.items()
        for e in edges_of(name, path, set(found), package=root.name)
        if not e.type_only
    ]
    return cycles(edges)


def test_no_two_modules_of_the_local_runner_import_each_other() -> None:
    assert len(list(LOCAL_DIR.glob("*.py"))) > 8  # the runner is read, not an empty glob
    assert local_cycles(LOCAL_DIR) == []


def test_the_check_sees_a_cycle_in_the_local_runner(tmp_path: Path) -> None:
    # Two commands that reach each other's helpers inside functions are a cycle; a
    # type-only import back is not.
    root = tmp_path / "turnledger_local"
    root.mkdir()
    (root / "__init__.py").write_text('"""p."""\n', encoding="utf-8")
    (root / "a_cli.py").write_text(
        '"""a."""\ndef run():\n    from .b_cli import helper\n', encoding="utf-8"
    )
    (root / "b_cli.py").write_text(
        '"""b."""\ndef helper():\n    from turnledger_local.a_cli import run\n',
        encoding="utf-8",
    )
    (root / "c_cli.py").write_text(
        '"""c."""\nfrom typing import TYPE_CHECKING\nfrom . import a_cli\n'
        "if TYPE_CHECKING:\n    from .d_cli import D\n",
        encoding="utf-8",
    )
    (root / "d_cli.py").write_text('"""d."""\nfrom .c_cli import x\n', encoding="utf-8")
    assert local_cycles(root) == [["turnledger_local.a_cli", "turnledger_local.b_cli"]]
