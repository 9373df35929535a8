"""The demo model behind the fake provider servers, speaking each provider's wire format.

The scenario suites run on every provider, not only on the in-process demo
model. These responders turn what a provider sent over HTTP back into the
provider-neutral context, let :class:`~turnledger.providers.demo.DemoProvider`
answer it, and send the answer in that provider's response shape. The demo
model reads only the context it is given, so a request that loses, duplicates
or misorders anything shows in the answer exactly as it would with the
in-process model::

    with FakeOpenAI() as fake:
        fake.default = responses_demo(fake)     # POST /v1/responses
    with FakeOpenAI(default=chat_demo()) as fake: ...       # POST /v1/chat/completions
    with FakeBedrock(default=converse_demo()) as fake: ...  # converse

The call ids of the answers are the *provider's* (``fc_<n>_<k>``, ``call.chat.<n>.<k>``,
``tooluse<n>x<k>``; the chat ones hold dots, which Bedrock refuses),
never the demo model's own ``call_<k>``, so a test sees them travel through the
log and back to the provider.

For the Responses API the context is the stored response of
``previous_response_id`` (as the fake keeps it) plus the new input items: the
answer then shows whether the continuation carried the whole conversation.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Callable
from typing import Any

from turnledger.core.models import ToolCall
from turnledger.providers.base import Message, ModelReply, ModelRequest, ResponseFormat
from turnledger.providers.demo import DemoProvider

from tests.functional.fake_bedrock import converse_reply, model_id, tool_use
from tests.functional.fake_openai import (
    FakeOpenAI,
    RecordedRequest,
    Scripted,
    completion,
    function_call_item,
    json_reply,
    response_reply,
)

Responder = Callable[[RecordedRequest], Scripted]


class _Ids:
    """Provider-style call ids: one counter per fake, shared by its threads."""

    def __init__(self, pattern: str) -> None:
        self._pattern = pattern
        self._replies = itertools.count(1)
        self._lock = threading.Lock()

    def renamed(self, reply: ModelReply) -> ModelReply:
        with self._lock:
            n = next(self._replies)
        calls = [
            call.model_copy(update={"id": self._pattern.format(n=n, k=k)})
            for k, call in enumerate(reply.tool_calls, start=1)
        ]
        return reply.model_copy(update={"tool_calls": calls})


def _answer(
    messages: list[Message], model: str, response_format: ResponseFormat | None, ids: _Ids
) -> ModelReply:
    request = ModelRequest(model=model, messages=messages, response_format=response_format)
    return ids.renamed(DemoProvider().complete(request))


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    parsed = json.loads(raw) if isinstance(raw, str) and raw.strip() else {}
    return parsed if isinstance(parsed, dict) else {}


# --- OpenAI Responses -------------------------------------------------------------------------


def _item_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.get("text") or part.get("refusal") or "" for part in content or [])


def responses_messages(instructions: str | None, items: list[dict[str, Any]]) -> list[Message]:
    """The provider-neutral context of Responses input (and stored output) items."""
    messages: list[Message] = []
    if instructions:
        messages.append(Message(role="system", content=instructions))
    names: dict[str, str] = {}
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(Message(role=item["role"], content=_item_text(item.get("content"))))
        elif kind == "function_call":
            call = ToolCall(
                id=item["call_id"], name=item["name"], arguments=_arguments(item["arguments"])
            )
            names[call.id] = call.name
            last = messages[-1] if messages else None
            if last is not None and last.role == "assistant":
                messages[-1] = last.model_copy(update={"tool_calls": [*last.tool_calls, call]})
            else:
                messages.append(Message(role="assistant", tool_calls=[call]))
        elif kind == "function_call_output":
            call_id = item["call_id"]
            messages.append(
                Message(
                    role="tool",
                    tool_call_id=call_id,
                    name=names.get(call_id),
                    content=_item_text(item.get("output")),
                )
            )
    return messages


def _responses_format(body: dict[str, Any]) -> ResponseFormat | None:
    fmt = (body.get("text") or {}).get("format")
    if not fmt or fmt.get("type") == "text":
        return None
    if fmt["type"] == "json_schema":
        schema = {key: value for key, value in fmt.items() if key != "type"}
        return ResponseFormat(type="json_schema", json_schema=schema)
    return ResponseFormat(type="json_object")


def responses_demo(fake: FakeOpenAI) -> Responder:
    """``POST /v1/responses`` answered by the demo model over the fake's stored state."""
    ids = _Ids("fc_{n}_{k}")

    def respond(request: RecordedRequest) -> Scripted:
        body = request.json()
        items = body.get("input", [])
        if isinstance(items, str):
            items = [{"type": "message", "role": "user", "content": items}]
        previous = body.get("previous_response_id")
        # The fake answered an unknown previous id itself before asking us.
        context = [*fake.stored.get(previous, []), *items] if previous else list(items)
        messages = responses_messages(body.get("instructions"), context)
        reply = _answer(messages, body["model"], _responses_format(body), ids)
        calls = [
            function_call_item(call.id, call.name, json.dumps(call.arguments))
            for call in reply.tool_calls
        ]
        return response_reply(
            reply.text,
            *calls,
            model=body["model"],
            input_tokens=reply.usage.input_tokens,
            output_tokens=reply.usage.output_tokens,
        )

    return respond


