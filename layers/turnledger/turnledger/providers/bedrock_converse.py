"""Amazon Bedrock's Converse API over botocore (``bedrock-runtime`` ``converse``).

The working context maps to Converse as a team moving an assistant between
OpenAI and Bedrock would expect, with no vendor leftovers:

* the history is built strict first (:mod:`turnledger.providers.history`);
  every system message goes in ``system``;
* user text is a ``text`` block; an assistant message is its ``text`` and one
  ``toolUse`` block ``{toolUseId, name, input}`` per call; a tool result is a
  ``toolResult`` block ``{toolUseId, content: [{text}], status: "error"}``
  (``status`` only on errors: models other than Anthropic's know no other
  value) in a user message;
* consecutive messages of one role are merged (Converse requires user and
  assistant to alternate): tool results and a following user text become one
  user message, the results first;
* call ids are mapped to what Bedrock accepts (``[a-zA-Z0-9_-]{1,64}``,
  unique in the conversation, see :mod:`turnledger.providers.call_ids`) and
  mapped back in the reply; a tool name from the history that Bedrock would
  refuse is made safe the same way;
* Converse refuses ``toolUse`` / ``toolResult`` blocks unless ``toolConfig`` is
  set; a call that offers no tools (a summary) gets its history's tool calls
  and results as text instead, so the model is never offered a tool it may
  not call;
* a blank text (Converse refuses empty text blocks) is left out, or, where it
  is all a message or a result holds, sent as ``(empty)``.

JSON mode: Converse has no JSON flag every model honours. The default
(``json_mode="tool"``) adds a tool ``json_answer`` whose input schema is the
requested schema (``{"type": "object"}`` for ``json_object``; a schema whose
root is not an object is wrapped in ``{"value": ...}``) and forces it
(``toolChoice.tool``; ``toolChoice.any`` when other tools are offered, so the
model can still call them); the answer's ``input`` becomes the reply's text,
as JSON. Forced tool choice needs a model that supports it (Anthropic Claude,
Amazon Nova, Mistral Large). ``json_mode="native"`` sends Converse's
``outputConfig.textFormat`` (structured outputs) instead, for models that have it.

Failures are mapped at this boundary (botocore's own retries are off: one
retry policy, here)::

    ThrottlingException, ServiceUnavailableException,
    InternalServerException, ModelNotReadyException, 5xx -> retried, then ProviderError (502)
    ModelTimeoutException, read/connect timeouts          -> retried, then ProviderTimeout (504)
    connection failures                                   -> retried, then ProviderError (502)
    ValidationException, AccessDeniedException, others    -> ProviderError (502) at once
    an answer botocore or we cannot read                  -> ProviderError (502) at once

The botocore client is built on the first call (creating it loads the service
model, which a cold start should not pay for a provider it may never use).
"""

from __future__ import annotations

import json
import math
import random
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
)
from botocore.parsers import ResponseParserError
from pydantic import BaseModel, ConfigDict, ValidationError

from ..core import deadline
from ..core.exceptions import ProviderError, ProviderTimeout
from ..core.models import ToolCall, Usage
from ..core.strict_json import BodyError, parse, tool_arguments
from .base import (
    Message,
    ModelReply,
    ModelRequest,
    Provider,
    ResponseFormat,
    TextSink,
    ToolSpec,
)
from .call_ids import BEDROCK_CALL_ID, CallIdMap
from .history import build_strict_history
from .retry import Backoff

if TYPE_CHECKING:
    from mypy_boto3_bedrock_runtime import BedrockRuntimeClient

#: Error codes worth another attempt: Bedrock was busy or broken, not the request.
RETRYABLE_CODES = frozenset(
    {
        "ThrottlingException",
        "ServiceUnavailableException",
        "InternalServerException",
        "ModelNotReadyException",
        "TooManyRequestsException",
    }
)
#: Error codes that mean the model took too long.
TIMEOUT_CODES = frozenset({"ModelTimeoutException"})
#: Stop reasons that mean the answer is unusable.
UNUSABLE_STOP_REASONS = frozenset({"malformed_model_output", "malformed_tool_use"})
#: What a blank text becomes where Converse needs some text.
EMPTY_TEXT = "(empty)"
#: The name of the tool that carries a JSON-mode answer (a suffix is added on a clash).
JSON_TOOL_NAME = "json_answer"
#: What the JSON tool tells the model.
JSON_TOOL_DESCRIPTION = (
    "Give your final answer by calling this tool exactly once; its input is the answer, "
    "as JSON matching the schema."
)
#: Longest provider error text kept in ``ProviderError.details``.
_MESSAGE_LIMIT = 500
_TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_UNSAFE_NAME_CHARS = re.compile(r"[^a-zA-Z0-9_-]")

