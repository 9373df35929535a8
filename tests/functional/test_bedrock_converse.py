"""The bedrock-converse provider: boto3 against a real HTTP fake of Bedrock on 127.0.0.1."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from turnledger.core.config import Settings
from turnledger.core.exceptions import ProviderError, ProviderTimeout
from turnledger.core.models import ToolCall, Usage
from turnledger.providers.base import Message, ModelRequest, ResponseFormat, ToolSpec
from turnledger.providers.bedrock_converse import BedrockConverseProvider
from turnledger.providers.factory import build_provider

from tests.functional.fake_bedrock import (
    FakeBedrock,
    bedrock_error,
    converse_body,
    converse_reply,
    model_id,
    tool_use,
)
from tests.functional.fake_openai import delayed, json_reply
from tests.support.provider_schemas import validate_converse_request
from tests.support.providers import Sleeps, quick_retries
from tests.support.transcripts import WEATHER

MODEL = "anthropic.claude-3-5-haiku-20241022-v1:0"


@pytest.fixture
def fake() -> Iterator[FakeBedrock]:
    with FakeBedrock() as server:
        yield server


@pytest.fixture
def make(fake: FakeBedrock, sleeps: Sleeps) -> Any:
    def factory(**overrides: Any) -> BedrockConverseProvider:
        options: dict[str, Any] = {
            "endpoint_url": fake.url,
            "region": "us-east-1",
            **quick_retries(sleeps),
            **overrides,
        }
        return BedrockConverseProvider(**options)

    return factory


def ask(*messages: Message, **options: Any) -> ModelRequest:
    return ModelRequest(model=MODEL, messages=list(messages), **options)


HELLO = ask(Message(role="user", content="hello"))


def sent(fake: FakeBedrock, index: int = -1) -> dict[str, Any]:
    """The ``converse`` parameters of a request, checked against botocore's model first."""
    request = fake.requests[index]
    params: dict[str, Any] = {"modelId": model_id(request), **request.json()}
    validate_converse_request(params)
    return params


def user(text: str) -> Message:
    return Message(role="user", content=text)


def calling(*calls: tuple[str, str]) -> Message:
    return Message(
        role="assistant",
        tool_calls=[ToolCall(id=i, name=n, arguments={"q": i}) for i, n in calls],
    )


def result(call_id: str, content: str = "out", *, error: bool = False) -> Message:
    return Message(
        role="tool", tool_call_id=call_id, name="get_weather", content=content, is_error=error
    )


# --- the request ---------------------------------------------------------------------------


def test_tool_results_and_the_next_user_text_are_one_user_message(
    fake: FakeBedrock, make: Any
) -> None:
    fake.script(converse_reply("ok"))

    make().complete(
        ask(
            user("weather in two cities?"),
            calling(("call_a", "get_weather"), ("call_b", "get_weather")),
            result("call_a", "cold"),
            result("call_b", "rejected: not allowed", error=True),
            user("and never mind"),
            user("actually, thanks"),
            tools=[WEATHER],
        )
    )

    assert sent(fake)["messages"][1:] == [
        {
            "role": "assistant",
            "content": [
                {
                    "toolUse": {
                        "toolUseId": "call_a",
                        "name": "get_weather",
                        "input": {"q": "call_a"},
                    }
                },
                {
                    "toolUse": {
                        "toolUseId": "call_b",
                        "name": "get_weather",
                        "input": {"q": "call_b"},
                    }
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"toolResult": {"toolUseId": "call_a", "content": [{"text": "cold"}]}},
                {
                    "toolResult": {
                        "toolUseId": "call_b",
                        "content": [{"text": "rejected: not allowed"}],
                        "status": "error",
                    }
                },
                {"text": "and never mind\n\nactually, thanks"},
            ],
        },
    ]


def test_call_ids_bedrock_refuses_or_repeats_are_mapped_consistently(
    fake: FakeBedrock, make: Any
) -> None:
    fake.script(converse_reply("ok"))

    make().complete(
        ask(
            user("one"),
            calling(("call_1", "get_weather")),
            result("call_1"),
            Message(role="assistant", content="done"),
            user("again"),
            # The demo model numbers calls per turn: the same id in a second turn.
            calling(("call_1", "get_weather"), ("call.x:9", "get_weather")),
            result("call_1"),
            result("call.x:9"),
            tools=[WEATHER],
        )
    )

    messages = sent(fake)["messages"]
    first_use = messages[1]["content"][0]["toolUse"]["toolUseId"]
    second_uses = [b["toolUse"]["toolUseId"] for b in messages[5]["content"]]
    second_results = [b["toolResult"]["toolUseId"] for b in messages[6]["content"]]
    assert first_use == "call_1"
    assert second_results == second_uses
    assert len({first_use, *second_uses}) == 3
    assert all(i.startswith("tl_") for i in second_uses)


