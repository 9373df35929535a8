"""The run of a turn has one owner, read from the source with :mod:`ast` (issue 40).

* **One commit site.** In :mod:`turnledger.turn`, a session's ``commit()`` (a call of
  ``.commit`` with no argument) is made in one place only: the runner's
  (:meth:`turnledger.turn.runner.TurnRunner.commit`). Everything else commits through it.
* **One admission.** One ``admit`` function (:mod:`turnledger.turn.admission`) asks the
  admission questions; every entry that acts on a conversation calls an ``admit``, and no
  module of the turn layer asks one of the questions itself (``refuse_if_running``,
  ``refuse_if_spent``, ``refuse_new_turn``, or a ``life.admit``).
* **Modules by job.** No module of the layer is over :data:`MAX_LINES` lines, but for the
  pydantic definitions of ``core/models.py``.

The checkers take sources, not files, so the last test proves each can fail.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "layers" / "turnledger" / "turnledger"
MAX_LINES = 800
#: Modules allowed over :data:`MAX_LINES`: the pydantic definitions may stay one module.
LONG_BY_DESIGN = {"core/models.py"}
#: The one place that commits, as ``module:Class.function``.
COMMIT_SITE = "turn/runner.py:TurnRunner.commit"
#: Where the admission questions are asked (and, for the lifecycle, defined).
ADMISSION = "turn/admission.py"
QUESTIONS = {"refuse_if_running", "refuse_if_spent", "refuse_new_turn"}
#: Every entry that acts on a conversation, as ``module:qualified name``: each calls ``admit``.
ENTRIES = (
    "turn/pipeline.py:Conversations._turn",
    "turn/pipeline.py:Conversations._approve",
    "turn/pipeline.py:Conversations.append",
    "turn/pipeline.py:Conversations.compact",
    "turn/pipeline.py:Conversations._settle_callback",
    "turn/pipeline.py:Conversations.expire_waits",
    "turn/longturns.py:accept",
)


def _functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    """Every function of ``tree`` by qualified name (``Class.method`` or ``function``)."""
    found: dict[str, ast.FunctionDef] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.FunctionDef):
                found[f"{prefix}{child.name}"] = child
                visit(child, f"{prefix}{child.name}.")

    visit(tree, "")
    return found


def _called(node: ast.AST) -> list[tuple[str, ast.Call]]:
    """The calls of ``node``'s own code (not of functions defined inside it), each with the
    name called (``f`` or the ``.attr``)."""
    calls = []
    todo = list(ast.iter_child_nodes(node))
    while todo:
        child = todo.pop()
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        if isinstance(child, ast.Call):
            func = child.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            calls.append((name, child))
        todo.extend(ast.iter_child_nodes(child))
    return sorted(calls, key=lambda found: found[1].lineno)


def commit_sites(sources: dict[str, str]) -> list[str]:
    """Where a session is committed (``.commit()``, no argument), as ``module:function``."""
    return [
        f"{name}:{qualified}"
        for name, source in sorted(sources.items())
        if name.startswith("turn/")
        for qualified, function in _functions(ast.parse(source)).items()
        for called, call in _called(function)
        if called == "commit"
        and isinstance(call.func, ast.Attribute)
        and not call.args
        and not call.keywords
    ]


def admission_faults(sources: dict[str, str]) -> list[str]:
    """What breaks the one admission: a second ``admit`` function, an entry that calls no
    ``admit``, or a question asked outside the admission module."""
    faults = []
    defined = [
        f"{name}:{qualified}"
        for name, source in sorted(sources.items())
        if name.startswith("turn/")
        for qualified, _ in _functions(ast.parse(source)).items()
        if qualified == "admit"
    ]
    if defined != [f"{ADMISSION}:admit"]:
        faults.append(f"admission functions: {defined}")
    trees = {name: ast.parse(source) for name, source in sources.items()}
    for entry in ENTRIES:
        module, qualified = entry.split(":")
        function = _functions(trees[module]).get(qualified) if module in trees else None
        if function is None:
            faults.append(f"{entry}: no such entry")
        elif not any(called == "admit" for called, _ in _called(function)):
            faults.append(f"{entry}: calls no admit")
    for name, tree in sorted(trees.items()):
        if not name.startswith("turn/") or name in (ADMISSION, "turn/lifecycle.py"):
            continue
        for called, call in _called_anywhere(tree):
            func = call.func
            # An admit of the session or its state machine, not the runner's (which is
            # the admission module's).
            asked_aside = (
                called == "admit"
                and isinstance(func, ast.Attribute)
                and ast.unparse(func.value).split(".")[-1] in {"session", "machine"}
            )
            if called in QUESTIONS or asked_aside:
                faults.append(f"{name}:{call.lineno}: asks {ast.unparse(func)} itself")
    return faults


def _called_anywhere(tree: ast.Module) -> list[tuple[str, ast.Call]]:
    return [
        (
            call.func.attr
            if isinstance(call.func, ast.Attribute)
            else getattr(call.func, "id", ""),
            call,
        )
        for call in ast.walk(tree)
        if isinstance(call, ast.Call)
    ]


def long_modules(sources: dict[str, str]) -> list[str]:
    """The modules over :data:`MAX_LINES` lines, but those long by design."""
    return sorted(
        name
        for name, source in sources.items()
        if name not in LONG_BY_DESIGN and len(source.splitlines()) > MAX_LINES
    )


def _package() -> dict[str, str]:
    return {
        path.relative_to(PACKAGE).as_posix(): path.read_text()
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def test_the_runner_is_the_one_commit_site_of_the_turn_layer() -> None:
    assert commit_sites(_package()) == [COMMIT_SITE]


def test_every_entry_is_admitted_by_the_one_admission_function() -> None:
    assert admission_faults(_package()) == []


def test_no_module_of_the_layer_is_over_800_lines() -> None:
    assert long_modules(_package()) == []


def test_the_checks_see_a_second_commit_a_skipped_admission_and_a_long_module() -> None:
    sources = _package()
    runner = sources["turn/runner.py"]
    # A second commit, in a module of its own and as a step of the runner.
    extra = "def sneak(session):\n    session.commit()\n"
    assert commit_sites({**sources, "turn/extra.py": extra}) == [
        "turn/extra.py:sneak",
        COMMIT_SITE,
    ]
    assert commit_sites({**sources, "turn/runner.py": runner + "\n\n" + extra}) == sorted(
        [COMMIT_SITE, "turn/runner.py:sneak"]
    )
    # The store's own commit (with arguments) is not a session's.
    assert commit_sites({"turn/x.py": "def f(store):\n    store.commit(key, head=1)\n"}) == []
    # An entry that no longer calls admit, a second admit, and a question asked aside.
    pipeline = sources["turn/pipeline.py"]
    skipped = pipeline.replace("run.admit(session, Rules(settled=True))", "pass", 1)
    assert skipped != pipeline
    assert any(
        "calls no admit" in f for f in admission_faults({**sources, "turn/pipeline.py": skipped})
    )
    second = "def admit(head):\n    return None\n"
    assert admission_faults({**sources, "turn/other.py": second}) == [
        f"admission functions: ['{ADMISSION}:admit', 'turn/other.py:admit']"
    ]
    aside = (
        "def f(session, now):\n"
        "    refuse_if_running(session.head, now)\n"
        "    session.machine.admit(now)\n"
    )
    faults = admission_faults({**sources, "turn/aside.py": aside})
    assert [f for f in faults if f.startswith("turn/aside.py")] == [
        "turn/aside.py:2: asks refuse_if_running itself",
        "turn/aside.py:3: asks session.machine.admit itself",
    ]
    # A module one line over the limit.
    assert long_modules(
        {"turn/x.py": "x = 1\n" * (MAX_LINES + 1), "core/models.py": "\n" * 900}
    ) == ["turn/x.py"]
