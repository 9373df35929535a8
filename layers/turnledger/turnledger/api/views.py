"""Request bodies to domain commands, and domain results to response bodies.

The only place the HTTP shapes of :mod:`.schemas` meet the service's commands
(:mod:`turnledger.turn.commands`) and results (:mod:`turnledger.turn.results`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..core.models import PendingCall, Usage
from ..turn.approvals import InboxListing
from ..turn.commands import CallbackOutcome, ClientOutput, Decisions, TurnCommand
from ..turn.lifecycle import WAIT_OF_STATE, logged_status, shown_reason
from ..turn.results import (
    CallbackResult,
    CancelResult,
    ConversationState,
    EventPage,
    ForkPage,
    OutputText,
    SweepReport,
    TurnResult,
)
from .schemas import (
    ApprovalRequest,
    CallbackRequest,
    CallbackResponse,
    CancelResponse,
    ContextInfo,
    ConversationView,
    EventsPage,
    EventView,
    ForkParentView,
    ForksPage,
    ForkView,
    FunctionCallOutput,
    InboxItemView,
    InboxPageView,
    InputMessage,
    OutputFunctionCall,
    OutputMessage,
    PendingToolCallView,
    PurgeReportView,
    TurnError,
    TurnRequest,
    TurnResponse,
    TurnsPage,
    TurnSummaryView,
)

if TYPE_CHECKING:
    # Annotations only: the read and clear functions never load the long turns' module.
    from ..turn.turn_reads import TurnEntry, TurnsListing

# --- requests -> commands -----------------------------------------------------------------


def turn_command(
    request: TurnRequest,
    idempotency_key: str | None = None,
    approver_claims: dict[str, str] | None = None,
) -> TurnCommand:
    """The command of ``POST .../turns``: its messages and its outputs, apart, the
    request's ``Idempotency-Key``, and the caller's approver claims (none: it holds no
    approver scope)."""
    if isinstance(request.input, str):
        messages, outputs = [request.input], []
    else:
        messages = [i.content for i in request.input if isinstance(i, InputMessage)]
        outputs = [
            ClientOutput(call_id=i.call_id, output=i.output)
            for i in request.input
            if isinstance(i, FunctionCallOutput)
        ]
    return TurnCommand(
        messages=messages,
        outputs=outputs,
        model=request.model,
        provider=request.provider,
        response_format=request.response_format,
        tools=request.tools,
        require_approval=request.require_approval,
        metadata=request.metadata,
        idempotency_key=idempotency_key,
        memory=request.memory,
        approver_claims=approver_claims or {},
        data_class=request.data_class,
    )


def decisions(request: ApprovalRequest, approver_claims: dict[str, str] | None = None) -> Decisions:
    """The decisions of ``POST .../approvals``, with the claims that allowed them."""
    return Decisions(
        approvals=request.approvals(),
        rejections=request.rejections(),
        outputs={o.id: o.output for o in request.outputs},
        approver_claims=approver_claims or {},
    )


def callback_outcome(request: CallbackRequest) -> CallbackOutcome:
    """The outcome a ``POST /v1/callbacks/{token}`` reports."""
    return CallbackOutcome(
        status=request.status, output=request.output, continue_turn=request.continue_
    )


# --- results -> responses -----------------------------------------------------------------


def pending_view(pending: PendingCall) -> PendingToolCallView:
    """The API's view of a pending call."""
    return PendingToolCallView(
        id=pending.id,
        name=pending.name,
        arguments=pending.arguments,
        requires=WAIT_OF_STATE.get(pending.state, "approval"),
        expires_at=pending.expires_at,
        reason=shown_reason(pending),
        task_id=pending.task_id,
        message=pending.elicitation.message if pending.elicitation else None,
        requested_schema=pending.elicitation.requested_schema if pending.elicitation else None,
    )


def turn_response(result: TurnResult) -> TurnResponse:
    """The answer of a turn (and of a decision that continued it)."""
    return TurnResponse(
        conversation_id=result.conversation_id,
        turn=result.turn,
        status=result.status,
        status_reason=result.status_reason,
        output_text=result.output_text,
        output_json=result.output_json,
        output=[
            OutputMessage(content=item.content)
            if isinstance(item, OutputText)
            else OutputFunctionCall(call_id=item.call_id, name=item.name, arguments=item.arguments)
            for item in result.output
        ],
        pending_tool_calls=[pending_view(p) for p in result.waiting],
        awaiting=result.awaiting,
        usage=result.usage,
        context=ContextInfo(
            messages_sent=result.context.messages_sent,
            provider_state=result.context.provider_state,
            tokens_estimated=result.context.tokens_estimated,
            budget_tokens=result.context.budget_tokens,
            summary_through=result.context.summary_through,
        ),
    )


def turn_body(result: TurnResult) -> dict[str, Any]:
    """:func:`turn_response` as JSON (what a long turn's draft keeps)."""
    return turn_response(result).model_dump(mode="json")


