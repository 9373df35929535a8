"""HTTP stays at the edge: what the package's modules may import, read from their source.

* Only ``turnledger.api`` (the HTTP edge) imports ``turnledger.api`` and the HTTP request
  and response models; the service takes domain commands and returns domain results.
* ``turnledger.api`` has no import cycle (route modules import the resolver; one module
  imports every route module to register them).
* The sweep and export/import are services the composition root (``turnledger.runtime``)
  wires: they never import it.

Every import counts, also one inside a function or under ``TYPE_CHECKING``: each is a
dependency of the module all the same.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[2] / "layers" / "turnledger" / "turnledger"
PACKAGE = "turnledger"
API = f"{PACKAGE}.api"
#: Where the HTTP request and response models lived before they moved into ``api``.
OLD_SCHEMAS = f"{PACKAGE}.schemas"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(PACKAGE_ROOT.rglob("*.py"))}


def imports_of(name: str, source: str, known: set[str], *, is_package: bool) -> set[str]:
    """The modules ``name`` imports (absolute names; ``from x import y`` counts ``x.y``
    when that is a module of ``known``)."""
    found: set[str] = set()
    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            found.add(target)
            for alias in node.names:
                if f"{target}.{alias.name}" in known:
                    found.add(f"{target}.{alias.name}")
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {
        name: imports_of(name, path.read_text(), known, is_package=path.name == "__init__.py")
        for name, path in modules.items()
    }


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def test_the_reader_resolves_relative_and_lazy_imports() -> None:
    source = (
        "from .. import runtime\n"
        "from ..schemas import TurnRequest\n"
        "def f():\n"
        "    from . import app\n"
        "    import turnledger.sweep\n"
    )
    known = {"turnledger.runtime", "turnledger.api.app", "turnledger.schemas"}
    found = imports_of("turnledger.api.waits", source, known, is_package=False)
    assert {
        "turnledger.runtime",
        "turnledger.schemas",
        "turnledger.api.app",
        "turnledger.sweep",
    } <= found


def test_only_the_api_imports_the_api_and_the_http_models() -> None:
    offenders = sorted(
        f"{module} imports {target}"
        for module, targets in _graph().items()
        if not _within(module, API)
        for target in targets
        if _within(target, API) or _within(target, OLD_SCHEMAS)
    )
    assert offenders == []


def test_no_http_models_outside_the_api() -> None:
    assert OLD_SCHEMAS not in _modules(), "the HTTP models live in turnledger.api"


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` (its modules in import order, the first repeated), or None."""
    done: set[str] = set()
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if (cycle := visit(target)) is not None:
                return cycle
        path.pop()
        done.add(node)
        return None

    for start in sorted(graph):
        if (cycle := visit(start)) is not None:
            return cycle
    return None


def test_the_cycle_finder_finds_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_the_api_has_no_import_cycle() -> None:
    api = {
        module: {t for t in targets if _within(t, API) and t != API}
        for module, targets in _graph().items()
        if _within(module, API)
    }
    assert find_cycle(api) is None


@pytest.mark.parametrize("service", [f"{PACKAGE}.sweep", f"{PACKAGE}.transfer"])
def test_services_do_not_import_the_composition_root(service: str) -> None:
    imported = _graph()[service]
    assert not any(_within(target, f"{PACKAGE}.runtime") for target in imported)