def test_without_tools_offered_the_history_s_tool_turns_are_text(
    fake: FakeBedrock, make: Any
) -> None:
    fake.script(converse_reply("summary"))

    make().complete(
        ask(
            user("weather?"),
            calling(("call_a", "get_weather")),
            result("call_a", "cold"),
            user("summarize"),
        )
    )

    params = sent(fake)
    assert "toolConfig" not in params
    assert params["messages"][1:] == [
        {
            "role": "assistant",
            "content": [{"text": '[called tool get_weather with {"q": "call_a"}]'}],
        },
        {
            "role": "user",
            "content": [
                {"text": "[tool result of get_weather: cold]"},
                {"text": "summarize"},
            ],
        },
    ]


def test_blank_texts_are_never_sent(fake: FakeBedrock, make: Any) -> None:
    fake.script(converse_reply("ok"))

    make().complete(
        ask(
            Message(role="system", content=""),
            user("  "),
            Message(role="assistant", content="  "),  # an empty answer: left out
            user(""),
            calling(("c", "get_weather")),
            result("c", ""),
            tools=[WEATHER],
        )
    )

    params = sent(fake)
    assert "system" not in params
    assert params["messages"][0] == {"role": "user", "content": [{"text": "(empty)"}]}
    result_block = params["messages"][2]["content"][0]["toolResult"]
    assert result_block["content"] == [{"text": "(empty)"}]


def test_max_tokens_is_the_inference_config(fake: FakeBedrock, make: Any) -> None:
    fake.script(converse_reply("ok"))

    make(max_tokens=512).complete(HELLO)

    assert sent(fake)["inferenceConfig"] == {"maxTokens": 512}


# --- JSON mode -------------------------------------------------------------------------------


def test_json_object_forces_an_answer_tool_and_its_input_is_the_text(
    fake: FakeBedrock, make: Any
) -> None:
    fake.script(converse_reply("Here:", tool_use("tooluse_j", "json_answer", {"name": "Ann"})))

    reply = make().complete(
        ask(user("Who am I?"), response_format=ResponseFormat(type="json_object"))
    )

    assert (reply.text, reply.tool_calls) == ('{"name": "Ann"}', [])
    tool_config = sent(fake)["toolConfig"]
    assert tool_config["toolChoice"] == {"tool": {"name": "json_answer"}}
    assert tool_config["tools"][0]["toolSpec"]["inputSchema"] == {"json": {"type": "object"}}


def test_json_mode_with_tools_lets_the_model_call_them(fake: FakeBedrock, make: Any) -> None:
    fake.script(converse_reply(None, tool_use("tooluse_w", "get_weather", {"city": "Oslo"})))
    taken = ToolSpec(name="json_answer", parameters={"type": "object"})

    reply = make().complete(
        ask(
            user("weather as JSON"),
            tools=[WEATHER, taken],
            response_format=ResponseFormat(type="json_object"),
        )
    )

    tool_config = sent(fake)["toolConfig"]
    assert tool_config["toolChoice"] == {"any": {}}
    names = [tool["toolSpec"]["name"] for tool in tool_config["tools"]]
    assert names == ["get_weather", "json_answer", "json_answer_2"]
    assert reply.tool_calls == [
        ToolCall(id="tooluse_w", name="get_weather", arguments={"city": "Oslo"})
    ]
    assert reply.text is None


def test_a_json_schema_that_is_not_an_object_is_wrapped_and_unwrapped(
    fake: FakeBedrock, make: Any
) -> None:
    fake.script(converse_reply(None, tool_use("t", "json_answer", {"value": ["a", "b"]})))
    schema = {"type": "array", "items": {"type": "string"}}

    reply = make().complete(
        ask(
            user("list"),
            response_format=ResponseFormat(
                type="json_schema", json_schema={"name": "names", "schema": schema}
            ),
        )
    )

    assert reply.text == '["a", "b"]'
    spec = sent(fake)["toolConfig"]["tools"][0]["toolSpec"]
    assert spec["inputSchema"]["json"] == {
        "type": "object",
        "properties": {"value": schema},
        "required": ["value"],
    }


def test_native_json_mode_sends_output_config(fake: FakeBedrock, make: Any) -> None:
    fake.script(converse_reply('{"name": "Ann"}'))
    schema = {"type": "object", "properties": {"name": {"type": "string"}}}

    reply = make(json_mode="native").complete(
        ask(
            user("Who?"),
            response_format=ResponseFormat(
                type="json_schema", json_schema={"name": "person", "schema": schema}
            ),
        )
    )

    params = sent(fake)
    assert reply.text == '{"name": "Ann"}'
    assert "toolConfig" not in params
    structure = params["outputConfig"]["textFormat"]["structure"]["jsonSchema"]
    assert (json.loads(structure["schema"]), structure["name"]) == (schema, "person")


# --- the reply -------------------------------------------------------------------------------


