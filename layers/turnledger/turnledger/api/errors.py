"""The error shapes of the API.

Every failure answers ``{"error": {"code", "message", "details"}}`` (under
``/openai/`` OpenAI's own shape, :func:`openai_error_body`); the resolver's
exception handlers (:mod:`.resolver`) answer them, and a long turn's draft keeps
them. Nothing chooses a status by matching message text.
"""

from __future__ import annotations

from typing import Any

from ..core.exceptions import ApprovalPending, InputPending, TurnledgerError
from .views import pending_view

#: Where the OpenAI-compatible face's routes live (errors there use OpenAI's shape).
OPENAI_PREFIX = "/openai/"


def error_body(exc: TurnledgerError) -> dict[str, Any]:
    """``exc`` as the contract's error body; calls that block a request are listed in
    ``details.pending_tool_calls`` as the API shows pending calls."""
    body = exc.to_body()
    if isinstance(exc, ApprovalPending | InputPending):
        body["error"]["details"] = {
            **exc.details,
            "pending_tool_calls": [pending_view(p).model_dump(mode="json") for p in exc.pending],
        }
    return body


def openai_error_body(exc: TurnledgerError) -> dict[str, Any]:
    """``exc`` in OpenAI's error shape; ``param`` names the field when the error says which.
    Calls that block a request add ``conversation_id`` and ``pending_tool_calls``."""
    details = exc.details or {}
    errors = details.get("errors")
    given = details.get("param")
    param = given if isinstance(given, str) else None
    if param is None and isinstance(errors, list) and errors and isinstance(errors[0], dict):
        loc = [str(part) for part in errors[0].get("loc", []) if part != "body"]
        param = ".".join(loc) or None
    kind = "server_error" if exc.status >= 500 else "invalid_request_error"
    if exc.status == 401:
        kind = "authentication_error"
    elif exc.status == 404:
        kind = "not_found_error"
    error: dict[str, Any] = {"message": str(exc), "type": kind, "param": param, "code": exc.code}
    if isinstance(exc, ApprovalPending | InputPending):
        # Beyond OpenAI's four fields: what a client needs to have the calls decided.
        error["conversation_id"] = details.get("conversation_id")
        error["pending_tool_calls"] = [pending_view(p).model_dump(mode="json") for p in exc.pending]
    return {"error": error}


def body_for(exc: TurnledgerError, path: str) -> dict[str, Any]:
    """The error body of ``exc`` for a request to ``path``."""
    return openai_error_body(exc) if path.startswith(OPENAI_PREFIX) else error_body(exc)
