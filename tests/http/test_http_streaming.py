"""Long and streamed turns over HTTP, through the local runner (issue 13).

``Prefer: respond-async`` turns run in the runner's own ``TurnWorkerFunction``
environment, started through Lambda's Invoke API the way the deployed turn function
starts it; clients follow them with ``GET .../turns/{n}[/stream]``.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from httpx_sse import connect_sse
from turnledger.core.models import ConversationKey
from turnledger.turn import drafts
from turnledger_local.clock import ClockFile
from turnledger_local.runner import LocalConfig, LocalRunner

from tests.http.conftest import ANN, BOB, store_of
from tests.support.factories import START
from tests.support.worker_hooks import FAIL_MID_STREAM

pytestmark = pytest.mark.http

ASYNC = {**ANN, "Prefer": "respond-async"}
ROOT = Path(__file__).resolve().parents[2]
#: 40 words: with a 20 ms delay per word the answer takes about a second to write.
WORDS = " ".join(f"word{i}" for i in range(40))


@pytest.fixture
def streaming(runner_config: LocalConfig, runner_clock: ClockFile) -> Iterator[LocalRunner]:
    """A runner whose demo model writes slowly, chunks stored every 100 ms."""
    config = dataclasses.replace(
        runner_config,
        clock_file=runner_clock.path,
        tools_file=ROOT / "events" / "local-tools.json",
        worker_hook="tests.support.worker_hooks:demo_fails_mid_stream",
        env={"DEMO_TOKEN_DELAY_MS": "20", "DRAFT_FLUSH_MS": "100"},
    )
    with LocalRunner(config) as runner:
        yield runner


@pytest.fixture
def client(streaming: LocalRunner) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=streaming.url, timeout=30) as http:
        yield http


def follow(
    client: httpx.Client, path: str, after: int = 0, headers: Mapping[str, str] = ANN
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Long-poll ``path``'s stream from ``after`` to the end: ``(chunks, last page)``."""
    chunks: list[dict[str, Any]] = []
    for _ in range(200):
        page = client.get(f"{path}/stream", params={"after": after, "wait": 5}, headers=headers)
        assert page.status_code == 200, page.text
        assert page.headers["content-type"] == "application/json", (page.headers, page.text)
        body = page.json()
        chunks.extend(body["chunks"])
        after = body["next_after"]
        if body["done"]:
            return chunks, body
    raise AssertionError("the stream never ended")


def events_of(client: httpx.Client, conversation_id: str) -> list[dict[str, Any]]:
    answer = client.get(f"/v1/conversations/{conversation_id}/events", headers=ANN)
    assert answer.status_code == 200, answer.text
    events: list[dict[str, Any]] = answer.json()["events"]
    return events


def test_async_turn_is_accepted_and_streamed_to_the_end_while_a_second_client_resumes(
    client: httpx.Client, streaming: LocalRunner
) -> None:
    accepted = client.post(
        "/v1/conversations/long-1/turns", json={"input": f"echo: {WORDS}"}, headers=ASYNC
    )
    assert accepted.status_code == 202, accepted.text
    assert accepted.headers["location"] == "/v1/conversations/long-1/turns/1"
    assert accepted.headers["preference-applied"] == "respond-async"
    assert accepted.json() == {
        "conversation_id": "long-1",
        "turn": 1,
        "status": "in_progress",
        "stream_url": "/v1/conversations/long-1/turns/1/stream",
    }
    path = accepted.headers["location"]
    first: dict[str, Any] = {}
    seen: list[dict[str, Any]] = []
    joined = threading.Event()

    def read_all() -> None:
        after = 0
        while True:
            page = client.get(f"{path}/stream", params={"after": after, "wait": 5}, headers=ANN)
            body = page.json()
            seen.extend(body["chunks"])
            after = body["next_after"]
            if len(seen) >= 3:
                joined.set()
            if body["done"]:
                first.update(body)
                joined.set()
                return

    reader = threading.Thread(target=read_all)
    reader.start()
    assert joined.wait(30)
    # A second client (its own connection) joins halfway, from the chunk it last saw.
    halfway = seen[1]["seq"]
    progress = client.get(path, headers=ANN)
    assert progress.status_code == 200
    with httpx.Client(base_url=streaming.url, timeout=30) as other:
        rest, last = follow(other, path, after=halfway)
    reader.join(30)
    assert first["done"] and first["status"] == "done"
    # Both saw the same chunks: the second from where it joined.
    assert rest == [c for c in seen if c["seq"] > halfway]
    assert [c["seq"] for c in seen] == list(range(1, len(seen) + 1))
    assert len(seen) > 3  # batched, but streamed: more than one chunk
    text = "".join(c["text"] for c in seen)
    assert text == WORDS
    result = first["result"]
    assert result == last["result"]
    assert result["status"] == "complete" and result["output_text"] == WORDS
    # GET .../turns/1 gives the same final response; the draft is not in the transcript.
    assert client.get(path, headers=ANN).json() == result
    kinds = [e["kind"] for e in events_of(client, "long-1")]
    assert kinds == ["user_message", "assistant_message"]


