"""The working context over HTTP, through the local runner and the real handlers:
a fact kept across many compactions, budgets, redaction and run records as a client
sees them."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from turnledger_local.clock import ClockFile
from turnledger_local.runner import LocalConfig

from tests.http.conftest import ANN, start


def test_a_fact_from_turn_one_survives_many_compactions_at_300_tokens(
    runner_config: LocalConfig, runner_clock: ClockFile
) -> None:
    config = dataclasses.replace(runner_config, env={"CONTEXT_MAX_TOKENS": "300"})
    for http in start(config, runner_clock):
        path = "/v1/conversations/long/turns"
        assert (
            http.post(path, json={"input": "Hi, my name is Ann."}, headers=ANN).status_code == 200
        )
        for index in range(2, 61):
            reply = http.post(
                path, json={"input": f"note {index}: one two three four five six"}, headers=ANN
            ).json()
            assert reply["context"]["tokens_estimated"] <= 300
            assert reply["context"]["budget_tokens"] == 300
        answer = http.post(path, json={"input": "What is my name?"}, headers=ANN).json()
        assert answer["output_text"] == "Your name is Ann."
        assert answer["context"]["summary_through"] is not None
        head = http.get("/v1/conversations/long", headers=ANN).json()
        assert (
            head["turns"] == 61 and head["summary_through"] == answer["context"]["summary_through"]
        )
        kinds: list[str] = []
        after = 0
        while after is not None:
            page = http.get(
                f"/v1/conversations/long/events?after={after}&limit=1000", headers=ANN
            ).json()
            kinds += [e["kind"] for e in page["events"]]
            after = page["next_after"]
        assert kinds.count("user_message") == 61
        assert kinds.count("context_compacted") >= 3


def test_budgets_and_redaction_as_a_client_sees_them(
    runner_config: LocalConfig, runner_clock: ClockFile, tmp_path: Path
) -> None:
    rules = tmp_path / "rules.json"
    rules.write_text(
        json.dumps(
            {
                "version": "r7",
                "rules": [{"name": "card", "pattern": r"\b\d{16}\b", "replacement": "[card]"}],
            }
        )
    )
    env = {"REDACTION_FILE": str(rules), "CONVERSATION_TOKEN_BUDGET": "40"}
    config = dataclasses.replace(runner_config, env=env)
    for http in start(config, runner_clock):
        path = "/v1/conversations/r/turns"
        echoed = http.post(path, json={"input": "echo: card 4111111111111111 ok"}, headers=ANN)
        assert echoed.json()["output_text"] == "card [card] ok"
        events = http.get("/v1/conversations/r/events", headers=ANN).json()["events"]
        assert events[0]["payload"]["content"] == "echo: card 4111111111111111 ok"
        run = events[1]["payload"]["run"]
        assert run["redaction_version"] == "r7"
        assert set(run) >= {
            "model",
            "provider",
            "provider_state",
            "latency_ms",
            "usage",
            "tokens_estimated",
            "redaction_version",
            "summary_through",
        }
        used = 0
        while used < 40:
            reply = http.post(path, json={"input": "one two three four five"}, headers=ANN)
            assert reply.status_code == 200
            usage = reply.json()["usage"]
            used = http.get("/v1/conversations/r", headers=ANN).json()["usage"]
            used = used["input_tokens"] + used["output_tokens"]
            assert usage["input_tokens"] > 0
        refused = http.post(path, json={"input": "one more"}, headers=ANN)
        assert refused.status_code == 409
        error = refused.json()["error"]
        assert error["code"] == "budget_exceeded"
        assert error["details"] == {"limit": 40, "used": used}


#: A 600,000-character paste of 6,000 words: over the history read window (400,000
#: characters) yet within demo-1's token budget (7,168), so it is stored and answered.
PASTE = " ".join(["x" * 99] * 6000)


def test_a_paste_longer_than_the_read_window_never_loses_the_turns_before_it(
    runner_config: LocalConfig, runner_clock: ClockFile
) -> None:
    """The silent-loss case of issue 23: the turn before a paste longer than the read
    window used to fall out of the context with no summary covering it."""
    assert len(PASTE) > 600_000 - 100
    for http in start(runner_config, runner_clock):
        path = "/v1/conversations/paste-1/turns"
        assert http.post(path, json={"input": "my name is Ivo"}, headers=ANN).status_code == 200
        assert http.post(path, json={"input": PASTE}, headers=ANN).status_code == 200
        answer = http.post(path, json={"input": "what is my name?"}, headers=ANN).json()
        assert answer["output_text"] == "Your name is Ivo."
        # A summary covers what the read window left out: the first turn (sequences 1-2).
        assert answer["context"]["summary_through"] == 2
        events = http.get("/v1/conversations/paste-1/events", headers=ANN).json()["events"]
        compacted = [e for e in events if e["kind"] == "context_compacted"]
        assert len(compacted) == 1 and compacted[0]["turn"] == 3
        assert "my name is Ivo" in compacted[0]["payload"]["text"]
        # Nothing is deleted: the transcript still holds every message.
        assert [e["payload"]["content"][:14] for e in events if e["kind"] == "user_message"] == [
            "my name is Ivo",
            PASTE[:14],
            "what is my nam",
        ]


def test_an_input_that_cannot_fit_the_budget_alone_is_refused_before_anything_is_stored(
    runner_config: LocalConfig, runner_clock: ClockFile
) -> None:
    for http in start(runner_config, runner_clock):
        path = "/v1/conversations/paste-2/turns"
        assert http.post(path, json={"input": "my name is Ivo"}, headers=ANN).status_code == 200
        refused = http.post(path, json={"input": "word " * 120_000}, headers=ANN)
        assert refused.status_code == 413
        error = refused.json()["error"]
        assert error["code"] == "context_length_exceeded"
        assert error["details"] == {"limit": 7168, "tokens": 120_000, "model": "demo-1"}
        head = http.get("/v1/conversations/paste-2", headers=ANN).json()
        assert (head["turns"], head["events"]) == (1, 2)
        answer = http.post(path, json={"input": "what is my name?"}, headers=ANN).json()
        assert answer["output_text"] == "Your name is Ivo."


def test_compact_over_http_writes_a_new_summary_and_answers_every_routes_errors(
    runner_config: LocalConfig, runner_clock: ClockFile
) -> None:
    env = {"CONTEXT_MAX_TOKENS": "60", "PROVIDERS": "demo,demo-stateful"}
    config = dataclasses.replace(runner_config, env=env)
    for http in start(config, runner_clock):
        compact = "/v1/conversations/compact-1/compact"
        missing = http.post(compact, json={}, headers=ANN)
        assert (missing.status_code, missing.json()["error"]["code"]) == (
            404,
            "conversation_not_found",
        )
        path = "/v1/conversations/compact-1/turns"
        http.post(path, json={"input": "My name is Ada."}, headers=ANN)
        early = http.post(compact, json={}, headers=ANN)
        assert (early.status_code, early.json()["error"]["code"]) == (409, "nothing_to_compact")
        through = None
        while through is None:
            reply = http.post(path, json={"input": "I like green tea."}, headers=ANN).json()
            through = reply["context"]["summary_through"]
        events = http.get("/v1/conversations/compact-1/events", headers=ANN).json()["events"]
        [old] = [e for e in events if e["kind"] == "context_compacted"]
        invalid = http.post(compact, json={"summarizer": "x"}, headers=ANN)
        assert (invalid.status_code, invalid.json()["error"]["code"]) == (422, "validation_error")
        unknown = http.post(compact, json={"provider": "nope"}, headers=ANN)
        assert (unknown.status_code, unknown.json()["error"]["code"]) == (422, "unknown_provider")
        other = http.post(compact, json={"provider": "demo-stateful"}, headers=ANN)
        assert other.status_code == 200, other.text
        event = other.json()
        assert (event["kind"], event["actor"]) == ("context_compacted", "ann")
        assert event["sequence"] == len(events) + 1
        payload = event["payload"]
        assert (payload["from_sequence"], payload["to_sequence"]) == (1, through)
        assert (payload["replaces"], payload["trigger"]) == (old["sequence"], "manual")
        assert payload["summarizer_provider"] == "demo-stateful"
        assert "My name is Ada." in payload["text"]
        head = http.get("/v1/conversations/compact-1", headers=ANN).json()
        assert head["summary_through"] == through and head["events"] == len(events) + 1
        answer = http.post(path, json={"input": "What is my name?"}, headers=ANN).json()
        assert answer["output_text"] == "Your name is Ada."
