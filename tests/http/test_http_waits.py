"""Tools that wait, over HTTP through the local runner: human input, deferred tools settled
by signed callbacks, mixed waits in one turn, cancel and interrupted turns.

One runner per module on DynamoDB Local (concurrent callbacks and cancels need a real
engine), its functions reading their time from a clock file the tests move. The deferred
tool is a real HTTP sink answering ``202 {"task_id"}``; its job is played by the test,
which POSTs the ``callback_url`` the sink received, with no credentials.
"""

from __future__ import annotations

import itertools
import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from turnledger_local.clock import ClockFile
from turnledger_local.runner import LocalConfig, LocalRunner

from tests.functional.http_sink import HttpSink, RecordedRequest, Reply
from tests.functional.test_tool_turns import lines, tool_line
from tests.http.conftest import on_ddb_local, tools_file
from tests.support.concurrency import all_at_once
from tests.support.factories import START
from tests.support.worker_hooks import DIE_IN_TOOLS, FAULTS_DIR

pytestmark = pytest.mark.integration

ANN = {"Authorization": "Bearer local:acme:ann"}
BEN = {"Authorization": "Bearer local:acme:ben"}
#: Same tenant, no approver scope: may answer its own client calls, nobody's job or input.
EVE = {"Authorization": "Bearer local:acme:eve;scope=read"}

#: The deferred tool's window for its callback.
DEFERRED_TTL = 600


def registry(sink: HttpSink) -> list[dict[str, Any]]:
    return [
        {
            "name": "ask_operator",
            "description": "Ask a person.",
            "parameters": {"type": "object", "properties": {"question": {"type": "string"}}},
            "executor": {"type": "human"},
        },
        {
            "name": "run_report",
            "description": "A long job.",
            "parameters": {"type": "object"},
            "executor": {
                "type": "http",
                "url": sink.url("/report"),
                "deferred": True,
                "deferred_ttl_seconds": DEFERRED_TTL,
            },
        },
        {
            "name": "surprise_job",
            "description": "Answers 202 without being declared deferred.",
            "parameters": {"type": "object"},
            "executor": {"type": "http", "url": sink.url("/surprise")},
        },
        {
            "name": "send_email",
            "parameters": {"type": "object"},
            "require_approval": True,
            "executor": {"type": "http", "url": sink.url("/email")},
        },
        {"name": "lookup_user", "parameters": {"type": "object"}, "executor": {"type": "client"}},
        {
            "name": "quick_step",
            "parameters": {"type": "object"},
            "executor": {"type": "http", "url": sink.url("/quick")},
        },
        {
            "name": "slow_step",
            "parameters": {"type": "object"},
            "executor": {"type": "http", "url": sink.url("/slow"), "timeout_seconds": 20},
        },
    ]


@pytest.fixture(scope="module")
def sink() -> Iterator[HttpSink]:
    with HttpSink(dedupe=True) as server:
        server.respond("/report", Reply(status=202, body={"task_id": "job-1"}))
        server.respond("/email", Reply(body={"sent": True}))
        server.respond("/slow", Reply(body={"slow": "done"}, delay=3.0))
        server.respond("/quick", Reply(body={"quick": True}))
        server.respond("/surprise", Reply(status=202, body={"task_id": "job-9"}))
        yield server


@pytest.fixture(scope="module")
def clock(tmp_path_factory: pytest.TempPathFactory) -> ClockFile:
    return ClockFile(tmp_path_factory.mktemp("clock") / "clock", START)