def conversation_view(state: ConversationState) -> ConversationView:
    """The answer of ``GET /v1/conversations/{id}``."""
    return ConversationView(
        conversation_id=state.conversation_id,
        status=state.status,
        turns=state.turns,
        events=state.events,
        created_at=state.created_at,
        updated_at=state.updated_at,
        expires_at=state.expires_at,
        ttl_seconds=state.ttl_seconds,
        pending_tool_calls=[pending_view(p) for p in state.waiting],
        usage=state.usage,
        cost_usd=state.cost_usd,
        failed_turns=state.failed_turns,
        summary_through=state.summary_through,
        awaiting=state.awaiting,
        expired_tool_calls=[pending_view(p) for p in state.expired],
        parent=ForkParentView(
            conversation_id=state.parent.conversation_id,
            turn=state.parent.turn,
            seq=state.parent.seq,
        )
        if state.parent is not None
        else None,
        forks=state.forks,
        data_class=state.data_class,
    )


def forks_page(page: ForkPage) -> ForksPage:
    """The answer of ``GET .../forks``."""
    return ForksPage(
        conversation_id=page.conversation_id,
        forks=[
            ForkView(
                conversation_id=f.conversation_id, turn=f.turn, seq=f.seq, created_at=f.created_at
            )
            for f in page.forks
        ],
        next_after=page.next_after,
    )


def events_page(page: EventPage) -> EventsPage:
    """The answer of ``GET .../events``."""
    return EventsPage(
        conversation_id=page.conversation_id,
        events=[EventView.model_validate(e.model_dump()) for e in page.events],
        next_after=page.next_after,
    )


def cancel_response(result: CancelResult) -> CancelResponse:
    """The answer of ``POST .../cancel``."""
    return CancelResponse(
        conversation_id=result.conversation_id,
        turn=result.turn,
        status=result.status,
        cancelled_call_ids=result.cancelled_call_ids,
        cancel_requested=result.cancel_requested,
    )


def callback_response(result: CallbackResult) -> CallbackResponse:
    """The answer of ``POST /v1/callbacks/{token}``."""
    return CallbackResponse(
        conversation_id=result.conversation_id,
        call_id=result.call_id,
        settled=result.settled,
        status=result.status,
        awaiting=result.awaiting,
        continued=result.continued,
    )


def purge_report(report: SweepReport) -> PurgeReportView:
    """The answer of tenant-wide erasure (the sweep's report)."""
    return PurgeReportView(
        conversations_removed=report.conversations_removed,
        events_removed=report.events_removed,
        objects_removed=report.objects_removed,
        provider_state_deleted=report.provider_state_deleted,
        read_units=report.read_units,
        complete=report.complete,
        waits_expired=report.waits_expired,
        fork_lives_reclaimed=report.fork_lives_reclaimed,
    )


def inbox_page(listing: InboxListing) -> InboxPageView:
    """The answer of ``GET /v1/approvals``."""
    return InboxPageView(
        items=[
            InboxItemView(
                kind=e.kind,
                conversation_id=e.conversation_id,
                id=e.call_id,
                tool=e.tool,
                arguments=e.arguments,
                requested_by=e.requested_by,
                requested_at=e.requested_at,
                expires_at=e.expires_at,
                reason=e.reason,
                message=e.message,
                requested_schema=e.requested_schema,
            )
            for e in listing.entries
        ],
        next_cursor=listing.next_cursor,
    )


def turn_summary(entry: TurnEntry) -> TurnSummaryView:
    """One turn of ``GET .../turns``."""
    logged = entry.logged
    if logged is None:
        assert entry.draft_started_at is not None
        return TurnSummaryView(
            turn=entry.turn,
            status=logged_status(None, in_progress=True, lease_lost=False),
            input=[],
            usage=Usage(),
            started_at=entry.draft_started_at,
        )
    answer, failure = logged.answer, logged.failure
    status = (
        logged_status(None, in_progress=True, lease_lost=False)
        if entry.in_progress
        else logged.status
    )
    return TurnSummaryView(
        turn=entry.turn,
        status=status,
        reason=logged.reason,
        input=logged.input,
        output_text=logged.output_text,
        awaiting=logged.awaiting,
        pending_tool_calls=[pending_view(p) for p in answer.waiting] if answer else [],
        run_ids=logged.run_ids,
        usage=logged.usage,
        cost_usd=logged.cost_usd,
        started_at=entry.draft_started_at or logged.started_at,
        ended_at=None if entry.in_progress else logged.ended_at,
        error=TurnError(code=failure.code, status=failure.status, message=failure.message)
        if failure is not None
        else None,
    )


def turns_page(conversation_id: str, listing: TurnsListing) -> TurnsPage:
    """The answer of ``GET .../turns``."""
    return TurnsPage(
        conversation_id=conversation_id,
        turns=[turn_summary(e) for e in listing.entries],
        next_after=listing.next_after,
    )
