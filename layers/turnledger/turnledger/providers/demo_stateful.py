"""The demo model keeping its own state the way the Responses API does (``demo-stateful``).

Every reply gets an id ``resp_<24 hex digits>``. With ``store`` the provider
keeps that response's whole context (what it was sent, or rebuilt, plus its
own answer) under the id, and ``response_id`` is returned; without it the
response is not kept and no id is returned. With a ``continuation`` it rebuilds
its context from the stored state plus ``messages[new_from:]``
(``continued``); when the id is unknown (never stored, deleted, forgotten) it
answers from the whole context it was sent (``fallback``). The answers are the
demo model's (:mod:`turnledger.providers.demo`), read from the rebuilt
context, so a continuation that loses or duplicates messages shows in them.

The state lives behind :class:`DemoStateStore`: :class:`MemoryDemoState` in
one process, or :class:`DirectoryDemoState` (one JSON file per response id,
written atomically) when several processes must share it, as the local
runner's workers do: :func:`demo_state_store` picks the directory when
``DEMO_STATE_DIR`` is set.
"""

from __future__ import annotations

import os
import re
import secrets
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from .base import Message, ModelReply, ModelRequest, Provider, ProviderState, TextSink
from .demo import DemoProvider, stream_words

#: What a demo response id looks like; anything else is unknown (and never a path).
RESPONSE_ID = re.compile(r"resp_[0-9a-f]{24}")

_MESSAGES = TypeAdapter(list[Message])


def new_response_id() -> str:
    """A fresh ``resp_<hex>`` id."""
    return f"resp_{secrets.token_hex(12)}"


class DemoStateStore(ABC):
    """Where ``demo-stateful`` keeps responses: id -> the response's whole context.

    Implementations must be safe to call from several threads; an id that does
    not match :data:`RESPONSE_ID` is simply unknown.
    """

    @abstractmethod
    def get(self, response_id: str) -> list[Message] | None:
        """The context stored under ``response_id``, or ``None`` when unknown."""

    @abstractmethod
    def put(self, response_id: str, messages: list[Message]) -> None:
        """Store ``messages`` under ``response_id`` (replacing any)."""

    @abstractmethod
    def delete(self, response_id: str) -> bool:
        """Delete ``response_id``; ``True`` when it was there."""

    @abstractmethod
    def clear(self) -> int:
        """Delete every stored response; returns how many there were."""


class MemoryDemoState(DemoStateStore):
    """Responses kept in this process's memory."""

    def __init__(self) -> None:
        """An empty store."""
        self._items: dict[str, list[Message]] = {}
        self._lock = threading.Lock()

    def get(self, response_id: str) -> list[Message] | None:
        """See :meth:`DemoStateStore.get`."""
        with self._lock:
            found = self._items.get(response_id)
            return list(found) if found is not None else None

    def put(self, response_id: str, messages: list[Message]) -> None:
        """See :meth:`DemoStateStore.put`."""
        if not RESPONSE_ID.fullmatch(response_id):
            raise ValueError(f"not a demo response id: {response_id!r}")
        with self._lock:
            self._items[response_id] = list(messages)

    def delete(self, response_id: str) -> bool:
        """See :meth:`DemoStateStore.delete`."""
        with self._lock:
            return self._items.pop(response_id, None) is not None

    def clear(self) -> int:
        """See :meth:`DemoStateStore.clear`."""
        with self._lock:
            count = len(self._items)
            self._items.clear()
            return count


