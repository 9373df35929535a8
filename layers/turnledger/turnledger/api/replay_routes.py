"""What a model call saw, and replays against another model: ``GET .../turns/{n}/context``,
``POST .../replays`` and ``GET .../replays/{replay_id}``.

The rebuild is :mod:`turnledger.turn.contexts`, the replay :mod:`turnledger.turn.replays`;
this module parses, calls them with the request's key and answers their views. Registered
on the API's resolver when :mod:`.app` loads (as every route module is).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Body, Path, Query
from pydantic import ConfigDict, Field

from ..context.assembly import SUMMARY_PREFIX
from ..core.exceptions import ServiceUnavailable
from ..core.models import Deferred
from ..core.observability import logger
from ..providers.base import Message, ToolSpec
from ..runtime import get_runtime
from ..turn import replays
from ..turn.contexts import CallContext, tool_specs, turn_calls
from ..turn.judging import Expect
from ..turn.replay_records import ReplayRecord, ReplaySpec
from ..turn.turn_reads import MAX_WAIT_SECONDS
from .idempotency import idempotent
from .pin_views import PinView, UserPinView, pin_view, user_pin_view
from .resolver import ConversationId, app, conversation, idempotency_key, json_response, responses

if TYPE_CHECKING:
    from ..turn.pipeline import Conversations

TurnNumber = Annotated[int, Path(ge=1, description="The turn's number (1, 2, ...)")]
ReplayId = Annotated[
    str, Path(pattern=replays.REPLAY_ID_PATTERN, description="A replay's id (rp_...).")
]


class CallContextView(Deferred):
    """What one model call of the turn was sent, rebuilt from the log, and its hashes."""

    call: int = Field(description="The call's place in its turn (1, 2, ...)")
    sequence: int = Field(description="The sequence of the call's assistant_message event")
    model: str
    provider: str
    provider_state: Literal["fresh", "continued", "fallback"]
    system_prompt: str | None = Field(description="The system prompt sent, or null")
    summary: str | None = Field(description="The summary message sent, or null")
    summary_through: int | None
    pins: list[PinView] = Field(
        default_factory=list,
        description="The pins in force at the call, oldest first (its context carried each)",
    )
    user_pins: list[UserPinView] = Field(
        default_factory=list,
        description="The pins of the conversation's user the call carried, before the "
        "conversation's, oldest first (POST /v1/memories/pins)",
    )
    tools: list[ToolSpec] = Field(
        description="The tools the deployment's registry offers now (not in the log, "
        "not in the hash)"
    )
    messages: list[Message] = Field(description="Every message sent, in order (hashed)")
    recorded_sha256: str = Field(description="The run record's context_sha256")
    sha256: str = Field(description="The hash of the rebuilt messages")
    matches: bool
    mismatch_causes: list[str] = Field(
        description="When the hashes differ: what the log does not hold and may explain it"
    )


class TurnContextView(Deferred):
    """``GET .../turns/{n}/context``: every model call of the turn."""

    conversation_id: str
    turn: int
    calls: list[CallContextView]
    all_match: bool


class ReplayRequest(Deferred):
    """``POST .../replays``."""

    model_config = ConfigDict(extra="forbid")

    provider: str = Field(min_length=1, description="The candidate's provider")
    model: str = Field(min_length=1, description="The candidate's model")
    mode: Literal["pointwise", "rollout"] = "pointwise"
    from_turn: int | None = Field(default=None, ge=1, description="Default: 1")
    to_turn: int | None = Field(default=None, ge=1, description="Default: the latest turn")
    system_prompt: str | None = Field(
        default=None, description="Sent instead of the deployment's system prompt"
    )
    expect: Expect | None = Field(
        default=None,
        description="What each replayed turn must show: tool-call trajectory and constraints",
    )


def _view(context: CallContext, tools: list[ToolSpec], system_prompt: str) -> CallContextView:
    messages = context.messages
    summary = next(
        (
            m.content
            for m in messages
            if m.role == "system" and (m.content or "").startswith(SUMMARY_PREFIX)
        ),
        None,
    )
    sent_prompt = (
        messages[0].content if system_prompt and messages and messages[0].role == "system" else None
    )
    return CallContextView(
        call=context.index,
        sequence=context.sequence,
        model=context.run.model,
        provider=context.run.provider,
        provider_state=context.run.provider_state,
        system_prompt=sent_prompt,
        summary=summary,
        summary_through=context.run.summary_through,
        pins=[pin_view(pin) for pin in context.pins],
        user_pins=[user_pin_view(pin) for pin in context.user_pins],
        tools=tools,
        messages=messages,
        recorded_sha256=context.run.context_sha256,
        sha256=context.sha256,
        matches=context.matches,
        mismatch_causes=context.causes,
    )


def turn_context_view(
    service: Conversations, conversation_id: str, turn: int, calls: list[CallContext]
) -> TurnContextView:
    """The view of a turn's rebuilt calls."""
    tools = tool_specs(service)
    views = [_view(c, tools, service.settings.system_prompt) for c in calls]
    return TurnContextView(
        conversation_id=conversation_id,
        turn=turn,
        calls=views,
        all_match=all(v.matches for v in views),
    )


