"""OpenAI's Responses API over httpx (``POST /responses``), with its stored state as a cache.

The working context maps to Responses input items: user and assistant
``message`` items, ``function_call`` items for the assistant's tool calls and
``function_call_output`` items for their results, with the call ids
(:mod:`turnledger.providers.call_ids`). Every system message (the system
prompt, a summary) goes in ``instructions``, on every request: the API does
not carry instructions over from a previous response. Tools go as
``function`` tools with ``strict: false`` (the API's default is strict, which
refuses most hand-written schemas), on every request too. JSON mode is
``text.format``.

Stored state::

    request.store                 -> "store": true; reply.response_id is the response's id
    request.continuation          -> "previous_response_id" + only messages[new_from:]
                                     -> reply.provider_state = "continued"
    the provider says it is gone  -> the whole context again, in the same call
                                     -> reply.provider_state = "fallback"

"Gone" is a ``404``, or a ``400`` whose error is about ``previous_response_id``
(OpenAI answers ``{"error": {"code": "previous_response_not_found", "param":
"previous_response_id", "message": "Previous response with id '...' not
found."}}``; compatible servers word it their own way). Reading the state as
gone when it is not costs one resend of the whole context, which then fails
with the real error if there is one; so the test is deliberately broad.

Failures are mapped as :mod:`turnledger.providers.openai_http` tables it; an
unusable 2xx body, or a response whose ``status`` is ``failed``, is a
``ProviderError`` (502) at once.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..core.exceptions import ProviderError
from ..core.models import ToolCall, Usage
from ..core.observability import logger
from ..core.strict_json import tool_arguments
from .base import (
    Message,
    ModelReply,
    ModelRequest,
    ProviderState,
    ResponseFormat,
    TextSink,
    ToolSpec,
)
from .call_ids import OPENAI_RESPONSES_CALL_ID, CallIdMap
from .history import MERGE_SEPARATOR, build_strict_history, normalize_history
from .openai_chat import arguments_text, json_instruction
from .openai_http import OpenAIStyleProvider, error_body, sse_events

#: Retries of one ``DELETE /responses/{id}`` (a clear must not wait long on them).
DELETE_MAX_RETRIES = 2
#: Per-attempt timeout of a delete, seconds.
DELETE_TIMEOUT_SECONDS = 10.0


# --- the request ---------------------------------------------------------------------------


def _items(messages: list[Message], ids: CallIdMap) -> list[dict[str, Any]]:
    """The input items of the (non-system) ``messages``, calls and results with wire ids."""
    items: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "system":
            continue
        if message.role == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": ids.result(message.tool_call_id or ""),
                    "output": message.content or "",
                }
            )
            continue
        if message.content or not message.tool_calls:
            items.append(
                {"type": "message", "role": message.role, "content": message.content or ""}
            )
        for call in message.tool_calls:
            items.append(
                {
                    "type": "function_call",
                    "call_id": ids.call(call.id),
                    "name": call.name,
                    "arguments": arguments_text(call),
                }
            )
    return items


def _tool(tool: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "name": tool.name,
        "description": tool.description,
        "parameters": tool.parameters,
        "strict": False,
    }


def _text_format(response_format: ResponseFormat) -> dict[str, Any]:
    if response_format.type == "json_schema":
        # Chat's {"json_schema": {name, schema, strict}} is flat in the Responses API.
        return {"type": "json_schema", **(response_format.json_schema or {})}
    return {"type": "json_object"}


def _instructions(history: list[Message], request: ModelRequest) -> str | None:
    system = history[0].content if history and history[0].role == "system" else None
    texts = [text for text in (system, json_instruction(request)) if text]
    return MERGE_SEPARATOR.join(texts) if texts else None


def request_body(request: ModelRequest, *, store: bool, continued: bool) -> dict[str, Any]:
    """The JSON body of ``POST /responses`` for ``request``.

    Args:
        request: the call; its ``continuation`` is used only when ``continued``.
        store: ask the provider to keep this response.
        continued: send ``previous_response_id`` and only the new messages.

    Raises:
        InvalidHistory: a bug: the messages cannot be built into a strict history.
    """
    history = build_strict_history(request.messages)
    ids = CallIdMap(OPENAI_RESPONSES_CALL_ID)
    body: dict[str, Any] = {"model": request.model}
    continuation = request.continuation if continued else None
    if continuation is None:
        body["input"] = _items(history, ids)
    else:
        # Map the ids of what the stored response already holds first, so the
        # new results name their calls exactly as the earlier requests did.
        _items(normalize_history(request.messages[: continuation.new_from]), ids)
        body["previous_response_id"] = continuation.previous_response_id
        body["input"] = _items(normalize_history(request.messages[continuation.new_from :]), ids)
    instructions = _instructions(history, request)
    if instructions is not None:
        body["instructions"] = instructions
    if request.tools:
        body["tools"] = [_tool(tool) for tool in request.tools]
    body["store"] = store
    if request.response_format is not None:
        body["text"] = {"format": _text_format(request.response_format)}
    return body


# --- the response, validated at the edge ---------------------------------------------------


class _Lenient(BaseModel):
    # Servers add fields and item types freely (reasoning, web search): ignore them.
    model_config = ConfigDict(extra="ignore")


class _Content(_Lenient):
    type: str = ""
    text: str | None = None
    refusal: str | None = None


class _OutputItem(_Lenient):
    type: str
    content: list[_Content] | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | dict[str, Any] | None = None


class _InputDetails(_Lenient):
    cached_tokens: int | None = None


class _Usage(_Lenient):
    input_tokens: int | None = None
    output_tokens: int | None = None
    input_tokens_details: _InputDetails | None = None


class _Error(_Lenient):
    message: str = ""
    code: str | None = None


class _Response(_Lenient):
    id: str = Field(min_length=1)
    status: str | None = None
    model: str | None = None
    output: list[_OutputItem]
    usage: _Usage | None = None
    error: _Error | None = None


def _unusable(reason: str, **details: Any) -> ProviderError:
    return ProviderError(
        "the model provider answered with an unusable body",
        details={"reason": reason, **details},
    )


def _tool_call(item: _OutputItem) -> ToolCall:
    if not item.call_id or not item.name:
        raise _unusable("invalid_response", item="function_call without call_id or name")
    arguments, raw = tool_arguments(item.arguments)
    return ToolCall(id=item.call_id, name=item.name, arguments=arguments, raw_arguments=raw)


def parse_reply(payload: bytes, fallback_model: str) -> tuple[str, ModelReply]:
    """``(response id, reply)`` of a Responses API body.

    Raises:
        ProviderError: the body is not a usable response, or its status is ``failed``.
    """
    try:
        response = _Response.model_validate_json(payload)
    except ValidationError as exc:
        raise _unusable("invalid_response", errors=exc.error_count()) from exc
    if response.status == "failed":
        error = response.error or _Error()
        raise ProviderError(
            "the model provider failed the response",
            details={"reason": "response_failed", "provider_message": error.message[:500]},
        )
    texts: list[str] = []
    calls: list[ToolCall] = []
    for item in response.output:
        if item.type == "message":
            for part in item.content or []:
                if part.type == "output_text" and part.text is not None:
                    texts.append(part.text)
                elif part.type == "refusal" and part.refusal is not None:
                    texts.append(part.refusal)
        elif item.type == "function_call":
            calls.append(_tool_call(item))
    usage = response.usage or _Usage()
    reply = ModelReply(
        text="".join(texts) if texts else None,
        tool_calls=calls,
        usage=Usage(
            input_tokens=usage.input_tokens or 0,
            output_tokens=usage.output_tokens or 0,
            cached_input_tokens=(usage.input_tokens_details or _InputDetails()).cached_tokens or 0,
        ),
        model=response.model or fallback_model,
    )
    return response.id, reply


def state_gone(response: httpx.Response) -> bool:
    """Whether an error answer says the ``previous_response_id`` is unknown (see the module)."""
    if response.status_code == 404:
        return True
    if response.status_code != 400:
        return False
    error = error_body(response)
    message = error.message.lower()
    return (
        error.code == "previous_response_not_found"
        or error.param == "previous_response_id"
        or "previous_response_id" in message
        or "previous response" in message
    )


# --- the provider -------------------------------------------------------------------------


class OpenAIResponsesProvider(OpenAIStyleProvider):
    """A model behind an OpenAI-compatible ``/responses`` endpoint (``openai-responses``).

    Constructor arguments: those of
    :class:`~turnledger.providers.openai_http.OpenAIStyleProvider`, plus
    ``store`` (default ``True``): ``False`` never lets the provider keep a
    response, whatever the request asks (a deployment that must keep no
    conversation data at the provider).
    """

    name = "openai-responses"
    stateful = True

    def __init__(self, *, store: bool = True, **options: Any) -> None:
        """See the class docstring."""
        super().__init__(**options)
        self.store = store

    @property
    def url(self) -> str:
        """Where requests go: ``{base_url}/responses``."""
        return self.base_url + "/responses"

    def complete(self, request: ModelRequest) -> ModelReply:
        """Send ``request`` (over the stored state when it has a continuation).

        Returns:
            The reply, with ``response_id`` when the response was stored and
            ``provider_state`` saying how the context was sent.

        Raises:
            InvalidHistory: a bug: the messages cannot be built into a strict history.
            ProviderTimeout: the last attempt allowed timed out.
            ProviderError: the provider failed, refused the request, or answered
                something unusable.
        """
        response, state, store = self._post(request, stream=False)
        response_id, reply = parse_reply(response.content, request.model)
        return reply.model_copy(
            update={"response_id": response_id if store else None, "provider_state": state}
        )

    def stream(self, request: ModelRequest, on_text: TextSink) -> ModelReply:
        """As :meth:`complete`, with ``stream: true``: text deltas go to ``on_text``.

        The reply is the ``response.completed`` event's response, mapped as
        :func:`parse_reply` maps a whole one; stored state that proved gone is a
        ``fallback`` as in :meth:`complete` (decided before any text arrives).

        Raises:
            ProviderTimeout, ProviderError: as :meth:`complete`; also a stream that
                breaks off, ends before ``response.completed``, or reports a failure.
        """
        response, state, store = self._post(request, stream=True)
        try:
            response_id, reply = parse_stream(sse_events(response), request.model, on_text)
        finally:
            response.close()
        return reply.model_copy(
            update={"response_id": response_id if store else None, "provider_state": state}
        )

    def _post(
        self, request: ModelRequest, *, stream: bool
    ) -> tuple[httpx.Response, ProviderState, bool]:
        """POST ``request`` over the stored state when it has a continuation, and once
        more with the whole context (``fallback``) when that state proved gone.

        Returns:
            The successful response (open, for a stream), how the context was sent,
            and whether the response is stored.
        """
        store = request.store and self.store
        continued = request.continuation is not None
        extra = {"stream": True} if stream else {}
        body = request_body(request, store=store, continued=continued)
        key = self.resolve_key()
        state: ProviderState = "continued" if continued else "fresh"
        response = self.send(
            "POST",
            self.url,
            key=key,
            body={**body, **extra},
            accept=state_gone if continued else None,
            stream=stream,
        )
        if not response.is_success:
            # The stored state is gone (expired, deleted, never stored): the whole context.
            state = "fallback"
            body = request_body(request, store=store, continued=False)
            response = self.send("POST", self.url, key=key, body={**body, **extra}, stream=stream)
        return response, state, store

    def delete_state(self, response_ids: list[str]) -> int:
        """``DELETE /responses/{id}`` for each id, best effort; how many were deleted.

        A ``404`` is a response already gone (not counted). Retryable failures
        are retried :data:`DELETE_MAX_RETRIES` times, then left: the provider
        expires stored responses on its own. Never raises.
        """
        if not response_ids:
            return 0
        try:
            key = self.resolve_key()
        except ProviderError as exc:
            logger.warning("provider state not deleted: no API key", extra=exc.details)
            return 0
        deleted = 0
        for response_id in response_ids:
            url = f"{self.url}/{quote(response_id, safe='')}"
            try:
                response = self.send(
                    "DELETE",
                    url,
                    key=key,
                    accept=_not_found,
                    max_retries=DELETE_MAX_RETRIES,
                    timeout=httpx.Timeout(DELETE_TIMEOUT_SECONDS),
                )
            except ProviderError as exc:
                logger.warning(
                    "provider state not deleted",
                    extra={"response_id": response_id, **exc.details},
                )
                continue
            except Exception:  # best effort: a clear must never fail on this
                logger.exception("provider state not deleted", extra={"response_id": response_id})
                continue
            if response.is_success:
                deleted += 1
        return deleted


def _not_found(response: httpx.Response) -> bool:
    return response.status_code == 404


def parse_stream(
    events: Iterator[tuple[str | None, str]], fallback_model: str, on_text: TextSink
) -> tuple[str, ModelReply]:
    """``(response id, reply)`` of a streamed response: deltas to ``on_text``, the reply
    from ``response.completed``.

    Raises:
        ProviderError: an ``error``/``response.failed`` event, a chunk that is not JSON,
            or a stream that ends before ``response.completed``.
    """
    for event, data in events:
        try:
            payload = json.loads(data)
        except ValueError as exc:
            raise _unusable("invalid_response") from exc
        kind = (payload.get("type") if isinstance(payload, dict) else None) or event
        if not isinstance(payload, dict):
            continue
        if kind in ("response.output_text.delta", "response.refusal.delta"):
            delta = payload.get("delta")
            if isinstance(delta, str) and delta:
                on_text(delta)
        elif kind in ("response.completed", "response.failed", "response.incomplete"):
            whole = payload.get("response")
            if not isinstance(whole, dict):
                raise _unusable("invalid_response")
            return parse_reply(json.dumps(whole).encode(), fallback_model)
        elif kind == "error":
            raise ProviderError(
                "the model provider failed while streaming",
                details={
                    "reason": "stream_error",
                    "provider_message": str(payload.get("message", ""))[:500],
                },
            )
    raise ProviderError(
        "the model provider's stream ended before it was done",
        details={"reason": "stream_incomplete"},
    )
