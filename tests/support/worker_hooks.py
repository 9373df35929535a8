"""Fault-injection hooks for the local runner's worker processes (``LocalConfig.worker_hook``).

A hook runs once in the process every execution environment is forked from,
so what it patches holds in every worker. Hooks read their settings from the
functions' environment (``LocalConfig.env``).
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

from turnledger.store.dynamodb import DynamoDBConversationStore

#: The functions' environment variable naming the barrier's directory.
BARRIER_DIR = "TURNLEDGER_TEST_BARRIER"
#: While this file exists in the barrier's directory, loads wait at the barrier.
ARMED = "armed"


def arrive(directory: Path, parties: int, timeout: float) -> None:
    """Wait until ``parties`` processes (this one included) have arrived in ``directory``.

    Raises:
        TimeoutError: fewer arrived within ``timeout`` seconds.
    """
    (directory / f"arrived-{os.getpid()}-{uuid.uuid4().hex}").touch()
    deadline = time.monotonic() + timeout
    while len(list(directory.glob("arrived-*"))) < parties:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only some of {parties} parties reached the barrier")
        time.sleep(0.01)


def two_loads_meet() -> None:
    """While the barrier is armed, each conversation load returns only once two loads have
    read their snapshots: two requests both read the state before either commits."""
    directory = Path(os.environ[BARRIER_DIR])
    original = DynamoDBConversationStore.load

    def load(self: DynamoDBConversationStore, *args: Any, **kwargs: Any) -> Any:
        snapshot = original(self, *args, **kwargs)
        if (directory / ARMED).exists():
            arrive(directory, parties=2, timeout=10)
        return snapshot

    DynamoDBConversationStore.load = load  # type: ignore[method-assign]


#: The functions' environment variable naming the directory of armed DynamoDB faults.
FAULTS_DIR = "TURNLEDGER_TEST_FAULTS"


def dynamodb_faults() -> None:
    """Fail DynamoDB calls on demand: a file ``<Operation>.<code>`` in the faults directory
    makes the next call of ``Operation`` (in any worker) raise ``ClientError(code)``
    instead of being sent, once; a ``TransactionCanceledException`` is cancelled for a
    ``TransactionConflict``. The file is removed by the call it fails."""
    from botocore.client import BaseClient
    from botocore.exceptions import ClientError

    directory = Path(os.environ[FAULTS_DIR])
    original = BaseClient._make_api_call

    def make_api_call(self: BaseClient, operation: str, params: Any) -> Any:
        if self.meta.service_model.service_name == "dynamodb":
            for armed in directory.glob(f"{operation}.*"):
                try:
                    armed.unlink()  # exactly one call (of any worker) wins the file
                except FileNotFoundError:
                    continue
                code = armed.suffix.removeprefix(".")
                extra: dict[str, Any] = (
                    {"CancellationReasons": [{"Code": "TransactionConflict"}]}
                    if code == "TransactionCanceledException"
                    else {}
                )
                raise ClientError(
                    {"Error": {"Code": code, "Message": "injected"}, **extra}, operation
                )
        return original(self, operation, params)

    BaseClient._make_api_call = make_api_call  # type: ignore[method-assign]


#: A file in the faults directory that makes the next tool run kill its environment.
DIE_IN_TOOLS = "die-in-tools"


def die_in_tools() -> None:
    """While ``<FAULTS_DIR>/die-in-tools`` exists, the next tool run kills its execution
    environment (once): the request dies holding the tool lease, as a crashed Lambda does."""
    from turnledger.tools.executors import ToolRunner

    directory = Path(os.environ[FAULTS_DIR])
    original = ToolRunner.run

    def run(self: ToolRunner, *args: Any, **kwargs: Any) -> Any:
        try:
            (directory / DIE_IN_TOOLS).unlink()
        except FileNotFoundError:
            return original(self, *args, **kwargs)
        os._exit(70)

    ToolRunner.run = run  # type: ignore[method-assign]


#: An input holding this fails after part of its answer streamed (``demo_fails_mid_stream``).
FAIL_MID_STREAM = "FAIL-MID-STREAM"


def demo_fails_mid_stream() -> None:
    """The demo model streams the first three words of an answer to an input holding
    :data:`FAIL_MID_STREAM`, then fails as a dropped provider connection would."""
    from turnledger.core.exceptions import ProviderError
    from turnledger.providers.base import ModelReply, ModelRequest, TextSink
    from turnledger.providers.demo import DemoProvider, stream_words

    original = DemoProvider.stream

    def stream(self: DemoProvider, request: ModelRequest, on_text: TextSink) -> ModelReply:
        last = next((m.content or "" for m in reversed(request.messages) if m.role == "user"), "")
        if FAIL_MID_STREAM not in last:
            return original(self, request, on_text)
        reply = self.complete(request)
        words = (reply.text or "").split(" ")
        stream_words(" ".join(words[:3]), on_text, self.token_delay_ms)
        raise ProviderError(
            "the model provider failed", details={"provider_message": "connection reset"}
        )

    DemoProvider.stream = stream  # type: ignore[method-assign]


def tools_outlast_deadline() -> None:
    """``http`` tool calls are not cut to the request's remaining time: a tool slower than
    the function's timeout keeps the invocation running until the runner stops it (as
    Lambda stops a function whose tool, storage or memory outran what its code foresaw)."""
    from turnledger.core.deadline import request_deadline
    from turnledger.tools.executors import ToolInvocation, ToolOutcome
    from turnledger.tools.http import HttpExecutor

    original = HttpExecutor.execute

    def execute(self: HttpExecutor, invocation: ToolInvocation) -> ToolOutcome:
        with request_deadline(None):
            return original(self, invocation)

    HttpExecutor.execute = execute  # type: ignore[method-assign]