JsonMode = Literal["tool", "native"]
ClientFactory = Callable[[], "BedrockRuntimeClient"]
#: Most clients kept with a read timeout cut by a request's deadline (one per whole second).
MAX_TIMED_CLIENTS = 16


# --- the request ---------------------------------------------------------------------------


def _text(text: str | None) -> str:
    return text if text and text.strip() else EMPTY_TEXT


def _tool_name(name: str) -> str:
    if _TOOL_NAME.fullmatch(name):
        return name
    return _UNSAFE_NAME_CHARS.sub("_", name)[:64] or "tool"


def _blocks(message: Message, ids: CallIdMap, *, tool_blocks: bool) -> list[dict[str, Any]]:
    """The content blocks of one (non-system) message."""
    if message.role == "tool":
        if not tool_blocks:
            status = "error" if message.is_error else "result"
            return [{"text": f"[tool {status} of {message.name}: {_text(message.content)}]"}]
        result: dict[str, Any] = {
            "toolUseId": ids.result(message.tool_call_id or ""),
            "content": [{"text": _text(message.content)}],
        }
        if message.is_error:
            result["status"] = "error"
        return [{"toolResult": result}]
    blocks: list[dict[str, Any]] = []
    if message.content and message.content.strip():
        blocks.append({"text": message.content})
    for call in message.tool_calls:
        if tool_blocks:
            use = {"toolUseId": ids.call(call.id), "name": _tool_name(call.name)}
            blocks.append({"toolUse": {**use, "input": call.arguments}})
        else:
            arguments = json.dumps(call.arguments, ensure_ascii=False)
            blocks.append({"text": f"[called tool {call.name} with {arguments}]"})
    return blocks


def _messages(history: list[Message], ids: CallIdMap, *, tool_blocks: bool) -> list[Any]:
    """Converse ``messages``: one per run of same-role messages, alternating."""
    wire: list[dict[str, Any]] = []
    for message in history:
        if message.role == "system":
            continue
        role = "assistant" if message.role == "assistant" else "user"
        blocks = _blocks(message, ids, tool_blocks=tool_blocks)
        if wire and wire[-1]["role"] == role:
            wire[-1]["content"].extend(blocks)
        else:
            wire.append({"role": role, "content": blocks})
    for turn in wire:
        if not turn["content"]:
            turn["content"].append({"text": EMPTY_TEXT})
    return wire


def _has_tool_blocks(history: list[Message]) -> bool:
    return any(m.role == "tool" or m.tool_calls for m in history)


def _json_schema(response_format: ResponseFormat) -> tuple[dict[str, Any], bool]:
    """``(schema, wrapped)``: the schema a tool input can take (an object at the root)."""
    spec = response_format.json_schema or {}
    schema = spec.get("schema")
    if not isinstance(schema, dict):
        return {"type": "object"}, False
    if schema.get("type") == "object":
        return schema, False
    return {"type": "object", "properties": {"value": schema}, "required": ["value"]}, True


def _json_tool_name(tools: list[ToolSpec]) -> str:
    taken = {tool.name for tool in tools}
    name, suffix = JSON_TOOL_NAME, 1
    while name in taken:
        suffix += 1
        name = f"{JSON_TOOL_NAME}_{suffix}"
    return name


@dataclass(frozen=True)
class ConverseCall:
    """A Converse request, and what reading its answer needs to know."""

    params: dict[str, Any]
    ids: CallIdMap
    #: The tool that carries a JSON-mode answer, when JSON mode uses one.
    json_tool: str | None = None
    #: The JSON answer is ``{"value": ...}`` around a schema that is not an object.
    json_wrapped: bool = False


