"""The OpenAI-compatible face, driven with the real ``openai`` SDK against the local runner:
the same ledger (checked through ``/v1``), the same tenancy (the API key is the bearer token)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI
from turnledger_local.runner import LocalConfig, LocalRunner
from turnledger_local.template import PROJECT_ROOT

from tests.http.conftest import ANN


@pytest.fixture
def runner_config(runner_config: LocalConfig) -> LocalConfig:
    """The sample tools: ``send_email`` needs approval, ``lookup_user`` is a client tool."""
    return dataclasses.replace(runner_config, tools_file=PROJECT_ROOT / "events/local-tools.json")


@pytest.fixture
def client(served: LocalRunner) -> Iterator[OpenAI]:
    with OpenAI(base_url=f"{served.url}/openai/v1", api_key="local:acme:ann", max_retries=0) as c:
        yield c


def events_of(http: httpx.Client, conversation_id: str) -> list[dict[str, Any]]:
    page = http.get(f"/v1/conversations/{conversation_id}/events", headers=ANN).json()
    events: list[dict[str, Any]] = page["events"]
    return events


def test_turns_in_a_conversation_and_its_items(client: OpenAI, http: httpx.Client) -> None:
    """create → responses per turn → items → delete; the events are the ledger's own."""
    conversation = client.conversations.create()
    assert conversation.id.startswith("conv_")
    first = client.responses.create(
        model="demo-1", input="My name is Ada.", conversation=conversation.id
    )
    assert first.output_text == "Noted (1 user messages so far)."
    second = client.responses.create(
        model="demo-1", input="What is my name?", conversation=conversation.id
    )
    assert second.output_text == "Your name is Ada."
    assert client.conversations.retrieve(conversation.id).id == conversation.id

    items = list(client.conversations.items.list(conversation.id, order="asc"))
    texts = [(item.role, item.content[0].text) for item in items if item.type == "message"]
    assert texts == [
        ("user", "My name is Ada."),
        ("assistant", "Noted (1 user messages so far)."),
        ("user", "What is my name?"),
        ("assistant", "Your name is Ada."),
    ]
    kinds = [e["kind"] for e in events_of(http, conversation.id)]
    assert kinds == ["user_message", "assistant_message"] * 2

    deleted = client.conversations.delete(conversation.id)
    assert deleted.deleted is True
    assert http.get(f"/v1/conversations/{conversation.id}", headers=ANN).status_code == 404
    with pytest.raises(openai.NotFoundError) as raised:
        client.conversations.retrieve(conversation.id)
    assert raised.value.body["code"] == "conversation_not_found"  # type: ignore[index]


def test_previous_response_id_chains_turns(client: OpenAI, http: httpx.Client) -> None:
    first = client.responses.create(model="demo-1", input="My name is Grace.")
    second = client.responses.create(
        model="demo-1", input="What is my name?", previous_response_id=first.id
    )
    assert second.output_text == "Your name is Grace."
    conversation_id = second.conversation.id  # type: ignore[union-attr]
    assert first.conversation.id == conversation_id  # type: ignore[union-attr]
    assert len(events_of(http, conversation_id)) == 4


