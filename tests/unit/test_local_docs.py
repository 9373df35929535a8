"""The local runner's flags and routes as documented cannot drift from the code:
``turnledger local --help``'s flags are exactly the flag tables' of docs/OPERATIONS.md and
docs/API.md, and the runner's local routes (:data:`LOCAL_ROUTES`, which every
``/_local/`` path of its source belongs to) are exactly each documented route list's."""

from __future__ import annotations

import re
from pathlib import Path

from turnledger_local import jobs, runner
from turnledger_local.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
_FLAG = re.compile(r"--[a-z][a-z0-9-]*")
_ROUTE = re.compile(r"\b(GET|POST) (/_local/[a-z/]+)")


def section(path: Path, heading: str) -> str:
    """The text of the section ``heading`` opens, to the next heading of its level."""
    text = path.read_text(encoding="utf-8")
    level = heading.split(" ", 1)[0]
    start = text.index(f"\n{heading}\n")
    end = text.find(f"\n{level} ", start + len(heading) + 2)
    return text[start : end if end != -1 else len(text)]


def first_cells(text: str) -> list[str]:
    """The first cell of every table row in ``text`` (header and rule left out)."""
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    return [row.split(" | ")[0] for row in rows if not row.startswith(("| flag ", "| route "))]


def help_flags() -> set[str]:
    local = build_parser()._subparsers._group_actions[0].choices["local"]  # type: ignore[union-attr]
    return {
        flag for action in local._actions for flag in action.option_strings if flag != "--help"
    } - {"-h"}


def test_the_flag_tables_name_exactly_the_flags_of_local_help() -> None:
    flags = help_flags()
    assert "--memory" in flags and "--provider" in flags
    for path, heading in (
        (ROOT / "docs" / "OPERATIONS.md", "## The local runner"),
        (ROOT / "docs" / "API.md", "## Local runner"),
    ):
        cells = [cell for cell in first_cells(section(path, heading)) if "--" in cell]
        documented = {flag for cell in cells for flag in _FLAG.findall(cell)}
        assert documented == flags, (path.name, documented ^ flags)


def test_the_help_names_every_provider_the_docs_name() -> None:
    local = build_parser()._subparsers._group_actions[0].choices["local"]  # type: ignore[union-attr]
    [provider] = [a for a in local._actions if "--provider" in a.option_strings]
    operations = section(ROOT / "docs" / "OPERATIONS.md", "## The local runner")
    [row] = [line for line in operations.splitlines() if line.startswith("| `--provider")]
    for name in ("demo", "demo-stateful", "openai-chat", "openai-responses", "bedrock-converse"):
        assert name in (provider.help or "") and f"`{name}`" in row


def test_every_local_path_of_the_runner_is_one_of_its_local_routes() -> None:
    paths = {route.split(" ", 1)[1] for route in runner.LOCAL_ROUTES}
    for module in (runner, jobs):
        source = Path(module.__file__ or "").read_text(encoding="utf-8")
        found = set(re.findall(r'"(/_local/[a-z/]*[a-z])"', source))
        assert found <= paths, (module.__name__, found - paths)
    assert len(paths) == 6


def test_every_route_list_names_exactly_the_runners_local_routes() -> None:
    routes = set(runner.LOCAL_ROUTES)
    api = ROOT / "docs" / "API.md"
    glance = section(api, "## Routes at a glance")
    summary = glance[glance.index("The local runner adds") :].split("\n\n")[0]
    lists = {
        "API.md, routes at a glance": summary,
        "API.md, local-only routes": "\n".join(first_cells(section(api, "## Local runner"))),
        "OPERATIONS.md, local routes": "\n".join(
            first_cells(section(ROOT / "docs" / "OPERATIONS.md", "## The local runner"))
        ),
        "turnledger local --help": build_parser()
        ._subparsers._group_actions[0]  # type: ignore[union-attr]
        .choices["local"]
        .epilog,
    }
    for name, text in lists.items():
        documented = {" ".join(match) for match in _ROUTE.findall(text or "")}
        assert documented == routes, (name, documented ^ routes)
