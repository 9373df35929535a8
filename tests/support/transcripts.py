"""One fixed conversation, continued on every provider: a user fact, a tool call, a question.

The pieces are the provider-neutral messages a turn's working context holds;
the continuation scenarios map them to each provider's wire format and check
every request against that provider's own schema.
"""

from __future__ import annotations

from typing import Any

from turnledger.core.models import ToolCall
from turnledger.providers.base import Message, ToolSpec

SYSTEM_PROMPT = "You are a concise assistant."

WEATHER = ToolSpec(
    name="get_weather",
    description="Current weather of a city",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
)

#: The whole context of the last turn, oldest first.
TRANSCRIPT: list[Message] = [
    Message(role="system", content=SYSTEM_PROMPT),
    Message(role="user", content="Hi, my name is Ann."),
    Message(role="assistant", content="Nice to meet you, Ann."),
    Message(role="user", content="What is the weather in Oslo?"),
    Message(
        role="assistant",
        tool_calls=[ToolCall(id="call_w1", name="get_weather", arguments={"city": "Oslo"})],
    ),
    Message(role="tool", tool_call_id="call_w1", name="get_weather", content='{"temp_c": 4}'),
    Message(role="assistant", content="It is 4 degrees in Oslo."),
    Message(role="user", content="What is my name?"),
]

#: Where each turn's new messages start in :data:`TRANSCRIPT`, and the reply that ends it.
#: Turn 1: the fact; turn 2: the question, a tool call, its result and the answer; turn 3.
TURN_STARTS = (1, 3, 7)


def converse_params(model: str) -> dict[str, Any]:
    """The Converse API's parameters for :data:`TRANSCRIPT` with :data:`WEATHER`, exactly."""
    return {
        "modelId": model,
        "system": [{"text": SYSTEM_PROMPT}],
        "messages": [
            {"role": "user", "content": [{"text": "Hi, my name is Ann."}]},
            {"role": "assistant", "content": [{"text": "Nice to meet you, Ann."}]},
            {"role": "user", "content": [{"text": "What is the weather in Oslo?"}]},
            {
                "role": "assistant",
                "content": [
                    {
                        "toolUse": {
                            "toolUseId": "call_w1",
                            "name": "get_weather",
                            "input": {"city": "Oslo"},
                        }
                    }
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "toolResult": {
                            "toolUseId": "call_w1",
                            "content": [{"text": '{"temp_c": 4}'}],
                        }
                    }
                ],
            },
            {"role": "assistant", "content": [{"text": "It is 4 degrees in Oslo."}]},
            {"role": "user", "content": [{"text": "What is my name?"}]},
        ],
        "toolConfig": {
            "tools": [
                {
                    "toolSpec": {
                        "name": "get_weather",
                        "description": "Current weather of a city",
                        "inputSchema": {"json": WEATHER.parameters},
                    }
                }
            ]
        },
    }


def responses_input() -> list[dict[str, Any]]:
    """The Responses API's input items for :data:`TRANSCRIPT` (what a fresh request sends;
    the system prompt goes in ``instructions``)."""
    return [
        {"type": "message", "role": "user", "content": "Hi, my name is Ann."},
        {"type": "message", "role": "assistant", "content": "Nice to meet you, Ann."},
        {"type": "message", "role": "user", "content": "What is the weather in Oslo?"},
        {
            "type": "function_call",
            "call_id": "call_w1",
            "name": "get_weather",
            "arguments": '{"city": "Oslo"}',
        },
        {"type": "function_call_output", "call_id": "call_w1", "output": '{"temp_c": 4}'},
        {"type": "message", "role": "assistant", "content": "It is 4 degrees in Oslo."},
        {"type": "message", "role": "user", "content": "What is my name?"},
    ]