def test_progress_shows_the_draft_text_while_the_turn_runs(client: httpx.Client) -> None:
    accepted = client.post(
        "/v1/conversations/long-2/turns", json={"input": f"echo: {WORDS}"}, headers=ASYNC
    )
    path = accepted.headers["location"]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        body = client.get(path, headers=ANN).json()
        if body.get("status") == "in_progress" and body["draft_text"]:
            assert WORDS.startswith(body["draft_text"])
            assert body["turn"] == 1 and body["conversation_id"] == "long-2"
            break
        time.sleep(0.05)
    else:
        raise AssertionError("never saw the draft in progress")
    follow(client, path)
    # Another tenant sees nothing of it.
    assert client.get(path, headers=BOB).status_code == 404


def test_provider_failure_mid_stream_keeps_the_draft_interrupted_and_commits_nothing(
    client: httpx.Client,
) -> None:
    accepted = client.post(
        "/v1/conversations/long-3/turns",
        json={"input": f"echo: one two three four five {FAIL_MID_STREAM}"},
        headers=ASYNC,
    )
    assert accepted.status_code == 202
    path = accepted.headers["location"]
    chunks, last = follow(client, path)
    assert "".join(c["text"] for c in chunks) == "one two three"
    assert last["status"] == "interrupted" and last["reason"] == "provider_error"
    assert last["result"]["error"]["code"] == "provider_error"
    # GET .../turns/1 answers what the synchronous turn would have: 502, with the draft.
    failed = client.get(path, headers=ANN)
    assert failed.status_code == 502
    details = failed.json()["error"]["details"]
    assert details["draft_status"] == "interrupted" and details["draft_text"] == "one two three"
    events = events_of(client, "long-3")
    assert [e["kind"] for e in events] == ["turn_failed"]
    # The next turn sees none of it: no user message, no half answer.
    again = client.post("/v1/conversations/long-3/turns", json={"input": "hi"}, headers=ANN)
    assert again.json()["output_text"] == "Noted (1 user messages so far)."


def test_cancel_mid_stream_interrupts_the_draft_and_records_why(
    client: httpx.Client, streaming: LocalRunner
) -> None:
    accepted = client.post(
        "/v1/conversations/long-4/turns", json={"input": f"echo: {WORDS}"}, headers=ASYNC
    )
    path = accepted.headers["location"]
    page = client.get(f"{path}/stream", params={"after": 0, "wait": 10}, headers=ANN).json()
    assert page["chunks"] and not page["done"]
    # POST .../cancel asks the worker to stop; it sees the flag at its next chunk.
    cancel = client.post(
        "/v1/conversations/long-4/cancel", json={"reason": "changed my mind"}, headers=ANN
    )
    assert cancel.status_code == 200, cancel.text
    assert cancel.json() == {
        "conversation_id": "long-4",
        "turn": 1,
        "status": "in_progress",
        "cancelled_call_ids": [],
        "cancel_requested": True,
    }
    chunks, last = follow(client, path, after=page["next_after"])
    text = "".join(c["text"] for c in [*page["chunks"], *chunks])
    assert WORDS.startswith(text) and text != WORDS
    assert last["status"] == "interrupted" and last["reason"] == "turn_cancelled"
    events = events_of(client, "long-4")
    assert [e["kind"] for e in events] == ["turn_interrupted"]
    assert events[0]["actor"] == events[0]["payload"]["interrupted_by"] != "system"
    assert events[0]["payload"]["reason"] == "changed my mind"
    assert client.get(path, headers=ANN).json()["error"]["code"] == "turn_cancelled"
    # Nothing of the draft reaches the next turn, and the conversation takes one at once.
    again = client.post("/v1/conversations/long-4/turns", json={"input": "hi"}, headers=ANN)
    assert again.json()["output_text"] == "Noted (1 user messages so far)."
    store = store_of(streaming)
    key = ConversationKey(tenant="acme", conversation_id="long-4")
    # A cancel of a turn that is over changes nothing.
    assert not drafts.request_cancel(store, key, 1, now=START, ttl_seconds=3600)


