"""The layer's build ships bytecode: Lambda's read-only ``/opt`` never caches a compile.

``layers/turnledger/Makefile`` is what ``sam build`` runs for the layer (``BuildMethod:
makefile``). These tests run its ``library`` and ``bytecode`` steps (not ``dependencies``,
which downloads the arm64 wheels: ``make template`` builds it all in CI and checks the
result with the same :func:`tests.support.layer_bytecode.problems`).
"""

from __future__ import annotations

import importlib.util
import os
import py_compile
import subprocess
import sys
from pathlib import Path

import pytest
from turnledger_local.template import PROJECT_ROOT

from tests.support.layer_bytecode import UNCHECKED_HASH, main, problems

LAYER_SOURCE = PROJECT_ROOT / "layers" / "turnledger"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The layer's ``python/`` folder as its Makefile builds it, without the dependencies."""
    artifacts = tmp_path_factory.mktemp("layer")
    subprocess.run(
        ["make", "--silent", "-o", "dependencies", "build-TurnledgerLayer"],
        cwd=LAYER_SOURCE,
        env={**os.environ, "ARTIFACTS_DIR": str(artifacts), "PYTHON": sys.executable},
        check=True,
        capture_output=True,
    )
    return artifacts / "python"


def test_every_module_of_the_library_ships_bytecode_that_never_checks_its_source(
    built: Path,
) -> None:
    modules = sorted(built.rglob("*.py"))
    assert built / "turnledger" / "runtime.py" in modules
    assert len(modules) == len(list((LAYER_SOURCE / "turnledger").rglob("*.py")))
    assert problems(built) == []


def test_a_checkouts_own_caches_are_not_shipped(built: Path) -> None:
    # Compiled afresh: a developer's timestamp-checked .pyc would be recompiled on Lambda.
    for compiled in built.rglob("*.pyc"):
        assert compiled.read_bytes()[4:8] == UNCHECKED_HASH.to_bytes(4, "little"), compiled


def test_lambdas_python_runs_the_shipped_bytecode_not_the_source(
    built: Path, tmp_path: Path
) -> None:
    # A copy whose sources are all made unimportable: only the bytecode can answer.
    layer = tmp_path / "python"
    subprocess.run(["cp", "-R", str(built), str(layer)], check=True)
    for source in layer.rglob("*.py"):
        source.write_text("raise SystemExit('compiled from source')\n", encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-c", "import turnledger.runtime, turnledger.api.app; print('ran')"],
        env={**os.environ, "PYTHONPATH": str(layer), "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ran"


def _module(root: Path, source: str = "ANSWER = 42\n") -> Path:
    path = root / "mod.py"
    path.write_text(source, encoding="utf-8")
    return path


def _compile_as_the_layer_does(path: Path) -> None:
    py_compile.compile(
        str(path), invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH, doraise=True
    )


def test_the_check_passes_a_module_compiled_as_the_layer_compiles(tmp_path: Path) -> None:
    path = _module(tmp_path)
    _compile_as_the_layer_does(path)
    assert problems(tmp_path) == []
    assert main([str(tmp_path)]) == 0


def test_the_check_finds_a_module_without_bytecode(tmp_path: Path) -> None:
    _module(tmp_path)
    assert problems(tmp_path) == ["mod.py: no mod.cpython-313.pyc"]
    assert main([str(tmp_path)]) == 1


def test_the_check_finds_bytecode_that_checks_its_source_time(tmp_path: Path) -> None:
    path = _module(tmp_path)
    py_compile.compile(str(path), doraise=True)  # the default: timestamp-checked
    assert problems(tmp_path) == [
        "mod.py: mod.cpython-313.pyc is checked against its source (flags 0)"
    ]


def test_the_check_finds_bytecode_of_another_source(tmp_path: Path) -> None:
    path = _module(tmp_path)
    _compile_as_the_layer_does(path)
    _module(tmp_path, "ANSWER = 43\n")
    assert problems(tmp_path) == ["mod.py: mod.cpython-313.pyc was compiled from another source"]


def test_the_check_finds_bytecode_of_another_python(tmp_path: Path) -> None:
    path = _module(tmp_path)
    _compile_as_the_layer_does(path)
    compiled = Path(importlib.util.cache_from_source(str(path)))
    compiled.write_bytes(b"\x00\x00\r\n" + compiled.read_bytes()[4:])
    assert problems(tmp_path) == ["mod.py: mod.cpython-313.pyc is not Python 3.13's"]


def test_the_check_refuses_an_empty_folder(tmp_path: Path) -> None:
    assert problems(tmp_path) == [f"{tmp_path}: no Python module at all"]
