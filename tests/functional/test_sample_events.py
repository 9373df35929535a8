"""Each sample event in events/ (the ones `sam local invoke -e` uses) drives its handler
to the answer API.md documents, through the function's own ``app.py`` on moto."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from moto import mock_aws
from turnledger.runtime import set_runtime
from turnledger_local.gateway import LambdaContext
from turnledger_local.template import PROJECT_ROOT

from tests.functional.http_sink import HttpSink, Reply
from tests.support.aws import aws_clients, create_bucket, create_conversations_table

Invoke = Callable[[str, dict[str, Any]], dict[str, Any]]


def load_function(name: str) -> ModuleType:
    """Import ``functions/<name>/app.py`` by path, as Lambda does."""
    path = PROJECT_ROOT / "functions" / name / "app.py"
    spec = importlib.util.spec_from_file_location(f"function_{name}_app", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def invoke(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[tuple[Invoke, HttpSink]]:
    """``invoke(function, event)`` on moto, with an approval tool served by a real sink."""
    with mock_aws(), HttpSink(dedupe=True) as sink:
        clients = aws_clients()
        table = create_conversations_table(clients.dynamodb)
        bucket = create_bucket(clients.s3)
        sink.respond("/email", Reply(body={"sent": True}))
        tools = tmp_path / "tools.json"
        tools.write_text(
            json.dumps(
                {
                    "tools": [
                        {
                            "name": "send_email",
                            "parameters": {"type": "object"},
                            "require_approval": True,
                            "executor": {"type": "http", "url": sink.url("/email")},
                        }
                    ]
                }
            )
        )
        for name, value in {
            "TABLE_NAME": table,
            "BUCKET_NAME": bucket,
            "TOOLS_FILE": str(tools),
            "TTL_SECONDS": "3600",
            "CALLBACK_KEY": "00" * 32,
        }.items():
            monkeypatch.setenv(name, value)
        set_runtime(None)
        modules: dict[str, ModuleType] = {}

        def call(function: str, event: dict[str, Any]) -> dict[str, Any]:
            module = modules.setdefault(function, load_function(function))
            context = LambdaContext(
                function_name=function, memory_limit_in_mb=512, timeout_seconds=29
            )
            result: dict[str, Any] = module.lambda_handler(event, context)
            return result

        yield call, sink
        set_runtime(None)


def body(result: dict[str, Any]) -> Any:
    return json.loads(result["body"]) if result.get("body") else None


def test_each_sample_event_gets_its_documented_answer(
    invoke: tuple[Invoke, HttpSink], load_event: Callable[[str], dict[str, Any]]
) -> None:
    """turn → 200; get → the head; events → the transcript; export → NDJSON;
    import → 201, then 409 conversation_exists; approve with nothing pending →
    409 not_awaiting_approval, then with a pending call → 200 complete; clear → 204;
    erase → a report; the OpenAI face's samples; openapi → the document."""
    call, sink = invoke
    turn = call("turn", load_event("turn"))
    assert turn["statusCode"] == 200
    assert body(turn)["output_text"] == "Noted (1 user messages so far)."

    head = call("read", load_event("get-conversation"))
    assert head["statusCode"] == 200 and body(head)["turns"] == 1

    events = call("read", load_event("get-events"))
    assert [e["kind"] for e in body(events)["events"]] == ["user_message", "assistant_message"]

    turns = body(call("read", load_event("list-turns")))
    assert [(t["turn"], t["status"], t["output_text"]) for t in turns["turns"]] == [
        (1, "complete", "Noted (1 user messages so far).")
    ]
    answer = call("read", load_event("get-turn"))
    assert (answer["statusCode"], body(answer)) == (200, body(turn))

    exported = call("read", load_event("export"))
    assert exported["statusCode"] == 200
    assert exported["headers"]["Content-Type"] == "application/x-ndjson"
    lines = [json.loads(line) for line in exported["body"].splitlines()]
    assert [line["type"] for line in lines] == ["conversation", "event", "event"]
    assert lines[0]["turns"] == 1 and lines[0]["schema_version"] == 1

    imported = call("turn", load_event("import"))
    assert imported["statusCode"] == 201
    assert body(imported)["conversation_id"] == "user-123-copy" and body(imported)["turns"] == 1
    again = call("turn", load_event("import"))
    assert again["statusCode"] == 409
    assert body(again)["error"]["code"] == "conversation_exists"

    nothing = call("approve", load_event("approve"))
    assert nothing["statusCode"] == 409
    assert body(nothing)["error"]["code"] == "not_awaiting_approval"

    ask = load_event("turn")
    ask["body"] = json.dumps({"input": '/tool send_email {"to": "bob@example.com"}'})
    # Another request: the sample's Idempotency-Key with another body would be 422.
    ask["headers"] = {**ask["headers"], "idempotency-key": "another-request"}
    paused = call("turn", ask)
    assert body(paused)["status"] == "awaiting_approval"
    assert body(paused)["pending_tool_calls"][0]["id"] == "call_1"
    inbox = call("read", load_event("list-approvals"))
    assert inbox["statusCode"] == 200
    assert [(i["conversation_id"], i["id"], i["tool"]) for i in body(inbox)["items"]] == [
        ("user-123", "call_1", "send_email")
    ]
    page = call("read", load_event("approvals-page"))
    assert page["statusCode"] == 200
    assert page["headers"]["Content-Type"].startswith("text/html")
    assert "default-src 'none'" in page["headers"]["Content-Security-Policy"]
    assert page["headers"]["Strict-Transport-Security"] == "max-age=63072000"
    approved = call("approve", load_event("approve"))
    assert approved["statusCode"] == 200
    assert body(approved)["status"] == "complete"
    assert body(approved)["output_text"] == 'Tool results: send_email: {"sent":true}'
    assert len(sink.side_effects("/email")) == 1
    assert body(call("read", load_event("list-approvals")))["items"] == []

    # Nothing waits: a cancel stops nothing and says so.
    idle = call("approve", load_event("cancel"))
    assert idle["statusCode"] == 200
    assert body(idle)["status"] == "complete" and body(idle)["cancelled_call_ids"] == []
    # The sample's token is not signed with this deployment's key: refused, nothing stored.
    forged = call("approve", load_event("callback"))
    assert forged["statusCode"] == 410
    assert body(forged)["error"]["code"] == "callback_invalid"

    cleared = call("clear", load_event("clear"))
    assert cleared["statusCode"] == 204
    assert call("read", load_event("get-conversation"))["statusCode"] == 404

    call("turn", load_event("turn"))
    erased = call("clear", load_event("erase-tenant"))
    assert erased["statusCode"] == 200
    # The conversation and the imported copy.
    assert body(erased)["conversations_removed"] == 2 and body(erased)["complete"] is True
    assert call("read", load_event("get-conversation"))["statusCode"] == 404

    created = call("turn", load_event("openai-create-conversation"))
    assert created["statusCode"] == 200 and body(created)["id"].startswith("conv_")
    # The samples name one conversation id; the face only continues one it made (an
    # unknown id is 404, as OpenAI answers), so they are sent for the one just made.
    sample = json.loads(load_event("openai-response")["body"])["conversation"]

    def for_created(name: str) -> dict[str, Any]:
        raw = json.dumps(load_event(name)).replace(sample, body(created)["id"])
        event: dict[str, Any] = json.loads(raw)
        return event

    unknown = call("turn", load_event("openai-response"))
    assert unknown["statusCode"] == 404 and body(unknown)["error"]["param"] == "conversation"
    response = call("turn", for_created("openai-response"))
    assert response["statusCode"] == 200
    assert body(response)["output"][0]["content"][0]["text"] == "Noted (1 user messages so far)."
    conversation = call("read", for_created("openai-get-conversation"))
    assert conversation["statusCode"] == 200 and body(conversation)["object"] == "conversation"
    items = call("read", for_created("openai-list-items"))
    assert [item["role"] for item in body(items)["data"]] == ["user", "assistant"]
    deleted = call("clear", for_created("openai-delete-conversation"))
    assert deleted["statusCode"] == 200 and body(deleted)["deleted"] is True
    gone = call("read", for_created("openai-get-conversation"))
    assert gone["statusCode"] == 404 and body(gone)["error"]["type"] == "not_found_error"

    document = call("read", load_event("openapi"))
    assert document["statusCode"] == 200
    assert body(document)["info"]["title"] == "turnledger"