def test_async_turn_pauses_for_approval_and_is_continued_async(client: httpx.Client) -> None:
    accepted = client.post(
        "/v1/conversations/long-5/turns",
        json={"input": '/tool send_email {"to": "bob@example.com"}'},
        headers=ASYNC,
    )
    path = accepted.headers["location"]
    chunks, paused = follow(client, path)
    assert chunks == []  # a tool call is no text
    assert paused["status"] == "done"
    assert paused["result"]["status"] == "awaiting_approval"
    [call] = paused["result"]["pending_tool_calls"]
    # A plain turn is refused before 202 while the call awaits approval.
    refused = client.post("/v1/conversations/long-5/turns", json={"input": "hi"}, headers=ASYNC)
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "approval_pending"
    continued = client.post(
        "/v1/conversations/long-5/approvals", json={"approve": [call["id"]]}, headers=ASYNC
    )
    assert continued.status_code == 202, continued.text
    assert continued.headers["location"] == path  # the same turn goes on
    chunks, last = follow(client, path)
    result = last["result"]
    assert result["status"] == "complete"
    assert result["output_text"].startswith("Tool results: send_email:")
    assert "".join(c["text"] for c in chunks) == result["output_text"]
    kinds = [e["kind"] for e in events_of(client, "long-5")]
    assert kinds[0] == "user_message" and kinds[-1] == "assistant_message"
    assert "tool_result" in kinds
    # Nothing left to decide: an async approval is refused at once.
    again = client.post(
        "/v1/conversations/long-5/approvals", json={"approve": [call["id"]]}, headers=ASYNC
    )
    assert again.status_code == 409 and again.json()["error"]["code"] == "not_awaiting_approval"


def test_sse_streams_live_to_a_real_client_that_resumes_from_last_event_id(
    client: httpx.Client,
) -> None:
    """The runner writes each chunk as an event as soon as it is stored (a front door
    that passes streams through); a client that drops resumes with ``Last-Event-ID``."""
    words = " ".join(f"w{i}" for i in range(80))  # about 1.6 s to write
    accepted = client.post(
        "/v1/conversations/long-6/turns", json={"input": f"echo: {words}"}, headers=ASYNC
    )
    url = accepted.json()["stream_url"]
    texts: dict[int, str] = {}
    # A copy: connect_sse sets Accept on the dict it is given.
    with connect_sse(client, "GET", url, headers=dict(ANN)) as source:
        assert source.response.headers["content-type"].startswith("text/event-stream")
        for sse in source.iter_sse():
            assert sse.event == "chunk" and sse.retry in (None, 1000)
            data = sse.json()
            assert str(data["seq"]) == sse.id
            texts[data["seq"]] = data["text"]
            if len(texts) == 2:
                break  # the connection drops mid-answer
    last_id = str(max(texts))
    arrivals: list[float] = []
    result: dict[str, Any] | None = None
    with connect_sse(client, "GET", url, headers={**ANN, "Last-Event-ID": last_id}) as source:
        for sse in source.iter_sse():
            arrivals.append(time.monotonic())
            if sse.event == "chunk":
                data = sse.json()
                assert data["seq"] not in texts  # resumed after the last one seen
                texts[data["seq"]] = data["text"]
            elif sse.event == "done":
                result = sse.json()["result"]
    assert result is not None and result["output_text"] == words
    assert "".join(texts[s] for s in sorted(texts)) == words
    # Live, not buffered: the events of one connection came over a span of time.
    assert arrivals[-1] - arrivals[0] > 0.3
    bad = client.get(url, headers={**ANN, "Last-Event-ID": "x", "Accept": "text/event-stream"})
    assert bad.status_code == 422
    gone = client.get(
        "/v1/conversations/nobody/turns/1/stream",
        headers={**ANN, "Accept": "text/event-stream"},
    )
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "conversation_not_found"


