"""Running server-side tool calls: over HTTP or as a Lambda function.

A tool failure is an answer, not an exception: every executor turns timeouts,
error statuses, unreachable endpoints and unusable bodies into a
:class:`ToolOutcome` with ``is_error`` set and a short text the model can read.

Every call carries an idempotency key derived from where the call was
recorded (tenant, conversation, life, call id, sequence), so a call that runs
again after a crash sends the same key and the tool can deduplicate it.
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import httpx
from botocore.exceptions import BotoCoreError, ClientError

from .. import deadline
from ..models import ToolCall
from ..observability import logger
from .registry import HttpExecutorConfig, LambdaExecutorConfig, ToolDefinition

if TYPE_CHECKING:
    from mypy_boto3_lambda import LambdaClient

#: Characters of a failing tool's response body quoted in the error text.
_SHORT_BODY = 200

#: Per-call timeout when neither the tool nor the runner sets one (seconds).
DEFAULT_TIMEOUT_SECONDS = 30.0


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


def _deferred(name: str, response: httpx.Response) -> ToolOutcome:
    """A ``202`` answer: deferred with its ``task_id``, or an error the model can read."""
    try:
        value = response.json()
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


class HttpExecutor:
    """POSTs the call to the tool's URL and takes the JSON response body as its output."""

    def __init__(
        self, client: httpx.Client, *, timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    ) -> None:
        """Create the executor.

        Args:
            client: the shared HTTP client (connection pooling across calls).
            timeout_seconds: per-call timeout for tools that do not set their own.
        """
        self.client = client
        self.timeout_seconds = timeout_seconds

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
            "Idempotency-Key": invocation.idempotency_key,
        }
        try:
            response = self.client.post(
                config.url,
                content=_encode(_request_body(invocation)),
                headers=headers,
                timeout=timeout,
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
            return _deferred(name, response)
        if not response.is_success:
            return ToolOutcome(
                f"tool {name} failed: HTTP {response.status_code}: {_short(response.text)}",
                is_error=True,
            )
        try:
            value = response.json()
        except ValueError:
            return ToolOutcome(f"tool {name} returned invalid JSON", is_error=True)
        return ToolOutcome(_as_output(value))


def _unreachable(tool: str, exc: Exception) -> None:
    # The model only reads "unreachable"; whoever runs the service must see it too. The
    # tool's name and the error's type only: arguments and URLs may carry personal data.
    logger.warning(
        "a tool could not be reached", extra={"tool": tool, "error_type": type(exc).__name__}
    )


class LambdaExecutor:
    """Invokes the tool's Lambda function synchronously; its JSON result is the output.

    The payload is ``{"tool", "call_id", "conversation_id", "arguments",
    "idempotency_key"}``. The Lambda client's own ``read_timeout`` bounds the call.
    """

    def __init__(self, client: LambdaClient) -> None:
        """Create the executor.

        Args:
            client: the Lambda client (its config sets timeouts and retries).
        """
        self.client = client

    def execute(self, invocation: ToolInvocation) -> ToolOutcome:
        """Invoke the function; failures become error outcomes."""
        config = invocation.tool.executor
        if not isinstance(config, LambdaExecutorConfig):
            raise ValueError(f"tool {invocation.tool.name} is not a lambda tool")
        name = invocation.tool.name
        payload = {**_request_body(invocation), "idempotency_key": invocation.idempotency_key}
        try:
            response = self.client.invoke(
                FunctionName=config.function_name,
                InvocationType="RequestResponse",
                Payload=_encode(payload),
            )
            raw = response["Payload"].read()
        except ClientError as exc:
            error = exc.response.get("Error", {})
            detail = f"{error.get('Code', 'ClientError')}: {error.get('Message', '')}"
            return ToolOutcome(f"tool {name} failed: {_short(detail)}", is_error=True)
        except BotoCoreError as exc:
            return ToolOutcome(f"tool {name} failed: {_short(str(exc))}", is_error=True)
        if "FunctionError" in response:
            return ToolOutcome(
                f"tool {name} failed: {_function_error(raw, response['FunctionError'])}",
                is_error=True,
            )
        try:
            value = json.loads(raw)
        except ValueError:
            return ToolOutcome(f"tool {name} returned invalid JSON", is_error=True)
        return ToolOutcome(_as_output(value))


def _function_error(raw: bytes, kind: str) -> str:
    """The function's own error report (``errorType: errorMessage``), shortened."""
    try:
        report = json.loads(raw)
    except ValueError:
        report = None
    if isinstance(report, dict) and ("errorType" in report or "errorMessage" in report):
        detail = f"{report.get('errorType', 'Error')}: {report.get('errorMessage', '')}"
    else:
        detail = raw.decode("utf-8", errors="replace")
    return _short(f"Lambda function error ({kind}): {detail}")


class ToolRunner:
    """Runs a turn's server-side tool calls in parallel, results in call order.

    Arguments are validated against the tool's schema first: an invalid call is
    answered with the validation error and never reaches its executor.
    """

    def __init__(
        self,
        http: httpx.Client,
        lambda_client_factory: Callable[[], LambdaClient] | None = None,
        *,
        max_workers: int = 8,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
    ) -> None:
        """Create the runner.

        Args:
            http: the shared HTTP client for ``http`` tools.
            lambda_client_factory: builds the Lambda client on the first ``lambda``
                call (kept out of cold starts that never need it); ``None`` when
                Lambda tools are not available here (they then answer with an error).
            max_workers: calls run at the same time, at most.
            timeout_seconds: per-call timeout of ``http`` tools that set none.

        Raises:
            ValueError: ``max_workers`` is below 1.
        """
        if max_workers < 1:
            raise ValueError("max_workers must be at least 1")
        self.http = HttpExecutor(http, timeout_seconds=timeout_seconds)
        self.max_workers = max_workers
        self._lambda_client_factory = lambda_client_factory
        self._lambda: LambdaExecutor | None = None
        self._lambda_lock = threading.Lock()

    def _lambda_executor(self) -> LambdaExecutor | None:
        if self._lambda_client_factory is None:
            return None
        with self._lambda_lock:
            if self._lambda is None:
                self._lambda = LambdaExecutor(self._lambda_client_factory())
            return self._lambda

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
        executor = self._lambda_executor()
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
