"""Request and response bodies of the HTTP API (the shapes of ``API.md``).

These are the edge models: the event handler validates requests with them
and the OpenAPI document is generated from them.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    TypeAdapter,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ..core.models import (
    CONVERSATION_ID_PATTERN,
    MAX_CALL_ID_CHARS,
    Deferred,
    ImportMark,
    JsonObjectFormat,
    JsonSchemaFormat,
    Usage,
)

#: A call id a request names: 1 to :data:`MAX_CALL_ID_CHARS` characters.
CallId = Annotated[str, Field(min_length=1, max_length=MAX_CALL_ID_CHARS)]


class _Body(Deferred):
    model_config = ConfigDict(extra="forbid")


class InputMessage(_Body):
    """A user message given as an input item."""

    type: Literal["message"]
    role: Literal["user"]
    content: str


class FunctionCallOutput(_Body):
    """The result of a client-side tool call."""

    type: Literal["function_call_output"]
    call_id: CallId
    output: str


InputItem = Annotated[InputMessage | FunctionCallOutput, Field(discriminator="type")]


#: Validates ``input`` when it is a list (see :meth:`TurnRequest._input`).
_INPUT_ITEMS: TypeAdapter[list[InputMessage | FunctionCallOutput]] = TypeAdapter(
    list[InputItem], config=ConfigDict(defer_build=True)
)
#: Text with something in it: what ``input`` must match when it is a string.
_SOME_TEXT = r"\S"


class TurnRequest(_Body):
    """Body of ``POST /v1/conversations/{id}/turns``."""

    # The limits on the types, not only in the validator: the OpenAPI document must say them.
    input: (
        Annotated[str, Field(min_length=1, pattern=_SOME_TEXT)]
        | Annotated[list[InputItem], Field(min_length=1)]
    ) = Field(
        description="One user message (some text: not empty, not only white space), or a list "
        "of at least one input item (messages and function_call_output results of client-side "
        "tools)."
    )
    model: str | None = Field(default=None, description="The deployment's default otherwise.")
    provider: str | None = Field(
        default=None,
        description="One of the providers the deployment allows (PROVIDERS); its default "
        "otherwise. The conversation's log is mapped to the provider's own shapes.",
    )
    response_format: JsonObjectFormat | JsonSchemaFormat | None = Field(
        default=None,
        discriminator="type",
        description='JSON mode: {"type": "json_object"}, or {"type": "json_schema", '
        '"json_schema": {"name", "schema"}}; the answer is returned in output_json.',
    )
    tools: list[str] | None = Field(
        default=None, description="Subset of registered tool names; default: all."
    )
    require_approval: list[str] = Field(
        default_factory=list,
        description="Extra tool names that need approval for this call; never waives one.",
    )
    metadata: dict[str, str] = Field(default_factory=dict, description="Stored on the turn.")
    memory: bool | None = Field(
        default=None,
        description="false: the conversation neither recalls nor writes back the user's "
        "long-term memory from this turn on; true: it does again (where the deployment has "
        "memory on). Absent: as the conversation did.",
    )
    data_class: str | None = Field(
        default=None,
        description="A class of the data policy this turn's content is: raises the "
        "conversation's class, never lowers it.",
    )

    @field_validator("input", mode="wrap")
    @classmethod
    def _input(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        # In place of the union's own validation, whose errors name pydantic's types
        # ("list[tagged-union[...]]") instead of saying what input may be.
        if isinstance(value, str):
            if not re.search(_SOME_TEXT, value):
                raise PydanticCustomError("empty_input", "input must hold some text")
            return value
        if isinstance(value, list):
            if not value:
                raise PydanticCustomError("empty_input", "input must hold at least one item")
            return _INPUT_ITEMS.validate_python(value)
        raise PydanticCustomError("input_type", "input must be a string or a list of input items")


class Rejection(_Body):
    """A rejected call with an optional reason."""

    id: CallId
    reason: str | None = None


class CallOutput(_Body):
    """The output a person (or the application) supplies for a waiting call."""

    id: CallId
    output: str


class ApprovalEdit(_Body):
    """An approval that runs edited arguments instead of the requested ones."""

    id: CallId
    arguments: dict[str, Any] = Field(
        description="Validated against the tool's parameters; these run, not the requested ones."
    )


class ApprovalRequest(_Body):
    """Body of ``POST /v1/conversations/{id}/approvals``."""

    # The OpenAPI document states what the validator below checks: at least one decision.
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "anyOf": [
                {"required": ["approve"], "properties": {"approve": {"minItems": 1}}},
                {"required": ["reject"], "properties": {"reject": {"minItems": 1}}},
                {"required": ["outputs"], "properties": {"outputs": {"minItems": 1}}},
            ]
        },
    )

    approve: list[CallId | ApprovalEdit] = Field(
        default_factory=list, json_schema_extra={"uniqueItems": True}
    )
    reject: list[CallId | Rejection] = Field(default_factory=list)
    outputs: list[CallOutput] = Field(
        default_factory=list,
        description="Outputs of human-input calls (or of deferred calls the application "
        "settles itself).",
    )

    @model_validator(mode="after")
    def _decides_something(self) -> ApprovalRequest:
        if not self.approve and not self.reject and not self.outputs:
            raise ValueError("approve, reject or give the output of at least one call")
        ids = [
            *(a if isinstance(a, str) else a.id for a in self.approve),
            *(r if isinstance(r, str) else r.id for r in self.reject),
            *(o.id for o in self.outputs),
        ]
        if len(ids) != len(set(ids)):
            raise ValueError("a call id may appear only once across approve, reject and outputs")
        return self

    def approvals(self) -> dict[str, dict[str, Any] | None]:
        """Approved call ids with their edited arguments (``None``: as requested)."""
        return {
            a if isinstance(a, str) else a.id: None if isinstance(a, str) else a.arguments
            for a in self.approve
        }

    def rejections(self) -> dict[str, str | None]:
        """Rejected call ids with their reasons."""
        return {
            r if isinstance(r, str) else r.id: None if isinstance(r, str) else r.reason
            for r in self.reject
        }


class PendingToolCallView(Deferred):
    """A tool call waiting for approval or for the client."""

    id: str
    name: str
    arguments: dict[str, Any]
    requires: Literal["approval", "client", "input", "async"]
    expires_at: datetime | None = None
    #: Why a call waits for a decision when it is not a plain approval
    #: (``outcome_unknown``: its tool may have run when its request died).
    reason: str | None = None
    #: A call whose tool asked a person mid-call (an MCP server's elicitation): what it
    #: asked, and the JSON Schema the answer's ``content`` must pass.
    message: str | None = None
    requested_schema: dict[str, Any] | None = None
    #: A deferred call's job id, as its tool named it.
    task_id: str | None = None


class OutputMessage(Deferred):
    """An assistant message of this request."""

    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    content: str


class OutputFunctionCall(Deferred):
    """A tool call the model made during this request."""

    type: Literal["function_call"] = "function_call"
    call_id: str
    name: str
    arguments: dict[str, Any]


class ContextInfo(Deferred):
    """How the working context of the turn's last model call was built and sent."""

    messages_sent: int
    provider_state: Literal["fresh", "continued", "fallback"] = "fresh"
    #: Tokens of what was sent, by the deployment's estimate.
    tokens_estimated: int = 0
    #: The context budget in force (tokens).
    budget_tokens: int = 0
    #: The last event sequence a summary in the context covers, or ``None``.
    summary_through: int | None = None


