"""``turnledger export`` / ``import`` with ``--data-dir`` on a machine with no AWS
configuration at all, and the command line's errors: one line ``code: message``, exit != 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from turnledger.api.schemas import TurnRequest
from turnledger.core.config import Settings
from turnledger.runtime import Runtime

from tests.support import edge
from tests.support.edge import Caller

ANN = Caller(tenant="acme", actor="ann")


@pytest.fixture
def no_aws(tmp_path: Path) -> dict[str, str]:
    """The process environment without any AWS variable, and a home with no ``~/.aws``."""
    home = tmp_path / "home"
    home.mkdir()
    env = {name: value for name, value in os.environ.items() if not name.startswith("AWS_")}
    return {**env, "HOME": str(home), "PYTHONPATH": os.pathsep.join(sys.path)}


def cli(env: dict[str, str], *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "turnledger_local.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def one_error_line(run: subprocess.CompletedProcess[str], prefix: str) -> str:
    """The run failed with exactly one line on stderr starting with ``prefix``."""
    assert run.returncode != 0, run.stdout
    lines = run.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(prefix), run.stderr
    return lines[0]


def test_export_and_import_with_a_data_dir_need_no_aws(tmp_path: Path, no_aws: dict[str, str]):
    """A conversation written in a data folder exports and imports there with no AWS variable."""
    data = tmp_path / "data"
    runtime = Runtime.from_settings(Settings(store="sqlite", data_dir=str(data)))
    edge.turn(runtime.conversations, ANN, "persist-1", TurnRequest(input="My name is Ada."))

    exported = cli(no_aws, "export", "--data-dir", str(data), "--tenant", "acme", "persist-1")
    assert exported.returncode == 0, exported.stderr
    assert exported.stdout.count("\n") == 3  # the head, then the input and the answer

    args = ("import", "--data-dir", str(data), "--tenant", "acme", "persist-2")
    imported = cli(no_aws, *args, stdin=exported.stdout)
    assert imported.returncode == 0, imported.stderr
    # 3: the conversation_imported event opens the copy
    assert imported.stderr.strip() == "imported persist-2: 1 turns, 3 events"
    again = cli(no_aws, *args, stdin=exported.stdout)
    assert one_error_line(again, "turnledger import: conversation_exists: ")


def test_every_cli_error_is_one_line_with_a_code(tmp_path: Path, no_aws: dict[str, str]):
    data = str(tmp_path / "data")
    cases = [
        (("export", "--data-dir", data, "--tenant", "acme", "absent"), "turnledger export: "),
        (("export", "--data-dir", data, "--tenant", "acme", "bad id"), "turnledger export: "),
        (("import", "--data-dir", data, "--tenant", "acme", "x1"), "turnledger import: "),
        # No data folder and no AWS region: the table cannot be reached, said in one line.
        (("export", "--tenant", "acme", "absent"), "turnledger export: aws_error: "),
        (("export", "absent"), "turnledger export: usage_error: "),
        (("local", "--port", "x"), "turnledger local: usage_error: "),
        (("nonsense",), "turnledger: usage_error: "),
    ]
    codes = []
    for args, prefix in cases:
        codes.append(one_error_line(cli(no_aws, *args), prefix).split(": ")[1])
    assert codes[:3] == ["conversation_not_found", "invalid_conversation_id", "validation_error"]


def test_the_docs_replay_command_with_a_data_dir_needs_no_aws(
    tmp_path: Path, no_aws: dict[str, str]
):
    """docs/API.md's ``turnledger replay --data-dir`` example, as written, on a folder a
    runner filled: the store is SQLite, so no AWS client (and no region) is needed."""
    data = tmp_path / "data"
    runtime = Runtime.from_settings(Settings(store="sqlite", data_dir=str(data)))
    for text in ("My name is Ada.", "What is my name?"):
        edge.turn(runtime.conversations, ANN, "replay-1", TurnRequest(input=text))
    out = tmp_path / "replay.json"
    args = ("--provider", "demo-stateful", "--model", "demo-1", "--sample", "50", "--seed", "1")
    run = cli(
        no_aws,
        *("replay", "--data-dir", str(data), "--tenant", "acme", *args),
        *("--concurrency", "4", "--json", str(out), "--csv", str(tmp_path / "replay.csv")),
    )
    assert run.returncode == 0, run.stderr
    report = json.loads(out.read_text(encoding="utf-8"))
    assert [row["conversation_id"] for row in report["conversations"]] == ["replay-1"]
    assert report["total"]["calls"] == 2
    assert report["total"]["context_mismatches"] == 0
    assert report["total"]["text_similarity"] == 1.0
