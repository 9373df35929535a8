"""A server-side tool call as every executor runs it, and what it answers.

Shared by the executors (:mod:`.executors`: Lambda and the runner; :mod:`.http`: the
``http`` executor, loaded on first use): the invocation, the outcome, the idempotency
key, the request body a tool receives and how its answer becomes an outcome. Imports no
HTTP client: :class:`LazyHttpClient` builds one on first use.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..core.models import Elicitation, ToolCall
from ..core.observability import logger
from ..core.strict_json import BodyError, parse
from .registry import ToolDefinition

if TYPE_CHECKING:
    import httpx

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
    #: The decision the call runs under when it needed one (``approved``): telemetry's.
    approval: str | None = None
    #: A call sent again once a person answered its tool's question (an MCP elicitation).
    elicitation: Elicitation | None = None


@dataclass(frozen=True)
class ToolOutcome:
    """What a tool call produced: its output, or the error text when ``is_error``.

    ``task_id`` set: the tool accepted the call to finish it elsewhere (deferred);
    ``output`` is then empty and the outcome comes later, through its callback.
    ``elicitation`` set: the tool asks a person first (an MCP server's elicitation);
    ``output`` is empty and the call is sent again with the answer.
    """

    output: str
    is_error: bool = False
    task_id: str | None = None
    elicitation: Elicitation | None = None


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


def as_output(value: Any) -> str:
    """A tool's JSON answer as text: a JSON string as itself, anything else as compact JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


#: How refusals name a tool's answer.
_ANSWER = "the answer"


def answered(name: str, body: bytes) -> ToolOutcome:
    """The outcome of tool ``name`` that answered ``body``: its JSON as text
    (:func:`as_output`), or an error the model can read when it is no JSON the ledger
    keeps (the strict parser's: :mod:`turnledger.core.strict_json`)."""
    try:
        value = parse(body, _ANSWER)
    except BodyError as exc:
        return ToolOutcome(f"tool {name} returned malformed JSON: {exc}", is_error=True)
    return ToolOutcome(as_output(value))


def short(text: str) -> str:
    """``text`` on one line, cut to a quotable length."""
    flat = " ".join(text.split())
    return flat if len(flat) <= _SHORT_BODY else flat[:_SHORT_BODY] + "..."


def request_body(invocation: ToolInvocation) -> dict[str, Any]:
    """What an executor sends a tool: the call, where it belongs, where to report later."""
    body: dict[str, Any] = {
        "tool": invocation.tool.name,
        "call_id": invocation.call.id,
        "conversation_id": invocation.conversation_id,
        "arguments": invocation.call.arguments,
    }
    if invocation.callback_url is not None:
        body["callback_url"] = invocation.callback_url
    return body


def deferred(name: str, body: bytes) -> ToolOutcome:
    """A ``202`` answer: deferred with its ``task_id``, or an error the model can read
    (its body read as strictly as any answer)."""
    try:
        value = parse(body, _ANSWER)
    except BodyError as exc:
        return ToolOutcome(f"tool {name} answered 202 with malformed JSON: {exc}", is_error=True)
    task_id = value.get("task_id") if isinstance(value, dict) else None
    if not isinstance(task_id, str) or not task_id or len(task_id) > 256:
        return ToolOutcome(
            f"tool {name} answered 202 without a task_id (a string of 1-256 characters)",
            is_error=True,
        )
    return ToolOutcome("", task_id=task_id)


def encode(body: dict[str, Any]) -> bytes:
    """``body`` as compact UTF-8 JSON."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


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


def unreachable(tool: str, exc: Exception) -> None:
    """Log that ``tool`` could not be reached (its name and the error's type only)."""
    # The model only reads "unreachable"; whoever runs the service must see it too. The
    # tool's name and the error's type only: arguments and URLs may carry personal data.
    logger.warning(
        "a tool could not be reached", extra={"tool": tool, "error_type": type(exc).__name__}
    )
