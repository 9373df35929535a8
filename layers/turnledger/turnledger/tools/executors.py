"""Running server-side tool calls: over HTTP or as a Lambda function.

A tool failure is an answer, not an exception: every executor turns timeouts,
error statuses, unreachable endpoints and unusable bodies into a
:class:`ToolOutcome` with ``is_error`` set and a short text the model can read.

Every call carries an idempotency key derived from where the call was
recorded (tenant, conversation, life, call id, sequence), so a call that runs
again after a crash sends the same key and the tool can deduplicate it.

Every call is bounded in wall-clock time by the tool's ``timeout_seconds`` and by
the request's remaining time (:mod:`turnledger.core.deadline`), whichever is sooner:

* ``http``: one deadline for the whole call (connect, send, every read), enforced
  by :func:`tool_http_client`'s transport on every socket operation and checked
  between the chunks of the streamed body; a body over
  :data:`MAX_RESPONSE_BYTES` is an error and is never buffered past the cap.
* ``lambda``: a single attempt (the invoke client never retries: a retried Invoke
  runs the function again) whose read timeout is the tool's timeout plus
  :data:`LAMBDA_TIMEOUT_MARGIN_SECONDS`, cut to the request's remaining time.
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import httpcore
import httpx
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    ReadTimeoutError,
)

from ..core import deadline
from ..core.models import ToolCall
from ..core.observability import logger
from .registry import HttpExecutorConfig, LambdaExecutorConfig, ToolDefinition

if TYPE_CHECKING:
    from mypy_boto3_lambda import LambdaClient

#: Characters of a failing tool's response body quoted in the error text.
_SHORT_BODY = 200

#: Per-call timeout when neither the tool nor the runner sets one (seconds).
DEFAULT_TIMEOUT_SECONDS = 30.0

#: The largest ``http`` tool response body read (bytes, after any content decoding):
#: a longer one is an error, and nothing past the cap is kept in memory.
MAX_RESPONSE_BYTES = 1024 * 1024

#: How much longer than its timeout a ``lambda`` tool's Invoke is awaited (seconds): a
#: function whose own timeout is the tool's gets to answer "Task timed out" itself.
LAMBDA_TIMEOUT_MARGIN_SECONDS = 1.0

#: Read timeouts cut by the request's deadline are rounded down to this step (seconds),
#: so that the invoke clients (one per read timeout) are reused across requests.
_LAMBDA_TIMEOUT_STEP = 0.25

#: Invoke clients kept, one per read timeout; the least recently used one goes first.
_LAMBDA_CLIENTS = 8

#: Longest wait for the TCP connection to Lambda (seconds), as for other AWS calls.
_LAMBDA_CONNECT_TIMEOUT = 3.0


@dataclass(frozen=True)
class ToolInvocation:
    """One tool call to run, with where it belongs."""

    tool: ToolDefinition
    call: ToolCall
    tenant: str
    conversation_id: str
    idempotency_key: str
    #: Where a tool that finishes the call later (``202``) reports its outcome.
    callback_url: str | None = None


@dataclass(frozen=True)
class ToolOutcome:
    """What a tool call produced: its output, or the error text when ``is_error``.

    ``task_id`` set: the tool accepted the call to finish it elsewhere (deferred);
    ``output`` is then empty and the outcome comes later, through its callback.
    """

    output: str
    is_error: bool = False
    task_id: str | None = None


class Executor(Protocol):
    """Runs one kind of tool call; never raises for a failure of the tool itself."""

    def execute(self, invocation: ToolInvocation) -> ToolOutcome:
        """Run ``invocation`` and report its outcome."""
        ...


def idempotency_key(
    tenant: str, conversation_id: str, gen: str, call_id: str, sequence: int
) -> str:
    """The idempotency key of one recorded tool call: 32 hex characters.

    The same parts always give the same key, so a call run again (a retried
    request, a resumed crash) is recognisable by the tool; ``gen`` and
    ``sequence`` keep a provider's reused call ids apart across lives and turns.
    """
    # A JSON array is an unambiguous encoding of the parts (no separator collisions).
    parts = json.dumps([tenant, conversation_id, gen, call_id, sequence], ensure_ascii=False)
    return hashlib.sha256(parts.encode("utf-8")).hexdigest()[:32]


def _as_output(value: Any) -> str:
    """A tool's JSON answer as text: a JSON string as itself, anything else as compact JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _short(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= _SHORT_BODY else flat[:_SHORT_BODY] + "..."


