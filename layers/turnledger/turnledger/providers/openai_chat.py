"""OpenAI-compatible Chat Completions over httpx (OpenAI, OpenRouter, vLLM, Ollama).

The request body is what the official ``openai`` package sends for the same
conversation (``tests/functional/test_openai_chat.py`` holds the two side by
side), so any server that works with that package works here, without the
package's import cost on a Lambda cold start.

Failures are mapped at this boundary::

    httpx.TimeoutException       -> retried, then ProviderTimeout (504)
    httpx network errors         -> retried, then ProviderError (502)
    408 / 409 / 429 / 5xx        -> retried, then ProviderError (502)
    other 4xx, unusable 2xx body -> ProviderError (502) at once

``ProviderError.details`` carries the HTTP status and the provider's own error
message, with the API key scrubbed from it.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any, Literal, NotRequired, TypedDict

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..exceptions import ProviderError, ProviderTimeout
from ..models import ToolCall, Usage
from .base import Message, ModelReply, ModelRequest, Provider, ToolSpec
from .history import check_strict_history

#: Statuses worth another attempt: the server was busy, throttled or broken, not the request.
RETRYABLE_STATUSES = frozenset({408, 409, 429})
#: Longest the provider's error text kept in ``ProviderError.details``.
_MESSAGE_LIMIT = 500

ApiKeyProvider = Callable[[], str | None]


# --- the request, in the wire shape -------------------------------------------------------


class _WireFunctionCall(TypedDict):
    name: str
    arguments: str


class _WireToolCall(TypedDict):
    id: str
    type: Literal["function"]
    function: _WireFunctionCall


class _WireMessage(TypedDict):
    role: str
    content: str | None
    tool_calls: NotRequired[list[_WireToolCall]]
    tool_call_id: NotRequired[str]


class _WireFunction(TypedDict):
    name: str
    description: str
    parameters: dict[str, Any]


class _WireTool(TypedDict):
    type: Literal["function"]
    function: _WireFunction


def _wire_message(message: Message) -> _WireMessage:
    if message.role == "tool":
        return {
            "role": "tool",
            "tool_call_id": message.tool_call_id or "",
            "content": message.content or "",
        }
    if message.role == "assistant" and message.tool_calls:
        return {
            "role": "assistant",
            "content": message.content,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {
                        "name": call.name,
                        # The parsed arguments, not raw_arguments: a call whose text was
                        # not a JSON object was answered with an error, and echoing the
                        # broken text makes some servers reject the whole history.
                        "arguments": json.dumps(call.arguments, ensure_ascii=False),
                    },
                }
                for call in message.tool_calls
            ],
        }
    return {"role": message.role, "content": message.content or ""}


def _wire_tool(tool: ToolSpec) -> _WireTool:
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
        },
    }


def request_body(request: ModelRequest) -> dict[str, Any]:
    """The JSON body of ``POST /chat/completions`` for ``request``."""
    body: dict[str, Any] = {
        "model": request.model,
        "messages": [_wire_message(message) for message in request.messages],
    }
    if request.tools:
        body["tools"] = [_wire_tool(tool) for tool in request.tools]
    return body


# --- the response, validated at the edge ---------------------------------------------------


class _Lenient(BaseModel):
    # Servers add fields freely (logprobs, reasoning, provider names): ignore them.
    model_config = ConfigDict(extra="ignore")


class _ReplyFunction(_Lenient):
    name: str = Field(min_length=1)
    arguments: str | dict[str, Any] | None = None


class _ReplyToolCall(_Lenient):
    id: str = Field(min_length=1)
    function: _ReplyFunction


class _ContentPart(_Lenient):
    text: str = ""


class _ReplyMessage(_Lenient):
    content: str | list[_ContentPart] | None = None
    refusal: str | None = None
    tool_calls: list[_ReplyToolCall] | None = None


class _Choice(_Lenient):
    message: _ReplyMessage


class _ReplyUsage(_Lenient):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class _Completion(_Lenient):
    choices: list[_Choice] = Field(min_length=1)
    usage: _ReplyUsage | None = None
    model: str | None = None


def _tool_call(wire: _ReplyToolCall) -> ToolCall:
    raw = wire.function.arguments
    if isinstance(raw, dict):
        return ToolCall(id=wire.id, name=wire.function.name, arguments=raw)
    # Some servers send "" for a call without arguments: that is an empty object.
    if raw is None or not raw.strip():
        return ToolCall(id=wire.id, name=wire.function.name, arguments={})
    try:
        parsed = json.loads(raw)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        return ToolCall(id=wire.id, name=wire.function.name, arguments=parsed)
    return ToolCall(id=wire.id, name=wire.function.name, arguments={}, raw_arguments=raw)


def parse_reply(payload: bytes, fallback_model: str) -> ModelReply:
    """Map a Chat Completions response body to a :class:`ModelReply`.

    Raises:
        ProviderError: the body is not a usable chat completion.
    """
    try:
        completion = _Completion.model_validate_json(payload)
    except ValidationError as exc:
        raise ProviderError(
            "the model provider answered with an unusable body",
            details={"reason": "invalid_response", "errors": exc.error_count()},
        ) from exc
    message = completion.choices[0].message
    content = message.content
    if isinstance(content, list):
        content = "".join(part.text for part in content)
    usage = completion.usage or _ReplyUsage()
    return ModelReply(
        text=content if content is not None else message.refusal,
        tool_calls=[_tool_call(call) for call in message.tool_calls or []],
        usage=Usage(
            input_tokens=usage.prompt_tokens or 0,
            output_tokens=usage.completion_tokens or 0,
        ),
        model=completion.model or fallback_model,
    )


# --- errors and backoff ---------------------------------------------------------------------


def _provider_message(response: httpx.Response) -> str:
    """The provider's own error text: ``error.message`` of its JSON body, else the body."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:_MESSAGE_LIMIT]
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])[:_MESSAGE_LIMIT]
        if isinstance(error, str):
            return error[:_MESSAGE_LIMIT]
    return response.text[:_MESSAGE_LIMIT]


