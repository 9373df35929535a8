"""The HTTP side shared by the OpenAI-style providers (``openai-chat``, ``openai-responses``).

One place sends a JSON request to an OpenAI-compatible server, with the API
key resolved per request, bounded retries with backoff, and failures mapped at
this boundary::

    httpx.TimeoutException       -> retried, then ProviderTimeout (504)
    httpx network errors         -> retried, then ProviderError (502)
    408 / 409 / 429 / 5xx        -> retried, then ProviderError (502)
    other 4xx                    -> ProviderError (502) at once

``ProviderError.details`` carries the HTTP status and the provider's own error
message, with the API key scrubbed from it, and the number of attempts.
A caller that handles some error answers itself (the Responses API's "previous
response not found") passes ``accept`` and gets those responses back as they are.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

from ..core import deadline
from ..core.exceptions import ProviderError, ProviderTimeout
from .base import ApiKeyProvider, Provider
from .retry import Backoff

#: Statuses worth another attempt: the server was busy, throttled or broken, not the request.
RETRYABLE_STATUSES = frozenset({408, 409, 429})
#: Longest the provider's error text kept in ``ProviderError.details``.
MESSAGE_LIMIT = 500


@dataclass(frozen=True)
class ErrorBody:
    """The fields of an OpenAI-shaped error body ``{"error": {message, type, param, code}}``."""

    message: str
    code: str | None = None
    param: str | None = None


def error_body(response: httpx.Response) -> ErrorBody:
    """The provider's own error: ``error.*`` of its JSON body, else the body as text."""
    try:
        body = response.json()
    except ValueError:
        return ErrorBody(response.text[:MESSAGE_LIMIT])
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            code, param = error.get("code"), error.get("param")
            return ErrorBody(
                str(error["message"])[:MESSAGE_LIMIT],
                code=code if isinstance(code, str) else None,
                param=param if isinstance(param, str) else None,
            )
        if isinstance(error, str):
            return ErrorBody(error[:MESSAGE_LIMIT])
    return ErrorBody(response.text[:MESSAGE_LIMIT])


def retry_after(response: httpx.Response) -> float | None:
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


def retryable(status: int) -> bool:
    """Whether an HTTP status is worth another attempt."""
    return status in RETRYABLE_STATUSES or status >= 500


@dataclass(frozen=True)
class _Failure:
    """Why one attempt failed: the error to raise if it was the last one."""

    error: ProviderError
    retry: bool
    #: Seconds the server asked us to wait before the next attempt.
    wait: float | None = None


def _capped(timeout: httpx.Timeout) -> httpx.Timeout:
    """``timeout`` with each phase cut to the request's remaining time."""
    return httpx.Timeout(
        connect=deadline.cap(timeout.connect),
        read=deadline.cap(timeout.read),
        write=deadline.cap(timeout.write),
        pool=deadline.cap(timeout.pool),
    )


