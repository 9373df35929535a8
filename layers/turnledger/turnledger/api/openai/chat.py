"""``POST /openai/v1/chat/completions``: Chat Completions on the OpenAI face, for the clients
that speak it (the ``openai`` SDK's ``chat.completions``, LangChain's ``ChatOpenAI``, the
Vercel AI SDK's ``openai.chat(...)``, LiteLLM, ...).

A request carries its whole history: its ``messages`` are read as the Responses face's
input items (system and developer messages as instructions, user and assistant messages,
an assistant's ``tool_calls`` as function calls, ``tool`` messages as their outputs) and
answered by the same code (:func:`.responses.respond`): the conversation whose transcript
the messages repeat is continued (:mod:`.matching`: the same chain, so a client may switch
between the two APIs), else a new one holds the history, the client as its source.
``store: false`` keeps nothing, as on the Responses face; omitted, it is ``true``.

Tools: functions the registry has keep its executors and approval rules; the others are
the client's (answered with ``tool_calls`` and ``finish_reason: "tool_calls"``). A call
that waits for anyone but the client (an approval, a person's input, a job) is never shown
as a ``tool_call``: the answer is ``409 approval_pending`` (or ``input_pending``) with the
conversation and its pending calls, which the inbox holds; once they are decided (``POST
/v1/conversations/{id}/approvals``, or the inbox), the same request sent again is answered
with the turn's answer (:func:`.matching.repeated`), and runs nothing twice.

Bodies are refused rather than read loosely (:mod:`.chat_schemas`); a streamed answer is
the finished answer as ``chat.completion.chunk`` events (:mod:`.chat_streaming`).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Body

from ...core.exceptions import ApprovalPending, InputPending, UnsupportedValue
from ...core.models import JsonObjectFormat, JsonSchemaFormat
from ...runtime import get_runtime
from ...turn.pipeline import Conversations
from ...turn.results import TurnResult
from ..resolver import Caller, app, caller, json_response
from ..views import pending_view
from .chat_schemas import (
    ChatAssistantMessage,
    ChatCompletionCreate,
    ChatContentPart,
    ChatDeveloperMessage,
    ChatJsonSchemaFormat,
    ChatMessage,
    ChatSystemMessage,
    ChatToolMessage,
    ChatUserMessage,
)
from .chat_streaming import Finish, chunks, deltas_of, event_stream
from .items import InputItem, parse_input
from .matching import repeated
from .responses import respond
from .schemas import PREFIX, ResponseCreate, epoch

__all__ = ["completion_id", "input_of"]


def completion_id(conversation_id: str, turn: int) -> str:
    """The id of the chat completion that answered ``turn`` of ``conversation_id``."""
    return f"chatcmpl-{turn}_{conversation_id}"


def _text(content: str | list[ChatContentPart] | None, where: str) -> str:
    """A message's content as text: a string, or its text (and refusal) parts joined.

    Raises:
        UnsupportedValue: a part that is no text (an image, audio, a file).
    """
    if content is None or isinstance(content, str):
        return content or ""
    texts: list[str] = []
    for index, part in enumerate(content):
        if part.type not in ("text", "refusal"):
            raise UnsupportedValue(
                f"content parts of type {part.type!r} are not supported (text only)",
                details={"param": f"{where}.content.{index}.type"},
            )
        texts.append(part.text or part.refusal or "")
    return "\n".join(texts)


def input_of(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """``messages`` as the Responses face's input items, in order."""
    items: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        where = f"messages.{index}"
        if isinstance(message, ChatSystemMessage | ChatDeveloperMessage | ChatUserMessage):
            items.append(
                {"type": "message", "role": message.role, "content": _text(message.content, where)}
            )
        elif isinstance(message, ChatAssistantMessage):
            text = _text(message.content, where) or message.refusal or ""
            if text:
                items.append({"type": "message", "role": "assistant", "content": text})
            for call in message.tool_calls or []:
                items.append(
                    {
                        "type": "function_call",
                        "call_id": call.id,
                        "name": call.function.name,
                        "arguments": call.function.arguments,
                    }
                )
        elif isinstance(message, ChatToolMessage):
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": message.tool_call_id,
                    "output": _text(message.content, where),
                }
            )
    return items


def _response_format(
    request: ChatCompletionCreate,
) -> JsonObjectFormat | JsonSchemaFormat | None:
    given = request.response_format
    if isinstance(given, ChatJsonSchemaFormat):
        return JsonSchemaFormat(type="json_schema", json_schema=given.json_schema)
    if isinstance(given, JsonObjectFormat):
        return given
    return None


def _metadata(request: ChatCompletionCreate) -> dict[str, str]:
    """The request's ``metadata``, and what it asked of the model that the deployment's
    settings decide instead (kept on the turn, so the record says what was asked)."""
    metadata = dict(request.metadata or {})
    asked = {
        "temperature": request.temperature,
        "max_completion_tokens": request.max_completion_tokens or request.max_tokens,
        "user": request.user,
    }
    for name, value in asked.items():
        if value is not None:
            metadata.setdefault(name, str(value))
    return metadata


