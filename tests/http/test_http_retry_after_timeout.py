"""A request is recognised, not repeated (issue 18, failure 1), through the local runner
with its functions' timeout enforced and shortened (``function_timeout_seconds``).

A synchronous turn whose tool needs no approval dies after the tool ran and before its
result is committed (here: the function times out while the tool answers slowly). The
client gets API Gateway's answer to a Lambda timeout and sends the same request again.
Measured before the fix: the retry resumed the old call, then appended the same user
message as a second turn, and the model called the tool again under a new key (2
``user_message`` events; the tool hit 3 times under 2 keys). Now the retry finds the
turn it began, finishes it and answers it.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from turnledger_local.clock import ClockFile
from turnledger_local.runner import LocalConfig

from tests.functional.http_sink import HttpSink, Reply
from tests.http.conftest import ANN, start

pytestmark = [pytest.mark.http, pytest.mark.integration]

#: Every function's timeout in this runner (seconds).
TIMEOUT = 3.0
#: The tool's own timeout: longer than the function's, so the function dies first.
TOOL_TIMEOUT = 10
#: Past any tool lease of the dead request (tool timeout + the model's attempts + margin).
PAST_THE_LEASE = 600
BODY = {"input": "/tool slow_report {}"}


@pytest.fixture
def timing_out(
    runner_config: LocalConfig,
    runner_clock: ClockFile,
    ddb_local_endpoint: str,
    sink: HttpSink,
    tmp_path: Path,
) -> Iterator[httpx.Client]:
    tools = tmp_path / "tools.json"
    tools.write_text(
        json.dumps(
            {
                "tools": [
                    {
                        "name": "slow_report",
                        "parameters": {"type": "object"},
                        "executor": {
                            "type": "http",
                            "url": sink.url("/report"),
                            "timeout_seconds": TOOL_TIMEOUT,
                        },
                    }
                ]
            }
        )
    )
    # Slower than the function's timeout the first time, quick after that.
    sink.respond("/report", Reply(body={"rows": 3}, delay=TIMEOUT + 3), Reply(body={"rows": 3}))
    config = dataclasses.replace(
        runner_config,
        dynamodb_endpoint=ddb_local_endpoint,
        tools_file=tools,
        function_timeout_seconds=TIMEOUT,
        worker_hook="tests.support.worker_hooks:tools_outlast_deadline",
    )
    yield from start(config, runner_clock)


def events(http: httpx.Client, conversation: str) -> list[dict[str, Any]]:
    answer = http.get(f"/v1/conversations/{conversation}/events", headers=ANN)
    assert answer.status_code == 200, answer.text
    found: list[dict[str, Any]] = answer.json()["events"]
    return found


def time_out_then_retry(
    http: httpx.Client, clock: ClockFile, headers: dict[str, str]
) -> tuple[str, httpx.Response]:
    """POST a turn that times out, let its lease lapse, POST the same request again."""
    conversation = f"retry-{uuid.uuid4().hex[:10]}"
    url = f"/v1/conversations/{conversation}/turns"
    first = http.post(url, json=BODY, headers=headers)
    assert first.status_code == 500, first.text
    assert first.json() == {"message": "Internal Server Error"}
    head = http.get(f"/v1/conversations/{conversation}", headers=ANN).json()
    assert head["status"] == "running_tools"  # the tool's call is recorded, its result not
    clock.advance(PAST_THE_LEASE)
    return conversation, http.post(url, json=BODY, headers=headers)


def assert_answered_once(
    http: httpx.Client, sink: HttpSink, conversation: str, retried: httpx.Response
) -> None:
    assert retried.status_code == 200, retried.text
    answer = retried.json()
    assert (answer["status"], answer["turn"]) == ("complete", 1)
    assert answer["output_text"] == 'Tool results: slow_report: {"rows":3}'
    kinds = [e["kind"] for e in events(http, conversation)]
    assert kinds.count("user_message") == 1, kinds
    assert kinds.count("tool_call_requested") == 1, kinds
    assert kinds.count("tool_result") == 1, kinds
    calls = [r for r in sink.requests_for("/report") if r.json()["conversation_id"] == conversation]
    # The dead request's call, then the same call resumed: never a second one.
    assert len(calls) == 2
    assert len({r.idempotency_key for r in calls}) == 1
    assert {r.json()["call_id"] for r in calls} == {"call_1"}


def test_a_retry_with_the_same_idempotency_key_answers_the_turn_it_began(
    timing_out: httpx.Client, runner_clock: ClockFile, sink: HttpSink
) -> None:
    headers = {**ANN, "Idempotency-Key": f"key-{uuid.uuid4().hex}"}
    conversation, retried = time_out_then_retry(timing_out, runner_clock, headers)
    assert_answered_once(timing_out, sink, conversation, retried)
    # The answer is now recorded under the key: sent again, it is replayed, nothing runs.
    before = events(timing_out, conversation)
    replayed = timing_out.post(
        f"/v1/conversations/{conversation}/turns", json=BODY, headers=headers
    )
    assert replayed.json() == retried.json()
    assert events(timing_out, conversation) == before
    assert len(sink.requests_for("/report")) == 2


def test_the_same_body_replayed_without_a_key_answers_the_turn_it_began(
    timing_out: httpx.Client, runner_clock: ClockFile, sink: HttpSink
) -> None:
    conversation, retried = time_out_then_retry(timing_out, runner_clock, ANN)
    assert_answered_once(timing_out, sink, conversation, retried)