def _retry_after(response: httpx.Response) -> float | None:
    """Seconds the server asked us to wait (``retry-after-ms`` or ``Retry-After``), if any."""
    millis = response.headers.get("retry-after-ms")
    if millis is not None:
        try:
            return max(float(millis) / 1000, 0.0)
        except ValueError:
            pass
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)


def _retryable(status: int) -> bool:
    return status in RETRYABLE_STATUSES or status >= 500


@dataclass(frozen=True)
class _Failure:
    """Why one attempt failed: the error to raise if it was the last one."""

    error: ProviderError
    retry: bool
    #: Seconds the server asked us to wait before the next attempt.
    wait: float | None = None


class OpenAIChatProvider(Provider):
    """A model behind an OpenAI-compatible ``/chat/completions`` endpoint (``openai-chat``)."""

    name = "openai-chat"

    def __init__(
        self,
        *,
        base_url: str,
        api_key: ApiKeyProvider | None = None,
        client: httpx.Client | None = None,
        transport: httpx.BaseTransport | None = None,
        timeout_seconds: float = 60.0,
        max_retries: int = 2,
        backoff_seconds: float = 0.5,
        max_backoff_seconds: float = 8.0,
        sleep: Callable[[float], None] = time.sleep,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        """Build the provider; nothing is sent and no key is resolved yet.

        Args:
            base_url: the API root, e.g. ``https://openrouter.ai/api/v1``.
            api_key: returns the API key, called on each request (cache inside it);
                ``None``, or a ``None`` key, sends no ``Authorization`` header.
            client: the HTTP client to use (kept open across calls); built from
                ``transport`` when not given.
            transport: the transport of the client built here (tests).
            timeout_seconds: per attempt.
            max_retries: attempts after the first, for retryable failures only.
            backoff_seconds: the first backoff; it doubles on each retry.
            max_backoff_seconds: cap of any wait, ``Retry-After`` included.
            sleep: waits between attempts (tests pass a recorder).
            jitter: a number in ``[0, 1)``; a wait is ``backoff * (0.5 + jitter / 2)``.
        """
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self._api_key = api_key
        self._client = client or httpx.Client(transport=transport)
        self._timeout = httpx.Timeout(timeout_seconds)
        self.max_retries = max_retries
        self._backoff = backoff_seconds
        self._max_backoff = max_backoff_seconds
        self._sleep = sleep
        self._jitter = jitter

    def complete(self, request: ModelRequest) -> ModelReply:
        """Send ``request`` and return the model's reply.

        Raises:
            InvalidHistory: the messages break the strict history rules; nothing was sent.
            ProviderTimeout: the last attempt allowed timed out.
            ProviderError: the provider failed, refused the request, or answered
                something unusable.
        """
        check_strict_history(request.messages)
        key = self._resolve_key()
        headers = {"Accept": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        body = request_body(request)

        attempt = 0
        while True:
            attempt += 1
            outcome = self._attempt(body, headers, key)
            if isinstance(outcome, bytes):
                return parse_reply(outcome, request.model)
            if not outcome.retry or attempt > self.max_retries:
                outcome.error.details["attempts"] = attempt
                raise outcome.error
            self._sleep(self._wait(attempt, outcome.wait))

    def _resolve_key(self) -> str | None:
        if self._api_key is None:
            return None
        try:
            key = self._api_key()
        except Exception as exc:  # any key source failure is one provider failure
            raise ProviderError(
                "could not resolve the model provider's API key",
                details={"reason": "api_key_unavailable", "error": type(exc).__name__},
            ) from exc
        return key.strip() if key else None

    def _attempt(
        self, body: dict[str, Any], headers: dict[str, str], key: str | None
    ) -> bytes | _Failure:
        """One POST: the 2xx body, or why it failed and whether to try again."""
        try:
            response = self._client.post(
                self.url, json=body, headers=headers, timeout=self._timeout
            )
        except httpx.TimeoutException as exc:
            error: ProviderError = ProviderTimeout(
                "the model provider did not answer in time",
                details={"reason": "timeout", "error": type(exc).__name__},
            )
            return _Failure(error, retry=True)
        except (httpx.NetworkError, httpx.RemoteProtocolError) as exc:
            error = ProviderError(
                "could not reach the model provider",
                details={"reason": "connection_failed", "error": type(exc).__name__},
            )
            return _Failure(error, retry=True)
        except httpx.HTTPError as exc:
            error = ProviderError(
                "could not call the model provider",
                details={"reason": "request_failed", "error": type(exc).__name__},
            )
            return _Failure(error, retry=False)

        if response.is_success:
            return response.content
        message = _provider_message(response)
        if key:
            message = message.replace(key, "***")
        error = ProviderError(
            f"the model provider answered {response.status_code}",
            details={"status": response.status_code, "provider_message": message},
        )
        return _Failure(error, retry=_retryable(response.status_code), wait=_retry_after(response))

    def _wait(self, attempt: int, asked: float | None) -> float:
        """Seconds before attempt ``attempt + 1``: what the server asked, else backoff."""
        if asked is not None:
            return min(asked, self._max_backoff)
        ceiling = min(self._backoff * 2.0 ** (attempt - 1), self._max_backoff)
        return ceiling * (0.5 + self._jitter() / 2)
