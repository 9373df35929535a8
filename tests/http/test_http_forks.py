"""Forks through the local runner, on DynamoDB Local and on SQLite (``--data-dir``).

A fork continues a conversation from the end of any turn, copying nothing: each side keeps
its own memory, the original is never touched, and a fork keeps its inherited history
whatever happens to its parent (deleted, expired, swept), until nothing reads it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from turnledger.core.models import ConversationKey
from turnledger_local.clock import ClockFile
from turnledger_local.runner import LocalConfig, LocalRunner

from tests.http.conftest import ANN, BOB, on_storage, store_of
from tests.support.factories import START, data_sort_keys, raw_sort_keys

TTL = 3600


@pytest.fixture(scope="module")
def clock(tmp_path_factory: pytest.TempPathFactory) -> ClockFile:
    return ClockFile(tmp_path_factory.mktemp("clock") / "clock", START)


@pytest.fixture(scope="module", params=["dynamodb-local", "sqlite"])
def runner(
    request: pytest.FixtureRequest,
    clock: ClockFile,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[LocalRunner]:
    suffix = uuid.uuid4().hex[:8]
    config = LocalConfig(
        tools_file=Path(__file__).resolve().parents[2] / "events" / "local-tools.json",
        port=0,
        ttl_seconds=TTL,
        table=f"fork-{suffix}",
        bucket=f"fork-{suffix}",
        clock_file=clock.path,
        env={"PROVIDERS": "demo,demo-stateful"},
    )
    with LocalRunner(on_storage(config, request, tmp_path_factory.mktemp("data"))) as served:
        yield served


@pytest.fixture
def http(runner: LocalRunner) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=runner.url, headers=ANN, timeout=30) as client:
        yield client


def key_of(conversation: str) -> ConversationKey:
    return ConversationKey(tenant="acme", conversation_id=conversation)


def new_id(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:10]}"


def say(http: httpx.Client, conversation: str, text: str) -> dict[str, Any]:
    response = http.post(f"/v1/conversations/{conversation}/turns", json={"input": text})
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def fork(http: httpx.Client, parent: str, to: str, after_turn: int | None = None) -> httpx.Response:
    body: dict[str, Any] = {"to": to}
    if after_turn is not None:
        body["after_turn"] = after_turn
    return http.post(f"/v1/conversations/{parent}/fork", json=body)


def events(http: httpx.Client, conversation: str) -> list[dict[str, Any]]:
    response = http.get(f"/v1/conversations/{conversation}/events", params={"limit": 1000})
    assert response.status_code == 200, response.text
    found: list[dict[str, Any]] = response.json()["events"]
    return found


def five_turns(http: httpx.Client, conversation: str) -> None:
    say(http, conversation, "My name is Sam.")
    for text in ("Hello there.", "Tell me more.", "And more.", "That is all."):
        say(http, conversation, text)


def test_each_side_of_a_fork_keeps_its_own_memory(http: httpx.Client) -> None:
    """Fork at turn 2 of 5; "my name is Max" on the fork: the fork answers Max, the
    original still Sam; the fork's head names its parent, its events start with the
    inherited ones (their original numbers and conversation), the original is unchanged."""
    original, branch = new_id("sam"), new_id("max")
    five_turns(http, original)
    before = events(http, original)
    made = fork(http, original, branch, after_turn=2)
    assert made.status_code == 201, made.text
    head = made.json()
    inherited = [e for e in before if e["turn"] <= 2]
    assert head["parent"] == {
        "conversation_id": original,
        "turn": 2,
        "seq": inherited[-1]["sequence"],
    }
    assert (head["conversation_id"], head["turns"], head["events"]) == (branch, 2, len(inherited))
    assert head["forks"] == 0 and head["status"] == "complete"

    say(http, branch, "My name is Max.")
    assert say(http, branch, "What is my name?")["output_text"] == "Your name is Max."
    assert say(http, original, "What is my name?")["output_text"] == "Your name is Sam."

    fork_events = events(http, branch)
    assert fork_events[: len(inherited)] == inherited
    own = fork_events[len(inherited) :]
    assert {e["conversation_id"] for e in own} == {branch}
    assert [e["sequence"] for e in fork_events] == list(range(1, len(fork_events) + 1))
    assert own[0]["turn"] == 3
    assert events(http, original)[: len(before)] == before

    parent = http.get(f"/v1/conversations/{original}").json()
    assert parent["parent"] is None and parent["forks"] == 1
    listed = http.get(f"/v1/conversations/{original}/forks").json()
    assert [(f["conversation_id"], f["turn"]) for f in listed["forks"]] == [(branch, 2)]
    assert listed["next_after"] is None


def test_fork_of_a_fork_reads_through_both(http: httpx.Client) -> None:
    """A fork of a fork after its own turns sees both parents' history; one after an
    inherited turn sees only the grandparent's part."""
    root, middle = new_id("root"), new_id("mid")
    five_turns(http, root)
    assert fork(http, root, middle, after_turn=1).status_code == 201
    say(http, middle, "My name is Max.")
    deep, shallow = new_id("deep"), new_id("shallow")
    assert fork(http, middle, deep).status_code == 201
    assert fork(http, middle, shallow, after_turn=1).status_code == 201
    assert say(http, deep, "What is my name?")["output_text"] == "Your name is Max."
    assert say(http, shallow, "What is my name?")["output_text"] == "Your name is Sam."
    deep_events = events(http, deep)
    assert [e["conversation_id"] for e in deep_events[:3]] == [root, root, middle]
    listed = http.get(f"/v1/conversations/{middle}/forks", params={"limit": 1}).json()
    assert len(listed["forks"]) == 1 and listed["next_after"] is not None
    rest = http.get(
        f"/v1/conversations/{middle}/forks", params={"after": listed["next_after"]}
    ).json()
    assert {f["conversation_id"] for f in listed["forks"] + rest["forks"]} == {deep, shallow}
    assert rest["next_after"] is None


