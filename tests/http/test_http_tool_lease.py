"""One live execution per tool call (issue: reliability), through the local runner on
DynamoDB Local, against a real HTTP tool endpoint that counts what it receives.

Reproduced from outside before the lease existed: 20 racing approvals of one call
made the tool endpoint receive 9 to 15 POSTs, and a second request during a slow
tool ran it again. Now the commit that starts running tools takes a lease: every
other request meets it and answers ``409 conversation_busy`` with ``Retry-After``,
runs nothing, and stores nothing.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from turnledger_local.clock import ClockFile
from turnledger_local.runner import LocalConfig

from tests.functional.http_sink import HttpSink, Reply
from tests.http.conftest import ANN, start
from tests.support.concurrency import all_at_once

pytestmark = [pytest.mark.http, pytest.mark.integration]


def registry(sink: HttpSink, path: Path, *, slow: float = 0.0) -> Path:
    path.write_text(
        json.dumps(
            {
                "tools": [
                    {
                        "name": "send_email",
                        "parameters": {"type": "object"},
                        "require_approval": True,
                        "executor": {"type": "http", "url": sink.url("/email")},
                    },
                    {
                        "name": "slow_report",
                        "parameters": {"type": "object"},
                        "executor": {
                            "type": "http",
                            "url": sink.url("/report"),
                            "timeout_seconds": 10,
                        },
                    },
                ]
            }
        )
    )
    sink.respond("/email", Reply(body={"sent": True}))
    sink.respond("/report", Reply(body={"rows": 3}, delay=slow))
    return path


@pytest.fixture
def tool_http(
    runner_config: LocalConfig,
    runner_clock: ClockFile,
    ddb_local_endpoint: str,
    sink: HttpSink,
    tmp_path: Path,
) -> Iterator[httpx.Client]:
    config = dataclasses.replace(
        runner_config,
        dynamodb_endpoint=ddb_local_endpoint,
        tools_file=registry(sink, tmp_path / "tools.json", slow=2.0),
        max_workers=12,
    )
    yield from start(config, runner_clock)


def test_twenty_racing_approvals_run_the_tool_once(tool_http: httpx.Client, sink: HttpSink) -> None:
    paused = tool_http.post(
        "/v1/conversations/race/turns",
        json={"input": '/tool send_email {"to": "bob@example.com"}'},
        headers=ANN,
    )
    assert paused.json()["status"] == "awaiting_approval"

    def approve(_: int) -> httpx.Response:
        return tool_http.post(
            "/v1/conversations/race/approvals", json={"approve": ["call_1"]}, headers=ANN
        )

    answers = all_at_once(20, approve)  # every request answered, no thread raised
    codes = sorted(a.status_code for a in answers)
    assert codes.count(200) == 1, codes
    assert set(codes) <= {200, 409}
    for answer in answers:
        if answer.status_code == 409:
            assert answer.json()["error"]["code"] in {"conversation_busy", "not_awaiting_approval"}
    assert len(sink.requests_for("/email")) == 1
    events = tool_http.get("/v1/conversations/race/events", headers=ANN).json()["events"]
    assert [e["kind"] for e in events].count("tool_result") == 1
    assert [e["kind"] for e in events].count("approval_resolved") == 1


def test_a_request_during_a_slow_tool_is_busy_with_retry_after_and_runs_nothing(
    tool_http: httpx.Client, sink: HttpSink
) -> None:
    first: list[httpx.Response] = []
    running = threading.Thread(
        target=lambda: first.append(
            tool_http.post(
                "/v1/conversations/slow/turns",
                json={"input": "/tool slow_report {}"},
                headers=ANN,
            )
        )
    )
    running.start()
    deadline = time.monotonic() + 10
    while not sink.requests_for("/report") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sink.requests_for("/report"), "the tool never started"
    head = tool_http.get("/v1/conversations/slow", headers=ANN).json()
    assert head["status"] == "running_tools"
    second = tool_http.post("/v1/conversations/slow/turns", json={"input": "hello?"}, headers=ANN)
    assert second.status_code == 409
    assert second.json()["error"]["code"] == "conversation_busy"
    retry_after = int(second.headers["retry-after"])
    assert retry_after >= 1
    assert second.json()["error"]["details"]["retry_after_seconds"] == retry_after
    running.join()
    assert first[0].status_code == 200, first[0].text
    assert first[0].json()["output_text"] == 'Tool results: slow_report: {"rows":3}'
    assert len(sink.requests_for("/report")) == 1
    events = tool_http.get("/v1/conversations/slow/events", headers=ANN).json()["events"]
    assert "hello?" not in json.dumps(events)
    # Now that the run is over, the same request goes through.
    again = tool_http.post("/v1/conversations/slow/turns", json={"input": "hello?"}, headers=ANN)
    assert again.status_code == 200
