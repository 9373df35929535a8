"""The stored state of a conversation: its head and its canonical events.

Three kinds of state live here:

* the **transcript**: :class:`Event`, an append-only log in sequence order;
* the **execution state**: :class:`Head` with its :class:`PendingCall` list
  (tool calls waiting for approval, for the client, or for their result);
* the **working context** is not stored: :mod:`turnledger.context.assembly` rebuilds it
  from the events on every turn.

Every model here validates strictly, so a stored item that does not fit is
reported as corrupted instead of being guessed at.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Mapping
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
    model_validator,
)

from .exceptions import InvalidConversationId

#: The schema version this build writes and the versions it can read. Version 2 added
#: context summaries, failed turns, run records and budgets; every version-1 item is a
#: valid version-2 item with those fields at their defaults, so both are read.
SCHEMA_VERSION = 2
SUPPORTED_SCHEMA_VERSIONS = [1, 2]

#: The expiry index files heads by the hour their TTL falls in (see store/keys.py).
EXPIRY_BUCKET_SECONDS = 3600

#: The conversation id rule, the one copy: 1-128 of ``A-Z a-z 0-9 . _ : -``, starting with
#: a letter or digit. The HTTP edge checks path ids with it (and documents it); other entry
#: points call :func:`validate_conversation_id`.
CONVERSATION_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
_CONVERSATION_ID = re.compile(CONVERSATION_ID_PATTERN)


def validate_conversation_id(value: str) -> str:
    """Return ``value`` if it is a valid conversation id.

    Raises:
        InvalidConversationId: it is not 1-128 characters of ``A-Z a-z 0-9 . _ : -``
            starting with a letter or digit.
    """
    if not _CONVERSATION_ID.fullmatch(value):
        raise InvalidConversationId(
            "conversation_id must be 1-128 characters of A-Z a-z 0-9 . _ : - "
            "and start with a letter or digit",
            details={"conversation_id": value[:200]},
        )
    return value


class Deferred(BaseModel):
    """A model whose validator and serializer pydantic builds on its first use, not when
    its class is defined (``defer_build``).

    For the models only some requests use (most request and response bodies of the
    HTTP API): a function's init then builds none of those its requests never see,
    about 1 ms a model; the first request of a route builds its own, as Powertools
    builds the route's parameter models then (under SnapStart both are built at init:
    :func:`turnledger.api.app.prepare_routes`). A model that a deferred one's fields
    name must be deferred too: building a model builds what its fields name.
    """

    model_config = ConfigDict(defer_build=True)

    @classmethod
    def model_rebuild(
        cls,
        *,
        force: bool = False,
        raise_errors: bool = True,
        _parent_namespace_depth: int = 2,
        _types_namespace: Any = None,
    ) -> bool | None:
        """Build the model, one thread at a time.

        Pydantic's ``model_rebuild`` is not thread-safe before 2.14 (pydantic#11849; 2.14
        takes a lock of its own, and the layer accepts 2.12 and later): the first uses of
        a deferred model from several threads at once (the tool runner's, a replay's
        workers) could validate with its parent's validator, whose ``extra="forbid"``
        refused every field (seen once in a replay over every conversation of a
        tenant). The mock validator of a deferred model rebuilds through this method, so
        every first use and :func:`build_deferred` pass the lock.
        """
        with _BUILDING:
            return super().model_rebuild(
                force=force,
                raise_errors=raise_errors,
                # One frame more than pydantic counts: this one.
                _parent_namespace_depth=_parent_namespace_depth + 1
                if _parent_namespace_depth > 0
                else 0,
                _types_namespace=_types_namespace,
            )


#: Held while a :class:`Deferred` model is built (reentrant: building a model builds the
#: deferred models its fields name).
_BUILDING = threading.RLock()


def build_deferred() -> int:
    """Build every :class:`Deferred` model defined so far (those of the modules imported);
    returns how many were not built yet. Where init runs ahead of requests (SnapStart)."""
    pending: list[type[Deferred]] = [Deferred]
    built = 0
    while pending:
        model = pending.pop()
        pending.extend(model.__subclasses__())
        if model is not Deferred and not model.__pydantic_complete__:
            model.model_rebuild()
            built += 1
    return built


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Payload(_Strict, Deferred):
    """An event's payload: validated by its kind's model (:data:`PAYLOAD_MODELS`), built
    on the first event of that kind a process reads or writes."""


class ConversationKey(_Strict):
    """Where a conversation lives: a tenant from verified identity and the caller's id.

    Built once per request by the entry point that checked the id (the HTTP edge, the
    sweep's event, a callback's verified token); the service takes it as given.
    """

    tenant: str = Field(min_length=1)
    conversation_id: str


class ConversationStatus(StrEnum):
    """Lifecycle of a conversation's head."""

    COMPLETE = "complete"
    AWAITING_APPROVAL = "awaiting_approval"
    AWAITING_CLIENT_TOOLS = "awaiting_client_tools"
    #: Tool calls were recorded and are being executed; a crash here is resumed from the log.
    RUNNING_TOOLS = "running_tools"
    #: A tombstone: the conversation is being cleared or swept; reads see nothing.
    CLEARED = "cleared"
    #: A human-input tool call waits for a person to supply its output.
    AWAITING_HITL = "awaiting_hitl"
    #: A deferred tool call runs elsewhere and is settled by its callback.
    AWAITING_ASYNC_TOOLS = "awaiting_async_tools"
    #: Public only: a ``running_tools`` head whose lease expired (its request died).
    INTERRUPTED = "interrupted"