def test_fork_is_refused_where_a_turn_still_waits(http: httpx.Client) -> None:
    """A pending approval at the fork point: 409 fork_point_open naming the wait; an earlier
    turn forks; a taken id is 409 conversation_exists; a missing parent or another tenant's
    is 404; a turn past the latest is 422; nothing was created by the refusals."""
    waiting, branch = new_id("wait"), new_id("branch")
    say(http, waiting, "My name is Sam.")
    paused = say(http, waiting, '/tool send_email {"to": "bob@example.com"}')
    assert paused["status"] == "awaiting_approval"
    refused = fork(http, waiting, branch)
    assert refused.status_code == 409, refused.text
    error = refused.json()["error"]
    assert error["code"] == "fork_point_open"
    assert error["details"]["status"] == "awaiting_approval"
    assert http.get(f"/v1/conversations/{branch}").status_code == 404
    assert fork(http, waiting, branch, after_turn=1).status_code == 201
    taken = fork(http, waiting, branch, after_turn=1)
    assert (taken.status_code, taken.json()["error"]["code"]) == (409, "conversation_exists")
    past = fork(http, waiting, new_id("past"), after_turn=9)
    assert (past.status_code, past.json()["error"]["code"]) == (422, "invalid_fork_point")
    assert fork(http, new_id("missing"), new_id("x")).status_code == 404
    other = http.post(f"/v1/conversations/{waiting}/fork", json={"to": new_id("x")}, headers=BOB)
    assert other.status_code == 404
    assert http.get(f"/v1/conversations/{waiting}").json()["status"] == "awaiting_approval"