def test_previous_response_id_of_an_earlier_response_forks(
    client: OpenAI, http: httpx.Client
) -> None:
    """As on OpenAI, a chain of previous_response_ids continues from the response it names:
    from an earlier one, on a fork of its conversation at that response's turn, which the
    original never sees."""
    r1 = client.responses.create(model="demo-1", input="My name is Sam.")
    r2 = client.responses.create(model="demo-1", input="Hello", previous_response_id=r1.id)
    r3 = client.responses.create(
        model="demo-1", input="My name is Max.", previous_response_id=r1.id
    )
    r4 = client.responses.create(
        model="demo-1", input="What is my name?", previous_response_id=r3.id
    )
    r5 = client.responses.create(
        model="demo-1", input="What is my name?", previous_response_id=r2.id
    )
    assert r4.output_text == "Your name is Max."
    assert r5.output_text == "Your name is Sam."
    original = r1.conversation.id  # type: ignore[union-attr]
    fork = r3.conversation.id  # type: ignore[union-attr]
    assert r2.conversation.id == r5.conversation.id == original  # type: ignore[union-attr]
    assert r4.conversation.id == fork != original  # type: ignore[union-attr]
    assert fork.startswith("conv_")
    # Turn numbers continue the parent's: the fork's first response is its turn 2.
    assert (r2.id, r3.id, r4.id) == (f"resp_2_{original}", f"resp_2_{fork}", f"resp_3_{fork}")
    assert r3.previous_response_id == r1.id

    head = http.get(f"/v1/conversations/{fork}", headers=ANN).json()
    assert head["parent"] == {"conversation_id": original, "turn": 1, "seq": 2}
    items = list(client.conversations.items.list(fork, order="asc"))
    texts = [item.content[0].text for item in items if item.type == "message"]
    assert texts == [
        "My name is Sam.",
        "Noted (1 user messages so far).",
        "My name is Max.",
        "Noted (2 user messages so far).",
        "What is my name?",
        "Your name is Max.",
    ]
    # The inherited events keep the conversation they were written in.
    assert [e["conversation_id"] for e in events_of(http, fork)] == [original] * 2 + [fork] * 4
    assert len(events_of(http, original)) == 6  # the original is never touched

    # A fork of the fork, from its inherited first response: its own conversation again.
    r6 = client.responses.create(
        model="demo-1", input="What is my name?", previous_response_id=r3.id
    )
    assert r6.output_text == "Your name is Max."
    assert r6.conversation.id not in (original, fork)  # type: ignore[union-attr]
    with pytest.raises(openai.BadRequestError) as raised:  # a turn the conversation lacks
        client.responses.create(
            model="demo-1", input="Hi", previous_response_id=f"resp_9_{original}"
        )
    assert raised.value.body["param"] == "previous_response_id"  # type: ignore[index]


def test_client_tools_and_approvals(client: OpenAI, http: httpx.Client) -> None:
    """A client tool is a function_call answered with function_call_output; a call that needs
    approval is an mcp_approval_request decided with an mcp_approval_response."""
    conversation = client.conversations.create()
    asked = client.responses.create(
        model="demo-1",
        input='/tool lookup_user {"email": "ada@example.com"}',
        conversation=conversation.id,
        tools=[{"type": "function", "name": "lookup_user", "parameters": {}, "strict": False}],
    )
    calls = [item for item in asked.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "lookup_user"
    assert json.loads(calls[0].arguments) == {"email": "ada@example.com"}
    answered = client.responses.create(
        model="demo-1",
        input=[
            {"type": "function_call_output", "call_id": calls[0].call_id, "output": '{"id": 7}'}
        ],
        conversation=conversation.id,
    )
    assert answered.output_text == 'Tool results: lookup_user: {"id": 7}'

    paused = client.responses.create(
        model="demo-1",
        input='/tool send_email {"to": "bob@example.com"}',
        previous_response_id=answered.id,
    )
    requests = [item for item in paused.output if item.type == "mcp_approval_request"]
    assert len(requests) == 1 and requests[0].name == "send_email"
    decided = client.responses.create(
        model="demo-1",
        input=[
            {
                "type": "mcp_approval_response",
                "approval_request_id": requests[0].id,
                "approve": True,
            }
        ],
        conversation=conversation.id,
    )
    assert decided.output_text is not None and "send_email" in decided.output_text
    kinds = [e["kind"] for e in events_of(http, conversation.id)]
    assert kinds.count("tool_result") == 2 and "approval_resolved" in kinds

    items = list(client.conversations.items.list(conversation.id, order="asc"))
    assert {item.type for item in items} >= {
        "message",
        "function_call",
        "function_call_output",
        "mcp_approval_response",
    }


def test_a_stateless_approval_continues_its_response(client: OpenAI, http: httpx.Client) -> None:
    """A decision sent after the history that asked for it (no ids, no
    previous_response_id) decides the call of the conversation that history is."""
    history: list[Any] = [{"role": "user", "content": '/tool send_email {"to": "bo@x.io"}'}]
    paused = client.responses.create(model="demo-1", input=history)
    [request] = [item for item in paused.output if item.type == "mcp_approval_request"]
    history += [item.model_dump(exclude_none=True) for item in paused.output]
    decision = {"type": "mcp_approval_response", "approval_request_id": request.id, "approve": True}
    decided = client.responses.create(model="demo-1", input=[*history, decision])
    assert decided.conversation.id == paused.conversation.id  # type: ignore[union-attr]
    assert decided.output_text is not None and "send_email" in decided.output_text
    kinds = [e["kind"] for e in events_of(http, paused.conversation.id)]  # type: ignore[union-attr]
    assert kinds.count("user_message") == 1 and "approval_resolved" in kinds


def test_errors_have_openai_s_shape(client: OpenAI, served: LocalRunner) -> None:
    with pytest.raises(openai.AuthenticationError):
        OpenAI(base_url=f"{served.url}/openai/v1", api_key="nope", max_retries=0).responses.create(
            model="demo-1", input="Hi."
        )
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(
            model="demo-1",
            input="Hi.",
            tools=[{"type": "function", "name": "nope", "parameters": {"type": "array"}}],
        )
    assert set(raised.value.body) == {"message", "type", "param", "code"}  # type: ignore[arg-type]
    assert raised.value.body["code"] == "invalid_request"  # type: ignore[index]
    assert raised.value.body["param"] == "tools.0"  # type: ignore[index]


def test_a_401_under_openai_v1_is_in_openai_s_shape(
    served: LocalRunner, http: httpx.Client
) -> None:
    """Refused before any function runs (no token, another scheme, a token the runner cannot
    use) or by the function (an unusable tenant): under ``/openai/v1`` always OpenAI's error
    shape, as every other error there; the native routes keep the contract's."""
    for headers in ({}, {"Authorization": "Basic abc"}, {"Authorization": "Bearer nope"}):
        for method, path in (
            ("POST", "/openai/v1/responses"),
            ("GET", "/openai/v1/conversations/conv_1"),
            ("GET", "/openai/v1/models"),
        ):
            answer = http.request(method, path, headers=headers, json={})
            assert answer.status_code == 401, (path, answer.text)
            error = answer.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}, answer.text
            assert (error["type"], error["param"], error["code"]) == (
                "authentication_error",
                None,
                "unauthorized",
            )
    by_function = http.get(
        "/openai/v1/conversations/conv_1", headers={"Authorization": "Bearer local:a b"}
    )
    assert by_function.status_code == 401
    assert set(by_function.json()["error"]) == {"message", "type", "param", "code"}
    native = http.get("/v1/conversations/c1")
    assert native.status_code == 401
    assert set(native.json()["error"]) == {"code", "message", "details"}
    with pytest.raises(openai.AuthenticationError) as raised:
        OpenAI(base_url=f"{served.url}/openai/v1", api_key="nope", max_retries=0).responses.create(
            model="demo-1", input="Hi."
        )
    assert raised.value.body["type"] == "authentication_error"  # type: ignore[index]


