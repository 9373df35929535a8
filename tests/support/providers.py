"""Test providers shared by the scenario suites."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from turnledger.providers.base import ModelReply, ModelRequest, Provider
from turnledger.providers.demo import DemoProvider


class Recording(Provider):
    """The demo model, recording every request it is sent; optional hooks before answering."""

    name = "demo"
    estimate_is_exact = True

    def __init__(self, before: Callable[[ModelRequest], None] | None = None) -> None:
        self.demo = DemoProvider()
        self.requests: list[ModelRequest] = []
        self.before = before
        self._lock = threading.Lock()

    def estimate_tokens(self, text: str) -> int:
        return self.demo.estimate_tokens(text)

    def complete(self, request: ModelRequest) -> ModelReply:
        with self._lock:
            self.requests.append(request)
        if self.before is not None:
            self.before(request)
        return self.demo.complete(request)


class Sleeps:
    """A provider's ``sleep`` that records the waits between attempts instead of waiting."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


def quick_retries(sleeps: Sleeps) -> dict[str, Any]:
    """A provider's retry options for tests: two retries, a 5 s timeout, no jitter, and
    ``sleeps`` recording the waits instead of waiting."""
    return {"timeout_seconds": 5.0, "max_retries": 2, "sleep": sleeps, "jitter": lambda: 1.0}