class EventKind(StrEnum):
    """Kinds of canonical events."""

    USER_MESSAGE = "user_message"
    ASSISTANT_MESSAGE = "assistant_message"
    TOOL_CALL_REQUESTED = "tool_call_requested"
    APPROVAL_REQUESTED = "approval_requested"
    APPROVAL_RESOLVED = "approval_resolved"
    TOOL_RESULT = "tool_result"
    CONTEXT_COMPACTED = "context_compacted"
    TURN_FAILED = "turn_failed"
    TOOL_CALL_DEFERRED = "tool_call_deferred"
    TOOL_INPUT_PROVIDED = "tool_input_provided"
    TOOL_INPUT_REQUESTED = "tool_input_requested"
    TOOL_CALL_SETTLED = "tool_call_settled"
    TURN_INTERRUPTED = "turn_interrupted"
    APPROVAL_EXPIRED = "approval_expired"
    CONVERSATION_IMPORTED = "conversation_imported"
    POLICY_DECISION = "policy_decision"
    DATA_CLASS_RAISED = "data_class_raised"
    PIN_ADDED = "pin_added"
    PIN_REMOVED = "pin_removed"


def _zero(value: int) -> bool:
    return value == 0


class Usage(_Strict):
    """Token usage reported by a provider.

    ``input_tokens`` counts every input token, cached or not (OpenAI's convention;
    Bedrock's separate cache counts are added in): ``cached_input_tokens`` (read from the
    provider's prompt cache) and ``cache_write_input_tokens`` (written to it) are parts
    of it, priced at their own rates (:meth:`turnledger.core.config.ModelSpec.cost`).
    Zero cache counts are left out of stored items and answers: usage without caching
    reads and costs exactly as before.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    #: Left out of every dump (stored items and answers alike) while zero.
    cached_input_tokens: int = Field(default=0, exclude_if=_zero)
    cache_write_input_tokens: int = Field(default=0, exclude_if=_zero)

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cached_input_tokens=self.cached_input_tokens + other.cached_input_tokens,
            cache_write_input_tokens=self.cache_write_input_tokens + other.cache_write_input_tokens,
        )


class ToolCall(_Strict):
    """A model's request to call one tool."""

    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: dict[str, Any]
    #: The provider's argument text when it was not a JSON object; the call is then
    #: answered with a validation error instead of running.
    raw_arguments: str | None = None


# --- event payloads, one model per kind -------------------------------------------------


class UserMessage(_Payload):
    """The caller's input message."""

    content: str
    metadata: dict[str, str] = Field(default_factory=dict)


class RunRecord(_Strict):
    """How one model call was made: enough to explain its answer later from the log.

    ``context_from`` is the first public sequence the call's context held whole
    (after the summary, if any), and ``context_sha256`` the hash of the messages
    sent, so :func:`turnledger.context.assembly.rebuild` can prove a rebuild from the log
    gives the same context.
    """

    model: str
    provider: str
    provider_state: Literal["fresh", "continued", "fallback"] = "fresh"
    latency_ms: int = Field(ge=0)
    usage: Usage = Field(default_factory=Usage)
    tokens_estimated: int = Field(ge=0)
    budget_tokens: int = Field(ge=0)
    messages_sent: int = Field(ge=0)
    redaction_version: str | None = None
    summary_through: int | None = None
    context_from: int = Field(ge=1)
    context_sha256: str
    #: Estimated tokens are multiplied by this (the conversation's calibration).
    token_scale: float = 1.0
    #: The provider's id of the response, when it keeps it (the provider cursor).
    response_id: str | None = None
    #: With ``response_id``: what the response was made with (system prompt, tools,
    #: redaction; :attr:`ProviderCursor.context_sha256`), so a fork at this answer can
    #: continue from it.
    made_with: str | None = None
    cost_usd: float = 0.0
    #: The user's memory records the context carried (``turnledger.context.memory``).
    memory_ids: list[str] = Field(default_factory=list)
    #: Whose records ``memory_ids`` are (set with them), so a rebuild reads them back.
    memory_user: str | None = None
    #: The pins of ``memory_user`` the context carried, oldest first
    #: (``turnledger.store.user_pins``): a rebuild reads them back by id.
    user_pins: list[str] = Field(default_factory=list)
    #: What the memory extraction after this answer used (its cost is in ``cost_usd``'s
    #: head rollup, not in ``cost_usd``); ``None``: none ran.
    memory_usage: Usage | None = None