@pytest.mark.parametrize("turn", ["01", "+1", "0", "1 ", "\u0661", "\u00b2", "1_"])
def test_a_response_id_is_read_only_in_its_canonical_form(
    client: OpenAI, http: httpx.Client, turn: str
) -> None:
    """``resp_<turn>_<conversation>`` with the turn as this service writes it: ``resp_01_X``
    is not ``resp_1_X`` (nor are other spellings of a number): ``400``, ``param``
    ``previous_response_id``, nothing stored."""
    first = client.responses.create(model="demo-1", input="My name is Ada.")
    conversation_id = first.conversation.id  # type: ignore[union-attr]
    assert first.id == f"resp_1_{conversation_id}"
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(
            model="demo-1",
            input="What is my name?",
            previous_response_id=f"resp_{turn}_{conversation_id}",
        )
    assert raised.value.body["param"] == "previous_response_id"  # type: ignore[index]
    assert len(events_of(http, conversation_id)) == 2


def test_an_unknown_conversation_is_404(client: OpenAI, http: httpx.Client) -> None:
    """As OpenAI answers: a ``conversation`` that does not exist (never made, deleted, or
    another tenant's) is ``404``, never a conversation made on the spot."""
    for named in ("conv_never_made", {"id": "conv_never_made"}):
        answer = http.post(
            "/openai/v1/responses",
            json={"model": "demo-1", "input": "Hi.", "conversation": named},
            headers=ANN,
        )
        assert answer.status_code == 404, answer.text
        assert answer.json()["error"] == {
            "message": answer.json()["error"]["message"],
            "type": "not_found_error",
            "param": "conversation",
            "code": "conversation_not_found",
        }
    assert http.get("/v1/conversations/conv_never_made", headers=ANN).status_code == 404
    theirs = client.conversations.create()
    with (
        OpenAI(base_url=str(client.base_url), api_key="local:globex:bob", max_retries=0) as other,
        pytest.raises(openai.NotFoundError),
    ):
        other.responses.create(model="demo-1", input="Hi.", conversation=theirs.id)
    client.conversations.delete(theirs.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="demo-1", input="Hi.", conversation=theirs.id)
    assert http.get(f"/v1/conversations/{theirs.id}", headers=ANN).status_code == 404
