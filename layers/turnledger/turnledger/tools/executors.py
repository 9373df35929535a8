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
  by :func:`.http.tool_http_client`'s transport on every socket operation and checked
  between the chunks of the streamed body; a body over
  :data:`.http.MAX_RESPONSE_BYTES` is an error and is never buffered past the cap.
* ``lambda``: a single attempt (the invoke client never retries: a retried Invoke
  runs the function again) whose read timeout is the tool's timeout plus
  :data:`LAMBDA_TIMEOUT_MARGIN_SECONDS`, cut to the request's remaining time.
"""

from __future__ import annotations

import contextvars
import math
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    ReadTimeoutError,
)

from ..core import deadline, telemetry
from ..core.observability import logger
from ..core.strict_json import BodyError, parse
from .calls import (
    DEFAULT_TIMEOUT_SECONDS,
    HttpClientSource,
    LazyHttpClient,
    ToolInvocation,
    ToolOutcome,
    answered,
    encode,
    idempotency_key,
    request_body,
    short,
    unreachable,
)
from .mcp_calls import McpExecutor
from .mcp_link import McpLink
from .registry import LambdaExecutorConfig

#: Imported from here by callers that run tools (re-exported from :mod:`.calls`).
__all__ = [
    "DEFAULT_TIMEOUT_SECONDS",
    "HttpClientSource",
    "LambdaExecutor",
    "LazyHttpClient",
    "ToolInvocation",
    "ToolOutcome",
    "ToolRunner",
    "idempotency_key",
    "invoke_config",
    "lazy_tool_http_client",
]

if TYPE_CHECKING:
    import httpx
    from mypy_boto3_lambda import LambdaClient

    from .http import HttpExecutor

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


def lazy_tool_http_client(timeout: float = DEFAULT_TIMEOUT_SECONDS) -> LazyHttpClient:
    """A :class:`LazyHttpClient` of :func:`.http.tool_http_client`: the client, and httpx
    with it, are loaded by the first ``http`` tool call or webhook."""

    def build() -> httpx.Client:
        from .http import tool_http_client

        return tool_http_client(timeout)

    return LazyHttpClient(build)


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
        payload = {**request_body(invocation), "idempotency_key": invocation.idempotency_key}
        try:
            response = self.client(read_timeout).invoke(
                FunctionName=config.function_name,
                InvocationType="RequestResponse",
                Payload=encode(payload),
            )
            raw = response["Payload"].read()
        except (ReadTimeoutError, ConnectTimeoutError) as exc:
            unreachable(name, exc)
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
        return answered(name, raw)


def _function_error(name: str, raw: bytes, kind: str) -> str:
    """The error report of a function that failed, as the model reads it.

    The tool's own report (``errorType: errorMessage`` of what its code raised) is its
    answer, shortened. Lambda's reports (``Runtime.*``, ``Sandbox.*``: a crash, a
    timeout, out of memory) and a body that is no report carry AWS's details (request
    ids, paths): they are logged, and the model reads only their type.
    """
    try:
        report = parse(raw, "the report")
    except BodyError:
        report = None
    if isinstance(report, dict) and ("errorType" in report or "errorMessage" in report):
        error_type = str(report.get("errorType", "Error"))
        if not error_type.startswith(_LAMBDA_ERROR_TYPES):
            detail = f"{error_type}: {report.get('errorMessage', '')}"
            return short(f"Lambda function error ({kind}): {detail}")
    else:
        error_type = "unreadable report"
    logger.warning(
        "a lambda tool's function failed",
        extra={"tool": name, "kind": kind, "detail": short(raw.decode("utf-8", "replace"))},
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
        mcp: McpLink | None = None,
    ) -> None:
        """Create the runner.

        Args:
            http: the shared HTTP client for ``http`` tools, best made by
                :func:`.http.tool_http_client` (it ends each call by its deadline, read by read),
                or what builds it on the first ``http`` call (:class:`LazyHttpClient`).
            lambda_client_factory: builds a Lambda client with the botocore config it
                is given (:func:`invoke_config`), on the first ``lambda`` call (kept out
                of cold starts that never need it); ``None`` when Lambda tools are not
                available here (they then answer with an error).
            max_workers: calls run at the same time, at most.
            timeout_seconds: per-call timeout of tools that set none.
            mcp: the process's link to MCP servers (the registry's too), for calls of
                ``mcp`` tools; a new one (reaching them over Streamable HTTP) when ``None``.

        Raises:
            ValueError: ``max_workers`` is below 1.
        """
        if max_workers < 1:
            raise ValueError("max_workers must be at least 1")
        self._http_client = http
        self._timeout_seconds = timeout_seconds
        self._http: HttpExecutor | None = None
        self._http_lock = threading.Lock()
        self.max_workers = max_workers
        self.mcp = McpExecutor(mcp or McpLink(), timeout_seconds=timeout_seconds)
        # Builds no client until the first lambda call.
        self.lambda_executor = (
            None
            if lambda_client_factory is None
            else LambdaExecutor(lambda_client_factory, timeout_seconds=timeout_seconds)
        )

    @property
    def http(self) -> HttpExecutor:
        """The executor of ``http`` tools, built on the first use: it loads httpx
        (:mod:`.http`), which a function whose calls never use it does not load."""
        with self._http_lock:
            if self._http is None:
                from .http import HttpExecutor

                self._http = HttpExecutor(self._http_client, timeout_seconds=self._timeout_seconds)
            return self._http

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
        executor: HttpExecutor | LambdaExecutor | McpExecutor | None = (
            self.http
            if tool.executor.type == "http"
            else self.mcp
            if tool.executor.type == "mcp"
            else self.lambda_executor
        )
        if executor is None:
            return ToolOutcome(
                f"tool {tool.name} cannot run: Lambda tools are not available here",
                is_error=True,
            )
        try:
            with telemetry.tool_call(
                tool.name, invocation.call.id, kind=tool.executor.type, approval=invocation.approval
            ) as span:
                outcome = executor.execute(invocation)
                telemetry.tool_outcome(
                    span, is_error=outcome.is_error, deferred=outcome.task_id is not None
                )
            return outcome
        except Exception:
            # An executor answers every failure of the tool; this is a bug of ours. The call
            # may have been sent: it is answered once with an error, as a timeout is, never
            # run again by a resume (a 500 here would repeat on every request after it).
            logger.exception("a tool's executor failed", extra={"tool": tool.name})
            return ToolOutcome(
                f"tool {tool.name} failed: an internal error (see the service's logs)",
                is_error=True,
            )

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
