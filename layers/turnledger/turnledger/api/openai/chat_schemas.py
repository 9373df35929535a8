"""The request body of ``POST /openai/v1/chat/completions``, as the ``openai`` SDK's types
define it (``openai.types.chat.CompletionCreateParams`` and its message params).

Unlike the Responses face's bodies, a field OpenAI defines that this face does not take is
refused (``400 unsupported_parameter``, :meth:`ChatCompletionCreate.check`) rather than
ignored: a Chat Completions client sends only what its caller set, so a field it sends was
meant to do something.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field

from ...core.exceptions import UnsupportedParameter, UnsupportedValue
from ...core.models import Deferred, JsonObjectFormat, JsonSchemaSpec

__all__ = [
    "ChatAssistantMessage",
    "ChatCompletionCreate",
    "ChatContentPart",
    "ChatFunctionTool",
    "ChatJsonSchemaFormat",
    "ChatMessage",
    "ChatTextFormat",
    "ChatToolCall",
    "ChatToolMessage",
    "ChatUserMessage",
]


class _Checked(Deferred):
    """A body part whose undeclared fields are kept, to be refused by name."""

    model_config = ConfigDict(extra="allow", frozen=True)

    def unsupported(self, where: str) -> None:
        """Refuse the first field this face does not declare (``None`` values pass: some
        clients send every field, unset ones as ``null``).

        Raises:
            UnsupportedParameter: with ``param`` ``<where>.<field>``.
        """
        for name, value in (self.model_extra or {}).items():
            if value is not None:
                param = f"{where}.{name}" if where else name
                raise UnsupportedParameter(
                    f"{param} is not supported by this service", details={"param": param}
                )


class ChatContentPart(_Checked):
    """A content part: ``text`` (and an assistant's ``refusal``) only; others are refused."""

    type: str
    text: str | None = None
    refusal: str | None = None


Content = str | list[ChatContentPart]


class ChatSystemMessage(_Checked):
    """``ChatCompletionSystemMessageParam``."""

    role: Literal["system"]
    content: Content


class ChatDeveloperMessage(_Checked):
    """``ChatCompletionDeveloperMessageParam``."""

    role: Literal["developer"]
    content: Content


class ChatUserMessage(_Checked):
    """``ChatCompletionUserMessageParam``."""

    role: Literal["user"]
    content: Content


class ChatFunction(_Checked):
    """A call's function: its name and its arguments as JSON text."""

    name: str = Field(min_length=1)
    arguments: str


class ChatToolCall(_Checked):
    """``ChatCompletionMessageFunctionToolCallParam``."""

    id: str = Field(min_length=1)
    type: Literal["function"] = "function"
    function: ChatFunction


class ChatAssistantMessage(_Checked):
    """``ChatCompletionAssistantMessageParam``."""

    role: Literal["assistant"]
    content: Content | None = None
    refusal: str | None = None
    tool_calls: list[ChatToolCall] | None = None
    #: An answer's annotations, echoed back by clients that send the message they got:
    #: accepted and not kept (this service's answers have none).
    annotations: list[dict[str, Any]] | None = None


class ChatToolMessage(_Checked):
    """``ChatCompletionToolMessageParam``."""

    role: Literal["tool"]
    content: Content
    tool_call_id: str = Field(min_length=1)


ChatMessage = Annotated[
    ChatSystemMessage
    | ChatDeveloperMessage
    | ChatUserMessage
    | ChatAssistantMessage
    | ChatToolMessage,
    Field(discriminator="role"),
]


class ChatFunctionDefinition(_Checked):
    """``FunctionDefinition``."""

    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatFunctionTool(_Checked):
    """``ChatCompletionFunctionToolParam`` (custom tools are refused)."""

    type: Literal["function"]
    function: ChatFunctionDefinition


class ChatNamedToolChoice(_Checked):
    """``ChatCompletionNamedToolChoiceParam``: refused (the model chooses, see ``check``)."""

    type: Literal["function"]
    function: dict[str, Any]


class ChatTextFormat(_Checked):
    """``ResponseFormatText``: plain text, as without ``response_format``."""

    type: Literal["text"]


class ChatJsonSchemaFormat(_Checked):
    """``ResponseFormatJSONSchema``."""

    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


class ChatStreamOptions(_Checked):
    """``ChatCompletionStreamOptionsParam``."""

    include_usage: bool | None = None
    #: Accepted and not used: the chunks carry no padding to obfuscate.
    include_obfuscation: bool | None = None


class ChatCompletionCreate(_Checked):
    """``POST /openai/v1/chat/completions``: the fields this face takes."""

    messages: list[ChatMessage] = Field(min_length=1)
    model: str | None = None
    tools: list[ChatFunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | ChatNamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: (
        Annotated[
            ChatTextFormat | JsonObjectFormat | ChatJsonSchemaFormat, Field(discriminator="type")
        ]
        | None
    ) = None
    stream: bool | None = None
    stream_options: ChatStreamOptions | None = None
    n: int | None = None
    #: Kept on the turn's metadata: the deployment's model settings apply.
    max_completion_tokens: int | None = Field(default=None, ge=1)
    #: The deprecated name of ``max_completion_tokens``.
    max_tokens: int | None = Field(default=None, ge=1)
    #: Kept on the turn's metadata: the deployment's model settings apply.
    temperature: float | None = Field(default=None, ge=0, le=2)
    metadata: dict[str, str] | None = None
    user: str | None = None
    store: bool | None = None

    def check(self) -> None:
        """Refuse what this face does not take, by name: a field it does not declare, in
        the body or a message or a tool; ``n`` other than 1; a ``tool_choice`` that forces
        a call; ``stream_options`` without ``stream``.

        Raises:
            UnsupportedParameter: a field this face does not take (``param`` names it).
            UnsupportedValue: a value it does not take (``param`` names its field).
        """
        self.unsupported("")
        for index, message in enumerate(self.messages):
            message.unsupported(f"messages.{index}")
            if isinstance(message, ChatAssistantMessage):
                for number, call in enumerate(message.tool_calls or []):
                    call.unsupported(f"messages.{index}.tool_calls.{number}")
                    call.function.unsupported(f"messages.{index}.tool_calls.{number}.function")
        for index, tool in enumerate(self.tools or []):
            tool.unsupported(f"tools.{index}")
            tool.function.unsupported(f"tools.{index}.function")
        if self.stream_options is not None:
            self.stream_options.unsupported("stream_options")
        if self.n is not None and self.n != 1:
            raise UnsupportedValue(
                f"n must be 1 (one choice per request), not {self.n}", details={"param": "n"}
            )
        if self.tool_choice == "required" or isinstance(self.tool_choice, ChatNamedToolChoice):
            raise UnsupportedValue(
                "tool_choice may be 'auto' or 'none': the model chooses whether to call a tool",
                details={"param": "tool_choice"},
            )
        if self.stream_options is not None and not self.stream:
            raise UnsupportedValue(
                "stream_options needs stream: true", details={"param": "stream_options"}
            )
