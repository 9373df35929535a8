"""Rebuild the working context (what the model sees next) from canonical events.

The transcript is the record; the context is derived from it on every turn.
Only conversational events become messages: user and assistant messages and
tool results. Execution-state events (requests, approvals) stay out. Tool
results are placed right after the assistant message that asked for them, in
its call order, whatever order they were recorded in (approvals may arrive in
any order).
"""

from __future__ import annotations

from collections.abc import Iterable

from .models import AssistantMessage, Event, EventKind, ToolResult, UserMessage
from .providers.base import Message


def build_messages(events: Iterable[Event], *, system_prompt: str = "") -> list[Message]:
    """The provider-neutral messages for ``events`` (oldest first)."""
    messages: list[Message] = []
    if system_prompt:
        messages.append(Message(role="system", content=system_prompt))
    waiting: list[str] = []  # call ids of the last assistant message, in order
    results: dict[str, Message] = {}

    def flush() -> None:
        messages.extend(results.pop(call_id) for call_id in waiting if call_id in results)
        waiting.clear()
        results.clear()

    for event in events:
        body = event.body()
        if isinstance(body, UserMessage):
            flush()
            messages.append(Message(role="user", content=body.content))
        elif isinstance(body, AssistantMessage):
            flush()
            messages.append(
                Message(role="assistant", content=body.content, tool_calls=body.tool_calls)
            )
            waiting.extend(call.id for call in body.tool_calls)
        elif isinstance(body, ToolResult) and event.kind is EventKind.TOOL_RESULT:
            results[body.call_id] = Message(
                role="tool",
                tool_call_id=body.call_id,
                name=body.name,
                content=body.output,
                is_error=body.is_error,
            )
    flush()
    return messages
