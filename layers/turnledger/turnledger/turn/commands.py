"""What the service is asked to do: the domain commands of a conversation's routes.

The HTTP edge (:mod:`turnledger.api`) validates request bodies and maps them to
these; the service (:class:`~turnledger.turn.pipeline.Conversations`) takes nothing
else. They are pydantic models because a long turn's command travels in the turn
worker's event (:mod:`turnledger.turn.longturns`) and is read back there.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..core.models import ClientTool, JsonObjectFormat, JsonSchemaFormat


class _Command(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ClientOutput(_Command):
    """The result of a client-side tool call (or the output of a call waiting for one)."""

    call_id: str
    output: str


class TurnCommand(_Command):
    """Run one turn: new user messages and/or outputs of calls that wait for them."""

    #: New user messages; none: the outputs only continue the waiting turn.
    messages: list[str] = Field(default_factory=list)
    outputs: list[ClientOutput] = Field(default_factory=list)
    model: str | None = None
    provider: str | None = None
    response_format: JsonObjectFormat | JsonSchemaFormat | None = Field(
        default=None, discriminator="type"
    )
    tools: list[str] | None = None
    require_approval: list[str] = Field(default_factory=list)
    #: Function tools the request declares that the registry lacks: the client runs them.
    client_tools: list[ClientTool] = Field(default_factory=list)
    metadata: dict[str, str] = Field(default_factory=dict)
    #: The request's ``Idempotency-Key``: with the rest, who began a turn, so a retry of
    #: that request resumes the turn instead of beginning another.
    idempotency_key: str | None = None
    #: ``False``: the conversation neither recalls nor writes back the user's long-term
    #: memory from this turn on; ``True``: it does again; ``None``: as it did.
    memory: bool | None = None
    #: The user whose memory the turn uses, when a trusted caller named one (the edge
    #: checks who may); ``None``: the turn's actor. Never taken from the model.
    memory_user: str | None = None
    #: The caller's approver claims, as the approvals route records them; empty: the caller
    #: holds no approver scope, and may not give the output of a human-input or deferred
    #: call (:func:`turnledger.turn.lifecycle.check_settler`).
    approver_claims: dict[str, str] = Field(default_factory=dict)
    #: The data class the caller says the turn's content is (it raises the
    #: conversation's class, never lowers it); ``None``: as detected.
    data_class: str | None = None

    @property
    def starts_turn(self) -> bool:
        """Whether the command starts a new turn (it carries a message)."""
        return bool(self.messages)


class Decisions(_Command):
    """Decide pending calls: approve (with edited arguments, or ``None``: as requested),
    reject (with a reason), or give the output of calls waiting for one."""

    approvals: dict[str, dict[str, Any] | None] = Field(default_factory=dict)
    rejections: dict[str, str | None] = Field(default_factory=dict)
    outputs: dict[str, str] = Field(default_factory=dict)
    #: The approver's identity claims that allowed the decision (recorded with it); empty:
    #: none (no output of a human-input or deferred call is taken).
    approver_claims: dict[str, str] = Field(default_factory=dict)


class CallbackOutcome(_Command):
    """A deferred call's outcome, as its job reported it."""

    status: Literal["succeeded", "failed", "cancelled"]
    #: The result (a string, or any JSON value); for ``failed``, the error text.
    output: Any = None
    #: Continue the turn at once when nothing else is pending.
    continue_turn: bool = False