@pytest.fixture(scope="module")
def faults(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Files here inject faults into the functions (tests/support/worker_hooks.py)."""
    return tmp_path_factory.mktemp("faults")


@pytest.fixture(scope="module")
def runner(
    sink: HttpSink,
    clock: ClockFile,
    faults: Path,
    ddb_local_endpoint: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[LocalRunner]:
    config = on_ddb_local(
        ddb_local_endpoint,
        ttl_seconds=30 * 86400,
        tools_file=tools_file(tmp_path_factory.mktemp("registry"), registry(sink)),
        clock_file=clock.path,
        worker_hook="tests.support.worker_hooks:die_in_tools",
        env={FAULTS_DIR: str(faults)},
    )
    with LocalRunner(config) as served:
        yield served


@pytest.fixture
def client(runner: LocalRunner) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=runner.url, headers=ANN, timeout=30) as http:
        yield http


@pytest.fixture
def anonymous(runner: LocalRunner) -> Iterator[httpx.Client]:
    """A client with no credentials: what a tool's job has."""
    with httpx.Client(timeout=30) as http:
        yield http


@pytest.fixture
def conversation() -> str:
    return f"wait-{uuid.uuid4().hex[:12]}"


def turn(client: httpx.Client, conversation: str, text: Any) -> httpx.Response:
    return client.post(f"/v1/conversations/{conversation}/turns", json={"input": text})


def approvals(
    client: httpx.Client, conversation: str, headers: dict[str, str] | None = None, **body: Any
) -> httpx.Response:
    return client.post(f"/v1/conversations/{conversation}/approvals", json=body, headers=headers)


def ok(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def error_of(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert set(error) == {"code", "message", "details"}
    return error


def events(client: httpx.Client, conversation: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = ok(
        client.get(f"/v1/conversations/{conversation}/events", params={"limit": 1000})
    )["events"]
    return found


def kinds(client: httpx.Client, conversation: str) -> list[str]:
    return [e["kind"] for e in events(client, conversation)]


def report_request(sink: HttpSink, conversation: str) -> RecordedRequest:
    [request] = [
        r for r in sink.requests_for("/report") if r.json()["conversation_id"] == conversation
    ]
    return request


def callback_url(sink: HttpSink, conversation: str) -> str:
    url: str = report_request(sink, conversation).json()["callback_url"]
    return url


# --- human input ---------------------------------------------------------------------------


def test_human_tool_waits_and_is_answered_on_the_approvals_route(
    client: httpx.Client, conversation: str
) -> None:
    """awaiting_hitl with requires "input"; a plain turn is 409 input_pending; the output
    from another person continues the turn; the transcript says who gave it."""
    paused = ok(turn(client, conversation, tool_line("ask_operator", question="budget?")))
    assert paused["status"] == "awaiting_hitl" and paused["awaiting"] == ["input"]
    [pending] = paused["pending_tool_calls"]
    assert (pending["id"], pending["requires"]) == ("call_1", "input")
    head = ok(client.get(f"/v1/conversations/{conversation}"))
    assert head["status"] == "awaiting_hitl" and head["awaiting"] == ["input"]

    before = kinds(client, conversation)
    refused = error_of(turn(client, conversation, "Hello?"), 409)
    assert refused["code"] == "input_pending"
    assert [p["id"] for p in refused["details"]["pending_tool_calls"]] == ["call_1"]
    assert kinds(client, conversation) == before  # nothing stored

    unknown = error_of(
        approvals(client, conversation, outputs=[{"id": "nope", "output": "x"}]), 422
    )
    assert unknown["code"] == "unknown_tool_call"
    done = ok(approvals(client, conversation, BEN, outputs=[{"id": "call_1", "output": "42k"}]))
    assert done["status"] == "complete" and done["awaiting"] == []
    assert done["output_text"] == "Tool results: ask_operator: 42k"
    provided = [e for e in events(client, conversation) if e["kind"] == "tool_input_provided"]
    assert [(e["actor"], e["payload"]["provided_by"], e["payload"]["via"]) for e in provided] == [
        ("ben", "ben", "approvals")
    ]
    again = error_of(
        approvals(client, conversation, outputs=[{"id": "call_1", "output": "x"}]), 422
    )
    assert again["code"] == "unknown_tool_call"


def test_human_tool_answered_by_a_function_call_output(
    client: httpx.Client, conversation: str
) -> None:
    ok(turn(client, conversation, tool_line("ask_operator", question="name?")))
    done = ok(
        turn(
            client,
            conversation,
            [{"type": "function_call_output", "call_id": "call_1", "output": "Ada"}],
        )
    )
    assert done["status"] == "complete" and done["turn"] == 1
    assert done["output_text"] == "Tool results: ask_operator: Ada"
    [provided] = [e for e in events(client, conversation) if e["kind"] == "tool_input_provided"]
    assert provided["payload"]["via"] == "turn"


# --- deferred tools and callbacks ------------------------------------------------------------


def test_deferred_tool_is_settled_by_its_signed_callback(
    client: httpx.Client,
    anonymous: httpx.Client,
    sink: HttpSink,
    runner: LocalRunner,
    conversation: str,
) -> None:
    """202 {"task_id"} defers the call; the job POSTs the callback_url with no other
    credentials and continues the turn; a replay is 410 and stores nothing."""
    paused = ok(turn(client, conversation, tool_line("run_report", month="11")))
    assert paused["status"] == "awaiting_async_tools" and paused["awaiting"] == ["async"]
    [pending] = paused["pending_tool_calls"]
    assert (pending["requires"], pending["task_id"]) == ("async", "job-1")
    request = report_request(sink, conversation)
    assert request.idempotency_key
    url = request.json()["callback_url"]
    assert url.startswith(f"{runner.url}/v1/callbacks/")
    assert "tool_call_deferred" in kinds(client, conversation)
    refused = error_of(turn(client, conversation, "Is it done?"), 409)
    assert refused["code"] == "input_pending"

    settled = ok(
        anonymous.post(url, json={"status": "succeeded", "output": {"rows": 3}, "continue": True})
    )
    assert settled["settled"] == "succeeded" and settled["continued"] is True
    assert settled["status"] == "complete"
    transcript = events(client, conversation)
    [settle] = [e for e in transcript if e["kind"] == "tool_call_settled"]
    assert settle["payload"] == {
        "call_id": "call_1",
        "name": "run_report",
        "status": "succeeded",
        "via": "callback",
        "task_id": "job-1",
    }
    assert transcript[-1]["kind"] == "assistant_message"
    assert transcript[-1]["payload"]["content"] == 'Tool results: run_report: {"rows":3}'

    replay = error_of(anonymous.post(url, json={"status": "failed", "output": "again"}), 410)
    assert replay["code"] == "callback_invalid"
    assert events(client, conversation) == transcript


def test_only_a_tool_declared_deferred_is_sent_a_callback_url(
    client: httpx.Client, sink: HttpSink, conversation: str
) -> None:
    """A ``callback_url`` is a credential that settles the call: a synchronous tool (or a
    Lambda one) is never sent one. A tool not declared ``"deferred": true`` that answers
    ``202`` gets an error result the model reads; the turn goes on, nothing waits."""
    ok(turn(client, conversation, tool_line("run_report", month="11")))
    assert "callback_url" in report_request(sink, conversation).json()
    # Nothing left waiting for the sweeps of later tests.
    ok(client.post(f"/v1/conversations/{conversation}/cancel", json={}))
    second = f"{conversation}-sync"
    done = ok(turn(client, second, tool_line("quick_step")))
    assert done["status"] == "complete"
    [quick] = [r for r in sink.requests_for("/quick") if r.json()["conversation_id"] == second]
    assert "callback_url" not in quick.json()
    third = f"{conversation}-surprise"
    answered = ok(turn(client, third, tool_line("surprise_job")))
    assert (answered["status"], answered["pending_tool_calls"]) == ("complete", [])
    [result] = [e for e in events(client, third) if e["kind"] == "tool_result"]
    assert result["payload"]["is_error"] is True
    assert "deferred" in result["payload"]["output"]
    [surprise] = [r for r in sink.requests_for("/surprise") if r.json()["conversation_id"] == third]
    assert "callback_url" not in surprise.json()


def test_callback_without_continue_reaches_the_model_with_the_next_turn(
    client: httpx.Client, anonymous: httpx.Client, sink: HttpSink, conversation: str
) -> None:
    ok(turn(client, conversation, tool_line("run_report")))
    settled = ok(
        anonymous.post(
            callback_url(sink, conversation), json={"status": "failed", "output": "disk full"}
        )
    )
    assert (settled["continued"], settled["status"]) == (False, "complete")
    assert kinds(client, conversation)[-1] == "tool_result"
    [result] = [e for e in events(client, conversation) if e["kind"] == "tool_result"]
    assert result["payload"]["is_error"] is True
    assert result["payload"]["output"] == "tool run_report failed: disk full"
    nxt = ok(turn(client, conversation, "And now?"))
    assert nxt["turn"] == 2 and nxt["output_text"] == "Noted (2 user messages so far)."


def _flip(token: str, at: int) -> str:
    return token[:at] + ("A" if token[at] != "A" else "B") + token[at + 1 :]


def _tampered(url: str) -> list[str]:
    base, _, token = url.rpartition("/")
    return [
        f"{base}/{_flip(token, len(token) - 5)}",  # in the MAC
        f"{base}/{_flip(token, 60)}",  # in the encrypted claims
        f"{base}/{token[:-43]}",  # without its MAC
        f"{base}/not-a-token",
    ]


def test_forged_and_expired_callbacks_are_refused_and_store_nothing(
    client: httpx.Client,
    anonymous: httpx.Client,
    sink: HttpSink,
    clock: ClockFile,
    conversation: str,
) -> None:
    ok(turn(client, conversation, tool_line("run_report")))
    url = callback_url(sink, conversation)
    before = events(client, conversation)
    for forged in _tampered(url):
        error = error_of(anonymous.post(forged, json={"status": "succeeded", "output": "x"}), 410)
        assert error["code"] == "callback_invalid"
    # A body that fails the schema is refused before anything else.
    assert anonymous.post(url, json={"status": "done"}).status_code == 422
    assert events(client, conversation) == before

    clock.advance(DEFERRED_TTL + 1)
    late = error_of(anonymous.post(url, json={"status": "succeeded", "output": "x"}), 410)
    assert late["code"] == "callback_invalid"
    assert events(client, conversation) == before
    # A read writes nothing: GET shows the call expired at once, the sweep records it.
    head = ok(client.get(f"/v1/conversations/{conversation}"))
    assert head["pending_tool_calls"] == [] and head["awaiting"] == []
    assert [c["name"] for c in head["expired_tool_calls"]] == ["run_report"]
    assert events(client, conversation) == before
    assert ok(client.post("/_local/sweep"))["waits_expired"] == 1
    head = ok(client.get(f"/v1/conversations/{conversation}"))
    assert head["status"] == "complete" and head["expired_tool_calls"] == []
    [settle] = [e for e in events(client, conversation) if e["kind"] == "tool_call_settled"]
    assert (settle["payload"]["status"], settle["payload"]["via"]) == ("failed", "timeout")
    [result] = [e for e in events(client, conversation) if e["kind"] == "tool_result"]
    assert "timed out" in result["payload"]["output"]


def test_a_token_of_a_cleared_conversation_is_refused_in_its_next_life(
    client: httpx.Client, anonymous: httpx.Client, sink: HttpSink, conversation: str
) -> None:
    ok(turn(client, conversation, tool_line("run_report")))
    url = callback_url(sink, conversation)
    assert client.delete(f"/v1/conversations/{conversation}").status_code == 204
    ok(turn(client, conversation, "A new life."))
    error = error_of(anonymous.post(url, json={"status": "succeeded", "output": "x"}), 410)
    assert error["code"] == "callback_invalid"
    assert kinds(client, conversation) == ["user_message", "assistant_message"]


# --- who may settle a call that waits for a person or a job ----------------------------------


def _settle(
    client: httpx.Client, entry: str, conversation: str, call: str, output: str, who: dict[str, str]
) -> httpx.Response:
    """Give ``call`` its ``output`` through ``entry``, as ``who``."""
    item = {"type": "function_call_output", "call_id": call, "output": output}
    if entry in ("turns", "turns-async"):
        prefer = {"Prefer": "respond-async"} if entry == "turns-async" else {}
        return client.post(
            f"/v1/conversations/{conversation}/turns",
            json={"input": [item]},
            headers={**who, **prefer},
        )
    if entry == "approvals":
        return approvals(client, conversation, who, outputs=[{"id": call, "output": output}])
    return client.post(
        "/openai/v1/responses", json={"conversation": conversation, "input": [item]}, headers=who
    )


ENTRIES = ("turns", "approvals", "face")


@pytest.mark.parametrize(
    ("tool", "settler"),
    [
        *((tool, entry) for tool in ("run_report", "ask_operator") for entry in ENTRIES),
        ("run_report", "callback"),
    ],
)
def test_only_an_approver_or_the_callback_settles_a_call_waiting_for_a_person_or_a_job(
    client: httpx.Client,
    anonymous: httpx.Client,
    sink: HttpSink,
    conversation: str,
    tool: str,
    settler: str,
) -> None:
    """One rule on every entry: a member without the approver scope gets 403 on the turn
    route, the approvals route and the OpenAI face, and nothing is recorded; then the
    job's genuine callback, or an approver on that entry, settles the call."""
    paused = ok(turn(client, conversation, tool_line(tool, question="q?")))
    [call] = [p["id"] for p in paused["pending_tool_calls"]]
    head = ok(client.get(f"/v1/conversations/{conversation}"))
    before = events(client, conversation)

    for entry in (*ENTRIES, "turns-async"):
        refused = _settle(client, entry, conversation, call, "forged by eve", EVE)
        assert refused.status_code == 403, (entry, refused.text)
        assert refused.json()["error"]["code"] == "approver_scope_missing", entry
        if entry == "face":
            assert set(refused.json()["error"]) == {"message", "type", "param", "code"}
        else:
            error_of(refused, 403)
    assert ok(client.get(f"/v1/conversations/{conversation}")) == head
    assert events(client, conversation) == before

    if settler == "callback":
        done = ok(
            anonymous.post(
                callback_url(sink, conversation),
                json={"status": "succeeded", "output": "genuine", "continue": True},
            )
        )
        assert (done["settled"], done["status"]) == ("succeeded", "complete")
    else:
        answer = _settle(client, settler, conversation, call, "genuine", ANN)
        assert answer.status_code == 200, answer.text
    said = [
        e["payload"]["output"] for e in events(client, conversation) if e["kind"] == "tool_result"
    ]
    assert said == ["genuine"]
    assert "forged" not in json.dumps(events(client, conversation))


@pytest.mark.parametrize("entry", ["turns", "face"])
def test_a_client_call_stays_answerable_by_a_member_without_the_approver_scope(
    client: httpx.Client, conversation: str, entry: str
) -> None:
    paused = ok(turn(client, conversation, tool_line("lookup_user", id=7)))
    [call] = [p["id"] for p in paused["pending_tool_calls"]]
    answer = _settle(client, entry, conversation, call, "Ada", EVE)
    assert answer.status_code == 200, answer.text
    said = [e for e in events(client, conversation) if e["kind"] == "tool_result"]
    assert [e["payload"]["output"] for e in said] == ["Ada"]


# --- several waits in one turn ---------------------------------------------------------------

MIXED = lines(
    tool_line("send_email", to="a@x"),
    tool_line("ask_operator", question="ok?"),
    tool_line("run_report"),
    tool_line("lookup_user", id=7),
)


@pytest.mark.parametrize(
    "order",
    [list(order) for order in itertools.permutations(["approval", "input", "client", "async"])],
    ids=lambda order: "-".join(order),
)
def test_mixed_waits_are_settled_one_by_one_and_the_model_is_called_once(
    client: httpx.Client,
    anonymous: httpx.Client,
    sink: HttpSink,
    conversation: str,
    order: list[str],
) -> None:
    first = ok(turn(client, conversation, MIXED))
    assert first["status"] == "awaiting_approval"
    assert first["awaiting"] == ["approval", "input", "client", "async"]
    assert {p["id"]: p["requires"] for p in first["pending_tool_calls"]} == {
        "call_1": "approval",
        "call_2": "input",
        "call_3": "async",
        "call_4": "client",
    }
    settle = {
        "approval": lambda: approvals(client, conversation, approve=["call_1"]),
        "input": lambda: approvals(
            client, conversation, outputs=[{"id": "call_2", "output": "yes"}]
        ),
        "client": lambda: turn(
            client,
            conversation,
            [{"type": "function_call_output", "call_id": "call_4", "output": "Ada"}],
        ),
        "async": lambda: anonymous.post(
            callback_url(sink, conversation),
            json={"status": "succeeded", "output": "report", "continue": True},
        ),
    }
    status_of = {
        "approval": "awaiting_approval",
        "input": "awaiting_hitl",
        "client": "awaiting_client_tools",
        "async": "awaiting_async_tools",
    }
    left = ["approval", "input", "client", "async"]
    for step, wait in enumerate(order):
        answer = ok(settle[wait]())
        left.remove(wait)
        head = ok(client.get(f"/v1/conversations/{conversation}"))
        assert head["awaiting"] == left
        assert head["status"] == (status_of[left[0]] if left else "complete")
        answers = [e for e in events(client, conversation) if e["kind"] == "assistant_message"]
        # The model is called again only once nothing is pending.
        assert len(answers) == (1 if step < 3 else 2), wait
    assert answers[-1]["payload"]["content"] == (
        'Tool results: send_email: {"sent":true}; ask_operator: yes; run_report: report; '
        "lookup_user: Ada"
    )
    # The last settle answered the turn (a callback answers what it settled).
    assert answer.get("output_text", answer.get("continued")) in (
        True,
        answers[-1]["payload"]["content"],
    )


# --- cancel and interrupted ------------------------------------------------------------------


def test_cancel_of_a_waiting_turn_records_who_and_keeps_results(
    client: httpx.Client, anonymous: httpx.Client, sink: HttpSink, conversation: str
) -> None:
    ok(turn(client, conversation, lines(tool_line("ask_operator"), tool_line("run_report"))))
    url = callback_url(sink, conversation)
    cancelled = ok(
        client.post(
            f"/v1/conversations/{conversation}/cancel",
            json={"reason": "wrong question {name}"},
            headers=BEN,
        )
    )
    assert cancelled["status"] == "complete"
    assert cancelled["cancelled_call_ids"] == ["call_1", "call_2"]
    transcript = events(client, conversation)
    interrupted = transcript[-1]
    assert interrupted["kind"] == "turn_interrupted" and interrupted["actor"] == "ben"
    assert interrupted["payload"] == {
        "interrupted_by": "ben",
        "cancelled_call_ids": ["call_1", "call_2"],
        "reason": "wrong question {name}",
    }
    [asked] = [
        e for e in transcript if e["kind"] == "tool_result" and e["payload"]["call_id"] == "call_1"
    ]
    assert asked["payload"]["output"] == (
        "tool call ask_operator was cancelled by ben: wrong question {name}"
    )
    # The job's late callback finds its call settled.
    error = error_of(anonymous.post(url, json={"status": "succeeded", "output": "x"}), 410)
    assert error["code"] == "callback_invalid"
    # Ready for a new turn.
    nxt = ok(turn(client, conversation, "Next."))
    assert nxt["status"] == "complete" and nxt["turn"] == 2
    # Nothing to cancel: answered as is.
    idle = ok(client.post(f"/v1/conversations/{conversation}/cancel", json={}))
    assert idle["cancelled_call_ids"] == [] and idle["status"] == "complete"


def test_cancel_decides_the_approvals_a_turn_waits_for(
    client: httpx.Client, sink: HttpSink, conversation: str
) -> None:
    """An approval, a person's input and a client tool pending at once: a cancel settles
    all three; the approval is recorded as rejected by the canceller and leaves the inbox."""
    first = ok(
        turn(
            client,
            conversation,
            lines(tool_line("send_email"), tool_line("ask_operator"), tool_line("lookup_user")),
        )
    )
    assert first["awaiting"] == ["approval", "input", "client"]
    inbox = ok(client.get("/v1/approvals", params={"conversation_id": conversation}))
    assert sorted(i["kind"] for i in inbox["items"]) == ["approval", "input"]
    cancelled = ok(
        client.post(
            f"/v1/conversations/{conversation}/cancel", json={"reason": "stop"}, headers=BEN
        )
    )
    assert cancelled["status"] == "complete"
    assert cancelled["cancelled_call_ids"] == ["call_1", "call_2", "call_3"]
    [decision] = [e for e in events(client, conversation) if e["kind"] == "approval_resolved"]
    assert decision["actor"] == "ben"
    assert (decision["payload"]["decision"], decision["payload"]["reason"]) == (
        "rejected",
        "cancelled by ben: stop",
    )
    assert not [
        r for r in sink.requests_for("/email") if r.json()["conversation_id"] == conversation
    ]
    assert ok(client.get("/v1/approvals", params={"conversation_id": conversation}))["items"] == []
    # People are told once per call: cancelled (not also "decided").
    told = [
        (n["detail-type"], n["detail"]["call_id"])
        for n in ok(client.get("/_local/notifications", headers=ANN))["notifications"]
        if n["detail"]["conversation_id"] == conversation
    ]
    assert told[-2:] == [("approval.cancelled", "call_1"), ("input.cancelled", "call_2")]
    assert ("approval.decided", "call_1") not in told
    assert ok(turn(client, conversation, "Next."))["status"] == "complete"


def race(
    client: httpx.Client, anonymous: httpx.Client, conversation: str, url: str
) -> dict[str, httpx.Response]:
    """A cancel and a callback sent at the same instant (from two threads); their answers."""

    def send(index: int) -> httpx.Response:
        if index == 0:
            return client.post(f"/v1/conversations/{conversation}/cancel", json={})
        return anonymous.post(url, json={"status": "succeeded", "output": "done"})

    cancelled, called_back = all_at_once(2, send)
    return {"cancel": cancelled, "callback": called_back}


def test_a_callback_racing_a_cancel_exactly_one_wins(
    client: httpx.Client, anonymous: httpx.Client, sink: HttpSink
) -> None:
    for _ in range(4):
        conversation = f"race-{uuid.uuid4().hex[:10]}"
        ok(turn(client, conversation, tool_line("run_report")))
        url = callback_url(sink, conversation)
        results = race(client, anonymous, conversation, url)
        transcript = events(client, conversation)
        settles = [e for e in transcript if e["kind"] == "tool_call_settled"]
        results_of_call = [e for e in transcript if e["kind"] == "tool_result"]
        assert len(settles) == 1 and len(results_of_call) == 1  # never both, never half
        won = settles[0]["payload"]["via"]
        if won == "callback":
            assert results["callback"].status_code == 200
            # The cancel came second, or lost the commit and read again: nothing left.
            assert ok(results["cancel"])["cancelled_call_ids"] == []
        else:
            assert won == "cancel"
            assert ok(results["cancel"])["cancelled_call_ids"] == ["call_1"]
            # The callback came second, or lost the commit and found its call settled.
            error_of(results["callback"], 410)
        assert ok(client.get(f"/v1/conversations/{conversation}"))["status"] == "complete"


def test_cancel_of_a_running_turn_stops_it_at_the_next_step(
    client: httpx.Client, sink: HttpSink, conversation: str
) -> None:
    """A cancel meeting a live lease is a request on the head; the running request sees
    it after its tool step, records the tool's result and the cancel, and stops before
    calling the model again."""
    answer: dict[str, httpx.Response] = {}
    running = threading.Thread(
        target=lambda: answer.setdefault("turn", turn(client, conversation, tool_line("slow_step")))
    )
    running.start()
    for _ in range(100):
        head = client.get(f"/v1/conversations/{conversation}")
        if head.status_code == 200 and head.json()["status"] == "running_tools":
            break
        threading.Event().wait(0.05)
    else:
        pytest.fail("the turn never started running its tool")
    requested = ok(client.post(f"/v1/conversations/{conversation}/cancel", json={}, headers=BEN))
    assert requested["cancel_requested"] is True and requested["status"] == "running_tools"
    running.join()
    stopped = ok(answer["turn"])
    assert stopped["status"] == "complete" and stopped["status_reason"] == "cancelled"
    transcript = events(client, conversation)
    assert [e["kind"] for e in transcript] == [
        "user_message",
        "assistant_message",
        "tool_call_requested",
        "tool_result",
        "turn_interrupted",
    ]
    assert transcript[3]["payload"]["output"] == '{"slow":"done"}'  # kept
    assert transcript[-1]["payload"]["interrupted_by"] == "ben"
    assert ok(client.get(f"/v1/conversations/{conversation}"))["status"] == "complete"


def test_a_turn_whose_process_died_is_interrupted_and_resumed_by_the_next_request(
    client: httpx.Client, sink: HttpSink, clock: ClockFile, faults: Path, conversation: str
) -> None:
    """The environment dies while it holds the tool lease: running_tools while the lease
    is live (others are refused), interrupted once it expired, resumed by the next turn
    from the log (the call runs once, under its recorded key, before the new message)."""
    (faults / DIE_IN_TOOLS).touch()
    died = turn(client, conversation, tool_line("quick_step"))
    assert died.status_code >= 500
    assert ok(client.get(f"/v1/conversations/{conversation}"))["status"] == "running_tools"
    busy = error_of(turn(client, conversation, "Still there?"), 409)
    assert busy["code"] == "conversation_busy"

    clock.advance(3600)  # past any lease
    assert ok(client.get(f"/v1/conversations/{conversation}"))["status"] == "interrupted"
    resumed = ok(turn(client, conversation, "Still there?"))
    assert resumed["status"] == "complete" and resumed["turn"] == 2
    transcript = events(client, conversation)
    assert [e["kind"] for e in transcript] == [
        "user_message",
        "assistant_message",
        "tool_call_requested",
        "tool_result",
        "user_message",
        "assistant_message",
    ]
    assert transcript[3]["payload"]["output"] == '{"quick":true}'
    [request] = [
        r for r in sink.requests_for("/quick") if r.json()["conversation_id"] == conversation
    ]
    assert request.idempotency_key == transcript[2]["payload"]["idempotency_key"]


def test_cancel_of_an_interrupted_turn_says_its_calls_may_have_run(
    client: httpx.Client, clock: ClockFile, faults: Path, conversation: str
) -> None:
    (faults / DIE_IN_TOOLS).touch()
    assert turn(client, conversation, tool_line("quick_step")).status_code >= 500
    # While the dead request's lease is live, a cancel only asks it to stop...
    asked = ok(client.post(f"/v1/conversations/{conversation}/cancel", json={}))
    assert asked["cancel_requested"] is True
    clock.advance(3600)
    assert ok(client.get(f"/v1/conversations/{conversation}"))["status"] == "interrupted"
    # ...and once it expired, the cancel stops the turn itself.
    cancelled = ok(client.post(f"/v1/conversations/{conversation}/cancel", json={}, headers=BEN))
    assert cancelled["cancelled_call_ids"] == ["call_1"] and cancelled["status"] == "complete"
    transcript = events(client, conversation)
    assert [e["kind"] for e in transcript][-2:] == ["tool_result", "turn_interrupted"]
    assert transcript[-2]["payload"]["output"] == (
        "tool call quick_step was cancelled by ben (it may have run before its request ended)"
    )
    assert ok(turn(client, conversation, "Fresh start."))["turn"] == 2


def test_a_cancel_asked_of_a_run_that_died_stops_it_instead_of_resuming(
    client: httpx.Client, sink: HttpSink, clock: ClockFile, faults: Path, conversation: str
) -> None:
    (faults / DIE_IN_TOOLS).touch()
    assert turn(client, conversation, tool_line("quick_step")).status_code >= 500
    asked = ok(client.post(f"/v1/conversations/{conversation}/cancel", json={}, headers=BEN))
    assert asked["cancel_requested"] is True
    clock.advance(3600)
    nxt = ok(turn(client, conversation, "Next."))
    assert (nxt["status"], nxt["turn"]) == ("complete", 2)
    transcript = events(client, conversation)
    interrupted = [e for e in transcript if e["kind"] == "turn_interrupted"]
    assert [e["payload"]["interrupted_by"] for e in interrupted] == ["ben"]
    # The cancelled call was not run again.
    assert not [
        r for r in sink.requests_for("/quick") if r.json()["conversation_id"] == conversation
    ]


def test_the_runner_keeps_its_callback_key_in_the_data_folder(tmp_path: Path) -> None:
    """With a data folder the key survives restarts (jobs still running can call back),
    readable by its owner only; without one each run has its own."""

    def key_of(config: LocalConfig) -> tuple[str, str]:
        with LocalRunner(config) as served:
            return served.environment["CALLBACK_KEY"], served.environment["PUBLIC_BASE_URL"]

    kept = LocalConfig(port=0, data_dir=tmp_path / "data", provision_storage=False)
    first, base = key_of(kept)
    assert key_of(kept)[0] == first and len(bytes.fromhex(first)) == 32
    assert base.startswith("http://127.0.0.1:")
    assert (tmp_path / "data" / "callback.key").stat().st_mode & 0o777 == 0o600
    fresh = LocalConfig(port=0, provision_storage=False)
    assert key_of(fresh)[0] != key_of(fresh)[0]