class AssistantMessage(_Payload):
    """The model's answer: text, tool calls, or both.

    In JSON mode the answer is kept as a JSON value (``content_json``), and
    ``content`` is ``None``: it is stringified only when sent back to a model.
    ``source`` ``client``: an assistant item the client sent as history (the OpenAI
    face), not an answer of this service's model; it has no run record.
    """

    source: Literal["model", "client"] = "model"
    content: str | None = None
    content_json: Any = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    model: str = ""
    usage: Usage = Field(default_factory=Usage)
    run: RunRecord | None = None

    @model_validator(mode="before")
    @classmethod
    def _run_defaults_to_the_message(cls, data: Any) -> Any:
        # Storage leaves out the run record's model and usage when they are the
        # message's own (every event byte is paid for on each write and read).
        if isinstance(data, dict) and isinstance(data.get("run"), dict):
            run = data["run"]
            if "model" not in run or "usage" not in run:
                run = {"model": data.get("model", ""), "usage": data.get("usage", {}), **run}
                data = {**data, "run": run}
        return data

    def stored(self) -> dict[str, Any]:
        """The payload as stored: defaults, and the run record's copies of the message's
        model and usage, left out (reads fill them back in)."""
        compact: dict[str, Any] = self.model_dump(mode="json", exclude_defaults=True)
        if self.run is not None:
            run = compact["run"]
            if self.run.model == self.model:
                run.pop("model", None)
            if self.run.usage == self.usage:
                run.pop("usage", None)
        return compact


Requirement = Literal["none", "approval", "client", "input", "async"]


class ToolCallRequested(_Payload):
    """Intent recorded before a tool runs (or pauses): the crash-safety anchor."""

    call_id: str
    name: str
    arguments: dict[str, Any]
    requires: Requirement
    idempotency_key: str


class ApprovalRequested(_Payload):
    """A call paused for a human decision."""

    call_id: str
    arguments_sha256: str
    expires_at: datetime
    #: An MCP tool's call: the sha256 of the tool's definition the approval is asked for
    #: (a changed definition invalidates it); ``None`` for other tools.
    definition_sha256: str | None = None


class ApprovalResolved(_Payload):
    """A human (or the approval window) decided a paused call."""

    call_id: str
    decision: Literal["approved", "rejected"]
    reason: str | None = None
    approver: str
    arguments_sha256: str
    #: An approval with edited arguments: what runs instead of the requested ones
    #: (``arguments_sha256`` stays the hash of what was requested).
    approved_arguments: dict[str, Any] | None = None
    approved_arguments_sha256: str | None = None
    #: The approver's identity claims the decision relied on (``sub`` and the approver
    #: claim, when one is required); ``None`` for the system's own decisions.
    approver_claims: dict[str, str] | None = None


class ApprovalExpired(_Payload):
    """A paused call's approval window closed with no decision (a rejection follows)."""

    call_id: str
    arguments_sha256: str
    expires_at: datetime


class ToolResult(_Payload):
    """The outcome of one tool call, exactly once per call."""

    call_id: str
    name: str
    output: str
    is_error: bool = False


class ContextCompacted(_Payload):
    """Older turns summarized once, for every later context: the transcript stays as it is.

    Covers public sequences ``from_sequence..to_sequence`` (whole turns, never a
    pending call); ``previous_through`` is the summary it folds in, if any. The
    manifest fields (``from_turn`` to ``trigger``) say what the range held and what
    compacting it saved; summaries written before they existed have them ``None``.
    """

    from_sequence: int = Field(ge=1)
    to_sequence: int = Field(ge=1)
    previous_through: int | None = None
    summarizer_provider: str
    summarizer_model: str
    prompt_version: str
    text: str
    #: sha256 of ``text``: a damaged summary is detected, never sent.
    content_sha256: str
    tokens_estimated: int = Field(ge=0)
    #: The turns of the first and last covered sequences.
    from_turn: int | None = None
    to_turn: int | None = None
    #: Messages (user, assistant, tool results) and tool calls in the whole range.
    messages: int | None = Field(default=None, ge=0)
    tool_calls: int | None = Field(default=None, ge=0)
    #: Tokens of what the summary replaces (the previous summary and the newly covered
    #: turns, as a model would be sent them) and of the summary itself.
    tokens_before: int | None = Field(default=None, ge=0)
    tokens_after: int | None = Field(default=None, ge=0)
    #: Why it was written: ``budget`` (older turns no longer fit), ``read_window`` (the
    #: history read left turns out), ``manual`` (``POST .../compact``).
    trigger: Literal["budget", "read_window", "manual"] | None = None
    #: A manual compaction: the sequence of the summary event it rewrites.
    replaces: int | None = None
    #: The ids of the pins in effect when it was written (none was given to the
    #: summarizer: every later context carries them beside it); ``None``: written
    #: before pins existed.
    pins: list[str] | None = None


