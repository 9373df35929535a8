"""Pins over HTTP (issue 42), through the local runner against the fake OpenAI server: a
pinned fact reaches every later model call byte for byte across many compactions, with a
summarizer that answers nothing or garbage on some cycles, and never reaches the summarizer.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from turnledger_local.clock import ClockFile
from turnledger_local.runner import LocalConfig

from tests.functional.fake_openai import (
    FakeOpenAI,
    RecordedRequest,
    Scripted,
    completion,
    json_reply,
)
from tests.http.conftest import ANN, on_openai_chat, start
from tests.support.pins import assert_pinned_first, is_summary, rebuilt_call
from tests.support.wire_demo import chat_demo

pytestmark = pytest.mark.http

#: Same tenant, no approver scope.
EVE = {"Authorization": "Bearer local:acme:eve;scope=read write"}
PIN = "The customer's confirmed language is Portuguese; order 7731 ships to Porto."
WORDS = " ".join(f"word{n}" for n in range(1, 25))
GPT = {"context_window": 128000, "answer_reserve": 4096}


class Summaries:
    """The fake's answers: the demo model, but every summary request's cycle listed in
    ``empty`` answers nothing and every one in ``garbage`` answers noise."""

    def __init__(self, empty: set[int], garbage: set[int]) -> None:
        self.demo = chat_demo()
        self.empty = empty
        self.garbage = garbage
        self.cycles = 0

    def __call__(self, request: RecordedRequest) -> Scripted:
        if is_summary(request):
            self.cycles += 1
            if self.cycles in self.empty:
                return json_reply(completion("", model="gpt-test"))
            if self.cycles in self.garbage:
                return json_reply(completion("%%%% ~~ 0xDEADBEEF ~~ %%%%", model="gpt-test"))
        return self.demo(request)


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        yield server


def serve(
    runner_config: LocalConfig, runner_clock: ClockFile, tmp_path: Path, fake: FakeOpenAI
) -> Iterator[httpx.Client]:
    config = on_openai_chat(
        runner_config, fake, MODELS=json.dumps({"gpt-test": GPT}), CONTEXT_MAX_TOKENS="140"
    )
    yield from start(dataclasses.replace(config, data_dir=tmp_path / "data"), runner_clock)


def turn(http: httpx.Client, conversation: str, text: str) -> dict[str, Any]:
    reply = http.post(f"/v1/conversations/{conversation}/turns", json={"input": text}, headers=ANN)
    assert reply.status_code == 200, reply.text
    body: dict[str, Any] = reply.json()
    return body


def events(http: httpx.Client, conversation: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    after: int | None = 0
    while after is not None:
        page = http.get(
            f"/v1/conversations/{conversation}/events?after={after}&limit=1000", headers=ANN
        ).json()
        found += page["events"]
        after = page["next_after"]
    return found


def test_a_pin_reaches_every_later_call_byte_for_byte_across_compactions(
    runner_config: LocalConfig, runner_clock: ClockFile, tmp_path: Path, fake: FakeOpenAI
) -> None:
    summaries = Summaries(empty={2}, garbage={3})
    fake.default = summaries
    for http in serve(runner_config, runner_clock, tmp_path, fake):
        path = "/v1/conversations/pinned/pins"
        for index in range(1, 4):
            turn(http, "pinned", f"note {index}: {WORDS}")
        refused = http.post(path, json={"text": PIN, "kind": "fact"}, headers=EVE)
        assert (refused.status_code, refused.json()["error"]["code"]) == (
            403,
            "approver_scope_missing",
        )
        added = http.post(path, json={"text": PIN, "kind": "fact", "reason": "CRM"}, headers=ANN)
        assert added.status_code == 201, added.text
        pin = added.json()
        assert (pin["text"], pin["kind"], pin["author"], pin["reason"]) == (
            PIN,
            "fact",
            "ann",
            "CRM",
        )
        assert http.get(path, headers=ANN).json()["pins"] == [pin]
        # A pin over the pins' share of the budget (a quarter: 35 tokens) is refused whole.
        stored = http.get("/v1/conversations/pinned", headers=ANN).json()["events"]
        large = http.post(path, json={"text": "word " * 20, "kind": "constraint"}, headers=ANN)
        assert large.status_code == 422, large.text
        assert large.json()["error"]["code"] == "pin_budget_exceeded"
        assert large.json()["error"]["details"]["limit"] == 35
        assert http.get("/v1/conversations/pinned", headers=ANN).json()["events"] == stored
        assert http.get(path, headers=ANN).json()["pins"] == [pin]
        first_after_pin = len(fake.requests)
        for index in range(4, 21):
            turn(http, "pinned", f"note {index}: {WORDS}")
        sent = fake.requests[first_after_pin:]
        calls = [r for r in sent if not is_summary(r)]
        assert len(calls) == 17
        assert_pinned_first(calls, f"[{pin['id']} fact] {PIN}", ahead_of="Summary of")
        assert summaries.cycles >= 5
        for request in fake.requests:
            if is_summary(request):
                assert PIN not in request.body.decode()
        log = events(http, "pinned")
        compacted = [e for e in log if e["kind"] == "context_compacted"]
        assert len(compacted) >= 5, [e["kind"] for e in log]
        assert all(e["payload"]["pins"] == [pin["id"]] for e in compacted)
        [pinned] = [e for e in log if e["kind"] == "pin_added"]
        assert (pinned["actor"], pinned["payload"]["text"]) == ("ann", PIN)
        # The context route rebuilds each call with the pin, and the hashes match.
        for number in range(4, 21):
            context = http.get(f"/v1/conversations/pinned/turns/{number}/context", headers=ANN)
            call = rebuilt_call(context.json())
            assert [p["id"] for p in call["pins"]] == [pin["id"]]
            assert PIN in call["messages"][0]["content"]

        removed = http.delete(f"{path}/{pin['id']}", headers=ANN)
        assert removed.status_code == 204, removed.text
        again = http.delete(f"{path}/{pin['id']}", headers=ANN)
        assert (again.status_code, again.json()["error"]["code"]) == (404, "pin_not_found")
        before = len(fake.requests)
        turn(http, "pinned", "note 21: one two three")
        after = [r for r in fake.requests[before:] if not is_summary(r)]
        assert after and all(PIN not in r.body.decode() for r in after)
        assert http.get(path, headers=ANN).json()["pins"] == []
        context = http.get("/v1/conversations/pinned/turns/21/context", headers=ANN).json()
        assert context["all_match"] and context["calls"][0]["pins"] == []


def test_compact_on_six_turns_with_no_summary_compacts_now(
    runner_config: LocalConfig, runner_clock: ClockFile
) -> None:
    for http in start(runner_config, runner_clock):
        for index in range(1, 7):
            reply = http.post(
                "/v1/conversations/six/turns", json={"input": f"note {index}"}, headers=ANN
            )
            assert reply.json()["context"]["summary_through"] is None
        compacted = http.post("/v1/conversations/six/compact", json={}, headers=ANN)
        assert compacted.status_code == 200, compacted.text
        event = compacted.json()
        assert (event["kind"], event["actor"], event["sequence"]) == (
            "context_compacted",
            "ann",
            13,
        )
        payload = event["payload"]
        assert (payload["trigger"], payload["from_turn"], payload["to_turn"]) == ("manual", 1, 4)
        assert (payload["from_sequence"], payload["to_sequence"]) == (1, 8)
        assert payload["replaces"] is None
        head = http.get("/v1/conversations/six", headers=ANN).json()
        assert head["summary_through"] == 8
        after = http.post("/v1/conversations/six/turns", json={"input": "note 7"}, headers=ANN)
        assert after.json()["context"]["summary_through"] == 8
