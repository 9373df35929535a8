"""Every shell example of README.md and docs/*.md, replayed in the order written against the
local runner, first on a fresh data folder and then again on the same, now filled, folder
(as ``make run`` keeps ``.data/`` between runs): each answer must be what the text shows.

What a block holds (```sh, ```bash, ```console or ```shell fences):

* a session: ``$ command`` lines, each followed by the output it shows; or plain commands,
  each followed by the output it shows as ``# `` comment lines;
* a command is replayed when it is ``curl`` to ``localhost:3000`` (or ``127.0.0.1:3000``),
  a variable assignment (``H='...'``, kept for the rest of the file), or ``make run`` with
  at most ``ARGS='...'`` (the runner restarts with those flags on the same data folder).
  Anything else (``make test``, ``sam``, ``open``, a real model's keys) is not run;
* the output shown is compared with the answer, white space ignored, ``...`` standing for
  anything; with ``curl -i``, headers the text leaves out may sit between its lines;
* a curl command shown with no output must succeed (``--fail-with-body``);
* ``<!-- replay: skip (why) -->`` on the line before a fence leaves that block out; the
  reason is required.

Each file starts on a runner as ``make run`` starts it (no flags).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import pytest
from turnledger_local.cli import build_parser, config_from_args
from turnledger_local.runner import LocalRunner

pytestmark = pytest.mark.http

ROOT = Path(__file__).resolve().parents[2]
SHELLS = {"sh", "bash", "console", "shell"}
_FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w-]*)\s*$")
_SKIP = re.compile(r"<!--\s*replay:\s*skip\s*\((?P<why>[^)]+)\)\s*-->")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=\S")
_LOCAL = re.compile(r"(?:https?://)?(?:localhost|127\.0\.0\.1):3000")
_MAKE_RUN = re.compile(r"^make run(?: ARGS=(?P<args>'[^']*'|\"[^\"]*\"|\S+))?\s*(?:#.*)?$")


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@dataclasses.dataclass
class Step:
    """One command of a block and the output the text shows for it."""

    where: str
    command: str
    expected: list[str]

    @property
    def line(self) -> int:
        """The line number of the command in its file."""
        return int(self.where.rsplit(":", 1)[1])


def blocks(path: Path) -> Iterator[tuple[int, list[str]]]:
    """``(line number, lines)`` of each shell block not marked to skip, dedented."""
    lines = path.read_text(encoding="utf-8").splitlines()
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        indent = len(opening["indent"])
        end = index + 1
        while end < len(lines) and not lines[end].strip().startswith("```"):
            end += 1
        before = next((line for line in reversed(lines[:index]) if line.strip()), "")
        if opening["lang"] in SHELLS and not _SKIP.search(before):
            yield index + 1, [line[indent:] for line in lines[index + 1 : end]]
        index = end + 1


def steps(path: Path) -> Iterator[Step]:
    """Every command of the file's shell blocks, in order, with the output shown for it."""
    for first, lines in blocks(path):
        session = any(line.startswith("$ ") for line in lines)
        index = 0
        while index < len(lines):
            line = lines[index]
            is_command = (
                line.startswith("$ ")
                if session
                else bool(line.strip()) and not (line.lstrip().startswith("#"))
            )
            if not is_command:
                index += 1
                continue
            where = f"{path.relative_to(ROOT)}:{first + index + 1}"
            command = line.removeprefix("$ ") if session else line
            while command.rstrip().endswith("\\") and index + 1 < len(lines):
                index += 1
                command = command.rstrip()[:-1].rstrip() + " " + lines[index].strip()
            index += 1
            expected: list[str] = []
            while index < len(lines):
                follower = lines[index]
                if session and follower.startswith("$ "):
                    break
                if not session and not follower.lstrip().startswith("#"):
                    break
                expected.append(follower if session else follower.lstrip()[1:])
                index += 1
            yield Step(where, command.strip(), [e for e in expected if e.strip()])


