"""``turnledger replay``: replays over many conversations of a tenant, from the command line,
on a data folder, with the aggregate as a table, JSON and CSV (issue 23)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from turnledger.api.schemas import TurnRequest
from turnledger.core.config import Settings
from turnledger.runtime import Runtime
from turnledger.turn import replays
from turnledger.turn.pins import PinCommand, Pins

from tests.support import edge
from tests.support.edge import Caller

ANN = Caller(tenant="acme", actor="ann")


@pytest.fixture
def data(tmp_path: Path) -> Path:
    """A data folder holding 20 conversations of ``acme`` (1 to 4 turns each), one of
    another tenant, and one of ``acme`` that was cleared."""
    folder = tmp_path / "data"
    service = Runtime.from_settings(Settings(store="sqlite", data_dir=str(folder))).conversations
    for number in range(20):
        for turn in range(number % 4 + 1):
            text = "My name is Ada." if turn == 0 else "What is my name?"
            edge.turn(service, ANN, f"cli-{number:02d}", TurnRequest(input=text))
    other = Caller(tenant="globex", actor="bob")
    edge.turn(service, other, "cli-00", TurnRequest(input="hello"))
    edge.turn(service, ANN, "cli-gone", TurnRequest(input="hello"))
    edge.clear(service, ANN, "cli-gone")
    return folder


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(
        [sys.executable, "-m", "turnledger_local.cli", "replay", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_a_replay_over_every_conversation_of_a_tenant(data: Path, tmp_path: Path) -> None:
    """Every live conversation of the tenant (20; not the cleared one, not another
    tenant's) is replayed, four at a time, with a progress bar; the table goes to stdout
    and the same rows, with the total, to JSON and CSV; each replay's record is stored."""
    out_json, out_csv = tmp_path / "replay.json", tmp_path / "replay.csv"
    done = cli(
        "--data-dir", str(data), "--tenant", "acme", "--provider", "demo-stateful",
        "--model", "demo-1", "--concurrency", "4", "--json", str(out_json), "--csv", str(out_csv),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "replaying" in done.stderr and "20/20" in done.stderr
    assert "TOTAL" in done.stdout and "cli-19" in done.stdout
    report = json.loads(out_json.read_text())
    rows = report["conversations"]
    assert [r["conversation_id"] for r in rows] == [f"cli-{n:02d}" for n in range(20)]
    assert all(r["status"] == "complete" and r["text_similarity"] == 1.0 for r in rows)
    assert [r["calls"] for r in rows] == [n % 4 + 1 for n in range(20)]
    total = report["total"]
    assert (total["conversation_id"], total["calls"], total["text_similarity"]) == (
        "TOTAL",
        50,
        1.0,
    )
    assert (
        total["candidate_tokens"]
        == total["original_tokens"]
        == sum(r["original_tokens"] for r in rows)
    )
    with out_csv.open(newline="") as source:
        table = list(csv.DictReader(source))
    assert [r["conversation_id"] for r in table] == [*(r["conversation_id"] for r in rows), "TOTAL"]
    assert table[-1]["calls"] == "50"
    service = Runtime.from_settings(Settings(store="sqlite", data_dir=str(data))).conversations
    record = replays.read(service, ANN.key("cli-07"), rows[7]["replay_id"])
    assert record.status == "complete" and len(record.calls) == 4


def test_a_sample_and_a_list_of_conversations(data: Path, tmp_path: Path) -> None:
    """``--sample N`` draws N of them (the same N for the same ``--seed``); named ids are
    replayed as named, and one that does not exist is a failed row (exit status 1)."""
    out = tmp_path / "sample.json"
    base = ["--data-dir", str(data), "--tenant", "acme", "--provider", "demo", "--model", "demo-1"]
    sampled = cli(*base, "--sample", "5", "--seed", "7", "--json", str(out))
    assert sampled.returncode == 0, sampled.stderr
    first = [r["conversation_id"] for r in json.loads(out.read_text())["conversations"]]
    assert len(first) == 5 and len(set(first)) == 5
    again = cli(*base, "--sample", "5", "--seed", "7", "--json", str(out))
    assert [r["conversation_id"] for r in json.loads(out.read_text())["conversations"]] == first
    assert again.returncode == 0

    named = cli(*base, "cli-03", "nope", "--mode", "rollout", "--json", str(out))
    assert named.returncode == 1
    rows = json.loads(out.read_text())["conversations"]
    assert [(r["conversation_id"], r["status"], r["error"]) for r in rows] == [
        ("cli-03", "complete", None),
        ("nope", "error", "conversation_not_found"),
    ]
    assert rows[0]["calls"] == 4 and rows[0]["text_similarity"] == 1.0


def test_expect_judges_each_replay_and_prints_the_candidates_pass_rate(
    data: Path, tmp_path: Path
) -> None:
    """Issue 42: ``--expect`` judges every conversation; the rows say which passed and the
    output ends with the candidate's pass rate. The demo model never calls a tool here, so
    a strict trajectory passes everywhere; a pinned check passes only where it holds."""
    expect = tmp_path / "expect.json"
    out = tmp_path / "judged.json"
    base = ["--data-dir", str(data), "--tenant", "acme", "--provider", "demo", "--model", "demo-1"]
    expect.write_text(json.dumps({"tool_calls": {"mode": "strict"}}))
    done = cli(*base, "cli-00", "cli-01", "cli-02", "--expect", str(expect), "--json", str(out))
    assert done.returncode == 0, done.stderr
    assert "pass rate of demo/demo-1: 3 of 3 conversations (100.0 %), 6 of 6 turns" in done.stdout
    report = json.loads(out.read_text())
    assert [r["passed"] for r in report["conversations"]] == [True, True, True]
    assert [r["turns_judged"] for r in report["conversations"]] == [1, 2, 3]
    assert report["pass_rate"].startswith("pass rate of demo/demo-1: 3 of 3")
    # A pinned constraint the candidate breaks once it is in force (turn 3 of cli-01).
    service = Runtime.from_settings(Settings(store="sqlite", data_dir=str(data))).conversations
    pin = Pins(service).add(ANN.key("cli-01"), "ops", PinCommand("Never say it.", "constraint"))
    edge.turn(service, ANN, "cli-01", TurnRequest(input="What is my name?"))
    check = {"type": "pin_respected", "pin_id": pin.id, "not_contains": "Ada"}
    expect.write_text(json.dumps({"constraints": [check]}))
    failing = cli(*base, "cli-01", "--expect", str(expect), "--json", str(out))
    assert failing.returncode == 0, failing.stderr
    assert "pass rate of demo/demo-1: 0 of 1 conversations (0.0 %), 2 of 3 turns" in (
        failing.stdout
    )
    assert json.loads(out.read_text())["conversations"][0]["passed"] is False
    plain = cli(*base, "cli-00", "--json", str(out))
    assert "pass rate" not in plain.stdout
    assert json.loads(out.read_text())["conversations"][0]["passed"] is None
