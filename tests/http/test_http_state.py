"""``GET .../state``, the four questions (issue 42), through the local runner: a
conversation whose process died while an ``http`` tool ran names that call as possibly
completed, with the idempotency key the tool was sent."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from turnledger_local.clock import ClockFile
from turnledger_local.runner import LocalConfig

from tests.functional.http_sink import HttpSink, Reply
from tests.http.conftest import ANN, BOB, start

pytestmark = [pytest.mark.http]

#: Every function's timeout in this runner (seconds); the tool answers later.
TIMEOUT = 3.0
#: Past any tool lease of the dead request.
PAST_THE_LEASE = 600


@pytest.fixture
def sink() -> Iterator[HttpSink]:
    with HttpSink() as server:
        yield server


@pytest.fixture
def dying(
    runner_config: LocalConfig, runner_clock: ClockFile, sink: HttpSink, tmp_path: Path
) -> Iterator[httpx.Client]:
    tools = tmp_path / "tools.json"
    report = {
        "name": "slow_report",
        "parameters": {"type": "object"},
        "executor": {"type": "http", "url": sink.url("/report"), "timeout_seconds": 10},
    }
    tools.write_text(json.dumps({"tools": [report]}))
    sink.respond("/report", Reply(body={"rows": 3}, delay=TIMEOUT + 3), Reply(body={"rows": 3}))
    config = dataclasses.replace(
        runner_config,
        data_dir=tmp_path / "data",
        tools_file=tools,
        function_timeout_seconds=TIMEOUT,
        worker_hook="tests.support.worker_hooks:tools_outlast_deadline",
    )
    yield from start(config, runner_clock)


def test_the_state_of_a_conversation_whose_process_died_while_a_tool_ran(
    dying: httpx.Client, runner_clock: ClockFile, sink: HttpSink
) -> None:
    http = dying
    base = "/v1/conversations/died"
    assert http.post(f"{base}/turns", json={"input": "hello"}, headers=ANN).status_code == 200
    died = http.post(f"{base}/turns", json={"input": "/tool slow_report {}"}, headers=ANN)
    assert died.status_code == 500, died.text
    [sent] = sink.requests_for("/report")
    runner_clock.advance(PAST_THE_LEASE)

    answer = http.get(f"{base}/state", headers=ANN)
    assert answer.status_code == 200, answer.text
    state = answer.json()
    happened = state["happened"]
    assert happened["last_turn"] == {"turn": 2, "status": "interrupted"}
    assert happened["events"] == {
        "assistant_message": 2,
        "tool_call_requested": 1,
        "user_message": 2,
    }
    [action] = state["external_actions"]
    assert (action["name"], action["call_id"], action["turn"]) == ("slow_report", "call_1", 2)
    assert (action["state"], action["may_have_completed"]) == ("interrupted", True)
    assert action["idempotency_key"] == sent.idempotency_key
    may_send = state["may_send"]
    assert (may_send["provider"], may_send["models"]) == ("demo", ["demo-1"])
    assert may_send["pins"] == [] and may_send["summary"] is None
    lost = state["if_cursor_lost"]
    assert lost["provider_cursor"] is None and lost["transcript_lost"] is False
    assert lost["next_call_rebuilds_from"] == "log"
    assert state["reads"] == 2  # the head, then one page of the log
    # Another tenant's conversation is a missing one.
    other = http.get(f"{base}/state", headers=BOB)
    assert (other.status_code, other.json()["error"]["code"]) == (404, "conversation_not_found")

    # The next request runs the call again under the same key: it succeeded.
    http.post(f"{base}/turns", json={"input": "again"}, headers=ANN)
    [action] = http.get(f"{base}/state", headers=ANN).json()["external_actions"]
    assert (action["state"], action["may_have_completed"]) == ("succeeded", True)
    keys = {r.idempotency_key for r in sink.requests_for("/report")}
    assert keys == {sent.idempotency_key}