class TurnFailed(_Payload):
    """A turn whose model call failed: shown in the transcript, never sent to a model."""

    code: str
    status: int
    attempts: int = Field(ge=1)
    #: The provider's own words, at most 500 characters.
    message: str = Field(max_length=500)


class ToolCallDeferred(_Payload):
    """A tool accepted a call to finish it elsewhere (``202 {"task_id"}``): it is settled
    later by its signed callback, by ``outputs`` on the approvals route, or by its timeout."""

    call_id: str
    name: str
    task_id: str
    #: When an unsettled call is recorded as failed ("timed out").
    expires_at: datetime


class ToolInputProvided(_Payload):
    """A person supplied the output of a human-input (or deferred) call."""

    call_id: str
    name: str
    provided_by: str
    #: ``approvals`` (``outputs``) or ``turn`` (a ``function_call_output`` item).
    via: Literal["approvals", "turn"]


class ToolInputRequested(_Payload):
    """A running call's tool asked a person for input (an MCP server's elicitation): the
    call waits for the answer (``awaiting_input``), then is sent again with it."""

    call_id: str
    name: str
    message: str
    requested_schema: dict[str, Any]
    #: 1 for the tool's first question in this call, 2 for the next, ...
    round: int = 1


class ToolCallSettled(_Payload):
    """A deferred call got its outcome: from its callback, its timeout, or a cancel."""

    call_id: str
    name: str
    status: Literal["succeeded", "failed", "cancelled"]
    via: Literal["callback", "approvals", "turn", "timeout", "cancel"]
    task_id: str | None = None


class TurnInterrupted(_Payload):
    """A turn was stopped (``POST .../cancel``): its pending calls were cancelled, every
    result recorded before stays."""

    interrupted_by: str
    cancelled_call_ids: list[str] = Field(default_factory=list)
    reason: str | None = None


class ConversationImported(_Payload):
    """The conversation was created here from an export (``POST .../import``): the first
    event of an imported history (turn ``0``), written by the importer.

    Every event after it up to ``events + 1`` came from the export and carries an
    :class:`ImportMark`: its content is the source's claim, not something that happened here.
    """

    imported_by: str
    source_conversation_id: str
    source_created_at: datetime
    source_updated_at: datetime
    #: sha256 of the export's bytes as received (UTF-8).
    export_sha256: str
    #: How many events the export held (they follow, renumbered from 2).
    events: int = Field(ge=1)
    #: Usage and cost of the imported answers, recomputed from their own records (the
    #: export's head line is not trusted): the head's totals start from these.
    usage_carried_over: Usage = Field(default_factory=Usage)
    cost_usd_carried_over: float = Field(default=0.0, ge=0)


class RejectedModel(_Strict):
    """A model a routing choice passed over, and why."""

    model: str
    reason: str


class PolicyDecision(_Payload):
    """Which model content of a data class was sent to (``turnledger.context.policy``):
    the class, the policy version that decided, the chosen model and every candidate
    passed over with its reason. Never sent to a model."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, validate_by_name=True, serialize_by_alias=True
    )

    data_class: str = Field(alias="class")
    policy_version: str
    chosen: str
    #: The provider of ``chosen``.
    provider: str
    rejected: list[RejectedModel] = Field(default_factory=list)
    #: What the call was for: ``turn``, ``summary``, ``memory`` or ``replay``.
    purpose: str = "turn"


class DataClassRaised(_Payload):
    """The conversation's data class rose (it never falls): from ``previous`` to ``to``,
    because of ``source`` (``turn``, ``detector:<name>``, ``tool:<name>``, ``operator``).
    Never sent to a model."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, validate_by_name=True, serialize_by_alias=True
    )

    previous: str | None = None
    to: str
    source: str
    policy_version: str


#: The most bytes (UTF-8) a pin's text holds.
PIN_TEXT_MAX_BYTES = 2048
#: What a pin is: a fact stated by an operator, a constraint every answer must keep, or the
#: correction of an earlier event (named by ``corrects``).
PinKind = Literal["fact", "constraint", "correction"]


class Pin(_Strict):
    """A fact, constraint or correction an operator pinned: every later model call carries
    its text verbatim (:mod:`turnledger.context.pins`) until it is removed."""

    id: str = Field(pattern=r"^pin_[0-9a-z]{1,40}$")
    kind: PinKind
    text: str = Field(min_length=1)
    #: A correction: the public sequence of the event it corrects.
    corrects: int | None = Field(default=None, ge=1)
    reason: str | None = None
    #: Who pinned it (the caller's ``sub``).
    author: str
    added_at: datetime
    #: The public sequence of its ``pin_added`` event.
    sequence: int = Field(ge=1)


class PinAdded(_Payload):
    """An operator pinned a fact, a constraint or a correction (the pin's ``sequence`` and
    ``added_at`` are the event's own)."""

    pin_id: str
    kind: PinKind
    text: str
    corrects: int | None = None
    reason: str | None = None
    author: str


