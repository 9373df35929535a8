"""The ``http`` tool executor and its client: loaded on the first ``http`` tool call or
webhook, with httpx (:class:`~.executors.ToolRunner` and
:func:`~.executors.lazy_tool_http_client` import it then), so that a function whose
requests make neither never loads httpx (about 25 ms of an init, ``make bench``).

The call's protocol (the request body, an answer's output, a deferred call, errors as
outcomes) is :mod:`.calls`'; this module sends it over HTTP within the call's deadline.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import httpcore
import httpx

from ..core import deadline, telemetry
from .calls import (
    DEFAULT_TIMEOUT_SECONDS,
    HttpClientSource,
    LazyHttpClient,
    ToolInvocation,
    ToolOutcome,
    answered,
    deferred,
    encode,
    request_body,
    short,
    unreachable,
)
from .registry import HttpExecutorConfig

#: The largest ``http`` tool response body read (bytes, after any content decoding):
#: a longer one is an error, and nothing past the cap is kept in memory.
MAX_RESPONSE_BYTES = 1024 * 1024


# --- a deadline for the whole HTTP call ---------------------------------------------
#
# httpx's timeouts are per operation: a server that sends a byte before each read
# timeout keeps a call alive for ever. httpcore reads its read timeout once per
# response, so it cannot be shortened between chunks either; instead the tool client's
# network streams cut every connect, read and write to the time left before the
# current call's end, which the executor sets in this context variable.

#: ``time.monotonic()`` by which the running ``http`` tool call must be over.
_call_end: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "turnledger_tool_call_end", default=None
)


@contextmanager
def _ends_at(end: float) -> Iterator[None]:
    token = _call_end.set(end)
    try:
        yield
    finally:
        _call_end.reset(token)


def _left(timeout: float | None) -> float | None:
    """``timeout``, or the time left in the current call when that is sooner."""
    end = _call_end.get()
    if end is None:
        return timeout
    # A positive floor: a socket timeout of 0 would make it non-blocking (an error other
    # than a timeout) instead of timing out at once.
    left = max(end - time.monotonic(), 0.001)
    return left if timeout is None else min(timeout, left)


class _BoundedStream(httpcore.NetworkStream):
    """A network stream whose every operation ends by the current call's end."""

    def __init__(self, stream: httpcore.NetworkStream) -> None:
        self._stream = stream

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, _left(timeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, _left(timeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(
        self,
        ssl_context: Any,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        return _BoundedStream(self._stream.start_tls(ssl_context, server_hostname, _left(timeout)))

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _BoundedBackend(httpcore.NetworkBackend):
    """httpcore's socket backend, with streams and connects cut to the call's end."""

    def __init__(self) -> None:
        self._backend = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        stream = self._backend.connect_tcp(
            host, port, _left(timeout), local_address, socket_options
        )
        return _BoundedStream(stream)

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        stream = self._backend.connect_unix_socket(path, _left(timeout), socket_options)
        return _BoundedStream(stream)

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


def tool_http_client(timeout: float = DEFAULT_TIMEOUT_SECONDS) -> httpx.Client:
    """An HTTP client whose ``http`` tool calls end by their deadline, read by read.

    Other requests made with it (webhooks) behave as with a plain client.
    """
    # One SSL context for the transport and its pool: loading the CA bundle is most of
    # the client's construction time, paid during init.
    ssl_context = httpx.create_ssl_context()
    transport = httpx.HTTPTransport(verify=ssl_context)
    # httpx's transport takes no network backend; its pool is replaced by the same
    # pool on the bounded backend (tests/functional/test_executor_bounds.py fails if
    # httpx stops using it).
    transport._pool = httpcore.ConnectionPool(
        ssl_context=ssl_context,
        max_connections=100,
        max_keepalive_connections=20,
        keepalive_expiry=5.0,
        network_backend=_BoundedBackend(),
    )
    return httpx.Client(timeout=timeout, transport=transport)


class _TooLarge(Exception):
    pass


def _read_body(response: httpx.Response, end: float, cap: int) -> bytes:
    """The response body, read chunk by chunk until ``end``.

    Raises:
        httpx.ReadTimeout: ``end`` passed before the body ended.
        _TooLarge: the body is longer than ``cap`` bytes (nothing past it was kept).
    """
    declared = response.headers.get("Content-Length", "")
    if declared.isdigit() and int(declared) > cap:
        raise _TooLarge
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_bytes():
        size += len(chunk)
        if size > cap:
            raise _TooLarge
        chunks.append(chunk)
        if time.monotonic() >= end:
            # A client without the bounded transport still stops here, between chunks.
            raise httpx.ReadTimeout("the call's deadline passed while reading its body")
    return b"".join(chunks)


class HttpExecutor:
    """POSTs the call to the tool's URL and takes the JSON response body as its output.

    The whole call (connect, send, every read) ends within the tool's timeout cut to
    the request's remaining time: exactly with a :func:`tool_http_client`, between
    body chunks with any other client.
    """

    def __init__(
        self,
        client: HttpClientSource,
        *,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
    ) -> None:
        """Create the executor.

        Args:
            client: the shared HTTP client (connection pooling across calls), best
                made by :func:`tool_http_client`; or what builds it, called on the first
                call (:class:`LazyHttpClient`).
            timeout_seconds: per-call timeout for tools that do not set their own.
            max_response_bytes: the longest response body accepted.
        """
        self._client = (
            client if isinstance(client, httpx.Client | LazyHttpClient) else LazyHttpClient(client)
        )
        self.timeout_seconds = timeout_seconds
        self.max_response_bytes = max_response_bytes

    @property
    def client(self) -> httpx.Client:
        """The HTTP client (built now if it was given as a factory and not built yet)."""
        return self._client if isinstance(self._client, httpx.Client) else self._client()

    def execute(self, invocation: ToolInvocation) -> ToolOutcome:
        """POST the call; see the module docstring for how failures are reported."""
        config = invocation.tool.executor
        if not isinstance(config, HttpExecutorConfig):
            raise ValueError(f"tool {invocation.tool.name} is not an http tool")
        name = invocation.tool.name
        configured = config.timeout_seconds or self.timeout_seconds
        # Cut to the request's remaining time: a tool never outlives the function.
        timeout = deadline.cap(configured) or 0.0
        if timeout <= 0:
            return ToolOutcome(
                f"tool {name} was not run: the request ran out of time", is_error=True
            )
        headers = {
            **config.headers,
            "Content-Type": "application/json",
            # The size cap counts decoded bytes: ask for a body that is not compressed.
            "Accept-Encoding": "identity",
            "Idempotency-Key": invocation.idempotency_key,
            # The trace context (``traceparent``) when telemetry is on: the tool's spans,
            # and a deferred tool's callback, join the turn's trace.
            **telemetry.headers(),
        }
        end = time.monotonic() + timeout
        try:
            with (
                _ends_at(end),
                self.client.stream(
                    "POST",
                    config.url,
                    content=encode(request_body(invocation)),
                    headers=headers,
                    timeout=timeout,
                ) as response,
            ):
                body = _read_body(response, end, self.max_response_bytes)
        except _TooLarge:
            return ToolOutcome(
                f"tool {name} answered more than {self.max_response_bytes} bytes",
                is_error=True,
            )
        except httpx.TimeoutException as exc:
            unreachable(name, exc)
            return ToolOutcome(f"tool {name} timed out after {timeout:g}s", is_error=True)
        except httpx.ConnectError as exc:
            unreachable(name, exc)
            return ToolOutcome(f"tool {name} is unreachable", is_error=True)
        except httpx.TransportError as exc:
            unreachable(name, exc)
            return ToolOutcome(f"tool {name} failed: {type(exc).__name__}", is_error=True)
        if response.status_code == 202:
            if not config.deferred:
                # It was sent no callback_url: nothing could ever settle the call.
                return ToolOutcome(
                    f"tool {name} answered 202, but it is not declared deferred "
                    '("deferred": true in its registry entry)',
                    is_error=True,
                )
            return deferred(name, body)
        if not response.is_success:
            text = body.decode(response.encoding or "utf-8", errors="replace")
            return ToolOutcome(
                f"tool {name} failed: HTTP {response.status_code}: {short(text)}",
                is_error=True,
            )
        return answered(name, body)
