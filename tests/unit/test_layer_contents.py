"""The Lambda layer holds what Lambda runs: no local runner, no local-only dependency.

``template.yaml`` ships everything under ``layers/turnledger/`` as the layer, so a
module there that imports the local runner (``turnledger_local``) or one of its
extras (moto, PyYAML, not installed on Lambda) would either fail on Lambda or drag
the runner back in. Every import is checked, including the ones inside functions.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from turnledger_local.template import PROJECT_ROOT

LAYER_ROOT = PROJECT_ROOT / "layers" / "turnledger"
LAYER_PACKAGE = LAYER_ROOT / "turnledger"
FUNCTIONS = PROJECT_ROOT / "functions"
#: Top-level modules that only the local runner and the tests may import.
LOCAL_ONLY = frozenset({"turnledger_local", "moto", "yaml"})


def _imported_roots(path: Path) -> set[str]:
    """The top-level module of every import statement in ``path``, at any depth."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def _shipped_modules() -> list[Path]:
    return sorted([*LAYER_ROOT.rglob("*.py"), *FUNCTIONS.rglob("*.py")])


def test_the_layer_has_modules_to_check() -> None:
    # Guards the walk below: an empty list would make the import check vacuous.
    assert (LAYER_PACKAGE / "api" / "app.py") in _shipped_modules()
    assert len(_shipped_modules()) > 20


@pytest.mark.parametrize("path", _shipped_modules(), ids=lambda p: str(p.relative_to(PROJECT_ROOT)))
def test_no_shipped_module_imports_local_only_code(path: Path) -> None:
    assert _imported_roots(path).isdisjoint(LOCAL_ONLY), (
        f"{path.relative_to(PROJECT_ROOT)} imports {_imported_roots(path) & LOCAL_ONLY}"
    )


def test_the_local_runner_is_outside_the_layer() -> None:
    import turnledger_local

    assert not (LAYER_PACKAGE / "local").exists()
    runner_dir = Path(turnledger_local.__file__).resolve().parent
    assert LAYER_ROOT not in runner_dir.parents


def test_the_import_scan_sees_deferred_imports(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "import os\n"
        "def f():\n"
        "    import yaml.constructor\n"
        "    from turnledger_local.runner import LocalRunner\n"
        "from . import sibling\n",
        encoding="utf-8",
    )
    assert _imported_roots(module) == {"os", "yaml", "turnledger_local"}