class PinRemoved(_Payload):
    """An operator removed a pin; ``pin`` is the pin as it stood, so the pins in force at
    any earlier point (a fork's) are known from the events after it alone."""

    pin_id: str
    removed_by: str
    reason: str | None = None
    pin: Pin


PAYLOAD_MODELS: dict[EventKind, type[_Strict]] = {
    EventKind.USER_MESSAGE: UserMessage,
    EventKind.ASSISTANT_MESSAGE: AssistantMessage,
    EventKind.TOOL_CALL_REQUESTED: ToolCallRequested,
    EventKind.APPROVAL_REQUESTED: ApprovalRequested,
    EventKind.APPROVAL_RESOLVED: ApprovalResolved,
    EventKind.TOOL_RESULT: ToolResult,
    EventKind.CONTEXT_COMPACTED: ContextCompacted,
    EventKind.TURN_FAILED: TurnFailed,
    EventKind.TOOL_CALL_DEFERRED: ToolCallDeferred,
    EventKind.TOOL_INPUT_PROVIDED: ToolInputProvided,
    EventKind.TOOL_INPUT_REQUESTED: ToolInputRequested,
    EventKind.TOOL_CALL_SETTLED: ToolCallSettled,
    EventKind.TURN_INTERRUPTED: TurnInterrupted,
    EventKind.APPROVAL_EXPIRED: ApprovalExpired,
    EventKind.CONVERSATION_IMPORTED: ConversationImported,
    EventKind.POLICY_DECISION: PolicyDecision,
    EventKind.DATA_CLASS_RAISED: DataClassRaised,
    EventKind.PIN_ADDED: PinAdded,
    EventKind.PIN_REMOVED: PinRemoved,
}
KIND_OF_PAYLOAD: dict[type[_Strict], EventKind] = {v: k for k, v in PAYLOAD_MODELS.items()}

Payload = (
    UserMessage
    | AssistantMessage
    | ToolCallRequested
    | ApprovalRequested
    | ApprovalResolved
    | ToolResult
    | ContextCompacted
    | TurnFailed
    | ToolCallDeferred
    | ToolInputProvided
    | ToolInputRequested
    | ToolCallSettled
    | TurnInterrupted
    | ApprovalExpired
    | ConversationImported
    | PolicyDecision
    | DataClassRaised
    | PinAdded
    | PinRemoved
)


class ImportMark(_Strict):
    """On an event that came from an import: who brought it in, when, from which export,
    and what the source said about it. The event's ``actor`` is then ``import``: the
    source's actor (and any approver or output in the payload) is a claim, never a
    decision made here."""

    imported_by: str
    imported_at: datetime
    source_conversation_id: str
    export_sha256: str
    #: The event's sequence in the export (it is renumbered here).
    source_sequence: int = Field(ge=1)
    #: The actor the export named (for an event imported twice, the first source's).
    claimed_actor: str


class Event(_Strict):
    """One canonical event, in the public shape of ``GET .../events``.

    ``sequence`` counts from 1 within the conversation's current life (a
    cleared or expired conversation restarts at 1). ``payload`` is validated
    against the model of its ``kind``; :meth:`body` returns it typed.
    """

    event_id: str
    conversation_id: str
    sequence: int = Field(ge=1)
    #: ``0`` only for the ``conversation_imported`` event that opens an imported history.
    turn: int = Field(ge=0)
    kind: EventKind
    actor: str
    occurred_at: datetime
    payload: dict[str, Any]
    schema_version: int = SCHEMA_VERSION
    #: Set on every event that came from an import (``None``: it happened here).
    imported: ImportMark | None = None

    @model_validator(mode="before")
    @classmethod
    def _payload_fits_kind(cls, data: Any) -> Any:
        # The payload is checked against its kind's model and stored in its full
        # form (defaults filled in), so an event reads back equal to what was written
        # even though storage leaves default fields out.
        if isinstance(data, dict) and "kind" in data and isinstance(data.get("payload"), dict):
            try:
                model = PAYLOAD_MODELS[EventKind(data["kind"])]
                full = model.model_validate(data["payload"]).model_dump(mode="json")
            except (ValueError, ValidationError) as exc:
                raise ValueError(f"payload does not fit kind {data['kind']}: {exc}") from exc
            data = {**data, "payload": full}
        return data

    def body(self) -> Payload:
        """The payload as the typed model of this event's kind."""
        model = PAYLOAD_MODELS[self.kind]
        return model.model_validate(self.payload)  # type: ignore[return-value]


#: Where a pending call stands (moves: :data:`turnledger.turn.lifecycle.CALL_MOVES`).
CallState = Literal[
    "awaiting_approval",
    "awaiting_client",
    "ready",
    "rejected",
    "outcome_unknown",
    "awaiting_input",
    "deferred",
]


