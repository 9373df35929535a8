"""The request's deadline: provider and tool timeouts are cut to the time Lambda has left.

The API handler sets it from ``context.get_remaining_time_in_millis()`` minus a margin
kept for committing and answering (:func:`request_deadline`); the model providers and
the tool executors read it where they choose a per-attempt timeout (:func:`cap`,
:func:`remaining`). Outside a request (tests, the sweep) there is no deadline and the
configured timeouts apply unchanged. The tool-run lease is cut to the function's own
end (:func:`life_left`): a run cannot outlive the function that runs it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

#: Seconds kept after the last model or tool call to commit the turn and answer.
MARGIN_SECONDS = 2.0

#: ``time.monotonic()`` by which model and tool calls must be over; ``None``: no deadline.
_deadline: ContextVar[float | None] = ContextVar("turnledger_deadline", default=None)

#: ``time.monotonic()`` at which the function itself ends; ``None``: no deadline.
_end: ContextVar[float | None] = ContextVar("turnledger_function_end", default=None)


@contextmanager
def request_deadline(
    remaining_seconds: float | None, *, margin_seconds: float = MARGIN_SECONDS
) -> Iterator[None]:
    """Within the block, calls end ``margin_seconds`` before ``remaining_seconds`` from now
    (``None``: no deadline)."""
    deadline = None if remaining_seconds is None else time.monotonic() + remaining_seconds
    token = _deadline.set(None if deadline is None else deadline - margin_seconds)
    end_token = _end.set(deadline)
    try:
        yield
    finally:
        _end.reset(end_token)
        _deadline.reset(token)


def remaining() -> float | None:
    """Seconds left for model and tool calls (``<= 0``: none), or ``None`` without a deadline."""
    deadline = _deadline.get()
    return None if deadline is None else deadline - time.monotonic()


def life_left() -> float | None:
    """Seconds until the function itself ends (the deadline plus its margin, at least 0),
    or ``None`` without a deadline."""
    end = _end.get()
    return None if end is None else max(0.0, end - time.monotonic())


def cap(timeout: float | None) -> float | None:
    """``timeout`` (``None``: unbounded), or the time left when that is sooner (at least 0)."""
    left = remaining()
    if left is None:
        return timeout
    left = max(0.0, left)
    return left if timeout is None else min(timeout, left)