def _as_response_request(request: ChatCompletionCreate) -> ResponseCreate:
    """The Responses face's request of ``request`` (its tools flat, as Responses has them)."""
    tools: list[dict[str, Any]] | None = None
    if request.tool_choice == "none":
        tools = []
    elif request.tools is not None:
        tools = [
            {
                "type": "function",
                "name": tool.function.name,
                "description": tool.function.description,
                "parameters": tool.function.parameters,
            }
            for tool in request.tools
        ]
    return ResponseCreate(
        model=request.model,
        input=input_of(request.messages),
        tools=tools,
        metadata=_metadata(request),
        stream=bool(request.stream),
        store=request.store is not False,
    )


def _refuse_waits(reply: TurnResult, stored: bool) -> None:
    """Answer a turn that waits for anyone but the client as its error: the calls are
    never shown as ``tool_calls`` (the client would run what is not its to run). Not
    ``stored``, nothing waits: the conversation is already cleared.

    Raises:
        ApprovalPending: a call waits for a decision.
        InputPending: a call waits for a person's input or a job.
    """
    others = [call for call in reply.waiting if pending_view(call).requires != "client"]
    if not others:
        return
    details = {"conversation_id": reply.conversation_id, "turn": reply.turn}
    if not stored:
        raise ApprovalPending(
            f"{', '.join(c.name for c in others)} cannot run without a decision, and store: "
            "false keeps nothing to decide: send the request with store: true",
            pending=others,
            details={"param": "store"},
        )
    if any(pending_view(call).requires == "approval" for call in others):
        raise ApprovalPending(
            f"the turn waits for approval of {', '.join(c.name for c in others)}: decide "
            f"with POST /v1/conversations/{reply.conversation_id}/approvals (or the inbox), "
            "then send this request again",
            pending=others,
            details=details,
        )
    raise InputPending(
        f"the turn waits for the output of {', '.join(c.name for c in others)}: give it "
        f"with POST /v1/conversations/{reply.conversation_id}/approvals, then send this "
        "request again",
        pending=others,
        details=details,
    )


def _usage(reply: TurnResult) -> dict[str, Any]:
    usage = reply.usage
    return {
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.input_tokens + usage.output_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_input_tokens, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def _tool_calls(reply: TurnResult) -> list[dict[str, Any]]:
    return [
        {
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
        }
        for call in map(pending_view, reply.waiting)
        if call.requires == "client"
    ]


def _content(reply: TurnResult) -> str | None:
    """The answer's text; in JSON mode, its JSON text."""
    if reply.output_json is not None:
        return json.dumps(reply.output_json, ensure_ascii=False)
    return reply.output_text or None


def completion_body(request: ChatCompletionCreate, reply: TurnResult) -> dict[str, Any]:
    """The ``chat.completion`` of ``reply``."""
    calls = _tool_calls(reply)
    message: dict[str, Any] = {
        "role": "assistant",
        "content": _content(reply),
        "refusal": None,
        "annotations": [],
    }
    if calls:
        message["tool_calls"] = calls
    return {
        **_head(request, reply),
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if calls else "stop",
                "logprobs": None,
            }
        ],
        "usage": _usage(reply),
    }


def _head(request: ChatCompletionCreate, reply: TurnResult) -> dict[str, Any]:
    """What every chunk and the completion carry: its id, time, model, and (beyond
    OpenAI's fields) the conversation it is stored in (``null`` with ``store: false``)."""
    stored = request.store is not False
    return {
        "id": completion_id(reply.conversation_id, reply.turn),
        "created": epoch(get_runtime().clock()),
        "model": request.model or get_runtime().settings.model,
        "system_fingerprint": None,
        "service_tier": "default",
        "conversation": {"id": reply.conversation_id} if stored else None,
    }


def _answer(
    service: Conversations, who: Caller, request: ChatCompletionCreate, items: list[InputItem]
) -> tuple[TurnResult, list[str] | None]:
    """The turn that answers ``items``: a request repeating the history of a turn that
    waited for someone is answered with that turn (nothing runs), else it is run."""
    shaped = _as_response_request(request)
    if shaped.store:
        again = repeated(service, who, items)
        if again is not None:
            return again, None
    done = respond(service, who, shaped, items, _response_format(request))
    return done.reply, done.pieces


@app.post(f"{PREFIX}/chat/completions", include_in_schema=False)
def create_chat_completion(request: Annotated[ChatCompletionCreate, Body()]) -> Response[str]:
    """One turn of the conversation the messages continue, as a ``chat.completion`` (or,
    with ``stream: true``, as its chunks)."""
    who = caller()
    request.check()
    service = get_runtime().conversations_for(who.tenant)
    items = parse_input(input_of(request.messages))
    reply, pieces = _answer(service, who, request, items)
    _refuse_waits(reply, request.store is not False)
    body = completion_body(request, reply)
    if not request.stream:
        return json_response(200, body)
    [choice] = body["choices"]
    finish = Finish(choice["finish_reason"], body["usage"])
    deltas = deltas_of(_content(reply), choice["message"].get("tool_calls", []), finish, pieces)
    include_usage = bool(request.stream_options and request.stream_options.include_usage)
    return event_stream(chunks(_head(request, reply), deltas, include_usage=include_usage))
