"""Check that a built layer ships the bytecode Lambda's Python runs without its sources.

Lambda mounts a layer read-only at ``/opt``: a module without a valid ``.pyc`` beside it is
compiled again on every cold start. ``layers/turnledger/Makefile`` compiles each module
with ``--invalidation-mode unchecked-hash`` (PEP 552), the one mode whose ``.pyc`` is used
whatever the file times the zip kept. This module checks that every ``.py`` under a folder
has such a ``.pyc`` of this interpreter's version, made from that very source.

Standard library only: ``make template`` runs it on ``sam build``'s output with the bare
``python3.13``: ``python3.13 tests/support/layer_bytecode.py DIR``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

#: The flags word of a hash-based ``.pyc`` whose source is never checked (PEP 552).
UNCHECKED_HASH = 0b01


def problems(root: Path) -> list[str]:
    """What is wrong with the bytecode under ``root``: one line per module, none if it is whole."""
    sources = sorted(root.rglob("*.py"))
    if not sources:
        return [f"{root}: no Python module at all"]
    version = f"Python {sys.version_info[0]}.{sys.version_info[1]}"
    found: list[str] = []
    for source in sources:
        compiled = Path(importlib.util.cache_from_source(str(source)))
        name = source.relative_to(root)
        if not compiled.is_file():
            found.append(f"{name}: no {compiled.name}")
            continue
        header = compiled.read_bytes()[:16]
        flags = int.from_bytes(header[4:8], "little")
        if header[:4] != importlib.util.MAGIC_NUMBER:
            found.append(f"{name}: {compiled.name} is not {version}'s")
        elif flags != UNCHECKED_HASH:
            found.append(f"{name}: {compiled.name} is checked against its source (flags {flags})")
        elif header[8:16] != importlib.util.source_hash(source.read_bytes()):
            found.append(f"{name}: {compiled.name} was compiled from another source")
    return found


def main(argv: list[str]) -> int:
    """Exit 1, listing them, when any module under the one argument lacks its bytecode."""
    if len(argv) != 1:
        print("usage: layer_bytecode.py LAYER_PYTHON_DIR", file=sys.stderr)
        return 2
    root = Path(argv[0])
    found = problems(root)
    for line in found[:20]:
        print(line, file=sys.stderr)
    if found:
        print(f"{root}: {len(found)} module(s) without their bytecode", file=sys.stderr)
        return 1
    print(f"{root}: every module ships its bytecode ({len(list(root.rglob('*.py')))} modules)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