def test_fork_outlives_its_deleted_and_expired_parents(
    http: httpx.Client, clock: ClockFile
) -> None:
    """DELETE of the parent is 204 and the parent is gone for every route, while the fork
    still answers from its inherited turns; the same after a parent expires and is swept."""
    deleted, expired = new_id("deleted"), new_id("expired")
    kept_a, kept_b = new_id("keep-a"), new_id("keep-b")
    for parent, child in ((deleted, kept_a), (expired, kept_b)):
        say(http, parent, "My name is Sam.")
        say(http, parent, "Hello.")
        assert fork(http, parent, child).status_code == 201
    assert http.delete(f"/v1/conversations/{deleted}").status_code == 204
    for route in ("", "/events", "/forks", "/export"):
        assert http.get(f"/v1/conversations/{deleted}{route}").status_code == 404
    assert say(http, kept_a, "What is my name?")["output_text"] == "Your name is Sam."
    assert http.get(f"/v1/conversations/{kept_a}").json()["parent"]["conversation_id"] == deleted

    clock.advance(TTL - 60)
    say(http, kept_b, "Still here.")
    clock.advance(120)  # the parent expired; the fork, used a minute ago, did not
    swept = http.post("/_local/sweep", json={"conversation_ids": [expired], "tenant": "acme"})
    assert swept.status_code == 200 and swept.json()["conversations_removed"] == 1
    assert http.get(f"/v1/conversations/{expired}").status_code == 404
    assert say(http, kept_b, "What is my name?")["output_text"] == "Your name is Sam."
    assert [e["conversation_id"] for e in events(http, kept_b)][:2] == [expired, expired]


def test_storage_no_fork_reads_is_reclaimed(
    http: httpx.Client, runner: LocalRunner, clock: ClockFile
) -> None:
    """A deleted parent's events stay stored while a fork reads them and no longer: when the
    fork is deleted, at once; when the fork expires, the sweep that removes it reports the
    parent's life reclaimed. Nothing of either is left in the table (but the bare
    gravestones a purge leaves for DynamoDB's TTL at the slots written in its last hour,
    holding no data: docs/STORAGE.md)."""
    store = store_of(runner)
    first, first_fork = new_id("gone"), new_id("last")
    second, second_fork = new_id("gone2"), new_id("last2")
    for parent, child in ((first, first_fork), (second, second_fork)):
        say(http, parent, "My name is Sam.")
        assert fork(http, parent, child).status_code == 201
        say(http, child, "Hello.")
        assert http.delete(f"/v1/conversations/{parent}").status_code == 204
        kept = raw_sort_keys(store, key_of(parent))
        assert [k for k in kept if k.startswith("E#")]
        assert http.get(f"/v1/conversations/{parent}").status_code == 404

    assert http.delete(f"/v1/conversations/{first_fork}").status_code == 204
    assert data_sort_keys(store, key_of(first)) == []
    assert data_sort_keys(store, key_of(first_fork)) == []

    clock.advance(TTL + 1)
    swept = http.post(
        "/_local/sweep", json={"conversation_ids": [second_fork], "tenant": "acme"}
    ).json()
    assert swept["conversations_removed"] == 1 and swept["fork_lives_reclaimed"] == 1
    assert data_sort_keys(store, key_of(second)) == []
    assert data_sort_keys(store, key_of(second_fork)) == []
    fresh = say(http, first, "What is my name?")
    assert (fresh["turn"], fresh["output_text"]) == (1, "I don't know your name yet.")


def test_export_of_a_fork_reimports_as_a_whole_conversation(http: httpx.Client) -> None:
    """The export of a fork holds its inherited events too; imported elsewhere, it is an
    ordinary conversation that remembers both sides of the fork point."""
    parent, child, copy = new_id("exp"), new_id("expfork"), new_id("copy")
    say(http, parent, "My name is Sam.")
    say(http, parent, "Hello.")
    assert fork(http, parent, child, after_turn=1).status_code == 201
    say(http, child, "I like tea.")
    exported = http.get(f"/v1/conversations/{child}/export")
    assert exported.status_code == 200, exported.text
    imported = http.post(
        f"/v1/conversations/{copy}/import",
        content=exported.content,
        headers={"Content-Type": "application/x-ndjson"},
    )
    assert imported.status_code == 201, imported.text
    assert imported.json()["parent"] is None
    assert imported.json()["events"] == len(events(http, child)) + 1
    assert say(http, copy, "What is my name?")["output_text"] == "Your name is Sam."