class DirectoryDemoState(DemoStateStore):
    """Responses kept as ``<dir>/<id>.json``, shared by every process that uses ``dir``.

    A write goes to a temporary file in the same directory, then replaces the
    target (``os.replace``), so a reader in another process sees the whole
    response or none of it.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        """Use ``directory`` (created if missing)."""
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def _path(self, response_id: str) -> Path | None:
        if not RESPONSE_ID.fullmatch(response_id):
            return None
        return self.directory / f"{response_id}.json"

    def get(self, response_id: str) -> list[Message] | None:
        """See :meth:`DemoStateStore.get`; an unreadable file is an unknown id."""
        path = self._path(response_id)
        if path is None:
            return None
        try:
            return _MESSAGES.validate_json(path.read_bytes())
        except (FileNotFoundError, ValidationError):
            return None

    def put(self, response_id: str, messages: list[Message]) -> None:
        """See :meth:`DemoStateStore.put`."""
        path = self._path(response_id)
        if path is None:
            raise ValueError(f"not a demo response id: {response_id!r}")
        data = _MESSAGES.dump_json(messages)
        handle, temporary = tempfile.mkstemp(dir=self.directory, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(handle, "wb") as file:
                file.write(data)
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise

    def delete(self, response_id: str) -> bool:
        """See :meth:`DemoStateStore.delete`."""
        path = self._path(response_id)
        if path is None:
            return False
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        return True

    def clear(self) -> int:
        """See :meth:`DemoStateStore.clear`."""
        count = 0
        for path in self.directory.glob("resp_*.json"):
            try:
                path.unlink()
            except FileNotFoundError:
                continue  # another process cleared it first
            count += 1
        return count


def demo_state_store(directory: str | None) -> DemoStateStore:
    """The directory store when ``directory`` is set (``DEMO_STATE_DIR``), else memory."""
    return DirectoryDemoState(directory) if directory else MemoryDemoState()


class DemoStatefulProvider(Provider):
    """The demo model with Responses-style stored state (provider ``demo-stateful``)."""

    name = "demo-stateful"
    stateful = True
    estimate_is_exact = True

    def __init__(self, store: DemoStateStore | None = None, token_delay_ms: int = 0) -> None:
        """Keep state in ``store`` (default: this process's memory); ``token_delay_ms`` as
        :class:`DemoProvider`'s."""
        self.state = store or MemoryDemoState()
        self._model = DemoProvider()
        self.token_delay_ms = max(token_delay_ms, 0)

    def stream(self, request: ModelRequest, on_text: TextSink) -> ModelReply:
        """The same answer as :meth:`complete` (state kept alike), handed over word by word."""
        reply = self._reply(request)
        stream_words(reply.text, on_text, self.token_delay_ms)
        return reply

    def estimate_tokens(self, text: str) -> int:
        """The demo model's estimate: whitespace-separated words."""
        return self._model.estimate_tokens(text)

    def complete(self, request: ModelRequest) -> ModelReply:
        """Answer from the stored state plus the new messages, or from the whole context.

        Never fails (see the module docstring for ``provider_state``). With a token
        delay, the whole answer takes as long as streaming it would.
        """
        reply = self._reply(request)
        if self.token_delay_ms and reply.text and request.purpose == "turn":
            time.sleep(self.token_delay_ms * len(reply.text.split()) / 1000)
        return reply

    def _reply(self, request: ModelRequest) -> ModelReply:
        context = list(request.messages)
        state: ProviderState = "fresh"
        if request.continuation is not None:
            stored = self.state.get(request.continuation.previous_response_id)
            if stored is None:
                state = "fallback"
            else:
                state = "continued"
                context = stored + list(request.messages[request.continuation.new_from :])
        reply = self._model.complete(
            request.model_copy(update={"messages": context, "continuation": None})
        )
        response_id: str | None = None
        if request.store:
            response_id = new_response_id()
            answer = Message(role="assistant", content=reply.text, tool_calls=reply.tool_calls)
            self.state.put(response_id, [*context, answer])
        return reply.model_copy(update={"response_id": response_id, "provider_state": state})

    def delete_state(self, response_ids: list[str]) -> int:
        """Delete the stored responses ``response_ids``; how many there were. Never raises."""
        deleted = 0
        for response_id in response_ids:
            try:
                deleted += self.state.delete(response_id)
            except OSError:
                continue  # best effort, like a real provider's delete
        return deleted

    def forget(self) -> int:
        """Drop every stored response (``POST /_local/provider/forget``); how many there were."""
        return self.state.clear()