def arguments_sha256(arguments: Mapping[str, Any]) -> str:
    """The SHA-256 (hex) of ``arguments`` as canonical JSON; an approval covers exactly these.

    Canonical: keys sorted, no whitespace, non-ASCII kept as UTF-8, so the hash does
    not depend on key order or on how a client escaped its text.
    """
    canonical = json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


#: Hex characters of a SHA-256 kept where a hash only identifies (128 bits): a stored
#: call's ``arguments_sha256``, a turn's ``request_sha256``.
STORED_HASH_CHARS = 32


class Elicitation(_Strict):
    """What a running call's tool asked a person (an MCP server's elicitation, form mode),
    kept on its pending call while it waits: the server's question, and the opaque state
    the call is sent again with; ``answer`` once a person gave it (an MCP ``ElicitResult``:
    ``{"action": "accept", "content": {...}}``, or ``decline`` / ``cancel``)."""

    #: The server's key of the request (its answer is sent under it).
    key: str
    message: str
    requested_schema: dict[str, Any]
    #: The server's ``request_state``, sent back verbatim, never read.
    request_state: str | None = None
    answer: dict[str, Any] | None = None
    round: int = 1


class PendingCall(_Strict):
    """A tool call of the current turn that has no result yet.

    ``state`` says what it waits for: a human (``awaiting_approval``), the
    caller (``awaiting_client``), or execution (``ready``: approved or needing
    no approval, recorded but not yet run; after a crash it runs again under
    the same ``idempotency_key``). ``rejected`` calls get an error result
    without running. ``outcome_unknown``: a tool that does not honour
    idempotency keys was running when its request died; a human decides whether
    it runs again (approve) or is recorded as failed (reject). ``awaiting_input``: a
    human-input tool waits for a person's output; ``deferred``: the tool runs it
    elsewhere (``task_id``) until its callback or ``expires_at``. The allowed moves
    between states are the named moves of :data:`turnledger.turn.lifecycle.CALL_MOVES`.
    """

    id: str
    name: str
    arguments: dict[str, Any]
    requires: Requirement
    state: CallState
    idempotency_key: str
    arguments_sha256: str
    expires_at: datetime | None = None
    reason: str | None = None
    #: The tool's id of a deferred call's job.
    task_id: str | None = None
    #: When the model asked for the call, and the actor of the turn that asked
    #: (``None`` on calls stored before these were recorded): the approval inbox shows them.
    requested_at: datetime | None = None
    requested_by: str | None = None
    #: An MCP tool's call: the sha256 of the tool definition it was requested under.
    definition_sha256: str | None = None
    #: A call whose tool asked a person mid-call (``awaiting_input``): what it asked.
    elicitation: Elicitation | None = None

    # Stored (serialized) calls keep the first half of ``arguments_sha256`` when it is the
    # hash of their ``arguments`` (an edit replaces both), and parsing one whose arguments
    # still hash to it restores the whole: 32 bytes less per call in the head state every
    # approval and decision writes (docs/STORAGE.md). Arguments changed since (a damaged
    # item) do not hash to it, so the call keeps the half and never runs under the
    # approval (its hash no longer matches its arguments: ``turn/execution.py``).
    @model_validator(mode="before")
    @classmethod
    def _whole_hash(cls, data: Any) -> Any:
        if isinstance(data, dict):
            stored, arguments = data.get("arguments_sha256"), data.get("arguments")
            short = isinstance(stored, str) and len(stored) == STORED_HASH_CHARS
            if short and isinstance(arguments, dict):
                whole = arguments_sha256(arguments)
                if whole.startswith(str(stored)):
                    return {**data, "arguments_sha256": whole}
        return data

    @model_serializer(mode="wrap")
    def _half_hash(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict) and data.get("arguments_sha256") == arguments_sha256(
            self.arguments
        ):
            data["arguments_sha256"] = self.arguments_sha256[:STORED_HASH_CHARS]
        return data


class CancelRequest(_Strict):
    """A ``POST .../cancel`` that met a running turn: its request stops at the next step."""

    requested_by: str
    requested_at: datetime
    reason: str | None = None


class Lease(_Strict):
    """The request running the conversation's tools, and until when it may.

    Taken by the commit that starts running tools; while it is live every other
    request answers ``conversation_busy`` and runs nothing. Only an expired lease
    is a crashed run, resumed from the log under the same idempotency keys.

    Its length covers the slowest the step can be: the calls run at most the
    runner's parallel limit at a time, so ``ceil(calls / limit)`` rounds of the
    slowest call's timeout, then the model work that follows (a context summary and
    the model call, each with all its attempts and backoffs), plus a margin. Within
    a request with a deadline it is cut to the function's remaining life plus that
    margin, never more: a run cannot outlive its function. Before each round after
    the first, the holder renews it over what is left, with a commit that expects
    the head it wrote last; if anything else was committed meanwhile (other than a
    cancel, which it takes in), the renewal fails and the holder stops there.
    """

    owner: str
    expires_at: datetime


