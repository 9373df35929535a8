"""Long-term memory per user over HTTP, through the local runner, on DynamoDB Local and
SQLite: recall across conversations, isolation between users and tenants, supersede by
key, delete one and all, tenant erasure, opt-out, and an extraction that fails.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from turnledger_local.runner import LocalConfig, LocalRunner

from tests.http.conftest import fresh_config, on_storage, serve

pytestmark = pytest.mark.http

ANN = {"Authorization": "Bearer local:acme:ann"}
BOB = {"Authorization": "Bearer local:acme:bob"}
ANN_ELSEWHERE = {"Authorization": "Bearer local:globex:ann"}
MEMORY_ON = {"MEMORY_ENABLED": "true"}


def _serve(
    request: pytest.FixtureRequest, tmp_path: Path, env: dict[str, str]
) -> Iterator[httpx.Client]:
    config = on_storage(fresh_config(), request, tmp_path / "data")
    with serve(None, config, env=env) as client:
        yield client


@pytest.fixture(params=["dynamodb-local", "sqlite"])
def api(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[httpx.Client]:
    """A runner with memory on, on DynamoDB Local or SQLite."""
    yield from _serve(request, tmp_path, dict(MEMORY_ON))


def say(
    api: httpx.Client, conversation_id: str, text: str, headers: dict[str, str], **body: Any
) -> str:
    answer = api.post(
        f"/v1/conversations/{conversation_id}/turns",
        json={"input": text, **body},
        headers=headers,
    )
    assert answer.status_code == 200, answer.text
    return str(answer.json()["output_text"])


def memories(api: httpx.Client, headers: dict[str, str]) -> list[dict[str, Any]]:
    answer = api.get("/v1/memories", headers=headers)
    assert answer.status_code == 200, answer.text
    items: list[dict[str, Any]] = answer.json()["items"]
    return items


def run_records(api: httpx.Client, conversation_id: str, headers: dict[str, str]) -> list[Any]:
    events = api.get(f"/v1/conversations/{conversation_id}/events", headers=headers).json()
    return [
        e["payload"]["run"]
        for e in events["events"]
        if e["kind"] == "assistant_message" and e["payload"].get("run")
    ]


def test_a_new_conversation_of_the_same_user_answers_from_memory(api: httpx.Client) -> None:
    assert say(api, "mem-one", "Hi! My name is Ann and I work on payments.", ANN)
    [extracting] = run_records(api, "mem-one", ANN)
    assert extracting["memory_usage"]["input_tokens"] > 0  # the extraction's usage is counted
    kept = {m["key"]: m for m in memories(api, ANN)}
    assert kept["name"]["text"] == "My name is Ann."
    assert kept["work"]["text"] == "I work on payments."
    assert kept["name"]["conversation_id"] == "mem-one"
    assert kept["name"]["source"] == "extracted"
    assert kept["name"]["from_sequence"] == kept["name"]["to_sequence"] == 1

    assert say(api, "mem-two", "what is my name?", ANN) == "Your name is Ann."
    [recalling] = run_records(api, "mem-two", ANN)
    assert kept["name"]["id"] in recalling["memory_ids"]


def test_another_user_or_tenant_never_sees_it(api: httpx.Client) -> None:
    say(api, "mem-iso", "my name is Ann", ANN)
    [record] = memories(api, ANN)

    for other in (BOB, ANN_ELSEWHERE):
        assert say(api, "mem-iso-other", "what is my name?", other) == (
            "I don't know your name yet."
        )
        assert memories(api, other) == []
        gone = api.delete(f"/v1/memories/{record['id']}", headers=other)
        assert gone.status_code == 404
        assert gone.json()["error"]["code"] == "memory_not_found"
        edit = api.patch(f"/v1/memories/{record['id']}", json={"text": "x"}, headers=other)
        assert edit.status_code == 404
    assert memories(api, ANN) == [record]


def test_a_statement_with_the_same_key_supersedes_the_old_one(api: httpx.Client) -> None:
    say(api, "mem-berlin", "I live in Berlin.", ANN)
    [berlin] = memories(api, ANN)
    say(api, "mem-paris", "Big news: I moved to Paris.", ANN)
    [paris] = memories(api, ANN)
    assert (paris["id"], paris["key"], paris["text"]) == (berlin["id"], "city", "I live in Paris.")
    assert paris["conversation_id"] == "mem-paris"
    assert paris["created_at"] == berlin["created_at"]

    # By hand too: a record with an existing key supersedes it (200, not 201).
    answer = api.post("/v1/memories", json={"text": "I live in Rome.", "key": "city"}, headers=ANN)
    assert answer.status_code == 200
    assert [m["text"] for m in memories(api, ANN)] == ["I live in Rome."]


def test_delete_one_then_all(api: httpx.Client) -> None:
    say(api, "mem-del", "my name is Ann. I work on search.", ANN)
    kept = {m["key"]: m for m in memories(api, ANN)}
    assert api.delete(f"/v1/memories/{kept['name']['id']}", headers=ANN).status_code == 204
    assert [m["key"] for m in memories(api, ANN)] == ["work"]
    assert say(api, "mem-del-2", "what is my name?", ANN) == "I don't know your name yet."

    added = api.post("/v1/memories", json={"text": "I like tea."}, headers=ANN)
    assert added.status_code == 201
    assert added.json()["source"] == "manual"
    cleared = api.delete("/v1/memories", headers=ANN)
    assert cleared.status_code == 200
    assert cleared.json() == {"deleted": 2}
    assert memories(api, ANN) == []


def test_tenant_erasure_removes_memory(api: httpx.Client) -> None:
    say(api, "mem-erase", "my name is Ann", ANN)
    say(api, "mem-erase", "my name is Ann", ANN_ELSEWHERE)
    api.post("/v1/memories", json={"text": "I like tea."}, headers=BOB)

    erased = api.delete("/v1/conversations", headers=ANN)
    assert erased.status_code == 200 and erased.json()["complete"] is True
    assert memories(api, ANN) == []
    assert memories(api, BOB) == []
    assert say(api, "mem-erase-2", "what is my name?", ANN) == "I don't know your name yet."
    # Another tenant's memory is its own.
    assert [m["key"] for m in memories(api, ANN_ELSEWHERE)] == ["name"]


def test_a_turn_that_opts_out_neither_writes_nor_recalls(api: httpx.Client) -> None:
    """``"memory": false`` opts the conversation out from that turn on (later turns need not
    repeat it); ``true`` opts it back in."""
    say(api, "mem-out", "my name is Zed", ANN, memory=False)
    say(api, "mem-out", "I live in Oslo", ANN)
    assert memories(api, ANN) == []
    say(api, "mem-out", "I work on billing", ANN, memory=True)
    assert [m["key"] for m in memories(api, ANN)] == ["work"]
    api.delete("/v1/memories", headers=ANN)
    say(api, "mem-out-2", "my name is Ann", ANN)
    assert say(api, "mem-out-3", "what is my name?", ANN, memory=False) == (
        "I don't know your name yet."
    )
    [run] = run_records(api, "mem-out-3", ANN)
    assert run["memory_ids"] == [] and run["memory_usage"] is None


@pytest.fixture(params=["dynamodb-local", "sqlite"])
def api_without_memory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[httpx.Client]:
    """A runner as deployed by default: memory off."""
    yield from _serve(request, tmp_path, {})


def test_a_deployment_with_memory_off_keeps_none(api_without_memory: httpx.Client) -> None:
    api = api_without_memory
    say(api, "mem-off", "my name is Ann", ANN)
    assert memories(api, ANN) == []
    assert say(api, "mem-off-2", "what is my name?", ANN) == "I don't know your name yet."


@pytest.fixture(params=["dynamodb-local", "sqlite"])
def api_failing_extractor(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[httpx.Client]:
    """Memory on, with a summarizer whose endpoint refuses every connection."""
    env = {
        **MEMORY_ON,
        "SUMMARIZER_PROVIDER": "openai-chat",
        "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
        "OPENAI_API_KEY": "sk-test",
        "PROVIDER_MAX_RETRIES": "0",
        "PROVIDER_TIMEOUT_SECONDS": "2",
    }
    yield from _serve(request, tmp_path, env)


def test_a_failed_extraction_does_not_fail_the_turn(api_failing_extractor: httpx.Client) -> None:
    api = api_failing_extractor
    assert say(api, "mem-fail", "my name is Ann", ANN) == "Noted (1 user messages so far)."
    assert memories(api, ANN) == []
    state = api.get("/v1/conversations/mem-fail", headers=ANN).json()
    assert state["status"] == "complete"


def test_manual_records_their_cap_and_a_named_user(tmp_path: Path) -> None:
    env = {**MEMORY_ON, "MEMORY_MAX_RECORDS": "2", "MEMORY_USER_SCOPE": "turnledger/memory"}
    config = LocalConfig(port=0, ttl_seconds=3600, data_dir=tmp_path / "data", env=env)
    with LocalRunner(config) as runner, httpx.Client(base_url=runner.url, timeout=30) as api:
        first = api.post("/v1/memories", json={"text": "I like tea."}, headers=ANN).json()
        edited = api.patch(
            f"/v1/memories/{first['id']}",
            json={"text": "I like green tea.", "key": "drink"},
            headers=ANN,
        )
        assert edited.status_code == 200
        assert (edited.json()["text"], edited.json()["key"]) == ("I like green tea.", "drink")
        api.post("/v1/memories", json={"text": "I have a cat."}, headers=ANN)
        full = api.post("/v1/memories", json={"text": "I have a dog."}, headers=ANN)
        assert full.status_code == 409
        assert full.json()["error"] == {
            "code": "memory_full",
            "message": "the user keeps at most 2 memory records; delete some first",
            "details": {"limit": 2},
        }
        page = api.get("/v1/memories?limit=1", headers=ANN).json()
        assert [m["id"] for m in page["items"]] == [first["id"]]
        rest = api.get(f"/v1/memories?after={page['next_cursor']}", headers=ANN).json()
        assert [m["text"] for m in rest["items"]] == ["I have a cat."]
        assert rest["next_cursor"] is None

        # Naming the user: only a caller holding MEMORY_USER_SCOPE.
        named = {"X-Memory-User": "ann"}
        refused = api.get("/v1/memories", headers={**BOB, **named})
        assert refused.status_code == 403
        assert refused.json()["error"]["code"] == "memory_user_not_allowed"
        backend = {"Authorization": "Bearer local:acme:svc;scope=turnledger/memory", **named}
        assert len(api.get("/v1/memories", headers=backend).json()["items"]) == 2
        answer = api.post(
            "/v1/conversations/mem-named/turns",
            json={"input": "what do I drink? what is my name"},
            headers=backend,
        )
        assert answer.status_code == 200
        assert (
            api.get("/v1/memories", headers={"Authorization": backend["Authorization"]}).json()[
                "items"
            ]
            == []
        )