def converse_call(
    request: ModelRequest, *, max_tokens: int | None = None, json_mode: JsonMode = "tool"
) -> ConverseCall:
    """The ``converse`` parameters for ``request`` (see the module docstring).

    Raises:
        InvalidHistory: a bug: the messages cannot be built into a strict history.
    """
    history = build_strict_history(request.messages)
    ids = CallIdMap(BEDROCK_CALL_ID, unique=True)
    tools: list[Any] = [
        {
            "toolSpec": {
                "name": tool.name,
                **({"description": tool.description} if tool.description else {}),
                "inputSchema": {"json": tool.parameters},
            }
        }
        for tool in request.tools
    ]
    json_tool: str | None = None
    wrapped = False
    tool_choice: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None
    response_format = request.response_format
    if response_format is not None and json_mode == "tool":
        schema, wrapped = _json_schema(response_format)
        json_tool = _json_tool_name(request.tools)
        tool_choice = {"any": {}} if tools else {"tool": {"name": json_tool}}
        tools.append(
            {
                "toolSpec": {
                    "name": json_tool,
                    "description": JSON_TOOL_DESCRIPTION,
                    "inputSchema": {"json": schema},
                }
            }
        )
    elif response_format is not None:
        spec = response_format.json_schema or {}
        structure: dict[str, Any] = {
            "schema": json.dumps(spec.get("schema", {"type": "object"})),
            "name": str(spec.get("name") or "answer"),
        }
        output_config = {
            "textFormat": {"type": "json_schema", "structure": {"jsonSchema": structure}}
        }

    params: dict[str, Any] = {
        "modelId": request.model,
        "messages": _messages(history, ids, tool_blocks=bool(tools)),
    }
    if history and history[0].role == "system" and history[0].content:
        params["system"] = [{"text": history[0].content}]
    if tools:
        params["toolConfig"] = {"tools": tools}
        if tool_choice is not None:
            params["toolConfig"]["toolChoice"] = tool_choice
    if max_tokens:
        params["inferenceConfig"] = {"maxTokens": max_tokens}
    if output_config is not None:
        params["outputConfig"] = output_config
    return ConverseCall(params=params, ids=ids, json_tool=json_tool, json_wrapped=wrapped)


# --- the response, validated at the edge ---------------------------------------------------


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _ToolUse(_Lenient):
    toolUseId: str
    name: str
    input: Any = None


class _Block(_Lenient):
    text: str | None = None
    toolUse: _ToolUse | None = None


class _Message(_Lenient):
    content: list[_Block]


class _Output(_Lenient):
    message: _Message


class _Usage(_Lenient):
    inputTokens: int = 0
    outputTokens: int = 0
    #: Prompt caching: counted apart from ``inputTokens`` by Converse.
    cacheReadInputTokens: int = 0
    cacheWriteInputTokens: int = 0

    def usage(self) -> Usage:
        """As :class:`Usage`, whose ``input_tokens`` include the cache's reads and writes."""
        read, written = self.cacheReadInputTokens, self.cacheWriteInputTokens
        return Usage(
            input_tokens=self.inputTokens + read + written,
            output_tokens=self.outputTokens,
            cached_input_tokens=read,
            cache_write_input_tokens=written,
        )


class _Converse(_Lenient):
    output: _Output
    usage: _Usage | None = None
    stopReason: str | None = None


def parse_reply(response: Any, call: ConverseCall, model: str) -> ModelReply:
    """Map a ``converse`` response to a :class:`ModelReply`.

    Raises:
        ProviderError: the response is not usable (no message, malformed output).
    """
    try:
        parsed = _Converse.model_validate(response)
    except ValidationError as exc:
        raise ProviderError(
            "the model provider answered with an unusable body",
            details={"reason": "invalid_response", "errors": exc.error_count()},
        ) from exc
    if parsed.stopReason in UNUSABLE_STOP_REASONS:
        raise ProviderError(
            "the model produced an unusable answer",
            details={"reason": "invalid_response", "stop_reason": parsed.stopReason},
        )
    texts: list[str] = []
    calls: list[ToolCall] = []
    json_answer: str | None = None
    for block in parsed.output.message.content:
        if block.text is not None:
            texts.append(block.text)
        elif block.toolUse is not None:
            use = block.toolUse
            if use.name == call.json_tool and json_answer is None:
                value = use.input
                if call.json_wrapped and isinstance(value, dict):
                    value = value.get("value")
                json_answer = json.dumps(value, ensure_ascii=False)
                continue
            call_id = call.ids.canonical(use.toolUseId)
            # ``input`` is a JSON value (a string is a string, not text to parse).
            if isinstance(use.input, dict):
                arguments, raw = tool_arguments(use.input)
            else:
                arguments, raw = {}, json.dumps(use.input, ensure_ascii=False)
            calls.append(
                ToolCall(id=call_id, name=use.name, arguments=arguments, raw_arguments=raw)
            )
    text = "".join(texts) if texts else None
    if json_answer is not None:
        # The JSON is the answer; text the model wrote around the forced call is not.
        text = json_answer
    usage = parsed.usage or _Usage()
    return ModelReply(
        text=text,
        tool_calls=calls,
        usage=usage.usage(),
        model=model,
    )


