"""The OpenAI-compatible face: the part of OpenAI's Responses and Conversations API that the
official ``openai`` SDK needs for stateful chat, mapped onto the same ledger and tenancy.

``OpenAI(base_url="<api>/openai/v1", api_key=<token>)``: the API key is the bearer token
(locally ``local:<tenant>:<user>``), so the tenant is the caller's as on ``/v1``.

* ``POST /openai/v1/conversations`` names a new conversation (``conv_...``); like any
  conversation of the ledger, it is stored by its first turn.
* ``POST /openai/v1/responses`` is one turn (or one decision) of the conversation that
  ``conversation`` names, or that ``previous_response_id`` belongs to (it must be the
  conversation's latest response: the ledger has no branches), or of a new one. A response
  id is ``resp_<turn>_<conversation id>``.
* Input items: messages (``role: user``), ``function_call_output`` (a client tool's
  result) and ``mcp_approval_response`` (a decision on an ``mcp_approval_request``, whose
  id is the call's id). ``tools`` names registered tools (function tools by ``name``).
* Output items: the assistant's ``message``, a ``function_call`` per call awaiting the
  client, an ``mcp_approval_request`` per call awaiting approval.
* ``GET .../conversations/{id}/items`` lists the transcript as items; ``DELETE`` clears.

Errors under this prefix use OpenAI's shape (``{"error": {"message", "type", "param",
"code"}}``, see :func:`openai_error_body`); ``code`` is the ledger's error code.
"""

from __future__ import annotations

import json
import secrets
from datetime import datetime
from typing import Annotated, Any, Literal

from aws_lambda_powertools.event_handler import Response, content_types
from aws_lambda_powertools.event_handler.openapi.params import Body, Path, Query
from pydantic import BaseModel, ConfigDict

from ..core.exceptions import InvalidRequest
from ..core.models import CONVERSATION_ID_PATTERN, Event, validate_conversation_id
from ..runtime import get_runtime
from ..turn.results import TurnResult
from .errors import openai_error_body
from .resolver import app, approver, caller, conversation
from .schemas import (
    ApprovalEdit,
    ApprovalRequest,
    FunctionCallOutput,
    InputMessage,
    Rejection,
    TurnRequest,
)
from .views import decisions, pending_view, turn_command

__all__ = ["PREFIX", "items_of", "openai_error_body", "parse_response_id", "response_id"]

PREFIX = "/openai/v1"
#: Shown as the ``server_label`` of approval requests: the ledger's own tool registry.
SERVER_LABEL = "turnledger"

OpenAIConversationId = Annotated[str, Path(pattern=CONVERSATION_ID_PATTERN)]


class _Open(BaseModel):
    # OpenAI's request bodies carry many fields this face does not use; they are accepted.
    model_config = ConfigDict(extra="allow")


class ConversationCreate(_Open):
    """``POST /openai/v1/conversations``."""

    metadata: dict[str, str] | None = None
    items: list[dict[str, Any]] | None = None


class ResponseCreate(_Open):
    """``POST /openai/v1/responses``."""

    model: str | None = None
    input: str | list[dict[str, Any]]
    conversation: str | dict[str, Any] | None = None
    previous_response_id: str | None = None
    tools: list[dict[str, Any]] | None = None
    instructions: str | None = None
    metadata: dict[str, str] | None = None


def _json(status: int, body: dict[str, Any]) -> Response[str]:
    return Response(
        status_code=status, content_type=content_types.APPLICATION_JSON, body=json.dumps(body)
    )


def _epoch(moment: datetime) -> int:
    return int(moment.timestamp())


def response_id(conversation_id: str, turn: int) -> str:
    """The response id of ``turn`` of ``conversation_id``."""
    return f"resp_{turn}_{conversation_id}"


def parse_response_id(value: str) -> tuple[str, int]:
    """``(conversation id, turn)`` of a :func:`response_id`.

    Raises:
        InvalidRequest: not a response id of this service.
    """
    prefix, _, rest = value.partition("_")
    turn, _, conversation_id = rest.partition("_")
    if prefix != "resp" or not turn.isdigit() or not conversation_id:
        raise InvalidRequest(f"previous_response_id {value!r} is not a response of this service")
    return validate_conversation_id(conversation_id), int(turn)


@app.post(f"{PREFIX}/conversations", include_in_schema=False)
def create_conversation(request: Annotated[ConversationCreate, Body()]) -> Response[str]:
    """Name a new conversation; its first response stores it."""
    caller()
    if request.items:
        raise InvalidRequest("items at creation are not supported: send them as the first input")
    conversation_id = f"conv_{secrets.token_hex(12)}"
    now = get_runtime().conversations.clock()
    body = {
        "id": conversation_id,
        "object": "conversation",
        "created_at": _epoch(now),
        "metadata": request.metadata or {},
    }
    return _json(200, body)