def test_text_calls_and_usage_are_mapped(fake: FakeBedrock, make: Any) -> None:
    fake.script(
        converse_reply(
            "Checking.",
            tool_use("tooluse_1", "get_weather", {"city": "Oslo"}),
            tool_use("tooluse_2", "get_weather", "not an object"),
            input_tokens=30,
            output_tokens=7,
        )
    )

    reply = make().complete(ask(user("weather"), tools=[WEATHER]))

    assert reply.text == "Checking."
    assert reply.tool_calls == [
        ToolCall(id="tooluse_1", name="get_weather", arguments={"city": "Oslo"}),
        ToolCall(id="tooluse_2", name="get_weather", arguments={}, raw_arguments='"not an object"'),
    ]
    assert reply.usage == Usage(input_tokens=30, output_tokens=7)
    assert (reply.model, reply.provider_state, reply.response_id) == (MODEL, "fresh", None)


@pytest.mark.parametrize(
    "body",
    [{"output": {}}, converse_body("x", stop_reason="malformed_tool_use")],
    ids=["no message", "malformed tool use"],
)
def test_an_unusable_answer_is_a_provider_error(
    fake: FakeBedrock, make: Any, body: dict[str, Any]
) -> None:
    fake.script(json_reply(body))

    with pytest.raises(ProviderError) as caught:
        make().complete(HELLO)

    assert caught.value.details["reason"] == "invalid_response"
    assert len(fake.requests) == 1


# --- errors and retries ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (429, "ThrottlingException"),
        (503, "ServiceUnavailableException"),
        (500, "InternalServerException"),
        (429, "ModelNotReadyException"),
        (502, "BadGateway"),
    ],
)
def test_throttling_and_5xx_are_retried(
    fake: FakeBedrock, make: Any, sleeps: Sleeps, status: int, code: str
) -> None:
    fake.script(bedrock_error(status, code, "try again"), converse_reply("ok"))

    assert make().complete(HELLO).text == "ok"
    assert len(fake.requests) == 2
    assert sleeps.waits == [0.5]


def test_retries_are_bounded_then_a_provider_error(
    fake: FakeBedrock, make: Any, sleeps: Sleeps
) -> None:
    fake.default = bedrock_error(429, "ThrottlingException", "Too many requests")

    with pytest.raises(ProviderError) as caught:
        make(max_retries=2).complete(HELLO)

    error = caught.value
    assert (type(error), error.status) == (ProviderError, 502)
    assert error.details == {
        "status": 429,
        "provider_code": "ThrottlingException",
        "provider_message": "Too many requests",
        "attempts": 3,
    }
    assert sleeps.waits == [0.5, 1.0]


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (400, "ValidationException"),
        (403, "AccessDeniedException"),
        (404, "ResourceNotFoundException"),
        (424, "ModelErrorException"),
    ],
)
def test_client_errors_are_not_retried(
    fake: FakeBedrock, make: Any, sleeps: Sleeps, status: int, code: str
) -> None:
    fake.script(bedrock_error(status, code, "no"), converse_reply("unused"))

    with pytest.raises(ProviderError) as caught:
        make().complete(HELLO)

    assert caught.value.status == 502
    assert caught.value.details["provider_code"] == code
    assert caught.value.details["attempts"] == 1
    assert sleeps.waits == []


def test_a_model_timeout_is_retried_then_a_provider_timeout(fake: FakeBedrock, make: Any) -> None:
    fake.default = bedrock_error(408, "ModelTimeoutException", "took too long")

    with pytest.raises(ProviderTimeout) as caught:
        make(max_retries=1).complete(HELLO)

    assert (caught.value.status, caught.value.code) == (504, "provider_timeout")
    assert caught.value.details["attempts"] == 2


def test_a_read_timeout_is_a_provider_timeout(fake: FakeBedrock, make: Any) -> None:
    fake.default = delayed(converse_reply("late"), 30.0)

    with pytest.raises(ProviderTimeout) as caught:
        make(timeout_seconds=0.2, max_retries=1).complete(HELLO)

    assert caught.value.details == {"reason": "timeout", "error": "ReadTimeoutError", "attempts": 2}


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_a_connection_failure_is_retried_then_a_provider_error(make: Any, sleeps: Sleeps) -> None:
    provider = make(endpoint_url=f"http://127.0.0.1:{_closed_port()}", max_retries=1)

    with pytest.raises(ProviderError) as caught:
        provider.complete(HELLO)

    assert caught.value.details == {
        "reason": "connection_failed",
        "error": "EndpointConnectionError",
        "attempts": 2,
    }


# --- the factory -----------------------------------------------------------------------------


def test_the_factory_builds_it_without_creating_a_client(fake: FakeBedrock) -> None:
    settings = Settings(
        provider="bedrock-converse",
        bedrock_region="eu-central-1",
        bedrock_endpoint=fake.url,
        bedrock_max_tokens=256,
        provider_max_retries=4,
    )

    provider = build_provider(settings)

    assert isinstance(provider, BedrockConverseProvider)
    assert provider._client is None  # nothing built, nothing sent
    assert (provider.region, provider.max_retries, provider.max_tokens) == ("eu-central-1", 4, 256)
    fake.script(converse_reply("built on first use"))
    assert provider.complete(HELLO).text == "built on first use"
    assert "eu-central-1" in fake.requests[0].headers["authorization"]
    assert sent(fake)["inferenceConfig"] == {"maxTokens": 256}
