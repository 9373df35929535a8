"""What every model provider takes and returns.

The working context is a list of :class:`Message` in the provider-neutral
shape below, rebuilt from the canonical events by :mod:`turnledger.context`
on every turn. A provider maps it to its own wire format, and maps its
failures to :class:`ProviderError` / :class:`ProviderTimeout`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..models import ToolCall, Usage


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


class ModelRequest(BaseModel):
    """One call to a model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    messages: list[Message]
    tools: list[ToolSpec] = Field(default_factory=list)


class ModelReply(BaseModel):
    """What the model answered: text, tool calls, or both."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    text: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    model: str = ""


class Provider(ABC):
    """A chat model."""

    #: How ``context.provider_state`` is reported: a provider without server-side
    #: memory always receives the whole working context (``fresh``).
    provider_state: str = "fresh"

    @abstractmethod
    def complete(self, request: ModelRequest) -> ModelReply:
        """Ask the model for the next message.

        Raises:
            ProviderTimeout: the provider did not answer in time (after retries).
            ProviderError: the provider failed or answered something unusable.
        """