def test_idempotency_key_answers_the_same_202_and_runs_once(client: httpx.Client) -> None:
    headers = {**ASYNC, "Idempotency-Key": "k-1"}
    body = {"input": "echo: once"}
    first = client.post("/v1/conversations/long-7/turns", json=body, headers=headers)
    second = client.post("/v1/conversations/long-7/turns", json=body, headers=headers)
    assert first.status_code == second.status_code == 202
    assert first.json() == second.json()
    follow(client, first.headers["location"])
    kinds = [e["kind"] for e in events_of(client, "long-7")]
    assert kinds == ["user_message", "assistant_message"]


def test_bad_reads_get_the_contracts_errors(client: httpx.Client) -> None:
    missing = client.get("/v1/conversations/nobody/turns/1", headers=ANN)
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "conversation_not_found"
    answer = client.post("/v1/conversations/long-8/turns", json={"input": "hi"}, headers=ANN)
    # A synchronous turn streams through its draft too; the draft's result is its answer.
    synchronous = client.get("/v1/conversations/long-8/turns/1/stream", headers=ANN)
    assert synchronous.status_code == 200
    assert synchronous.json()["done"] and synchronous.json()["result"] == answer.json()
    beyond = client.get("/v1/conversations/long-8/turns/2/stream", headers=ANN)
    assert beyond.status_code == 404 and beyond.json()["error"]["code"] == "turn_not_found"
    for query in ({"wait": 21}, {"after": -1}):
        bad = client.get("/v1/conversations/long-8/turns/1/stream", params=query, headers=ANN)
        assert bad.status_code == 422, query
        assert bad.json()["error"]["code"] == "validation_error"
    zero = client.get("/v1/conversations/long-8/turns/0", headers=ANN)
    assert zero.status_code == 422 and zero.json()["error"]["code"] == "validation_error"
    assert client.get("/v1/conversations/long-8/turns/1", headers={}).status_code == 401


def test_a_second_async_turn_while_one_runs_is_busy_and_clear_removes_drafts(
    client: httpx.Client, streaming: LocalRunner
) -> None:
    first = client.post(
        "/v1/conversations/long-9/turns", json={"input": f"echo: {WORDS}"}, headers=ASYNC
    )
    assert first.status_code == 202
    busy = client.post("/v1/conversations/long-9/turns", json={"input": "x"}, headers=ASYNC)
    # Accepted as turn 1 too (nothing committed yet), while turn 1 is running.
    assert busy.status_code == 409 and busy.json()["error"]["code"] == "conversation_busy"
    follow(client, first.headers["location"])
    assert client.delete("/v1/conversations/long-9", headers=ANN).status_code == 204
    store = store_of(streaming)
    key = ConversationKey(tenant="acme", conversation_id="long-9")
    assert drafts.read(store, key, 1).state is None
    assert drafts.read(store, key, 1).chunks == []
    gone = client.get(first.headers["location"], headers=ANN)
    assert gone.status_code == 404


def test_the_runner_serves_lambdas_invoke_api_to_boto3_on_loopback_only(
    streaming: LocalRunner,
) -> None:
    import json

    import boto3
    from turnledger_local.gateway import HttpRequest

    lambda_client = boto3.client(
        "lambda",
        endpoint_url=streaming.url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    queued = lambda_client.invoke(
        FunctionName="TurnWorkerFunction", InvocationType="Event", Payload=b'{"kind": "x"}'
    )
    assert queued["StatusCode"] == 202
    # Synchronously, the worker's refusal of a stray event is a function error, as on AWS.
    refused = lambda_client.invoke(FunctionName="TurnWorkerFunction", Payload=b'{"kind": "x"}')
    assert refused["FunctionError"] == "Unhandled"
    assert "errorType" in json.loads(refused["Payload"].read())
    with pytest.raises(lambda_client.exceptions.ResourceNotFoundException):
        lambda_client.invoke(FunctionName="NoSuchFunction", Payload=b"{}")
    remote = streaming.handle(
        HttpRequest(
            method="POST",
            raw_path="/2015-03-31/functions/TurnWorkerFunction/invocations",
            body=b"{}",
            source_ip="192.0.2.7",
        )
    )
    assert remote.status == 403