#: The statuses a turn's answer shows.
AnsweredStatus = Literal[
    "complete",
    "awaiting_approval",
    "awaiting_client_tools",
    "awaiting_hitl",
    "awaiting_async_tools",
    "interrupted",
]


class TurnResponse(Deferred):
    """Answer of a turn, and of an approval that decided the last pending call."""

    conversation_id: str
    turn: int
    status: AnsweredStatus
    #: Extension: why a turn stopped early (``max_tool_steps``), else ``None``.
    status_reason: str | None = None
    output_text: str | None
    #: JSON mode: the answer as a JSON value (``output_text`` holds its text).
    output_json: Any = None
    output: list[OutputMessage | OutputFunctionCall]
    pending_tool_calls: list[PendingToolCallView]
    usage: Usage
    context: ContextInfo
    #: Everything still awaited (``approval``, ``input``, ``client``, ``async``), the
    #: first being what ``status`` shows.
    awaiting: list[Literal["approval", "input", "client", "async"]] = Field(default_factory=list)


class ConversationView(Deferred):
    """Answer of ``GET /v1/conversations/{id}``: the head.

    A call whose approval window closed is shown in ``expired_tool_calls`` at once,
    not among ``pending_tool_calls``: the next request on the conversation (or the
    sweep) records the expiry (``approval_expired``) and the rejection the model sees.
    """

    conversation_id: str
    status: Literal[
        "complete",
        "awaiting_approval",
        "awaiting_client_tools",
        "running_tools",
        "interrupted",
        "awaiting_hitl",
        "awaiting_async_tools",
    ]
    turns: int
    events: int
    created_at: datetime
    updated_at: datetime
    expires_at: datetime | None
    ttl_seconds: int
    pending_tool_calls: list[PendingToolCallView]
    usage: Usage
    #: Estimated cost in US dollars of every model call so far (the deployment's prices).
    cost_usd: float = 0.0
    #: Turns whose model call failed (``turn_failed`` events).
    failed_turns: int = 0
    #: The last event sequence the newest context summary covers, or ``None``.
    summary_through: int | None = None
    #: Everything the current turn still awaits (see ``TurnResponse.awaiting``).
    awaiting: list[Literal["approval", "input", "client", "async"]] = Field(default_factory=list)
    #: Calls whose approval window closed with no decision (see the class docstring).
    expired_tool_calls: list[PendingToolCallView] = Field(default_factory=list)
    #: Set on a fork: the conversation it was forked from, the turn and last sequence
    #: it inherits (``null``: not a fork).
    parent: ForkParentView | None = None
    #: Live forks of this conversation (``GET .../forks`` lists them).
    forks: int = 0
    #: The conversation's data class (it only rises); left out while it has none, so a
    #: conversation without one reads as before.
    data_class: str | None = Field(default=None, exclude_if=lambda value: value is None)