@app.get(
    "/v1/conversations/<conversation_id>/turns/<turn>/context",
    responses=responses(TurnContextView, 400, 401, 404, 409, 422, 503),
)
def get_turn_context(conversation_id: ConversationId, turn: TurnNumber) -> TurnContextView:
    """What each model call of turn ``turn`` was sent (after redaction, as sent), rebuilt
    from the log, with the recomputed hash beside the run record's."""
    _, key = conversation(conversation_id)
    service = get_runtime().conversations_for(key.tenant)
    return turn_context_view(service, conversation_id, turn, turn_calls(service, key, turn))


def replay_url(conversation_id: str, replay_id: str) -> str:
    """Where a replay is read (the ``Location`` of its ``202``)."""
    return f"/v1/conversations/{conversation_id}/replays/{replay_id}"


@app.post(
    "/v1/conversations/<conversation_id>/replays",
    responses=responses(ReplayRecord, 400, 401, 404, 409, 422, 503, status=202),
)
def post_replay(
    conversation_id: ConversationId, request: Annotated[ReplayRequest, Body()]
) -> Response[str]:
    """Replay the conversation's recorded model calls against another provider and model,
    with no side effects; ``202`` with the replay's ``id`` and ``Location``. It runs in
    the turn worker (in this request when the deployment has none)."""
    _, key = conversation(conversation_id)
    runtime = get_runtime()
    service = runtime.conversations_for(key.tenant)

    def begin() -> ReplayRecord:
        record = replays.start(service, key, ReplaySpec(**request.model_dump()))
        function = runtime.settings.turn_worker_function
        if not function:
            return replays.run(service, key, record.id).model_copy(update={"calls": []})
        from ..turn.longturns import invoke_worker  # run code: loaded when a replay starts

        try:
            invoke_worker(
                function,
                replays.worker_event(key, record.id),
                runtime.settings.turn_worker_endpoint,
            )
        except Exception as exc:
            logger.exception("could not start the turn worker for a replay")
            replays.abandon(service, key, record, "worker_unavailable")
            raise ServiceUnavailable(
                "the turn worker could not be started; the replay did not run",
                details={"retry_after_seconds": 1},
            ) from exc
        return record

    # A retry with the same Idempotency-Key answers the first 202 and starts nothing.
    record = idempotent(
        key=idempotency_key(),
        conversation=key,
        route="replays",
        body=request.model_dump(mode="json"),
        run=begin,
        parse=ReplayRecord.model_validate,
    )
    body = record.model_dump(mode="json", exclude={"calls"})
    response = json_response(202, body)
    response.headers["Location"] = replay_url(conversation_id, record.id)
    return response


@app.get(
    "/v1/conversations/<conversation_id>/replays/<replay_id>",
    responses=responses(ReplayRecord, 400, 401, 404, 409, 422, 503),
)
def get_replay(
    conversation_id: ConversationId,
    replay_id: ReplayId,
    wait: Annotated[
        float,
        Query(ge=0, le=MAX_WAIT_SECONDS, description="Seconds to wait for a running replay's end."),
    ] = 0,
) -> ReplayRecord:
    """The replay record: status, each call's recorded and candidate answers, a summary
    (``wait`` long-polls while it runs)."""
    _, key = conversation(conversation_id)
    service = get_runtime().reads_for(key.tenant)
    return replays.read_waiting(service, key, replay_id, wait=wait)
