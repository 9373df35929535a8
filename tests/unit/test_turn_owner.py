"""Only the turn's owners write a status or move a call: the tables
(:mod:`turnledger.turn.lifecycle`) and the state machine that makes their moves
(:mod:`turnledger.turn.machine`).

Read from the source with :mod:`ast`, so a new module that sets a conversation's
status, a call's state or a draft's status itself fails here, with where it does.
Reading one is fine (a store tells a tombstone from a head); writing is not:

* naming a :class:`~turnledger.core.models.ConversationStatus` member other than
  ``CLEARED`` (the storage's own tombstone, written by clear and the sweep);
* a call-state or status literal given as ``state=``/``status=``, or under a
  ``"state"``/``"status"`` key, or assigned to ``.state``/``.status``/``.phase``;
* a ``commit`` of a session given anything: the status is derived, never passed.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import get_args

from turnledger.core.models import CallState, ConversationStatus
from turnledger.turn.lifecycle import DraftStatus

PACKAGE = Path(__file__).resolve().parents[2] / "layers" / "turnledger" / "turnledger"
#: Where statuses are defined (models) and owned (the tables, and the state machine).
OWNERS = {"lifecycle.py", "machine.py", "models.py"}
#: Values that are statuses of a conversation, a call or a draft.
STATUS_VALUES = (
    {s.value for s in ConversationStatus} | set(get_args(CallState)) | set(get_args(DraftStatus))
) - {"complete"}  # "complete" is also a plain word of answers built from the derived status


def _violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[str] = []

    def flag(node: ast.AST, what: str) -> None:
        found.append(f"{path.relative_to(PACKAGE)}:{getattr(node, 'lineno', '?')}: {what}")

    def is_status_literal(node: ast.AST | None) -> bool:
        return isinstance(node, ast.Constant) and node.value in STATUS_VALUES

    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "ConversationStatus"
            and node.attr != "CLEARED"
        ):
            flag(node, f"names ConversationStatus.{node.attr}")
        elif isinstance(node, ast.keyword) and node.arg in ("state", "status"):
            if is_status_literal(node.value):
                flag(node, f"passes {node.arg}={ast.unparse(node.value)}")
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if (
                    isinstance(key, ast.Constant)
                    and key.value in ("state", "status")
                    and is_status_literal(value)
                ):
                    flag(node, f"sets {key.value!r}: {ast.unparse(value)}")
        elif isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if (
                    isinstance(target, ast.Attribute)
                    and target.attr in ("state", "status", "phase")
                    and is_status_literal(node.value)
                ):
                    flag(node, f"assigns .{target.attr} = {ast.unparse(node.value)}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "commit"
            and isinstance(node.func.value, ast.Attribute | ast.Name)
            and ast.unparse(node.func.value).endswith("session")
            and (node.args or node.keywords)
        ):
            flag(node, "passes something to a session's commit")
    return found


def test_only_the_turns_owner_writes_a_status() -> None:
    modules = [p for p in sorted(PACKAGE.rglob("*.py")) if p.name not in OWNERS]
    assert len(modules) > 40  # the whole package is read, not an empty glob
    found = [line for path in modules for line in _violations(path)]
    assert found == [], "statuses written outside the lifecycle:\n" + "\n".join(found)


def test_the_check_sees_a_status_written_elsewhere(tmp_path: Path) -> None:
    # The check itself must be able to fail: each way of writing a status is caught.
    sample = PACKAGE / "_sample_for_test.py"
    source = (
        "from .models import ConversationStatus\n"
        "def f(session, pending):\n"
        "    session.commit(ConversationStatus.COMPLETE)\n"
        "    pending.model_copy(update={'state': 'ready'})\n"
        "    pending.state = 'rejected'\n"
        "    make(status='awaiting_approval')\n"
    )
    try:
        sample.write_text(source)
        found = _violations(sample)
    finally:
        sample.unlink()
    assert len(found) == 5, found
