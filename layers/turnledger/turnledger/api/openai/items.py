"""Conversation items of the OpenAI face: the ids it gives, the items the ledger's events
show as, the input items a request sends (read into the ledger's vocabulary), and the
canonical form in which a request's history is compared with a stored transcript.

Every item id this face gives is ``<kind>_<token>_<conversation id>`` (the token holds no
``_``). Ids a client sends back are accepted and play no part in matching a history with a
stored transcript: only the items' canonical form does (:mod:`.matching`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from ...core.exceptions import InvalidRequest
from ...core.models import (
    MAX_CALL_ID_CHARS,
    AssistantMessage,
    Event,
    ToolCall,
    ToolResult,
    UserMessage,
)
from ...core.strict_json import tool_arguments

__all__ = [
    "Canon",
    "InputItem",
    "Transcript",
    "history_of",
    "item_id",
    "items_of",
    "output_message",
    "parse_input",
    "transcript",
]

#: An item in canonical form: its kind and what it says (text, call id, name, arguments).
Canon = tuple[str, ...]

Kind = Literal[
    "user", "assistant", "instructions", "function_call", "function_call_output", "approval"
]

#: Input kinds that are accepted and left out of the transcript (kept by the client).
_OPAQUE = frozenset({"reasoning", "mcp_approval_request", "mcp_list_tools", "mcp_call"})
#: Content parts that are text.
_TEXT_PARTS = frozenset({"input_text", "output_text", "text", "refusal"})


def item_id(kind: str, token: str | int, conversation_id: str) -> str:
    """The id of an item of ``conversation_id`` (``token`` holds no ``_``)."""
    return f"{kind}_{token}_{conversation_id}"


def canonical_arguments(arguments: dict[str, Any]) -> str:
    """Arguments as canonical JSON text (sorted keys, no spaces): equal values, equal text."""
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def output_message(item: str, text: str) -> dict[str, Any]:
    """An assistant message item holding ``text``."""
    return {
        "type": "message",
        "id": item,
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def _assistant_text(payload: dict[str, Any]) -> str | None:
    if payload.get("content_json") is not None:
        return json.dumps(payload["content_json"], ensure_ascii=False)
    text = payload.get("content")
    return text if isinstance(text, str) else None


def items_of(event: Event) -> list[dict[str, Any]]:
    """The conversation items one event shows as (none for bookkeeping events)."""
    payload = event.payload
    kind = event.kind.value
    conversation_id = event.conversation_id
    if kind == "user_message":
        return [
            {
                "type": "message",
                "id": item_id("msg", event.sequence, conversation_id),
                "status": "completed",
                "role": "user",
                "content": [{"type": "input_text", "text": payload["content"]}],
            }
        ]
    if kind == "assistant_message":
        items: list[dict[str, Any]] = []
        text = _assistant_text(payload)
        if text:
            items.append(output_message(item_id("msg", event.sequence, conversation_id), text))
        for index, call in enumerate(payload.get("tool_calls") or []):
            items.append(
                {
                    "type": "function_call",
                    "id": item_id("fc", f"{event.sequence}.{index}", conversation_id),
                    "call_id": call["id"],
                    "name": call["name"],
                    "arguments": call.get("raw_arguments") or json.dumps(call["arguments"]),
                    "status": "completed",
                }
            )
        return items
    if kind == "tool_result":
        return [
            {
                "type": "function_call_output",
                "id": item_id("fco", event.sequence, conversation_id),
                "call_id": payload["call_id"],
                "output": payload["output"],
                "status": "completed",
            }
        ]
    if kind == "approval_resolved":
        return [
            {
                "type": "mcp_approval_response",
                "id": item_id("mcpa", event.sequence, conversation_id),
                "approval_request_id": payload["call_id"],
                "approve": payload["decision"] == "approved",
                "reason": payload.get("reason"),
            }
        ]
    return []


@dataclass(frozen=True)
class InputItem:
    """One input item of a request, read."""

    kind: Kind
    text: str = ""
    call_id: str = ""
    name: str = ""
    arguments: dict[str, Any] | None = None
    #: A function call's argument text when it is no JSON object.
    raw_arguments: str | None = None
    approve: bool = False
    reason: str | None = None
    #: The id the client sent with it (accepted; matching goes by content).
    id: str | None = None

    @property
    def canon(self) -> Canon | None:
        """The item in canonical form; ``None`` for items outside the transcript."""
        if self.kind in ("user", "assistant"):
            return (self.kind, self.text)
        if self.kind == "function_call":
            arguments = self.raw_arguments
            if arguments is None:
                arguments = canonical_arguments(self.arguments or {})
            return ("function_call", self.call_id, self.name, arguments)
        if self.kind == "function_call_output":
            return ("function_call_output", self.call_id, self.text)
        return None


def _content_text(content: object, what: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts: list[str] = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") not in _TEXT_PARTS:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise InvalidRequest(
                    f"{what} content parts of type {kind!r} are not supported (text only)",
                    details={"param": "input"},
                )
            texts.append(str(part.get("text") or part.get("refusal") or ""))
        return "\n".join(texts)
    raise InvalidRequest(f"{what} content must be text or a list of text parts")


def _check_call_id(call_id: str) -> None:
    """Refuse a call id over :data:`MAX_CALL_ID_CHARS` (it is never quoted back).

    Raises:
        InvalidRequest: it is longer.
    """
    if len(call_id) > MAX_CALL_ID_CHARS:
        raise InvalidRequest(
            f"a call id may be at most {MAX_CALL_ID_CHARS} characters",
            details={"limit": MAX_CALL_ID_CHARS},
        )


def _read(item: dict[str, Any]) -> InputItem | None:
    kind = item.get("type", "message")
    sent_id = item.get("id") if isinstance(item.get("id"), str) else None
    if kind == "message":
        role = item.get("role")
        text = _content_text(item.get("content"), "a message's")
        if role in ("user", "assistant"):
            return InputItem(kind=role, text=text, id=sent_id)
        if role in ("system", "developer"):
            return InputItem(kind="instructions", text=text, id=sent_id)
        raise InvalidRequest("input messages must have role user, assistant, system or developer")
    if kind == "function_call":
        call_id, name = item.get("call_id"), item.get("name")
        if not isinstance(call_id, str) or not call_id or not isinstance(name, str) or not name:
            raise InvalidRequest("a function_call item needs call_id and name")
        _check_call_id(call_id)
        raw = item.get("arguments") or ""
        arguments: dict[str, Any] | None = {}
        raw_arguments: str | None = None
        if isinstance(raw, dict):
            arguments = raw
        else:
            # Held to a body's limits, as a model's arguments are (the text is inside
            # the body, unread by the body's own check).
            parsed, refused = tool_arguments(str(raw))
            arguments, raw_arguments = (parsed, None) if refused is None else (None, refused)
        return InputItem(
            kind="function_call",
            call_id=call_id,
            name=name,
            arguments=arguments,
            raw_arguments=raw_arguments,
            id=sent_id,
        )
    if kind == "function_call_output":
        call_id = item.get("call_id")
        if not isinstance(call_id, str) or not call_id:
            raise InvalidRequest("a function_call_output item needs call_id")
        _check_call_id(call_id)
        output = item.get("output")
        text = (
            output
            if isinstance(output, str)
            else _content_text(output, "a function_call_output's")
            if isinstance(output, list)
            else json.dumps(output)
        )
        return InputItem(kind="function_call_output", call_id=call_id, text=text, id=sent_id)
    if kind == "mcp_approval_response":
        call_id = item.get("approval_request_id")
        if not isinstance(call_id, str) or not isinstance(item.get("approve"), bool):
            raise InvalidRequest("mcp_approval_response needs approval_request_id and approve")
        # An MCP tool's request is mcpr_<call id> (.mcp); the ledger's own, the call id.
        call_id = call_id.removeprefix("mcpr_")
        _check_call_id(call_id)
        reason = item.get("reason")
        return InputItem(
            kind="approval",
            call_id=call_id,
            approve=bool(item["approve"]),
            reason=reason if isinstance(reason, str) else None,
            id=sent_id,
        )
    if kind in _OPAQUE:
        return None
    raise InvalidRequest(f"input items of type {kind!r} are not supported")


def parse_input(value: str | list[dict[str, Any]]) -> list[InputItem]:
    """A request's ``input`` as items (a string is one user message). Reasoning items and
    echoed approval requests are accepted and left out.

    Raises:
        InvalidRequest: an item this face cannot take (names its kind).
    """
    if isinstance(value, str):
        return [InputItem(kind="user", text=value)]
    items: list[InputItem] = []
    for raw in value:
        if not isinstance(raw, dict):
            raise InvalidRequest("input items must be objects")
        read = _read(raw)
        if read is not None:
            items.append(read)
    return items


@dataclass(frozen=True)
class Transcript:
    """The canonical items a client was shown of a run of events, and where that leaves
    the transcript."""

    items: list[Canon]
    #: The transcript ends with an answer of this service's model (a response ends there).
    answered: bool
    #: Calls shown to the client (``function_call`` items) that have no output yet.
    open_calls: frozenset[str]


def transcript(
    events: Iterable[Event],
    *,
    answered: bool = False,
    open_calls: frozenset[str] = frozenset(),
) -> Transcript:
    """The canonical items a client was shown of ``events``: user and assistant messages,
    and the calls the client (or a person) answered with their outputs; calls this service
    ran or asked approval for are not the client's items. ``answered`` and ``open_calls``
    are where the events before these left it (the start of a conversation by default):
    an output whose call came before ``events`` is shown when its call is open.
    """
    events = list(events)
    requires = {
        (e.turn, e.payload["call_id"]): e.payload["requires"]
        for e in events
        if e.kind.value == "tool_call_requested"
    }
    open_now = set(open_calls)
    items: list[Canon] = []
    for event in events:
        payload, kind = event.payload, event.kind.value
        if kind == "user_message":
            items.append(("user", payload["content"]))
            answered = False
        elif kind == "assistant_message":
            text = _assistant_text(payload)
            if text:
                items.append(("assistant", text))
            for call in payload.get("tool_calls") or []:
                # A call with no request event is one the client gave as history.
                if requires.get((event.turn, call["id"]), "client") in ("client", "input"):
                    arguments = call.get("raw_arguments") or canonical_arguments(call["arguments"])
                    items.append(("function_call", call["id"], call["name"], arguments))
                    open_now.add(call["id"])
            answered = payload.get("source", "model") == "model"
        elif kind == "tool_result" and payload["call_id"] in open_now:
            open_now.discard(payload["call_id"])
            items.append(("function_call_output", payload["call_id"], payload["output"]))
            answered = False
    return Transcript(items=items, answered=answered, open_calls=frozenset(open_now))


def history_of(items: Iterable[InputItem]) -> list[UserMessage | AssistantMessage | ToolResult]:
    """Input items as the ledger's events, the client as their source: user messages,
    assistant items (``source="client"``; function calls join the assistant item before
    them), and the outputs of those calls."""
    recorded: list[UserMessage | AssistantMessage | ToolResult] = []
    names: dict[str, str] = {}
    for item in items:
        if item.kind == "user":
            recorded.append(UserMessage(content=item.text))
        elif item.kind == "assistant":
            recorded.append(AssistantMessage(source="client", content=item.text))
        elif item.kind == "function_call":
            call = ToolCall(
                id=item.call_id,
                name=item.name,
                arguments=item.arguments or {},
                raw_arguments=item.raw_arguments,
            )
            names[item.call_id] = item.name
            last = recorded[-1] if recorded else None
            if isinstance(last, AssistantMessage):
                recorded[-1] = last.model_copy(update={"tool_calls": [*last.tool_calls, call]})
            else:
                recorded.append(AssistantMessage(source="client", tool_calls=[call]))
        elif item.kind == "function_call_output":
            name = names.get(item.call_id, "client")
            recorded.append(ToolResult(call_id=item.call_id, name=name, output=item.text))
    return recorded
