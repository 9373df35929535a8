"""``POST /v1/conversations/{id}/compact``: compact now, or write the newest summary again.

With no summary yet, the new ``context_compacted`` event (``trigger: "manual"``) covers
every turn but the newest, by the budget trigger's rules; with one, it covers the same
range as the summary it rewrites (named by its ``replaces``). Either is written by the
summarizer the body names; later turns use it, and nothing is deleted
(:meth:`turnledger.turn.pipeline.Conversations.compact`).
"""

from __future__ import annotations

from typing import Annotated

from aws_lambda_powertools.event_handler.openapi.params import Body

from ..runtime import get_runtime
from .resolver import ConversationId, app, conversation, responses
from .schemas import CompactRequest, EventView


@app.post(
    "/v1/conversations/<conversation_id>/compact",
    responses=responses(EventView, 400, 401, 404, 409, 413, 422, 502, 503, 504),
)
def post_compact(
    conversation_id: ConversationId, request: Annotated[CompactRequest, Body()]
) -> EventView:
    """Compact now (no summary yet: every turn but the newest), or summarize the newest
    summary's range again (optionally with another summarizer); answers the new
    ``context_compacted`` event."""
    who, key = conversation(conversation_id)
    service = get_runtime().conversations_for(key.tenant)
    event = service.compact(key, who.actor, provider=request.provider, model=request.model)
    return EventView.model_validate(event.model_dump())