# --- errors ------------------------------------------------------------------------------


def _failure(exc: Exception) -> tuple[ProviderError, bool]:
    """The error to raise for ``exc``, and whether another attempt may help."""
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        details = {
            "status": status,
            "provider_code": code,
            "provider_message": str(error.get("Message", ""))[:_MESSAGE_LIMIT],
        }
        if code in TIMEOUT_CODES:
            return ProviderTimeout("the model did not answer in time", details=details), True
        retry = code in RETRYABLE_CODES or status >= 500
        return ProviderError(f"the model provider answered {status}", details=details), retry
    name = type(exc).__name__
    if isinstance(exc, ReadTimeoutError | ConnectTimeoutError):
        details = {"reason": "timeout", "error": name}
        return ProviderTimeout("the model provider did not answer in time", details=details), True
    if isinstance(exc, EndpointConnectionError | ConnectionClosedError):
        details = {"reason": "connection_failed", "error": name}
        return ProviderError("could not reach the model provider", details=details), True
    details = {"reason": "request_failed", "error": name}
    return ProviderError("could not call the model provider", details=details), False


# --- the provider -------------------------------------------------------------------------


class BedrockConverseProvider(Provider):
    """A model on Amazon Bedrock, through the Converse API (``bedrock-converse``)."""

    name = "bedrock-converse"

    def __init__(
        self,
        *,
        region: str | None = None,
        endpoint_url: str | None = None,
        client: BedrockRuntimeClient | None = None,
        client_factory: ClientFactory | None = None,
        timeout_seconds: float = 60.0,
        max_retries: int = 2,
        max_tokens: int | None = None,
        json_mode: JsonMode = "tool",
        backoff_seconds: float = 0.5,
        max_backoff_seconds: float = 8.0,
        sleep: Callable[[float], None] = time.sleep,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        """Build the provider; no client is created and nothing is sent yet.

        Args:
            region: the AWS region of Bedrock (default: the environment's).
            endpoint_url: another endpoint (tests, VPC endpoints).
            client: a ready ``bedrock-runtime`` client (tests: a Stubber's).
            client_factory: builds the client on the first call (default: botocore,
                with ``region``, ``endpoint_url``, the timeouts and no retries).
            timeout_seconds: per attempt (botocore's read timeout).
            max_retries: attempts after the first, for retryable failures only.
            max_tokens: ``inferenceConfig.maxTokens``; ``None``: the model's default.
            json_mode: how JSON mode is asked for (see the module docstring).
            backoff_seconds: the first backoff; it doubles on each retry.
            max_backoff_seconds: cap of any wait.
            sleep: waits between attempts (tests pass a recorder).
            jitter: a number in ``[0, 1)``; a wait is ``backoff * (0.5 + jitter / 2)``.
        """
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        self.region = region
        self.endpoint_url = endpoint_url
        self.timeout_seconds = timeout_seconds
        self.max_retries = max_retries
        self.max_tokens = max_tokens
        self.json_mode: JsonMode = json_mode
        self._client = client
        self._client_factory = client_factory or self._aws_client
        self._client_lock = threading.Lock()
        # botocore fixes a client's read timeout when it is built; an attempt that must end
        # sooner (the request's deadline) takes a client built for that many whole seconds.
        # Only for clients this provider builds itself: a given client is used as it is.
        self._timed_clients: dict[int, BedrockRuntimeClient] = {}
        self._builds_clients = client is None and client_factory is None
        self._backoff = Backoff(backoff_seconds, max_backoff_seconds, sleep, jitter)

    @property
    def client(self) -> BedrockRuntimeClient:
        """The ``bedrock-runtime`` client, built on first use."""
        if self._client is None:
            with self._client_lock:
                if self._client is None:
                    self._client = self._client_factory()
        return self._client

    def _aws_client(self, timeout_seconds: float | None = None) -> BedrockRuntimeClient:
        from botocore.config import Config

        from ..core.aws import AwsSession

        timeout = self.timeout_seconds if timeout_seconds is None else timeout_seconds
        config = Config(
            connect_timeout=min(timeout, 10.0),
            read_timeout=timeout,
            # One retry policy, ours: botocore's would multiply the attempts.
            retries={"total_max_attempts": 1, "mode": "standard"},
        )
        client: BedrockRuntimeClient = AwsSession().client(
            "bedrock-runtime",
            region_name=self.region,
            endpoint_url=self.endpoint_url,
            config=config,
        )
        return client

    def complete(self, request: ModelRequest) -> ModelReply:
        """Send ``request`` to ``converse`` and return the model's reply.

        Bedrock keeps no state: a ``continuation`` is ignored and the whole
        context is sent (``provider_state`` ``fresh``).

        Raises:
            InvalidHistory: a bug: the messages cannot be built into a strict history.
            ProviderTimeout: the last attempt allowed timed out.
            ProviderError: Bedrock failed, refused the request, or answered
                something unusable.
        """
        call = converse_call(request, max_tokens=self.max_tokens, json_mode=self.json_mode)
        response, _ = self._send("converse", call.params)
        return parse_reply(response, call, request.model)

    def stream(self, request: ModelRequest, on_text: TextSink) -> ModelReply:
        """Send ``request`` to ``converse_stream``; hand each text delta to ``on_text``.

        The events (content block starts and deltas, the stop reason, the usage
        metadata) are assembled into the ``converse`` response they stand for and
        mapped by :func:`parse_reply`. In JSON tool mode the answer is the forced
        tool's input, handed over whole at the end. Only the call that opens the
        stream is retried; an error event or a broken stream fails the call.

        Raises:
            ProviderTimeout, ProviderError: as :meth:`complete`.
        """
        call = converse_call(request, max_tokens=self.max_tokens, json_mode=self.json_mode)
        sink = on_text if call.json_tool is None else None
        opened, attempt = self._send("converse_stream", call.params)
        try:
            response = _assemble(opened["stream"], sink)
        except ProviderError as exc:
            exc.details["attempts"] = attempt
            raise
        except (ClientError, BotoCoreError) as exc:
            error, _ = _failure(exc)  # the answer had begun: never sent again
            error.details["attempts"] = attempt
            raise error from exc
        reply = parse_reply(response, call, request.model)
        if sink is None and reply.text:
            on_text(reply.text)
        return reply

    def _send(
        self, operation: Literal["converse", "converse_stream"], params: dict[str, Any]
    ) -> tuple[Any, int]:
        """Call ``operation`` with bounded retries (throttling, 5xx, timeouts) while the
        request's deadline allows; returns the answer and the attempts it took.

        Raises:
            ProviderTimeout, ProviderError: as :meth:`complete`.
        """
        attempt = 0
        while True:
            attempt += 1
            client = self._client_for_attempt(attempt)
            try:
                return getattr(client, operation)(**params), attempt
            except ResponseParserError as exc:
                raise ProviderError(
                    "the model provider answered with an unusable body",
                    details={"reason": "invalid_response", "attempts": attempt},
                ) from exc
            except (ClientError, BotoCoreError) as exc:
                error, retry = _failure(exc)
                left = deadline.remaining()
                if not retry or attempt > self.max_retries or (left is not None and left <= 0):
                    error.details["attempts"] = attempt
                    raise error from exc
                self._backoff.wait(attempt)

    def _client_for_attempt(self, attempt: int) -> BedrockRuntimeClient:
        """The client for one attempt, its read timeout cut to the request's time left.

        Raises:
            ProviderTimeout: the request's time is spent; nothing is sent.
            ProviderError: the client cannot be built.
        """
        timeout = deadline.cap(self.timeout_seconds)
        if timeout is not None and timeout <= 0:
            # Answer 504 now rather than be cut off by Lambda's timeout mid-call.
            raise ProviderTimeout(
                "the request ran out of time before the model answered",
                details={"reason": "deadline", "attempts": attempt},
            )
        if timeout is None or timeout >= self.timeout_seconds or not self._builds_clients:
            return self._build_client()
        return self._build_client(max(1, math.floor(timeout)))

    def timed_client(self, seconds: int) -> BedrockRuntimeClient:
        """The cached client whose read timeout is ``seconds`` (built on first use).

        A request's deadline takes the whole seconds it has left (at least 1; the
        deadline's margin covers the part of a second over): at most one client per
        second of the configured timeout, and :data:`MAX_TIMED_CLIENTS` in all.
        """
        with self._client_lock:
            client = self._timed_clients.get(seconds)
            if client is None:
                if len(self._timed_clients) >= MAX_TIMED_CLIENTS:
                    self._timed_clients.pop(next(iter(self._timed_clients)))
                client = self._aws_client(float(seconds))
                self._timed_clients[seconds] = client
            return client

    def _build_client(self, timed_seconds: int | None = None) -> BedrockRuntimeClient:
        try:
            return self.client if timed_seconds is None else self.timed_client(timed_seconds)
        except (BotoCoreError, ValueError) as exc:  # no region, a bad endpoint URL
            raise ProviderError(
                "could not set up the Bedrock client",
                details={"reason": "client_unavailable", "error": type(exc).__name__},
            ) from exc


def _assemble(events: Any, on_text: TextSink | None) -> dict[str, Any]:
    """The ``converse`` response a ``converse_stream`` event stream stands for.

    Raises:
        ProviderError: an exception event, or a stream that ends before ``messageStop``.
        ClientError, BotoCoreError: botocore's, from reading the stream.
    """
    blocks: dict[int, dict[str, Any]] = {}
    stop_reason: str | None = None
    usage: dict[str, Any] | None = None
    for event in events:
        if "contentBlockStart" in event:
            start = event["contentBlockStart"]
            use = (start.get("start") or {}).get("toolUse")
            if use is not None:
                blocks[int(start.get("contentBlockIndex", len(blocks)))] = {
                    "toolUse": {"toolUseId": use.get("toolUseId"), "name": use.get("name")},
                    "input": "",
                }
        elif "contentBlockDelta" in event:
            part = event["contentBlockDelta"]
            index = int(part.get("contentBlockIndex", 0))
            delta = part.get("delta") or {}
            if "text" in delta:
                block = blocks.setdefault(index, {"text": ""})
                block["text"] = block.get("text", "") + delta["text"]
                if on_text is not None and delta["text"]:
                    on_text(delta["text"])
            elif "toolUse" in delta:
                block = blocks.setdefault(index, {"toolUse": {}, "input": ""})
                block["input"] += (delta["toolUse"] or {}).get("input", "")
        elif "messageStop" in event:
            stop_reason = event["messageStop"].get("stopReason")
        elif "metadata" in event:
            usage = event["metadata"].get("usage")
        elif any(name.endswith("Exception") for name in event):
            # An exception event (the model failed mid-answer); botocore may raise instead.
            failure = next(name for name in event if name.endswith("Exception"))
            raise ProviderError(
                "the model provider failed while streaming",
                details={
                    "reason": "stream_error",
                    "provider_code": failure,
                    "provider_message": str((event.get(failure) or {}).get("message", ""))[
                        :_MESSAGE_LIMIT
                    ],
                },
            )
    if stop_reason is None:
        raise ProviderError(
            "the model provider's stream ended before it was done",
            details={"reason": "stream_incomplete"},
        )
    content: list[dict[str, Any]] = []
    for index in sorted(blocks):
        block = blocks[index]
        if "toolUse" in block:
            raw = block["input"] or "{}"
            try:
                value: Any = parse(raw, "the arguments' JSON")
            except BodyError:
                value = raw  # kept as the call's raw arguments by parse_reply
            content.append({"toolUse": {**block["toolUse"], "input": value}})
        else:
            content.append({"text": block.get("text", "")})
    return {
        "output": {"message": {"role": "assistant", "content": content}},
        "stopReason": stop_reason,
        "usage": usage or {"inputTokens": 0, "outputTokens": 0, "totalTokens": 0},
    }