class OpenAIStyleProvider(Provider):
    """A provider that speaks JSON over HTTP to an OpenAI-compatible server.

    Subclasses build the body and parse the answer; :meth:`send` does the rest.
    """

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
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key
        self._client = client or httpx.Client(transport=transport)
        self._timeout = httpx.Timeout(timeout_seconds)
        self.max_retries = max_retries
        self._backoff = Backoff(backoff_seconds, max_backoff_seconds, sleep, jitter)

    def resolve_key(self) -> str | None:
        """The API key for this request, or ``None`` to send none.

        Raises:
            ProviderError: the key source failed (``reason: api_key_unavailable``).
        """
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

    def send(
        self,
        method: str,
        url: str,
        *,
        key: str | None,
        body: dict[str, Any] | None = None,
        accept: Callable[[httpx.Response], bool] | None = None,
        max_retries: int | None = None,
        timeout: httpx.Timeout | None = None,
        stream: bool = False,
    ) -> httpx.Response:
        """Send one request, with retries; the 2xx response or one ``accept`` keeps.

        With ``stream`` the 2xx response is returned unread (server-sent events, see
        :func:`sse_events`) and the caller must close it; failures before it are retried
        as usual, nothing after it is (the answer has begun).

        Args:
            method: ``POST``, ``DELETE``, ...
            url: the full URL.
            key: the API key (from :meth:`resolve_key`), scrubbed from any error text.
            body: the JSON body, if any.
            accept: error responses the caller handles itself: returned at once,
                neither retried nor raised.
            max_retries: overrides the provider's retries for this request.
            timeout: overrides the per-attempt timeout for this request.

        Raises:
            ProviderTimeout: the last attempt allowed timed out.
            ProviderError: the provider failed or refused the request.
        """
        headers = {"Accept": "text/event-stream" if stream else "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        retries = self.max_retries if max_retries is None else max_retries
        attempt = 0
        while True:
            attempt += 1
            outcome = self._attempt(method, url, body, headers, key, accept, timeout, stream)
            if isinstance(outcome, httpx.Response):
                return outcome
            left = deadline.remaining()
            if not outcome.retry or attempt > retries or (left is not None and left <= 0):
                outcome.error.details["attempts"] = attempt
                raise outcome.error
            self._backoff.wait(attempt, outcome.wait)

    def _attempt(
        self,
        method: str,
        url: str,
        body: dict[str, Any] | None,
        headers: dict[str, str],
        key: str | None,
        accept: Callable[[httpx.Response], bool] | None,
        timeout: httpx.Timeout | None,
        stream: bool = False,
    ) -> httpx.Response | _Failure:
        """One request: the response to return, or why it failed and whether to try again."""
        configured = timeout or self._timeout
        left = deadline.remaining()
        if left is not None and left <= 0:
            # The request's time is spent: answer 504 now rather than be cut off by Lambda.
            error: ProviderError = ProviderTimeout(
                "the request ran out of time before the model answered",
                details={"reason": "deadline"},
            )
            return _Failure(error, retry=False)
        try:
            if stream:
                built = self._client.build_request(
                    method, url, json=body, headers=headers, timeout=_capped(configured)
                )
                response = self._client.send(built, stream=True)
                if not response.is_success:
                    response.read()  # an error answer is small: read it whole, as below
                    response.close()
            else:
                response = self._client.request(
                    method, url, json=body, headers=headers, timeout=_capped(configured)
                )
        except httpx.TimeoutException as exc:
            error = ProviderTimeout(
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

        if response.is_success or (accept is not None and accept(response)):
            return response
        message = error_body(response).message
        if key:
            message = message.replace(key, "***")
        error = ProviderError(
            f"the model provider answered {response.status_code}",
            details={"status": response.status_code, "provider_message": message},
        )
        return _Failure(error, retry=retryable(response.status_code), wait=retry_after(response))


def sse_events(response: httpx.Response) -> Iterator[tuple[str | None, str]]:
    """``(event, data)`` of each server-sent event of an open streaming ``response``.

    Multi-line ``data`` is joined with newlines, as the SSE specification says.

    Raises:
        ProviderTimeout: the stream stalled past the read timeout.
        ProviderError: the connection broke mid-stream (``reason: stream_interrupted``).
    """
    event: str | None = None
    data: list[str] = []
    try:
        for line in response.iter_lines():
            if not line:
                if data:
                    yield event, "\n".join(data)
                event, data = None, []
            elif line.startswith(":"):
                continue  # a comment (keep-alive)
            else:
                name, _, value = line.partition(":")
                value = value.removeprefix(" ")
                if name == "event":
                    event = value
                elif name == "data":
                    data.append(value)
        if data:
            yield event, "\n".join(data)
    except httpx.TimeoutException as exc:
        raise ProviderTimeout(
            "the model provider stopped streaming its answer",
            details={"reason": "timeout", "error": type(exc).__name__},
        ) from exc
    except httpx.HTTPError as exc:
        raise ProviderError(
            "the model provider's stream broke off",
            details={"reason": "stream_interrupted", "error": type(exc).__name__},
        ) from exc
