"""What ``turnledger local`` writes to its log when a model provider fails or has no key:
one structured line with the cause, never a traceback; a warning at start for a
configured provider without its key. The runner runs as ``make run`` runs it (a process of
its own), and its standard output and error are read whole."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.http.conftest import ANN

pytestmark = pytest.mark.http


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run_local(tmp_path: Path, *args: str, turns: int = 1) -> tuple[list[httpx.Response], str]:
    """Start ``turnledger local ARGS`` with no OpenAI key and an OpenAI base URL nobody
    serves; send ``turns`` turns; stop it; return the answers and its whole log."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_API_KEY")}
    env["OPENAI_BASE_URL"] = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    log = tmp_path / "runner.log"
    with log.open("w") as sink:
        runner = subprocess.Popen(
            [sys.executable, "-m", "turnledger_local.cli", "local", "--port", str(port), *args],
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
        answers: list[httpx.Response] = []
        try:
            deadline = time.monotonic() + 60
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
                while len(answers) < turns:
                    try:
                        answers.append(
                            client.post(
                                f"/v1/conversations/log-{len(answers)}/turns",
                                headers=ANN,
                                json={"input": "hi"},
                            )
                        )
                    except httpx.TransportError:
                        assert time.monotonic() < deadline, log.read_text()
                        time.sleep(0.2)
        finally:
            runner.terminate()
            runner.wait(timeout=30)
    return answers, log.read_text(encoding="utf-8")


def test_a_provider_failure_is_one_line_with_its_cause_and_no_traceback(tmp_path: Path):
    args = ("--provider", "openai-chat", "--model", "gpt-4o-mini", "--log-level", "WARNING")
    [answer], log = run_local(tmp_path, *args)
    assert answer.status_code == 502
    assert answer.json()["error"]["code"] == "provider_error"
    assert "Traceback" not in log
    [line] = [line for line in log.splitlines() if "provider_error" in line]
    record = json.loads(line)
    assert record["level"] == "ERROR" and "exception" not in record
    assert record["message"] == "the model provider failed: could not reach the model provider"
    assert record["details"]["reason"] == "connection_failed"
    assert len(line) < 2000, len(line)


def test_a_configured_provider_without_its_key_is_warned_of_at_start(tmp_path: Path):
    _, log = run_local(tmp_path, "--provider", "openai-chat", "--model", "gpt-4o-mini")
    warnings = [line for line in log.splitlines() if "warning" in line.lower()]
    assert any("openai-chat" in w and "OPENAI_API_KEY" in w for w in warnings), log
    _, quiet = run_local(tmp_path)
    assert "OPENAI_API_KEY" not in quiet  # the demo model needs no key
