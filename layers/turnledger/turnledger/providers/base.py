"""What every model provider takes and returns.

The working context is a list of :class:`Message` in the provider-neutral
shape below, rebuilt from the canonical events by :mod:`turnledger.context.assembly`
on every turn. A provider maps it to its own wire format, and maps its
failures to :class:`~turnledger.core.exceptions.ProviderError` /
:class:`~turnledger.core.exceptions.ProviderTimeout`.

Provider-side state (the Responses API's ``previous_response_id``) is a cache
over the log: the service decides whether a stored response may be used (the
head's provider cursor, checked by :mod:`turnledger.turn.pipeline`) and says so
with :attr:`ModelRequest.continuation`.
A stateful provider then sends only the messages after
``continuation.new_from``; when the provider answers that the state is gone it
sends the whole context again in the same call and reports ``fallback``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..core.models import ToolCall, Usage


class Message(BaseModel):
    """One message of the working context.

    * ``system`` / ``user``: ``content`` is the text.
    * ``assistant``: ``content`` (may be ``None``) and/or ``tool_calls``.
    * ``tool``: the result of one call: ``tool_call_id``, ``name`` (the tool's
      name), ``content`` (the output, or the error text when ``is_error``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None
    is_error: bool = False


class ToolSpec(BaseModel):
    """A tool as the model sees it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})


ProviderState = Literal["fresh", "continued", "fallback"]

#: Takes each piece of an answer's text as a streaming provider receives it.
TextSink = Callable[[str], None]

#: Returns the API key of an HTTP provider, called per request (``None``: send none).
ApiKeyProvider = Callable[[], str | None]


class ResponseFormat(BaseModel):
    """JSON mode: ``{"type": "json_object"}``, or a JSON schema the answer must fit.

    ``json_schema`` has OpenAI's shape: ``{"name", "schema", "strict"?}``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _schema_iff_json_schema(self) -> ResponseFormat:
        # Every provider maps the schema by its name; a half-given format is a caller's bug.
        if self.type == "json_schema":
            if self.json_schema is None or not isinstance(self.json_schema.get("name"), str):
                raise ValueError('type "json_schema" needs json_schema with a "name"')
        elif self.json_schema is not None:
            raise ValueError('json_schema is only allowed with type "json_schema"')
        return self


class Continuation(BaseModel):
    """Use the provider's stored state: ``previous_response_id`` plus the new messages.

    ``messages[new_from:]`` of the request are the ones the stored response has
    not seen. System messages are never sent as new items; a provider whose API
    does not carry them over (the Responses API's ``instructions``) sends them
    again on every request, from ``messages``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    previous_response_id: str
    new_from: int = Field(ge=0)


class ModelRequest(BaseModel):
    """One call to a model.

    ``messages`` is always the whole working context, so a provider can fall
    back to it when its stored state is gone.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    messages: list[Message]
    tools: list[ToolSpec] = Field(default_factory=list)
    #: What the call is for: the demo model answers ``summary`` calls as a summarizer and
    #: ``memory`` calls as the memory extractor (:mod:`turnledger.context.memory`).
    purpose: Literal["turn", "summary", "memory"] = "turn"
    response_format: ResponseFormat | None = None
    #: Stored provider state the pipeline found usable (stateful providers only).
    continuation: Continuation | None = None
    #: Ask a stateful provider to keep this response (``store``), so the next turn can continue it.
    store: bool = False


class ModelReply(BaseModel):
    """What the model answered: text, tool calls, or both."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    text: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    model: str = ""
    #: The provider's id of this response when it keeps it (a cursor for the next turn).
    response_id: str | None = None
    #: How the context was sent: whole (``fresh``), as new items over stored state
    #: (``continued``), or whole after the stored state proved gone (``fallback``).
    provider_state: ProviderState = "fresh"


class Provider(ABC):
    """A chat model.

    ``name`` is the value of ``PROVIDER`` (and of a turn's ``"provider"``) that
    selects it. A stateful provider (``stateful = True``) honours
    :attr:`ModelRequest.continuation` and ``store`` and implements
    :meth:`delete_state`.
    """

    name: str = ""
    #: True when the provider can keep responses server-side (``previous_response_id``).
    stateful: bool = False
    #: True when :meth:`estimate_tokens` is what the provider reports as usage (no
    #: calibration, no per-message overhead).
    estimate_is_exact: bool = False

    @abstractmethod
    def complete(self, request: ModelRequest) -> ModelReply:
        """Ask the model for the next message.

        Raises:
            ProviderTimeout: the provider did not answer in time (after retries).
            ProviderError: the provider failed or answered something unusable.
        """

    def stream(self, request: ModelRequest, on_text: TextSink) -> ModelReply:
        """Ask the model for the next message, handing its text to ``on_text`` as it comes.

        Returns the whole reply, as :meth:`complete` does; the pieces given to
        ``on_text`` are its text in order. The default calls :meth:`complete` and
        hands the text over once; a provider that can stream overrides this.
        ``on_text`` may raise (a cancel): the exception goes through unchanged.

        Raises:
            ProviderTimeout: the provider did not answer in time (after retries).
            ProviderError: the provider failed or answered something unusable.
        """
        reply = self.complete(request)
        if reply.text:
            on_text(reply.text)
        return reply

    def estimate_tokens(self, text: str) -> int:
        """A conservative estimate of the tokens ``text`` costs this provider's models.

        The default is one token per three characters (real tokenizers average
        about four for English; code and other scripts need fewer per token).
        The pipeline corrects it per conversation with the usage providers report.
        """
        return -(-len(text) // 3)

    def delete_state(self, response_ids: list[str]) -> int:
        """Delete stored responses, best effort; returns how many were deleted.

        Never raises: a clear must not fail because the provider is down.
        """
        return 0