class JsonSchemaSpec(_Strict):
    """The JSON schema an answer must fit, in OpenAI's shape."""

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    #: ``schema`` on the wire (a pydantic name is taken).
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class JsonObjectFormat(_Strict):
    """JSON mode: any JSON object."""

    type: Literal["json_object"]


class JsonSchemaFormat(_Strict):
    """JSON mode: an answer that fits ``json_schema``."""

    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


class ProviderCursor(_Strict):
    """Provider-side state of the conversation: a cache over the log, never the record.

    Usable by the next model call only when the same tenant, provider, model,
    system prompt, tools and redaction rules (``context_sha256``) made it, no
    summary was added since (``sequence`` is the answer it covers), and it is
    younger than the provider's retention.
    """

    provider: str
    api: str
    model: str
    response_id: str
    created_at: datetime
    tenant: str
    #: sha256 of the system prompt, the tool set and the redaction version it was made with.
    context_sha256: str
    #: The public sequence of the ``assistant_message`` the stored response holds.
    sequence: int = Field(ge=1)
    #: The conversation whose turn stored the response: its owner, the only one whose
    #: purge deletes it (a fork holds its parent's; ``None``: a cursor written before
    #: this field, the holder's own).
    conversation_id: str | None = None

    def owned_by(self, conversation_id: str) -> bool:
        """Whether a purge of ``conversation_id`` deletes the stored response."""
        return self.conversation_id in (None, conversation_id)


#: Tool names as OpenAI (and most providers) accept them: 1-64 of ``A-Z a-z 0-9 _ -``.
TOOL_NAME_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"

#: The longest call id a request (or an import) may name: twice Bedrock's 64, well over
#: the ids providers make (OpenAI's ``call_...`` about 30, Anthropic's ``toolu_...`` about
#: 30); an id a provider refuses is mapped on the wire (:mod:`turnledger.providers.call_ids`).
MAX_CALL_ID_CHARS = 128


class ClientTool(_Strict):
    """A function tool the request declares and the registry lacks: the client runs it.

    Offered to the model for the turn; its calls wait for the client's output, as calls of
    the registry's ``client`` tools do.
    """

    name: str = Field(pattern=TOOL_NAME_PATTERN)
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})


class TurnOptions(_Strict):
    """What the request that began the current turn asked for.

    Kept on the head, so a turn continued later (by approvals, or by client tool
    results) offers the same tools, uses the same model and provider, and keeps
    the call-level approval requirements, whichever process continues it.
    """

    provider: str | None = None
    response_format: JsonObjectFormat | JsonSchemaFormat | None = Field(
        default=None, discriminator="type"
    )
    model: str | None = None
    tools: list[str] | None = None
    require_approval: list[str] = Field(default_factory=list)
    #: Tools the request declared that the registry lacks (the client runs them).
    client_tools: list[ClientTool] = Field(default_factory=list)
    #: Who began the turn: a sha256 of its ``Idempotency-Key`` (if any) and body (its
    #: first :data:`STORED_HASH_CHARS` hex characters; older heads hold all 64), so a
    #: retry of that request resumes the turn instead of beginning another.
    request_sha256: str | None = None
    #: The user whose long-term memory the turn recalls and writes back (``None``: off).
    memory_user: str | None = None
    #: The W3C ``traceparent`` of the request that last left the turn waiting (telemetry
    #: on): the request that resumes it links its span there (:mod:`turnledger.turn.traces`).
    trace_context: str | None = None


class SummaryRef(_Strict):
    """Where the newest summary is: its event, and the last sequence it covers.

    A turn reads the events after ``through`` (the summary's own event among
    them) and nothing older.
    """

    sequence: int = Field(ge=1)
    through: int = Field(ge=1)


#: Conversations in a fork's lineage at most (:attr:`ForkOrigin.segments`): a fork of a fork
#: of ... reads at most this many ancestors' partitions, one query each.
MAX_FORK_DEPTH = 16


class ForkSegment(_Strict):
    """Inherited events of a fork: the public sequences after the previous segment's
    ``through`` up to ``through``, stored in ``conversation_id``'s partition by its life
    ``gen`` (storage sequence = ``base`` + public sequence). Public sequences are the same in
    every conversation of a lineage, so an event keeps its number wherever it is read."""

    conversation_id: str
    gen: str
    base: int = Field(ge=0)
    through: int = Field(ge=1)


class ForkOrigin(_Strict):
    """Where a fork was made: its parent's life, the turn it was forked after and that turn's
    last public sequence, and where every inherited event is stored."""

    conversation_id: str
    gen: str
    turn: int = Field(ge=0)
    seq: int = Field(ge=0)
    #: Oldest first, covering public sequences ``1..seq``; at most :data:`MAX_FORK_DEPTH`.
    segments: list[ForkSegment] = Field(default_factory=list, max_length=MAX_FORK_DEPTH)


