"""OpenAI-compatible Chat Completions over httpx (OpenAI, OpenRouter, vLLM, Ollama).

The request body is what the official ``openai`` package sends for the same
conversation (``tests/functional/test_openai_chat.py`` holds the two side by
side, and every scenario's body is validated against the package's own
request types), so any server that works with that package works here,
without the package's import cost on a Lambda cold start.

The history is built strict first (several user items of one input become
one user message, see :mod:`turnledger.providers.history`), tool call ids are
mapped to what OpenAI accepts (:mod:`turnledger.providers.call_ids`), and JSON
mode is ``response_format``. Failures are mapped as
:mod:`turnledger.providers.openai_http` tables it; an unusable 2xx body is a
``ProviderError`` (502) at once.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, Literal, NotRequired, TypedDict

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..core.exceptions import ProviderError
from ..core.models import ToolCall, Usage
from ..core.strict_json import tool_arguments
from .base import (
    ApiKeyProvider,
    Message,
    ModelReply,
    ModelRequest,
    ResponseFormat,
    TextSink,
    ToolSpec,
)
from .call_ids import OPENAI_CHAT_CALL_ID, CallIdMap
from .history import MERGE_SEPARATOR, build_strict_history
from .openai_http import OpenAIStyleProvider, sse_events

__all__ = ["ApiKeyProvider", "OpenAIChatProvider", "parse_reply", "request_body"]

#: OpenAI refuses ``json_object`` mode unless the word "JSON" appears in the
#: messages; when it does not, this line is added to the system prompt.
JSON_OBJECT_INSTRUCTION = "Answer with a JSON object."


def json_instruction(request: ModelRequest) -> str | None:
    """The instruction JSON mode needs added to the system prompt, if any."""
    if request.response_format is None or request.response_format.type != "json_object":
        return None
    if any("json" in (message.content or "").lower() for message in request.messages):
        return None
    return JSON_OBJECT_INSTRUCTION


# --- the request, in the wire shape -------------------------------------------------------


class _WireFunctionCall(TypedDict):
    name: str
    arguments: str


class _WireToolCall(TypedDict):
    id: str
    type: Literal["function"]
    function: _WireFunctionCall


class _WireMessage(TypedDict):
    role: str
    content: str | None
    tool_calls: NotRequired[list[_WireToolCall]]
    tool_call_id: NotRequired[str]


class _WireFunction(TypedDict):
    name: str
    description: str
    parameters: dict[str, Any]


class _WireTool(TypedDict):
    type: Literal["function"]
    function: _WireFunction


def arguments_text(call: ToolCall) -> str:
    """A call's arguments as the JSON text OpenAI-style APIs carry.

    The parsed arguments, not ``raw_arguments``: a call whose text was not a
    JSON object was answered with an error, and echoing the broken text makes
    some servers reject the whole history.
    """
    return json.dumps(call.arguments, ensure_ascii=False)


def _wire_message(message: Message, ids: CallIdMap) -> _WireMessage:
    if message.role == "tool":
        return {
            "role": "tool",
            "tool_call_id": ids.result(message.tool_call_id or ""),
            "content": message.content or "",
        }
    if message.role == "assistant" and message.tool_calls:
        return {
            "role": "assistant",
            "content": message.content,
            "tool_calls": [
                {
                    "id": ids.call(call.id),
                    "type": "function",
                    "function": {"name": call.name, "arguments": arguments_text(call)},
                }
                for call in message.tool_calls
            ],
        }
    return {"role": message.role, "content": message.content or ""}


def _wire_tool(tool: ToolSpec) -> _WireTool:
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
        },
    }


def _wire_response_format(response_format: ResponseFormat) -> dict[str, Any]:
    if response_format.type == "json_schema":
        return {"type": "json_schema", "json_schema": dict(response_format.json_schema or {})}
    return {"type": "json_object"}


def _with_instruction(messages: list[Message], instruction: str | None) -> list[Message]:
    if instruction is None:
        return messages
    if messages and messages[0].role == "system":
        system = MERGE_SEPARATOR.join(t for t in (messages[0].content, instruction) if t)
        return [Message(role="system", content=system), *messages[1:]]
    return [Message(role="system", content=instruction), *messages]


def request_body(request: ModelRequest) -> dict[str, Any]:
    """The JSON body of ``POST /chat/completions`` for ``request``.

    Raises:
        InvalidHistory: a bug: the messages cannot be built into a strict history.
    """
    messages = _with_instruction(build_strict_history(request.messages), json_instruction(request))
    ids = CallIdMap(OPENAI_CHAT_CALL_ID)
    body: dict[str, Any] = {
        "model": request.model,
        "messages": [_wire_message(message, ids) for message in messages],
    }
    if request.tools:
        body["tools"] = [_wire_tool(tool) for tool in request.tools]
    if request.response_format is not None:
        body["response_format"] = _wire_response_format(request.response_format)
    return body


# --- the response, validated at the edge ---------------------------------------------------


class _Lenient(BaseModel):
    # Servers add fields freely (logprobs, reasoning, provider names): ignore them.
    model_config = ConfigDict(extra="ignore")


class _ReplyFunction(_Lenient):
    name: str = Field(min_length=1)
    arguments: str | dict[str, Any] | None = None


class _ReplyToolCall(_Lenient):
    id: str = Field(min_length=1)
    function: _ReplyFunction


class _ContentPart(_Lenient):
    text: str = ""


class _ReplyMessage(_Lenient):
    content: str | list[_ContentPart] | None = None
    refusal: str | None = None
    tool_calls: list[_ReplyToolCall] | None = None


class _Choice(_Lenient):
    message: _ReplyMessage


class _PromptDetails(_Lenient):
    cached_tokens: int | None = None


class _ReplyUsage(_Lenient):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_tokens_details: _PromptDetails | None = None


class _Completion(_Lenient):
    choices: list[_Choice] = Field(min_length=1)
    usage: _ReplyUsage | None = None
    model: str | None = None


def _tool_call(wire: _ReplyToolCall) -> ToolCall:
    # Some servers send "" (or an object) for the arguments: "" is an empty object.
    arguments, raw = tool_arguments(wire.function.arguments)
    return ToolCall(id=wire.id, name=wire.function.name, arguments=arguments, raw_arguments=raw)


def parse_reply(payload: bytes, fallback_model: str) -> ModelReply:
    """Map a Chat Completions response body to a :class:`ModelReply`.

    Raises:
        ProviderError: the body is not a usable chat completion.
    """
    try:
        completion = _Completion.model_validate_json(payload)
    except ValidationError as exc:
        raise ProviderError(
            "the model provider answered with an unusable body",
            details={"reason": "invalid_response", "errors": exc.error_count()},
        ) from exc
    message = completion.choices[0].message
    content = message.content
    if isinstance(content, list):
        content = "".join(part.text for part in content)
    usage = completion.usage or _ReplyUsage()
    return ModelReply(
        text=content if content is not None else message.refusal,
        tool_calls=[_tool_call(call) for call in message.tool_calls or []],
        usage=Usage(
            input_tokens=usage.prompt_tokens or 0,
            output_tokens=usage.completion_tokens or 0,
            cached_input_tokens=(usage.prompt_tokens_details or _PromptDetails()).cached_tokens
            or 0,
        ),
        model=completion.model or fallback_model,
    )


# --- the provider -------------------------------------------------------------------------


class OpenAIChatProvider(OpenAIStyleProvider):
    """A model behind an OpenAI-compatible ``/chat/completions`` endpoint (``openai-chat``).

    Constructor arguments: see :class:`~turnledger.providers.openai_http.OpenAIStyleProvider`.
    """

    name = "openai-chat"

    @property
    def url(self) -> str:
        """Where requests go: ``{base_url}/chat/completions``."""
        return self.base_url + "/chat/completions"

    def complete(self, request: ModelRequest) -> ModelReply:
        """Send ``request`` and return the model's reply.

        The messages are first built into a strict history (see
        :func:`~turnledger.providers.history.build_strict_history`).

        Raises:
            InvalidHistory: a bug: the context cannot be built into a strict
                history (a tool result without its call); nothing was sent.
            ProviderTimeout: the last attempt allowed timed out.
            ProviderError: the provider failed, refused the request, or answered
                something unusable.
        """
        body = request_body(request)
        key = self.resolve_key()
        response = self.send("POST", self.url, key=key, body=body)
        return parse_reply(response.content, request.model)

    def stream(self, request: ModelRequest, on_text: TextSink) -> ModelReply:
        """Send ``request`` with ``stream: true``; hand each text delta to ``on_text``.

        The reply is assembled from the chunks (text, tool calls by index, the usage
        of the last chunk, asked for with ``stream_options.include_usage``) and mapped
        as :func:`parse_reply` maps a whole completion. Failures before the first byte
        are retried as in :meth:`complete`; a stream that breaks off or ends without
        ``[DONE]`` is a :class:`ProviderError`.

        Raises:
            ProviderTimeout, ProviderError: as :meth:`complete`.
        """
        body = {
            **request_body(request),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        key = self.resolve_key()
        response = self.send("POST", self.url, key=key, body=body, stream=True)
        try:
            return parse_stream(sse_events(response), request.model, on_text)
        finally:
            response.close()


def parse_stream(
    events: Iterator[tuple[str | None, str]], fallback_model: str, on_text: TextSink
) -> ModelReply:
    """Assemble a streamed chat completion (``chat.completion.chunk`` events).

    Raises:
        ProviderError: a chunk is not JSON, carries an error, or the stream ends early.
    """
    texts: list[str] = []
    refusals: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    usage: dict[str, Any] | None = None
    model: str | None = None
    for _, data in events:
        if data.strip() == "[DONE]":
            break
        try:
            chunk = json.loads(data)
        except ValueError as exc:
            raise ProviderError(
                "the model provider streamed an unusable chunk",
                details={"reason": "invalid_response"},
            ) from exc
        if not isinstance(chunk, dict):
            continue
        if isinstance(chunk.get("error"), dict):
            raise ProviderError(
                "the model provider failed while streaming",
                details={
                    "reason": "stream_error",
                    "provider_message": str(chunk["error"].get("message", ""))[:500],
                },
            )
        model = chunk.get("model") or model
        if isinstance(chunk.get("usage"), dict):
            usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str) and delta["content"]:
                texts.append(delta["content"])
                on_text(delta["content"])
            if isinstance(delta.get("refusal"), str) and delta["refusal"]:
                refusals.append(delta["refusal"])
                if not texts:
                    on_text(delta["refusal"])  # the answer is the refusal (parse_reply)
            for part in delta.get("tool_calls") or []:
                call = calls.setdefault(
                    int(part.get("index", len(calls))),
                    {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
                )
                call["id"] = part.get("id") or call["id"]
                function = part.get("function") or {}
                call["function"]["name"] += function.get("name") or ""
                call["function"]["arguments"] += function.get("arguments") or ""
    else:
        raise ProviderError(
            "the model provider's stream ended before it was done",
            details={"reason": "stream_incomplete"},
        )
    message: dict[str, Any] = {
        "role": "assistant",
        "content": "".join(texts) if texts else None,
        "refusal": "".join(refusals) if refusals else None,
    }
    if calls:
        message["tool_calls"] = [calls[index] for index in sorted(calls)]
    whole = {"choices": [{"message": message}], "usage": usage, "model": model}
    return parse_reply(json.dumps(whole).encode(), fallback_model)
