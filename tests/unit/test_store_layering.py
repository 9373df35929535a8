"""Storage knows nothing of turn rules: no module of ``turnledger/store`` imports the turn
layer (turn rules, pipeline, execution, session, schemas, api).

The turn layer hands the store plain data (a head's wait deadline, the inbox entries
to write and delete); a store module importing the rules would let them leak back in.
"""

from __future__ import annotations

import ast
from pathlib import Path

import turnledger

#: Modules of the package the storage layer must never import (and their submodules).
FORBIDDEN = ("turnstate", "pipeline", "execution", "session", "schemas", "api")

STORE = Path(turnledger.__file__).parent / "store"


def imported_modules(path: Path) -> set[str]:
    """Every ``turnledger`` module ``path`` imports, as dotted names under the package
    (relative imports resolved against ``turnledger.store``), at any depth of the file."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = ["turnledger", "store"][: 2 - (node.level - 1)]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            found.add(base)
            # ``from .. import turnstate`` names the module in the alias.
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def forbidden_imports(path: Path) -> list[str]:
    """The turn-layer modules (``turnledger.<name>``) ``path`` imports from."""
    bad = set()
    for name in imported_modules(path):
        parts = name.split(".")
        if parts[0] == "turnledger" and len(parts) > 1 and parts[1] in FORBIDDEN:
            bad.add(".".join(parts[:2]))
    return sorted(bad)


def test_the_store_package_has_modules() -> None:
    """The check below looks at real files (a moved package would make it pass vacuously)."""
    assert {"base.py", "codec.py", "inbox.py", "memory.py"} <= {p.name for p in STORE.glob("*.py")}


def test_no_store_module_imports_the_turn_layer() -> None:
    """No module under ``turnledger/store`` imports turnstate, pipeline, execution,
    session, schemas or api, directly, relatively or lazily inside a function."""
    offenders = {
        path.name: bad for path in sorted(STORE.glob("*.py")) if (bad := forbidden_imports(path))
    }
    assert offenders == {}


def test_the_check_sees_every_form_of_import(tmp_path: Path) -> None:
    """The detector itself: relative, absolute, aliased and function-local imports."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from .. import turnstate\n"
        "from ..pipeline import Pipeline\n"
        "import turnledger.session as s\n"
        "def f():\n"
        "    from ..api.app import app\n"
        "from ..models import Head\n"
        "from . import codec\n"
    )
    assert forbidden_imports(sample) == [
        "turnledger.api",
        "turnledger.pipeline",
        "turnledger.session",
        "turnledger.turnstate",
    ]