class Head(_Strict):
    """The conversation's effective head: its state as every layer above the store sees it.

    Stored in two parts (docs/STORAGE.md, "The effective head"): the *slow state* in the
    ``HEAD`` item, written only when it changes, and the *fast state* in the newest turn
    item of the life, written by every commit; a read merges them. ``version`` counts
    commits: each commit expects the version it read and writes ``version + 1`` (the
    slot it writes at is the lock: :mod:`turnledger.store.commit`). ``seq`` is the last
    stored sequence (storage numbering); ``base`` is the storage sequence just before this
    life of the conversation began, so the public ``sequence`` of an event is
    its storage sequence minus ``base``. ``gen`` names this life: events and
    S3 objects carry it, so leftovers of an earlier life are never read as
    this one's.
    """

    schema_version: int = SCHEMA_VERSION
    gen: str
    version: int = Field(ge=1)
    base: int = Field(ge=0)
    seq: int = Field(ge=0)
    turn: int = Field(ge=0)
    status: ConversationStatus
    created_at: datetime
    updated_at: datetime
    ttl_seconds: int = Field(ge=0)
    #: Epoch seconds after which the conversation is expired; ``None`` never expires.
    expires_at: int | None = None
    pending: list[PendingCall] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    options: TurnOptions = Field(default_factory=TurnOptions)
    #: The expiry-index bucket (hour number) the head is filed under. It stays put
    #: while the expiry moves forward, so a turn does not move an index entry (2 WCU)
    #: every time its TTL crosses an hour; a head is re-filed when its bucket has
    #: been swept (by the next turn, or by the sweep that passes it). ``None``: the
    #: bucket of ``expires_at``.
    expiry_bucket: int | None = None
    #: The newest context summary, if older turns were ever compacted.
    summary: SummaryRef | None = None
    #: Turns whose model call failed (``turn_failed`` events).
    failed_turns: int = Field(default=0, ge=0)
    #: Estimated cost of every model call so far, from the deployment's price table.
    cost_usd: float = Field(default=0.0, ge=0)
    #: Provider-reported input tokens over our estimate, for this conversation's last
    #: call: later estimates are scaled by it (``None``: not calibrated yet).
    token_scale: float | None = None
    #: The newest response a stateful provider keeps for this conversation.
    provider_cursor: ProviderCursor | None = None
    #: Who runs the tools of a ``running_tools`` head, and until when.
    lease: Lease | None = None
    #: Set (with ``running_tools`` only) when a cancel asks the running request to stop.
    cancel: CancelRequest | None = None
    #: The earliest deadline of a wait that expires (a decision's window, a deferred
    #: call's deadline) and that no inbox entry written with this head files itself,
    #: computed by the turn layer (:func:`turnledger.turn.lifecycle.head_wait_deadline`):
    #: the store files the head under its hour on the ``by-wait`` index. ``None``: no
    #: such wait.
    wait_deadline: datetime | None = None
    #: The conversation opted out of long-term memory (a turn sent ``"memory": false``).
    memory_off: bool = False
    #: Set on a fork (``POST .../fork``): its parent and the inherited events' whereabouts.
    #: The fork's own events start at public sequence ``fork.seq + 1``.
    fork: ForkOrigin | None = None
    #: The conversation's data class (``turnledger.context.policy``): it only rises, and a
    #: fork inherits it. ``None``: no class.
    data_class: str | None = None
    #: When the oldest content its class's retention keeps falls due (never later; set by
    #: the first commit of a class with a retention, moved by the sweep that removes it:
    #: :mod:`turnledger.ops.retention`). With :attr:`wait_deadline`, the head's next due
    #: work: the store files it on ``by-wait`` under the earlier one's hour. ``None``:
    #: nothing due.
    retention_due: datetime | None = None
    #: The active pins, oldest first: every model call carries them (slow state: only a
    #: pin's change rewrites ``HEAD``, and a turn reads them with the head).
    pins: list[Pin] = Field(default_factory=list)

    def live_lease(self, now: datetime) -> Lease | None:
        """The lease of a run that may still be going on at ``now``."""
        if self.status is ConversationStatus.RUNNING_TOOLS and self.lease is not None:
            return self.lease if self.lease.expires_at > now else None
        return None

    @property
    def filed_bucket(self) -> int:
        """The expiry bucket the head is filed under (only meaningful with an expiry)."""
        if self.expiry_bucket is not None:
            return self.expiry_bucket
        return (self.expires_at or 0) // EXPIRY_BUCKET_SECONDS

    @property
    def event_count(self) -> int:
        """Events in this life of the conversation."""
        return self.seq - self.base

    def is_expired(self, now: datetime) -> bool:
        """True when the idle TTL has passed at ``now`` (read-through expiry)."""
        return self.expires_at is not None and now.timestamp() >= self.expires_at

    def is_visible(self, now: datetime) -> bool:
        """True when reads should see this conversation at ``now``."""
        return self.status is not ConversationStatus.CLEARED and not self.is_expired(now)
