"""The vocabulary stays in one place: the drawings that name things list every one of them.

Two drifts, each read from the code with ``ast`` (nothing is imported) and proven able to
fail on a made-up name:

* every key prefix and sort key of ``turnledger/store/keys.py`` (a module constant named
  ``*_PREFIX`` or ``*_SK``, and the inbox's ``ENTRY_PREFIX``) appears in the layout table
  of docs/STORAGE.md ("Items");
* every error class of ``turnledger/core/exceptions.py`` appears in the exceptions tree
  drawn in that module's docstring.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DIR = ROOT / "layers" / "turnledger" / "turnledger"
STORAGE = ROOT / "docs" / "STORAGE.md"


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def _string_constants(path: Path, suffixes: tuple[str, ...]) -> dict[str, str]:
    """Module-level constants of ``path`` named ``*<suffix>``, with their string value (an
    f-string of earlier constants is resolved)."""
    found: dict[str, str] = {}
    for node in _tree(path).body:
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target = node.targets[0]
        if not isinstance(target, ast.Name) or not target.id.endswith(suffixes):
            continue
        value = node.value
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            found[target.id] = value.value
        elif isinstance(value, ast.JoinedStr):
            parts = []
            for part in value.values:
                if isinstance(part, ast.Constant):
                    parts.append(str(part.value))
                elif isinstance(part, ast.FormattedValue) and isinstance(part.value, ast.Name):
                    parts.append(found[part.value.id])
            found[target.id] = "".join(parts)
    return found


def key_prefixes() -> dict[str, str]:
    """Every sort key and key prefix the store writes, by constant name."""
    prefixes = _string_constants(PACKAGE_DIR / "store" / "keys.py", ("_PREFIX", "_SK"))
    prefixes.update(_string_constants(PACKAGE_DIR / "store" / "inbox.py", ("ENTRY_PREFIX",)))
    return prefixes


def layout_keys(text: str) -> list[str]:
    """The keys named (in backticks) in the first column of the "Items" table of ``text``."""
    section = text.split("\n## Items\n", 1)[1].split("\n## ", 1)[0]
    cells = [line.split("|")[1] for line in section.splitlines() if line.startswith("| ")]
    return [key for cell in cells for key in re.findall(r"`([^`]+)`", cell)]


def missing_from_layout(prefixes: dict[str, str], text: str) -> list[str]:
    """The constants whose value no key of the layout table starts with (or contains, for
    a partition key's part such as ``#memory#``)."""
    named = layout_keys(text)
    return sorted(
        name
        for name, prefix in prefixes.items()
        if not any(key.startswith(prefix) or prefix in key for key in named)
    )


def error_classes() -> list[str]:
    """The public exception classes of core/exceptions.py."""
    return [
        node.name
        for node in _tree(PACKAGE_DIR / "core" / "exceptions.py").body
        if isinstance(node, ast.ClassDef) and not node.name.startswith("_")
    ]


def missing_from_tree(classes: list[str], docstring: str) -> list[str]:
    """The classes the drawn tree does not name."""
    drawn = set(re.findall(r"[├└]── (\w+)", docstring)) | {"TurnledgerError"}
    return sorted(name for name in classes if name not in drawn)


def test_every_key_prefix_is_in_the_layout_table() -> None:
    """docs/STORAGE.md's table lists every kind of key the store writes."""
    prefixes = key_prefixes()
    assert {"EVENT_PREFIX", "HEAD_SK", "ENTRY_PREFIX", "SIDE_PREFIX"} <= set(prefixes)
    assert missing_from_layout(prefixes, STORAGE.read_text(encoding="utf-8")) == []


def test_a_prefix_missing_from_the_table_is_named() -> None:
    """The check can fail: a made-up prefix no row names is reported."""
    text = STORAGE.read_text(encoding="utf-8")
    assert missing_from_layout({"NEW_PREFIX": "Z#"}, text) == ["NEW_PREFIX"]
    assert missing_from_layout({"EVENT_PREFIX": "E#"}, text) == []


def test_every_error_class_is_in_the_exceptions_tree() -> None:
    """The tree drawn in core/exceptions.py's docstring names every error class."""
    docstring = ast.get_docstring(_tree(PACKAGE_DIR / "core" / "exceptions.py")) or ""
    classes = error_classes()
    assert {"ConversationBusy", "ForkTooDeep", "InvalidForkPoint"} <= set(classes)
    assert missing_from_tree(classes, docstring) == []


def test_an_error_missing_from_the_tree_is_named() -> None:
    """The check can fail: a class the tree does not draw is reported."""
    docstring = ast.get_docstring(_tree(PACKAGE_DIR / "core" / "exceptions.py")) or ""
    assert missing_from_tree(["ConversationBusy", "BrandNewError"], docstring) == ["BrandNewError"]