@app.get(f"{PREFIX}/conversations/<conversation_id>", include_in_schema=False)
def retrieve_conversation(conversation_id: OpenAIConversationId) -> Response[str]:
    """The conversation, once its first response stored it."""
    _, key = conversation(conversation_id)
    view = get_runtime().conversations_for(key.tenant).get(key)
    body = {
        "id": conversation_id,
        "object": "conversation",
        "created_at": _epoch(view.created_at),
        "metadata": {},
    }
    return _json(200, body)


@app.delete(f"{PREFIX}/conversations/<conversation_id>", include_in_schema=False)
def delete_conversation(conversation_id: OpenAIConversationId) -> Response[str]:
    """Clear the conversation (as ``DELETE /v1/conversations/{id}``)."""
    _, key = conversation(conversation_id)
    get_runtime().conversations_for(key.tenant).clear(key)
    return _json(200, {"id": conversation_id, "object": "conversation.deleted", "deleted": True})


@app.get(f"{PREFIX}/conversations/<conversation_id>/items", include_in_schema=False)
def list_items(
    conversation_id: OpenAIConversationId,
    after: Annotated[str | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Annotated[Literal["asc", "desc"], Query()] = "desc",
) -> Response[str]:
    """The transcript as items, ``order``ed, ``limit`` per page after the item ``after``."""
    _, key = conversation(conversation_id)
    service = get_runtime().conversations_for(key.tenant)
    events: list[Event] = []
    cursor = 0
    while True:
        page = service.events(key, after=cursor, limit=1000)
        events.extend(page.events)
        if page.next_after is None:
            break
        cursor = page.next_after
    items = [item for event in events for item in items_of(event)]
    if order == "desc":
        items.reverse()
    if after is not None:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise InvalidRequest(f"after names no item of this conversation: {after!r}")
        items = items[ids.index(after) + 1 :]
    data = items[:limit]
    body = {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": len(items) > limit,
    }
    return _json(200, body)


def items_of(event: Event) -> list[dict[str, Any]]:
    """The conversation items one event shows as (none for bookkeeping events)."""
    payload = event.payload
    kind = event.kind.value
    base = f"{event.sequence}"
    if kind == "user_message":
        content = [{"type": "input_text", "text": payload["content"]}]
        return [
            {
                "type": "message",
                "id": f"msg_{base}",
                "status": "completed",
                "role": "user",
                "content": content,
            }
        ]
    if kind == "assistant_message":
        items: list[dict[str, Any]] = []
        text = payload.get("content")
        if payload.get("content_json") is not None:
            text = json.dumps(payload["content_json"], ensure_ascii=False)
        if text:
            items.append(_output_message(f"msg_{base}", text))
        for index, call in enumerate(payload.get("tool_calls") or []):
            items.append(
                {
                    "type": "function_call",
                    "id": f"fc_{base}_{index}",
                    "call_id": call["id"],
                    "name": call["name"],
                    "arguments": json.dumps(call["arguments"]),
                    "status": "completed",
                }
            )
        return items
    if kind == "tool_result":
        return [
            {
                "type": "function_call_output",
                "id": f"fco_{base}",
                "call_id": payload["call_id"],
                "output": payload["output"],
                "status": "completed",
            }
        ]
    if kind == "approval_resolved":
        return [
            {
                "type": "mcp_approval_response",
                "id": f"mcpa_{base}",
                "approval_request_id": payload["call_id"],
                "approve": payload["decision"] == "approved",
                "reason": payload.get("reason"),
            }
        ]
    return []


def _output_message(item_id: str, text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": item_id,
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def _conversation_of(request: ResponseCreate) -> tuple[str, int | None]:
    """The conversation ``request`` continues, or a new one's id; and the turn that
    ``previous_response_id`` names (``None``: none named)."""
    if request.conversation is not None and request.previous_response_id is not None:
        raise InvalidRequest("send conversation or previous_response_id, not both")
    if request.conversation is not None:
        named = request.conversation
        value = named.get("id") if isinstance(named, dict) else named
        if not isinstance(value, str):
            raise InvalidRequest("conversation must be an id or {'id': ...}")
        return validate_conversation_id(value), None
    if request.previous_response_id is not None:
        return parse_response_id(request.previous_response_id)
    return f"conv_{secrets.token_hex(12)}", None


@app.post(f"{PREFIX}/responses", include_in_schema=False)
def create_response(request: Annotated[ResponseCreate, Body()]) -> Response[str]:
    """One turn (or a decision on pending calls) of a conversation, as an OpenAI response."""
    conversation_id, previous_turn = _conversation_of(request)
    who, key = conversation(conversation_id)
    service = get_runtime().conversations_for(key.tenant)
    if previous_turn is not None:
        turns = service.get(key).turns
        if turns != previous_turn:
            raise InvalidRequest(
                "previous_response_id must be the conversation's latest response "
                f"(turn {turns}); the ledger does not branch"
            )
    items: list[dict[str, Any]] = (
        [{"type": "message", "role": "user", "content": request.input}]
        if isinstance(request.input, str)
        else request.input
    )
    approvals = [item for item in items if item.get("type") == "mcp_approval_response"]
    others = [item for item in items if item.get("type") != "mcp_approval_response"]
    if approvals and others:
        raise InvalidRequest("send mcp_approval_response items on their own")
    if approvals:
        approve: list[str | ApprovalEdit] = []
        reject: list[str | Rejection] = []
        for item in approvals:
            call_id = item.get("approval_request_id")
            if not isinstance(call_id, str) or not isinstance(item.get("approve"), bool):
                raise InvalidRequest("mcp_approval_response needs approval_request_id and approve")
            if item["approve"]:
                approve.append(call_id)
            else:
                reject.append(Rejection(id=call_id, reason=item.get("reason")))
        # Deciding here needs what the approvals route needs.
        who = approver(key.conversation_id)
        decided = decisions(ApprovalRequest(approve=approve, reject=reject), who.approver_claims)
        reply = service.approve(key, who.actor, decided)
    else:
        reply = service.turn(key, who.actor, turn_command(_turn_request(request, others)))
    return _json(200, _response_body(request, reply))


def _turn_request(request: ResponseCreate, items: list[dict[str, Any]]) -> TurnRequest:
    inputs: list[InputMessage | FunctionCallOutput] = []
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            if item.get("role") != "user":
                raise InvalidRequest("input messages must have role user")
            inputs.append(InputMessage(type="message", role="user", content=_text(item)))
        elif kind == "function_call_output":
            output = item.get("output")
            inputs.append(
                FunctionCallOutput(
                    type="function_call_output",
                    call_id=str(item.get("call_id", "")),
                    output=output if isinstance(output, str) else json.dumps(output),
                )
            )
        else:
            raise InvalidRequest(f"input items of type {kind!r} are not supported")
    if not inputs:
        raise InvalidRequest("input holds no item")
    tools = None
    if request.tools is not None:
        tools = [str(tool.get("name") or tool.get("server_label") or "") for tool in request.tools]
    metadata = dict(request.metadata or {})
    if request.instructions:
        # Kept on the turn; the deployment's system prompt is what the model is sent.
        metadata["instructions"] = request.instructions[:1000]
    return TurnRequest(input=inputs, model=request.model, tools=tools, metadata=metadata)


def _text(item: dict[str, Any]) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [
            str(part.get("text", ""))
            for part in content
            if isinstance(part, dict) and part.get("type") in {"input_text", "text"}
        ]
        return "\n".join(parts)
    raise InvalidRequest("a message's content must be text or a list of input_text parts")


def _response_body(request: ResponseCreate, reply: TurnResult) -> dict[str, Any]:
    output: list[dict[str, Any]] = []
    if reply.output_text:
        output.append(_output_message(f"msg_{reply.turn}", reply.output_text))
    for call in map(pending_view, reply.waiting):
        arguments = json.dumps(call.arguments)
        if call.requires == "approval":
            output.append(
                {
                    "type": "mcp_approval_request",
                    "id": call.id,
                    "name": call.name,
                    "arguments": arguments,
                    "server_label": SERVER_LABEL,
                }
            )
        elif call.requires in ("client", "input"):
            # A human-input call is answered the same way (function_call_output); a
            # deferred one waits for its job's callback, not for this client.
            output.append(
                {
                    "type": "function_call",
                    "id": f"fc_{call.id}",
                    "call_id": call.id,
                    "name": call.name,
                    "arguments": arguments,
                    "status": "completed",
                }
            )
    usage = reply.usage
    now = get_runtime().conversations.clock()
    return {
        "id": response_id(reply.conversation_id, reply.turn),
        "object": "response",
        "created_at": _epoch(now),
        "status": "completed",
        "model": request.model or get_runtime().settings.model,
        "output": output,
        "conversation": {"id": reply.conversation_id},
        "previous_response_id": request.previous_response_id,
        "instructions": request.instructions,
        "tools": request.tools or [],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "metadata": request.metadata or {},
        "temperature": None,
        "top_p": None,
        "error": None,
        "incomplete_details": None,
        "usage": {
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
            "total_tokens": usage.input_tokens + usage.output_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    }
