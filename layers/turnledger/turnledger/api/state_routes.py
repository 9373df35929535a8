"""``GET /v1/conversations/{id}/state``: the four questions of a conversation, answered
from its log (:mod:`turnledger.turn.state`); a read of the tenant's store alone."""

from __future__ import annotations

from ..runtime import get_runtime
from ..turn.state import FourAnswers, four_answers
from .resolver import ConversationId, app, conversation, responses


@app.get(
    "/v1/conversations/<conversation_id>/state",
    responses=responses(FourAnswers, 400, 401, 404, 409, 422, 503),
)
def get_state(conversation_id: ConversationId) -> FourAnswers:
    """Which events happened, which external actions may have completed, what the next
    model call may receive, and what remains if the provider cursor disappears."""
    _, key = conversation(conversation_id)
    runtime = get_runtime()
    return four_answers(runtime.reads_for(key.tenant), key, runtime.data_policy(key.tenant))
