"""The openai-responses provider against a real HTTP fake of the Responses API on 127.0.0.1."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from turnledger.core.exceptions import ProviderError, ProviderTimeout
from turnledger.core.models import ToolCall, Usage
from turnledger.providers.base import (
    Continuation,
    Message,
    ModelRequest,
    ResponseFormat,
)
from turnledger.providers.openai_responses import OpenAIResponsesProvider

from tests.functional.fake_openai import (
    HANG,
    RESPONSES_PATH,
    FakeOpenAI,
    error_reply,
    function_call_item,
    json_reply,
    raw_reply,
    response_body,
    response_reply,
)
from tests.support.provider_schemas import validate_responses_request
from tests.support.providers import Sleeps, quick_retries
from tests.support.transcripts import SYSTEM_PROMPT, TRANSCRIPT, WEATHER, responses_input

KEY = "sk-test-responses"


@pytest.fixture
def make(fake: FakeOpenAI, sleeps: Sleeps) -> Any:
    """``make(**overrides)``: a provider aimed at the fake, with no real waiting."""

    def factory(**overrides: Any) -> OpenAIResponsesProvider:
        options: dict[str, Any] = {
            "base_url": fake.base_url,
            "api_key": lambda: KEY,
            **quick_retries(sleeps),
            **overrides,
        }
        return OpenAIResponsesProvider(**options)

    return factory


def ask(*messages: Message, **options: Any) -> ModelRequest:
    return ModelRequest(model="gpt-test", messages=list(messages), **options)


HELLO = ask(Message(role="user", content="hello"))


def sent(fake: FakeOpenAI, index: int = -1) -> dict[str, Any]:
    """The body of a request, checked against the official request type first."""
    body: dict[str, Any] = fake.requests[index].json()
    validate_responses_request(body)
    return body


# --- the request ---------------------------------------------------------------------------


def test_sends_the_request_the_official_openai_client_sends(fake: FakeOpenAI, make: Any) -> None:
    fake.script(response_reply("from openai"), response_reply("from turnledger"))
    client = openai.OpenAI(base_url=fake.base_url, api_key=KEY, max_retries=0)
    client.responses.create(
        model="gpt-test",
        input=responses_input(),
        instructions=SYSTEM_PROMPT,
        tools=[
            {
                "type": "function",
                "name": "get_weather",
                "description": "Current weather of a city",
                "parameters": WEATHER.parameters,
                "strict": False,
            }
        ],
        store=True,
    )

    reply = make().complete(ask(*TRANSCRIPT, tools=[WEATHER], store=True))

    theirs, ours = fake.requests
    assert reply.text == "from turnledger"
    assert (ours.method, ours.path) == (theirs.method, theirs.path) == ("POST", RESPONSES_PATH)
    assert ours.headers["authorization"] == theirs.headers["authorization"] == f"Bearer {KEY}"
    assert ours.json() == theirs.json()
    validate_responses_request(ours.json())


def test_a_plain_request_has_no_tools_instructions_or_format(fake: FakeOpenAI, make: Any) -> None:
    fake.script(response_reply("hi"))

    make().complete(HELLO)

    assert sent(fake) == {
        "model": "gpt-test",
        "input": [{"type": "message", "role": "user", "content": "hello"}],
        "store": False,
    }


def test_system_messages_and_a_summary_go_in_instructions(fake: FakeOpenAI, make: Any) -> None:
    fake.script(response_reply("ok"))

    make().complete(
        ask(
            Message(role="system", content="Be brief."),
            Message(role="system", content="Summary of earlier conversation: my name is Ann"),
            Message(role="user", content="a"),
            Message(role="user", content="b"),
        )
    )

    body = sent(fake)
    assert body["instructions"] == "Be brief.\n\nSummary of earlier conversation: my name is Ann"
    assert body["input"] == [{"type": "message", "role": "user", "content": "a\n\nb"}]


def test_an_assistant_message_with_text_and_calls_is_a_message_then_function_calls(
    fake: FakeOpenAI, make: Any
) -> None:
    fake.script(response_reply("done"))
    calling = Message(
        role="assistant",
        content="Checking both.",
        tool_calls=[
            ToolCall(id="call_a", name="get_weather", arguments={"city": "Oslo"}),
            ToolCall(id="call_b", name="get_weather", arguments={}, raw_arguments="{broken"),
        ],
    )

    make().complete(
        ask(
            Message(role="user", content="weather?"),
            calling,
            Message(role="tool", tool_call_id="call_a", name="get_weather", content="cold"),
            Message(
                role="tool",
                tool_call_id="call_b",
                name="get_weather",
                content="invalid arguments",
                is_error=True,
            ),
            tools=[WEATHER],
        )
    )

    assert sent(fake)["input"][1:] == [
        {"type": "message", "role": "assistant", "content": "Checking both."},
        {
            "type": "function_call",
            "call_id": "call_a",
            "name": "get_weather",
            "arguments": '{"city": "Oslo"}',
        },
        {"type": "function_call", "call_id": "call_b", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_a", "output": "cold"},
        {"type": "function_call_output", "call_id": "call_b", "output": "invalid arguments"},
    ]


def test_a_call_id_too_long_for_openai_is_mapped_the_same_way_in_call_and_result(
    fake: FakeOpenAI, make: Any
) -> None:
    fake.script(response_reply("ok"))
    long_id = "x" * 80
    make().complete(
        ask(
            Message(role="user", content="go"),
            Message(role="assistant", tool_calls=[ToolCall(id=long_id, name="t", arguments={})]),
            Message(role="tool", tool_call_id=long_id, name="t", content="out"),
        )
    )

    call, result = sent(fake)["input"][1:]
    assert call["call_id"] == result["call_id"]
    assert call["call_id"].startswith("tl_") and len(call["call_id"]) <= 64


@pytest.mark.parametrize(
    ("response_format", "expected", "instruction"),
    [
        (ResponseFormat(type="json_object"), {"type": "json_object"}, True),
        (
            ResponseFormat(
                type="json_schema",
                json_schema={
                    "name": "person",
                    "schema": {"type": "object", "properties": {"name": {"type": "string"}}},
                    "strict": False,
                },
            ),
            {
                "type": "json_schema",
                "name": "person",
                "schema": {"type": "object", "properties": {"name": {"type": "string"}}},
                "strict": False,
            },
            False,
        ),
    ],
    ids=["json_object", "json_schema"],
)
def test_json_mode_is_text_format(
    fake: FakeOpenAI,
    make: Any,
    response_format: ResponseFormat,
    expected: dict[str, Any],
    instruction: bool,
) -> None:
    fake.script(response_reply('{"name": "Ann"}'))

    reply = make().complete(
        ask(Message(role="user", content="Who am I?"), response_format=response_format)
    )

    body = sent(fake)
    assert reply.text == '{"name": "Ann"}'
    assert body["text"] == {"format": expected}
    # OpenAI refuses json_object unless "JSON" is somewhere in the context.
    assert ("JSON" in body.get("instructions", "")) is instruction


def test_json_object_adds_no_instruction_when_json_is_already_asked_for(
    fake: FakeOpenAI, make: Any
) -> None:
    fake.script(response_reply("{}"))

    make().complete(
        ask(
            Message(role="user", content="Answer in json please"),
            response_format=ResponseFormat(type="json_object"),
        )
    )

    assert "instructions" not in sent(fake)


# --- the reply -----------------------------------------------------------------------------


def test_text_calls_usage_model_and_id_are_mapped(fake: FakeOpenAI, make: Any) -> None:
    body = response_body(
        "Let me check.",
        [
            function_call_item("call_1", "get_weather", '{"city": "Oslo"}'),
            function_call_item("call_2", "get_weather", ""),
            function_call_item("call_3", "get_weather", "[1]"),
        ],
        model="gpt-test-2025",
        input_tokens=40,
        output_tokens=9,
    )
    body["output"].insert(0, {"type": "reasoning", "id": "rs_1", "summary": []})
    fake.script(json_reply(body))

    reply = make().complete(ask(Message(role="user", content="weather"), store=True))

    assert reply.text == "Let me check."
    assert reply.tool_calls == [
        ToolCall(id="call_1", name="get_weather", arguments={"city": "Oslo"}),
        ToolCall(id="call_2", name="get_weather", arguments={}),
        ToolCall(id="call_3", name="get_weather", arguments={}, raw_arguments="[1]"),
    ]
    assert reply.usage == Usage(input_tokens=40, output_tokens=9)
    assert reply.model == "gpt-test-2025"
    assert (reply.response_id, reply.provider_state) == ("resp_fake_1", "fresh")


def test_a_refusal_is_the_text(fake: FakeOpenAI, make: Any) -> None:
    body = response_body()
    body["output"] = [
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "refusal", "refusal": "I can't help with that."}],
        }
    ]
    fake.script(json_reply(body))

    assert make().complete(HELLO).text == "I can't help with that."


def test_an_unstored_response_gives_no_cursor(fake: FakeOpenAI, make: Any) -> None:
    fake.script(response_reply("a"), response_reply("b"))

    unstored = make().complete(HELLO)  # the request does not ask to store
    refused = make(store=False).complete(ask(Message(role="user", content="x"), store=True))

    assert (unstored.response_id, refused.response_id) == (None, None)
    assert [r.json()["store"] for r in fake.requests] == [False, False]
    assert fake.stored == {}


def test_a_failed_response_is_a_provider_error(fake: FakeOpenAI, make: Any) -> None:
    body = response_body(status="failed")
    body["error"] = {"code": "server_error", "message": "The model crashed"}
    fake.script(json_reply(body))

    with pytest.raises(ProviderError) as caught:
        make().complete(HELLO)

    assert caught.value.details == {
        "reason": "response_failed",
        "provider_message": "The model crashed",
    }


@pytest.mark.parametrize(
    "body",
    [
        "not json",
        "{}",
        '{"id": "resp_1"}',
        '{"id": "resp_1", "output": [{"type": "function_call"}]}',
    ],
    ids=["not json", "empty", "no output", "call without id"],
)
def test_an_unusable_body_is_a_provider_error_without_retry(
    fake: FakeOpenAI, make: Any, body: str
) -> None:
    fake.script(raw_reply(body))

    with pytest.raises(ProviderError) as caught:
        make().complete(HELLO)

    assert caught.value.details["reason"] == "invalid_response"
    assert len(fake.requests) == 1


# --- stored state ----------------------------------------------------------------------------


def continuing(previous: str, new_from: int = 1) -> ModelRequest:
    return ask(
        Message(role="user", content="Hi, my name is Ann."),
        Message(role="assistant", content="Hello Ann."),
        Message(role="user", content="What is my name?"),
        store=True,
        continuation=Continuation(previous_response_id=previous, new_from=new_from),
    )


def test_a_continuation_sends_only_the_new_messages(fake: FakeOpenAI, make: Any) -> None:
    fake.script(response_reply("Hello Ann."), response_reply("Ann."))
    provider = make()
    first = provider.complete(ask(Message(role="user", content="Hi, my name is Ann."), store=True))
    assert first.response_id is not None

    reply = provider.complete(continuing(first.response_id, new_from=2))

    body = sent(fake)
    assert body["previous_response_id"] == first.response_id
    assert body["input"] == [{"type": "message", "role": "user", "content": "What is my name?"}]
    assert reply.provider_state == "continued"
    assert len(fake.contexts[-1]) == 3  # stored input, stored output, the new message


@pytest.mark.parametrize(
    "refusal",
    [
        # OpenAI's own answer (the fake's built-in state loss).
        None,
        error_reply(404, "Response not found"),
        json_reply(
            {
                "error": {
                    "message": "Invalid `previous_response_id`.",
                    "type": "invalid_request_error",
                    "code": "invalid_request_error",
                }
            },
            status=400,
        ),
    ],
    ids=["previous_response_not_found", "404", "compatible server wording"],
)
def test_lost_state_falls_back_to_the_whole_context_in_the_same_call(
    fake: FakeOpenAI, make: Any, sleeps: Sleeps, refusal: Any
) -> None:
    if refusal is not None:
        fake.script(refusal)
        fake.stored["resp_gone"] = []  # kept, so the scripted refusal is what answers
    fake.script(response_reply("Your name is Ann."))

    reply = make().complete(continuing("resp_gone", new_from=2))

    assert (reply.text, reply.provider_state) == ("Your name is Ann.", "fallback")
    assert len(fake.requests) == 2
    assert "previous_response_id" not in sent(fake)
    assert len(sent(fake)["input"]) == 3
    assert sleeps.waits == []  # a fallback is not a retry


def test_another_client_error_with_a_continuation_is_not_a_fallback(
    fake: FakeOpenAI, make: Any
) -> None:
    fake.stored["resp_1"] = []
    fake.script(error_reply(400, "Invalid value for 'model'"))

    with pytest.raises(ProviderError) as caught:
        make().complete(continuing("resp_1"))

    assert caught.value.details["status"] == 400
    assert len(fake.requests) == 1


def test_a_failing_fallback_is_a_provider_error(fake: FakeOpenAI, make: Any) -> None:
    fake.script(error_reply(400, "Invalid value for 'tools'"))

    with pytest.raises(ProviderError) as caught:
        make().complete(continuing("resp_gone"))

    assert caught.value.details == {
        "status": 400,
        "provider_message": "Invalid value for 'tools'",
        "attempts": 1,
    }
    assert len(fake.requests) == 2


# --- retries (the shared OpenAI HTTP client) ------------------------------------------------


def test_retries_on_500_then_succeeds(fake: FakeOpenAI, make: Any, sleeps: Sleeps) -> None:
    fake.script(error_reply(500, "boom"), response_reply("finally"))

    assert make().complete(HELLO).text == "finally"
    assert sleeps.waits == [0.5]


def test_a_timeout_is_retried_then_a_provider_timeout(fake: FakeOpenAI, make: Any) -> None:
    fake.default = HANG

    with pytest.raises(ProviderTimeout) as caught:
        make(timeout_seconds=0.2, max_retries=1).complete(HELLO)

    assert caught.value.details["attempts"] == 2


# --- deleting stored state -------------------------------------------------------------------


def test_delete_state_deletes_what_is_kept_and_counts_it(fake: FakeOpenAI, make: Any) -> None:
    fake.stored.update({"resp_a": [], "resp_b": []})

    deleted = make().delete_state(["resp_a", "resp_b", "resp_unknown"])

    assert deleted == 2
    assert fake.stored == {}
    assert [(r.method, r.path) for r in fake.requests] == [
        ("DELETE", "/v1/responses/resp_a"),
        ("DELETE", "/v1/responses/resp_b"),
        ("DELETE", "/v1/responses/resp_unknown"),
    ]
    assert all(r.headers["authorization"] == f"Bearer {KEY}" for r in fake.requests)


def test_delete_state_retries_a_couple_of_times(
    fake: FakeOpenAI, make: Any, sleeps: Sleeps
) -> None:
    fake.stored.update({"resp_a": [], "resp_b": []})
    fake.script_deletes(
        error_reply(503, "busy"),
        error_reply(500, "boom"),
        json_reply({"id": "resp_a", "object": "response", "deleted": True}),
        error_reply(503, "busy"),
        error_reply(503, "busy"),
        error_reply(503, "busy"),
    )

    deleted = make(max_retries=0).delete_state(["resp_a", "resp_b"])

    assert deleted == 1  # resp_b failed three times: left to expire on its own
    assert len(fake.requests) == 6
    assert len(sleeps.waits) == 4


def test_delete_state_never_raises(make: Any) -> None:
    def broken_key() -> str:
        raise RuntimeError("no key")

    unreachable = make(base_url="http://127.0.0.1:9/v1", max_retries=0)

    assert unreachable.delete_state(["resp_a"]) == 0
    assert make(api_key=broken_key).delete_state(["resp_a"]) == 0
    assert unreachable.delete_state([]) == 0


def test_delete_state_escapes_the_id(fake: FakeOpenAI, make: Any) -> None:
    assert make().delete_state(["../chat/completions"]) == 0

    assert fake.requests[0].path == "/v1/responses/..%2Fchat%2Fcompletions"


def test_the_body_is_json_with_the_content_type_set(fake: FakeOpenAI, make: Any) -> None:
    fake.script(response_reply("hi"))

    make().complete(HELLO)

    request = fake.requests[0]
    assert request.headers["content-type"] == "application/json"
    assert json.loads(request.body)["model"] == "gpt-test"
