"""A replay's records: what ``POST .../replays`` asks (:class:`ReplaySpec`), each replayed
call beside the recorded one (:class:`ReplayCall`), the totals and the record the route
answers (:class:`ReplayRecord`), and the replay's errors. The replay itself is
:mod:`.replays`; these shapes are the records it keeps and the API's answer."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import ConfigDict, Field

from ..core.exceptions import TurnledgerError
from ..core.models import Deferred, ToolCall, Usage
from .judging import Expect, TurnVerdict

Mode = Literal["pointwise", "rollout"]
Status = Literal["running", "complete", "failed"]
Match = Literal["same", "different", "missing", "extra"]


class _Model(Deferred):
    model_config = ConfigDict(extra="forbid")


class ReplaySpec(_Model):
    """What a replay runs: the candidate, the mode, the turns and the system prompt."""

    provider: str
    model: str
    mode: Mode = "pointwise"
    from_turn: int | None = Field(default=None, ge=1)
    to_turn: int | None = Field(default=None, ge=1)
    #: Sent instead of the deployment's system prompt (``None``: the recorded one).
    system_prompt: str | None = None
    #: What each replayed turn must show (``None``: nothing is judged).
    expect: Expect | None = None


class CallError(_Model):
    """Why a candidate call failed."""

    code: str
    message: str


class Answer(_Model):
    """One model answer: text, tool calls, and what it cost."""

    text: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    model: str = ""
    usage: Usage = Field(default_factory=Usage)
    cost_usd: float = 0.0
    latency_ms: int = 0
    error: CallError | None = None


class ToolCallMatch(_Model):
    """A recorded tool call beside the candidate's: ``same`` name and arguments,
    ``different`` arguments, ``missing`` (not called), or a candidate's ``extra`` call."""

    name: str
    match: Match
    arguments: dict[str, Any] | None = None
    candidate_arguments: dict[str, Any] | None = None


class GivenResult(_Model):
    """A rollout's tool result: the recorded output of an equal call, or an error."""

    call_id: str
    name: str
    output: str
    recorded: bool


class ReplayCall(_Model):
    """One replayed call: the recorded answer beside the candidate's."""

    turn: int
    #: The call's place in its turn (1, 2, ...).
    call: int
    #: The recorded call (``None``: a rollout call the recording has no counterpart for).
    recorded: Answer | None = None
    candidate: Answer | None = None
    tool_calls: list[ToolCallMatch] = Field(default_factory=list)
    #: ``difflib`` ratio of the two texts (``None``: neither has text).
    similarity: float | None = None
    #: Pointwise: whether the context sent hashed to the run record's ``context_sha256``.
    context_matches: bool | None = None
    #: Rollout: the user message sent before this call (the first call of a turn).
    input: str | None = None
    #: Rollout: what the candidate's tool calls were answered with.
    tool_results: list[GivenResult] = Field(default_factory=list)


class Totals(_Model):
    """Tokens, cost and latency of a set of calls."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    latency_ms: int = 0

    def add(self, answer: Answer) -> None:
        """Count ``answer`` in."""
        self.calls += 1
        self.input_tokens += answer.usage.input_tokens
        self.output_tokens += answer.usage.output_tokens
        self.cost_usd = round(self.cost_usd + answer.cost_usd, 8)
        self.latency_ms += answer.latency_ms


class ReplaySummary(_Model):
    """The replay's aggregate: tool-call agreement, text similarity, cost and latency."""

    calls: int
    tool_calls: int
    identical_tool_calls: int
    #: ``identical_tool_calls / tool_calls`` (``None``: no tool call on either side).
    identical_tool_call_share: float | None
    #: The mean of the calls' similarities (``None``: no text on either side).
    text_similarity: float | None
    failed_calls: int
    #: Pointwise: calls whose rebuilt context did not hash to the recorded one.
    context_mismatches: int
    original: Totals
    candidate: Totals
    #: With ``expect``: the turns judged and those that passed (``None``: not judged).
    turns_judged: int | None = None
    turns_passed: int | None = None


class ReplayRecord(_Model):
    """A replay: its request, status, calls and summary."""

    id: str
    conversation_id: str
    status: Status
    provider: str
    model: str
    mode: Mode
    from_turn: int
    to_turn: int
    system_prompt: str | None = None
    created_at: datetime
    updated_at: datetime
    calls: list[ReplayCall] = Field(default_factory=list)
    summary: ReplaySummary | None = None
    error: CallError | None = None
    expect: Expect | None = None
    #: With ``expect``, once complete: every turn judged, and whether all passed.
    turns: list[TurnVerdict] = Field(default_factory=list)
    passed: bool | None = None


class ReplayNotFound(TurnledgerError):
    """The conversation has no such replay (or it expired with the conversation)."""

    status = 404
    code = "replay_not_found"


class InvalidTurnRange(TurnledgerError):
    """A replay's turn range is empty or goes past the conversation's turns."""

    status = 422
    code = "invalid_turn_range"


# --- storing ---------------------------------------------------------------------------
