"""Drive the service as the HTTP edge does: a request body in, its response body out.

Each helper maps the body to the domain command (:mod:`turnledger.api.views`), calls
:class:`~turnledger.turn.pipeline.Conversations` with the caller's key and actor, and maps
the domain result back to the response body the API answers, so tests written
against the contract's shapes go through the same mapping the routes use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from turnledger.api import views
from turnledger.api.resolver import Caller
from turnledger.api.schemas import (
    ApprovalRequest,
    CallbackRequest,
    CancelResponse,
    ConversationView,
    EventsPage,
    TurnRequest,
    TurnResponse,
)
from turnledger.api.streaming import StreamPage
from turnledger.api.streaming import stream_page as _stream_page
from turnledger.api.streaming import turn_view as _turn_view
from turnledger.store.base import PurgeReport
from turnledger.turn import longturns
from turnledger.turn.callbacks import CallbackClaims
from turnledger.turn.drafts import DraftSink
from turnledger.turn.pipeline import Conversations

__all__ = ["Caller"]


def _approver_claims(who: Caller) -> dict[str, str]:
    """The approver claims the routes pass down for ``who``: its own, else those of the
    local runner's default identity (``sub``), which holds the approver scope."""
    return who.approver_claims or {"sub": who.actor}


def turn(
    svc: Conversations,
    who: Caller,
    conversation_id: str,
    request: TurnRequest,
    idempotency_key: str | None = None,
    *,
    sink: DraftSink | None = None,
) -> TurnResponse:
    """``POST .../turns`` (with its ``Idempotency-Key`` header, if given); the answer
    streams into ``sink``, the turn's draft, when one is given."""
    command = views.turn_command(request, idempotency_key, _approver_claims(who))
    return views.turn_response(svc.turn(who.key(conversation_id), who.actor, command, sink=sink))


def approve(
    svc: Conversations, who: Caller, conversation_id: str, request: ApprovalRequest
) -> TurnResponse:
    """``POST .../approvals``."""
    decided = views.decisions(request, _approver_claims(who))
    return views.turn_response(svc.approve(who.key(conversation_id), who.actor, decided))


def get(svc: Conversations, who: Caller, conversation_id: str) -> ConversationView:
    """``GET /v1/conversations/{id}``."""
    return views.conversation_view(svc.get(who.key(conversation_id)))


def events(
    svc: Conversations, who: Caller, conversation_id: str, *, after: int = 0, limit: int = 100
) -> EventsPage:
    """``GET .../events``."""
    return views.events_page(svc.events(who.key(conversation_id), after=after, limit=limit))


def clear(svc: Conversations, who: Caller, conversation_id: str) -> PurgeReport:
    """``DELETE /v1/conversations/{id}``."""
    return svc.clear(who.key(conversation_id))


def cancel(
    svc: Conversations, who: Caller, conversation_id: str, reason: str | None = None
) -> CancelResponse:
    """``POST .../cancel``."""
    return views.cancel_response(svc.cancel(who.key(conversation_id), who.actor, reason))


def settle_callback(svc: Conversations, claims: CallbackClaims, request: CallbackRequest) -> Any:
    """``POST /v1/callbacks/{token}`` once the token is verified."""
    return views.callback_response(svc.settle_callback(claims, views.callback_outcome(request)))


def accept(
    svc: Conversations,
    who: Caller,
    conversation_id: str,
    request: TurnRequest | ApprovalRequest,
    invoke: Callable[[dict[str, Any]], None],
) -> int:
    """Accept a long turn (``Prefer: respond-async``); returns its number."""
    claims = _approver_claims(who)
    command = (
        views.turn_command(request, approver_claims=claims)
        if isinstance(request, TurnRequest)
        else views.decisions(request, claims)
    )
    return longturns.accept(svc, who.key(conversation_id), who.actor, command, invoke)


def run_worker(svc: Conversations, event: dict[str, Any]) -> dict[str, Any]:
    """The turn worker's run, keeping the answers the API's worker keeps."""
    from turnledger.api.errors import error_body

    return longturns.run_worker(svc, event, answer=views.turn_body, error_body=error_body)


def turn_view(
    svc: Conversations, who: Caller, conversation_id: str, turn: int
) -> tuple[int, dict[str, Any]]:
    """``GET .../turns/{n}``: ``(status code, body)``."""
    return _turn_view(svc, who.key(conversation_id), turn)


def stream_page(
    svc: Conversations,
    who: Caller,
    conversation_id: str,
    turn: int,
    *,
    after: int,
    wait: float,
    gather: bool = False,
) -> StreamPage:
    """``GET .../turns/{n}/stream``."""
    return _stream_page(svc, who.key(conversation_id), turn, after=after, wait=wait, gather=gather)
