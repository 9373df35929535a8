"""A person answers what a running call's tool asked (an MCP server's elicitation).

A server of the 2026-07-28 protocol may answer a ``tools/call`` with a question for the
user instead of a result (:mod:`turnledger.tools.mcp_client`). The call then waits for a
person (:func:`ask`: ``tool_input_requested``, ``ready`` -> ``awaiting_input``; the inbox
lists it with kind ``input``, its message and its schema). The person's answer comes the
way a human-input tool's output does (``outputs`` on the approvals route, or a
``function_call_output`` item), as the JSON of an MCP ``ElicitResult``:
``{"action": "accept", "content": {...}}`` (``content`` must pass the requested schema),
``{"action": "decline"}`` or ``{"action": "cancel"}``. Every answer of a request is
checked before any is recorded (:func:`check_answers`: ``422`` and nothing changes);
then each is recorded (:func:`answer`: ``tool_input_provided``, ``awaiting_input`` ->
``ready``) and the call is sent again under its own id with the answer and the server's
``request_state``. The server may ask again (another round) or finish.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import ConfigDict, ValidationError, model_validator

from ..core.exceptions import RequestValidationFailed
from ..core.models import Deferred, Elicitation, PendingCall, ToolInputProvided, ToolInputRequested
from ..tools.registry import schema_refusal
from .lifecycle import CallMove
from .session import Session

__all__ = ["answer", "ask", "check_answers"]


class _Answer(Deferred):
    """A person's answer, as MCP's ``ElicitResult`` has it."""

    model_config = ConfigDict(extra="forbid")

    action: Literal["accept", "decline", "cancel"]
    content: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _content_with_accept(self) -> _Answer:
        if self.action == "accept" and self.content is None:
            raise ValueError('"accept" carries the content the requested schema describes')
        if self.action != "accept" and self.content is not None:
            raise ValueError(f'"{self.action}" carries no content')
        return self


def _refusal(asked: Elicitation, output: str) -> tuple[dict[str, Any] | None, str | None]:
    """The answer ``output`` gives to ``asked`` (as stored), or why it gives none."""
    try:
        given = _Answer.model_validate(json.loads(output))
    except ValueError as exc:  # json's and pydantic's errors alike
        why = (
            "; ".join(str(e["msg"]) for e in exc.errors())
            if isinstance(exc, ValidationError)
            else "it is not JSON"
        )
        return None, (
            'the answer is the JSON of {"action": "accept", "content": {...}}, '
            f'{{"action": "decline"}} or {{"action": "cancel"}}: {why}'
        )
    if given.content is not None:
        problem = schema_refusal(asked.requested_schema, given.content, "content")
        if problem is not None:
            return None, f"the answer does not pass the requested schema: {problem}"
    return given.model_dump(exclude_none=True), None


def check_answers(
    waiting: Mapping[str, PendingCall], outputs: Mapping[str, str]
) -> dict[str, dict[str, Any]]:
    """The answers among ``outputs`` to calls of ``waiting`` whose tool asked a person, by
    call id (other ids are left to the caller).

    Raises:
        RequestValidationFailed: an answer is not an ``ElicitResult`` or its content does
            not pass the requested schema (``details.errors[]``: ``id``, ``msg``); nothing
            is recorded, the calls still wait.
    """
    answers: dict[str, dict[str, Any]] = {}
    errors = []
    for call_id, output in outputs.items():
        pending = waiting.get(call_id)
        if pending is None or pending.elicitation is None:
            continue
        given, why = _refusal(pending.elicitation, output)
        if given is None:
            errors.append({"id": call_id, "msg": why})
        else:
            answers[call_id] = given
    if errors:
        raise RequestValidationFailed(
            "an answer to a tool's question was refused; nothing was recorded",
            details={"errors": errors},
        )
    return answers


def ask(session: Session, pending: PendingCall, asked: Elicitation) -> None:
    """Record that ``pending``'s tool asks a person ``asked`` first: the call waits for the
    answer (it has no window: it waits until answered, cancelled or the conversation ends)."""
    session.add(
        ToolInputRequested(
            call_id=pending.id,
            name=pending.name,
            message=asked.message,
            requested_schema=asked.requested_schema,
            round=asked.round,
        ),
        actor=f"tool:{pending.name}",
    )
    session.machine.change(pending, CallMove.ELICIT, elicitation=asked, expires_at=None)


def answer(
    session: Session,
    pending: PendingCall,
    given: dict[str, Any],
    *,
    actor: str,
    via: Literal["approvals", "turn"],
) -> None:
    """Record ``actor``'s answer ``given`` (checked by :func:`check_answers`) to what
    ``pending``'s tool asked: the call is ready to be sent again with it."""
    assert pending.elicitation is not None  # only such calls are answered here
    session.add(
        ToolInputProvided(call_id=pending.id, name=pending.name, provided_by=actor, via=via),
        actor=actor,
    )
    session.machine.change(
        pending,
        CallMove.ANSWER,
        elicitation=pending.elicitation.model_copy(update={"answer": given}),
    )