def _request_body(invocation: ToolInvocation) -> dict[str, Any]:
    body: dict[str, Any] = {
        "tool": invocation.tool.name,
        "call_id": invocation.call.id,
        "conversation_id": invocation.conversation_id,
        "arguments": invocation.call.arguments,
    }
    if invocation.callback_url is not None:
        body["callback_url"] = invocation.callback_url
    return body


def _deferred(name: str, body: bytes) -> ToolOutcome:
    """A ``202`` answer: deferred with its ``task_id``, or an error the model can read."""
    try:
        value = json.loads(body)
    except ValueError:
        value = None
    task_id = value.get("task_id") if isinstance(value, dict) else None
    if not isinstance(task_id, str) or not task_id or len(task_id) > 256:
        return ToolOutcome(
            f"tool {name} answered 202 without a task_id (a string of 1-256 characters)",
            is_error=True,
        )
    return ToolOutcome("", task_id=task_id)


def _encode(body: dict[str, Any]) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


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


class LazyHttpClient:
    """An HTTP client built on first use, once (thread-safe): what an ``http`` tool call or a
    webhook needs, kept out of the init of a function that never makes one (its CA
    bundle alone takes about 40 ms to load)."""

    def __init__(self, build: Callable[[], httpx.Client]) -> None:
        self._build = build
        self._client: httpx.Client | None = None
        self._lock = threading.Lock()

    def __call__(self) -> httpx.Client:
        """The client, built by the first call."""
        with self._lock:
            if self._client is None:
                self._client = self._build()
            return self._client

    @property
    def built(self) -> bool:
        """Whether the client has been built."""
        return self._client is not None

    def post(self, *args: Any, **kwargs: Any) -> httpx.Response:
        """``httpx.Client.post`` on the client (built now if need be)."""
        return self().post(*args, **kwargs)


