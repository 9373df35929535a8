"""Tracing is Powertools' Tracer where it is on, and costs nothing where it is off."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from turnledger.core import observability


class FakeTracer:
    """Records the handlers Powertools would capture."""

    def __init__(self) -> None:
        self.captured: list[str] = []

    def capture_lambda_handler(self, handler: Callable[..., Any]) -> Callable[..., Any]:
        self.captured.append(handler.__name__)
        return handler


def handler(event: dict[str, Any], context: object) -> dict[str, Any]:
    return {"echo": event}


def test_tracing_is_off_outside_lambda_and_when_disabled(monkeypatch: pytest.MonkeyPatch) -> None:
    """No function name, or POWERTOOLS_TRACE_DISABLED: no Tracer (its import costs cold start)."""
    monkeypatch.delenv("AWS_LAMBDA_FUNCTION_NAME", raising=False)
    assert not observability.tracing_enabled()
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "TurnFunction")
    monkeypatch.setenv("POWERTOOLS_TRACE_DISABLED", "true")
    assert not observability.tracing_enabled()
    monkeypatch.setenv("POWERTOOLS_TRACE_DISABLED", "false")
    assert observability.tracing_enabled()


def test_traced_handlers_are_captured_only_where_tracing_is_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``@traced`` hands the handler to ``capture_lambda_handler`` when a Tracer exists."""
    wrapped = observability.traced(handler)
    monkeypatch.setattr(observability, "tracer", lambda: None)
    assert wrapped({"a": 1}, None) == {"echo": {"a": 1}}
    fake = FakeTracer()
    monkeypatch.setattr(observability, "tracer", lambda: fake)
    assert wrapped({"b": 2}, None) == {"echo": {"b": 2}}
    assert fake.captured == ["handler"]