def test_the_turn_worker_sample_runs_a_long_turn_that_the_reads_follow(
    invoke: tuple[Invoke, HttpSink], load_event: Callable[[str], dict[str, Any]]
) -> None:
    """turn-worker (the event the turn function sends, Prefer: respond-async) → the
    turn runs and its draft is done; get-turn → the final response; get-turn-stream →
    every chunk and ``done``."""
    call, _ = invoke
    ran = call("worker", load_event("turn-worker"))
    assert ran == {"turn": 1, "status": "done"}
    final = call("read", load_event("get-turn"))
    assert final["statusCode"] == 200
    assert body(final)["output_text"] == "a long answer, streamed into the draft"
    page = call("read", load_event("get-turn-stream"))
    assert page["statusCode"] == 200
    streamed = body(page)
    assert streamed["done"] and streamed["status"] == "done"
    assert "".join(c["text"] for c in streamed["chunks"]) == body(final)["output_text"]
    # A retried invocation (Lambda retries asynchronous events) runs nothing again.
    assert call("worker", load_event("turn-worker"))["skipped"] is True


def test_the_context_and_replay_samples_answer_through_their_functions(
    invoke: tuple[Invoke, HttpSink], load_event: Callable[[str], dict[str, Any]]
) -> None:
    """get-turn-context → every call's rebuilt context, hashes equal; start-replay → 202
    with ``Location`` (no turn worker here: it ran within the request); get-replay (at
    that id) → the record; the conversation is as it was."""
    call, _ = invoke
    for _ in range(2):
        turn = load_event("turn")
        turn["headers"] = {**turn["headers"], "idempotency-key": f"k-{_}"}
        assert call("turn", turn)["statusCode"] == 200
    head = body(call("read", load_event("get-conversation")))
    context = call("read", load_event("get-turn-context"))
    assert context["statusCode"] == 200
    [model_call] = body(context)["calls"]
    assert body(context)["all_match"] is True
    assert model_call["sha256"] == model_call["recorded_sha256"]
    assert [m["role"] for m in model_call["messages"]] == ["user", "assistant", "user"]

    started = call("turn", load_event("start-replay"))
    assert started["statusCode"] == 202
    replay_id = body(started)["id"]
    assert started["headers"]["Location"] == f"/v1/conversations/user-123/replays/{replay_id}"
    read = load_event("get-replay")
    read["rawPath"] = read["requestContext"]["http"]["path"] = started["headers"]["Location"]
    read["pathParameters"]["replay_id"] = replay_id
    replay = call("read", read)
    assert replay["statusCode"] == 200
    record = body(replay)
    assert record["status"] == "complete" and len(record["calls"]) == 2
    assert record["summary"]["text_similarity"] == 1.0
    assert body(call("read", load_event("get-conversation"))) == head
    missing = call("read", load_event("get-replay"))
    assert missing["statusCode"] == 404
    assert body(missing)["error"]["code"] == "replay_not_found"