class ForkParentView(Deferred):
    """Where a fork was made."""

    conversation_id: str
    turn: int
    seq: int


class ForkRequest(_Body):
    """Body of ``POST /v1/conversations/{id}/fork``."""

    to: str = Field(pattern=CONVERSATION_ID_PATTERN, description="The new conversation's id.")
    after_turn: int | None = Field(
        default=None, ge=0, description="Fork after this turn (default: the latest turn)."
    )


class ForkView(Deferred):
    """One live fork, as ``GET .../forks`` lists it."""

    conversation_id: str
    #: The turn it was forked after, and that turn's last sequence.
    turn: int
    seq: int
    created_at: datetime


class ForksPage(Deferred):
    """Answer of ``GET /v1/conversations/{id}/forks``: live forks by id."""

    conversation_id: str
    forks: list[ForkView]
    #: Pass as ``after`` to get the next page; ``None`` when this page reached the end.
    next_after: str | None


class EventView(Deferred):
    """One canonical event."""

    event_id: str
    conversation_id: str
    sequence: int
    turn: int
    kind: str
    actor: str
    occurred_at: datetime
    payload: dict[str, Any]
    schema_version: int
    #: Set on an event that came from an import: the actor is then ``import``, and what
    #: the payload says (an approver, a tool's output) is the source's claim.
    imported: ImportMark | None = None


class ExportLink(Deferred):
    """Answer of ``GET .../export`` (``303``, with ``Location``) when the export is larger
    than a response carries: where to fetch it, until when, and its size."""

    export_url: str
    expires_at: datetime
    bytes: int


