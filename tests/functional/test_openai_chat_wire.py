"""openai-chat's wire mapping: strict histories built, ids mapped, JSON mode, schema-checked."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError
from turnledger.core.models import ToolCall
from turnledger.providers.base import Message, ModelRequest, ResponseFormat
from turnledger.providers.openai_chat import JSON_OBJECT_INSTRUCTION, OpenAIChatProvider

from tests.functional.fake_openai import FakeOpenAI, text_reply
from tests.support.provider_schemas import validate_chat_request
from tests.support.transcripts import WEATHER


def send(fake: FakeOpenAI, *messages: Message, **options: Any) -> dict[str, Any]:
    """Send ``messages`` through openai-chat; the body, checked against the ``openai`` types."""
    fake.script(text_reply("ok"))
    provider = OpenAIChatProvider(base_url=fake.base_url, max_retries=0)
    provider.complete(ModelRequest(model="gpt-test", messages=list(messages), **options))
    body: dict[str, Any] = fake.requests[-1].json()
    validate_chat_request(body)
    return body


def test_a_client_tool_result_and_two_user_messages_make_a_normal_request(
    fake: FakeOpenAI,
) -> None:
    body = send(
        fake,
        Message(role="system", content="s"),
        Message(role="system", content="Summary of earlier conversation: x"),
        Message(role="user", content="look it up"),
        Message(role="assistant", tool_calls=[ToolCall(id="c1", name="lookup", arguments={})]),
        Message(role="tool", tool_call_id="c1", name="lookup", content="found"),
        Message(role="user", content="thanks"),
        Message(role="user", content="and one more thing"),
    )

    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "tool", "user"]
    assert body["messages"][0]["content"] == "s\n\nSummary of earlier conversation: x"
    assert body["messages"][-1] == {"role": "user", "content": "thanks\n\nand one more thing"}


def test_a_call_id_over_40_characters_is_mapped_in_call_and_result(fake: FakeOpenAI) -> None:
    long_id = "toolu_bdrk_" + "A" * 40
    body = send(
        fake,
        Message(role="user", content="go"),
        Message(role="assistant", tool_calls=[ToolCall(id=long_id, name="t", arguments={})]),
        Message(role="tool", tool_call_id=long_id, name="t", content="out"),
    )

    wire = body["messages"][1]["tool_calls"][0]["id"]
    assert len(wire) <= 40 and wire != long_id
    assert body["messages"][2]["tool_call_id"] == wire


def test_json_object_mode_is_response_format_with_json_named(fake: FakeOpenAI) -> None:
    body = send(
        fake,
        Message(role="system", content="Be brief."),
        Message(role="user", content="Who am I?"),
        response_format=ResponseFormat(type="json_object"),
    )

    assert body["response_format"] == {"type": "json_object"}
    # OpenAI refuses json_object unless "JSON" appears in the messages.
    assert body["messages"][0] == {
        "role": "system",
        "content": f"Be brief.\n\n{JSON_OBJECT_INSTRUCTION}",
    }


def test_json_object_mode_without_a_system_prompt_adds_one(fake: FakeOpenAI) -> None:
    body = send(
        fake,
        Message(role="user", content="Who?"),
        response_format=ResponseFormat(type="json_object"),
    )

    assert body["messages"][0] == {"role": "system", "content": JSON_OBJECT_INSTRUCTION}


def test_json_schema_mode_is_sent_as_given(fake: FakeOpenAI) -> None:
    schema = {
        "name": "person",
        "schema": {"type": "object", "properties": {"name": {"type": "string"}}},
        "strict": True,
    }
    body = send(
        fake,
        Message(role="user", content="Who?"),
        tools=[WEATHER],
        response_format=ResponseFormat(type="json_schema", json_schema=schema),
    )

    assert body["response_format"] == {"type": "json_schema", "json_schema": schema}
    assert [m["role"] for m in body["messages"]] == ["user"]


@pytest.mark.parametrize(
    "fields",
    [
        {"type": "json_schema"},
        {"type": "json_schema", "json_schema": {"schema": {}}},
        {"type": "json_object", "json_schema": {"name": "x"}},
    ],
    ids=["schema missing", "schema without a name", "schema on json_object"],
)
def test_a_half_given_response_format_is_refused(fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        ResponseFormat.model_validate(fields)
