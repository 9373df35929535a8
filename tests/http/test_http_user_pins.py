"""Pins of a user over HTTP (issue 42), through the local runner against the fake OpenAI
server: a pin added once for a user (``/v1/memories/pins``, the user ``X-Memory-User``
names) reaches every model call of each of that user's conversations byte for byte, first
in the pin block, and no call of another user's; the context route rebuilds it; removing it
removes it from the next call; a pin that would not fit is refused whole.
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

from tests.functional.fake_openai import FakeOpenAI, RecordedRequest
from tests.http.conftest import on_openai_chat, start
from tests.support.pins import assert_pinned_first, is_turn_call, rebuilt_call
from tests.support.wire_demo import chat_demo

pytestmark = pytest.mark.http

MEMORY_SCOPE = "turnledger/memory"
#: A backend acting for its users: it names the user and, as an operator, may pin.
BACKEND = f"Bearer local:acme:svc;scope={MEMORY_SCOPE} turnledger/approve"
#: The same backend without the approver scope.
READER = f"Bearer local:acme:svc;scope={MEMORY_SCOPE}"
PIN = "The customer is a minor: never offer alcohol; confirmed language Portuguese."
CONVERSATION_PIN = "Order 7731 ships to Porto."
GPT = {"context_window": 128000, "answer_reserve": 4096}


def as_user(user: str, token: str = BACKEND) -> dict[str, str]:
    return {"Authorization": token, "X-Memory-User": user}


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        server.default = chat_demo()
        yield server


@pytest.fixture
def http(
    runner_config: LocalConfig, runner_clock: ClockFile, tmp_path: Path, fake: FakeOpenAI
) -> Iterator[httpx.Client]:
    config = on_openai_chat(
        runner_config,
        fake,
        MODELS=json.dumps({"gpt-test": GPT}),
        CONTEXT_MAX_TOKENS="400",
        MEMORY_ENABLED="true",
        MEMORY_USER_SCOPE=MEMORY_SCOPE,
    )
    yield from start(dataclasses.replace(config, data_dir=tmp_path / "data"), runner_clock)


def turn_calls(
    http: httpx.Client, fake: FakeOpenAI, conversation: str, user: str, text: str
) -> list[RecordedRequest]:
    """Run one turn of ``conversation`` for ``user``; the model calls it made."""
    before = len(fake.requests)
    reply = http.post(
        f"/v1/conversations/{conversation}/turns", json={"input": text}, headers=as_user(user)
    )
    assert reply.status_code == 200, reply.text
    calls = [r for r in fake.requests[before:] if is_turn_call(r)]
    assert calls
    return calls


def context(http: httpx.Client, conversation: str, number: int) -> dict[str, Any]:
    reply = http.get(
        f"/v1/conversations/{conversation}/turns/{number}/context", headers=as_user("alice")
    )
    assert reply.status_code == 200, reply.text
    body: dict[str, Any] = reply.json()
    return body


def test_a_user_pin_reaches_every_conversation_of_that_user_and_no_other(
    http: httpx.Client, fake: FakeOpenAI
) -> None:
    path = "/v1/memories/pins"
    refused = http.post(path, json={"text": PIN, "kind": "fact"}, headers=as_user("alice", READER))
    assert (refused.status_code, refused.json()["error"]["code"]) == (
        403,
        "approver_scope_missing",
    )
    added = http.post(
        path,
        json={"text": PIN, "kind": "fact", "reason": "guardian call"},
        headers=as_user("alice"),
    )
    assert added.status_code == 201, added.text
    pin = added.json()
    assert (pin["text"], pin["kind"], pin["author"], pin["reason"]) == (
        PIN,
        "fact",
        "svc",
        "guardian call",
    )
    assert http.get(path, headers=as_user("alice", READER)).json()["pins"] == [pin]
    assert http.get(path, headers=as_user("carol")).json()["pins"] == []
    # A correction names an event of one conversation: a user's pin cannot be one.
    correction = http.post(
        path, json={"text": "x", "kind": "correction", "corrects": 1}, headers=as_user("alice")
    )
    assert correction.status_code == 422, correction.text

    line = f"[{pin['id']} user fact] {PIN}"
    # Two conversations of alice, one with a pin of its own: the user's pin comes first.
    sent = turn_calls(http, fake, "alice-1", "alice", "hello, I need a drink suggestion")
    turn_calls(http, fake, "alice-2", "alice", "start")
    own = http.post(
        "/v1/conversations/alice-2/pins",
        json={"text": CONVERSATION_PIN, "kind": "fact"},
        headers=as_user("alice"),
    )
    assert own.status_code == 201, own.text
    sent += turn_calls(http, fake, "alice-2", "alice", "and what about dinner?")
    sent += turn_calls(http, fake, "alice-1", "alice", "one more question")
    assert_pinned_first(sent, line, ahead_of=CONVERSATION_PIN)
    # Another user's conversation carries none of it.
    for request in turn_calls(http, fake, "carol-1", "carol", "hello, a drink suggestion?"):
        assert PIN not in request.body.decode()

    # The context route rebuilds each call with the user's pin, byte for byte.
    for conversation, number in [("alice-1", 1), ("alice-2", 2), ("alice-1", 2)]:
        call = rebuilt_call(context(http, conversation, number))
        assert call["user_pins"] == [pin]
        assert f"\n{line}" in call["messages"][0]["content"]
    assert context(http, "carol-1", 1)["calls"][0]["user_pins"] == []
    # The state route names them among what the next call may receive.
    state = http.get("/v1/conversations/alice-2/state", headers=as_user("alice")).json()
    assert state["may_send"]["user_pins"] == [pin]
    assert [p["text"] for p in state["may_send"]["pins"]] == [CONVERSATION_PIN]
    state = http.get("/v1/conversations/carol-1/state", headers=as_user("carol")).json()
    assert state["may_send"]["user_pins"] == []

    # A replay judges the user's pin on each turn that carried it.
    check = {"type": "pin_respected", "pin_id": pin["id"], "contains": "Olá"}
    started = http.post(
        "/v1/conversations/alice-1/replays",
        json={"provider": "openai-chat", "model": "gpt-test", "expect": {"constraints": [check]}},
        headers=as_user("alice"),
    )
    assert started.status_code == 202, started.text
    replay = http.get(
        started.headers["Location"], headers=as_user("alice"), params={"wait": 20}
    ).json()
    assert replay["status"] == "complete", replay
    assert [v["passed"] for v in replay["turns"]] == [False, False]
    assert {f["constraint"] for v in replay["turns"] for f in v["failures"]} == {
        f"pin_respected:{pin['id']}"
    }

    # Removed: the next call no longer carries it; past calls still rebuild with it.
    removed = http.delete(f"{path}/{pin['id']}", headers=as_user("alice"))
    assert removed.status_code == 204, removed.text
    again = http.delete(f"{path}/{pin['id']}", headers=as_user("alice"))
    assert (again.status_code, again.json()["error"]["code"]) == (404, "pin_not_found")
    for request in turn_calls(http, fake, "alice-1", "alice", "and now?"):
        assert PIN not in request.body.decode()
    assert http.get(path, headers=as_user("alice")).json()["pins"] == []
    after = context(http, "alice-1", 3)
    assert after["all_match"] and after["calls"][0]["user_pins"] == []
    before = context(http, "alice-1", 1)
    assert before["all_match"] and before["calls"][0]["user_pins"] == [pin]


def test_a_user_pin_that_would_not_fit_is_refused_whole(http: httpx.Client) -> None:
    path = "/v1/memories/pins"
    small = http.post(path, json={"text": PIN, "kind": "constraint"}, headers=as_user("alice"))
    assert small.status_code == 201, small.text
    # The pins' share of the budget is a quarter: 100 tokens of 400.
    large = http.post(path, json={"text": "word " * 100, "kind": "fact"}, headers=as_user("alice"))
    assert large.status_code == 422, large.text
    error = large.json()["error"]
    assert (error["code"], error["details"]["limit"]) == ("pin_budget_exceeded", 100)
    assert error["details"]["tokens"] > 100
    assert http.get(path, headers=as_user("alice")).json()["pins"] == [small.json()]
    # A conversation's pin is counted with its user's pins: the same pin on two
    # conversations of the same history is refused with more tokens beside alice's pin.
    own = {"text": "x" * 1500, "kind": "fact"}
    tokens = {}
    for user in ("alice", "carol"):
        conversation = f"/v1/conversations/{user}-3"
        reply = http.post(f"{conversation}/turns", json={"input": "hi"}, headers=as_user(user))
        assert reply.status_code == 200, reply.text
        refused = http.post(f"{conversation}/pins", json=own, headers=as_user(user))
        assert refused.status_code == 422, refused.text
        assert refused.json()["error"]["code"] == "pin_budget_exceeded"
        tokens[user] = refused.json()["error"]["details"]["tokens"]
    assert tokens["alice"] > tokens["carol"]
