"""Domain errors, one class per failure the public contract names.

Every error the HTTP API answers is a :class:`TurnledgerError`: it carries the
contract's ``code``, the HTTP ``status`` and the ``details`` a caller needs
next. Lower-library exceptions (botocore, httpx, pydantic) are translated into
this tree at the boundary where they happen, so the API layer maps one
hierarchy to responses and never matches on message text::

    TurnledgerError
    ├── InvalidRequest               400 invalid_request
    │   └── UnsupportedParameter     400 unsupported_parameter
    ├── InvalidConversationId        400 invalid_conversation_id
    ├── InvalidCursor                400 invalid_cursor
    ├── UnsupportedValue             400 unsupported_value
    ├── Unauthorized                 401 unauthorized
    ├── ApproverScopeMissing         403 approver_scope_missing
    ├── AdminScopeMissing            403 admin_scope_missing
    ├── ApproverIsRequester          403 approver_is_requester
    ├── MemoryUserNotAllowed         403 memory_user_not_allowed
    ├── ConversationNotFound         404 conversation_not_found
    ├── MemoryNotFound               404 memory_not_found
    ├── PinNotFound                  404 pin_not_found
    ├── ConversationBusy             409 conversation_busy
    ├── (calls pending)
    │   ├── ApprovalPending          409 approval_pending
    │   └── InputPending             409 input_pending
    ├── NotAwaitingApproval          409 not_awaiting_approval
    ├── ToolDefinitionChanged        409 tool_definition_changed
    ├── BudgetExceeded               409 budget_exceeded
    ├── ConversationExists           409 conversation_exists
    ├── ForkPointOpen                409 fork_point_open
    ├── ForkTooDeep                  409 fork_too_deep
    ├── MemoryFull                   409 memory_full
    ├── NothingToCompact             409 nothing_to_compact
    ├── StateError
    │   ├── CorruptedState           409 corrupted_state
    │   └── UnsupportedStateVersion  409 unsupported_state_version
    ├── CallbackInvalid              410 callback_invalid
    ├── ContentUnreadable            410 content_unreadable
    ├── PayloadTooLarge              413 payload_too_large
    │   ├── ImportTooLarge           413 import_too_large
    │   └── ContextLengthExceeded    413 context_length_exceeded
    ├── RequestValidationFailed      422 validation_error
    ├── InvalidForkPoint             422 invalid_fork_point
    ├── UnknownToolCall              422 unknown_tool_call
    ├── UnknownTool                  422 unknown_tool
    ├── UnknownProvider              422 unknown_provider
    ├── UnknownModel                 422 unknown_model
    ├── DataPolicyUnsatisfied        422 data_policy_unsatisfied
    ├── UnknownDataClass             422 unknown_data_class
    ├── PinBudgetExceeded            422 pin_budget_exceeded
    ├── IdempotencyKeyReused         422 idempotency_key_reused
    ├── ProviderError                502 provider_error
    │   └── ProviderTimeout          504 provider_timeout
    ├── ToolServerUnavailable        502 tool_server_unavailable
    ├── ServiceUnavailable           503 service_unavailable
    └── InternalError                500 internal_error
        └── InvalidHistory           500 internal_error (strict-provider check)

Long turns add their own (:mod:`turnledger.turn.longturns`: ``turn_not_found``,
``turn_superseded``, ``async_unavailable``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from .models import PendingCall


class TurnledgerError(Exception):
    """Base of every error the API answers with the contract's error shape."""

    status: ClassVar[int] = 500
    code: ClassVar[str] = "internal_error"

    def __init__(self, message: str, *, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = details or {}

    def to_body(self) -> dict[str, Any]:
        """The JSON body of the error response: ``{"error": {code, message, details}}``."""
        return {"error": {"code": self.code, "message": self.message, "details": self.details}}


class InvalidRequest(TurnledgerError):
    """The body is not JSON, or not a JSON object."""

    status = 400
    code = "invalid_request"


class InvalidConversationId(TurnledgerError):
    """The conversation id breaks the id rule."""

    status = 400
    code = "invalid_conversation_id"


class Unauthorized(TurnledgerError):
    """No verified identity, or one without a usable tenant."""

    status = 401
    code = "unauthorized"


class ApproverScopeMissing(TurnledgerError):
    """The caller's identity lacks the claim value that deciding approvals requires
    (``APPROVER_CLAIM`` holding ``APPROVER_SCOPE``)."""

    status = 403
    code = "approver_scope_missing"


class AdminScopeMissing(TurnledgerError):
    """The caller's identity lacks the claim value setting the data policy requires
    (``APPROVER_CLAIM`` holding ``DATA_POLICY_ADMIN_SCOPE``), or tenants set none here."""

    status = 403
    code = "admin_scope_missing"


class ApproverIsRequester(TurnledgerError):
    """Four-eyes: the approver is the person whose turn asked for the call
    (``details.calls``); nothing was decided."""

    status = 403
    code = "approver_is_requester"


class ConversationNotFound(TurnledgerError):
    """The conversation is absent, expired, cleared, or another tenant's."""

    status = 404
    code = "conversation_not_found"


class ConversationBusy(TurnledgerError):
    """Another write on the same conversation committed first, or another request is
    running its tools; nothing of this one was stored.

    ``details.retry_after_seconds`` (and the ``Retry-After`` header) says when to try again.
    """

    status = 409
    code = "conversation_busy"

    @property
    def retry_after(self) -> int | None:
        """Seconds after which a retry may succeed, when known."""
        value = self.details.get("retry_after_seconds")
        return int(value) if isinstance(value, int | float) else None


class _CallsPending(TurnledgerError):
    """Calls of the conversation wait for someone: ``pending`` names them (the HTTP
    edge shows them as ``details.pending_tool_calls``)."""

    def __init__(
        self,
        message: str,
        *,
        pending: Sequence[PendingCall] = (),
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message, details=details)
        self.pending: list[PendingCall] = list(pending)


class ApprovalPending(_CallsPending):
    """A turn was sent while tool calls await approval."""

    status = 409
    code = "approval_pending"


class NotAwaitingApproval(TurnledgerError):
    """Approvals were sent to a conversation with nothing pending approval."""

    status = 409
    code = "not_awaiting_approval"


class BudgetExceeded(TurnledgerError):
    """The conversation's token budget is spent; ``details.limit`` and ``details.used``."""

    status = 409
    code = "budget_exceeded"


class NothingToCompact(TurnledgerError):
    """``POST .../compact`` on a conversation with no summary yet: there is no range to
    summarize again (compaction starts when the context no longer fits)."""

    status = 409
    code = "nothing_to_compact"


class PinBudgetExceeded(TurnledgerError):
    """A pin whose block (with the system prompt) would take more than its share of a
    model's context budget: refused when added, never cut from a context later."""

    status = 422
    code = "pin_budget_exceeded"


class PinNotFound(TurnledgerError):
    """``DELETE .../pins/{pin_id}`` names no active pin of the conversation (or, under
    ``/v1/memories/pins``, of the user)."""

    status = 404
    code = "pin_not_found"


class StateError(TurnledgerError):
    """A stored item cannot be read by this build; ``DELETE`` recovers the conversation."""

    status = 409


class CorruptedState(StateError):
    """A stored item fails validation."""

    code = "corrupted_state"


class UnsupportedStateVersion(StateError):
    """A stored item has a schema version this build cannot read."""

    code = "unsupported_state_version"

    def __init__(self, found: object, supported: list[int], *, where: str) -> None:
        super().__init__(
            f"{where} has schema version {found!r}; this build reads {supported}",
            details={"found": found, "supported": supported, "item": where},
        )


class ConversationExists(TurnledgerError):
    """An import names a conversation id that is taken (a live, or unreadable, head)."""

    status = 409
    code = "conversation_exists"


class ForkPointOpen(TurnledgerError):
    """A fork was asked at a point where the conversation waits (an approval, a person's
    input, a client or deferred call) or runs tools: ``details.status`` says which."""

    status = 409
    code = "fork_point_open"


class ForkTooDeep(TurnledgerError):
    """A fork would read more ancestors than a lineage may have (``MAX_FORK_DEPTH``)."""

    status = 409
    code = "fork_too_deep"


class InvalidForkPoint(TurnledgerError):
    """``after_turn`` names no turn of the conversation."""

    status = 422
    code = "invalid_fork_point"


class MemoryUserNotAllowed(TurnledgerError):
    """The caller named a memory user (``X-Memory-User``) without the scope that allows it."""

    status = 403
    code = "memory_user_not_allowed"


class MemoryNotFound(TurnledgerError):
    """The caller's user has no memory record with this id (another user's is never found)."""

    status = 404
    code = "memory_not_found"


class MemoryFull(TurnledgerError):
    """A record added by hand would take the user past ``MEMORY_MAX_RECORDS``."""

    status = 409
    code = "memory_full"


class PayloadTooLarge(TurnledgerError):
    """The input is over the configured size limit."""

    status = 413
    code = "payload_too_large"


class ImportTooLarge(PayloadTooLarge):
    """An import holds more events than one request may write (``IMPORT_MAX_EVENTS``);
    ``details.limit_events`` and ``details.events`` say by how much. Nothing was written."""

    code = "import_too_large"


class ContextLengthExceeded(PayloadTooLarge):
    """A turn's input cannot fit the context budget even alone (with the system prompt);
    ``details.limit`` (the budget), ``details.tokens`` (the input's estimate) and
    ``details.model`` say by how much. Nothing was stored."""

    code = "context_length_exceeded"


class RequestValidationFailed(TurnledgerError):
    """The body fails the request schema; ``details.errors`` says where."""

    status = 422
    code = "validation_error"


class UnknownToolCall(TurnledgerError):
    """An approval names a call id that is not pending."""

    status = 422
    code = "unknown_tool_call"


class UnknownTool(TurnledgerError):
    """A turn names a tool that is not registered."""

    status = 422
    code = "unknown_tool"


class UnknownProvider(TurnledgerError):
    """A turn names a provider the deployment does not enable (``details.allowed``)."""

    status = 422
    code = "unknown_provider"


class UnknownModel(TurnledgerError):
    """A turn names a model the deployment does not allow (``details.allowed``)."""

    status = 422
    code = "unknown_model"


class DataPolicyUnsatisfied(TurnledgerError):
    """No model the conversation's data class allows may answer (``details.class``,
    ``details.rejected``): nothing was sent, nothing stored."""

    status = 422
    code = "data_policy_unsatisfied"


class UnknownDataClass(TurnledgerError):
    """A request names a data class the policy does not have (``details.classes``)."""

    status = 422
    code = "unknown_data_class"


class IdempotencyKeyReused(TurnledgerError):
    """An ``Idempotency-Key`` was sent again with a different body."""

    status = 422
    code = "idempotency_key_reused"


class ProviderError(TurnledgerError):
    """The model provider failed (after bounded retries); the turn left no trace."""

    status = 502
    code = "provider_error"


class ProviderTimeout(ProviderError):
    """The model provider timed out (after bounded retries); the turn left no trace."""

    status = 504
    code = "provider_timeout"


class ServiceUnavailable(TurnledgerError):
    """The storage backend is throttling or failing (after its own bounded retries).

    ``details.retry_after_seconds`` (and the ``Retry-After`` header) says when to try
    again. When ``outcome_unknown`` is set, the backend failed after the write may have
    landed: the write is whole or absent, never half, but which one is not known.
    """

    status = 503
    code = "service_unavailable"

    def __init__(
        self,
        message: str,
        *,
        retry_after_seconds: int = 1,
        outcome_unknown: bool = False,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(
            message, details={**(details or {}), "retry_after_seconds": retry_after_seconds}
        )
        self.outcome_unknown = outcome_unknown

    @property
    def retry_after(self) -> int | None:
        """Seconds after which a retry may succeed."""
        value = self.details.get("retry_after_seconds")
        return int(value) if isinstance(value, int | float) else None


class InternalError(TurnledgerError):
    """A bug or misconfiguration on our side."""

    status = 500
    code = "internal_error"


class InvalidHistory(InternalError):
    """The history about to be sent to a strict provider breaks its message rules."""


class InputPending(_CallsPending):
    """A plain turn was sent while human-input or deferred tool calls wait for their output."""

    status = 409
    code = "input_pending"


class CallbackInvalid(TurnledgerError):
    """A deferred tool's callback token is forged, expired, used, or its call is settled."""

    status = 410
    code = "callback_invalid"


class ContentUnreadable(TurnledgerError):
    """Stored content whose key erasure destroyed (e.g. an item restored from a backup)."""

    status = 410
    code = "content_unreadable"


class InvalidCursor(TurnledgerError):
    """A listing's ``cursor`` is not one this API handed out (to this tenant)."""

    status = 400
    code = "invalid_cursor"


class UnsupportedValue(TurnledgerError):
    """A value this face does not take for a field it does (named in ``details.param``)."""

    status = 400
    code = "unsupported_value"


class ToolDefinitionChanged(TurnledgerError):
    """An MCP call's approval was asked for a tool definition its server has changed since
    (``details.calls``): the approval is invalidated, nothing is decided."""

    status = 409
    code = "tool_definition_changed"


class ToolServerUnavailable(TurnledgerError):
    """An MCP server of the registry could not list its tools (``details.server_label``)."""

    status = 502
    code = "tool_server_unavailable"


class UnsupportedParameter(InvalidRequest):
    """A request sets a field this API does not take (``details.param``): refused, never
    accepted and ignored."""

    code = "unsupported_parameter"
