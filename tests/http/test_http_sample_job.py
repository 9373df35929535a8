"""The runner's sample job server for deferred tools (``POST /_local/job``, ``GET
/_local/jobs``): docs/GUIDE.md's deferred session, followed as written, and the job's
own rules (the same ``Idempotency-Key`` gets the same task, a failing job, bad input)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from turnledger_local.runner import LocalConfig, LocalRunner

from tests.http.conftest import ANN
from tests.http.test_docs_replay import ROOT, Replay, section

pytestmark = pytest.mark.http

TOOLS = ROOT / "events" / "local-tools.json"


def test_the_guides_deferred_session_answers_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GUIDE's "Tools that wait" sessions on the sample tools: the deferred one is
    answered by the sample job, which calls back and continues the turn."""
    monkeypatch.chdir(ROOT)
    guide = ROOT / "docs" / "GUIDE.md"
    replay = Replay(tmp_path / "data")
    try:
        replay.file(guide, ["--tools", str(TOOLS)], section(guide, "## Tools that wait"))
    finally:
        replay.stop()
    assert replay.ran >= 8, "the sessions were not found"
    assert not replay.failures, "\n\n".join(replay.failures)


@pytest.fixture
def jobs(runner_config: LocalConfig) -> Iterator[httpx.Client]:
    config = dataclasses.replace(runner_config, tools_file=TOOLS)
    with LocalRunner(config) as runner, httpx.Client(base_url=runner.url, timeout=30) as client:
        yield client


def tool_turn(client: httpx.Client, conversation: str, arguments: str) -> dict:
    answer = client.post(
        f"/v1/conversations/{conversation}/turns",
        headers=ANN,
        json={"input": f"/tool run_report {arguments}"},
    )
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_a_failing_job_settles_its_call_as_failed(jobs: httpx.Client) -> None:
    waiting = tool_turn(jobs, "job-fail", '{"fail": true, "seconds": 0}')
    assert waiting["status"] == "awaiting_async_tools"
    [job] = jobs.get("/_local/jobs", params={"conversation_id": "job-fail", "wait": 10}).json()[
        "jobs"
    ]
    assert job["state"] == "called_back" and job["callback"]["settled"] == "failed"
    done = jobs.get("/v1/conversations/job-fail/turns/1", headers=ANN).json()
    assert done["status"] == "complete"
    assert "run_report failed: the job failed, as asked" in done["output_text"]


def test_the_same_idempotency_key_gets_the_same_task_and_no_second_job(
    jobs: httpx.Client,
) -> None:
    body = {"tool": "run_report", "conversation_id": "direct", "arguments": {"seconds": 60}}
    headers = {"Idempotency-Key": "k-1"}
    first = jobs.post("/_local/job", json=body, headers=headers)
    again = jobs.post("/_local/job", json=body, headers=headers)
    other = jobs.post("/_local/job", json=body, headers={"Idempotency-Key": "k-2"})
    assert first.status_code == again.status_code == other.status_code == 202
    assert first.json() == again.json() != other.json()
    listed = jobs.get("/_local/jobs", params={"conversation_id": "direct"}).json()["jobs"]
    assert [job["task_id"] for job in listed] == [first.json()["task_id"], other.json()["task_id"]]
    assert {job["state"] for job in listed} == {"running"}


def test_bad_job_requests_get_the_error_shape(jobs: httpx.Client) -> None:
    cases = [
        (jobs.post("/_local/job", json={"arguments": {"seconds": -1}}), 422, "validation_error"),
        (jobs.post("/_local/job", json={"arguments": {"seconds": "1"}}), 422, "validation_error"),
        (jobs.post("/_local/job", content=b"[1]"), 400, "invalid_request"),
        (jobs.get("/_local/jobs", params={"wait": "21"}), 422, "validation_error"),
        (jobs.get("/_local/jobs", params={"wait": "nan"}), 422, "validation_error"),
        (jobs.get("/_local/job"), 405, "method_not_allowed"),
        (jobs.post("/_local/jobs"), 405, "method_not_allowed"),
    ]
    for answer, status, code in cases:
        assert answer.status_code == status, answer.text
        assert answer.json()["error"]["code"] == code
    assert jobs.get("/_local/job").headers["allow"] == "POST"