#: An HTTP client, or what builds it on first use.
type HttpClientSource = httpx.Client | Callable[[], httpx.Client]


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
        }
        end = time.monotonic() + timeout
        try:
            with (
                _ends_at(end),
                self.client.stream(
                    "POST",
                    config.url,
                    content=_encode(_request_body(invocation)),
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
            _unreachable(name, exc)
            return ToolOutcome(f"tool {name} timed out after {timeout:g}s", is_error=True)
        except httpx.ConnectError as exc:
            _unreachable(name, exc)
            return ToolOutcome(f"tool {name} is unreachable", is_error=True)
        except httpx.TransportError as exc:
            _unreachable(name, exc)
            return ToolOutcome(f"tool {name} failed: {type(exc).__name__}", is_error=True)
        if response.status_code == 202:
            return _deferred(name, body)
        if not response.is_success:
            text = body.decode(response.encoding or "utf-8", errors="replace")
            return ToolOutcome(
                f"tool {name} failed: HTTP {response.status_code}: {_short(text)}",
                is_error=True,
            )
        try:
            value = json.loads(body)
        except ValueError:
            return ToolOutcome(f"tool {name} returned invalid JSON", is_error=True)
        return ToolOutcome(_as_output(value))


def _unreachable(tool: str, exc: Exception) -> None:
    # The model only reads "unreachable"; whoever runs the service must see it too. The
    # tool's name and the error's type only: arguments and URLs may carry personal data.
    logger.warning(
        "a tool could not be reached", extra={"tool": tool, "error_type": type(exc).__name__}
    )


def invoke_config(read_timeout: float) -> Config:
    """The botocore config of a client that invokes ``lambda`` tools.

    A single attempt: botocore would otherwise retry an Invoke whose answer is late,
    running the function again while the first run goes on (other AWS clients keep
    their retries). ``read_timeout`` bounds the wait for the function's answer.
    """
    return Config(
        connect_timeout=min(_LAMBDA_CONNECT_TIMEOUT, read_timeout),
        read_timeout=read_timeout,
        retries={"total_max_attempts": 1, "mode": "standard"},
    )


def _invoke_timeout(configured: float) -> float | None:
    """How long to await the Invoke: the tool's timeout plus the margin, cut to the
    request's remaining time (rounded down to a step); ``None``: no time is left."""
    wanted = configured + LAMBDA_TIMEOUT_MARGIN_SECONDS
    left = deadline.remaining()
    if left is None or left >= wanted:
        return wanted
    stepped = math.floor(left / _LAMBDA_TIMEOUT_STEP) * _LAMBDA_TIMEOUT_STEP
    return stepped if stepped > 0 else None


#: What the model and the caller read when a ``lambda`` tool's Invoke fails (AWS's own
#: message, with the account and role, is logged only).
LAMBDA_INVOKE_FAILED = "its function could not be invoked (see the service's logs)"
#: Error types of Lambda's own reports, not the tool's code.
_LAMBDA_ERROR_TYPES = ("Runtime.", "Sandbox.")


class LambdaExecutor:
    """Invokes the tool's Lambda function synchronously; its JSON result is the output.

    The payload is ``{"tool", "call_id", "conversation_id", "arguments",
    "idempotency_key"}``. The Invoke is made once, never retried, and awaited for the
    tool's timeout plus :data:`LAMBDA_TIMEOUT_MARGIN_SECONDS`, cut to the request's
    remaining time (see :func:`invoke_config`).
    """

    def __init__(
        self,
        client_factory: Callable[[Config], LambdaClient],
        *,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
    ) -> None:
        """Create the executor.

        Args:
            client_factory: builds a Lambda client with the given botocore config; it
                is called once per distinct read timeout (a few are kept).
            timeout_seconds: per-call timeout for tools that do not set their own.
        """
        self._client_factory = client_factory
        self.timeout_seconds = timeout_seconds
        self._clients: OrderedDict[float, LambdaClient] = OrderedDict()
        # Also serialises the factory: a boto3 session must not build clients in parallel.
        self._lock = threading.Lock()

    def client(self, read_timeout: float) -> LambdaClient:
        """The invoke client awaiting answers for ``read_timeout`` seconds."""
        with self._lock:
            client = self._clients.get(read_timeout)
            if client is None:
                client = self._clients[read_timeout] = self._client_factory(
                    invoke_config(read_timeout)
                )
                if len(self._clients) > _LAMBDA_CLIENTS:
                    self._clients.popitem(last=False)
            else:
                self._clients.move_to_end(read_timeout)
            return client

    def execute(self, invocation: ToolInvocation) -> ToolOutcome:
        """Invoke the function; failures become error outcomes."""
        config = invocation.tool.executor
        if not isinstance(config, LambdaExecutorConfig):
            raise ValueError(f"tool {invocation.tool.name} is not a lambda tool")
        name = invocation.tool.name
        read_timeout = _invoke_timeout(config.timeout_seconds or self.timeout_seconds)
        if read_timeout is None:
            return ToolOutcome(
                f"tool {name} was not run: the request ran out of time", is_error=True
            )
        payload = {**_request_body(invocation), "idempotency_key": invocation.idempotency_key}
        try:
            response = self.client(read_timeout).invoke(
                FunctionName=config.function_name,
                InvocationType="RequestResponse",
                Payload=_encode(payload),
            )
            raw = response["Payload"].read()
        except (ReadTimeoutError, ConnectTimeoutError) as exc:
            _unreachable(name, exc)
            return ToolOutcome(f"tool {name} timed out after {read_timeout:g}s", is_error=True)
        except (ClientError, BotoCoreError) as exc:
            # AWS's message names the account, the role and the function's ARN: it goes
            # to the log; the model and the caller get a generic text.
            error = exc.response.get("Error", {}) if isinstance(exc, ClientError) else {}
            logger.warning(
                "a lambda tool could not be invoked",
                extra={
                    "tool": name,
                    "code": error.get("Code", type(exc).__name__),
                    "detail": error.get("Message", str(exc)),
                },
            )
            return ToolOutcome(f"tool {name} failed: {LAMBDA_INVOKE_FAILED}", is_error=True)
        if "FunctionError" in response:
            return ToolOutcome(
                f"tool {name} failed: {_function_error(name, raw, response['FunctionError'])}",
                is_error=True,
            )
        try:
            value = json.loads(raw)
        except ValueError:
            return ToolOutcome(f"tool {name} returned invalid JSON", is_error=True)
        return ToolOutcome(_as_output(value))


def _function_error(name: str, raw: bytes, kind: str) -> str:
    """The error report of a function that failed, as the model reads it.

    The tool's own report (``errorType: errorMessage`` of what its code raised) is its
    answer, shortened. Lambda's reports (``Runtime.*``, ``Sandbox.*``: a crash, a
    timeout, out of memory) and a body that is no report carry AWS's details (request
    ids, paths): they are logged, and the model reads only their type.
    """
    try:
        report = json.loads(raw)
    except ValueError:
        report = None
    if isinstance(report, dict) and ("errorType" in report or "errorMessage" in report):
        error_type = str(report.get("errorType", "Error"))
        if not error_type.startswith(_LAMBDA_ERROR_TYPES):
            detail = f"{error_type}: {report.get('errorMessage', '')}"
            return _short(f"Lambda function error ({kind}): {detail}")
    else:
        error_type = "unreadable report"
    logger.warning(
        "a lambda tool's function failed",
        extra={"tool": name, "kind": kind, "detail": _short(raw.decode("utf-8", "replace"))},
    )
    return f"Lambda function error ({kind}): {error_type}"


class ToolRunner:
    """Runs a turn's server-side tool calls in parallel, results in call order.

    Arguments are validated against the tool's schema first: an invalid call is
    answered with the validation error and never reaches its executor.
    """

    def __init__(
        self,
        http: HttpClientSource,
        lambda_client_factory: Callable[[Config], LambdaClient] | None = None,
        *,
        max_workers: int = 8,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
    ) -> None:
        """Create the runner.

        Args:
            http: the shared HTTP client for ``http`` tools, best made by
                :func:`tool_http_client` (it ends each call by its deadline, read by read),
                or what builds it on the first ``http`` call (:class:`LazyHttpClient`).
            lambda_client_factory: builds a Lambda client with the botocore config it
                is given (:func:`invoke_config`), on the first ``lambda`` call (kept out
                of cold starts that never need it); ``None`` when Lambda tools are not
                available here (they then answer with an error).
            max_workers: calls run at the same time, at most.
            timeout_seconds: per-call timeout of tools that set none.

        Raises:
            ValueError: ``max_workers`` is below 1.
        """
        if max_workers < 1:
            raise ValueError("max_workers must be at least 1")
        self.http = HttpExecutor(http, timeout_seconds=timeout_seconds)
        self.max_workers = max_workers
        # Builds no client until the first lambda call.
        self.lambda_executor = (
            None
            if lambda_client_factory is None
            else LambdaExecutor(lambda_client_factory, timeout_seconds=timeout_seconds)
        )

    def run_one(self, invocation: ToolInvocation) -> ToolOutcome:
        """Validate and run one call.

        Raises:
            ValueError: the tool is a client-side tool.
        """
        tool = invocation.tool
        if tool.executor.type in ("client", "human"):
            raise ValueError(f"tool {tool.name} is a {tool.executor.type} tool; it never runs here")
        invalid = tool.validate_call(invocation.call)
        if invalid is not None:
            return ToolOutcome(invalid, is_error=True)
        if tool.executor.type == "http":
            return self.http.execute(invocation)
        executor = self.lambda_executor
        if executor is None:
            return ToolOutcome(
                f"tool {tool.name} cannot run: Lambda tools are not available here",
                is_error=True,
            )
        return executor.execute(invocation)

    def run(self, invocations: list[ToolInvocation]) -> list[ToolOutcome]:
        """Run ``invocations`` concurrently.

        Returns:
            One outcome per invocation, in the same order.

        Raises:
            ValueError: an invocation is of a client-side tool (checked before any runs).
        """
        clients = [i.tool.name for i in invocations if i.tool.executor.type in ("client", "human")]
        if clients:
            raise ValueError(f"client tools cannot be run on the server: {', '.join(clients)}")
        if len(invocations) <= 1:
            return [self.run_one(invocation) for invocation in invocations]
        workers = min(self.max_workers, len(invocations))
        # Each call runs in a copy of this thread's context: the request's deadline holds there.
        contexts = [contextvars.copy_context() for _ in invocations]
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tool") as pool:
            return list(pool.map(lambda c, i: c.run(self.run_one, i), contexts, invocations))