def test_fork_body_errors(http: httpx.Client) -> None:
    """A bad ``to`` or ``after_turn`` is 422 in the error shape; nothing is created."""
    parent = new_id("body")
    say(http, parent, "Hi.")
    for body in ({}, {"to": "bad id"}, {"to": "ok", "after_turn": -1}, {"to": "ok", "x": 1}):
        response = http.post(f"/v1/conversations/{parent}/fork", json=body)
        assert response.status_code == 422, (body, response.text)
        assert response.json()["error"]["code"] == "validation_error"
    assert http.get(f"/v1/conversations/{parent}").json()["forks"] == 0


def test_a_fork_continues_the_providers_stored_response(http: httpx.Client) -> None:
    """A stateful provider's stored response at the fork point is continued (the latest
    answer's cursor, or the one an earlier answer's run record names); a fork whose point
    the provider holds nothing for starts fresh. Approvals work on a fork as anywhere."""
    parent = new_id("stateful")
    stateful = {"provider": "demo-stateful"}
    for text in ("My name is Bo.", "Hello."):
        http.post(f"/v1/conversations/{parent}/turns", json={"input": text, **stateful})
    at_latest, at_first = new_id("latest"), new_id("first")
    assert fork(http, parent, at_latest).status_code == 201
    assert fork(http, parent, at_first, after_turn=1).status_code == 201
    for branch in (at_latest, at_first):
        answer = http.post(
            f"/v1/conversations/{branch}/turns", json={"input": "What is my name?", **stateful}
        ).json()
        assert answer["context"]["provider_state"] == "continued", branch
        assert answer["context"]["messages_sent"] == 1
        assert answer["output_text"] == "Your name is Bo."

    plain, plain_fork = new_id("plain"), new_id("plainfork")
    say(http, plain, "My name is Bo.")
    assert fork(http, plain, plain_fork).status_code == 201
    answer = http.post(
        f"/v1/conversations/{plain_fork}/turns", json={"input": "What is my name?", **stateful}
    ).json()
    assert (answer["context"]["provider_state"], answer["output_text"]) == (
        "fresh",
        "Your name is Bo.",
    )
    paused = say(http, plain_fork, '/tool send_email {"to": "bob@example.com"}')
    call = paused["pending_tool_calls"][0]["id"]
    decided = http.post(f"/v1/conversations/{plain_fork}/approvals", json={"approve": [call]})
    assert decided.status_code == 200 and decided.json()["status"] == "complete"
    assert http.get(f"/v1/conversations/{plain}").json()["turns"] == 1


def test_a_long_turn_streams_on_a_fork(http: httpx.Client) -> None:
    """``Prefer: respond-async`` on a fork: 202, the turn runs in the turn worker, its stream
    ends with the answer, which remembers the inherited turns."""
    parent, branch = new_id("longp"), new_id("longf")
    say(http, parent, "My name is Sam.")
    assert fork(http, parent, branch).status_code == 201
    accepted = http.post(
        f"/v1/conversations/{branch}/turns",
        json={"input": "What is my name?"},
        headers={"Prefer": "respond-async"},
    )
    assert accepted.status_code == 202, accepted.text
    assert accepted.json()["turn"] == 2
    stream = http.get(f"/v1/conversations/{branch}/turns/2/stream", params={"wait": 10}).json()
    while not stream["done"]:
        stream = http.get(
            f"/v1/conversations/{branch}/turns/2/stream",
            params={"wait": 10, "after": stream["next_after"] or 0},
        ).json()
    assert stream["status"] == "done"
    assert stream["result"]["output_text"] == "Your name is Sam."