class EventsPage(Deferred):
    """Answer of ``GET /v1/conversations/{id}/events``."""

    conversation_id: str
    events: list[EventView]
    #: Pass as ``after`` to get the next page; ``None`` when this page reached the end.
    next_after: int | None


class TurnError(Deferred):
    """Why a turn's last request failed: the error it answered (its code and status)."""

    code: str
    status: int
    message: str


class TurnSummaryView(Deferred):
    """One turn of ``GET /v1/conversations/{id}/turns``, rebuilt from the log."""

    turn: int
    #: ``in_progress`` (a run is going on), ``failed`` (its last request failed: see
    #: ``error``), ``interrupted`` (a run died holding its lease), or the status its last
    #: request answered (``complete``, ``awaiting_approval``, ...).
    status: AnsweredStatus | Literal["in_progress", "failed"]
    #: Why it stopped early (``cancelled``, ``max_tool_steps``, ``turn_budget``) or the
    #: failure's code; else ``None``.
    reason: str | None = None
    #: The user messages of the turn, in order.
    input: list[str]
    #: The model's newest text in the turn, or ``None``.
    output_text: str | None = None
    #: What the turn still waits for, and the calls that wait (its latest turn only).
    awaiting: list[Literal["approval", "input", "client", "async"]] = Field(default_factory=list)
    pending_tool_calls: list[PendingToolCallView] = Field(default_factory=list)
    #: ``event_id`` of each model answer (``assistant_message`` event, with its run record).
    run_ids: list[str] = Field(default_factory=list)
    #: Usage and estimated cost of every model call of the turn.
    usage: Usage
    cost_usd: float = 0.0
    #: When its first and last events were recorded (a run with no event yet: when it began).
    started_at: datetime
    ended_at: datetime | None = None
    error: TurnError | None = None


class TurnsPage(Deferred):
    """Answer of ``GET /v1/conversations/{id}/turns``."""

    conversation_id: str
    turns: list[TurnSummaryView]
    #: Pass as ``after`` to get the next page; ``None`` when this page reached the latest turn.
    next_after: int | None


class ErrorDetail(Deferred):
    """What went wrong: a stable ``code`` (see the README's error table), a message,
    and the details a caller needs next."""

    code: str
    message: str
    details: dict[str, Any] = Field(default_factory=dict)


class ErrorBody(Deferred):
    """Every error answer: ``{"error": {"code", "message", "details"}}``."""

    error: ErrorDetail


class PurgeReportView(Deferred):
    """Answer of the sweep and of tenant-wide erasure."""

    conversations_removed: int
    events_removed: int
    objects_removed: int
    #: Stored responses deleted at the model provider (best effort; provider cursors).
    provider_state_deleted: int = 0
    read_units: float
    #: ``False`` when the work stopped at its time budget; run it again to continue.
    complete: bool
    #: Calls whose wait (a decision's window, a deferred call's deadline) closed,
    #: recorded by the sweep's expiry pass.
    waits_expired: int = 0
    #: Deleted (or expired) conversations kept while forks read their history, and
    #: removed in this run because no fork reads them any more (their events and objects
    #: are counted above).
    fork_lives_reclaimed: int = 0


class CallbackRequest(_Body):
    """Body of ``POST /v1/callbacks/{token}``: a deferred call's outcome."""

    status: Literal["succeeded", "failed", "cancelled"]
    output: Any = Field(
        default=None,
        description="The result (a string, or any JSON value, kept as compact JSON); for "
        "failed, the error text the model reads.",
    )
    continue_: bool = Field(
        default=False,
        alias="continue",
        description="true: continue the turn in this request when nothing else is pending "
        "(the model is called and its answer stored); false: the result reaches the model "
        "with the next turn.",
    )

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class CallbackResponse(Deferred):
    """Answer of a callback: what was settled and where the conversation stands."""

    conversation_id: str
    call_id: str
    settled: Literal["succeeded", "failed", "cancelled"]
    status: str
    awaiting: list[Literal["approval", "input", "client", "async"]] = Field(default_factory=list)
    #: True when the turn was continued in this request (the model answered).
    continued: bool = False


