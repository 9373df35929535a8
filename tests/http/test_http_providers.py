"""Providers over HTTP, through the local runner and the real handlers.

JSON mode (``response_format`` in, ``output_json`` out, ``content_json`` in the
transcript), a turn naming another provider the deployment allows (and one it
does not), and ``openai-responses`` against the fake Responses API: continued
turns, and the stored responses deleted by clear and by tenant erasure.
"""

from __future__ import annotations

from typing import Any

import httpx
from turnledger_local.clock import ClockFile

from tests.functional.fake_openai import RESPONSES_PATH, FakeOpenAI, text_reply
from tests.http.conftest import ANN, serve
from tests.support.provider_schemas import validate_responses_request
from tests.support.wire_demo import responses_demo

JSON_OBJECT = {"type": "json_object"}


def post_turn(http: httpx.Client, conversation: str, text: Any, **body: Any) -> httpx.Response:
    return http.post(
        f"/v1/conversations/{conversation}/turns", json={"input": text, **body}, headers=ANN
    )


def error_of(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "details"}
    error: dict[str, Any] = body["error"]
    return error


def events_of(http: httpx.Client, conversation: str) -> list[dict[str, Any]]:
    page = http.get(f"/v1/conversations/{conversation}/events", headers=ANN)
    assert page.status_code == 200
    events: list[dict[str, Any]] = page.json()["events"]
    return events


def test_json_mode_over_http(http: httpx.Client) -> None:
    first = post_turn(http, "j", "My name is Ann.", response_format=JSON_OBJECT)
    assert first.status_code == 200, first.text
    body = first.json()
    assert body["output_json"] == {"answer": "Noted (1 user messages so far)."}
    [answer] = [e for e in events_of(http, "j") if e["kind"] == "assistant_message"]
    assert answer["payload"]["content"] is None
    assert answer["payload"]["content_json"] == {"answer": "Noted (1 user messages so far)."}

    plain = post_turn(http, "j", "What is my name?").json()
    assert (plain["output_text"], plain["output_json"]) == ("Your name is Ann.", None)

    schema = {
        "type": "json_schema",
        "json_schema": {"name": "reply", "schema": {"type": "object"}},
    }
    assert post_turn(http, "j", "echo: ok", response_format=schema).json()["output_json"] == {
        "answer": "ok"
    }

    for bad in (
        {"type": "xml"},
        {"type": "json_object", "extra": 1},
        "json",
        {"type": "json_schema"},
        {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}},
        {"type": "json_object", "json_schema": {"name": "reply"}},
    ):
        refused = post_turn(http, "j", "Hello.", response_format=bad)
        assert refused.status_code == 422, refused.text
        assert error_of(refused)["code"] == "validation_error"
    assert len(events_of(http, "j")) == 6  # refused turns left nothing


def test_a_non_json_answer_in_json_mode_is_502_and_recorded(runner_clock: ClockFile) -> None:
    with FakeOpenAI() as fake:
        env = {"OPENAI_BASE_URL": fake.base_url, "PROVIDER_MAX_RETRIES": "0"}
        with serve(runner_clock, provider="openai-chat", model="gpt-test", env=env) as http:
            fake.script(text_reply("Sure! Here is your answer."))
            failed = post_turn(http, "nj", "Answer in JSON.", response_format=JSON_OBJECT)
            assert failed.status_code == 502
            assert error_of(failed)["code"] == "provider_error"
            assert [e["kind"] for e in events_of(http, "nj")] == ["turn_failed"]
            fake.script(text_reply('{"ok": true}'))
            done = post_turn(http, "nj", "Answer in JSON.", response_format=JSON_OBJECT)
            assert done.status_code == 200 and done.json()["output_json"] == {"ok": True}


def test_a_turn_may_name_another_allowed_provider(runner_clock: ClockFile) -> None:
    env = {"PROVIDERS": "demo-stateful"}
    with serve(runner_clock, provider="demo", env=env) as http:
        first = post_turn(http, "s", "My name is Ann.", provider="demo-stateful").json()
        assert first["context"]["provider_state"] == "fresh"
        second = post_turn(http, "s", "I live in Oslo.", provider="demo-stateful").json()
        assert second["context"] == {**second["context"], "provider_state": "continued"}
        assert second["context"]["messages_sent"] == 1
        back = post_turn(http, "s", "What is my name?").json()  # the default provider
        assert (back["output_text"], back["context"]["provider_state"]) == (
            "Your name is Ann.",
            "fresh",
        )
        runs = [
            e["payload"]["run"] for e in events_of(http, "s") if e["kind"] == "assistant_message"
        ]
        assert [r["provider"] for r in runs] == ["demo-stateful", "demo-stateful", "demo"]

        refused = post_turn(http, "s", "Hello.", provider="openai-chat")
        assert refused.status_code == 422
        error = error_of(refused)
        assert error["code"] == "unknown_provider"
        assert error["details"] == {"provider": "openai-chat", "allowed": ["demo", "demo-stateful"]}
        assert len(events_of(http, "s")) == 6


def test_openai_responses_continues_and_clear_and_erasure_delete_its_state(
    runner_clock: ClockFile,
) -> None:
    with FakeOpenAI() as fake:
        fake.default = responses_demo(fake)
        env = {"OPENAI_BASE_URL": fake.base_url, "PROVIDER_MAX_RETRIES": "0"}
        with serve(runner_clock, provider="openai-responses", model="gpt-test", env=env) as http:
            assert post_turn(http, "a", "My name is Ann.").status_code == 200
            second = post_turn(http, "a", "What is my name?").json()
            assert (second["output_text"], second["context"]["provider_state"]) == (
                "Your name is Ann.",
                "continued",
            )
            post_turn(http, "b", "My name is Bea.")
            post_turn(http, "c", "My name is Cy.")
            posted = [r.json() for r in fake.requests if r.method == "POST"]
            for body in posted:
                validate_responses_request(body)
            assert posted[1]["previous_response_id"] == "resp_fake_1"

            assert http.delete("/v1/conversations/a", headers=ANN).status_code == 204
            deleted = [r.path for r in fake.requests if r.method == "DELETE"]
            # Every stored response of the chain: the cursor's, and those its run records name.
            assert sorted(deleted) == [
                f"{RESPONSES_PATH}/resp_fake_1",
                f"{RESPONSES_PATH}/resp_fake_2",
            ]

            erased = http.delete("/v1/conversations", headers=ANN)
            assert erased.status_code == 200, erased.text
            report = erased.json()
            assert (report["conversations_removed"], report["provider_state_deleted"]) == (2, 2)