def _is_assignment(command: str) -> bool:
    """``NAME=value`` alone: no command runs (``NAME=value make run`` is a command)."""
    try:
        words = shlex.split(command, comments=True)
    except ValueError:
        return False
    return len(words) == 1 and _ASSIGNMENT.match(words[0]) is not None and "$(" not in command


def shown(expected: list[str], actual: str, headers: bool) -> bool:
    """Whether ``actual`` is what ``expected`` shows (white space ignored, ``...`` = any)."""
    parts = [re.escape("".join(line.split())).replace(r"\.\.\.", ".*?") for line in expected]
    pattern = (".*?" if headers else "").join(parts)
    flags = re.DOTALL | (re.IGNORECASE if headers else 0)
    return re.fullmatch(pattern, "".join(actual.split()), flags) is not None


class Replay:
    """Runs a file's steps against a runner on ``data_dir``, restarting it as ``make run``
    lines say; collects every difference from the text."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.runner: LocalRunner | None = None
        self.failures: list[str] = []
        self.ran = 0

    def start(self, args: list[str]) -> None:
        self.stop()
        argv = ["local", *args, "--port", "0", "--data-dir", str(self.data_dir)]
        self.runner = LocalRunner(config_from_args(build_parser().parse_args(argv)))
        self.runner.start()

    def stop(self) -> None:
        if self.runner is not None:
            self.runner.stop()
            self.runner = None

    def file(self, path: Path, args: Sequence[str] = (), lines: range | None = None) -> None:
        """Replay ``path`` on a runner started with ``args``; with ``lines``, only the
        commands of those lines (and every assignment before them) are run."""
        self.start(list(args))
        prelude: list[str] = []
        for step in steps(path):
            if lines is not None and step.line not in lines:
                if step.line < lines.start and _is_assignment(step.command):
                    prelude.append(step.command)
                continue
            made = _MAKE_RUN.match(step.command)
            if made is not None:
                self.start(shlex.split(shlex.split(made["args"])[0]) if made["args"] else [])
            elif _is_assignment(step.command):
                prelude.append(step.command)
            elif step.command.startswith("curl ") and _LOCAL.search(step.command):
                self.curl(step, prelude)

    def curl(self, step: Step, prelude: list[str]) -> None:
        assert self.runner is not None
        command = _LOCAL.sub(self.runner.url, step.command)
        if not step.expected:
            command = command.replace("curl ", "curl --fail-with-body ", 1)
        script = "\n".join([*prelude, command])
        self.ran += 1
        done = subprocess.run(
            ["bash", "-c", script],
            capture_output=True,
            text=True,
            timeout=90,
            cwd=ROOT,
            env={**os.environ, "NO_PROXY": "*"},
        )
        flags = command.split("http", 1)[0]
        headers = re.search(r"\s-[a-zA-Z]*i", flags) is not None
        if done.returncode != 0:
            self.failures.append(
                f"{step.where}: {step.command}\n  exit {done.returncode}: "
                f"{done.stdout[-500:]}{done.stderr[-500:]}"
            )
        elif step.expected and not shown(
            [_LOCAL.sub(self.runner.url, line) for line in step.expected], done.stdout, headers
        ):
            self.failures.append(
                f"{step.where}: {step.command}\n  shows:  {' '.join(step.expected)[:700]}"
                f"\n  answer: {done.stdout[:700]}"
            )


def test_every_shell_example_answers_as_written_fresh_and_on_a_filled_data_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)  # `make run` serves from the project's folder (events/...)
    replay = Replay(tmp_path / "data")
    try:
        for run in ("fresh", "again"):
            for path in documents():
                before = len(replay.failures)
                replay.file(path)
                replay.failures[before:] = [f"[{run}] {f}" for f in replay.failures[before:]]
    finally:
        replay.stop()
    assert replay.ran > 20, "the examples were not found"
    assert not replay.failures, "\n\n".join(replay.failures)


def test_the_parser_reads_sessions_plain_commands_and_skips() -> None:
    """The rules above, on a small document."""
    text = "\n".join(
        [
            "```sh",
            "$ H='Authorization: Bearer local:acme'",
            '$ curl -s localhost:3000/x -H "$H" \\',
            "    -d '{}'",
            '{"a":1,',
            ' "b": ...}',
            "```",
            "<!-- replay: skip (needs a job) -->",
            "```sh",
            "curl -s localhost:3000/skipped",
            "```",
            "  ```bash",
            "  curl -s localhost:3000/y",
            '  # {"c":2}',
            "  ```",
        ]
    )
    path = ROOT / "docs" / "_replay_parser_check.md"
    path.write_text(text, encoding="utf-8")
    try:
        found = [(s.command, s.expected) for s in steps(path)]
    finally:
        path.unlink()
    assert found == [
        ("H='Authorization: Bearer local:acme'", []),
        ("curl -s localhost:3000/x -H \"$H\" -d '{}'", ['{"a":1,', ' "b": ...}']),
        ("curl -s localhost:3000/y", [' {"c":2}']),
    ]
    assert shown(['{"a":1,', ' "b": ...}'], '{"a":1,"b":{"x":[1]}}', headers=False)
    assert not shown(['{"a":1}'], '{"a":1,"b":2}', headers=False)


def section(path: Path, heading: str) -> range:
    """The line numbers of the section of ``path`` that ``heading`` opens (to the next
    heading of its level or above)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    level = len(heading) - len(heading.lstrip("#"))
    start = lines.index(heading) + 1
    end = next(
        (
            number
            for number, line in enumerate(lines[start:], start + 1)
            if line.startswith("#") and len(line) - len(line.lstrip("#")) <= level
        ),
        len(lines) + 1,
    )
    return range(start, end)


