"""The OpenAI face's request bodies and the small helpers every route of it shares.

OpenAI's bodies carry many fields this face does not use; they are accepted and ignored
(``extra="allow"``).
"""

from __future__ import annotations

import secrets
from datetime import datetime
from typing import Annotated, Any

from aws_lambda_powertools.event_handler.openapi.params import Path
from pydantic import ConfigDict

from ...core.models import CONVERSATION_ID_PATTERN, Deferred

__all__ = [
    "PREFIX",
    "ConversationCreate",
    "ItemsCreate",
    "OpenAIConversationId",
    "ResponseCreate",
    "epoch",
    "new_conversation_id",
]

PREFIX = "/openai/v1"

OpenAIConversationId = Annotated[str, Path(pattern=CONVERSATION_ID_PATTERN)]


def new_conversation_id() -> str:
    """A new conversation id of this face (``conv_<24 hex>``)."""
    return f"conv_{secrets.token_hex(12)}"


class _Open(Deferred):
    model_config = ConfigDict(extra="allow")


class ConversationCreate(_Open):
    """``POST /openai/v1/conversations``."""

    metadata: dict[str, str] | None = None
    items: list[dict[str, Any]] | None = None


class ItemsCreate(_Open):
    """``POST /openai/v1/conversations/{id}/items``."""

    items: list[dict[str, Any]]


class ResponseCreate(_Open):
    """``POST /openai/v1/responses``."""

    model: str | None = None
    input: str | list[dict[str, Any]]
    conversation: str | dict[str, Any] | None = None
    previous_response_id: str | None = None
    tools: list[dict[str, Any]] | None = None
    instructions: str | None = None
    metadata: dict[str, str] | None = None
    stream: bool = False
    store: bool = True


def epoch(moment: datetime) -> int:
    """``moment`` in whole epoch seconds, as OpenAI's ``created_at``."""
    return int(moment.timestamp())