class CompactRequest(_Body):
    """Body of ``POST /v1/conversations/{id}/compact`` (may be ``{}``)."""

    provider: str | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description="The summarizer's provider (default: the deployment's summarizer).",
    )
    model: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="The summarizer's model (default: SUMMARIZER_MODEL, else the turn model).",
    )


class CancelRequestBody(_Body):
    """Body of ``POST /v1/conversations/{id}/cancel`` (may be ``{}``)."""

    reason: str | None = Field(default=None, max_length=500)


class CancelResponse(Deferred):
    """Answer of a cancel."""

    conversation_id: str
    turn: int
    #: The status after the cancel: ``complete`` once a waiting turn is cancelled;
    #: ``running_tools`` when the running request was asked to stop at its next step;
    #: ``in_progress`` when a long turn's answer being written was (``turn`` is that turn).
    status: str
    #: Calls recorded as cancelled by this request.
    cancelled_call_ids: list[str] = Field(default_factory=list)
    #: True when a running request was asked to stop (it records the cancel itself).
    cancel_requested: bool = False


class InboxItemView(Deferred):
    """One call waiting for a person."""

    kind: Literal["approval", "input"] = Field(
        description="approval: approve or reject it; input: supply its output"
    )
    conversation_id: str
    id: str = Field(description="The call id, as POST .../approvals names it.")
    tool: str
    arguments: dict[str, Any]
    requested_by: str | None = Field(
        description="The actor of the turn whose model asked for the call (null: not recorded)."
    )
    requested_at: datetime
    expires_at: datetime | None = Field(description="After this the call counts as rejected.")
    reason: str | None = Field(
        default=None,
        description="Why it waits when it is not a plain request (its tool may have run).",
    )
    message: str | None = Field(
        default=None,
        description="A call whose tool asked a person mid-call (an MCP elicitation): its "
        "question; null for any other call.",
    )
    requested_schema: dict[str, Any] | None = Field(
        default=None,
        description="The JSON Schema the answer's content must pass (with message).",
    )


class InboxPageView(Deferred):
    """A page of the tenant's approval inbox."""

    items: list[InboxItemView]
    next_cursor: str | None = Field(
        description="Pass as cursor= for the next page; null when there is none."
    )


# --- long-term memory (/v1/memories) ----------------------------------------------------------

_MEMORY_KEY = r"^[a-z0-9][a-z0-9_.-]{0,63}$"


class MemoryView(Deferred):
    """One memory record of the caller's user."""

    id: str
    text: str
    key: str | None = None
    source: Literal["extracted", "manual"]
    conversation_id: str | None = None
    from_sequence: int | None = None
    to_sequence: int | None = None
    created_at: datetime
    updated_at: datetime


class MemoryPageView(Deferred):
    """A page of the caller's user's memory records, oldest first."""

    items: list[MemoryView]
    next_cursor: str | None = Field(
        description="Pass as after= for the next page; null when there is none."
    )


class MemoryCreate(_Body):
    """Body of ``POST /v1/memories``."""

    text: str = Field(min_length=1, max_length=1000, pattern=_SOME_TEXT)
    key: str | None = Field(
        default=None,
        pattern=_MEMORY_KEY,
        description="A record with this key is superseded (edited in place) instead.",
    )


class MemoryPatch(_Body):
    """Body of ``PATCH /v1/memories/{id}``: the fields to change."""

    text: str | None = Field(default=None, min_length=1, max_length=1000, pattern=_SOME_TEXT)
    key: str | None = Field(default=None, pattern=_MEMORY_KEY)


class MemoriesDeleted(Deferred):
    """Answer of ``DELETE /v1/memories``."""

    deleted: int
