"""The context route and replays over HTTP: the local runner's functions, its turn worker
running the replay asynchronously, and ``http`` tools served by a sink that proves no tool
endpoint is called (issue 23)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from turnledger_local.runner import LocalConfig, LocalRunner

from tests.functional.http_sink import HttpSink
from tests.functional.test_tool_turns import script_tools, tool_definitions, tool_line

ANN = {"Authorization": "Bearer local:acme:ann"}
BOB = {"Authorization": "Bearer local:globex:bob"}


@pytest.fixture
def sink() -> Iterator[HttpSink]:
    with HttpSink(dedupe=True) as server:
        script_tools(server)
        yield server


@pytest.fixture
def client(runner_config: LocalConfig, sink: HttpSink, tmp_path: Path) -> Iterator[httpx.Client]:
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps({"tools": tool_definitions(sink)}), encoding="utf-8")
    config = dataclasses.replace(runner_config, tools_file=tools)
    with LocalRunner(config) as runner, httpx.Client(base_url=runner.url, timeout=30) as http:
        yield http


def test_a_replay_over_http_runs_in_the_worker_and_touches_nothing(
    client: httpx.Client, sink: HttpSink
) -> None:
    """Turns with a tool call; the context route shows each call's context with equal
    hashes; a pointwise and a rollout replay answer 202 with Location, run in the turn
    worker, and read back complete, with no tool request and the conversation unchanged."""
    base = "/v1/conversations/http-replay-1"
    inputs = ["My name is Ada.", tool_line("get_weather", city="Oslo"), "What is my name?"]
    for text in inputs:
        answer = client.post(f"{base}/turns", headers=ANN, json={"input": text})
        assert answer.status_code == 200 and answer.json()["status"] == "complete", answer.text
    tool_requests = len(sink.requests)
    head = client.get(base, headers=ANN).json()
    events = client.get(f"{base}/events", headers=ANN).json()

    context = client.get(f"{base}/turns/2/context", headers=ANN)
    assert context.status_code == 200
    calls = context.json()["calls"]
    assert context.json()["all_match"] is True and [c["call"] for c in calls] == [1, 2]
    assert [m["role"] for m in calls[1]["messages"]][-2:] == ["assistant", "tool"]
    assert {t["name"] for t in calls[0]["tools"]} >= {"get_weather"}

    for mode in ("pointwise", "rollout"):
        started = client.post(
            f"{base}/replays",
            headers=ANN,
            json={"provider": "demo", "model": "demo-1", "mode": mode},
        )
        assert started.status_code == 202, started.text
        location = started.headers["Location"]
        assert location == f"{base}/replays/{started.json()['id']}"
        record = client.get(location, headers=ANN, params={"wait": 20}).json()
        assert record["status"] == "complete", record
        assert [(c["turn"], c["call"]) for c in record["calls"]] == [(1, 1), (2, 1), (2, 2), (3, 1)]
        assert record["summary"]["identical_tool_call_share"] == 1.0
        assert record["summary"]["text_similarity"] == 1.0
        assert client.get(location, headers=BOB).status_code == 404
    rollout_call = record["calls"][1]
    assert rollout_call["tool_results"][0]["recorded"] is True
    assert sink.requests[tool_requests:] == []
    assert client.get(base, headers=ANN).json() == head
    assert client.get(f"{base}/events", headers=ANN).json() == events

    missing = client.get(f"{base}/turns/9/context", headers=ANN)
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "turn_not_found")
    unknown = client.get(f"{base}/replays/rp_{'0' * 24}", headers=ANN)
    assert (unknown.status_code, unknown.json()["error"]["code"]) == (404, "replay_not_found")
    bad = client.get(f"{base}/replays/nope", headers=ANN)
    assert (bad.status_code, bad.json()["error"]["code"]) == (422, "validation_error")
    range_ = client.post(
        f"{base}/replays", headers=ANN, json={"provider": "demo", "model": "demo-1", "to_turn": 4}
    )
    assert (range_.status_code, range_.json()["error"]["code"]) == (422, "invalid_turn_range")


def test_a_replay_retried_with_its_idempotency_key_starts_once(client: httpx.Client) -> None:
    """The same ``Idempotency-Key`` and body answers the first ``202`` (the same replay);
    another body under that key is ``422 idempotency_key_reused``."""
    base = "/v1/conversations/http-replay-2"
    assert client.post(f"{base}/turns", headers=ANN, json={"input": "hi"}).status_code == 200
    keyed = {**ANN, "Idempotency-Key": "replay-once"}
    body = {"provider": "demo", "model": "demo-1"}
    first = client.post(f"{base}/replays", headers=keyed, json=body)
    again = client.post(f"{base}/replays", headers=keyed, json=body)
    assert first.status_code == again.status_code == 202
    assert again.json()["id"] == first.json()["id"]
    assert again.headers["Location"] == first.headers["Location"]
    other = client.post(f"{base}/replays", headers=keyed, json={**body, "mode": "rollout"})
    assert (other.status_code, other.json()["error"]["code"]) == (422, "idempotency_key_reused")


def test_a_replay_judged_on_actions_and_constraints(client: httpx.Client) -> None:
    """Issue 42: the same model passes a strict trajectory; ``never_call`` on a tool the
    conversation called fails, naming the constraint and the turn; wording is not judged."""
    base = "/v1/conversations/http-replay-judged"
    inputs = ["My name is Ada.", tool_line("get_weather", city="Oslo"), "What is my name?"]
    for text in inputs:
        answer = client.post(f"{base}/turns", headers=ANN, json={"input": text})
        assert answer.status_code == 200, answer.text

    def judged(expect: dict[str, object], mode: str = "pointwise") -> dict[str, object]:
        body = {"provider": "demo", "model": "demo-1", "mode": mode, "expect": expect}
        started = client.post(f"{base}/replays", headers=ANN, json=body)
        assert started.status_code == 202, started.text
        record: dict[str, object] = client.get(
            started.headers["Location"], headers=ANN, params={"wait": 20}
        ).json()
        assert record["status"] == "complete", record
        return record

    for mode in ("pointwise", "rollout"):
        strict = judged({"tool_calls": {"mode": "strict", "args": "exact"}}, mode)
        assert strict["passed"] is True
        assert strict["turns"] == [{"turn": n, "passed": True, "failures": []} for n in (1, 2, 3)]
        assert strict["summary"]["turns_judged"] == 3  # type: ignore[index]
        assert strict["summary"]["turns_passed"] == 3  # type: ignore[index]

    forbidden = judged(
        {
            "tool_calls": {"mode": "unordered"},
            "constraints": [{"type": "never_call", "tool": "get_weather"}],
        }
    )
    assert forbidden["passed"] is False
    verdicts = forbidden["turns"]
    assert [v["passed"] for v in verdicts] == [True, False, True]  # type: ignore[union-attr,index]
    assert verdicts[1]["failures"] == [  # type: ignore[index]
        {
            "constraint": "never_call",
            "expected": "get_weather",
            "actual": [{"name": "get_weather", "arguments": {"city": "Oslo"}}],
        }
    ]
    assert forbidden["summary"]["turns_passed"] == 2  # type: ignore[index]

    # A pin is judged while it is in force: from turn 4 on.
    pin = client.post(
        f"{base}/pins", headers=ANN, json={"text": "Never say her name.", "kind": "constraint"}
    )
    assert pin.status_code == 201, pin.text
    client.post(f"{base}/turns", headers=ANN, json={"input": "What is my name?"})
    pin_id = pin.json()["id"]
    respected = judged(
        {"constraints": [{"type": "pin_respected", "pin_id": pin_id, "not_contains": "Ada"}]}
    )
    assert [v["passed"] for v in respected["turns"]] == [True, True, True, False]  # type: ignore[union-attr,index]
    [failure] = respected["turns"][3]["failures"]  # type: ignore[index]
    assert failure == {
        "constraint": f"pin_respected:{pin_id}",
        "expected": {"not_contains": "Ada"},
        "actual": "Your name is Ada.",
    }
    body = {"provider": "demo", "model": "demo-1"}
    no_check = {"constraints": [{"type": "pin_respected", "pin_id": pin_id}]}
    refused = client.post(f"{base}/replays", headers=ANN, json={**body, "expect": no_check})
    assert (refused.status_code, refused.json()["error"]["code"]) == (422, "validation_error")
    gone = {"constraints": [{"type": "pin_respected", "pin_id": "pin_0", "contains": "x"}]}
    refused = client.post(f"{base}/replays", headers=ANN, json={**body, "expect": gone})
    assert (refused.status_code, refused.json()["error"]["code"]) == (400, "invalid_request")