# --- OpenAI Chat Completions ------------------------------------------------------------------


def chat_messages(wire: list[dict[str, Any]]) -> list[Message]:
    """The provider-neutral context of Chat Completions messages."""
    messages: list[Message] = []
    names: dict[str, str] = {}
    for message in wire:
        role = message["role"]
        if role == "tool":
            call_id = message["tool_call_id"]
            messages.append(
                Message(
                    role="tool",
                    tool_call_id=call_id,
                    name=names.get(call_id),
                    content=_item_text(message.get("content")),
                )
            )
            continue
        calls = [
            ToolCall(
                id=call["id"],
                name=call["function"]["name"],
                arguments=_arguments(call["function"]["arguments"]),
            )
            for call in message.get("tool_calls") or []
        ]
        names.update((call.id, call.name) for call in calls)
        content = message.get("content")
        messages.append(
            Message(
                role=role,
                content=None if content is None else _item_text(content),
                tool_calls=calls,
            )
        )
    return messages


def chat_demo() -> Responder:
    """``POST /v1/chat/completions`` answered by the demo model."""
    ids = _Ids("call.chat.{n}.{k}")

    def respond(request: RecordedRequest) -> Scripted:
        body = request.json()
        fmt = body.get("response_format")
        response_format = (
            ResponseFormat.model_validate(fmt) if fmt and fmt.get("type") != "text" else None
        )
        reply = _answer(chat_messages(body["messages"]), body["model"], response_format, ids)
        calls = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
            }
            for call in reply.tool_calls
        ]
        return json_reply(
            completion(
                reply.text,
                calls or None,
                model=body["model"],
                prompt_tokens=reply.usage.input_tokens,
                completion_tokens=reply.usage.output_tokens,
            )
        )

    return respond


# --- Bedrock Converse -------------------------------------------------------------------------


def converse_messages(body: dict[str, Any]) -> list[Message]:
    """The provider-neutral context of a Converse request."""
    messages: list[Message] = []
    system = "\n\n".join(block["text"] for block in body.get("system", []) if "text" in block)
    if system:
        messages.append(Message(role="system", content=system))
    names: dict[str, str] = {}
    for message in body["messages"]:
        texts = [block["text"] for block in message["content"] if "text" in block]
        if message["role"] == "assistant":
            calls = [
                ToolCall(
                    id=block["toolUse"]["toolUseId"],
                    name=block["toolUse"]["name"],
                    arguments=block["toolUse"]["input"],
                )
                for block in message["content"]
                if "toolUse" in block
            ]
            names.update((call.id, call.name) for call in calls)
            messages.append(
                Message(role="assistant", content="".join(texts) or None, tool_calls=calls)
            )
            continue
        for block in message["content"]:
            if "toolResult" in block:
                result = block["toolResult"]
                messages.append(
                    Message(
                        role="tool",
                        tool_call_id=result["toolUseId"],
                        name=names.get(result["toolUseId"]),
                        content="".join(part.get("text", "") for part in result["content"]),
                        is_error=result.get("status") == "error",
                    )
                )
        if texts:
            messages.append(Message(role="user", content="\n\n".join(texts)))
    return messages


def converse_demo() -> Responder:
    """Bedrock ``converse`` answered by the demo model.

    JSON mode in ``tool`` form (the answer tool forced, or ``any`` tool when others
    are offered) is answered, when the demo does not call a tool, with that tool's
    ``input``: the demo's ``{"answer": ...}``.
    """
    ids = _Ids("tooluse{n}x{k}")

    def respond(request: RecordedRequest) -> Scripted:
        body = request.json()
        config = body.get("toolConfig") or {}
        choice = config.get("toolChoice") or {}
        forced = choice.get("tool", {}).get("name")
        if "any" in choice:  # JSON mode with other tools: the answer tool is one of them
            names = [tool["toolSpec"]["name"] for tool in config.get("tools", [])]
            forced = next((n for n in names if n.startswith("json_answer")), None)
        response_format = ResponseFormat(type="json_object") if forced else None
        reply = _answer(converse_messages(body), model_id(request), response_format, ids)
        usage = {
            "input_tokens": reply.usage.input_tokens,
            "output_tokens": reply.usage.output_tokens,
        }
        if forced and not reply.tool_calls:
            answer = tool_use("tooluse_json", forced, json.loads(reply.text or "{}"))
            return converse_reply(None, answer, **usage)
        uses = [tool_use(call.id, call.name, call.arguments) for call in reply.tool_calls]
        return converse_reply(reply.text, *uses, **usage)

    return respond