def no_aws_environment(home: Path) -> dict[str, str]:
    """The process environment without any AWS variable, with an empty home (no ``~/.aws``)."""
    home.mkdir(exist_ok=True)
    env = {name: value for name, value in os.environ.items() if not name.startswith("AWS_")}
    return {**env, "HOME": str(home), "PYTHONPATH": os.pathsep.join(sys.path)}


@pytest.mark.parametrize("args", [[], ["--memory"]], ids=["plain", "memory"])
def test_the_replay_examples_answer_as_written_and_the_cli_on_the_data_dir_needs_no_aws(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    """docs/API.md's replay section on a runner started with ``args`` (``--memory``: the
    calls carry the user's memory block, and their contexts still rebuild and match), then
    its ``turnledger replay --data-dir`` command on the runner's folder, as written, with
    no AWS configuration (the runner too: no AWS variable, a home without ``~/.aws``)."""
    monkeypatch.chdir(ROOT)
    for name in [name for name in os.environ if name.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "runner-home"))
    api = ROOT / "docs" / "API.md"
    lines = section(api, "## What a call saw, and replays")
    data = tmp_path / "data"
    replay = Replay(data)
    try:
        replay.file(api, args, lines)
        assert replay.ran >= 6, "the replay examples were not found"
        assert not replay.failures, "\n\n".join(replay.failures)
        assert replay.runner is not None
        context = httpx.get(
            f"{replay.runner.url}/v1/conversations/api-replay-1/turns/2/context",
            headers={"Authorization": "Bearer local:acme:ann"},
        ).json()
        carried = [c for c in context["calls"] if c["messages"][0]["role"] == "system"]
        assert len(carried) == (1 if args else 0)  # the memory block, rebuilt
        assert context["all_match"] is True, context

        [command] = [
            s.command for s in steps(api) if s.line in lines and s.command.startswith("turnledger ")
        ]
        words = shlex.split(command)
        words[words.index("--data-dir") + 1] = str(data)
        done = subprocess.run(
            [sys.executable, "-m", "turnledger_local.cli", *words[1:]],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
            env=no_aws_environment(tmp_path / "home"),
        )
    finally:
        replay.stop()
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "replay.json").read_text(encoding="utf-8"))
    assert (tmp_path / "replay.csv").is_file()
    row = next(r for r in report["conversations"] if r["conversation_id"] == "api-replay-1")
    assert row["status"] == "complete"
    assert row["context_mismatches"] == 0
    assert report["total"]["context_mismatches"] == 0
